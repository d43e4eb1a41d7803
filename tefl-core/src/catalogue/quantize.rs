//! FP8 with per-tensor scaling: quantize, dequantize, amax, transpose and the delayed-scaling update.

use super::check;
use crate::op::{Op, OpDescriptor, OutputSpec};
use crate::{DType, Error, Tensor, declare_op};

/// How delayed scaling reduces the amax history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AmaxAlgo {
    /// The maximum over the whole history.
    #[default]
    Max,
    /// The most recent entry (row 0).
    MostRecent,
}

declare_op! {
    /// `quantize(x, fp8_dtype, scale, want_transpose) -> (q, q_t?, amax, scale_inv)`:
    /// q = saturating RNE cast of x·scale; amax = max|x|; scale_inv = 1/scale. With
    /// `want_transpose` this is TE's fused cast + transpose: both orientations of the codes
    /// (for the TN-only FP8 GEMMs, see `generic_gemm`) with one amax, from one read of x.
    pub struct Quantize = "quantize";
    /// Arguments of [`Quantize`].
    pub struct QuantizeArgs {
        /// Input (f32/f16/bf16); 2-D when a transpose is wanted.
        tensor x: Tensor,
        /// f32 `[1]`.
        tensor scale: Tensor,
        /// f8e4m3 or f8e5m2.
        scalar fp8_dtype: DType,
        /// Also return qᵀ (x must be 2-D).
        scalar want_transpose: bool,
    }
    /// Outputs of [`Quantize`].
    pub struct QuantizeOut {
        /// FP8 codes, shape of `x`.
        tensor q: Tensor,
        /// FP8 codes of xᵀ when asked.
        tensor q_t: Option<Tensor>,
        /// f32 `[1]`: max |x|.
        tensor amax: Tensor,
        /// f32 `[1]`: 1/scale.
        tensor scale_inv: Tensor,
    }
    validate(a) {
        const OP: &str = "quantize";
        check::float(OP, "x", &a.x)?;
        check::scalar_f32(OP, "scale", &a.scale)?;
        if !a.fp8_dtype.is_fp8() {
            return Err(Error::invalid(OP, "fp8_dtype", format!("{} is not f8e4m3 or f8e5m2", a.fp8_dtype)));
        }
        if a.want_transpose && a.x.rank() != 2 {
            return Err(Error::Shape { op: OP, arg: "x", got: a.x.shape().to_vec(), expected: "rank 2 for a transpose".into() });
        }
        Ok(())
    }
    outputs(a) {
        let mut v = vec![
            OutputSpec::new("q", a.x.shape(), a.fp8_dtype),
            OutputSpec::new("amax", [1], DType::F32),
            OutputSpec::new("scale_inv", [1], DType::F32),
        ];
        if a.want_transpose {
            let s = a.x.shape(); // rank 2 (validated)
            v.push(OutputSpec::new("q_t", [s[1], s[0]], a.fp8_dtype));
        }
        v
    }
}

declare_op! {
    /// `bgrad_quantize(x[m, n], scale, fp8_dtype, want_transpose) -> (dbias, q, q_t?, amax, scale_inv)`:
    /// the bias gradient dbias\[j\] = Σ_i x\[i, j\] (accumulated in f32, stored in x's dtype) and
    /// `quantize` of the same x, in one pass over it (TE's `bgrad_quantize`, the backward of a
    /// Linear with bias whose output gradient feeds FP8 GEMMs).
    pub struct BgradQuantize = "bgrad_quantize";
    /// Arguments of [`BgradQuantize`].
    pub struct BgradQuantizeArgs {
        /// The gradient `[m, n]` (f32/f16/bf16).
        tensor x: Tensor,
        /// f32 `[1]`.
        tensor scale: Tensor,
        /// f8e4m3 or f8e5m2.
        scalar fp8_dtype: DType,
        /// Also return qᵀ.
        scalar want_transpose: bool,
    }
    /// Outputs of [`BgradQuantize`].
    pub struct BgradQuantizeOut {
        /// `[n]`, dtype of `x`.
        tensor dbias: Tensor,
        /// FP8 codes `[m, n]`.
        tensor q: Tensor,
        /// FP8 codes `[n, m]` when asked.
        tensor q_t: Option<Tensor>,
        /// f32 `[1]`: max |x|.
        tensor amax: Tensor,
        /// f32 `[1]`: 1/scale.
        tensor scale_inv: Tensor,
    }
    validate(a) {
        const OP: &str = "bgrad_quantize";
        check::float(OP, "x", &a.x)?;
        if a.x.rank() != 2 {
            return Err(Error::Shape { op: OP, arg: "x", got: a.x.shape().to_vec(), expected: "rank 2 [m, n]".into() });
        }
        check::scalar_f32(OP, "scale", &a.scale)?;
        if !a.fp8_dtype.is_fp8() {
            return Err(Error::invalid(OP, "fp8_dtype", format!("{} is not f8e4m3 or f8e5m2", a.fp8_dtype)));
        }
        Ok(())
    }
    outputs(a) {
        let s = a.x.shape(); // rank 2 (validated)
        let mut v = vec![
            OutputSpec::new("dbias", [s[1]], a.x.dtype()),
            OutputSpec::new("q", s, a.fp8_dtype),
            OutputSpec::new("amax", [1], DType::F32),
            OutputSpec::new("scale_inv", [1], DType::F32),
        ];
        if a.want_transpose {
            v.push(OutputSpec::new("q_t", [s[1], s[0]], a.fp8_dtype));
        }
        v
    }
}

