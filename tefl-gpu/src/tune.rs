//! Launch parameters from tune configs (FlagGems' `configs_loader` and
//! `heuristics_config_utils`): the GPU defaults (`tefl-gpu/src/tune_configs.toml`) under the
//! vendor's `tune_configs.toml` under the arch family's file (`hopper/tune_configs.toml`),
//! the family coming from the vendor's [`VendorInfo::arch_family`]. Rules pick a candidate
//! without measuring; with `TEFL_AUTOTUNE=1` the autotuner times the candidates once per
//! shape bucket, through `tefl_core`'s device runtime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tefl_core::device::DeviceInfo;
use tefl_core::tuning::{Autotuner, TuneConfig, TuneKey, TuneTable};
use tefl_core::{DType, Device, Error, Result, VendorInfo};

/// One tune-config file: where it lives (for error messages) and its text.
#[derive(Debug)]
pub struct TuneFile {
    /// The path, from the workspace root.
    pub path: &'static str,
    /// The TOML text.
    pub text: &'static str,
}

/// The GPU defaults every backend's configs are layered over.
pub static GPU_DEFAULTS: TuneFile =
    TuneFile { path: "tefl-gpu/src/tune_configs.toml", text: include_str!("tune_configs.toml") };

/// A backend's tune configs: its own file and one per arch family it tunes for. Declare it
/// as a `static` with [`TuneConfigs::new`]; each arch's layered table is parsed once.
#[derive(Debug)]
pub struct TuneConfigs {
    /// The vendor whose `arch_family` maps an arch to a family folder.
    pub vendor: fn() -> VendorInfo,
    /// The vendor's `tune_configs.toml`.
    pub vendor_file: TuneFile,
    /// `(family, file)` per arch-family folder (`("hopper", hopper/tune_configs.toml)`).
    pub families: &'static [(&'static str, TuneFile)],
    tables: OnceLock<Mutex<HashMap<String, Arc<TuneTable>>>>,
}

fn parse(file: &TuneFile) -> Option<TuneTable> {
    TuneTable::parse(file.text, file.path)
        .map_err(|e| tracing::error!(target: "TE-FL", "tune configs ignored: {e}"))
        .ok()
}

impl TuneConfigs {
    /// The configs of `vendor`: its own file, then one file per arch family.
    pub const fn new(
        vendor: fn() -> VendorInfo,
        vendor_file: TuneFile,
        families: &'static [(&'static str, TuneFile)],
    ) -> Self {
        TuneConfigs { vendor, vendor_file, families, tables: OnceLock::new() }
    }

    /// The layered table for `arch` (arch family over vendor over GPU defaults), parsed on
    /// the first call per arch; later calls are one map lookup (it is on every op's path).
    pub fn table(&self, arch: &str) -> Arc<TuneTable> {
        let mut tables = self.tables.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tables.get(arch) {
            return t.clone();
        }
        let t = Arc::new(self.layered(&(self.vendor)(), arch));
        tables.insert(arch.to_owned(), t.clone());
        t
    }

    fn layered(&self, vendor: &VendorInfo, arch: &str) -> TuneTable {
        let defaults = parse(&GPU_DEFAULTS).unwrap_or_default();
        let own = parse(&self.vendor_file);
        let family = vendor.arch_family(arch);
        let arch_table = self.families.iter().find(|(f, _)| Some(*f) == family).and_then(|(_, file)| parse(file));
        TuneTable::layered(&defaults, own.as_ref(), arch_table.as_ref())
    }

    /// Every file, for a test that each parses.
    pub fn files(&self) -> impl Iterator<Item = &TuneFile> {
        std::iter::once(&GPU_DEFAULTS)
            .chain(std::iter::once(&self.vendor_file))
            .chain(self.families.iter().map(|(_, f)| f))
    }
}

/// An integer parameter of a candidate, clamped to [1, 2^20].
pub fn int(c: &TuneConfig, key: &str, default: i64) -> u32 {
    c.get(key).and_then(|v| v.as_int()).unwrap_or(default).clamp(1, 1 << 20) as u32
}

