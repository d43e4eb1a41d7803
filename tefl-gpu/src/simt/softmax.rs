//! The fused softmax variants: one block per row, the row kept in registers when it fits.

use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result, Tensor};

use crate::tune::{self, RowConfig};
use crate::{Defines, Variant};

use super::host::{Arg, Grid, OnDevice, blocks_for, cty, empty, i32_of, info, ptr, tune_table};

/// The kernels of `simt/softmax.cu` these ops launch.
const ENTRIES: &[&str] = &["softmax_fwd", "softmax_bwd"];

#[derive(Clone, Copy)]
enum MaskKind {
    None = 0,
    Tensor = 1,
    UpperTriang = 2,
    AlignedCausal = 3,
}

/// The variant of `softmax.cu` for these dtypes, mask and row config: the one place its
/// defines are built (launches and the compile test both call it). `keep_l2`: the fused
/// backward loads y and dy with an L2 evict_last policy (see [`keep_l2`]).
fn variant(op: &'static str, x: DType, g: DType, mask: MaskKind, cfg: RowConfig, keep_l2: bool) -> Result<Variant> {
    let defines = Defines::new()
        .set("TX", cty(op, "x", x)?)
        .set("TG", cty(op, "dy", g)?)
        .set("MASK", mask as u8)
        .set("BLOCK", cfg.block)
        .set("ROW_VECS", cfg.row_vecs.max(1))
        .flag("FUSED", cfg.fused())
        .flag("PAIR_MAX", cfg.fused() && matches!(mask, MaskKind::None) && x.size_in_bytes() == 2)
        .set("VEC_BYTES", cfg.vec_bytes)
        .flag("KEEP_L2", keep_l2 && cfg.fused());
    Ok(Variant::new(&tefl_kernels::SOFTMAX, ENTRIES, defines))
}

fn kernel(
    op: &'static str,
    ctx: &KernelCtx<'_>,
    x: DType,
    g: DType,
    mask: MaskKind,
    cfg: RowConfig,
    keep_l2: bool,
) -> Result<OnDevice> {
    OnDevice::new(ctx.device, variant(op, x, g, mask, cfg, keep_l2)?)
}

/// Where the backward holds y and dy in L2 while a row is in use (an L2 evict_last policy, as
/// torch.compile's kernel loads them), the first row whose lines it releases once its dx is
/// stored: the device's tune table decides (`softmax_bwd_l2`, by the two inputs' bytes; see
/// [`tune::l2_keep`]). On an H200 it made the 16384 x 8192 bf16 backward 1% faster (the
/// measurements are in `simt/softmax.cu`).
fn keep_l2(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<Option<usize>> {
    let row_bytes = a.y.last_dim() * (a.y.dtype().size_in_bytes() + a.dy.dtype().size_in_bytes());
    Ok(tune::l2_keep(&*tune_table(ctx.device)?, "softmax_bwd_l2", a.y.rows(), row_bytes))
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
        Arg::I32(i32_of(ctx, op, "x", rows)?),
        Arg::I32(i32_of(ctx, op, "x", sq)?),
        Arg::I32(i32_of(ctx, op, "x", sk)?),
        Arg::I32(i32_of(ctx, op, "x", h)?),
        Arg::I32(i32_of(ctx, op, "mask", mask_batch)?),
        Arg::F32(scale),
    ];
    let run = |cfg: RowConfig| -> Result<()> {
        let k = kernel(op, ctx, x.dtype(), x.dtype(), kind, cfg, false)?;
        k.launch("softmax_fwd", Grid::linear(blocks_for(rows, 1, i32::MAX as u32), cfg.block), &args)
    };
    // The heuristic, or (TEFL_AUTOTUNE=1) the fastest candidate for this row length.
    let (table, info) = (tune_table(ctx.device)?, info(ctx.device)?);
    let cfg =
        tune::tuned_row_kernel(&table, "softmax", &info, x.dtype(), sk, |cfg| tune::measure(ctx.device, &|| run(cfg)));
    run(cfg)?;
    Ok(SoftmaxOut { y })
}

