//! Devices, device kinds and the device runtimes that backends register.
//!
//! [`DeviceKind`] is open: it is a registered name, not an enum, so an out-of-tree vendor
//! (an NPU, an MLU) brings its own kind together with its [`DeviceRuntime`].

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::{Error, Result};

/// The kind of a device: a short lower-case name (`cpu`, `cuda`, `hip`, `vulkan`, or a vendor's own).
///
/// ```
/// use tefl_core::DeviceKind;
/// const NPU: DeviceKind = DeviceKind::new("npu");
/// assert_eq!(NPU.name(), "npu");
/// assert_eq!(DeviceKind::intern("cuda").unwrap(), DeviceKind::CUDA);
/// ```
#[derive(Clone, Copy)]
pub struct DeviceKind(&'static str);

impl DeviceKind {
    /// The host CPU.
    pub const CPU: DeviceKind = DeviceKind("cpu");
    /// NVIDIA CUDA devices.
    pub const CUDA: DeviceKind = DeviceKind("cuda");
    /// AMD HIP devices.
    pub const HIP: DeviceKind = DeviceKind("hip");
    /// Vulkan compute devices.
    pub const VULKAN: DeviceKind = DeviceKind("vulkan");

    /// A kind from a static name. Use lower-case ASCII letters, digits and `_`.
    pub const fn new(name: &'static str) -> Self {
        DeviceKind(name)
    }

    /// A kind from a run-time name (plugins, configuration). The name is validated and
    /// interned once, so the returned kind is `Copy` and cheap to compare.
    pub fn intern(name: &str) -> Result<Self> {
        let valid = !name.is_empty()
            && name.len() <= 32
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(Error::Tensor(format!(
                "invalid device kind {name:?}: use 1-32 lower-case ASCII letters, digits or '_'"
            )));
        }
        for k in [Self::CPU, Self::CUDA, Self::HIP, Self::VULKAN] {
            if k.0 == name {
                return Ok(k);
            }
        }
        static INTERNED: OnceLock<RwLock<Vec<&'static str>>> = OnceLock::new();
        let table = INTERNED.get_or_init(Default::default);
        if let Some(s) = read_lock(table).iter().find(|s| **s == name) {
            return Ok(DeviceKind(s));
        }
        let mut w = write_lock(table);
        if let Some(s) = w.iter().find(|s| **s == name) {
            return Ok(DeviceKind(s));
        }
        // Interned names live for the whole process; there are only a handful of kinds.
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        w.push(leaked);
        Ok(DeviceKind(leaked))
    }

    /// The name.
    pub const fn name(self) -> &'static str {
        self.0
    }
}

impl PartialEq for DeviceKind {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0) || self.0 == other.0
    }
}
impl Eq for DeviceKind {}
impl Hash for DeviceKind {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}
impl PartialOrd for DeviceKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for DeviceKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(other.0)
    }
}
impl fmt::Debug for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceKind({})", self.0)
    }
}
impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// One device: a kind and an ordinal (`cuda:1`). The CPU is `cpu` (ordinal 0).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// The kind.
    pub kind: DeviceKind,
    /// Which device of that kind.
    pub ordinal: u32,
}

impl Device {
    /// The host CPU.
    pub const CPU: Device = Device { kind: DeviceKind::CPU, ordinal: 0 };

    /// A device of the given kind and ordinal.
    pub const fn new(kind: DeviceKind, ordinal: u32) -> Self {
        Device { kind, ordinal }
    }

    /// `cuda:<ordinal>`.
    pub const fn cuda(ordinal: u32) -> Self {
        Device::new(DeviceKind::CUDA, ordinal)
    }

    /// True for the host CPU.
    pub fn is_cpu(&self) -> bool {
        self.kind == DeviceKind::CPU
    }

    /// The best device this process can use: the first available of cuda, hip, any
    /// out-of-tree kind, vulkan, and finally the CPU. Never panics; no driver means "not chosen".
    pub fn best_available() -> Device {
        let runtimes = runtimes_snapshot();
        let rank = |k: DeviceKind| match k.name() {
            "cuda" => 0,
            "hip" => 1,
            "vulkan" => 3,
            "cpu" => 4,
            _ => 2,
        };
        let mut kinds: Vec<_> = runtimes.iter().map(|r| r.kind()).collect();
        kinds.sort_by_key(|k| (rank(*k), *k));
        for k in kinds {
            if let Some(rt) = runtimes.iter().find(|r| r.kind() == k)
                && rt.device_count() > 0
            {
                return Device::new(k, 0);
            }
        }
        Device::CPU
    }

    /// Whether the device exists and its runtime is usable here.
    pub fn is_available(&self) -> bool {
        runtime(self.kind).is_ok_and(|rt| (self.ordinal as usize) < rt.device_count())
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_cpu() { f.write_str("cpu") } else { write!(f, "{}:{}", self.kind, self.ordinal) }
    }
}
impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Device {
    type Err = Error;
    /// Parses `cpu`, `cuda`, `cuda:1`, `vulkan:0`, `npu:3`.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let (name, ord) = match s.split_once(':') {
            Some((n, o)) => {
                let ord = o
                    .parse::<u32>()
                    .map_err(|_| Error::Tensor(format!("invalid device {s:?}: ordinal {o:?} is not a number")))?;
                (n, ord)
            }
            None => (s, 0),
        };
        Ok(Device::new(DeviceKind::intern(&name.to_ascii_lowercase())?, ord))
    }
}

/// Device memory owned by a runtime. Backends implement it for their allocations.
pub trait Buffer: Send + Sync + 'static {
    /// The device the memory is on.
    fn device(&self) -> Device;
    /// Its size in bytes.
    fn len_bytes(&self) -> usize;
    /// For downcasting to the backend's concrete type.
    fn as_any(&self) -> &dyn Any;
    /// The address of the first byte where other libraries can use it (a host pointer, a CUDA
    /// device pointer), for zero-copy export (DLPack); `None` where there is no such address.
    fn raw_address(&self) -> Option<u64> {
        None
    }
}

