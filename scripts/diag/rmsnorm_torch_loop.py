"""The RMSNorm forward timed the peers' way for every side, tefl included: tefl through its
Python package (`tefl.tex.rmsnorm_fwd` on torch's CUDA tensors, on torch's stream), FlagGems
(`flag_gems.use_gems()` around `F.rms_norm`) and torch.compile, all in this one process with
bench_peers.py's own loop and flush (loaded from BENCH_PEERS, default beside this script: copy
tests/src/bench_peers.py there, and bench_peers_module.py), ROUNDS rounds in turns of the sides
SIDES names, in its order (default "tefl,flaggems,compile"), after the one-time calls PRE names (comma-separated, none by
default: `compile` and `flaggems` call that side once, `eager` torch's own kernel, `triton` a
one-line Triton kernel, `state` prints the context's limits and cache config, `empty_cache`,
`prefer_l1` / `prefer_shared` / `prefer_equal` set the context's cache config, `flush_buffer`
fills and frees a 256 MiB buffer; each untimed, before the first round). Each side's timing
starts with a line on stderr in the form of bench's peer phases, for
scripts/diag/with_clocks.sh.

On 2026-12-06 (H100) this found why bench put FlagGems ahead of tefl at 8192x4096: one untimed
call of torch.compile's kernel (PRE=compile) made every later call of tefl's and FlagGems' on
the same x faster (lines of x it loaded with an L2 evict_last policy stay in L2 through the
fill), which bench's peers, timed after torch.compile in one process, had and tefl's side did
not. bench_peers.py's flush now scrubs such lines first (its `l2_scrub`), as tefl's side does.

    PYTHONPATH=SITE python3 rmsnorm_torch_loop.py [ROWSxCOLS ...]

SITE holds the tefl wheel built with the nvidia feature (`cd tefl-python && maturin build
--release --features nvidia`) and, for FlagGems, the bench's peer wheels. Environment: ROUNDS
(3), REPS (20), and bench_peers.py's own TEFL_BENCH_WARMUP (seconds) and TEFL_BENCH_PEER_FLUSH
(zero or memset); NOSCRUB=1 flushes without bench_peers.py's L2 scrub (its `l2_scrub`), as
both sides did before 2026-12-06.
"""

import contextlib
import os
import sys

import torch
import torch.nn.functional as F

import tefl.tex as tex

import bench_peers_module


peers = bench_peers_module.load(
    os.environ.get("BENCH_PEERS") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_peers.py")
)
dev = "cuda"
ROUNDS = int(os.environ.get("ROUNDS", "3"))
REPS = int(os.environ.get("REPS", "20"))


if os.environ.get("NOSCRUB"):
    # The flush without bench_peers.py's L2 scrub (the fill alone, as before 2026-12-06).
    peers.flush_l2 = peers.flusher()


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
        # As bench_peers.py: FlagGems' context around the whole timing (`side_context`), not each call.
        out.append(("flaggems", lambda: F.rms_norm(x, (cols,), g, 1e-5)))
    compiled = torch.compile(lambda: F.rms_norm(x, (cols,), g, 1e-5))
    out.append(("compile", compiled))
    out.append(("eager", lambda: F.rms_norm(x, (cols,), g, 1e-5)))
    order = [s for s in os.environ.get("SIDES", "tefl,flaggems,compile").split(",") if s]
    for pre in [s for s in os.environ.get("PRE", "").split(",") if s]:
        print(f"once before the rounds: {pre}", flush=True)
        if pre == "triton":
            triton_once(x)
        elif pre == "state":
            print_context_state()
        elif pre == "empty_cache":
            torch.cuda.empty_cache()
        elif pre in ("prefer_l1", "prefer_shared", "prefer_equal"):
            set_cache_config({"prefer_shared": 1, "prefer_l1": 2, "prefer_equal": 3}[pre])
        elif pre == "flush_buffer":
            # As a benchmarker's L2 clearing: a large buffer filled, then freed to torch's cache.
            b = torch.empty(256 << 20, dtype=torch.int8, device=dev)
            b.zero_()
            del b
        elif pre in ("flaggems", "compile", "eager"):
            with side_context(pre):
                dict(out)[pre]()
        else:
            raise KeyError(pre)
        torch.cuda.synchronize()
    return [side for name in order for side in out if side[0] == name]


def libcuda():
    import ctypes

    return ctypes.CDLL("libcuda.so.1")


def print_context_state():
    """The current context's cache config, limits and flags (cuCtxGet*), as one line."""
    import ctypes

    cu = libcuda()
    v = ctypes.c_size_t()
    limits = []
    for limit in range(7):
        rc = cu.cuCtxGetLimit(ctypes.byref(v), limit)
        limits.append(str(v.value) if rc == 0 else f"rc{rc}")
    cfg, flags = ctypes.c_int(), ctypes.c_uint()
    rc1, rc2 = cu.cuCtxGetCacheConfig(ctypes.byref(cfg)), cu.cuCtxGetFlags(ctypes.byref(flags))
    print(f"context: limits {' '.join(limits)}; cache config {cfg.value} (rc {rc1}); flags {flags.value:#x} (rc {rc2})", flush=True)


def set_cache_config(value):
    rc = libcuda().cuCtxSetCacheConfig(value)
    print(f"cuCtxSetCacheConfig({value}): rc {rc}", flush=True)


def triton_once(x):
    """One launch of a one-line Triton kernel (x + 1 into a new tensor)."""
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(src, dst, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + i, tl.load(src + i, mask=i < n) + 1, mask=i < n)

    y = torch.empty_like(x)
    add_one[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)


def side_context(name):
    """What a side's calls run inside: FlagGems' `use_gems()` for its side (around the whole
    timing, as bench_peers.py does), nothing for the others."""
    return peers.flag_gems.use_gems() if name == "flaggems" else contextlib.nullcontext()


def timed_side(shape, name, f):
    """One side's timing, its start named on stderr as bench's peer phases are (the line that
    scripts/diag/with_clocks.sh sets the clocks beside)."""
    print(f"bench peers: {shape}: {name}", file=sys.stderr, flush=True)
    with side_context(name):
        return timed(f)


def main():
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1:] or ["8192x4096", "16384x8192"])]
    flush = os.environ.get("TEFL_BENCH_PEER_FLUSH", "zero")
    print(torch.cuda.get_device_name(), f"flush {flush}, {REPS} reps, {ROUNDS} rounds")
    for rows, cols in shapes:
        fns = sides(rows, cols)
        times = {name: [] for name, _ in fns}
        for _ in range(ROUNDS):
            for name, f in fns:
                times[name].append(timed_side(f"{rows}x{cols}", name, f))
        best = {name: min(ts) for name, ts in times.items()}
        for name, ts in times.items():
            against = f", tefl's speed against it {best[name] / best['tefl']:.3f}x" if "tefl" in best else ""
            rounds = " / ".join(f"{t:.4f}" for t in ts)
            print(f"{rows}x{cols} {name:9s} {rounds} ms; best {best[name]:.4f}{against}")


if __name__ == "__main__":
    main()
