//! Launch parameters from the tune configs (FlagGems' `heuristics_config_utils`): the
//! embedded `tune_configs.toml` layered under the arch family's override
//! (`hopper/tune_configs.toml`), and rules that pick a candidate without measuring. With
//! `TEFL_AUTOTUNE=1` the autotuner times the candidates once per shape bucket instead
//! (see [`tuned`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tefl_core::tuning::{Autotuner, TuneConfig, TuneKey, TuneTable};
use tefl_core::{DType, Device, Result};

const DEFAULTS: &str = include_str!("tune_configs.toml");
const HOPPER: &str = include_str!("hopper/tune_configs.toml");

/// The layered table for an arch (`sm_90` → the hopper file over the defaults), parsed once
/// per arch.
pub fn table(arch: &str) -> Arc<TuneTable> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<TuneTable>>>> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    cache.entry(arch.to_owned()).or_insert_with(|| Arc::new(parse_table(arch))).clone()
}

fn parse_table(arch: &str) -> TuneTable {
    let defaults = TuneTable::parse(DEFAULTS, "tefl-backend-nvidia/src/tune_configs.toml").unwrap_or_default();
    let family = crate::vendor_info().arch_family(arch).map(str::to_owned);
    let arch_table = match family.as_deref() {
        Some("hopper") => TuneTable::parse(HOPPER, "tefl-backend-nvidia/src/hopper/tune_configs.toml").ok(),
        _ => None,
    };
    TuneTable::layered(&defaults, None, arch_table.as_ref())
}

fn int(c: &TuneConfig, key: &str, default: i64) -> u32 {
    c.get(key).and_then(|v| v.as_int()).unwrap_or(default).clamp(1, 1 << 20) as u32
}

/// How a row kernel (norm, softmax) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowConfig {
    /// Threads per block.
    pub block: u32,
    /// Bytes per vector access.
    pub vec_bytes: u32,
    /// Vectors per thread kept in registers; 0 means the two-pass (scalar) path.
    pub row_vecs: u32,
}

impl RowConfig {
    /// The config a candidate gives for rows of `n` elements of `elem` bytes: the row fits
    /// in registers when `n` is a whole number of vectors and at most block · max_row_vecs.
    pub fn from_candidate(c: &TuneConfig, n: usize, elem: usize) -> Option<RowConfig> {
        let (block, vec_bytes, max) = (int(c, "block", 256), int(c, "vec_bytes", 16), int(c, "max_row_vecs", 8));
        let nv = (vec_bytes as usize / elem).max(1);
        let nvecs = n / nv;
        if n.is_multiple_of(nv) && nvecs <= (block * max) as usize {
            Some(RowConfig { block, vec_bytes, row_vecs: nvecs.div_ceil(block as usize).max(1) as u32 })
        } else {
            None
        }
    }

    /// The two-pass config (any `n`).
    pub fn two_pass(block: u32) -> RowConfig {
        RowConfig { block, vec_bytes: 16, row_vecs: 0 }
    }
}

/// The heuristic for a row kernel: the first candidate (in table order) that keeps the row
/// in registers with at most 4 vectors per thread, else any that keeps it at all, else the
/// two-pass path with 256 threads (or fewer for short rows).
pub fn row_kernel(family: &str, arch: &str, n: usize, elem: usize) -> RowConfig {
    row_kernel_within(family, arch, n, elem, 4)
}

/// [`row_kernel`] preferring at most `pref` vectors per thread.
pub fn row_kernel_within(family: &str, arch: &str, n: usize, elem: usize, pref: u32) -> RowConfig {
    let t = table(arch);
    let cands = t.configs(family);
    let fits: Vec<RowConfig> = cands.iter().filter_map(|c| RowConfig::from_candidate(c, n, elem)).collect();
    fits.iter()
        .find(|r| r.row_vecs <= pref && (r.block as usize) * 2 <= n.max(64))
        .or_else(|| fits.iter().find(|r| r.row_vecs <= pref))
        .or(fits.first())
        .copied()
        .unwrap_or_else(|| RowConfig::two_pass(if n < 1024 { 128 } else { 256 }))
}

/// How an elementwise kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElementwiseConfig {
    /// Threads per block.
    pub block: u32,
    /// Vectors per thread per grid-stride step.
    pub unroll: u32,
    /// Bytes per vector access.
    pub vec_bytes: u32,
}

impl ElementwiseConfig {
    /// The config a candidate describes.
    pub fn from_candidate(c: &TuneConfig) -> Self {
        ElementwiseConfig {
            block: int(c, "block", 256),
            unroll: int(c, "unroll", 2),
            vec_bytes: int(c, "vec_bytes", 16),
        }
    }
}

/// The heuristic for an elementwise kernel: the table's first candidate.
pub fn elementwise(arch: &str) -> ElementwiseConfig {
    let t = table(arch);
    ElementwiseConfig::from_candidate(&t.configs("elementwise").first().cloned().unwrap_or_default())
}

/// An elementwise config chosen by the autotuner when asked for (timing each candidate with
/// `bench`, per power-of-two bucket of `items`), else by [`elementwise`].
pub fn tuned_elementwise(
    kernel: &str,
    device: Device,
    arch: &str,
    dtype: DType,
    items: usize,
    mut bench: impl FnMut(ElementwiseConfig) -> Result<f64>,
) -> ElementwiseConfig {
    let heuristic = elementwise(arch);
    if !autotune_requested() {
        return heuristic;
    }
    let t = table(arch);
    let cands = t.configs("elementwise").to_vec();
    let bucket = format!("items={}", items.next_power_of_two());
    let key = tune_key(kernel, dtype, &bucket, device, arch);
    let chosen = autotuner().select(&key, &cands, |c| bench(ElementwiseConfig::from_candidate(c)), TuneConfig::new);
    if chosen.is_empty() { heuristic } else { ElementwiseConfig::from_candidate(&chosen) }
}

