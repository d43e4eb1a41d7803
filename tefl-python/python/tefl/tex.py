"""TransformerEngine's TEX functions on tefl: change one import,

    import transformer_engine_fl_torch as tex    # or: import tefl.tex as tex

and ``tex.rmsnorm_fwd(...)``, ``tex.generic_gemm(...)`` and the rest take TE's argument lists and
return TE's tuples, running on whatever tefl's policy selects (``TE_FL_PREFER``,
``TE_FL_PER_OP``, ``set_backend``). Tensors are torch tensors or numpy arrays (anything with
``__dlpack__``), taken without a copy; results come back as the inputs' kind.

FP8 goes through ``Float8Quantizer`` (the norms' and ``generic_gemm``'s ``quantizer``) and
``Float8Tensor`` (``generic_gemm``'s A and B). Arguments tefl does not support yet (other kinds
of quantizer, an attention bias, context parallelism, ...) raise ``NotImplementedError`` naming
them; bad values raise ``ValueError``/``TypeError`` naming
the argument (tefl's name, and TE's after it where they differ: ``argument 'gamma' (TE's
'weight')``); an impl failure with no fallback left raises ``RuntimeError`` naming the impls,
and a call that could not get its memory ``tefl.OutOfMemoryError`` (a ``RuntimeError``).
Scalar arguments take any number (Python, numpy, a one-element tensor), not strings. TE's
``sm_margin`` (SMs the norms leave to other kernels) is checked as TE's C++ int and otherwise
ignored: tefl's kernels take the whole device.
"""

import math
import operator
import re

from . import _native
from ._core import call, dtype_name, global_manager, kind_of

__all__ = [
    "get_backend",
    "set_backend",
    "list_backends",
    "rmsnorm_fwd",
    "rmsnorm_bwd",
    "rmsnorm_bwd_add",
    "layernorm_fwd",
    "layernorm_bwd",
    "generic_gemm",
    "te_general_grouped_gemm",
    "fused_attn_fwd",
    "fused_attn_bwd",
    "fused_rope_forward",
    "fused_rope_backward",
    "scaled_softmax_forward",
    "scaled_softmax_backward",
    "scaled_masked_softmax_forward",
    "scaled_masked_softmax_backward",
    "scaled_upper_triang_masked_softmax_forward",
    "scaled_upper_triang_masked_softmax_backward",
    "scaled_aligned_causal_masked_softmax_forward",
    "scaled_aligned_causal_masked_softmax_backward",
    "multi_tensor_scale",
    "multi_tensor_l2norm",
    "multi_tensor_unscale_l2norm",
    "multi_tensor_adam",
    "multi_tensor_sgd",
    "multi_tensor_compute_scale_and_scale_inv",
    "quantize",
    "dequantize",
    "bgrad_quantize",
    "compute_amax",
    "Float8Quantizer",
    "Float8Tensor",
    "fused_amax_and_scale_update_after_reduction",
    "dropout_fwd",
    "dropout_bwd",
]


def _unsupported(fn, **named):
    """NotImplementedError for the first argument given that tefl does not support yet."""
    for name, (value, ok) in named.items():
        if not ok(value):
            raise NotImplementedError(f"{fn}: argument '{name}'={value!r} is not supported by tefl yet")


def _none(v):
    return v is None


def _real(name, v):
    """Argument ``name`` as a float: a Python or numpy number, or a one-element tensor
    (``TypeError`` naming it otherwise; strings are not numbers here)."""
    if not isinstance(v, (str, bytes)):
        try:
            return float(v)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"argument '{name}' must be a real number, got {type(v).__name__} {v!r}")


def _integer(name, v):
    """Argument ``name`` as an int: an integer, or a float with no fractional part (``TypeError``
    naming it otherwise; its range is checked by the op)."""
    if not isinstance(v, (str, bytes)):
        try:
            return operator.index(v)
        except TypeError:
            pass
        try:
            whole = float(v)
        except (TypeError, ValueError):
            whole = None
        if whole is not None and whole.is_integer():
            return int(whole)
    raise TypeError(f"argument '{name}' must be an integer, got {type(v).__name__} {v!r}")


def _flag(name, v):
    """Argument ``name`` as a bool, as TE's bindings convert one (None is False); a string is a
    ``TypeError`` naming it ('False' would otherwise be true)."""
    if isinstance(v, (str, bytes)):
        raise TypeError(f"argument '{name}' must be a bool, got {type(v).__name__} {v!r}")
    return bool(v)


def _zero_centered(sm_margin, zero_centered_gamma):
    """The two options every TE norm takes: ``zero_centered_gamma`` as a bool, returned, and
    ``sm_margin`` (SMs to leave to other kernels), checked as TE's C++ int, in [0, 2^31), and
    not used: tefl's norm kernels size their grids to the whole device."""
    v = _integer("sm_margin", sm_margin)
    if not 0 <= v < 1 << 31:
        raise ValueError(f"argument 'sm_margin' must be in [0, 2^31), got {v}")
    return _flag("zero_centered_gamma", zero_centered_gamma)


def _zero(v):
    return v in (None, 0)


# -- backends ---------------------------------------------------------------------------------


def list_backends():
    """``[{'name', 'vendor', 'priority', 'available'}, ...]``: every backend tefl knows here."""
    return [
        {"name": b["name"], "vendor": b["vendor"], "priority": b["priority"], "available": b["available"]}
        for b in global_manager().list_backends()
    ]


def get_backend():
    """The name of the backend ops go to first."""
    return global_manager().get_backend()


def set_backend(name):
    """Routes every op to backend `name` first (``RuntimeError`` naming the backends there are
    when it is unknown or unavailable)."""
    global_manager().set_backend(name)


# -- FP8 quantizers and tensors ---------------------------------------------------------------


class Float8Quantizer:
    """TE's delayed-scaling FP8 quantizer: an op given one writes FP8 codes of (value · ``scale``)
    and raises ``amax`` in place to the largest |value| it saw (before scaling), as TE's kernels
    do (the recipe resets it). ``scale`` and ``amax`` are f32 ``[1]`` tensors on the device the
    op runs on; ``fp8_dtype`` is e4m3 or e5m2 (a torch float8 dtype, TE's ``DType`` or a string).

    TE's own quantizer objects work too: any object with ``scale``, ``amax`` and ``dtype`` or
    ``fp8_dtype`` is read the same way. Other kinds (current scaling, MXFP8 blocks) are not
    supported yet."""

    def __init__(self, scale, amax, fp8_dtype):
        self.scale = scale
        self.amax = amax
        self.fp8_dtype = fp8_dtype


