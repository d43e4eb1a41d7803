"""Calls into tefl's Rust core, with tensors in the caller's kind.

Tensors go in by DLPack without a copy (numpy arrays, torch tensors, anything with
``__dlpack__``) and come back as the kind the call's inputs were: torch tensors for torch
inputs, numpy arrays otherwise.
"""

import os
import sys

from . import _native

__all__ = [
    "call",
    "cuda_stream",
    "deterministic_default",
    "dtype_name",
    "to_kind",
    "kind_of",
    "global_manager",
]

_DTYPE_NAMES = {
    "float32": "f32",
    "float": "f32",
    "f32": "f32",
    "float16": "f16",
    "half": "f16",
    "f16": "f16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float64": "f64",
    "f64": "f64",
    "int32": "i32",
    "int": "i32",
    "i32": "i32",
    "int64": "i64",
    "i64": "i64",
    "uint8": "u8",
    "u8": "u8",
    "bool": "bool",
    "float8_e4m3fn": "f8e4m3",
    "float8_e4m3": "f8e4m3",
    "f8e4m3": "f8e4m3",
    "kfloat8e4m3": "f8e4m3",
    "float8_e5m2": "f8e5m2",
    "f8e5m2": "f8e5m2",
    "kfloat8e5m2": "f8e5m2",
    "kfloat32": "f32",
    "kfloat16": "f16",
    "kbfloat16": "bf16",
}


# tefl's names of the torch and numpy dtype objects seen so far (hashable, and few): their text
# is parsed once, not on every call. Other values (strings, enums that compare equal to ints)
# are parsed each time.
_DTYPE_CACHE = {}


def deterministic_default(torch_deterministic=False):
    """Whether an attention backward whose caller did not say must give the same dQ bits on every
    repetition: when TransformerEngine's ``NVTE_ALLOW_NONDETERMINISTIC_ALGO`` is 0 (TE's switch
    for its fused attention; unset or any other integer allows the faster, non-deterministic
    backward) or when ``torch_deterministic`` (``torch.are_deterministic_algorithms_enabled()``)
    is set. A value that is not an integer is a ``ValueError`` naming the variable."""
    raw = os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1")
    try:
        allowed = int(raw.strip()) != 0
    except ValueError:
        raise ValueError(f"NVTE_ALLOW_NONDETERMINISTIC_ALGO={raw!r}: expected an integer (0 or 1)") from None
    return bool(torch_deterministic) or not allowed


def dtype_name(dtype, arg="dtype"):
    """tefl's name of a dtype given as a torch dtype, a numpy dtype, TE's DType or a string."""
    cached = type(dtype).__module__.split(".")[0] in ("torch", "numpy")
    if cached:
        name = _DTYPE_CACHE.get(dtype)
        if name is not None:
            return name
    name = _parse_dtype(dtype, arg)
    if cached:
        _DTYPE_CACHE[dtype] = name
    return name


