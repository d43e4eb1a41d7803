//! Closed-source plugins through the stable C ABI of `include/tefl_plugin.h`.
//!
//! [`load_plugins`] opens each library named in `TE_FL_PLUGIN_MODULES`, checks the ABI,
//! calls its `tefl_plugin_init` and registers the vendor and impls it describes. Any
//! problem (a missing file or symbol, another major ABI version, a failing init, a bad
//! description) skips that plugin with an ERROR log line naming it and the reason; the rest
//! keeps working. At call time, a kernel that returns an error, an unknown error code or a
//! handle tefl did not issue is a failure the manager can fall back from.

use std::ffi::{CStr, CString, OsStr, OsString, c_char, c_void};
use std::sync::Arc;

use crate::device::read_lock;
use crate::op::{ArgRef, DynCall, OpDescriptor};
use crate::registry::{BackendImplKind, OpImpl, Registry, VendorInfo};
use crate::{DType, Device, DeviceKind, Error, Result, Tensor};

/// The ABI version this build of tefl speaks.
pub const ABI_MAJOR: u32 = 1;
/// See [`ABI_MAJOR`].
pub const ABI_MINOR: u32 = 0;

const DEVICE_CPU: i32 = 1;

#[repr(C)]
struct CTensor {
    struct_size: usize,
    data: *mut c_void,
    device_type: i32,
    device_id: i32,
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    ndim: i32,
    shape: *const i64,
    strides: *const i64,
}

/// `tefl_error *` on the C side: an opaque handle made by [`host_make_error`].
type ErrPtr = *mut c_void;
type AllocFn = unsafe extern "C" fn(*const CCall, usize, u8, u8, i32, *const i64, *mut *mut c_void) -> ErrPtr;
type MakeErrorFn = unsafe extern "C" fn(i32, *const c_char) -> ErrPtr;
type KernelFn = unsafe extern "C" fn(*mut c_void, *const CCall) -> ErrPtr;
type InitFn = unsafe extern "C" fn(*const CHostApi, *mut CPlugin) -> ErrPtr;

#[repr(C)]
struct CCall {
    struct_size: usize,
    op: *const c_char,
    inputs: *const CTensor,
    n_inputs: usize,
    scalars: *const c_char,
    n_outputs: usize,
    alloc_output: AllocFn,
    make_error: MakeErrorFn,
    host_state: *mut c_void,
}

#[repr(C)]
struct COpImpl {
    struct_size: usize,
    op: *const c_char,
    impl_id: *const c_char,
    priority: i32,
    dtypes: *const c_char,
    kernel: Option<KernelFn>,
    user: *mut c_void,
}

#[repr(C)]
struct CVendorInfo {
    struct_size: usize,
    vendor_name: *const c_char,
    device_name: *const c_char,
    device_query_cmd: *const c_char,
}

#[repr(C)]
struct CPlugin {
    struct_size: usize,
    abi_major: u32,
    abi_minor: u32,
    vendor: *const CVendorInfo,
    impls: *const COpImpl,
    n_impls: usize,
}

#[repr(C)]
struct CHostApi {
    struct_size: usize,
    abi_major: u32,
    abi_minor: u32,
    make_error: MakeErrorFn,
}

/// What a `tefl_error *` points to.
struct PluginError {
    code: i32,
    message: String,
}

/// The error handles issued and not yet taken back: a returned pointer is only ever
/// dereferenced when it is one of these.
fn issued() -> &'static std::sync::Mutex<std::collections::HashSet<usize>> {
    static ISSUED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<usize>>> = std::sync::OnceLock::new();
    ISSUED.get_or_init(Default::default)
}

unsafe extern "C" fn host_make_error(code: i32, message: *const c_char) -> ErrPtr {
    let message = if message.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null message is a NUL-terminated string the plugin owns for the call.
        unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned()
    };
    let p = Box::into_raw(Box::new(PluginError { code, message }));
    issued().lock().unwrap_or_else(|e| e.into_inner()).insert(p as usize);
    p.cast()
}

fn make_error(code: i32, message: &str) -> ErrPtr {
    let m = CString::new(message).unwrap_or_default();
    // SAFETY: `m` is a valid NUL-terminated string for the call.
    unsafe { host_make_error(code, m.as_ptr()) }
}