class Float8Tensor:
    """FP8 data as a quantized output holds it: ``data`` (the codes: a torch float8 tensor, or
    uint8 bytes for numpy, which has no FP8 dtype), ``scale_inv`` (f32 ``[1]``: value = code ·
    scale_inv) and ``fp8_dtype``; ``transpose``, the codes of the transposed 2-D data, where the
    quantizer asked for them (TE's columnwise usage; else None). ``generic_gemm`` and
    ``te_general_grouped_gemm`` take one as A or B."""

    def __init__(self, data, scale_inv, fp8_dtype, transpose=None):
        self.data = data
        self.scale_inv = scale_inv
        self.fp8_dtype = dtype_name(fp8_dtype, "fp8_dtype")
        self.transpose = transpose

    @property
    def shape(self):
        return self.data.shape

    def dequantize(self, dtype="f32"):
        """The values, codes times ``scale_inv``, as ``dtype``."""
        return dequantize(self.data, self.scale_inv, dtype, self.fp8_dtype)

    def __repr__(self):
        return f"Float8Tensor({self.fp8_dtype}, shape={tuple(self.shape)})"


def _fp8_quantizer(fn, quantizer):
    """(scale, amax, fp8 dtype name) of a quantizer, or None for none; NotImplementedError for a
    kind tefl does not take."""
    if quantizer is None:
        return None
    fmt = getattr(quantizer, "fp8_dtype", None)
    if fmt is None:
        fmt = getattr(quantizer, "dtype", None)
    scale, amax = getattr(quantizer, "scale", None), getattr(quantizer, "amax", None)
    if scale is None or amax is None or fmt is None:
        raise NotImplementedError(
            f"{fn}: argument 'quantizer'={quantizer!r} is not supported by tefl yet "
            "(tefl takes delayed-scaling FP8 quantizers: scale, amax and an e4m3/e5m2 dtype)"
        )
    name = dtype_name(fmt, "quantizer.dtype")
    if name not in ("f8e4m3", "f8e5m2"):
        raise ValueError(f"{fn}: quantizer dtype {fmt!r} is not an FP8 format (e4m3 or e5m2)")
    return scale, amax, name


def _raise_amax(amax, seen):
    """amax = max(amax, seen), in place (a torch tensor or a numpy array)."""
    if hasattr(amax, "copy_"):
        import torch

        amax.copy_(torch.maximum(amax, seen.reshape(amax.shape).to(amax.dtype)))
    else:
        import numpy as np

        np.maximum(amax, np.asarray(seen).reshape(amax.shape), out=amax)


def _fp8_parts(t):
    """(codes as stored, scale_inv, format name) of a Float8Tensor (tefl's, or TE's with
    ``_data``, ``_scale_inv`` and ``_fp8_dtype``), or None for anything else."""
    if isinstance(t, Float8Tensor):
        return t.data, t.scale_inv, t.fp8_dtype
    if hasattr(t, "_data") and hasattr(t, "_scale_inv") and hasattr(t, "_fp8_dtype"):
        return t._data, t._scale_inv, dtype_name(t._fp8_dtype, "_fp8_dtype")
    return None


def _fp8_operand(t):
    """(codes as an FP8 tensor, scale_inv) of a Float8Tensor (``_fp8_parts``), or None for
    anything else."""
    parts = _fp8_parts(t)
    if parts is None:
        return None
    data, scale_inv, fmt = parts
    if dtype_name(getattr(data, "dtype", None), "data") == "u8":
        data = _native.view_as(data, fmt)
    return data, scale_inv


# -- normalization ----------------------------------------------------------------------------


def _store(ln_out, y):
    """TE writes into ``ln_out`` when given: copy the result there and return it."""
    if ln_out is None:
        return y
    ln_out[...] = y
    return ln_out


_ARGUMENT = re.compile(r"argument '(\w+)'")


def _call_te(op, args, te_names, **kw):
    """``call`` for a TE function whose arguments tefl names otherwise (``te_names``: tefl's
    name to TE's): a ValueError or TypeError naming such an argument names TE's too, e.g.
    ``argument 'gamma' (TE's 'weight')``."""
    try:
        return call(op, args, **kw)
    except (ValueError, TypeError) as e:
        if e.args and isinstance(e.args[0], str):

            def both(m):
                theirs = te_names.get(m.group(1))
                return f"{m.group(0)} (TE's '{theirs}')" if theirs and theirs != m.group(1) else m.group(0)

            e.args = (_ARGUMENT.sub(both, e.args[0], count=1),) + e.args[1:]
        raise


# TE's names of the norm forwards' arguments where tefl's differ (for error messages).
_NORM_NAMES = {"x": "input", "gamma": "weight", "beta": "bias"}


def rmsnorm_fwd(input, weight, eps, ln_out=None, quantizer=None, otype=None, sm_margin=0, zero_centered_gamma=False):
    """``-> (out, None, rsigma)``: out = input·rsigma·weight (weight + 1 when zero-centred).

    With a ``quantizer`` (``Float8Quantizer``), out is a ``Float8Tensor`` written in the same
    pass, and the quantizer's amax is raised to max |input·rsigma·weight|."""
    zc = _zero_centered(sm_margin, zero_centered_gamma)
    kind = kind_of([input])
    args = {"x": input, "gamma": weight, "eps": _real("eps", eps), "zero_centered_gamma": zc}
    q = _norm_out(args, "rmsnorm_fwd", input, ln_out, quantizer, otype)
    out = _call_te("rmsnorm_fwd", args, kind=kind, te_names=_NORM_NAMES)
    return _norm_result(out, ln_out, quantizer, q), None, out["rsigma"]


def _norm_out(args, fn, input, ln_out, quantizer, otype):
    """The output dtype (and FP8 scale) arguments of a norm forward; returns the quantizer's
    (scale, amax, format), or None."""
    q = _fp8_quantizer(fn, quantizer)
    if q is None:
        otype = dtype_name(otype, "otype") if otype is not None else None
        args["out_dtype"] = otype or _dtype_of(input, "input")
        return None
    if ln_out is not None:
        raise NotImplementedError(f"{fn}: argument 'ln_out' with a quantizer is not supported by tefl yet")
    args["out_dtype"], args["scale"] = q[2], q[0]
    return q


def _norm_result(out, ln_out, quantizer, q):
    """A norm forward's output: a Float8Tensor (the quantizer's amax raised; q from _norm_out)
    or the plain one."""
    if q is None:
        return _store(ln_out, out["y"])
    _raise_amax(quantizer.amax, out["amax"])
    return Float8Tensor(out["y"], out["scale_inv"], q[2])


def rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin=0, zero_centered_gamma=False):
    """``-> (dx, dgamma)``."""
    zc = _zero_centered(sm_margin, zero_centered_gamma)
    out = _call_te(
        "rmsnorm_bwd",
        {"dy": dz, "x": x, "rsigma": rsigma, "gamma": gamma, "zero_centered_gamma": zc},
        te_names={"dy": "dz"},
    )
    return out["dx"], out["dgamma"]


