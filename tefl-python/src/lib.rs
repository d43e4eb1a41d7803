//! `tefl._native`: tefl's Rust core for Python. The Python package (`python/tefl`) builds the
//! TEX functions, the plugin API and the torch layers on these few entry points:
//!
//! - `Manager` (the process-wide one, `global_manager()`, or a new one over the built-in impls
//!   plus Python impls): `call(op, args, impl_id=None)` runs an op of the catalogue by name with a
//!   dict of arguments and returns a dict of outputs; the GIL is released while it runs.
//! - `Tensor`: a tefl tensor, handed to Python by DLPack (`__dlpack__`, no copy).
//! - Python impls: a callable registered for an op takes part in selection, fallback and
//!   counters like a Rust impl; its exceptions become impl failures naming it.
//!
//! Arguments: tensors are any object with `__dlpack__` (imported without a copy); bools, ints,
//! floats, strings, None, lists and dicts map to tefl's dynamic values (`tefl_core::dynargs`).
//! Errors: bad input is `ValueError` (`TypeError` for a value of the wrong kind) with tefl's
//! message naming the argument; an impl failure is `RuntimeError` naming the impl.

mod dlpack;

use std::sync::Arc;

use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use tefl_core::dynargs::{self, Value};
use tefl_core::op::{DynKernel, FieldKind};
use tefl_core::{BackendImplKind, DType, Device, DeviceKind, Error, OpImpl, Registry, Tensor};

pyo3::create_exception!(
    tefl,
    OutOfMemoryError,
    PyRuntimeError,
    "A device (or the host) could not hold what a call needed: tefl's OutOfMemory error, raised \
     when every impl that failed ran out of memory. A RuntimeError, like torch's own."
);

/// A tefl error as the Python exception the package promises.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::OutOfMemory { .. } => OutOfMemoryError::new_err(msg),
        Error::ArgumentType { .. } => PyTypeError::new_err(msg),
        Error::Config { .. }
        | Error::Shape { .. }
        | Error::DType { .. }
        | Error::DeviceMismatch { .. }
        | Error::InvalidArgument { .. }
        | Error::Tensor(_)
        | Error::UnknownOp(_) => PyValueError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// A tefl tensor on the Python side: hand it to `numpy.from_dlpack` or `torch.from_dlpack`.
#[pyclass(name = "Tensor", module = "tefl._native", frozen)]
struct PyTensor {
    inner: Tensor,
}

#[pymethods]
impl PyTensor {
    /// DLPack export (no copy); the keyword arguments of the protocol are accepted.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<Bound<'_, PyAny>>,
        dl_device: Option<Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = dl_device;
        // A consumer that speaks DLPack 1.x gets a versioned (writable) capsule.
        let versioned = match max_version {
            Some(v) => v.extract::<(u32, u32)>().is_ok_and(|(major, _)| major >= 1),
            None => false,
        };
        let consumer_stream = stream.and_then(|s| s.extract::<i64>().ok()).and_then(|s| u64::try_from(s).ok());
        if copy == Some(true) {
            let fresh = dlpack::fresh_copy(&self.inner).map_err(to_py)?;
            return dlpack::export(py, &fresh, versioned, consumer_stream);
        }
        dlpack::export(py, &self.inner, versioned, consumer_stream)
    }

    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        dlpack::dl_device(self.inner.device()).ok_or_else(|| {
            pyo3::exceptions::PyBufferError::new_err(format!("{} has no DLPack device", self.inner.device()))
        })
    }

    /// The shape.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.inner.shape().to_vec()
    }

    /// tefl's dtype name (`bf16`, `f8e4m3`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype().name()
    }

    /// The device (`cpu`, `cuda:0`, `vulkan:0`).
    #[getter]
    fn device(&self) -> String {
        self.inner.device().to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "tefl.Tensor(shape={:?}, dtype={}, device={})",
            self.inner.shape(),
            self.inner.dtype(),
            self.inner.device()
        )
    }
}