/// Takes back an error handle: `None` for NULL (success), the error for a handle we issued,
/// and a description of the problem for any other pointer (never dereferenced).
fn take_error(p: ErrPtr) -> Option<String> {
    take_error_code(p).map(|(_, m)| m)
}

/// [`take_error`] with the error's code (0 for a handle tefl did not issue).
fn take_error_code(p: ErrPtr) -> Option<(i32, String)> {
    if p.is_null() {
        return None;
    }
    if !issued().lock().unwrap_or_else(|e| e.into_inner()).remove(&(p as usize)) {
        return Some((0, format!("returned an error handle tefl did not issue ({p:p})")));
    }
    // SAFETY: `p` came from Box::into_raw in host_make_error and was still in the issued set,
    // which we just removed it from, so this is the only place that frees it.
    let e = unsafe { Box::from_raw(p.cast::<PluginError>()) };
    let kind = match e.code {
        1 => "invalid argument",
        2 => "unsupported",
        3 => "device error",
        4 => "out of memory",
        5 => "internal error",
        other => return Some((0, format!("unknown error code {other}: {}", e.message))),
    };
    let text = if e.message.is_empty() { kind.to_string() } else { format!("{} (code {}: {kind})", e.message, e.code) };
    Some((e.code, text))
}

/// One kernel of a loaded plugin: its C function and the library that keeps it loaded.
struct PluginKernel {
    impl_id: String,
    kernel: KernelFn,
    user: usize,
    _lib: Arc<libloading::Library>,
}

fn dtype_code(d: DType) -> (u8, u8) {
    match d {
        DType::F32 => (2, 32),
        DType::F16 => (2, 16),
        DType::BF16 => (4, 16),
        DType::F64 => (2, 64),
        DType::F8E4M3 => (10, 8),
        DType::F8E5M2 => (11, 8),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
        DType::U8 | DType::Bool => (1, 8),
    }
}

fn dtype_from_code(code: u8, bits: u8) -> Option<DType> {
    Some(match (code, bits) {
        (2, 32) => DType::F32,
        (2, 16) => DType::F16,
        (4, 16) => DType::BF16,
        (2, 64) => DType::F64,
        (10, 8) => DType::F8E4M3,
        (11, 8) => DType::F8E5M2,
        (0, 32) => DType::I32,
        (0, 64) => DType::I64,
        (1, 8) => DType::U8,
        _ => return None,
    })
}

/// What the host keeps for one kernel call.
struct CallState {
    outputs: Vec<Option<Tensor>>,
    /// The last output allocation that ran out of memory: what a kernel returning
    /// TEFL_ERR_OUT_OF_MEMORY is reported as (with its bytes and tensor).
    out_of_memory: Option<Error>,
}

unsafe extern "C" fn host_alloc_output(
    call: *const CCall,
    index: usize,
    code: u8,
    bits: u8,
    ndim: i32,
    shape: *const i64,
    data: *mut *mut c_void,
) -> ErrPtr {
    // SAFETY: `call` is the CCall tefl passed to the kernel, alive for the whole call, and
    // its host_state points to the CallState of that call (checked non-null below).
    let Some(call) = (unsafe { call.as_ref() }) else { return make_error(1, "alloc_output: null call") };
    // SAFETY: see above; the state is only touched from the kernel's thread during the call.
    let Some(state) = (unsafe { (call.host_state as *mut CallState).as_mut() }) else {
        return make_error(1, "alloc_output: not a tefl call");
    };
    if data.is_null() || index >= state.outputs.len() || !(0..=8).contains(&ndim) || (ndim > 0 && shape.is_null()) {
        return make_error(1, &format!("alloc_output: bad arguments (index {index}, ndim {ndim})"));
    }
    if state.outputs[index].is_some() {
        // Replacing the first buffer would free memory the plugin may still write through.
        return make_error(1, &format!("alloc_output: output {index} is already allocated for this call"));
    }
    let Some(dtype) = dtype_from_code(code, bits) else {
        return make_error(2, &format!("alloc_output: unknown dtype code {code}/{bits}"));
    };
    // SAFETY: the plugin promises `ndim` readable i64 at `shape` (checked non-null above).
    let dims: &[i64] = if ndim == 0 { &[] } else { unsafe { std::slice::from_raw_parts(shape, ndim as usize) } };
    if dims.iter().any(|d| *d < 0) {
        return make_error(1, "alloc_output: negative dimension");
    }
    let dims: Vec<usize> = dims.iter().map(|d| *d as usize).collect();
    let tensor = match Tensor::zeros(&dims, dtype, &Device::CPU) {
        Ok(t) => t,
        Err(e @ Error::OutOfMemory { .. }) => {
            let err = make_error(4, &e.to_string());
            state.out_of_memory = Some(e);
            return err;
        }
        Err(e) => return make_error(1, &format!("alloc_output: {e}")),
    };
    let Some(ptr) = crate::device::as_host(&**tensor.buffer()).map(|h| h.raw_ptr()) else {
        return make_error(5, "alloc_output: not host memory");
    };
    state.outputs[index] = Some(tensor);
    // SAFETY: `data` is non-null (checked) and points to the plugin's out-parameter.
    unsafe { *data = ptr.cast() };
    std::ptr::null_mut()
}

