# Sourced by the Nsight Compute comparisons (ncu_rmsnorm.sh, ncu_rope.sh; copy it into the
# bundle beside them): finds ncu, then
#   ncu_profile NAME REGEX TIMEOUT CMD...  the fifth launch of the kernels REGEX matches in CMD
#                                          (ncu's defaults: base clocks, caches flushed before the
#                                          kernel) to $out/NAME.ncu-rep, its details page to
#                                          NAME.txt and its SASS source page to NAME.csv (for
#                                          scripts/ncu_source.py); CMD's output in ncu-NAME.log
#   ncu_summary NAME...                    each log's last lines and each report's key figures
out=${OUT:-/tmp/out}; mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $ncu"; "$ncu" --version | tail -1
ncu_sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters"
ncu_profile() {
  local name=$1 regex=$2 limit=$3
  shift 3
  # shellcheck disable=SC2086 # the sections are words of their own
  timeout "$limit" "$ncu" $ncu_sections --kernel-name "regex:$regex" --launch-skip 4 --launch-count 1 -o "$out/$name" \
    "$@" > "$out/ncu-$name.log" 2>&1
  echo "$name rc=$?"
  "$ncu" -i "$out/$name.ncu-rep" --page details > "$out/$name.txt" 2>&1
  "$ncu" -i "$out/$name.ncu-rep" --page source --print-source sass --csv > "$out/$name.csv" 2>&1
}
ncu_summary() {
  local r logs=()
  for r in "$@"; do logs+=("$out/ncu-$r.log"); done
  tail -n 3 "${logs[@]}"
  for r in "$@"; do
    echo "=== $r"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Executed Instructions  |Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|L2 Hit Rate|L1/TEX Hit|Block Limit|Dynamic Shared|Static Shared|Grid Size|Block Size|SM Frequency|DRAM Frequency|Mem Busy|Max Bandwidth" "$out/$r.txt" | head -40
  done
}
