#!/usr/bin/env bash
# Nsight Compute on RoPE (s4096 b4 h32 d128 bf16 sbhd, the bench's shape): tefl's rope_warp
# against torch.compile's Triton kernel for bench_peers.py's expression (each the fifth launch of
# its process; ncu's defaults: base clocks, caches flushed before the kernel). Copy it into the
# nvidia bundle (beside `bench`) and run it there on the GPU machine; $OUT gets both reports,
# their details pages and their SASS source pages as CSV for scripts/ncu_source.py.
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $ncu"; "$ncu" --version | tail -1
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
secs="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters"
TEFL_BENCH_WARMUP=0.1 timeout 200 "$ncu" $secs --kernel-name regex:rope_warp --launch-skip 4 --launch-count 1 -o "$out/tefl" \
  "$here/bench" --backend nvidia --only rope > "$out/ncu-tefl.log" 2>&1; echo "tefl rc=$?"
timeout 250 "$ncu" $secs --kernel-name regex:triton_ --launch-skip 4 --launch-count 1 -o "$out/compile" python3 "$site/compiled.py" > "$out/ncu-compile.log" 2>&1; echo "compile rc=$?"
for r in tefl compile; do
  "$ncu" -i "$out/$r.ncu-rep" --page details > "$out/$r.txt" 2>&1
  "$ncu" -i "$out/$r.ncu-rep" --page source --print-source sass --csv > "$out/$r.csv" 2>&1
done
tail -n 3 "$out/ncu-tefl.log" "$out/ncu-compile.log"
for r in tefl compile; do echo "=== $r"; grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Executed Instructions  |Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|L2 Hit Rate|L1/TEX Hit|Block Limit|Grid Size|Block Size|SM Frequency|DRAM Frequency|Mem Busy|Max Bandwidth" "$out/$r.txt" | head -40; done
