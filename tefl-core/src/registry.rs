//! Op implementations, vendor descriptions and the registry that holds them.

use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::op::{DynKernel, ErasedKernel, Op, OpDescriptor};
pub use crate::op::{KernelCtx, KernelFn};
use crate::{DType, Device, DeviceKind, Error, Result};

/// The three kinds of implementation, as in TE-FL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendImplKind {
    /// Portable kernels (token `flagos`, alias `default`): the Vulkan backend.
    Default,
    /// A vendor's kernels (nvidia, amd, out-of-tree vendors).
    Vendor,
    /// The CPU reference implementation.
    Reference,
}

impl BackendImplKind {
    /// The policy token: `flagos`, `vendor` or `reference`.
    pub const fn token(self) -> &'static str {
        match self {
            BackendImplKind::Default => "flagos",
            BackendImplKind::Vendor => "vendor",
            BackendImplKind::Reference => "reference",
        }
    }
}

impl fmt::Display for BackendImplKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.token())
    }
}

/// An availability check: `Ok(())` or the reason the impl cannot run here.
pub type AvailabilityFn = Arc<dyn Fn() -> std::result::Result<(), String> + Send + Sync>;

/// An impl's cheap check of one call's arguments (see [`OpImpl::supports_args`]): `Ok(())`
/// when it can serve them, else why not.
pub type SupportsFn<O> = Arc<dyn Fn(&<O as Op>::Args) -> std::result::Result<(), String> + Send + Sync>;

/// The message of a caught panic payload.
pub fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs vendor code that answers `Ok` or a reason, turning a panic into `Err` with its message.
pub(crate) fn contained(
    what: &str,
    f: impl FnOnce() -> std::result::Result<(), String>,
) -> std::result::Result<(), String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(format!("{what} panicked: {}", panic_message(&*p))))
}

/// Per-(op, impl) counters, readable at any time.
#[derive(Debug, Default)]
pub struct ImplCounters {
    /// Successful calls served.
    pub calls: AtomicU64,
    /// Calls that returned an error or panicked.
    pub failures: AtomicU64,
    /// Successful calls served as a fallback after another impl failed.
    pub fallbacks: AtomicU64,
    /// Times the impl was passed over because it failed recently.
    pub skipped: AtomicU64,
    /// Times the impl said it does not support a call's arguments (not a failure).
    pub unsupported: AtomicU64,
}

/// One implementation of one op.
///
/// ```
/// use tefl_core::{BackendImplKind, OpImpl, catalogue::RmsNormFwd};
/// let imp = OpImpl::new::<RmsNormFwd>("vendor.mybackend", BackendImplKind::Vendor, |_ctx, a| {
///     Err(tefl_core::Error::invalid("rmsnorm_fwd", "x", format!("demo only: {:?}", a.x)))
/// })
/// .vendor("mybackend")
/// .priority(200);
/// assert_eq!(imp.impl_id(), "vendor.mybackend");
/// ```
pub struct OpImpl {
    op: &'static str,
    op_type: TypeId,
    impl_id: String,
    kind: BackendImplKind,
    vendor: Option<String>,
    priority: i32,
    device: DeviceKind,
    dtypes: Vec<DType>,
    available: Option<AvailabilityFn>,
    kernel: Box<dyn Any + Send + Sync>,
    supports_args: Option<Box<dyn Any + Send + Sync>>,
    /// The op a `supports_args` check was written for, when it is not this impl's op.
    misplaced_supports: Option<&'static str>,
    compiled_in: bool,
    by_name_only: bool,
    pub(crate) counters: ImplCounters,
}

