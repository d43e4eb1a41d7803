//! `generic_gemm`: D = alpha·op(A)·op(B) (+ C) with fused epilogues.
//!
//! Row-major form. TransformerEngine's `generic_gemm(A, transA, B, transB, D, ...)` is
//! column-major; a column-major product is the row-major product of the transposes, so TE's
//! call `(A, transA, B, transB)` is this op's `(a = B, transa = transB, b = A, transb = transA)`.
//! TE's Linear forward calls `(weight, true, input, false)`: here `a = input [m, k]`,
//! `transa = false`, `b = weight [n, k]`, `transb = true`, giving `input · weightᵀ`.

use super::check;
use crate::op::{Op, OpDescriptor, OutputSpec};
use crate::{DType, Error, Tensor, declare_op};

/// The epilogue fused after the product P = alpha·op(A)·op(B) (+ C when accumulating).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GemmEpilogue {
    /// D = P.
    #[default]
    None,
    /// D = P + bias[n].
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
        /// A: `[m, k]`, or `[k, m]` when `transa` (f32, f16 or bf16).
        tensor a: Tensor,
        /// B: `[k, n]`, or `[n, k]` when `transb` (same dtype as `a`).
        tensor b: Tensor,
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
        /// The dtype of D (f32, f16 or bf16).
        scalar out_dtype: DType,
    }
    /// Outputs of [`GenericGemm`].
    pub struct GemmOut {
        /// D `[m, n]`.
        tensor d: Tensor,
        /// The pre-activation `[m, n]` (dtype of D) for the `Gelu` epilogues.
        tensor aux_out: Option<Tensor>,
        /// Σ_m D `[n]` (f32) for the bias-gradient epilogues.
        tensor bias_grad: Option<Tensor>,
    }
    validate(a) {
        const OP: &str = "generic_gemm";
        let (m, k, n) = gemm_dims(a)?;
        if !a.alpha.is_finite() {
            return Err(Error::invalid(OP, "alpha", format!("must be finite, got {}", a.alpha)));
        }
        check::out_float(OP, "out_dtype", a.out_dtype)?;
        let _ = k;
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
        let widest = a.out_dtype.size_in_bytes().max(DType::F32.size_in_bytes());
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
            v.push(OutputSpec::new("aux_out", [m, n], a.out_dtype));
        }
        if a.epilogue.writes_bias_grad() {
            v.push(OutputSpec::new("bias_grad", [n], DType::F32));
        }
        v
    }
}

/// (m, k, n) of a valid GEMM, or the error naming the argument at fault.
pub fn gemm_dims(a: &GemmArgs) -> crate::Result<(usize, usize, usize)> {
    const OP: &str = "generic_gemm";
    check::float(OP, "a", &a.a)?;
    check::dtype_is(OP, "b", &a.b, a.a.dtype())?;
    for (name, t) in [("a", &a.a), ("b", &a.b)] {
        if t.rank() != 2 {
            return Err(Error::Shape { op: OP, arg: name, got: t.shape().to_vec(), expected: "rank 2".into() });
        }
    }
    let (m, k) = if a.transa { (a.a.shape()[1], a.a.shape()[0]) } else { (a.a.shape()[0], a.a.shape()[1]) };
    let (kb, n) = if a.transb { (a.b.shape()[1], a.b.shape()[0]) } else { (a.b.shape()[0], a.b.shape()[1]) };
    if kb != k {
        return Err(Error::Shape {
            op: OP,
            arg: "b",
            got: a.b.shape().to_vec(),
            expected: format!("inner dimension {k} (op(A) is [{m}, {k}], transb = {})", a.transb),
        });
    }
    Ok((m, k, n))
}

pub(super) fn descriptors() -> Vec<&'static OpDescriptor> {
    vec![GenericGemm::descriptor()]
}
