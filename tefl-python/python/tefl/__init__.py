"""tefl from Python: TransformerEngine's TEX ops (``tefl.tex``, also importable as
``transformer_engine_fl_torch``), TE-FL's plugin API with Python impls (``tefl.plugin.core``)
and torch layers (``tefl.torch``), on tefl's Rust dispatch layer.

    import numpy as np
    import tefl.tex as tex
    x = np.random.randn(4, 64).astype(np.float32)
    y, _, rsigma = tex.rmsnorm_fwd(x, np.ones(64, np.float32), 1e-5, None, None, np.float32, 0, False)
"""

from . import _native
from ._core import call, dtype_name

# Raised when a call could not get the memory it needed (every impl that failed ran out of
# memory); a RuntimeError.
OutOfMemoryError = _native.OutOfMemoryError

__all__ = [
    "OutOfMemoryError",
    "call",
    "dtype_name",
    "explain",
    "host_cache_bytes",
    "host_cache_limit",
    "linked_backends",
    "list_backends",
    "release_host_cache",
    "set_host_cache_limit",
]
__version__ = "0.1.0"


def _init():
    from .plugin import core as plugin_core

    # Python modules in TE_FL_PLUGIN_MODULES are loaded by the package (when the process-wide
    # manager is made), not opened as libraries.
    _native.set_python_plugin_modules(plugin_core.python_plugin_modules())


def explain(op, device="cpu", dtype="f32"):
    """Why `op` on `device` with `dtype` goes where it goes, through the process-wide manager."""
    from ._core import global_manager

    return global_manager().explain(op, device, dtype_name(dtype))


def list_backends():
    """Every backend tefl knows here (see ``tefl.tex.list_backends``)."""
    from ._core import global_manager

    return global_manager().list_backends()


def linked_backends():
    """The backend crates in this build of tefl (``reference`` always)."""
    return _native.linked_backends()


def release_host_cache():
    """Frees the CPU buffers tefl keeps for reuse and returns how many bytes that gave back.

    Large host buffers (256 KiB and up) that tefl frees are kept, up to 512 MiB in all, for the
    next allocation of about their size, so that a CPU training step does not hand its
    buffers back to the C allocator and fault their pages in again at the next step; the CPU
    GEMM also keeps its packing buffers (up to about 2.2 MiB a thread) between calls. Like
    ``torch.cuda.empty_cache``, this gives that memory back; nothing else changes.
    """
    return _native.release_host_cache()


def host_cache_bytes():
    """Bytes of freed CPU buffers tefl keeps for reuse now (see ``release_host_cache``)."""
    return _native.host_cache_bytes()


def host_cache_limit():
    """The most bytes of freed CPU buffers tefl keeps for reuse: ``set_host_cache_limit``'s
    value, else ``TEFL_HOST_CACHE_MB`` MiB, else 512 MiB."""
    return _native.host_cache_limit()


def set_host_cache_limit(nbytes):
    """Sets how many bytes of freed CPU buffers tefl may keep for reuse (0 keeps none), frees
    the oldest kept buffers past it now, and returns how many bytes that gave back. A negative
    or non-integer ``nbytes`` is a ``TypeError`` / ``OverflowError``."""
    return _native.set_host_cache_limit(nbytes)


_init()
