//! Tune configs (FlagGems' `tune_configs.yaml`, in TOML) and the on-disk autotune cache.
//!
//! A backend embeds `tune_configs.toml` and per-arch overrides (`hopper/tune_configs.toml`).
//! Each top-level array of tables is one kernel's candidate list. An entry is either one
//! literal config, or `gen = true` with lists that expand to their cartesian product
//! (optionally renamed through `param_map = { PARAM = "list_key" }`):
//!
//! ```
//! use tefl_core::tuning::TuneTable;
//! let t = TuneTable::parse(r#"
//!     [[rmsnorm]]
//!     block = 128
//!     vec = 4
//!
//!     [[rmsnorm]]
//!     gen = true
//!     param_map = { block = "blocks" }
//!     blocks = [256, 512]
//!     vec = [4, 8]
//! "#, "example")?;
//! assert_eq!(t.configs("rmsnorm").len(), 5);
//! # Ok::<(), tefl_core::Error>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::{DType, Error, Result};

/// One value of a tune parameter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TuneValue {
    /// An integer (block sizes, vector widths, stages).
    Int(i64),
    /// A flag.
    Bool(bool),
    /// A name.
    Str(String),
}

impl TuneValue {
    /// The integer, if it is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            TuneValue::Int(i) => Some(*i),
            _ => None,
        }
    }
}

impl std::fmt::Display for TuneValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TuneValue::Int(i) => write!(f, "{i}"),
            TuneValue::Bool(b) => write!(f, "{b}"),
            TuneValue::Str(s) => write!(f, "{s}"),
        }
    }
}

/// One candidate configuration: parameter name → value (sorted, so it is canonical).
pub type TuneConfig = BTreeMap<String, TuneValue>;

/// Candidate configs per kernel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TuneTable {
    kernels: BTreeMap<String, Vec<TuneConfig>>,
}

fn scalar(origin: &str, kernel: &str, key: &str, v: &toml::Value) -> Result<TuneValue> {
    match v {
        toml::Value::Integer(i) => Ok(TuneValue::Int(*i)),
        toml::Value::Boolean(b) => Ok(TuneValue::Bool(*b)),
        toml::Value::String(s) => Ok(TuneValue::Str(s.clone())),
        other => Err(Error::Tuning(format!(
            "{origin}: kernel '{kernel}', key '{key}': expected an integer, boolean or string, got {}",
            other.type_str()
        ))),
    }
}

impl TuneTable {
    /// Parses one TOML file; `origin` names it in errors.
    pub fn parse(src: &str, origin: &str) -> Result<Self> {
        let root: toml::Table = src.parse().map_err(|e| Error::Tuning(format!("{origin}: {e}")))?;
        let mut kernels = BTreeMap::new();
        for (kernel, entries) in root {
            let toml::Value::Array(entries) = entries else {
                return Err(Error::Tuning(format!("{origin}: '{kernel}' must be an array of tables ([[{kernel}]])")));
            };
            let mut configs = Vec::new();
            for entry in entries {
                let toml::Value::Table(t) = entry else {
                    return Err(Error::Tuning(format!("{origin}: '{kernel}' entries must be tables")));
                };
                configs.extend(Self::expand(origin, &kernel, &t)?);
            }
            kernels.insert(kernel, configs);
        }
        Ok(TuneTable { kernels })
    }

    fn expand(origin: &str, kernel: &str, t: &toml::Table) -> Result<Vec<TuneConfig>> {
        let gen_on = match t.get("gen") {
            None => false,
            Some(toml::Value::Boolean(b)) => *b,
            Some(_) => return Err(Error::Tuning(format!("{origin}: kernel '{kernel}': 'gen' must be true or false"))),
        };
        if !gen_on {
            if t.contains_key("param_map") {
                return Err(Error::Tuning(format!("{origin}: kernel '{kernel}': 'param_map' needs 'gen = true'")));
            }
            let mut c = TuneConfig::new();
            for (k, v) in t.iter().filter(|(k, _)| *k != "gen") {
                c.insert(k.clone(), scalar(origin, kernel, k, v)?);
            }
            return Ok(vec![c]);
        }
        // key in the table -> parameter name
        let mut rename: HashMap<String, String> = HashMap::new();
        if let Some(pm) = t.get("param_map") {
            let toml::Value::Table(pm) = pm else {
                return Err(Error::Tuning(format!("{origin}: kernel '{kernel}': 'param_map' must be a table")));
            };
            for (param, list_key) in pm {
                let toml::Value::String(list_key) = list_key else {
                    return Err(Error::Tuning(format!(
                        "{origin}: kernel '{kernel}': param_map.{param} must name a list key"
                    )));
                };
                if !t.contains_key(list_key) {
                    return Err(Error::Tuning(format!(
                        "{origin}: kernel '{kernel}': param_map.{param} names '{list_key}', which is not in the entry"
                    )));
                }
                rename.insert(list_key.clone(), param.clone());
            }
        }
        let mut axes: Vec<(String, Vec<TuneValue>)> = Vec::new();
        for (k, v) in t.iter().filter(|(k, _)| *k != "gen" && *k != "param_map") {
            let name = rename.get(k).cloned().unwrap_or_else(|| k.clone());
            let values = match v {
                toml::Value::Array(a) => a.iter().map(|x| scalar(origin, kernel, k, x)).collect::<Result<Vec<_>>>()?,
                x => vec![scalar(origin, kernel, k, x)?],
            };
            if values.is_empty() {
                return Err(Error::Tuning(format!("{origin}: kernel '{kernel}': list '{k}' is empty")));
            }
            axes.push((name, values));
        }
        let mut out = vec![TuneConfig::new()];
        for (name, values) in &axes {
            out = out
                .into_iter()
                .flat_map(|c| {
                    values.iter().map(move |v| {
                        let mut c = c.clone();
                        c.insert(name.clone(), v.clone());
                        c
                    })
                })
                .collect();
        }
        Ok(out)
    }