/// `value` (a Python object) as argument `arg` of a call.
fn to_value(v: &Bound<'_, PyAny>, arg: &str, inout: bool, stream: Option<u64>) -> PyResult<Value> {
    if v.is_none() {
        return Ok(Value::None);
    }
    if let Ok(t) = v.cast::<PyTensor>() {
        return Ok(Value::Tensor(t.get().inner.clone()));
    }
    if v.is_instance_of::<pyo3::types::PyCapsule>() {
        // A DLPack capsule made by the caller (torch's to_dlpack: the fast path of tefl.tex).
        let imported = dlpack::import_capsule(v, arg)?;
        if inout && (imported.copied || imported.read_only) {
            return Err(PyValueError::new_err(format!(
                "argument '{arg}' is updated in place and its memory cannot be written in place"
            )));
        }
        return Ok(Value::Tensor(imported.tensor));
    }
    if v.is_instance_of::<PyBool>() {
        return Ok(Value::Bool(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        return v
            .extract::<i128>()
            .map(Value::Int)
            .map_err(|_| PyValueError::new_err(format!("argument '{arg}': {v} does not fit 128 bits")));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(Value::Float(v.extract()?));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(Value::Str(v.extract()?));
    }
    if v.hasattr("__dlpack__")? {
        let imported = dlpack::import(v, arg, stream)?;
        if inout && imported.copied {
            return Err(PyValueError::new_err(format!(
                "argument '{arg}' is updated in place and its memory cannot be used in place (not 8-byte aligned): pass an aligned tensor"
            )));
        }
        if inout && imported.read_only {
            return Err(PyValueError::new_err(format!("argument '{arg}' is updated in place but is read-only")));
        }
        return Ok(Value::Tensor(imported.tensor));
    }
    if let Ok(list) = v.cast::<PyList>() {
        return list.iter().map(|x| to_value(&x, arg, inout, stream)).collect::<PyResult<_>>().map(Value::List);
    }
    if let Ok(tuple) = v.cast::<PyTuple>() {
        return tuple.iter().map(|x| to_value(&x, arg, inout, stream)).collect::<PyResult<_>>().map(Value::List);
    }
    if let Ok(dict) = v.cast::<PyDict>() {
        let mut items = Vec::new();
        for (k, x) in dict.iter() {
            let key: String =
                k.extract().map_err(|_| PyTypeError::new_err(format!("argument '{arg}': keys must be str")))?;
            items.push((key, to_value(&x, arg, inout, stream)?));
        }
        return Ok(Value::Map(items));
    }
    Err(PyTypeError::new_err(format!(
        "argument '{arg}': {} is not a tensor (no __dlpack__), number, bool, str, list or dict",
        v.get_type().name()?
    )))
}

/// How tensors come back from a call.
#[derive(Clone, Copy)]
enum TensorsOut {
    /// As `tefl._native.Tensor` objects (DLPack producers).
    Objects,
    /// As `(capsule, dtype name)`: a legacy DLPack capsule for `torch.utils.dlpack.from_dlpack`
    /// (the fast path), used by its consumer on `stream`.
    Capsules { stream: Option<u64> },
}

/// A dynamic value as a Python object (tensors as `tefl._native.Tensor`).
fn from_value(py: Python<'_>, v: Value) -> PyResult<Py<PyAny>> {
    from_value_as(py, v, TensorsOut::Objects)
}

fn from_value_as(py: Python<'_>, v: Value, tensors: TensorsOut) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::None => py.None(),
        Value::Bool(b) => PyBool::new(py, b).to_owned().into_any().unbind(),
        Value::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
        Value::Float(f) => f.into_pyobject(py)?.into_any().unbind(),
        Value::Str(s) => s.into_pyobject(py)?.into_any().unbind(),
        Value::Tensor(t) => match tensors {
            TensorsOut::Objects => Py::new(py, PyTensor { inner: t })?.into_any(),
            TensorsOut::Capsules { stream } => {
                let cap = dlpack::export(py, &t, false, stream)?;
                (cap, t.dtype().name()).into_pyobject(py)?.into_any().unbind()
            }
        },
        Value::List(items) => {
            let objs = items.into_iter().map(|x| from_value_as(py, x, tensors)).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, objs)?.into_any().unbind()
        }
        Value::Map(items) => {
            let d = PyDict::new(py);
            for (k, x) in items {
                d.set_item(k, from_value_as(py, x, tensors)?)?;
            }
            d.into_any().unbind()
        }
    })
}

