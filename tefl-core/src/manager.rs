//! The manager: resolves, caches and runs the chain of impls for each call.
//!
//! One call: validate → look up the cached chain for (op, device, dtype signature, policy
//! generation, scoped override) → call the first impl → on failure, if the policy allows,
//! the next. The chain is resolved once per key (candidates by device, filters, order;
//! see [`Manager::explain`]) and then costs a thread-local hash lookup.

use std::any::TypeId;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::SystemTime;

use crate::device::{read_lock, write_lock};
use crate::op::{ArgSummary, Op, OpArgs, OpOutput, check_inout_aliasing};
use crate::policy::{EnvConfig, PolicyOverride, SelectionPolicy, Token};
use crate::registry::{BackendImplKind, KernelCtx, OpImpl, Registry, panic_message};
use crate::{DType, Device, Error, Result, catalogue};

const LOG: &str = "TE-FL";
/// How many failure records the manager keeps (oldest dropped first).
pub const FAILURE_MEMORY: usize = 64;
/// The longest a failing impl is passed over, in calls of its chain.
pub const MAX_SKIP_CALLS: u64 = 4096;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The failure memory of one impl for one (device kind, dtype signature): shared by every
/// chain that holds the impl, whatever policy or scope resolved the chain.
#[derive(Default)]
struct FailState {
    consecutive_failures: AtomicU32,
    skip_remaining: AtomicU64,
}

/// Which impl and which kind of call a [`FailState`] is about.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct FailKey {
    imp: usize,
    device: crate::DeviceKind,
    signature: u64,
    primary: DType,
}

/// One impl of a resolved chain, with its failure memory.
struct ChainEntry {
    imp: Arc<OpImpl>,
    staged: bool,
    fail: Arc<FailState>,
    staged_logged: AtomicBool,
}

impl std::ops::Deref for ChainEntry {
    type Target = FailState;
    fn deref(&self) -> &FailState {
        &self.fail
    }
}

impl FailState {
    /// Whether to pass over this impl for one call because it failed recently.
    fn take_skip(&self) -> bool {
        if self.skip_remaining.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.skip_remaining.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
    }

    fn note_failure(&self) {
        let c = self.consecutive_failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let skip = (8u64 << (c - 1).min(20)).min(MAX_SKIP_CALLS);
        self.skip_remaining.store(skip, Ordering::Relaxed);
    }

    fn note_success(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }
}

/// A resolved chain, shared by every thread.
struct SharedChain {
    entries: Vec<ChainEntry>,
    strict: bool,
    empty_reason: String,
}

/// A thread's handle on a shared chain, remembering which entry it last saw serve.
struct LocalChain {
    shared: Arc<SharedChain>,
    last_served: Cell<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct ChainKey {
    manager: u64,
    generation: u64,
    scope: u64,
    op: TypeId,
    device: Device,
    signature: u64,
    primary: DType,
}

impl Hash for ChainKey {
    // Three words instead of field-by-field hashing: this runs on every call. Consistent
    // with Eq: equal device kinds have equal names, hence equal lengths and first bytes.
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.manager ^ self.generation.rotate_left(21) ^ self.scope.rotate_left(42));
        self.op.hash(h);
        let name = self.device.kind.name();
        let kind = (name.len() as u64) << 8 | u64::from(name.as_bytes().first().copied().unwrap_or(0));
        h.write_u64(
            self.signature
                ^ u64::from(self.primary.code()) << 56
                ^ u64::from(self.device.ordinal).rotate_left(32)
                ^ kind.rotate_left(44),
        );
    }
}

/// A small multiplicative hasher for the per-call cache key (no DoS concern: keys are ours).
#[derive(Default)]
struct KeyHasher(u64);
impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i))
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i))
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64)
    }
}
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

/// Per-thread state: the chain cache and the scoped overrides.
#[derive(Default)]
struct ThreadState {
    /// The last chain this thread used: most call sites repeat one op.
    last: Option<(ChainKey, Rc<LocalChain>)>,
    chains: FastMap<ChainKey, Rc<LocalChain>>,
    scopes: Vec<(u64, u64, PolicyOverride)>,
    /// Per manager id with scopes on this thread: the fingerprint of its override stack.
    scope_keys: Vec<(u64, u64)>,
}

impl ThreadState {
    fn refresh_scope_keys(&mut self) {
        use std::hash::DefaultHasher;
        let mut managers: Vec<u64> = self.scopes.iter().map(|(m, _, _)| *m).collect();
        managers.sort_unstable();
        managers.dedup();
        self.scope_keys = managers
            .into_iter()
            .map(|m| {
                let mut h = DefaultHasher::new();
                for (_, _, o) in self.scopes.iter().filter(|(x, _, _)| *x == m) {
                    o.hash(&mut h);
                }
                (m, h.finish() | 1)
            })
            .collect();
    }
}

const THREAD_CACHE_LIMIT: usize = 1024;

thread_local! {
    static THREAD: RefCell<ThreadState> = RefCell::new(ThreadState::default());
}

/// One failure the manager remembers.
#[derive(Debug, Clone)]
pub struct FailureRecord {
    /// The op.
    pub op: &'static str,
    /// The impl that failed.
    pub impl_id: String,
    /// The device of the call.
    pub device: Device,
    /// The error or panic message.
    pub error: String,
    /// When it happened.
    pub at: SystemTime,
}

