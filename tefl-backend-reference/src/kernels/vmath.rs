//! f32 `exp` written so that loops over slices vectorise, the slice loops built on it, and
//! vectorised conversions between f32 and the 16-bit floats.
//!
//! The standard library's `f32::exp` is a call into libm per element, which a compiler cannot
//! turn into vector code, and the activations, softmax and attention spent most of their time
//! there. [`exp`] is plain arithmetic (a range reduction by ln 2 and a degree-7 polynomial, then
//! 2ⁿ put together from its bits) with selects for the special cases, so a loop of it
//! vectorises; the slice functions below are compiled twice more, for AVX-512 and for AVX2
//! (eight lanes with FMA and F16C), and the widest the CPU has is picked at run time. Its error
//! is within 2 ulp of the exact result for |x| ≤ 87 (1.17 at most over the dense sweep against
//! f64 in the tests below); results below f32's smallest normal value (x < -87.33) are 0, and
//! x > 88.72 gives +inf, as does `f32::exp`.

use half::{bf16, f16};
use tefl_core::fp8::Fp8Format;

/// The largest x whose e^x is finite in f32.
const HI: f32 = 88.722_83;
/// Below this, e^x is under f32's smallest normal value and is returned as 0.
const LO: f32 = -87.336_54;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 in two parts: LN2_HI has its low 9 bits zero (15 significant), so n·LN2_HI is exact
/// for |n| < 2⁹.
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// 1.5·2²³: adding it rounds a float of magnitude below 2²² to an integer (round to nearest).
const ROUND: f32 = 12_582_912.0;

/// Independent partial sums a sum keeps: a sum in one accumulator is a chain of dependent adds
/// the compiler may not reorder (f32 addition is not associative), so it runs at one add per
/// add latency; sixteen let it use vector registers.
const LANES: usize = 16;

/// e^x in f32 (see the module's text for its error and range), branch-free.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let xc = x.clamp(LO, HI);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    // r = x - n ln 2, in [-ln2/2, ln2/2] (up to rounding).
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    // e^r by its Taylor series to r⁷ (the r⁸ term is below 2⁻²⁵ relative on that interval).
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2ⁿ from its exponent bits; n is in [-126, 128], and 2¹²⁸ (n = 128 only for x ≥ 88.38)
    // is built as 2 · 2¹²⁷. n as an integer is t's low mantissa bits (t's ulp is 1): reading
    // them, rather than a saturating `as i32` cast, keeps the loop in vector registers.
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let big = ni > 127;
    let two_n = f32::from_bits(((ni - i32::from(big) + 127) as u32) << 23);
    let y = p * two_n * if big { 2.0 } else { 1.0 };
    if x.is_nan() {
        x
    } else if x > HI {
        f32::INFINITY
    } else if x < LO {
        0.0
    } else {
        y
    }
}

/// Calls the body compiled for the widest vector unit the CPU has: `$avx512(args)` with
/// AVX-512F, `$avx2(args)` with AVX2, FMA and F16C (see [`has_avx2`]), else `$generic(args)`
/// (x86-64's baseline, SSE2: four lanes).
macro_rules! dispatch {
    ($generic:path, $avx512:path, $avx2:path, ($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked just above), all the function asks for.
                return unsafe { $avx512($($arg),*) };
            }
            if $crate::kernels::vmath::has_avx2() {
                // SAFETY: the CPU has AVX2, FMA and F16C (checked just above), all the function
                // asks for.
                return unsafe { $avx2($($arg),*) };
            }
        }
        $generic($($arg),*)
    }};
}
pub(crate) use dispatch;

/// Whether the CPU has the second tier's extensions: AVX2 and FMA (eight lanes; the CPUs without
/// AVX-512, such as AMD's before Zen 4 and Intel's client parts, have them) and F16C (the f16
/// conversions). Rust never fuses a multiply and an add on its own, so every tier computes the
/// same bits; only the width of the vectors differs.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// `$avx512` and `$avx2`: `$generic` (an `#[inline(always)]` body) compiled for the two tiers
/// [`dispatch!`] picks from.
macro_rules! tiers {
    ($generic:path => $avx512:ident, $avx2:ident $(<const $k:ident: usize>)? ($($a:ident: $t:ty),*) $(-> $r:ty)?) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f")]
        fn $avx512$(<const $k: usize>)?($($a: $t),*) $(-> $r)? {
            $generic($($a),*)
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn $avx2$(<const $k: usize>)?($($a: $t),*) $(-> $r)? {
            $generic($($a),*)
        }
    };
}

