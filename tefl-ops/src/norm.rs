//! Normalisation entry points.

use tefl_core::catalogue::*;
use tefl_core::{DType, Tensor};

use crate::call::{Call, setters};

/// `rmsnorm_fwd`: y = x·rsigma·g, rsigma = 1/sqrt(mean(x²) + eps) over the last dim; `y` has
/// `x`'s dtype unless `.out_dtype(..)` says otherwise.
///
/// ```no_run
/// # use tefl_core::{DType, Tensor, Device};
/// # let x = Tensor::zeros([4, 8], DType::BF16, &Device::CPU)?;
/// # let gamma = Tensor::zeros([8], DType::BF16, &Device::CPU)?;
/// let out = tefl_ops::rmsnorm_fwd(&x, &gamma, 1e-5).zero_centered_gamma(true).out_dtype(DType::F32).call()?;
/// let (y, rsigma) = (out.y, out.rsigma);
/// # Ok::<(), tefl_core::Error>(())
/// ```
pub fn rmsnorm_fwd(x: &Tensor, gamma: &Tensor, eps: f32) -> Call<RmsNormFwd> {
    Call::new(RmsNormFwdArgs {
        x: x.clone(),
        gamma: gamma.clone(),
        eps,
        zero_centered_gamma: false,
        out_dtype: x.dtype(),
        scale: None,
    })
}
setters!(RmsNormFwd {
    /// Scale by `1 + gamma`.
    zero_centered_gamma: bool,
    /// The dtype of `y`.
    out_dtype: DType,
});

impl Call<RmsNormFwd> {
    /// Writes `y` as FP8 (`f8e4m3` or `f8e5m2`) scaled by `scale` (f32 `[1]`), returning its
    /// `amax` and `scale_inv` too: TE's norm with an output quantizer.
    pub fn fp8_output(mut self, fp8_dtype: DType, scale: &Tensor) -> Self {
        self.args_mut().out_dtype = fp8_dtype;
        self.args_mut().scale = Some(scale.clone());
        self
    }
}

/// `rmsnorm_bwd`: `(dx, dgamma)` from the forward's `x`, `rsigma` and `gamma`.
pub fn rmsnorm_bwd(dy: &Tensor, x: &Tensor, rsigma: &Tensor, gamma: &Tensor) -> Call<RmsNormBwd> {
    Call::new(RmsNormBwdArgs {
        dy: dy.clone(),
        x: x.clone(),
        rsigma: rsigma.clone(),
        gamma: gamma.clone(),
        zero_centered_gamma: false,
    })
}
setters!(RmsNormBwd {
    /// As in the forward.
    zero_centered_gamma: bool,
});

/// `rmsnorm_bwd_add`: RMSNorm backward with the residual gradient `add` fused into `dx`.
pub fn rmsnorm_bwd_add(dy: &Tensor, x: &Tensor, rsigma: &Tensor, gamma: &Tensor, add: &Tensor) -> Call<RmsNormBwdAdd> {
    Call::new(RmsNormBwdAddArgs {
        dy: dy.clone(),
        x: x.clone(),
        rsigma: rsigma.clone(),
        gamma: gamma.clone(),
        add: add.clone(),
        zero_centered_gamma: false,
    })
}
setters!(RmsNormBwdAdd {
    /// As in the forward.
    zero_centered_gamma: bool,
});

/// `layernorm_fwd`: y = (x − mu)·rsigma·g + beta; returns `y`, `mu` and `rsigma`.
pub fn layernorm_fwd(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> Call<LayerNormFwd> {
    Call::new(LayerNormFwdArgs {
        x: x.clone(),
        gamma: gamma.clone(),
        beta: beta.clone(),
        eps,
        zero_centered_gamma: false,
        out_dtype: x.dtype(),
        scale: None,
    })
}
setters!(LayerNormFwd {
    /// Scale by `1 + gamma`.
    zero_centered_gamma: bool,
    /// The dtype of `y`.
    out_dtype: DType,
});

impl Call<LayerNormFwd> {
    /// Writes `y` as FP8 scaled by `scale`, with its `amax` and `scale_inv` (see
    /// [`Call::<RmsNormFwd>::fp8_output`]).
    pub fn fp8_output(mut self, fp8_dtype: DType, scale: &Tensor) -> Self {
        self.args_mut().out_dtype = fp8_dtype;
        self.args_mut().scale = Some(scale.clone());
        self
    }
}

/// `layernorm_bwd`: `(dx, dgamma, dbeta)`.
pub fn layernorm_bwd(dy: &Tensor, x: &Tensor, mu: &Tensor, rsigma: &Tensor, gamma: &Tensor) -> Call<LayerNormBwd> {
    Call::new(LayerNormBwdArgs {
        dy: dy.clone(),
        x: x.clone(),
        mu: mu.clone(),
        rsigma: rsigma.clone(),
        gamma: gamma.clone(),
        zero_centered_gamma: false,
    })
}
setters!(LayerNormBwd {
    /// As in the forward.
    zero_centered_gamma: bool,
});
