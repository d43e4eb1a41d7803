#!/usr/bin/env bash
# RoPE's warp kernel in the forms of scripts/diag/rope_warp.patch (the bench and conformance
# built with it beside this script): each form its own process, ROUNDS (2) rounds in turns,
# `bench --only copy,rope --rounds 2` without peers. CHECK=1 then runs the rope family's
# conformance with DIAG_I32 and DIAG_FASTSC.
here=$(cd "$(dirname "$0")" && pwd)
export TEFL_BENCH_WARMUP=${TEFL_BENCH_WARMUP:-0.5}
nvidia-smi --query-gpu=name --format=csv,noheader
forms=("base" "TEFL_DIAG_ROPE_DEFS=DIAG_I32" "TEFL_DIAG_ROPE_DEFS=DIAG_FASTSC" "TEFL_DIAG_ROPE_DEFS=DIAG_I32,DIAG_FASTSC" "TEFL_DIAG_ROPE_NOKEEP=1" "TEFL_DIAG_ROPE_HEADS=32")
"$here/bench" --backend nvidia --only "copy,rope" > /dev/null 2>&1
for r in $(seq 1 "${ROUNDS:-2}"); do
  for f in "${forms[@]}"; do
    envs=(); [ "$f" != base ] && envs=($f)
    line=$(env "${envs[@]}" "$here/bench" --backend nvidia --only "copy,rope" --rounds 2 2>&1 | grep -E "^(copy|rope)" | tr -s ' ' | tr '\n' ';')
    echo "r$r $f: $line"
  done
done
if [ -n "${CHECK:-}" ]; then
  TEFL_DIAG_ROPE_DEFS=DIAG_I32,DIAG_FASTSC "$here/conformance" nvidia --impl vendor.nvidia --families rope 2>&1 | tail -1
fi