    /// The candidates of `kernel` (empty when the table does not define it).
    pub fn configs(&self, kernel: &str) -> &[TuneConfig] {
        self.kernels.get(kernel).map_or(&[], Vec::as_slice)
    }

    /// The kernels this table defines.
    pub fn kernels(&self) -> impl Iterator<Item = &str> {
        self.kernels.keys().map(String::as_str)
    }

    /// Layers tables per kernel: the arch file over the vendor file over built-in defaults.
    /// A kernel defined in a higher layer replaces that kernel's whole list below it.
    pub fn layered(defaults: &TuneTable, vendor: Option<&TuneTable>, arch: Option<&TuneTable>) -> TuneTable {
        let mut kernels = defaults.kernels.clone();
        for layer in [vendor, arch].into_iter().flatten() {
            for (k, v) in &layer.kernels {
                kernels.insert(k.clone(), v.clone());
            }
        }
        TuneTable { kernels }
    }
}

/// What an autotune result is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TuneKey {
    /// The kernel name.
    pub kernel: String,
    /// Its dtype.
    pub dtype: String,
    /// The shape bucket (a backend heuristic maps shapes to buckets, e.g. `n<=4096`).
    pub shape_bucket: String,
    /// The device name.
    pub device: String,
    /// The arch (`sm_90`).
    pub arch: String,
    /// The driver version.
    pub driver: String,
}

impl TuneKey {
    /// A key.
    pub fn new(kernel: &str, dtype: DType, shape_bucket: &str, device: &str, arch: &str, driver: &str) -> Self {
        TuneKey {
            kernel: kernel.into(),
            dtype: dtype.name().into(),
            shape_bucket: shape_bucket.into(),
            device: device.into(),
            arch: arch.into(),
            driver: driver.into(),
        }
    }
}

/// One candidate's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The candidate.
    pub config: TuneConfig,
    /// Median seconds, when it ran.
    pub seconds: Option<f64>,
    /// Why it could not run.
    pub error: Option<String>,
}

/// One cache file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutotuneEntry {
    /// File format version.
    pub format: u32,
    /// The key.
    pub key: TuneKey,
    /// Checksum of the candidate set the winner was chosen from.
    pub candidates_checksum: String,
    /// The fastest candidate.
    pub winner: TuneConfig,
    /// Every candidate's timing, for inspection.
    pub timings: Vec<Timing>,
}

const FORMAT: u32 = 1;

/// FNV-1a, 64 bits: a stable checksum for file names and candidate sets.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The checksum of a candidate set (order matters: it is the tuning order).
pub fn candidates_checksum(candidates: &[TuneConfig]) -> String {
    let json = serde_json::to_string(candidates).unwrap_or_default();
    format!("{:016x}", fnv1a64(json.as_bytes()))
}