/// The impl of the catalogue op `desc` that calls a plugin kernel: a run-time kernel
/// ([`OpImpl::dynamic`]) that marshals the op's arguments in declaration order. Tensors must be
/// on the host in this ABI version.
fn plugin_impl(desc: &OpDescriptor, k: PluginKernel, vendor: &str, priority: i32, dtypes: &[DType]) -> OpImpl {
    let impl_id = k.impl_id.clone();
    OpImpl::dynamic(desc, impl_id, BackendImplKind::Vendor, Arc::new(move |_ctx, call| call_plugin(&k, call)))
        .vendor(vendor)
        .priority(priority)
        .device(DeviceKind::CPU)
        .dtypes(dtypes)
}

fn call_plugin(k: &PluginKernel, call: &DynCall<'_>) -> Result<Vec<Option<Tensor>>> {
    let fail = |reason: String| Error::ImplFailed { op: call.op, impl_id: k.impl_id.clone(), reason };
    // Collect the argument slots and scalars in declaration order.
    let mut slots: Vec<(bool, Option<Tensor>)> = Vec::new();
    let mut scalars = Vec::new();
    call.visit_args(&mut |a| match a {
        ArgRef::Tensor { inout, tensor, .. } => slots.push((inout, tensor.cloned())),
        ArgRef::Scalar { name, text } => scalars.push(format!("{name}={text}")),
    });
    if let Some((_, Some(t))) = slots.iter().find(|(_, t)| t.as_ref().is_some_and(|t| !t.device().is_cpu())) {
        return Err(fail(format!("the C plugin ABI passes host tensors only; got one on {}", t.device())));
    }
    // The ABI's dims are int64: a (zero-sized) tensor with a larger dim cannot be described.
    let shapes: Vec<Vec<i64>> = slots
        .iter()
        .map(|(_, t)| {
            t.as_ref().map_or(Ok(Vec::new()), |t| {
                t.shape().iter().map(|d| i64::try_from(*d)).collect::<std::result::Result<Vec<_>, _>>()
            })
        })
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::Unsupported {
            op: call.op,
            impl_id: k.impl_id.clone(),
            reason: "a dimension does not fit the C ABI's int64".into(),
        })?;
    // Hold every input's guard for the duration of the call.
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    let mut descs = Vec::with_capacity(slots.len());
    for ((inout, t), shape) in slots.iter().zip(&shapes) {
        let Some(t) = t else {
            descs.push(CTensor {
                struct_size: std::mem::size_of::<CTensor>(),
                data: std::ptr::null_mut(),
                device_type: DEVICE_CPU,
                device_id: 0,
                dtype_code: 0,
                dtype_bits: 0,
                dtype_lanes: 1,
                ndim: -1,
                shape: std::ptr::null(),
                strides: std::ptr::null(),
            });
            continue;
        };
        let data: *mut c_void = if *inout {
            let mut g = t.host_bytes_mut()?;
            let p = g.as_mut_ptr().cast();
            writes.push(g);
            p
        } else {
            let g = t.host_bytes()?;
            let p = g.as_ptr().cast_mut().cast();
            reads.push(g);
            p
        };
        let (code, bits) = dtype_code(t.dtype());
        descs.push(CTensor {
            struct_size: std::mem::size_of::<CTensor>(),
            data,
            device_type: DEVICE_CPU,
            device_id: 0,
            dtype_code: code,
            dtype_bits: bits,
            dtype_lanes: 1,
            ndim: shape.len() as i32,
            shape: shape.as_ptr(),
            strides: std::ptr::null(),
        });
    }
    let n_outputs = call.outputs.len();
    let mut state = CallState { outputs: vec![None; n_outputs], out_of_memory: None };
    let op_c = CString::new(call.op).map_err(|e| fail(e.to_string()))?;
    let scalars_c = CString::new(scalars.join(";")).map_err(|e| fail(e.to_string()))?;
    let c_call = CCall {
        struct_size: std::mem::size_of::<CCall>(),
        op: op_c.as_ptr(),
        inputs: descs.as_ptr(),
        n_inputs: descs.len(),
        scalars: scalars_c.as_ptr(),
        n_outputs,
        alloc_output: host_alloc_output,
        make_error: host_make_error,
        host_state: (&mut state as *mut CallState).cast(),
    };
    // SAFETY: the kernel pointer came from a plugin whose library `k` keeps loaded; `c_call`
    // and everything it points to (descriptors, shapes, strings, guarded tensor memory and
    // the call state) outlive the call. The plugin contract is the header's.
    let returned = unsafe { (k.kernel)(k.user as *mut c_void, &c_call) };
    drop((reads, writes));
    match take_error_code(returned) {
        None => {}
        // TEFL_ERR_UNSUPPORTED: the kernel has no code for these arguments; not a failure.
        Some((2, reason)) => return Err(Error::Unsupported { op: call.op, impl_id: k.impl_id.clone(), reason }),
        // TEFL_ERR_OUT_OF_MEMORY: the manager falls back without passing the impl over on
        // later calls. An output allocation that ran out says its bytes and tensor; the
        // plugin's own allocations say only what the plugin wrote.
        Some((4, reason)) => {
            return Err(state.out_of_memory.take().unwrap_or_else(|| Error::OutOfMemory {
                device: Device::CPU.to_string(),
                bytes: 0,
                what: format!("impl '{}' of op '{}': {reason}", k.impl_id, call.op),
            }));
        }
        Some((_, reason)) => return Err(fail(reason)),
    }
    Ok(state.outputs)
}

