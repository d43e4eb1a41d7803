#!/usr/bin/env bash
# compute-sanitizer racecheck of one impl's op over the conformance cases, split into shards
# (`conformance --shard K/N`) so that a run longer than the GPU machine's 10-minute command can
# go over several commands. The first shard given runs alone (it fills the kernel cache and
# says how long a shard takes); the rest run PARALLEL at a time. Each shard's log is
# $OUT/racecheck-K.log; one summary line a shard: its counts, the sanitizer's hazard line, rc.
#
#   SHARDS=8 ONLY="0 1 2 3" PARALLEL=3 bash scripts/diag/racecheck_shards.sh
#
# IMPL (vendor.nvidia.portable), FAMILY (attention), OPS (fused_attn_bwd), SHARDS (8),
# ONLY (the shards to run, default all), PARALLEL (2), CONFORMANCE (the binary; default above).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# The conformance binary beside this script (the diagnostic bundle's), else the nvidia bundle's.
default=$here/conformance
[ -x "$default" ] || default=$here/../../target/bundle/nvidia/conformance
conformance=${CONFORMANCE:-$default}
out=${OUT:-/tmp/out}
mkdir -p "$out"
impl=${IMPL:-vendor.nvidia.portable}
family=${FAMILY:-attention}
ops=${OPS:-fused_attn_bwd}
shards=${SHARDS:-8}
parallel=${PARALLEL:-2}
only=${ONLY:-$(seq -s ' ' 0 $((shards - 1)))}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

one() {
  local k=$1 log="$out/racecheck-$1.log" t0=$SECONDS rc
  "$sanitizer" --tool racecheck --error-exitcode 9 --target-processes all \
    "$conformance" nvidia --impl "$impl" --families "$family" --ops "$ops" --shard "$k/$shards" > "$log" 2>&1
  rc=$?
  local counts hazards
  counts=$(grep -E "passed" "$log" | tail -1)
  hazards=$(grep -E "hazards displayed|ERROR SUMMARY" "$log" | tail -1)
  echo "shard $k/$shards: rc $rc in $((SECONDS - t0)) s; ${counts:-no count line}; ${hazards:-no sanitizer summary}"
}

set -- $only
[ $# -gt 0 ] || exit 0
one "$1"
shift
while [ $# -gt 0 ]; do
  batch=()
  for _ in $(seq 1 "$parallel"); do
    [ $# -gt 0 ] || break
    batch+=("$1")
    shift
  done
  for k in "${batch[@]}"; do one "$k" & done
  wait
done
