#!/usr/bin/env bash
# The FP8 cast + transpose's checks and timings in one GPU call, from the diagnostic bundle of
# scripts/diag/ct_grid.patch (bench + conformance beside this script, with ct_grid.sh,
# ct_form_checks.sh, forms_in_turns.sh, ncu_quantize_t.sh and ncu_profile.sh):
#   1. the fp8 family's --full conformance (its 8200 x 6408 cases stride);
#   2. compute-sanitizer racecheck over --ops quantize,bgrad_quantize (the column sums' shared
#      memory) and memcheck over the same with --full, both on cast_transpose_8x8 only;
#   3. if fewer than TIME_IF_BEFORE (330) seconds have gone, one round of ct_grid.sh's forms
#      and Nsight Compute's DRAM bytes (ncu_quantize_t.sh, NCU_S seconds at most).
# RC_S and MC_S bound the two sanitizer runs (150 and 240 s). Logs under $OUT.
here=$(cd "$(dirname "$0")" && pwd)
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$here" || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
RC_S=${RC_S:-150} MC_S=${MC_S:-240} MC_ARGS=--full bash "$here/ct_form_checks.sh" landed cast_transpose_8x8
echo "checks done at $SECONDS s"
[ "$SECONDS" -lt "${TIME_IF_BEFORE:-330}" ] || exit 0
t0=$SECONDS
ROUNDS=${ROUNDS:-1} bash ct_grid.sh 2>&1 | tee "$OUT/ct_grid.log"
echo "ct_grid in $((SECONDS - t0)) s"
t0=$SECONDS
timeout "${NCU_S:-120}" bash ncu_quantize_t.sh 2>&1 | tail -60
echo "ncu in $((SECONDS - t0)) s; all done at $SECONDS s"
