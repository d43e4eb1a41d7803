//! Tensors in and out by DLPack (the legacy `DLManagedTensor` capsule, which every producer and
//! consumer speaks): an object's `__dlpack__()` capsule becomes a tefl tensor over the same
//! memory, and a tefl tensor becomes a capsule over its memory, owned by the capsule until its
//! consumer releases it.

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::{CStr, c_void};
use tefl_core::{DType, Device, DeviceKind, Tensor};

/// DLPack's device types tefl maps.
const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;
/// DLPack's type codes.
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
const DL_BOOL: u8 = 6;
// DLPack 1.1's FP8 codes for TE's two formats (torch exports float8_e4m3fn and float8_e5m2 as
// these); the other FP8 codes (e4m3 with infinities, the fnuz forms) are other encodings.
const DL_FLOAT8_E4M3FN: u8 = 10;
const DL_FLOAT8_E5M2: u8 = 12;

const CAPSULE_NAME: &CStr = c"dltensor";
const USED_CAPSULE_NAME: &CStr = c"used_dltensor";

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

/// DLPack 1.x's managed tensor (capsule `dltensor_versioned`).
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

/// DLPack 1.x's flag: the memory must not be written.
const FLAG_READ_ONLY: u64 = 1;
const VERSIONED_NAME: &CStr = c"dltensor_versioned";
const USED_VERSIONED_NAME: &CStr = c"used_dltensor_versioned";

fn dtype_of(t: DlDataType) -> Option<DType> {
    if t.lanes != 1 {
        return None;
    }
    Some(match (t.code, t.bits) {
        (DL_FLOAT, 32) => DType::F32,
        (DL_FLOAT, 16) => DType::F16,
        (DL_BFLOAT, 16) => DType::BF16,
        (DL_FLOAT, 64) => DType::F64,
        (DL_INT, 32) => DType::I32,
        (DL_INT, 64) => DType::I64,
        (DL_UINT, 8) => DType::U8,
        (DL_BOOL, 8) => DType::Bool,
        (DL_FLOAT8_E4M3FN, 8) => DType::F8E4M3,
        (DL_FLOAT8_E5M2, 8) => DType::F8E5M2,
        _ => return None,
    })
}

/// The DLPack type of a tefl dtype (FP8 data goes out as bytes, which every consumer reads
/// (numpy has no float8): view it as float8 there; it comes in either way).
fn dl_type(d: DType) -> DlDataType {
    let (code, bits) = match d {
        DType::F32 => (DL_FLOAT, 32),
        DType::F16 => (DL_FLOAT, 16),
        DType::BF16 => (DL_BFLOAT, 16),
        DType::F64 => (DL_FLOAT, 64),
        DType::I32 => (DL_INT, 32),
        DType::I64 => (DL_INT, 64),
        DType::Bool => (DL_BOOL, 8),
        DType::U8 | DType::F8E4M3 | DType::F8E5M2 => (DL_UINT, 8),
    };
    DlDataType { code, bits, lanes: 1 }
}

/// The DLPack device of a tefl device, where DLPack has one.
pub fn dl_device(d: Device) -> Option<(i32, i32)> {
    if d.is_cpu() {
        Some((DL_CPU, 0))
    } else if d.kind == DeviceKind::CUDA {
        Some((DL_CUDA, d.ordinal as i32))
    } else {
        None
    }
}

/// A consumed capsule's managed tensor (legacy or versioned), released (its deleter called,
/// with the GIL) when the last tefl tensor over its memory goes.
enum Imported {
    Legacy(*mut DlManagedTensor),
    Versioned(*mut DlManagedTensorVersioned),
}

// SAFETY: the managed tensor is only touched again by `drop`, which calls its deleter with the
// GIL held, as DLPack producers expect from any thread.
unsafe impl Send for Imported {}
// SAFETY: as above; nothing reads through `&Imported`.
unsafe impl Sync for Imported {}

impl Drop for Imported {
    fn drop(&mut self) {
        // At interpreter exit (a tensor kept by a thread-local, dropped after finalisation)
        // the producer's memory is gone with the interpreter: nothing to release.
        // SAFETY: a plain query of the interpreter's state.
        if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
            return;
        }
        Python::attach(|_| {
            // SAFETY: the pointer came from a consumed capsule (ownership passed to us, per
            // DLPack) and is released exactly once, here.
            unsafe {
                match *self {
                    Imported::Legacy(m) => {
                        if let Some(deleter) = (*m).deleter {
                            deleter(m);
                        }
                    }
                    Imported::Versioned(m) => {
                        if let Some(deleter) = (*m).deleter {
                            deleter(m);
                        }
                    }
                }
            }
        });
    }
}

