"""TE-FL's plugin API (``transformer_engine.plugin.core``) on tefl's dispatch layer.

    from tefl.plugin.core import OpRegistry, OpManager, OpImpl, BackendImplKind

    registry = OpRegistry()
    registry.register_impl(OpImpl(op_name="rmsnorm_fwd", impl_id="vendor.mybackend",
                                  kind=BackendImplKind.VENDOR, vendor="mybackend",
                                  fn=my_rmsnorm, priority=200))
    manager = OpManager(registry)
    output, rsigma = manager.call("rmsnorm_fwd", input, weight)

A Python impl takes part in selection, routing (``TE_FL_PREFER``, ``TE_FL_PER_OP``, allow and
deny lists), fallback, failure memory, counters and ``explain`` exactly like tefl's own: it is
registered with tefl's Rust manager as a run-time impl. Its function is called with the op's
leading tensor arguments positionally and the rest by keyword, under tefl's argument names
(``rmsnorm_fwd``: ``fn(x, gamma, eps=..., zero_centered_gamma=..., out_dtype=...)``), tensors
in the caller's kind; it returns the op's outputs in order (a tuple, or one tensor). What it
raises is an impl failure: the manager logs it, names the impl, and falls back. ``MemoryError``
or torch's ``OutOfMemoryError`` counts as running out of memory: the manager falls back but
keeps trying the impl on later calls, and a call with nothing else to run raises
``tefl.OutOfMemoryError``.

``TE_FL_PLUGIN_MODULES`` may name Python modules: their ``register(registry)`` is called when
the process-wide manager is first used (``import tefl`` does it) and by every ``OpManager``.
"""

import contextvars
import enum
import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from .. import _native
from .._core import _convert, cuda_stream, dtype_name, kind_of, to_kind

__all__ = ["BackendImplKind", "OpImpl", "OpRegistry", "OpManager", "load_plugin_modules"]

# The tensor kind of the call being served (Python impls get their tensors as that kind).
_CALL_KIND = contextvars.ContextVar("tefl_call_kind", default=None)


class BackendImplKind(enum.Enum):
    """Which policy token selects an impl: ``flagos``/``default``, ``vendor`` or ``reference``."""

    DEFAULT = "default"
    VENDOR = "vendor"
    REFERENCE = "reference"


@dataclass
class OpImpl:
    """One implementation of one op: TE-FL's fields, plus the device kind its function takes
    tensors on (``cpu``, ``cuda``) and, optionally, the input dtypes it accepts."""

    op_name: str
    impl_id: str
    kind: BackendImplKind
    fn: Callable[..., Any]
    vendor: Optional[str] = None
    priority: int = 0
    device: str = "cpu"
    supported_dtypes: Optional[List[Any]] = None

    def _spec(self):
        kind = self.kind.value if isinstance(self.kind, BackendImplKind) else str(self.kind)
        return {
            "op_name": self.op_name,
            "impl_id": self.impl_id,
            "kind": kind,
            "vendor": self.vendor,
            "priority": int(self.priority),
            "device": self.device,
            "dtypes": [dtype_name(d, "supported_dtypes") for d in self.supported_dtypes]
            if self.supported_dtypes
            else None,
            "fn_": _adapter(self.fn),
        }


_CATALOGUE = None


# Outputs appended to an op for its FP8 form (absent for float outputs).
_FP8_EXTRAS = {
    "rmsnorm_fwd": ("amax", "scale_inv"),
    "layernorm_fwd": ("amax", "scale_inv"),
    "generic_gemm": ("d_amax",),
}


# Arguments appended to an op for its FP8 form (passed to Python impls only when given).
_FP8_EXTRA_ARGS = {
    "rmsnorm_fwd": ("scale",),
    "layernorm_fwd": ("scale",),
    "generic_gemm": ("a_scale_inv", "b_scale_inv", "d_scale"),
}


def _catalogue():
    """{op: (argument names, output names)}, read from tefl once."""
    global _CATALOGUE
    if _CATALOGUE is None:
        _CATALOGUE = _native.catalogue()
    return _CATALOGUE


def _adapter(fn):
    """The callable tefl's Rust side calls: (op, {tefl argument: value}) -> outputs."""
    catalogue = _catalogue()

    def call(op, args):
        kind = _CALL_KIND.get() or _guess_kind(args)
        names, _ = catalogue[op]
        positional = []
        for name in names:
            v = args.get(name)
            if isinstance(v, _native.Tensor):
                positional.append(to_kind(v, kind))
            else:
                break
        rest = {}
        fp8_args = _FP8_EXTRA_ARGS.get(op, ())
        for name in names[len(positional):]:
            v = args.get(name)
            if v is None and name in fp8_args:
                # Arguments appended for the FP8 form reach an impl only when given, so impls
                # written for the float form keep their signatures.
                continue
            if isinstance(v, list):
                v = [to_kind(x, kind) for x in v]
            else:
                v = to_kind(v, kind)
            rest[name] = v
        return fn(*positional, **rest)

    return call


def _guess_kind(args):
    for v in args.values():
        if isinstance(v, _native.Tensor) and not v.device.startswith("cpu"):
            return "torch"
    return "numpy"