/// What a backend provides for its device kind: memory, copies and identification.
/// Every method reports problems as errors; none may panic when the driver is missing.
pub trait DeviceRuntime: Send + Sync + 'static {
    /// The kind this runtime serves.
    fn kind(&self) -> DeviceKind;
    /// How many devices are usable (0 when the driver is missing or skipped).
    fn device_count(&self) -> usize;
    /// Why no device is usable, when `device_count() == 0`.
    fn unavailable_reason(&self) -> Option<String> {
        None
    }
    /// A human-readable device name.
    fn name(&self, ordinal: u32) -> String;
    /// The architecture string used for tune-config lookup (`sm_90`, `gfx942`, ...).
    fn arch(&self, ordinal: u32) -> String;
    /// Allocates `bytes` bytes (contents unspecified) on `device`.
    fn alloc(&self, device: Device, bytes: usize) -> Result<Arc<dyn Buffer>>;
    /// Copies host bytes into a buffer of this runtime (sizes must match).
    fn copy_from_host(&self, dst: &dyn Buffer, src: &[u8]) -> Result<()>;
    /// Queues a copy of host bytes into a buffer of this runtime (sizes must match) on the
    /// queue this thread's ops run on ([`DeviceRuntime::queue`]), returning once `src` has been
    /// read but without waiting for the copy: for bytes that only work queued after it on that
    /// queue reads (a kernel's table of tensor addresses), where a host wait would stall the
    /// device between the work before and after it. This default is
    /// [`DeviceRuntime::copy_from_host`].
    fn copy_from_host_queued(&self, dst: &dyn Buffer, src: &[u8]) -> Result<()> {
        self.copy_from_host(dst, src)
    }
    /// Copies a buffer of this runtime into host bytes (sizes must match).
    fn copy_to_host(&self, src: &dyn Buffer, dst: &mut [u8]) -> Result<()>;
    /// Waits for all work queued on `device`.
    fn synchronize(&self, device: Device) -> Result<()>;
    /// Seconds `work` takes on `device`. Runtimes time it on the device where they can (events
    /// around the work on the device's queue); this default synchronizes before and after and
    /// reads the host clock.
    fn time_on_device(&self, device: Device, work: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        self.synchronize(device)?;
        let start = std::time::Instant::now();
        work()?;
        self.synchronize(device)?;
        Ok(start.elapsed().as_secs_f64())
    }
    /// Seconds `work` takes on `device`, queued right after `before` (untimed: the L2 flush a
    /// benchmark runs between repetitions). Runtimes with device timing queue `work` behind
    /// `before` without a host wait, so the device is still busy with `before` while the host
    /// queues `work`, and `work`'s launch latency is not counted; this default runs `before`,
    /// then times `work` with [`DeviceRuntime::time_on_device`].
    fn time_after(
        &self,
        device: Device,
        before: &mut dyn FnMut() -> Result<()>,
        work: &mut dyn FnMut() -> Result<()>,
    ) -> Result<f64> {
        before()?;
        self.time_on_device(device, work)
    }
    /// Seconds each of `reps` repetitions of `work` takes on `device`, each queued right after
    /// `before` (untimed) as in [`DeviceRuntime::time_after`]. Runtimes with device timing queue
    /// every repetition, then wait once, as a PyTorch benchmark loop with CUDA events does (the
    /// device runs flush, work, flush, work, ... back to back, with no host wait between
    /// repetitions); this default calls [`DeviceRuntime::time_after`] once a repetition.
    fn time_reps_after(
        &self,
        device: Device,
        reps: usize,
        before: &mut dyn FnMut() -> Result<()>,
        work: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<f64>> {
        (0..reps).map(|_| self.time_after(device, before, work)).collect()
    }
    /// Copies `src` into `dst` (equal sizes, both of this runtime). Runtimes copy on the
    /// device; this default stages the bytes through the host.
    fn copy_device_to_device(&self, src: &dyn Buffer, dst: &dyn Buffer) -> Result<()> {
        if src.len_bytes() != dst.len_bytes() {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", src.len_bytes(), dst.len_bytes())));
        }
        let mut staged = try_zeroed_bytes(src.len_bytes(), || "a host staging copy".into())?;
        self.copy_to_host(src, &mut staged)?;
        self.copy_from_host(dst, &staged)
    }
    /// `bytes` bytes on `device` whose contents the caller overwrites before reading (kernel
    /// outputs): no zero fill where the runtime can skip it. Poisoned like [`alloc`](Self::alloc)
    /// when allocations are poisoned. Defaults to `alloc`.
    fn alloc_uninit(&self, device: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.alloc(device, bytes)
    }
    /// Sets every byte of `dst` to `byte` on the device. This default uploads a host buffer.
    fn fill(&self, dst: &dyn Buffer, byte: u8) -> Result<()> {
        let mut host = try_zeroed_bytes(dst.len_bytes(), || "a host fill buffer".into())?;
        if byte != 0 {
            host.fill(byte);
        }
        self.copy_from_host(dst, &host)
    }
    /// Leaves the device's last-level cache holding nothing a benchmark's next timed call reads
    /// (bench's L2 flush before each timed repetition), by way of `scratch`, a buffer of this
    /// runtime larger than that cache whose contents it overwrites; queued like
    /// [`fill`](Self::fill), nothing waits for it. This default fills `scratch` with zeros. A
    /// runtime whose kernels can hold cache lines at a raised eviction priority, which a fill
    /// does not evict, first puts such lines back (CUDA: lines loaded with an L2 evict_last
    /// policy).
    fn flush_cache(&self, scratch: &dyn Buffer) -> Result<()> {
        self.fill(scratch, 0)
    }
    /// The facts about a device that kernels and launch heuristics need. This default knows
    /// only the name and arch; GPU runtimes query the rest once. Read it through [`info`],
    /// which caches it per device.
    fn device_info(&self, ordinal: u32) -> Result<DeviceInfo> {
        Ok(DeviceInfo::basic(Device::new(self.kind(), ordinal), self.name(ordinal), self.arch(ordinal)))
    }
    /// The queue (CUDA/HIP stream, Vulkan queue) ops on `device` run on from this thread: the
    /// one handed in with [`with_queue`] when there is one, else the runtime's own. A caller
    /// that shares the device with another library orders its work against this one.
    fn queue(&self, device: Device) -> Result<Queue> {
        Ok(current_queue(device).unwrap_or(Queue { device, handle: 0, external: false }))
    }
    /// Whether ops can run on a queue handed in with [`with_queue`] (else opening such a scope
    /// is an error).
    fn accepts_external_queues(&self) -> bool {
        false
    }
    /// A buffer over `bytes` bytes at `address` on `device` that another library allocated
    /// (zero-copy DLPack import: a torch CUDA tensor, a NumPy array): tefl reads and writes them
    /// in place and drops `owner`, which keeps the memory alive, with the buffer. Runtimes that
    /// cannot use foreign memory answer with an error (the caller copies instead).
    ///
    /// # Safety
    /// `address` must be valid for reads and writes of `bytes` bytes on `device` until `owner`
    /// is dropped, and nothing may write the memory while an op runs on it except that op.
    unsafe fn import_external(
        &self,
        device: Device,
        address: u64,
        bytes: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<Arc<dyn Buffer>> {
        let _ = (address, bytes, owner);
        Err(Error::DeviceFailure {
            device: device.to_string(),
            reason: format!("the {} runtime cannot use memory it did not allocate", device.kind),
        })
    }
    /// Orders the runtime's own queue after the work queued so far on the caller's queue
    /// `handle` (a stream that used tefl memory handed out without a copy), so that releasing
    /// that memory on the runtime's queue waits for it. Runtimes without queues do nothing.
    fn wait_for_queue(&self, device: Device, handle: u64) -> Result<()> {
        let _ = (device, handle);
        Ok(())
    }
    /// How many warnings and errors the driver's debug layers reported so far in this process
    /// (Vulkan's validation layers when `VK_INSTANCE_LAYERS` enables them); the conformance
    /// suite fails on any. 0 for runtimes without such layers.
    fn validation_messages(&self) -> usize {
        0
    }
}

/// Facts about one device, looked up once per device ([`info`]) and passed down to launch
/// heuristics and kernel builds instead of each querying the driver its own way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device.
    pub device: Device,
    /// Its human-readable name (keys of cached tuning results).
    pub name: String,
    /// The architecture string (`sm_90`, `gfx942`).
    pub arch: String,
    /// The arch family tune configs are layered by (`hopper`, `cdna3`), from the vendor's
    /// [`VendorInfo::arch_family`](crate::VendorInfo::arch_family); `None` when unknown.
    pub arch_family: Option<String>,
    /// Streaming multiprocessors / compute units.
    pub compute_units: u32,
    /// Lanes of a warp, wavefront or subgroup (1 on the CPU).
    pub warp_size: u32,
    /// The most threads a block may have.
    pub max_threads_per_block: u32,
    /// Shared memory a block gets without opting in, in bytes.
    pub shared_memory_per_block: usize,
    /// Shared memory a block can opt in to, in bytes (≥ `shared_memory_per_block`).
    pub shared_memory_per_block_optin: usize,
    /// Device memory in bytes (0 when unknown).
    pub total_memory: usize,
    /// Whether 16-bit floats can be stored and loaded (Vulkan's `storageBuffer16BitAccess`).
    pub storage_16bit: bool,
    /// The driver's version, for keys of cached tuning results (`unknown` when not known).
    pub driver_version: String,
}

