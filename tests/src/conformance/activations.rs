//! The activations: plain, gated, clamped SwiGLU, their backwards and the dbias forms.

use tefl_core::catalogue::*;

use super::{FLOATS, Size, Suite, cmp};
use crate::oracle;

/// Calls a forward activation on the impl under test.
type Fwd = fn(&Suite<'_>, ActArgs) -> tefl_core::Result<ActOut>;
/// Calls a backward activation on the impl under test.
type Bwd = fn(&Suite<'_>, DActArgs) -> tefl_core::Result<DActOut>;
/// An activation pair as the suite runs it: forward name, backward name, the formula, the calls.
pub(super) type ActPair = (&'static str, &'static str, Activation, Fwd, Bwd);

/// The plain activations (shared with the NaN cases).
pub(super) const PLAIN: [ActPair; 5] = [
    ("gelu", "dgelu", Activation::Gelu, |s, a| s.call::<Gelu>(&a), |s, a| s.call::<DGelu>(&a)),
    ("qgelu", "dqgelu", Activation::Qgelu, |s, a| s.call::<Qgelu>(&a), |s, a| s.call::<DQgelu>(&a)),
    ("relu", "drelu", Activation::Relu, |s, a| s.call::<Relu>(&a), |s, a| s.call::<DRelu>(&a)),
    ("srelu", "dsrelu", Activation::Srelu, |s, a| s.call::<Srelu>(&a), |s, a| s.call::<DSrelu>(&a)),
    ("silu", "dsilu", Activation::Silu, |s, a| s.call::<Silu>(&a), |s, a| s.call::<DSilu>(&a)),
];

/// The gated activations, act(a)·b (shared with the NaN cases).
pub(super) const GATED: [ActPair; 5] = [
    ("geglu", "dgeglu", Activation::Gelu, |s, a| s.call::<Geglu>(&a), |s, a| s.call::<DGeglu>(&a)),
    ("qgeglu", "dqgeglu", Activation::Qgelu, |s, a| s.call::<Qgeglu>(&a), |s, a| s.call::<DQgeglu>(&a)),
    ("reglu", "dreglu", Activation::Relu, |s, a| s.call::<Reglu>(&a), |s, a| s.call::<DReglu>(&a)),
    ("sreglu", "dsreglu", Activation::Srelu, |s, a| s.call::<Sreglu>(&a), |s, a| s.call::<DSreglu>(&a)),
    ("swiglu", "dswiglu", Activation::Silu, |s, a| s.call::<Swiglu>(&a), |s, a| s.call::<DSwiglu>(&a)),
];

impl Suite<'_> {
    pub(super) fn activations(&mut self) {
        type DB = fn(&Suite, DActArgs) -> tefl_core::Result<DBiasOut>;
        let dbias: [(&'static str, Activation, DB); 5] = [
            ("dbias_dgelu", Activation::Gelu, |s, a| s.call::<DBiasDGelu>(&a)),
            ("dbias_dqgelu", Activation::Qgelu, |s, a| s.call::<DBiasDQgelu>(&a)),
            ("dbias_drelu", Activation::Relu, |s, a| s.call::<DBiasDRelu>(&a)),
            ("dbias_dsrelu", Activation::Srelu, |s, a| s.call::<DBiasDSrelu>(&a)),
            ("dbias_dsilu", Activation::Silu, |s, a| s.call::<DBiasDSilu>(&a)),
        ];
        // (0, 1000): no rows (dbias is zeros).
        let mut shapes = vec![(1, 1000), (5, 4097), (2, 16384), (0, 1000)];
        if self.size == Size::Full {
            shapes.push((64, 16384));
        }
        for dtype in FLOATS {
            for &(rows, n) in &shapes {
                let case = format!("{rows}x{n}");
                for (fname, bname, kind, f, b) in PLAIN {
                    self.case(fname, dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -4.0, 4.0)?;
                        let o = f(s, ActArgs { x })?;
                        Ok(vec![cmp("y", &o.y, xv.iter().map(|v| oracle::act(kind, *v)).collect(), dtype)?])
                    });
                    self.case(bname, dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -4.0, 4.0)?;
                        let (g, gv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                        let o = b(s, DActArgs { grad: g, input: x })?;
                        let want = xv.iter().zip(&gv).map(|(v, g)| g * oracle::dact(kind, *v)).collect();
                        Ok(vec![cmp("grad_input", &o.grad_input, want, dtype)?])
                    });
                }
                for (fname, bname, kind, f, b) in GATED {
                    self.case(fname, dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&[rows, 2 * n], dtype, -4.0, 4.0)?;
                        let o = f(s, ActArgs { x })?;
                        Ok(vec![cmp("y", &o.y, oracle::gated(kind, &xv, n), dtype)?])
                    });
                    self.case(bname, dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&[rows, 2 * n], dtype, -4.0, 4.0)?;
                        let (g, gv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                        let o = b(s, DActArgs { grad: g, input: x })?;
                        let mut want = vec![0.0; xv.len()];
                        for r in 0..rows {
                            for j in 0..n {
                                let (a, bb, gg) = (xv[r * 2 * n + j], xv[r * 2 * n + n + j], gv[r * n + j]);
                                want[r * 2 * n + j] = gg * bb * oracle::dact(kind, a);
                                want[r * 2 * n + n + j] = gg * oracle::act(kind, a);
                            }
                        }
                        Ok(vec![cmp("grad_input", &o.grad_input, want, dtype)?])
                    });
                }
                for (name, kind, f) in dbias {
                    self.case(name, dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -3.0, 3.0)?;
                        let (g, gv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                        let o = f(s, DActArgs { grad: g, input: x })?;
                        let gi: Vec<f64> = xv.iter().zip(&gv).map(|(v, g)| g * oracle::dact(kind, *v)).collect();
                        let db = (0..n).map(|j| (0..rows).map(|r| gi[r * n + j]).sum()).collect();
                        Ok(vec![cmp("grad_input", &o.grad_input, gi, dtype)?, cmp("dbias", &o.dbias, db, dtype)?])
                    });
                }
                self.case("clamped_swiglu", dtype, case.clone(), |s| {
                    let (x, xv) = s.rand(&[rows, 2 * n], dtype, -9.0, 9.0)?;
                    let o = s.call::<ClampedSwiglu>(&ClampedSwigluArgs { x, limit: 7.0, alpha: 1.702 })?;
                    Ok(vec![cmp("y", &o.y, oracle::clamped_swiglu(&xv, n, 7.0, 1.702), dtype)?])
                });
                self.case("clamped_dswiglu", dtype, case, |s| {
                    let (x, xv) = s.rand(&[rows, 2 * n], dtype, -9.0, 9.0)?;
                    let (g, gv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                    let o =
                        s.call::<ClampedDSwiglu>(&ClampedDSwigluArgs { grad: g, input: x, limit: 7.0, alpha: 1.702 })?;
                    let want = oracle::clamped_dswiglu(&xv, &gv, n, 7.0, f64::from(1.702f32));
                    Ok(vec![cmp("grad_input", &o.grad_input, want, dtype)?])
                });
            }
        }
    }
}
