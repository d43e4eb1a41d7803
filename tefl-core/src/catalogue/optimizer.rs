//! Multi-tensor optimizer ops (in place). Each takes `noop_flag` (i32 `[1]`): non-zero on
//! entry means the op changes nothing; scale and the l2norms set it to 1 when they meet
//! inf or NaN.

use super::check;
use crate::op::{Op, OpDescriptor, OutputSpec};
use crate::{DType, Error, Result, Tensor, declare_op};

/// Adam's weight-decay mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AdamMode {
    /// Mode 0: L2 regularisation, g += wd·p (Adam).
    L2,
    /// Mode 1: decoupled decay, p −= lr·wd·p (AdamW).
    #[default]
    AdamW,
}

/// Adam's hyper-parameters, shared by [`MultiTensorAdam`] and [`MultiTensorAdamMaster`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamHyper {
    /// Learning rate.
    pub lr: f32,
    /// β₁ in [0, 1).
    pub beta1: f32,
    /// β₂ in [0, 1).
    pub beta2: f32,
    /// ε > 0.
    pub eps: f32,
    /// The step number (≥ 1) for bias correction.
    pub step: u32,
    /// L2 (Adam) or decoupled (AdamW).
    pub mode: AdamMode,
    /// Divide the moments by (1 − βᵗ).
    pub bias_correction: bool,
    /// Weight decay.
    pub weight_decay: f32,
}

impl AdamHyper {
    /// The bias corrections (1 − β₁ᵗ, 1 − β₂ᵗ) for this step, or (1, 1) without bias
    /// correction. Computed in f64 with a real exponent, so every step a `u32` holds is
    /// exact to f32 (a large step gives 1, never an overflowed exponent). Every backend uses
    /// this one helper.
    pub fn bias_corrections(&self) -> (f32, f32) {
        if !self.bias_correction {
            return (1.0, 1.0);
        }
        let c = |beta: f32| (1.0 - f64::from(beta).powf(f64::from(self.step))) as f32;
        (c(self.beta1), c(self.beta2))
    }

    /// AdamW at `lr` with betas (0.9, 0.999), eps 1e-8, step 1, bias correction, no decay.
    pub fn adamw(lr: f32) -> Self {
        AdamHyper {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            step: 1,
            mode: AdamMode::AdamW,
            bias_correction: true,
            weight_decay: 0.0,
        }
    }
}

fn check_noop(op: &'static str, t: &Tensor) -> Result<()> {
    check::dtype_is(op, "noop_flag", t, DType::I32)?;
    check::shape_is(op, "noop_flag", t, &[1])
}

fn check_list(op: &'static str, name: &'static str, list: &[Tensor], float_only: bool) -> Result<()> {
    check::nonempty(op, name, list.len())?;
    for (i, t) in list.iter().enumerate() {
        if float_only && !DType::FLOATS.contains(&t.dtype()) {
            return Err(Error::invalid(
                op,
                name,
                format!("tensor {i} has dtype {}, expected f32, f16 or bf16", t.dtype()),
            ));
        }
    }
    Ok(())
}

fn check_f32_list(op: &'static str, name: &'static str, list: &[Tensor]) -> Result<()> {
    for (i, t) in list.iter().enumerate() {
        if t.dtype() != DType::F32 {
            return Err(Error::invalid(op, name, format!("tensor {i} has dtype {}, expected f32", t.dtype())));
        }
    }
    Ok(())
}

/// The l2norms' outputs: the total, and one norm per tensor when asked.
fn norm_outputs(n: usize, per_tensor: bool) -> Vec<OutputSpec> {
    let mut v = vec![OutputSpec::new("total", [1], DType::F32)];
    if per_tensor {
        v.push(OutputSpec::new("per_tensor_norms", [n], DType::F32));
    }
    v
}

fn finite(op: &'static str, name: &'static str, v: f32) -> Result<()> {
    if v.is_finite() { Ok(()) } else { Err(Error::invalid(op, name, format!("must be finite, got {v}"))) }
}

