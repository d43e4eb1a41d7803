"""The RMSNorm forward timed the peers' way for every side, tefl included: tefl through its
Python package (`tefl.tex.rmsnorm_fwd` on torch's CUDA tensors, on torch's stream), FlagGems
(`flag_gems.use_gems()` around `F.rms_norm`) and torch.compile, all in this one process with
bench_peers.py's loop (a 256 MiB flush, then CUDA events around one call, every repetition
queued before one wait; the median of REPS), ROUNDS rounds in turns. Where bench's own table
puts tefl behind FlagGems but this loop does not, the difference is in how bench times tefl's
side (its process, its flush, its events), not in the kernel.

    PYTHONPATH=SITE python3 rmsnorm_torch_loop.py [ROWSxCOLS ...]

SITE holds the tefl wheel built with the nvidia feature (`cd tefl-python && maturin build
--release --features nvidia`) and, for FlagGems, the bench's peer wheels. Environment: ROUNDS
(3), REPS (20), WARMUP seconds (0.5), FLUSH (zero: torch's `zero_()`; memset: the driver's
`cuMemsetD8Async` on torch's stream, as bench flushes tefl's side).
"""

import ctypes
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import tefl.tex as tex

dev = "cuda"
ROUNDS = int(os.environ.get("ROUNDS", "3"))
REPS = int(os.environ.get("REPS", "20"))
WARMUP = float(os.environ.get("WARMUP", "0.5"))
flush = torch.empty(256 << 20, dtype=torch.int8, device=dev)

if os.environ.get("FLUSH", "zero") == "memset":
    _memset = ctypes.CDLL("libcuda.so.1").cuMemsetD8Async
    _memset.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
    _memset.restype = ctypes.c_int

    def flush_l2():
        status = _memset(flush.data_ptr(), 0, flush.numel(), torch.cuda.current_stream().cuda_stream)
        if status != 0:
            raise RuntimeError(f"cuMemsetD8Async returned CUresult {status}")
else:
    flush_l2 = flush.zero_


def timed(f):
    """bench_peers.py's `timed`: one call, WARMUP seconds of calls, then REPS flushed calls
    between events, all queued before one wait; the median in ms."""
    f()
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < WARMUP:
        f()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPS)]
    for a, b in ev:
        flush_l2()
        a.record()
        f()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def sides(rows, cols):
    x = (torch.rand(rows, cols, device=dev) - 0.5).to(torch.bfloat16)
    g = (torch.rand(cols, device=dev) - 0.5).to(torch.bfloat16)
    out = [("tefl", lambda: tex.rmsnorm_fwd(x, g, 1e-5))]
    ref = F.rms_norm(x.float(), (cols,), g.float(), 1e-5)
    got = out[0][1]()[0].float()
    err = (got - ref).abs().max().item()
    if not err < 0.05:
        sys.exit(f"tefl's output is off by {err} at {rows}x{cols}")
    try:
        import flag_gems

        def gems():
            with flag_gems.use_gems():
                return F.rms_norm(x, (cols,), g, 1e-5)

        out.append(("flaggems", gems))
    except Exception as e:
        print(f"FlagGems not importable ({type(e).__name__}: {e})", file=sys.stderr)
    compiled = torch.compile(lambda: F.rms_norm(x, (cols,), g, 1e-5))
    out.append(("compile", compiled))
    return out


def main():
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1:] or ["8192x4096", "16384x8192"])]
    print(torch.cuda.get_device_name(), f"flush {os.environ.get('FLUSH', 'zero')}, {REPS} reps, {ROUNDS} rounds")
    for rows, cols in shapes:
        fns = sides(rows, cols)
        times = {name: [] for name, _ in fns}
        for _ in range(ROUNDS):
            for name, f in fns:
                times[name].append(timed(f))
        best = {name: min(ts) for name, ts in times.items()}
        for name, ts in times.items():
            print(
                f"{rows}x{cols} {name:9s} " + " / ".join(f"{t:.4f}" for t in ts) + f" ms; best {best[name]:.4f}, "
                f"tefl's speed against it {best[name] / best['tefl']:.3f}x"
            )


if __name__ == "__main__":
    main()