/// Sum of a slice in [`LANES`] partial sums (so that it vectorises; the order of the additions
/// differs from a left-to-right sum by rounding only).
#[inline(always)]
fn sum_generic(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn exp_shifted_generic(row: &mut [f32], m: f32) -> f32 {
    for x in row.iter_mut() {
        // A masked entry (-inf) is 0 even when m is NaN or +inf.
        *x = if *x == f32::NEG_INFINITY { 0.0 } else { exp(*x - m) };
    }
    sum_generic(row)
}

tiers!(exp_shifted_generic => exp_shifted_avx512, exp_shifted_avx2 (row: &mut [f32], m: f32) -> f32);

/// `row[j] = e^(row[j] - m)`, 0 where `row[j]` is -inf (a masked score); returns the row's sum.
pub fn exp_shifted(row: &mut [f32], m: f32) -> f32 {
    dispatch!(exp_shifted_generic, exp_shifted_avx512, exp_shifted_avx2, (row, m))
}

#[inline(always)]
fn dot_generic(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut lanes = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            lanes[l] += x[l] * y[l];
        }
    }
    // The lanes added pairwise.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
    }
    lanes[0] + tail
}

tiers!(dot_generic => dot_avx512, dot_avx2 (a: &[f32], b: &[f32]) -> f32);

/// Σ a\[j\]·b\[j\] over the shorter length, in `LANES` (16) partial sums (it vectorises; the result
/// differs from a left-to-right sum by rounding only, and a NaN or infinity in either input
/// reaches it as in a sequential sum).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dispatch!(dot_generic, dot_avx512, dot_avx2, (a, b))
}

#[inline(always)]
fn sum_f64_generic<const K: usize>(ins: [&[f32]; K], f: impl Fn([f32; K]) -> f32) -> f64 {
    let n = ins.iter().map(|x| x.len()).min().unwrap_or(0);
    let ins: [&[f32]; K] = std::array::from_fn(|k| &ins[k][..n]);
    let mut lanes = [0.0f64; LANES];
    let whole = n / LANES * LANES;
    for j0 in (0..whole).step_by(LANES) {
        for (l, acc) in lanes.iter_mut().enumerate() {
            *acc += f64::from(f(std::array::from_fn(|k| ins[k][j0 + l])));
        }
    }
    let tail: f64 = (whole..n).map(|j| f64::from(f(std::array::from_fn(|k| ins[k][j])))).sum();
    lanes.iter().sum::<f64>() + tail
}

tiers!(sum_f64_generic => sum_f64_avx512, sum_f64_avx2 <const K: usize>(ins: [&[f32]; K], f: impl Fn([f32; K]) -> f32) -> f64);

/// Σ_j f(\[ins\[0\]\[j\], .., ins\[K-1\]\[j\]\]) over the shortest input, each term computed in f32 and
/// summed in f64 in `LANES` (16) partial sums (rows of norms reach 16384 elements and more; the
/// partial sums let it vectorise).
pub fn sum_f64<const K: usize>(ins: [&[f32]; K], f: impl Fn([f32; K]) -> f32) -> f64 {
    dispatch!(sum_f64_generic, sum_f64_avx512, sum_f64_avx2, (ins, f))
}

/// max(a, b), NaN when either is NaN (`f32::max` would drop a NaN).
#[inline(always)]
pub fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) }
}

/// max over `xs` of `f(x)`, starting from `init`, NaN when any is NaN: in [`LANES`] partial
/// maxima, so that it vectorises (max_nan's and amax's loop).
#[inline(always)]
fn fold_max_nan(xs: &[f32], init: f32, f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [init; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder().iter().fold(init, |m, v| nan_max(m, f(*v)));
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = nan_max(*a, f(*v));
        }
    }
    acc.iter().copied().fold(tail, nan_max)
}

#[inline(always)]
fn max_nan_generic(xs: &[f32]) -> f32 {
    fold_max_nan(xs, f32::NEG_INFINITY, |v| v)
}

tiers!(max_nan_generic => max_nan_avx512, max_nan_avx2 (xs: &[f32]) -> f32);

/// The maximum of `xs` (-inf when empty), NaN when `xs` holds a NaN (where `f32::max` would
/// drop it).
pub fn max_nan(xs: &[f32]) -> f32 {
    dispatch!(max_nan_generic, max_nan_avx512, max_nan_avx2, (xs))
}

