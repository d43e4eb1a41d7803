//! The conformance suite: one set of cases for every backend. For a given impl id it calls
//! each op that impl registers directly (bypassing the policy), on the impl's device, with
//! fresh random inputs, and compares every output with the f64 [`crate::oracle`] at the
//! tolerance of its dtype. In-place outputs are poisoned (NaN) before each run, and NaN
//! never passes.
#![allow(clippy::needless_range_loop)] // index loops mirror the formulas

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tefl_core::catalogue::*;
use tefl_core::fp8::Fp8Format;
use tefl_core::{DType, Device, Error, Manager, Op, Tensor};

use crate::{Rng, oracle, rel_err, tolerance};

mod nan;

/// How one case ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Every output within tolerance.
    Pass,
    /// An output out of tolerance, or an error.
    Fail(String),
    /// Not run, with the reason.
    Skip(String),
}

/// One case's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The op.
    pub op: &'static str,
    /// The dtype the case ran with.
    pub dtype: DType,
    /// What the case was.
    pub case: String,
    /// How it ended.
    pub status: Status,
    /// Largest absolute error over its outputs.
    pub max_abs: f64,
    /// Largest relative error (‖out − ref‖/‖ref‖) over its outputs.
    pub rel: f64,
}

/// One output to compare.
struct Cmp {
    name: &'static str,
    got: Vec<f64>,
    want: Vec<f64>,
    dtype: DType,
    /// Lower bound on ‖want‖ in the relative error (for outputs that can be near 0 by
    /// cancellation, such as a log-sum-exp).
    floor: f64,
    /// NaN expected where `want` has it (NaN-propagation cases): those positions must be NaN,
    /// the others are compared as usual, and `want` must hold at least one NaN.
    nan: bool,
}

fn cmp(name: &'static str, got: &Tensor, want: Vec<f64>, dtype: DType) -> tefl_core::Result<Cmp> {
    Ok(Cmp { name, got: got.to_vec::<f64>()?, want, dtype, floor: 0.0, nan: false })
}

/// For a NaN-propagation comparison: checks that `got` is NaN exactly where `want` is (and
/// that `want` has a NaN at all), and returns the comparison of the remaining positions.
fn nan_positions(c: &Cmp) -> Result<Cmp, String> {
    let expected = c.want.iter().filter(|w| w.is_nan()).count();
    if expected == 0 {
        return Err(format!("{}: the oracle has no NaN, so this NaN case tests nothing", c.name));
    }
    if let Some(i) = c.want.iter().zip(&c.got).position(|(w, g)| w.is_nan() && !g.is_nan()) {
        return Err(format!("{}: element {i} is {} where NaN must propagate", c.name, c.got[i]));
    }
    let (got, want): (Vec<f64>, Vec<f64>) =
        c.got.iter().zip(&c.want).filter(|(_, w)| !w.is_nan()).map(|(g, w)| (*g, *w)).unzip();
    Ok(Cmp { name: c.name, got, want, dtype: c.dtype, floor: c.floor, nan: false })
}

/// How big the cases are: `Full` adds hidden 16384 and long sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// The everyday set.
    Quick,
    /// Every case.
    Full,
}

/// A suite run against one impl.
pub struct Suite<'m> {
    mgr: &'m Manager,
    impl_id: String,
    /// The device the impl runs on.
    pub device: Device,
    rng: Rng,
    size: Size,
    ops: BTreeMap<&'static str, Vec<DType>>,
    /// Results so far.
    pub outcomes: Vec<Outcome>,
}

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

impl<'m> Suite<'m> {
    /// A suite for `impl_id` as registered in `mgr`, with inputs drawn from `seed`.
    pub fn new(mgr: &'m Manager, impl_id: &str, seed: u64, size: Size) -> Result<Self, String> {
        let (ops, mut kinds) = mgr.with_registry(|r| {
            let mut ops = BTreeMap::new();
            let mut kinds = Vec::new();
            for i in r.all_impls().filter(|i| i.impl_id() == impl_id) {
                ops.insert(i.op(), i.supported_dtypes().to_vec());
                kinds.push(i.device_kind());
            }
            (ops, kinds)
        });
        kinds.dedup();
        let kind = match kinds.as_slice() {
            [] => tefl_core::DeviceKind::CPU,
            [k] => *k,
            many => return Err(format!("impl '{impl_id}' spans several device kinds: {many:?}")),
        };
        tefl_core::device::set_poison_allocations(true);
        Ok(Suite {
            mgr,
            impl_id: impl_id.into(),
            device: Device::new(kind, 0),
            rng: Rng::new(seed),
            size,
            ops,
            outcomes: Vec::new(),
        })
    }

    /// Why a case of `op` with `dtype` does not run, if it doesn't.
    fn skip_reason(&self, op: &str, dtype: DType) -> Option<String> {
        match self.ops.get(op) {
            None => Some("not registered by this backend".into()),
            Some(d) if !d.is_empty() && !d.contains(&dtype) => Some(format!("{dtype} not supported")),
            Some(_) => None,
        }
    }

    /// A device tensor holding `values` (rounded to `dtype`).
    fn put(&self, values: &[f64], shape: &[usize], dtype: DType) -> tefl_core::Result<Tensor> {
        let f: Vec<f32> = values.iter().map(|v| *v as f32).collect();
        Tensor::from_slice(&f, shape, dtype)?.to_device(&self.device)
    }

    fn put_i32(&self, v: &[i32]) -> tefl_core::Result<Tensor> {
        Tensor::from_slice(v, [v.len()], DType::I32)?.to_device(&self.device)
    }

    /// A random device tensor and the exact values it holds.
    fn rand(&mut self, shape: &[usize], dtype: DType, lo: f64, hi: f64) -> tefl_core::Result<(Tensor, Vec<f64>)> {
        let n: usize = shape.iter().product();
        let v = self.rng.vec(n, lo, hi);
        let t = self.put(&v, shape, dtype)?;
        let exact = t.to_vec::<f64>()?;
        Ok((t, exact))
    }

    /// A device tensor of NaN (for outputs written in place).
    fn poisoned(&self, shape: &[usize], dtype: DType) -> tefl_core::Result<Tensor> {
        let n: usize = shape.iter().product();
        self.put(&vec![f64::NAN; n], shape, dtype)
    }

    /// Calls the impl under test; its outputs must also follow the op's output contract
    /// (which holds the contract itself to every backend's real outputs).
    fn call<O: Op>(&self, args: &O::Args) -> tefl_core::Result<O::Output> {
        let out = self.mgr.call_impl::<O>(&self.impl_id, args)?;
        tefl_core::op::check_outputs::<O>(args, &out, self.device)
            .map_err(|reason| Error::invalid(O::NAME, "output contract", reason))?;
        Ok(out)
    }

