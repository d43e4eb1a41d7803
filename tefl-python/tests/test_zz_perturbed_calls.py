"""Every valid call the other tests made on NumPy inputs (recorded by conftest.py), replayed with
one argument made wrong: a tensor with a dimension one longer or shorter, one dimension fewer or
more, or another dtype; a number out of range or not finite. Each must succeed (some changes
are still valid) or raise ValueError / TypeError / NotImplementedError / OverflowError naming
an argument, or tefl.OutOfMemoryError for a size no memory holds; never another error (an impl
that failed on arguments validation let through). Runs last (file order), after the calls are
recorded; the ops the other tests do not call on NumPy inputs get a valid call of their own
here (EXTRA)."""

import numpy as np
import pytest

import tefl
from conftest import RECORDED, copy_args, original_call
from tefl import _native

ARGUMENT_ERRORS = (ValueError, TypeError, NotImplementedError, OverflowError, tefl.OutOfMemoryError)
NUMBERS = (-1, 0, 2**31, 2**63, -(2**63), 1e30, float("nan"), float("inf"), -0.5, 7)

_rng = np.random.default_rng(0)


def _r(*shape):
    return _rng.uniform(-1, 1, shape).astype(np.float32)


def _ones(*shape):
    return np.ones(shape, np.float32)


def _noop():
    return np.zeros(1, np.int32)


class _Fp8:
    """FP8 codes held as NumPy uint8 bytes (NumPy has no FP8 dtype), made a tefl FP8 tensor of
    format `fmt` at call time."""

    def __init__(self, codes, fmt):
        self.codes, self.fmt = codes, fmt


def _codes(*shape):
    # e4m3 / e5m2 codes of finite values: 0x00-0x77 are positive finite in both formats.
    return _rng.integers(0, 0x78, shape).astype(np.uint8)


def _materialize(args):
    return {k: _native.view_as(v.codes, v.fmt) if isinstance(v, _Fp8) else v for k, v in args.items()}


_HYPER = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "step": 1, "mode": "adamw", "bias_correction": True,
          "weight_decay": 0.01}
_GLU_BWD = ("dgeglu", "dqgeglu", "dreglu", "dsreglu")

