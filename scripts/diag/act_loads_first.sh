#!/usr/bin/env bash
# Elementwise forward with its unrolled items' loads first (the bench and conformance built
# with scripts/diag/act_loads_first.patch beside it, as in that file's header): for each form,
# plain GRID_STRIDE and TEFL_DIAG_ACT_LF=1, the autotuner times every block x unroll candidate
# of the gelu forward (TEFL_AUTOTUNE=1, a fresh kernel cache a form and round, each its own
# process, ROUNDS rounds in turns) and its timings are printed, then the bench's gelu row with
# the pick. CHECK=1 then runs the activations family's conformance with TEFL_DIAG_ACT_LF=1 at
# unroll 2 and 4 (TEFL_DIAG_ACT_UNROLL pins it for every activation launch).
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export TEFL_BENCH_WARMUP=${TEFL_BENCH_WARMUP:-1}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for round in $(seq 1 "${ROUNDS:-2}"); do
  for form in plain lf; do
    cache=$(mktemp -d)
    envs=(TEFL_AUTOTUNE=1 TEFL_CACHE_DIR="$cache")
    [ "$form" = lf ] && envs+=(TEFL_DIAG_ACT_LF=1)
    env "${envs[@]}" "$here/bench" --backend nvidia --only "${ONLY:-copy,gelu}" > "$out/lf-$form-$round.log" 2>&1
    echo "r$round $form: $(grep -E '^(copy|gelu)' "$out/lf-$form-$round.log" | tr -s ' ' | tr '\n' ';')"
    python3 - "$cache" "r$round $form" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/autotune/*/*.json")):
    d = json.load(open(f))
    k = d["key"]
    ts = ", ".join(f'{t["config"].get("block")}x{t["config"].get("unroll")} {t["seconds"] * 1e6:.1f}'
                   for t in d["timings"] if t.get("seconds"))
    print(f'  {sys.argv[2]} {k["kernel"]} {k["dtype"]} {k["shape_bucket"]}: winner {d["winner"]}; us: {ts}')
PY
    rm -rf "$cache"
  done
done
if [ -n "${CHECK:-}" ]; then
  for u in 2 4; do
    TEFL_DIAG_ACT_LF=1 TEFL_DIAG_ACT_UNROLL=$u "$here/conformance" nvidia --impl vendor.nvidia \
      --families activations 2>&1 | tail -2 | sed "s/^/check [LF, unroll $u] /"
  done
fi
