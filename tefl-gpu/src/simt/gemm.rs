//! `generic_gemm` on any SIMT target, and the GEMM epilogue every GPU backend shares.
//!
//! The portable path: `simt/gemm.cu`'s tiled kernel writes alpha·op(A)·op(B) in f32 (no tensor
//! cores), then `simt/gemm_epilogue.cu` adds C and the bias, applies GELU or dGELU, rounds to D
//! and sums the bias gradient over the unrounded values. A backend with a GEMM library (CUDA's
//! cuBLASLt) writes the f32 product itself and calls [`finish_epilogue`] for the epilogues its
//! library does not fuse.

use tefl_core::catalogue::*;
use tefl_core::fp8::Fp8Format;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use super::host::{Arg, Grid, OnDevice, blocks_for, cty, empty, i32_of, opt_ptr, ptr, sm_count, zeros};
use crate::{Defines, Variant};

const OP: &str = "generic_gemm";
/// Rows and columns of w one block of the tiled kernel computes (`TILE_M`, `TILE_N`).
const TILE: usize = 64;
/// Threads of a tiled-kernel block (`GEMM_THREADS`).
const GEMM_THREADS: u32 = 256;

/// The epilogue's code in `gemm_epilogue.cu` (`EP`).
fn ep_code(ep: GemmEpilogue) -> u8 {
    match ep {
        GemmEpilogue::None => 0,
        GemmEpilogue::Bias => 1,
        GemmEpilogue::Gelu => 2,
        GemmEpilogue::BiasGelu => 3,
        GemmEpilogue::DGelu => 4,
        GemmEpilogue::DGeluBiasGrad => 5,
        GemmEpilogue::BiasGrad => 6,
    }
}

/// The epilogue variant of `simt/gemm_epilogue.cu` for the c, bias, aux and output dtypes
/// (`None`: the output's) and an epilogue (launches and the compile tests).
fn epilogue_variant(
    c: Option<DType>,
    bias: Option<DType>,
    aux: Option<DType>,
    out: DType,
    ep: GemmEpilogue,
) -> Result<Variant> {
    let out_t = cty(OP, "out_dtype", out)?;
    let or_out =
        |arg: &'static str, d: Option<DType>| d.map(|d| cty(OP, arg, d)).transpose().map(|t| t.unwrap_or(out_t));
    let defines = Defines::new()
        .set("TC", or_out("c", c)?)
        .set("TB", or_out("bias", bias)?)
        .set("TAUX", or_out("aux", aux)?)
        .set("TD", out_t)
        .set("EP", ep_code(ep));
    Ok(Variant::new(&tefl_kernels::GEMM_EPILOGUE, &["gemm_epilogue", "col_sum_partial", "col_sum_finish"], defines))
}

/// The variant of `simt/gemm.cu` for the dtypes of A and B: float inputs (the dtype of both), or
/// FP8 codes of either format each (`FP8_IN`, decoded in the kernel).
fn tiled_variant(a: DType, b: DType) -> Result<Variant> {
    let defines = if a.is_fp8() {
        let format = |arg: &'static str, d: DType| {
            let expected = "f8e4m3 or f8e5m2 (as a)";
            Fp8Format::of(d).map(|f| (f.mantissa_bits(), f.bias())).ok_or_else(|| Error::DType {
                op: OP,
                arg,
                got: d,
                expected: expected.into(),
            })
        };
        let ((am, ab), (bm, bb)) = (format("a", a)?, format("b", b)?);
        Defines::new().set("FP8_IN", 1).set("A_MANT", am).set("A_BIAS", ab).set("B_MANT", bm).set("B_BIAS", bb)
    } else {
        Defines::new().set("TA", cty(OP, "a", a)?)
    };
    Ok(Variant::new(&tefl_kernels::GEMM_TILED, &["gemm_tiled"], defines))
}

