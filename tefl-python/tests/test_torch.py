"""tefl.tex and tefl.torch on torch tensors (CUDA when there is a GPU, else the CPU) against
torch's own ops; skipped where torch is not installed (the CI machine). On the GPU machine:
every tex op matches torch on CUDA tensors, tefl runs on the caller's current stream, and the
TEX README's "Testing Your Backend" snippet runs (with the backend name filled in)."""

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import tefl.tex as tex  # noqa: E402
import tefl.torch as tt  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]
TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def close(got, want, dtype):
    got, want = got.float(), want.float()
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.numel() == 0:
        return
    err = (got - want).abs().max().item() / max(1.0, want.abs().max().item())
    assert err < TOL[dtype], f"max relative error {err:.3e}"


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEVICE, dtype=torch.float32) * scale).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensors_stay_where_they_are(dtype):
    x = randn(8, 64, dtype=dtype)
    y = tex.gelu(x, None)
    assert isinstance(y, torch.Tensor) and y.device == x.device and y.dtype == dtype
    close(y, F.gelu(x.float(), approximate="tanh"), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_match_torch(dtype):
    x, w, b = randn(64, 1024, dtype=dtype), randn(1024, dtype=dtype), randn(1024, dtype=dtype)
    y, _, rs = tex.rmsnorm_fwd(x, w, 1e-5, None, None, dtype, 0, False)
    close(y, F.rms_norm(x.float(), (1024,), w.float(), 1e-5), dtype)
    y, mu, rs = tex.layernorm_fwd(x, w, b, 1e-5, None, None, dtype, 0, False)
    close(y, F.layer_norm(x.float(), (1024,), w.float(), b.float(), 1e-5), dtype)
    # Backward through tefl.torch against autograd of torch's formula.
    xr = x.float().clone().requires_grad_()
    wr = w.float().clone().requires_grad_()
    F.rms_norm(xr, (1024,), wr, 1e-5).square().sum().backward()
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    tt.rmsnorm(xt, wt).float().square().sum().backward()
    close(xt.grad, xr.grad, dtype)
    close(wt.grad, wr.grad, dtype)


def grads_match(ours, theirs, inputs, dtype):
    """Runs both modules on clones of ``inputs`` (and a fixed upstream gradient), then checks
    the outputs, the input gradients and every parameter's gradient (by name) agree."""
    got_in = [t.clone().requires_grad_() for t in inputs]
    want_in = [t.clone().requires_grad_() for t in inputs]
    got, want = ours(*got_in), theirs(*want_in)
    close(got, want, dtype)
    dy = randn(*want.shape, dtype=dtype)
    got.backward(dy)
    want.backward(dy)
    for g, w in zip(got_in, want_in):
        close(g.grad, w.grad, dtype)
    params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        close(p.grad, params[name].grad, dtype)


def norm_pairs(hidden, dtype):
    """(tefl.torch, torch.nn) RMSNorm and LayerNorm pairs holding the same random weights."""
    kw = dict(device=DEVICE, dtype=dtype)
    rms = tt.RMSNorm(hidden, **kw), torch.nn.RMSNorm(hidden, eps=1e-5, **kw)
    ln = tt.LayerNorm(hidden, **kw), torch.nn.LayerNorm(hidden, eps=1e-5, **kw)
    for ours, theirs in (rms, ln):
        with torch.no_grad():
            for p in ours.parameters():
                p.copy_(randn(hidden, dtype=dtype))
        theirs.load_state_dict(ours.state_dict())
    return [rms, ln]


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_layers_match_torch_nn(dtype):
    """Every tefl.torch layer, forward and backward, against the torch.nn layer (or torch's
    formula) holding the same weights."""
    kw = dict(device=DEVICE, dtype=dtype)
    x = randn(3, 17, 96, dtype=dtype)
    for bias in (True, False):
        ours = tt.Linear(96, 80, bias=bias, **kw)
        theirs = torch.nn.Linear(96, 80, bias=bias, **kw)
        theirs.load_state_dict(ours.state_dict())
        grads_match(ours, theirs, [x], dtype)
    for pair in norm_pairs(96, dtype):
        grads_match(*pair, [x], dtype)

    class TorchSwiGLU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(96, 2 * 40, bias=True, **kw), torch.nn.Linear(40, 96, bias=True, **kw)

        def forward(self, x):
            gate, up = self.fc1(x).chunk(2, dim=-1)
            return self.fc2(F.silu(gate) * up)

    ours, theirs = tt.SwiGLUMLP(96, 40, bias=True, **kw), TorchSwiGLU()
    theirs.load_state_dict(ours.state_dict())
    grads_match(ours, theirs, [x], dtype)

    for causal in (True, False):

        class Sdpa(torch.nn.Module):
            def forward(self, q, k, v):
                o = F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True
                )
                return o.transpose(1, 2)

        q, k, v = randn(2, 33, 4, 64, dtype=dtype), randn(2, 33, 2, 64, dtype=dtype), randn(2, 33, 2, 64, dtype=dtype)
        grads_match(tt.DotProductAttention(4, causal=causal), Sdpa(), [q, k, v], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_layers_take_views_that_are_not_contiguous_rows(dtype):
    """2-D and 3-D inputs that are transposed views (the layers make rows of them), forward and
    backward, against the torch.nn layers."""
    kw = dict(device=DEVICE, dtype=dtype)
    for x in (randn(96, 40, dtype=dtype).t(), randn(96, 5, 7, dtype=dtype).permute(2, 1, 0)):
        assert not x.is_contiguous()
        for pair in norm_pairs(96, dtype):
            grads_match(*pair, [x], dtype)
        ours, theirs = tt.Linear(96, 24, **kw), torch.nn.Linear(96, 24, **kw)
        theirs.load_state_dict(ours.state_dict())
        grads_match(ours, theirs, [x], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_layers_take_a_batch_without_tokens(dtype):
    """An expert that drew no tokens: every layer returns an empty output, an empty input
    gradient and zero weight gradients, as torch.nn does."""
    kw = dict(device=DEVICE, dtype=dtype)
    layers = [pair[0] for pair in norm_pairs(96, dtype)]
    layers += [tt.Linear(96, 24, **kw), tt.SwiGLUMLP(96, 40, bias=True, **kw)]
    for layer in layers:
        for shape in ((0, 96), (2, 0, 96)):
            x = randn(*shape, dtype=dtype).requires_grad_()
            y = layer(x)
            assert y.shape[:-1] == shape[:-1] and y.dtype == dtype
            y.backward(torch.zeros_like(y))
            assert x.grad.shape == shape
            for name, p in layer.named_parameters():
                assert p.grad is not None and p.grad.shape == p.shape, name
                assert torch.count_nonzero(p.grad).item() == 0, f"{type(layer).__name__}.{name}"
            layer.zero_grad()


@pytest.mark.parametrize("dtype", DTYPES)
def test_generic_gemm_matches_torch(dtype):
    A, B = randn(512, 256, dtype=dtype), randn(128, 256, dtype=dtype)
    D = torch.empty(128, 512, device=DEVICE, dtype=dtype)
    tex.generic_gemm(A, True, B, False, D, None, dtype, None, None, False, None, False, None, 0, False, False)
    close(D, B.float() @ A.float().T, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_sdpa(dtype, causal):
    if not CUDA and dtype != torch.float32:
        pytest.skip("CPU: f32 only")
    b, s, h, d = 2, 200, 4, 64
    q, k, v, do = (randn(b, s, h, d, dtype=dtype) for _ in range(4))
    mask = "causal" if causal else "no_mask"
    o, lse, rng = tex.fused_attn_fwd(s, s, True, d**-0.5, 0.0, True, "bshd_bshd_bshd", "no_bias", mask, None, None, None, q, k, v)
    qr, kr, vr = (t.float().transpose(1, 2).requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
    close(o, want.transpose(1, 2), dtype)
    want.backward(do.float().transpose(1, 2))
    dq, dk, dv, _ = tex.fused_attn_bwd(
        s, s, d**-0.5, 0.0, True, "bshd_bshd_bshd", "no_bias", mask, None, False, None, None, q, k, v, o, do, None, None, [lse, rng]
    )
    close(dq, qr.grad.transpose(1, 2), dtype)
    close(dk, kr.grad.transpose(1, 2), dtype)
    close(dv, vr.grad.transpose(1, 2), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_thd_attention_with_max_seqlen_matches_sdpa(dtype):
    # Sequences of 100, 37 and 150 tokens packed as thd, then 13 rows past the last one, with
    # TE's max_seqlen bounds (on CUDA the lengths stay on the GPU: tefl clamps them there and
    # fills the rows past the sequences there). Each sequence against SDPA on it alone.
    if not CUDA and dtype != torch.float32:
        pytest.skip("CPU: f32 only")
    lens, h, d = [100, 37, 150], 4, 64
    total = sum(lens) + 13
    q, k, v, do = (randn(total, h, d, dtype=dtype) for _ in range(4))
    cu = torch.tensor([0, 100, 137, 287], dtype=torch.int32, device=DEVICE)
    fwd = (True, d**-0.5, 0.0, True, "thd_thd_thd", "no_bias", "padding_causal", None, cu, cu, q, k, v)
    o, lse, rng = tex.fused_attn_fwd(150, 150, *fwd)
    dq, dk, dv, _ = tex.fused_attn_bwd(
        150, 150, d**-0.5, 0.0, True, "thd_thd_thd", "no_bias", "padding_causal", None, False, cu, cu,
        q, k, v, o, do, None, None, [lse, rng],
    )
    lo = 0
    for n in lens:
        qr, kr, vr = (t[lo : lo + n].float().transpose(0, 1).requires_grad_() for t in (q, k, v))
        want = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
        close(o[lo : lo + n], want.transpose(0, 1), dtype)
        want.backward(do[lo : lo + n].float().transpose(0, 1))
        for got, ref in ((dq, qr), (dk, kr), (dv, vr)):
            close(got[lo : lo + n], ref.grad.transpose(0, 1), dtype)
        lo += n
    # The rows past the sequences: zeros, and -inf in lse.
    for t in (o, dq, dk, dv):
        assert not t[lo:].float().abs().any()
    assert torch.isneginf(lse[:, lo:]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_activations_and_softmax_match_torch(dtype):
    x = randn(32, 256, dtype=dtype)
    close(tex.silu(x, None), F.silu(x.float()), dtype)
    close(tex.relu(x, None), F.relu(x.float()), dtype)
    a, g = x.float().chunk(2, -1)
    close(tex.swiglu(x, None), F.silu(a) * g, dtype)
    s = randn(2, 4, 64, 64, dtype=dtype)
    close(tex.scaled_softmax_forward(s, 0.5), torch.softmax(0.5 * s.float(), -1), dtype)
    close(
        tex.scaled_upper_triang_masked_softmax_forward(s.reshape(8, 64, 64), 1.0),
        torch.softmax(s.float().reshape(8, 64, 64).masked_fill(torch.ones(64, 64, device=DEVICE).triu(1).bool(), -math.inf), -1),
        dtype,
    )


def test_adam_updates_torch_parameters_in_place():
    p = randn(1000)
    g = randn(1000)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    ref = p.clone().requires_grad_()
    opt = torch.optim.AdamW([ref], lr=1e-3, weight_decay=0.01)
    ref.grad = g.clone()
    opt.step()
    ptr = p.data_ptr()
    noop = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    tex.multi_tensor_adam(2048 * 32, noop, [[g], [p], [m], [v]], 1e-3, 0.9, 0.999, 1e-8, 1, 1, True, 0.01)
    assert p.data_ptr() == ptr
    close(p, ref.detach(), torch.float32)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_tefl_runs_on_the_callers_stream():
    # A producer kernel on a side stream, tefl's op queued right after it on the same stream:
    # if tefl ran on another stream it could read x before the producer wrote it.
    side = torch.cuda.Stream()
    big = randn(4096, 4096)
    torch.cuda.synchronize()
    results = []
    with torch.cuda.stream(side):
        for i in range(5):
            x = big
            for _ in range(8):
                x = (x @ big) * 1e-3  # a long producer chain
            y = tex.relu(x, None)
            results.append((x, y))
    side.synchronize()
    for x, y in results:
        assert torch.equal(y, torch.relu(x))


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_a_training_step_through_tefl_never_waits_for_the_gpu():
    """Nothing on the way from tefl.torch to tefl's kernels synchronises with the GPU: torch's
    sync debug mode raises on any synchronising torch call (a device tensor built from Python
    values, a device value read back), forward and backward."""
    kw = dict(device=DEVICE, dtype=torch.bfloat16)
    norm, proj, mlp = tt.RMSNorm(256, **kw), tt.Linear(256, 256, **kw), tt.SwiGLUMLP(256, 128, **kw)
    attn = tt.DotProductAttention(4, causal=True)
    x = randn(2, 64, 256, dtype=torch.bfloat16).requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        h = norm(x)
        q = h.reshape(2, 64, 4, 64)
        y = mlp(proj(attn(q, q, q).reshape(2, 64, 256)))
        y.float().square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_thd_attention_with_max_seqlen_does_not_wait_for_the_gpu():
    """With TE's max_seqlen bounds a thd call leaves cu_seqlens on the GPU: queued behind a
    long kernel (torch.cuda._sleep), the call returns long before the kernel ends; without the
    bounds tefl reads the lengths back, which waits for it (the test's own control)."""
    import time

    h, d = 4, 64
    q = randn(300, h, d, dtype=torch.bfloat16)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32, device=DEVICE)

    def call(max_seqlen):
        return tex.fused_attn_fwd(
            max_seqlen, max_seqlen, True, d**-0.5, 0.0, True, "thd_thd_thd", "no_bias", "padding_causal", None,
            cu, cu, q, q, q,
        )

    def host_seconds(max_seqlen):
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000_000)  # about half a second of GPU time, queued
        t0 = time.perf_counter()
        call(max_seqlen)
        dt = time.perf_counter() - t0
        torch.cuda.synchronize()
        return dt

    call(200), call(None)  # compiled and warm
    assert host_seconds(200) < 0.1
    assert host_seconds(None) > 0.2


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_the_tex_readme_snippet_runs():
    # "Testing Your Backend", as written, with "your_vendor" filled in by tefl's CUDA backend.
    tex.set_backend("nvidia")
    x = torch.randn(32, 1024, device="cuda", dtype=torch.bfloat16)
    weight = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    output, _, rsigma = tex.rmsnorm_fwd(x, weight, 1e-5, None, None, torch.bfloat16, 0, False)
    print(f"RMSNorm output shape: {output.shape}")
    A = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)
    D = torch.empty(1024, 2048, device="cuda", dtype=torch.bfloat16)
    workspace = torch.empty(1024 * 1024, device="cuda", dtype=torch.uint8)
    result = tex.generic_gemm(
        A, False, B, False, D, None, torch.bfloat16, None, None, False, None, False, workspace, 1024 * 1024, False, False
    )
    print(f"GEMM output shape: {D.shape}")
    assert output.shape == (32, 1024) and D.shape == (1024, 2048)
    close(D, A.float() @ B.float(), torch.bfloat16)


def _host_vs_cuda(fn, *arrays, tol=1e-4):
    """`fn` on numpy arrays (tefl's host reference, itself checked against numpy formulas in
    test_tex.py) and on the same values as CUDA torch tensors: the results must agree."""
    import numpy as np

    want = fn(*arrays)
    got = fn(*[torch.from_numpy(a).to(DEVICE) if isinstance(a, np.ndarray) else a for a in arrays])
    want = want if isinstance(want, (tuple, list)) else [want]
    got = got if isinstance(got, (tuple, list)) else [got]
    for w, g in zip(want, got):
        if w is None:
            assert g is None
            continue
        g = g.cpu().float().numpy() if isinstance(g, torch.Tensor) else np.asarray(g)
        w = np.asarray(w, dtype=np.float64)
        scale = max(1.0, float(np.abs(w).max(initial=0.0)))
        assert np.abs(g.astype(np.float64) - w).max(initial=0.0) / scale < tol


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_every_other_tex_op_on_cuda_matches_the_host():
    import numpy as np

    rng = np.random.default_rng(3)
    r = lambda *s: rng.uniform(-2, 2, size=s).astype(np.float32)  # noqa: E731
    x, g, b, dy, add = r(6, 40), r(40), r(40), r(6, 40), r(6, 40)
    _, _, rs = tex.rmsnorm_fwd(x, g, 1e-5, None, None, np.float32, 0, False)
    _host_vs_cuda(lambda x, g, dy, rs: tex.rmsnorm_bwd(dy, x, rs, g, 0, False), x, g, dy, rs)
    _host_vs_cuda(lambda x, g, dy, add, rs: tex.rmsnorm_bwd_add(dy, x, add, rs, g, 0, False), x, g, dy, add, rs)
    _, mu, rs2 = tex.layernorm_fwd(x, g, b, 1e-5, None, None, np.float32, 0, False)
    _host_vs_cuda(lambda dy, x, mu, rs, g: tex.layernorm_bwd(dy, x, mu, rs, g, 0, False), dy, x, mu, rs2, g)
    for name in ["gelu", "qgelu", "relu", "srelu", "silu"]:
        _host_vs_cuda(lambda gr, x: getattr(tex, "d" + name)(gr, x, None), dy, x)
    for name in ["geglu", "qgeglu", "reglu", "sreglu", "swiglu"]:
        _host_vs_cuda(lambda x: getattr(tex, name)(x, None), x)
        _host_vs_cuda(lambda gr, x: getattr(tex, "d" + name)(gr, x, None), r(6, 20), x)
    for name in ["dbias_dgelu", "dbias_dsilu", "dbias_drelu", "dbias_dqgelu", "dbias_dsrelu"]:
        _host_vs_cuda(lambda gr, x: getattr(tex, name)(gr, x, None), dy, x)
    s4 = r(2, 3, 8, 8)
    y = tex.scaled_softmax_forward(s4, 0.5)
    mask = (rng.uniform(size=(2, 1, 8, 8)) < 0.3).astype(np.uint8)
    _host_vs_cuda(lambda s, m: tex.scaled_masked_softmax_forward(s, m, 0.7), s4, mask)
    _host_vs_cuda(lambda d, y: tex.scaled_masked_softmax_backward(d, y, 0.5), r(2, 3, 8, 8), y)
    t3 = r(6, 8, 8)
    yt = tex.scaled_upper_triang_masked_softmax_forward(t3, 1.0)
    _host_vs_cuda(lambda d, y: tex.scaled_upper_triang_masked_softmax_backward(d, y, 1.0), r(6, 8, 8), yt)
    _host_vs_cuda(lambda s: tex.scaled_aligned_causal_masked_softmax_forward(s, 1.0), s4)
    ya = tex.scaled_aligned_causal_masked_softmax_forward(s4, 1.0)
    _host_vs_cuda(lambda d, y: tex.scaled_aligned_causal_masked_softmax_backward(d, y, 1.0), r(2, 3, 8, 8), ya)
    xr, fr = r(9, 2, 3, 16), r(9, 1, 1, 16)
    for fmt in ["sbhd"]:
        _host_vs_cuda(lambda x, f: tex.fused_rope_forward(x, f, None, fmt, False, None, 1, 0), xr, fr)
        _host_vs_cuda(lambda x, f: tex.fused_rope_forward(x, f, None, fmt, True, None, 1, 0), xr, fr)
        _host_vs_cuda(lambda x, f: tex.fused_rope_backward(x, f, None, fmt, False, None, 1, 0), xr, fr)
    _host_vs_cuda(lambda x: tex.dropout_fwd(x, 0.3, 5, 7), r(64, 64))
    q, _, _, _ = tex.quantize(x, np.array([4.0], np.float32), "f8e4m3", False)
    _host_vs_cuda(lambda x, s: tex.quantize(x, s, "f8e5m2", True)[2:], x, np.array([4.0], np.float32))

    def l2(a, b):
        noop = a.new_zeros(1).int() if isinstance(a, torch.Tensor) else np.zeros(1, np.int32)
        return tex.multi_tensor_l2norm(2048, noop, [[a, b]], True)

    _host_vs_cuda(l2, r(100), r(7, 3))

    def scale_then_sgd(a, gr):
        noop = a.new_zeros(1).int() if isinstance(a, torch.Tensor) else np.zeros(1, np.int32)
        dst = a * 0
        tex.multi_tensor_scale(2048, noop, [[a], [dst]], 0.25)
        p, mom = a * 1, a * 0
        tex.multi_tensor_sgd(2048, noop, [[gr], [p], [mom]], 0.01, 0.9, 0.0, 0.1, True, True, False, 1.0)
        return dst, p, mom

    _host_vs_cuda(scale_then_sgd, r(50), r(50))


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_gemm_matches_torch(dtype):
    # TE's "TN" over three experts (one without tokens): D[g] = B[g]·A[g]ᵀ, written in place.
    k, n, ms = 256, 128, [64, 0, 192]
    A = [randn(n, k, dtype=dtype) for _ in ms]
    B = [randn(m, k, dtype=dtype) for m in ms]
    D = [torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype) for m in ms]
    bias = [randn(n, dtype=dtype) for _ in ms]
    got = tex.te_general_grouped_gemm(A, True, B, False, D, dtype, ms, bias, None, False, [], False, [], 0, False, False, 0)
    assert got is bias
    for a, b, d, c in zip(A, B, D, bias):
        close(d, b.float() @ a.float().T + c.float(), dtype)
    one = [torch.full((sum(ms), n), float("nan"), device=DEVICE, dtype=dtype)]
    tex.te_general_grouped_gemm(A, True, B, False, one, dtype, ms, [], None, True, [], False, [], 0, False, False, 0)
    close(one[0], torch.cat([b.float() @ a.float().T for a, b in zip(A, B)]), dtype)


@pytest.mark.parametrize("fb", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_gemms_take_torch_float8_tensors(fb):
    # tefl's FP8 codes come back as torch float8 tensors and go back in as they are (DLPack's
    # float8 codes): TE's "TN" D = B·Aᵀ on them against torch's product of the same values.
    def quantized(x, fmt):
        scale = torch.tensor([float(torch.empty(()).uniform_(1.0, 8.0))], device=DEVICE)
        q = tex.quantize(x, tex.Float8Quantizer(scale, torch.zeros(1, device=DEVICE), fmt))
        assert q.data.dtype == fmt and q.data.device == x.device
        return q

    A, B = quantized(randn(96, 64), torch.float8_e4m3fn), quantized(randn(40, 64), fb)
    value = lambda q: q.data.float() * q.scale_inv
    want = value(B) @ value(A).T
    d = tex.generic_gemm(A, True, B, False, None, None, torch.bfloat16, None, None, False, None, False, None, 0, False, True)[0]
    assert d.dtype == torch.bfloat16
    close(d, want, torch.bfloat16)
    if fb == torch.float8_e4m3fn:
        # torch's own FP8 GEMM on the same codes (it takes B row-major, A column-major).
        ref = torch._scaled_mm(B.data, A.data.T, scale_a=B.scale_inv, scale_b=A.scale_inv, out_dtype=torch.float32)
        close(d, ref, torch.bfloat16)
    # The grouped GEMM on Float8Tensor lists of torch float8 codes.
    ms = [16, 24]
    As = [quantized(randn(32, 64), torch.float8_e4m3fn) for _ in ms]
    Bs = [quantized(randn(m, 64), fb) for m in ms]
    D = [torch.empty(m, 32, device=DEVICE, dtype=torch.float32) for m in ms]
    tex.te_general_grouped_gemm(As, True, Bs, False, D, torch.float32, ms, [], None, False, [], False, [], 0, False, True, 0)
    for a, b, d in zip(As, Bs, D):
        close(d, value(b) @ value(a).T, torch.float32)


def test_bgrad_quantize_and_compute_amax_match_torch():
    x = randn(64, 96, scale=3.0)
    scale = torch.tensor([4.0], device=DEVICE)
    amax = torch.zeros(1, device=DEVICE)
    dbias, q = tex.bgrad_quantize(x, tex.Float8Quantizer(scale, amax, torch.float8_e4m3fn))
    close(dbias, x.sum(0), torch.float32)
    assert q.data.dtype == torch.float8_e4m3fn and q.data.device == x.device
    # Within one e4m3 step of torch's own cast of x·scale (inside e4m3's range).
    got, want = q.data.float(), (x * scale).to(torch.float8_e4m3fn).float()
    assert bool(((got - want).abs() <= want.abs() * 2.0**-3 + 2.0**-9).all()), (got - want).abs().max()
    assert amax.item() == x.abs().max().item()
    assert torch.equal(tex.dequantize(q, torch.float32), got / 4.0)
    amax2 = torch.full((1,), 1e6, device=DEVICE)
    tex.compute_amax(x, amax2)
    assert amax2.item() == x.abs().max().item()