/// Reads a C string owned by the plugin; `None` when null or not UTF-8.
fn c_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the plugin promises NUL-terminated strings that live while it is loaded.
    unsafe { CStr::from_ptr(p) }.to_str().ok().map(str::to_string)
}

/// Whether a `TE_FL_PLUGIN_MODULES` entry names a library file: a path (it has a `/`), or a
/// file name ending in `.so`, `.dylib` or `.dll` (or versioned, `libx.so.1`). Any other entry
/// is a bare name: the library `libx.so` found by the system loader, or, where a host language
/// loads plugins too, one of its modules (the Python package asks this same question).
pub fn is_library_path(entry: &str) -> bool {
    entry.contains('/') || [".so", ".dylib", ".dll"].iter().any(|s| entry.ends_with(s)) || entry.contains(".so.")
}

/// The file to open for a `TE_FL_PLUGIN_MODULES` entry: a path as given, or a library name
/// `x` as `libx.so` (found by the system loader).
fn library_file(entry: &OsStr) -> OsString {
    if is_library_path(&entry.to_string_lossy()) {
        entry.to_os_string()
    } else {
        let mut f = OsString::from(std::env::consts::DLL_PREFIX);
        f.push(entry);
        f.push(std::env::consts::DLL_SUFFIX);
        f
    }
}

