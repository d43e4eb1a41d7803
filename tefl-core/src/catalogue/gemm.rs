//! `generic_gemm`: D = alpha·op(A)·op(B) (+ C) with fused epilogues.
//!
//! Row-major form. TransformerEngine's `generic_gemm(A, transA, B, transB, D, ...)` is
//! column-major; a column-major product is the row-major product of the transposes, so TE's
//! call `(A, transA, B, transB)` is this op's `(a = B, transa = transB, b = A, transb = transA)`.
//! TE's Linear forward calls `(weight, true, input, false)`: here `a = input [m, k]`,
//! `transa = false`, `b = weight [n, k]`, `transb = true`, giving `input · weightᵀ`.
//!
//! ## FP8
//!
//! A and B may hold FP8 codes (e4m3 or e5m2, the two may differ: TE multiplies e5m2 gradients
//! by e4m3 weights), each with its per-tensor `scale_inv` (f32 `[1]` on the device): the product
//! is `alpha · (a_scale_inv·A) · (b_scale_inv·B)`, accumulated in f32. D may be a float dtype or
//! FP8: then `d_scale` scales D before the saturating cast and `d_amax` returns max |D| (after
//! the epilogue, before scaling), as TE's output quantizer does. `split_accumulator` is TE's
//! `use_split_accumulator` (TE asks for it in dgrad and wgrad): when unset, a backend may
//! accumulate with its fast FP8 path (on Hopper, the tensor cores' reduced-precision
//! accumulation).
//!
//! Hopper's FP8 tensor cores take only the "TN" form, which in this row-major view is
//! `transa = false`, `transb = true` (`a [m, k]`, `b [n, k]`, both K-major: TE's Linear
//! forward). TE feeds the other GEMMs (dgrad, wgrad) the FP8 transposed copy it keeps of each
//! operand (`quantize(.., want_transpose = true)` makes both with one scale_inv) so that every
//! FP8 GEMM is TN; callers of tefl should do the same. A backend given another form transposes
//! the codes itself first (the same codes, the same scale_inv: exact, but an extra pass).

use super::check;
use crate::op::{Op, OpDescriptor, OutputSpec};
use crate::{DType, Error, Tensor, declare_op};

/// The epilogue fused after the product P = alpha·op(A)·op(B) (+ C when accumulating).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GemmEpilogue {
    /// D = P.
    #[default]
    None,
    /// D = P + bias\[n\].
    Bias,
    /// D = gelu(P); `aux_out` = P (the pre-activation the backward needs).
    Gelu,
    /// D = gelu(P + bias); `aux_out` = P + bias.
    BiasGelu,
    /// Grad mode: D = P ⊙ gelu'(aux), with `aux` the forward's pre-activation.
    DGelu,
    /// Grad mode: as `DGelu`, and `bias_grad[n]` = Σ_m D[m, n].
    DGeluBiasGrad,
    /// Grad mode: D = P and `bias_grad[n]` = Σ_m D[m, n].
    BiasGrad,
}

impl GemmEpilogue {
    /// Whether the epilogue reads `bias`.
    pub fn needs_bias(self) -> bool {
        matches!(self, GemmEpilogue::Bias | GemmEpilogue::BiasGelu)
    }
    /// Whether the epilogue reads `aux`.
    pub fn needs_aux(self) -> bool {
        matches!(self, GemmEpilogue::DGelu | GemmEpilogue::DGeluBiasGrad)
    }
    /// Whether the epilogue writes `aux_out`.
    pub fn writes_aux(self) -> bool {
        matches!(self, GemmEpilogue::Gelu | GemmEpilogue::BiasGelu)
    }
    /// Whether the epilogue writes `bias_grad`.
    pub fn writes_bias_grad(self) -> bool {
        matches!(self, GemmEpilogue::DGeluBiasGrad | GemmEpilogue::BiasGrad)
    }
}

