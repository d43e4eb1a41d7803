//! Fused softmax variants on `[.., sq, sk]`: softmax over the last dim of scale·x, masked
//! entries never contribute, a fully masked row gives zeros. Backward: dx = scale·y·(dy − Σ dy·y).

use super::check;
use crate::op::{Op, OpDescriptor, OutputSpec};
use crate::{DType, Error, Result, Tensor, declare_args, declare_op_with, declare_output};

declare_args! {
    /// Inputs of the unmasked and causal softmax forwards.
    pub struct SoftmaxArgs {
        /// Scores `[.., sq, sk]`.
        tensor x: Tensor,
        /// Multiplies `x` before the softmax.
        scalar scale: f32,
    }
}
declare_args! {
    /// Inputs of `scaled_masked_softmax_forward`.
    pub struct MaskedSoftmaxArgs {
        /// Scores `[b, h, sq, sk]`.
        tensor x: Tensor,
        /// u8 or bool `[b or 1, 1, sq, sk]`, 1 = masked; broadcast over heads (and batch when 1).
        tensor mask: Tensor,
        /// Multiplies `x` before the softmax.
        scalar scale: f32,
    }
}
declare_output! {
    /// Output of a softmax forward.
    pub struct SoftmaxOut {
        /// Probabilities, shape and dtype of `x`.
        tensor y: Tensor,
    }
}
declare_args! {
    /// Inputs of a softmax backward.
    pub struct SoftmaxBwdArgs {
        /// Gradient of `y`.
        tensor dy: Tensor,
        /// The forward's output.
        tensor y: Tensor,
        /// The forward's scale.
        scalar scale: f32,
    }
}
declare_output! {
    /// Output of a softmax backward.
    pub struct SoftmaxBwdOut {
        /// Gradient of `x`.
        tensor dx: Tensor,
    }
}

fn check_x(op: &'static str, x: &Tensor, scale: f32, square: bool) -> Result<()> {
    check::rows_of(op, "x", x, 2)?;
    check::float(op, "x", x)?;
    if !scale.is_finite() {
        return Err(Error::invalid(op, "scale", format!("must be finite, got {scale}")));
    }
    let s = x.shape();
    if square && s[s.len() - 2] > s[s.len() - 1] {
        return Err(Error::Shape { op, arg: "x", got: s.to_vec(), expected: "sq <= sk".into() });
    }
    Ok(())
}

/// An output shaped and typed like `x`.
fn like_x(name: &'static str, x: &Tensor) -> Vec<OutputSpec> {
    vec![OutputSpec::new(name, x.shape(), x.dtype())]
}

fn check_bwd(op: &'static str, a: &SoftmaxBwdArgs) -> Result<()> {
    check::rows_of(op, "y", &a.y, 2)?;
    check::float(op, "y", &a.y)?;
    check::float(op, "dy", &a.dy)?;
    check::shape_is(op, "dy", &a.dy, a.y.shape())?;
    if !a.scale.is_finite() {
        return Err(Error::invalid(op, "scale", format!("must be finite, got {}", a.scale)));
    }
    Ok(())
}

declare_op_with! {
    /// `scaled_softmax_forward(x, scale)`.
    pub struct ScaledSoftmaxForward = "scaled_softmax_forward";
    args SoftmaxArgs; output SoftmaxOut;
    validate(a) { check_x("scaled_softmax_forward", &a.x, a.scale, false) }
    outputs(a) { like_x("y", &a.x) }
}

declare_op_with! {
    /// `scaled_masked_softmax_forward(x, mask, scale)`: mask = 1 hides an entry.
    pub struct ScaledMaskedSoftmaxForward = "scaled_masked_softmax_forward";
    args MaskedSoftmaxArgs; output SoftmaxOut;
    validate(a) {
        const OP: &str = "scaled_masked_softmax_forward";
        check_x(OP, &a.x, a.scale, false)?;
        let s = a.x.shape();
        if s.len() != 4 {
            return Err(Error::Shape { op: OP, arg: "x", got: s.to_vec(), expected: "[b, h, sq, sk]".into() });
        }
        check::dtype_in(OP, "mask", &a.mask, &[DType::U8, DType::Bool])?;
        let m = a.mask.shape();
        if m.len() != 4 || (m[0] != s[0] && m[0] != 1) || m[1] != 1 || m[2] != s[2] || m[3] != s[3] {
            return Err(Error::Shape {
                op: OP,
                arg: "mask",
                got: m.to_vec(),
                expected: format!("[{} or 1, 1, {}, {}]", s[0], s[2], s[3]),
            });
        }
        Ok(())
    }
    outputs(a) { like_x("y", &a.x) }
}

declare_op_with! {
    /// `scaled_upper_triang_masked_softmax_forward(x, scale)`: causal, j > i masked (sq ≤ sk).
    pub struct ScaledUpperTriangMaskedSoftmaxForward = "scaled_upper_triang_masked_softmax_forward";
    args SoftmaxArgs; output SoftmaxOut;
    validate(a) { check_x("scaled_upper_triang_masked_softmax_forward", &a.x, a.scale, true) }
    outputs(a) { like_x("y", &a.x) }
}

declare_op_with! {
    /// `scaled_aligned_causal_masked_softmax_forward(x, scale)`: bottom-right causal,
    /// j > i + sk − sq masked.
    pub struct ScaledAlignedCausalMaskedSoftmaxForward = "scaled_aligned_causal_masked_softmax_forward";
    args SoftmaxArgs; output SoftmaxOut;
    validate(a) { check_x("scaled_aligned_causal_masked_softmax_forward", &a.x, a.scale, false) }
    outputs(a) { like_x("y", &a.x) }
}

macro_rules! softmax_bwd {
    ($( $op:ident = $name:literal; )*) => {
        $(
            declare_op_with! {
                #[doc = concat!("`", $name, "(dy, y, scale)`: dx = scale·y·(dy − Σ dy·y).")]
                pub struct $op = $name;
                args SoftmaxBwdArgs; output SoftmaxBwdOut;
                validate(a) { check_bwd($name, a) }
                outputs(a) { like_x("dx", &a.y) }
            }
        )*
    };
}

softmax_bwd! {
    ScaledSoftmaxBackward = "scaled_softmax_backward";
    ScaledMaskedSoftmaxBackward = "scaled_masked_softmax_backward";
    ScaledUpperTriangMaskedSoftmaxBackward = "scaled_upper_triang_masked_softmax_backward";
    ScaledAlignedCausalMaskedSoftmaxBackward = "scaled_aligned_causal_masked_softmax_backward";
}

pub(super) fn descriptors() -> Vec<&'static OpDescriptor> {
    vec![
        ScaledSoftmaxForward::descriptor(),
        ScaledMaskedSoftmaxForward::descriptor(),
        ScaledUpperTriangMaskedSoftmaxForward::descriptor(),
        ScaledAlignedCausalMaskedSoftmaxForward::descriptor(),
        ScaledSoftmaxBackward::descriptor(),
        ScaledMaskedSoftmaxBackward::descriptor(),
        ScaledUpperTriangMaskedSoftmaxBackward::descriptor(),
        ScaledAlignedCausalMaskedSoftmaxBackward::descriptor(),
    ]
}
