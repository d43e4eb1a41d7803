//! The chain caches: per thread (a hash lookup per call) over per manager (shared by
//! threads), and the failure memory shared by every chain that holds an impl.

use std::any::TypeId;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::device::read_lock;
use crate::op::{ArgSummary, Op};
use crate::policy::{PolicyOverride, SelectionPolicy};
use crate::registry::OpImpl;
use crate::{DType, Device};

use super::{MAX_SKIP_CALLS, Manager, lock};

/// The failure memory of one impl for one (device kind, dtype signature): shared by every
/// chain that holds the impl, whatever policy or scope resolved the chain.
#[derive(Default)]
pub(super) struct FailState {
    consecutive_failures: AtomicU32,
    skip_remaining: AtomicU64,
}

/// Which impl and which kind of call a [`FailState`] is about.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct FailKey {
    pub(super) imp: usize,
    pub(super) device: crate::DeviceKind,
    pub(super) signature: u64,
    pub(super) primary: DType,
}

/// One impl of a resolved chain, with its failure memory.
pub(super) struct ChainEntry {
    pub(super) imp: Arc<OpImpl>,
    pub(super) staged: bool,
    pub(super) fail: Arc<FailState>,
    pub(super) staged_logged: AtomicBool,
}

impl std::ops::Deref for ChainEntry {
    type Target = FailState;
    fn deref(&self) -> &FailState {
        &self.fail
    }
}

impl FailState {
    /// Whether to pass over this impl for one call because it failed recently.
    pub(super) fn take_skip(&self) -> bool {
        if self.skip_remaining.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.skip_remaining.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
    }

    pub(super) fn note_failure(&self) {
        let c = self.consecutive_failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let skip = (8u64 << (c - 1).min(20)).min(MAX_SKIP_CALLS);
        self.skip_remaining.store(skip, Ordering::Relaxed);
    }

    pub(super) fn note_success(&self) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }
}

/// A resolved chain, shared by every thread.
pub(super) struct SharedChain {
    pub(super) entries: Vec<ChainEntry>,
    pub(super) strict: bool,
    pub(super) empty_reason: String,
}

/// A thread's handle on a shared chain, remembering which entry it last saw serve.
pub(super) struct LocalChain {
    pub(super) shared: Arc<SharedChain>,
    pub(super) last_served: Cell<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct ChainKey {
    pub(super) manager: u64,
    pub(super) generation: u64,
    pub(super) scope: u64,
    pub(super) op: TypeId,
    pub(super) device: Device,
    pub(super) signature: u64,
    pub(super) primary: DType,
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
pub(super) struct ThreadState {
    /// The last chain this thread used: most call sites repeat one op.
    last: Option<(ChainKey, Rc<LocalChain>)>,
    chains: FastMap<ChainKey, Rc<LocalChain>>,
    pub(super) scopes: Vec<(u64, u64, PolicyOverride)>,
    /// Per manager id with scopes on this thread: the fingerprint of its override stack.
    pub(super) scope_keys: Vec<(u64, u64)>,
}

impl ThreadState {
    pub(super) fn refresh_scope_keys(&mut self) {
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
    pub(super) static THREAD: RefCell<ThreadState> = RefCell::new(ThreadState::default());
}

const SHARED_CACHE_LIMIT: usize = 4096;

impl Manager {
    /// The cache-key part of this thread's scoped overrides for this manager: 0 without any,
    /// else a fingerprint of the whole stack of overrides (so two stacks that give the same
    /// policy share chains, and dropping scopes in any order never leaves a stale key).
    pub(super) fn scope_id(&self, st: &ThreadState) -> u64 {
        st.scope_keys.iter().find(|(m, _)| *m == self.id).map_or(0, |(_, k)| *k)
    }

    #[inline]
    pub(super) fn chain_for<O: Op>(&self, s: &ArgSummary) -> Rc<LocalChain> {
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

    pub(super) fn effective_policy(&self) -> SelectionPolicy {
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
}