declare_op! {
    /// `generic_gemm`: D[m, n] = epilogue(alpha·op(A)[m, k]·op(B)[k, n] (+ C)); see the module docs
    /// for how TE's column-major arguments map onto this row-major form.
    pub struct GenericGemm = "generic_gemm";
    /// Arguments of [`GenericGemm`].
    pub struct GemmArgs {
        /// A: `[m, k]`, or `[k, m]` when `transa` (f32, f16, bf16, or FP8 codes).
        tensor a: Tensor,
        /// B: `[k, n]`, or `[n, k]` when `transb` (the dtype of `a`; FP8 of either format when
        /// `a` is FP8).
        tensor b: Tensor,
        /// f32 `[1]`: the dequantization scale of FP8 `a` (required then, refused otherwise).
        tensor a_scale_inv: Option<Tensor>,
        /// f32 `[1]`: the dequantization scale of FP8 `b`.
        tensor b_scale_inv: Option<Tensor>,
        /// f32 `[1]`: the scale of an FP8 D (required when `out_dtype` is FP8).
        tensor d_scale: Option<Tensor>,
        /// Bias `[n]`, for the `Bias` and `BiasGelu` epilogues.
        tensor bias: Option<Tensor>,
        /// The forward's pre-activation `[m, n]`, for the `DGelu` epilogues.
        tensor aux: Option<Tensor>,
        /// C `[m, n]`, added to the product when `accumulate` (TE's beta = 1).
        tensor c: Option<Tensor>,
        /// Use Aᵀ.
        scalar transa: bool,
        /// Use Bᵀ.
        scalar transb: bool,
        /// Scales the product.
        scalar alpha: f32,
        /// Add `c` to the product.
        scalar accumulate: bool,
        /// The fused epilogue.
        scalar epilogue: GemmEpilogue,
        /// The dtype of D (f32, f16, bf16; f8e4m3 or f8e5m2 with FP8 inputs).
        scalar out_dtype: DType,
        /// FP8 inputs: accumulate in full f32 precision (TE's `use_split_accumulator`); when
        /// unset the backend may use its fast FP8 accumulation. Ignored for float inputs.
        scalar split_accumulator: bool,
    }
    /// Outputs of [`GenericGemm`].
    pub struct GemmOut {
        /// D `[m, n]`.
        tensor d: Tensor,
        /// The pre-activation `[m, n]` for the `Gelu` epilogues (dtype of D; bf16 when D is
        /// FP8).
        tensor aux_out: Option<Tensor>,
        /// Σ_m D `[n]` (f32) for the bias-gradient epilogues.
        tensor bias_grad: Option<Tensor>,
        /// f32 `[1]`: max |D| before the scaling, when D is FP8.
        tensor d_amax: Option<Tensor>,
    }
    validate(a) {
        const OP: &str = "generic_gemm";
        let (m, k, n) = gemm_dims(a)?;
        if !a.alpha.is_finite() {
            return Err(Error::invalid(OP, "alpha", format!("must be finite, got {}", a.alpha)));
        }
        let _ = k;
        let fp8_in = a.a.dtype().is_fp8();
        if a.out_dtype.is_fp8() && !fp8_in {
            return Err(Error::invalid(OP, "out_dtype", format!("{} output needs FP8 inputs", a.out_dtype)));
        }
        if !a.out_dtype.is_fp8() {
            check::out_float(OP, "out_dtype", a.out_dtype)?;
        }
        for (name, scale, wanted) in [
            ("a_scale_inv", &a.a_scale_inv, fp8_in),
            ("b_scale_inv", &a.b_scale_inv, fp8_in),
            ("d_scale", &a.d_scale, a.out_dtype.is_fp8()),
        ] {
            match (scale, wanted) {
                (Some(s), true) => check::scalar_f32(OP, name, s)?,
                (None, true) => return Err(Error::invalid(OP, name, "FP8 operands need their scale")),
                (Some(_), false) => return Err(Error::invalid(OP, name, "only FP8 operands take a scale")),
                (None, false) => {}
            }
        }
        match (&a.bias, a.epilogue.needs_bias()) {
            (Some(b), true) => {
                check::float(OP, "bias", b)?;
                check::shape_is(OP, "bias", b, &[n])?;
            }
            (None, true) => return Err(Error::invalid(OP, "bias", format!("{:?} needs a bias", a.epilogue))),
            (Some(_), false) => return Err(Error::invalid(OP, "bias", format!("{:?} takes no bias", a.epilogue))),
            (None, false) => {}
        }
        match (&a.aux, a.epilogue.needs_aux()) {
            (Some(x), true) => {
                check::float(OP, "aux", x)?;
                check::shape_is(OP, "aux", x, &[m, n])?;
            }
            (None, true) => return Err(Error::invalid(OP, "aux", format!("{:?} needs aux", a.epilogue))),
            (Some(_), false) => return Err(Error::invalid(OP, "aux", format!("{:?} takes no aux", a.epilogue))),
            (None, false) => {}
        }
        match (&a.c, a.accumulate) {
            (Some(c), true) => {
                check::float(OP, "c", c)?;
                check::shape_is(OP, "c", c, &[m, n])?;
            }
            (None, true) => return Err(Error::invalid(OP, "c", "accumulate needs c")),
            (Some(_), false) => return Err(Error::invalid(OP, "c", "c is only read when accumulate is set")),
            (None, false) => {}
        }
        // D (and aux_out) hold m·n elements: a size no allocation can have is rejected here,
        // naming the operand that brings n (k = 0 makes tiny inputs with a huge product).
        let widest = DType::F32.size_in_bytes();
        if m.checked_mul(n).and_then(|e| e.checked_mul(widest)).is_none_or(|b| b > isize::MAX as usize) {
            return Err(Error::Shape {
                op: OP,
                arg: "b",
                got: a.b.shape().to_vec(),
                expected: format!("a product [{m}, n] that fits in memory (m·n·{widest} bytes overflows)"),
            });
        }
        Ok(())
    }
    outputs(a) {
        let Ok((m, _, n)) = gemm_dims(a) else { return Vec::new() };
        let mut v = vec![OutputSpec::new("d", [m, n], a.out_dtype)];
        if a.epilogue.writes_aux() {
            v.push(OutputSpec::new("aux_out", [m, n], aux_dtype(a.out_dtype)));
        }
        if a.epilogue.writes_bias_grad() {
            v.push(OutputSpec::new("bias_grad", [n], DType::F32));
        }
        if a.out_dtype.is_fp8() {
            v.push(OutputSpec::new("d_amax", [1], DType::F32));
        }
        v
    }
}