impl OpImpl {
    /// An impl of op `O` running on the CPU with priority 0 and no vendor; refine it with the
    /// builder methods.
    pub fn new<O: Op>(
        impl_id: impl Into<String>,
        kind: BackendImplKind,
        kernel: impl Fn(&KernelCtx<'_>, &O::Args) -> Result<O::Output> + Send + Sync + 'static,
    ) -> Self {
        let kernel: KernelFn<O> = Arc::new(kernel);
        OpImpl::from_erased(ErasedKernel::of::<O>(kernel), impl_id.into(), kind)
    }

    /// An impl of the catalogue op `desc` served by a run-time kernel that does not know the
    /// op's Rust types (see [`DynKernel`]): how C plugins and other host languages' impls are
    /// made. Refine it with the builder methods, as for [`OpImpl::new`].
    pub fn dynamic(desc: &OpDescriptor, impl_id: impl Into<String>, kind: BackendImplKind, kernel: DynKernel) -> Self {
        OpImpl::from_erased((desc.erase_dyn)(kernel), impl_id.into(), kind)
    }

    fn from_erased(k: ErasedKernel, impl_id: String, kind: BackendImplKind) -> Self {
        OpImpl {
            op: k.op,
            op_type: k.op_type,
            impl_id,
            kind,
            vendor: None,
            priority: 0,
            device: DeviceKind::CPU,
            dtypes: Vec::new(),
            available: None,
            kernel: k.kernel,
            supports_args: None,
            misplaced_supports: None,
            compiled_in: false,
            by_name_only: false,
            counters: ImplCounters::default(),
        }
    }

    /// Sets the vendor name (compared case-insensitively by allow/deny lists).
    pub fn vendor(mut self, vendor: impl Into<String>) -> Self {
        self.vendor = Some(vendor.into());
        self
    }
    /// Sets the priority (higher first within one policy token).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
    /// Sets the device kind the kernel runs on.
    pub fn device(mut self, device: DeviceKind) -> Self {
        self.device = device;
        self
    }
    /// Limits the primary dtypes the impl accepts (empty: any).
    pub fn dtypes(mut self, dtypes: &[DType]) -> Self {
        self.dtypes = dtypes.to_vec();
        self
    }
    /// Adds an availability check, run when a chain is resolved (not per call). A check
    /// that panics means unavailable, with the panic's message.
    pub fn available(mut self, check: impl Fn() -> std::result::Result<(), String> + Send + Sync + 'static) -> Self {
        self.available = Some(Arc::new(check));
        self
    }
    /// Adds a cheap per-call check of the arguments (like TE's `get_fused_attn_backend`): when
    /// it answers `Err(reason)`, the manager moves on to the next impl of the chain without
    /// counting a failure (the impl is not passed over for later calls with other arguments),
    /// and `Manager::explain_call` shows the reason. A kernel may also return
    /// [`Error::Unsupported`] to the same effect. `O` must be the op the impl was made for
    /// (registering an impl whose check names another op is an error).
    pub fn supports_args<O: Op>(
        mut self,
        check: impl Fn(&O::Args) -> std::result::Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        if self.op_type == TypeId::of::<O>() {
            let f: SupportsFn<O> = Arc::new(check);
            self.supports_args = Some(Box::new(f));
        } else {
            self.misplaced_supports = Some(O::NAME);
        }
        self
    }
    /// Marks the impl as compiled into tefl (link-time registrations of tefl's own crates):
    /// its outputs are trusted to follow the op's contract. Impls registered at run time and
    /// plugin kernels are not, and the manager checks their outputs.
    #[doc(hidden)]
    pub fn compiled_in(mut self) -> Self {
        self.compiled_in = true;
        self
    }
    /// Takes the impl out of automatic selection: it serves only calls whose op
    /// `TE_FL_PER_OP` routes to it by id (`op=impl:<id>`), and direct calls by id (the
    /// conformance suite). For alternative kernels kept to be tested, such as the portable
    /// kernels on a GPU that has faster ones.
    pub fn by_name_only(mut self) -> Self {
        self.by_name_only = true;
        self
    }

    /// The op's name.
    pub fn op(&self) -> &'static str {
        self.op
    }
    /// The impl id (`vendor.nvidia`).
    pub fn impl_id(&self) -> &str {
        &self.impl_id
    }
    /// The kind.
    pub fn kind(&self) -> BackendImplKind {
        self.kind
    }
    /// The vendor name, if any.
    pub fn vendor_name(&self) -> Option<&str> {
        self.vendor.as_deref()
    }
    /// The backend this impl belongs to for `TE_BACKEND`: its vendor, else its kind token.
    pub fn backend_name(&self) -> &str {
        self.vendor.as_deref().unwrap_or(self.kind.token())
    }
    /// The priority.
    pub fn get_priority(&self) -> i32 {
        self.priority
    }
    /// The device kind.
    pub fn device_kind(&self) -> DeviceKind {
        self.device
    }
    /// Accepted primary dtypes (empty: any).
    pub fn supported_dtypes(&self) -> &[DType] {
        &self.dtypes
    }
    /// Whether the impl accepts calls whose primary dtype is `dtype`.
    pub fn supports(&self, dtype: DType) -> bool {
        self.dtypes.is_empty() || self.dtypes.contains(&dtype)
    }
    /// Runs the impl's own availability check; a panic in it is an `Err` with its message.
    pub fn check_available(&self) -> std::result::Result<(), String> {
        match &self.available {
            None => Ok(()),
            Some(f) => contained("availability check", || f()),
        }
    }
    /// Whether the impl is compiled into tefl (see [`OpImpl::compiled_in`]).
    pub fn is_compiled_in(&self) -> bool {
        self.compiled_in
    }
    /// Whether only routing by id selects it (see [`OpImpl::by_name_only`]).
    pub fn is_by_name_only(&self) -> bool {
        self.by_name_only
    }
    /// Whether the impl has a per-call argument check.
    pub fn has_supports_check(&self) -> bool {
        self.supports_args.is_some()
    }
    /// Runs the impl's per-call argument check (`Ok` when it has none); a panic in it is an
    /// `Err` with its message.
    pub fn check_supports<O: Op>(&self, args: &O::Args) -> std::result::Result<(), String> {
        match self.supports_args.as_ref().and_then(|b| b.downcast_ref::<SupportsFn<O>>()) {
            None => Ok(()),
            Some(f) => contained("supports check", || f(args)),
        }
    }
    /// Whether this impl was registered for op type `O`.
    pub fn is_for<O: Op>(&self) -> bool {
        self.op_type == TypeId::of::<O>()
    }
    /// The typed kernel, or an error when `O` is not the op the impl was registered for.
    pub fn kernel<O: Op>(&self) -> Result<&KernelFn<O>> {
        self.kernel.downcast_ref::<KernelFn<O>>().ok_or_else(|| Error::KernelTypeMismatch {
            impl_id: self.impl_id.clone(),
            registered: self.op,
            called: O::NAME,
        })
    }
    /// Its counters.
    pub fn counters(&self) -> &ImplCounters {
        &self.counters
    }
    /// `(kind=<kind>, vendor=<vendor>)` as TE-FL's log lines print it.
    pub fn describe(&self) -> String {
        format!("(kind={}, vendor={})", self.kind, self.vendor.as_deref().unwrap_or("None"))
    }
}