impl DeviceInfo {
    /// What every runtime knows: name and arch, one compute unit, no shared memory.
    pub fn basic(device: Device, name: String, arch: String) -> DeviceInfo {
        DeviceInfo {
            device,
            name,
            arch,
            arch_family: None,
            compute_units: 1,
            warp_size: 1,
            max_threads_per_block: 1,
            shared_memory_per_block: 0,
            shared_memory_per_block_optin: 0,
            total_memory: 0,
            storage_16bit: true,
            driver_version: "unknown".into(),
        }
    }
}

/// The facts of `device`, queried from its runtime once per process and shared.
pub fn info(device: Device) -> Result<Arc<DeviceInfo>> {
    static CACHE: OnceLock<RwLock<HashMap<Device, Arc<DeviceInfo>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(i) = read_lock(cache).get(&device) {
        return Ok(i.clone());
    }
    let rt = runtime(device.kind)?;
    if device.ordinal as usize >= rt.device_count() {
        return Err(Error::DeviceUnavailable {
            device: device.to_string(),
            reason: rt
                .unavailable_reason()
                .unwrap_or_else(|| format!("{} has {} device(s)", device.kind, rt.device_count())),
        });
    }
    let i = Arc::new(rt.device_info(device.ordinal)?);
    Ok(write_lock(cache).entry(device).or_insert(i).clone())
}

/// A queue of a device: the raw handle of a CUDA/HIP stream (0: the runtime's own default),
/// or of a Vulkan queue, and whether it was handed in from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Queue {
    /// The device it belongs to.
    pub device: Device,
    /// The raw handle (`CUstream`, `hipStream_t`, `VkQueue` as an integer).
    pub handle: u64,
    /// Whether the caller handed it in ([`with_queue`]).
    pub external: bool,
}

thread_local! {
    static EXTERNAL_QUEUES: std::cell::RefCell<Vec<Queue>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with ops on `device` from this thread queued on the caller's stream `handle`
/// (PyTorch's current stream, say) instead of the runtime's own; scopes nest. The caller
/// keeps the stream alive for the scope. When the device's runtime cannot adopt an external
/// stream ([`DeviceRuntime::accepts_external_queues`]) this is a typed error and `f` does not
/// run, rather than ops running unordered on the runtime's own queue.
pub fn with_queue<R>(device: Device, handle: u64, f: impl FnOnce() -> R) -> Result<R> {
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            EXTERNAL_QUEUES.with(|q| q.borrow_mut().pop());
        }
    }
    if !runtime(device.kind)?.accepts_external_queues() {
        return Err(Error::DeviceFailure {
            device: device.to_string(),
            reason: format!("the {} runtime cannot run ops on an external queue", device.kind),
        });
    }
    EXTERNAL_QUEUES.with(|q| q.borrow_mut().push(Queue { device, handle, external: true }));
    let _pop = Pop;
    Ok(f())
}

/// The external queue handed in for `device` on this thread (innermost [`with_queue`]).
pub fn current_queue(device: Device) -> Option<Queue> {
    EXTERNAL_QUEUES.with(|q| q.borrow().iter().rev().find(|q| q.device == device).copied())
}

/// A link-time registration of a device runtime (`inventory`). Backends submit one.
pub struct DeviceRuntimeRegistration {
    /// Builds the runtime; called once, lazily. Must not panic without a driver.
    pub make: fn() -> Arc<dyn DeviceRuntime>,
}
inventory::collect!(DeviceRuntimeRegistration);

type RuntimeTable = RwLock<HashMap<DeviceKind, Arc<dyn DeviceRuntime>>>;

