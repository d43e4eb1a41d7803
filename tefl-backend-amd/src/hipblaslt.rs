//! hipBLASLt, loaded at run time (`libhipblaslt.so.1` of ROCm 7, `libhipblaslt.so.0` of
//! ROCm 6), as the library of the shared GEMM host logic (`tefl_gpu::blaslt`): f32, f16 and
//! bf16 inputs with f32 accumulation, and its fused epilogues (bias, GELU with aux, dGELU).
//!
//! The enum values used here (`hipDataType`, `hipblasComputeType_t`, `hipblasOperation_t`,
//! the descriptor and preference attributes, the epilogues) are those of hipBLASLt 0.6
//! (ROCm 6.0) and later; an older hipBLASLt (ROCm 5.x took other compute and data type enums)
//! is reported unavailable, and so is a missing library: then, and for any shape hipBLASLt has
//! no algorithm for, the portable tiled GEMM serves the op (`ops/gemm.rs`).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use tefl_core::device::{Buffer, DeviceRuntime};
use tefl_core::{DType, Device, Error, Result};
use tefl_gpu::blaslt::{BlasLt, LtCall, LtEpilogue, LtLayout, LtShape, PlanCache};

use crate::hip::{HipStream, candidates, library_api, open_first};
use crate::runtime::{self, failure};

/// The library names tried (ROCm 7, then 6).
pub const HIPBLASLT_LIBS: [&str; 2] = ["libhipblaslt.so.1", "libhipblaslt.so.0"];

/// The oldest hipBLASLt whose enums this binding uses: 0.6 (ROCm 6.0), as
/// `hipblasLtGetVersion` reports it (major·100000 + minor·100 + patch).
pub const MIN_VERSION: c_int = 600;

/// The workspace each device's handle gets.
const WORKSPACE_BYTES: usize = 32 << 20;

type Status = c_int;
type Handle = *mut c_void;
type Desc = *mut c_void;
type Layout = *mut c_void;
type Pref = *mut c_void;

/// `hipblasLtMatmulAlgo_t` (opaque: an algorithm the heuristic picked).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Algo {
    data: [u8; 16],
    max_workspace_bytes: usize,
}

/// `hipblasLtMatmulHeuristicResult_t` (one heuristic answer).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct HeuristicResult {
    algo: Algo,
    workspace_size: usize,
    state: Status,
    waves_count: f32,
    reserved: [c_int; 4],
}

/// `hipDataType` values.
mod data_type {
    use std::ffi::c_int;
    pub const R_32F: c_int = 0;
    pub const R_16F: c_int = 2;
    pub const R_16BF: c_int = 14;
}
/// `HIPBLAS_COMPUTE_32F`.
const COMPUTE_32F: c_int = 2;
/// `HIPBLAS_OP_N`, `HIPBLAS_OP_T`.
const OP_N: c_int = 111;
const OP_T: c_int = 112;
/// `hipblasLtMatmulDescAttributes_t` values.
mod desc_attr {
    use std::ffi::c_int;
    pub const TRANSA: c_int = 0;
    pub const TRANSB: c_int = 1;
    pub const EPILOGUE: c_int = 2;
    pub const BIAS_POINTER: c_int = 3;
    pub const BIAS_DATA_TYPE: c_int = 4;
    pub const EPILOGUE_AUX_POINTER: c_int = 10;
    pub const EPILOGUE_AUX_LD: c_int = 11;
}
/// `HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES`.
const PREF_MAX_WORKSPACE_BYTES: c_int = 1;

library_api! {
    /// hipBLASLt's entry points this backend calls (hipBLASLt 0.6 to 1.x), resolved once.
    HipblasLtApi {
    /// `hipblasLtCreate`.
    create = b"hipblasLtCreate\0": fn(*mut Handle) -> Status;
    /// `hipblasLtGetVersion`.
    get_version = b"hipblasLtGetVersion\0": fn(Handle, *mut c_int) -> Status;
    /// `hipblasLtMatmulDescCreate`.
    desc_create = b"hipblasLtMatmulDescCreate\0": fn(*mut Desc, c_int, c_int) -> Status;
    /// `hipblasLtMatmulDescDestroy`.
    desc_destroy = b"hipblasLtMatmulDescDestroy\0": fn(Desc) -> Status;
    /// `hipblasLtMatmulDescSetAttribute`.
    desc_set = b"hipblasLtMatmulDescSetAttribute\0": fn(Desc, c_int, *const c_void, usize) -> Status;
    /// `hipblasLtMatrixLayoutCreate`.
    layout_create = b"hipblasLtMatrixLayoutCreate\0": fn(*mut Layout, c_int, u64, u64, i64) -> Status;
    /// `hipblasLtMatrixLayoutDestroy`.
    layout_destroy = b"hipblasLtMatrixLayoutDestroy\0": fn(Layout) -> Status;
    /// `hipblasLtMatmulPreferenceCreate`.
    pref_create = b"hipblasLtMatmulPreferenceCreate\0": fn(*mut Pref) -> Status;
    /// `hipblasLtMatmulPreferenceSetAttribute`.
    pref_set = b"hipblasLtMatmulPreferenceSetAttribute\0": fn(Pref, c_int, *const c_void, usize) -> Status;
    /// `hipblasLtMatmulPreferenceDestroy`.
    pref_destroy = b"hipblasLtMatmulPreferenceDestroy\0": fn(Pref) -> Status;
    /// `hipblasLtMatmulAlgoGetHeuristic`.
    heuristic = b"hipblasLtMatmulAlgoGetHeuristic\0": fn(
        Handle, Desc, Layout, Layout, Layout, Layout, Pref, c_int, *mut HeuristicResult, *mut c_int
    ) -> Status;
    /// `hipblasLtMatmul`.
    matmul = b"hipblasLtMatmul\0": fn(
        Handle, Desc, *const c_void, *const c_void, Layout, *const c_void, Layout, *const c_void,
        *const c_void, Layout, *mut c_void, Layout, *const Algo, *mut c_void, usize, HipStream
    ) -> Status;
}}