impl fmt::Debug for OpImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpImpl")
            .field("op", &self.op)
            .field("impl_id", &self.impl_id)
            .field("kind", &self.kind)
            .field("vendor", &self.vendor)
            .field("priority", &self.priority)
            .field("device", &self.device)
            .field("dtypes", &self.dtypes)
            .finish_non_exhaustive()
    }
}

/// A vendor's description, after FlagGems' `VendorInfoBase`.
#[derive(Clone)]
pub struct VendorInfo {
    /// The vendor name (`nvidia`): what impls' `vendor` and allow/deny lists use.
    pub vendor_name: String,
    /// The device name (`cuda`).
    pub device_name: String,
    /// A command that only succeeds on this vendor's hardware (`nvidia-smi`). Metadata and a
    /// diagnostic probe: never run on the dispatch path.
    pub device_query_cmd: String,
    /// Dispatch key; defaults to the device name upper-cased.
    pub dispatch_key: Option<String>,
    /// Architecture prefixes to family names, first match wins (`sm_9` → `hopper`).
    pub arch_map: Vec<(String, String)>,
    /// Ops this vendor does not want used: its impls of them are removed at registration.
    pub unused_ops: Vec<String>,
    /// Whether the vendor's driver is usable here (`Err` says why not).
    pub availability: AvailabilityFn,
    /// Which kernel one of the vendor's impls (by id) of an op runs for a device and dtype
    /// (where it has more than one, chosen by arch and tune configs): `explain` shows it under
    /// the impl.
    pub kernels: Option<KernelChoiceFn>,
}

/// A vendor's answer to "which kernel would your impl `impl_id` of `op` run on `device` for
/// `dtype`", called as `f(impl_id, op, device, dtype)` (`None`: one kernel, or nothing to say).
pub type KernelChoiceFn = Arc<dyn Fn(&str, &str, Device, DType) -> Option<String> + Send + Sync>;