declare_op! {
    /// `multi_tensor_scale(noop, src[], dst[], scale)`: dst = src·scale; sets noop on inf/NaN in src.
    /// In place is allowed: `dst[i]` may be `src[i]` itself (same dtype and shape).
    pub struct MultiTensorScale = "multi_tensor_scale";
    /// Arguments of [`MultiTensorScale`].
    pub struct MultiTensorScaleArgs {
        /// i32 `[1]`.
        inout noop_flag: Tensor,
        /// Sources.
        tensor src: Vec<Tensor>,
        /// Destinations (same shapes; any float dtype).
        inout dst: Vec<Tensor>,
        /// The factor.
        scalar scale: f32,
    }
    /// Outputs of [`MultiTensorScale`] (none: `dst` and `noop_flag` are written in place).
    pub struct MultiTensorScaleOut {}
    validate(a) {
        const OP: &str = "multi_tensor_scale";
        check_noop(OP, &a.noop_flag)?;
        check_list(OP, "src", &a.src, true)?;
        check_list(OP, "dst", &a.dst, true)?;
        check::same_len(OP, "dst", a.dst.len(), a.src.len())?;
        check::pairwise_shapes(OP, "dst", &a.dst, &a.src)?;
        finite(OP, "scale", a.scale)
    }
    in_place [("dst", "src")]
}

declare_op! {
    /// `multi_tensor_l2norm(noop, t[], per_tensor) -> (total, per_tensor_norms)`; sets noop on inf/NaN.
    pub struct MultiTensorL2Norm = "multi_tensor_l2norm";
    /// Arguments of [`MultiTensorL2Norm`].
    pub struct MultiTensorL2NormArgs {
        /// i32 `[1]`.
        inout noop_flag: Tensor,
        /// The tensors.
        tensor tensors: Vec<Tensor>,
        /// Also return each tensor's norm.
        scalar per_tensor: bool,
    }
    /// Outputs of [`MultiTensorL2Norm`].
    pub struct MultiTensorL2NormOut {
        /// f32 `[1]`: the norm of all tensors together.
        tensor total: Tensor,
        /// f32 `[n]` when `per_tensor`.
        tensor per_tensor_norms: Option<Tensor>,
    }
    validate(a) {
        check_noop("multi_tensor_l2norm", &a.noop_flag)?;
        check_list("multi_tensor_l2norm", "tensors", &a.tensors, true)
    }
    outputs(a) { norm_outputs(a.tensors.len(), a.per_tensor) }
}

declare_op! {
    /// `multi_tensor_unscale_l2norm(noop, t[], inv_scale, per_tensor)`: the l2 norms of t·inv_scale.
    pub struct MultiTensorUnscaleL2Norm = "multi_tensor_unscale_l2norm";
    /// Arguments of [`MultiTensorUnscaleL2Norm`].
    pub struct MultiTensorUnscaleL2NormArgs {
        /// i32 `[1]`.
        inout noop_flag: Tensor,
        /// The tensors.
        tensor tensors: Vec<Tensor>,
        /// f32 `[1]`.
        tensor inv_scale: Tensor,
        /// Also return each tensor's norm.
        scalar per_tensor: bool,
    }
    /// Outputs of [`MultiTensorUnscaleL2Norm`].
    pub struct MultiTensorUnscaleL2NormOut {
        /// f32 `[1]`.
        tensor total: Tensor,
        /// f32 `[n]` when `per_tensor`.
        tensor per_tensor_norms: Option<Tensor>,
    }
    validate(a) {
        const OP: &str = "multi_tensor_unscale_l2norm";
        check_noop(OP, &a.noop_flag)?;
        check_list(OP, "tensors", &a.tensors, true)?;
        check::scalar_f32(OP, "inv_scale", &a.inv_scale)
    }
    outputs(a) { norm_outputs(a.tensors.len(), a.per_tensor) }
}

