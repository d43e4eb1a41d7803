//! Activations on `[.., N]`; gated forms take `[.., 2N]` = [a | b] and return `[.., N]`.
//! Backward `d<name>(grad, input)` returns the input gradient; `dbias_d<name>` also returns
//! Σ_rows of it. Formulas in OPS.md.

use super::check;
use crate::op::{Op, OpDescriptor, OutputSpec};
use crate::{Error, Result, Tensor, declare_args, declare_op_with, declare_output};

/// The elementwise activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))).
    Gelu,
    /// x·σ(1.702x).
    Qgelu,
    /// max(x, 0).
    Relu,
    /// relu(x)².
    Srelu,
    /// x·σ(x).
    Silu,
}

impl Activation {
    /// Every activation.
    pub const ALL: [Activation; 5] =
        [Activation::Gelu, Activation::Qgelu, Activation::Relu, Activation::Srelu, Activation::Silu];
}

declare_args! {
    /// Input of an activation forward.
    pub struct ActArgs {
        /// `[.., N]` (or `[.., 2N]` for gated forms), f32/f16/bf16.
        tensor x: Tensor,
    }
}
declare_output! {
    /// Output of an activation forward (dtype of `x`).
    pub struct ActOut {
        /// `[.., N]`.
        tensor y: Tensor,
    }
}
declare_args! {
    /// Inputs of an activation backward.
    pub struct DActArgs {
        /// Gradient of the output, `[.., N]`.
        tensor grad: Tensor,
        /// The forward input, `[.., N]` (or `[.., 2N]` for gated forms).
        tensor input: Tensor,
    }
}
declare_output! {
    /// Output of an activation backward (dtype of `input`).
    pub struct DActOut {
        /// Gradient of the input, shape of `input`.
        tensor grad_input: Tensor,
    }
}
declare_output! {
    /// Outputs of a `dbias_d<act>` op.
    pub struct DBiasOut {
        /// Σ_rows grad_input, `[N]` (dtype of `input`).
        tensor dbias: Tensor,
        /// Gradient of the input.
        tensor grad_input: Tensor,
    }
}
declare_args! {
    /// Input of `clamped_swiglu`.
    pub struct ClampedSwigluArgs {
        /// `[.., 2N]` = [a | b].
        tensor x: Tensor,
        /// a' = min(a, limit), b' = clamp(b, −limit, limit) (TE default 7.0).
        scalar limit: f32,
        /// out = a'·σ(alpha·a')·(b' + 1) (TE default 1.702).
        scalar alpha: f32,
    }
}
declare_args! {
    /// Inputs of `clamped_dswiglu`.
    pub struct ClampedDSwigluArgs {
        /// Gradient of the output, `[.., N]`.
        tensor grad: Tensor,
        /// The forward input, `[.., 2N]`.
        tensor input: Tensor,
        /// As in the forward.
        scalar limit: f32,
        /// As in the forward.
        scalar alpha: f32,
    }
}

fn check_fwd(op: &'static str, x: &Tensor, gated: bool) -> Result<()> {
    check::rows_of(op, "x", x, 1)?;
    check::float(op, "x", x)?;
    if gated && !x.last_dim().is_multiple_of(2) {
        return Err(Error::Shape {
            op,
            arg: "x",
            got: x.shape().to_vec(),
            expected: "an even last dimension [.., 2N]".into(),
        });
    }
    Ok(())
}

fn check_bwd(op: &'static str, grad: &Tensor, input: &Tensor, gated: bool) -> Result<()> {
    check_fwd(op, input, gated).map_err(|e| match e {
        Error::Shape { op, got, expected, .. } => Error::Shape { op, arg: "input", got, expected },
        Error::DType { op, got, expected, .. } => Error::DType { op, arg: "input", got, expected },
        other => other,
    })?;
    check::float(op, "grad", grad)?;
    let mut want = input.shape().to_vec();
    if gated && let Some(last) = want.last_mut() {
        *last /= 2;
    }
    check::shape_is(op, "grad", grad, &want)
}

/// The output shape of a forward activation: the input's, with the last dim halved when gated.
fn act_out_shape(x: &Tensor, gated: bool) -> Vec<usize> {
    let mut s = x.shape().to_vec();
    if gated && let Some(last) = s.last_mut() {
        *last /= 2;
    }
    s
}

fn check_clamp(op: &'static str, limit: f32, alpha: f32) -> Result<()> {
    check::positive(op, "limit", limit)?;
    if !alpha.is_finite() {
        return Err(Error::invalid(op, "alpha", format!("must be finite, got {alpha}")));
    }
    Ok(())
}

