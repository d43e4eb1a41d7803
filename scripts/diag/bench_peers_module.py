"""bench_peers.py (tests/src/) loaded as a module by the diagnostic scripts beside this file
(rmsnorm_torch_loop.py, compile_loop_flush.py), so that they time their sides with its loop,
flush and L2 scrub: its device argument given, its request loop reading nothing. Copy this file
with them when they run from a bundle folder."""
import importlib.util
import io
import sys


def load(path):
    """The module of the bench_peers.py at `path`, on CUDA."""
    spec = importlib.util.spec_from_file_location("bench_peers", path)
    module = importlib.util.module_from_spec(spec)
    saved = sys.argv, sys.stdin
    sys.argv, sys.stdin = [path, "cuda"], io.StringIO("")
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv, sys.stdin = saved
    return module
