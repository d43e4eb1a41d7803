//! # tefl-tests
//!
//! Cross-crate tests of tefl, built with the same backend features as the facade
//! (`--features nvidia,amd,vulkan`). The integration tests in `tests/` check that the set of
//! registered (op, impl) pairs and vendors is exactly what the enabled features promise,
//! and that a build with every backend starts on a machine without GPU drivers.
//! The conformance suite shared by every backend, with its f64 oracle, will live here too.

/// The (op, impl_id) pairs each backend promises to register in this version of tefl.
/// A backend that registers an op adds it here; the registered-set test then holds it to it.
pub fn promised_impls(backend: &str) -> Vec<(&'static str, &'static str)> {
    // Every op of the catalogue under `id`.
    let every_op = |id: &'static str| -> Vec<_> { tefl_core::catalogue::all().iter().map(|d| (d.name, id)).collect() };
    match backend {
        // The reference backend implements the whole catalogue.
        "reference" => every_op("reference.cpu"),
        // So does the CUDA backend, plus the portable GEMM registered by id only.
        "nvidia" => {
            let mut v = every_op("vendor.nvidia");
            v.push(("generic_gemm", "vendor.nvidia.portable"));
            v.push(("fused_attn_fwd", "vendor.nvidia.portable"));
            v.push(("fused_attn_bwd", "vendor.nvidia.portable"));
            v
        }
        // The HIP and Vulkan backends: every op (their GEMMs, the grouped one too, for float
        // inputs).
        "amd" => every_op("vendor.amd"),
        "vulkan" => every_op("default.vulkan"),
        _ => Vec::new(),
    }
}

include!(concat!(env!("OUT_DIR"), "/enabled_features.rs"));

/// The backends the enabled features link (`reference` always), sorted: this crate's own
/// features (each enables `tefl-ops/<backend>`), independent of what `tefl-ops` reports.
pub fn enabled_backends() -> Vec<&'static str> {
    let mut v = vec!["reference"];
    v.extend(ENABLED_FEATURES.iter().copied());
    v.sort();
    v
}

pub mod chart;
pub mod cli;
pub mod conformance;
pub mod jobs;
pub mod oracle;
pub mod progress;

use std::sync::OnceLock;

use tefl_core::op::Op;
use tefl_core::{DType, Error, Manager, Registry, Tensor};

/// A small deterministic generator (splitmix64) so failures replay from the printed seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    /// n uniforms in [lo, hi).
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    /// An integer in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A fresh seed per run (`TEFL_TEST_SEED` replays one), printed so a failure can be replayed.
pub fn seed(test: &str) -> u64 {
    let s = std::env::var("TEFL_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        (t as u64) ^ (std::process::id() as u64).rotate_left(32)
    });
    println!("{test}: seed {s} (replay with TEFL_TEST_SEED={s})");
    s
}

/// A tensor of `dtype` holding `values` (rounded to the dtype).
pub fn tensor(values: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    let f: Vec<f32> = values.iter().map(|v| *v as f32).collect();
    Tensor::from_slice(&f, shape, dtype).expect("valid test tensor")
}

/// The exact values a tensor holds, widened to f64.
pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().expect("float tensor")
}

/// The tolerance on ‖out − ref‖/‖ref‖ for an output of `dtype` (DESIGN.md).
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 | DType::BF16 => 1e-2,
        DType::F8E4M3 => 7e-2,
        DType::F8E5M2 => 1.3e-1,
        _ => 0.0,
    }
}

/// Relative error ‖got − want‖/‖want‖ (absolute when want is 0); infinite when got holds NaN.
pub fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    if got.iter().any(|v| v.is_nan()) {
        return f64::INFINITY;
    }
    let num: f64 = got.iter().zip(want).map(|(g, w)| if g == w { 0.0 } else { (g - w).powi(2) }).sum::<f64>().sqrt();
    let den: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    if den == 0.0 { num } else { num / den }
}

/// Compares `got` with the oracle at the tolerance of `dtype`, printing max abs and rel error.
#[track_caller]
pub fn assert_close(what: &str, got: &[f64], want: &[f64], dtype: DType) {
    let rel = rel_err(got, want);
    let max_abs = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);
    let tol = tolerance(dtype);
    println!("  {what:<40} {dtype:<6} max_abs {max_abs:.3e}  rel {rel:.3e}  (tol {tol:.0e})");
    assert!(rel <= tol, "{what} ({dtype}): relative error {rel:.3e} > {tol:.0e}; max abs {max_abs:.3e}");
}

/// The output rounded like `dtype` stores it (to compare oracles with stored outputs).
pub fn round(values: &[f64], dtype: DType) -> Vec<f64> {
    self::values(&tensor(values, &[values.len()], dtype))
}

/// A manager over every linked-in impl (for direct impl calls).
pub fn manager() -> &'static Manager {
    static M: OnceLock<Manager> = OnceLock::new();
    M.get_or_init(|| {
        let _ = tefl_ops::linked_backends();
        Manager::new(Registry::with_builtins(), Default::default())
    })
}

/// Calls the reference impl of `O` directly (bypassing policy).
pub fn reference<O: Op>(args: &O::Args) -> tefl_core::Result<O::Output> {
    manager().call_impl::<O>("reference.cpu", args)
}

/// Errors that name what was wrong: an argument, a variable, a tensor, an impl.
pub fn names_the_culprit(e: &Error) -> bool {
    match e {
        Error::Shape { arg, .. } | Error::DType { arg, .. } | Error::InvalidArgument { arg, .. } => !arg.is_empty(),
        Error::DeviceMismatch { .. } | Error::Config { .. } => true,
        Error::OutOfMemory { what, .. } => !what.is_empty(),
        Error::Unsupported { impl_id, .. } => !impl_id.is_empty(),
        // Every impl of the chain failed: each failure must name its culprit in turn.
        Error::AllFailed { failures, .. } => {
            !failures.is_empty()
                && failures.iter().all(|(_, r)| {
                    r.contains("argument '") || r.contains(": out of memory ") || r.starts_with("not supported")
                })
        }
        _ => false,
    }
}