/// The name of a `hipblasStatus_t`.
pub fn status_name(s: Status) -> String {
    const NAMES: [&str; 12] = [
        "HIPBLAS_STATUS_SUCCESS",
        "HIPBLAS_STATUS_NOT_INITIALIZED",
        "HIPBLAS_STATUS_ALLOC_FAILED",
        "HIPBLAS_STATUS_INVALID_VALUE",
        "HIPBLAS_STATUS_MAPPING_ERROR",
        "HIPBLAS_STATUS_EXECUTION_FAILED",
        "HIPBLAS_STATUS_INTERNAL_ERROR",
        "HIPBLAS_STATUS_NOT_SUPPORTED",
        "HIPBLAS_STATUS_ARCH_MISMATCH",
        "HIPBLAS_STATUS_HANDLE_IS_NULLPTR",
        "HIPBLAS_STATUS_INVALID_ENUM",
        "HIPBLAS_STATUS_UNKNOWN",
    ];
    usize::try_from(s)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("hipblasStatus {s}"), |n| format!("{n} ({s})"))
}

fn check(device: Device, s: Status, what: &str) -> Result<()> {
    if s == 0 { Ok(()) } else { Err(failure(device, format!("hipBLASLt {what}: {}", status_name(s)))) }
}

/// Loads hipBLASLt from `files` (the first that opens) and resolves its entry points.
fn load(files: &[String]) -> std::result::Result<HipblasLtApi, String> {
    let (lib, file) = open_first(files).ok_or_else(|| format!("hipBLASLt was not found; tried {files:?}"))?;
    HipblasLtApi::resolve(lib, file)
}

/// hipBLASLt's entry points, or why it cannot be used (no library, a missing entry point).
/// Loaded once.
pub fn api() -> std::result::Result<&'static HipblasLtApi, String> {
    static API: OnceLock<std::result::Result<HipblasLtApi, String>> = OnceLock::new();
    API.get_or_init(|| load(&candidates(&HIPBLASLT_LIBS))).as_ref().map_err(Clone::clone)
}

/// A device's hipBLASLt handle and workspace.
struct DeviceLt {
    handle: Handle,
    /// Keeps the workspace allocated while the handle lives.
    _workspace: Arc<dyn Buffer>,
    workspace_ptr: u64,
}
// SAFETY: the handle is used by one call at a time per plan (under the plan's mutex) with its
// device current; hipBLASLt handles may be used from any thread.
unsafe impl Send for DeviceLt {}
// SAFETY: as above.
unsafe impl Sync for DeviceLt {}

/// A device's handle, or why hipBLASLt cannot serve it (remembered).
type DeviceState = std::result::Result<Arc<DeviceLt>, String>;

