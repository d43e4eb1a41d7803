//! Normalisation ops: RMSNorm and LayerNorm, forward and backward.
//!
//! The forwards may write FP8 (TE's norm with an output quantizer): with `out_dtype` f8e4m3 or
//! f8e5m2 and the quantizer's `scale`, y = saturating cast of (normalised value)·scale, and the
//! outputs add `amax` (max |normalised value|, before scaling) and `scale_inv` = 1/scale — one
//! pass that normalises, scales, casts and reduces the amax.

use super::check;
use crate::op::{Op, OpDescriptor, OutputSpec};
use crate::{DType, Error, Tensor, declare_op};

declare_op! {
    /// `rmsnorm_fwd(x[.., N], gamma[N], eps, zero_centered_gamma, out_dtype) -> (y, rsigma[rows] f32)`:
    /// rsigma = 1/sqrt(mean(x²) + eps); g = zero_centered_gamma ? 1 + gamma : gamma; y = x·rsigma·g.
    pub struct RmsNormFwd = "rmsnorm_fwd";
    /// Arguments of [`RmsNormFwd`].
    pub struct RmsNormFwdArgs {
        /// Input, `[.., N]`, f32/f16/bf16.
        tensor x: Tensor,
        /// Scale, `[N]`, f32/f16/bf16.
        tensor gamma: Tensor,
        /// Added to the mean square; finite and > 0.
        scalar eps: f32,
        /// When set, the scale is `1 + gamma`.
        scalar zero_centered_gamma: bool,
        /// The dtype of `y`: f32, f16, bf16, or f8e4m3 / f8e5m2 with `scale`.
        scalar out_dtype: DType,
        /// f32 `[1]`: the FP8 output's scale (required with an FP8 `out_dtype`, refused otherwise).
        tensor scale: Option<Tensor>,
    }
    /// Outputs of [`RmsNormFwd`].
    pub struct RmsNormFwdOut {
        /// Normalised output, shape of `x`, dtype `out_dtype`.
        tensor y: Tensor,
        /// 1/sqrt(mean(x²) + eps) per row, f32, `[rows]`.
        tensor rsigma: Tensor,
        /// FP8 output: f32 `[1]`, max |y| before scaling.
        tensor amax: Option<Tensor>,
        /// FP8 output: f32 `[1]`, 1/scale.
        tensor scale_inv: Option<Tensor>,
    }
    validate(a) {
        fwd_common("rmsnorm_fwd", &a.x, &a.gamma, a.eps, a.out_dtype, a.scale.as_ref())
    }
    outputs(a) {
        let mut v = vec![OutputSpec::new("y", a.x.shape(), a.out_dtype), OutputSpec::new("rsigma", [a.x.rows()], DType::F32)];
        fp8_outputs(&mut v, a.out_dtype);
        v
    }
}

declare_op! {
    /// `rmsnorm_bwd(dy, x, rsigma, gamma, zero_centered_gamma) -> (dx, dgamma)`:
    /// x̂ = x·rsigma; d = dy·g; dx = rsigma·(d − x̂·mean(d·x̂)); dgamma = Σ_rows dy·x̂.
    pub struct RmsNormBwd = "rmsnorm_bwd";
    /// Arguments of [`RmsNormBwd`].
    pub struct RmsNormBwdArgs {
        /// Gradient of `y`, shape of `x`.
        tensor dy: Tensor,
        /// The forward input, `[.., N]`.
        tensor x: Tensor,
        /// The forward's `rsigma`, f32 `[rows]`.
        tensor rsigma: Tensor,
        /// The forward's scale, `[N]`.
        tensor gamma: Tensor,
        /// As in the forward.
        scalar zero_centered_gamma: bool,
    }
    /// Outputs of [`RmsNormBwd`].
    pub struct RmsNormBwdOut {
        /// Gradient of `x` (dtype of `x`).
        tensor dx: Tensor,
        /// Gradient of `gamma` (dtype of `gamma`).
        tensor dgamma: Tensor,
    }
    validate(a) {
        bwd_common("rmsnorm_bwd", &a.dy, &a.x, &a.rsigma, &a.gamma)
    }
    outputs(a) { bwd_outputs(&a.x, &a.gamma, false) }
}