/// The named arguments of a call of `op` from a dict.
fn call_args(op: &str, args: &Bound<'_, PyDict>, stream: Option<u64>) -> PyResult<Vec<(String, Value)>> {
    let desc = tefl_core::catalogue::find(op);
    let mut out = Vec::with_capacity(args.len());
    for (k, v) in args.iter() {
        let name: String = k.extract().map_err(|_| PyTypeError::new_err("argument names must be str"))?;
        let inout =
            desc.and_then(|d| d.args.iter().find(|f| f.name == name)).is_some_and(|f| f.kind == FieldKind::InOut);
        out.push((name.clone(), to_value(&v, &name, inout, stream)?));
    }
    Ok(out)
}

/// The CUDA device of the first CUDA tensor in `v`.
fn first_cuda_device(v: &Value) -> Option<Device> {
    match v {
        Value::Tensor(t) if t.device().kind == DeviceKind::CUDA => Some(t.device()),
        Value::List(items) => items.iter().find_map(first_cuda_device),
        _ => None,
    }
}

/// A tefl manager: the process-wide one, or one of the Python plugin API's `OpManager`s.
#[pyclass(name = "Manager", module = "tefl._native", frozen)]
struct PyManager {
    inner: ManagerRef,
}

enum ManagerRef {
    Global(&'static tefl_core::Manager),
    Own(Arc<tefl_core::Manager>),
}

impl PyManager {
    fn get(&self) -> &tefl_core::Manager {
        match &self.inner {
            ManagerRef::Global(m) => m,
            ManagerRef::Own(m) => m,
        }
    }
}

fn kind_of(kind: &str) -> PyResult<BackendImplKind> {
    match kind.to_ascii_lowercase().as_str() {
        "vendor" => Ok(BackendImplKind::Vendor),
        "default" | "flagos" => Ok(BackendImplKind::Default),
        "reference" => Ok(BackendImplKind::Reference),
        other => Err(PyValueError::new_err(format!(
            "kind: unknown BackendImplKind {other:?} (one of vendor, default, reference)"
        ))),
    }
}

/// A Python impl's description, from the plugin API.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct ImplSpec {
    op_name: String,
    impl_id: String,
    kind: String,
    vendor: Option<String>,
    priority: i32,
    device: Option<String>,
    dtypes: Option<Vec<String>>,
    fn_: Py<PyAny>,
}

