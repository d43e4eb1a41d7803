// FP8 (OCP e4m3 / e5m2) with per-tensor scaling: codes are bytes, four to a word. The format
// (mantissa bits, bias, max value and code) is a push constant; TX (the float dtype) and WG
// are constants. Stages: 0 quantize (codes, amax, scale_inv), 1 amax only, 2 dequantize,
// 3 quantize into the transposed layout, 4 transpose codes, 5 the delayed-scaling update.
// Amax propagates NaN: |x| is taken on the bits and a NaN orders above +inf as an integer.

struct Params {
    stage: u32,
    total: u32,
    // Rows and columns of the (untransposed) matrix, or history rows and columns (stage 5).
    m: u32,
    n: u32,
    mant: u32,
    bias: i32,
    max_code: u32,
    maxv: f32,
    fp8_max: f32,
    margin: f32,
    algo_max: u32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> scale: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
@group(0) @binding(3) var<storage, read_write> amax: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> scale_inv: array<f32>;
var<immediate> p: Params;

var<workgroup> red_bits: array<u32, WG>;

fn ld_x(i: u32) -> f32 {
    return unpack(src[word_of(i, TX)], i, TX);
}

fn code_at(i: u32) -> u32 {
    return byte_at(src[i >> 2u], i);
}

// Saturating, round-to-nearest-even encode; NaN gives 0x7f.
fn encode(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    if (is_nan(x)) {
        return 0x7Fu;
    }
    let sign = select(0u, 0x80u, (bits >> 31u) != 0u);
    let a = bitcast<f32>(bits & 0x7FFFFFFFu);
    if (a >= p.maxv) {
        return sign | p.max_code;
    }
    let emin = 1 - p.bias;
    var e = i32((bitcast<u32>(a) >> 23u) & 0xFFu) - 127;
    if (e < emin) {
        e = emin;
    }
    let quantum = bitcast<f32>(u32(e - i32(p.mant) + 127) << 23u);
    let q = u32(round(a / quantum));
    let code = min((u32(e - emin) << p.mant) + q, p.max_code);
    return sign | code;
}

// The value of code c in this call's format (fp8_codes.wgsl).
fn decode(c: u32) -> f32 {
    return fp8_decode(c, p.mant);
}

// The larger of two |x| bit patterns (a NaN's is above +inf's).
fn abs_bits(v: f32) -> u32 {
    return bitcast<u32>(v) & 0x7FFFFFFFu;
}

// The workgroup's largest |x| bits into amax[0] (every invocation calls it).
fn amax_reduce(m: u32, lane: u32) {
    red_bits[lane] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            red_bits[lane] = max(red_bits[lane], red_bits[lane + s]);
        }
        workgroupBarrier();
    }
    if (lane == 0u && red_bits[0] != 0u) {
        atomicMax(&amax[0], red_bits[0]);
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let stride = groups.x * WG;
    switch p.stage {
        case 0u, 1u: {
            var m = 0u;
            if (p.stage == 0u) {
                let s = scale[0];
                if (gid.x == 0u) {
                    scale_inv[0] = 1.0 / s;
                }
                let words = (p.total + 3u) / 4u;
                for (var w = gid.x; w < words; w += stride) {
                    var word = 0u;
                    for (var l = 0u; l < 4u; l++) {
                        let i = w * 4u + l;
                        if (i < p.total) {
                            let v = ld_x(i);
                            m = max(m, abs_bits(v));
                            word |= encode(v * s) << (8u * l);
                        }
                    }
                    dst[w] = word;
                }
            } else {
                for (var i = gid.x; i < p.total; i += stride) {
                    m = max(m, abs_bits(ld_x(i)));
                }
            }
            amax_reduce(m, lane);
        }
        case 2u: {
            let s = scale[0];
            let per = per_word(TX);
            let words = (p.total + per - 1u) / per;
            for (var w = gid.x; w < words; w += stride) {
                let i = w * per;
                let lo = decode(code_at(i)) * s;
                var hi = 0.0;
                if (per == 2u && i + 1u < p.total) {
                    hi = decode(code_at(i + 1u)) * s;
                }
                dst[w] = pack(lo, hi, TX);
            }
        }
        case 3u, 4u: {
            // Element e of the [n, m] result is (c, r) = (e / m, e % m) of the [m, n] source.
            let s = scale[0];
            let words = (p.total + 3u) / 4u;
            for (var w = gid.x; w < words; w += stride) {
                var word = 0u;
                for (var l = 0u; l < 4u; l++) {
                    let e = w * 4u + l;
                    if (e < p.total) {
                        let c = e / p.m;
                        let r = e - c * p.m;
                        let i = r * p.n + c;
                        var code = 0u;
                        if (p.stage == 3u) {
                            code = encode(ld_x(i) * s);
                        } else {
                            code = code_at(i);
                        }
                        word |= code << (8u * l);
                    }
                }
                dst[w] = word;
            }
        }
        default: {
            // Delayed scaling over the columns of the [m = history, n] amax history (dst).
            let j = gid.x;
            if (j >= p.n) {
                return;
            }
            var a = 0.0;
            if (p.algo_max != 0u) {
                for (var r = 0u; r < p.m; r++) {
                    a = max_nan(a, bitcast<f32>(dst[r * p.n + j]));
                }
            } else {
                a = bitcast<f32>(dst[j]);
            }
            let finite = (bitcast<u32>(a) & 0x7F800000u) != 0x7F800000u;
            if (finite && a > 0.0) {
                let sc = p.fp8_max / a / exp2(p.margin);
                let sc_finite = (bitcast<u32>(sc) & 0x7F800000u) != 0x7F800000u;
                if (sc_finite && sc > 0.0) {
                    scale[j] = sc;
                }
            }
            scale_inv[j] = 1.0 / scale[j];
            let first = dst[j];
            for (var r = 0u; r + 1u < p.m; r++) {
                dst[r * p.n + j] = dst[(r + 1u) * p.n + j];
            }
            dst[(p.m - 1u) * p.n + j] = first;
            dst[j] = 0u;
        }
    }
}
