//! Rotary position embedding on every GPU target: a warp per heads of a token row when a head's
//! 16-byte vectors tile the warp, else a block per token row (or rows of one position); every
//! layout, interleaved or half-split pairs, cu_seqlens and start positions.

use crate::{Defines, Variant};
use tefl_core::catalogue::*;
use tefl_core::{DType, KernelCtx, Result};

use super::host::{Arg, Grid, OnDevice, blocks_for, cty, empty, i32_of, info, opt_ptr, ptr, tune_table};
use crate::tune;

/// Which kernel of `simt/rope.cu` a call runs; each is compiled alone (`ROPE_KERNEL`), so a
/// cold start compiles only the one it launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// `rope`: any head and rotated dims, element by element.
    Scalar = 0,
    /// `rope_vec`: 16-byte vectors, a block per token row (or rows of one position).
    Vector = 1,
    /// `rope_warp`: 16-byte vectors, a warp per heads of a token row.
    Warp = 2,
}

impl Kernel {
    /// The kernel for heads of `d` elements with `d_rot` rotated, `ve` elements a vector.
    fn pick(d: usize, d_rot: usize, interleaved: bool, ve: usize) -> Kernel {
        let rotated = if interleaved { d_rot } else { d_rot / 2 };
        if !(d.is_multiple_of(ve) && rotated.is_multiple_of(ve)) {
            Kernel::Scalar
        } else if warp_kernel_fits(d, ve) {
            Kernel::Warp
        } else {
            Kernel::Vector
        }
    }

    /// The entry point (as a variant's entry list).
    fn entries(self) -> &'static [&'static str] {
        match self {
            Kernel::Scalar => &["rope"],
            Kernel::Vector => &["rope_vec"],
            Kernel::Warp => &["rope_warp"],
        }
    }
}

/// The variant of `simt/rope.cu` for a kernel, dtype, layout, direction, head / rotated dims,
/// rows a block (`group`, the vector kernel) and whether x is held in L2 (`keep_l2`, the warp
/// kernel): launches and the compile test.
#[allow(clippy::too_many_arguments)]
fn variant(
    kernel: Kernel,
    op: &'static str,
    x: DType,
    layout: QkvLayout,
    interleaved: bool,
    backward: bool,
    d: usize,
    d_rot: usize,
    group: usize,
    keep_l2: bool,
) -> Result<Variant> {
    let defines = Defines::new()
        .set("ROPE_KERNEL", kernel as u8)
        .set("TX", cty(op, "x", x)?)
        .set("LAYOUT", layout as u8)
        .flag("INTERLEAVED", interleaved)
        .flag("BACKWARD", backward)
        .set("D", d)
        .set("DROT", d_rot)
        .set("GROUP", group)
        .set("HEADS", WARP_HEADS)
        .flag("KEEP_L2", keep_l2);
    Ok(Variant::new(&tefl_kernels::ROPE, kernel.entries(), defines))
}

/// Heads a warp of `rope_warp` takes (of one token row). H200, bench shape (s4096 b4 h32 d128
/// bf16, sbhd), 2026-11-26, two runs each: 16 heads with 4 vectors a lane in flight 0.072 /
/// 0.073 ms, 32 heads 0.073 / 0.074, 16 heads with 2 vectors 0.074 / 0.074, 8 with 2 0.078 /
/// 0.079; the block kernel (`rope_vec`) 0.082 / 0.082. A lane has had all 8 of its vectors in
/// flight since 2026-11-28 (0.071 ms; docs/performance-log.md).
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

/// What a call with these arguments runs: its geometry, kernel, rows a block and, for the warp
/// kernel, whether it holds x in L2 (the first token row it releases, [`tune::l2_keep`] with
/// the tune configs' `rope_l2` entry: the Hopper file sets it).
struct Plan {
    g: RopeGeometry,
    kernel: Kernel,
    group: usize,
    release_from: Option<usize>,
}

impl Plan {
    fn of(op: &'static str, ctx: &KernelCtx<'_>, a: &RopeArgs) -> Result<Plan> {
        let g = rope_geometry(op, a)?;
        let ve = 16 / a.x.dtype().size_in_bytes();
        let kernel = Kernel::pick(g.d, g.d_rot, a.interleaved, ve);
        let group = if kernel == Kernel::Vector { rows_per_block(a, g.batch) } else { 1 };
        let release_from = if kernel == Kernel::Warp {
            let row_bytes = g.h * g.d * a.x.dtype().size_in_bytes();
            tune::l2_keep(&*tune_table(ctx.device)?, "rope_l2", token_rows(a, &g), row_bytes)
        } else {
            None
        };
        Ok(Plan { g, kernel, group, release_from })
    }

    /// The variant of the call's direction (`backward`) or the other's.
    fn variant(&self, op: &'static str, a: &RopeArgs, backward: bool) -> Result<Variant> {
        let g = &self.g;
        let keep = self.release_from.is_some();
        variant(self.kernel, op, a.x.dtype(), a.layout, a.interleaved, backward, g.d, g.d_rot, self.group, keep)
    }
}

/// Token rows of x (h heads of d elements each).
fn token_rows(a: &RopeArgs, g: &RopeGeometry) -> usize {
    a.x.numel() / (g.h * g.d).max(1)
}