/// Counters of one (op, impl).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImplStats {
    /// The op.
    pub op: &'static str,
    /// The impl.
    pub impl_id: String,
    /// Successful calls.
    pub calls: u64,
    /// Failed calls (errors and panics).
    pub failures: u64,
    /// Successful calls served after another impl failed in the same call.
    pub fallbacks: u64,
    /// Calls that passed over this impl because it failed recently.
    pub skipped: u64,
    /// Calls whose arguments the impl said it does not support (not failures).
    pub unsupported: u64,
}

/// How one impl fared in a resolution.
#[derive(Debug, Clone)]
pub struct ExplainEntry {
    /// The impl id.
    pub impl_id: String,
    /// Its kind.
    pub kind: BackendImplKind,
    /// Its vendor.
    pub vendor: Option<String>,
    /// Its priority.
    pub priority: i32,
    /// Its position in the chain (0 = called first), or `None` when dropped.
    pub position: Option<usize>,
    /// Whether the call is staged through the host for it.
    pub staged: bool,
    /// Why it was dropped, or why it sits where it does.
    pub reason: String,
}

/// The candidate chain of one (op, device, dtype) under the current policy, with reasons.
#[derive(Debug, Clone)]
pub struct Explanation {
    /// The op.
    pub op: String,
    /// The device.
    pub device: Device,
    /// The primary dtype.
    pub dtype: DType,
    /// Whether the chain stops at the first failure.
    pub strict: bool,
    /// The chain in call order, then the dropped impls.
    pub entries: Vec<ExplainEntry>,
}

impl Explanation {
    /// The impl ids of the chain, in call order.
    pub fn chain(&self) -> Vec<&str> {
        let mut v: Vec<_> = self.entries.iter().filter(|e| e.position.is_some()).collect();
        v.sort_by_key(|e| e.position);
        v.into_iter().map(|e| e.impl_id.as_str()).collect()
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "op '{}' on {} ({}){}:",
            self.op,
            self.device,
            self.dtype,
            if self.strict { ", strict: no fallback" } else { "" }
        )?;
        if self.entries.is_empty() {
            writeln!(f, "  no impl registered")?;
        }
        for e in &self.entries {
            let pos = e.position.map_or("dropped".to_string(), |p| format!("#{}", p + 1));
            writeln!(
                f,
                "  {pos:>7}  {:<24} kind={:<9} vendor={:<10} priority={:<5} {}{}",
                e.impl_id,
                e.kind.token(),
                e.vendor.as_deref().unwrap_or("None"),
                e.priority,
                if e.staged { "[staged via host] " } else { "" },
                e.reason
            )?;
        }
        Ok(())
    }
}

/// A whole backend, as the TEX interface lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// The name (`nvidia`, `vulkan`, `reference`, or an out-of-tree vendor's).
    pub name: String,
    /// The vendor's registered name, when it registered a `VendorInfo`.
    pub vendor: Option<String>,
    /// The highest priority among its impls.
    pub priority: i32,
    /// Whether its driver is usable here.
    pub available: bool,
    /// Why not, when it is not.
    pub unavailable_reason: Option<String>,
    /// Whether it is the backend `get_backend` reports.
    pub current: bool,
    /// How many impls it registers.
    pub impls: usize,
}

/// Resolves and runs op calls. Most users use the process-wide [`global`] manager through
/// `tefl-ops`; the seed's in-tree example builds its own:
///
/// ```
/// use tefl_core::{BackendImplKind, Manager, OpImpl, Prefer, Registry, SelectionPolicy, Tensor, DType};
/// use tefl_core::catalogue::{RmsNormFwd, RmsNormFwdArgs, RmsNormFwdOut};
/// let mut reg = Registry::new();
/// reg.register_impl(
///     OpImpl::new::<RmsNormFwd>("vendor.mybackend", BackendImplKind::Vendor, |_, a| {
///         let rows = a.x.rows();
///         Ok(RmsNormFwdOut { y: a.x.clone(), rsigma: Tensor::zeros([rows], DType::F32, &a.x.device())? })
///     })
///     .vendor("mybackend")
///     .priority(200),
/// )?;
/// let mgr = Manager::new(reg, SelectionPolicy::default().prefer(Prefer::Vendor));
/// let x = Tensor::from_slice(&[1.0f32; 8], [2, 4], DType::F32)?;
/// let g = Tensor::from_slice(&[1.0f32; 4], [4], DType::F32)?;
/// let args = RmsNormFwdArgs { x, gamma: g, eps: 1e-5, zero_centered_gamma: false, out_dtype: DType::F32 };
/// let out = mgr.call::<RmsNormFwd>(&args)?;
/// assert_eq!(out.rsigma.shape(), &[2]);
/// # Ok::<(), tefl_core::Error>(())
/// ```
pub struct Manager {
    id: u64,
    registry: RwLock<Registry>,
    policy: RwLock<SelectionPolicy>,
    generation: AtomicU64,
    chains: Mutex<HashMap<ChainKey, Arc<SharedChain>>>,
    served: Mutex<HashMap<(&'static str, Device), String>>,
    failures: Mutex<VecDeque<FailureRecord>>,
    fail_states: Mutex<HashMap<FailKey, Arc<FailState>>>,
    warned: Mutex<HashSet<String>>,
}

const SHARED_CACHE_LIMIT: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a failure says, without repeating the "implementation 'x' failed for op 'y'" the
/// log line or the list it goes into already says.
fn failure_text(err: &Error, impl_id: &str) -> String {
    match err {
        Error::ImplFailed { impl_id: i, reason, .. } | Error::Unsupported { impl_id: i, reason, .. }
            if i == impl_id =>
        {
            reason.clone()
        }
        e => e.to_string(),
    }
}

impl Manager {
    /// A manager over `registry` with `policy`. Logs `Registered impl_ids: [...]`.
    pub fn new(registry: Registry, policy: SelectionPolicy) -> Self {
        let ids = registry.impl_ids();
        let quoted: Vec<String> = ids.iter().map(|i| format!("'{i}'")).collect();
        tracing::info!(target: LOG, "Registered impl_ids: [{}]", quoted.join(", "));
        let m = Manager {
            id: next_id(),
            registry: RwLock::new(registry),
            policy: RwLock::new(policy),
            generation: AtomicU64::new(1),
            chains: Mutex::new(HashMap::new()),
            served: Mutex::new(HashMap::new()),
            failures: Mutex::new(VecDeque::new()),
            fail_states: Mutex::new(HashMap::new()),
            warned: Mutex::new(HashSet::new()),
        };
        m.warn_unknown_names();
        m
    }