/// Loads one plugin into `reg`; the error says why it was skipped.
pub fn load_plugin(reg: &mut Registry, entry: impl AsRef<OsStr>) -> Result<usize> {
    let entry = entry.as_ref();
    let name = entry.to_string_lossy().into_owned();
    let err = |reason: String| Error::Plugin { plugin: name.clone(), reason };
    let file = library_file(entry);
    // SAFETY: loading runs the library's initialisers; a plugin is trusted code the user
    // named in TE_FL_PLUGIN_MODULES.
    let lib = unsafe { libloading::Library::new(&file) }
        .map_err(|e| err(format!("cannot load {}: {e}", file.to_string_lossy())))?;
    // SAFETY: the symbol is declared in tefl_plugin.h with this signature.
    let init: InitFn = *unsafe { lib.get::<InitFn>(b"tefl_plugin_init\0") }
        .map_err(|e| err(format!("missing symbol tefl_plugin_init: {e}")))?;
    let host = CHostApi {
        struct_size: std::mem::size_of::<CHostApi>(),
        abi_major: ABI_MAJOR,
        abi_minor: ABI_MINOR,
        make_error: host_make_error,
    };
    let mut out = CPlugin {
        struct_size: std::mem::size_of::<CPlugin>(),
        abi_major: 0,
        abi_minor: 0,
        vendor: std::ptr::null(),
        impls: std::ptr::null(),
        n_impls: 0,
    };
    // SAFETY: `host` and `out` are valid for the call; the plugin fills `out`.
    let returned = unsafe { init(&host, &mut out) };
    if let Some(why) = take_error(returned) {
        return Err(err(format!("tefl_plugin_init failed: {why}")));
    }
    if out.abi_major != ABI_MAJOR || out.abi_minor > ABI_MINOR {
        return Err(err(format!(
            "built for ABI {}.{}, this tefl speaks {ABI_MAJOR}.{ABI_MINOR}",
            out.abi_major, out.abi_minor
        )));
    }
    // SAFETY: a non-null vendor pointer refers to the plugin's static description.
    let vendor = unsafe { out.vendor.as_ref() }.ok_or_else(|| err("no vendor description".into()))?;
    if vendor.struct_size < std::mem::size_of::<CVendorInfo>() {
        return Err(err(format!("vendor description of {} bytes is too small", vendor.struct_size)));
    }
    let vendor_name = c_str(vendor.vendor_name).ok_or_else(|| err("vendor_name missing or not UTF-8".into()))?;
    let info = VendorInfo::new(
        &vendor_name,
        &c_str(vendor.device_name).unwrap_or_else(|| "cpu".into()),
        &c_str(vendor.device_query_cmd).unwrap_or_default(),
    );
    if out.n_impls > 0 && out.impls.is_null() {
        return Err(err("impls is null".into()));
    }
    let lib = Arc::new(lib);
    let mut impls = Vec::new();
    for i in 0..out.n_impls {
        // SAFETY: the plugin promises `n_impls` descriptions at `impls` (non-null, checked).
        let d = unsafe { &*out.impls.add(i) };
        if d.struct_size < std::mem::size_of::<COpImpl>() {
            return Err(err(format!("impl {i}: description of {} bytes is too small", d.struct_size)));
        }
        let op = c_str(d.op).ok_or_else(|| err(format!("impl {i}: op name missing")))?;
        let desc = crate::catalogue::find(&op)
            .ok_or_else(|| err(format!("impl {i}: '{op}' is not an op of the catalogue")))?;
        let impl_id = c_str(d.impl_id).ok_or_else(|| err(format!("impl {i}: impl_id missing")))?;
        let kernel = d.kernel.ok_or_else(|| err(format!("impl {i}: kernel is null")))?;
        let dtypes = c_str(d.dtypes)
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.parse::<DType>())
            .collect::<Result<Vec<_>>>()
            .map_err(|e| err(format!("impl {i}: {e}")))?;
        let k = PluginKernel { impl_id, kernel, user: d.user as usize, _lib: lib.clone() };
        impls.push(plugin_impl(desc, k, &vendor_name, d.priority, &dtypes));
    }
    // All or nothing: every impl is checked before anything is registered, so a plugin that
    // is skipped leaves no trace in the registry.
    for (i, imp) in impls.iter().enumerate() {
        if impls[..i].iter().any(|o| o.op() == imp.op() && o.impl_id() == imp.impl_id()) {
            return Err(err(format!("declares impl '{}' of op '{}' twice", imp.impl_id(), imp.op())));
        }
        if reg.contains(imp.op(), imp.impl_id()) {
            return Err(err(format!(
                "impl '{}' of op '{}' is already registered (duplicate registration)",
                imp.impl_id(),
                imp.op()
            )));
        }
    }
    // A vendor tefl already knows keeps its description (and its availability check): a
    // plugin cannot replace, say, the nvidia backend's driver probe by naming "nvidia".
    if reg.vendor(&vendor_name).is_none() {
        reg.register_vendor(info);
    }
    let n = impls.len();
    for imp in impls {
        reg.register_impl(imp).map_err(|e| err(e.to_string()))?;
    }
    Ok(n)
}