fn runtime_table() -> &'static RuntimeTable {
    static TABLE: OnceLock<RuntimeTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut m: HashMap<DeviceKind, Arc<dyn DeviceRuntime>> = HashMap::new();
        m.insert(DeviceKind::CPU, Arc::new(CpuRuntime));
        for reg in inventory::iter::<DeviceRuntimeRegistration> {
            match std::panic::catch_unwind(reg.make).ok().and_then(Contained::new) {
                Some(rt) => {
                    m.entry(rt.kind).or_insert(Arc::new(rt));
                }
                None => tracing::error!(target: "TE-FL", "a device runtime's constructor panicked; its device kind is unavailable"),
            }
        }
        RwLock::new(m)
    })
}

fn runtimes_snapshot() -> Vec<Arc<dyn DeviceRuntime>> {
    read_lock(runtime_table()).values().cloned().collect()
}

/// Registers a device runtime at run time (plugins). Replaces nothing: a kind that already
/// has a runtime keeps it, and an error says so.
pub fn register_device_runtime(rt: Arc<dyn DeviceRuntime>) -> Result<()> {
    let rt = Contained::new(rt)
        .ok_or_else(|| Error::Tensor("the device runtime's kind() panicked; it was not registered".into()))?;
    let mut t = write_lock(runtime_table());
    let kind = rt.kind;
    if t.contains_key(&kind) {
        return Err(Error::Tensor(format!("a device runtime for '{kind}' is already registered")));
    }
    t.insert(kind, Arc::new(rt));
    Ok(())
}

/// A backend's runtime with every call contained: a panic in vendor code becomes an error
/// (or "no device" for the counting and naming calls), never an unwind into the caller.
struct Contained {
    inner: Arc<dyn DeviceRuntime>,
    kind: DeviceKind,
}

impl Contained {
    fn new(inner: Arc<dyn DeviceRuntime>) -> Option<Self> {
        let kind = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.kind())).ok()?;
        Some(Contained { inner, kind })
    }

    fn guard<T>(&self, what: &str, f: impl FnOnce() -> T) -> std::result::Result<T, String> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
            format!("the {} runtime panicked in {what}: {}", self.kind, crate::registry::panic_message(&*p))
        })
    }

    fn fallible<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.guard(what, f).unwrap_or_else(|reason| Err(Error::DeviceFailure { device: self.kind.to_string(), reason }))
    }
}

impl DeviceRuntime for Contained {
    fn kind(&self) -> DeviceKind {
        self.kind
    }
    fn device_count(&self) -> usize {
        self.guard("device_count", || self.inner.device_count()).unwrap_or(0)
    }
    fn unavailable_reason(&self) -> Option<String> {
        self.guard("unavailable_reason", || self.inner.unavailable_reason()).unwrap_or_else(Some)
    }
    fn name(&self, ordinal: u32) -> String {
        self.guard("name", || self.inner.name(ordinal)).unwrap_or_else(|_| format!("unknown {} device", self.kind))
    }
    fn arch(&self, ordinal: u32) -> String {
        self.guard("arch", || self.inner.arch(ordinal)).unwrap_or_else(|_| "unknown".into())
    }
    fn alloc(&self, device: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.fallible("alloc", || self.inner.alloc(device, bytes))
    }
    fn copy_from_host(&self, dst: &dyn Buffer, src: &[u8]) -> Result<()> {
        self.fallible("copy_from_host", || self.inner.copy_from_host(dst, src))
    }
    fn copy_to_host(&self, src: &dyn Buffer, dst: &mut [u8]) -> Result<()> {
        self.fallible("copy_to_host", || self.inner.copy_to_host(src, dst))
    }
    fn synchronize(&self, device: Device) -> Result<()> {
        self.fallible("synchronize", || self.inner.synchronize(device))
    }
    fn time_on_device(&self, device: Device, work: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        self.fallible("time_on_device", || self.inner.time_on_device(device, work))
    }
    fn time_after(
        &self,
        device: Device,
        before: &mut dyn FnMut() -> Result<()>,
        work: &mut dyn FnMut() -> Result<()>,
    ) -> Result<f64> {
        self.fallible("time_after", || self.inner.time_after(device, before, work))
    }
    fn time_reps_after(
        &self,
        device: Device,
        reps: usize,
        before: &mut dyn FnMut() -> Result<()>,
        work: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<f64>> {
        self.fallible("time_reps_after", || self.inner.time_reps_after(device, reps, before, work))
    }
    fn copy_device_to_device(&self, src: &dyn Buffer, dst: &dyn Buffer) -> Result<()> {
        self.fallible("copy_device_to_device", || self.inner.copy_device_to_device(src, dst))
    }
    fn alloc_uninit(&self, device: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.fallible("alloc_uninit", || self.inner.alloc_uninit(device, bytes))
    }
    fn fill(&self, dst: &dyn Buffer, byte: u8) -> Result<()> {
        self.fallible("fill", || self.inner.fill(dst, byte))
    }
    fn flush_cache(&self, scratch: &dyn Buffer) -> Result<()> {
        self.fallible("flush_cache", || self.inner.flush_cache(scratch))
    }
    fn device_info(&self, ordinal: u32) -> Result<DeviceInfo> {
        self.fallible("device_info", || self.inner.device_info(ordinal))
    }
    fn queue(&self, device: Device) -> Result<Queue> {
        self.fallible("queue", || self.inner.queue(device))
    }
    fn accepts_external_queues(&self) -> bool {
        self.guard("accepts_external_queues", || self.inner.accepts_external_queues()).unwrap_or(false)
    }
    unsafe fn import_external(
        &self,
        device: Device,
        address: u64,
        bytes: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<Arc<dyn Buffer>> {
        // SAFETY: the caller's promise is passed on unchanged.
        self.fallible("import_external", || unsafe { self.inner.import_external(device, address, bytes, owner) })
    }
    fn wait_for_queue(&self, device: Device, handle: u64) -> Result<()> {
        self.fallible("wait_for_queue", || self.inner.wait_for_queue(device, handle))
    }
    fn validation_messages(&self) -> usize {
        self.guard("validation_messages", || self.inner.validation_messages()).unwrap_or(0)
    }
}

static POISON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every runtime fill new allocations with `0xFF` bytes (NaN in every float dtype)
/// instead of leaving them unspecified, so that an output a kernel forgets to write cannot
/// pass a comparison. The conformance suite turns this on; runtimes honour it in `alloc`.
pub fn set_poison_allocations(on: bool) {
    POISON.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether new allocations must be poisoned (see [`set_poison_allocations`]).
pub fn poison_allocations() -> bool {
    POISON.load(std::sync::atomic::Ordering::Relaxed)
}

/// The runtime of a device kind.
pub fn runtime(kind: DeviceKind) -> Result<Arc<dyn DeviceRuntime>> {
    read_lock(runtime_table()).get(&kind).cloned().ok_or_else(|| Error::DeviceUnavailable {
        device: kind.to_string(),
        reason: "no runtime registered for this device kind (is its backend feature enabled?)".into(),
    })
}

/// Every registered device kind, sorted by name.
pub fn device_kinds() -> Vec<DeviceKind> {
    let mut v: Vec<_> = read_lock(runtime_table()).keys().copied().collect();
    v.sort();
    v
}

pub(crate) fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // A panic while holding one of tefl's locks leaves data that is still consistent
    // (every critical section is a single insert or read), so poisoning is ignored.
    l.read().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn write_lock<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// Host memory: 8-byte aligned so every dtype can be viewed in place. Either tefl's own
/// allocation or memory another library owns (a NumPy array or a torch CPU tensor imported
/// without a copy, see [`external_host_buffer`]).
pub struct HostBuffer {
    words: RwLock<HostBytes>,
    len: usize,
}

/// Where a [`HostBuffer`]'s bytes live.
enum HostBytes {
    /// tefl's allocation.
    Owned(Vec<u64>),
    /// Memory of another owner, kept alive by `_owner` (dropped with the buffer).
    External { ptr: std::ptr::NonNull<u8>, _owner: Box<dyn Any + Send + Sync> },
}

// SAFETY: the external pointer is only dereferenced under the buffer's lock, and the contract of
// `external_host_buffer` makes the memory valid (and usable from any thread) while `_owner` lives.
unsafe impl Send for HostBytes {}
// SAFETY: as above; shared access only reads through the lock's read guard.
unsafe impl Sync for HostBytes {}

impl HostBytes {
    fn bytes(&self, len: usize) -> &[u8] {
        match self {
            HostBytes::Owned(words) => &bytemuck::cast_slice::<u64, u8>(words)[..len],
            // SAFETY: `external_host_buffer`'s contract: `ptr` is valid for reads of `len` bytes
            // while the owner lives, which it does as long as `self`.
            HostBytes::External { ptr, .. } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) },
        }
    }
    fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        match self {
            HostBytes::Owned(words) => words.as_mut_slice().pipe_bytes_mut(len),
            // SAFETY: as in `bytes`, for writes; `&mut self` (the lock's write guard) makes this
            // the only access through tefl.
            HostBytes::External { ptr, .. } => unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) },
        }
    }
}

