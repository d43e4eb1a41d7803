//! Multi-tensor optimizer entry points (in place).

use tefl_core::Tensor;
use tefl_core::catalogue::*;

use crate::call::{Call, setters};

/// `multi_tensor_scale(noop_flag, src, dst, scale)`: dst = src·scale.
pub fn multi_tensor_scale(noop_flag: &Tensor, src: &[Tensor], dst: &[Tensor], scale: f32) -> Call<MultiTensorScale> {
    Call::new(MultiTensorScaleArgs { noop_flag: noop_flag.clone(), src: src.to_vec(), dst: dst.to_vec(), scale })
}

/// `multi_tensor_l2norm(noop_flag, tensors)`: the total l2 norm (and each tensor's with `.per_tensor(true)`).
pub fn multi_tensor_l2norm(noop_flag: &Tensor, tensors: &[Tensor]) -> Call<MultiTensorL2Norm> {
    Call::new(MultiTensorL2NormArgs { noop_flag: noop_flag.clone(), tensors: tensors.to_vec(), per_tensor: false })
}
setters!(MultiTensorL2Norm {
    /// Also return each tensor's norm.
    per_tensor: bool,
});

/// `multi_tensor_unscale_l2norm(noop_flag, tensors, inv_scale)`.
pub fn multi_tensor_unscale_l2norm(
    noop_flag: &Tensor,
    tensors: &[Tensor],
    inv_scale: &Tensor,
) -> Call<MultiTensorUnscaleL2Norm> {
    Call::new(MultiTensorUnscaleL2NormArgs {
        noop_flag: noop_flag.clone(),
        tensors: tensors.to_vec(),
        inv_scale: inv_scale.clone(),
        per_tensor: false,
    })
}
setters!(MultiTensorUnscaleL2Norm {
    /// Also return each tensor's norm.
    per_tensor: bool,
});

/// `multi_tensor_adam(noop_flag, grads, params, exp_avg, exp_avg_sq, lr)`: AdamW, betas
/// (0.9, 0.999), eps 1e-8, step 1, bias correction on, no weight decay, unless set.
///
/// ```no_run
/// # use tefl_core::{DType, Tensor, Device, catalogue::AdamMode};
/// # let t = || Tensor::zeros([8], DType::F32, &Device::CPU).unwrap();
/// # let (noop, g, p, m, v) = (Tensor::zeros([1], DType::I32, &Device::CPU)?, t(), t(), t(), t());
/// tefl_ops::multi_tensor_adam(&noop, &[g], &[p], &[m], &[v], 1e-3).step(10).weight_decay(0.1).mode(AdamMode::AdamW).call()?;
/// # Ok::<(), tefl_core::Error>(())
/// ```
pub fn multi_tensor_adam(
    noop_flag: &Tensor,
    grads: &[Tensor],
    params: &[Tensor],
    exp_avg: &[Tensor],
    exp_avg_sq: &[Tensor],
    lr: f32,
) -> Call<MultiTensorAdam> {
    Call::new(MultiTensorAdamArgs {
        noop_flag: noop_flag.clone(),
        grads: grads.to_vec(),
        params: params.to_vec(),
        exp_avg: exp_avg.to_vec(),
        exp_avg_sq: exp_avg_sq.to_vec(),
        hyper: AdamHyper::adamw(lr),
    })
}

/// `multi_tensor_adam_master`: Adam on f32 masters, cast into the model params.
pub fn multi_tensor_adam_master(
    noop_flag: &Tensor,
    grads: &[Tensor],
    model_params: &[Tensor],
    master_params: &[Tensor],
    exp_avg: &[Tensor],
    exp_avg_sq: &[Tensor],
    lr: f32,
) -> Call<MultiTensorAdamMaster> {
    Call::new(MultiTensorAdamMasterArgs {
        noop_flag: noop_flag.clone(),
        grads: grads.to_vec(),
        model_params: model_params.to_vec(),
        master_params: master_params.to_vec(),
        exp_avg: exp_avg.to_vec(),
        exp_avg_sq: exp_avg_sq.to_vec(),
        hyper: AdamHyper::adamw(lr),
    })
}

macro_rules! adam_setters {
    ($($op:ty),*) => {
        $(
            impl Call<$op> {
                /// β₁.
                pub fn beta1(mut self, v: f32) -> Self {
                    self.args_mut().hyper.beta1 = v;
                    self
                }
                /// β₂.
                pub fn beta2(mut self, v: f32) -> Self {
                    self.args_mut().hyper.beta2 = v;
                    self
                }
                /// ε.
                pub fn eps(mut self, v: f32) -> Self {
                    self.args_mut().hyper.eps = v;
                    self
                }
                /// The step number (≥ 1).
                pub fn step(mut self, v: u32) -> Self {
                    self.args_mut().hyper.step = v;
                    self
                }
                /// L2 or decoupled decay.
                pub fn mode(mut self, v: AdamMode) -> Self {
                    self.args_mut().hyper.mode = v;
                    self
                }
                /// Bias correction.
                pub fn bias_correction(mut self, v: bool) -> Self {
                    self.args_mut().hyper.bias_correction = v;
                    self
                }
                /// Weight decay.
                pub fn weight_decay(mut self, v: f32) -> Self {
                    self.args_mut().hyper.weight_decay = v;
                    self
                }
            }
        )*
    };
}
adam_setters!(MultiTensorAdam, MultiTensorAdamMaster);

/// `multi_tensor_sgd(noop_flag, grads, params, momentum_buf, lr)`: plain SGD unless set.
pub fn multi_tensor_sgd(
    noop_flag: &Tensor,
    grads: &[Tensor],
    params: &[Tensor],
    momentum_buf: &[Tensor],
    lr: f32,
) -> Call<MultiTensorSgd> {
    Call::new(MultiTensorSgdArgs {
        noop_flag: noop_flag.clone(),
        grads: grads.to_vec(),
        params: params.to_vec(),
        momentum_buf: momentum_buf.to_vec(),
        weight_decay: 0.0,
        momentum: 0.0,
        dampening: 0.0,
        lr,
        nesterov: false,
        first_run: false,
        wd_after_momentum: false,
        scale: 1.0,
    })
}
setters!(MultiTensorSgd {
    /// Weight decay.
    weight_decay: f32,
    /// Momentum.
    momentum: f32,
    /// Dampening.
    dampening: f32,
    /// Nesterov momentum.
    nesterov: bool,
    /// First step (the buffer is set to the gradient).
    first_run: bool,
    /// Decay after the momentum update.
    wd_after_momentum: bool,
    /// Gradient scale.
    scale: f32,
});

/// `multi_tensor_compute_scale_and_scale_inv(noop_flag, amax, scale, scale_inv, fp8_max)`.
pub fn multi_tensor_compute_scale_and_scale_inv(
    noop_flag: &Tensor,
    amax: &[Tensor],
    scale: &[Tensor],
    scale_inv: &[Tensor],
    fp8_max: f32,
) -> Call<MultiTensorComputeScaleAndScaleInv> {
    Call::new(ComputeScaleArgs {
        noop_flag: noop_flag.clone(),
        amax: amax.to_vec(),
        scale: scale.to_vec(),
        scale_inv: scale_inv.to_vec(),
        fp8_max,
        force_pow_2: false,
        epsilon: 0.0,
    })
}
setters!(MultiTensorComputeScaleAndScaleInv {
    /// Round scales down to powers of two.
    force_pow_2: bool,
    /// Lower bound on amax.
    epsilon: f32,
});
