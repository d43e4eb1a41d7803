"""One torch.compile peer of the bench timed four ways in turns, to see which part of a loop
moves its time: the flush with or without the L2 scrub, and a host wait after every call or
every repetition queued before one wait (the bench's way). The peer, the shapes, the scrub
and the fill are bench_peers.py's own (BENCH_PEERS, default tests/src/bench_peers.py, loaded
by bench_peers_module.py beside this script).

On the GPU machine: `python3 scripts/diag/compile_loop_flush.py rope 4096 4 32 128` (an op and
its numbers as bench sends them to its peers' process; ROUNDS, 3).
"""
import os
import statistics
import sys

import torch

import bench_peers_module

here = os.path.dirname(os.path.abspath(__file__))
bp = bench_peers_module.load(os.environ.get("BENCH_PEERS") or os.path.join(here, "../../tests/src/bench_peers.py"))
op, nums = sys.argv[1], [int(x) for x in sys.argv[2:]]
fill, scrub = bp.flusher(), bp.l2_scrub()
if scrub is None:
    sys.exit("the L2 scrub is not available (bench_peers said why)")
f = dict((name, setup) for name, _, setup in bp.peers(op, nums))["compile"]()
for _ in range(3):
    f()
torch.cuda.synchronize()


def run(with_scrub, wait_each, reps=20):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        if with_scrub:
            scrub()
        fill()
        a.record()
        f()
        b.record()
        if wait_each:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


forms = [(s, w) for s in (False, True) for w in (True, False)]
for r in range(int(os.environ.get("ROUNDS", "3"))):
    print(
        f"round {r + 1}: "
        + "; ".join(
            f"{'scrub+fill' if s else 'fill'}, {'wait each' if w else 'queued'} {run(s, w):.4f} ms" for s, w in forms
        ),
        flush=True,
    )
