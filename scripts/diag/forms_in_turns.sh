#!/usr/bin/env bash
# Bench forms of a diagnostic build in turns: `forms_in_turns.sh ONLY FORM...`, each FORM
# "base" or space-separated VAR=VALUE settings, each run its own process (`bench --backend
# nvidia --only ONLY $BENCH_ARGS`, no peers), ROUNDS (2) rounds in turns after one run that
# compiles the kernels. Prints each run's rows as "name time rate;". CHECK_FAMILY=F then runs
# the conformance of family F (vendor.nvidia) in each form but base, a line a form. The
# diagnostic scripts beside it (rope_warp.sh, norm_keep.sh, ...) call it; copy it into the bundle
# folder with them.
here=$(cd "$(dirname "$0")" && pwd)
only=$1
shift
export TEFL_BENCH_WARMUP=${TEFL_BENCH_WARMUP:-0.5}
nvidia-smi --query-gpu=name --format=csv,noheader
"$here/bench" --backend nvidia --only "$only" > /dev/null 2>&1
for r in $(seq 1 "${ROUNDS:-2}"); do
  for f in "$@"; do
    envs=(); [ "$f" != base ] && read -r -a envs <<< "$f"
    # shellcheck disable=SC2086 # BENCH_ARGS are words of their own
    line=$(env "${envs[@]}" "$here/bench" --backend nvidia --only "$only" ${BENCH_ARGS:-} 2>&1 \
      | grep -E "(GB|TFLOP)/s" | grep -v "^bench" | sed -E 's/ +/ /g; s/((GB|TFLOP)\/s).*/\1;/' | tr '\n' ' ')
    echo "r$r $f: $line"
  done
done
if [ -n "${CHECK_FAMILY:-}" ]; then
  for f in "$@"; do
    [ "$f" = base ] && continue
    read -r -a envs <<< "$f"
    echo "$f: $(env "${envs[@]}" "$here/conformance" nvidia --impl vendor.nvidia --families "$CHECK_FAMILY" 2>&1 | tail -1)"
  done
fi