declare_op! {
    /// `rmsnorm_bwd_add(dy, x, rsigma, gamma, add, zero_centered_gamma) -> (dx + add, dgamma)`:
    /// RMSNorm backward with the residual gradient `add` fused into `dx`.
    pub struct RmsNormBwdAdd = "rmsnorm_bwd_add";
    /// Arguments of [`RmsNormBwdAdd`].
    pub struct RmsNormBwdAddArgs {
        /// Gradient of `y`, shape of `x`.
        tensor dy: Tensor,
        /// The forward input, `[.., N]`.
        tensor x: Tensor,
        /// The forward's `rsigma`, f32 `[rows]`.
        tensor rsigma: Tensor,
        /// The forward's scale, `[N]`.
        tensor gamma: Tensor,
        /// Added to `dx` (the residual branch's gradient), shape of `x`.
        tensor add: Tensor,
        /// As in the forward.
        scalar zero_centered_gamma: bool,
    }
    /// Outputs of [`RmsNormBwdAdd`].
    pub struct RmsNormBwdAddOut {
        /// Gradient of `x` plus `add` (dtype of `x`).
        tensor dx: Tensor,
        /// Gradient of `gamma` (dtype of `gamma`).
        tensor dgamma: Tensor,
    }
    validate(a) {
        const OP: &str = "rmsnorm_bwd_add";
        bwd_common(OP, &a.dy, &a.x, &a.rsigma, &a.gamma)?;
        check::float(OP, "add", &a.add)?;
        check::shape_is(OP, "add", &a.add, a.x.shape())
    }
    outputs(a) { bwd_outputs(&a.x, &a.gamma, false) }
}

declare_op! {
    /// `layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma, out_dtype) -> (y, mu, rsigma)`:
    /// y = (x − mu)·rsigma·g + beta, with mu and rsigma = 1/sqrt(var + eps) per row (f32).
    pub struct LayerNormFwd = "layernorm_fwd";
    /// Arguments of [`LayerNormFwd`].
    pub struct LayerNormFwdArgs {
        /// Input, `[.., N]`.
        tensor x: Tensor,
        /// Scale, `[N]`.
        tensor gamma: Tensor,
        /// Shift, `[N]`.
        tensor beta: Tensor,
        /// Added to the variance; finite and > 0.
        scalar eps: f32,
        /// When set, the scale is `1 + gamma`.
        scalar zero_centered_gamma: bool,
        /// The dtype of `y`: f32, f16, bf16, or f8e4m3 / f8e5m2 with `scale`.
        scalar out_dtype: DType,
        /// f32 `[1]`: the FP8 output's scale (required with an FP8 `out_dtype`, refused otherwise).
        tensor scale: Option<Tensor>,
    }
    /// Outputs of [`LayerNormFwd`].
    pub struct LayerNormFwdOut {
        /// Normalised output.
        tensor y: Tensor,
        /// Row means, f32 `[rows]`.
        tensor mu: Tensor,
        /// 1/sqrt(var + eps) per row, f32 `[rows]`.
        tensor rsigma: Tensor,
        /// FP8 output: f32 `[1]`, max |y| before scaling.
        tensor amax: Option<Tensor>,
        /// FP8 output: f32 `[1]`, 1/scale.
        tensor scale_inv: Option<Tensor>,
    }
    validate(a) {
        const OP: &str = "layernorm_fwd";
        fwd_common(OP, &a.x, &a.gamma, a.eps, a.out_dtype, a.scale.as_ref())?;
        check::float(OP, "beta", &a.beta)?;
        check::shape_is(OP, "beta", &a.beta, &[a.x.last_dim()])
    }
    outputs(a) {
        let mut v = vec![
            OutputSpec::new("y", a.x.shape(), a.out_dtype),
            OutputSpec::new("mu", [a.x.rows()], DType::F32),
            OutputSpec::new("rsigma", [a.x.rows()], DType::F32),
        ];
        fp8_outputs(&mut v, a.out_dtype);
        v
    }
}