impl VendorInfo {
    /// A vendor with no arch map, no unused ops and an always-available check.
    pub fn new(vendor_name: &str, device_name: &str, device_query_cmd: &str) -> Self {
        VendorInfo {
            vendor_name: vendor_name.into(),
            device_name: device_name.into(),
            device_query_cmd: device_query_cmd.into(),
            dispatch_key: None,
            arch_map: Vec::new(),
            unused_ops: Vec::new(),
            availability: Arc::new(|| Ok(())),
            kernels: None,
        }
    }
    /// Sets the kernel-choice description `explain` shows (see [`VendorInfo::kernels`]).
    pub fn kernels(mut self, f: impl Fn(&str, &str, Device, DType) -> Option<String> + Send + Sync + 'static) -> Self {
        self.kernels = Some(Arc::new(f));
        self
    }
    /// The kernel the vendor's impl `impl_id` of `op` runs on `device` for `dtype`, where the
    /// vendor says; a panic in the vendor's function reads as nothing said.
    pub fn kernel_for(&self, impl_id: &str, op: &str, device: Device, dtype: DType) -> Option<String> {
        let f = self.kernels.as_ref()?;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(impl_id, op, device, dtype))).ok().flatten()
    }
    /// Sets the arch map.
    pub fn arch_map(mut self, map: &[(&str, &str)]) -> Self {
        self.arch_map = map.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        self
    }
    /// Sets the unused ops.
    pub fn unused_ops(mut self, ops: &[&str]) -> Self {
        self.unused_ops = ops.iter().map(|s| s.to_string()).collect();
        self
    }
    /// Sets the availability check.
    pub fn availability(mut self, f: impl Fn() -> std::result::Result<(), String> + Send + Sync + 'static) -> Self {
        self.availability = Arc::new(f);
        self
    }
    /// The dispatch key: the explicit one, else the device name upper-cased.
    pub fn dispatch_key(&self) -> String {
        self.dispatch_key.clone().unwrap_or_else(|| self.device_name.to_ascii_uppercase())
    }
    /// The family of an arch string (`sm_90` → `hopper`), from the arch map.
    pub fn arch_family(&self, arch: &str) -> Option<&str> {
        self.arch_map.iter().find(|(p, _)| arch.starts_with(p.as_str())).map(|(_, f)| f.as_str())
    }
    /// Runs the availability check; a panic in it is an `Err` with its message.
    pub fn check_available(&self) -> std::result::Result<(), String> {
        contained("vendor availability check", || (self.availability)())
    }
}

impl fmt::Debug for VendorInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VendorInfo")
            .field("vendor_name", &self.vendor_name)
            .field("device_name", &self.device_name)
            .field("device_query_cmd", &self.device_query_cmd)
            .field("dispatch_key", &self.dispatch_key())
            .field("arch_map", &self.arch_map)
            .field("unused_ops", &self.unused_ops)
            .finish_non_exhaustive()
    }
}

/// A link-time impl registration; submitted by [`crate::register_impl!`].
pub struct ImplRegistration {
    /// Builds the impl.
    pub make: fn() -> OpImpl,
}
inventory::collect!(ImplRegistration);

