"""torch layers on tefl's ops, with autograd: swap ``torch.nn`` layers for these and the
forward and backward run through tefl (whatever its policy selects: the CUDA backend for CUDA
tensors, the reference on the CPU, a plugin's impl where routed).

    import tefl.torch as tt
    norm = tt.RMSNorm(1024)
    proj = tt.Linear(1024, 3072)
    attn = tt.DotProductAttention(num_heads=8, causal=True)
    mlp = tt.SwiGLUMLP(1024, 2816)

Each layer keeps ``torch.nn``'s parameter names and shapes (``weight`` ``[out, in]``, ``bias``),
so a ``state_dict`` moves between the two. Inputs are made contiguous; the ops run on torch's
current CUDA stream.
"""

import torch

from . import tex
from ._core import call, deterministic_default, dtype_name

__all__ = ["RMSNorm", "LayerNorm", "Linear", "DotProductAttention", "SwiGLUMLP", "rmsnorm", "layernorm", "linear", "swiglu"]


# The layers call tefl's ops directly (the arguments are theirs, already of the right types),
# not through the TE-signature wrappers of tefl.tex, and reshape only what is not already
# contiguous rows: at small shapes a layer's cost is its host time.


def _dtype(t):
    return dtype_name(t.dtype)


def _rows(x):
    """x as contiguous rows ``[rows, last dim]``: x itself when it already is."""
    if x.dim() == 2 and x.is_contiguous():
        return x
    return x.reshape(-1, x.shape[-1]).contiguous()


def _like(y, shape):
    """y (rows) in `shape`, without a reshape when it already has it."""
    return y if y.shape == shape else y.reshape(shape)


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, zero_centered):
        x2 = _rows(x)
        out = call(
            "rmsnorm_fwd",
            {"x": x2, "gamma": weight.contiguous(), "eps": eps, "zero_centered_gamma": zero_centered, "out_dtype": _dtype(x)},
            kind="torch",
        )
        ctx.save_for_backward(x2, out["rsigma"], weight)
        ctx.zero_centered = zero_centered
        return _like(out["y"], x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, rsigma, weight = ctx.saved_tensors
        out = call(
            "rmsnorm_bwd",
            {"dy": _rows(dy), "x": x2, "rsigma": rsigma, "gamma": weight, "zero_centered_gamma": ctx.zero_centered},
            kind="torch",
        )
        return _like(out["dx"], dy.shape), out["dgamma"].to(weight.dtype), None, None


class _LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, zero_centered):
        x2 = _rows(x)
        out = call(
            "layernorm_fwd",
            {
                "x": x2,
                "gamma": weight.contiguous(),
                "beta": bias.contiguous(),
                "eps": eps,
                "zero_centered_gamma": zero_centered,
                "out_dtype": _dtype(x),
            },
            kind="torch",
        )
        ctx.save_for_backward(x2, out["mu"], out["rsigma"], weight)
        ctx.zero_centered = zero_centered
        return _like(out["y"], x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, mu, rsigma, weight = ctx.saved_tensors
        out = call(
            "layernorm_bwd",
            {"dy": _rows(dy), "x": x2, "mu": mu, "rsigma": rsigma, "gamma": weight, "zero_centered_gamma": ctx.zero_centered},
            kind="torch",
        )
        return _like(out["dx"], dy.shape), out["dgamma"].to(weight.dtype), out["dbeta"].to(weight.dtype), None, None


def _gemm(a, b, transa, transb, bias=None):
    """Row-major op(a)·op(b) (+ bias) through tefl's generic_gemm."""
    out = call(
        "generic_gemm",
        {
            "a": a,
            "b": b,
            "bias": bias,
            "aux": None,
            "c": None,
            "transa": transa,
            "transb": transb,
            "alpha": 1.0,
            "accumulate": False,
            "split_accumulator": False,
            "epilogue": "bias" if bias is not None else "none",
            "out_dtype": _dtype(a),
        },
        kind="torch",
    )
    return out["d"]


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        x2 = _rows(x)
        w = weight.contiguous()
        y = _gemm(x2, w, False, True, bias.contiguous() if bias is not None else None)
        ctx.save_for_backward(x2, w)
        ctx.has_bias = bias is not None
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, w = ctx.saved_tensors
        dy2 = _rows(dy)
        dx = _gemm(dy2, w, False, False)
        if dy.dim() != 2:
            dx = dx.reshape(*dy.shape[:-1], w.shape[1])
        dw = _gemm(dy2, x2, True, False)
        db = dy2.float().sum(0).to(dy.dtype) if ctx.has_bias else None
        return dx, dw, db


def _attn_args(q, k, v, mask, scale):
    """fused_attn_fwd / _bwd's shared arguments for bshd q, k, v, no dropout, no window."""
    return {
        "q": q,
        "k": k,
        "v": v,
        "cu_seqlens_q": None,
        "cu_seqlens_kv": None,
        "layout": "bshd",
        "mask": mask,
        "scale": scale,
        "dropout_p": 0.0,
        "seed": 0,
        "offset": 0,
        "window": [-1, -1],
    }


class _AttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, deterministic):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        mask = "causal" if causal else "none"
        out = call("fused_attn_fwd", _attn_args(q, k, v, mask, scale), kind="torch")
        ctx.save_for_backward(q, k, v, out["o"], out["softmax_lse"])
        ctx.mask, ctx.scale, ctx.deterministic = mask, scale, deterministic
        return out["o"]

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        args = _attn_args(q, k, v, ctx.mask, ctx.scale)
        args.update({"o": o, "d_o": do.contiguous(), "softmax_lse": lse, "deterministic": ctx.deterministic})
        out = call("fused_attn_bwd", args, kind="torch")
        return out["dq"], out["dk"], out["dv"], None, None, None