/// `TE_FL_PLUGIN_MODULES` entries that another host language loads itself (Python modules,
/// see the `tefl` Python package): [`load_plugins`] leaves them alone.
static FOREIGN_ENTRIES: std::sync::RwLock<Vec<String>> = std::sync::RwLock::new(Vec::new());

/// Marks `TE_FL_PLUGIN_MODULES` entries as loaded by the host language (Python modules, whose
/// `register(registry)` the Python package calls): library loading skips them instead of
/// logging an error for a file that is not there.
pub fn set_foreign_entries(entries: Vec<String>) {
    *crate::device::write_lock(&FOREIGN_ENTRIES) = entries;
}

/// What the host language loads itself, for the error of an entry that is neither that nor a
/// library (e.g. "Python module"); empty when no host language loads plugins.
static FOREIGN_KIND: std::sync::RwLock<String> = std::sync::RwLock::new(String::new());

/// Names what the host language loads from `TE_FL_PLUGIN_MODULES` ("Python module"): an entry
/// that is a bare name and fails to load as a library is then reported as neither.
pub fn set_foreign_kind(kind: &str) {
    *crate::device::write_lock(&FOREIGN_KIND) = kind.to_string();
}

/// Loads every plugin of `TE_FL_PLUGIN_MODULES`; each failure is an ERROR log line naming
/// the plugin and the reason, and the others still load. Returns how many loaded.
pub fn load_plugins(reg: &mut Registry, entries: &[OsString]) -> usize {
    let mut loaded = 0;
    let foreign = read_lock(&FOREIGN_ENTRIES).clone();
    let foreign_kind = read_lock(&FOREIGN_KIND).clone();
    for entry in entries {
        let e = entry.to_string_lossy();
        if foreign.iter().any(|f| f.as_str() == e) {
            tracing::debug!(target: "TE-FL", "Plugin '{e}' is loaded by the host language, not as a library");
            continue;
        }
        match load_plugin(reg, entry) {
            Ok(n) => {
                tracing::info!(target: "TE-FL", "Plugin '{e}' loaded: {n} impl(s)");
                loaded += 1;
            }
            Err(err) if !foreign_kind.is_empty() && !is_library_path(&e) => {
                tracing::error!(target: "TE-FL", "Plugin '{e}' skipped: not a {foreign_kind} that can be imported, nor a library ({err})")
            }
            Err(err) => tracing::error!(target: "TE-FL", "Plugin '{e}' skipped: {err}"),
        }
    }
    loaded
}

#[cfg(test)]
mod tests {
    use super::{is_library_path, library_file};
    use std::ffi::OsStr;

    #[test]
    fn plugin_entries_are_library_paths_or_bare_names() {
        for path in ["./libx.so", "/opt/p/libx.so", "libx.so", "libx.so.1", "x.dylib", "x.dll", "dir/x"] {
            assert!(is_library_path(path), "{path}");
            assert_eq!(library_file(OsStr::new(path)), OsStr::new(path), "{path}");
        }
        // Bare names: Python modules (dotted too, including ones that merely contain ".so") or
        // library names the loader completes.
        for name in ["my_plugin", "pkg.plugins", "pkg.sockets", "tefl_vendor_x", "x.so_like"] {
            assert!(!is_library_path(name), "{name}");
            let file = library_file(OsStr::new(name)).to_string_lossy().into_owned();
            let expected = format!("{}{name}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
            assert_eq!(file, expected);
        }
    }
}
