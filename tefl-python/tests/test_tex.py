"""Every tefl.tex op on numpy inputs against numpy formulas (float64 references), with TE's
argument lists and return tuples; awkward shapes (odd widths, one row) and fresh random data."""

import math

import numpy as np
import pytest

import tefl
import tefl.tex as tex
import transformer_engine_fl_torch as tex_alias

RNG = np.random.default_rng()


def rand(*shape, lo=-2.0, hi=2.0, dtype=np.float32):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def close(got, want, tol=2e-5):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    err = float(np.abs(got - want).max(initial=0.0)) / scale
    assert err < tol, f"max relative error {err:.3e} >= {tol:.1e}"


def test_te_nondeterministic_switch(monkeypatch):
    # tefl.torch.DotProductAttention's default for `deterministic`: TE's
    # NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 or torch's deterministic algorithms ask for it.
    from tefl._core import deterministic_default

    monkeypatch.delenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", raising=False)
    assert deterministic_default(False) is False
    assert deterministic_default(True) is True
    for raw, want in [("0", True), (" 0 ", True), ("1", False), ("2", False)]:
        monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", raw)
        assert deterministic_default(False) is want, raw
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "yes")
    with pytest.raises(ValueError, match="NVTE_ALLOW_NONDETERMINISTIC_ALGO='yes'"):
        deterministic_default(False)


def test_the_alias_module_is_tex():
    assert tex_alias.rmsnorm_fwd is tex.rmsnorm_fwd
    assert "generic_gemm" in tex_alias.__all__


def test_backends_are_listed_as_the_seed_shows():
    backends = tex.list_backends()
    assert {"name", "vendor", "priority", "available"} <= set(backends[0])
    assert any(b["name"] == "reference" and b["available"] for b in backends)
    assert tex.get_backend() in [b["name"] for b in backends]
    with pytest.raises(RuntimeError, match="hygon"):
        tex.set_backend("hygon")
    before = tex.get_backend()
    tex.set_backend("reference")
    try:
        assert tex.get_backend() == "reference"
    finally:
        tex.set_backend(before)


@pytest.mark.parametrize("rows,cols", [(5, 37), (1, 1024), (33, 64)])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_rmsnorm(rows, cols, zero_centered):
    x, g, dy = rand(rows, cols), rand(cols), rand(rows, cols)
    y, mu, rs = tex.rmsnorm_fwd(x, g, 1e-5, None, None, np.float32, 0, zero_centered)
    assert mu is None
    x64, g64 = x.astype(np.float64), g.astype(np.float64) + (1.0 if zero_centered else 0.0)
    r = 1.0 / np.sqrt((x64**2).mean(-1) + 1e-5)
    close(rs, r)
    close(y, x64 * r[:, None] * g64)
    dx, dg = tex.rmsnorm_bwd(dy, x, rs, g, 0, zero_centered)
    xhat = x64 * r[:, None]
    dxhat = dy * g64
    want_dx = r[:, None] * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    close(dx, want_dx, 1e-4)
    close(dg, (dy * xhat).sum(0), 1e-4)
    add = rand(rows, cols)
    dx2, _ = tex.rmsnorm_bwd_add(dy, x, add, rs, g, 0, zero_centered)
    close(dx2, want_dx + add, 1e-4)


def test_rmsnorm_writes_ln_out_and_converts_otype():
    x, g = rand(4, 40), rand(40)
    ln_out = np.zeros((4, 40), np.float32)
    y, _, _ = tex.rmsnorm_fwd(x, g, 1e-6, ln_out, None, np.float32, 0, False)
    assert y is ln_out and np.abs(ln_out).max() > 0
    y16, _, _ = tex.rmsnorm_fwd(x, g, 1e-6, None, None, np.float16, 0, False)
    assert y16.dtype == np.float16
    close(y16, ln_out, 2e-3)
    # bf16 results reach numpy as float32 (numpy has no bf16).
    ybf, _, _ = tex.rmsnorm_fwd(x, g, 1e-6, None, None, "bf16", 0, False)
    assert ybf.dtype == np.float32
    close(ybf, ln_out, 1e-2)


def test_layernorm():
    x, g, b, dy = rand(7, 51), rand(51), rand(51), rand(7, 51)
    y, mu, rs = tex.layernorm_fwd(x, g, b, 1e-5, None, None, np.float32, 0, False)
    x64 = x.astype(np.float64)
    m = x64.mean(-1)
    r = 1.0 / np.sqrt(x64.var(-1) + 1e-5)
    close(mu, m)
    close(rs, r)
    xhat = (x64 - m[:, None]) * r[:, None]
    close(y, xhat * g + b)
    dx, dg, db = tex.layernorm_bwd(dy, x, mu, rs, g, 0, False)
    dxhat = dy * g.astype(np.float64)
    want = r[:, None] * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    close(dx, want, 1e-4)
    close(dg, (dy * xhat).sum(0), 1e-4)
    close(db, dy.sum(0), 1e-4)


def fp8_values(t):
    """A Float8Tensor's values (codes · scale_inv) in float64."""
    return np.asarray(t.dequantize("f32"), np.float64)


# Relative spacing of FP8 values: 3 mantissa bits for e4m3, 2 for e5m2 (half of it is the most
# a round-to-nearest cast moves a value).
FP8_STEP = {"f8e4m3": 2.0**-3, "f8e5m2": 2.0**-2}


