#!/usr/bin/env bash
# The norm forward's L2 policy on x for LayerNorm and FP8 outputs (scripts/diag/norm_keep.patch):
# each form its own process, ROUNDS (3) rounds in turns, bench --only "copy,layernorm_fwd,rmsnorm_fwd"
# without peers. CHECK=1 then runs the norms family's conformance with both switches.
here=$(cd "$(dirname "$0")" && pwd)
export TEFL_BENCH_WARMUP=${TEFL_BENCH_WARMUP:-0.5}
nvidia-smi --query-gpu=name --format=csv,noheader
only=${ONLY:-copy,layernorm_fwd,rmsnorm_fwd}
"$here/bench" --backend nvidia --only "$only" > /dev/null 2>&1
forms=("base" "TEFL_DIAG_LN_KEEP=1" "TEFL_DIAG_FP8_KEEP=1")
for r in $(seq 1 "${ROUNDS:-3}"); do
  for f in "${forms[@]}"; do
    envs=(); [ "$f" != base ] && envs=($f)
    line=$(env "${envs[@]}" "$here/bench" --backend nvidia --only "$only" 2>&1 | grep -E "^(copy|layernorm|rmsnorm)" \
      | sed -E 's/ +/ /g; s/(GB\/s).*/\1;/' | tr '\n' ' ')
    echo "r$r $f: $line"
  done
done
if [ -n "${CHECK:-}" ]; then
  TEFL_DIAG_LN_KEEP=1 TEFL_DIAG_FP8_KEEP=1 "$here/conformance" nvidia --impl vendor.nvidia --families norms 2>&1 | tail -1
fi
