#!/usr/bin/env bash
# Nsight Compute on the 8192x4096 bf16 RMSNorm forward, tefl's norm_fwd against FlagGems'
# rms_norm_kernel (each the fifth launch of its process; ncu's defaults: base clocks, caches
# flushed before the kernel). Copy it into the nvidia bundle (beside `bench` and `peers/`, whose
# FlagGems wheels it installs) and run it there on the GPU machine; $OUT gets both reports, their
# details pages and their SASS source pages as CSV for scripts/ncu_source.py.
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $ncu"; "$ncu" --version | tail -1
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
secs="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters"
TEFL_BENCH_WARMUP=0.1 timeout 200 "$ncu" $secs --kernel-name regex:norm_fwd --launch-skip 4 --launch-count 1 -o "$out/tefl" \
  "$here/bench" --backend nvidia --only "rmsnorm_fwd 8192" > "$out/ncu-tefl.log" 2>&1; echo "tefl rc=$?"
timeout 200 "$ncu" $secs --kernel-name regex:rms_norm --launch-skip 4 --launch-count 1 -o "$out/fg" python3 "$site/fg.py" > "$out/ncu-fg.log" 2>&1; echo "fg rc=$?"
for r in tefl fg; do
  "$ncu" -i "$out/$r.ncu-rep" --page details > "$out/$r.txt" 2>&1
  "$ncu" -i "$out/$r.ncu-rep" --page source --print-source sass --csv > "$out/$r.csv" 2>&1
done
tail -n 3 "$out/ncu-tefl.log" "$out/ncu-fg.log"
for r in tefl fg; do echo "=== $r"; grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Executed Instructions  |Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|L2 Hit Rate|L1/TEX Hit|Block Limit|Dynamic Shared|Static Shared|Grid Size|Block Size|SM Frequency|DRAM Frequency|Mem Busy|Max Bandwidth" "$out/$r.txt" | head -40; done