class _SwiGLUFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        ctx.save_for_backward(x)
        return tex.swiglu(x, None)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return tex.dswiglu(dy.contiguous(), x, None)


def swiglu(x):
    """silu(x[..., :n])·x[..., n:] with n half the last dim (autograd through tefl)."""
    return _SwiGLUFn.apply(x)


def rmsnorm(x, weight, eps=1e-5, zero_centered_gamma=False):
    """y = x·rsigma·weight over the last dim (autograd through tefl)."""
    return _RMSNormFn.apply(x, weight, float(eps), bool(zero_centered_gamma))


def layernorm(x, weight, bias, eps=1e-5, zero_centered_gamma=False):
    """LayerNorm over the last dim (autograd through tefl)."""
    return _LayerNormFn.apply(x, weight, bias, float(eps), bool(zero_centered_gamma))


def linear(x, weight, bias=None):
    """x·weightᵀ + bias, as ``torch.nn.functional.linear`` (autograd through tefl)."""
    return _LinearFn.apply(x, weight, bias)


class RMSNorm(torch.nn.Module):
    """``torch.nn.RMSNorm(hidden, eps)`` on tefl."""

    def __init__(self, hidden, eps=1e-5, zero_centered_gamma=False, device=None, dtype=None):
        super().__init__()
        init = torch.zeros if zero_centered_gamma else torch.ones
        self.weight = torch.nn.Parameter(init(hidden, device=device, dtype=dtype))
        self.eps, self.zero_centered_gamma = eps, zero_centered_gamma

    def forward(self, x):
        return rmsnorm(x, self.weight, self.eps, self.zero_centered_gamma)


class LayerNorm(torch.nn.Module):
    """``torch.nn.LayerNorm(hidden, eps)`` on tefl."""

    def __init__(self, hidden, eps=1e-5, device=None, dtype=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(hidden, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x):
        return layernorm(x, self.weight, self.bias, self.eps)


class Linear(torch.nn.Module):
    """``torch.nn.Linear(in_features, out_features, bias)`` on tefl's GEMM."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        ref = torch.nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.weight = ref.weight
        self.bias = ref.bias

    def forward(self, x):
        return linear(x, self.weight, self.bias)


class DotProductAttention(torch.nn.Module):
    """Attention over ``[batch, seq, heads, head_dim]`` q, k, v (GQA: fewer k/v heads), causal
    or not: tefl's flash attention forward and backward. ``deterministic``: whether the backward's
    dQ must be the same bits on every repetition (slower on CUDA, see ``tex.fused_attn_bwd``);
    ``None`` asks for it when ``torch.are_deterministic_algorithms_enabled()`` or, as in
    TransformerEngine, ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` (read at each call)."""

    def __init__(self, num_heads, causal=True, scale=None, deterministic=None):
        super().__init__()
        self.num_heads, self.causal, self.scale = num_heads, causal, scale
        self.deterministic = deterministic

    def forward(self, q, k, v):
        scale = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        det = self.deterministic
        if det is None:
            det = deterministic_default(torch.are_deterministic_algorithms_enabled())
        return _AttentionFn.apply(q, k, v, bool(self.causal), float(scale), bool(det))


class SwiGLUMLP(torch.nn.Module):
    """down(silu(gate(x)) · up(x)) with gate and up fused in one ``[2·ffn, hidden]`` weight."""

    def __init__(self, hidden, ffn, bias=False, device=None, dtype=None):
        super().__init__()
        self.fc1 = Linear(hidden, 2 * ffn, bias=bias, device=device, dtype=dtype)
        self.fc2 = Linear(ffn, hidden, bias=bias, device=device, dtype=dtype)

    def forward(self, x):
        return self.fc2(_SwiGLUFn.apply(self.fc1(x)))
