//! RoPE, forward and backward, every layout, interleaved or not.

use tefl_core::DType;
use tefl_core::catalogue::*;

use super::{FLOATS, Suite, cmp};
use crate::oracle;

impl Suite<'_> {
    pub(super) fn rope(&mut self) {
        for dtype in FLOATS {
            for layout in [QkvLayout::Sbhd, QkvLayout::Bshd, QkvLayout::Thd] {
                for interleaved in [false, true] {
                    for backward in [false, true] {
                        let op = if backward { "fused_rope_backward" } else { "fused_rope_forward" };
                        self.case(op, dtype, format!("{layout:?} interleaved={interleaved} d_rot 32 of 64"), |s| {
                            let (b, sl, h, d, d_rot, s_max) = (3, 11, 2, 64, 32, 40);
                            let cu = [0, 4, 15, 22];
                            let xs = match layout {
                                QkvLayout::Sbhd => vec![sl, b, h, d],
                                QkvLayout::Bshd => vec![b, sl, h, d],
                                QkvLayout::Thd => vec![22, h, d],
                            };
                            let (x, xv) = s.rand(&xs, dtype, -1.0, 1.0)?;
                            let (freqs, fv) = s.rand(&[s_max, d_rot], DType::F32, -3.0, 3.0)?;
                            let starts = [0, 5, 17];
                            let args = RopeArgs {
                                x,
                                freqs,
                                cu_seqlens: (layout == QkvLayout::Thd).then(|| s.put_i32(&cu)).transpose()?,
                                start_positions: Some(s.put_i32(&starts)?),
                                layout,
                                interleaved,
                            };
                            let g = rope_geometry("conformance", &args)?;
                            let mut want = xv.clone();
                            for bi in 0..g.batch {
                                for p in 0..g.spans[bi].1 {
                                    let pos = starts[bi] as usize + p;
                                    let f = &fv[pos * d_rot..(pos + 1) * d_rot];
                                    for hh in 0..h {
                                        let at = (g.row(bi, p) * h + hh) * d;
                                        let seg = &xv[at..at + d_rot];
                                        let out = if backward {
                                            rope_transpose(seg, f, interleaved)
                                        } else {
                                            oracle::rope_vec(seg, f, interleaved)
                                        };
                                        want[at..at + d_rot].copy_from_slice(&out);
                                    }
                                }
                            }
                            let o = if backward {
                                s.call::<FusedRopeBackward>(&args)?.y
                            } else {
                                s.call::<FusedRopeForward>(&args)?.y
                            };
                            Ok(vec![cmp("y", &o, want, dtype)?])
                        });
                    }
                }
            }
        }
    }
}

/// The transpose of the RoPE map on one head vector (what the backward applies).
fn rope_transpose(g: &[f64], f: &[f64], interleaved: bool) -> Vec<f64> {
    let mut y = g.to_vec();
    let dr = f.len();
    if interleaved {
        for p in 0..dr / 2 {
            y[2 * p] = g[2 * p] * f[2 * p].cos() + g[2 * p + 1] * f[2 * p + 1].sin();
            y[2 * p + 1] = g[2 * p + 1] * f[2 * p + 1].cos() - g[2 * p] * f[2 * p].sin();
        }
    } else {
        let h = dr / 2;
        for j in 0..h {
            y[j] = g[j] * f[j].cos() + g[j + h] * f[j + h].sin();
            y[j + h] = g[j + h] * f[j + h].cos() - g[j] * f[j].sin();
        }
    }
    y
}
