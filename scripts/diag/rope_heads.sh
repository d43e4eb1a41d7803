#!/usr/bin/env bash
# RoPE's warp kernel with 8, 4 and 32 heads a warp, every vector of a lane in flight
# (scripts/diag/rope_heads.patch; the bench and conformance built with it beside this script,
# and forms_in_turns.sh): each form its own process, ROUNDS (3) rounds in turns, `bench --only
# copy,rope` without peers. CHECK=1 then runs the rope family's conformance in each form.
here=$(cd "$(dirname "$0")" && pwd)
forms=("TEFL_DIAG_ROPE_HEADS=8 TEFL_DIAG_ROPE_UNROLL=4" "TEFL_DIAG_ROPE_HEADS=4 TEFL_DIAG_ROPE_UNROLL=2"
  "TEFL_DIAG_ROPE_HEADS=32 TEFL_DIAG_ROPE_UNROLL=16")
ROUNDS=${ROUNDS:-3} CHECK_FAMILY=${CHECK:+rope} bash "$here/forms_in_turns.sh" "copy,rope" base "${forms[@]}"
