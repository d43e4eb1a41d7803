#!/usr/bin/env bash
# RoPE's warp kernel in the forms of scripts/diag/rope_l2.patch (the bench and conformance built
# with it beside this script, and forms_in_turns.sh): each form its own process, ROUNDS (3)
# rounds in turns, `bench --only copy,rope` without peers. SET=l2 (default: the L2 policy, the
# stores, the grid), SET=pair (the shuffle-free form), SET=occ (registers capped for more blocks
# an SM, fewer vectors a lane), SET=occ2 (one or two vectors a lane, 8 to 12 blocks an SM),
# SET=freqs (the angles loaded before x) or SET=wrows (a warp over the rows of one position, the
# angles computed once). CHECK=1 then runs the rope family's conformance in each form. VS=FORM
# then times that form and the build as they are against torch (`--vs torch --rounds 3`).
here=$(cd "$(dirname "$0")" && pwd)
if [ "${SET:-l2}" = occ ]; then
  forms=("TEFL_DIAG_ROPE_MINB=7" "TEFL_DIAG_ROPE_MINB=8" "TEFL_DIAG_ROPE_HEADS=8 TEFL_DIAG_ROPE_UNROLL=4 TEFL_DIAG_ROPE_MINB=8"
    "TEFL_DIAG_ROPE_HEADS=16 TEFL_DIAG_ROPE_UNROLL=4 TEFL_DIAG_ROPE_MINB=8" "TEFL_DIAG_ROPE_PAIR=1"
    "TEFL_DIAG_ROPE_HEADS=8 TEFL_DIAG_ROPE_UNROLL=4 TEFL_DIAG_ROPE_MINB=10")
elif [ "${SET:-l2}" = occ2 ]; then
  # Few vectors a lane, many warps an SM, the angles still computed once per 16 or 32 heads
  # (sm_90 registers of the bench's variant: 48, 48, 58, 48, 40 with 16 bytes of spill).
  forms=("TEFL_DIAG_ROPE_HEADS=16 TEFL_DIAG_ROPE_UNROLL=2 TEFL_DIAG_ROPE_MINB=10"
    "TEFL_DIAG_ROPE_HEADS=16 TEFL_DIAG_ROPE_UNROLL=1 TEFL_DIAG_ROPE_MINB=10"
    "TEFL_DIAG_ROPE_HEADS=16 TEFL_DIAG_ROPE_UNROLL=2 TEFL_DIAG_ROPE_MINB=8"
    "TEFL_DIAG_ROPE_HEADS=32 TEFL_DIAG_ROPE_UNROLL=2 TEFL_DIAG_ROPE_MINB=10"
    "TEFL_DIAG_ROPE_HEADS=16 TEFL_DIAG_ROPE_UNROLL=1 TEFL_DIAG_ROPE_MINB=12")
elif [ "${SET:-l2}" = freqs ]; then
  forms=("TEFL_DIAG_ROPE_FREQS_FIRST=1" "TEFL_DIAG_ROPE_FREQS_FIRST=1 TEFL_DIAG_ROPE_KEEP=0"
    "TEFL_DIAG_ROPE_FREQS_FIRST=1 TEFL_DIAG_ROPE_HEADS=8 TEFL_DIAG_ROPE_UNROLL=4 TEFL_DIAG_ROPE_MINB=8"
    "TEFL_DIAG_ROPE_FREQS_FIRST=1 TEFL_DIAG_ROPE_HEADS=32")
elif [ "${SET:-l2}" = wrows ]; then
  w8="TEFL_DIAG_ROPE_HEADS=8 TEFL_DIAG_ROPE_UNROLL=4"
  forms=("TEFL_DIAG_ROPE_WROWS=4 $w8" "TEFL_DIAG_ROPE_WROWS=4 $w8 TEFL_DIAG_ROPE_KEEP=0" "TEFL_DIAG_ROPE_WROWS=2 $w8"
    "TEFL_DIAG_ROPE_WROWS=4" "TEFL_DIAG_ROPE_WROWS=4 TEFL_DIAG_ROPE_KEEP=0" "TEFL_DIAG_ROPE_FREQS_FIRST=1")
elif [ "${SET:-l2}" = pair ]; then
  forms=("TEFL_DIAG_ROPE_PAIR=1" "TEFL_DIAG_ROPE_PAIR=1 TEFL_DIAG_ROPE_HEADS=8"
    "TEFL_DIAG_ROPE_PAIR=1 TEFL_DIAG_ROPE_HEADS=32" "TEFL_DIAG_ROPE_PAIR=1 TEFL_DIAG_ROPE_KEEP=0"
    "TEFL_DIAG_ROPE_PAIR=1 TEFL_DIAG_ROPE_RELEASE_MIB=0")
else
  forms=("TEFL_DIAG_ROPE_KEEP=0" "TEFL_DIAG_ROPE_RELEASE_MIB=0" "TEFL_DIAG_ROPE_STORE=1" "TEFL_DIAG_ROPE_STORE=2"
    "TEFL_DIAG_ROPE_KEEP=0 TEFL_DIAG_ROPE_STORE=1" "TEFL_DIAG_ROPE_BPS=16" "TEFL_DIAG_ROPE_BPS=8")
fi
ROUNDS=${ROUNDS:-3} CHECK_FAMILY=${CHECK:+rope} bash "$here/forms_in_turns.sh" "copy,rope" base "${forms[@]}"
if [ -n "${VS:-}" ]; then
  for f in base "$VS"; do
    envs=(); [ "$f" != base ] && read -r -a envs <<< "$f"
    echo "== $f against torch"
    env "${envs[@]}" "$here/bench" --backend nvidia --vs torch --only rope --rounds 3 2>&1 | grep -v "^\s*$" | tail -14
  done
fi