@pytest.mark.parametrize("fmt", ["f8e4m3", "f8e5m2"])
def test_norms_write_fp8_through_a_quantizer(fmt):
    x, g, b = rand(6, 48), rand(48), rand(48)
    x64 = x.astype(np.float64)
    scale = np.array([RNG.uniform(0.5, 4.0)], np.float32)
    # rmsnorm: the amax starts below the output's and is raised to it in place.
    amax = np.array([0.25], np.float32)
    q = tex.Float8Quantizer(scale, amax, fmt)
    out, mu, rs = tex.rmsnorm_fwd(x, g, 1e-5, None, q, None, 0, False)
    assert isinstance(out, tex.Float8Tensor) and mu is None and out.fp8_dtype == fmt
    assert out.data.dtype == np.uint8 and tuple(out.shape) == (6, 48)
    r = 1.0 / np.sqrt((x64**2).mean(-1) + 1e-5)
    y = x64 * r[:, None] * g
    close(rs, r)
    close(out.scale_inv, 1.0 / scale.astype(np.float64), 1e-7)
    close(amax, [np.abs(y).max()], 1e-5)
    got = fp8_values(out)
    assert np.all(np.abs(got - y) <= FP8_STEP[fmt] / 2 * np.abs(y) + 2.0**-9 / scale[0]), np.abs(got - y).max()
    # layernorm: an amax already above the output's stays.
    amax = np.array([1e3], np.float32)
    out, mu, rs = tex.layernorm_fwd(x, g, b, 1e-5, None, tex.Float8Quantizer(scale, amax, fmt), None, 0, False)
    m = x64.mean(-1)
    y = (x64 - m[:, None]) / np.sqrt(x64.var(-1) + 1e-5)[:, None] * g + b
    close(mu, m)
    assert amax[0] == np.float32(1e3)
    got = fp8_values(out)
    assert np.all(np.abs(got - y) <= FP8_STEP[fmt] / 2 * np.abs(y) + 2.0**-9 / scale[0]), np.abs(got - y).max()
    with pytest.raises(NotImplementedError, match="ln_out"):
        tex.rmsnorm_fwd(x, g, 1e-5, np.zeros_like(x), q, None, 0, False)
    with pytest.raises(ValueError, match="FP8"):
        tex.rmsnorm_fwd(x, g, 1e-5, None, tex.Float8Quantizer(scale, amax, "bf16"), None, 0, False)


def quantized(x, fmt):
    """x as a Float8Tensor, through tex.quantize with a random scale."""
    s = np.array([RNG.uniform(1.0, 8.0)], np.float32)
    q, _, _, s_inv = tex.quantize(x, s, fmt)
    return tex.Float8Tensor(q, s_inv, fmt)


@pytest.mark.parametrize("fa,fb", [("f8e4m3", "f8e4m3"), ("f8e4m3", "f8e5m2")])
def test_generic_gemm_on_fp8_operands_and_to_an_fp8_output(fa, fb):
    # TE's "TN": A [out, in] (the weight), B [tokens, in] -> D = B·Aᵀ, from the FP8 values.
    A, B = quantized(rand(24, 64), fa), quantized(rand(9, 64), fb)
    want = fp8_values(B) @ fp8_values(A).T
    D = np.zeros((9, 24), np.float32)
    d, _, _, _ = tex.generic_gemm(A, True, B, False, D, None, np.float32, None, None, False, None, False, None, 0, False, True)
    assert d is D
    close(D, want, 1e-5)
    # D as FP8 through a quantizer (amax raised from 0), with a bias.
    bias = rand(24)
    qd = tex.Float8Quantizer(np.array([0.5], np.float32), np.zeros(1, np.float32), "f8e4m3")
    d8, _, _, _ = tex.generic_gemm(A, True, B, False, None, qd, None, bias, None, False, None, False, None, 0, False, False)
    assert isinstance(d8, tex.Float8Tensor) and tuple(d8.shape) == (9, 24)
    want_b = want + bias
    close(qd.amax, [np.abs(want_b).max()], 1e-5)
    close(d8.scale_inv, [2.0], 1e-7)
    got = fp8_values(d8)
    assert np.all(np.abs(got - want_b) <= FP8_STEP["f8e4m3"] / 2 * np.abs(want_b) + 2.0**-9 * 2), np.abs(got - want_b).max()
    with pytest.raises(TypeError, match="both"):
        tex.generic_gemm(A, True, rand(9, 64), False, D, None, np.float32, None, None, False, None, False, None, 0, False, False)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def test_generic_gemm_in_te_convention():
    # TE's "TN": weight A [out, in], input B [tokens, in] -> D [tokens, out] = B·Aᵀ.
    A, B = rand(24, 40), rand(9, 40)
    D = np.zeros((9, 24), np.float32)
    bias = rand(24)
    d, bias_grad, gelu_in, extra = tex.generic_gemm(
        A, True, B, False, D, None, np.float32, bias, None, False, None, False, None, 0, False, False
    )
    assert d is D and bias_grad is None and gelu_in is None and extra is None
    close(D, B.astype(np.float64) @ A.T.astype(np.float64) + bias, 1e-5)
    # "NN": D = B·A; accumulate adds to D.
    A2, B2 = rand(40, 24), rand(9, 40)
    before = D.copy()
    tex.generic_gemm(A2, False, B2, False, D, None, np.float32, None, None, False, None, False, None, 0, True, False)
    close(D, before + B2.astype(np.float64) @ A2.astype(np.float64), 1e-5)
    # GELU epilogue: the pre-activation goes to gelu_in.
    pre = np.zeros((9, 24), np.float32)
    tex.generic_gemm(A, True, B, False, D, None, np.float32, bias, None, True, pre, False, None, 0, False, False)
    p = B.astype(np.float64) @ A.T.astype(np.float64) + bias
    close(pre, p, 1e-5)
    close(D, gelu_tanh(p), 1e-4)
    # Backward: the bias gradient is the column sums of D.
    G = rand(9, 24)
    Dg = np.zeros((9, 40), np.float32)
    _, bgrad, _, _ = tex.generic_gemm(
        A, False, G, False, Dg, None, np.float32, np.zeros(24, np.float32), None, False, None, True, None, 0, False, False
    )
    close(Dg, G.astype(np.float64) @ A.astype(np.float64), 1e-5)
    close(bgrad, Dg.sum(0), 1e-4)


def test_generic_gemm_as_the_tex_readme_writes_it():
    # The TEX README's example (A [m, k], B [k, n], no transposes) only fits D = A·B.
    A, B = rand(16, 8), rand(8, 20)
    D = np.empty((16, 20), np.float32)
    tex.generic_gemm(A, False, B, False, D, None, np.float32, None, None, False, None, False, None, 0, False, False)
    close(D, A.astype(np.float64) @ B.astype(np.float64), 1e-5)
    with pytest.raises(ValueError, match="do not multiply"):
        tex.generic_gemm(A, False, rand(5, 7), False, D, None, np.float32, None, None, False, None, False, None, 0, False, False)