    /// Runs one case: skipped when the impl lacks the op or dtype, else compared.
    fn case(
        &mut self,
        op: &'static str,
        dtype: DType,
        case: String,
        f: impl FnOnce(&mut Self) -> tefl_core::Result<Vec<Cmp>>,
    ) {
        if let Some(reason) = self.skip_reason(op, dtype) {
            self.outcomes.push(Outcome { op, dtype, case, status: Status::Skip(reason), max_abs: 0.0, rel: 0.0 });
            return;
        }
        let (status, max_abs, rel) = match f(self) {
            Err(e) => (Status::Fail(format!("error: {e}")), f64::NAN, f64::NAN),
            Ok(cmps) => {
                let mut worst = (0.0f64, 0.0f64);
                let mut fail = None;
                for c in &cmps {
                    if c.got.len() != c.want.len() {
                        fail.get_or_insert(format!("{}: {} values, expected {}", c.name, c.got.len(), c.want.len()));
                        continue;
                    }
                    let filtered;
                    let c = if c.nan {
                        match nan_positions(c) {
                            Ok(rest) => {
                                filtered = rest;
                                &filtered
                            }
                            Err(why) => {
                                fail.get_or_insert(why);
                                continue;
                            }
                        }
                    } else {
                        c
                    };
                    let r = rel_err(&c.got, &c.want);
                    let norm = c.want.iter().map(|w| w * w).sum::<f64>().sqrt();
                    let r = if norm > 0.0 && norm < c.floor { r * norm / c.floor } else { r };
                    let a = c
                        .got
                        .iter()
                        .zip(&c.want)
                        .map(|(g, w)| if g == w { 0.0 } else { (g - w).abs() })
                        .fold(0.0, f64::max);
                    let a = if c.got.iter().any(|v| v.is_nan()) { f64::INFINITY } else { a };
                    worst = (worst.0.max(a), worst.1.max(r));
                    let tol = tolerance(c.dtype);
                    if r.is_nan() || r > tol {
                        fail.get_or_insert(format!("{}: rel {r:.2e} > {tol:.0e} (max abs {a:.2e})", c.name));
                    }
                }
                (fail.map_or(Status::Pass, Status::Fail), worst.0, worst.1)
            }
        };
        self.outcomes.push(Outcome { op, dtype, case, status, max_abs, rel });
    }

    /// Runs every case.
    pub fn run_all(&mut self, progress: &mut dyn FnMut(&str)) {
        self.run_families(None, progress);
    }

    /// The op families, in the order [`Suite::run_all`] runs them.
    pub const FAMILIES: [&'static str; 11] = [
        "norms",
        "gemm",
        "activations",
        "softmax",
        "attention",
        "rope",
        "optimizers",
        "fp8",
        "dropout",
        "nan",
        "aliasing",
    ];

    /// Runs the families named in `only` (all when `None`).
    pub fn run_families(&mut self, only: Option<&[String]>, progress: &mut dyn FnMut(&str)) {
        type Family<'a> = (&'static str, fn(&mut Suite<'a>));
        let families: [Family<'m>; 11] = [
            ("norms", Self::norms),
            ("gemm", Self::gemm),
            ("activations", Self::activations),
            ("softmax", Self::softmax),
            ("attention", Self::attention),
            ("rope", Self::rope),
            ("optimizers", Self::optimizers),
            ("fp8", Self::fp8),
            ("dropout", Self::dropout),
            ("nan", Self::nan),
            ("aliasing", Self::aliasing),
        ];
        for (name, f) in families {
            if only.is_some_and(|o| !o.iter().any(|x| x == name)) {
                continue;
            }
            progress(name);
            f(self);
        }
    }

    // ---------------- norms ----------------

    fn norms(&mut self) {
        let mut shapes = vec![(1, 1000), (3, 4097), (17, 64), (2, 16384)];
        if self.size == Size::Full {
            shapes.push((33, 16384));
        }
        for dtype in FLOATS {
            for &(rows, n) in &shapes {
                for zc in [false, true] {
                    let out_dtype = if zc { DType::F32 } else { dtype };
                    let case = format!("{rows}x{n} zero_centered={zc}");
                    self.case("rmsnorm_fwd", dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -2.0, 2.0)?;
                        let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let o = s.call::<RmsNormFwd>(&RmsNormFwdArgs {
                            x,
                            gamma: g,
                            eps: 1e-5,
                            zero_centered_gamma: zc,
                            out_dtype,
                        })?;
                        let (y, rs) = oracle::rmsnorm_fwd(&xv, n, &gv, 1e-5, zc);
                        Ok(vec![cmp("y", &o.y, y, out_dtype)?, cmp("rsigma", &o.rsigma, rs, DType::F32)?])
                    });
                    for add in [false, true] {
                        let op = if add { "rmsnorm_bwd_add" } else { "rmsnorm_bwd" };
                        self.case(op, dtype, case.clone(), |s| {
                            let (x, xv) = s.rand(&[rows, n], dtype, -2.0, 2.0)?;
                            let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                            let (dy, dyv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                            let (_, rs) = oracle::rmsnorm_fwd(&xv, n, &gv, 1e-5, zc);
                            let rs_t = s.put(&rs, &[rows], DType::F32)?;
                            let rsv = rs_t.to_vec::<f64>()?;
                            let (mut dx, dg) = oracle::rmsnorm_bwd(&dyv, &xv, &rsv, n, &gv, zc);
                            let o = if add {
                                let (a, av) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                                dx.iter_mut().zip(&av).for_each(|(d, a)| *d += a);
                                let r = s.call::<RmsNormBwdAdd>(&RmsNormBwdAddArgs {
                                    dy,
                                    x,
                                    rsigma: rs_t,
                                    gamma: g,
                                    add: a,
                                    zero_centered_gamma: zc,
                                })?;
                                (r.dx, r.dgamma)
                            } else {
                                let r = s.call::<RmsNormBwd>(&RmsNormBwdArgs {
                                    dy,
                                    x,
                                    rsigma: rs_t,
                                    gamma: g,
                                    zero_centered_gamma: zc,
                                })?;
                                (r.dx, r.dgamma)
                            };
                            Ok(vec![cmp("dx", &o.0, dx, dtype)?, cmp("dgamma", &o.1, dg, dtype)?])
                        });
                    }
                    self.case("layernorm_fwd", dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -3.0, 3.0)?;
                        let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let (b, bv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let o = s.call::<LayerNormFwd>(&LayerNormFwdArgs {
                            x,
                            gamma: g,
                            beta: b,
                            eps: 1e-5,
                            zero_centered_gamma: zc,
                            out_dtype,
                        })?;
                        let (y, mu, rs) = oracle::layernorm_fwd(&xv, n, &gv, &bv, 1e-5, zc);
                        Ok(vec![
                            cmp("y", &o.y, y, out_dtype)?,
                            // A row mean can cancel to nearly 0; measure it against the size a
                            // mean of n values in [-3, 3] typically has (1.7 / sqrt(n)).
                            Cmp { floor: (rows as f64 / n as f64).sqrt(), ..cmp("mu", &o.mu, mu, DType::F32)? },
                            cmp("rsigma", &o.rsigma, rs, DType::F32)?,
                        ])
                    });
                    self.case("layernorm_bwd", dtype, case, |s| {
                        let (x, xv) = s.rand(&[rows, n], dtype, -3.0, 3.0)?;
                        let (g, gv) = s.rand(&[n], dtype, -1.0, 1.0)?;
                        let (dy, dyv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                        let (_, mu, rs) = oracle::layernorm_fwd(&xv, n, &gv, &vec![0.0; n], 1e-5, zc);
                        let (mu_t, rs_t) = (s.put(&mu, &[rows], DType::F32)?, s.put(&rs, &[rows], DType::F32)?);
                        let (muv, rsv) = (mu_t.to_vec::<f64>()?, rs_t.to_vec::<f64>()?);
                        let o = s.call::<LayerNormBwd>(&LayerNormBwdArgs {
                            dy,
                            x,
                            mu: mu_t,
                            rsigma: rs_t,
                            gamma: g,
                            zero_centered_gamma: zc,
                        })?;
                        let (dx, dg, db) = oracle::layernorm_bwd(&dyv, &xv, &muv, &rsv, n, &gv, zc);
                        Ok(vec![
                            cmp("dx", &o.dx, dx, dtype)?,
                            cmp("dgamma", &o.dgamma, dg, dtype)?,
                            cmp("dbeta", &o.dbeta, db, dtype)?,
                        ])
                    });
                }
            }
        }
    }

