#!/usr/bin/env bash
# RoPE's warp kernel in the forms of scripts/diag/rope_warp.patch (the bench and conformance
# built with it beside this script, and forms_in_turns.sh): each form its own process, ROUNDS
# (2) rounds in turns, `bench --only copy,rope --rounds 2` without peers. CHECK=1 then runs the
# rope family's conformance with DIAG_I32 and DIAG_FASTSC.
here=$(cd "$(dirname "$0")" && pwd)
BENCH_ARGS="--rounds 2" bash "$here/forms_in_turns.sh" "copy,rope" base "TEFL_DIAG_ROPE_DEFS=DIAG_I32" \
  "TEFL_DIAG_ROPE_DEFS=DIAG_FASTSC" "TEFL_DIAG_ROPE_DEFS=DIAG_I32,DIAG_FASTSC" "TEFL_DIAG_ROPE_NOKEEP=1" \
  "TEFL_DIAG_ROPE_HEADS=32"
if [ -n "${CHECK:-}" ]; then
  TEFL_DIAG_ROPE_DEFS=DIAG_I32,DIAG_FASTSC "$here/conformance" nvidia --impl vendor.nvidia --families rope 2>&1 | tail -1
fi