/// Asks `obj` for a DLPack 1.x capsule, else (an older producer) a legacy one. For a CUDA
/// tensor, `stream` is the stream tefl will use it on (the producer orders its pending work
/// before it; DLPack spells the legacy default stream 1, never 0).
fn capsule_of<'py>(obj: &Bound<'py, PyAny>, stream: Option<u64>) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = pyo3::types::PyDict::new(obj.py());
    kwargs.set_item("max_version", (1, 0))?;
    if let Some(s) = stream {
        let on_cuda = obj
            .call_method0("__dlpack_device__")
            .ok()
            .and_then(|d| d.extract::<(i32, i32)>().ok())
            .is_some_and(|(t, _)| t == DL_CUDA);
        if on_cuda {
            kwargs.set_item("stream", if s == 0 { 1 } else { s })?;
        }
    }
    match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(c) => Ok(c),
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => obj.call_method0("__dlpack__"),
        Err(e) => Err(e),
    }
}

/// What importing an object gave: a tensor over its memory, or over a copy where its memory
/// could not be used in place (unaligned host memory).
pub struct ImportedTensor {
    pub tensor: Tensor,
    /// Whether `tensor` is a copy (an argument the op writes in place must not be).
    pub copied: bool,
    /// Whether the producer marked the memory read-only (so must an in-place argument not be).
    pub read_only: bool,
}

/// Imports `obj` (anything with `__dlpack__`) for argument `arg`.
pub fn import(obj: &Bound<'_, PyAny>, arg: &str, stream: Option<u64>) -> PyResult<ImportedTensor> {
    import_capsule(&capsule_of(obj, stream)?, arg)
}