def rmsnorm_bwd_add(dz, x, add, rsigma, gamma, sm_margin=0, zero_centered_gamma=False):
    """``-> (dx, dgamma)``: as ``rmsnorm_bwd``, with ``add`` added to dx (a residual's gradient)."""
    zc = _zero_centered(sm_margin, zero_centered_gamma)
    out = _call_te(
        "rmsnorm_bwd_add",
        {
            "dy": dz,
            "x": x,
            "rsigma": rsigma,
            "gamma": gamma,
            "add": add,
            "zero_centered_gamma": zc,
        },
        te_names={"dy": "dz"},
    )
    return out["dx"], out["dgamma"]


def layernorm_fwd(
    input, weight, bias, eps, ln_out=None, quantizer=None, otype=None, sm_margin=0, zero_centered_gamma=False
):
    """``-> (out, mu, rsigma)``; with a ``quantizer``, out is a ``Float8Tensor`` (as ``rmsnorm_fwd``)."""
    zc = _zero_centered(sm_margin, zero_centered_gamma)
    kind = kind_of([input])
    args = {"x": input, "gamma": weight, "beta": bias, "eps": _real("eps", eps), "zero_centered_gamma": zc}
    q = _norm_out(args, "layernorm_fwd", input, ln_out, quantizer, otype)
    out = _call_te("layernorm_fwd", args, kind=kind, te_names=_NORM_NAMES)
    return _norm_result(out, ln_out, quantizer, q), out["mu"], out["rsigma"]


def layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin=0, zero_centered_gamma=False):
    """``-> (dx, dgamma, dbeta)``."""
    zc = _zero_centered(sm_margin, zero_centered_gamma)
    out = _call_te(
        "layernorm_bwd",
        {"dy": dz, "x": x, "mu": mu, "rsigma": rsigma, "gamma": gamma, "zero_centered_gamma": zc},
        te_names={"dy": "dz"},
    )
    return out["dx"], out["dgamma"], out["dbeta"]


def _dtype_of(t, arg):
    """The dtype of tensor argument ``arg``; a value that is no tensor is a TypeError naming it."""
    dtype = getattr(t, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"argument '{arg}': expected a tensor (torch, numpy or any object with __dlpack__), "
            f"got {type(t).__name__}"
        )
    return dtype_name(dtype, arg)


# -- GEMM -------------------------------------------------------------------------------------


def _shape(t):
    return tuple(int(d) for d in t.shape)


def generic_gemm(
    A,
    transA,
    B,
    transB,
    D,
    quantizer,
    output_dtype,
    bias,
    bias_type,
    gelu,
    gelu_in,
    grad,
    workspace,
    workspaceSize,
    accumulate,
    use_split_accumulator,
):
    """TE's GEMM, in its column-major convention: with row-major (torch/numpy) tensors,
    D = op(B)·op(A), op(X) = Xᵀ when its trans flag is set — TE's layout "TN" (transA=True,
    transB=False) is ``D = B·Aᵀ``, a linear layer's forward with A the weight.

    A call whose shapes only fit the row-major reading D = op(A)·op(B) (TE itself would reject
    it) is computed that way: the TEX README's own example is written so.

    Epilogues: ``bias`` (D += bias), ``gelu`` (D = gelu(D), pre-activation into ``gelu_in``);
    with ``grad`` they are the backward's: ``gelu`` means D ⊙= gelu'(gelu_in), ``bias`` asks for
    the bias gradient (column sums of D). ``accumulate`` adds to D. Returns
    ``(D, bias_grad, gelu_in, None)``.

    FP8: A and B may be ``Float8Tensor``s (both, e4m3 or e5m2; their ``scale_inv`` scale the
    product), ``use_split_accumulator`` picks TE's split accumulation, and a ``quantizer``
    (``Float8Quantizer``) makes D a ``Float8Tensor`` of (product · scale), its amax raised.
    """
    transA, transB = _flag("transA", transA), _flag("transB", transB)
    kind = kind_of([x.data if isinstance(x, Float8Tensor) else x for x in (A, B, D)])
    fa, fb = _fp8_operand(A), _fp8_operand(B)
    if (fa is None) != (fb is None):
        raise TypeError("generic_gemm: A and B must both be FP8 (Float8Tensor) or both not")
    a_scale_inv = b_scale_inv = None
    if fa is not None:
        (A, a_scale_inv), (B, b_scale_inv) = fa, fb
    q = _fp8_quantizer("generic_gemm", quantizer)
    a_shape, b_shape = _shape(A), _shape(B)
    if len(a_shape) != 2 or len(b_shape) != 2:
        A2, B2 = _flatten2(A), _flatten2(B)
    else:
        A2, B2 = A, B
    a_shape, b_shape = _shape(A2), _shape(B2)

    def fits(first, ft, second, st):
        (r1, c1), (r2, c2) = first, second
        k1 = r1 if ft else c1
        k2 = c2 if st else r2
        return k1 == k2

    # TE's reading: D = op(B)·op(A) (row-major).
    if fits(b_shape, transB, a_shape, transA):
        left, tl, right, tr = B2, transB, A2, transA
        left_si, right_si = b_scale_inv, a_scale_inv
    elif fits(a_shape, transA, b_shape, transB):
        left, tl, right, tr = A2, transA, B2, transB
        left_si, right_si = a_scale_inv, b_scale_inv
    else:
        raise ValueError(
            f"generic_gemm: A {a_shape} (transA={transA}) and B {b_shape} (transB={transB}) do not "
            "multiply in TE's convention D = op(B)·op(A)"
        )
    if grad:
        if gelu and bias is not None:
            epilogue = "dgelu_bias_grad"
        elif gelu:
            epilogue = "dgelu"
        elif bias is not None:
            epilogue = "bias_grad"
        else:
            epilogue = "none"
    else:
        if gelu and bias is not None:
            epilogue = "bias_gelu"
        elif gelu:
            epilogue = "gelu"
        elif bias is not None:
            epilogue = "bias"
        else:
            epilogue = "none"
    if q is not None:
        if accumulate or D is not None:
            raise NotImplementedError("generic_gemm: argument 'D' with a quantizer is not supported by tefl yet")
        out_dtype = q[2]
    else:
        if output_dtype is not None:
            out_dtype = dtype_name(output_dtype, "output_dtype")
        elif D is not None:
            out_dtype = _dtype_of(D, "D")
        else:
            raise ValueError(
                "generic_gemm: argument 'output_dtype' is None and no D is given: one of them sets the output dtype"
            )
    args = {
        "a": left,
        "b": right,
        "a_scale_inv": left_si,
        "b_scale_inv": right_si,
        "d_scale": q[0] if q is not None else None,
        "bias": bias if epilogue in ("bias", "bias_gelu") else None,
        "aux": gelu_in if epilogue in ("dgelu", "dgelu_bias_grad") else None,
        "c": D if accumulate else None,
        "transa": tl,
        "transb": tr,
        "alpha": 1.0,
        "accumulate": _flag("accumulate", accumulate),
        "epilogue": epilogue,
        "out_dtype": out_dtype,
        "split_accumulator": _flag("use_split_accumulator", use_split_accumulator),
    }
    # (which of TE's A and B is tefl's a follows from the orientation picked above)
    te_a, te_b = ("B", "A") if left is B2 else ("A", "B")
    gemm_names = {"a": te_a, "b": te_b, "a_scale_inv": te_a + "_scale_inv", "b_scale_inv": te_b + "_scale_inv"}
    gemm_names.update({"c": "D", "aux": "gelu_in"})
    out = _call_te("generic_gemm", args, kind=kind, te_names=gemm_names)
    d = out["d"]
    if q is not None:
        _raise_amax(quantizer.amax, out["d_amax"])
        d = Float8Tensor(d, 1.0 / q[0], q[2])  # scale_inv, a new tensor of the scale's kind
    if D is not None:
        D[...] = d.reshape(_shape(D)) if _shape(d) != _shape(D) else d
        d = D
    if out.get("aux_out") is not None and gelu_in is not None and not grad:
        gelu_in[...] = out["aux_out"].reshape(_shape(gelu_in))
    return d, out.get("bias_grad"), gelu_in if gelu else None, None


