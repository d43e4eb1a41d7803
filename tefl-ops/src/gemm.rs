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
    Call::new(GemmArgs::new(a.clone(), b.clone()))
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
    /// FP8: accumulate at full precision (TE's `use_split_accumulator`).
    split_accumulator: bool,
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
    /// FP8 operands: the per-tensor `scale_inv` (f32 `[1]`) of A and of B.
    pub fn fp8_scales(mut self, a_scale_inv: &Tensor, b_scale_inv: &Tensor) -> Self {
        self.args_mut().a_scale_inv = Some(a_scale_inv.clone());
        self.args_mut().b_scale_inv = Some(b_scale_inv.clone());
        self
    }
    /// Writes D as FP8 scaled by `d_scale` (f32 `[1]`), returning max |D| as `d_amax`.
    pub fn fp8_output(mut self, fp8_dtype: DType, d_scale: &Tensor) -> Self {
        self.args_mut().out_dtype = fp8_dtype;
        self.args_mut().d_scale = Some(d_scale.clone());
        self
    }
}

/// `te_general_grouped_gemm`: D_g = op(A_g)·op(B_g) for every group g in one call (the
/// experts of a mixture-of-experts layer); `d` is one tensor per group. D has A's dtype (bf16
/// for FP8 A) unless `.out_dtype(..)`.
///
/// ```no_run
/// # use tefl_core::{DType, Tensor, Device};
/// # let xs: Vec<Tensor> = vec![];
/// # let ws: Vec<Tensor> = vec![];
/// // Each expert's tokens [m_g, k] times its weight [n, k]ᵀ.
/// let out = tefl_ops::grouped_gemm(&xs, &ws).transb(true).call()?;
/// # Ok::<(), tefl_core::Error>(())
/// ```
pub fn grouped_gemm(a: &[Tensor], b: &[Tensor]) -> Call<GroupedGemm> {
    let out_dtype = match a.first().map(|t| t.dtype()) {
        Some(d) if d.is_fp8() => DType::BF16,
        Some(d) => d,
        None => DType::BF16,
    };
    Call::new(GroupedGemmArgs {
        a: a.to_vec(),
        b: b.to_vec(),
        a_scale_inv: Vec::new(),
        b_scale_inv: Vec::new(),
        bias: Vec::new(),
        transa: false,
        transb: false,
        out_dtype,
        split_accumulator: false,
    })
}
setters!(GroupedGemm {
    /// Use A_gᵀ.
    transa: bool,
    /// Use B_gᵀ.
    transb: bool,
    /// The dtype of every D_g.
    out_dtype: DType,
    /// FP8: accumulate at full precision.
    split_accumulator: bool,
});

impl Call<GroupedGemm> {
    /// One bias `[n_g]` per group.
    pub fn bias(mut self, bias: &[Tensor]) -> Self {
        self.args_mut().bias = bias.to_vec();
        self
    }
    /// FP8 operands: one `scale_inv` per group for A and for B.
    pub fn fp8_scales(mut self, a_scale_inv: &[Tensor], b_scale_inv: &[Tensor]) -> Self {
        self.args_mut().a_scale_inv = a_scale_inv.to_vec();
        self.args_mut().b_scale_inv = b_scale_inv.to_vec();
        self
    }
}