/// The epilogue kernel on the f32 product `w` (`[m, n]`, alpha already applied), then the bias
/// gradient when asked for: D, aux_out and bias_grad as `generic_gemm` returns them.
pub fn finish_epilogue(
    ctx: &KernelCtx<'_>,
    a: &GemmArgs,
    m: usize,
    n: usize,
    w: Tensor,
    d: Tensor,
    aux_out: Option<Tensor>,
) -> Result<GemmOut> {
    let dev = ctx.device;
    let c = a.c.as_ref().filter(|_| a.accumulate);
    let variant = epilogue_variant(
        c.map(Tensor::dtype),
        a.bias.as_ref().map(Tensor::dtype),
        a.aux.as_ref().map(Tensor::dtype),
        a.out_dtype,
        a.epilogue,
    )?;
    let k = OnDevice::new(dev, variant)?;
    let total = m * n;
    let sms = sm_count(dev);
    k.launch(
        "gemm_epilogue",
        Grid::linear(blocks_for(total, 256, sms * 16), 256),
        &[
            Arg::Ptr(ptr(&w)?),
            Arg::Ptr(opt_ptr(c)?),
            Arg::Ptr(opt_ptr(a.bias.as_ref())?),
            Arg::Ptr(opt_ptr(a.aux.as_ref())?),
            Arg::Ptr(ptr(&d)?),
            Arg::Ptr(opt_ptr(aux_out.as_ref())?),
            Arg::U64(total as u64),
            Arg::I32(i32_of(ctx, OP, "b", n)?),
            Arg::I32(i32::from(c.is_some())),
        ],
    )?;
    let bias_grad = if a.epilogue.writes_bias_grad() {
        let col_blocks = n.div_ceil(256) as u32;
        let parts = (sms * 4).div_ceil(col_blocks).clamp(1, m.max(1) as u32);
        let ws = empty(dev, &[parts as usize, n], DType::F32)?;
        let bg = empty(dev, &[n], DType::F32)?;
        let n_i = i32_of(ctx, OP, "b", n)?;
        k.launch(
            "col_sum_partial",
            Grid { blocks: (col_blocks, parts, 1), threads: (256, 1, 1), smem: 0 },
            &[Arg::Ptr(ptr(&w)?), Arg::Ptr(ptr(&ws)?), Arg::I32(i32_of(ctx, OP, "a", m)?), Arg::I32(n_i)],
        )?;
        k.launch(
            "col_sum_finish",
            Grid::linear(col_blocks, 256),
            &[Arg::Ptr(ptr(&ws)?), Arg::Ptr(ptr(&bg)?), Arg::I32(parts as i32), Arg::I32(n_i)],
        )?;
        Some(bg)
    } else {
        None
    };
    Ok(GemmOut { d, aux_out, bias_grad, d_amax: None })
}

/// The GEMM `a` into the float D an FP8 D is quantized from ([`quantize_fp8_d`]): D of
/// `aux_dtype(out)` (bf16 for an FP8 D, as its GELU pre-activation; a float D's own dtype), no
/// `d_scale`.
pub fn float_d_args(a: &GemmArgs) -> GemmArgs {
    GemmArgs { out_dtype: aux_dtype(a.out_dtype), d_scale: None, ..a.clone() }
}

/// An FP8-output GEMM's result `r`, computed with [`float_d_args`], finished: D quantized with
/// `d_scale`, its amax as `d_amax`. A float D's result is returned unchanged. (The FP8 paths of
/// every GPU backend end here.)
pub fn quantize_fp8_d(ctx: &KernelCtx<'_>, a: &GemmArgs, r: GemmOut) -> Result<GemmOut> {
    if !a.out_dtype.is_fp8() {
        return Ok(r);
    }
    let args = QuantizeArgs { x: r.d, scale: a.fp8_d_scale()?.clone(), fp8_dtype: a.out_dtype, want_transpose: false };
    let q = super::quantize::quantize(ctx, &args)?;
    Ok(GemmOut { d: q.q, d_amax: Some(q.amax), ..r })
}