#[inline(always)]
fn count_non_finite_generic(xs: &[f32]) -> usize {
    // Exponent bits all set: an infinity or a NaN. Counted over the whole slice, with no early
    // exit, so that the loop compiles to vector compares.
    xs.iter().map(|v| usize::from(v.to_bits() & 0x7f80_0000 == 0x7f80_0000)).sum()
}

tiers!(count_non_finite_generic => count_non_finite_avx512, count_non_finite_avx2 (xs: &[f32]) -> usize);

/// How many values of `xs` are NaN or infinite.
pub fn count_non_finite(xs: &[f32]) -> usize {
    dispatch!(count_non_finite_generic, count_non_finite_avx512, count_non_finite_avx2, (xs))
}

/// Whether every value of `xs` is finite, the slice checked in parallel chunks (attention's
/// choice of path and the optimizers' overflow checks read whole tensors: element by element
/// with an early exit, the check of q, k and v took a tenth of a small attention forward).
pub fn all_finite(xs: &[f32]) -> bool {
    use rayon::prelude::*;
    xs.par_chunks(1 << 15).all(|c| count_non_finite(c) == 0)
}

#[inline(always)]
fn scale_generic(xs: &mut [f32], k: f32) {
    xs.iter_mut().for_each(|x| *x *= k);
}

tiers!(scale_generic => scale_avx512, scale_avx2 (xs: &mut [f32], k: f32));

/// `xs[j] *= k` for every j.
pub fn scale(xs: &mut [f32], k: f32) {
    dispatch!(scale_generic, scale_avx512, scale_avx2, (xs, k))
}

#[inline(always)]
fn map_generic<const K: usize>(ins: [&[f32]; K], out: &mut [f32], f: impl Fn([f32; K]) -> f32) {
    // Every input cut to the output's length, so that the loop's indexing needs no checks.
    let ins: [&[f32]; K] = std::array::from_fn(|k| &ins[k][..out.len()]);
    for (j, o) in out.iter_mut().enumerate() {
        *o = f(std::array::from_fn(|k| ins[k][j]));
    }
}

tiers!(map_generic => map_avx512, map_avx2 <const K: usize>(ins: [&[f32]; K], out: &mut [f32], f: impl Fn([f32; K]) -> f32));

/// `out[j] = f([ins[0][j], .., ins[K-1][j]])` for every j of `out` (each input at least as
/// long), compiled for AVX-512 or AVX2 where the CPU has them: `f` should be inline arithmetic
/// (such as [`exp`]) for the loop to vectorise.
///
/// # Panics
/// When an input is shorter than `out`.
pub fn map<const K: usize>(ins: [&[f32]; K], out: &mut [f32], f: impl Fn([f32; K]) -> f32) {
    assert!(ins.iter().all(|x| x.len() >= out.len()), "vmath::map: an input is shorter than the output");
    dispatch!(map_generic, map_avx512, map_avx2, (ins, out, f))
}

// Conversions between f32 and the 16-bit floats, the same values as the `half` crate's
// (round to nearest even; NaN stays NaN, quieted) but vectorised: bf16 by its bits, f16 by the
// AVX-512 or F16C conversion instructions where the CPU has them.

#[inline(always)]
fn bf16_bits_to_f32(b: u16) -> f32 {
    let b = if b & 0x7fff > 0x7f80 { b | 0x0040 } else { b };
    f32::from_bits(u32::from(b) << 16)
}

#[inline(always)]
fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        ((u >> 16) | 0x0040) as u16
    } else {
        // Round to nearest even: add half an ulp of the result, less one when its last bit is 0.
        (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
    }
}

#[inline(always)]
fn widen_bf16_generic(src: &[bf16], dst: &mut [f32]) {
    let src = &src[..dst.len()];
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16_bits_to_f32(s.to_bits());
    }
}

#[inline(always)]
fn narrow_bf16_generic(src: &[f32], dst: &mut [bf16]) {
    let src = &src[..dst.len()];
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16::from_bits(f32_to_bf16_bits(*s));
    }
}

