//! Activation entry points: forward `name(x)`, backward `dname(grad, input)`, and
//! `dbias_dname(grad, input)`.

use tefl_core::Tensor;
use tefl_core::catalogue::*;

use crate::call::{Call, setters};

macro_rules! forward {
    ($( $f:ident => $op:ident, $doc:literal; )*) => {
        $(
            #[doc = $doc]
            pub fn $f(x: &Tensor) -> Call<$op> {
                Call::new(ActArgs { x: x.clone() })
            }
        )*
    };
}

macro_rules! backward {
    ($( $f:ident => $op:ident, $doc:literal; )*) => {
        $(
            #[doc = $doc]
            pub fn $f(grad: &Tensor, input: &Tensor) -> Call<$op> {
                Call::new(DActArgs { grad: grad.clone(), input: input.clone() })
            }
        )*
    };
}

forward! {
    gelu => Gelu, "`gelu(x)` = 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))).";
    qgelu => Qgelu, "`qgelu(x)` = x·σ(1.702x).";
    relu => Relu, "`relu(x)` = max(x, 0).";
    srelu => Srelu, "`srelu(x)` = relu(x)².";
    silu => Silu, "`silu(x)` = x·σ(x).";
    geglu => Geglu, "`geglu([a | b])` = gelu(a)·b on `[.., 2N]`.";
    qgeglu => Qgeglu, "`qgeglu([a | b])` = qgelu(a)·b.";
    reglu => Reglu, "`reglu([a | b])` = relu(a)·b.";
    sreglu => Sreglu, "`sreglu([a | b])` = srelu(a)·b.";
    swiglu => Swiglu, "`swiglu([a | b])` = silu(a)·b.";
}

backward! {
    dgelu => DGelu, "Backward of [`gelu`].";
    dqgelu => DQgelu, "Backward of [`qgelu`].";
    drelu => DRelu, "Backward of [`relu`].";
    dsrelu => DSrelu, "Backward of [`srelu`].";
    dsilu => DSilu, "Backward of [`silu`].";
    dgeglu => DGeglu, "Backward of [`geglu`]: grad `[.., N]`, input `[.., 2N]`.";
    dqgeglu => DQgeglu, "Backward of [`qgeglu`].";
    dreglu => DReglu, "Backward of [`reglu`].";
    dsreglu => DSreglu, "Backward of [`sreglu`].";
    dswiglu => DSwiglu, "Backward of [`swiglu`].";
    dbias_dgelu => DBiasDGelu, "[`dgelu`] and Σ_rows of its result.";
    dbias_dqgelu => DBiasDQgelu, "[`dqgelu`] and Σ_rows of its result.";
    dbias_drelu => DBiasDRelu, "[`drelu`] and Σ_rows of its result.";
    dbias_dsrelu => DBiasDSrelu, "[`dsrelu`] and Σ_rows of its result.";
    dbias_dsilu => DBiasDSilu, "[`dsilu`] and Σ_rows of its result.";
}

/// `clamped_swiglu([a | b])` with TE's defaults limit = 7.0, alpha = 1.702.
pub fn clamped_swiglu(x: &Tensor) -> Call<ClampedSwiglu> {
    Call::new(ClampedSwigluArgs { x: x.clone(), limit: 7.0, alpha: 1.702 })
}
setters!(ClampedSwiglu {
    /// The clamp limit.
    limit: f32,
    /// The sigmoid slope.
    alpha: f32,
});

/// Backward of [`clamped_swiglu`], with the same defaults.
pub fn clamped_dswiglu(grad: &Tensor, input: &Tensor) -> Call<ClampedDSwiglu> {
    Call::new(ClampedDSwigluArgs { grad: grad.clone(), input: input.clone(), limit: 7.0, alpha: 1.702 })
}
setters!(ClampedDSwiglu {
    /// The clamp limit.
    limit: f32,
    /// The sigmoid slope.
    alpha: f32,
});
