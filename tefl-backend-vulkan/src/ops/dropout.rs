//! Dropout on Vulkan (`shaders/dropout.wgsl`) with tefl_core's Philox 4x32-10 stream, so the
//! mask is the reference's bit for bit: forward (one invocation per Philox block of four
//! elements) and backward.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use super::{MAX_GROUPS, dtype_name};
use crate::gpu::gpu;

/// Bytes of the shader's push constants (seven 32-bit fields).
const PUSH_BYTES: u32 = 28;

#[allow(clippy::too_many_arguments)]
fn launch(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    stage: u32,
    x: &Tensor,
    mask: &Tensor,
    out: &Tensor,
    p: f32,
    seed: u64,
    offset: u64,
) -> Result<()> {
    let total = x.numel();
    if total == 0 {
        return Ok(());
    }
    if total >= (1usize << 31) {
        return Err(Error::Unsupported {
            op,
            impl_id: ctx.impl_id.to_string(),
            reason: format!("{total} elements; the Vulkan shaders index with 32 bits"),
        });
    }
    let wg = crate::heuristics::elementwise_workgroup(ctx.device)?;
    let name = format!("dropout.tx={}.wg={wg}", dtype_name(op, "x", x.dtype())?);
    let gpu = gpu(ctx.device)?;
    let pipeline = gpu.pipeline(&name, 3, PUSH_BYTES)?;
    let bind = super::binding;
    let bindings = [bind(x)?, bind(mask)?, bind(out)?];
    let mut push: Vec<u8> =
        [stage, total as u32, seed as u32, (seed >> 32) as u32, offset as u32, (offset >> 32) as u32]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
    push.extend_from_slice(&p.to_le_bytes());
    let items =
        if stage == 0 { total.div_ceil(4) } else { total.div_ceil(if x.dtype() == DType::F32 { 1 } else { 2 }) };
    let groups = (items as u32).div_ceil(wg).clamp(1, MAX_GROUPS);
    gpu.run(|r| r.dispatch(&pipeline, &bindings, &push, (groups, 1, 1)))
}

/// `dropout_fwd`.
pub fn dropout_fwd(ctx: &KernelCtx<'_>, a: &DropoutFwdArgs) -> Result<DropoutFwdOut> {
    let y = Tensor::uninit(a.x.shape(), a.x.dtype(), &ctx.device)?;
    let mask = Tensor::uninit(a.x.shape(), DType::U8, &ctx.device)?;
    launch("dropout_fwd", ctx, 0, &a.x, &mask, &y, a.p, a.seed, a.offset)?;
    Ok(DropoutFwdOut { y, mask })
}

/// `dropout_bwd`.
pub fn dropout_bwd(ctx: &KernelCtx<'_>, a: &DropoutBwdArgs) -> Result<DropoutBwdOut> {
    let dx = Tensor::uninit(a.dy.shape(), a.dy.dtype(), &ctx.device)?;
    launch("dropout_bwd", ctx, 1, &a.dy, &a.mask, &dx, a.p, 0, 0)?;
    Ok(DropoutBwdOut { dx })
}
