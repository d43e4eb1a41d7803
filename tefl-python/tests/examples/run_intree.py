"""Runs the TE-FL plugin README's in-tree example (``example_intree.py``: the README's code with
only its import line changed) the way its README shows, then checks its result.

The snippet expects ``input``, ``weight`` and ``torch`` to exist. With torch installed they are
torch tensors and torch itself; without it (the CI machine) they are numpy arrays of a small
``numpy.ndarray`` subclass with torch's ``pow`` and ``mean(dim, keepdim)``, and ``torch`` is a
namespace holding ``rsqrt`` — the only torch calls the snippet makes.
"""

import pathlib
import sys
import types

import numpy as np

rng = np.random.default_rng(7)
x = rng.standard_normal((6, 48)).astype(np.float32)
w = rng.standard_normal(48).astype(np.float32)

try:
    import torch

    namespace = {"torch": torch, "input": torch.from_numpy(x), "weight": torch.from_numpy(w)}
except ImportError:

    class TorchLike(np.ndarray):
        """numpy with the two tensor methods the snippet uses, spelled as torch spells them."""

        def pow(self, e):
            return np.power(self, e)

        def mean(self, dim=None, keepdim=False, **kw):
            return np.mean(np.asarray(self), axis=dim, keepdims=keepdim).view(TorchLike)

    fake_torch = types.SimpleNamespace(rsqrt=lambda t: (1.0 / np.sqrt(np.asarray(t))).view(TorchLike))
    namespace = {"torch": fake_torch, "input": x.view(TorchLike), "weight": w.view(TorchLike)}

source = (pathlib.Path(__file__).parent / "example_intree.py").read_text()
exec(compile(source, "example_intree.py", "exec"), namespace)

output, rsigma = (np.asarray(namespace["output"]), np.asarray(namespace["rsigma"]))
want_r = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(-1) + 1e-5)
want = x * want_r[:, None] * w
err = max(np.abs(output - want).max(), np.abs(rsigma.reshape(-1) - want_r).max())
print(f"in-tree example: output {output.shape}, rsigma {rsigma.shape}, max error {err:.2e}")
sys.exit(0 if err < 1e-4 else 1)