def _list_arg(name, v):
    """Argument ``name`` as a list (TE takes Python lists or tuples of tensors there)."""
    if isinstance(v, (list, tuple)):
        return list(v)
    raise TypeError(f"argument '{name}' must be a list of tensors, got {type(v).__name__}")


def _numel(t):
    return math.prod(_shape(t))


def te_general_grouped_gemm(
    A,
    transa,
    B,
    transb,
    D,
    D_type,
    m_splits,
    bias,
    bias_type,
    single_output,
    pre_gelu_out,
    grad,
    workspace,
    workspaceSize,
    accumulate,
    use_split_accumulator,
    math_sm_count=0,
):
    """TE's grouped GEMM (a mixture-of-experts layer's expert GEMMs) in one call, in TE's
    column-major convention: with row-major tensors, D[g] = op(B[g])·op(A[g]) for every group g
    (op(X) = Xᵀ when its trans flag is set; TE's "TN", transa=True, is a linear layer's forward
    D[g] = B[g]·A[g]ᵀ with A[g] the expert's weight), plus ``bias[g]`` where given.

    ``D`` is the list of outputs, written in place (one ``[m_g, n]`` tensor a group, or with
    ``single_output`` one ``[Σ m_g, n]`` tensor holding the groups' rows in order) in ``D_type``;
    ``m_splits`` must name each group's m (rows of op(B[g])). A and B may be lists of
    ``Float8Tensor`` (FP8; ``use_split_accumulator`` picks TE's split accumulation). Returns
    ``bias``, as TE does. A bias gradient (``grad`` with a bias), a GELU epilogue
    (``pre_gelu_out`` with data) and ``accumulate`` raise ``NotImplementedError``;
    ``workspace``, ``workspaceSize`` and ``math_sm_count`` are checked and not used."""
    fn = "te_general_grouped_gemm"
    A, B = _list_arg("A", A), _list_arg("B", B)
    returned = bias
    bias = [] if bias is None else _list_arg("bias", bias)
    gelu_out = [] if pre_gelu_out is None else _list_arg("pre_gelu_out", pre_gelu_out)
    grad, accumulate = _flag("grad", grad), _flag("accumulate", accumulate)
    _integer("math_sm_count", math_sm_count)
    _integer("workspaceSize", workspaceSize)
    with_bias = any(_numel(b) > 0 for b in bias)
    _unsupported(
        fn,
        accumulate=(accumulate, lambda v: not v),
        pre_gelu_out=(gelu_out, lambda v: all(_numel(t) == 0 for t in v)),
    )
    if grad and with_bias:
        raise NotImplementedError(
            f"{fn}: argument 'bias' with grad=True (the bias gradient) is not supported by tefl yet"
        )
    if len(A) != len(B):
        raise ValueError(f"{fn}: argument 'B' has {len(B)} tensors, argument 'A' {len(A)}: one of each per group")
    if with_bias and len(bias) != len(A):
        raise ValueError(f"{fn}: argument 'bias' has {len(bias)} tensors for {len(A)} groups")
    kind = kind_of([x.data if isinstance(x, Float8Tensor) else x for x in A + B + list(D or [])])
    fp8 = [_fp8_operand(t) for t in A + B]
    if any(f is None for f in fp8) and any(f is not None for f in fp8):
        raise TypeError(f"{fn}: A and B must all be FP8 (Float8Tensor) or all not")
    a_si = b_si = []
    if fp8 and fp8[0] is not None:
        A, a_si = [f[0] for f in fp8[: len(A)]], [f[1] for f in fp8[: len(A)]]
        B, b_si = [f[0] for f in fp8[len(A) :]], [f[1] for f in fp8[len(A) :]]
    # TE's D[g] = op(B[g])·op(A[g]): tefl's a is B[g] (transposed per transb), its b A[g].
    transa, transb = _flag("transa", transa), _flag("transb", transb)
    ms = [_integer("m_splits", x) for x in _list_arg("m_splits", m_splits)]
    got_m = [_shape(b)[1 if transb else 0] if len(_shape(b)) == 2 else None for b in B]
    if ms != got_m:
        raise ValueError(f"{fn}: argument 'm_splits' is {ms}, the groups' m (rows of op(B[g])) are {got_m}")
    if D is None:
        raise TypeError(f"{fn}: argument 'D' must be the list of output tensors (TE writes the products there)")
    D = _list_arg("D", D)
    if _flag("single_output", single_output):
        if len(D) != 1:
            raise ValueError(f"{fn}: argument 'D' holds {len(D)} tensors; single_output takes one [sum(m_splits), n]")
    elif len(D) != len(A):
        raise ValueError(f"{fn}: argument 'D' holds {len(D)} tensors for {len(A)} groups")
    args = {
        "a": B,
        "b": A,
        "a_scale_inv": b_si,
        "b_scale_inv": a_si,
        "bias": bias if with_bias else [],
        "transa": transb,
        "transb": transa,
        "out_dtype": dtype_name(D_type, "D_type"),
        "split_accumulator": _flag("use_split_accumulator", use_split_accumulator),
    }
    names = {"a": "B", "b": "A", "a_scale_inv": "B_scale_inv", "b_scale_inv": "A_scale_inv"}
    out = _call_te(fn, args, kind=kind, te_names=names)["d"]
    if len(D) == 1 and len(out) != 1:
        total, row = D[0], 0
        want = (sum(ms),) + _shape(out[0])[1:]
        if _shape(total) != want:
            raise ValueError(f"{fn}: argument 'D' has shape {_shape(total)}, the groups' rows make {want}")
        for d in out:
            m = _shape(d)[0]
            total[row : row + m] = d
            row += m
    else:
        for g, (dst, d) in enumerate(zip(D, out)):
            if _shape(dst) != _shape(d):
                raise ValueError(f"{fn}: argument 'D' [{g}] has shape {_shape(dst)}, the product {_shape(d)}")
            dst[...] = d
    return returned


