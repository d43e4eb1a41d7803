"""Records every tefl op call the tests make on NumPy inputs (deep copies of the arguments),
for ``test_zz_perturbed_calls.py``: each recorded call is a valid call, so a copy with one
argument made wrong must be refused with a Python argument error, never reach an impl and
fail there."""

import numpy as np
import pytest

import tefl
import tefl._core as _core
import tefl.tex as _tex

RECORDED = []
_call = _core.call


def _copy(v):
    if isinstance(v, np.ndarray):
        return np.array(v, copy=True)
    if isinstance(v, list):
        return [_copy(x) for x in v]
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    return v


def _plain(v):
    if isinstance(v, list):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(_plain(x) for x in v.values())
    return v is None or isinstance(v, (np.ndarray, bool, int, float, str))


def _recording_call(op, args, impl_id=None, manager=None, kind=None):
    if impl_id is None and manager is None and all(_plain(v) for v in args.values()):
        RECORDED.append((op, {k: _copy(v) for k, v in args.items()}))
    return _call(op, args, impl_id, manager, kind)


@pytest.fixture(autouse=True, scope="session")
def _record_calls():
    saved = (_core.call, _tex.call, tefl.call)
    _core.call = _tex.call = tefl.call = _recording_call
    yield
    _core.call, _tex.call, tefl.call = saved


def original_call(op, args):
    """A call that is not recorded."""
    return _call(op, args)


def copy_args(args):
    """Deep copies of a call's arguments (in-place ops write into them)."""
    return {k: _copy(v) for k, v in args.items()}
