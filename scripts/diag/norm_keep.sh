#!/usr/bin/env bash
# The norm forward's L2 policy on x for LayerNorm and FP8 outputs (scripts/diag/norm_keep.patch;
# the bench and conformance built with it beside this script, and forms_in_turns.sh): each form
# its own process, ROUNDS (3) rounds in turns, `bench --only copy,layernorm_fwd,rmsnorm_fwd`
# without peers (ONLY overrides). CHECK=1 then runs the norms family's conformance with both
# switches.
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${ROUNDS:-3} bash "$here/forms_in_turns.sh" "${ONLY:-copy,layernorm_fwd,rmsnorm_fwd}" base \
  "TEFL_DIAG_LN_KEEP=1" "TEFL_DIAG_FP8_KEEP=1"
if [ -n "${CHECK:-}" ]; then
  TEFL_DIAG_LN_KEEP=1 TEFL_DIAG_FP8_KEEP=1 "$here/conformance" nvidia --impl vendor.nvidia --families norms 2>&1 | tail -1
fi
