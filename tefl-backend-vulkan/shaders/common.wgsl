// Shared helpers of every tefl Vulkan shader. build.rs prepends the variant's constants (dtype
// codes such as TX, the workgroup size WG) before this file.
//
// Tensors are bound as arrays of 32-bit words whatever their dtype (code 0: f32, 1: f16,
// 2: bf16): a 16-bit element i is half (i & 1) of word i / 2, so no 16-bit storage feature is
// needed. Conversions are done on the bits, rounding to nearest even, with inf and NaN kept.

const F32: u32 = 0u;
const F16: u32 = 1u;
const BF16: u32 = 2u;

// Elements of a dtype per 32-bit word.
fn per_word(code: u32) -> u32 {
    return select(2u, 1u, code == F32);
}

// The word holding element i.
fn word_of(i: u32, code: u32) -> u32 {
    return select(i >> 1u, i, code == F32);
}

fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1Fu;
    let m = h & 0x3FFu;
    if (e == 0u) {
        // Zero or subnormal: m · 2^-24 (a normal f32).
        let v = f32(m) * 5.9604644775390625e-8;
        return select(v, -v, sign != 0u);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7F800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

fn f32_to_f16(f: f32) -> u32 {
    let b = bitcast<u32>(f);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7FFFFFFFu;
    if (a > 0x7F800000u) {
        return sign | 0x7E00u;
    }
    if (a >= 0x477FF000u) {
        // 65520 and above round to infinity.
        return sign | 0x7C00u;
    }
    if (a >= 0x38800000u) {
        let m = a - 0x38000000u;
        return sign | ((m + 0xFFFu + ((m >> 13u) & 1u)) >> 13u);
    }
    if (a < 0x33000000u) {
        return sign;
    }
    // Subnormal: the value in units of 2^-24, rounded to nearest even.
    let e = a >> 23u;
    let mant = (a & 0x7FFFFFu) | 0x800000u;
    let shift = 126u - e;
    let half = 1u << (shift - 1u);
    let rem = mant & ((1u << shift) - 1u);
    var q = mant >> shift;
    if (rem > half || (rem == half && (q & 1u) == 1u)) {
        q = q + 1u;
    }
    return sign | q;
}

fn f32_to_bf16(f: f32) -> u32 {
    let b = bitcast<u32>(f);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
        return ((b >> 16u) & 0x8000u) | 0x7FC0u;
    }
    return (b + 0x7FFFu + ((b >> 16u) & 1u)) >> 16u;
}

// Element i of a tensor of dtype `code` whose word `w` holds it.
fn unpack(w: u32, i: u32, code: u32) -> f32 {
    if (code == F32) {
        return bitcast<f32>(w);
    }
    let h = (w >> ((i & 1u) * 16u)) & 0xFFFFu;
    if (code == F16) {
        return f16_to_f32(h);
    }
    return bitcast<f32>(h << 16u);
}

// The bits of v in dtype `code` (low 16 bits for the 16-bit dtypes).
fn to_bits(v: f32, code: u32) -> u32 {
    if (code == F32) {
        return bitcast<u32>(v);
    }
    if (code == F16) {
        return f32_to_f16(v);
    }
    return f32_to_bf16(v);
}

// A word of two 16-bit elements (lo first), or one f32.
fn pack(lo: f32, hi: f32, code: u32) -> u32 {
    if (code == F32) {
        return bitcast<u32>(lo);
    }
    return to_bits(lo, code) | (to_bits(hi, code) << 16u);
}

// NaN test on the bits (a float comparison may be compiled as ordered and never see NaN).
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7FFFFFFFu) > 0x7F800000u;
}

// max that keeps NaN (WGSL's max may drop it).
fn max_nan(a: f32, b: f32) -> f32 {
    if (is_nan(a)) {
        return a;
    }
    if (is_nan(b)) {
        return b;
    }
    return max(a, b);
}

// −∞.
fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

// 1/s, 0 for s = 0 (a fully masked row), NaN kept.
fn recip_or_zero(s: f32) -> f32 {
    if (s > 0.0) {
        return 1.0 / s;
    }
    return select(0.0, s, is_nan(s));
}

// Byte j of a byte tensor bound as words.
fn byte_at(w: u32, j: u32) -> u32 {
    return (w >> ((j & 3u) * 8u)) & 0xFFu;
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// tanh from exp, exact at the limits (no NaN for large |x|).
fn tanh_safe(x: f32) -> f32 {
    return 1.0 - 2.0 / (exp(2.0 * x) + 1.0);
}