/// The impl serving `spec` with a Python callable. The callable gets the call's arguments as a
/// dict (tensors as `tefl._native.Tensor`) and returns the outputs (a dict by output name, a
/// tuple in output order, or one tensor for one output); what it raises is an impl failure.
fn python_impl(spec: ImplSpec) -> PyResult<OpImpl> {
    let desc = tefl_core::catalogue::find(&spec.op_name).ok_or_else(|| {
        let hint =
            tefl_core::catalogue::closest(&spec.op_name).map(|c| format!(" (did you mean {c}?)")).unwrap_or_default();
        PyValueError::new_err(format!("op_name: '{}' is not an op of tefl's catalogue{hint}", spec.op_name))
    })?;
    let kind = kind_of(&spec.kind)?;
    let func = Arc::new(spec.fn_);
    let kernel: DynKernel = Arc::new(move |ctx, call| {
        let fail = |reason: String| Error::ImplFailed { op: call.op, impl_id: ctx.impl_id.to_string(), reason };
        Python::attach(|py| {
            let kwargs = PyDict::new(py);
            for (name, v) in call.values() {
                let obj = from_value(py, v).map_err(|e| fail(e.to_string()))?;
                kwargs.set_item(name, obj).map_err(|e| fail(e.to_string()))?;
            }
            let ret = func.bind(py).call1((call.op, kwargs)).map_err(|e| {
                if raised_out_of_memory(py, &e) {
                    // Not a defect of the impl: the manager falls back without passing it over.
                    return Error::OutOfMemory {
                        device: ctx.device.to_string(),
                        bytes: 0,
                        what: format!("impl '{}' of op '{}': raised {e}", ctx.impl_id, call.op),
                    };
                }
                fail(format!("raised {e}"))
            })?;
            outputs_of(&ret, call.outputs).map_err(|e| fail(e.to_string()))
        })
    });
    let mut imp = OpImpl::dynamic(desc, spec.impl_id, kind, kernel).priority(spec.priority);
    if let Some(v) = spec.vendor {
        imp = imp.vendor(v);
    }
    if let Some(d) = spec.device {
        let kind = DeviceKind::intern(&d.to_ascii_lowercase()).map_err(to_py)?;
        imp = imp.device(kind);
    }
    if let Some(ds) = spec.dtypes {
        let ds = ds.iter().map(|d| d.parse::<DType>()).collect::<tefl_core::Result<Vec<_>>>().map_err(to_py)?;
        imp = imp.dtypes(&ds);
    }
    Ok(imp)
}

/// Whether a Python impl's exception says it ran out of memory: `MemoryError`, or an exception
/// class named `OutOfMemoryError` (torch's `torch.OutOfMemoryError`, alias
/// `torch.cuda.OutOfMemoryError`, or tefl's own), matched by name so that torch need not be
/// imported.
fn raised_out_of_memory(py: Python<'_>, e: &PyErr) -> bool {
    if e.is_instance_of::<PyMemoryError>(py) {
        return true;
    }
    e.get_type(py).mro().iter().any(|c| {
        c.cast::<pyo3::types::PyType>().ok().and_then(|t| t.name().ok()).is_some_and(|n| n == "OutOfMemoryError")
    })
}

/// The output slots of a Python impl's return value.
fn outputs_of(ret: &Bound<'_, PyAny>, fields: &[tefl_core::op::FieldDesc]) -> PyResult<Vec<Option<Tensor>>> {
    let slot = |v: Bound<'_, PyAny>, name: &str| -> PyResult<Option<Tensor>> {
        match to_value(&v, name, false, None)? {
            Value::None => Ok(None),
            Value::Tensor(t) => Ok(Some(t)),
            other => Err(PyTypeError::new_err(format!("output '{name}' is {}, not a tensor", other.kind()))),
        }
    };
    if let Ok(d) = ret.cast::<PyDict>() {
        return fields
            .iter()
            .map(|f| slot(d.get_item(f.name)?.unwrap_or(ret.py().None().into_bound(ret.py())), f.name))
            .collect();
    }
    if let Ok(t) = ret.cast::<PyTuple>() {
        // Outputs a catalogue version appended (optional ones, such as the FP8 extras of the
        // norms) may be left off the end: they are absent.
        let optional = |f: &tefl_core::op::FieldDesc| f.ty.starts_with("Option");
        if t.len() < fields.len() && fields[t.len()..].iter().all(optional) {
            let mut slots = fields.iter().zip(t.iter()).map(|(f, v)| slot(v, f.name)).collect::<PyResult<Vec<_>>>()?;
            slots.resize(fields.len(), None);
            return Ok(slots);
        }
        if t.len() != fields.len() {
            return Err(PyValueError::new_err(format!(
                "returned {} values; the op has {} outputs ({})",
                t.len(),
                fields.len(),
                fields.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
            )));
        }
        return fields.iter().zip(t.iter()).map(|(f, v)| slot(v, f.name)).collect();
    }
    if fields.len() == 1 {
        return Ok(vec![slot(ret.clone(), fields[0].name)?]);
    }
    Err(PyTypeError::new_err(format!(
        "returned {}; the op has {} outputs: return a tuple or a dict",
        ret.get_type().name()?,
        fields.len()
    )))
}

