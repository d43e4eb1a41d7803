#!/usr/bin/env bash
# f32 1024^3 GEMM: tefl's reference backend and numpy's matmul, side by side in one run.
# numpy comes from PyPI (pip install numpy). OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are unset
# for the numpy command alone (they slow a current OpenBLAS on this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1024}
cargo build -q --release -p tefl-backend-reference --example gemm_gflops
for round in 1 2; do
  ./target/release/examples/gemm_gflops "$n" 20
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 - "$n" <<'PY'
import sys, time, numpy as np
n = int(sys.argv[1])
a = (np.arange(n * n, dtype=np.float32).reshape(n, n) * 7919 % 1000) / 1000 - 0.5
a = a.astype(np.float32)
for _ in range(3): a @ a
ts = []
for _ in range(20):
    t = time.perf_counter(); a @ a; ts.append(time.perf_counter() - t)
ts.sort(); med = ts[len(ts) // 2]
try:
    from threadpoolctl import threadpool_info
    info = [(i.get("internal_api"), i.get("architecture"), i.get("num_threads")) for i in threadpool_info()]
except Exception:
    info = "threadpoolctl not installed"
print(f"numpy {np.__version__} matmul f32 {n}^3: median {med*1e3:.3f} ms, {2*n**3/med/1e9:.1f} GFLOP/s  blas={info}")
PY
done