def _parse_dtype(dtype, arg):
    if dtype is None:
        raise ValueError(f"argument '{arg}': a dtype is required")
    text = str(dtype)
    for prefix in ("torch.", "DType.", "tex.DType.", "<class 'numpy.", "dtype('"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    text = text.rstrip("')>").lower()
    try:
        return _DTYPE_NAMES[text]
    except KeyError:
        raise TypeError(f"argument '{arg}': {dtype!r} is not a dtype tefl knows") from None


def _walk(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _walk(v)
        else:
            yield v


def kind_of(values):
    """The tensor kind results come back as: 'torch' when any of the values is a torch tensor,
    else the class of the first numpy array (a subclass of ``numpy.ndarray`` stays itself),
    else 'numpy'."""
    torch = sys.modules.get("torch")
    if torch is not None:
        tensor = torch.Tensor
        for v in values:
            if isinstance(v, tensor):
                return "torch"
    else:
        # Without torch loaded, a call whose first argument is a plain numpy array is numpy's.
        numpy = sys.modules.get("numpy")
        for v in values:
            if numpy is not None and type(v) is numpy.ndarray:
                return numpy.ndarray
            break
    first = None
    for v in _walk(values):
        module = type(v).__module__
        if module.startswith("torch"):
            return "torch"
        if first is None and hasattr(v, "__array_priority__") and hasattr(v, "__dlpack__"):
            first = type(v)
    return first or "numpy"


def _torch_dlpack():
    """torch's C-level DLPack converters (much cheaper per call than the object protocol)."""
    import torch

    to = getattr(torch._C, "_to_dlpack", None) or torch.utils.dlpack.to_dlpack
    frm = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
    return to, frm


def _torch_in(v, to_dlpack):
    import torch

    if isinstance(v, torch.Tensor):
        return to_dlpack(v.detach())
    if isinstance(v, (list, tuple)):
        return [_torch_in(x, to_dlpack) for x in v]
    return v


def to_kind(t, kind):
    """A tefl tensor (``tefl._native.Tensor``, or a ``(capsule, dtype)`` pair from the torch
    fast path) as a tensor of `kind`, without a copy where the kind can hold its dtype (numpy
    has no bf16: bf16 results come to numpy as float32)."""
    if isinstance(t, tuple) and len(t) == 2 and type(t[0]).__name__ == "PyCapsule":
        import torch

        cap, dtype = t
        x = _torch_dlpack()[1](cap)
        if dtype == "f8e4m3":
            x = x.view(torch.float8_e4m3fn)
        elif dtype == "f8e5m2":
            x = x.view(torch.float8_e5m2)
        return x
    if not isinstance(t, _native.Tensor):
        return t
    if kind == "torch":
        import torch

        x = torch.from_dlpack(t)
        if t.dtype == "f8e4m3":
            x = x.view(torch.float8_e4m3fn)
        elif t.dtype == "f8e5m2":
            x = x.view(torch.float8_e5m2)
        return x
    np = sys.modules.get("numpy")
    if np is None:
        import numpy as np

    if t.dtype == "bf16":
        t = _native.cast(t, "f32")
    x = np.from_dlpack(t)
    if kind is not np.ndarray and isinstance(kind, type) and issubclass(kind, np.ndarray):
        x = x.view(kind)
    return x


def _convert(v, kind):
    if isinstance(v, list):
        return [_convert(x, kind) for x in v]
    return to_kind(v, kind)


_GLOBAL = None


def global_manager():
    """The process-wide manager (``tex`` calls go through it)."""
    global _GLOBAL
    if _GLOBAL is None:
        from .plugin import core as plugin_core

        _GLOBAL = _native.global_manager()
        plugin_core._install_global_plugins(_GLOBAL)
    return _GLOBAL


def cuda_stream(values):
    """torch's current CUDA stream (its handle) for the device of the first CUDA torch tensor
    among `values`, else None: tefl queues the op's work there, as torch's own ops would."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    for v in _walk(values):
        if isinstance(v, torch.Tensor) and v.is_cuda:
            if raw is not None:
                return raw(v.device.index)
            return torch.cuda.current_stream(v.device).cuda_stream
    return None


class _Torch:
    """torch's pieces the per-call fast path uses, looked up once."""

    def __init__(self, torch):
        self.Tensor = torch.Tensor
        self.to_dlpack, self.from_dlpack = _torch_dlpack()
        self.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.views = {"f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2}


_TORCH = None


def _torch_call(m, op, args, impl_id):
    """One pass over the arguments: torch tensors to DLPack capsules (C-level), the first CUDA
    tensor's current stream; outputs back from capsules."""
    global _TORCH
    if _TORCH is None:
        import torch

        _TORCH = _Torch(torch)
    T = _TORCH
    stream = None
    native = {}
    for k, v in args.items():
        if isinstance(v, T.Tensor):
            if stream is None and v.is_cuda:
                stream = T.raw_stream(v.get_device()) if T.raw_stream else cuda_stream([v])
            # (DLPack refuses a tensor that requires grad; detach makes a new tensor object,
            # so only when needed.)
            native[k] = T.to_dlpack(v.detach() if v.requires_grad else v)
        elif isinstance(v, (list, tuple)):
            if stream is None:
                stream = cuda_stream(v)
            native[k] = _torch_in(v, T.to_dlpack)
        else:
            native[k] = v
    out = m.call(op, native, impl_id, stream, True)
    result = {}
    for k, v in out.items():
        if type(v) is tuple:
            x = T.from_dlpack(v[0])
            view = T.views.get(v[1])
            result[k] = x if view is None else x.view(view)
        elif isinstance(v, list):
            result[k] = [to_kind(x, "torch") for x in v]
        else:
            result[k] = v
    return result


def call(op, args, impl_id=None, manager=None, kind=None):
    """Runs tefl op `op` with `args` (a dict by tefl argument name); returns a dict by output
    name, tensors in the caller's kind. CUDA torch tensors run on torch's current stream."""
    kind = kind or kind_of(args.values())
    m = manager or _GLOBAL or global_manager()
    if kind == "torch":
        return _torch_call(m, op, args, impl_id)
    out = m.call(op, args, impl_id)
    return {k: _convert(v, kind) for k, v in out.items()}