/// The cache directory: `$TEFL_CACHE_DIR`, else `$XDG_CACHE_HOME/tefl`, else `~/.cache/tefl`
/// (read once, by [`crate::policy::env`]).
pub fn default_cache_dir() -> Result<PathBuf> {
    Ok(crate::policy::env().clone()?.cache_dir)
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` atomically: a unique temporary file in the same folder, synced,
/// then renamed over the target (readers see the old file or the new one, never a mix).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e: std::io::Error, p: &Path| Error::Io { path: p.display().to_string(), reason: e.to_string() };
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| io(e, dir))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("entry");
    let tmp = dir.join(format!(".{name}.tmp.{}.{}", std::process::id(), TMP_COUNTER.fetch_add(1, Ordering::Relaxed)));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(io(e, path));
    }
    Ok(())
}

/// The autotuner and its on-disk cache.
pub struct Autotuner {
    dir: PathBuf,
    enabled: bool,
    memo: Mutex<HashMap<TuneKey, TuneConfig>>,
}

impl Autotuner {
    /// An autotuner caching under `dir`; `enabled = false` means heuristics only.
    pub fn new(dir: impl Into<PathBuf>, enabled: bool) -> Self {
        Autotuner { dir: dir.into(), enabled, memo: Mutex::new(HashMap::new()) }
    }

    /// The autotuner the environment describes (`TEFL_CACHE_DIR`; measuring only with
    /// `TEFL_AUTOTUNE=1`, see [`crate::policy::EnvConfig::autotune`]).
    pub fn from_env() -> Result<Self> {
        let env = crate::policy::env().clone()?;
        Ok(Autotuner::new(env.cache_dir, env.autotune))
    }

    /// Whether tuning runs (`TEFL_AUTOTUNE=1`).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Where the entry for `key` lives.
    pub fn path_for(&self, key: &TuneKey) -> PathBuf {
        let json = serde_json::to_string(key).unwrap_or_default();
        let kernel: String =
            key.kernel.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '-' }).collect();
        self.dir.join("autotune").join(kernel).join(format!("{:016x}.json", fnv1a64(json.as_bytes())))
    }

    /// The cached entry for `key`, if present, readable and made from the same candidate set.
    pub fn lookup(&self, key: &TuneKey, candidates: &[TuneConfig]) -> Option<AutotuneEntry> {
        let bytes = fs::read(self.path_for(key)).ok()?;
        let entry: AutotuneEntry = serde_json::from_slice(&bytes).ok()?;
        (entry.format == FORMAT && entry.key == *key && entry.candidates_checksum == candidates_checksum(candidates))
            .then_some(entry)
    }

    /// The config to use for `key`: the memoised or cached winner; else, when tuning is on,
    /// times every candidate with `bench` (seconds; an error skips that candidate), stores all
    /// timings and returns the fastest; else (or when nothing ran) the `heuristic`'s choice.
    pub fn select(
        &self,
        key: &TuneKey,
        candidates: &[TuneConfig],
        mut bench: impl FnMut(&TuneConfig) -> Result<f64>,
        heuristic: impl FnOnce() -> TuneConfig,
    ) -> TuneConfig {
        if !self.enabled || candidates.is_empty() {
            return heuristic();
        }
        if let Some(c) = self.memo.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
            return c.clone();
        }
        let winner = match self.lookup(key, candidates) {
            Some(e) => e.winner,
            None => {
                let timings: Vec<Timing> = candidates
                    .iter()
                    .map(|c| match bench(c) {
                        Ok(s) if s.is_finite() => Timing { config: c.clone(), seconds: Some(s), error: None },
                        Ok(s) => {
                            Timing { config: c.clone(), seconds: None, error: Some(format!("non-finite time {s}")) }
                        }
                        Err(e) => Timing { config: c.clone(), seconds: None, error: Some(e.to_string()) },
                    })
                    .collect();
                let best = timings
                    .iter()
                    .filter_map(|t| t.seconds.map(|s| (s, &t.config)))
                    .min_by(|a, b| a.0.total_cmp(&b.0))
                    .map(|(_, c)| c.clone());
                let Some(best) = best else {
                    tracing::warn!(target: "TE-FL", "Autotune of '{}' ran no candidate; using heuristics", key.kernel);
                    return heuristic();
                };
                let entry = AutotuneEntry {
                    format: FORMAT,
                    key: key.clone(),
                    candidates_checksum: candidates_checksum(candidates),
                    winner: best.clone(),
                    timings,
                };
                let json = serde_json::to_vec_pretty(&entry).unwrap_or_default();
                if let Err(e) = write_atomic(&self.path_for(key), &json) {
                    tracing::warn!(target: "TE-FL", "Autotune cache not written: {e}");
                }
                best
            }
        };
        self.memo.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), winner.clone());
        winner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, i64)]) -> TuneConfig {
        pairs.iter().map(|(k, v)| (k.to_string(), TuneValue::Int(*v))).collect()
    }

    #[test]
    fn gen_expands_cartesian_product() {
        let t = TuneTable::parse(
            r#"
            [[norm]]
            gen = true
            param_map = { BLOCK = "blocks" }
            blocks = [128, 256, 512]
            vec = [4, 8]
            warps = 4
            "#,
            "t",
        )
        .unwrap();
        let c = t.configs("norm");
        assert_eq!(c.len(), 6);
        assert_eq!(c[0], cfg(&[("BLOCK", 128), ("vec", 4), ("warps", 4)]));
        assert_eq!(c[5], cfg(&[("BLOCK", 512), ("vec", 8), ("warps", 4)]));
    }

    #[test]
    fn errors_name_the_place() {
        for (src, needle) in [
            ("norm = 3", "array of tables"),
            ("[[norm]]\nx = 1.5", "key 'x'"),
            ("[[norm]]\ngen = true\nparam_map = { B = \"nope\" }\nb = [1]", "nope"),
            ("[[norm]]\ngen = true\nb = []", "empty"),
            ("[[norm]]\nparam_map = { B = \"b\" }\nb = 1", "gen = true"),
            ("[[norm", "t:"),
        ] {
            let e = TuneTable::parse(src, "t").unwrap_err().to_string();
            assert!(e.contains(needle), "{src:?}: {e}");
        }
    }

    #[test]
    fn arch_over_vendor_over_defaults() {
        let d = TuneTable::parse("[[a]]\nx = 1\n[[b]]\nx = 1\n[[c]]\nx = 1", "d").unwrap();
        let v = TuneTable::parse("[[b]]\nx = 2\n[[c]]\nx = 2", "v").unwrap();
        let h = TuneTable::parse("[[c]]\nx = 3\n[[c]]\nx = 4", "h").unwrap();
        let t = TuneTable::layered(&d, Some(&v), Some(&h));
        assert_eq!(t.configs("a"), &[cfg(&[("x", 1)])]);
        assert_eq!(t.configs("b"), &[cfg(&[("x", 2)])]);
        assert_eq!(t.configs("c"), &[cfg(&[("x", 3)]), cfg(&[("x", 4)])]);
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("tefl-tune-{tag}-{}-{}", std::process::id(), fnv1a64(tag.as_bytes())));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn autotune_times_caches_and_invalidates() {
        let dir = tmpdir("cache");
        let key = TuneKey::new("norm", DType::BF16, "n<=8192", "H100", "sm_90", "580");
        let cands = vec![cfg(&[("b", 1)]), cfg(&[("b", 2)]), cfg(&[("b", 3)])];
        let mut runs = 0;
        let t = Autotuner::new(&dir, true);
        let w = t.select(
            &key,
            &cands,
            |c| {
                runs += 1;
                match c["b"].as_int() {
                    Some(2) => Ok(1.0),
                    Some(3) => Err(Error::Tuning("too big".into())),
                    _ => Ok(2.0),
                }
            },
            || cfg(&[("b", 9)]),
        );
        assert_eq!(w, cfg(&[("b", 2)]));
        assert_eq!(runs, 3);
        let entry = t.lookup(&key, &cands).unwrap();
        assert_eq!(entry.timings.len(), 3);
        assert!(entry.timings[2].error.as_deref().unwrap().contains("too big"));
        // A new process (new tuner) reads the file without timing anything.
        let t2 = Autotuner::new(&dir, true);
        let w2 = t2.select(&key, &cands, |_| panic!("must not time"), || cfg(&[("b", 9)]));
        assert_eq!(w2, w);
        // A changed candidate set invalidates the entry.
        let cands2 = vec![cfg(&[("b", 1)]), cfg(&[("b", 4)])];
        assert!(t2.lookup(&key, &cands2).is_none());
        let w3 = Autotuner::new(&dir, true).select(&key, &cands2, |c| Ok(c["b"].as_int().unwrap() as f64), || cfg(&[]));
        assert_eq!(w3, cfg(&[("b", 1)]));
        // Disabled: heuristics, no timing.
        let w4 = Autotuner::new(&dir, false).select(&key, &cands, |_| panic!("disabled"), || cfg(&[("b", 7)]));
        assert_eq!(w4, cfg(&[("b", 7)]));
        // No leftover temporary files.
        let folder = t.path_for(&key).parent().unwrap().to_path_buf();
        let names: Vec<_> = fs::read_dir(folder).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn corrupt_cache_entries_are_retuned() {
        let dir = tmpdir("corrupt");
        let key = TuneKey::new("k", DType::F32, "all", "dev", "arch", "drv");
        let cands = vec![cfg(&[("b", 1)])];
        let t = Autotuner::new(&dir, true);
        write_atomic(&t.path_for(&key), b"{ not json").unwrap();
        assert!(t.lookup(&key, &cands).is_none());
        assert_eq!(t.select(&key, &cands, |_| Ok(1.0), TuneConfig::new), cands[0]);
        assert!(t.lookup(&key, &cands).is_some());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn concurrent_writers_leave_a_valid_file() {
        let dir = tmpdir("race");
        let path = dir.join("x.json");
        std::thread::scope(|s| {
            for i in 0..8 {
                let p = path.clone();
                s.spawn(move || {
                    for j in 0..50 {
                        write_atomic(&p, format!("{{\"writer\": {i}, \"n\": {j}}}").as_bytes()).unwrap();
                    }
                });
            }
        });
        let v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["n"], 49);
        let _ = fs::remove_dir_all(&dir);
    }
}
