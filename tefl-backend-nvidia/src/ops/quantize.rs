//! FP8 per-tensor scaling on CUDA: quantize (with amax and scale_inv in the same pass, and
//! an optional transpose), dequantize, amax, transpose of codes and the delayed-scaling update.

use tefl_core::catalogue::*;
use tefl_core::fp8::Fp8Format;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use super::{Kernel, blocks_for, cty, empty, i32_of, sm_count, zeros};
use crate::compiler::{Arg, Grid, Source, ptr};

static SRC: Source = Source { name: "quantize", text: include_str!("quantize.cu") };
const BLOCK: u32 = 256;

fn kernel(op: &'static str, ctx: &KernelCtx<'_>, float: DType, fp8: DType) -> Result<Kernel> {
    let f = Fp8Format::of(fp8).ok_or_else(|| Error::invalid(op, "fp8_dtype", format!("{fp8} is not an fp8 dtype")))?;
    let (mant, bias) = match f {
        Fp8Format::E4M3 => (3, 7),
        Fp8Format::E5M2 => (2, 15),
    };
    Ok(Kernel::new(
        ctx.device,
        &SRC,
        vec![
            ("TX", cty(op, "x", float)?.to_string()),
            ("MANT", mant.to_string()),
            ("BIAS", bias.to_string()),
            ("MAXV", format!("{:.1}f", f.max())),
            ("MAXCODE", f.max_code().to_string()),
            ("BLOCK", BLOCK.to_string()),
        ],
    ))
}

fn grid(ctx: &KernelCtx<'_>, n: usize) -> Grid {
    Grid::linear(blocks_for(n, BLOCK as usize, sm_count(ctx.device) * 8), BLOCK)
}

fn transpose(k: &Kernel, op: &'static str, q: &Tensor) -> Result<Tensor> {
    let (m, n) = (q.shape()[0], q.shape()[1]);
    let qt = empty(q.device(), &[n, m], q.dtype())?;
    k.launch(
        "transpose_u8",
        Grid { blocks: (n.div_ceil(32) as u32, m.div_ceil(32) as u32, 1), threads: (32, 8, 1), smem: 0 },
        &[Arg::Ptr(ptr(q)?), Arg::Ptr(ptr(&qt)?), Arg::I32(i32_of(op, "q", m)?), Arg::I32(i32_of(op, "q", n)?)],
    )?;
    Ok(qt)
}

pub fn quantize(ctx: &KernelCtx<'_>, a: &QuantizeArgs) -> Result<QuantizeOut> {
    const OP: &str = "quantize";
    let k = kernel(OP, ctx, a.x.dtype(), a.fp8_dtype)?;
    let n = a.x.numel();
    let q = empty(ctx.device, a.x.shape(), a.fp8_dtype)?;
    let amax = zeros(ctx.device, &[1], DType::F32)?;
    let scale_inv = empty(ctx.device, &[1], DType::F32)?;
    k.launch(
        "quantize",
        grid(ctx, n),
        &[
            Arg::Ptr(ptr(&a.x)?),
            Arg::Ptr(ptr(&a.scale)?),
            Arg::Ptr(ptr(&q)?),
            Arg::Ptr(ptr(&amax)?),
            Arg::Ptr(ptr(&scale_inv)?),
            Arg::U64(n as u64),
        ],
    )?;
    let q_t = if a.want_transpose { Some(transpose(&k, OP, &q)?) } else { None };
    Ok(QuantizeOut { q, q_t, amax, scale_inv })
}

pub fn dequantize(ctx: &KernelCtx<'_>, a: &DequantizeArgs) -> Result<DequantizeOut> {
    let k = kernel("dequantize", ctx, a.out_dtype, a.q.dtype())?;
    let n = a.q.numel();
    let y = empty(ctx.device, a.q.shape(), a.out_dtype)?;
    k.launch(
        "dequantize",
        grid(ctx, n),
        &[Arg::Ptr(ptr(&a.q)?), Arg::Ptr(ptr(&a.scale_inv)?), Arg::Ptr(ptr(&y)?), Arg::U64(n as u64)],
    )?;
    Ok(DequantizeOut { y })
}

pub fn compute_amax(ctx: &KernelCtx<'_>, a: &ComputeAmaxArgs) -> Result<ComputeAmaxOut> {
    let k = kernel("compute_amax", ctx, a.x.dtype(), DType::F8E4M3)?;
    let n = a.x.numel();
    let amax = zeros(ctx.device, &[1], DType::F32)?;
    k.launch("compute_amax", grid(ctx, n), &[Arg::Ptr(ptr(&a.x)?), Arg::Ptr(ptr(&amax)?), Arg::U64(n as u64)])?;
    Ok(ComputeAmaxOut { amax })
}

pub fn fp8_transpose(ctx: &KernelCtx<'_>, a: &Fp8TransposeArgs) -> Result<Fp8TransposeOut> {
    let k = kernel("fp8_transpose", ctx, DType::F32, a.q.dtype())?;
    Ok(Fp8TransposeOut { q_t: transpose(&k, "fp8_transpose", &a.q)? })
}

pub fn delayed_scaling(ctx: &KernelCtx<'_>, a: &DelayedScalingArgs) -> Result<DelayedScalingOut> {
    const OP: &str = "fused_amax_and_scale_update_after_reduction";
    let k = kernel(OP, ctx, DType::F32, DType::F8E4M3)?;
    let (hist, n) = (a.amax_history.shape()[0], a.amax_history.shape()[1]);
    k.launch(
        "delayed_scaling",
        Grid::linear(n.div_ceil(128) as u32, 128),
        &[
            Arg::Ptr(ptr(&a.amax_history)?),
            Arg::Ptr(ptr(&a.scale)?),
            Arg::Ptr(ptr(&a.scale_inv)?),
            Arg::I32(i32_of(OP, "amax_history", hist)?),
            Arg::I32(i32_of(OP, "amax_history", n)?),
            Arg::F32(a.fp8_max),
            Arg::F32(a.margin),
            Arg::I32(i32::from(matches!(a.algo, AmaxAlgo::Max))),
        ],
    )?;
    Ok(DelayedScalingOut {})
}

/// Define sets covering every code path (the NVRTC compile test and cache warm-up).
pub fn compile_variants() -> Vec<(&'static Source, Vec<(&'static str, String)>)> {
    let mut v = Vec::new();
    for t in ["float", "f16", "bf16"] {
        for (mant, bias, maxv, code) in [(3, 7, "448.0f", 126), (2, 15, "57344.0f", 123)] {
            v.push((
                &SRC,
                vec![
                    ("TX", t.to_string()),
                    ("MANT", mant.to_string()),
                    ("BIAS", bias.to_string()),
                    ("MAXV", maxv.to_string()),
                    ("MAXCODE", code.to_string()),
                    ("BLOCK", BLOCK.to_string()),
                ],
            ));
        }
    }
    v
}
