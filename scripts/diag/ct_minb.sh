#!/usr/bin/env bash
# The FP8 cast + transpose with all 8 of a thread's x loads in flight at once: the diagnostic
# build of scripts/diag/ct_rows16.patch (bench and conformance beside this script, with
# forms_in_turns.sh and ct_form_checks.sh), whose TEFL_DIAG_CT8_MINB=1 compiles
# cast_transpose_8x8 with __launch_bounds__(256, 1) (sm_90: 79 registers, three blocks an SM,
# the 8 loads issued before the first use) where the landed __launch_bounds__(256) gives 56
# registers and the loads in pairs; 4 gives 64 registers and 4 loads first. ROUNDS (3) rounds of
# the forms in turns (copy,quantize_t), then, if fewer than TIME_IF_BEFORE (200) seconds have
# gone, the checks of the MINB=1 form: the fp8 family's --full conformance, racecheck and
# memcheck on cast_transpose_8x8 over quantize,bgrad_quantize. Logs under $OUT.
# Run on an H100 (2026-12-07, the thirteenth session, the performance log): MINB=1 ran 2.9%
# slower than the landed kernel, MINB=4 3-4%; its checks were clean. Closed.
here=$(cd "$(dirname "$0")" && pwd)
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$here" || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
ROUNDS=${ROUNDS:-3} bash "$here/forms_in_turns.sh" copy,quantize_t base TEFL_DIAG_CT8_MINB=1 \
  "TEFL_DIAG_CT8_MINB=1 TEFL_DIAG_CT_PER_SM=24" "TEFL_DIAG_CT8_MINB=1 TEFL_DIAG_CT_PER_SM=12" TEFL_DIAG_CT8_MINB=4
echo "forms done at $SECONDS s"
[ "$SECONDS" -lt "${TIME_IF_BEFORE:-200}" ] || exit 0
TEFL_DIAG_CT8_MINB=1 bash "$here/ct_form_checks.sh" "MINB=1" cast_transpose_8x8
echo "all done at $SECONDS s"