    // ---------------- gemm ----------------

    #[allow(clippy::too_many_arguments)]
    fn gemm_case(
        &mut self,
        dtype: DType,
        (m, k, n): (usize, usize, usize),
        ta: bool,
        tb: bool,
        ep: GemmEpilogue,
        acc: bool,
    ) {
        let case = format!("{m}x{k}x{n} transa={ta} transb={tb} {ep:?} accumulate={acc}");
        self.case("generic_gemm", dtype, case, |s| {
            let (a, av) = s.rand(&if ta { [k, m] } else { [m, k] }, dtype, -1.0, 1.0)?;
            let (b, bv) = s.rand(&if tb { [n, k] } else { [k, n] }, dtype, -1.0, 1.0)?;
            let bias = if ep.needs_bias() { Some(s.rand(&[n], dtype, -1.0, 1.0)?) } else { None };
            let aux = if ep.needs_aux() { Some(s.rand(&[m, n], dtype, -2.0, 2.0)?) } else { None };
            let c = if acc { Some(s.rand(&[m, n], DType::F32, -1.0, 1.0)?) } else { None };
            let args = GemmArgs {
                a,
                b,
                bias: bias.as_ref().map(|x| x.0.clone()),
                aux: aux.as_ref().map(|x| x.0.clone()),
                c: c.as_ref().map(|x| x.0.clone()),
                transa: ta,
                transb: tb,
                alpha: 0.75,
                accumulate: acc,
                epilogue: ep,
                out_dtype: dtype,
            };
            let o = s.call::<GenericGemm>(&args)?;
            let (d, aux_out, bias_grad) = oracle::gemm(
                &av,
                &bv,
                (m, k, n),
                ta,
                tb,
                0.75,
                c.as_ref().map(|x| x.1.as_slice()),
                bias.as_ref().map(|x| x.1.as_slice()),
                aux.as_ref().map(|x| x.1.as_slice()),
                ep,
            );
            let mut out = vec![cmp("d", &o.d, d, dtype)?];
            match (aux_out, &o.aux_out) {
                (Some(w), Some(g)) => out.push(cmp("aux_out", g, w, dtype)?),
                (None, None) => {}
                _ => return Err(Error::Tensor("aux_out present where it should not be, or missing".into())),
            }
            match (bias_grad, &o.bias_grad) {
                (Some(w), Some(g)) => out.push(cmp("bias_grad", g, w, dtype)?),
                (None, None) => {}
                _ => return Err(Error::Tensor("bias_grad present where it should not be, or missing".into())),
            }
            Ok(out)
        });
    }

