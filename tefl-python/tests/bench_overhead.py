"""The Python-side overhead of a cached tiny op call: ``tex.relu`` on a 16-element tensor,
against torch eager's ``torch.relu`` on the same tensor (or numpy's ``np.maximum`` without
torch). Prints microseconds per call (median of 7 runs of 2000 calls). With torch, also the
host time of a ``tefl.torch`` layer's forward with autograd recording (``tt.rmsnorm``,
``tt.linear`` on ``[8, 1024]`` bf16 rows, ``tt.DotProductAttention`` on a causal 128-token
sequence of 8 heads) against ``torch.nn.functional``'s.

    python tefl-python/tests/bench_overhead.py [--device cuda|cpu]
"""

import argparse
import statistics
import time

import tefl.tex as tex


def per_call(fn, n=2000, runs=7, sync=None):
    for _ in range(200):
        fn()
    if sync:
        sync()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if sync:
            sync()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default=None)
    a = p.parse_args()
    try:
        import torch

        device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
        x = torch.randn(16, device=device)
        sync = torch.cuda.synchronize if device == "cuda" else None
        peer_name, peer = "torch.relu", lambda: torch.relu(x)
    except ImportError:
        import numpy as np

        device, sync = "cpu", None
        x = np.random.randn(16).astype(np.float32)
        peer_name, peer = "np.maximum", lambda: np.maximum(x, 0)
    ours = per_call(lambda: tex.relu(x, None), sync=sync)
    theirs = per_call(peer, sync=sync)
    print(f"tiny op call on {device}: tefl tex.relu {ours:.1f} us, {peer_name} {theirs:.1f} us (ratio {ours / theirs:.2f})")
    if peer_name == "torch.relu":
        layers(device, sync)


def layers(device, sync):
    import torch
    import torch.nn.functional as F

    import tefl.torch as tt

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(8, 1024, device=device, dtype=dtype, requires_grad=True)
    w = torch.ones(1024, device=device, dtype=dtype, requires_grad=True)
    wl = torch.randn(1024, 1024, device=device, dtype=dtype, requires_grad=True)
    # Attention on [batch 1, seq 128, heads 8, head dim 64] (SDPA takes the heads-first view).
    q = torch.randn(1, 128, 8, 64, device=device, dtype=dtype, requires_grad=True)
    attn = tt.DotProductAttention(8, causal=True)
    qh = q.transpose(1, 2)
    for name, peer, ours, theirs in (
        ("rmsnorm", "rms_norm", lambda: tt.rmsnorm(x, w), lambda: F.rms_norm(x, (1024,), w, 1e-5)),
        ("linear", "linear", lambda: tt.linear(x, wl), lambda: F.linear(x, wl)),
        (
            "DotProductAttention",
            "scaled_dot_product_attention",
            lambda: attn(q, q, q),
            lambda: F.scaled_dot_product_attention(qh, qh, qh, is_causal=True),
        ),
    ):
        a, b = per_call(ours, sync=sync), per_call(theirs, sync=sync)
        print(f"layer forward with autograd on {device}: tt.{name} {a:.1f} us, F.{peer} {b:.1f} us (ratio {a / b:.2f})")


if __name__ == "__main__":
    import logging

    logging.disable(logging.CRITICAL)
    main()
