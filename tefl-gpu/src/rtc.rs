//! Run-time compilation: the [`RtcCompiler`] a backend binds (NVRTC, hiprtc), the on-disk
//! binary cache (`$TEFL_CACHE_DIR/<compiler>/`, keyed by the full source text with its
//! defines, the options, the arch and the compiler's version) and the in-memory cache of
//! modules loaded per device.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use tefl_core::tuning::{fnv1a64, write_atomic};
use tefl_core::{Error, Result};
use tefl_kernels::Target;

use crate::variant::{Defines, Variant, full_source};

/// A run-time compiler of kernel sources into device binaries (cubin, code object).
pub trait RtcCompiler: Send + Sync {
    /// The target whose prelude the sources get.
    fn target(&self) -> Target;
    /// The compiler's name (cache folder, messages): `nvrtc`, `hiprtc`.
    fn name(&self) -> &'static str;
    /// The device kind errors name (`cuda`, `hip`).
    fn device_kind(&self) -> &'static str;
    /// Whether the compiler's library loads (checked before any other call).
    fn available(&self) -> std::result::Result<(), String>;
    /// The compiler's version (part of the cache key: an upgrade compiles again).
    fn version(&self) -> Result<String>;
    /// The options for `arch` (`sm_90`, `gfx942`).
    fn options(&self, arch: &str) -> Vec<String>;
    /// The extension of cached binaries (`cubin`, `hsaco`).
    fn binary_extension(&self) -> &'static str;
    /// Compiles the full text of `file_name`, a program of `kernels` entry points, with
    /// `options` into a binary, or the compiler's log when it fails.
    fn compile_text(
        &self,
        text: &str,
        file_name: &str,
        options: &[String],
        kernels: usize,
    ) -> std::result::Result<Vec<u8>, String>;
    /// Whether two threads may compile at once ([`compile_ahead`] compiles on its own thread
    /// only then). No by default: hiprtc (ROCm 5.2) corrupts its heap when they do.
    fn compiles_concurrently(&self) -> bool {
        false
    }
}

fn compile_error(c: &dyn RtcCompiler, v: &Variant, log: String) -> Error {
    Error::DeviceFailure {
        device: c.device_kind().into(),
        reason: format!("{} could not compile {} ({}): {log}", c.name(), v.source.name, v.source.path),
    }
}

/// Compiles `variant` for `arch`, without a cache.
pub fn compile(c: &dyn RtcCompiler, variant: &Variant, arch: &str) -> Result<Vec<u8>> {
    c.available().map_err(|reason| Error::DeviceUnavailable { device: c.device_kind().into(), reason })?;
    if !variant.source.supports(c.target()) {
        return Err(compile_error(c, variant, format!("the source has no {} version", c.target().name())));
    }
    let text = full_source(c.target(), variant);
    c.compile_text(&text, variant.source.path, &c.options(arch), variant.entries.len())
        .map_err(|log| compile_error(c, variant, log))
}

/// Which part of a compile test's programs this process builds ([`compile_shard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This process's part, `0..count`.
    pub index: usize,
    /// How many processes share the programs.
    pub count: usize,
}

impl Shard {
    /// Whether job `i` of the list is this shard's (round robin).
    pub fn owns(&self, i: usize) -> bool {
        i % self.count == self.index
    }
}

/// What [`compile_shard`] decided for this process.
#[derive(Debug)]
pub enum ShardRole {
    /// Build this shard's programs.
    Compile(Shard),
    /// Other processes built every program: their failures, empty when all passed.
    Spawned(Vec<String>),
}