#[pymethods]
impl PyManager {
    /// A new manager: every built-in impl plus `impls` (Python impls, see the plugin API),
    /// under the policy of the `TE_FL_*` variables.
    #[new]
    fn new(impls: Vec<ImplSpec>) -> PyResult<Self> {
        let mut reg = Registry::with_builtins();
        for spec in impls {
            reg.register_impl(python_impl(spec)?).map_err(to_py)?;
        }
        let cfg = tefl_core::policy::env().clone().map_err(to_py)?;
        tefl_core::plugin::load_plugins(&mut reg, &cfg.plugin_modules);
        Ok(PyManager { inner: ManagerRef::Own(Arc::new(tefl_core::Manager::new(reg, cfg.policy))) })
    }

    /// Calls `op` with `args` (a dict by argument name); returns a dict by output name. With
    /// `impl_id`, that impl runs directly, bypassing the policy. With `stream` (a CUDA stream
    /// handle: torch's current stream), the op's CUDA work is queued on that stream, after
    /// the work already there, instead of tefl's own; the GIL is released while it runs.
    ///
    /// With `capsules`, output tensors come back as `(capsule, dtype name)` pairs for
    /// `torch.utils.dlpack.from_dlpack` (faster than the object protocol).
    #[pyo3(signature = (op, args, impl_id=None, stream=None, capsules=false))]
    fn call(
        &self,
        py: Python<'_>,
        op: &str,
        args: &Bound<'_, PyDict>,
        impl_id: Option<&str>,
        stream: Option<u64>,
        capsules: bool,
    ) -> PyResult<Py<PyDict>> {
        let named = call_args(op, args, stream)?;
        let cuda = named.iter().find_map(|(_, v)| first_cuda_device(v));
        let m = self.get();
        let run = move || match impl_id {
            Some(id) => dynargs::call_impl_by_name(m, op, id, named),
            None => dynargs::call_by_name(m, op, named),
        };
        let out = py
            .detach(|| match (cuda, stream) {
                (Some(device), Some(handle)) if handle != 0 => tefl_core::device::with_queue(device, handle, run)?,
                _ => run(),
            })
            .map_err(to_py)?;
        let tensors = if capsules { TensorsOut::Capsules { stream } } else { TensorsOut::Objects };
        let d = PyDict::new(py);
        for (name, v) in out {
            d.set_item(name, from_value_as(py, v, tensors)?)?;
        }
        Ok(d.unbind())
    }

    /// Registers a Python impl (see the plugin API).
    fn register_impl(&self, spec: ImplSpec) -> PyResult<()> {
        self.get().register_impl(python_impl(spec)?).map_err(to_py)
    }

    /// Logs `Registered impl_ids: [...]` for the registry as it is now (after Python plugins).
    fn log_registered(&self) {
        self.get().log_registered();
    }

    /// Every registered impl id, sorted.
    fn impl_ids(&self) -> Vec<String> {
        self.get().with_registry(|r| r.impl_ids())
    }

    /// TEX's `list_backends()`: `[{'name', 'vendor', 'priority', 'available', ...}]`.
    fn list_backends(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let list = PyList::empty(py);
        for b in self.get().list_backends() {
            let d = PyDict::new(py);
            d.set_item("name", b.name)?;
            d.set_item("vendor", b.vendor)?;
            d.set_item("priority", b.priority)?;
            d.set_item("available", b.available)?;
            d.set_item("unavailable_reason", b.unavailable_reason)?;
            d.set_item("current", b.current)?;
            d.set_item("impls", b.impls)?;
            list.append(d)?;
        }
        Ok(list.unbind())
    }

