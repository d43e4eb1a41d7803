"""Prints what torch.compile makes of the bench's peers: each case's time (the bench's way: an
L2 flush, then one call between CUDA events; the median of 20), then every Triton kernel in the
inductor cache with its chosen config (`.best_config`) and the global loads, stores, cache
policies and barriers of its PTX.

On the GPU machine: `TORCHINDUCTOR_CACHE_DIR=/tmp/ind python3 scripts/triton_dump.py
softmax_bwd` (cases: softmax_bwd, swiglu, rope, rmsnorm, layernorm; all when none is named). Use a fresh
cache directory, or kernels of earlier runs are printed too. The shapes and formulas are
bench_peers.py's."""
import glob
import os
import sys

import torch
import torch.nn.functional as F

bf = torch.bfloat16


def t(*s, dt=bf):
    return (torch.rand(*s, device="cuda", dtype=torch.float32) - 0.5).to(dt)


def cases():
    y, dy = torch.softmax(t(16384, 8192).float(), -1).to(bf), t(16384, 8192)

    def softmax_bwd():
        yf, dyf = y.float(), dy.float()
        return (0.125 * yf * (dyf - (dyf * yf).sum(-1, keepdim=True))).to(bf)

    xs = t(16384, 16384)
    s, b, h, d = 4096, 4, 32, 128
    xr, fr = t(s, b, h, d), t(s, 1, 1, d, dt=torch.float32)
    c, sn = fr.cos().to(bf), fr.sin().to(bf)
    xn, g = t(16384, 8192), t(8192)
    return {
        "softmax_bwd": softmax_bwd,
        "swiglu": lambda: (lambda u, v: F.silu(u) * v)(*xs.chunk(2, -1)),
        "rope": lambda: xr * c + torch.cat((-xr[..., d // 2 :], xr[..., : d // 2]), -1) * sn,
        "rmsnorm": lambda: F.rms_norm(xn, (8192,), g, 1e-5),
        "layernorm": lambda: F.layer_norm(xn, (8192,), g, g, 1e-5),
    }


def main():
    all_cases = cases()
    flush = torch.empty(256 * 2**20 // 4, device="cuda")
    for name in sys.argv[1:] or list(all_cases):
        torch._dynamo.reset()
        f = torch.compile(all_cases[name])
        for _ in range(3):
            f()
        ts = []
        for _ in range(20):
            flush.fill_(1.0)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            f()
            e1.record()
            torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1))
        ts.sort()
        print(f"== {name}: {ts[len(ts) // 2]:.4f} ms", flush=True)
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        print("set TORCHINDUCTOR_CACHE_DIR to print the kernels")
        return
    for p in sorted(glob.glob(cache + "/**/*.best_config", recursive=True)):
        print("=====", p)
        print(open(p).read())
    for p in sorted(glob.glob(cache + "/**/*.py", recursive=True)):
        src = open(p).read()
        i = src.find("@triton.jit")
        if i >= 0 and src.find("def triton_", i) >= 0:
            print("=====", p)
            print(src[max(0, i - 1200) : i + 6000])
    keep = ("ld.global", "st.global", "createpolicy", "bar.sync", ".maxntid")
    for p in sorted(glob.glob(cache + "/**/*.ptx", recursive=True)):
        print("===== PTX", p)
        print("\n".join(line for line in open(p).read().splitlines() if any(k in line for k in keep)))


if __name__ == "__main__":
    main()