declare_op! {
    /// `multi_tensor_adam(noop, grads[], params[], m[], v[], lr, beta1, beta2, eps, step, mode,
    /// bias_correction, weight_decay)`: params f32/f16/bf16, states f32, math in f32.
    pub struct MultiTensorAdam = "multi_tensor_adam";
    /// Arguments of [`MultiTensorAdam`].
    pub struct MultiTensorAdamArgs {
        /// i32 `[1]`.
        inout noop_flag: Tensor,
        /// Gradients (same shapes as params).
        tensor grads: Vec<Tensor>,
        /// Parameters, updated in place.
        inout params: Vec<Tensor>,
        /// First moments (f32), updated in place.
        inout exp_avg: Vec<Tensor>,
        /// Second moments (f32), updated in place.
        inout exp_avg_sq: Vec<Tensor>,
        /// The hyper-parameters.
        scalar hyper: AdamHyper,
    }
    /// Outputs of [`MultiTensorAdam`] (none: everything is in place).
    pub struct MultiTensorAdamOut {}
    validate(a) {
        const OP: &str = "multi_tensor_adam";
        check_noop(OP, &a.noop_flag)?;
        check_adam(OP, &a.grads, ("params", &a.params), &a.exp_avg, &a.exp_avg_sq, &a.hyper)
    }
}

declare_op! {
    /// `multi_tensor_adam_master` (TE's `multi_tensor_adam_capturable_master` role): Adam on f32
    /// master params, then the updated masters are cast into the half-precision model params.
    pub struct MultiTensorAdamMaster = "multi_tensor_adam_master";
    /// Arguments of [`MultiTensorAdamMaster`].
    pub struct MultiTensorAdamMasterArgs {
        /// i32 `[1]`.
        inout noop_flag: Tensor,
        /// Gradients.
        tensor grads: Vec<Tensor>,
        /// The model's params (f16/bf16/f32), overwritten with the cast masters.
        inout model_params: Vec<Tensor>,
        /// f32 master params, updated in place.
        inout master_params: Vec<Tensor>,
        /// f32 first moments.
        inout exp_avg: Vec<Tensor>,
        /// f32 second moments.
        inout exp_avg_sq: Vec<Tensor>,
        /// The hyper-parameters.
        scalar hyper: AdamHyper,
    }
    /// Outputs of [`MultiTensorAdamMaster`] (none).
    pub struct MultiTensorAdamMasterOut {}
    validate(a) {
        const OP: &str = "multi_tensor_adam_master";
        check_noop(OP, &a.noop_flag)?;
        check_adam(OP, &a.grads, ("master_params", &a.master_params), &a.exp_avg, &a.exp_avg_sq, &a.hyper)?;
        check_f32_list(OP, "master_params", &a.master_params)?;
        check_list(OP, "model_params", &a.model_params, true)?;
        check::same_len(OP, "model_params", a.model_params.len(), a.master_params.len())?;
        check::pairwise_shapes(OP, "model_params", &a.model_params, &a.master_params)
    }
}