/// The handle of `device`, created once (an error: hipBLASLt cannot serve this device).
fn device_lt(device: Device) -> Result<Arc<DeviceLt>> {
    static M: LazyLock<Mutex<HashMap<u32, DeviceState>>> = LazyLock::new(Default::default);
    let unavailable = |reason: String| Error::DeviceUnavailable { device: device.to_string(), reason };
    let mut g = M.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = g.get(&device.ordinal) {
        return d.clone().map_err(unavailable);
    }
    let made = (|| {
        let lt = api().map_err(unavailable)?;
        let rt = runtime::global();
        rt.enter(device)?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; the device is current on this thread.
        check(device, unsafe { (lt.create)(&mut handle) }, "create")?;
        let mut version: c_int = 0;
        // SAFETY: a live handle and a valid out-pointer.
        check(device, unsafe { (lt.get_version)(handle, &mut version) }, "version")?;
        if version < MIN_VERSION {
            return Err(unavailable(format!(
                "{} is hipBLASLt {}.{} (older than 0.6, ROCm 6.0, whose enums this backend uses)",
                lt.library,
                version / 100000,
                version / 100 % 1000
            )));
        }
        let workspace = rt.alloc_uninit(device, WORKSPACE_BYTES)?;
        let workspace_ptr = rt.buffer(workspace.as_ref())?.device_ptr();
        Ok(Arc::new(DeviceLt { handle, _workspace: workspace, workspace_ptr }))
    })();
    match made {
        Ok(d) => {
            g.insert(device.ordinal, Ok(d.clone()));
            Ok(d)
        }
        Err(Error::DeviceUnavailable { reason, .. }) => {
            g.insert(device.ordinal, Err(reason.clone()));
            Err(unavailable(reason))
        }
        Err(e) => Err(e),
    }
}

/// Whether hipBLASLt serves `device` (`Err`: why not, e.g. not installed or too old).
pub fn usable(device: Device) -> Result<()> {
    device_lt(device).map(|_| ())
}

fn lt_type(d: DType) -> Result<c_int> {
    Ok(match d {
        DType::F32 => data_type::R_32F,
        DType::F16 => data_type::R_16F,
        DType::BF16 => data_type::R_16BF,
        other => {
            return Err(Error::DType { op: "generic_gemm", arg: "a", got: other, expected: "f32, f16 or bf16".into() });
        }
    })
}

/// Cached descriptors and algorithm of one GEMM shape.
struct Plan {
    desc: Desc,
    layouts: [Layout; 3],
    algo: Algo,
}
// SAFETY: the descriptors are only touched while the plan's mutex is held.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        let Ok(lt) = api() else { return };
        // SAFETY: each non-null descriptor was created for this plan and is destroyed once, here.
        unsafe {
            if !self.desc.is_null() {
                let _ = (lt.desc_destroy)(self.desc);
            }
            for l in self.layouts {
                if !l.is_null() {
                    let _ = (lt.layout_destroy)(l);
                }
            }
        }
    }
}

fn set_desc<T>(lt: &HipblasLtApi, device: Device, desc: Desc, attr: c_int, v: &T) -> Result<()> {
    // SAFETY: `desc` is live; `v` points at a value of the attribute's type and size.
    let s = unsafe { (lt.desc_set)(desc, attr, v as *const T as *const c_void, std::mem::size_of::<T>()) };
    check(device, s, "set attribute")
}

/// Builds the plan of `shape`: `Ok(None)` when hipBLASLt has no algorithm for it.
fn build_plan(lt: &HipblasLtApi, shape: &LtShape, dev_lt: &DeviceLt) -> Result<Option<Plan>> {
    let device = Device::new(tefl_core::DeviceKind::HIP, shape.device);
    let mut plan = Plan { desc: std::ptr::null_mut(), layouts: [std::ptr::null_mut(); 3], algo: Algo::default() };
    // SAFETY: a valid out-pointer; the plan owns the descriptor from here (freed on drop).
    check(device, unsafe { (lt.desc_create)(&mut plan.desc, COMPUTE_32F, data_type::R_32F) }, "matmul descriptor")?;
    let (first, second, out) = shape.layouts();
    let ab = lt_type(shape.ab)?;
    for (slot, (t, l)) in plan.layouts.iter_mut().zip([(ab, first), (ab, second), (lt_type(shape.d)?, out)]) {
        let l: LtLayout = l;
        // SAFETY: a valid out-pointer; the plan owns the layout from here.
        check(device, unsafe { (lt.layout_create)(slot, t, l.rows, l.cols, l.ld) }, "layout")?;
    }
    let op = |t: bool| if t { OP_T } else { OP_N };
    set_desc(lt, device, plan.desc, desc_attr::TRANSA, &op(shape.transb))?;
    set_desc(lt, device, plan.desc, desc_attr::TRANSB, &op(shape.transa))?;
    set_desc(lt, device, plan.desc, desc_attr::EPILOGUE, &shape.epilogue.code())?;
    if shape.epilogue.has_pointers() {
        // Placeholders (the workspace) until each call sets the real pointers.
        let placeholder = dev_lt.workspace_ptr;
        set_desc(lt, device, plan.desc, desc_attr::BIAS_POINTER, &placeholder)?;
        set_desc(lt, device, plan.desc, desc_attr::BIAS_DATA_TYPE, &lt_type(shape.d)?)?;
        if shape.epilogue != LtEpilogue::Bias {
            set_desc(lt, device, plan.desc, desc_attr::EPILOGUE_AUX_POINTER, &placeholder)?;
            set_desc(lt, device, plan.desc, desc_attr::EPILOGUE_AUX_LD, &shape.aux_ld())?;
        }
    }
    let mut pref: Pref = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    check(device, unsafe { (lt.pref_create)(&mut pref) }, "preference")?;
    let ws = WORKSPACE_BYTES as u64;
    let mut result = HeuristicResult::default();
    let mut count: c_int = 0;
    // SAFETY: `pref` is live and destroyed once below; every descriptor is live; `result` holds
    // the one result asked for and `count` is a valid out-pointer.
    let found = unsafe {
        let set = (lt.pref_set)(pref, PREF_MAX_WORKSPACE_BYTES, &ws as *const u64 as *const c_void, 8);
        let h = if set == 0 {
            let [a, b, d] = plan.layouts;
            (lt.heuristic)(dev_lt.handle, plan.desc, a, b, d, d, pref, 1, &mut result, &mut count)
        } else {
            set
        };
        let _ = (lt.pref_destroy)(pref);
        h
    };
    if found != 0 || count < 1 || result.state != 0 {
        tracing::debug!(target: "TE-FL", "hipBLASLt heuristic: no algorithm for {shape:?} ({})", status_name(found));
        return Ok(None);
    }
    plan.algo = result.algo;
    Ok(Some(plan))
}