macro_rules! activation_ops {
    ($( $fwd:ident = $fname:literal, $bwd:ident = $bname:literal, gated: $gated:literal; )*) => {
        $(
            declare_op_with! {
                #[doc = concat!("`", $fname, "` forward.")]
                pub struct $fwd = $fname;
                args ActArgs; output ActOut;
                validate(a) { check_fwd($fname, &a.x, $gated) }
                outputs(a) { vec![OutputSpec::new("y", act_out_shape(&a.x, $gated), a.x.dtype())] }
            }
            declare_op_with! {
                #[doc = concat!("`", $bname, "`: backward of `", $fname, "`.")]
                pub struct $bwd = $bname;
                args DActArgs; output DActOut;
                validate(a) { check_bwd($bname, &a.grad, &a.input, $gated) }
                outputs(a) { vec![OutputSpec::new("grad_input", a.input.shape(), a.input.dtype())] }
            }
        )*
        fn act_descriptors() -> Vec<&'static OpDescriptor> {
            vec![$( $fwd::descriptor(), $bwd::descriptor(), )*]
        }
    };
}

activation_ops! {
    Gelu = "gelu", DGelu = "dgelu", gated: false;
    Qgelu = "qgelu", DQgelu = "dqgelu", gated: false;
    Relu = "relu", DRelu = "drelu", gated: false;
    Srelu = "srelu", DSrelu = "dsrelu", gated: false;
    Silu = "silu", DSilu = "dsilu", gated: false;
    Geglu = "geglu", DGeglu = "dgeglu", gated: true;
    Qgeglu = "qgeglu", DQgeglu = "dqgeglu", gated: true;
    Reglu = "reglu", DReglu = "dreglu", gated: true;
    Sreglu = "sreglu", DSreglu = "dsreglu", gated: true;
    Swiglu = "swiglu", DSwiglu = "dswiglu", gated: true;
}

macro_rules! dbias_ops {
    ($( $op:ident = $name:literal; )*) => {
        $(
            declare_op_with! {
                #[doc = concat!("`", $name, "`: activation backward and Σ_rows of the input gradient.")]
                pub struct $op = $name;
                args DActArgs; output DBiasOut;
                validate(a) { check_bwd($name, &a.grad, &a.input, false) }
                outputs(a) {
                    vec![
                        OutputSpec::new("dbias", [a.input.last_dim()], a.input.dtype()),
                        OutputSpec::new("grad_input", a.input.shape(), a.input.dtype()),
                    ]
                }
            }
        )*
        fn dbias_descriptors() -> Vec<&'static OpDescriptor> {
            vec![$( $op::descriptor(), )*]
        }
    };
}

dbias_ops! {
    DBiasDGelu = "dbias_dgelu";
    DBiasDQgelu = "dbias_dqgelu";
    DBiasDRelu = "dbias_drelu";
    DBiasDSrelu = "dbias_dsrelu";
    DBiasDSilu = "dbias_dsilu";
}

declare_op_with! {
    /// `clamped_swiglu(x, limit, alpha)`: a' = min(a, limit), b' = clamp(b, −limit, limit),
    /// out = a'·σ(alpha·a')·(b' + 1).
    pub struct ClampedSwiglu = "clamped_swiglu";
    args ClampedSwigluArgs; output ActOut;
    validate(a) {
        check_fwd("clamped_swiglu", &a.x, true)?;
        check_clamp("clamped_swiglu", a.limit, a.alpha)
    }
    outputs(a) { vec![OutputSpec::new("y", act_out_shape(&a.x, true), a.x.dtype())] }
}

declare_op_with! {
    /// `clamped_dswiglu(grad, input, limit, alpha)`: backward of `clamped_swiglu`.
    pub struct ClampedDSwiglu = "clamped_dswiglu";
    args ClampedDSwigluArgs; output DActOut;
    validate(a) {
        check_bwd("clamped_dswiglu", &a.grad, &a.input, true)?;
        check_clamp("clamped_dswiglu", a.limit, a.alpha)
    }
    outputs(a) { vec![OutputSpec::new("grad_input", a.input.shape(), a.input.dtype())] }
}

pub(super) fn descriptors() -> Vec<&'static OpDescriptor> {
    let mut v = act_descriptors();
    v.push(ClampedSwiglu::descriptor());
    v.push(ClampedDSwiglu::descriptor());
    v.extend(dbias_descriptors());
    v
}