/// A CPU buffer over `len` bytes at `ptr` that another owner allocated (zero-copy import of a
/// NumPy array or torch CPU tensor): tefl reads and writes them in place and drops `owner` (which
/// keeps the memory alive, e.g. a DLPack capsule's tensor) with the buffer. The address must be
/// 8-byte aligned, as tefl's own host memory is, so that kernels view any dtype in place: an
/// unaligned one is an [`Error::Tensor`] (copy it instead).
///
/// # Safety
/// `ptr` must be valid for reads and writes of `len` bytes from any thread until `owner` is
/// dropped, and nothing may write the memory while an op runs on it except that op.
pub unsafe fn external_host_buffer(
    ptr: *mut u8,
    len: usize,
    owner: Box<dyn Any + Send + Sync>,
) -> Result<Arc<dyn Buffer>> {
    let Some(ptr) = std::ptr::NonNull::new(ptr) else {
        return Err(Error::Tensor("an external host buffer at address 0".into()));
    };
    if !(ptr.as_ptr() as usize).is_multiple_of(8) {
        return Err(Error::Tensor(format!("external host memory at {ptr:p} is not 8-byte aligned")));
    }
    Ok(Arc::new(CpuBuffer(HostBuffer { words: RwLock::new(HostBytes::External { ptr, _owner: owner }), len })))
}

/// `n` zeroed elements, or [`Error::OutOfMemory`] naming `what` when the allocator refuses
/// (never an abort, unlike `vec!`). For buffers whose size a user's shapes decide.
pub fn try_zeroed<T: bytemuck::Zeroable>(n: usize, what: impl FnOnce() -> String) -> Result<Vec<T>> {
    try_zeroed_vec::<T>(n).ok_or_else(|| Error::OutOfMemory {
        device: "cpu".into(),
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
        what: what(),
    })
}

/// Host memory a new allocation can still get: `MemAvailable` + `SwapFree` (Linux), capped
/// by the cgroup's remaining limit when there is one; `None` when unknown.
fn host_memory_available() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |name: &str| {
        meminfo.lines().find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<usize>().ok())
    };
    let mut avail = kib("MemAvailable:")?.saturating_add(kib("SwapFree:").unwrap_or(0)).saturating_mul(1024);
    let read = |f: &str| std::fs::read_to_string(f).ok()?.trim().parse::<usize>().ok();
    if let (Some(max), Some(cur)) = (read("/sys/fs/cgroup/memory.max"), read("/sys/fs/cgroup/memory.current")) {
        avail = avail.min(max.saturating_sub(cur));
    }
    Some(avail)
}

/// Requests at least this large are checked against [`host_memory_available`] first: with
/// memory overcommit, a huge `calloc` succeeds and the process is killed when it touches the
/// pages, which is an abort by another name.
const LARGE_HOST_ALLOCATION: usize = 1 << 30;

/// Whether a host allocation of `bytes` may be attempted.
fn host_can_allocate(bytes: usize) -> bool {
    bytes < LARGE_HOST_ALLOCATION || host_memory_available().is_none_or(|a| bytes <= a)
}

/// `n` zeroed elements, or `None` when the allocator refuses or the request is larger than
/// the memory left (never aborts). Zeroed pages come from the allocator (`calloc`), so a
/// large buffer is not written here.
fn try_zeroed_vec<T: bytemuck::Zeroable>(n: usize) -> Option<Vec<T>> {
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    if !host_can_allocate(layout.size()) {
        return None;
    }
    // SAFETY: the layout has a non-zero size (checked above).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of `n` `T`s, and all
    // its bytes are zero, which is a valid `T` (`Zeroable`).
    Some(unsafe { Vec::from_raw_parts(p, n, n) })
}

/// `n` zero bytes on the host, or [`Error::OutOfMemory`] naming `what` (never an abort).
pub fn try_zeroed_bytes(n: usize, what: impl FnOnce() -> String) -> Result<Vec<u8>> {
    try_zeroed_vec::<u8>(n).ok_or_else(|| Error::OutOfMemory { device: "cpu".into(), bytes: n, what: what() })
}