def _flatten2(t):
    shape = _shape(t)
    if len(shape) < 2:
        raise ValueError(f"generic_gemm: a GEMM operand must have 2 or more dims, got {shape}")
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return t.reshape(rows, shape[-1])


# -- attention --------------------------------------------------------------------------------

_MASKS = {
    "no_mask": "none",
    "causal": "causal",
    "causal_bottom_right": "causal_bottom_right",
    "padding": "padding",
    "padding_causal": "padding_causal",
}


def _layout(qkv_layout):
    text = str(qkv_layout).split(".")[-1].lower()
    if text.startswith("nvte_"):
        text = text[5:]
    fmt = text.split("_")[0]
    if fmt not in ("bshd", "sbhd", "thd") or any(p != fmt for p in text.split("_")):
        raise NotImplementedError(
            f"fused_attn: qkv_layout {qkv_layout!r}: tefl takes separate q, k, v in one of bshd_bshd_bshd, "
            "sbhd_sbhd_sbhd, thd_thd_thd"
        )
    return fmt


def _mask(attn_mask_type):
    text = str(attn_mask_type).split(".")[-1].lower()
    if text.startswith("nvte_"):
        text = text[5:]
    if text.endswith("_mask") and text != "no_mask":
        text = text[: -len("_mask")]
    try:
        return _MASKS[text]
    except KeyError:
        raise NotImplementedError(f"fused_attn: attn_mask_type {attn_mask_type!r} is not supported by tefl") from None


def _no_bias(bias_type):
    return bias_type is None or str(bias_type).lower().endswith("no_bias")


# TE's names of the attention arguments where tefl's differ (for error messages).
_ATTN_NAMES = {
    "q": "Q",
    "k": "K",
    "v": "V",
    "scale": "attn_scale",
    "dropout_p": "p_dropout",
    "window": "window_size",
    "mask": "attn_mask_type",
    "layout": "qkv_layout",
    "o": "O",
    "d_o": "dO",
    "softmax_lse": "Aux_CTX_Tensors[0]",
}


def _attn_args(Q, K, V, cu_q, cu_kv, qkv_layout, attn_mask_type, attn_scale, p, seed, offset, window_size, max_seqlen):
    """The arguments tefl's attention forward and backward share, from TE's. ``max_seqlen``: TE's
    (max_seqlen_q, max_seqlen_kv), bounds on the thd sequence lengths; with them a thd call whose
    cu_seqlens are on the GPU does not wait for the GPU to read them (bshd and sbhd take their
    lengths from the shapes, as before: the bounds are not passed on)."""
    scale = _real("attn_scale", attn_scale) if attn_scale is not None else float(_shape(Q)[-1]) ** -0.5
    layout = _layout(qkv_layout)
    if layout != "thd":
        max_seqlen = (None, None)
    return {
        "q": Q,
        "k": K,
        "v": V,
        "cu_seqlens_q": cu_q,
        "cu_seqlens_kv": cu_kv,
        "layout": layout,
        "mask": _mask(attn_mask_type),
        "scale": scale,
        "dropout_p": p,
        "seed": _integer("seed", seed),
        "offset": _integer("offset", offset),
        "window": _window(window_size),
        "max_seqlen_q": None if max_seqlen[0] is None else _integer("max_seqlen_q", max_seqlen[0]),
        "max_seqlen_kv": None if max_seqlen[1] is None else _integer("max_seqlen_kv", max_seqlen[1]),
    }


def _window(window_size):
    if window_size is None:
        return [-1, -1]
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"argument 'window_size' must be a pair (left, right), got {window_size!r}") from None
    return [_integer("window_size", left), _integer("window_size", right)]


def fused_attn_fwd(
    max_seqlen_q,
    max_seqlen_kv,
    is_training,
    attn_scale,
    p_dropout,
    set_zero,
    qkv_layout,
    bias_type,
    attn_mask_type,
    window_size,
    cu_seqlens_q,
    cu_seqlens_kv,
    Q,
    K,
    V,
    fake_dtype=None,
    cu_seqlens_q_padded=None,
    cu_seqlens_kv_padded=None,
    page_table_k=None,
    page_table_v=None,
    s_quantizer=None,
    o_quantizer=None,
    Bias=None,
    rng_gen=None,
    rng_elts_per_thread=0,
    seed=0,
    offset=0,
):
    """``-> [O, softmax_lse, rng_state]``: flash attention (online softmax, no sq×sk buffer).
    rng_state holds the dropout seed and offset for the backward (an int64 pair, on the host:
    neither direction waits for the GPU to read or write it)."""
    _unsupported(
        "fused_attn_fwd",
        bias_type=(bias_type, _no_bias),
        cu_seqlens_q_padded=(cu_seqlens_q_padded, _none),
        cu_seqlens_kv_padded=(cu_seqlens_kv_padded, _none),
        page_table_k=(page_table_k, _none),
        page_table_v=(page_table_v, _none),
        s_quantizer=(s_quantizer, _none),
        o_quantizer=(o_quantizer, _none),
        Bias=(Bias, _none),
    )
    if rng_gen is not None and hasattr(rng_gen, "initial_seed"):
        seed = int(rng_gen.initial_seed())
    p = _real("p_dropout", p_dropout) if is_training else 0.0
    args = _attn_args(
        Q, K, V, cu_seqlens_q, cu_seqlens_kv, qkv_layout, attn_mask_type, attn_scale, p, seed, offset, window_size,
        (max_seqlen_q, max_seqlen_kv),
    )
    out = _call_te("fused_attn_fwd", args, te_names=_ATTN_NAMES)
    return [out["o"], out["softmax_lse"], _rng_state(Q, seed, offset)]


_U64 = (1 << 64) - 1


def _rng_state(like, seed, offset):
    """TE's rng_state: the seed and offset as an int64 pair (u64 values by their bits). For
    torch it is a host tensor even when the attention ran on the GPU: building a device one
    from Python values copies from pageable memory and waits for the stream, and the backward
    reading it back would wait again (the tensor only carries the pair to the backward)."""
    seed, offset = [v - (1 << 64) if v >= 1 << 63 else v for v in (_integer("seed", seed), _integer("offset", offset))]
    if type(like).__module__.startswith("torch"):
        import torch

        return torch.tensor([seed, offset], dtype=torch.int64)
    import numpy as np

    return np.array([seed, offset], dtype=np.int64)