/// `generic_gemm` with the portable tiled kernel and the shared epilogue. FP8 inputs are
/// decoded in the kernel, their scales multiplying alpha there; an FP8 D is made as bf16 and
/// quantized ([`quantize_fp8_d`]).
pub fn generic_gemm(ctx: &KernelCtx<'_>, a: &GemmArgs) -> Result<GemmOut> {
    if a.out_dtype.is_fp8() {
        return quantize_fp8_d(ctx, a, float_gemm(ctx, &float_d_args(a))?);
    }
    float_gemm(ctx, a)
}

/// [`generic_gemm`] into a float D.
fn float_gemm(ctx: &KernelCtx<'_>, a: &GemmArgs) -> Result<GemmOut> {
    let (m, k, n) = gemm_dims(a)?;
    let dev = ctx.device;
    let d = empty(dev, &[m, n], a.out_dtype)?;
    let aux_out = if a.epilogue.writes_aux() { Some(empty(dev, &[m, n], a.out_dtype)?) } else { None };
    if m == 0 || n == 0 {
        let bias_grad = if a.epilogue.writes_bias_grad() { Some(zeros(dev, &[n], DType::F32)?) } else { None };
        return Ok(GemmOut { d, aux_out, bias_grad, d_amax: None });
    }
    let (m_i, n_i, k_i) = (i32_of(ctx, OP, "a", m)?, i32_of(ctx, OP, "b", n)?, i32_of(ctx, OP, "a", k)?);
    let row_tiles = m.div_ceil(TILE);
    if row_tiles > 65535 {
        return Err(super::host::unsupported(ctx, OP, format!("'a': {m} rows need {row_tiles} row tiles, over 65535")));
    }
    // The kernel reads the scales only with FP8 inputs.
    let (sa, sb) = if a.a.dtype().is_fp8() {
        let (sa, sb) = a.fp8_scales()?;
        (ptr(sa)?, ptr(sb)?)
    } else {
        (0, 0)
    };
    let w = if k == 0 {
        // No product: D is C (or zero) through the epilogue.
        zeros(dev, &[m, n], DType::F32)?
    } else {
        let w = empty(dev, &[m, n], DType::F32)?;
        OnDevice::new(dev, tiled_variant(a.a.dtype(), a.b.dtype())?)?.launch(
            "gemm_tiled",
            Grid { blocks: (n.div_ceil(TILE) as u32, row_tiles as u32, 1), threads: (GEMM_THREADS, 1, 1), smem: 0 },
            &[
                Arg::Ptr(ptr(&a.a)?),
                Arg::Ptr(ptr(&a.b)?),
                Arg::Ptr(ptr(&w)?),
                Arg::I32(m_i),
                Arg::I32(n_i),
                Arg::I32(k_i),
                Arg::I32(i32::from(a.transa)),
                Arg::I32(i32::from(a.transb)),
                Arg::F32(a.alpha),
                Arg::Ptr(sa),
                Arg::Ptr(sb),
            ],
        )?;
        w
    };
    finish_epilogue(ctx, a, m, n, w, d, aux_out)
}

/// Variants covering every code path: the tiled kernel per input dtype and the epilogue per
/// epilogue kind (the compile tests).
pub fn variants() -> Vec<Variant> {
    use GemmEpilogue as E;
    let (e4, e5) = (DType::F8E4M3, DType::F8E5M2);
    let tiled = [(DType::F32, DType::F32), (DType::F16, DType::F16), (DType::BF16, DType::BF16), (e4, e5), (e5, e4)]
        .into_iter()
        .filter_map(|(a, b)| tiled_variant(a, b).ok());
    let epilogues = [E::None, E::Bias, E::Gelu, E::BiasGelu, E::DGelu, E::DGeluBiasGrad, E::BiasGrad]
        .into_iter()
        .filter_map(|ep| epilogue_variant(Some(DType::F32), Some(DType::BF16), Some(DType::F16), DType::BF16, ep).ok());
    tiled.chain(epilogues).collect()
}