    fn gemm(&mut self) {
        let eps = [
            GemmEpilogue::None,
            GemmEpilogue::Bias,
            GemmEpilogue::Gelu,
            GemmEpilogue::BiasGelu,
            GemmEpilogue::DGelu,
            GemmEpilogue::DGeluBiasGrad,
            GemmEpilogue::BiasGrad,
        ];
        for dtype in FLOATS {
            for (i, &ep) in eps.iter().enumerate() {
                for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                    self.gemm_case(dtype, (17 + i, 33, 9 + 2 * i), ta, tb, ep, i % 2 == 1);
                }
            }
            self.gemm_case(dtype, (1, 1000, 257), false, true, GemmEpilogue::Bias, false);
            self.gemm_case(dtype, (65, 129, 1), true, false, GemmEpilogue::None, true);
            self.gemm_case(dtype, (96, 4097, 40), false, false, GemmEpilogue::None, false);
        }
    }

    // ---------------- activations ----------------

    fn activations(&mut self) {
        type Fwd = fn(&Suite, ActArgs) -> tefl_core::Result<ActOut>;
        type Bwd = fn(&Suite, DActArgs) -> tefl_core::Result<DActOut>;
        let plain: [(&'static str, &'static str, Activation, Fwd, Bwd); 5] = [
            ("gelu", "dgelu", Activation::Gelu, |s, a| s.call::<Gelu>(&a), |s, a| s.call::<DGelu>(&a)),
            ("qgelu", "dqgelu", Activation::Qgelu, |s, a| s.call::<Qgelu>(&a), |s, a| s.call::<DQgelu>(&a)),
            ("relu", "drelu", Activation::Relu, |s, a| s.call::<Relu>(&a), |s, a| s.call::<DRelu>(&a)),
            ("srelu", "dsrelu", Activation::Srelu, |s, a| s.call::<Srelu>(&a), |s, a| s.call::<DSrelu>(&a)),
            ("silu", "dsilu", Activation::Silu, |s, a| s.call::<Silu>(&a), |s, a| s.call::<DSilu>(&a)),
        ];
        let gated: [(&'static str, &'static str, Activation, Fwd, Bwd); 5] = [
            ("geglu", "dgeglu", Activation::Gelu, |s, a| s.call::<Geglu>(&a), |s, a| s.call::<DGeglu>(&a)),
            ("qgeglu", "dqgeglu", Activation::Qgelu, |s, a| s.call::<Qgeglu>(&a), |s, a| s.call::<DQgeglu>(&a)),
            ("reglu", "dreglu", Activation::Relu, |s, a| s.call::<Reglu>(&a), |s, a| s.call::<DReglu>(&a)),
            ("sreglu", "dsreglu", Activation::Srelu, |s, a| s.call::<Sreglu>(&a), |s, a| s.call::<DSreglu>(&a)),
            ("swiglu", "dswiglu", Activation::Silu, |s, a| s.call::<Swiglu>(&a), |s, a| s.call::<DSwiglu>(&a)),
        ];
        type DB = fn(&Suite, DActArgs) -> tefl_core::Result<DBiasOut>;
        let dbias: [(&'static str, Activation, DB); 5] = [
            ("dbias_dgelu", Activation::Gelu, |s, a| s.call::<DBiasDGelu>(&a)),
            ("dbias_dqgelu", Activation::Qgelu, |s, a| s.call::<DBiasDQgelu>(&a)),
            ("dbias_drelu", Activation::Relu, |s, a| s.call::<DBiasDRelu>(&a)),
            ("dbias_dsrelu", Activation::Srelu, |s, a| s.call::<DBiasDSrelu>(&a)),
            ("dbias_dsilu", Activation::Silu, |s, a| s.call::<DBiasDSilu>(&a)),
        ];
        let mut shapes = vec![(1, 1000), (5, 4097), (2, 16384)];
        if self.size == Size::Full {
            shapes.push((64, 16384));
        }
        for dtype in FLOATS {
            for &(rows, n) in &shapes {
                let case = format!("{rows}x{n}");
                for (fname, bname, kind, f, b) in plain {
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
                for (fname, bname, kind, f, b) in gated {
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

    // ---------------- softmax ----------------

    fn softmax(&mut self) {
        type Fwd = fn(&Suite, SoftmaxArgs) -> tefl_core::Result<SoftmaxOut>;
        let fwds: [(&'static str, Fwd, u8); 3] = [
            ("scaled_softmax_forward", |s, a| s.call::<ScaledSoftmaxForward>(&a), 0),
            (
                "scaled_upper_triang_masked_softmax_forward",
                |s, a| s.call::<ScaledUpperTriangMaskedSoftmaxForward>(&a),
                1,
            ),
            (
                "scaled_aligned_causal_masked_softmax_forward",
                |s, a| s.call::<ScaledAlignedCausalMaskedSoftmaxForward>(&a),
                2,
            ),
        ];
        type Bwd = fn(&Suite, SoftmaxBwdArgs) -> tefl_core::Result<SoftmaxBwdOut>;
        let bwds: [(&'static str, Bwd); 4] = [
            ("scaled_softmax_backward", |s, a| s.call::<ScaledSoftmaxBackward>(&a)),
            ("scaled_masked_softmax_backward", |s, a| s.call::<ScaledMaskedSoftmaxBackward>(&a)),
            ("scaled_upper_triang_masked_softmax_backward", |s, a| {
                s.call::<ScaledUpperTriangMaskedSoftmaxBackward>(&a)
            }),
            ("scaled_aligned_causal_masked_softmax_backward", |s, a| {
                s.call::<ScaledAlignedCausalMaskedSoftmaxBackward>(&a)
            }),
        ];
        let mut shapes = vec![(2, 3, 5, 7), (1, 2, 9, 9), (1, 1, 3, 1000), (2, 2, 17, 4097), (1, 1, 2, 16384)];
        if self.size == Size::Full {
            shapes.push((1, 2, 64, 16384));
        }
        for dtype in FLOATS {
            for &(b, h, sq, sk) in &shapes {
                let shape = [b, h, sq, sk];
                let case = format!("{shape:?}");
                for (name, f, kind) in fwds {
                    if kind == 1 && sq > sk {
                        continue;
                    }
                    self.case(name, dtype, case.clone(), |s| {
                        let (x, xv) = s.rand(&shape, dtype, -5.0, 5.0)?;
                        let o = f(s, SoftmaxArgs { x, scale: 0.7 })?;
                        let sc = f64::from(0.7f32);
                        let want = match kind {
                            0 => oracle::softmax(&xv, sq, sk, sc, |_, _, _| false),
                            1 => oracle::softmax(&xv, sq, sk, sc, |_, i, j| j > i),
                            _ => {
                                oracle::softmax(&xv, sq, sk, sc, |_, i, j| j as i64 > i as i64 + sk as i64 - sq as i64)
                            }
                        };
                        Ok(vec![cmp("y", &o.y, want, dtype)?])
                    });
                }
                for mb in [1, b] {
                    self.case("scaled_masked_softmax_forward", dtype, format!("{case} mask batch {mb}"), |s| {
                        let (x, xv) = s.rand(&shape, dtype, -5.0, 5.0)?;
                        let mv: Vec<u8> = (0..mb * sq * sk).map(|_| u8::from(s.rng.uniform(0.0, 1.0) < 0.3)).collect();
                        let mask = Tensor::from_slice(&mv, [mb, 1, sq, sk], DType::U8)?.to_device(&s.device)?;
                        let o = s.call::<ScaledMaskedSoftmaxForward>(&MaskedSoftmaxArgs { x, mask, scale: 0.7 })?;
                        let want = oracle::softmax(&xv, sq, sk, f64::from(0.7f32), |r, i, j| {
                            let bb = if mb == 1 { 0 } else { r / (h * sq) };
                            mv[(bb * sq + i) * sk + j] != 0
                        });
                        Ok(vec![cmp("y", &o.y, want, dtype)?])
                    });
                }
                for (name, f) in bwds {
                    self.case(name, dtype, case.clone(), |s| {
                        let n = b * h * sq * sk;
                        let raw = s.rng.vec(n, -5.0, 5.0);
                        let yv = oracle::softmax(&raw, sq, sk, 1.0, |_, _, _| false);
                        let y = s.put(&yv, &shape, dtype)?;
                        let yv = y.to_vec::<f64>()?;
                        let (dy, dyv) = s.rand(&shape, dtype, -1.0, 1.0)?;
                        let o = f(s, SoftmaxBwdArgs { dy, y, scale: 0.7 })?;
                        let sc = f64::from(0.7f32);
                        let mut want = vec![0.0; n];
                        for r in 0..n / sk {
                            let dt: f64 = (0..sk).map(|j| yv[r * sk + j] * dyv[r * sk + j]).sum();
                            for j in 0..sk {
                                want[r * sk + j] = sc * yv[r * sk + j] * (dyv[r * sk + j] - dt);
                            }
                        }
                        Ok(vec![cmp("dx", &o.dx, want, dtype)?])
                    });
                }
            }
        }
    }

    // ---------------- attention ----------------

    fn attention(&mut self) {
        let none = AttnWindow::default();
        let base = |layout, mask| AttnCase {
            layout,
            mask,
            b: 2,
            sq: 37,
            sk: 45,
            hq: 4,
            hk: 2,
            d: 64,
            cu_q: None,
            cu_k: None,
            window: none,
            p: 0.0,
        };
        let mut cases = Vec::new();
        for layout in [QkvLayout::Bshd, QkvLayout::Sbhd] {
            for mask in [AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight] {
                cases.push(base(layout, mask));
            }
            for mask in [AttnMask::Padding, AttnMask::PaddingCausal] {
                cases.push(AttnCase { cu_q: Some(vec![0, 30, 67]), cu_k: Some(vec![0, 45, 57]), ..base(layout, mask) });
            }
        }
        for mask in
            [AttnMask::None, AttnMask::Causal, AttnMask::CausalBottomRight, AttnMask::Padding, AttnMask::PaddingCausal]
        {
            cases.push(AttnCase {
                cu_q: Some(vec![0, 5, 17, 18, 40]),
                cu_k: Some(vec![0, 7, 19, 19, 70]),
                b: 4,
                ..base(QkvLayout::Thd, mask)
            });
        }
        cases.push(AttnCase { hq: 3, hk: 1, d: 128, ..base(QkvLayout::Bshd, AttnMask::Causal) });
        cases.push(AttnCase {
            window: AttnWindow { left: Some(5), right: Some(0) },
            ..base(QkvLayout::Bshd, AttnMask::Causal)
        });
        cases.push(AttnCase {
            window: AttnWindow { left: Some(3), right: Some(2) },
            ..base(QkvLayout::Sbhd, AttnMask::None)
        });
        // Windows wider than any sequence mean unbounded, whatever the integer (issue 12).
        cases.push(AttnCase {
            window: AttnWindow { left: Some(usize::MAX), right: None },
            ..base(QkvLayout::Bshd, AttnMask::Causal)
        });
        cases.push(AttnCase {
            window: AttnWindow { left: Some(i64::MAX as usize), right: Some(i64::MAX as usize) },
            ..base(QkvLayout::Sbhd, AttnMask::None)
        });
        cases.push(AttnCase {
            window: AttnWindow { left: Some(7), right: Some(usize::MAX - 1) },
            ..base(QkvLayout::Bshd, AttnMask::CausalBottomRight)
        });
        cases.push(AttnCase { p: 0.2, ..base(QkvLayout::Bshd, AttnMask::Causal) });
        cases.push(AttnCase {
            p: 0.1,
            cu_q: Some(vec![0, 3, 20]),
            cu_k: Some(vec![0, 8, 30]),
            ..base(QkvLayout::Thd, AttnMask::None)
        });
        cases.push(AttnCase { b: 1, sq: 1, sk: 1, hq: 1, hk: 1, d: 8, ..base(QkvLayout::Bshd, AttnMask::None) });
        // Head dims off the fast paths: 256 (the largest, tiles cut to fit), 96 (not a power of
        // two) and 33 (odd: scalar loads and stores).
        cases.push(AttnCase { b: 1, sq: 70, sk: 70, hq: 2, hk: 1, d: 256, ..base(QkvLayout::Bshd, AttnMask::Causal) });
        cases.push(AttnCase {
            d: 96,
            cu_q: Some(vec![0, 9, 50]),
            cu_k: Some(vec![0, 20, 41]),
            ..base(QkvLayout::Thd, AttnMask::None)
        });
        cases.push(AttnCase { d: 33, ..base(QkvLayout::Sbhd, AttnMask::CausalBottomRight) });
        let long = if self.size == Size::Full { 1024 } else { 300 };
        cases.push(AttnCase {
            b: 1,
            sq: long,
            sk: long,
            hq: 2,
            hk: 1,
            d: 64,
            ..base(QkvLayout::Bshd, AttnMask::Causal)
        });
        for dtype in FLOATS {
            for c in &cases {
                self.attn_case(c, dtype);
            }
        }
    }

    fn attn_case(&mut self, c: &AttnCase, dtype: DType) {
        let case = format!(
            "{:?} {:?} b{} sq{} sk{} hq{} hk{} d{} window({:?},{:?}) p={}",
            c.layout, c.mask, c.b, c.sq, c.sk, c.hq, c.hk, c.d, c.window.left, c.window.right, c.p
        );
        let tq = c.cu_q.as_ref().and_then(|v| v.last()).map_or(c.b * c.sq, |t| *t as usize);
        let tk = c.cu_k.as_ref().and_then(|v| v.last()).map_or(c.b * c.sk, |t| *t as usize);
        let shape = |s: usize, h: usize, total: usize| match c.layout {
            QkvLayout::Bshd => vec![c.b, s, h, c.d],
            QkvLayout::Sbhd => vec![s, c.b, h, c.d],
            QkvLayout::Thd => vec![total, h, c.d],
        };
        let (qs, ks) = (shape(c.sq, c.hq, tq), shape(c.sk, c.hk, tk));
        let scale = 1.0 / (c.d as f32).sqrt();
        // Inputs drawn once and shared by the forward and backward cases.
        let inputs = (|| -> tefl_core::Result<_> {
            let q = self.rand(&qs, dtype, -1.0, 1.0)?;
            let k = self.rand(&ks, dtype, -1.0, 1.0)?;
            let v = self.rand(&ks, dtype, -1.0, 1.0)?;
            let d_o = self.rand(&qs, dtype, -1.0, 1.0)?;
            let cu_q = c.cu_q.as_deref().map(|x| self.put_i32(x)).transpose()?;
            let cu_k = c.cu_k.as_deref().map(|x| self.put_i32(x)).transpose()?;
            Ok((q, k, v, d_o, cu_q, cu_k))
        })();
        let ((q, qv), (k, kv), (v, vv), (d_o, dov), cu_q, cu_k) = match inputs {
            Ok(x) => x,
            Err(e) => {
                self.case("fused_attn_fwd", dtype, case, |_| Err(e));
                return;
            }
        };
        let fwd_args = AttnFwdArgs {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            cu_seqlens_q: cu_q.clone(),
            cu_seqlens_kv: cu_k.clone(),
            layout: c.layout,
            mask: c.mask,
            scale,
            dropout_p: c.p,
            seed: 1234,
            offset: 99,
            window: c.window,
        };
        let g = match attn_geometry("conformance", &q, &k, &v, cu_q.as_ref(), cu_k.as_ref(), c.layout, c.mask) {
            Ok(g) => g,
            Err(e) => {
                self.case("fused_attn_fwd", dtype, case, |_| Err(e));
                return;
            }
        };
        let prob = oracle::AttnProblem {
            g: &g,
            q: &qv,
            k: &kv,
            v: &vv,
            mask: c.mask,
            window: c.window,
            scale: f64::from(scale),
            p: f64::from(c.p),
            seed: 1234,
            offset: 99,
        };
        self.case("fused_attn_fwd", dtype, case.clone(), |s| {
            let o = s.call::<FusedAttnFwd>(&fwd_args)?;
            let want = prob.forward();
            let got_lse = o.softmax_lse.to_vec::<f64>()?;
            if got_lse.iter().zip(&want.lse).any(|(a, b)| a.is_finite() != b.is_finite()) {
                return Err(Error::Tensor("softmax_lse: -inf rows differ from the oracle's".into()));
            }
            let (lf, wf): (Vec<f64>, Vec<f64>) =
                got_lse.iter().zip(&want.lse).filter(|(a, _)| a.is_finite()).map(|(a, b)| (*a, *b)).unzip();
            Ok(vec![
                cmp("o", &o.o, want.o, dtype)?,
                Cmp {
                    floor: (lf.len() as f64).sqrt(),
                    name: "softmax_lse",
                    got: lf,
                    want: wf,
                    dtype: DType::F32,
                    nan: false,
                },
            ])
        });
        self.case("fused_attn_bwd", dtype, case, |s| {
            let p = &prob;
            let fw = p.forward();
            let o = s.put(&fw.o, &qs, dtype)?;
            let lse = s.put(&fw.lse, &g.lse_shape(), DType::F32)?;
            let args = fwd_args.backward(o, d_o.clone(), lse);
            let got = s.call::<FusedAttnBwd>(&args)?;
            let (dq, dk, dv) = p.backward(&dov);
            Ok(vec![cmp("dq", &got.dq, dq, dtype)?, cmp("dk", &got.dk, dk, dtype)?, cmp("dv", &got.dv, dv, dtype)?])
        });
    }

    // ---------------- rope ----------------

    fn rope(&mut self) {
        for dtype in FLOATS {
            for layout in [QkvLayout::Sbhd, QkvLayout::Bshd, QkvLayout::Thd] {
                for interleaved in [false, true] {
                    for backward in [false, true] {
                        let op = if backward { "fused_rope_backward" } else { "fused_rope_forward" };
                        self.case(op, dtype, format!("{layout:?} interleaved={interleaved} d_rot 32 of 64"), |s| {
                            let (b, sl, h, d, d_rot, s_max) = (3, 11, 2, 64, 32, 40);
                            let cu = [0, 4, 15, 22];
                            let xs = match layout {
                                QkvLayout::Sbhd => vec![sl, b, h, d],
                                QkvLayout::Bshd => vec![b, sl, h, d],
                                QkvLayout::Thd => vec![22, h, d],
                            };
                            let (x, xv) = s.rand(&xs, dtype, -1.0, 1.0)?;
                            let (freqs, fv) = s.rand(&[s_max, d_rot], DType::F32, -3.0, 3.0)?;
                            let starts = [0, 5, 17];
                            let args = RopeArgs {
                                x,
                                freqs,
                                cu_seqlens: (layout == QkvLayout::Thd).then(|| s.put_i32(&cu)).transpose()?,
                                start_positions: Some(s.put_i32(&starts)?),
                                layout,
                                interleaved,
                            };
                            let g = rope_geometry("conformance", &args)?;
                            let mut want = xv.clone();
                            for bi in 0..g.batch {
                                for p in 0..g.spans[bi].1 {
                                    let pos = starts[bi] as usize + p;
                                    let f = &fv[pos * d_rot..(pos + 1) * d_rot];
                                    for hh in 0..h {
                                        let at = (g.row(bi, p) * h + hh) * d;
                                        let seg = &xv[at..at + d_rot];
                                        let out = if backward {
                                            rope_transpose(seg, f, interleaved)
                                        } else {
                                            oracle::rope_vec(seg, f, interleaved)
                                        };
                                        want[at..at + d_rot].copy_from_slice(&out);
                                    }
                                }
                            }
                            let o = if backward {
                                s.call::<FusedRopeBackward>(&args)?.y
                            } else {
                                s.call::<FusedRopeForward>(&args)?.y
                            };
                            Ok(vec![cmp("y", &o, want, dtype)?])
                        });
                    }
                }
            }
        }
    }

    // ---------------- optimizers ----------------

    fn noop(&self) -> tefl_core::Result<Tensor> {
        self.put_i32(&[0])
    }

    fn optimizers(&mut self) {
        let shapes: [&[usize]; 3] = [&[7, 13], &[1000], &[3, 1, 4097]];
        for dtype in FLOATS {
            for mode in [AdamMode::L2, AdamMode::AdamW] {
                // A step past i32::MAX still has bias corrections of 1 (not an overflowed power).
                for (bc, step) in [(true, 3u32), (false, 3), (true, u32::MAX)] {
                    let case = format!("3 tensors {mode:?} bias_correction={bc} step={step}");
                    let hyper = AdamHyper {
                        lr: 1e-2,
                        beta1: 0.9,
                        beta2: 0.999,
                        eps: 1e-8,
                        step,
                        mode,
                        bias_correction: bc,
                        weight_decay: 0.01,
                    };
                    self.case("multi_tensor_adam", dtype, case, |s| {
                        let mut lists = (vec![], vec![], vec![], vec![]);
                        let mut want = (vec![], vec![], vec![]);
                        for sh in shapes {
                            let (g, gv) = s.rand(sh, dtype, -1.0, 1.0)?;
                            let (p, pv) = s.rand(sh, dtype, -1.0, 1.0)?;
                            let (m, mv) = s.rand(sh, DType::F32, -0.1, 0.1)?;
                            let (v, vv) = s.rand(sh, DType::F32, 0.0, 0.1)?;
                            let r: Vec<(f64, f64, f64)> =
                                (0..gv.len()).map(|j| oracle::adam_step(pv[j], gv[j], mv[j], vv[j], &hyper)).collect();
                            want.0.push(crate::round(&r.iter().map(|x| x.0).collect::<Vec<_>>(), dtype));
                            want.1.push(r.iter().map(|x| x.1).collect::<Vec<_>>());
                            want.2.push(r.iter().map(|x| x.2).collect::<Vec<_>>());
                            lists.0.push(g);
                            lists.1.push(p);
                            lists.2.push(m);
                            lists.3.push(v);
                        }
                        s.call::<MultiTensorAdam>(&MultiTensorAdamArgs {
                            noop_flag: s.noop()?,
                            grads: lists.0,
                            params: lists.1.clone(),
                            exp_avg: lists.2.clone(),
                            exp_avg_sq: lists.3.clone(),
                            hyper,
                        })?;
                        let mut out = Vec::new();
                        for i in 0..shapes.len() {
                            out.push(cmp("params", &lists.1[i], want.0[i].clone(), dtype)?);
                            out.push(cmp("exp_avg", &lists.2[i], want.1[i].clone(), DType::F32)?);
                            out.push(cmp("exp_avg_sq", &lists.3[i], want.2[i].clone(), DType::F32)?);
                        }
                        Ok(out)
                    });
                }
            }
            let hyper = AdamHyper { beta2: 0.99, ..AdamHyper::adamw(0.1) };
            self.case("multi_tensor_adam_master", dtype, "f32 masters, model copy".into(), |s| {
                let (g, gv) = s.rand(&[50], dtype, -1.0, 1.0)?;
                let (master, pv) = s.rand(&[50], DType::F32, -1.0, 1.0)?;
                let model = s.poisoned(&[50], dtype)?;
                let (m, v) = (s.put(&[0.0; 50], &[50], DType::F32)?, s.put(&[0.0; 50], &[50], DType::F32)?);
                s.call::<MultiTensorAdamMaster>(&MultiTensorAdamMasterArgs {
                    noop_flag: s.noop()?,
                    grads: vec![g],
                    model_params: vec![model.clone()],
                    master_params: vec![master.clone()],
                    exp_avg: vec![m],
                    exp_avg_sq: vec![v],
                    hyper,
                })?;
                let want: Vec<f64> = (0..50).map(|j| oracle::adam_step(pv[j], gv[j], 0.0, 0.0, &hyper).0).collect();
                Ok(vec![
                    cmp("master_params", &master, want.clone(), DType::F32)?,
                    cmp("model_params", &model, crate::round(&want, dtype), dtype)?,
                ])
            });
            for (momentum, nesterov, first_run, wd_after) in [
                (0.0f32, false, false, false),
                (0.9, false, true, false),
                (0.9, true, false, true),
                (0.5, false, false, true),
            ] {
                self.case(
                    "multi_tensor_sgd",
                    dtype,
                    format!("momentum={momentum} nesterov={nesterov} first_run={first_run} wd_after={wd_after}"),
                    |s| {
                        let (g, gv) = s.rand(&[4097], dtype, -1.0, 1.0)?;
                        let (p, pv) = s.rand(&[4097], dtype, -1.0, 1.0)?;
                        let (b, bv) = s.rand(&[4097], DType::F32, -0.5, 0.5)?;
                        s.call::<MultiTensorSgd>(&MultiTensorSgdArgs {
                            noop_flag: s.noop()?,
                            grads: vec![g],
                            params: vec![p.clone()],
                            momentum_buf: vec![b.clone()],
                            weight_decay: 0.01,
                            momentum,
                            dampening: 0.1,
                            lr: 0.05,
                            nesterov,
                            first_run,
                            wd_after_momentum: wd_after,
                            scale: 0.5,
                        })?;
                        let f = |x: f32| f64::from(x);
                        let (wd, damp, lr, sc, mom) = (f(0.01), f(0.1), f(0.05), 0.5, f(momentum));
                        let (mut wp, mut wb) = (vec![], vec![]);
                        for j in 0..gv.len() {
                            let mut gg = gv[j] * sc;
                            if !wd_after {
                                gg += wd * pv[j];
                            }
                            let mut buf = bv[j];
                            if mom != 0.0 {
                                buf = if first_run { gg } else { mom * buf + (1.0 - damp) * gg };
                                gg = if nesterov { gg + mom * buf } else { buf };
                            }
                            if wd_after {
                                gg += wd * pv[j];
                            }
                            wp.push(pv[j] - lr * gg);
                            wb.push(buf);
                        }
                        Ok(vec![
                            cmp("params", &p, crate::round(&wp, dtype), dtype)?,
                            cmp("momentum_buf", &b, wb, DType::F32)?,
                        ])
                    },
                );
            }
            self.case("multi_tensor_scale", dtype, "two tensors into a poisoned dst".into(), |s| {
                let (a, av) = s.rand(&[10, 10], dtype, -2.0, 2.0)?;
                let (b, bv) = s.rand(&[4097], DType::F32, -2.0, 2.0)?;
                let (da, db) = (s.poisoned(&[10, 10], dtype)?, s.poisoned(&[4097], DType::F16)?);
                let flag = s.noop()?;
                s.call::<MultiTensorScale>(&MultiTensorScaleArgs {
                    noop_flag: flag.clone(),
                    src: vec![a, b],
                    dst: vec![da.clone(), db.clone()],
                    scale: 3.0,
                })?;
                let flagv: Vec<f64> = flag.to_vec::<i32>()?.into_iter().map(f64::from).collect();
                Ok(vec![
                    cmp("dst[0]", &da, crate::round(&av.iter().map(|x| x * 3.0).collect::<Vec<_>>(), dtype), dtype)?,
                    cmp(
                        "dst[1]",
                        &db,
                        crate::round(&bv.iter().map(|x| x * 3.0).collect::<Vec<_>>(), DType::F16),
                        DType::F16,
                    )?,
                    Cmp { name: "noop_flag", got: flagv, want: vec![0.0], dtype: DType::F32, floor: 0.0, nan: false },
                ])
            });
            self.case("multi_tensor_scale", dtype, "inf sets noop_flag".into(), |s| {
                let src = s.put(&[1.0, f64::INFINITY, 2.0], &[3], dtype)?;
                let dst = s.poisoned(&[3], DType::F32)?;
                let flag = s.noop()?;
                s.call::<MultiTensorScale>(&MultiTensorScaleArgs {
                    noop_flag: flag.clone(),
                    src: vec![src],
                    dst: vec![dst],
                    scale: 1.0,
                })?;
                let flagv: Vec<f64> = flag.to_vec::<i32>()?.into_iter().map(f64::from).collect();
                Ok(vec![Cmp {
                    name: "noop_flag",
                    got: flagv,
                    want: vec![1.0],
                    dtype: DType::F32,
                    floor: 0.0,
                    nan: false,
                }])
            });
            for per_tensor in [false, true] {
                for unscale in [false, true] {
                    let op = if unscale { "multi_tensor_unscale_l2norm" } else { "multi_tensor_l2norm" };
                    self.case(op, dtype, format!("per_tensor={per_tensor}"), |s| {
                        let (a, av) = s.rand(&[10, 10], dtype, -2.0, 2.0)?;
                        let (b, bv) = s.rand(&[4097], dtype, -2.0, 2.0)?;
                        let f = if unscale { 0.25 } else { 1.0 };
                        let (na, nb) = (
                            av.iter().map(|x| (x * f).powi(2)).sum::<f64>(),
                            bv.iter().map(|x| (x * f).powi(2)).sum::<f64>(),
                        );
                        let (total, per) = if unscale {
                            let inv = s.put(&[0.25], &[1], DType::F32)?;
                            let o = s.call::<MultiTensorUnscaleL2Norm>(&MultiTensorUnscaleL2NormArgs {
                                noop_flag: s.noop()?,
                                tensors: vec![a, b],
                                inv_scale: inv,
                                per_tensor,
                            })?;
                            (o.total, o.per_tensor_norms)
                        } else {
                            let o = s.call::<MultiTensorL2Norm>(&MultiTensorL2NormArgs {
                                noop_flag: s.noop()?,
                                tensors: vec![a, b],
                                per_tensor,
                            })?;
                            (o.total, o.per_tensor_norms)
                        };
                        let mut out = vec![cmp("total", &total, vec![(na + nb).sqrt()], DType::F32)?];
                        match (per, per_tensor) {
                            (Some(p), true) => {
                                out.push(cmp("per_tensor_norms", &p, vec![na.sqrt(), nb.sqrt()], DType::F32)?)
                            }
                            (None, false) => {}
                            _ => {
                                return Err(Error::Tensor(
                                    "per_tensor_norms present where it should not be, or missing".into(),
                                ));
                            }
                        }
                        Ok(out)
                    });
                }
            }
        }
        self.case("multi_tensor_compute_scale_and_scale_inv", DType::F32, "pow2, epsilon, inf amax".into(), |s| {
            let amax = s.put(&[2.0, 0.0, f64::INFINITY, 1000.0], &[4], DType::F32)?;
            let scale = s.put(&[1.0, 5.0, 7.0, 1.0], &[4], DType::F32)?;
            let scale_inv = s.poisoned(&[4], DType::F32)?;
            s.call::<MultiTensorComputeScaleAndScaleInv>(&ComputeScaleArgs {
                noop_flag: s.noop()?,
                amax: vec![amax],
                scale: vec![scale.clone()],
                scale_inv: vec![scale_inv.clone()],
                fp8_max: 448.0,
                force_pow_2: true,
                epsilon: 1e-3,
            })?;
            let want = vec![128.0, 262144.0, 7.0, 0.25];
            let inv = want.iter().map(|v| 1.0 / v).collect();
            Ok(vec![cmp("scale", &scale, want, DType::F32)?, cmp("scale_inv", &scale_inv, inv, DType::F32)?])
        });
    }

    // ---------------- fp8 ----------------

    fn fp8(&mut self) {
        for fp8 in [DType::F8E4M3, DType::F8E5M2] {
            let f = Fp8Format::of(fp8).expect("fp8 dtype");
            let sc = if fp8 == DType::F8E4M3 { 100.0 } else { 1000.0 };
            for dtype in FLOATS {
                self.case("quantize", dtype, format!("13x1000 to {fp8} with transpose"), |s| {
                    let (x, xv) = s.rand(&[13, 1000], dtype, -3.0, 3.0)?;
                    let scale = s.put(&[sc], &[1], DType::F32)?;
                    let o = s.call::<Quantize>(&QuantizeArgs { x, scale, fp8_dtype: fp8, want_transpose: true })?;
                    let codes = o.q.to_vec::<u8>()?;
                    let want: Vec<u8> =
                        xv.iter().map(|v| oracle::fp8_nearest(f, f64::from(*v as f32 * sc as f32))).collect();
                    if let Some(i) = codes.iter().zip(&want).position(|(a, b)| a != b) {
                        return Err(Error::Tensor(format!("code {i}: {:#04x}, expected {:#04x}", codes[i], want[i])));
                    }
                    let qt = o.q_t.ok_or_else(|| Error::Tensor("q_t missing".into()))?.to_vec::<u8>()?;
                    if (0..13).any(|i| (0..1000).any(|j| qt[j * 13 + i] != codes[i * 1000 + j])) {
                        return Err(Error::Tensor("q_t is not the transpose of q".into()));
                    }
                    let amax = xv.iter().fold(0.0f64, |a, b| a.max(b.abs()));
                    Ok(vec![
                        cmp("amax", &o.amax, vec![amax], DType::F32)?,
                        cmp("scale_inv", &o.scale_inv, vec![1.0 / sc], DType::F32)?,
                    ])
                });
                self.case("compute_amax", dtype, "4097".into(), |s| {
                    let (x, xv) = s.rand(&[4097], dtype, -3.0, 3.0)?;
                    let o = s.call::<ComputeAmax>(&ComputeAmaxArgs { x })?;
                    Ok(vec![cmp("amax", &o.amax, vec![xv.iter().fold(0.0f64, |a, b| a.max(b.abs()))], DType::F32)?])
                });
            }
            for out_dtype in FLOATS {
                self.case("dequantize", out_dtype, format!("{fp8} 4097"), |s| {
                    let codes: Vec<u8> =
                        (0..4097).map(|i| (i * 37 % 256) as u8).filter(|c| f.decode(*c).is_finite()).collect();
                    let n = codes.len();
                    let q = Tensor::from_slice(&codes, [n], fp8)?.to_device(&s.device)?;
                    let si = s.put(&[0.5], &[1], DType::F32)?;
                    let o = s.call::<Dequantize>(&DequantizeArgs { q, scale_inv: si, out_dtype })?;
                    let want: Vec<f64> = codes.iter().map(|c| f64::from(f.decode(*c)) * 0.5).collect();
                    Ok(vec![cmp("y", &o.y, crate::round(&want, out_dtype), out_dtype)?])
                });
            }
            self.case("fp8_transpose", fp8, "33x1000".into(), |s| {
                let codes: Vec<u8> = (0..33 * 1000).map(|i| (i * 7 % 251) as u8).collect();
                let q = Tensor::from_slice(&codes, [33, 1000], fp8)?.to_device(&s.device)?;
                let o = s.call::<Fp8Transpose>(&Fp8TransposeArgs { q })?;
                let got: Vec<f64> = o.q_t.to_vec::<u8>()?.into_iter().map(f64::from).collect();
                let want: Vec<f64> = (0..1000)
                    .flat_map(|j| (0..33).map(move |i| (i, j)))
                    .map(|(i, j)| f64::from(codes[i * 1000 + j]))
                    .collect();
                Ok(vec![Cmp { name: "q_t", got, want, dtype: DType::F32, floor: 0.0, nan: false }])
            });
        }
        for algo in [AmaxAlgo::Max, AmaxAlgo::MostRecent] {
            self.case("fused_amax_and_scale_update_after_reduction", DType::F32, format!("{algo:?} margin 1"), |s| {
                let mut hv = s.rng.vec(16 * 5, 0.0, 10.0);
                // column 3: zeros (the scale is kept); column 4: an inf (kept, for Max)
                for r in 0..16 {
                    hv[r * 5 + 3] = 0.0;
                }
                hv[7 * 5 + 4] = f64::INFINITY;
                let h = s.put(&hv, &[16, 5], DType::F32)?;
                let hv = h.to_vec::<f64>()?;
                let scale = s.put(&[1.0, 2.0, 3.0, 4.0, 5.0], &[5], DType::F32)?;
                let scale_inv = s.poisoned(&[5], DType::F32)?;
                s.call::<FusedAmaxAndScaleUpdate>(&DelayedScalingArgs {
                    amax_history: h.clone(),
                    scale: scale.clone(),
                    scale_inv: scale_inv.clone(),
                    fp8_max: 448.0,
                    margin: 1.0,
                    algo,
                })?;
                let (nh, ns, nsi) = oracle::delayed_scaling(&hv, 5, &[1.0, 2.0, 3.0, 4.0, 5.0], 448.0, 1.0, algo);
                Ok(vec![
                    cmp("amax_history", &h, nh, DType::F32)?,
                    cmp("scale", &scale, ns, DType::F32)?,
                    cmp("scale_inv", &scale_inv, nsi, DType::F32)?,
                ])
            });
        }
    }

    // ---------------- dropout ----------------

    fn dropout(&mut self) {
        for dtype in FLOATS {
            for (rows, n) in [(1, 1000), (7, 4097)] {
                self.case("dropout_fwd", dtype, format!("{rows}x{n} p=0.3"), |s| {
                    let (x, xv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                    let o = s.call::<DropoutFwd>(&DropoutFwdArgs { x, p: 0.3, seed: 7, offset: 11 })?;
                    let keep = 1.0 / (1.0 - f64::from(0.3f32));
                    let kept: Vec<f64> = (0..xv.len())
                        .map(|i| f64::from(u8::from(tefl_core::philox::uniform(7, 11, i as u64) >= 0.3)))
                        .collect();
                    let y = xv.iter().zip(&kept).map(|(x, k)| x * k * keep).collect();
                    let mask: Vec<f64> = o.mask.to_vec::<u8>()?.into_iter().map(f64::from).collect();
                    Ok(vec![
                        cmp("y", &o.y, y, dtype)?,
                        Cmp { name: "mask", got: mask, want: kept, dtype: DType::F32, floor: 0.0, nan: false },
                    ])
                });
                self.case("dropout_bwd", dtype, format!("{rows}x{n} p=0.3"), |s| {
                    let (dy, dyv) = s.rand(&[rows, n], dtype, -1.0, 1.0)?;
                    let mv: Vec<u8> = (0..rows * n).map(|i| u8::from(i % 3 != 0)).collect();
                    let mask = Tensor::from_slice(&mv, [rows, n], DType::U8)?.to_device(&s.device)?;
                    let o = s.call::<DropoutBwd>(&DropoutBwdArgs { dy, mask, p: 0.3 })?;
                    let keep = 1.0 / (1.0 - f64::from(0.3f32));
                    let want = dyv.iter().zip(&mv).map(|(d, m)| d * f64::from(*m) * keep).collect();
                    Ok(vec![cmp("dx", &o.dx, want, dtype)?])
                });
            }
        }
    }

    // ---------------- report ----------------

    /// The op × dtype table (pass / FAIL / skip, with the first error) and the closing line.
    pub fn report(&self) -> String {
        // (passed, failed, skipped, first detail, worst relative error) per op × dtype
        type Cell = (usize, usize, usize, Option<String>, f64);
        let mut cells: BTreeMap<(&str, DType), Cell> = BTreeMap::new();
        for o in &self.outcomes {
            let c = cells.entry((o.op, o.dtype)).or_insert((0, 0, 0, None, 0.0));
            match &o.status {
                Status::Pass => c.0 += 1,
                Status::Fail(e) => {
                    c.1 += 1;
                    c.3.get_or_insert(format!("{}: {e}", o.case));
                }
                Status::Skip(r) => {
                    c.2 += 1;
                    c.3.get_or_insert(r.clone());
                }
            }
            if o.rel.is_finite() {
                c.4 = c.4.max(o.rel);
            }
        }
        let mut out = String::new();
        let _ = writeln!(out, "{:<48} {:<7} {:<6} {:>6}  {:>9}  detail", "op", "dtype", "result", "cases", "max rel");
        for ((op, dtype), (p, f, s, detail, rel)) in &cells {
            let result = if *f > 0 {
                "FAIL"
            } else if *p > 0 {
                "pass"
            } else {
                "skip"
            };
            let detail = if *f > 0 || *p == 0 { detail.clone().unwrap_or_default() } else { String::new() };
            let _ = writeln!(out, "{op:<48} {:<7} {result:<6} {:>6}  {rel:>9.2e}  {detail}", dtype.name(), p + f + s);
        }
        let (p, f, s) = self.counts();
        let _ = writeln!(out, "{p} passed, {f} failed, {s} skipped");
        out
    }

    /// One line per case: op, dtype, case, result, max abs and relative error.
    pub fn details(&self) -> String {
        let mut out = String::new();
        for o in &self.outcomes {
            let r = match &o.status {
                Status::Pass => "pass".to_string(),
                Status::Fail(e) => format!("FAIL {e}"),
                Status::Skip(r) => format!("skip {r}"),
            };
            let _ = writeln!(
                out,
                "{:<46} {:<7} max_abs {:>9.2e} rel {:>9.2e}  {}  [{}]",
                o.op,
                o.dtype.name(),
                o.max_abs,
                o.rel,
                r,
                o.case
            );
        }
        out
    }

    /// (passed, failed, skipped) cases.
    pub fn counts(&self) -> (usize, usize, usize) {
        self.outcomes.iter().fold((0, 0, 0), |(p, f, s), o| match o.status {
            Status::Pass => (p + 1, f, s),
            Status::Fail(_) => (p, f + 1, s),
            Status::Skip(_) => (p, f, s + 1),
        })
    }
}

/// One attention case.
struct AttnCase {
    layout: QkvLayout,
    mask: AttnMask,
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    d: usize,
    cu_q: Option<Vec<i32>>,
    cu_k: Option<Vec<i32>>,
    window: AttnWindow,
    p: f32,
}

/// The transpose of the RoPE map on one head vector (what the backward applies).
fn rope_transpose(g: &[f64], f: &[f64], interleaved: bool) -> Vec<f64> {
    let mut y = g.to_vec();
    let dr = f.len();
    if interleaved {
        for p in 0..dr / 2 {
            y[2 * p] = g[2 * p] * f[2 * p].cos() + g[2 * p + 1] * f[2 * p + 1].sin();
            y[2 * p + 1] = g[2 * p + 1] * f[2 * p + 1].cos() - g[2 * p] * f[2 * p].sin();
        }
    } else {
        let h = dr / 2;
        for j in 0..h {
            y[j] = g[j] * f[j].cos() + g[j + h] * f[j + h].sin();
            y[j + h] = g[j + h] * f[j + h].cos() - g[j] * f[j].sin();
        }
    }
    y
}