    /// TEX's `get_backend()`: the backend calls go to first.
    fn get_backend(&self) -> String {
        self.get().get_backend().name
    }

    /// TEX's `set_backend(name)`: route every op to that backend first (an unknown or
    /// unavailable one is a `RuntimeError` listing those there are).
    fn set_backend(&self, name: &str) -> PyResult<()> {
        self.get().set_backend(name).map_err(to_py)
    }

    /// Why `op` on `device` with `dtype` goes where it goes (the chain, each impl's state).
    fn explain(&self, op: &str, device: &str, dtype: &str) -> PyResult<String> {
        let device: Device = device.parse().map_err(to_py)?;
        let dtype: DType = dtype.parse().map_err(to_py)?;
        Ok(self.get().explain(op, &device, dtype).map_err(to_py)?.to_string())
    }

    /// Per (op, impl id): (calls served, failures, calls served as a fallback).
    fn counters(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let d = PyDict::new(py);
        self.get().with_registry(|r| -> PyResult<()> {
            for imp in r.all_impls() {
                let c = imp.counters();
                let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
                d.set_item((imp.op(), imp.impl_id()), (load(&c.calls), load(&c.failures), load(&c.fallbacks)))?;
            }
            Ok(())
        })?;
        Ok(d.unbind())
    }
}

/// The process-wide manager (what `tefl.tex` calls through).
#[pyfunction]
fn global_manager() -> PyResult<PyManager> {
    Ok(PyManager { inner: ManagerRef::Global(tefl_core::global().map_err(to_py)?) })
}

/// The names of the ops of the catalogue, and each one's argument and output names.
#[pyfunction]
fn catalogue(py: Python<'_>) -> PyResult<Py<PyDict>> {
    let d = PyDict::new(py);
    for desc in tefl_core::catalogue::all() {
        let args: Vec<&str> = desc.args.iter().map(|f| f.name).collect();
        let outs: Vec<&str> = desc.outputs.iter().map(|f| f.name).collect();
        d.set_item(desc.name, (args, outs))?;
    }
    Ok(d.unbind())
}

/// A copy of `t` on `device` (`cpu`, `cuda:0`, ...).
#[pyfunction]
fn to_device(py: Python<'_>, t: &Bound<'_, PyAny>, device: &str) -> PyResult<Py<PyAny>> {
    let device: Device = device.parse().map_err(to_py)?;
    let Value::Tensor(t) = to_value(t, "t", false, None)? else {
        return Err(PyTypeError::new_err("t: expected a tensor"));
    };
    let moved = py.detach(|| t.to_device(&device)).map_err(to_py)?;
    Ok(Py::new(py, PyTensor { inner: moved })?.into_any())
}

/// A host copy of `t` converted to `dtype` (numpy has no bf16: bf16 results reach numpy as f32).
#[pyfunction]
fn cast(py: Python<'_>, t: &Bound<'_, PyAny>, dtype: &str) -> PyResult<Py<PyAny>> {
    let dtype: DType = dtype.parse().map_err(to_py)?;
    let Value::Tensor(t) = to_value(t, "t", false, None)? else {
        return Err(PyTypeError::new_err("t: expected a tensor"));
    };
    let out = py
        .detach(|| -> tefl_core::Result<Tensor> {
            let vals = t.to_vec::<f32>()?;
            Tensor::from_slice(&vals, t.shape(), dtype)
        })
        .map_err(to_py)?;
    Ok(Py::new(py, PyTensor { inner: out })?.into_any())
}

