"""Where `train_block.py`'s step time goes: each op of its block timed alone, forward and
backward, `tefl.torch` against `torch.nn` / `torch.nn.functional` on the same inputs (median
of 7 runs of N calls; CUDA runs synchronise around each run only).

    python examples/python/op_times.py [--device cuda|cpu] [--dtype bf16|f32] [--calls N]

The shapes are train_block's defaults (batch 4, seq 256, hidden 512, 8 heads, ffn 1408).
"""

import argparse
import os

# On the CPU, torch's OpenMP threads spin for a while after each torch op (libgomp's default
# wait policy) and keep the cores from tefl's threads; "PASSIVE" lets them sleep instead. It
# must be set before torch starts OpenMP, so here, before torch is imported; a value already
# in the environment is kept. (It changes nothing for CUDA tensors.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import statistics
import time

import torch
import torch.nn.functional as F

import tefl.torch as tt


def per_call(fn, calls, sync, runs=7):
    for _ in range(3):
        fn()
    sync()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(out)


def fwd_bwd(f, inputs):
    """(forward only, forward + backward) callables for f on fresh leaf copies of inputs."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]

    def fwd():
        with torch.no_grad():
            f(*leaves)

    def both():
        y = f(*leaves)
        y.backward(torch.ones_like(y))

    return fwd, both


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=["bf16", "f32"])
    p.add_argument("--calls", type=int, default=None)
    a = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[a.dtype or ("bf16" if a.device == "cuda" else "f32")]
    calls = a.calls or (50 if a.device == "cuda" else 5)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    kw = dict(device=a.device, dtype=dtype)
    b, s, hid, heads, ffn = 4, 256, 512, 8, 1408
    d = hid // heads
    torch.manual_seed(0)
    x = torch.randn(b * s, hid, **kw)
    g = torch.ones(hid, **kw)
    wq = torch.randn(3 * hid, hid, **kw) / hid**0.5
    w1 = torch.randn(2 * ffn, hid, **kw) / hid**0.5
    w2 = torch.randn(hid, ffn, **kw) / ffn**0.5
    h2 = torch.randn(b * s, 2 * ffn, **kw)
    m = torch.randn(b * s, ffn, **kw)
    q, k, v = (torch.randn(b, s, heads, d, **kw) for _ in range(3))
    attn = tt.DotProductAttention(heads, causal=True)

    def sdpa(q, k, v):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2)

    def torch_swiglu(t):
        gate, up = t.chunk(2, dim=-1)
        return F.silu(gate) * up

    cases = [
        ("rmsnorm [1024, 512]", lambda t, w: tt.rmsnorm(t, w), lambda t, w: F.rms_norm(t, (hid,), w, 1e-5), [x, g]),
        ("linear qkv 512 -> 1536", tt.linear, F.linear, [x, wq]),
        ("linear fc1 512 -> 2816", tt.linear, F.linear, [x, w1]),
        ("linear fc2 1408 -> 512", tt.linear, F.linear, [m, w2]),
        ("swiglu [1024, 2816]", tt.swiglu, torch_swiglu, [h2]),
        ("attention causal b4 s256 h8 d64", attn, sdpa, [q, k, v]),
    ]
    policy = os.environ["OMP_WAIT_POLICY"]
    print(f"device {a.device}, {dtype}, {calls} calls a run; ms a call; OMP_WAIT_POLICY={policy}")
    print(f"{'op':<34} {'tefl fwd':>9} {'torch fwd':>10} {'tefl f+b':>9} {'torch f+b':>10}")
    totals = [0.0] * 4
    for name, ours, theirs, inputs in cases:
        row = []
        of, ob = fwd_bwd(ours, inputs)
        tf, tb = fwd_bwd(theirs, inputs)
        for fn in (of, tf, ob, tb):
            row.append(per_call(fn, calls, sync))
        totals = [t + r for t, r in zip(totals, row)]
        print(f"{name:<34} {row[0]:>9.3f} {row[1]:>10.3f} {row[2]:>9.3f} {row[3]:>10.3f}")
    print(f"{'sum':<34} {totals[0]:>9.3f} {totals[1]:>10.3f} {totals[2]:>9.3f} {totals[3]:>10.3f}")


if __name__ == "__main__":
    main()
