//! The conformance suite: one set of cases for every backend. For a given impl id it calls
//! each op that impl registers directly (bypassing the policy), on the impl's device, with
//! fresh random inputs, and compares every output with the f64 [`crate::oracle`] at the
//! tolerance of its dtype. In-place outputs are poisoned (NaN) before each run, and NaN
//! never passes.
#![allow(clippy::needless_range_loop)] // index loops mirror the formulas

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use tefl_core::{DType, Device, Error, Manager, Op, Tensor};

use crate::{Rng, rel_err, tolerance};

mod activations;
mod attention;
mod dropout;
mod empty;
mod fp8;
mod gemm;
mod nan;
mod norms;
mod optimizers;
mod rope;
mod softmax;

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

/// How big the cases are: `Full` adds hidden 16384 and long sequences, and takes the large
/// attention cases in every dtype (`Quick`, in one each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// The everyday set.
    Quick,
    /// Every case.
    Full,
}

/// `--shard K/N`: of the cases an impl runs in each family (those not skipped for their op or
/// dtype), in the suite's order, only the K-th, the (K + N)-th, and so on run (counting from 0);
/// the others are skipped as in another shard. The N shards together run every case once, so a slow tool (compute-sanitizer)
/// can be split across commands of bounded length. A case's inputs come from the suite's one
/// random stream, which only the cases that run draw from: a shard's failure replays with the
/// same `--shard` and `--seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// Which shard, from 0.
    pub index: usize,
    /// How many shards.
    pub count: usize,
}

impl Shard {
    /// The largest shard count taken.
    pub const MAX_COUNT: usize = 1000;

    /// `K/N` with 0 ≤ K < N ≤ [`Shard::MAX_COUNT`], or the message naming the bad value.
    pub fn parse(v: &str) -> Result<Shard, String> {
        let bad = || format!("--shard {v:?}: expected K/N, shard K of N, with 0 <= K < N <= {}", Shard::MAX_COUNT);
        let (k, n) = v.split_once('/').ok_or_else(bad)?;
        let (index, count) =
            (k.trim().parse::<usize>().map_err(|_| bad())?, n.trim().parse::<usize>().map_err(|_| bad())?);
        if count == 0 || count > Shard::MAX_COUNT || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
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
    /// The status line on a terminal (family, cases done, the case running).
    progress: crate::progress::Progress,
    /// While set, an `Unsupported` answer skips the case (cases of an op option a backend
    /// may lack and say so, see [`Suite::optional_case`]).
    options_may_be_unsupported: bool,
    /// When set, only these ops' cases run ([`Suite::only_ops`]).
    selected_ops: Option<BTreeSet<&'static str>>,
    /// When set, only this shard's cases run ([`Suite::shard`]).
    shard: Option<Shard>,
    /// Cases of the running family met so far that the impl runs (not skipped for their op or
    /// dtype): the shard's count.
    runnable: usize,
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
            progress: crate::progress::Progress::new("conformance"),
            options_may_be_unsupported: false,
            selected_ops: None,
            shard: None,
            runnable: 0,
        })
    }

    /// The catalogue's names for `ops`, for [`Suite::only_ops`]; a name the catalogue lacks is
    /// an error naming it.
    pub fn select_ops(ops: &[String]) -> Result<BTreeSet<&'static str>, String> {
        ops.iter()
            .map(|op| {
                tefl_core::catalogue::all()
                    .iter()
                    .find(|d| d.name == op)
                    .map(|d| d.name)
                    .ok_or_else(|| format!("unknown op {op:?} (`cargo xtask coverage` lists the catalogue)"))
            })
            .collect()
    }

    /// Runs only the cases of `ops` ([`Suite::select_ops`]); the others are skipped as not
    /// selected. For narrowing a slow tool to one op's kernels, e.g. compute-sanitizer's
    /// racecheck on the grouped GEMM without the rest of its family.
    pub fn only_ops(&mut self, ops: BTreeSet<&'static str>) {
        self.selected_ops = Some(ops);
    }

    /// Runs only `shard`'s share of the cases ([`Shard`]); the others are skipped as in another
    /// shard.
    pub fn shard(&mut self, shard: Shard) {
        self.shard = Some(shard);
    }

    /// Why a case of `op` with `dtype` does not run, if it doesn't.
    fn skip_reason(&self, op: &str, dtype: DType) -> Option<String> {
        if self.selected_ops.as_ref().is_some_and(|s| !s.contains(op)) {
            return Some("not selected (--ops)".into());
        }
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
        let mut skip = self.skip_reason(op, dtype);
        if skip.is_none()
            && let Some(shard) = self.shard
        {
            let i = self.runnable;
            self.runnable += 1;
            if i % shard.count != shard.index {
                skip = Some(format!("in another shard (--shard {shard})"));
            }
        }
        if let Some(reason) = skip {
            self.outcomes.push(Outcome { op, dtype, case, status: Status::Skip(reason), max_abs: 0.0, rel: 0.0 });
            return;
        }
        self.progress.tick(&format!("{op} {dtype} {case}"));
        let (status, max_abs, rel) = match f(self) {
            // An option a backend declares it lacks (an FP8 output of the norms on Vulkan).
            Err(Error::Unsupported { reason, .. }) if self.options_may_be_unsupported => {
                (Status::Skip(format!("unsupported: {reason}")), 0.0, 0.0)
            }
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

    /// Runs a case of an op option a backend may lack (an FP8 output): an `Unsupported`
    /// answer skips it with the backend's reason, anything else is compared as usual.
    fn optional_case(
        &mut self,
        op: &'static str,
        dtype: DType,
        case: String,
        f: impl FnOnce(&mut Self) -> tefl_core::Result<Vec<Cmp>>,
    ) {
        self.options_may_be_unsupported = true;
        self.case(op, dtype, case, f);
        self.options_may_be_unsupported = false;
    }

    /// Runs every case.
    pub fn run_all(&mut self, progress: &mut dyn FnMut(&str)) {
        self.run_families(None, progress);
    }

    /// The op families, in the order [`Suite::run_all`] runs them.
    pub const FAMILIES: [&'static str; 12] = [
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
        "empty",
    ];

    /// Runs the families named in `only` (all when `None`).
    pub fn run_families(&mut self, only: Option<&[String]>, progress: &mut dyn FnMut(&str)) {
        type Family<'a> = (&'static str, fn(&mut Suite<'a>));
        let families: [Family<'m>; 12] = [
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
            ("empty", Self::empty),
        ];
        for (name, f) in families {
            if only.is_some_and(|o| !o.iter().any(|x| x == name)) {
                continue;
            }
            self.progress.clear();
            progress(name);
            self.progress.start(name, None);
            // Shards count each family's cases from its first, so that a family run in a
            // process of its own (`--jobs`) takes the same share as in one process.
            self.runnable = 0;
            f(self);
        }
        self.progress.clear();
    }

    /// The optimizers' `noop_flag`: an i32 `[1]` zero on the suite's device.
    fn noop(&self) -> tefl_core::Result<Tensor> {
        self.put_i32(&[0])
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