/// The dtype of the `Gelu` epilogues' pre-activation for a D of `out`: D's own, bf16 for FP8.
pub fn aux_dtype(out: DType) -> DType {
    if out.is_fp8() { DType::BF16 } else { out }
}

/// (m, k, n) of a valid GEMM, or the error naming the argument at fault.
pub fn gemm_dims(a: &GemmArgs) -> crate::Result<(usize, usize, usize)> {
    matmul_dims("generic_gemm", (&a.a, a.transa), (&a.b, a.transb))
}

/// (m, k, n) of op(A)·op(B) for two rank-2 operands (both float of one dtype, or both FP8),
/// or the error naming the one at fault (`a`, `b`).
pub fn matmul_dims(
    op: &'static str,
    (a, transa): (&Tensor, bool),
    (b, transb): (&Tensor, bool),
) -> crate::Result<(usize, usize, usize)> {
    if a.dtype().is_fp8() {
        check::dtype_in(op, "b", b, &[DType::F8E4M3, DType::F8E5M2])?;
    } else {
        check::float(op, "a", a)?;
        check::dtype_is(op, "b", b, a.dtype())?;
    }
    for (name, t) in [("a", a), ("b", b)] {
        if t.rank() != 2 {
            return Err(Error::Shape { op, arg: name, got: t.shape().to_vec(), expected: "rank 2".into() });
        }
    }
    let (m, k) = if transa { (a.shape()[1], a.shape()[0]) } else { (a.shape()[0], a.shape()[1]) };
    let (kb, n) = if transb { (b.shape()[1], b.shape()[0]) } else { (b.shape()[0], b.shape()[1]) };
    if kb != k {
        return Err(Error::Shape {
            op,
            arg: "b",
            got: b.shape().to_vec(),
            expected: format!("inner dimension {k} (op(A) is [{m}, {k}], transb = {transb})"),
        });
    }
    Ok((m, k, n))
}

