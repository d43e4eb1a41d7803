//! Normalisation entry points.

use tefl_core::catalogue::{RmsNormBwd, RmsNormBwdArgs, RmsNormFwd, RmsNormFwdArgs};
use tefl_core::{DType, Manager, Result, Tensor};

/// `rmsnorm_fwd`: y = x·rsigma·g with rsigma = 1/sqrt(mean(x²) + eps) over the last dim.
/// Returns `(y, rsigma)`; `y` has `x`'s dtype unless [`RmsNormFwdCall::out_dtype`] says otherwise.
///
/// ```no_run
/// # use tefl_core::{DType, Tensor};
/// # let (x, gamma) = (Tensor::zeros([4, 8], DType::BF16, &tefl_core::Device::CPU)?, Tensor::zeros([8], DType::BF16, &tefl_core::Device::CPU)?);
/// let (y, rsigma) = tefl_ops::rmsnorm_fwd(&x, &gamma, 1e-5).zero_centered_gamma(true).out_dtype(DType::F32).call()?;
/// # Ok::<(), tefl_core::Error>(())
/// ```
pub fn rmsnorm_fwd(x: &Tensor, gamma: &Tensor, eps: f32) -> RmsNormFwdCall {
    RmsNormFwdCall(RmsNormFwdArgs {
        x: x.clone(),
        gamma: gamma.clone(),
        eps,
        zero_centered_gamma: false,
        out_dtype: x.dtype(),
    })
}

/// A pending `rmsnorm_fwd` call; see [`rmsnorm_fwd`].
#[derive(Debug, Clone)]
pub struct RmsNormFwdCall(pub RmsNormFwdArgs);

impl RmsNormFwdCall {
    /// Use `1 + gamma` as the scale.
    pub fn zero_centered_gamma(mut self, on: bool) -> Self {
        self.0.zero_centered_gamma = on;
        self
    }
    /// The dtype of `y` (f32, f16 or bf16).
    pub fn out_dtype(mut self, dtype: DType) -> Self {
        self.0.out_dtype = dtype;
        self
    }
    /// Runs on the global manager.
    pub fn call(self) -> Result<(Tensor, Tensor)> {
        self.call_with(tefl_core::global()?)
    }
    /// Runs on `manager`.
    pub fn call_with(self, manager: &Manager) -> Result<(Tensor, Tensor)> {
        let out = manager.call::<RmsNormFwd>(&self.0)?;
        Ok((out.y, out.rsigma))
    }
}

/// `rmsnorm_bwd`: returns `(dx, dgamma)` for the forward's `x`, `rsigma` and `gamma`.
pub fn rmsnorm_bwd(dy: &Tensor, x: &Tensor, rsigma: &Tensor, gamma: &Tensor) -> RmsNormBwdCall {
    RmsNormBwdCall(RmsNormBwdArgs {
        dy: dy.clone(),
        x: x.clone(),
        rsigma: rsigma.clone(),
        gamma: gamma.clone(),
        zero_centered_gamma: false,
    })
}

/// A pending `rmsnorm_bwd` call; see [`rmsnorm_bwd`].
#[derive(Debug, Clone)]
pub struct RmsNormBwdCall(pub RmsNormBwdArgs);

impl RmsNormBwdCall {
    /// As in the forward.
    pub fn zero_centered_gamma(mut self, on: bool) -> Self {
        self.0.zero_centered_gamma = on;
        self
    }
    /// Runs on the global manager.
    pub fn call(self) -> Result<(Tensor, Tensor)> {
        self.call_with(tefl_core::global()?)
    }
    /// Runs on `manager`.
    pub fn call_with(self, manager: &Manager) -> Result<(Tensor, Tensor)> {
        let out = manager.call::<RmsNormBwd>(&self.0)?;
        Ok((out.dx, out.dgamma))
    }
}