def attention_ref(q, k, v, causal, scale):
    # bshd, one sequence length; returns o and lse.
    b, sq, h, d = q.shape
    sk = k.shape[1]
    s = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), k.astype(np.float64)) * scale
    if causal:
        mask = np.triu(np.ones((sq, sk), bool), 1)
        s = np.where(mask, -np.inf, s)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", p / l, v.astype(np.float64))
    lse = (m + np.log(l))[..., 0]
    return o, lse, p / l


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention(causal):
    b, s, h, d = 2, 19, 3, 16
    q, k, v, do = rand(b, s, h, d, lo=-1, hi=1), rand(b, s, h, d, lo=-1, hi=1), rand(b, s, h, d, lo=-1, hi=1), rand(b, s, h, d)
    scale = d**-0.5
    mask = "causal" if causal else "no_mask"
    o, lse, rng_state = tex.fused_attn_fwd(
        s, s, True, scale, 0.0, True, "bshd_bshd_bshd", "no_bias", mask, (-1, -1), None, None, q, k, v
    )
    want_o, want_lse, p = attention_ref(q, k, v, causal, scale)
    close(o, want_o, 1e-4)
    close(lse, want_lse, 1e-4)
    assert rng_state.dtype == np.int64
    dq, dk, dv, dbias = tex.fused_attn_bwd(
        s, s, scale, 0.0, True, "bshd_bshd_bshd", "no_bias", mask, (-1, -1), False, None, None,
        q, k, v, o, do, None, None, [lse, rng_state],
    )
    assert dbias is None
    do64 = do.astype(np.float64)
    dp = np.einsum("bihd,bjhd->bhij", do64, v.astype(np.float64))
    delta = (dp * p).sum(-1, keepdims=True)
    ds = p * (dp - delta)
    close(dv, np.einsum("bhij,bihd->bjhd", p, do64), 1e-4)
    close(dq, np.einsum("bhij,bjhd->bihd", ds, k.astype(np.float64)) * scale, 1e-4)
    close(dk, np.einsum("bhij,bihd->bjhd", ds, q.astype(np.float64)) * scale, 1e-4)
    # TE's deterministic argument: the same values, the same bits on a second call.
    bwd_det = (s, s, scale, 0.0, True, "bshd_bshd_bshd", "no_bias", mask, (-1, -1), True, None, None, q, k, v, o, do)
    dq_det, _, _, _ = tex.fused_attn_bwd(*bwd_det, None, None, [lse, rng_state])
    dq_again, _, _, _ = tex.fused_attn_bwd(*bwd_det, None, None, [lse, rng_state])
    close(dq_det, np.einsum("bhij,bjhd->bihd", ds, k.astype(np.float64)) * scale, 1e-4)
    assert np.array_equal(np.asarray(dq_det), np.asarray(dq_again))
    with pytest.raises(TypeError, match="deterministic"):
        tex.fused_attn_bwd(*bwd_det[:9], "yes", *bwd_det[10:], None, None, [lse, rng_state])
    with pytest.raises(NotImplementedError, match="Bias"):
        tex.fused_attn_fwd(s, s, True, scale, 0.0, True, "bshd_bshd_bshd", "no_bias", mask, None, None, None, q, k, v, Bias=q)
    with pytest.raises(NotImplementedError, match="qkv_layout"):
        tex.fused_attn_fwd(s, s, True, scale, 0.0, True, "bs3hd", "no_bias", mask, None, None, None, q, k, v)
    with pytest.raises(ValueError, match="window_size"):
        tex.fused_attn_fwd(s, s, True, scale, 0.0, True, "bshd_bshd_bshd", "no_bias", mask, (4,), None, None, q, k, v)
    # A side of the window is -1 (unbounded) or a count of keys; no other negative.
    with pytest.raises(ValueError, match=r"argument 'window' \(TE's 'window_size'\).*-5"):
        tex.fused_attn_fwd(s, s, True, scale, 0.0, True, "bshd_bshd_bshd", "no_bias", mask, (-5, 0), None, None, q, k, v)
    # v's head dim must be that of q and k (o takes q's shape).
    with pytest.raises(ValueError, match="'v'"):
        tex.fused_attn_fwd(s, s, True, scale, 0.0, True, "bshd_bshd_bshd", "no_bias", mask, None, None, None, q, k, v[..., :8].copy())


def test_thd_attention_and_max_seqlen():
    # Two sequences packed as thd (3 and 4 tokens): each is its own causal attention, the same
    # as bshd on that sequence alone. TE's max_seqlen bounds: at or above the lengths they
    # change nothing, below one they are refused by name (numpy lengths are read on the host).
    h, d = 2, 8
    q, k, v = (rand(7, h, d, lo=-1, hi=1) for _ in range(3))
    cu = np.array([0, 3, 7], np.int32)
    args = (True, d**-0.5, 0.0, True, "thd_thd_thd", "no_bias", "padding_causal", (-1, -1), cu, cu, q, k, v)
    o, lse, _ = tex.fused_attn_fwd(4, 4, *args)
    for lo, hi in [(0, 3), (3, 7)]:
        want_o, want_lse, _ = attention_ref(q[None, lo:hi], k[None, lo:hi], v[None, lo:hi], True, d**-0.5)
        close(np.asarray(o)[lo:hi], want_o[0], 1e-4)
        close(np.asarray(lse)[:, lo:hi], want_lse[0], 1e-4)
    o_unbounded, _, _ = tex.fused_attn_fwd(None, None, *args)
    assert np.array_equal(np.asarray(o), np.asarray(o_unbounded))
    with pytest.raises(ValueError, match="max_seqlen_q"):
        tex.fused_attn_fwd(3, 4, *args)
    with pytest.raises(ValueError, match="max_seqlen_kv"):
        tex.fused_attn_fwd(4, -1, *args)
    # bshd and sbhd take their lengths from the shapes: the bounds are not read (as before).
    qb = q[None]
    bshd = (True, d**-0.5, 0.0, True, "bshd_bshd_bshd", "no_bias", "causal", (-1, -1), None, None, qb, qb, qb)
    assert np.array_equal(np.asarray(tex.fused_attn_fwd(1, 1, *bshd)[0]), np.asarray(tex.fused_attn_fwd(7, 7, *bshd)[0]))