declare_op! {
    /// `te_general_grouped_gemm`: independent GEMMs in one call, D_g = op(A_g)·op(B_g) (+ bias_g)
    /// for every group g: a mixture-of-experts layer's expert GEMMs, whose m (tokens routed to
    /// each expert) differ while k and n are usually shared (they may differ too). Row-major,
    /// with `generic_gemm`'s conventions (its module docs: TE's column-major order, FP8 and the
    /// TN form); a group with m = 0 (an expert no token chose) gives an empty D_g.
    pub struct GroupedGemm = "te_general_grouped_gemm";
    /// Arguments of [`GroupedGemm`].
    pub struct GroupedGemmArgs {
        /// A_g: `[m_g, k_g]`, or `[k_g, m_g]` when `transa` (f32, f16, bf16 or FP8; one dtype for
        /// every group).
        tensor a: Vec<Tensor>,
        /// B_g: `[k_g, n_g]`, or `[n_g, k_g]` when `transb` (one per group).
        tensor b: Vec<Tensor>,
        /// FP8 A: one f32 `[1]` scale_inv per group (empty otherwise).
        tensor a_scale_inv: Vec<Tensor>,
        /// FP8 B: one f32 `[1]` scale_inv per group (empty otherwise).
        tensor b_scale_inv: Vec<Tensor>,
        /// Empty, or one bias `[n_g]` per group (float).
        tensor bias: Vec<Tensor>,
        /// Use A_gᵀ.
        scalar transa: bool,
        /// Use B_gᵀ.
        scalar transb: bool,
        /// The dtype of every D_g (f32, f16 or bf16).
        scalar out_dtype: DType,
        /// FP8 inputs: full-precision accumulation (see [`GemmArgs::split_accumulator`]).
        scalar split_accumulator: bool,
    }
    /// Outputs of [`GroupedGemm`].
    pub struct GroupedGemmOut {
        /// D_g `[m_g, n_g]`, one per group.
        tensor d: Vec<Tensor>,
    }
    validate(a) {
        grouped_dims(a).map(|_| ())
    }
    outputs(a) {
        let Ok(dims) = grouped_dims(a) else { return Vec::new() };
        dims.iter().map(|&(m, _, n)| OutputSpec::new("d", [m, n], a.out_dtype)).collect()
    }
}

impl GemmArgs {
    /// D = op(A)·op(B) with nothing else: no transposes, alpha 1, no epilogue, no C, no
    /// scales, D in A's dtype (bf16 for FP8 A). Set the rest with struct update syntax.
    pub fn new(a: Tensor, b: Tensor) -> Self {
        let out_dtype = if a.dtype().is_fp8() { DType::BF16 } else { a.dtype() };
        GemmArgs {
            a,
            b,
            a_scale_inv: None,
            b_scale_inv: None,
            d_scale: None,
            bias: None,
            aux: None,
            c: None,
            transa: false,
            transb: false,
            alpha: 1.0,
            accumulate: false,
            epilogue: GemmEpilogue::None,
            out_dtype,
            split_accumulator: false,
        }
    }

    /// FP8 A's and B's `scale_inv`, or the error naming the one missing (validation requires
    /// both for FP8 inputs; a kernel reading them asks here rather than assuming it).
    pub fn fp8_scales(&self) -> crate::Result<(&Tensor, &Tensor)> {
        let missing = |name| Error::invalid("generic_gemm", name, "FP8 operands need their scale");
        let sa = self.a_scale_inv.as_ref().ok_or_else(|| missing("a_scale_inv"))?;
        let sb = self.b_scale_inv.as_ref().ok_or_else(|| missing("b_scale_inv"))?;
        Ok((sa, sb))
    }

    /// An FP8 D's `d_scale`, or the error naming it when missing.
    pub fn fp8_d_scale(&self) -> crate::Result<&Tensor> {
        self.d_scale.as_ref().ok_or_else(|| Error::invalid("generic_gemm", "d_scale", "an FP8 D needs its scale"))
    }
}