fn widen_f16_generic(src: &[f16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

fn narrow_f16_generic(src: &[f32], dst: &mut [f16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(*s);
    }
}

// FP8 encoding of a slice, branch-free so that it vectorises: the same codes as
// `Fp8Format::encode` (round to nearest even, saturating, NaN to the canonical code), which the
// tests check over a sweep of f32 patterns and every code's rounding boundaries.

/// The constants of one FP8 format that the slice encoder needs.
#[derive(Clone, Copy)]
struct Fp8Consts {
    mb: i32,
    emin: i32,
    max: f32,
    max_code: i32,
}

impl Fp8Consts {
    fn of(f: Fp8Format) -> Fp8Consts {
        Fp8Consts { mb: f.mantissa_bits(), emin: 1 - f.bias(), max: f.max(), max_code: i32::from(f.max_code()) }
    }
}

/// One code: as `Fp8Format::encode`, with selects for its branches. The exponent is clamped to
/// the format's least normal one, and `a · 2^(mb - e)` (exact: a power of two, no overflow or
/// underflow at these exponents) is below 2^(mb + 1), so adding 2^23 rounds it to an integer,
/// ties to even, held in the sum's low mantissa bits. NaN and infinite inputs compute garbage
/// in the arithmetic lanes that the selects then discard.
#[inline(always)]
fn fp8_code(c: Fp8Consts, x: f32) -> u8 {
    const TWO_23: f32 = 8_388_608.0;
    let a = x.abs();
    let e = ((a.to_bits() >> 23) as i32 - 127).max(c.emin);
    let up = f32::from_bits(((c.mb - e + 127) as u32) << 23);
    let n = (a * up + TWO_23).to_bits().wrapping_sub(TWO_23.to_bits()) as i32;
    let code = (((e - c.emin) << c.mb) + n).min(c.max_code);
    let code = if a >= c.max { c.max_code } else { code };
    let sign = ((x.to_bits() >> 24) & 0x80) as i32;
    if x.is_nan() { tefl_core::fp8::NAN_CODE } else { (sign | code) as u8 }
}

#[inline(always)]
fn encode_fp8_generic(c: Fp8Consts, scale: f32, src: &[f32], dst: &mut [u8]) -> f32 {
    let src = &src[..dst.len()];
    for (d, s) in dst.iter_mut().zip(src) {
        *d = fp8_code(c, s * scale);
    }
    amax_generic(src)
}

#[inline(always)]
fn amax_generic(xs: &[f32]) -> f32 {
    fold_max_nan(xs, 0.0, f32::abs)
}

tiers!(amax_generic => amax_avx512, amax_avx2 (xs: &[f32]) -> f32);

/// max |x| over `xs` (0 for none), NaN when one is NaN: an FP8 quantizer's amax.
pub fn amax(xs: &[f32]) -> f32 {
    dispatch!(amax_generic, amax_avx512, amax_avx2, (xs))
}

tiers!(encode_fp8_generic => encode_fp8_avx512, encode_fp8_avx2 (c: Fp8Consts, scale: f32, src: &[f32], dst: &mut [u8]) -> f32);

/// The `format` codes of `src[i]·scale` into `dst` (the first `dst.len()` elements of `src`; the
/// same codes as `Fp8Format::encode`), and max |src| over them (NaN when one is NaN): an FP8
/// output's codes and its amax in one call.
pub fn encode_fp8(format: Fp8Format, scale: f32, src: &[f32], dst: &mut [u8]) -> f32 {
    assert!(src.len() >= dst.len(), "encode_fp8: {} values for {} codes", src.len(), dst.len());
    let c = Fp8Consts::of(format);
    dispatch!(encode_fp8_generic, encode_fp8_avx512, encode_fp8_avx2, (c, scale, src, dst))
}

tiers!(widen_bf16_generic => widen_bf16_avx512, widen_bf16_avx2 (src: &[bf16], dst: &mut [f32]));
tiers!(narrow_bf16_generic => narrow_bf16_avx512, narrow_bf16_avx2 (src: &[f32], dst: &mut [bf16]));

/// The f16 conversions by the CPU's conversion instructions, 16 values at a time (AVX-512) or
/// 8 (F16C), the tail by the `half` crate's.
#[cfg(target_arch = "x86_64")]
mod f16_instructions {
    use super::*;
    use std::arch::x86_64::*;

    /// Round to nearest even (`half`'s rounding), no exceptions (AVX-512's form; F16C's
    /// immediate has no bit for it, and the exceptions are masked in MXCSR anyway).
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    /// The first min(len) elements of `src` converted into `dst`: `W` at a time by `chunk`
    /// (given exactly `W` of each), the rest by `tail`. Inlined into each caller, so `chunk`'s
    /// instructions run with the caller's target features.
    #[inline(always)]
    fn in_chunks<const W: usize, S, D>(
        src: &[S],
        dst: &mut [D],
        chunk: impl Fn(&[S], &mut [D]),
        tail: fn(&[S], &mut [D]),
    ) {
        let n = dst.len().min(src.len());
        let whole = n / W * W;
        for (d, s) in dst[..whole].chunks_exact_mut(W).zip(src[..whole].chunks_exact(W)) {
            chunk(s, d);
        }
        tail(&src[whole..n], &mut dst[whole..n]);
    }

    #[target_feature(enable = "avx512f")]
    pub fn widen_avx512(src: &[f16], dst: &mut [f32]) {
        in_chunks::<16, _, _>(
            src,
            dst,
            // SAFETY: `s` holds 16 f16 (32 bytes, read unaligned) and `d` 16 f32 (64 bytes).
            |s, d| unsafe { _mm512_storeu_ps(d.as_mut_ptr(), _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().cast()))) },
            widen_f16_generic,
        );
    }

    #[target_feature(enable = "avx512f")]
    pub fn narrow_avx512(src: &[f32], dst: &mut [f16]) {
        in_chunks::<16, _, _>(
            src,
            dst,
            // SAFETY: `s` holds 16 f32 (64 bytes) and `d` 16 f16 (32 bytes), both unaligned.
            |s, d| unsafe {
                _mm256_storeu_si256(d.as_mut_ptr().cast(), _mm512_cvtps_ph::<NEAREST>(_mm512_loadu_ps(s.as_ptr())))
            },
            narrow_f16_generic,
        );
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn widen_avx2(src: &[f16], dst: &mut [f32]) {
        in_chunks::<8, _, _>(
            src,
            dst,
            // SAFETY: `s` holds 8 f16 (16 bytes, read unaligned) and `d` 8 f32 (32 bytes).
            |s, d| unsafe { _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast()))) },
            widen_f16_generic,
        );
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn narrow_avx2(src: &[f32], dst: &mut [f16]) {
        in_chunks::<8, _, _>(
            src,
            dst,
            // SAFETY: `s` holds 8 f32 (32 bytes) and `d` 8 f16 (16 bytes), both unaligned.
            |s, d| unsafe {
                _mm_storeu_si128(
                    d.as_mut_ptr().cast(),
                    _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr())),
                )
            },
            narrow_f16_generic,
        );
    }
}

