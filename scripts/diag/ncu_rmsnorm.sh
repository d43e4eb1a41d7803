#!/usr/bin/env bash
# Nsight Compute on the 8192x4096 bf16 RMSNorm forward, tefl's norm_fwd against FlagGems'
# rms_norm_kernel (each the fifth launch of its process; ncu's defaults: base clocks, caches
# flushed before the kernel). Copy it and ncu_profile.sh into the nvidia bundle (beside `bench`
# and `peers/`, whose FlagGems wheels it installs) and run it there on the GPU machine; $OUT gets
# both reports, their details pages and their SASS source pages as CSV for scripts/ncu_source.py.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ncu_profile.sh"
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" "$here"/peers/*.whl && export PYTHONPATH="$site"
cat > "$site/fg.py" <<'PY'
import torch, flag_gems
x = (torch.rand(8192, 4096, device="cuda") - 0.5).bfloat16()
w = (torch.rand(4096, device="cuda") - 0.5).bfloat16()
with flag_gems.use_gems():
    for _ in range(8):
        y = torch.nn.functional.rms_norm(x, (4096,), w, 1e-5)
torch.cuda.synchronize()
print("fg ok", y.shape)
PY
TEFL_BENCH_WARMUP=0.1 ncu_profile tefl norm_fwd 200 "$here/bench" --backend nvidia --only "rmsnorm_fwd 8192"
ncu_profile fg rms_norm 200 python3 "$site/fg.py"
ncu_summary tefl fg
