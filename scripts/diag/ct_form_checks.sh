#!/usr/bin/env bash
# `ct_form_checks.sh LABEL KERNEL`: the checks of one form of the FP8 cast + transpose, run in
# the environment the caller exported (its TEFL_DIAG_CT_* switches), from a diagnostic bundle
# (conformance beside this script): the fp8 family's --full conformance, then compute-sanitizer
# racecheck and memcheck on KERNEL over --ops quantize,bgrad_quantize. RC_S and MC_S bound the
# two sanitizer runs (150 s each by default); MC_ARGS are added to memcheck's conformance
# arguments (ct_checks.sh: --full). Logs under $OUT (default /tmp/out). ct_checks.sh,
# ct_rows16.sh and ct_minb.sh call it.
here=$(cd "$(dirname "$0")" && pwd)
label=$1 kernel=$2
out=${OUT:-/tmp/out}
mkdir -p "$out"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
t0=$SECONDS
"$here/conformance" nvidia --full --families fp8 --impl vendor.nvidia --jobs 8 > "$out/conf_fp8.log" 2>&1
echo "$label: conformance fp8 --full: rc $? in $((SECONDS - t0)) s: $(tail -1 "$out/conf_fp8.log")"
for run in "racecheck ${RC_S:-150}" "memcheck ${MC_S:-150}"; do
  set -- $run
  extra=""
  [ "$1" = memcheck ] && extra=${MC_ARGS:-}
  t0=$SECONDS
  # shellcheck disable=SC2086 # $extra is words of their own or none
  timeout "$2" "$san" --tool "$1" --error-exitcode 9 --target-processes all --kernel-name "kns=$kernel" \
    "$here/conformance" nvidia --families fp8 --impl vendor.nvidia --ops quantize,bgrad_quantize $extra > "$out/$1.log" 2>&1
  echo "$label: $1 $extra: rc $? in $((SECONDS - t0)) s: $(grep -E 'passed|SUMMARY' "$out/$1.log" | tail -2 | tr '\n' ' ')"
done