class OpRegistry:
    """The impls a manager is made with (TE-FL's ``OpRegistry``)."""

    def __init__(self):
        self._impls = []
        self._sinks = []

    def register_impl(self, impl: OpImpl):
        """Adds ``impl`` (an ``OpImpl``); managers made from this registry, and the process-wide
        one for plugin modules, take it."""
        if not isinstance(impl, OpImpl):
            raise TypeError(f"register_impl: expected an OpImpl, got {type(impl).__name__}")
        spec = impl._spec()
        for sink in self._sinks:
            sink.register_impl(spec)
        self._impls.append(impl)

    def get_implementations(self, op_name: str) -> List[OpImpl]:
        """The Python impls registered here for ``op_name``."""
        return [i for i in self._impls if i.op_name == op_name]

    def list_impls(self) -> List[OpImpl]:
        return list(self._impls)


# Keyword defaults of the ops' trailing scalar arguments for OpManager.call (TE-FL passes what
# the impl needs; tefl's ops take every argument, so the common ones get TE's defaults).
_DEFAULTS = {
    "eps": 1e-5,
    "zero_centered_gamma": False,
}


class OpManager:
    """Runs ops through tefl's selection (TE-FL's ``OpManager``): the built-in impls plus the
    registry's Python impls and the Python plugin modules of ``TE_FL_PLUGIN_MODULES``."""

    def __init__(self, registry: Optional[OpRegistry] = None):
        self.registry = registry or OpRegistry()
        plugin_registry = OpRegistry()
        load_plugin_modules(plugin_registry)
        specs = [i._spec() for i in self.registry.list_impls() + plugin_registry.list_impls()]
        self._native = _native.Manager(specs)
        self.registry._sinks.append(self._native)

    def call(self, op_name: str, *args, **kwargs):
        """Calls ``op_name`` with TE-FL's calling convention: the op's tensor arguments
        positionally, the rest by keyword (tefl's names; ``eps`` defaults to 1e-5 and an
        output dtype to the first input's). Returns the outputs: one value, or a tuple."""
        catalogue = _catalogue()
        if op_name not in catalogue:
            raise ValueError(f"unknown op {op_name!r}")
        names, outs = catalogue[op_name]
        if len(args) > len(names):
            raise TypeError(f"{op_name} takes at most {len(names)} arguments, got {len(args)}")
        named = dict(zip(names, args))
        for k, v in kwargs.items():
            if k in named:
                raise TypeError(f"{op_name}: argument {k!r} given twice")
            named[k] = v
        for name in names:
            if name not in named:
                if name in _DEFAULTS:
                    named[name] = _DEFAULTS[name]
                elif name == "out_dtype" and args:
                    named[name] = dtype_name(getattr(args[0], "dtype", None), "out_dtype")
                else:
                    named[name] = None
        kind = kind_of(named.values())
        if kind == "torch":
            # torch refuses to export tensors that require grad; tefl only reads them.
            named = {k: _detached(v) for k, v in named.items()}
        token = _CALL_KIND.set(kind)
        try:
            out = self._native.call(op_name, named, None, cuda_stream(named.values()))
        finally:
            _CALL_KIND.reset(token)
        values = [_convert(out[o], kind) for o in outs]
        # The FP8 extras come back only for an FP8 output, so float calls keep TE-FL's tuples.
        extras = _FP8_EXTRAS.get(op_name, ())
        while extras and values and values[-1] is None and outs[len(values) - 1] in extras:
            values.pop()
        return values[0] if len(values) == 1 else tuple(values)

    def explain(self, op_name: str, device: str = "cpu", dtype: str = "f32") -> str:
        """Why ``op_name`` goes where it goes: the chain and each impl's state."""
        return self._native.explain(op_name, device, dtype_name(dtype))

    def counters(self):
        """{(op, impl_id): (calls, failures, fallbacks)}."""
        return self._native.counters()

    def impl_ids(self):
        return self._native.impl_ids()


def _detached(v):
    if isinstance(v, (list, tuple)):
        return [_detached(x) for x in v]
    return v.detach() if hasattr(v, "requires_grad") and getattr(v, "requires_grad", False) else v


def _plugin_names():
    raw = os.environ.get("TE_FL_PLUGIN_MODULES", "")
    return [n.strip() for n in raw.split(",") if n.strip()]


def _is_python_module(name):
    # A library path (tefl's own rule, shared with the native loader) is never a module.
    if _native.plugin_entry_is_library(name):
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def python_plugin_modules():
    """The ``TE_FL_PLUGIN_MODULES`` entries that are Python modules."""
    return [n for n in _plugin_names() if _is_python_module(n)]


def load_plugin_modules(registry: OpRegistry):
    """Imports each Python module of ``TE_FL_PLUGIN_MODULES`` and calls its
    ``register(registry)``; a module that fails is reported (ERROR line) and skipped."""
    import sys

    loaded = []
    for name in python_plugin_modules():
        try:
            module = importlib.import_module(name)
            register = getattr(module, "register")
            register(registry)
            loaded.append(name)
        except Exception as e:  # a broken plugin must not stop the others
            print(f"[TE-FL plugin ERROR] Plugin '{name}' skipped: {type(e).__name__}: {e}", file=sys.stderr)
    return loaded


def _install_global_plugins(manager):
    """Registers the Python plugin modules' impls with the process-wide manager (the native
    manager takes the same impl descriptions a registry hands its sinks)."""
    registry = OpRegistry()
    registry._sinks.append(manager)
    if load_plugin_modules(registry):
        # The native manager logged its impls when it was made; the list with the Python
        # plugins' impls in it, as TE-FL logs it after discovery.
        manager.log_registered()
