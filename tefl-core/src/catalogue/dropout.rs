//! Dropout with a counter-based RNG (Philox 4x32-10, [`crate::philox`]): the same
//! (seed, offset, element index) gives the same mask on every backend.

use super::check;
use crate::op::{Op, OpDescriptor, OutputSpec};
use crate::{DType, Tensor, declare_op};

declare_op! {
    /// `dropout_fwd(x, p, seed, offset) -> (y, mask)`: element i is kept when
    /// `philox::uniform(seed, offset, i) >= p`; kept values are scaled by 1/(1 − p).
    pub struct DropoutFwd = "dropout_fwd";
    /// Arguments of [`DropoutFwd`].
    pub struct DropoutFwdArgs {
        /// Input.
        tensor x: Tensor,
        /// Drop probability in [0, 1).
        scalar p: f32,
        /// Philox key.
        scalar seed: u64,
        /// Philox counter offset.
        scalar offset: u64,
    }
    /// Outputs of [`DropoutFwd`].
    pub struct DropoutFwdOut {
        /// x·mask/(1 − p), dtype of `x`.
        tensor y: Tensor,
        /// u8, 1 = kept.
        tensor mask: Tensor,
    }
    validate(a) {
        check::float("dropout_fwd", "x", &a.x)?;
        check::probability("dropout_fwd", "p", a.p)
    }
    outputs(a) {
        vec![OutputSpec::new("y", a.x.shape(), a.x.dtype()), OutputSpec::new("mask", a.x.shape(), DType::U8)]
    }
}

declare_op! {
    /// `dropout_bwd(dy, mask, p) -> dx = dy·mask/(1 − p)`.
    pub struct DropoutBwd = "dropout_bwd";
    /// Arguments of [`DropoutBwd`].
    pub struct DropoutBwdArgs {
        /// Gradient of `y`.
        tensor dy: Tensor,
        /// The forward's mask (u8).
        tensor mask: Tensor,
        /// The forward's p.
        scalar p: f32,
    }
    /// Outputs of [`DropoutBwd`].
    pub struct DropoutBwdOut {
        /// Gradient of `x`.
        tensor dx: Tensor,
    }
    validate(a) {
        check::float("dropout_bwd", "dy", &a.dy)?;
        check::dtype_is("dropout_bwd", "mask", &a.mask, DType::U8)?;
        check::shape_is("dropout_bwd", "mask", &a.mask, a.dy.shape())?;
        check::probability("dropout_bwd", "p", a.p)
    }
    outputs(a) { vec![OutputSpec::new("dx", a.dy.shape(), a.dy.dtype())] }
}

pub(super) fn descriptors() -> Vec<&'static OpDescriptor> {
    vec![DropoutFwd::descriptor(), DropoutBwd::descriptor()]
}
