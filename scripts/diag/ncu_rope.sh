#!/usr/bin/env bash
# Nsight Compute on RoPE (s4096 b4 h32 d128 bf16 sbhd, the bench's shape): tefl's rope_warp
# against torch.compile's Triton kernel for bench_peers.py's expression (each the fifth launch of
# its process; ncu's defaults: base clocks, caches flushed before the kernel). Inductor's
# autotuner times its candidate configs on the first call, and under ncu's serialised launches
# it picks a slow one (2026-12-06: 132 us launches against the 88-92 us candidates), so the
# expression runs once without ncu first, with its own cache folder: the profiled run then takes
# the config picked at real timing from Inductor's local autotune cache (printed). Copy it and
# ncu_profile.sh into the nvidia bundle (beside `bench`) and run it there on the GPU machine;
# $OUT gets both reports, their details pages and their SASS source pages as CSV for
# scripts/ncu_source.py.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ncu_profile.sh"
site=$(mktemp -d)
cat > "$site/compiled.py" <<'PY'
import torch
s, b, h, d = 4096, 4, 32, 128
bf = torch.bfloat16
x = (torch.rand(s, b, h, d, device="cuda") - 0.5).to(bf)
fr = torch.rand(s, 1, 1, d, device="cuda") * 100
c, sn = fr.cos().to(bf), fr.sin().to(bf)
f = torch.compile(lambda x, c, sn: x * c + torch.cat((-x[..., d // 2 :], x[..., : d // 2]), -1) * sn)
for _ in range(8):
    y = f(x, c, sn)
torch.cuda.synchronize()
print("compile ok", y.shape)
PY
export TORCHINDUCTOR_CACHE_DIR="$site/inductor"
timeout 200 python3 "$site/compiled.py" 2>&1 | tail -1
find "$TORCHINDUCTOR_CACHE_DIR" -name "*.best_config" -exec cat {} \; -exec echo \;
TEFL_BENCH_WARMUP=0.1 ncu_profile tefl rope_warp 200 "$here/bench" --backend nvidia --only rope
ncu_profile compile triton_ 250 python3 "$site/compiled.py"
ncu_summary tefl compile