# (op, a valid call's arguments) for the ops the other tests reach only through torch or not at
# all; FP8 inputs are uint8 codes viewed as FP8 at call time (`_Fp8`).
EXTRA = [
    ("dequantize", lambda: {"q": _Fp8(_codes(4, 8), "f8e4m3"), "scale_inv": _ones(1), "out_dtype": "f32"}),
    ("dequantize", lambda: {"q": _Fp8(_codes(3, 5), "f8e5m2"), "scale_inv": _ones(1), "out_dtype": "bf16"}),
    ("fp8_transpose", lambda: {"q": _Fp8(_codes(4, 8), "f8e4m3")}),
    ("bgrad_quantize", lambda: {"x": _r(4, 8), "scale": _ones(1), "fp8_dtype": "f8e4m3", "want_transpose": True}),
    ("clamped_swiglu", lambda: {"x": _r(4, 8), "limit": 7.0, "alpha": 1.702}),
    ("clamped_dswiglu", lambda: {"grad": _r(4, 4), "input": _r(4, 8), "limit": 7.0, "alpha": 1.702}),
    ("compute_amax", lambda: {"x": _r(4, 8)}),
    ("dropout_bwd", lambda: {"dy": _r(4, 8), "mask": (_r(4, 8) > 0).astype(np.uint8), "p": 0.5}),
    *[(op, lambda: {"grad": _r(4, 8), "input": _r(4, 8)}) for op in ("dbias_dqgelu", "dbias_drelu", "dbias_dsilu", "dbias_dsrelu", "dsrelu")],
    *[(op, lambda: {"grad": _r(4, 4), "input": _r(4, 8)}) for op in _GLU_BWD],
    *[(op, lambda: {"x": _r(4, 8)}) for op in ("qgeglu", "sreglu", "srelu")],
    ("fused_amax_and_scale_update_after_reduction", lambda: {"amax_history": np.abs(_r(4, 2)), "scale": _ones(2),
                                                            "scale_inv": _ones(2), "fp8_max": 448.0, "margin": 0.0,
                                                            "algo": "max"}),
    ("multi_tensor_adam", lambda: {"noop_flag": _noop(), "grads": [_r(8), _r(5)], "params": [_r(8), _r(5)],
                                   "exp_avg": [_r(8), _r(5)], "exp_avg_sq": [np.abs(_r(8)), np.abs(_r(5))],
                                   "hyper": dict(_HYPER)}),
    ("multi_tensor_adam_master", lambda: {"noop_flag": _noop(), "grads": [_r(8)], "model_params": [_r(8)],
                                          "master_params": [_r(8)], "exp_avg": [_r(8)], "exp_avg_sq": [np.abs(_r(8))],
                                          "hyper": dict(_HYPER)}),
    ("multi_tensor_compute_scale_and_scale_inv", lambda: {"noop_flag": _noop(), "amax": [np.abs(_r(1)), np.abs(_r(1))],
                                                          "scale": [_ones(1), _ones(1)], "scale_inv": [_ones(1), _ones(1)],
                                                          "fp8_max": 448.0, "force_pow_2": False, "epsilon": 0.0}),
    ("multi_tensor_unscale_l2norm", lambda: {"noop_flag": _noop(), "tensors": [_r(8), _r(5)], "inv_scale": _ones(1),
                                             "per_tensor": True}),
    ("scaled_aligned_causal_masked_softmax_forward", lambda: {"x": _r(2, 2, 4, 4), "scale": 0.5}),
    ("scaled_aligned_causal_masked_softmax_backward", lambda: {"dy": _r(2, 2, 4, 4), "y": np.abs(_r(2, 2, 4, 4)), "scale": 0.5}),
    ("scaled_masked_softmax_backward", lambda: {"dy": _r(2, 2, 4, 4), "y": np.abs(_r(2, 2, 4, 4)), "scale": 0.5}),
    ("scaled_upper_triang_masked_softmax_backward", lambda: {"dy": _r(2, 4, 4), "y": np.abs(_r(2, 4, 4)), "scale": 0.5}),
    ("te_general_grouped_gemm", lambda: {"a": [_r(3, 8), _r(5, 8)], "b": [_r(8, 4), _r(8, 4)], "a_scale_inv": [],
                                         "b_scale_inv": [], "bias": [_r(4), _r(4)], "transa": False, "transb": False,
                                         "out_dtype": "f32", "split_accumulator": False}),
]


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
        elif isinstance(v, _Fp8):
            # The codes' variants; one of another dtype goes in as that plain array.
            for what, w in _tensor_variants(v.codes):
                yield name, f"codes {what}", {**args, name: _Fp8(w, v.fmt) if w.dtype == np.uint8 else w}
            yield name, "the codes as plain uint8", {**args, name: v.codes.copy()}
        elif isinstance(v, list) and v and all(isinstance(x, np.ndarray) for x in v):
            for what, w in _tensor_variants(v[0]):
                yield name, f"element 0 {what}", {**args, name: [w, *v[1:]]}
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            for w in NUMBERS:
                yield name, f"= {w!r}", {**args, name: w}
        elif isinstance(v, dict):
            for key, x in v.items():
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    for w in NUMBERS:
                        yield name, f"[{key!r}] = {w!r}", {**args, name: {**v, key: w}}


def test_the_extra_calls_are_valid():
    for op, make in EXTRA:
        original_call(op, _materialize(make()))


def test_calls_with_one_wrong_argument_are_refused_by_validation():
    if not RECORDED:
        pytest.skip("no calls recorded: run the whole test directory")
    seen, tried, wrong = set(), 0, []
    for op, args in [*RECORDED, *((op, make()) for op, make in EXTRA)]:
        for name, what, bad in _perturbed(args):
            key = (op, name, what, tuple((k, getattr(v, "shape", None)) for k, v in args.items()))
            if key in seen:
                continue
            seen.add(key)
            tried += 1
            try:
                original_call(op, _materialize(copy_args(bad)))
            except ARGUMENT_ERRORS:
                pass
            except Exception as e:  # an impl failure: validation let the change through
                wrong.append(f"{op}: {name} {what}: {type(e).__name__}: {str(e)[:200]}")
    assert tried > 500, f"only {tried} perturbed calls: too few calls recorded"
    assert not wrong, "\n".join(wrong)