fn backward(op: &'static str, ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    let (rows, sk) = (a.y.rows(), a.y.last_dim());
    let dx = empty(ctx.device, a.y.shape(), a.y.dtype())?;
    if rows == 0 || sk == 0 {
        return Ok(SoftmaxBwdOut { dx });
    }
    let release_from = keep_l2(ctx, a)?;
    let args = [
        Arg::Ptr(ptr(&a.dy)?),
        Arg::Ptr(ptr(&a.y)?),
        Arg::Ptr(ptr(&dx)?),
        Arg::I32(i32_of(ctx, op, "y", rows)?),
        Arg::I32(i32_of(ctx, op, "y", sk)?),
        Arg::F32(a.scale),
        Arg::I32(i32_of(ctx, op, "y", release_from.unwrap_or(rows))?),
    ];
    let run = |cfg: RowConfig| -> Result<()> {
        let k = kernel(op, ctx, a.y.dtype(), a.dy.dtype(), MaskKind::None, cfg, release_from.is_some())?;
        k.launch("softmax_bwd", Grid::linear(blocks_for(rows, 1, i32::MAX as u32), cfg.block), &args)
    };
    // The backward's own list (`[[softmax_bwd]]`) where the tune configs have one, else the
    // forward's; tuned (TEFL_AUTOTUNE=1) under its own name either way.
    let (table, info) = (tune_table(ctx.device)?, info(ctx.device)?);
    let cfg = tune::tuned_row_kernel_as(&table, "softmax", "softmax_bwd", &info, a.y.dtype(), sk, |cfg| {
        tune::measure(ctx.device, &|| run(cfg))
    });
    run(cfg)?;
    Ok(SoftmaxBwdOut { dx })
}

/// The catalogue op `scaled_softmax_forward` on a GPU through the portable kernels of `simt/softmax.cu` (every SIMT backend's impl).
pub fn scaled_softmax_forward(ctx: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_softmax_forward", ctx, &a.x, None, MaskKind::None, a.scale)
}
/// The catalogue op `scaled_masked_softmax_forward` on a GPU through the portable kernels of `simt/softmax.cu` (every SIMT backend's impl).
pub fn scaled_masked_softmax_forward(ctx: &KernelCtx<'_>, a: &MaskedSoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_masked_softmax_forward", ctx, &a.x, Some(&a.mask), MaskKind::Tensor, a.scale)
}
/// The catalogue op `scaled_upper_triang_masked_softmax_forward` on a GPU through the portable kernels of `simt/softmax.cu` (every SIMT backend's impl).
pub fn scaled_upper_triang_masked_softmax_forward(ctx: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_upper_triang_masked_softmax_forward", ctx, &a.x, None, MaskKind::UpperTriang, a.scale)
}
/// The catalogue op `scaled_aligned_causal_masked_softmax_forward` on a GPU through the portable kernels of `simt/softmax.cu` (every SIMT backend's impl).
pub fn scaled_aligned_causal_masked_softmax_forward(ctx: &KernelCtx<'_>, a: &SoftmaxArgs) -> Result<SoftmaxOut> {
    forward("scaled_aligned_causal_masked_softmax_forward", ctx, &a.x, None, MaskKind::AlignedCausal, a.scale)
}
/// The catalogue op `scaled_softmax_backward` on a GPU through the portable kernels of `simt/softmax.cu` (every SIMT backend's impl).
pub fn scaled_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_softmax_backward", ctx, a)
}
/// The catalogue op `scaled_masked_softmax_backward` on a GPU through the portable kernels of `simt/softmax.cu` (every SIMT backend's impl).
pub fn scaled_masked_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_masked_softmax_backward", ctx, a)
}
/// The catalogue op `scaled_upper_triang_masked_softmax_backward` on a GPU through the portable kernels of `simt/softmax.cu` (every SIMT backend's impl).
pub fn scaled_upper_triang_masked_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_upper_triang_masked_softmax_backward", ctx, a)
}
/// The catalogue op `scaled_aligned_causal_masked_softmax_backward` on a GPU through the portable kernels of `simt/softmax.cu` (every SIMT backend's impl).
pub fn scaled_aligned_causal_masked_softmax_backward(ctx: &KernelCtx<'_>, a: &SoftmaxBwdArgs) -> Result<SoftmaxBwdOut> {
    backward("scaled_aligned_causal_masked_softmax_backward", ctx, a)
}

/// Variants covering every code path (the NVRTC compile test).
pub fn variants() -> Vec<Variant> {
    use DType::{BF16, F16, F32};
    let mut v = Vec::new();
    for (x, g) in [(BF16, BF16), (F32, F16), (F16, F32)] {
        for mask in [MaskKind::None, MaskKind::Tensor, MaskKind::UpperTriang, MaskKind::AlignedCausal] {
            for cfg in [RowConfig { block: 256, vec_bytes: 16, row_vecs: 2 }, RowConfig::two_pass(256)] {
                v.extend(variant("softmax", x, g, mask, cfg, false));
            }
        }
        // The backward holding y and dy in L2.
        v.extend(variant("softmax", x, g, MaskKind::None, RowConfig { block: 512, vec_bytes: 16, row_vecs: 2 }, true));
    }
    v
}