/// Freed host buffers kept for the next allocation of about their size.
///
/// A training step allocates and frees the same large buffers every step (a GEMM's output,
/// a converted copy). Handed back to the C allocator, memory above its trim threshold goes
/// back to the kernel, and the next step faults every page in again: with many threads
/// storing into fresh pages at once, those faults cost more than the arithmetic (a 1024×1536
/// f32 GEMM output: 62,000 faults and 2.5× the time over 20 calls on two cores). The cache
/// keeps such buffers instead, within a fixed budget ([`HOST_CACHE_BYTES`]); smaller ones
/// stay with the C allocator, whose own free lists serve them well.
struct HostCache {
    /// Cached buffers, oldest first; each one's length is its initialized part.
    free: Vec<Vec<u64>>,
    /// Σ capacity of `free`, in bytes.
    bytes: usize,
}

/// Buffers of at least this many bytes are kept for reuse when freed.
const HOST_CACHE_MIN_BYTES: usize = 256 << 10;
/// The most bytes the host cache keeps by default; beyond its budget the oldest buffers are
/// freed. `TEFL_HOST_CACHE_MB` and [`set_host_cache_limit`] change the budget.
pub const HOST_CACHE_BYTES: usize = 512 << 20;

/// The budget now; `usize::MAX` until first read (then `TEFL_HOST_CACHE_MB`'s, or the default
/// where the environment is malformed: that error is every call's, from the manager).
static HOST_CACHE_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The most bytes of freed CPU buffers the host cache keeps now: [`set_host_cache_limit`]'s
/// value, else `TEFL_HOST_CACHE_MB`'s, else [`HOST_CACHE_BYTES`].
pub fn host_cache_limit() -> usize {
    let v = HOST_CACHE_LIMIT.load(Ordering::Relaxed);
    if v != usize::MAX {
        return v;
    }
    let from_env = crate::policy::env().as_ref().map_or(HOST_CACHE_BYTES, |c| c.host_cache_bytes);
    // A concurrent set_host_cache_limit wins over the environment.
    let _ = HOST_CACHE_LIMIT.compare_exchange(usize::MAX, from_env, Ordering::Relaxed, Ordering::Relaxed);
    HOST_CACHE_LIMIT.load(Ordering::Relaxed)
}

/// Sets the host cache's budget (bytes; 0 keeps no freed buffer), freeing the oldest kept
/// buffers past it now, and returns how many bytes that gave back. `usize::MAX` is taken as
/// `usize::MAX - 1` (the value marks "not read yet").
pub fn set_host_cache_limit(bytes: usize) -> usize {
    let limit = bytes.min(usize::MAX - 1);
    HOST_CACHE_LIMIT.store(limit, Ordering::Relaxed);
    let evicted = {
        let mut c = lock_cache();
        trim_to(&mut c, limit)
    };
    evicted.iter().map(|v| v.capacity() * 8).sum()
}

/// Takes the oldest buffers out of the cache until it holds at most `limit` bytes and
/// [`HOST_CACHE_ENTRIES`] buffers; they are freed by the caller, after the lock.
fn trim_to(c: &mut HostCache, limit: usize) -> Vec<Vec<u64>> {
    let mut n = 0;
    let mut over = c.bytes;
    while n < c.free.len() && (over > limit || c.free.len() - n > HOST_CACHE_ENTRIES) {
        over -= c.free[n].capacity() * 8;
        n += 1;
    }
    c.bytes = over;
    c.free.drain(..n).collect()
}

/// The most buffers the host cache keeps.
const HOST_CACHE_ENTRIES: usize = 64;

fn host_cache() -> &'static std::sync::Mutex<HostCache> {
    static CACHE: OnceLock<std::sync::Mutex<HostCache>> = OnceLock::new();
    CACHE.get_or_init(|| std::sync::Mutex::new(HostCache { free: Vec::new(), bytes: 0 }))
}

fn lock_cache() -> std::sync::MutexGuard<'static, HostCache> {
    // Every critical section leaves the cache consistent (a push or a remove with its byte
    // count), so a poisoned lock is used as is.
    host_cache().lock().unwrap_or_else(|p| p.into_inner())
}

/// A cached buffer of exactly `words` words (contents unspecified), when one with a capacity
/// between `words` and 1.25 × `words` is cached: the smallest such one.
fn cache_take(words: usize) -> Option<Vec<u64>> {
    if words.saturating_mul(8) < HOST_CACHE_MIN_BYTES {
        return None;
    }
    let mut v = {
        let mut c = lock_cache();
        let limit = words.saturating_add(words / 4);
        let (i, _) = c
            .free
            .iter()
            .enumerate()
            .filter(|(_, v)| (words..=limit).contains(&v.capacity()))
            .min_by_key(|(_, v)| v.capacity())?;
        let v = c.free.remove(i);
        c.bytes -= v.capacity() * 8;
        v
    };
    // Only the initialized part is ever exposed: shorter, it is cut; longer, zeros are
    // appended (safe code: no uninitialized word is read).
    v.truncate(words);
    v.resize(words, 0);
    Some(v)
}

/// Keeps a freed buffer for reuse when it is large enough, evicting the oldest ones over the
/// budget (they are freed after the lock is released).
fn cache_give(v: Vec<u64>) {
    let bytes = v.capacity().saturating_mul(8);
    let limit = host_cache_limit();
    if !(HOST_CACHE_MIN_BYTES..=limit).contains(&bytes) {
        return;
    }
    let evicted = {
        let mut c = lock_cache();
        c.free.push(v);
        c.bytes += bytes;
        trim_to(&mut c, limit)
    };
    drop(evicted);
}

/// Host memory a backend keeps beside the buffer cache between calls (the reference GEMM's
/// per-thread packing buffers, say), given back by [`release_host_cache`] too. A backend
/// registers one with `inventory::submit!`.
pub struct HostScratchRelease {
    /// Frees the scratch and returns the bytes it gave back (scratch in use at that moment is
    /// left alone).
    pub free: fn() -> usize,
}

inventory::collect!(HostScratchRelease);

