//! The op catalogue: every op tefl dispatches, declared once (names are TransformerEngine's;
//! formulas in `shared/OPS.md`). Backends register impls against these types, `tefl-ops`
//! wraps them in typed entry points, and the conformance suite, the coverage table and
//! `TE_FL_PER_OP` validation all read this list.

use crate::op::{Op, OpDescriptor};
use crate::{DType, Error, Result, Tensor, declare_op};

/// Argument checks shared by the op declarations. Each returns an error naming the argument.
pub mod check {
    use super::*;

    /// `t` has a float dtype (f32, f16 or bf16).
    pub fn float(op: &'static str, arg: &'static str, t: &Tensor) -> Result<()> {
        dtype_in(op, arg, t, &DType::FLOATS)
    }

    /// `t`'s dtype is one of `allowed`.
    pub fn dtype_in(op: &'static str, arg: &'static str, t: &Tensor, allowed: &[DType]) -> Result<()> {
        if allowed.contains(&t.dtype()) {
            return Ok(());
        }
        let names: Vec<_> = allowed.iter().map(|d| d.name()).collect();
        Err(Error::DType { op, arg, got: t.dtype(), expected: format!("one of {}", names.join(", ")) })
    }

    /// `t` has exactly the dtype `want`.
    pub fn dtype_is(op: &'static str, arg: &'static str, t: &Tensor, want: DType) -> Result<()> {
        if t.dtype() == want {
            return Ok(());
        }
        Err(Error::DType { op, arg, got: t.dtype(), expected: want.to_string() })
    }

    /// `t`'s shape equals `want`.
    pub fn shape_is(op: &'static str, arg: &'static str, t: &Tensor, want: &[usize]) -> Result<()> {
        if t.shape() == want {
            return Ok(());
        }
        Err(Error::Shape { op, arg, got: t.shape().to_vec(), expected: format!("{want:?}") })
    }

    /// `t` has at least `rank` dimensions and no zero-sized one.
    pub fn rank_at_least(op: &'static str, arg: &'static str, t: &Tensor, rank: usize) -> Result<()> {
        if t.rank() < rank || t.shape().contains(&0) {
            return Err(Error::Shape {
                op,
                arg,
                got: t.shape().to_vec(),
                expected: format!("at least {rank} non-empty dimension(s)"),
            });
        }
        Ok(())
    }

    /// `v` is finite and strictly positive.
    pub fn positive(op: &'static str, arg: &'static str, v: f32) -> Result<()> {
        if v.is_finite() && v > 0.0 {
            return Ok(());
        }
        Err(Error::invalid(op, arg, format!("must be finite and > 0, got {v}")))
    }
}

declare_op! {
    /// `rmsnorm_fwd(x[.., N], gamma[N], eps, zero_centered_gamma, out_dtype) -> (y, rsigma[rows] f32)`:
    /// rsigma = 1/sqrt(mean(x²) + eps); g = zero_centered_gamma ? 1 + gamma : gamma; y = x·rsigma·g.
    pub struct RmsNormFwd = "rmsnorm_fwd";
    /// Arguments of [`RmsNormFwd`].
    pub struct RmsNormFwdArgs {
        /// Input, `[.., N]`, f32/f16/bf16.
        tensor x: Tensor,
        /// Scale, `[N]`, f32/f16/bf16.
        tensor gamma: Tensor,
        /// Added to the mean square; finite and > 0.
        scalar eps: f32,
        /// When set, the scale is `1 + gamma`.
        scalar zero_centered_gamma: bool,
        /// The dtype of `y` (f32, f16 or bf16).
        scalar out_dtype: DType,
    }
    /// Outputs of [`RmsNormFwd`].
    pub struct RmsNormFwdOut {
        /// Normalised output, shape of `x`, dtype `out_dtype`.
        tensor y: Tensor,
        /// 1/sqrt(mean(x²) + eps) per row, f32, `[rows]`.
        tensor rsigma: Tensor,
    }
    validate(a) {
        const OP: &str = "rmsnorm_fwd";
        check::rank_at_least(OP, "x", &a.x, 1)?;
        check::float(OP, "x", &a.x)?;
        check::float(OP, "gamma", &a.gamma)?;
        check::shape_is(OP, "gamma", &a.gamma, &[a.x.last_dim()])?;
        check::positive(OP, "eps", a.eps)?;
        if !DType::FLOATS.contains(&a.out_dtype) {
            return Err(Error::invalid(OP, "out_dtype", format!("{} is not f32, f16 or bf16", a.out_dtype)));
        }
        Ok(())
    }
}

