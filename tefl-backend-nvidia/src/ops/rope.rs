//! Rotary position embedding on CUDA: one block per token row, every layout, interleaved or
//! half-split pairs, cu_seqlens and start positions.

use tefl_core::catalogue::*;
use tefl_core::{KernelCtx, Result};

use super::{Kernel, blocks_for, cty, empty, i32_of};
use crate::compiler::{Arg, Grid, Source, opt_ptr, ptr};

static SRC: Source = Source { name: "rope", text: include_str!("rope.cu") };

fn run(op: &'static str, ctx: &KernelCtx<'_>, a: &RopeArgs, backward: bool) -> Result<RopeOut> {
    let g = rope_geometry(op, a)?;
    let k = Kernel::new(
        ctx.device,
        &SRC,
        vec![
            ("TX", cty(op, "x", a.x.dtype())?.to_string()),
            ("LAYOUT", (a.layout as u8).to_string()),
            ("INTERLEAVED", u8::from(a.interleaved).to_string()),
            ("BACKWARD", u8::from(backward).to_string()),
            ("D", g.d.to_string()),
            ("DROT", g.d_rot.to_string()),
        ],
    );
    let y = empty(ctx.device, a.x.shape(), a.x.dtype())?;
    let rows = a.x.numel() / (g.h * g.d).max(1);
    // The vector kernel has h · (rotated + copied vectors per head) slots, about h·d/16 of them.
    let threads = ((g.h * g.d / 16).next_power_of_two()).clamp(32, 256) as u32;
    let grid = Grid { smem: (8 * g.d_rot) as u32, ..Grid::linear(blocks_for(rows, 1, i32::MAX as u32), threads) };
    let ve = 16 / a.x.dtype().size_in_bytes();
    let rotated = if a.interleaved { g.d_rot } else { g.d_rot / 2 };
    let common = [
        Arg::Ptr(ptr(&a.x)?),
        Arg::Ptr(ptr(&a.freqs)?),
        Arg::Ptr(ptr(&y)?),
        Arg::Ptr(opt_ptr(a.cu_seqlens.as_ref())?),
        Arg::Ptr(opt_ptr(a.start_positions.as_ref())?),
        Arg::I32(i32_of(op, "x", rows)?),
        Arg::I32(i32_of(op, "x", g.batch)?),
        Arg::I32(i32_of(op, "x", g.s)?),
        Arg::I32(i32_of(op, "x", g.h)?),
    ];
    if g.d.is_multiple_of(ve) && rotated.is_multiple_of(ve) {
        k.launch("rope_vec", grid, &common)?;
    } else {
        let mut args = common.to_vec();
        args.extend([Arg::I32(i32_of(op, "x", g.d)?), Arg::I32(i32_of(op, "freqs", g.d_rot)?)]);
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

/// Define sets covering every code path (the NVRTC compile test and cache warm-up).
pub fn compile_variants() -> Vec<(&'static Source, Vec<(&'static str, String)>)> {
    let mut v = Vec::new();
    for t in ["float", "bf16"] {
        for layout in 0..3 {
            for il in 0..2 {
                for bw in 0..2 {
                    v.push((
                        &SRC,
                        vec![
                            ("TX", t.to_string()),
                            ("LAYOUT", layout.to_string()),
                            ("INTERLEAVED", il.to_string()),
                            ("BACKWARD", bw.to_string()),
                            ("D", "64".to_string()),
                            ("DROT", "32".to_string()),
                        ],
                    ));
                }
            }
        }
    }
    v
}