/// Frees every host buffer tefl keeps for reuse (see [`HOST_CACHE_BYTES`]) and the scratch
/// backends keep between calls ([`HostScratchRelease`]), and returns how many bytes that gave
/// back; later allocations fill the cache again.
pub fn release_host_cache() -> usize {
    let freed = {
        let mut c = lock_cache();
        c.bytes = 0;
        std::mem::take(&mut c.free)
    };
    let cached: usize = freed.iter().map(|v| v.capacity() * 8).sum();
    cached + inventory::iter::<HostScratchRelease>.into_iter().map(|h| (h.free)()).sum::<usize>()
}

/// Bytes held by tefl's host buffer cache now.
pub fn host_cache_bytes() -> usize {
    lock_cache().bytes
}

/// A new zeroed allocation of `len` bytes as words (the cache already missed).
fn fresh_zeroed_words(len: usize) -> Result<Vec<u64>> {
    try_zeroed_vec::<u64>(len.div_ceil(8)).ok_or_else(|| Error::OutOfMemory {
        device: "cpu".into(),
        bytes: len,
        what: "a host buffer".into(),
    })
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let bytes = self.words.get_mut().unwrap_or_else(|p| p.into_inner());
        if let HostBytes::Owned(words) = bytes {
            cache_give(std::mem::take(words));
        }
    }
}

impl HostBuffer {
    /// A zero-filled buffer of `len` bytes, or [`Error::OutOfMemory`] when the allocator
    /// refuses. A cached buffer of about the size is reused (and zeroed) when there is one.
    pub fn try_zeroed(len: usize) -> Result<Self> {
        let words = match cache_take(len.div_ceil(8)) {
            Some(mut v) => {
                v.fill(0);
                v
            }
            None => fresh_zeroed_words(len)?,
        };
        Ok(HostBuffer { words: RwLock::new(HostBytes::Owned(words)), len })
    }

    /// A buffer of `len` bytes whose contents are unspecified (a reused buffer keeps what it
    /// held; a new one is zero), for outputs written in full: a reused buffer is not zeroed.
    /// [`Error::OutOfMemory`] when the allocator refuses.
    pub fn try_uninit(len: usize) -> Result<Self> {
        let words = match cache_take(len.div_ceil(8)) {
            Some(words) => words,
            None => fresh_zeroed_words(len)?,
        };
        Ok(HostBuffer { words: RwLock::new(HostBytes::Owned(words)), len })
    }

    /// A buffer holding a copy of `data`'s bytes (one allocation, one copy); an
    /// [`Error::OutOfMemory`] when the allocator refuses.
    pub fn from_pod<T: bytemuck::Pod>(data: &[T]) -> Result<Self> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let n = bytes.len().div_ceil(8);
        if let Some(mut words) = cache_take(n) {
            let dst = bytemuck::cast_slice_mut::<u64, u8>(&mut words);
            dst[..bytes.len()].copy_from_slice(bytes);
            dst[bytes.len()..].fill(0);
            return Ok(HostBuffer { words: RwLock::new(HostBytes::Owned(words)), len: bytes.len() });
        }
        let mut words = Vec::<u64>::new();
        if !host_can_allocate(bytes.len()) || words.try_reserve_exact(n).is_err() {
            return Err(Error::OutOfMemory { device: "cpu".into(), bytes: bytes.len(), what: "a host copy".into() });
        }
        let full = bytes.len() / 8;
        words.extend(bytes[..full * 8].chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))));
        if full * 8 < bytes.len() {
            let mut last = [0u8; 8];
            last[..bytes.len() - full * 8].copy_from_slice(&bytes[full * 8..]);
            words.push(u64::from_ne_bytes(last));
        }
        Ok(HostBuffer { words: RwLock::new(HostBytes::Owned(words)), len: bytes.len() })
    }

    /// A buffer holding a copy of `bytes`; an [`Error::OutOfMemory`] when the allocator refuses.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let b = HostBuffer::try_zeroed(bytes.len())?;
        write_lock(&b.words).bytes_mut(b.len).copy_from_slice(bytes);
        Ok(b)
    }

    /// The address of the bytes, for foreign code (the C plugin ABI) that writes a buffer no
    /// Rust code is using. The address is stable for the buffer's lifetime.
    pub fn raw_ptr(&self) -> *mut u8 {
        write_lock(&self.words).bytes_mut(self.len).as_mut_ptr()
    }

    /// Shared access to the bytes (blocks while a writer holds them).
    pub fn read(&self) -> HostRead<'_> {
        HostRead { guard: read_lock(&self.words), len: self.len }
    }

    /// Exclusive access to the bytes; fails instead of blocking when the buffer is already
    /// borrowed (the same tensor passed as two arguments, one of them written).
    pub fn try_write(&self) -> Option<HostWrite<'_>> {
        match self.words.try_write() {
            Ok(guard) => Some(HostWrite { guard, len: self.len }),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(HostWrite { guard: p.into_inner(), len: self.len }),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

trait PipeBytes {
    fn pipe_bytes_mut(&mut self, len: usize) -> &mut [u8];
}
impl PipeBytes for [u64] {
    fn pipe_bytes_mut(&mut self, len: usize) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u64, u8>(self)[..len]
    }
}

/// A read guard over a [`HostBuffer`]'s bytes.
pub struct HostRead<'a> {
    guard: RwLockReadGuard<'a, HostBytes>,
    len: usize,
}
impl std::ops::Deref for HostRead<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.guard.bytes(self.len)
    }
}

/// A write guard over a [`HostBuffer`]'s bytes.
pub struct HostWrite<'a> {
    guard: RwLockWriteGuard<'a, HostBytes>,
    len: usize,
}
impl std::ops::Deref for HostWrite<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.guard.bytes(self.len)
    }
}
impl std::ops::DerefMut for HostWrite<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.guard.bytes_mut(self.len)
    }
}

struct CpuBuffer(HostBuffer);