/// How a row kernel (norm, softmax) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowConfig {
    /// Threads per block.
    pub block: u32,
    /// Bytes per vector access.
    pub vec_bytes: u32,
    /// Vectors per thread kept in registers; 0 means the two-pass (scalar) path.
    pub row_vecs: u32,
}

/// Elements of `elem` bytes in a vector of `vec_bytes` (at least one).
fn elems_per_vector(vec_bytes: u32, elem: usize) -> usize {
    (vec_bytes as usize / elem.max(1)).max(1)
}

impl RowConfig {
    /// The config a candidate gives for rows of `n` elements of `elem` bytes: the row fits
    /// in registers when `n` is a whole number of vectors and at most block · max_row_vecs.
    pub fn from_candidate(c: &TuneConfig, n: usize, elem: usize) -> Option<RowConfig> {
        let (block, vec_bytes, max) = (int(c, "block", 256), int(c, "vec_bytes", 16), int(c, "max_row_vecs", 8));
        let nv = elems_per_vector(vec_bytes, elem);
        let nvecs = n / nv;
        if n.is_multiple_of(nv) && nvecs <= (block * max) as usize {
            Some(RowConfig { block, vec_bytes, row_vecs: nvecs.div_ceil(block as usize).max(1) as u32 })
        } else {
            None
        }
    }

    /// Vectors in a row of `n` elements of `elem` bytes (whole ones).
    pub fn vectors(&self, n: usize, elem: usize) -> usize {
        n / elems_per_vector(self.vec_bytes, elem)
    }

    /// The two-pass config (any `n`).
    pub fn two_pass(block: u32) -> RowConfig {
        RowConfig { block, vec_bytes: 16, row_vecs: 0 }
    }

    /// Whether the row is kept in registers (read once).
    pub fn fused(&self) -> bool {
        self.row_vecs > 0
    }
}

/// The heuristic for a row kernel of `family`: the first candidate (in table order) that keeps
/// the row in registers with at most `pref` vectors per thread, no more threads than half the
/// row and a vector for every thread, else the first with at most `pref`, else any that keeps
/// it, else the two-pass path with 256 threads (128 for rows under 1024).
pub fn row_kernel(t: &TuneTable, family: &str, n: usize, elem: usize, pref: u32) -> RowConfig {
    let fits: Vec<RowConfig> = t.configs(family).iter().filter_map(|c| RowConfig::from_candidate(c, n, elem)).collect();
    fits.iter()
        .find(|r| r.row_vecs <= pref && (r.block as usize) * 2 <= n.max(64) && r.block as usize <= r.vectors(n, elem))
        .or_else(|| fits.iter().find(|r| r.row_vecs <= pref))
        .or(fits.first())
        .copied()
        .unwrap_or_else(|| RowConfig::two_pass(if n < 1024 { 128 } else { 256 }))
}

/// Row buffers the tune table asks for in the shared-memory ring of the fused norm backward
/// (`simt/norm.cu`, STAGES): `norm_bwd.stages`, at most 8; 0 (the next row waits in registers)
/// when absent or below 2.
pub fn norm_bwd_ring(t: &TuneTable) -> u32 {
    let want = t.configs("norm_bwd").first().and_then(|c| c.get("stages")).and_then(|v| v.as_int()).unwrap_or(0);
    if want >= 2 { want.min(8) as u32 } else { 0 }
}

/// Vectors a thread takes of a row in the ring's kernel: `norm_bwd.row_vecs` (1 to 8; 2 when
/// absent, as the register path). Fewer vectors a thread means larger blocks for the same row.
pub fn norm_bwd_ring_vecs(t: &TuneTable) -> u32 {
    t.configs("norm_bwd").first().map_or(2, |c| int(c, "row_vecs", 2).min(8))
}

