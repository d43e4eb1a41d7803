//! The fused softmax family on Vulkan: one workgroup per row (two for a 16-bit row of odd
//! length, so every output word has one writer), masks by push constant. `softmax_vec.wgsl`
//! where the tensors are one 16-bit dtype and rows are whole 16-byte chunks (16-byte loads,
//! subgroup reductions); `softmax.wgsl` otherwise.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use super::{MAX_GROUPS, dtype_name};
use crate::gpu::gpu;

/// Bytes of the shader's push constants (nine 32-bit fields).
const PUSH_BYTES: u32 = 36;

/// The shader's mask codes.
#[derive(Clone, Copy)]
enum Mask {
    None = 0,
    Tensor = 1,
    UpperTriang = 2,
    AlignedCausal = 3,
}

/// The `softmax_vec` variant for x (and y, dx) of dtype `tx` and dy of `tg` with rows of `sk`
/// on a workgroup of `wg`: `None` where the general shader must run.
fn vec_variant(gpu: &crate::gpu::Gpu, tx: DType, tg: DType, sk: usize, wg: u32) -> Option<String> {
    let name = super::half_name(tx)?;
    (tx == tg && sk.is_multiple_of(8) && gpu.reduces_in_subgroups(wg)).then(|| format!("softmax_vec.tx={name}.wg={wg}"))
}

/// One dispatch of `softmax.wgsl` (or `softmax_vec.wgsl`) over `rows` rows of `sk`: forward
/// (`stage` 0) or backward.
#[allow(clippy::too_many_arguments)]
fn launch(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    stage: u32,
    x: &Tensor,
    g: Option<&Tensor>,
    mask: Option<&Tensor>,
    kind: Mask,
    out: &Tensor,
    scale: f32,
) -> Result<()> {
    let s = x.shape();
    let (sq, sk) = (s[s.len() - 2], s[s.len() - 1]);
    let h = if s.len() == 4 { s[1] } else { 1 };
    let rows = x.rows();
    if rows == 0 || sk == 0 {
        return Ok(());
    }
    if x.numel() >= (1usize << 31) {
        return Err(Error::Unsupported {
            op,
            impl_id: ctx.impl_id.to_string(),
            reason: format!("{} elements; the Vulkan shaders index with 32 bits", x.numel()),
        });
    }
    let rpg: usize = if x.dtype() != DType::F32 && sk % 2 == 1 { 2 } else { 1 };
    let wg = crate::heuristics::elementwise_workgroup(ctx.device)?;
    let tg = g.map_or(x.dtype(), Tensor::dtype);
    let gpu = gpu(ctx.device)?;
    let name = match vec_variant(&gpu, x.dtype(), tg, sk, wg) {
        Some(name) => name,
        None => format!("softmax.tx={}.tg={}.wg={wg}", dtype_name(op, "x", x.dtype())?, dtype_name(op, "dy", tg)?),
    };
    let pipeline = gpu.pipeline(&name, 4, PUSH_BYTES)?;
    let bind = super::binding;
    let bindings = [bind(x)?, bind(g.unwrap_or(x))?, bind(mask.unwrap_or(x))?, bind(out)?];
    let mask_batch = mask.map_or(1, |m| m.shape()[0]);
    let mut push: Vec<u8> =
        [stage, kind as u32, rows as u32, sq as u32, sk as u32, h as u32, mask_batch as u32, rpg as u32]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
    push.extend_from_slice(&scale.to_le_bytes());
    let groups = (rows.div_ceil(rpg) as u32).clamp(1, MAX_GROUPS);
    gpu.run(|r| r.dispatch(&pipeline, &bindings, &push, (groups, 1, 1)))
}

fn forward(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    x: &Tensor,
    mask: Option<&Tensor>,
    kind: Mask,
    scale: f32,
) -> Result<SoftmaxOut> {
    let y = Tensor::uninit(x.shape(), x.dtype(), &ctx.device)?;
    launch(op, ctx, 0, x, None, mask, kind, &y, scale)?;
    Ok(SoftmaxOut { y })
}

fn backward(op: &'static str, ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    let dx = Tensor::uninit(a.y.shape(), a.y.dtype(), &ctx.device)?;
    launch(op, ctx, 1, &a.y, Some(&a.dy), None, Mask::None, &dx, a.scale)?;
    Ok(SoftmaxBwdOut { dx })
}

/// `scaled_softmax_forward`.
pub fn scaled_softmax_forward(ctx: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_softmax_forward", ctx, &a.x, None, Mask::None, a.scale)
}
/// `scaled_masked_softmax_forward`.
pub fn scaled_masked_softmax_forward(ctx: &KernelCtx<'_>, a: &MaskedSoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_masked_softmax_forward", ctx, &a.x, Some(&a.mask), Mask::Tensor, a.scale)
}
/// `scaled_upper_triang_masked_softmax_forward`.
pub fn scaled_upper_triang_masked_softmax_forward(ctx: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_upper_triang_masked_softmax_forward", ctx, &a.x, None, Mask::UpperTriang, a.scale)
}
/// `scaled_aligned_causal_masked_softmax_forward`.
pub fn scaled_aligned_causal_masked_softmax_forward(ctx: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_aligned_causal_masked_softmax_forward", ctx, &a.x, None, Mask::AlignedCausal, a.scale)
}
/// `scaled_softmax_backward`.
pub fn scaled_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_softmax_backward", ctx, a)
}
/// `scaled_masked_softmax_backward`.
pub fn scaled_masked_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_masked_softmax_backward", ctx, a)
}
/// `scaled_upper_triang_masked_softmax_backward`.
pub fn scaled_upper_triang_masked_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_upper_triang_masked_softmax_backward", ctx, a)
}
/// `scaled_aligned_causal_masked_softmax_backward`.
pub fn scaled_aligned_causal_masked_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_aligned_causal_masked_softmax_backward", ctx, a)
}