impl Buffer for CpuBuffer {
    fn device(&self) -> Device {
        Device::CPU
    }
    fn len_bytes(&self) -> usize {
        self.0.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn raw_address(&self) -> Option<u64> {
        Some(self.0.raw_ptr() as u64)
    }
}

/// Views a buffer as host memory when it is one.
pub fn as_host(buf: &dyn Buffer) -> Option<&HostBuffer> {
    buf.as_any().downcast_ref::<CpuBuffer>().map(|b| &b.0)
}

/// Wraps host bytes as a CPU buffer.
pub fn host_buffer(bytes: &[u8]) -> Result<Arc<dyn Buffer>> {
    Ok(Arc::new(CpuBuffer(HostBuffer::from_bytes(bytes)?)))
}

/// A CPU buffer holding a copy of `data`.
pub fn host_buffer_from<T: bytemuck::Pod>(data: &[T]) -> Result<Arc<dyn Buffer>> {
    Ok(Arc::new(CpuBuffer(HostBuffer::from_pod(data)?)))
}

/// The host CPU's runtime (always available).
pub struct CpuRuntime;

impl DeviceRuntime for CpuRuntime {
    fn kind(&self) -> DeviceKind {
        DeviceKind::CPU
    }
    unsafe fn import_external(
        &self,
        _device: Device,
        address: u64,
        bytes: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<Arc<dyn Buffer>> {
        // SAFETY: the trait's contract is external_host_buffer's.
        unsafe { external_host_buffer(address as usize as *mut u8, bytes, owner) }
    }
    fn device_count(&self) -> usize {
        1
    }
    fn name(&self, _ordinal: u32) -> String {
        "host cpu".into()
    }
    fn arch(&self, _ordinal: u32) -> String {
        std::env::consts::ARCH.into()
    }
    fn device_info(&self, ordinal: u32) -> Result<DeviceInfo> {
        let mut i = DeviceInfo::basic(Device::CPU, self.name(ordinal), self.arch(ordinal));
        i.compute_units = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        i.max_threads_per_block = 1;
        Ok(i)
    }
    fn fill(&self, dst: &dyn Buffer, byte: u8) -> Result<()> {
        let host = as_host(dst).ok_or_else(|| Error::Tensor("not a CPU buffer".into()))?;
        host.try_write().ok_or_else(|| Error::Tensor("destination buffer is borrowed".into()))?.fill(byte);
        Ok(())
    }
    fn alloc(&self, device: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        if !device.is_cpu() {
            return Err(Error::DeviceUnavailable {
                device: device.to_string(),
                reason: "the CPU runtime only has device 'cpu'".into(),
            });
        }
        let buf = HostBuffer::try_zeroed(bytes)?;
        if poison_allocations()
            && let Some(mut w) = buf.try_write()
        {
            w.fill(0xFF);
        }
        Ok(Arc::new(CpuBuffer(buf)))
    }
    fn alloc_uninit(&self, device: Device, bytes: usize) -> Result<Arc<dyn Buffer>> {
        if !device.is_cpu() || poison_allocations() {
            return self.alloc(device, bytes);
        }
        Ok(Arc::new(CpuBuffer(HostBuffer::try_uninit(bytes)?)))
    }
    fn copy_from_host(&self, dst: &dyn Buffer, src: &[u8]) -> Result<()> {
        let host = as_host(dst).ok_or_else(|| Error::Tensor("not a CPU buffer".into()))?;
        let mut w = host.try_write().ok_or_else(|| Error::Tensor("destination buffer is borrowed".into()))?;
        if w.len() != src.len() {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", src.len(), w.len())));
        }
        w.copy_from_slice(src);
        Ok(())
    }
    fn copy_to_host(&self, src: &dyn Buffer, dst: &mut [u8]) -> Result<()> {
        let host = as_host(src).ok_or_else(|| Error::Tensor("not a CPU buffer".into()))?;
        let r = host.read();
        if r.len() != dst.len() {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", r.len(), dst.len())));
        }
        dst.copy_from_slice(&r);
        Ok(())
    }
    fn synchronize(&self, _device: Device) -> Result<()> {
        Ok(())
    }
    fn copy_device_to_device(&self, src: &dyn Buffer, dst: &dyn Buffer) -> Result<()> {
        let (s, d) = match (as_host(src), as_host(dst)) {
            (Some(s), Some(d)) => (s, d),
            _ => return Err(Error::Tensor("not CPU buffers".into())),
        };
        let r = s.read();
        let mut w = d.try_write().ok_or_else(|| Error::Tensor("destination buffer is borrowed".into()))?;
        if r.len() != w.len() {
            return Err(Error::Tensor(format!("copy of {} bytes into {} bytes", r.len(), w.len())));
        }
        w.copy_from_slice(&r);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_open_and_interned() {
        let a = DeviceKind::intern("npu").unwrap();
        let b = DeviceKind::intern("npu").unwrap();
        assert!(std::ptr::eq(a.name(), b.name()));
        assert_eq!(a, DeviceKind::new("npu"));
        assert!(DeviceKind::intern("NPU").is_err());
        assert!(DeviceKind::intern("").is_err());
    }

    #[test]
    fn device_parse_and_display() {
        assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::cuda(1));
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::CPU);
        assert_eq!(Device::cuda(0).to_string(), "cuda:0");
        assert!("cuda:x".parse::<Device>().is_err());
    }

    #[test]
    fn timing_runs_before_untimed_then_times_work_and_contains_panics() {
        let rt = Contained::new(Arc::new(CpuRuntime)).unwrap();
        let order = std::cell::RefCell::new(Vec::new());
        let mut before = || {
            order.borrow_mut().push("before");
            std::thread::sleep(std::time::Duration::from_millis(150));
            Ok(())
        };
        let mut work = || {
            order.borrow_mut().push("work");
            std::thread::sleep(std::time::Duration::from_millis(20));
            Ok(())
        };
        let t = rt.time_after(Device::CPU, &mut before, &mut work).unwrap();
        let ts = rt.time_reps_after(Device::CPU, 2, &mut before, &mut work).unwrap();
        assert_eq!(*order.borrow(), ["before", "work", "before", "work", "before", "work"]);
        // Each the work's 20 ms, not the 150 ms before it.
        assert_eq!(ts.len(), 2);
        for t in [t, ts[0], ts[1]] {
            assert!((0.015..0.12).contains(&t), "{t}");
        }
        let e = rt.time_after(Device::CPU, &mut || panic!("the flush exploded"), &mut || Ok(())).unwrap_err();
        assert!(matches!(&e, Error::DeviceFailure { .. }) && e.to_string().contains("the flush exploded"), "{e}");
        let mut n = 0;
        let mut second_panics = || {
            n += 1;
            if n == 2 { panic!("the second call exploded") } else { Ok(()) }
        };
        let e = rt.time_reps_after(Device::CPU, 3, &mut || Ok(()), &mut second_panics).unwrap_err();
        assert!(matches!(&e, Error::DeviceFailure { .. }) && e.to_string().contains("the second call exploded"), "{e}");
    }

    #[test]
    fn cpu_is_always_available() {
        assert!(Device::CPU.is_available());
        assert!(!Device::new(DeviceKind::new("nonexistent"), 0).is_available());
    }
}
