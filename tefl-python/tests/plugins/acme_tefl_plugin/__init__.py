"""An out-of-tree Python plugin package (TE-FL's layout): ``register(registry)`` adds a vendor
impl of ``gelu`` (tanh approximation, on the host) and one of ``silu`` that always raises, so
that the tests see a plugin's impl chosen and a failing one fall back."""

import numpy as np

from tefl.plugin.core import BackendImplKind, OpImpl

CALLS = {"gelu": 0, "silu": 0}


def acme_gelu(x, **kwargs):
    CALLS["gelu"] += 1
    x = np.asarray(x, dtype=np.float32)
    y = 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))
    return y.astype(np.float32)


def acme_silu(x, **kwargs):
    CALLS["silu"] += 1
    raise RuntimeError("acme silu kernel is broken")


def register(registry):
    registry.register_impl(
        OpImpl(op_name="gelu", impl_id="vendor.acme", kind=BackendImplKind.VENDOR, vendor="acme", fn=acme_gelu, priority=150)
    )
    registry.register_impl(
        OpImpl(op_name="silu", impl_id="vendor.acme", kind=BackendImplKind.VENDOR, vendor="acme", fn=acme_silu, priority=150)
    )
