//! Rotary position embedding on Vulkan (`shaders/rope.wgsl`): forward and backward, every
//! layout (thd through cu_seqlens), start positions, interleaved or half rotation, with the
//! catalogue's `rope_geometry` checks. `shaders/rope_vec.wgsl` where x is 16-bit and heads
//! and the rotated part are whole 16-byte chunks (one invocation per token row and chunk,
//! across the heads, cos/sin once per row); else `shaders/rope.wgsl`, one output word per
//! invocation, cos/sin per element.

use tefl_core::catalogue::*;
use tefl_core::{DType, Error, KernelCtx, Result, Tensor};

use super::{MAX_GROUPS, dtype_name};
use crate::gpu::gpu;

/// Bytes of the shader's push constants (ten 32-bit fields).
const PUSH_BYTES: u32 = 40;

fn run(op: &'static str, ctx: &KernelCtx<'_>, a: &RopeArgs, backward: bool) -> Result<RopeOut> {
    let g = rope_geometry(op, a)?;
    let y = Tensor::uninit(a.x.shape(), a.x.dtype(), &ctx.device)?;
    let total = a.x.numel();
    if total == 0 {
        return Ok(RopeOut { y });
    }
    if total >= (1usize << 31) || a.freqs.numel() >= (1usize << 31) {
        return Err(Error::Unsupported {
            op,
            impl_id: ctx.impl_id.to_string(),
            reason: format!("{total} elements; the Vulkan shaders index with 32 bits"),
        });
    }
    let wg = crate::heuristics::elementwise_workgroup(ctx.device)?;
    // The 16-byte path: 16-bit x, heads and the rotated part in whole chunks of 8 (the halves
    // too when they rotate against each other).
    let whole = g.d.is_multiple_of(8) && g.d_rot.is_multiple_of(if a.interleaved { 8 } else { 16 });
    let vec = whole && super::half_name(a.x.dtype()).is_some();
    let shader = if vec { "rope_vec" } else { "rope" };
    let name = format!("{shader}.tx={}.wg={wg}", dtype_name(op, "x", a.x.dtype())?);
    let gpu = gpu(ctx.device)?;
    let pipeline = gpu.pipeline(&name, 5, PUSH_BYTES)?;
    let bind = super::binding;
    let bindings = [
        bind(&a.x)?,
        bind(&a.freqs)?,
        bind(a.cu_seqlens.as_ref().unwrap_or(&a.freqs))?,
        bind(a.start_positions.as_ref().unwrap_or(&a.freqs))?,
        bind(&y)?,
    ];
    let push: Vec<u8> = [
        a.layout as u32,
        u32::from(a.interleaved),
        u32::from(backward),
        g.batch as u32,
        g.s as u32,
        g.h as u32,
        g.d as u32,
        g.d_rot as u32,
        u32::from(a.start_positions.is_some()),
        total as u32,
    ]
    .iter()
    .flat_map(|v| v.to_le_bytes())
    .collect();
    // Work items: (token row, chunk of a head) pairs on the 16-byte path, else output words.
    let items =
        if vec { total / g.h.max(1) / 8 } else { total.div_ceil(if a.x.dtype() == DType::F32 { 1 } else { 2 }) };
    let groups = (items as u32).div_ceil(wg).clamp(1, MAX_GROUPS);
    gpu.run(|r| r.dispatch(&pipeline, &bindings, &push, (groups, 1, 1)))?;
    Ok(RopeOut { y })
}

/// `fused_rope_forward`.
pub fn fused_rope_forward(ctx: &KernelCtx<'_>, a: &RopeArgs) -> Result<RopeOut> {
    run("fused_rope_forward", ctx, a, false)
}

/// `fused_rope_backward`.
pub fn fused_rope_backward(ctx: &KernelCtx<'_>, a: &RopeArgs) -> Result<RopeOut> {
    run("fused_rope_backward", ctx, a, true)
}
