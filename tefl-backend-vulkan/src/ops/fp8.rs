//! FP8 with per-tensor scaling on Vulkan (`shaders/fp8.wgsl`): quantize (codes, amax and
//! scale_inv in one pass, the transposed codes when asked), dequantize, amax, transpose of
//! codes and the delayed-scaling update (in place), with tefl_core's saturating
//! round-to-nearest-even encoding; `bgrad_quantize` as quantize and the activations' column
//! sums (`shaders/activation_dbias.wgsl` with the identity), a second pass over x where the
//! CUDA backend makes one.

use tefl_core::catalogue::*;
use tefl_core::fp8::Fp8Format;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use super::{MAX_GROUPS, dtype_name};
use crate::gpu::gpu;

/// Bytes of the shader's push constants (eleven 32-bit fields).
const PUSH_BYTES: u32 = 44;

/// The shader's stages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Quantize = 0,
    Amax = 1,
    Dequantize = 2,
    QuantizeTransposed = 3,
    TransposeCodes = 4,
    DelayedScaling = 5,
}

/// One dispatch: `float` is the shader's float dtype, `fp8` the format; the five bindings are
/// src, scale, dst, amax, scale_inv (an absent one bound as `src`).
#[allow(clippy::too_many_arguments)]
fn launch(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    stage: Stage,
    float: DType,
    fp8: DType,
    total: usize,
    (m, n): (usize, usize),
    bindings: [&Tensor; 5],
    extra: (f32, f32, bool),
) -> Result<()> {
    if total >= (1usize << 31) {
        return Err(Error::Unsupported {
            op,
            impl_id: ctx.impl_id.to_string(),
            reason: format!("{total} elements; the Vulkan shaders index with 32 bits"),
        });
    }
    let f = Fp8Format::of(fp8).ok_or_else(|| Error::invalid(op, "fp8_dtype", format!("{fp8} is not an fp8 dtype")))?;
    let (mant, bias) = (f.mantissa_bits() as u32, f.bias() as u32);
    let wg = crate::heuristics::elementwise_workgroup(ctx.device)?;
    let name = format!("fp8.tx={}.wg={wg}", dtype_name(op, "x", float)?);
    let gpu = gpu(ctx.device)?;
    let pipeline = gpu.pipeline(&name, 5, PUSH_BYTES)?;
    let b = bindings.iter().map(|t| super::binding(t)).collect::<Result<Vec<_>>>()?;
    let mut push: Vec<u8> = Vec::with_capacity(PUSH_BYTES as usize);
    for v in [stage as u32, total as u32, m as u32, n as u32, mant, bias, u32::from(f.max_code())] {
        push.extend_from_slice(&v.to_le_bytes());
    }
    for v in [f.max(), extra.0, extra.1] {
        push.extend_from_slice(&v.to_le_bytes());
    }
    push.extend_from_slice(&u32::from(extra.2).to_le_bytes());
    let items = match stage {
        Stage::Quantize | Stage::QuantizeTransposed | Stage::TransposeCodes => total.div_ceil(4),
        Stage::Dequantize => total.div_ceil(if float == DType::F32 { 1 } else { 2 }),
        Stage::Amax => total,
        Stage::DelayedScaling => n,
    };
    let groups = (items as u32).div_ceil(wg).clamp(1, MAX_GROUPS);
    gpu.run(|r| r.dispatch(&pipeline, &b, &push, (groups, 1, 1)))
}

/// `quantize`.
pub fn quantize(ctx: &KernelCtx<'_>, a: &QuantizeArgs) -> Result<QuantizeOut> {
    const OP: &str = "quantize";
    let dev = ctx.device;
    let total = a.x.numel();
    let q = Tensor::uninit(a.x.shape(), a.fp8_dtype, &dev)?;
    let amax = Tensor::zeros([1], DType::F32, &dev)?;
    let scale_inv = Tensor::uninit([1], DType::F32, &dev)?;
    let binds = [&a.x, &a.scale, &q, &amax, &scale_inv];
    let no = (0.0, 0.0, false);
    launch(OP, ctx, Stage::Quantize, a.x.dtype(), a.fp8_dtype, total, (0, 0), binds, no)?;
    let q_t = if a.want_transpose {
        let (m, n) = (a.x.shape()[0], a.x.shape()[1]);
        let qt = Tensor::uninit([n, m], a.fp8_dtype, &dev)?;
        let binds = [&a.x, &a.scale, &qt, &amax, &scale_inv];
        launch(OP, ctx, Stage::QuantizeTransposed, a.x.dtype(), a.fp8_dtype, total, (m, n), binds, no)?;
        Some(qt)
    } else {
        None
    };
    Ok(QuantizeOut { q, q_t, amax, scale_inv })
}

