//! Rotary position embedding on every GPU target: a warp per heads of a token row when a head's
//! 16-byte vectors tile the warp, else a block per token row (or rows of one position); every
//! layout, interleaved or half-split pairs, cu_seqlens and start positions.

use crate::{Defines, Variant};
use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result};

use super::host::{Arg, Grid, OnDevice, blocks_for, cty, empty, i32_of, info, opt_ptr, ptr};

/// The variant of `simt/rope.cu` for a dtype, layout, direction and head / rotated dims
/// (launches and the compile test).
#[allow(clippy::too_many_arguments)]
fn variant(
    op: &'static str,
    x: DType,
    layout: QkvLayout,
    interleaved: bool,
    backward: bool,
    d: usize,
    d_rot: usize,
    group: usize,
) -> Result<Variant> {
    let defines = Defines::new()
        .set("TX", cty(op, "x", x)?)
        .set("LAYOUT", layout as u8)
        .flag("INTERLEAVED", interleaved)
        .flag("BACKWARD", backward)
        .set("D", d)
        .set("DROT", d_rot)
        .set("GROUP", group)
        .set("HEADS", WARP_HEADS);
    Ok(Variant::new(&tefl_kernels::ROPE, &["rope", "rope_vec", "rope_warp"], defines))
}

/// Heads a warp of `rope_warp` takes (of one token row). H200, bench shape (s4096 b4 h32 d128
/// bf16, sbhd), 2026-11-26, two runs each: 16 heads with 4 vectors a lane in flight 0.072 /
/// 0.073 ms, 32 heads 0.073 / 0.074, 16 heads with 2 vectors 0.074 / 0.074, 8 with 2 0.078 /
/// 0.079; the block kernel (`rope_vec`) 0.082 / 0.082.
const WARP_HEADS: usize = 16;

/// Whether `rope_warp` takes heads of `d` elements, `ve` a vector: a lane keeps one vector
/// of each head it takes, so a head's vectors must tile the warp.
fn warp_kernel_fits(d: usize, ve: usize) -> bool {
    let sv = d / ve;
    sv > 0 && sv <= 32 && 32 % sv == 0
}

/// Rows of one position a block of the vector kernel takes: the batch entries of a position
/// share its cos/sin (computed once per block), which needs bshd / sbhd, no start positions
/// and an even batch. Two rows, not four: four held 80 registers a thread and 3 blocks an SM,
/// two fit 4 (rope.cu's launch bounds: 0.082 ms against 0.087 on the H200's bench shape).
fn rows_per_block(a: &RopeArgs, batch: usize) -> usize {
    let shared = matches!(a.layout, QkvLayout::Bshd | QkvLayout::Sbhd) && a.start_positions.is_none();
    if shared && batch.is_multiple_of(2) { 2 } else { 1 }
}

fn run(op: &'static str, ctx: &KernelCtx<'_>, a: &RopeArgs, backward: bool) -> Result<RopeOut> {
    let g = rope_geometry(op, a)?;
    let ve = 16 / a.x.dtype().size_in_bytes();
    let rotated = if a.interleaved { g.d_rot } else { g.d_rot / 2 };
    let vector = g.d.is_multiple_of(ve) && rotated.is_multiple_of(ve);
    let group = if vector && !warp_kernel_fits(g.d, ve) { rows_per_block(a, g.batch) } else { 1 };
    let k =
        OnDevice::new(ctx.device, variant(op, a.x.dtype(), a.layout, a.interleaved, backward, g.d, g.d_rot, group)?)?;
    let y = empty(ctx.device, a.x.shape(), a.x.dtype())?;
    let rows = a.x.numel() / (g.h * g.d).max(1);
    // The vector kernel has h · (rotated + copied vectors per head) slots, about h·d/16 of them.
    let threads = ((g.h * g.d / 16).next_power_of_two()).clamp(32, 256) as u32;
    let grid =
        Grid { smem: (8 * g.d_rot) as u32, ..Grid::linear(blocks_for(rows / group, 1, i32::MAX as u32), threads) };
    let common = [
        Arg::Ptr(ptr(&a.x)?),
        Arg::Ptr(ptr(&a.freqs)?),
        Arg::Ptr(ptr(&y)?),
        Arg::Ptr(opt_ptr(a.cu_seqlens.as_ref())?),
        Arg::Ptr(opt_ptr(a.start_positions.as_ref())?),
        Arg::I32(i32_of(ctx, op, "x", rows)?),
        Arg::I32(i32_of(ctx, op, "x", g.batch)?),
        Arg::I32(i32_of(ctx, op, "x", g.s)?),
        Arg::I32(i32_of(ctx, op, "x", g.h)?),
    ];
    if vector && warp_kernel_fits(g.d, ve) {
        // One warp per WARP_HEADS heads of a row, 128-thread blocks.
        let warps_per_block = (128 / info(ctx.device)?.warp_size.max(1)).max(1) as usize;
        let items = rows * g.h.div_ceil(WARP_HEADS);
        k.launch("rope_warp", Grid::linear(blocks_for(items, warps_per_block, i32::MAX as u32), 128), &common)?;
    } else if vector {
        k.launch("rope_vec", grid, &common)?;
    } else {
        let mut args = common.to_vec();
        args.extend([Arg::I32(i32_of(ctx, op, "x", g.d)?), Arg::I32(i32_of(ctx, op, "freqs", g.d_rot)?)]);
        k.launch("rope", grid, &args)?;
    }
    Ok(RopeOut { y })
}

pub fn fused_rope_forward(ctx: &KernelCtx<'_>, a: &RopeArgs) -> Result<RopeOut> {
    run("fused_rope_forward", ctx, a, false)
}

pub fn fused_rope_backward(ctx: &KernelCtx<'_>, a: &RopeArgs) -> Result<RopeOut> {
    run("fused_rope_backward", ctx, a, true)
}

/// Variants covering every code path (the NVRTC compile test and cache warm-up).
pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for t in [DType::F32, DType::BF16] {
        for layout in [QkvLayout::Bshd, QkvLayout::Sbhd, QkvLayout::Thd] {
            for interleaved in [false, true] {
                for backward in [false, true] {
                    v.extend(variant("rope", t, layout, interleaved, backward, 64, 32, 1));
                }
                // Row groups (bshd / sbhd only) touch only the row addressing: one direction
                // covers them.
                if layout != QkvLayout::Thd {
                    v.extend(variant("rope", t, layout, interleaved, false, 64, 32, 2));
                }
            }
        }
    }
    v
}
