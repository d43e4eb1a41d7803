//! The manager: resolves, caches and runs the chain of impls for each call.
//!
//! One call: validate → look up the cached chain for (op, device, dtype signature, policy
//! generation, scoped override) → call the first impl → on failure, if the policy allows,
//! the next. The chain is resolved once per key (candidates by device, filters, order;
//! see [`Manager::explain`]) and then costs a thread-local hash lookup.

mod cache;
mod call;
mod explain;
mod tex;

pub use explain::{ExplainEntry, Explanation};
pub use tex::BackendInfo;

use cache::{ChainKey, FailKey, FailState, SharedChain, THREAD};

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::SystemTime;

use crate::device::{read_lock, write_lock};
use crate::policy::{EnvConfig, PolicyOverride, SelectionPolicy};
use crate::registry::{OpImpl, Registry};
use crate::{Device, Error, Result};

const LOG: &str = "TE-FL";
/// How many failure records the manager keeps (oldest dropped first).
pub const FAILURE_MEMORY: usize = 64;
/// The longest a failing impl is passed over, in calls of its chain.
pub const MAX_SKIP_CALLS: u64 = 4096;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
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
///         Ok(RmsNormFwdOut { y: a.x.clone(), rsigma: Tensor::zeros([rows], DType::F32, &a.x.device())?, amax: None, scale_inv: None })
///     })
///     .vendor("mybackend")
///     .priority(200),
/// )?;
/// let mgr = Manager::new(reg, SelectionPolicy::default().prefer(Prefer::Vendor));
/// let x = Tensor::from_slice(&[1.0f32; 8], [2, 4], DType::F32)?;
/// let g = Tensor::from_slice(&[1.0f32; 4], [4], DType::F32)?;
/// let args = RmsNormFwdArgs { x, gamma: g, eps: 1e-5, zero_centered_gamma: false, out_dtype: DType::F32, scale: None };
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

/// The `Registered impl_ids: ['a', 'b']` line of a registry (INFO).
fn log_registered(registry: &Registry) {
    let quoted: Vec<String> = registry.impl_ids().iter().map(|i| format!("'{i}'")).collect();
    tracing::info!(target: LOG, "Registered impl_ids: [{}]", quoted.join(", "));
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Manager {
    /// A manager over `registry` with `policy`. Logs `Registered impl_ids: [...]`.
    pub fn new(registry: Registry, policy: SelectionPolicy) -> Self {
        log_registered(&registry);
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

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        lock(&self.chains).clear();
    }

    fn warn_once(&self, what: String) {
        if lock(&self.warned).insert(what.clone()) {
            tracing::warn!(target: LOG, "{what}");
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

    /// Logs `Registered impl_ids: [...]` again, for the registry as it is now: a host that
    /// registers impls after the manager was made (the Python package's plugin modules) says
    /// the complete list once they are in.
    pub fn log_registered(&self) {
        log_registered(&read_lock(&self.registry));
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