/// A RoPE warm-up (`tefl_core::Manager::warmup`): starts compiling, on another thread, the
/// kernel a call with these arguments launches (and, forward, the backward its first call
/// compiles ahead), launching nothing.
fn warmup(op: &'static str, ctx: &KernelCtx<'_>, a: &RopeArgs, backward: bool) -> Result<()> {
    let plan = Plan::of(op, ctx, a)?;
    let target = crate::target::target_of(ctx.device)?;
    target.compile_ahead(ctx.device, &plan.variant(op, a, backward)?);
    if !backward {
        target.compile_ahead(ctx.device, &plan.variant(op, a, true)?);
    }
    Ok(())
}

/// `fused_rope_forward`'s warm-up (see `warmup`).
pub fn warmup_rope_forward(ctx: &KernelCtx<'_>, a: &RopeArgs) -> Result<()> {
    warmup("fused_rope_forward", ctx, a, false)
}

/// `fused_rope_backward`'s warm-up (see `warmup`).
pub fn warmup_rope_backward(ctx: &KernelCtx<'_>, a: &RopeArgs) -> Result<()> {
    warmup("fused_rope_backward", ctx, a, true)
}

fn run(op: &'static str, ctx: &KernelCtx<'_>, a: &RopeArgs, backward: bool) -> Result<RopeOut> {
    let plan = Plan::of(op, ctx, a)?;
    let (g, kernel, group) = (&plan.g, plan.kernel, plan.group);
    let variant_for = |backward| plan.variant(op, a, backward);
    let k = OnDevice::new(ctx.device, variant_for(backward)?)?;
    if !backward {
        // The backward of the same call shape: compiled on another thread on the first call.
        k.compile_ahead(|| Ok(vec![variant_for(true)?]));
    }
    let y = empty(ctx.device, a.x.shape(), a.x.dtype())?;
    let rows = token_rows(a, g);
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
    match kernel {
        Kernel::Warp => {
            // One warp per WARP_HEADS heads of a row, 128-thread blocks.
            let warps_per_block = (128 / info(ctx.device)?.warp_size.max(1)).max(1) as usize;
            let items = rows * g.h.div_ceil(WARP_HEADS);
            let mut args = common.to_vec();
            args.push(Arg::I32(i32_of(ctx, op, "x", plan.release_from.unwrap_or(rows))?));
            k.launch("rope_warp", Grid::linear(blocks_for(items, warps_per_block, i32::MAX as u32), 128), &args)?;
        }
        Kernel::Vector => k.launch("rope_vec", grid, &common)?,
        Kernel::Scalar => {
            let mut args = common.to_vec();
            args.extend([Arg::I32(i32_of(ctx, op, "x", g.d)?), Arg::I32(i32_of(ctx, op, "freqs", g.d_rot)?)]);
            k.launch("rope", grid, &args)?;
        }
    }
    Ok(RopeOut { y })
}

/// The catalogue op `fused_rope_forward` on a GPU through the portable kernels of `simt/rope.cu` (every SIMT backend's impl).
pub fn fused_rope_forward(ctx: &KernelCtx<'_>, a: &RopeArgs) -> Result<RopeOut> {
    run("fused_rope_forward", ctx, a, false)
}

/// The catalogue op `fused_rope_backward` on a GPU through the portable kernels of `simt/rope.cu` (every SIMT backend's impl).
pub fn fused_rope_backward(ctx: &KernelCtx<'_>, a: &RopeArgs) -> Result<RopeOut> {
    run("fused_rope_backward", ctx, a, true)
}

/// Variants covering every code path (the NVRTC compile test).
pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for t in [DType::F32, DType::BF16] {
        for layout in [QkvLayout::Bshd, QkvLayout::Sbhd, QkvLayout::Thd] {
            for interleaved in [false, true] {
                for backward in [false, true] {
                    for kernel in [Kernel::Scalar, Kernel::Vector, Kernel::Warp] {
                        v.extend(variant(kernel, "rope", t, layout, interleaved, backward, 64, 32, 1, false));
                    }
                    // The warp kernel holding x in L2.
                    v.extend(variant(Kernel::Warp, "rope", t, layout, interleaved, backward, 64, 32, 1, true));
                }
                // Row groups (bshd / sbhd only) touch only the vector kernel's row addressing:
                // one direction covers them.
                if layout != QkvLayout::Thd {
                    v.extend(variant(Kernel::Vector, "rope", t, layout, interleaved, false, 64, 32, 2, false));
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::Kernel;

    #[test]
    fn picks_the_kernel_by_head_shape() {
        // bf16 (8 a vector): d 128 is 16 vectors, which tile a warp.
        assert_eq!(Kernel::pick(128, 128, false, 8), Kernel::Warp);
        assert_eq!(Kernel::pick(64, 32, true, 8), Kernel::Warp);
        // 12 vectors a head do not tile a warp; 64 are more than one.
        assert_eq!(Kernel::pick(96, 96, false, 8), Kernel::Vector);
        assert_eq!(Kernel::pick(512, 512, false, 8), Kernel::Vector);
        // Half of 20 rotated dims is not a whole vector of 8; d 100 is not either.
        assert_eq!(Kernel::pick(64, 20, false, 8), Kernel::Scalar);
        assert_eq!(Kernel::pick(100, 96, false, 8), Kernel::Scalar);
        // f32 (4 a vector): d 256 is 64 vectors.
        assert_eq!(Kernel::pick(128, 128, false, 4), Kernel::Warp);
        assert_eq!(Kernel::pick(256, 256, true, 4), Kernel::Vector);
    }
}