/// Imports a DLPack capsule (legacy or versioned) for argument `arg`, consuming it.
pub fn import_capsule(capsule: &Bound<'_, PyAny>, arg: &str) -> PyResult<ImportedTensor> {
    let obj = capsule;
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err(format!("argument '{arg}': __dlpack__ did not return a capsule")))?;
    let name = capsule.name()?;
    // SAFETY: a capsule's name is a NUL-terminated string or null (checked).
    let name = name.map(|n| unsafe { n.as_cstr() }.to_owned());
    let (owner, t, read_only) = if name.as_deref() == Some(VERSIONED_NAME) {
        let ptr = capsule.pointer_checked(Some(VERSIONED_NAME))?.as_ptr().cast::<DlManagedTensorVersioned>();
        // SAFETY: `capsule` is live and the new name static: the capsule's destructor now leaves
        // the tensor to us (DLPack's hand-over).
        if unsafe { pyo3::ffi::PyCapsule_SetName(capsule.as_ptr(), USED_VERSIONED_NAME.as_ptr()) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: the producer keeps the managed tensor valid until its deleter runs.
        let (major, flags) = unsafe { ((*ptr).version.major, (*ptr).flags) };
        let owner = Imported::Versioned(ptr);
        if major != 1 {
            return Err(PyValueError::new_err(format!("argument '{arg}': DLPack version {major} is not 1")));
        }
        // SAFETY: as above.
        (owner, unsafe { &(*ptr).dl_tensor }, flags & FLAG_READ_ONLY != 0)
    } else if name.as_deref() == Some(CAPSULE_NAME) {
        let ptr = capsule.pointer_checked(Some(CAPSULE_NAME))?.as_ptr().cast::<DlManagedTensor>();
        // SAFETY: as for the versioned capsule.
        if unsafe { pyo3::ffi::PyCapsule_SetName(capsule.as_ptr(), USED_CAPSULE_NAME.as_ptr()) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: the producer keeps the managed tensor valid until its deleter runs.
        (Imported::Legacy(ptr), unsafe { &(*ptr).dl_tensor }, false)
    } else {
        return Err(PyValueError::new_err(format!(
            "argument '{arg}': the DLPack capsule was already consumed or is not a DLPack capsule"
        )));
    };
    let dtype = dtype_of(t.dtype).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "argument '{arg}': DLPack dtype (code {}, {} bits, {} lanes) has no tefl dtype",
            t.dtype.code, t.dtype.bits, t.dtype.lanes
        ))
    })?;
    let ndim = usize::try_from(t.ndim).map_err(|_| PyValueError::new_err(format!("argument '{arg}': ndim < 0")))?;
    let dims: &[i64] = if ndim == 0 || t.shape.is_null() {
        &[]
    } else {
        // SAFETY: DLPack: `shape` holds `ndim` dims while the tensor lives.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let shape: Vec<usize> = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| PyValueError::new_err(format!("argument '{arg}': dim {d} < 0"))))
        .collect::<PyResult<_>>()?;
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    // Strides matter only where there are elements to address: an empty tensor is contiguous
    // whatever its producer reports (numpy exports zero strides for some empty arrays), as in
    // torch, and so is a dimension of size 1.
    if !t.strides.is_null() && ndim > 0 && numel != Some(0) {
        // SAFETY: DLPack: `strides` holds `ndim` entries when not null.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut want = 1i64;
        for (i, (&d, &s)) in dims.iter().zip(strides).enumerate().rev() {
            if d > 1 && s != want {
                return Err(PyValueError::new_err(format!(
                    "argument '{arg}' is not contiguous (dim {i} has stride {s}, expected {want}): pass a contiguous tensor"
                )));
            }
            want = want.saturating_mul(d);
        }
    }
    let bytes = numel
        .and_then(|n| n.checked_mul(dtype.size_in_bytes()))
        .ok_or_else(|| PyValueError::new_err(format!("argument '{arg}': shape {shape:?} overflows")))?;
    let addr = (t.data as usize).wrapping_add(t.byte_offset as usize);
    match t.device.device_type {
        DL_CPU => {
            if bytes == 0 {
                let tensor = Tensor::zeros(&shape, dtype, &Device::CPU).map_err(crate::to_py)?;
                return Ok(ImportedTensor { tensor, copied: false, read_only });
            }
            if !addr.is_multiple_of(8) {
                // tefl's host memory is 8-byte aligned (kernels view any dtype in place): copy.
                // SAFETY: DLPack: the memory holds the tensor's `bytes` bytes while the managed
                // tensor lives, and `owner` is alive here.
                let data = unsafe { std::slice::from_raw_parts(addr as *const u8, bytes) };
                let buf = tefl_core::device::host_buffer(data).map_err(crate::to_py)?;
                drop(owner);
                let tensor = Tensor::from_buffer(buf, &shape, dtype).map_err(crate::to_py)?;
                return Ok(ImportedTensor { tensor, copied: true, read_only });
            }
            let owner: Box<dyn std::any::Any + Send + Sync> = Box::new(owner);
            // SAFETY: DLPack: the memory holds the tensor's `bytes` bytes while the managed tensor
            // lives, which `owner` ensures; tefl only touches it during ops on it.
            let buf = unsafe { tefl_core::device::external_host_buffer(addr as *mut u8, bytes, owner) }
                .map_err(crate::to_py)?;
            let tensor = Tensor::from_buffer(buf, &shape, dtype).map_err(crate::to_py)?;
            Ok(ImportedTensor { tensor, copied: false, read_only })
        }
        DL_CUDA => {
            let device = Device::cuda(u32::try_from(t.device.device_id).unwrap_or(u32::MAX));
            let rt = tefl_core::device::runtime(DeviceKind::CUDA).map_err(crate::to_py)?;
            if bytes == 0 {
                let tensor = Tensor::zeros(&shape, dtype, &device).map_err(crate::to_py)?;
                return Ok(ImportedTensor { tensor, copied: false, read_only });
            }
            let owner: Box<dyn std::any::Any + Send + Sync> = Box::new(owner);
            // SAFETY: DLPack: the memory holds the tensor's `bytes` bytes on this device while the
            // managed tensor lives, which `owner` ensures; the producer ordered its writes before
            // the stream tefl runs on (`stream` above).
            let buf = unsafe { rt.import_external(device, addr as u64, bytes, owner) }.map_err(crate::to_py)?;
            let tensor = Tensor::from_buffer(buf, &shape, dtype).map_err(crate::to_py)?;
            if addr.is_multiple_of(16) {
                return Ok(ImportedTensor { tensor, copied: false, read_only });
            }
            // tefl's kernels load 16 bytes at a time from their tensors' starts: copy.
            Ok(ImportedTensor { tensor: fresh_copy(&tensor).map_err(crate::to_py)?, copied: true, read_only })
        }
        other => Err(PyValueError::new_err(format!(
            "argument '{arg}' is on DLPack device type {other}; tefl takes host (CPU) and CUDA tensors"
        ))),
    }
}

/// A copy of `t` in a new buffer on its device.
pub fn fresh_copy(t: &Tensor) -> tefl_core::Result<Tensor> {
    let out = Tensor::uninit(t.shape(), t.dtype(), &t.device())?;
    out.copy_from(t)?;
    Ok(out)
}

/// What an exported capsule owns: the tensor (its memory), the shape array DLPack points at,
/// and the consumer's stream (where it may still use the memory when it lets go of it).
struct ExportCtx {
    tensor: Option<Tensor>,
    shape: Vec<i64>,
    consumer_stream: Option<u64>,
}

impl Drop for ExportCtx {
    fn drop(&mut self) {
        let Some(t) = self.tensor.take() else { return };
        // The consumer may have queued work on its stream that still reads the memory: order
        // tefl's queue (where the memory is released) after it. DLPack's 1 and 2 name the legacy
        // and per-thread default streams, which tefl's default stream already follows.
        if let (Some(s), Ok(rt)) =
            (self.consumer_stream.filter(|&s| s > 2), tefl_core::device::runtime(t.device().kind))
        {
            let _ = rt.wait_for_queue(t.device(), s);
        }
        drop(t);
    }
}