/// An impl's warm-up for one op: starts what a call with these arguments would do before its
/// first launch (compiling its kernels, on other threads), running nothing and writing nothing
/// (see [`crate::Manager::warmup`]). Triton's `JITFunction.warmup` is the model.
pub type WarmupFn<O> = fn(&KernelCtx<'_>, &<O as Op>::Args) -> Result<()>;

/// A link-time warm-up of one op of one impl; submitted by [`crate::register_warmup!`].
pub struct WarmupRegistration {
    /// The impl's id.
    pub impl_id: &'static str,
    /// The op's name.
    pub op: &'static str,
    /// The op's [`WarmupFn`], type-erased (a `Box` of `WarmupFn<O>`).
    pub warmup: fn() -> Box<dyn Any + Send + Sync>,
}
inventory::collect!(WarmupRegistration);

/// The warm-up registered for op `O` of impl `impl_id`, if any.
pub(crate) fn warmup_of<O: Op>(impl_id: &str) -> Option<WarmupFn<O>> {
    inventory::iter::<WarmupRegistration>
        .into_iter()
        .filter(|w| w.impl_id == impl_id && w.op == O::NAME)
        .find_map(|w| (w.warmup)().downcast::<WarmupFn<O>>().ok().map(|f| *f))
}

/// Registers warm-ups ([`WarmupFn`]) for ops of a link-time impl:
/// `register_warmup!(IMPL_ID, FusedAttnBwd => attention::warmup_bwd, ...)`.
#[macro_export]
macro_rules! register_warmup {
    ($impl_id:expr, $($op:ty => $f:path),+ $(,)?) => {
        $(
            $crate::__private::inventory::submit! {
                $crate::registry::WarmupRegistration {
                    impl_id: $impl_id,
                    op: <$op as $crate::Op>::NAME,
                    warmup: || ::std::boxed::Box::new($f as $crate::registry::WarmupFn<$op>),
                }
            }
        )+
    };
}

/// A link-time vendor registration; submitted by [`crate::register_vendor!`].
pub struct VendorRegistration {
    /// Builds the vendor info.
    pub make: fn() -> VendorInfo,
}
inventory::collect!(VendorRegistration);

/// Runs a link-time registration's constructor (vendor code), containing a panic.
fn make_contained<T>(make: fn() -> T) -> Result<T> {
    std::panic::catch_unwind(make).map_err(|p| Error::Plugin {
        plugin: "link-time registration".into(),
        reason: format!("constructor panicked: {}", panic_message(&*p)),
    })
}

/// Every impl and vendor known to one manager.
///
/// ```
/// use tefl_core::{BackendImplKind, OpImpl, Registry, catalogue::RmsNormFwd, Error};
/// let mut reg = Registry::new();
/// let mk = || OpImpl::new::<RmsNormFwd>("vendor.x", BackendImplKind::Vendor, |_, _| {
///     Err(Error::invalid("rmsnorm_fwd", "x", "not for real"))
/// });
/// reg.register_impl(mk()).unwrap();
/// assert!(matches!(reg.register_impl(mk()), Err(Error::DuplicateImpl { .. })));
/// ```
#[derive(Default)]
pub struct Registry {
    impls: BTreeMap<&'static str, Vec<Arc<OpImpl>>>,
    vendors: BTreeMap<String, VendorInfo>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// A registry of everything linked in (vendors first, then impls). A duplicate is
    /// logged as an ERROR and skipped; use [`Registry::try_with_builtins`] to get the error.
    pub fn with_builtins() -> Self {
        let mut reg = Registry::new();
        for v in inventory::iter::<VendorRegistration> {
            match make_contained(v.make) {
                Ok(info) => reg.register_vendor(info),
                Err(e) => tracing::error!(target: "TE-FL", "{e}"),
            }
        }
        for r in inventory::iter::<ImplRegistration> {
            if let Err(e) = make_contained(r.make).and_then(|imp| reg.register_impl(imp)) {
                tracing::error!(target: "TE-FL", "{e}");
            }
        }
        reg
    }

    /// Like [`Registry::with_builtins`], but a duplicate registration is an error.
    pub fn try_with_builtins() -> Result<Self> {
        let mut reg = Registry::new();
        for v in inventory::iter::<VendorRegistration> {
            reg.register_vendor(make_contained(v.make)?);
        }
        for r in inventory::iter::<ImplRegistration> {
            reg.register_impl(make_contained(r.make)?)?;
        }
        Ok(reg)
    }

    /// Whether `op` has an impl `impl_id`.
    pub fn contains(&self, op: &str, impl_id: &str) -> bool {
        self.impls_of(op).iter().any(|i| i.impl_id == impl_id)
    }

    /// Adds a vendor. Its `unused_ops` remove that vendor's impls of those ops, now and later.
    pub fn register_vendor(&mut self, info: VendorInfo) {
        let key = info.vendor_name.to_ascii_lowercase();
        for op in &info.unused_ops {
            if let Some(list) = self.impls.get_mut(op.as_str()) {
                list.retain(|i| !i.vendor_name().is_some_and(|v| v.eq_ignore_ascii_case(&key)));
            }
        }
        self.vendors.insert(key, info);
    }

    /// Adds an impl. A second impl with the same (op, impl_id) is an error. An impl of an op
    /// its vendor lists in `unused_ops` is dropped (logged at INFO), not an error.
    pub fn register_impl(&mut self, imp: OpImpl) -> Result<()> {
        if let Some(other) = imp.misplaced_supports {
            return Err(Error::invalid(
                "register_impl",
                "supports_args",
                format!("impl '{}' of op '{}' has a supports check written for op '{other}'", imp.impl_id, imp.op),
            ));
        }
        let list = self.impls.entry(imp.op).or_default();
        if list.iter().any(|i| i.impl_id == imp.impl_id) {
            return Err(Error::DuplicateImpl { op: imp.op, impl_id: imp.impl_id });
        }
        if let Some(v) = imp.vendor_name().and_then(|v| self.vendors.get(&v.to_ascii_lowercase()))
            && v.unused_ops.iter().any(|o| o == imp.op)
        {
            tracing::info!(target: "TE-FL", "Impl '{}' for op '{}' dropped: listed in unused_ops of vendor '{}'", imp.impl_id, imp.op, v.vendor_name);
            return Ok(());
        }
        list.push(Arc::new(imp));
        Ok(())
    }

    /// The impls of `op`, in registration order.
    pub fn impls_of(&self, op: &str) -> &[Arc<OpImpl>] {
        self.impls.get(op).map_or(&[], |v| v.as_slice())
    }

    /// Every impl, grouped by op name.
    pub fn all_impls(&self) -> impl Iterator<Item = &Arc<OpImpl>> {
        self.impls.values().flatten()
    }

    /// Every (op, impl_id) pair, sorted.
    pub fn op_impl_pairs(&self) -> Vec<(String, String)> {
        let mut v: Vec<_> = self.all_impls().map(|i| (i.op.to_string(), i.impl_id.clone())).collect();
        v.sort();
        v
    }

    /// The distinct impl ids, sorted (what `Registered impl_ids: [...]` prints).
    pub fn impl_ids(&self) -> Vec<String> {
        let mut v: Vec<_> = self.all_impls().map(|i| i.impl_id.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// A vendor by name (case-insensitive).
    pub fn vendor(&self, name: &str) -> Option<&VendorInfo> {
        self.vendors.get(&name.to_ascii_lowercase())
    }

    /// Every vendor, sorted by name.
    pub fn vendors(&self) -> impl Iterator<Item = &VendorInfo> {
        self.vendors.values()
    }
}

/// Registers an impl at link time, next to its kernel.
///
/// ```ignore
/// tefl_core::register_impl! {
///     op: RmsNormFwd, impl_id: "vendor.nvidia", kind: Vendor, vendor: "nvidia", priority: 100,
///     device: DeviceKind::CUDA, dtypes: [F32, F16, BF16], kernel: ops::norm::rmsnorm_fwd,
/// }
/// ```
/// `kind` defaults to `Vendor`; `vendor` may be omitted (reference and portable impls);
/// an optional trailing `available: <fn() -> Result<(), String>>` adds an availability check.
#[macro_export]
macro_rules! register_impl {
    (
        op: $op:ty, impl_id: $id:expr, $(kind: $kind:ident,)? $(vendor: $vendor:expr,)?
        priority: $prio:expr, device: $dev:expr, dtypes: [$($dt:ident),* $(,)?], kernel: $k:expr
        $(, available: $av:expr)? $(,)?
    ) => {
        const _: () = {
            fn __tefl_make_impl() -> $crate::OpImpl {
                let imp = $crate::OpImpl::new::<$op>($id, $crate::__impl_kind!($($kind)?), $k)
                    .priority($prio)
                    .device($dev)
                    .dtypes(&[$($crate::DType::$dt),*])
                    .compiled_in();
                $(let imp = imp.vendor($vendor);)?
                $(let imp = imp.available($av);)?
                imp
            }
            $crate::__private::inventory::submit! {
                $crate::registry::ImplRegistration { make: __tefl_make_impl }
            }
        };
    };
}

/// Registers one backend's kernels, the one registration macro every backend uses:
///
/// ```ignore
/// tefl_core::register_backend! {
///     impl_id: "vendor.acme", kind: Vendor, vendor: "acme", device: DeviceKind::CUDA,
///     available: crate::kernels_available,
///     ops: all
/// }
/// ```
///
/// `ops: all` registers every wave-1 op of the catalogue with the kernel a complete backend
/// names for it by convention (`ops/norm.rs` → `norm::rmsnorm_fwd`; the list is in
/// `catalogue/mod.rs`); `ops: all + fp8` adds the FP8 training set (FP8 inputs to the GEMMs,
/// `bgrad_quantize`, `te_general_grouped_gemm`), and `ops: all + fp8 ops` the set's two ops
/// alone, for a backend whose GEMMs take float inputs only. A partial backend lists its own:
/// `ops: { floats { RmsNormFwd => norm::rmsnorm_fwd; } any { } }`. `floats` ops accept
/// f32/f16/bf16 as their primary dtype, `any` ops (first tensor not a float) accept any, and
/// an optional `gemms [F32, F16, BF16, F8E4M3] { GenericGemm => gemm::generic_gemm; }` section
/// names the dtypes its ops accept. It also defines `pub const OPS: &[&str]`, the names
/// registered. `vendor` and `available` are optional; the priority is 0.
#[macro_export]
macro_rules! register_backend {
    (
        impl_id: $id:expr, kind: $kind:ident, $(vendor: $vendor:expr,)? device: $dev:expr,
        $(available: $av:expr,)? ops: all $(,)?
    ) => {
        $crate::__catalogue_kernels! {
            [F32, F16, BF16] {} {}
            impl_id: $id, kind: $kind, $(vendor: $vendor,)? device: $dev, $(available: $av,)?
        }
    };
    (
        impl_id: $id:expr, kind: $kind:ident, $(vendor: $vendor:expr,)? device: $dev:expr,
        $(available: $av:expr,)? ops: all + fp8 $(,)?
    ) => {
        $crate::__catalogue_kernels! {
            [F32, F16, BF16, F8E4M3, F8E5M2]
            { BgradQuantize => quantize::bgrad_quantize; }
            { GroupedGemm => gemm::grouped_gemm; }
            impl_id: $id, kind: $kind, $(vendor: $vendor,)? device: $dev, $(available: $av,)?
        }
    };
    (
        impl_id: $id:expr, kind: $kind:ident, $(vendor: $vendor:expr,)? device: $dev:expr,
        $(available: $av:expr,)? ops: all + fp8 ops $(,)?
    ) => {
        $crate::__catalogue_kernels! {
            [F32, F16, BF16]
            { BgradQuantize => quantize::bgrad_quantize; }
            { GroupedGemm => gemm::grouped_gemm; }
            impl_id: $id, kind: $kind, $(vendor: $vendor,)? device: $dev, $(available: $av,)?
        }
    };
    (
        impl_id: $id:expr, kind: $kind:ident, $(vendor: $vendor:expr,)? device: $dev:expr,
        $(available: $av:expr,)?
        ops: {
            floats { $($fop:ident => $fk:path;)* }
            any { $($aop:ident => $ak:path;)* }
            $(gemms [$($gd:ident),*] { $($gop:ident => $gk:path;)* })?
        } $(,)?
    ) => {
        const _: () = {
            const VENDOR: ::std::option::Option<&str> = $crate::__optional!($($vendor)?);
            const AVAILABLE: ::std::option::Option<fn() -> ::std::result::Result<(), ::std::string::String>> =
                $crate::__optional!($($av)?);
            fn backend_impl<O: $crate::Op>(
                dtypes: &[$crate::DType],
                kernel: fn(&$crate::KernelCtx<'_>, &O::Args) -> $crate::Result<O::Output>,
            ) -> $crate::OpImpl {
                let imp = $crate::OpImpl::new::<O>($id, $crate::__impl_kind!($kind), kernel)
                    .priority(0)
                    .device($dev)
                    .dtypes(dtypes)
                    .compiled_in();
                let imp = match VENDOR {
                    Some(v) => imp.vendor(v),
                    None => imp,
                };
                match AVAILABLE {
                    Some(check) => imp.available(check),
                    None => imp,
                }
            }
            $(
                $crate::__private::inventory::submit! {
                    $crate::registry::ImplRegistration {
                        make: || backend_impl::<$fop>(&[$crate::DType::F32, $crate::DType::F16, $crate::DType::BF16], $fk),
                    }
                }
            )*
            $(
                $crate::__private::inventory::submit! {
                    $crate::registry::ImplRegistration { make: || backend_impl::<$aop>(&[], $ak) }
                }
            )*
            $(
                const GEMM_DTYPES: &[$crate::DType] = &[$($crate::DType::$gd),*];
                $(
                    $crate::__private::inventory::submit! {
                        $crate::registry::ImplRegistration { make: || backend_impl::<$gop>(GEMM_DTYPES, $gk) }
                    }
                )*
            )?
        };
        /// The ops this backend registers, by name.
        pub const OPS: &[&str] = &[
            $(<$fop as $crate::Op>::NAME,)* $(<$aop as $crate::Op>::NAME,)* $($(<$gop as $crate::Op>::NAME,)*)?
        ];
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __optional {
    () => {
        ::std::option::Option::None
    };
    ($e:expr) => {
        ::std::option::Option::Some($e)
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __impl_kind {
    () => {
        $crate::BackendImplKind::Vendor
    };
    ($k:ident) => {
        $crate::BackendImplKind::$k
    };
}

/// Registers a vendor at link time: `register_vendor!(fn_returning_vendor_info);`.
#[macro_export]
macro_rules! register_vendor {
    ($make:path) => {
        $crate::__private::inventory::submit! {
            $crate::registry::VendorRegistration { make: $make }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::{RmsNormBwd, RmsNormFwd};

    fn failing(id: &str) -> OpImpl {
        OpImpl::new::<RmsNormFwd>(id, BackendImplKind::Vendor, |_, _| Err(Error::invalid("rmsnorm_fwd", "x", "test")))
    }

    #[test]
    fn duplicates_are_errors_per_op() {
        let mut r = Registry::new();
        r.register_impl(failing("vendor.a")).unwrap();
        assert!(matches!(r.register_impl(failing("vendor.a")), Err(Error::DuplicateImpl { .. })));
        // Same impl id, other op: fine.
        r.register_impl(OpImpl::new::<RmsNormBwd>("vendor.a", BackendImplKind::Vendor, |_, _| {
            Err(Error::invalid("rmsnorm_bwd", "x", "test"))
        }))
        .unwrap();
        assert_eq!(r.impl_ids(), vec!["vendor.a".to_string()]);
        assert_eq!(r.op_impl_pairs().len(), 2);
    }

    #[test]
    fn unused_ops_remove_vendor_impls() {
        let mut r = Registry::new();
        r.register_impl(failing("vendor.a").vendor("Acme")).unwrap();
        r.register_impl(failing("vendor.b").vendor("other")).unwrap();
        r.register_vendor(VendorInfo::new("acme", "npu", "npu-smi").unused_ops(&["rmsnorm_fwd"]));
        assert_eq!(r.impl_ids(), vec!["vendor.b".to_string()]);
        r.register_impl(failing("vendor.c").vendor("ACME")).unwrap();
        assert_eq!(r.impl_ids(), vec!["vendor.b".to_string()]);
    }

    #[test]
    fn a_supports_check_for_another_op_is_refused() {
        let mut r = Registry::new();
        let imp = failing("vendor.a").supports_args::<RmsNormBwd>(|_| Ok(()));
        assert!(matches!(r.register_impl(imp), Err(Error::InvalidArgument { arg: "supports_args", .. })));
        let imp = failing("vendor.a").supports_args::<RmsNormFwd>(|_| Ok(()));
        assert!(imp.has_supports_check());
        r.register_impl(imp).unwrap();
    }

    #[test]
    fn kernel_downcast_is_type_checked() {
        let imp = failing("vendor.a");
        assert!(imp.kernel::<RmsNormFwd>().is_ok());
        assert!(matches!(imp.kernel::<RmsNormBwd>(), Err(Error::KernelTypeMismatch { .. })));
    }

    #[test]
    fn vendor_info_defaults() {
        let v = VendorInfo::new("nvidia", "cuda", "nvidia-smi").arch_map(&[("sm_9", "hopper"), ("sm_8", "ampere")]);
        assert_eq!(v.dispatch_key(), "CUDA");
        assert_eq!(v.arch_family("sm_90a"), Some("hopper"));
        assert_eq!(v.arch_family("sm_75"), None);
    }
}
