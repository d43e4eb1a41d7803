//! Rotary position embedding on the CPU (rayon over token rows).

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::{KernelCtx, Result};

use crate::util::{build_f32, view};

/// Rotates the first d_rot dims of one head vector in place by the angles `f` (length d_rot).
fn rotate(v: &mut [f32], f: &[f32], interleaved: bool) {
    let d_rot = f.len();
    if interleaved {
        for p in 0..d_rot / 2 {
            let (x0, x1) = (v[2 * p], v[2 * p + 1]);
            let (c0, s0) = (f[2 * p].cos(), f[2 * p].sin());
            let (c1, s1) = (f[2 * p + 1].cos(), f[2 * p + 1].sin());
            v[2 * p] = x0 * c0 - x1 * s0;
            v[2 * p + 1] = x1 * c1 + x0 * s1;
        }
    } else {
        let h = d_rot / 2;
        for j in 0..h {
            let (x0, x1) = (v[j], v[j + h]);
            let (c0, s0) = (f[j].cos(), f[j].sin());
            let (c1, s1) = (f[j + h].cos(), f[j + h].sin());
            v[j] = x0 * c0 - x1 * s0;
            v[j + h] = x1 * c1 + x0 * s1;
        }
    }
}

/// The transpose of the forward map, which is what the gradient needs (the inverse rotation
/// when, as usual, both halves share their angles).
fn rotate_transpose(v: &mut [f32], f: &[f32], interleaved: bool) {
    let d_rot = f.len();
    if interleaved {
        for p in 0..d_rot / 2 {
            let (g0, g1) = (v[2 * p], v[2 * p + 1]);
            let (c0, s0) = (f[2 * p].cos(), f[2 * p].sin());
            let (c1, s1) = (f[2 * p + 1].cos(), f[2 * p + 1].sin());
            v[2 * p] = g0 * c0 + g1 * s1;
            v[2 * p + 1] = g1 * c1 - g0 * s0;
        }
    } else {
        let h = d_rot / 2;
        for j in 0..h {
            let (g0, g1) = (v[j], v[j + h]);
            let (c0, s0) = (f[j].cos(), f[j].sin());
            let (c1, s1) = (f[j + h].cos(), f[j + h].sin());
            v[j] = g0 * c0 + g1 * s1;
            v[j + h] = g1 * c1 - g0 * s0;
        }
    }
}

fn run(a: &RopeArgs, op: &'static str, backward: bool) -> Result<RopeOut> {
    let g = rope_geometry(op, a)?;
    let x = view(&a.x)?;
    let freqs = view(&a.freqs)?;
    let width = g.h * g.d;
    let (y, ()) = build_f32(a.x.shape(), a.x.dtype(), "rope output y", |y| {
        y.copy_from_slice(&x);
        // Map each token row to (sequence, position) so rows can be processed in parallel.
        let mut pos_of_row = vec![None; y.len() / width];
        for b in 0..g.batch {
            for p in 0..g.spans[b].1 {
                pos_of_row[g.row(b, p)] = Some(g.starts[b] + p);
            }
        }
        y.par_chunks_mut(width).zip(pos_of_row.par_iter()).for_each(|(row, pos)| {
            let Some(pos) = pos else { return };
            let f = &freqs[pos * g.d_rot..(pos + 1) * g.d_rot];
            for head in row.chunks_mut(g.d) {
                if backward {
                    rotate_transpose(&mut head[..g.d_rot], f, a.interleaved);
                } else {
                    rotate(&mut head[..g.d_rot], f, a.interleaved);
                }
            }
        });
        Ok(())
    })?;
    Ok(RopeOut { y })
}

/// The catalogue op `fused_rope_forward` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn fused_rope_forward(_: &KernelCtx<'_>, a: &RopeArgs) -> Result<RopeOut> {
    run(a, "fused_rope_forward", false)
}

/// The catalogue op `fused_rope_backward` on the CPU reference (the catalogue's formula, checked against the f64 oracle).
pub fn fused_rope_backward(_: &KernelCtx<'_>, a: &RopeArgs) -> Result<RopeOut> {
    run(a, "fused_rope_backward", true)
}