    /// The manager the environment describes: every linked-in impl, the policy from the
    /// `TE_FL_*` / `TE_*` variables (a bad value is an error naming the variable).
    pub fn from_env() -> Result<Self> {
        Ok(Manager::from_config(crate::policy::env().clone()?))
    }

    /// The manager a parsed configuration describes: every linked-in impl, plus the plugins
    /// of `TE_FL_PLUGIN_MODULES` (a plugin that cannot be used is skipped with an ERROR log
    /// line naming it), under the configuration's policy.
    pub fn from_config(cfg: EnvConfig) -> Self {
        let mut reg = Registry::with_builtins();
        crate::plugin::load_plugins(&mut reg, &cfg.plugin_modules);
        Manager::new(reg, cfg.policy)
    }

    /// Calls op `O`: validates the arguments, then runs the cached chain.
    pub fn call<O: Op>(&self, args: &O::Args) -> Result<O::Output> {
        let summary = args.summary(O::NAME)?;
        O::validate(args)?;
        check_inout_aliasing::<O>(args)?;
        let chain = self.chain_for::<O>(&summary);
        self.run::<O>(&chain, &summary, args)
    }

    /// Calls one impl directly by id, bypassing the policy (the conformance suite does this).
    /// A reference impl serves other devices through host staging, as in a normal call.
    pub fn call_impl<O: Op>(&self, impl_id: &str, args: &O::Args) -> Result<O::Output> {
        let summary = args.summary(O::NAME)?;
        O::validate(args)?;
        check_inout_aliasing::<O>(args)?;
        let imp =
            read_lock(&self.registry).impls_of(O::NAME).iter().find(|i| i.impl_id() == impl_id).cloned().ok_or_else(
                || Error::NoImplementation {
                    op: O::NAME,
                    device: summary.device,
                    dtype: summary.primary,
                    reason: format!("no impl '{impl_id}' registered"),
                },
            )?;
        let staged = imp.device_kind() != summary.device.kind;
        if staged && !(imp.kind() == BackendImplKind::Reference && imp.device_kind() == Device::CPU.kind) {
            return Err(Error::DeviceMismatch {
                op: O::NAME,
                arg: "impl",
                got: summary.device,
                expected: Device::new(imp.device_kind(), 0),
            });
        }
        if let Err(reason) = imp.check_supports::<O>(args) {
            imp.counters.unsupported.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Unsupported { op: O::NAME, impl_id: impl_id.to_string(), reason });
        }
        let entry = ChainEntry { imp, staged, fail: Arc::default(), staged_logged: AtomicBool::new(true) };
        self.attempt::<O>(&entry, &summary, args)
    }

    /// The cache-key part of this thread's scoped overrides for this manager: 0 without any,
    /// else a fingerprint of the whole stack of overrides (so two stacks that give the same
    /// policy share chains, and dropping scopes in any order never leaves a stale key).
    fn scope_id(&self, st: &ThreadState) -> u64 {
        st.scope_keys.iter().find(|(m, _)| *m == self.id).map_or(0, |(_, k)| *k)
    }

    #[inline]
    fn chain_for<O: Op>(&self, s: &ArgSummary) -> Rc<LocalChain> {
        let generation = self.generation.load(Ordering::Acquire);
        let hit = THREAD.try_with(|t| {
            let mut st = t.try_borrow_mut().ok()?;
            let key = ChainKey {
                manager: self.id,
                generation,
                scope: self.scope_id(&st),
                op: TypeId::of::<O>(),
                device: s.device,
                signature: s.signature,
                primary: s.primary,
            };
            if let Some((k, c)) = &st.last
                && *k == key
            {
                return Some(c.clone());
            }
            let c = st.chains.get(&key)?.clone();
            st.last = Some((key, c.clone()));
            Some(c)
        });
        match hit {
            Ok(Some(c)) => c,
            _ => self.chain_slow(O::NAME, TypeId::of::<O>(), s, generation),
        }
    }