/// `bgrad_quantize`: [`quantize`] of x (which also rejects an x past the shaders' 32-bit
/// indices), then x's column sums in x's dtype.
pub fn bgrad_quantize(ctx: &KernelCtx<'_>, a: &BgradQuantizeArgs) -> Result<BgradQuantizeOut> {
    let args = QuantizeArgs {
        x: a.x.clone(),
        scale: a.scale.clone(),
        fp8_dtype: a.fp8_dtype,
        want_transpose: a.want_transpose,
    };
    let QuantizeOut { q, q_t, amax, scale_inv } = quantize(ctx, &args)?;
    let dbias = super::activation::column_sums("bgrad_quantize", ctx, &a.x, &a.x, super::activation::IDENTITY)?;
    Ok(BgradQuantizeOut { dbias, q, q_t, amax, scale_inv })
}

/// `dequantize`.
pub fn dequantize(ctx: &KernelCtx<'_>, a: &DequantizeArgs) -> Result<DequantizeOut> {
    let y = Tensor::uninit(a.q.shape(), a.out_dtype, &ctx.device)?;
    let binds = [&a.q, &a.scale_inv, &y, &a.scale_inv, &a.scale_inv];
    let total = a.q.numel();
    launch("dequantize", ctx, Stage::Dequantize, a.out_dtype, a.q.dtype(), total, (0, 0), binds, (0.0, 0.0, false))?;
    Ok(DequantizeOut { y })
}

/// `compute_amax`.
pub fn compute_amax(ctx: &KernelCtx<'_>, a: &ComputeAmaxArgs) -> Result<ComputeAmaxOut> {
    let amax = Tensor::zeros([1], DType::F32, &ctx.device)?;
    let binds = [&a.x, &amax, &amax, &amax, &amax];
    let total = a.x.numel();
    launch("compute_amax", ctx, Stage::Amax, a.x.dtype(), DType::F8E4M3, total, (0, 0), binds, (0.0, 0.0, false))?;
    Ok(ComputeAmaxOut { amax })
}

/// `fp8_transpose`.
pub fn fp8_transpose(ctx: &KernelCtx<'_>, a: &Fp8TransposeArgs) -> Result<Fp8TransposeOut> {
    let (m, n) = (a.q.shape()[0], a.q.shape()[1]);
    let q_t = Tensor::uninit([n, m], a.q.dtype(), &ctx.device)?;
    let binds = [&a.q, &q_t, &q_t, &q_t, &q_t];
    let total = a.q.numel();
    let no = (0.0, 0.0, false);
    launch("fp8_transpose", ctx, Stage::TransposeCodes, DType::F32, a.q.dtype(), total, (m, n), binds, no)?;
    Ok(Fp8TransposeOut { q_t })
}

/// `fused_amax_and_scale_update_after_reduction` (in place).
pub fn delayed_scaling(ctx: &KernelCtx<'_>, a: &DelayedScalingArgs) -> Result<DelayedScalingOut> {
    const OP: &str = "fused_amax_and_scale_update_after_reduction";
    let (hist, n) = (a.amax_history.shape()[0], a.amax_history.shape()[1]);
    let binds = [&a.scale, &a.scale, &a.amax_history, &a.scale, &a.scale_inv];
    let extra = (a.fp8_max, a.margin, matches!(a.algo, AmaxAlgo::Max));
    launch(OP, ctx, Stage::DelayedScaling, DType::F32, DType::F8E4M3, hist * n, (hist, n), binds, extra)?;
    Ok(DelayedScalingOut {})
}
