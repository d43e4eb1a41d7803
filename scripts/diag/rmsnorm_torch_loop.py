"""The RMSNorm forward timed the peers' way for every side, tefl included: tefl through its
Python package (`tefl.tex.rmsnorm_fwd` on torch's CUDA tensors, on torch's stream), FlagGems
(`flag_gems.use_gems()` around `F.rms_norm`) and torch.compile, all in this one process with
bench_peers.py's own loop and flush (loaded from BENCH_PEERS, default beside this script: copy
tests/src/bench_peers.py there), ROUNDS rounds in turns. Where bench's own table puts tefl
behind FlagGems but this loop does not, the difference is in how bench times tefl's side (its
process, its flush, its events), not in the kernel.

    PYTHONPATH=SITE python3 rmsnorm_torch_loop.py [ROWSxCOLS ...]

SITE holds the tefl wheel built with the nvidia feature (`cd tefl-python && maturin build
--release --features nvidia`) and, for FlagGems, the bench's peer wheels. Environment: ROUNDS
(3), REPS (20), and bench_peers.py's own TEFL_BENCH_WARMUP (seconds) and TEFL_BENCH_PEER_FLUSH
(zero or memset).
"""

import importlib.util
import io
import os
import sys

import torch
import torch.nn.functional as F

import tefl.tex as tex


def load_peers():
    """bench_peers.py as a module: its device argument given, its request loop reading nothing."""
    path = os.environ.get("BENCH_PEERS") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_peers.py")
    spec = importlib.util.spec_from_file_location("bench_peers", path)
    module = importlib.util.module_from_spec(spec)
    saved = sys.argv, sys.stdin
    sys.argv, sys.stdin = [path, "cuda"], io.StringIO("")
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv, sys.stdin = saved
    return module


peers = load_peers()
dev = "cuda"
ROUNDS = int(os.environ.get("ROUNDS", "3"))
REPS = int(os.environ.get("REPS", "20"))


def timed(f):
    """bench_peers.py's `timed` (flush, events around one call, all queued), in ms."""
    return peers.timed(f, REPS) * 1e3


def sides(rows, cols):
    # Each shape compiled from dynamo's empty state, as bench_peers.py compiles each spec.
    torch._dynamo.reset()
    x = (torch.rand(rows, cols, device=dev) - 0.5).to(torch.bfloat16)
    g = (torch.rand(cols, device=dev) - 0.5).to(torch.bfloat16)
    out = [("tefl", lambda: tex.rmsnorm_fwd(x, g, 1e-5))]
    ref = F.rms_norm(x.float(), (cols,), g.float(), 1e-5)
    got = out[0][1]()[0].float()
    err = (got - ref).abs().max().item()
    if not err < 0.05:
        sys.exit(f"tefl's output is off by {err} at {rows}x{cols}")
    if peers.flag_gems is not None:

        def gems():
            with peers.flag_gems.use_gems():
                return F.rms_norm(x, (cols,), g, 1e-5)

        out.append(("flaggems", gems))
    compiled = torch.compile(lambda: F.rms_norm(x, (cols,), g, 1e-5))
    out.append(("compile", compiled))
    return out


def main():
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1:] or ["8192x4096", "16384x8192"])]
    flush = os.environ.get("TEFL_BENCH_PEER_FLUSH", "zero")
    print(torch.cuda.get_device_name(), f"flush {flush}, {REPS} reps, {ROUNDS} rounds")
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