    /// Cache miss: resolve (or fetch the shared chain) and remember it for this thread.
    #[cold]
    #[inline(never)]
    fn chain_slow(&self, op: &'static str, op_type: TypeId, s: &ArgSummary, generation: u64) -> Rc<LocalChain> {
        let scope = THREAD.try_with(|t| t.try_borrow().map(|st| self.scope_id(&st)).unwrap_or(0)).unwrap_or(0);
        let key = ChainKey {
            manager: self.id,
            generation,
            scope,
            op: op_type,
            device: s.device,
            signature: s.signature,
            primary: s.primary,
        };
        let chain = Rc::new(LocalChain { shared: self.shared_chain(op, key), last_served: Cell::new(usize::MAX) });
        // Thread-local storage may be gone (thread teardown) or busy: then the chain is not cached.
        let _ = THREAD.try_with(|t| {
            if let Ok(mut st) = t.try_borrow_mut() {
                if st.chains.len() >= THREAD_CACHE_LIMIT {
                    st.chains.clear();
                }
                st.chains.retain(|k, _| k.manager != self.id || k.generation == generation);
                st.chains.insert(key, chain.clone());
                st.last = Some((key, chain.clone()));
            }
        });
        chain
    }

    fn effective_policy(&self) -> SelectionPolicy {
        let mut p = read_lock(&self.policy).clone();
        let _ = THREAD.try_with(|t| {
            if let Ok(st) = t.try_borrow() {
                for (m, _, o) in &st.scopes {
                    if *m == self.id {
                        o.apply(&mut p);
                    }
                }
            }
        });
        p
    }

    fn shared_chain(&self, op: &'static str, key: ChainKey) -> Arc<SharedChain> {
        let mut shared_key = key;
        shared_key.device.ordinal = 0; // chains depend on the device kind only
        if let Some(c) = lock(&self.chains).get(&shared_key) {
            return c.clone();
        }
        let policy = self.effective_policy();
        let ex = self.resolve(op, key.device, key.primary, &policy);
        let reg = read_lock(&self.registry);
        let mut entries = Vec::new();
        for e in ex.entries.iter().filter(|e| e.position.is_some()) {
            if let Some(imp) = reg.impls_of(op).iter().find(|i| i.impl_id() == e.impl_id) {
                let fail = self.fail_state(imp, &key);
                entries.push(ChainEntry {
                    imp: imp.clone(),
                    staged: e.staged,
                    fail,
                    staged_logged: AtomicBool::new(false),
                });
            }
        }
        let empty_reason = if ex.entries.is_empty() {
            "no impl registered for this op".to_string()
        } else {
            let why: Vec<String> = ex.entries.iter().map(|e| format!("'{}': {}", e.impl_id, e.reason)).collect();
            why.join("; ")
        };
        let chain = Arc::new(SharedChain { entries, strict: policy.strict, empty_reason });
        let mut map = lock(&self.chains);
        if map.len() >= SHARED_CACHE_LIMIT {
            map.clear();
        }
        map.entry(shared_key).or_insert(chain).clone()
    }

    /// The failure memory of `imp` for calls like `key` (one per impl, device kind and dtype
    /// signature, shared by every chain).
    fn fail_state(&self, imp: &Arc<OpImpl>, key: &ChainKey) -> Arc<FailState> {
        let k = FailKey {
            imp: Arc::as_ptr(imp) as usize,
            device: key.device.kind,
            signature: key.signature,
            primary: key.primary,
        };
        let mut map = lock(&self.fail_states);
        if map.len() >= SHARED_CACHE_LIMIT {
            map.retain(|_, v| Arc::strong_count(v) > 1);
        }
        map.entry(k).or_default().clone()
    }