/// Threads an SM the ring's kernel runs: `norm_bwd.threads_per_sm` (32 to 2048; 1024 when
/// absent). Fewer threads leave each more registers (the kernel's launch bounds follow).
pub fn norm_bwd_threads_per_sm(t: &TuneTable) -> u32 {
    t.configs("norm_bwd").first().map_or(1024, |c| int(c, "threads_per_sm", 1024).clamp(32, 2048))
}

/// Blocks of `block` threads the ring's kernel runs an SM: `threads_per_sm` threads' worth, at
/// least one (its registers are capped to match, `BWD_MIN_BLOCKS` in `simt/norm.cu`).
pub fn norm_bwd_blocks_per_sm(block: u32, threads_per_sm: u32) -> u32 {
    (threads_per_sm / block.max(1)).max(1)
}

/// The ring's row buffers for a launch: [`norm_bwd_ring`], fewer where `blocks_per_sm`
/// blocks' rings of `stage_bytes` each would not fit the device's `smem_optin` bytes a block,
/// and none when fewer than two would.
pub fn norm_bwd_stages(t: &TuneTable, smem_optin: usize, stage_bytes: usize, blocks_per_sm: u32) -> u32 {
    // Each block with its static shared memory and the driver's reserve beside.
    let room = (smem_optin / blocks_per_sm.max(1) as usize).saturating_sub(2048);
    let fit = room.checked_div(stage_bytes).unwrap_or(0).min(8) as u32;
    let stages = norm_bwd_ring(t).min(fit);
    if stages >= 2 { stages } else { 0 }
}

/// Whether a kernel streaming `rows` rows of `row_bytes` bytes from an input holds that input in
/// L2 while its rows are in use (an L2 evict_last policy, `load_kept` in the prelude), and if so
/// the first row whose lines it puts back to the normal priority once the row is done
/// (`release_after`). The table's entry `entry` decides: `keep_min_mib` (kept where the input
/// has at least that many MiB; never where unset or 0) and `release_last_mib` (only the rows of
/// the input's last that many MiB are released, the only ones still in L2 when the kernel
/// ends; every row where unset).
pub fn l2_keep(t: &TuneTable, entry: &str, rows: usize, row_bytes: usize) -> Option<usize> {
    let config = t.configs(entry).first();
    let mib_of = |key: &str| config.and_then(|c| c.get(key)).and_then(|v| v.as_int());
    let bytes = (rows as u64).saturating_mul(row_bytes as u64);
    if !mib_of("keep_min_mib").is_some_and(|m| m > 0 && bytes >= (m as u64).saturating_mul(1 << 20)) {
        return None;
    }
    let Some(last_mib) = mib_of("release_last_mib").filter(|&m| m >= 0) else { return Some(0) };
    let last_rows = ((last_mib as u64).saturating_mul(1 << 20)).div_ceil(row_bytes.max(1) as u64);
    Some(rows.saturating_sub(usize::try_from(last_rows).unwrap_or(usize::MAX)))
}

/// How an elementwise kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// The heuristic for an elementwise kernel: the first candidate of the table's shared
/// `elementwise` list.
pub fn elementwise(t: &TuneTable) -> ElementwiseConfig {
    ElementwiseConfig::from_candidate(&t.configs("elementwise").first().cloned().unwrap_or_default())
}

/// The candidates for elementwise kernel `kernel` (an op name, e.g. `gelu`): the table's list
/// of that name where it has one (`[[gelu]]`, as FlagGems keys its tune configs by op),
/// else the shared `elementwise` list.
fn elementwise_candidates<'t>(t: &'t TuneTable, kernel: &str) -> &'t [TuneConfig] {
    match t.configs(kernel) {
        [] => t.configs("elementwise"),
        own => own,
    }
}

/// The heuristic for elementwise kernel `kernel`: the first of its candidates
/// (see `elementwise_candidates`).
pub fn elementwise_for(t: &TuneTable, kernel: &str) -> ElementwiseConfig {
    ElementwiseConfig::from_candidate(&elementwise_candidates(t, kernel).first().cloned().unwrap_or_default())
}

