#!/usr/bin/env bash
# The FP8 cast + transpose with 16 rows a thread (cast_transpose_16x8: 512-row tiles, each q_t
# store 16 codes, so that a warp writes whole 128-byte lines of 4 q_t rows) against the landed 8
# (base), from the diagnostic build of scripts/diag/ct_rows16.patch (bench and conformance
# beside this script, with forms_in_turns.sh and ct_form_checks.sh), whose host takes
# TEFL_DIAG_CT_RPT=16 (m % 16 == 0), TEFL_DIAG_CT_PER_SM (blocks an SM, 16 landed then, 24 now) and
# TEFL_DIAG_CT16_MINB (the 16-row kernel's __launch_bounds__ minimum blocks: 4 caps it at 64
# registers). First the checks of the 16-row form (ct_form_checks.sh: fp8 --full conformance;
# racecheck and memcheck on cast_transpose_16x8 over quantize,bgrad_quantize), then ROUNDS (3)
# rounds of the forms in turns (forms_in_turns.sh).
# Run on an H100 (2026-12-07, the performance log): the 16-row form tied the 8-row one. The
# patch also has TEFL_DIAG_CT8_MINB (ct_minb.sh).
here=$(cd "$(dirname "$0")" && pwd)
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$here" || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
TEFL_DIAG_CT_RPT=16 bash "$here/ct_form_checks.sh" "16 rows" cast_transpose_16x8
forms=()
for b in 16 8 12 24; do forms+=("TEFL_DIAG_CT_RPT=16 TEFL_DIAG_CT_PER_SM=$b"); done
forms+=("TEFL_DIAG_CT_RPT=16 TEFL_DIAG_CT16_MINB=4")
ROUNDS=${ROUNDS:-3} bash "$here/forms_in_turns.sh" copy,quantize_t base "${forms[@]}"
echo "all done at $SECONDS s"