/// `t`'s memory retyped as `dtype` of the same element size (no copy): FP8 data that reached
/// numpy as uint8 bytes goes back in as its FP8 dtype.
#[pyfunction]
fn view_as(py: Python<'_>, t: &Bound<'_, PyAny>, dtype: &str) -> PyResult<Py<PyAny>> {
    let dtype: DType = dtype.parse().map_err(to_py)?;
    let Value::Tensor(t) = to_value(t, "t", false, None)? else {
        return Err(PyTypeError::new_err("t: expected a tensor"));
    };
    if t.dtype().size_in_bytes() != dtype.size_in_bytes() {
        return Err(PyValueError::new_err(format!("t: {} elements cannot be viewed as {dtype}", t.dtype())));
    }
    let view = Tensor::from_buffer(t.buffer().clone(), t.shape(), dtype).map_err(to_py)?;
    Ok(Py::new(py, PyTensor { inner: view })?.into_any())
}

/// Marks `TE_FL_PLUGIN_MODULES` entries that are Python modules (the package calls their
/// `register(registry)`), so that tefl does not also try to open them as libraries.
#[pyfunction]
fn set_python_plugin_modules(names: Vec<String>) {
    tefl_core::plugin::set_foreign_kind("Python module");
    tefl_core::plugin::set_foreign_entries(names);
}

/// Whether a `TE_FL_PLUGIN_MODULES` entry names a library file rather than a bare name (tefl's
/// one rule, `tefl_core::plugin::is_library_path`): such an entry is never a Python module.
#[pyfunction]
fn plugin_entry_is_library(entry: &str) -> bool {
    tefl_core::plugin::is_library_path(entry)
}

/// The backend crates linked into this build.
#[pyfunction]
fn linked_backends() -> Vec<&'static str> {
    tefl_ops::linked_backends()
}

/// Frees the large CPU buffers tefl keeps for reuse (and the CPU GEMM's packing scratch); the
/// bytes given back.
#[pyfunction]
fn release_host_cache() -> usize {
    tefl_core::device::release_host_cache()
}

/// Bytes of freed CPU buffers tefl keeps for reuse now.
#[pyfunction]
fn host_cache_bytes() -> usize {
    tefl_core::device::host_cache_bytes()
}

/// The most bytes of freed CPU buffers tefl keeps for reuse now.
#[pyfunction]
fn host_cache_limit() -> usize {
    tefl_core::device::host_cache_limit()
}

/// Sets that budget (0 keeps none), freeing kept buffers past it; the bytes given back.
#[pyfunction]
fn set_host_cache_limit(nbytes: usize) -> usize {
    tefl_core::device::set_host_cache_limit(nbytes)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Keeps every backend crate's registrations in the library (see linked_backends).
    let _ = tefl_ops::linked_backends();
    tefl_core::logging::init().map_err(to_py)?;
    m.add_class::<PyTensor>()?;
    m.add_class::<PyManager>()?;
    m.add("OutOfMemoryError", m.py().get_type::<OutOfMemoryError>())?;
    m.add_function(wrap_pyfunction!(global_manager, m)?)?;
    m.add_function(wrap_pyfunction!(catalogue, m)?)?;
    m.add_function(wrap_pyfunction!(plugin_entry_is_library, m)?)?;
    m.add_function(wrap_pyfunction!(to_device, m)?)?;
    m.add_function(wrap_pyfunction!(cast, m)?)?;
    m.add_function(wrap_pyfunction!(view_as, m)?)?;
    m.add_function(wrap_pyfunction!(set_python_plugin_modules, m)?)?;
    m.add_function(wrap_pyfunction!(linked_backends, m)?)?;
    m.add_function(wrap_pyfunction!(release_host_cache, m)?)?;
    m.add_function(wrap_pyfunction!(host_cache_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(host_cache_limit, m)?)?;
    m.add_function(wrap_pyfunction!(set_host_cache_limit, m)?)?;
    Ok(())
}