/// `dst[j] = src[j]` widened from bf16, for every j of `dst`.
///
/// # Panics
/// When `src` is shorter than `dst`.
pub fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
    assert!(src.len() >= dst.len(), "vmath::widen_bf16: source shorter than destination");
    dispatch!(widen_bf16_generic, widen_bf16_avx512, widen_bf16_avx2, (src, dst))
}

/// `dst[j] = src[j]` rounded to bf16, for every j of `dst`.
///
/// # Panics
/// When `src` is shorter than `dst`.
pub fn narrow_bf16(src: &[f32], dst: &mut [bf16]) {
    assert!(src.len() >= dst.len(), "vmath::narrow_bf16: source shorter than destination");
    dispatch!(narrow_bf16_generic, narrow_bf16_avx512, narrow_bf16_avx2, (src, dst))
}

/// `dst[j] = src[j]` widened from f16, for every j of `dst`.
///
/// # Panics
/// When `src` is shorter than `dst`.
pub fn widen_f16(src: &[f16], dst: &mut [f32]) {
    assert!(src.len() >= dst.len(), "vmath::widen_f16: source shorter than destination");
    dispatch!(widen_f16_generic, f16_instructions::widen_avx512, f16_instructions::widen_avx2, (src, dst))
}

/// `dst[j] = src[j]` rounded to f16, for every j of `dst`.
///
/// # Panics
/// When `src` is shorter than `dst`.
pub fn narrow_f16(src: &[f32], dst: &mut [f16]) {
    assert!(src.len() >= dst.len(), "vmath::narrow_f16: source shorter than destination");
    dispatch!(narrow_f16_generic, f16_instructions::narrow_avx512, f16_instructions::narrow_avx2, (src, dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_values_are_counted_and_nothing_else() {
        let edge = [f32::MAX, -f32::MAX, f32::MIN_POSITIVE, 1e-45, -0.0, 0.0, 1.0];
        assert_eq!(count_non_finite(&edge), 0);
        let bad = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN, f32::from_bits(0x7f80_0001)];
        assert_eq!(count_non_finite(&bad), bad.len());
        // One bad value anywhere in a long slice, at a chunk's edge and in the tail.
        let n = 3 * (1 << 15) + 7;
        for at in [0, (1 << 15) - 1, 1 << 15, n - 1] {
            let mut xs: Vec<f32> = (0..n).map(|i| i as f32 * 1e30).collect();
            assert!(all_finite(&xs), "{at}");
            xs[at] = f32::NAN;
            assert!(!all_finite(&xs), "{at}");
            assert_eq!(count_non_finite(&xs), 1);
        }
        assert!(all_finite(&[]));
    }

    #[test]
    fn fp8_slices_encode_as_the_scalar_encoder_does() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            // Every code's value, the midpoints between neighbours (ties) and one f32 ulp either
            // side of each, both signs; then a sweep over the f32 bit patterns (NaNs, infinities,
            // subnormals and the saturating range among them).
            let mut xs = Vec::new();
            let values: Vec<f32> = (0u8..=0x7F).map(|c| format.decode(c)).filter(|v| v.is_finite()).collect::<Vec<_>>();
            for w in values.windows(2) {
                let mid = (w[0] + w[1]) / 2.0;
                for v in [w[0], mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1)] {
                    xs.extend([v, -v]);
                }
            }
            let top = format.max();
            xs.extend([top, top * 1.0625, f32::MAX, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0, 1e-30]);
            xs.extend((0..(1u64 << 32)).step_by(7919).map(|b| f32::from_bits(b as u32)));
            for scale in [1.0f32, 0.37, 3.0e3] {
                let mut got = vec![0u8; xs.len()];
                let amax = encode_fp8(format, scale, &xs, &mut got);
                for (x, g) in xs.iter().zip(&got) {
                    assert_eq!(
                        *g,
                        format.encode(x * scale),
                        "{format:?} x {x:e} ({:#010x}) scale {scale}",
                        x.to_bits()
                    );
                }
                assert!(amax.is_nan(), "a NaN among the inputs makes amax NaN");
            }
            let finite: Vec<f32> = xs.iter().copied().filter(|v| v.is_finite()).take(1000).collect();
            let mut codes = vec![0u8; finite.len()];
            let want = finite.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(encode_fp8(format, 1.0, &finite, &mut codes), want);
        }
    }

    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        let ulp = f64::from(f32::from_bits(w.to_bits() + 1) - w);
        (f64::from(got) - want).abs() / ulp
    }

    #[test]
    fn exp_is_within_two_ulp_over_its_normal_range() {
        let mut worst = (0.0f64, 0.0f32);
        let mut x = -87.0f32;
        while x <= 88.7 {
            for dx in [0.0f32, 1.3e-3, 7.7e-6] {
                let v = x + dx;
                let e = ulps(exp(v), f64::from(v).exp());
                if e > worst.0 {
                    worst = (e, v);
                }
            }
            x += 0.001_37;
        }
        assert!(worst.0 <= 2.0, "exp: {} ulp at x = {}", worst.0, worst.1);
    }

    #[test]
    fn exp_special_values() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(88.72).is_finite() && exp(88.72) > 3.39e38);
    }

    #[test]
    fn exp_shifted_masks_sums_and_keeps_nan() {
        let mut row: Vec<f32> =
            (0..37).map(|i| if i % 5 == 0 { f32::NEG_INFINITY } else { i as f32 * 0.25 - 4.0 }).collect();
        let src = row.clone();
        let sum = exp_shifted(&mut row, 1.5);
        let mut want_sum = 0.0f64;
        for (g, s) in row.iter().zip(&src) {
            let w = if *s == f32::NEG_INFINITY { 0.0 } else { (f64::from(*s) - 1.5).exp() };
            want_sum += w;
            assert!((f64::from(*g) - w).abs() <= 2e-7 * w, "{g} against {w}");
        }
        assert!((f64::from(sum) - want_sum).abs() <= 1e-6 * want_sum);
        // A NaN reference: every visible entry NaN, masked ones 0.
        let mut row = vec![1.0, f32::NEG_INFINITY, 2.0];
        assert!(exp_shifted(&mut row, f32::NAN).is_nan());
        assert!(row[0].is_nan() && row[1] == 0.0 && row[2].is_nan());
    }

    #[test]
    fn map_applies_the_function_elementwise() {
        let a: Vec<f32> = (0..100).map(|i| i as f32 * 0.1 - 5.0).collect();
        let b: Vec<f32> = (0..120).map(|i| i as f32).collect();
        let mut out = vec![0.0f32; 100];
        map([&a, &b], &mut out, |[x, y]| exp(x) * y);
        for j in 0..100 {
            let w = f64::from(a[j]).exp() * f64::from(b[j]);
            assert!((f64::from(out[j]) - w).abs() <= 3e-7 * w.abs() + 1e-30, "{j}");
        }
    }

    #[test]
    fn conversions_match_the_half_crate_bit_for_bit() {
        // Every bf16 and f16 bit pattern widened, and f32 values around every rounding case
        // (ties, NaN, infinities, overflow, subnormals) narrowed; 37 elements so that a tail
        // past the 16-wide chunks is covered.
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for chunk in all.chunks(37) {
            let b: Vec<bf16> = chunk.iter().map(|&x| bf16::from_bits(x)).collect();
            let h: Vec<f16> = chunk.iter().map(|&x| f16::from_bits(x)).collect();
            let mut wb = vec![0.0f32; chunk.len()];
            let mut wh = vec![0.0f32; chunk.len()];
            widen_bf16(&b, &mut wb);
            widen_f16(&h, &mut wh);
            for j in 0..chunk.len() {
                assert_eq!(wb[j].to_bits(), b[j].to_f32().to_bits(), "bf16 {:#06x}", chunk[j]);
                let (got, want) = (wh[j], h[j].to_f32());
                assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "f16 {:#06x}", chunk[j]);
            }
        }
        let mut xs: Vec<f32> = vec![
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
            65520.0,
            65519.0,
            1e-8,
            -3e-41,
        ];
        for base in [1.0f32, 3.0, 0.1, 1e-5, 6.1e-5, 2.0e4, 3.3e38] {
            let u = base.to_bits();
            for d in [0u32, 1, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1_0000, 0x1_8000] {
                xs.push(f32::from_bits(u + d));
                xs.push(-f32::from_bits(u + d));
            }
        }
        let mut nb = vec![bf16::ZERO; xs.len()];
        let mut nh = vec![f16::ZERO; xs.len()];
        narrow_bf16(&xs, &mut nb);
        narrow_f16(&xs, &mut nh);
        for (j, x) in xs.iter().enumerate() {
            let (gb, wb) = (nb[j], bf16::from_f32(*x));
            assert!(gb.to_bits() == wb.to_bits() || (gb.is_nan() && wb.is_nan()), "bf16 of {x:e}: {gb} against {wb}");
            let (gh, wh) = (nh[j], f16::from_f32(*x));
            assert!(gh.to_bits() == wh.to_bits() || (gh.is_nan() && wh.is_nan()), "f16 of {x:e}: {gh} against {wh}");
        }
    }

    /// The values the tier test runs on: a spread of magnitudes with NaN, infinities, zeros and
    /// subnormals among them, 1037 of them (a tail past every vector width).
    fn tier_inputs() -> Vec<f32> {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut xs: Vec<f32> = (0..1037)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let u = (state >> 40) as f32 / (1u64 << 24) as f32;
                (u - 0.5) * [1.0f32, 30.0, 200.0, 1e-40, 7e4][(state % 5) as usize]
            })
            .collect();
        for (at, v) in [(3, f32::NAN), (40, f32::INFINITY), (41, f32::NEG_INFINITY), (500, -0.0), (1036, 1e-45)] {
            xs[at] = v;
        }
        xs
    }

    /// Bits, with every NaN read as one (`half` and the conversion instructions may quiet a NaN
    /// differently; the tiers must agree on where NaNs are, not on their payloads).
    fn bits(xs: &[f32]) -> Vec<u32> {
        xs.iter().map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() }).collect()
    }

    /// Each tier the CPU running the test has computes the baseline's bits (the second tier's
    /// code is what CPUs without AVX-512 run, CI's among them).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn every_tier_computes_the_baseline_bits() {
        // `$f512(args)` on the AVX-512 tier (`wide`), else `$f2(args)`.
        macro_rules! on_tier {
            ($wide:expr, $f512:path, $f2:path, ($($a:expr),*)) => {
                if $wide { $f512($($a),*) } else { $f2($($a),*) }
            };
        }
        let xs = tier_inputs();
        let finite: Vec<f32> = xs.iter().map(|v| if v.is_finite() { *v } else { 0.5 }).collect();
        let ys: Vec<f32> = finite.iter().rev().copied().collect();
        let n = xs.len();
        let f = |[x, y]: [f32; 2]| exp(x * 0.01) * y - x;
        let c = Fp8Consts::of(Fp8Format::E4M3);
        // (name, whether it is the AVX-512 tier) of each tier this CPU has.
        let mut tiers = Vec::new();
        if has_avx2() {
            tiers.push(("avx2", false));
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            tiers.push(("avx512", true));
        }
        assert!(!tiers.is_empty() || !std::arch::is_x86_feature_detected!("avx2"), "has_avx2 said no on an AVX2 CPU");
        for (name, wide) in tiers {
            // SAFETY: each tier's functions run only where the CPU has its extensions (checked
            // when the tier was pushed above).
            unsafe {
                let (mut a, mut b) = (xs.clone(), xs.clone());
                let sa = on_tier!(wide, exp_shifted_avx512, exp_shifted_avx2, (&mut a, 1.25));
                let sb = exp_shifted_generic(&mut b, 1.25);
                assert_eq!((bits(&a), bits(&[sa])), (bits(&b), bits(&[sb])), "{name} exp_shifted");
                let w = on_tier!(wide, dot_avx512, dot_avx2, (&finite, &ys));
                assert_eq!(w.to_bits(), dot_generic(&finite, &ys).to_bits(), "{name} dot");
                let w = on_tier!(wide, max_nan_avx512, max_nan_avx2, (&finite));
                assert_eq!(w.to_bits(), max_nan_generic(&finite).to_bits(), "{name} max_nan");
                let w = on_tier!(wide, amax_avx512, amax_avx2, (&xs));
                assert_eq!(bits(&[w]), bits(&[amax_generic(&xs)]), "{name} amax");
                let w = on_tier!(wide, count_non_finite_avx512, count_non_finite_avx2, (&xs));
                assert_eq!((w, count_non_finite_generic(&xs)), (3, 3), "{name} count_non_finite");
                let (mut wo, mut go) = (vec![0.0f32; n], vec![0.0f32; n]);
                on_tier!(wide, map_avx512, map_avx2, ([&xs, &ys], &mut wo, f));
                map_generic([&xs, &ys], &mut go, f);
                assert_eq!(bits(&wo), bits(&go), "{name} map");
                let w = on_tier!(wide, sum_f64_avx512, sum_f64_avx2, ([&finite, &ys], f));
                assert_eq!(w.to_bits(), sum_f64_generic([&finite, &ys], f).to_bits(), "{name} sum_f64");
                let (mut wa, mut ga) = (xs.clone(), xs.clone());
                on_tier!(wide, scale_avx512, scale_avx2, (&mut wa, -3.5));
                scale_generic(&mut ga, -3.5);
                assert_eq!(bits(&wa), bits(&ga), "{name} scale");
                let (mut wc, mut gc) = (vec![0u8; n], vec![0u8; n]);
                let w = on_tier!(wide, encode_fp8_avx512, encode_fp8_avx2, (c, 3.0, &xs, &mut wc));
                let g = encode_fp8_generic(c, 3.0, &xs, &mut gc);
                assert_eq!((wc, bits(&[w])), (gc, bits(&[g])), "{name} encode_fp8");
                // The 16-bit conversions, narrowed then widened back.
                let (mut wb, mut gb) = (vec![bf16::ZERO; n], vec![bf16::ZERO; n]);
                let (mut wh, mut gh) = (vec![f16::ZERO; n], vec![f16::ZERO; n]);
                let (mut w32, mut g32) = (vec![0.0f32; n], vec![0.0f32; n]);
                on_tier!(wide, narrow_bf16_avx512, narrow_bf16_avx2, (&xs, &mut wb));
                narrow_bf16_generic(&xs, &mut gb);
                on_tier!(wide, widen_bf16_avx512, widen_bf16_avx2, (&wb, &mut w32));
                widen_bf16_generic(&gb, &mut g32);
                assert_eq!(bits(&w32), bits(&g32), "{name} bf16");
                on_tier!(wide, f16_instructions::narrow_avx512, f16_instructions::narrow_avx2, (&xs, &mut wh));
                narrow_f16_generic(&xs, &mut gh);
                on_tier!(wide, f16_instructions::widen_avx512, f16_instructions::widen_avx2, (&wh, &mut w32));
                widen_f16_generic(&gh, &mut g32);
                assert_eq!(bits(&w32), bits(&g32), "{name} f16");
            }
        }
    }

    #[test]
    fn sum_f64_sums_every_term_in_f64() {
        let a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..1003).map(|i| 1.0 + i as f32 * 1e-3).collect();
        let got = sum_f64([&a, &b], |[x, y]| x * y);
        let want: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y)).sum();
        assert!((got - want).abs() <= 1e-12 * want.abs().max(1.0), "{got} against {want}");
        assert_eq!(sum_f64([&a[..0]], |[x]| x), 0.0);
        assert!(sum_f64([&[1.0, f32::NAN, 2.0][..]], |[x]| x).is_nan());
    }
}
