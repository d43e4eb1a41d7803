// The value of an OCP FP8 code, shared by fp8.wgsl and gemm_fp8.wgsl: `mant` is the format's
// mantissa bits (3: e4m3, bias 7, NaN at S.1111.111, no infinity; 2: e5m2, bias 15, IEEE-style
// infinities and NaNs).

fn fp8_decode(c: u32, mant: u32) -> f32 {
    let bias = (1 << (6u - mant)) - 1;
    let s = select(1.0, -1.0, (c & 0x80u) != 0u);
    let e = (c & 0x7Fu) >> mant;
    let m = c & ((1u << mant) - 1u);
    let emax = (1u << (7u - mant)) - 1u;
    if (mant == 3u && e == emax && m == 7u) {
        return bitcast<f32>(0x7FC00000u);
    }
    if (mant == 2u && e == emax) {
        if (m == 0u) {
            return s * bitcast<f32>(0x7F800000u);
        }
        return bitcast<f32>(0x7FC00000u);
    }
    let frac = f32(m) / f32(1u << mant);
    if (e == 0u) {
        return s * bitcast<f32>(u32(1 - bias + 127) << 23u) * frac;
    }
    return s * bitcast<f32>(u32(i32(e) - bias + 127) << 23u) * (1.0 + frac);
}
