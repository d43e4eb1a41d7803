#!/usr/bin/env bash
# ct_ring.sh: the ring forms of cast_transpose_8x8 (ct_ring.patch's diagnostic build beside
# it, with forms_in_turns.sh and ct_form_checks.sh) in turns, ROUNDS (3) rounds; then the fp8
# --full conformance of each ring form in CONF (e.g. CONF="3 2"), then, with CHECK=n, the
# sanitizer checks of n stages (ct_form_checks.sh). NOFORMS=1 skips the timing; FORMS replaces
# the forms (shell words, e.g. FORMS="base TEFL_DIAG_CT_PER_SM=16 TEFL_DIAG_CT_PER_SM=32").
# QT_SHAPES=MxN,... then times the landed form at those shapes too (TEFL_DIAG_QT_SHAPES), in
# turns with the forms above.
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
if [ -z "${NOFORMS:-}" ]; then
  if [ -n "${FORMS:-}" ]; then
    eval "set -- $FORMS"
  else
    set -- base TEFL_DIAG_CT_STAGES=2 TEFL_DIAG_CT_STAGES=3 TEFL_DIAG_CT_STAGES=4 \
      "TEFL_DIAG_CT_STAGES=2 TEFL_DIAG_CT_RING_BLOCKS=2" TEFL_DIAG_CT_PER_SM=16
  fi
  [ -n "${QT_SHAPES:-}" ] && set -- "$@" "TEFL_DIAG_QT_SHAPES=$QT_SHAPES"
  ROUNDS=${ROUNDS:-3} bash forms_in_turns.sh copy,quantize_t "$@"
fi
for st in ${CONF:-}; do
  t0=$SECONDS
  echo "stages $st: conformance fp8 --full: $(TEFL_DIAG_CT_STAGES=$st ./conformance nvidia --full --families fp8 --impl vendor.nvidia --jobs 8 2>&1 | tail -1) ($((SECONDS - t0)) s)"
done
if [ -n "${CHECK:-}" ]; then
  export TEFL_DIAG_CT_STAGES=$CHECK
  MC_ARGS=--full MC_S=${MC_S:-200} bash ct_form_checks.sh "stages $CHECK" cast_transpose_8x8
fi
