"""Every valid call the other tests made on NumPy inputs (recorded by conftest.py), replayed with
one argument made wrong: a tensor with a dimension one longer or shorter, one dimension fewer or
more, or another dtype; a number out of range or not finite. Each must succeed (some changes
are still valid) or raise ValueError / TypeError / NotImplementedError / OverflowError naming
an argument, or tefl.OutOfMemoryError for a size no memory holds; never another error (an impl
that failed on arguments validation let through). Runs last (file order), after the calls are
recorded."""

import numpy as np
import pytest

import tefl
from conftest import RECORDED, original_call

ARGUMENT_ERRORS = (ValueError, TypeError, NotImplementedError, OverflowError, tefl.OutOfMemoryError)
NUMBERS = (-1, 0, 2**31, 2**63, -(2**63), 1e30, float("nan"), float("inf"), -0.5, 7)


def _tensor_variants(a):
    for i in range(a.ndim):
        for delta in (1, -1):
            shape = list(a.shape)
            shape[i] += delta
            if shape[i] >= 0:
                yield f"dim {i} {delta:+d}", np.resize(a, shape).astype(a.dtype)
    if a.ndim > 0 and a.shape[0] > 0:
        yield "first dim dropped", np.ascontiguousarray(a[0])
    yield "a dim added", a[None].copy()
    for dt in (np.float32, np.float16, np.int32, np.int64, np.uint8):
        if a.dtype != dt:
            with np.errstate(invalid="ignore", over="ignore"):  # (NaN or big values to integers)
                yield f"as {np.dtype(dt)}", a.astype(dt)


def _perturbed(args):
    """(argument, change, new args) for every single-argument change."""
    for name, v in args.items():
        if isinstance(v, np.ndarray):
            for what, w in _tensor_variants(v):
                yield name, what, {**args, name: w}
        elif isinstance(v, list) and v and all(isinstance(x, np.ndarray) for x in v):
            for what, w in _tensor_variants(v[0]):
                yield name, f"element 0 {what}", {**args, name: [w, *v[1:]]}
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            for w in NUMBERS:
                yield name, f"= {w!r}", {**args, name: w}


def test_calls_with_one_wrong_argument_are_refused_by_validation():
    if not RECORDED:
        pytest.skip("no calls recorded: run the whole test directory")
    seen, tried, wrong = set(), 0, []
    for op, args in RECORDED:
        for name, what, bad in _perturbed(args):
            key = (op, name, what, tuple((k, getattr(v, "shape", None)) for k, v in args.items()))
            if key in seen:
                continue
            seen.add(key)
            tried += 1
            try:
                original_call(op, {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in bad.items()})
            except ARGUMENT_ERRORS:
                pass
            except Exception as e:  # an impl failure: validation let the change through
                wrong.append(f"{op}: {name} {what}: {type(e).__name__}: {str(e)[:200]}")
    assert tried > 500, f"only {tried} perturbed calls: too few calls recorded"
    assert not wrong, "\n".join(wrong)