/// Forward attention blocks per SM the kernel's register budget is cut for (`attention`'s
/// `fwd_min_blocks`, 2 by default; `TEFL_ATTN_FWD_MIN_BLOCKS` overrides it for experiments).
pub fn attention_fwd_min_blocks(arch: &str) -> u32 {
    if let Ok(env) = tefl_core::policy::env()
        && let Some(n) = env.attn_fwd_min_blocks
    {
        return n;
    }
    let t = table(arch);
    t.configs("attention").first().map_or(2, |c| int(c, "fwd_min_blocks", 2).clamp(1, 4))
}

/// Seconds one candidate takes, as the autotuner compares them: a first untimed run (it
/// compiles and loads the kernel variant), then the fastest of three timed runs.
pub fn measure(device: Device, run: &dyn Fn() -> Result<()>) -> Result<f64> {
    use tefl_core::device::DeviceRuntime;
    let rt = crate::runtime::global();
    run()?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        best = best.min(rt.time_on_device(device, &mut || run())?);
    }
    Ok(best)
}

/// The autotuner of the process (`TEFL_AUTOTUNE`, `TEFL_CACHE_DIR`); off when misconfigured.
pub fn autotuner() -> &'static Autotuner {
    static A: OnceLock<Autotuner> = OnceLock::new();
    A.get_or_init(|| {
        Autotuner::from_env().unwrap_or_else(|e| {
            tracing::warn!(target: "TE-FL", "autotuning off: {e}");
            Autotuner::new(std::env::temp_dir(), false)
        })
    })
}

/// Whether autotuning was asked for explicitly (`TEFL_AUTOTUNE=1`): measuring is opt-in on
/// CUDA, so a first call never pays for timing every candidate unasked.
pub fn autotune_requested() -> bool {
    tefl_core::policy::env().as_ref().is_ok_and(|e| e.autotune)
}

/// The key of a cached tuning result: the device's name (not its ordinal), its arch and the
/// driver's version, so that another GPU model or a driver upgrade tunes again.
fn tune_key(kernel: &str, dtype: DType, bucket: &str, device: Device, arch: &str) -> TuneKey {
    use tefl_core::device::DeviceRuntime;
    let name = crate::runtime::global().name(device.ordinal);
    TuneKey::new(kernel, dtype, bucket, &name, arch, crate::vendor::driver_version())
}

/// A row-kernel config chosen by the autotuner when asked for (timing each candidate that
/// fits with `bench`), else by [`row_kernel`].
pub fn tuned_row_kernel(
    family: &str,
    device: Device,
    arch: &str,
    dtype: DType,
    n: usize,
    mut bench: impl FnMut(RowConfig) -> Result<f64>,
) -> RowConfig {
    let heuristic = row_kernel(family, arch, n, dtype.size_in_bytes());
    if !autotune_requested() {
        return heuristic;
    }
    let t = table(arch);
    let cands: Vec<TuneConfig> = t
        .configs(family)
        .iter()
        .filter(|c| RowConfig::from_candidate(c, n, dtype.size_in_bytes()).is_some())
        .cloned()
        .collect();
    let bucket = format!("n={}", n.next_power_of_two());
    let key = tune_key(family, dtype, &bucket, device, arch);
    let chosen = autotuner().select(
        &key,
        &cands,
        |c| match RowConfig::from_candidate(c, n, dtype.size_in_bytes()) {
            Some(r) => bench(r),
            None => Err(tefl_core::Error::Tuning("candidate does not fit".into())),
        },
        TuneConfig::new,
    );
    RowConfig::from_candidate(&chosen, n, dtype.size_in_bytes()).unwrap_or(heuristic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tune_keys_carry_the_driver_version_and_device_name() {
        let k = tune_key("norm", DType::BF16, "n=4096", Device::cuda(0), "sm_90");
        assert_eq!(k.driver, crate::vendor::driver_version());
        assert_ne!(k.driver, "cuda", "the driver field is a version, not the API's name");
        assert_ne!(k.device, "cuda:0", "the device field is the device's name, not its ordinal");
        if crate::vendor::availability().is_err() {
            assert_eq!(k.driver, "unknown");
        } else {
            assert!(k.driver.split('.').all(|p| p.parse::<u32>().is_ok()), "{}", k.driver);
        }
    }

    #[test]
    fn hopper_overrides_norm_but_not_softmax() {
        let h = table("sm_90");
        let d = table("sm_80");
        assert_ne!(h.configs("norm"), d.configs("norm"));
        assert_eq!(h.configs("softmax"), d.configs("softmax"));
        assert_eq!(d.configs("norm").len(), 4);
    }

    #[test]
    fn rows_fit_in_registers_when_they_can() {
        // 8192 bf16 = 1024 vectors of 16 bytes.
        let r = row_kernel("norm", "sm_90", 8192, 2);
        assert!(r.row_vecs >= 1 && r.row_vecs <= 4, "{r:?}");
        assert!((r.block * r.row_vecs * 8) as usize >= 8192);
        // An odd length cannot be vectorised: the two-pass path.
        assert_eq!(row_kernel("norm", "sm_90", 4097, 2).row_vecs, 0);
        // Longer than 1024 threads x 8 vectors x 8 elements.
        assert_eq!(row_kernel("norm", "sm_80", 1 << 17, 2).row_vecs, 0);
        // A tiny row still gets a block.
        let t = row_kernel("norm", "sm_80", 8, 4);
        assert_eq!(t.row_vecs, 1);
    }
}
