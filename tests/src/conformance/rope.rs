//! RoPE, forward and backward, every layout, interleaved or not.

use tefl_core::DType;
use tefl_core::catalogue::*;

use super::{FLOATS, Suite, cmp};
use crate::oracle;

/// One geometry of the RoPE cases: batch, sequence length, heads, head dim, rotated dims, and
/// whether the sequences start at given positions.
struct Geometry {
    b: usize,
    sl: usize,
    h: usize,
    d: usize,
    d_rot: usize,
    starts: bool,
    /// Layouts it runs in (thd needs the fixed cu_seqlens of the first geometry).
    layouts: &'static [QkvLayout],
    label: &'static str,
}

/// The geometries: the first exercises every layout with start positions; the others pick
/// each GPU kernel on purpose (16-bit rows: d 128 puts 16 vectors in a head, which the warp
/// kernel takes, 20 heads make a warp's last group of heads partial; f32 d 256 is 64 vectors,
/// the block kernel's, with two rows of a position in a block when there are no start
/// positions; d 72 with 24 rotated leaves a half that is not a whole vector, the scalar
/// kernel's; d 64 with 48 rotated puts a rotated vector's partner three or six vectors on, not
/// half a head, and 5 heads leave the warp kernel's lanes a different number of heads each).
const GEOMETRIES: &[Geometry] = &[
    Geometry {
        b: 3,
        sl: 11,
        h: 2,
        d: 64,
        d_rot: 32,
        starts: true,
        layouts: &[QkvLayout::Sbhd, QkvLayout::Bshd, QkvLayout::Thd],
        label: "d_rot 32 of 64",
    },
    Geometry {
        b: 2,
        sl: 9,
        h: 20,
        d: 128,
        d_rot: 128,
        starts: false,
        layouts: &[QkvLayout::Sbhd, QkvLayout::Bshd],
        label: "h 20, d 128 all rotated",
    },
    Geometry {
        b: 2,
        sl: 5,
        h: 3,
        d: 256,
        d_rot: 256,
        starts: false,
        layouts: &[QkvLayout::Sbhd],
        label: "d 256 all rotated",
    },
    Geometry {
        b: 2,
        sl: 5,
        h: 3,
        d: 72,
        d_rot: 24,
        starts: true,
        layouts: &[QkvLayout::Bshd],
        label: "d_rot 24 of 72",
    },
    Geometry {
        b: 2,
        sl: 7,
        h: 5,
        d: 64,
        d_rot: 48,
        starts: true,
        layouts: &[QkvLayout::Sbhd, QkvLayout::Bshd],
        label: "h 5, d_rot 48 of 64",
    },
];

impl Suite<'_> {
    pub(super) fn rope(&mut self) {
        for geo in GEOMETRIES {
            for dtype in FLOATS {
                for &layout in geo.layouts {
                    for interleaved in [false, true] {
                        for backward in [false, true] {
                            self.rope_case(geo, dtype, layout, interleaved, backward);
                        }
                    }
                }
            }
        }
    }

    fn rope_case(&mut self, geo: &Geometry, dtype: DType, layout: QkvLayout, interleaved: bool, backward: bool) {
        let op = if backward { "fused_rope_backward" } else { "fused_rope_forward" };
        let name = format!("{layout:?} interleaved={interleaved} {}", geo.label);
        self.case(op, dtype, name, |s| {
            let Geometry { b, sl, h, d, d_rot, .. } = *geo;
            let cu = [0, 4, 15, 22];
            let xs = match layout {
                QkvLayout::Sbhd => vec![sl, b, h, d],
                QkvLayout::Bshd => vec![b, sl, h, d],
                QkvLayout::Thd => vec![22, h, d],
            };
            let (x, xv) = s.rand(&xs, dtype, -1.0, 1.0)?;
            let starts: Vec<i32> = if geo.starts { [0, 5, 17].into_iter().take(b).collect() } else { vec![0; b] };
            let s_max = sl + *starts.iter().max().unwrap_or(&0) as usize + 12;
            let (freqs, fv) = s.rand(&[s_max, d_rot], DType::F32, -3.0, 3.0)?;
            let args = RopeArgs {
                x,
                freqs,
                cu_seqlens: (layout == QkvLayout::Thd).then(|| s.put_i32(&cu)).transpose()?,
                start_positions: if geo.starts { Some(s.put_i32(&starts)?) } else { None },
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
            let o = if backward { s.call::<FusedRopeBackward>(&args)?.y } else { s.call::<FusedRopeForward>(&args)?.y };
            Ok(vec![cmp("y", &o, want, dtype)?])
        });
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