/// hipBLASLt as the shared GEMM host logic's library.
pub struct HipBlasLt;

impl BlasLt for HipBlasLt {
    fn name(&self) -> &'static str {
        "hipBLASLt"
    }

    fn matmul(&self, device: Device, shape: &LtShape, call: &LtCall) -> Result<bool> {
        static PLANS: LazyLock<PlanCache<Plan>> = LazyLock::new(PlanCache::default);
        let lt = api().map_err(|reason| Error::DeviceUnavailable { device: device.to_string(), reason })?;
        let dev_lt = device_lt(device)?;
        let Some(plan) = PLANS.get(shape, || build_plan(lt, shape, &dev_lt))? else { return Ok(false) };
        let p = plan.lock().unwrap_or_else(|p| p.into_inner());
        if call.bias != 0 {
            set_desc(lt, device, p.desc, desc_attr::BIAS_POINTER, &call.bias)?;
        }
        if call.aux != 0 {
            set_desc(lt, device, p.desc, desc_attr::EPILOGUE_AUX_POINTER, &call.aux)?;
        }
        let c = if call.c == 0 { call.d } else { call.c };
        let [la, lb, ld] = p.layouts;
        runtime::global().on_queue(device, |stream| {
            // SAFETY: descriptors and algorithm come from the plan for exactly these shapes and
            // dtypes; a, b, c, d are live device buffers of those sizes (validated by the op);
            // the workspace holds WORKSPACE_BYTES; alpha and beta are f32 (the scale type); the
            // stream is the op's queue on this device.
            let s = unsafe {
                (lt.matmul)(
                    dev_lt.handle,
                    p.desc,
                    &call.alpha as *const f32 as *const c_void,
                    call.b as *const c_void,
                    la,
                    call.a as *const c_void,
                    lb,
                    &call.beta as *const f32 as *const c_void,
                    c as *const c_void,
                    ld,
                    call.d as *mut c_void,
                    ld,
                    &p.algo,
                    dev_lt.workspace_ptr as *mut c_void,
                    WORKSPACE_BYTES,
                    stream,
                )
            };
            check(device, s, "matmul")
        })?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_library_is_unavailable_naming_the_library() {
        let err = load(&["/nonexistent/libhipblaslt.so.1".to_string()]).err().expect("nothing to load");
        assert!(err.contains("hipBLASLt") && err.contains("/nonexistent/libhipblaslt.so.1"), "{err}");
    }

    /// The C layouts of the two structs hipBLASLt fills (hipblaslt.h: 16 bytes and a size_t;
    /// then a size_t, a status, a float and four ints).
    #[test]
    fn heuristic_result_has_the_c_layout() {
        assert_eq!(std::mem::size_of::<Algo>(), 24);
        assert_eq!(std::mem::size_of::<HeuristicResult>(), 56);
        assert_eq!(std::mem::offset_of!(HeuristicResult, state), 32);
    }

    #[test]
    fn status_names() {
        assert_eq!(status_name(7), "HIPBLAS_STATUS_NOT_SUPPORTED (7)");
        assert_eq!(status_name(-1), "hipblasStatus -1");
    }

    /// Where a hipBLASLt is installed, every entry point resolves (none is in CI: Debian has no
    /// package of it).
    #[test]
    fn an_installed_hipblaslt_resolves() {
        match api() {
            Ok(lt) => eprintln!("hipBLASLt loaded from {}", lt.library),
            Err(why) => {
                assert!(why.contains("hipBLASLt") || why.contains("libhipblaslt"), "{why}");
                eprintln!("skipped: {why}");
            }
        }
    }
}