declare_op! {
    /// `dequantize(q, scale_inv, out_dtype) -> q·scale_inv`.
    pub struct Dequantize = "dequantize";
    /// Arguments of [`Dequantize`].
    pub struct DequantizeArgs {
        /// FP8 codes.
        tensor q: Tensor,
        /// f32 `[1]`.
        tensor scale_inv: Tensor,
        /// f32, f16 or bf16.
        scalar out_dtype: DType,
    }
    /// Outputs of [`Dequantize`].
    pub struct DequantizeOut {
        /// Shape of `q`.
        tensor y: Tensor,
    }
    validate(a) {
        check::dtype_in("dequantize", "q", &a.q, &[DType::F8E4M3, DType::F8E5M2])?;
        check::scalar_f32("dequantize", "scale_inv", &a.scale_inv)?;
        check::out_float("dequantize", "out_dtype", a.out_dtype)
    }
    outputs(a) { vec![OutputSpec::new("y", a.q.shape(), a.out_dtype)] }
}

declare_op! {
    /// `compute_amax(x) -> max |x|` (f32 `[1]`; NaN if x holds one).
    pub struct ComputeAmax = "compute_amax";
    /// Arguments of [`ComputeAmax`].
    pub struct ComputeAmaxArgs {
        /// Input.
        tensor x: Tensor,
    }
    /// Outputs of [`ComputeAmax`].
    pub struct ComputeAmaxOut {
        /// f32 `[1]`.
        tensor amax: Tensor,
    }
    validate(a) { check::float("compute_amax", "x", &a.x) }
    outputs(a) { vec![OutputSpec::new("amax", [1], DType::F32)] }
}

declare_op! {
    /// `fp8_transpose(q[m, n]) -> q[n, m]`.
    pub struct Fp8Transpose = "fp8_transpose";
    /// Arguments of [`Fp8Transpose`].
    pub struct Fp8TransposeArgs {
        /// FP8 codes `[m, n]`.
        tensor q: Tensor,
    }
    /// Outputs of [`Fp8Transpose`].
    pub struct Fp8TransposeOut {
        /// `[n, m]`.
        tensor q_t: Tensor,
    }
    validate(a) {
        check::dtype_in("fp8_transpose", "q", &a.q, &[DType::F8E4M3, DType::F8E5M2])?;
        if a.q.rank() != 2 {
            return Err(Error::Shape { op: "fp8_transpose", arg: "q", got: a.q.shape().to_vec(), expected: "rank 2".into() });
        }
        Ok(())
    }
    outputs(a) {
        let s = a.q.shape(); // rank 2 (validated)
        vec![OutputSpec::new("q_t", [s[1], s[0]], a.q.dtype())]
    }
}

declare_op! {
    /// `fused_amax_and_scale_update_after_reduction(amax_history, scale, scale_inv, fp8_max, margin, algo)`:
    /// amax = max over the history (or row 0); scale = fp8_max / amax / 2^margin, kept when amax is 0
    /// or not finite; scale_inv = 1/scale; then the history rolls up one row and row 0 is zeroed.
    pub struct FusedAmaxAndScaleUpdate = "fused_amax_and_scale_update_after_reduction";
    /// Arguments of [`FusedAmaxAndScaleUpdate`].
    pub struct DelayedScalingArgs {
        /// f32 `[history, n]`, row 0 the newest.
        inout amax_history: Tensor,
        /// f32 `[n]`.
        inout scale: Tensor,
        /// f32 `[n]`.
        inout scale_inv: Tensor,
        /// The format's max (448 or 57344).
        scalar fp8_max: f32,
        /// Extra headroom in powers of two.
        scalar margin: f32,
        /// How the history reduces.
        scalar algo: AmaxAlgo,
    }
    /// Outputs of [`FusedAmaxAndScaleUpdate`] (none: everything is in place).
    pub struct DelayedScalingOut {}
    validate(a) {
        const OP: &str = "fused_amax_and_scale_update_after_reduction";
        check::dtype_is(OP, "amax_history", &a.amax_history, DType::F32)?;
        if a.amax_history.rank() != 2 || a.amax_history.shape().contains(&0) {
            return Err(Error::Shape { op: OP, arg: "amax_history", got: a.amax_history.shape().to_vec(), expected: "[history, n]".into() });
        }
        let n = a.amax_history.shape()[1];
        check::dtype_is(OP, "scale", &a.scale, DType::F32)?;
        check::shape_is(OP, "scale", &a.scale, &[n])?;
        check::dtype_is(OP, "scale_inv", &a.scale_inv, DType::F32)?;
        check::shape_is(OP, "scale_inv", &a.scale_inv, &[n])?;
        check::positive(OP, "fp8_max", a.fp8_max)?;
        if !a.margin.is_finite() {
            return Err(Error::invalid(OP, "margin", format!("must be finite, got {}", a.margin)));
        }
        Ok(())
    }
}

pub(super) fn descriptors() -> Vec<&'static OpDescriptor> {
    vec![
        Quantize::descriptor(),
        BgradQuantize::descriptor(),
        Dequantize::descriptor(),
        ComputeAmax::descriptor(),
        Fp8Transpose::descriptor(),
        FusedAmaxAndScaleUpdate::descriptor(),
    ]
}
