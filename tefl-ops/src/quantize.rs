//! FP8 and dropout entry points.

use tefl_core::catalogue::*;
use tefl_core::{DType, Tensor};

use crate::call::{Call, setters};

/// `quantize(x, fp8_dtype, scale)`: FP8 codes of x·scale, amax and scale_inv (and qᵀ with
/// `.want_transpose(true)`).
pub fn quantize(x: &Tensor, fp8_dtype: DType, scale: &Tensor) -> Call<Quantize> {
    Call::new(QuantizeArgs { x: x.clone(), scale: scale.clone(), fp8_dtype, want_transpose: false })
}
setters!(Quantize {
    /// Also return the transposed codes (x must be 2-D).
    want_transpose: bool,
});

/// `bgrad_quantize(x, fp8_dtype, scale)`: the bias gradient (column sums of `x [m, n]`) and
/// the FP8 cast of `x`, in one pass.
pub fn bgrad_quantize(x: &Tensor, fp8_dtype: DType, scale: &Tensor) -> Call<BgradQuantize> {
    Call::new(BgradQuantizeArgs { x: x.clone(), scale: scale.clone(), fp8_dtype, want_transpose: false })
}
setters!(BgradQuantize {
    /// Also return the transposed codes.
    want_transpose: bool,
});

/// `dequantize(q, scale_inv)` to f32 unless `.out_dtype(..)`.
pub fn dequantize(q: &Tensor, scale_inv: &Tensor) -> Call<Dequantize> {
    Call::new(DequantizeArgs { q: q.clone(), scale_inv: scale_inv.clone(), out_dtype: DType::F32 })
}
setters!(Dequantize {
    /// The output dtype.
    out_dtype: DType,
});

/// `compute_amax(x)` = max |x|.
pub fn compute_amax(x: &Tensor) -> Call<ComputeAmax> {
    Call::new(ComputeAmaxArgs { x: x.clone() })
}

/// `fp8_transpose(q)`.
pub fn fp8_transpose(q: &Tensor) -> Call<Fp8Transpose> {
    Call::new(Fp8TransposeArgs { q: q.clone() })
}

/// `fused_amax_and_scale_update_after_reduction(amax_history, scale, scale_inv, fp8_max)`:
/// margin 0 and the max over the history unless set.
pub fn fused_amax_and_scale_update_after_reduction(
    amax_history: &Tensor,
    scale: &Tensor,
    scale_inv: &Tensor,
    fp8_max: f32,
) -> Call<FusedAmaxAndScaleUpdate> {
    Call::new(DelayedScalingArgs {
        amax_history: amax_history.clone(),
        scale: scale.clone(),
        scale_inv: scale_inv.clone(),
        fp8_max,
        margin: 0.0,
        algo: AmaxAlgo::Max,
    })
}
setters!(FusedAmaxAndScaleUpdate {
    /// Headroom in powers of two.
    margin: f32,
    /// How the history reduces.
    algo: AmaxAlgo,
});

/// `dropout_fwd(x, p, seed, offset)`: `y` and the u8 keep mask.
pub fn dropout_fwd(x: &Tensor, p: f32, seed: u64, offset: u64) -> Call<DropoutFwd> {
    Call::new(DropoutFwdArgs { x: x.clone(), p, seed, offset })
}

/// `dropout_bwd(dy, mask, p)`.
pub fn dropout_bwd(dy: &Tensor, mask: &Tensor, p: f32) -> Call<DropoutBwd> {
    Call::new(DropoutBwdArgs { dy: dy.clone(), mask: mask.clone(), p })
}