def test_rope():
    s, b, h, d = 11, 2, 3, 8
    x = rand(s, b, h, d)
    freqs = rand(s, 1, 1, d, lo=-3, hi=3)
    y = tex.fused_rope_forward(x, freqs, None, "sbhd", False, None, 1, 0)
    half = d // 2
    x64, f = x.astype(np.float64), freqs.astype(np.float64)
    rot = np.concatenate([-x64[..., half:], x64[..., :half]], -1)
    close(y, x64 * np.cos(f) + rot * np.sin(f), 1e-5)
    dy = rand(s, b, h, d)
    dx = tex.fused_rope_backward(dy, freqs, None, "sbhd", False, None, 1, 0)
    # The backward is the transpose of the forward: <dy, R x> = <Rᵀ dy, x>.
    close(float((dy * y).sum()), float((dx * x.astype(np.float64)).sum()), 1e-4)
    with pytest.raises(NotImplementedError, match="cp_size"):
        tex.fused_rope_forward(x, freqs, None, "sbhd", False, None, 2, 0)


def test_empty_batches():
    # A batch of no sequences: empty outputs of the right shapes, no error (as torch gives).
    x, freqs = rand(5, 0, 3, 8), rand(5, 1, 1, 8)
    assert tex.fused_rope_forward(x, freqs, None, "sbhd", False, None, 1, 0).shape == (5, 0, 3, 8)
    q = rand(0, 7, 2, 16)
    o, lse, _ = tex.fused_attn_fwd(7, 7, True, 0.25, 0.0, True, "bshd_bshd_bshd", "no_bias", "causal", (-1, -1), None, None, q, q, q)
    assert o.shape == (0, 7, 2, 16) and lse.shape == (0, 2, 7)
    with pytest.raises(ValueError, match="'k'"):
        tex.fused_attn_fwd(7, 7, True, 0.25, 0.0, True, "bshd_bshd_bshd", "no_bias", "causal", (-1, -1), None, None,
                           rand(1, 7, 2, 16), rand(1, 0, 2, 16), rand(1, 0, 2, 16))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def test_softmax_family():
    x = rand(2, 3, 5, 5)
    y = tex.scaled_softmax_forward(x, 0.7)
    close(y, softmax(0.7 * x.astype(np.float64)))
    dy = rand(2, 3, 5, 5)
    dx = tex.scaled_softmax_backward(dy, y, 0.7)
    y64 = y.astype(np.float64)
    close(dx, 0.7 * y64 * (dy - (dy * y64).sum(-1, keepdims=True)), 1e-5)
    tri = tex.scaled_upper_triang_masked_softmax_forward(rand(3, 6, 6), 1.0)
    assert np.all(np.triu(tri, 1) == 0)
    close(tri.sum(-1), np.ones((3, 6)))
    mask = (RNG.uniform(size=(2, 1, 5, 5)) < 0.3).astype(np.uint8)
    mask[..., 0] = 0
    ym = tex.scaled_masked_softmax_forward(x, mask, 1.0)
    assert np.all(ym[np.broadcast_to(mask, ym.shape).astype(bool)] == 0)


ACTS = {
    "gelu": gelu_tanh,
    "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "qgelu": lambda x: x / (1 + np.exp(-1.702 * x)),
}


@pytest.mark.parametrize("name", sorted(ACTS))
def test_activations(name):
    x = rand(3, 17)
    y = getattr(tex, name)(x, None)
    close(y, ACTS[name](x.astype(np.float64)), 1e-5)
    # Backward against central differences of the forward formula.
    g = rand(3, 17)
    dx = getattr(tex, "d" + name)(g, x, None)
    h = 1e-6
    x64 = x.astype(np.float64)
    fd = (ACTS[name](x64 + h) - ACTS[name](x64 - h)) / (2 * h)
    close(dx, g * fd, 1e-4)


def test_gated_activations():
    x = rand(4, 2 * 13)
    a, b = x[:, :13].astype(np.float64), x[:, 13:].astype(np.float64)
    close(tex.swiglu(x, None), ACTS["silu"](a) * b, 1e-5)
    close(tex.geglu(x, None), gelu_tanh(a) * b, 1e-5)
    close(tex.reglu(x, None), np.maximum(a, 0) * b, 1e-5)
    g = rand(4, 13)
    dx = tex.dswiglu(g, x, None)
    sig = 1 / (1 + np.exp(-a))
    close(dx[:, 13:], g * ACTS["silu"](a), 1e-4)
    close(dx[:, :13], g * b * (sig + a * sig * (1 - sig)), 1e-4)
    dbias, dgelu = tex.dbias_dgelu(g, x[:, :13].copy(), None)
    close(dbias, np.asarray(dgelu, np.float64).sum(0), 1e-4)


def test_multi_tensor_ops_work_in_place():
    noop = np.zeros(1, np.int32)
    src = [rand(5), rand(3, 4)]
    dst = [np.zeros(5, np.float32), np.zeros((3, 4), np.float32)]
    tex.multi_tensor_scale(2048, noop, [src, dst], 0.5)
    for s, d in zip(src, dst):
        close(d, 0.5 * s.astype(np.float64))
    total, per = tex.multi_tensor_l2norm(2048, noop, [src], True)
    close(np.asarray(total).reshape(-1)[0], math.sqrt(sum(float((s.astype(np.float64) ** 2).sum()) for s in src)), 1e-5)
    close(per, [np.linalg.norm(s.astype(np.float64)) for s in src], 1e-5)
    # Adam: the caller's arrays are updated where they are.
    g, p, m, v = [rand(6)], [rand(6)], [np.zeros(6, np.float32)], [np.zeros(6, np.float32)]
    p0, addr = p[0].copy(), p[0].ctypes.data
    tex.multi_tensor_adam(2048, noop, [g, p, m, v], 1e-2, 0.9, 0.999, 1e-8, 1, 1, True, 0.01)
    assert p[0].ctypes.data == addr
    g64 = g[0].astype(np.float64)
    m_hat, v_hat = g64, g64**2
    want = p0 * (1 - 1e-2 * 0.01) - 1e-2 * m_hat / (np.sqrt(v_hat) + 1e-8)
    close(p[0], want, 1e-5)
    close(m[0], 0.1 * g64)
    # A non-finite input sets the noop flag and a flagged call changes nothing.
    tex.multi_tensor_scale(2048, noop, [[np.array([np.inf], np.float32)], [np.zeros(1, np.float32)]], 1.0)
    assert noop[0] == 1
    before = p[0].copy()
    tex.multi_tensor_adam(2048, noop, [g, p, m, v], 1e-2, 0.9, 0.999, 1e-8, 2, 1, True, 0.01)
    assert np.array_equal(p[0], before)