/// Seconds one candidate takes, as the autotuner compares them: a first untimed run (it
/// compiles and loads the kernel variant), then the fastest of three timed runs on the
/// device's runtime. The first measurement of a process, and the first after a pause of
/// more than [`WarmUp::IDLE`], is preceded by [`WarmUp::SECS`] of runs of its candidate: a GPU
/// idle before it runs its first seconds of work slower (NVIDIA's Vulkan driver about five
/// times slower, a step, not a ramp; H200, 2026-12-01: the first Vulkan GEMM candidates an
/// autotuner timed took 26–30 ms where they take 7), and without the warm-up the first
/// candidates of a bucket lost for that.
pub fn measure(device: Device, run: &dyn Fn() -> Result<()>) -> Result<f64> {
    static WARM: WarmUp = WarmUp::new();
    WARM.measure(device, run, std::time::Duration::from_secs_f64(WarmUp::SECS))
}

/// When the autotuner's measurements last ended, so that [`measure`] warms the device up
/// after a pause (one per process; tests make their own).
pub struct WarmUp {
    last: Mutex<Option<std::time::Instant>>,
}

impl WarmUp {
    /// Seconds of runs before timing after a pause (the bench warms up for 3 s for the same
    /// reason; a candidate's runs count here as the bench's calls do).
    pub const SECS: f64 = 2.0;
    /// A pause longer than this since the last measurement ended warms up again.
    pub const IDLE: std::time::Duration = std::time::Duration::from_secs(2);

    /// No measurement yet.
    pub const fn new() -> Self {
        WarmUp { last: Mutex::new(None) }
    }

    /// [`measure`] with a warm-up of `warm_up` after a pause.
    pub fn measure(&self, device: Device, run: &dyn Fn() -> Result<()>, warm_up: std::time::Duration) -> Result<f64> {
        let rt = tefl_core::device::runtime(device.kind)?;
        run()?;
        let paused = self.last.lock().unwrap_or_else(|p| p.into_inner()).is_none_or(|t| t.elapsed() > Self::IDLE);
        if paused {
            // Each run waited for, so that the host does not queue seconds of work ahead.
            let start = std::time::Instant::now();
            while start.elapsed() < warm_up {
                run()?;
                rt.synchronize(device)?;
            }
        }
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            best = best.min(rt.time_on_device(device, &mut || run())?);
        }
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
        Ok(best)
    }
}