    fn run<O: Op>(&self, chain: &LocalChain, s: &ArgSummary, args: &O::Args) -> Result<O::Output> {
        let sh = &*chain.shared;
        if sh.entries.is_empty() {
            return Err(Error::NoImplementation {
                op: O::NAME,
                device: s.device,
                dtype: s.primary,
                reason: sh.empty_reason.clone(),
            });
        }
        let mut failures: Vec<(String, String)> = Vec::new();
        let mut unsupported: Vec<usize> = Vec::new();
        let mut attempted = false;
        for pass in 0..2 {
            for (i, e) in sh.entries.iter().enumerate() {
                if unsupported.contains(&i) {
                    continue;
                }
                // Pass 0 honours the failure memory; pass 1 (only when pass 0 tried nothing)
                // tries every impl rather than fail without an attempt.
                if pass == 0 && !sh.strict && e.take_skip() {
                    e.imp.counters.skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                // An impl that does not support these arguments is passed over, not failed.
                let checked = if e.imp.has_supports_check() { e.imp.check_supports::<O>(args) } else { Ok(()) };
                let result = match checked {
                    Ok(()) => {
                        attempted = true;
                        self.attempt::<O>(e, s, args)
                    }
                    Err(reason) => {
                        Err(Error::Unsupported { op: O::NAME, impl_id: e.imp.impl_id().to_string(), reason })
                    }
                };
                match result {
                    Ok(out) => {
                        e.note_success();
                        e.imp.counters.calls.fetch_add(1, Ordering::Relaxed);
                        let fell_back = !failures.is_empty();
                        if fell_back {
                            Self::on_fallback(e, O::NAME);
                        }
                        if chain.last_served.get() != i {
                            self.note_served(O::NAME, s.device, &e.imp, fell_back);
                            chain.last_served.set(i);
                        }
                        return Ok(out);
                    }
                    Err(err @ Error::Unsupported { .. }) => {
                        e.imp.counters.unsupported.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(target: LOG, "Implementation '{}' does not support this call of op '{}': {}", e.imp.impl_id(), O::NAME, failure_text(&err, e.imp.impl_id()));
                        unsupported.push(i);
                        failures.push((
                            e.imp.impl_id().to_string(),
                            format!("not supported: {}", failure_text(&err, e.imp.impl_id())),
                        ));
                    }
                    Err(err) => {
                        self.on_failure(e, O::NAME, s.device, &err);
                        if sh.strict {
                            return Err(err);
                        }
                        failures.push((e.imp.impl_id().to_string(), failure_text(&err, e.imp.impl_id())));
                    }
                }
            }
            if attempted {
                break;
            }
        }
        if !attempted && !failures.is_empty() && unsupported.len() == sh.entries.len() {
            let why: Vec<String> = failures.iter().map(|(i, e)| format!("'{i}': {e}")).collect();
            return Err(Error::NoImplementation {
                op: O::NAME,
                device: s.device,
                dtype: s.primary,
                reason: why.join("; "),
            });
        }
        Err(Error::AllFailed { op: O::NAME, failures })
    }

    fn attempt<O: Op>(&self, e: &ChainEntry, s: &ArgSummary, args: &O::Args) -> Result<O::Output> {
        let kernel = e.imp.kernel::<O>()?;
        let device = if e.staged { Device::CPU } else { s.device };
        let ctx = KernelCtx { device, op: O::NAME, impl_id: e.imp.impl_id() };
        if e.staged && !e.staged_logged.swap(true, Ordering::Relaxed) {
            tracing::info!(target: LOG, "Op '{}' staged through host memory for '{}' (call on {})", O::NAME, e.imp.impl_id(), s.device);
        }
        let result = catch_unwind(AssertUnwindSafe(|| {
            if e.staged {
                let host = args.to_host()?;
                let out = kernel(&ctx, &host)?;
                args.write_back(&host)?;
                out.to_device(&s.device)
            } else {
                kernel(&ctx, args)
            }
        }));
        let out = result.unwrap_or_else(|p| {
            Err(Error::ImplFailed {
                op: O::NAME,
                impl_id: e.imp.impl_id().to_string(),
                reason: format!("panicked: {}", panic_message(&*p)),
            })
        })?;
        if !e.imp.is_compiled_in() {
            crate::op::check_outputs::<O>(args, &out, s.device).map_err(|reason| Error::ImplFailed {
                op: O::NAME,
                impl_id: e.imp.impl_id().to_string(),
                reason,
            })?;
        }
        Ok(out)
    }

    #[cold]
    #[inline(never)]
    fn on_failure(&self, e: &ChainEntry, op: &'static str, device: Device, err: &Error) {
        e.imp.counters.failures.fetch_add(1, Ordering::Relaxed);
        e.note_failure();
        tracing::warn!(target: LOG, "Implementation '{}' failed for op '{}': {}", e.imp.impl_id(), op, failure_text(err, e.imp.impl_id()));
        self.remember_failure(op, e.imp.impl_id(), device, err);
    }

    #[cold]
    #[inline(never)]
    fn on_fallback(e: &ChainEntry, op: &'static str) {
        e.imp.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        tracing::info!(target: LOG, "Op '{}' fallback to '{}' {}", op, e.imp.impl_id(), e.imp.describe());
    }

    #[cold]
    #[inline(never)]
    fn note_served(&self, op: &'static str, device: Device, imp: &OpImpl, fell_back: bool) {
        let mut served = lock(&self.served);
        match served.get(&(op, device)) {
            None => {
                tracing::info!(target: LOG, "Op '{}' using '{}' {}", op, imp.impl_id(), imp.describe());
            }
            Some(prev) if prev != imp.impl_id() && !fell_back => {
                tracing::info!(target: LOG, "Op '{}' switched from '{}' to '{}' {}", op, prev, imp.impl_id(), imp.describe());
            }
            Some(_) => {}
        }
        served.insert((op, device), imp.impl_id().to_string());
    }

    fn remember_failure(&self, op: &'static str, impl_id: &str, device: Device, err: &Error) {
        let mut f = lock(&self.failures);
        if f.len() == FAILURE_MEMORY {
            f.pop_front();
        }
        f.push_back(FailureRecord {
            op,
            impl_id: impl_id.to_string(),
            device,
            error: err.to_string(),
            at: SystemTime::now(),
        });
    }

    /// Resolves the chain of `op` for `device` and `dtype` under the current policy (including
    /// this thread's scoped overrides), with the reason each impl was dropped or placed.
    pub fn explain(&self, op: &str, device: &Device, dtype: DType) -> Result<Explanation> {
        let known = catalogue::find(op)
            .map(|d| d.name)
            .or_else(|| read_lock(&self.registry).all_impls().find(|i| i.op() == op).map(|i| i.op()));
        let Some(op) = known else {
            return Err(Error::UnknownOp(op.to_string()));
        };
        Ok(self.resolve(op, *device, dtype, &self.effective_policy()))
    }

    /// Like [`Manager::explain`], for one concrete call: the chain for these arguments' device
    /// and dtypes, where each impl with a per-call check ([`OpImpl::supports_args`]) is asked
    /// whether it supports them; one that does not is dropped with its reason.
    pub fn explain_call<O: Op>(&self, args: &O::Args) -> Result<Explanation> {
        let s = args.summary(O::NAME)?;
        O::validate(args)?;
        let mut ex = self.resolve(O::NAME, s.device, s.primary, &self.effective_policy());
        let reg = read_lock(&self.registry);
        let mut order: Vec<usize> = (0..ex.entries.len()).filter(|&i| ex.entries[i].position.is_some()).collect();
        order.sort_by_key(|&i| ex.entries[i].position);
        let mut next = 0;
        for i in order {
            let e = &mut ex.entries[i];
            let verdict = reg
                .impls_of(O::NAME)
                .iter()
                .find(|imp| imp.impl_id() == e.impl_id)
                .map_or(Ok(()), |imp| imp.check_supports::<O>(args));
            match verdict {
                Ok(()) => {
                    e.position = Some(next);
                    next += 1;
                }
                Err(r) => {
                    e.position = None;
                    e.reason = format!("does not support these arguments: {r}");
                }
            }
        }
        Ok(ex)
    }

    fn resolve(&self, op: &str, device: Device, dtype: DType, policy: &SelectionPolicy) -> Explanation {
        let reg = read_lock(&self.registry);
        let mut placed: Vec<(Arc<OpImpl>, bool, String)> = Vec::new();
        let mut dropped: Vec<ExplainEntry> = Vec::new();
        let entry = |imp: &OpImpl, staged: bool, position: Option<usize>, reason: String| ExplainEntry {
            impl_id: imp.impl_id().to_string(),
            kind: imp.kind(),
            vendor: imp.vendor_name().map(str::to_string),
            priority: imp.get_priority(),
            position,
            staged,
            reason,
        };
        let mut candidates: Vec<(Arc<OpImpl>, bool)> = Vec::new();
        for imp in reg.impls_of(op) {
            let staged = imp.device_kind() != device.kind
                && imp.kind() == BackendImplKind::Reference
                && imp.device_kind() == Device::CPU.kind;
            let why_not = if imp.device_kind() != device.kind && !staged {
                Some(format!("runs on {}, the call is on {device}", imp.device_kind()))
            } else if !imp.supports(dtype) {
                let list: Vec<_> = imp.supported_dtypes().iter().map(|d| d.name()).collect();
                Some(format!("does not support {dtype} (supports {})", list.join(", ")))
            } else if let Some(v) = imp.vendor_name().filter(|v| policy.denies(v)) {
                Some(format!("vendor '{v}' is denied by TE_FL_DENY_VENDORS"))
            } else if imp.kind() == BackendImplKind::Vendor && !policy.allows(imp.vendor_name().unwrap_or("")) {
                Some(format!("vendor '{}' is not in TE_FL_ALLOW_VENDORS", imp.vendor_name().unwrap_or("None")))
            } else if let Some(Err(r)) = imp.vendor_name().and_then(|v| reg.vendor(v)).map(|v| v.check_available()) {
                Some(format!("unavailable: {r}"))
            } else if let Err(r) = imp.check_available() {
                Some(format!("unavailable: {r}"))
            } else {
                None
            };
            match why_not {
                Some(r) => dropped.push(entry(imp, staged, None, r)),
                None => candidates.push((imp.clone(), staged)),
            }
        }
        candidates
            .sort_by(|a, b| b.0.get_priority().cmp(&a.0.get_priority()).then_with(|| a.0.impl_id().cmp(b.0.impl_id())));

        let mut take = |pred: &dyn Fn(&OpImpl) -> bool, why: &dyn Fn(&OpImpl) -> String| {
            let (hit, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut candidates).into_iter().partition(|(i, _)| pred(i));
            candidates = rest;
            for (imp, staged) in hit {
                let w = why(&imp);
                placed.push((imp, staged, w));
            }
        };
        let leftover_reason: String;
        if let Some(tokens) = policy.per_op.get(op) {
            for (n, tok) in tokens.iter().enumerate() {
                take(&|i| tok.matches(i), &|i| {
                    format!("TE_FL_PER_OP token {} '{tok}', priority {}", n + 1, i.get_priority())
                });
            }
            let names: Vec<String> = tokens.iter().map(Token::to_string).collect();
            leftover_reason = format!("not named by TE_FL_PER_OP for '{op}' ({})", names.join("|"));
        } else if let Some(b) = &policy.backend {
            let fb = policy.fallback_backend.clone();
            take(&|i| i.backend_name().eq_ignore_ascii_case(b), &|i| {
                format!("TE_BACKEND={b}, priority {}", i.get_priority())
            });
            take(&|i| i.backend_name().eq_ignore_ascii_case(&fb), &|i| {
                format!("TE_FALLBACK_BACKEND={fb}, priority {}", i.get_priority())
            });
            leftover_reason = format!("TE_BACKEND={b} forces one backend (fallback: {fb})");
        } else {
            let prefer = policy.prefer;
            for kind in prefer.order() {
                take(&|i| i.kind() == kind, &|i| {
                    format!("TE_FL_PREFER={prefer}: {} impls, priority {}", kind.token(), i.get_priority())
                });
            }
            leftover_reason = String::new();
        }
        for (imp, staged) in candidates {
            dropped.push(entry(&imp, staged, None, leftover_reason.clone()));
        }
        let mut entries: Vec<ExplainEntry> = placed
            .iter()
            .enumerate()
            .map(|(n, (imp, staged, why))| entry(imp, *staged, Some(n), why.clone()))
            .collect();
        entries.extend(dropped);
        Explanation { op: op.to_string(), device, dtype, strict: policy.strict, entries }
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        lock(&self.chains).clear();
    }

    fn warn_once(&self, what: String) {
        if lock(&self.warned).insert(what.clone()) {
            tracing::warn!(target: LOG, "{what}");
        }
    }

    /// WARNs about vendors and impl ids the policy names but nothing registered: one
    /// environment often serves machines with different plugins, so this is not an error.
    fn warn_unknown_names(&self) {
        let policy = read_lock(&self.policy).clone();
        let reg = read_lock(&self.registry);
        let vendor_known = |v: &str| {
            reg.vendor(v).is_some()
                || reg.all_impls().any(|i| i.vendor_name().is_some_and(|x| x.eq_ignore_ascii_case(v)))
        };
        let backend_known = |b: &str| b == "reference" || b == "flagos" || vendor_known(b);
        for (op, tokens) in &policy.per_op {
            for t in tokens {
                match t {
                    Token::VendorNamed(v) if !vendor_known(v) => self.warn_once(format!(
                        "TE_FL_PER_OP names vendor '{v}' for op '{op}', but no such vendor is registered"
                    )),
                    Token::Impl(id) if !reg.impls_of(op).iter().any(|i| i.impl_id() == id) => self.warn_once(format!(
                        "TE_FL_PER_OP names impl '{id}' for op '{op}', but no such impl is registered"
                    )),
                    _ => {}
                }
            }
        }
        for (var, list) in [
            ("TE_FL_ALLOW_VENDORS", policy.allow_vendors.clone().unwrap_or_default()),
            ("TE_FL_DENY_VENDORS", policy.deny_vendors.clone()),
        ] {
            for v in list.iter().filter(|v| !vendor_known(v)) {
                self.warn_once(format!("{var} names vendor '{v}', but no such vendor is registered"));
            }
        }
        if let Some(b) = policy.backend.as_deref().filter(|b| !backend_known(b)) {
            self.warn_once(format!(
                "TE_BACKEND names backend '{b}', but no such backend is registered; ops go to '{}'",
                policy.fallback_backend
            ));
        }
        if !backend_known(&policy.fallback_backend) {
            self.warn_once(format!(
                "TE_FALLBACK_BACKEND names backend '{}', but no such backend is registered",
                policy.fallback_backend
            ));
        }
    }

    /// Registers an impl at run time; cached chains are invalidated.
    pub fn register_impl(&self, imp: OpImpl) -> Result<()> {
        write_lock(&self.registry).register_impl(imp)?;
        self.bump();
        Ok(())
    }

    /// Registers a vendor at run time; cached chains are invalidated.
    pub fn register_vendor(&self, info: crate::VendorInfo) {
        write_lock(&self.registry).register_vendor(info);
        self.bump();
    }

    /// Runs `f` with read access to the registry.
    pub fn with_registry<R>(&self, f: impl FnOnce(&Registry) -> R) -> R {
        f(&read_lock(&self.registry))
    }

    /// The base policy (without scoped overrides).
    pub fn policy(&self) -> SelectionPolicy {
        read_lock(&self.policy).clone()
    }

    /// Replaces the policy; cached chains are invalidated.
    pub fn set_policy(&self, policy: SelectionPolicy) {
        *write_lock(&self.policy) = policy;
        self.bump();
        self.warn_unknown_names();
    }

    /// The current policy generation (changes whenever cached chains become stale).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Applies `o` on this thread until the returned guard drops. Scopes nest; they affect
    /// only calls made on this thread through this manager.
    ///
    /// ```
    /// # use tefl_core::{Manager, Registry, SelectionPolicy, PolicyOverride, Prefer};
    /// let mgr = Manager::new(Registry::new(), SelectionPolicy::default());
    /// {
    ///     let _scope = mgr.scoped(PolicyOverride::new().prefer(Prefer::Reference).strict(true));
    ///     // calls here prefer the reference and never fall back
    /// }
    /// // and here the manager's own policy applies again
    /// ```
    pub fn scoped(&self, o: PolicyOverride) -> ScopeGuard {
        let id = next_id();
        let _ = THREAD.try_with(|t| {
            if let Ok(mut st) = t.try_borrow_mut() {
                st.scopes.push((self.id, id, o));
                st.refresh_scope_keys();
            }
        });
        ScopeGuard { scope: id, _not_send: std::marker::PhantomData }
    }

    /// Runs `f` under a scoped override.
    pub fn with_override<R>(&self, o: PolicyOverride, f: impl FnOnce() -> R) -> R {
        let _g = self.scoped(o);
        f()
    }

    /// Counters of every (op, impl), sorted by op then impl id.
    pub fn stats(&self) -> Vec<ImplStats> {
        let reg = read_lock(&self.registry);
        let mut v: Vec<ImplStats> = reg
            .all_impls()
            .map(|i| ImplStats {
                op: i.op(),
                impl_id: i.impl_id().to_string(),
                calls: i.counters.calls.load(Ordering::Relaxed),
                failures: i.counters.failures.load(Ordering::Relaxed),
                fallbacks: i.counters.fallbacks.load(Ordering::Relaxed),
                skipped: i.counters.skipped.load(Ordering::Relaxed),
                unsupported: i.counters.unsupported.load(Ordering::Relaxed),
            })
            .collect();
        v.sort_by(|a, b| (a.op, &a.impl_id).cmp(&(b.op, &b.impl_id)));
        v
    }

    /// Counters of one (op, impl).
    pub fn stats_of(&self, op: &str, impl_id: &str) -> Option<ImplStats> {
        self.stats().into_iter().find(|s| s.op == op && s.impl_id == impl_id)
    }

    /// The most recent failures, oldest first (at most [`FAILURE_MEMORY`]).
    pub fn recent_failures(&self) -> Vec<FailureRecord> {
        lock(&self.failures).iter().cloned().collect()
    }

    /// Forgets failures: every impl is tried again on the next call.
    pub fn reset_failures(&self) {
        lock(&self.failures).clear();
        lock(&self.fail_states).clear();
        self.bump();
    }

    // ---- TEX-style whole-backend selection ----

    /// Every backend: registered vendors, the backends of registered impls, and `reference`.
    pub fn list_backends(&self) -> Vec<BackendInfo> {
        let reg = read_lock(&self.registry);
        let policy = self.effective_policy();
        let mut names: Vec<String> = reg.vendors().map(|v| v.vendor_name.to_ascii_lowercase()).collect();
        names.extend(reg.all_impls().map(|i| i.backend_name().to_ascii_lowercase()));
        names.push("reference".into());
        names.sort();
        names.dedup();
        let mut infos: Vec<BackendInfo> = names
            .into_iter()
            .map(|name| {
                let impls: Vec<_> = reg.all_impls().filter(|i| i.backend_name().eq_ignore_ascii_case(&name)).collect();
                let vendor = reg.vendor(&name);
                let check = match vendor {
                    Some(v) => v.check_available(),
                    None if name == "reference" || impls.iter().any(|i| i.check_available().is_ok()) => Ok(()),
                    None => Err("none of its impls is available".to_string()),
                };
                let (available, unavailable_reason) = match check {
                    Ok(()) => (true, None),
                    Err(r) => (false, Some(r)),
                };
                BackendInfo {
                    vendor: vendor.map(|v| v.vendor_name.clone()),
                    priority: impls.iter().map(|i| i.get_priority()).max().unwrap_or(0),
                    available,
                    unavailable_reason,
                    current: false,
                    impls: impls.len(),
                    name,
                }
            })
            .collect();
        let current = match &policy.backend {
            Some(b) => Some(b.clone()),
            None => {
                // Automatic: the best available backend in preference order.
                let kind_of = |b: &BackendInfo| {
                    reg.all_impls().find(|i| i.backend_name().eq_ignore_ascii_case(&b.name)).map(|i| i.kind())
                };
                policy
                    .prefer
                    .order()
                    .iter()
                    .find_map(|k| {
                        infos
                            .iter()
                            .filter(|b| b.available && kind_of(b) == Some(*k))
                            .max_by_key(|b| b.priority)
                            .map(|b| b.name.clone())
                    })
                    .or(Some("reference".into()))
            }
        };
        for b in &mut infos {
            b.current = current.as_deref() == Some(b.name.as_str());
        }
        infos
    }

    /// The backend in use: the forced one, or the best available under the preference.
    pub fn get_backend(&self) -> BackendInfo {
        let list = self.list_backends();
        list.iter().find(|b| b.current).cloned().unwrap_or_else(|| {
            let name = self.effective_policy().backend.unwrap_or_else(|| "reference".into());
            BackendInfo {
                name,
                vendor: None,
                priority: 0,
                available: false,
                unavailable_reason: Some("not registered in this build".into()),
                current: true,
                impls: 0,
            }
        })
    }

    /// Forces one whole backend (`torch` means `reference`; `auto` returns to automatic
    /// selection). Ops it lacks, or that fail, go to `TE_FALLBACK_BACKEND`.
    pub fn set_backend(&self, name: &str) -> Result<()> {
        let lower = name.trim().to_ascii_lowercase();
        let mut policy = self.policy();
        if lower == "auto" {
            policy.backend = None;
        } else {
            let parsed = crate::policy::parse_backend_name("set_backend", &lower)?;
            let list = self.list_backends();
            let Some(info) = list.iter().find(|b| b.name == parsed) else {
                return Err(Error::BackendNotFound {
                    name: name.to_string(),
                    available: list.into_iter().map(|b| b.name).collect(),
                });
            };
            if !info.available {
                tracing::warn!(target: LOG, "Backend '{parsed}' is not available here; its ops will go to '{}'", policy.fallback_backend);
            }
            policy.backend = Some(parsed);
        }
        *write_lock(&self.policy) = policy;
        self.bump();
        Ok(())
    }
}

/// Ends a scoped override when dropped (see [`Manager::scoped`]).
pub struct ScopeGuard {
    scope: u64,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        let _ = THREAD.try_with(|t| {
            if let Ok(mut st) = t.try_borrow_mut() {
                st.scopes.retain(|(_, id, _)| *id != self.scope);
                st.refresh_scope_keys();
            }
        });
    }
}

static GLOBAL: OnceLock<std::result::Result<Manager, Error>> = OnceLock::new();

/// The process-wide manager, built from the environment on first use. A bad environment
/// variable makes every call return the same configuration error.
pub fn global() -> Result<&'static Manager> {
    GLOBAL.get_or_init(Manager::from_env).as_ref().map_err(Clone::clone)
}