declare_op! {
    /// `rmsnorm_bwd(dy, x, rsigma, gamma, zero_centered_gamma) -> (dx, dgamma)`:
    /// x̂ = x·rsigma; d = dy·g; dx = rsigma·(d − x̂·mean(d·x̂)); dgamma = Σ_rows dy·x̂.
    pub struct RmsNormBwd = "rmsnorm_bwd";
    /// Arguments of [`RmsNormBwd`].
    pub struct RmsNormBwdArgs {
        /// Gradient of `y`, shape of `x`.
        tensor dy: Tensor,
        /// The forward input, `[.., N]`.
        tensor x: Tensor,
        /// The forward's `rsigma`, f32 `[rows]`.
        tensor rsigma: Tensor,
        /// The forward's scale, `[N]`.
        tensor gamma: Tensor,
        /// As in the forward.
        scalar zero_centered_gamma: bool,
    }
    /// Outputs of [`RmsNormBwd`].
    pub struct RmsNormBwdOut {
        /// Gradient of `x` (dtype of `x`).
        tensor dx: Tensor,
        /// Gradient of `gamma` (dtype of `gamma`).
        tensor dgamma: Tensor,
    }
    validate(a) {
        const OP: &str = "rmsnorm_bwd";
        check::rank_at_least(OP, "x", &a.x, 1)?;
        check::float(OP, "x", &a.x)?;
        check::float(OP, "dy", &a.dy)?;
        check::shape_is(OP, "dy", &a.dy, a.x.shape())?;
        check::dtype_is(OP, "rsigma", &a.rsigma, DType::F32)?;
        check::shape_is(OP, "rsigma", &a.rsigma, &[a.x.rows()])?;
        check::float(OP, "gamma", &a.gamma)?;
        check::shape_is(OP, "gamma", &a.gamma, &[a.x.last_dim()])?;
        Ok(())
    }
}

/// Every op in the catalogue.
pub fn all() -> &'static [&'static OpDescriptor] {
    static ALL: std::sync::OnceLock<Vec<&'static OpDescriptor>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| vec![RmsNormFwd::descriptor(), RmsNormBwd::descriptor()])
}

/// The catalogue entry named `name`.
pub fn find(name: &str) -> Option<&'static OpDescriptor> {
    all().iter().copied().find(|d| d.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpArgs;

    fn t(shape: &[usize], dtype: DType) -> Tensor {
        let n: usize = shape.iter().product();
        if dtype.is_float() {
            Tensor::from_slice(&vec![1.0f32; n], shape, dtype).unwrap()
        } else {
            Tensor::zeros(shape, dtype, &crate::Device::CPU).unwrap()
        }
    }

    #[test]
    fn names_are_unique_and_findable() {
        let mut names: Vec<_> = all().iter().map(|d| d.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all().len());
        assert!(find("rmsnorm_fwd").is_some());
        assert!(find("rmsnorm_fwdx").is_none());
    }

    #[test]
    fn validation_names_the_argument() {
        let args = RmsNormFwdArgs {
            x: t(&[3, 8], DType::BF16),
            gamma: t(&[7], DType::BF16),
            eps: 1e-5,
            zero_centered_gamma: false,
            out_dtype: DType::BF16,
        };
        match RmsNormFwd::validate(&args) {
            Err(Error::Shape { arg: "gamma", .. }) => {}
            other => panic!("{other:?}"),
        }
        let args = RmsNormFwdArgs { gamma: t(&[8], DType::BF16), eps: 0.0, ..args };
        assert!(matches!(RmsNormFwd::validate(&args), Err(Error::InvalidArgument { arg: "eps", .. })));
        let args = RmsNormFwdArgs { eps: 1e-5, x: t(&[3, 8], DType::I32), ..args };
        assert!(matches!(RmsNormFwd::validate(&args), Err(Error::DType { arg: "x", .. })));
    }

    #[test]
    fn summary_packs_dtypes_in_order() {
        let args = RmsNormBwdArgs {
            dy: t(&[2, 4], DType::BF16),
            x: t(&[2, 4], DType::F16),
            rsigma: t(&[2], DType::F32),
            gamma: t(&[4], DType::F32),
            zero_centered_gamma: false,
        };
        let s = args.summary("rmsnorm_bwd").unwrap();
        assert_eq!(s.primary, DType::BF16);
        assert_eq!(s.signature, 0x1123);
        assert!(s.device.is_cpu());
    }

    #[test]
    fn host_staging_round_trip_keeps_values() {
        let args = RmsNormBwdArgs {
            dy: t(&[2, 4], DType::BF16),
            x: t(&[2, 4], DType::F16),
            rsigma: t(&[2], DType::F32),
            gamma: t(&[4], DType::F32),
            zero_centered_gamma: true,
        };
        let h = args.to_host().unwrap();
        assert!(h.zero_centered_gamma);
        assert_eq!(h.x.to_vec::<f32>().unwrap(), vec![1.0; 8]);
        args.write_back(&h).unwrap();
    }
}