impl Default for WarmUp {
    fn default() -> Self {
        Self::new()
    }
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

/// Whether autotuning was asked for (`TEFL_AUTOTUNE=1`): measuring is opt-in on GPUs, so a
/// first call never pays for timing every candidate unasked.
pub fn autotune_requested() -> bool {
    tefl_core::policy::env().as_ref().is_ok_and(|e| e.autotune)
}

/// The key of a cached tuning result: the device's name (not its ordinal), its arch and the
/// driver's version, so that another GPU model or a driver upgrade tunes again.
pub fn tune_key(kernel: &str, dtype: DType, bucket: &str, info: &DeviceInfo) -> TuneKey {
    TuneKey::new(kernel, dtype, bucket, &info.name, &info.arch, &info.driver_version)
}

/// A row-kernel config of `family` chosen by the autotuner when asked for (timing each
/// candidate that fits with `bench`, per power-of-two bucket of `n`), else by [`row_kernel`]
/// with at most 4 vectors per thread.
pub fn tuned_row_kernel(
    t: &TuneTable,
    family: &str,
    info: &DeviceInfo,
    dtype: DType,
    n: usize,
    bench: impl FnMut(RowConfig) -> Result<f64>,
) -> RowConfig {
    tuned_row_kernel_as(t, family, family, info, dtype, n, bench)
}

/// [`tuned_row_kernel`] for a kernel of `family` with a name of its own (`kernel`, e.g. the
/// softmax backward's `softmax_bwd`): its candidates are the table's list of that name where it
/// has one (`[[softmax_bwd]]`), else `family`'s, and the autotuner keys it by that name either
/// way, so that its winner is not the family's.
pub fn tuned_row_kernel_as(
    t: &TuneTable,
    family: &str,
    kernel: &str,
    info: &DeviceInfo,
    dtype: DType,
    n: usize,
    mut bench: impl FnMut(RowConfig) -> Result<f64>,
) -> RowConfig {
    let family = if t.configs(kernel).is_empty() { family } else { kernel };
    let elem = dtype.size_in_bytes();
    let heuristic = row_kernel(t, family, n, elem, 4);
    if !autotune_requested() {
        return heuristic;
    }
    let (key, cands) = row_kernel_key(t, family, kernel, info, dtype, n);
    let chosen = autotuner().select(
        &key,
        &cands,
        |c| match RowConfig::from_candidate(c, n, elem) {
            Some(r) => bench(r),
            None => Err(Error::Tuning("candidate does not fit".into())),
        },
        TuneConfig::new,
    );
    RowConfig::from_candidate(&chosen, n, elem).unwrap_or(heuristic)
}

/// The autotuner's key and candidates (those that fit rows of `n`) for a row kernel of `family`.
fn row_kernel_key(
    t: &TuneTable,
    family: &str,
    kernel: &str,
    info: &DeviceInfo,
    dtype: DType,
    n: usize,
) -> (TuneKey, Vec<TuneConfig>) {
    let elem = dtype.size_in_bytes();
    let cands = t.configs(family).iter().filter(|c| RowConfig::from_candidate(c, n, elem).is_some()).cloned().collect();
    (tune_key(kernel, dtype, &format!("n={}", n.next_power_of_two()), info), cands)
}

/// The config [`tuned_row_kernel`] returns for these arguments where it times nothing: with
/// autotuning asked for, the winner cached on disk for this key and candidate set, else the
/// heuristic. Warm-ups compile it ahead; they never time candidates.
pub fn row_kernel_ahead(t: &TuneTable, family: &str, info: &DeviceInfo, dtype: DType, n: usize) -> RowConfig {
    let elem = dtype.size_in_bytes();
    let heuristic = row_kernel(t, family, n, elem, 4);
    if !autotune_requested() {
        return heuristic;
    }
    let (key, cands) = row_kernel_key(t, family, family, info, dtype, n);
    autotuner().lookup(&key, &cands).and_then(|e| RowConfig::from_candidate(&e.winner, n, elem)).unwrap_or(heuristic)
}

/// The config [`tuned_elementwise`] returns for these arguments where it times nothing (see
/// [`row_kernel_ahead`]).
pub fn elementwise_ahead(
    t: &TuneTable,
    kernel: &str,
    info: &DeviceInfo,
    dtype: DType,
    items: usize,
) -> ElementwiseConfig {
    let heuristic = elementwise_for(t, kernel);
    if !autotune_requested() {
        return heuristic;
    }
    let (key, cands) = elementwise_key(t, kernel, info, dtype, items);
    match autotuner().lookup(&key, &cands) {
        Some(e) if !e.winner.is_empty() => ElementwiseConfig::from_candidate(&e.winner),
        _ => heuristic,
    }
}

/// The autotuner's key and candidates for elementwise kernel `kernel` over `items` items.
fn elementwise_key(
    t: &TuneTable,
    kernel: &str,
    info: &DeviceInfo,
    dtype: DType,
    items: usize,
) -> (TuneKey, Vec<TuneConfig>) {
    (
        tune_key(kernel, dtype, &format!("items={}", items.next_power_of_two()), info),
        elementwise_candidates(t, kernel).to_vec(),
    )
}

/// An elementwise config chosen by the autotuner when asked for (per power-of-two bucket of
/// `items`), else by [`elementwise`].
pub fn tuned_elementwise(
    t: &TuneTable,
    kernel: &str,
    info: &DeviceInfo,
    dtype: DType,
    items: usize,
    mut bench: impl FnMut(ElementwiseConfig) -> Result<f64>,
) -> ElementwiseConfig {
    let heuristic = elementwise_for(t, kernel);
    if !autotune_requested() {
        return heuristic;
    }
    let (key, cands) = elementwise_key(t, kernel, info, dtype, items);
    let chosen = autotuner().select(&key, &cands, |c| bench(ElementwiseConfig::from_candidate(c)), TuneConfig::new);
    if chosen.is_empty() { heuristic } else { ElementwiseConfig::from_candidate(&chosen) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acme() -> VendorInfo {
        VendorInfo::new("acme-tune-test", "acme", "acme-smi").arch_map(&[("gfx94", "cdna3"), ("gfx90", "cdna2")])
    }

    static ACME: TuneConfigs = TuneConfigs::new(
        acme,
        TuneFile { path: "acme/tune_configs.toml", text: "[[softmax]]\nblock = 64\nvec_bytes = 8\nmax_row_vecs = 2\n" },
        &[(
            "cdna3",
            TuneFile { path: "acme/cdna3/tune_configs.toml", text: "[[norm]]\nblock = 1024\nvec_bytes = 16\n" },
        )],
    );

    /// The warm-up runs the candidate for its whole time on a first measurement and after a
    /// pause, not on one that follows another at once; the timed runs follow it either way.
    #[test]
    fn measurements_warm_up_after_a_pause_only() {
        let warm = WarmUp::new();
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let run = || {
            runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(2));
            Ok(())
        };
        let count = || runs.swap(0, std::sync::atomic::Ordering::Relaxed);
        let warm_up = std::time::Duration::from_millis(100);
        let t0 = std::time::Instant::now();
        let secs = warm.measure(Device::CPU, &run, warm_up).unwrap();
        assert!(t0.elapsed() >= warm_up, "{:?}", t0.elapsed());
        assert!((0.002..0.5).contains(&secs), "{secs}");
        // The untimed first run, at least 100 ms / (2 ms + scheduling) of warm-up, three timed.
        let first = count();
        assert!(first >= 4 + 10, "{first} runs");
        // Right after: no warm-up.
        warm.measure(Device::CPU, &run, warm_up).unwrap();
        assert_eq!(count(), 4);
        // After a pause: the warm-up again.
        std::thread::sleep(WarmUp::IDLE + std::time::Duration::from_millis(50));
        warm.measure(Device::CPU, &run, warm_up).unwrap();
        assert!(count() >= 4 + 10);
    }

    #[test]
    fn family_over_vendor_over_gpu_defaults() {
        let mi300 = ACME.table("gfx942");
        let mi200 = ACME.table("gfx90a");
        // The family file replaces norm on cdna3 only.
        assert_eq!(mi300.configs("norm").len(), 1);
        assert_eq!(int(&mi300.configs("norm")[0], "block", 0), 1024);
        assert_eq!(mi200.configs("norm").len(), 4, "cdna2 keeps the GPU defaults");
        // The vendor file replaces softmax everywhere; elementwise stays the default.
        for t in [&mi300, &mi200] {
            assert_eq!(t.configs("softmax").len(), 1);
            assert_eq!(int(&t.configs("softmax")[0], "block", 0), 64);
            assert_eq!(t.configs("elementwise").len(), 9);
        }
        assert!(ACME.files().count() == 3);
        assert!(Arc::ptr_eq(&ACME.table("gfx942"), &mi300), "parsed once per arch");
    }

    #[test]
    fn rows_fit_in_registers_when_they_can() {
        let t = ACME.table("gfx90a");
        // 8192 bf16 = 1024 vectors of 16 bytes.
        let r = row_kernel(&t, "norm", 8192, 2, 4);
        assert!(r.fused() && r.row_vecs <= 4, "{r:?}");
        assert!((r.block * r.row_vecs * 8) as usize >= 8192);
        // An odd length cannot be vectorised: the two-pass path.
        assert_eq!(row_kernel(&t, "norm", 4097, 2, 4).row_vecs, 0);
        // Longer than 1024 threads x 8 vectors x 8 elements.
        assert_eq!(row_kernel(&t, "norm", 1 << 17, 2, 4).row_vecs, 0);
        // A tiny row still gets a block.
        assert_eq!(row_kernel(&t, "norm", 8, 4, 4).row_vecs, 1);
        assert_eq!(elementwise(&t), ElementwiseConfig { block: 128, unroll: 1, vec_bytes: 16 });
    }

    #[test]
    fn an_op_list_replaces_the_shared_elementwise_list_for_that_op_only() {
        let t = TuneTable::parse(
            "[[elementwise]]\nblock = 256\nunroll = 1\n[[elementwise]]\nblock = 512\nunroll = 2\n\
             [[gelu]]\nblock = 128\nunroll = 1\n",
            "test.toml",
        )
        .unwrap();
        assert_eq!(elementwise_for(&t, "gelu"), ElementwiseConfig { block: 128, unroll: 1, vec_bytes: 16 });
        assert_eq!(elementwise_candidates(&t, "gelu").len(), 1);
        assert_eq!(elementwise_for(&t, "swiglu"), ElementwiseConfig { block: 256, unroll: 1, vec_bytes: 16 });
        assert_eq!(elementwise_candidates(&t, "swiglu").len(), 2);
        assert_eq!(elementwise(&t), elementwise_for(&t, "dgelu"));
    }

    #[test]
    fn a_named_row_kernel_takes_its_own_list_where_the_table_has_one() {
        if autotune_requested() {
            return; // the heuristic is what this checks
        }
        let info = DeviceInfo::basic(Device::CPU, "Acme X1".into(), "gfx942".into());
        let shared = "[[softmax]]\nblock = 256\nvec_bytes = 16\nmax_row_vecs = 8\n";
        let own = format!("{shared}[[softmax_bwd]]\nblock = 512\nvec_bytes = 16\nmax_row_vecs = 8\n");
        let pick = |text: &str| {
            let t = TuneTable::parse(text, "test.toml").unwrap();
            let r = tuned_row_kernel_as(&t, "softmax", "softmax_bwd", &info, DType::BF16, 8192, |_| unreachable!());
            (r.block, r.row_vecs)
        };
        assert_eq!(pick(&own), (512, 2));
        assert_eq!(pick(shared), (256, 4));
    }

    #[test]
    fn an_input_is_held_in_l2_from_its_threshold_and_released_over_its_last_mib() {
        let t = |text: &'static str| TuneTable::parse(text, "test.toml").unwrap();
        let both = t("[[rope_l2]]\nkeep_min_mib = 128\nrelease_last_mib = 64\n");
        // 16384 rows of 8 KiB (128 MiB): kept, the last 64 MiB (8192 rows) released.
        assert_eq!(l2_keep(&both, "rope_l2", 16384, 8192), Some(8192));
        // One row short of the threshold: plain loads.
        assert_eq!(l2_keep(&both, "rope_l2", 16383, 8192), None);
        // Rows of 1 MiB: the last 64 released; fewer rows than the released span: every row;
        // an empty row: nothing kept.
        assert_eq!(l2_keep(&both, "rope_l2", 20000, 1 << 20), Some(19936));
        let low = t("[[rope_l2]]\nkeep_min_mib = 1\nrelease_last_mib = 64\n");
        assert_eq!(l2_keep(&low, "rope_l2", 10, 1 << 20), Some(0));
        assert_eq!(l2_keep(&both, "rope_l2", 100, 0), None);
        // Another entry's name, no threshold or a zero one: never kept; no release span: every row.
        assert_eq!(l2_keep(&both, "norm_fwd_l2", 1 << 20, 8192), None);
        assert_eq!(l2_keep(&t("[[rope_l2]]\nrelease_last_mib = 64\n"), "rope_l2", 1 << 20, 8192), None);
        assert_eq!(l2_keep(&t("[[rope_l2]]\nkeep_min_mib = 0\n"), "rope_l2", 1 << 20, 8192), None);
        assert_eq!(l2_keep(&t("[[rope_l2]]\nkeep_min_mib = 1\n"), "rope_l2", 1 << 20, 8192), Some(0));
    }

    #[test]
    fn the_norm_backward_ring_fits_two_blocks_or_is_not_used() {
        let t = |text: &'static str| TuneTable::parse(text, "test.toml").unwrap();
        let three = t("[[norm_bwd]]\nstages = 3\n");
        // An H100's 227 KiB a block: rows of 8192 bf16 x and dy are 32 KiB a stage.
        assert_eq!(norm_bwd_stages(&three, 232_448, 32 << 10, 2), 3);
        // 48 KiB stages (f32 x): two fit in half the memory, not three.
        assert_eq!(norm_bwd_stages(&three, 232_448, 48 << 10, 2), 2);
        // 64 KiB stages: one would fit, and one is no ring; one block an SM holds three.
        assert_eq!(norm_bwd_stages(&three, 232_448, 64 << 10, 2), 0);
        assert_eq!(norm_bwd_stages(&three, 232_448, 64 << 10, 1), 3);
        // A 64 KiB device (HIP's LDS) holds two 8 KiB stages, but not three of 12 KiB.
        assert_eq!(norm_bwd_stages(&three, 65_536, 8 << 10, 2), 3);
        assert_eq!(norm_bwd_stages(&three, 65_536, 12 << 10, 2), 2);
        // Not asked for (the GPU defaults), below 2, or an empty row.
        assert_eq!(norm_bwd_stages(&t(""), 232_448, 32 << 10, 2), 0);
        assert_eq!(norm_bwd_stages(&t("[[norm_bwd]]\nstages = 1\n"), 232_448, 32 << 10, 2), 0);
        assert_eq!(norm_bwd_stages(&three, 232_448, 0, 2), 0);
        // Vectors a thread: 2 unless set, at most 8; blocks an SM: threads_per_sm threads'
        // worth (1024 unless set, 32 to 2048), at least one.
        assert_eq!(norm_bwd_ring_vecs(&three), 2);
        assert_eq!(norm_bwd_ring_vecs(&t("[[norm_bwd]]\nstages = 4\nrow_vecs = 1\n")), 1);
        assert_eq!(norm_bwd_ring_vecs(&t("[[norm_bwd]]\nrow_vecs = 99\n")), 8);
        assert_eq!(norm_bwd_threads_per_sm(&three), 1024);
        assert_eq!(norm_bwd_threads_per_sm(&t("[[norm_bwd]]\nthreads_per_sm = 512\n")), 512);
        assert_eq!(norm_bwd_threads_per_sm(&t("[[norm_bwd]]\nthreads_per_sm = 0\n")), 32);
        assert_eq!(norm_bwd_threads_per_sm(&t("[[norm_bwd]]\nthreads_per_sm = 99999\n")), 2048);
        let per_sm = |block| norm_bwd_blocks_per_sm(block, 1024);
        assert_eq!((per_sm(1024), per_sm(512), per_sm(256)), (1, 2, 4));
        assert_eq!((norm_bwd_blocks_per_sm(512, 512), norm_bwd_blocks_per_sm(1024, 512)), (1, 1));
    }

    #[test]
    fn tune_keys_hold_the_device_name_arch_and_driver() {
        let mut info = DeviceInfo::basic(Device::CPU, "Acme X1".into(), "gfx942".into());
        info.driver_version = "6.2".into();
        let k = tune_key("norm", DType::BF16, "n=4096", &info);
        assert_eq!((k.device.as_str(), k.arch.as_str(), k.driver.as_str()), ("Acme X1", "gfx942", "6.2"));
    }
}
