//! Rotary position embedding on the CPU (rayon over token rows).

use rayon::prelude::*;
use tefl_core::catalogue::*;
use tefl_core::{KernelCtx, Result};

use crate::util::{build_f32, view};

/// Rotates the first d_rot dims of one head vector in place by angles whose cosines and sines
/// are `cos` and `sin` (length d_rot each: a token row's, shared by its heads).
fn rotate(v: &mut [f32], cos: &[f32], sin: &[f32], interleaved: bool) {
    let d_rot = cos.len();
    if interleaved {
        for p in 0..d_rot / 2 {
            let (x0, x1) = (v[2 * p], v[2 * p + 1]);
            v[2 * p] = x0 * cos[2 * p] - x1 * sin[2 * p];
            v[2 * p + 1] = x1 * cos[2 * p + 1] + x0 * sin[2 * p + 1];
        }
    } else {
        let h = d_rot / 2;
        let (v0, v1) = v[..d_rot].split_at_mut(h);
        let (c0, c1) = cos.split_at(h);
        let (s0, s1) = sin.split_at(h);
        for j in 0..h {
            let (x0, x1) = (v0[j], v1[j]);
            v0[j] = x0 * c0[j] - x1 * s0[j];
            v1[j] = x1 * c1[j] + x0 * s1[j];
        }
    }
}

/// The transpose of the forward map, which is what the gradient needs (the inverse rotation
/// when, as usual, both halves share their angles).
fn rotate_transpose(v: &mut [f32], cos: &[f32], sin: &[f32], interleaved: bool) {
    let d_rot = cos.len();
    if interleaved {
        for p in 0..d_rot / 2 {
            let (g0, g1) = (v[2 * p], v[2 * p + 1]);
            v[2 * p] = g0 * cos[2 * p] + g1 * sin[2 * p + 1];
            v[2 * p + 1] = g1 * cos[2 * p + 1] - g0 * sin[2 * p];
        }
    } else {
        let h = d_rot / 2;
        let (v0, v1) = v[..d_rot].split_at_mut(h);
        let (c0, c1) = cos.split_at(h);
        let (s0, s1) = sin.split_at(h);
        for j in 0..h {
            let (g0, g1) = (v0[j], v1[j]);
            v0[j] = g0 * c0[j] + g1 * s1[j];
            v1[j] = g1 * c1[j] - g0 * s0[j];
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
        // A row's cosines and sines are computed once for all its heads (buffers kept per
        // rayon job).
        y.par_chunks_mut(width).zip(pos_of_row.par_iter()).for_each_init(
            || (Vec::new(), Vec::new()),
            |(cos, sin), (row, pos)| {
                let Some(pos) = pos else { return };
                let f = &freqs[pos * g.d_rot..(pos + 1) * g.d_rot];
                cos.clear();
                cos.extend(f.iter().map(|a| a.cos()));
                sin.clear();
                sin.extend(f.iter().map(|a| a.sin()));
                for head in row.chunks_mut(g.d) {
                    if backward {
                        rotate_transpose(head, cos, sin, a.interleaved);
                    } else {
                        rotate(head, cos, sin, a.interleaved);
                    }
                }
            },
        );
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