impl GroupedGemmArgs {
    /// Group `g` as the `generic_gemm` it is (its bias epilogue when it has a bias): what every
    /// backend that runs the groups one by one calls, and what the oracle checks.
    pub fn group(&self, g: usize) -> GemmArgs {
        let bias = self.bias.get(g).cloned();
        GemmArgs {
            a_scale_inv: self.a_scale_inv.get(g).cloned(),
            b_scale_inv: self.b_scale_inv.get(g).cloned(),
            epilogue: if bias.is_some() { GemmEpilogue::Bias } else { GemmEpilogue::None },
            bias,
            transa: self.transa,
            transb: self.transb,
            out_dtype: self.out_dtype,
            split_accumulator: self.split_accumulator,
            ..GemmArgs::new(self.a[g].clone(), self.b[g].clone())
        }
    }

    /// The groups validated, then `gemm` run on each [`GroupedGemmArgs::group`] in order: the
    /// grouped GEMM of a backend that runs the groups one by one.
    pub fn each_group(
        &self,
        mut gemm: impl FnMut(&GemmArgs) -> crate::Result<GemmOut>,
    ) -> crate::Result<GroupedGemmOut> {
        let groups = grouped_dims(self)?.len();
        let d = (0..groups).map(|g| gemm(&self.group(g)).map(|out| out.d)).collect::<crate::Result<Vec<_>>>()?;
        Ok(GroupedGemmOut { d })
    }
}

/// (m, k, n) of every group of a valid grouped GEMM, or the error naming the argument at fault
/// (a list, with the group's index in the message).
pub fn grouped_dims(a: &GroupedGemmArgs) -> crate::Result<Vec<(usize, usize, usize)>> {
    const OP: &str = "te_general_grouped_gemm";
    check::nonempty(OP, "a", a.a.len())?;
    check::same_len(OP, "b", a.b.len(), a.a.len())?;
    check::out_float(OP, "out_dtype", a.out_dtype)?;
    let first = a.a[0].dtype();
    let fp8 = first.is_fp8();
    let mut dims = Vec::with_capacity(a.a.len());
    for (g, (x, y)) in a.a.iter().zip(&a.b).enumerate() {
        if x.dtype() != first && !(fp8 && x.dtype().is_fp8()) {
            return Err(Error::DType {
                op: OP,
                arg: "a",
                got: x.dtype(),
                expected: format!("{first} in every group (group {g})"),
            });
        }
        let d = matmul_dims(OP, (x, a.transa), (y, a.transb)).map_err(|e| match e {
            Error::Shape { op, arg, got, expected } => {
                Error::Shape { op, arg, got, expected: format!("{expected} in group {g}") }
            }
            other => other,
        })?;
        dims.push(d);
    }
    for (name, list) in [("a_scale_inv", &a.a_scale_inv), ("b_scale_inv", &a.b_scale_inv)] {
        if fp8 {
            check::same_len(OP, name, list.len(), a.a.len())?;
            for s in list.iter() {
                check::scalar_f32(OP, name, s)?;
            }
        } else if !list.is_empty() {
            return Err(Error::invalid(OP, name, "only FP8 operands take a scale"));
        }
    }
    if !a.bias.is_empty() {
        check::same_len(OP, "bias", a.bias.len(), a.a.len())?;
        for (b, &(_, _, n)) in a.bias.iter().zip(&dims) {
            check::float(OP, "bias", b)?;
            check::shape_is(OP, "bias", b, &[n])?;
        }
    }
    for &(m, _, n) in &dims {
        if m.checked_mul(n).and_then(|e| e.checked_mul(4)).is_none_or(|b| b > isize::MAX as usize) {
            return Err(Error::invalid(OP, "b", format!("a product [{m}, {n}] too large for memory")));
        }
    }
    Ok(dims)
}

pub(super) fn descriptors() -> Vec<&'static OpDescriptor> {
    vec![GenericGemm::descriptor(), GroupedGemm::descriptor()]
}