def fused_attn_bwd(
    max_seqlen_q,
    max_seqlen_kv,
    attn_scale,
    p_dropout,
    set_zero,
    qkv_layout,
    bias_type,
    attn_mask_type,
    window_size,
    deterministic,
    cu_seqlens_q,
    cu_seqlens_kv,
    Q,
    K,
    V,
    O,
    dO,
    fake_dtype=None,
    dqkv_dtype=None,
    Aux_CTX_Tensors=None,
    cu_seqlens_q_padded=None,
    cu_seqlens_kv_padded=None,
    s_quantizer=None,
    dp_quantizer=None,
    dqkv_quantizer=None,
):
    """``-> [dQ, dK, dV, None]`` (no attention bias, so no dBias). ``Aux_CTX_Tensors`` is the
    forward's ``[softmax_lse, rng_state]``. ``deterministic``: dQ comes out the same bits on every
    repetition; the CUDA backend's tensor-core kernels add the key blocks' dQ shares in the order
    they finish (the last bits vary from run to run), so there such a call computes dQ in a
    pass of its own per query tile (about 2x the backward's time on an H200 at b4 h32 s4096
    d128). dK and dV are deterministic either way."""
    _unsupported(
        "fused_attn_bwd",
        bias_type=(bias_type, _no_bias),
        cu_seqlens_q_padded=(cu_seqlens_q_padded, _none),
        cu_seqlens_kv_padded=(cu_seqlens_kv_padded, _none),
        s_quantizer=(s_quantizer, _none),
        dp_quantizer=(dp_quantizer, _none),
        dqkv_quantizer=(dqkv_quantizer, _none),
    )
    if not Aux_CTX_Tensors:
        raise ValueError("fused_attn_bwd: argument 'Aux_CTX_Tensors' must hold the forward's softmax_lse")
    lse = Aux_CTX_Tensors[0]
    seed, offset = 0, 0
    if len(Aux_CTX_Tensors) > 1 and Aux_CTX_Tensors[1] is not None:
        rng = Aux_CTX_Tensors[1]
        seed, offset = (int(v) & _U64 for v in (rng.tolist() if hasattr(rng, "tolist") else rng))
    args = _attn_args(
        Q,
        K,
        V,
        cu_seqlens_q,
        cu_seqlens_kv,
        qkv_layout,
        attn_mask_type,
        attn_scale,
        _real("p_dropout", p_dropout),
        seed,
        offset,
        window_size,
        (max_seqlen_q, max_seqlen_kv),
    )
    args.update({"o": O, "d_o": dO, "softmax_lse": lse, "deterministic": _flag("deterministic", deterministic)})
    out = _call_te("fused_attn_bwd", args, te_names=_ATTN_NAMES)
    return [out["dq"], out["dk"], out["dv"], None]


# -- RoPE -------------------------------------------------------------------------------------


def _qkv_format(qkv_format):
    text = str(qkv_format).split(".")[-1].lower()
    if text.startswith("nvte_"):
        text = text[5:]
    if text not in ("bshd", "sbhd", "thd"):
        raise ValueError(f"fused_rope: argument 'qkv_format' {qkv_format!r} is not one of bshd, sbhd, thd")
    return text


def _rope(op, input, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank):
    _unsupported(op, cp_size=(cp_size, lambda v: v in (None, 1)), cp_rank=(cp_rank, _zero))
    shape = tuple(int(d) for d in freqs.shape)
    if len(shape) == 4:
        # TE's freqs are [s, 1, 1, d]; tefl's [s, d].
        freqs = freqs.reshape(shape[0], shape[-1])
    args = {
        "x": input,
        "freqs": freqs,
        "cu_seqlens": cu_seqlens,
        "start_positions": start_positions,
        "layout": _qkv_format(qkv_format),
        "interleaved": _flag("interleaved", interleaved),
    }
    return _call_te(op, args, te_names={"x": "input" if op == "fused_rope_forward" else "output_grads"})["y"]


