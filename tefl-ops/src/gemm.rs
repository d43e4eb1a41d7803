//! `generic_gemm`.

use tefl_core::catalogue::*;
use tefl_core::{DType, Tensor};

use crate::call::{Call, setters};

/// `generic_gemm`: D = epilogue(alpha·op(A)·op(B) (+ C)), row-major. See
/// [`tefl_core::catalogue::GemmArgs`] for how TE's column-major argument order maps onto it.
///
/// ```no_run
/// # use tefl_core::{DType, Tensor, Device, catalogue::GemmEpilogue};
/// # let (input, weight, bias) = (Tensor::zeros([8, 16], DType::BF16, &Device::CPU)?, Tensor::zeros([32, 16], DType::BF16, &Device::CPU)?, Tensor::zeros([32], DType::BF16, &Device::CPU)?);
/// // A Linear layer's forward: input · weightᵀ + bias, with the GELU fused.
/// let out = tefl_ops::generic_gemm(&input, &weight).transb(true).bias(&bias).epilogue(GemmEpilogue::BiasGelu).call()?;
/// let (y, pre_gelu) = (out.d, out.aux_out);
/// # Ok::<(), tefl_core::Error>(())
/// ```
pub fn generic_gemm(a: &Tensor, b: &Tensor) -> Call<GenericGemm> {
    Call::new(GemmArgs {
        a: a.clone(),
        b: b.clone(),
        bias: None,
        aux: None,
        c: None,
        transa: false,
        transb: false,
        alpha: 1.0,
        accumulate: false,
        epilogue: GemmEpilogue::None,
        out_dtype: a.dtype(),
    })
}
setters!(GenericGemm {
    /// Use Aᵀ.
    transa: bool,
    /// Use Bᵀ.
    transb: bool,
    /// Scale the product.
    alpha: f32,
    /// The fused epilogue.
    epilogue: GemmEpilogue,
    /// The dtype of D.
    out_dtype: DType,
});

impl Call<GenericGemm> {
    /// The bias `[n]` of the `Bias` / `BiasGelu` epilogues.
    pub fn bias(mut self, bias: &Tensor) -> Self {
        self.args_mut().bias = Some(bias.clone());
        self
    }
    /// The forward's pre-activation `[m, n]` for the `DGelu` epilogues.
    pub fn aux(mut self, aux: &Tensor) -> Self {
        self.args_mut().aux = Some(aux.clone());
        self
    }
    /// D = product + `c` (TE's accumulate, beta = 1).
    pub fn accumulate(mut self, c: &Tensor) -> Self {
        self.args_mut().c = Some(c.clone());
        self.args_mut().accumulate = true;
        self
    }
}
