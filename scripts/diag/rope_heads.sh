#!/usr/bin/env bash
# RoPE's warp kernel with 8, 4 and 32 heads a warp, every vector of a lane in flight
# (scripts/diag/rope_heads.patch; the bench and conformance built with it beside this script,
# and forms_in_turns.sh): each form its own process, ROUNDS (3) rounds in turns, `bench --only
# copy,rope` without peers. CHECK=1 then runs the rope family's conformance in each form.
here=$(cd "$(dirname "$0")" && pwd)
forms=("TEFL_DIAG_ROPE_HEADS=8 TEFL_DIAG_ROPE_UNROLL=4" "TEFL_DIAG_ROPE_HEADS=4 TEFL_DIAG_ROPE_UNROLL=2"
  "TEFL_DIAG_ROPE_HEADS=32 TEFL_DIAG_ROPE_UNROLL=16")
ROUNDS=${ROUNDS:-3} bash "$here/forms_in_turns.sh" "copy,rope" base "${forms[@]}"
if [ -n "${CHECK:-}" ]; then
  for f in "${forms[@]}"; do
    read -r -a envs <<< "$f"
    echo "$f: $(env "${envs[@]}" "$here/conformance" nvidia --impl vendor.nvidia --families rope 2>&1 | tail -1)"
  done
fi