/// The checks both Adams share; `params` is the list Adam updates in f32 by its argument name
/// (`params`, or the master variant's `master_params`).
fn check_adam(
    op: &'static str,
    grads: &[Tensor],
    params: (&'static str, &[Tensor]),
    m: &[Tensor],
    v: &[Tensor],
    h: &AdamHyper,
) -> Result<()> {
    let (params_name, params) = params;
    check_list(op, "grads", grads, true)?;
    check_list(op, params_name, params, true)?;
    for (name, list) in [(params_name, params), ("exp_avg", m), ("exp_avg_sq", v)] {
        check::same_len(op, name, list.len(), grads.len())?;
        check::pairwise_shapes(op, name, list, grads)?;
    }
    check_f32_list(op, "exp_avg", m)?;
    check_f32_list(op, "exp_avg_sq", v)?;
    finite(op, "lr", h.lr)?;
    finite(op, "weight_decay", h.weight_decay)?;
    check::probability(op, "beta1", h.beta1)?;
    check::probability(op, "beta2", h.beta2)?;
    check::positive(op, "eps", h.eps)?;
    if h.step == 0 {
        return Err(Error::invalid(op, "step", "must be >= 1"));
    }
    Ok(())
}

declare_op! {
    /// `multi_tensor_sgd(noop, grads[], params[], momentum_buf[], wd, momentum, dampening, lr,
    /// nesterov, first_run, wd_after_momentum, scale)` (PyTorch's SGD semantics; g = grad·scale).
    pub struct MultiTensorSgd = "multi_tensor_sgd";
    /// Arguments of [`MultiTensorSgd`].
    pub struct MultiTensorSgdArgs {
        /// i32 `[1]`.
        inout noop_flag: Tensor,
        /// Gradients.
        tensor grads: Vec<Tensor>,
        /// Parameters.
        inout params: Vec<Tensor>,
        /// Momentum buffers (f32).
        inout momentum_buf: Vec<Tensor>,
        /// Weight decay.
        scalar weight_decay: f32,
        /// Momentum (0 = none).
        scalar momentum: f32,
        /// Dampening.
        scalar dampening: f32,
        /// Learning rate.
        scalar lr: f32,
        /// Nesterov momentum.
        scalar nesterov: bool,
        /// First step: the buffer is set to g instead of updated.
        scalar first_run: bool,
        /// Apply weight decay after the momentum update.
        scalar wd_after_momentum: bool,
        /// Multiplies the gradients first.
        scalar scale: f32,
    }
    /// Outputs of [`MultiTensorSgd`] (none).
    pub struct MultiTensorSgdOut {}
    validate(a) {
        const OP: &str = "multi_tensor_sgd";
        check_noop(OP, &a.noop_flag)?;
        check_list(OP, "grads", &a.grads, true)?;
        for (name, list) in [("params", &a.params), ("momentum_buf", &a.momentum_buf)] {
            check::same_len(OP, name, list.len(), a.grads.len())?;
            check::pairwise_shapes(OP, name, list, &a.grads)?;
        }
        check_list(OP, "params", &a.params, true)?;
        check_f32_list(OP, "momentum_buf", &a.momentum_buf)?;
        for (n, v) in [("weight_decay", a.weight_decay), ("momentum", a.momentum), ("dampening", a.dampening), ("lr", a.lr), ("scale", a.scale)] {
            finite(OP, n, v)?;
        }
        Ok(())
    }
}

declare_op! {
    /// `multi_tensor_compute_scale_and_scale_inv(noop, amax[], scale[], scale_inv[], fp8_max,
    /// force_pow_2, epsilon)`: scale = fp8_max / max(amax, epsilon) (rounded down to a power of 2 when
    /// asked; kept when amax is not finite or the result is not), scale_inv = 1/scale.
    pub struct MultiTensorComputeScaleAndScaleInv = "multi_tensor_compute_scale_and_scale_inv";
    /// Arguments of [`MultiTensorComputeScaleAndScaleInv`].
    pub struct ComputeScaleArgs {
        /// i32 `[1]`.
        inout noop_flag: Tensor,
        /// f32 amaxes.
        tensor amax: Vec<Tensor>,
        /// f32 scales, written.
        inout scale: Vec<Tensor>,
        /// f32 inverse scales, written.
        inout scale_inv: Vec<Tensor>,
        /// 448 (e4m3) or 57344 (e5m2), or another positive maximum.
        scalar fp8_max: f32,
        /// Round the scale down to a power of two.
        scalar force_pow_2: bool,
        /// Lower bound on amax.
        scalar epsilon: f32,
    }
    /// Outputs of [`MultiTensorComputeScaleAndScaleInv`] (none).
    pub struct ComputeScaleOut {}
    validate(a) {
        const OP: &str = "multi_tensor_compute_scale_and_scale_inv";
        check_noop(OP, &a.noop_flag)?;
        check::nonempty(OP, "amax", a.amax.len())?;
        for (name, list) in [("amax", &a.amax), ("scale", &a.scale), ("scale_inv", &a.scale_inv)] {
            check::same_len(OP, name, list.len(), a.amax.len())?;
            check_f32_list(OP, name, list)?;
            check::pairwise_shapes(OP, name, list, &a.amax)?;
        }
        check::positive(OP, "fp8_max", a.fp8_max)?;
        if !(a.epsilon.is_finite() && a.epsilon >= 0.0) {
            return Err(Error::invalid(OP, "epsilon", format!("must be finite and >= 0, got {}", a.epsilon)));
        }
        Ok(())
    }
}

pub(super) fn descriptors() -> Vec<&'static OpDescriptor> {
    vec![
        MultiTensorScale::descriptor(),
        MultiTensorL2Norm::descriptor(),
        MultiTensorUnscaleL2Norm::descriptor(),
        MultiTensorAdam::descriptor(),
        MultiTensorAdamMaster::descriptor(),
        MultiTensorSgd::descriptor(),
        MultiTensorComputeScaleAndScaleInv::descriptor(),
    ]
}
