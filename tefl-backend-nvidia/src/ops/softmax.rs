//! The fused softmax variants: one block per row, the row kept in registers when it fits.

use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use super::{Kernel, blocks_for, cty, empty, i32_of};
use crate::compiler::{Arg, Grid, Source, ptr};
use crate::heuristics::{self, RowConfig};

static SRC: Source = Source { name: "softmax", text: include_str!("softmax.cu") };

#[derive(Clone, Copy)]
enum MaskKind {
    None = 0,
    Tensor = 1,
    UpperTriang = 2,
    AlignedCausal = 3,
}

fn kernel(op: &'static str, ctx: &KernelCtx<'_>, x: DType, g: DType, mask: MaskKind, cfg: RowConfig) -> Result<Kernel> {
    Ok(Kernel::new(
        ctx.device,
        &SRC,
        vec![
            ("TX", cty(op, "x", x)?.to_string()),
            ("TG", cty(op, "dy", g)?.to_string()),
            ("MASK", (mask as u8).to_string()),
            ("BLOCK", cfg.block.to_string()),
            ("ROW_VECS", cfg.row_vecs.max(1).to_string()),
            ("FUSED", u8::from(cfg.row_vecs > 0).to_string()),
            ("VEC_BYTES", cfg.vec_bytes.to_string()),
        ],
    ))
}

fn forward(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    x: &Tensor,
    mask: Option<&Tensor>,
    kind: MaskKind,
    scale: f32,
) -> Result<SoftmaxOut> {
    let s = x.shape();
    let (sq, sk) = (s[s.len() - 2], s[s.len() - 1]);
    let h = if s.len() == 4 { s[1] } else { 1 };
    let rows = x.rows();
    let y = empty(ctx.device, s, x.dtype())?;
    if rows == 0 || sk == 0 {
        return Ok(SoftmaxOut { y });
    }
    let (mask_ptr, mask_batch) = match mask {
        Some(m) => (ptr(m)?, m.shape()[0]),
        None => (0, 1),
    };
    let args = [
        Arg::Ptr(ptr(x)?),
        Arg::Ptr(mask_ptr),
        Arg::Ptr(ptr(&y)?),
        Arg::I32(i32_of(op, "x", rows)?),
        Arg::I32(i32_of(op, "x", sq)?),
        Arg::I32(i32_of(op, "x", sk)?),
        Arg::I32(i32_of(op, "x", h)?),
        Arg::I32(i32_of(op, "mask", mask_batch)?),
        Arg::F32(scale),
    ];
    let run = |cfg: RowConfig| -> Result<()> {
        let k = kernel(op, ctx, x.dtype(), x.dtype(), kind, cfg)?;
        k.launch("softmax_fwd", Grid::linear(blocks_for(rows, 1, i32::MAX as u32), cfg.block), &args)
    };
    // The heuristic, or (TEFL_AUTOTUNE=1) the fastest candidate for this row length.
    let cfg = heuristics::tuned_row_kernel("softmax", ctx.device, super::arch(ctx.device), x.dtype(), sk, |cfg| {
        heuristics::measure(ctx.device, &|| run(cfg))
    });
    run(cfg)?;
    Ok(SoftmaxOut { y })
}

fn backward(op: &'static str, ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    let (rows, sk) = (a.y.rows(), a.y.last_dim());
    let dx = empty(ctx.device, a.y.shape(), a.y.dtype())?;
    if rows == 0 || sk == 0 {
        return Ok(SoftmaxBwdOut { dx });
    }
    let cfg = heuristics::row_kernel("softmax", super::arch(ctx.device), sk, a.y.dtype().size_in_bytes());
    let k = kernel(op, ctx, a.y.dtype(), a.dy.dtype(), MaskKind::None, cfg)?;
    k.launch(
        "softmax_bwd",
        Grid::linear(blocks_for(rows, 1, i32::MAX as u32), cfg.block),
        &[
            Arg::Ptr(ptr(&a.dy)?),
            Arg::Ptr(ptr(&a.y)?),
            Arg::Ptr(ptr(&dx)?),
            Arg::I32(i32_of(op, "y", rows)?),
            Arg::I32(i32_of(op, "y", sk)?),
            Arg::F32(a.scale),
        ],
    )?;
    Ok(SoftmaxBwdOut { dx })
}

pub fn scaled_softmax_forward(ctx: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_softmax_forward", ctx, &a.x, None, MaskKind::None, a.scale)
}
pub fn scaled_masked_softmax_forward(ctx: &KernelCtx<'_>, a: &MaskedSoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_masked_softmax_forward", ctx, &a.x, Some(&a.mask), MaskKind::Tensor, a.scale)
}
pub fn scaled_upper_triang_masked_softmax_forward(ctx: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_upper_triang_masked_softmax_forward", ctx, &a.x, None, MaskKind::UpperTriang, a.scale)
}
pub fn scaled_aligned_causal_masked_softmax_forward(ctx: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_aligned_causal_masked_softmax_forward", ctx, &a.x, None, MaskKind::AlignedCausal, a.scale)
}
pub fn scaled_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_softmax_backward", ctx, a)
}
pub fn scaled_masked_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_masked_softmax_backward", ctx, a)
}
pub fn scaled_upper_triang_masked_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_upper_triang_masked_softmax_backward", ctx, a)
}
pub fn scaled_aligned_causal_masked_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_aligned_causal_masked_softmax_backward", ctx, a)
}

/// Define sets covering every code path (the NVRTC compile test and cache warm-up).
pub fn compile_variants() -> Vec<(&'static Source, Vec<(&'static str, String)>)> {
    let mut v = Vec::new();
    for (x, g) in [("bf16", "bf16"), ("float", "f16"), ("f16", "float")] {
        for mask in 0..4 {
            for fused in [0, 1] {
                v.push((
                    &SRC,
                    vec![
                        ("TX", x.to_string()),
                        ("TG", g.to_string()),
                        ("MASK", mask.to_string()),
                        ("BLOCK", "256".into()),
                        ("ROW_VECS", "2".into()),
                        ("FUSED", fused.to_string()),
                        ("VEC_BYTES", "16".into()),
                    ],
                ));
            }
        }
    }
    v
}