unsafe extern "C" fn export_deleter(m: *mut DlManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` and its context were made by `export` with Box::into_raw and are freed once,
    // by whoever holds the managed tensor (the consumer, or the capsule's destructor).
    unsafe {
        drop(Box::from_raw((*m).manager_ctx.cast::<ExportCtx>()));
        drop(Box::from_raw(m));
    }
}

unsafe extern "C" fn export_deleter_versioned(m: *mut DlManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: as for `export_deleter`.
    unsafe {
        drop(Box::from_raw((*m).manager_ctx.cast::<ExportCtx>()));
        drop(Box::from_raw(m));
    }
}

/// The tensor a capsule named `name` still owns, or null when a consumer took it (renamed the
/// capsule; the failed lookup's error is cleared).
///
/// # Safety
/// `capsule` must be a live capsule object.
unsafe fn unconsumed(capsule: *mut pyo3::ffi::PyObject, name: &CStr) -> *mut std::ffi::c_void {
    // SAFETY: the caller passes a live capsule; a lookup under another name returns null and
    // sets an error, cleared here.
    unsafe {
        let p = pyo3::ffi::PyCapsule_GetPointer(capsule, name.as_ptr());
        if p.is_null() {
            pyo3::ffi::PyErr_Clear();
        }
        p
    }
}

unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the capsule; an unconsumed capsule still owns the tensor.
    unsafe {
        let p = unconsumed(capsule, CAPSULE_NAME);
        if !p.is_null() {
            export_deleter(p.cast());
        }
    }
}

unsafe extern "C" fn capsule_destructor_versioned(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: as for `capsule_destructor`.
    unsafe {
        let p = unconsumed(capsule, VERSIONED_NAME);
        if !p.is_null() {
            export_deleter_versioned(p.cast());
        }
    }
}

/// A DLPack capsule over `t`'s memory (no copy): DLPack 1.0's `dltensor_versioned` when the
/// consumer asked for it (`versioned`, writable), else the legacy `dltensor`. The capsule or
/// its consumer keeps the tensor alive.
pub fn export(py: Python<'_>, t: &Tensor, versioned: bool, consumer_stream: Option<u64>) -> PyResult<Py<PyAny>> {
    let (device_type, device_id) = dl_device(t.device()).ok_or_else(|| {
        PyBufferError::new_err(format!("a tensor on {} has no DLPack device; copy it to the host first", t.device()))
    })?;
    let data = t.buffer().raw_address().ok_or_else(|| {
        PyBufferError::new_err(format!("a tensor on {} has no address other libraries can use", t.device()))
    })?;
    let mut ctx = Box::new(ExportCtx {
        tensor: Some(t.clone()),
        shape: t.shape().iter().map(|&d| d as i64).collect(),
        consumer_stream,
    });
    let dl_tensor = DlTensor {
        data: data as *mut c_void,
        device: DlDevice { device_type, device_id },
        ndim: t.rank() as i32,
        dtype: dl_type(t.dtype()),
        shape: ctx.shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let ctx = Box::into_raw(ctx).cast::<c_void>();
    let cap = if versioned {
        let m = Box::into_raw(Box::new(DlManagedTensorVersioned {
            version: DlPackVersion { major: 1, minor: 0 },
            manager_ctx: ctx,
            deleter: Some(export_deleter_versioned),
            flags: 0,
            dl_tensor,
        }));
        // SAFETY: a capsule over `m` with a static name; its destructor frees `m` unless a
        // consumer took it (renaming the capsule).
        let cap =
            unsafe { pyo3::ffi::PyCapsule_New(m.cast(), VERSIONED_NAME.as_ptr(), Some(capsule_destructor_versioned)) };
        if cap.is_null() {
            // SAFETY: the capsule was not made, so `m` is still ours to free.
            unsafe { export_deleter_versioned(m) };
        }
        cap
    } else {
        let m = Box::into_raw(Box::new(DlManagedTensor { dl_tensor, manager_ctx: ctx, deleter: Some(export_deleter) }));
        // SAFETY: as above.
        let cap = unsafe { pyo3::ffi::PyCapsule_New(m.cast(), CAPSULE_NAME.as_ptr(), Some(capsule_destructor)) };
        if cap.is_null() {
            // SAFETY: the capsule was not made, so `m` is still ours to free.
            unsafe { export_deleter(m) };
        }
        cap
    };
    if cap.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new (owned) reference.
    Ok(unsafe { Py::from_owned_ptr(py, cap) })
}