def fused_rope_forward(
    input, freqs, start_positions=None, qkv_format="sbhd", interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    """Rotary position embedding of ``input`` by ``freqs`` (``[s, 1, 1, d2]`` angles)."""
    return _rope("fused_rope_forward", input, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank)


def fused_rope_backward(
    output_grads, freqs, start_positions=None, qkv_format="sbhd", interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    """The gradient of ``fused_rope_forward``."""
    return _rope(
        "fused_rope_backward", output_grads, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank
    )


# -- softmax ----------------------------------------------------------------------------------


def _softmax_fwd(name, masked):
    if masked:

        def forward(input, mask, scale_factor):
            args = {"x": input, "mask": mask, "scale": _real("scale_factor", scale_factor)}
            return _call_te(name, args, te_names={"x": "input"})["y"]

        forward.__doc__ = f"TE's ``{name}(input, mask, scale_factor)``: softmax(scale·input), masked where mask is set."
    else:

        def forward(input, scale_factor):
            return _call_te(name, {"x": input, "scale": _real("scale_factor", scale_factor)}, te_names={"x": "input"})["y"]

        forward.__doc__ = f"TE's ``{name}(input, scale_factor)``."
    forward.__name__ = name
    return forward


def _softmax_bwd(name):
    def backward(output_grads, softmax_results, scale_factor):
        args = {"dy": output_grads, "y": softmax_results, "scale": _real("scale_factor", scale_factor)}
        return _call_te(name, args, te_names={"dy": "output_grads", "y": "softmax_results"})["dx"]

    backward.__name__ = name
    backward.__doc__ = f"TE's ``{name}(output_grads, softmax_results, scale_factor)``."
    return backward


for _n in ["scaled_softmax", "scaled_masked_softmax", "scaled_upper_triang_masked_softmax", "scaled_aligned_causal_masked_softmax"]:
    globals()[_n + "_forward"] = _softmax_fwd(_n + "_forward", _n == "scaled_masked_softmax")
    globals()[_n + "_backward"] = _softmax_bwd(_n + "_backward")


# -- activations ------------------------------------------------------------------------------


def _act(name):
    def forward(input, quantizer=None):
        if quantizer is not None:
            _unsupported(name, quantizer=(quantizer, _none))
        return _call_te(name, {"x": input}, te_names={"x": "input"})["y"]

    forward.__name__ = name
    forward.__doc__ = f"TE's ``{name}(input, quantizer)``."
    return forward


def _dact(name):
    def backward(grad, input, quantizer=None):
        _unsupported(name, quantizer=(quantizer, _none))
        return call(name, {"grad": grad, "input": input})["grad_input"]

    backward.__name__ = name
    backward.__doc__ = f"TE's ``{name}(grad, fwd_input, quantizer)``."
    return backward


def _dbias(name):
    def backward(grad, input, quantizer=None):
        _unsupported(name, quantizer=(quantizer, _none))
        out = call(name, {"grad": grad, "input": input})
        return out["dbias"], out["grad_input"]

    backward.__name__ = name
    backward.__doc__ = f"TE's ``{name}(grad, fwd_input, quantizer) -> (grad_bias, grad_input)``."
    return backward


_ACTS = ["gelu", "geglu", "qgelu", "qgeglu", "relu", "reglu", "srelu", "sreglu", "silu", "swiglu"]
for _n in _ACTS:
    globals()[_n] = _act(_n)
    globals()["d" + _n] = _dact("d" + _n)
    __all__ += [_n, "d" + _n]
for _n in ["dbias_dgelu", "dbias_dsilu", "dbias_drelu", "dbias_dqgelu", "dbias_dsrelu"]:
    globals()[_n] = _dbias(_n)
    __all__.append(_n)


def clamped_swiglu(input, quantizer=None, limit=7.0, alpha=1.702):
    _unsupported("clamped_swiglu", quantizer=(quantizer, _none))
    args = {"x": input, "limit": _real("limit", limit), "alpha": _real("alpha", alpha)}
    return _call_te("clamped_swiglu", args, te_names={"x": "input"})["y"]


def clamped_dswiglu(grad, input, quantizer=None, limit=7.0, alpha=1.702):
    _unsupported("clamped_dswiglu", quantizer=(quantizer, _none))
    args = {"grad": grad, "input": input, "limit": _real("limit", limit), "alpha": _real("alpha", alpha)}
    return call("clamped_dswiglu", args)["grad_input"]


__all__ += ["clamped_swiglu", "clamped_dswiglu"]


# -- multi-tensor optimizers (in place) ---------------------------------------------------------


def _lists(fn, chunk_size, tensor_lists, n):
    """The ``n`` tensor lists of a multi-tensor op, after checking ``chunk_size`` as TE's C++
    int, in [1, 2^31) (tefl sizes its own launches, so it is not used otherwise)."""
    chunk = _integer("chunk_size", chunk_size)
    if not 0 < chunk < 1 << 31:
        raise ValueError(f"{fn}: argument 'chunk_size' must be in [1, 2^31), got {chunk}")
    if len(tensor_lists) not in n:
        raise ValueError(f"{fn}: argument 'tensor_lists' must hold {' or '.join(map(str, n))} lists, got {len(tensor_lists)}")
    return [list(x) for x in tensor_lists]


def _list_names(*names):
    """TE's names of a multi-tensor op's lists (``tensor_lists[i]``), by tefl's names, in order."""
    return {n: f"tensor_lists[{i}]" for i, n in enumerate(names) if n is not None}


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    """dst = src·scale over ``tensor_lists = [src, dst]``; noop_flag set on inf/NaN."""
    src, dst = _lists("multi_tensor_scale", chunk_size, tensor_lists, (2,))
    args = {"noop_flag": noop_flag, "src": src, "dst": dst, "scale": _real("scale", scale)}
    _call_te("multi_tensor_scale", args, te_names=_list_names("src", "dst"))


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False):
    """``-> (total_norm, per_tensor_norms)``."""
    (tensors,) = _lists("multi_tensor_l2norm", chunk_size, tensor_lists, (1,))
    args = {"noop_flag": noop_flag, "tensors": tensors, "per_tensor": _flag("per_tensor", per_tensor)}
    out = _call_te("multi_tensor_l2norm", args, te_names=_list_names("tensors"))
    return out["total"], out["per_tensor_norms"]


def multi_tensor_unscale_l2norm(chunk_size, noop_flag, tensor_lists, inv_scale, per_tensor=False):
    """``-> (total_norm, per_tensor_norms)`` of the tensors times ``inv_scale``."""
    (tensors,) = _lists("multi_tensor_unscale_l2norm", chunk_size, tensor_lists, (1,))
    out = _call_te(
        "multi_tensor_unscale_l2norm",
        {"noop_flag": noop_flag, "tensors": tensors, "inv_scale": inv_scale, "per_tensor": _flag("per_tensor", per_tensor)},
        te_names=_list_names("tensors"),
    )
    return out["total"], out["per_tensor_norms"]


def _adam_mode(mode):
    """TE's Adam mode: 0 = L2 regularisation, 1 = AdamW (decoupled weight decay)."""
    v = _integer("mode", mode)
    if v not in (0, 1):
        raise ValueError(f"argument 'mode' must be 0 (L2) or 1 (AdamW), got {v}")
    return "adamw" if v == 1 else "l2"


def multi_tensor_adam(
    chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay
):
    """Adam/AdamW in place over ``[grads, params, exp_avg, exp_avg_sq]`` (or with f32 master
    params as a fifth list); ``mode`` 0 = L2, 1 = AdamW."""
    lists = _lists("multi_tensor_adam", chunk_size, tensor_lists, (4, 5))
    hyper = {
        "lr": _real("lr", lr),
        "beta1": _real("beta1", beta1),
        "beta2": _real("beta2", beta2),
        "eps": _real("epsilon", epsilon),
        "step": _integer("step", step),
        "mode": _adam_mode(mode),
        "bias_correction": _flag("bias_correction", bias_correction),
        "weight_decay": _real("weight_decay", weight_decay),
    }
    if len(lists) == 4:
        g, p, m, v = lists
        _call_te(
            "multi_tensor_adam",
            {"noop_flag": noop_flag, "grads": g, "params": p, "exp_avg": m, "exp_avg_sq": v, "hyper": hyper},
            te_names={**_list_names("grads", "params", "exp_avg", "exp_avg_sq"), "eps": "epsilon"},
        )
    else:
        g, p, m, v, master = lists
        _call_te(
            "multi_tensor_adam_master",
            {
                "noop_flag": noop_flag,
                "grads": g,
                "model_params": p,
                "master_params": master,
                "exp_avg": m,
                "exp_avg_sq": v,
                "hyper": hyper,
            },
            te_names={
                **_list_names("grads", "model_params", "exp_avg", "exp_avg_sq", "master_params"),
                "eps": "epsilon",
            },
        )


def multi_tensor_sgd(
    chunk_size, noop_flag, tensor_lists, wd, momentum, dampening, lr, nesterov, first_run, wd_after_momentum, scale
):
    """SGD with momentum in place over ``[grads, params, momentum_bufs]``."""
    g, p, mom = _lists("multi_tensor_sgd", chunk_size, tensor_lists, (3,))
    _call_te(
        "multi_tensor_sgd",
        {
            "noop_flag": noop_flag,
            "grads": g,
            "params": p,
            "momentum_buf": mom,
            "weight_decay": _real("wd", wd),
            "momentum": _real("momentum", momentum),
            "dampening": _real("dampening", dampening),
            "lr": _real("lr", lr),
            "nesterov": _flag("nesterov", nesterov),
            "first_run": _flag("first_run", first_run),
            "wd_after_momentum": _flag("wd_after_momentum", wd_after_momentum),
            "scale": _real("scale", scale),
        },
        te_names={**_list_names("grads", "params", "momentum_buf"), "weight_decay": "wd"},
    )


def multi_tensor_compute_scale_and_scale_inv(chunk_size, noop_flag, tensor_lists, max_fp8, force_pow_2_scales, epsilon):
    """FP8 scales from amaxes in place over ``[amaxes, scales, scale_invs]``."""
    amax, scale, scale_inv = _lists("multi_tensor_compute_scale_and_scale_inv", chunk_size, tensor_lists, (3,))
    _call_te(
        "multi_tensor_compute_scale_and_scale_inv",
        {
            "noop_flag": noop_flag,
            "amax": amax,
            "scale": scale,
            "scale_inv": scale_inv,
            "fp8_max": _real("max_fp8", max_fp8),
            "force_pow_2": _flag("force_pow_2_scales", force_pow_2_scales),
            "epsilon": _real("epsilon", epsilon),
        },
        te_names={**_list_names("amax", "scale", "scale_inv"), "fp8_max": "max_fp8", "force_pow_2": "force_pow_2_scales"},
    )


# -- FP8 bookkeeping and dropout ----------------------------------------------------------------


def _is_quantizer(v):
    """Whether ``v`` is a quantizer object (scale and amax attributes), not a tensor."""
    return not hasattr(v, "__dlpack__") and hasattr(v, "scale") and hasattr(v, "amax")


def _columnwise(quantizer):
    """Whether a quantizer asks for the transposed codes too (TE's columnwise usage)."""
    return bool(getattr(quantizer, "columnwise_usage", False))


def quantize(tensor, scale, fp8_dtype=None, want_transpose=False):
    """Two forms. TE's, ``quantize(tensor, quantizer, output=None, noop=None)`` with a
    ``Float8Quantizer``: ``-> Float8Tensor`` of (tensor · scale), the quantizer's amax raised to
    max |tensor| (``output`` and ``noop`` are not supported yet). tefl's, ``quantize(tensor,
    scale, fp8_dtype, want_transpose=False)``: ``-> (q, q_t, amax, scale_inv)``, q as uint8
    bytes for numpy (float8 for torch)."""
    if _is_quantizer(scale):
        # TE's positional order: (tensor, quantizer, output, noop).
        output, noop = fp8_dtype, want_transpose
        _unsupported("quantize", output=(output, _none), noop=(noop, lambda v: v is None or v is False))
        sc, amax, fmt = _fp8_quantizer("quantize", scale)
        args = {"x": tensor, "scale": sc, "fp8_dtype": fmt, "want_transpose": _columnwise(scale)}
        out = _call_te("quantize", args, te_names={"x": "tensor", "scale": "quantizer.scale"})
        _raise_amax(amax, out["amax"])
        return Float8Tensor(out["q"], out["scale_inv"], fmt, out["q_t"])
    if fp8_dtype is None:
        raise TypeError("quantize: argument 'fp8_dtype' is missing (or pass a quantizer as the second argument)")
    out = call(
        "quantize",
        {"x": tensor, "scale": scale, "fp8_dtype": dtype_name(fp8_dtype, "fp8_dtype"), "want_transpose": _flag("want_transpose", want_transpose)},
    )
    return out["q"], out["q_t"], out["amax"], out["scale_inv"]


def dequantize(input, scale_inv=None, otype=None, fp8_dtype="f8e4m3"):
    """FP8 ``input`` times ``scale_inv``: a torch float8 tensor, or uint8 bytes of
    ``fp8_dtype`` (how FP8 data reaches numpy). TE's form, ``dequantize(input, otype)`` with a
    ``Float8Tensor`` (tefl's or TE's), takes its codes, scale_inv and format."""
    parts = _fp8_parts(input)
    if parts is not None:
        if otype is None:
            otype, scale_inv = scale_inv, None
        if scale_inv is not None or otype is None:
            raise TypeError("dequantize: a Float8Tensor takes (input, otype), TE's form")
        input, scale_inv, fp8_dtype = parts
    elif scale_inv is None or otype is None:
        raise TypeError("dequantize: arguments 'scale_inv' and 'otype' are needed for plain FP8 codes")
    kind = kind_of([input])
    q = input
    if dtype_name(getattr(input, "dtype", None), "input") == "u8":
        q = _native.view_as(input, dtype_name(fp8_dtype, "fp8_dtype"))
    return call("dequantize", {"q": q, "scale_inv": scale_inv, "out_dtype": dtype_name(otype, "otype")}, kind=kind)["y"]


def bgrad_quantize(input, quantizer):
    """TE's ``bgrad_quantize``: ``-> [grad_bias, Float8Tensor]``, the column sums of the 2-D
    ``input`` (in its dtype, summed in f32) and its FP8 cast through the ``Float8Quantizer``
    (amax raised), in one pass over it; the codes' transpose too where the quantizer asks for
    columnwise usage."""
    q = _fp8_quantizer("bgrad_quantize", quantizer)
    if q is None:
        raise TypeError("bgrad_quantize: argument 'quantizer' is None; TE's call takes a quantizer")
    args = {"x": input, "scale": q[0], "fp8_dtype": q[2], "want_transpose": _columnwise(quantizer)}
    out = _call_te("bgrad_quantize", args, kind=kind_of([input]), te_names={"x": "input", "scale": "quantizer.scale"})
    _raise_amax(quantizer.amax, out["amax"])
    return [out["dbias"], Float8Tensor(out["q"], out["scale_inv"], q[2], out["q_t"])]


def compute_amax(tensor, amax):
    """TE's ``compute_amax``: ``amax`` (f32, one element) set in place to max |tensor| (NaN where
    the tensor holds one)."""
    if _dtype_of(amax, "amax") != "f32" or _numel(amax) != 1:
        raise ValueError(
            f"compute_amax: argument 'amax' must be an f32 tensor of one element, "
            f"got {_dtype_of(amax, 'amax')} {_shape(amax)}"
        )
    got = _call_te("compute_amax", {"x": tensor}, kind=kind_of([tensor, amax]), te_names={"x": "tensor"})["amax"]
    amax[...] = got.reshape(_shape(amax))


def fused_amax_and_scale_update_after_reduction(amax_history, scale, scale_inv, fp8_max, margin, amax_compute_algo):
    """Delayed scaling's update, in place: amax from the history ("max" or "most_recent"), new
    scale and scale_inv, the history rolled."""
    call(
        "fused_amax_and_scale_update_after_reduction",
        {
            "amax_history": amax_history,
            "scale": scale,
            "scale_inv": scale_inv,
            "fp8_max": _real("fp8_max", fp8_max),
            "margin": _real("margin", margin),
            "algo": str(amax_compute_algo),
        },
    )


def dropout_fwd(input, dropout_probability, seed=0, offset=0):
    """``-> (output, mask)``."""
    p = _real("dropout_probability", dropout_probability)
    args = {"x": input, "p": p, "seed": _integer("seed", seed), "offset": _integer("offset", offset)}
    out = _call_te("dropout_fwd", args, te_names={"x": "input", "p": "dropout_probability"})
    return out["y"], out["mask"]


def dropout_bwd(grad_output, mask, dropout_probability):
    p = _real("dropout_probability", dropout_probability)
    return _call_te("dropout_bwd", {"dy": grad_output, "mask": mask, "p": p}, te_names={"dy": "grad_output", "p": "dropout_probability"})["dx"]
