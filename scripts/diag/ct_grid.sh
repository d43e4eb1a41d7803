#!/usr/bin/env bash
# The FP8 cast + transpose's grid (scripts/diag/ct_grid.patch: TEFL_DIAG_CT_PER_SM blocks an SM
# striding over the row tiles, 0 a block a tile; TEFL_DIAG_CT_ORDER=rows the row blocks on the
# grid's x, so that the blocks resident together cover more row tiles of fewer column tiles and
# write longer runs of each q_t row; TEFL_DIAG_CT_NOQT=1 the kernel without its q_t stores
# (q_t's values then wrong; the rate still counts its bytes); TEFL_DIAG_CT_VC=8 or 2 the column
# vectors across a warp (4 landed: a warp's q_t store writes 64 bytes of each of 4 q_t rows; 8: 32
# bytes of each of 8, 2: 128 bytes of each of 2, its loads then 32 bytes of each x row); the
# bench and conformance built with it beside this script, and forms_in_turns.sh): each form its
# own process, ROUNDS (3) rounds in turns, `bench --only copy,quantize_t` without peers. CHECK=1
# then runs the fp8 family's full conformance in each form but base (the landed 24; its
# 8200 x 6408 cases stride), and leaves the NOQT form out, whose q_t is wrong by design.
here=$(cd "$(dirname "$0")" && pwd)
forms=()
for b in 0 4 8 16 32 48; do forms+=("TEFL_DIAG_CT_PER_SM=$b"); done
for b in 16 32; do forms+=("TEFL_DIAG_CT_ORDER=rows TEFL_DIAG_CT_PER_SM=$b"); done
for v in 8 2; do forms+=("TEFL_DIAG_CT_VC=$v"); done
[ -z "${CHECK:-}" ] && forms+=("TEFL_DIAG_CT_NOQT=1")
ROUNDS=${ROUNDS:-3} CHECK_FAMILY=${CHECK:+fp8} CHECK_ARGS=--full bash "$here/forms_in_turns.sh" copy,quantize_t base "${forms[@]}"