/// Spreads the compile test `test` (its full libtest name) over one process per core (up to 8):
/// hiprtc (ROCm 5.2) corrupts its heap when two threads compile at once, so the test binary
/// runs itself again, once per shard (`TEFL_COMPILE_SHARD=i/n`, only `test`), and the parent
/// collects what each reports. A shard that does not report its one test passed is a failure,
/// and so is each line `stderr_failures` picks out of a shard's stderr: a compiler may write
/// there what its log lacks (NVRTC 13 with `--split-compile`: ptxas' advisories). A process
/// that is itself a shard, or one that cannot find its own executable, compiles (its part) in
/// place.
pub fn compile_shard(test: &str, stderr_failures: fn(&str) -> Vec<String>) -> ShardRole {
    if let Ok(v) = std::env::var("TEFL_COMPILE_SHARD") {
        let parsed = v.split_once('/').and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)));
        return match parsed {
            Some((index, count)) if index < count => ShardRole::Compile(Shard { index, count }),
            _ => ShardRole::Spawned(vec![format!("TEFL_COMPILE_SHARD={v:?}: expected i/n with i < n")]),
        };
    }
    // At most 8: each process holds a compiler of a few hundred MB.
    let count = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    // (One core: one shard, still its own process, so that its stderr is read.)
    let Ok(exe) = std::env::current_exe() else {
        return ShardRole::Compile(Shard { index: 0, count: 1 });
    };
    let outputs: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..count)
            .map(|index| {
                let exe = &exe;
                s.spawn(move || {
                    std::process::Command::new(exe)
                        .args([test, "--exact", "--nocapture", "--test-threads=1"])
                        .env("TEFL_COMPILE_SHARD", format!("{index}/{count}"))
                        .output()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut failures = Vec::new();
    for (index, out) in outputs.into_iter().enumerate() {
        match out {
            Ok(Ok(o)) => {
                let stdout = String::from_utf8_lossy(&o.stdout);
                let stderr = String::from_utf8_lossy(&o.stderr);
                if !o.status.success() || !stdout.contains("test result: ok. 1 passed") {
                    failures.push(format!("shard {index}/{count} ({}):\n{stdout}\n{stderr}", o.status));
                }
                failures.extend(stderr_failures(&stderr).into_iter().map(|f| format!("shard {index}/{count}: {f}")));
            }
            Ok(Err(e)) => failures.push(format!("shard {index}/{count}: could not run {}: {e}", exe.display())),
            Err(_) => failures.push(format!("shard {index}/{count}: its waiting thread panicked")),
        }
    }
    ShardRole::Spawned(failures)
}

/// Every other variant of each source (the first, third, ... of each `Source::name` in list
/// order), as a mask over `variants`: what a compile test builds for a second target of the
/// same code (the CUDA test's sm_80, the HIP test's gfx908), so that each source still meets
/// that target's compiler at about half the cost.
pub fn every_other_of_each_source(variants: &[Variant]) -> Vec<bool> {
    let mut nth = std::collections::HashMap::new();
    variants
        .iter()
        .map(|v| {
            let i = nth.entry(v.source.name).or_insert(0usize);
            *i += 1;
            *i % 2 == 1
        })
        .collect()
}

/// The cache key of a compilation: full source (prelude, defines, headers), options, arch,
/// compiler name and version.
pub fn cache_key(c: &dyn RtcCompiler, variant: &Variant, arch: &str, version: &str) -> u64 {
    let mut bytes = full_source(c.target(), variant).into_bytes();
    bytes.extend(c.options(arch).join(" ").bytes());
    bytes.extend(format!("|{arch}|{} {version}", c.name()).bytes());
    fnv1a64(&bytes)
}

/// Where `c`'s binaries are cached (`$TEFL_CACHE_DIR/<compiler>`).
pub fn cache_dir(c: &dyn RtcCompiler) -> Result<PathBuf> {
    Ok(tefl_core::tuning::default_cache_dir()?.join(c.name()))
}

/// Where a compile's binary is cached on disk for `arch`.
fn cached_path(c: &dyn RtcCompiler, variant: &Variant, arch: &str, key: u64) -> Result<PathBuf> {
    cache_dir(c).map(|d| d.join(format!("{}-{arch}-{key:016x}.{}", variant.source.name, c.binary_extension())))
}

fn read_cached(path: &Result<PathBuf>) -> Option<Vec<u8>> {
    let p = path.as_ref().ok()?;
    let bytes = std::fs::read(p).ok().filter(|b| !b.is_empty())?;
    tracing::debug!(target: "TE-FL", "kernel cache hit {}", p.display());
    Some(bytes)
}

/// Compiles `variant` and stores the binary at `path` (atomically; a cache that cannot be
/// written only costs a warning).
fn compile_and_store(c: &dyn RtcCompiler, variant: &Variant, arch: &str, path: &Result<PathBuf>) -> Result<Vec<u8>> {
    let started = std::time::Instant::now();
    let binary = compile(c, variant, arch)?;
    tracing::info!(
        target: "TE-FL",
        "compiled kernel source {} for {arch} in {} ms",
        variant.source.name,
        started.elapsed().as_millis()
    );
    match path {
        Ok(p) => {
            if let Err(e) = write_atomic(p, &binary) {
                tracing::warn!(target: "TE-FL", "kernel cache not written: {e}");
            }
        }
        Err(e) => tracing::warn!(target: "TE-FL", "no kernel cache directory: {e}"),
    }
    Ok(binary)
}

/// One compile under way (or finished by [`compile_ahead`] and not yet taken), by cache key.
#[derive(Default)]
struct Slot {
    /// `None` while it runs; the binary, or `None` inside when it failed.
    done: Mutex<Option<Option<Vec<u8>>>>,
    finished: Condvar,
}

impl Slot {
    fn finish(&self, binary: Option<Vec<u8>>) {
        *lock(&self.done) = Some(binary);
        self.finished.notify_all();
    }

    /// The binary once the compile ends; `None` when it failed.
    fn wait(&self) -> Option<Vec<u8>> {
        let mut done = lock(&self.done);
        while done.is_none() {
            done = self.finished.wait(done).unwrap_or_else(|p| p.into_inner());
        }
        done.clone().flatten()
    }
}

/// The compiles of this process under way, and those [`compile_ahead`] finished that no
/// launch has taken yet.
fn slots() -> &'static Mutex<HashMap<u64, Arc<Slot>>> {
    static S: OnceLock<Mutex<HashMap<u64, Arc<Slot>>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What [`claim`] found for a key.
enum Claim {
    /// Another thread compiles the program, or has.
    Taken(Arc<Slot>),
    /// This thread now compiles it.
    Mine(Claimed),
}

/// A slot this thread compiles into: whatever happens, it is finished (dropped without a
/// binary, by a compile that unwound, it reads as failed), so that no thread waits forever.
struct Claimed {
    key: u64,
    slot: Arc<Slot>,
    finished: bool,
}

impl Claimed {
    /// Hands `binary` to the threads waiting for it; `keep`: leaves it in the table for a
    /// launch to come (a compile ahead), else removes the slot.
    fn finish(mut self, binary: Option<Vec<u8>>, keep: bool) {
        self.finished = true;
        self.slot.finish(binary);
        if !keep {
            release(self.key, &self.slot);
        }
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        if !self.finished {
            self.slot.finish(None);
            release(self.key, &self.slot);
        }
    }
}

/// The slot of `key`: another thread's, or a new one this thread now owns.
fn claim(key: u64) -> Claim {
    let mut slots = lock(slots());
    match slots.get(&key) {
        Some(slot) => Claim::Taken(slot.clone()),
        None => {
            let slot = Arc::new(Slot::default());
            slots.insert(key, slot.clone());
            Claim::Mine(Claimed { key, slot, finished: false })
        }
    }
}

/// Removes `slot` from the table if it is still `key`'s.
fn release(key: u64, slot: &Arc<Slot>) {
    let mut slots = lock(slots());
    if slots.get(&key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
        slots.remove(&key);
    }
}

/// Waits for the compile in `slot` (another thread's) and releases the slot: its binary, or
/// `None` when it failed.
fn take(key: u64, slot: &Arc<Slot>, variant: &Variant, arch: &str) -> Option<Vec<u8>> {
    let waited = std::time::Instant::now();
    let binary = slot.wait();
    release(key, slot);
    if binary.is_some() {
        tracing::debug!(
            target: "TE-FL",
            "kernel source {} for {arch} compiled on another thread (waited {} ms)",
            variant.source.name,
            waited.elapsed().as_millis()
        );
    }
    binary
}

/// Compiles through the on-disk cache: a hit reads the binary, a miss compiles and stores it
/// (atomically; a cache that cannot be written only costs a warning). A compile of the same
/// program already under way on another thread ([`compile_ahead`], or a launch racing this
/// one) is waited for instead of repeated.
pub fn compile_cached(c: &dyn RtcCompiler, variant: &Variant, arch: &str) -> Result<Vec<u8>> {
    let version = c.version()?;
    let key = cache_key(c, variant, arch, &version);
    let path = cached_path(c, variant, arch, key);
    // A compile under way on another thread, or finished ahead and not taken yet, first (its
    // slot is released either way).
    let pending = lock(slots()).get(&key).cloned();
    if let Some(slot) = pending
        && let Some(binary) = take(key, &slot, variant, arch)
    {
        return Ok(binary);
    }
    if let Some(bytes) = read_cached(&path) {
        return Ok(bytes);
    }
    match claim(key) {
        Claim::Taken(slot) => match take(key, &slot, variant, arch) {
            Some(binary) => Ok(binary),
            // It failed on the other thread: compile here, for this call's own error.
            None => compile_and_store(c, variant, arch, &path),
        },
        Claim::Mine(claimed) => {
            let result = compile_and_store(c, variant, arch, &path);
            claimed.finish(result.as_ref().ok().cloned(), false);
            result
        }
    }
}

/// The compiles [`compile_ahead`] has started and not finished: the process waits for them
/// when it exits, so that none is inside the compiler while its library is torn down.
fn running_ahead() -> &'static (Mutex<usize>, Condvar) {
    static R: OnceLock<(Mutex<usize>, Condvar)> = OnceLock::new();
    R.get_or_init(Default::default)
}

extern "C" fn wait_for_compiles_ahead() {
    let (count, idle) = running_ahead();
    let mut n = lock(count);
    while *n > 0 {
        n = idle.wait(n).unwrap_or_else(|p| p.into_inner());
    }
}

unsafe extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

/// Compiles `variant` for `arch` on a thread of its own, into the on-disk cache and for the
/// launch that will ask for it ([`compile_cached`] then takes the binary, or waits for it): an op
/// names the variants its later calls will need (a forward its backward's) so that their compile
/// overlaps this call's work. Nothing happens for a compiler that cannot compile on two threads
/// at once, with `TEFL_COMPILE_AHEAD=0`, for a binary already cached, or for one already being
/// compiled; a failure is only logged (the launch that needs the variant compiles it again and
/// reports the error).
pub fn compile_ahead(c: &'static dyn RtcCompiler, variant: Variant, arch: String) {
    let enabled = tefl_core::policy::env().as_ref().is_ok_and(|e| e.compile_ahead);
    if !enabled || !c.compiles_concurrently() || c.available().is_err() {
        return;
    }
    // Asking for the version loads the compiler's library here, before the exit hook is
    // registered: exit handlers run in reverse order, so the hook runs before the library's.
    let Ok(version) = c.version() else { return };
    static EXIT_HOOK: OnceLock<()> = OnceLock::new();
    EXIT_HOOK.get_or_init(|| {
        // SAFETY: registers a plain function that takes no arguments; it runs at process exit,
        // before the handlers of the compiler's library (loaded above), and only waits.
        let _ = unsafe { atexit(wait_for_compiles_ahead) };
    });
    let work = move || {
        let key = cache_key(c, &variant, &arch, &version);
        let path = cached_path(c, &variant, &arch, key);
        if path.as_ref().is_ok_and(|p| p.exists()) {
            return;
        }
        let Claim::Mine(claimed) = claim(key) else { return };
        match compile_and_store(c, &variant, &arch, &path) {
            // Left in the table for the launch that asks for it.
            Ok(binary) => claimed.finish(Some(binary), true),
            Err(e) => {
                tracing::debug!(target: "TE-FL", "compile ahead of {}: {e}", variant.source.name);
                claimed.finish(None, false);
            }
        }
    };
    *lock(&running_ahead().0) += 1;
    let running = RunningAhead;
    // A thread that cannot be spawned drops `running` with the closure.
    let _ = std::thread::Builder::new().name("tefl-compile-ahead".into()).spawn(move || {
        let _running = running;
        work();
    });
}

/// One compile counted in [`running_ahead`] until dropped (also when its thread unwinds).
struct RunningAhead;

impl Drop for RunningAhead {
    fn drop(&mut self) {
        let (count, idle) = running_ahead();
        let mut n = lock(count);
        *n = n.saturating_sub(1);
        idle.notify_all();
    }
}

/// Whether a device binary defines the kernel `entry` (its symbol table holds the name as a
/// NUL-terminated string): the compile test checks every variant's entry points this way.
pub fn binary_has_entry(binary: &[u8], entry: &str) -> bool {
    let needle: Vec<u8> = [&[0u8][..], entry.as_bytes(), &[0u8][..]].concat();
    binary.windows(needle.len()).any(|w| w == needle.as_slice())
}

/// The modules whose (device ordinal, source, defines) hash alike: almost always one.
type Bucket<M> = Vec<(u32, &'static str, Defines, Arc<M>)>;

/// Modules of type `M` loaded per (device ordinal, source, defines), each loaded once. Looked
/// up on every launch, so by a hash of the variant (no key string is built per call).
pub struct ModuleCache<M> {
    modules: Mutex<HashMap<u64, Bucket<M>>>,
    /// The variants [`ModuleCache::first_ahead`] has said yes to, by fingerprint.
    ahead: Mutex<HashSet<u64>>,
}

fn fingerprint(ordinal: u32, variant: &Variant) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ordinal.hash(&mut h);
    variant.source.name.hash(&mut h);
    variant.defines.hash(&mut h);
    h.finish()
}

fn find<M>(bucket: Option<&Bucket<M>>, ordinal: u32, variant: &Variant) -> Option<Arc<M>> {
    bucket?
        .iter()
        .find(|(o, name, d, _)| *o == ordinal && *name == variant.source.name && *d == variant.defines)
        .map(|e| e.3.clone())
}

impl<M> Default for ModuleCache<M> {
    fn default() -> Self {
        ModuleCache { modules: Mutex::new(HashMap::new()), ahead: Mutex::new(HashSet::new()) }
    }
}

impl<M> ModuleCache<M> {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The module of `variant` on device `ordinal`, loaded with `load` on first use. Two
    /// threads racing on a first use may both load; one module is kept.
    pub fn get_or_load(&self, ordinal: u32, variant: &Variant, load: impl FnOnce() -> Result<M>) -> Result<Arc<M>> {
        let key = fingerprint(ordinal, variant);
        if let Some(m) = find(self.lock().get(&key), ordinal, variant) {
            return Ok(m);
        }
        let m = Arc::new(load()?);
        let mut modules = self.lock();
        if let Some(kept) = find(modules.get(&key), ordinal, variant) {
            return Ok(kept);
        }
        modules.entry(key).or_default().push((ordinal, variant.source.name, variant.defines.clone(), m.clone()));
        Ok(m)
    }

    /// Whether `variant` should be compiled ahead for device `ordinal` ([`compile_ahead`]): yes
    /// the first time it is asked for a variant not loaded there, no after that (an op may name
    /// the same later variant on every call; this costs one hash). Two variants whose
    /// fingerprints collide only lose the second one's compile ahead.
    pub fn first_ahead(&self, ordinal: u32, variant: &Variant) -> bool {
        !self.contains(ordinal, variant) && lock(&self.ahead).insert(fingerprint(ordinal, variant))
    }

    /// Whether the module of `variant` is loaded on device `ordinal`.
    pub fn contains(&self, ordinal: u32, variant: &Variant) -> bool {
        find(self.lock().get(&fingerprint(ordinal, variant)), ordinal, variant).is_some()
    }

    /// How many modules are loaded.
    pub fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Bucket<M>>> {
        lock(&self.modules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variant::Defines;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn shards_split_the_jobs_round_robin() {
        let shards: Vec<_> = (0..3).map(|index| Shard { index, count: 3 }).collect();
        for i in 0..10 {
            assert_eq!(shards.iter().filter(|s| s.owns(i)).count(), 1, "job {i}");
        }
        assert!(shards[1].owns(4) && !shards[1].owns(5));
    }

    #[test]
    fn every_other_variant_of_each_source_is_sampled_from_its_first() {
        let of =
            |source: &'static tefl_kernels::Source, i: usize| Variant::new(source, &["k"], Defines::new().set("I", i));
        // Two sources interleaved: each keeps its own first, third, ... variant.
        let list = [
            of(&tefl_kernels::ROPE, 0),
            of(&tefl_kernels::NORM, 0),
            of(&tefl_kernels::NORM, 1),
            of(&tefl_kernels::ROPE, 1),
            of(&tefl_kernels::ROPE, 2),
            of(&tefl_kernels::NORM, 2),
            of(&tefl_kernels::SOFTMAX, 0),
        ];
        assert_eq!(every_other_of_each_source(&list), [true, true, false, false, true, true, true]);
        assert!(every_other_of_each_source(&[]).is_empty());
    }

    /// A compiler that "compiles" to the text's length after `delay_ms`, counts its calls, and
    /// may or may not compile on two threads at once.
    struct Counting {
        calls: AtomicUsize,
        delay_ms: u64,
        concurrent: bool,
    }

    impl Counting {
        const fn new(delay_ms: u64, concurrent: bool) -> Self {
            Counting { calls: AtomicUsize::new(0), delay_ms, concurrent }
        }
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    impl RtcCompiler for Counting {
        fn target(&self) -> Target {
            Target::Hip
        }
        fn name(&self) -> &'static str {
            "counting-rtc-test"
        }
        fn device_kind(&self) -> &'static str {
            "test"
        }
        fn available(&self) -> std::result::Result<(), String> {
            Ok(())
        }
        fn version(&self) -> Result<String> {
            Ok("1.0".into())
        }
        fn options(&self, arch: &str) -> Vec<String> {
            vec![format!("--arch={arch}")]
        }
        fn binary_extension(&self) -> &'static str {
            "bin"
        }
        fn compile_text(&self, text: &str, _: &str, _: &[String], _: usize) -> std::result::Result<Vec<u8>, String> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(self.delay_ms));
            assert!(!text.contains("#define PANIC 1"), "the test compiler unwinds");
            if text.contains("#define FAIL 1") {
                Err("error: FAIL".into())
            } else {
                Ok(text.len().to_le_bytes().to_vec())
            }
        }
        fn compiles_concurrently(&self) -> bool {
            self.concurrent
        }
    }

    #[test]
    fn keys_change_with_defines_arch_and_version() {
        let c = Counting::new(0, false);
        let v = Variant::new(&tefl_kernels::NORM, &[], Defines::new().set("BLOCK", 256));
        let w = Variant::new(&tefl_kernels::NORM, &[], Defines::new().set("BLOCK", 512));
        let k = cache_key(&c, &v, "gfx942", "1.0");
        assert_eq!(k, cache_key(&c, &v, "gfx942", "1.0"));
        assert_ne!(k, cache_key(&c, &w, "gfx942", "1.0"));
        assert_ne!(k, cache_key(&c, &v, "gfx90a", "1.0"));
        assert_ne!(k, cache_key(&c, &v, "gfx942", "1.1"));
    }

    #[test]
    fn a_source_without_the_target_is_an_error_and_failures_name_the_file() {
        let c = Counting::new(0, false);
        let attn = Variant::new(&tefl_kernels::ATTENTION_CUDA, &[], Defines::new());
        let e = compile(&c, &attn, "gfx942").unwrap_err().to_string();
        assert!(e.contains("no hip version"), "{e}");
        let bad = Variant::new(&tefl_kernels::NORM, &[], Defines::new().set("FAIL", 1));
        let e = compile(&c, &bad, "gfx942").unwrap_err().to_string();
        assert!(e.contains("simt/norm.cu") && e.contains("error: FAIL"), "{e}");
    }

    #[test]
    fn module_cache_loads_once_per_device_and_variant() {
        let cache: ModuleCache<u32> = ModuleCache::new();
        let v = Variant::new(&tefl_kernels::NORM, &[], Defines::new().set("BLOCK", 256));
        let loads = AtomicUsize::new(0);
        let load = || {
            loads.fetch_add(1, Ordering::SeqCst);
            Ok(7)
        };
        assert_eq!(*cache.get_or_load(0, &v, load).unwrap(), 7);
        assert_eq!(*cache.get_or_load(0, &v, || Ok(8)).unwrap(), 7);
        assert_eq!(*cache.get_or_load(1, &v, || Ok(9)).unwrap(), 9);
        assert!(cache.get_or_load(2, &v, || Err(Error::Tensor("no".into()))).is_err());
        // Other defines, or another source with the same defines, are other modules.
        let other = Variant::new(&tefl_kernels::NORM, &[], Defines::new().set("BLOCK", 128));
        assert_eq!(*cache.get_or_load(0, &other, || Ok(10)).unwrap(), 10);
        let softmax = Variant::new(&tefl_kernels::SOFTMAX, &[], Defines::new().set("BLOCK", 256));
        assert_eq!(*cache.get_or_load(0, &softmax, || Ok(11)).unwrap(), 11);
        assert_eq!(*cache.get_or_load(0, &v, || Ok(12)).unwrap(), 7);
        assert_eq!((loads.load(Ordering::SeqCst), cache.len()), (1, 4));
    }

    /// A variant no earlier run has cached (a fresh nonce among its defines).
    fn fresh_variant(fail: bool) -> Variant {
        use std::hash::{BuildHasher, Hasher};
        let nonce = std::collections::hash_map::RandomState::new().build_hasher().finish();
        Variant::new(&tefl_kernels::NORM, &[], Defines::new().set("NONCE", nonce).flag("FAIL", fail))
    }

    fn remove_cached(c: &dyn RtcCompiler, v: &Variant, arch: &str) {
        if let Ok(p) = cached_path(c, v, arch, cache_key(c, v, arch, "1.0")) {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn a_launch_takes_the_binary_compiled_ahead_without_compiling_again() {
        static C: Counting = Counting::new(150, true);
        let v = fresh_variant(false);
        compile_ahead(&C, v.clone(), "gfx942".into());
        wait_for_compiles_ahead();
        assert_eq!(C.calls(), 1, "compiled on its own thread");
        let bin = compile_cached(&C, &v, "gfx942").unwrap();
        assert_eq!(bin, full_source(Target::Hip, &v).len().to_le_bytes().to_vec());
        assert_eq!(C.calls(), 1);
        // Asking again for a binary that is cached compiles nothing.
        compile_ahead(&C, v.clone(), "gfx942".into());
        wait_for_compiles_ahead();
        assert_eq!(C.calls(), 1);
        remove_cached(&C, &v, "gfx942");
        // A launch right after the request finds the compile under way, finished, or not yet
        // started: either way the program is compiled once.
        let w = fresh_variant(false);
        compile_ahead(&C, w.clone(), "gfx942".into());
        compile_cached(&C, &w, "gfx942").unwrap();
        wait_for_compiles_ahead();
        assert_eq!(C.calls(), 2);
        remove_cached(&C, &w, "gfx942");
    }

    #[test]
    fn a_failed_compile_ahead_leaves_the_launch_its_own_error() {
        static C: Counting = Counting::new(150, true);
        let v = fresh_variant(true);
        compile_ahead(&C, v.clone(), "gfx942".into());
        wait_for_compiles_ahead();
        let e = compile_cached(&C, &v, "gfx942").unwrap_err().to_string();
        assert!(e.contains("error: FAIL") && e.contains("simt/norm.cu"), "{e}");
        assert_eq!(C.calls(), 2);
    }

    #[test]
    fn racing_launches_compile_once() {
        static C: Counting = Counting::new(150, true);
        let v = fresh_variant(false);
        let bins: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4).map(|_| s.spawn(|| compile_cached(&C, &v, "gfx90a").unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(bins.windows(2).all(|w| w[0] == w[1]));
        // Those that started while the first compiled waited for it; any later found its binary
        // in the disk cache.
        assert_eq!(C.calls(), 1);
        remove_cached(&C, &v, "gfx90a");
    }

    #[test]
    fn a_compile_that_unwinds_leaves_no_thread_waiting() {
        static C: Counting = Counting::new(150, true);
        let v = fresh_variant(false);
        let v = Variant { defines: v.defines.flag("PANIC", true), ..v };
        std::thread::scope(|s| {
            let first = s.spawn(|| compile_cached(&C, &v, "gfx942"));
            std::thread::sleep(std::time::Duration::from_millis(30));
            // Waits for the first compile, which unwinds, then compiles (and unwinds) itself.
            let second = std::panic::catch_unwind(|| compile_cached(&C, &v, "gfx942"));
            assert!(first.join().is_err() && second.is_err());
        });
        assert_eq!(C.calls(), 2);
        assert!(!lock(slots()).contains_key(&cache_key(&C, &v, "gfx942", "1.0")));
    }

    #[test]
    fn a_compiler_that_cannot_run_twice_at_once_compiles_nothing_ahead() {
        static C: Counting = Counting::new(0, false);
        compile_ahead(&C, fresh_variant(false), "gfx942".into());
        wait_for_compiles_ahead();
        assert_eq!(C.calls(), 0);
    }

    #[test]
    fn variants_are_compiled_ahead_once_and_never_once_loaded() {
        let cache: ModuleCache<u32> = ModuleCache::new();
        let v = Variant::new(&tefl_kernels::NORM, &[], Defines::new().set("BLOCK", 256));
        let w = Variant::new(&tefl_kernels::NORM, &[], Defines::new().set("BLOCK", 512));
        assert!(cache.first_ahead(0, &v) && !cache.first_ahead(0, &v) && cache.first_ahead(1, &v));
        cache.get_or_load(0, &w, || Ok(1)).unwrap();
        assert!(cache.contains(0, &w) && !cache.contains(1, &w) && !cache.first_ahead(0, &w));
    }

    #[test]
    fn entries_are_found_in_symbol_tables() {
        let bin = b"\x7fELF..\0norm_fwd\0norm_bwd\0";
        assert!(binary_has_entry(bin, "norm_fwd") && binary_has_entry(bin, "norm_bwd"));
        assert!(!binary_has_entry(bin, "norm") && !binary_has_entry(bin, "norm_bwd_cols"));
    }
}