declare_op! {
    /// `layernorm_bwd(dy, x, mu, rsigma, gamma, zero_centered_gamma) -> (dx, dgamma, dbeta)`:
    /// dx = rsigma·(d − mean(d) − x̂·mean(d·x̂)) with d = dy·g; dgamma = Σ_rows dy·x̂; dbeta = Σ_rows dy.
    pub struct LayerNormBwd = "layernorm_bwd";
    /// Arguments of [`LayerNormBwd`].
    pub struct LayerNormBwdArgs {
        /// Gradient of `y`.
        tensor dy: Tensor,
        /// The forward input.
        tensor x: Tensor,
        /// The forward's `mu`, f32 `[rows]`.
        tensor mu: Tensor,
        /// The forward's `rsigma`, f32 `[rows]`.
        tensor rsigma: Tensor,
        /// The forward's scale, `[N]`.
        tensor gamma: Tensor,
        /// As in the forward.
        scalar zero_centered_gamma: bool,
    }
    /// Outputs of [`LayerNormBwd`].
    pub struct LayerNormBwdOut {
        /// Gradient of `x`.
        tensor dx: Tensor,
        /// Gradient of `gamma`.
        tensor dgamma: Tensor,
        /// Gradient of `beta` (dtype of `gamma`).
        tensor dbeta: Tensor,
    }
    validate(a) {
        const OP: &str = "layernorm_bwd";
        bwd_common(OP, &a.dy, &a.x, &a.rsigma, &a.gamma)?;
        check::dtype_is(OP, "mu", &a.mu, DType::F32)?;
        check::shape_is(OP, "mu", &a.mu, &[a.x.rows()])
    }
    outputs(a) { bwd_outputs(&a.x, &a.gamma, true) }
}

fn fwd_common(
    op: &'static str,
    x: &Tensor,
    gamma: &Tensor,
    eps: f32,
    out_dtype: DType,
    scale: Option<&Tensor>,
) -> crate::Result<()> {
    check::rows_of(op, "x", x, 1)?;
    check::float(op, "x", x)?;
    check::float(op, "gamma", gamma)?;
    check::shape_is(op, "gamma", gamma, &[x.last_dim()])?;
    check::positive(op, "eps", eps)?;
    if !DType::FLOATS.contains(&out_dtype) && !out_dtype.is_fp8() {
        return Err(Error::invalid(op, "out_dtype", format!("{out_dtype} is not f32, f16, bf16, f8e4m3 or f8e5m2")));
    }
    match (scale, out_dtype.is_fp8()) {
        (Some(s), true) => check::scalar_f32(op, "scale", s),
        (None, true) => Err(Error::invalid(op, "scale", format!("an {out_dtype} output needs the quantizer's scale"))),
        (Some(_), false) => Err(Error::invalid(op, "scale", format!("a {out_dtype} output takes no scale"))),
        (None, false) => Ok(()),
    }
}

/// The FP8 forwards' extra outputs: amax and scale_inv.
fn fp8_outputs(v: &mut Vec<OutputSpec>, out_dtype: DType) {
    if out_dtype.is_fp8() {
        v.push(OutputSpec::new("amax", [1], DType::F32));
        v.push(OutputSpec::new("scale_inv", [1], DType::F32));
    }
}

/// dx like x; dgamma (and dbeta) like gamma.
fn bwd_outputs(x: &Tensor, gamma: &Tensor, dbeta: bool) -> Vec<OutputSpec> {
    let mut v =
        vec![OutputSpec::new("dx", x.shape(), x.dtype()), OutputSpec::new("dgamma", gamma.shape(), gamma.dtype())];
    if dbeta {
        v.push(OutputSpec::new("dbeta", gamma.shape(), gamma.dtype()));
    }
    v
}

fn bwd_common(op: &'static str, dy: &Tensor, x: &Tensor, rsigma: &Tensor, gamma: &Tensor) -> crate::Result<()> {
    check::rows_of(op, "x", x, 1)?;
    check::float(op, "x", x)?;
    check::float(op, "dy", dy)?;
    check::shape_is(op, "dy", dy, x.shape())?;
    check::dtype_is(op, "rsigma", rsigma, DType::F32)?;
    check::shape_is(op, "rsigma", rsigma, &[x.rows()])?;
    check::float(op, "gamma", gamma)?;
    check::shape_is(op, "gamma", gamma, &[x.last_dim()])
}

pub(super) fn descriptors() -> Vec<&'static OpDescriptor> {
    vec![
        RmsNormFwd::descriptor(),
        RmsNormBwd::descriptor(),
        RmsNormBwdAdd::descriptor(),
        LayerNormFwd::descriptor(),
        LayerNormBwd::descriptor(),
    ]
}
