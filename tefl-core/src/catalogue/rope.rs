//! Rotary position embedding, forward and backward.

use super::check;
use crate::catalogue::QkvLayout;
use crate::op::{Op, OpDescriptor, OutputSpec};
use crate::{DType, Error, Result, Tensor, declare_args, declare_op_with, declare_output};

declare_args! {
    /// Arguments of `fused_rope_forward` / `fused_rope_backward`.
    pub struct RopeArgs {
        /// The input (forward) or the output gradient (backward): `[s, b, h, d]` (sbhd),
        /// `[b, s, h, d]` (bshd) or `[t, h, d]` (thd).
        tensor x: Tensor,
        /// Rotation angles, f32 `[s_max, d_rot]` (d_rot ≤ d, even); row = position.
        tensor freqs: Tensor,
        /// i32 `[b + 1]` cumulative lengths (thd only).
        tensor cu_seqlens: Option<Tensor>,
        /// i32 `[b]` position of each sequence's first token (default 0).
        tensor start_positions: Option<Tensor>,
        /// The layout (bshd, sbhd or thd).
        scalar layout: QkvLayout,
        /// Rotate pairs (x₂ᵢ, x₂ᵢ₊₁) instead of the two halves.
        scalar interleaved: bool,
    }
}
declare_output! {
    /// Output of the RoPE ops.
    pub struct RopeOut {
        /// Shape and dtype of `x`.
        tensor y: Tensor,
    }
}

/// The sequences of a RoPE call: (first row, length, start position) per sequence, plus the
/// number of sequences and the row stride rules of the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RopeGeometry {
    /// The layout.
    pub layout: QkvLayout,
    /// Sequences.
    pub batch: usize,
    /// Positions per sequence slot (bshd/sbhd) or max length (thd).
    pub s: usize,
    /// Heads.
    pub h: usize,
    /// Head dim.
    pub d: usize,
    /// Rotated dims.
    pub d_rot: usize,
    /// (first token row for thd, length) per sequence (none when `x` is empty).
    pub spans: Vec<(usize, usize)>,
    /// Start position per sequence (none when `x` is empty and no start positions are given).
    pub starts: Vec<usize>,
}

impl RopeGeometry {
    /// The token row of (sequence `b`, position `pos`).
    pub fn row(&self, b: usize, pos: usize) -> usize {
        match self.layout {
            QkvLayout::Bshd => b * self.s + pos,
            QkvLayout::Sbhd => pos * self.batch + b,
            QkvLayout::Thd => self.spans[b].0 + pos,
        }
    }
}

/// Validates a RoPE call and resolves its geometry.
pub fn rope_geometry(op: &'static str, a: &RopeArgs) -> Result<RopeGeometry> {
    check::float(op, "x", &a.x)?;
    let rank = if a.layout == QkvLayout::Thd { 3 } else { 4 };
    // No sequences or no positions is a call with nothing to rotate; a token row of no heads
    // or heads of no dims is refused.
    if a.x.rank() != rank || a.x.shape()[rank - 2..].contains(&0) {
        return Err(Error::Shape {
            op,
            arg: "x",
            got: a.x.shape().to_vec(),
            expected: format!("rank {rank} for {:?}, h and d >= 1", a.layout),
        });
    }
    let xs = a.x.shape();
    let (h, d) = (xs[rank - 2], xs[rank - 1]);
    check::dtype_is(op, "freqs", &a.freqs, DType::F32)?;
    let fs = a.freqs.shape();
    if fs.len() != 2 || fs[1] == 0 || fs[1] > d || !fs[1].is_multiple_of(2) {
        return Err(Error::Shape {
            op,
            arg: "freqs",
            got: fs.to_vec(),
            expected: format!("[s_max, d_rot] with d_rot even and <= {d}"),
        });
    }
    let (s_max, d_rot) = (fs[0], fs[1]);
    let (batch, s, spans) = match a.layout {
        QkvLayout::Thd => {
            let cu = a
                .cu_seqlens
                .as_ref()
                .ok_or_else(|| Error::invalid(op, "cu_seqlens", "the thd layout needs cu_seqlens"))?;
            let v = check::cu_seqlens(op, "cu_seqlens", cu, Some(xs[0]))?;
            let spans: Vec<(usize, usize)> = v.windows(2).map(|w| (w[0] as usize, (w[1] - w[0]) as usize)).collect();
            let s = spans.iter().map(|x| x.1).max().unwrap_or(0);
            (spans.len(), s, spans)
        }
        l => {
            if a.cu_seqlens.is_some() {
                return Err(Error::invalid(op, "cu_seqlens", "only read by the thd layout"));
            }
            let (b, s) = if l == QkvLayout::Bshd { (xs[0], xs[1]) } else { (xs[1], xs[0]) };
            // (No spans for an empty x: its batch may be any size when its sequences are empty.)
            let spans = if a.x.numel() == 0 { Vec::new() } else { (0..b).map(|i| (i * s, s)).collect() };
            (b, s, spans)
        }
    };
    let starts = match &a.start_positions {
        None => vec![0; spans.len()],
        Some(t) => {
            check::dtype_is(op, "start_positions", t, DType::I32)?;
            check::shape_is(op, "start_positions", t, &[batch])?;
            let v = t.to_vec_in_call::<i32>()?;
            if let Some(p) = v.iter().find(|p| **p < 0) {
                return Err(Error::invalid(op, "start_positions", format!("negative position {p}")));
            }
            v.into_iter().map(|p| p as usize).collect()
        }
    };
    for (i, ((_, len), st)) in spans.iter().zip(&starts).enumerate() {
        if st + len > s_max {
            return Err(Error::invalid(
                op,
                "freqs",
                format!("sequence {i} reaches position {} but freqs has {s_max} rows", st + len),
            ));
        }
    }
    Ok(RopeGeometry { layout: a.layout, batch, s, h, d, d_rot, spans, starts })
}

declare_op_with! {
    /// `fused_rope_forward`: rotates the first d_rot dims of each head by the angles of its position;
    /// halves: [x1, x2] → [x1·cos − x2·sin, x2·cos + x1·sin]; interleaved: on pairs (x₂ᵢ, x₂ᵢ₊₁).
    pub struct FusedRopeForward = "fused_rope_forward";
    args RopeArgs; output RopeOut;
    validate(a) { rope_geometry("fused_rope_forward", a).map(|_| ()) }
    outputs(a) { vec![OutputSpec::new("y", a.x.shape(), a.x.dtype())] }
}

declare_op_with! {
    /// `fused_rope_backward`: the inverse rotation, applied to the output gradient.
    pub struct FusedRopeBackward = "fused_rope_backward";
    args RopeArgs; output RopeOut;
    validate(a) { rope_geometry("fused_rope_backward", a).map(|_| ()) }
    outputs(a) { vec![OutputSpec::new("y", a.x.shape(), a.x.dtype())] }
}

pub(super) fn descriptors() -> Vec<&'static OpDescriptor> {
    vec![FusedRopeForward::descriptor(), FusedRopeBackward::descriptor()]
}