def test_sgd():
    noop = np.zeros(1, np.int32)
    g, p, mom = [rand(9)], [rand(9)], [np.zeros(9, np.float32)]
    p0 = p[0].astype(np.float64).copy()
    tex.multi_tensor_sgd(2048, noop, [g, p, mom], 0.0, 0.9, 0.0, 0.1, False, True, False, 1.0)
    close(p[0], p0 - 0.1 * g[0].astype(np.float64), 1e-5)


def test_fp8_quantize_round_trip():
    x = rand(4, 16, lo=-3, hi=3)
    scale = np.array([10.0], np.float32)
    q, q_t, amax, scale_inv = tex.quantize(x, scale, "f8e4m3", True)
    assert q.dtype == np.uint8 and q_t.shape == (16, 4)
    close(amax, [np.abs(x).max()])
    close(scale_inv, [0.1])
    y = tex.dequantize(q, scale_inv, np.float32)
    close(y, x, 0.07)  # e4m3 keeps 3 mantissa bits


def test_dropout():
    x = rand(64, 64)
    y, mask = tex.dropout_fwd(x, 0.25, 11, 0)
    keep = np.asarray(mask).astype(bool).reshape(x.shape)
    assert 0.65 < keep.mean() < 0.85
    close(y, np.where(keep, x / 0.75, 0.0), 1e-6)


def test_seeds_cover_the_whole_u64_range():
    x = rand(32, 32)
    top = (1 << 64) - 1
    y1, m1 = tex.dropout_fwd(x, 0.5, top, 0)
    y2, m2 = tex.dropout_fwd(x, 0.5, top, 0)
    _, m3 = tex.dropout_fwd(x, 0.5, top - 1, 0)
    assert np.array_equal(np.asarray(m1), np.asarray(m2)) and not np.array_equal(np.asarray(m1), np.asarray(m3))
    with pytest.raises(ValueError, match="seed"):
        tex.dropout_fwd(x, 0.5, 1 << 64, 0)
    # The attention's rng_state keeps such a seed as TE does (int64 bits), and the backward
    # reads it back: the same seed's backward as one given the seed directly.
    b, s, h, d = 1, 8, 2, 8
    q, k, v, do = (rand(b, s, h, d) for _ in range(4))
    args = (s, s, True, d**-0.5, 0.3, True, "bshd_bshd_bshd", "no_bias", "no_mask", (-1, -1), None, None, q, k, v)
    o, lse, rng_state = tex.fused_attn_fwd(*args, seed=top, offset=5)
    assert list(np.asarray(rng_state)) == [-1, 5]
    o_again, _, _ = tex.fused_attn_fwd(*args, seed=top, offset=5)
    o_other, _, _ = tex.fused_attn_fwd(*args, seed=top - 1, offset=5)
    assert np.array_equal(np.asarray(o), np.asarray(o_again)) and not np.array_equal(np.asarray(o), np.asarray(o_other))
    bwd = (s, s, d**-0.5, 0.3, True, "bshd_bshd_bshd", "no_bias", "no_mask", (-1, -1), False, None, None, q, k, v, o, do, None, None)
    dq, _, _, _ = tex.fused_attn_bwd(*bwd, [lse, rng_state])
    dq_other, _, _, _ = tex.fused_attn_bwd(*bwd, [lse, np.array([-2, 5], np.int64)])
    assert np.isfinite(np.asarray(dq)).all() and not np.array_equal(np.asarray(dq), np.asarray(dq_other))


def test_bad_input_is_a_named_python_error():
    x, g = rand(3, 8), rand(8)
    with pytest.raises(ValueError, match="gamma"):
        tex.rmsnorm_fwd(x, rand(5), 1e-5, None, None, np.float32, 0, False)
    with pytest.raises(TypeError, match="otype"):
        tex.rmsnorm_fwd(x, g, 1e-5, None, None, "float7", 0, False)
    with pytest.raises(NotImplementedError, match="quantizer"):
        tex.rmsnorm_fwd(x, g, 1e-5, None, object(), "f32", 0, False)
    with pytest.raises(ValueError, match="eps"):
        tex.rmsnorm_fwd(x, g, -1.0, None, None, np.float32, 0, False)
    with pytest.raises(TypeError, match="'x'"):
        tefl.call("rmsnorm_fwd", {"x": 3.0, "gamma": g, "eps": 1e-5, "zero_centered_gamma": False, "out_dtype": "f32"})
    with pytest.raises(ValueError, match="contiguous"):
        tex.gelu(rand(8, 8)[:, ::2], None)
    with pytest.raises(ValueError, match="unknown op|did you mean"):
        tefl.call("rmsnorm_fw", {})
    # A value that is no tensor where one is needed, and a GEMM told no output dtype.
    for bad in (None, [[1.0] * 8] * 3):
        with pytest.raises(TypeError, match="'input'.*expected a tensor"):
            tex.rmsnorm_fwd(bad, g, 1e-5, None, None, None, 0, False)
    for chunk in (0, -5, 1 << 31):
        with pytest.raises(ValueError, match="chunk_size"):
            tex.multi_tensor_scale(chunk, np.zeros(1, np.int32), [[rand(4)], [rand(4)]], 2.0)
    with pytest.raises(ValueError, match="'output_dtype'"):
        tex.generic_gemm(rand(4, 8), True, rand(4, 8), False, None, None, None, None, None, False, None, False, None, 0, False, False)


def test_errors_give_tes_name_of_a_renamed_argument():
    # tefl's catalogue names the arguments x, gamma, a, b, dy ...; the TE function's own names
    # follow them in the message, so the caller finds the one they passed.
    x = rand(3, 8)
    with pytest.raises(ValueError, match=r"argument 'gamma' \(TE's 'weight'\) has shape \[5\]"):
        tex.rmsnorm_fwd(x, rand(5), 1e-5, None, None, None, 0, False)
    with pytest.raises(ValueError, match=r"argument 'beta' \(TE's 'bias'\)"):
        tex.layernorm_fwd(x, rand(8), rand(3), 1e-5, None, None, None, 0, False)
    with pytest.raises(ValueError, match=r"argument 'x' \(TE's 'input'\) is not contiguous"):
        tex.rmsnorm_fwd(rand(3, 16)[:, ::2], rand(8), 1e-5, None, None, None, 0, False)
    # TE's D = op(B)·op(A): its A is tefl's b.
    with pytest.raises(ValueError, match=r"argument 'b' \(TE's 'A'\) has dtype i32"):
        tex.generic_gemm(
            np.ones((4, 8), np.int32), True, rand(3, 8), False, None, None, "float32", None, None, False, None, False, None, 0, False, False
        )
    with pytest.raises(ValueError, match=r"argument 'dy' \(TE's 'output_grads'\)"):
        tex.scaled_softmax_backward(rand(2, 4), rand(2, 5), 1.0)
    with pytest.raises(ValueError, match=r"argument 'p' \(TE's 'dropout_probability'\)"):
        tex.dropout_fwd(x, 1.5)
    # The multi-tensor ops' lists are TE's tensor_lists[i].
    noop = np.zeros(1, np.int32)
    g, p, m = [rand(5)], [rand(5)], [np.zeros(5, np.float32)]
    with pytest.raises(ValueError, match=r"argument 'exp_avg_sq' \(TE's 'tensor_lists\[3\]'\)"):
        tex.multi_tensor_adam(65536, noop, [g, p, m, [np.zeros(4, np.float32)]], 1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    with pytest.raises(ValueError, match=r"argument 'master_params' \(TE's 'tensor_lists\[4\]'\)"):
        tex.multi_tensor_adam(65536, noop, [g, p, m, [np.zeros(5, np.float32)], [rand(3)]], 1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    with pytest.raises(ValueError, match=r"argument 'eps' \(TE's 'epsilon'\)"):
        tex.multi_tensor_adam(65536, noop, [g, p, m, [np.zeros(5, np.float32)]], 1e-3, 0.9, 0.999, -1.0, 1, 1, 1, 0.0)
    # An argument both name alike is named once.
    with pytest.raises(ValueError, match=r"argument 'eps' is invalid"):
        tex.rmsnorm_fwd(x, rand(8), -1.0, None, None, None, 0, False)


def test_overlapping_views_written_in_place_are_refused():
    # Each argument is imported on its own, so the check goes by memory: two views of one array
    # (or overlapping slices of it) written in place would race.
    g, p, v = rand(8), rand(8), np.zeros(16, np.float32)
    noop = np.zeros(1, np.int32)
    with pytest.raises(ValueError, match="exp_avg_sq.*'exp_avg'"):
        tex.multi_tensor_adam(2048, noop, [[g], [p], [v[:8]], [v[4:12]]], 1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    with pytest.raises(ValueError, match="'params'"):
        tex.multi_tensor_adam(2048, noop, [[g], [p[:]], [p.view()], [v[8:]]], 1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    before = v.copy()
    # Disjoint halves of one array are fine, and both are updated in place.
    tex.multi_tensor_adam(2048, noop, [[g], [p], [v[:8]], [v[8:]]], 1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    # (rtol: 1 - beta2 in f32 is 0.00100005.)
    assert np.allclose(v[:8], 0.1 * g, rtol=1e-4) and np.allclose(v[8:], 0.001 * g * g, rtol=1e-4)
    assert not np.array_equal(v, before)


def test_scalar_arguments_are_checked_and_named():
    x, g = rand(3, 8), rand(8)
    # Numbers of any kind convert (numpy scalars, 0-d arrays, whole floats for integers) ...
    y, _, _ = tex.rmsnorm_fwd(x, g, np.float32(1e-5), None, None, None, np.int64(2), False)
    close(y, x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * g, tol=1e-5)
    x4 = x.reshape(1, 1, 3, 8)
    close(tex.scaled_softmax_forward(x4, np.array(2.0)), tex.scaled_softmax_forward(x4, 2.0))
    tex.dropout_fwd(x, 0.5, seed=7.0, offset=np.uint64(3))
    # ... anything else is a TypeError naming the argument; strings are not numbers.
    for call, name in [
        (lambda: tex.rmsnorm_fwd(x, g, "1e-5", None, None, None, 0, False), "eps"),
        (lambda: tex.layernorm_fwd(x, g, g, None, None, None, None, 0, False), "eps"),
        (lambda: tex.scaled_softmax_forward(x.reshape(1, 1, 3, 8), "2"), "scale_factor"),
        (lambda: tex.dropout_fwd(x, "a"), "dropout_probability"),
        (lambda: tex.dropout_fwd(x, 0.5, seed=1.5), "seed"),
        (lambda: tex.rmsnorm_bwd(x, x, rand(3), g, 1.5, False), "sm_margin"),
        (lambda: tex.clamped_swiglu(rand(3, 8), None, limit=[7.0]), "limit"),
        (lambda: tex.rmsnorm_fwd(x, g, 1e-5, None, None, None, 0, "False"), "zero_centered_gamma"),
        (
            lambda: tex.generic_gemm(x, "True", x, False, None, None, "f32", None, None, False, None, False, None, 0, False, False),
            "transA",
        ),
    ]:
        with pytest.raises(TypeError, match=f"'{name}'"):
            call()
    # TE's sm_margin is a C int of SMs to leave free: checked, though tefl reserves none.
    for bad in (-1, 1 << 31):
        with pytest.raises(ValueError, match="sm_margin"):
            tex.layernorm_fwd(x, g, g, 1e-5, None, None, None, bad, False)
    lists = [[rand(8)], [rand(8)], [np.zeros(8, np.float32)], [np.zeros(8, np.float32)]]
    with pytest.raises(ValueError, match="'mode'"):
        tex.multi_tensor_adam(2048, np.zeros(1, np.int32), lists, 1e-3, 0.9, 0.999, 1e-8, 1, 2, 1, 0.0)
    with pytest.raises(TypeError, match="'lr'"):
        tex.multi_tensor_adam(2048, np.zeros(1, np.int32), lists, None, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)


def test_arrays_without_rows_give_empty_outputs_and_zero_sums():
    # An expert that drew no tokens: no rows. numpy reports zero strides for empty arrays; an
    # empty array is contiguous whatever its strides. Sums over the rows (dgamma, dbeta, dbias)
    # are zeros, as torch gives.
    for empty in (np.zeros((0, 8), np.float32), rand(4, 8)[:0]):
        g, b = rand(8), rand(8)
        y, _, rs = tex.rmsnorm_fwd(empty, g, 1e-5, None, None, None, 0, False)
        assert y.shape == (0, 8) and rs.shape == (0,)
        dx, dg = tex.rmsnorm_bwd(empty, empty, rs, g, 0, False)
        assert dx.shape == (0, 8) and np.array_equal(dg, np.zeros(8))
        y, mu, rs = tex.layernorm_fwd(empty, g, b, 1e-5, None, None, None, 0, True)
        assert y.shape == (0, 8) and mu.shape == rs.shape == (0,)
        dx, dg, db = tex.layernorm_bwd(empty, empty, mu, rs, g, 0, True)
        assert dx.shape == (0, 8) and np.array_equal(dg, np.zeros(8)) and np.array_equal(db, np.zeros(8))
        assert tex.gelu(empty, None).shape == (0, 8)
        assert tex.swiglu(empty, None).shape == (0, 4)
        assert tex.dswiglu(empty[:, :4], empty, None).shape == (0, 8)
        dbias, dgelu = tex.dbias_dgelu(empty, empty, None)
        assert dgelu.shape == (0, 8) and np.array_equal(dbias, np.zeros(8))
    no_heads = np.zeros((2, 0, 5, 7), np.float32)
    y = tex.scaled_softmax_forward(no_heads, 0.5)
    assert y.shape == (2, 0, 5, 7)
    assert tex.scaled_softmax_backward(no_heads, y, 0.5).shape == (2, 0, 5, 7)
    # A row of no elements has no norm: a last dimension of 0 is a shape error naming x.
    with pytest.raises(ValueError, match="'x'.*last dimension over 0"):
        tex.rmsnorm_fwd(np.zeros((4, 0), np.float32), np.zeros(0, np.float32), 1e-5, None, None, None, 0, False)


def test_outputs_are_zero_copy_views_of_tefl_memory():
    x = rand(4, 32)
    y = tex.gelu(x, None)
    # numpy holds tefl's buffer through DLPack: the array does not own its data.
    assert not y.flags["OWNDATA"]
    y2 = y * 1
    assert np.array_equal(y, y2)


def test_running_out_of_memory_is_an_out_of_memory_error():
    # D = B·A in TE's column-major reading, [2^30, 0]·[0, 2^30]: 2^60 f32 elements (4 EiB), which
    # no allocator gives. The error is tefl.OutOfMemoryError (a RuntimeError, as torch's is),
    # naming the size and the output, not a list of failed impls.
    a = np.zeros((0, 2**30), np.float32)
    b = np.zeros((2**30, 0), np.float32)
    with pytest.raises(tefl.OutOfMemoryError, match=f"out of memory allocating {2**62} bytes for .*generic_gemm"):
        tex.generic_gemm(a, False, b, False, None, None, np.float32, None, None, False, None, False, None, 0, False, False)
    assert issubclass(tefl.OutOfMemoryError, RuntimeError)
    assert f"{tefl.OutOfMemoryError.__module__}.{tefl.OutOfMemoryError.__name__}" == "tefl.OutOfMemoryError"


def test_grouped_gemm_in_te_convention():
    # Three experts, TE's "TN": weights A[g] [n, k], inputs B[g] [m_g, k] -> D[g] = B[g]·A[g]ᵀ,
    # one expert with no tokens; with a bias, then into one [sum m, n] output.
    k, n, ms = 24, 17, [5, 0, 9]
    A = [rand(n, k) for _ in ms]
    B = [rand(m, k) for m in ms]
    bias = [rand(n) for _ in ms]
    D = [np.full((m, n), np.nan, np.float32) for m in ms]
    got = tex.te_general_grouped_gemm(
        A, True, B, False, D, np.float32, ms, bias, None, False, [], False, [], 0, False, False, 0
    )
    assert got is bias
    for g in range(3):
        close(D[g], B[g].astype(np.float64) @ A[g].T.astype(np.float64) + bias[g], 1e-5)
    # No bias (TE passes empty tensors), transb: B[g] stored [k, m_g]; one output for all rows.
    Bt = [np.ascontiguousarray(b.T) for b in B]
    empty = [np.zeros(0, np.float32) for _ in ms]
    one = [np.full((sum(ms), n), np.nan, np.float32)]
    tex.te_general_grouped_gemm(A, True, Bt, True, one, np.float32, ms, empty, None, True, empty, False, [], 0, False, False, 0)
    want = np.concatenate([b.astype(np.float64) @ a.T.astype(np.float64) for a, b in zip(A, B)])
    close(one[0], want, 1e-5)
    # What tefl does not take, and what does not fit, named.
    call = lambda **kw: tex.te_general_grouped_gemm(
        *[kw.get(a, v) for a, v in zip(
            ["A", "transa", "B", "transb", "D", "D_type", "m_splits", "bias", "bias_type", "single_output", "pre_gelu_out", "grad", "workspace", "workspaceSize", "accumulate", "use_split_accumulator", "math_sm_count"],
            [A, True, B, False, D, np.float32, ms, [], None, False, [], False, [], 0, False, False, 0],
        )]
    )
    with pytest.raises(NotImplementedError, match="accumulate"):
        call(accumulate=True)
    with pytest.raises(NotImplementedError, match="pre_gelu_out"):
        call(pre_gelu_out=[np.zeros((m, n), np.float32) for m in ms])
    with pytest.raises(NotImplementedError, match="bias"):
        call(bias=bias, grad=True)
    with pytest.raises(ValueError, match="m_splits"):
        call(m_splits=[5, 1, 8])
    with pytest.raises(TypeError, match="m_splits"):
        call(m_splits=[5, "0", 9])
    with pytest.raises(ValueError, match="'D' has shape"):
        call(D=[np.zeros((sum(ms), n + 1), np.float32)], single_output=True)
    with pytest.raises(ValueError, match="'D'"):
        call(D=D[:2])
    with pytest.raises(TypeError, match="'D'"):
        call(D=None)
    with pytest.raises(ValueError, match="'A'"):
        call(A=A[:2])
    with pytest.raises(ValueError, match="'A'|'B'"):
        call(A=[rand(n, k + 1) for _ in ms])


def test_grouped_gemm_on_fp8_operands():
    k, n, ms = 32, 16, [3, 7]
    A = [quantized(rand(n, k), "f8e4m3") for _ in ms]
    B = [quantized(rand(m, k), "f8e4m3") for m in ms]
    D = [np.zeros((m, n), np.float32) for m in ms]
    tex.te_general_grouped_gemm(A, True, B, False, D, np.float32, ms, [], None, False, [], False, [], 0, False, True, 0)
    for g in range(2):
        close(D[g], fp8_values(B[g]) @ fp8_values(A[g]).T, 1e-5)
    with pytest.raises(TypeError, match="FP8"):
        tex.te_general_grouped_gemm(A, True, [rand(m, k) for m in ms], False, D, np.float32, ms, [], None, False, [], False, [], 0, False, False, 0)


class _Columnwise(tex.Float8Quantizer):
    """A quantizer that also asks for the transposed codes (TE's columnwise usage)."""

    columnwise_usage = True


@pytest.mark.parametrize("fmt", ["f8e4m3", "f8e5m2"])
def test_bgrad_quantize_and_the_te_forms_of_quantize_and_dequantize(fmt):
    x = rand(13, 40, lo=-3, hi=3)
    x64 = x.astype(np.float64)
    scale = np.array([RNG.uniform(1.0, 8.0)], np.float32)
    amax = np.zeros(1, np.float32)
    dbias, q = tex.bgrad_quantize(x, _Columnwise(scale, amax, fmt))
    close(dbias, x64.sum(0), 1e-5)
    close(amax, [np.abs(x64).max()])
    assert isinstance(q, tex.Float8Tensor) and q.fp8_dtype == fmt and tuple(q.shape) == (13, 40)
    got = fp8_values(q)
    assert np.all(np.abs(got - x64) <= FP8_STEP[fmt] / 2 * np.abs(x64) + 2.0**-9 / scale[0]), np.abs(got - x64).max()
    assert np.array_equal(np.asarray(q.transpose), np.asarray(q.data).T)
    # TE's quantize(tensor, quantizer) -> Float8Tensor, and dequantize(Float8Tensor, otype).
    amax2 = np.zeros(1, np.float32)
    q2 = tex.quantize(x, tex.Float8Quantizer(scale, amax2, fmt))
    assert isinstance(q2, tex.Float8Tensor) and q2.transpose is None
    assert np.array_equal(np.asarray(q2.data), np.asarray(q.data))
    close(amax2, [np.abs(x64).max()])
    close(tex.dequantize(q2, np.float32), got, 1e-7)
    with pytest.raises(NotImplementedError, match="output"):
        tex.quantize(x, tex.Float8Quantizer(scale, amax2, fmt), np.zeros_like(x))
    with pytest.raises(TypeError, match="quantizer"):
        tex.bgrad_quantize(x, None)
    with pytest.raises(ValueError, match="'x' \\(TE's 'input'\\)|input"):
        tex.bgrad_quantize(rand(40), tex.Float8Quantizer(scale, amax2, fmt))


def test_compute_amax_sets_the_amax_in_place():
    x = rand(9, 31, lo=-5, hi=5)
    amax = np.array([1e6], np.float32)  # overwritten, not raised
    assert tex.compute_amax(x, amax) is None
    close(amax, [np.abs(x.astype(np.float64)).max()], 1e-7)
    x[3, 4] = np.nan
    tex.compute_amax(x, amax)
    assert np.isnan(amax[0])
    with pytest.raises(ValueError, match="'amax'"):
        tex.compute_amax(x, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="'amax'"):
        tex.compute_amax(x, np.zeros(1, np.float64))


def test_large_cpu_buffers_are_kept_for_reuse_and_can_be_released():
    # A 600x700 f32 product (1.7 MB): its buffer is kept when freed and the next call of the
    # same shape reuses it; the results stay right, and release_host_cache gives it back.
    tefl.release_host_cache()
    assert tefl.host_cache_bytes() == 0
    for _ in range(2):
        A, B = rand(700, 300), rand(600, 300)
        D = np.zeros((600, 700), np.float32)
        tex.generic_gemm(A, True, B, False, D, None, np.float32, None, None, False, None, False, None, 0, False, False)
        close(D, B.astype(np.float64) @ A.T.astype(np.float64), 1e-5)
        kept = tefl.host_cache_bytes()
        assert kept >= 600 * 700 * 4, kept
    # The cache's bytes and any per-thread GEMM packing scratch; nothing is left after it.
    assert tefl.release_host_cache() >= kept
    assert tefl.host_cache_bytes() == 0
    assert tefl.release_host_cache() == 0
    # A zero budget keeps nothing; the default (512 MiB, TEFL_HOST_CACHE_MB unset) comes back.
    default = tefl.host_cache_limit()
    assert default == 512 << 20
    try:
        assert tefl.set_host_cache_limit(0) == 0
        D = np.zeros((600, 700), np.float32)
        tex.generic_gemm(A, True, B, False, D, None, np.float32, None, None, False, None, False, None, 0, False, False)
        assert tefl.host_cache_bytes() == 0
        with pytest.raises(OverflowError):
            tefl.set_host_cache_limit(-1)
    finally:
        tefl.set_host_cache_limit(default)
    assert tefl.host_cache_limit() == default
