#!/usr/bin/env bash
# `ct_form_checks.sh LABEL KERNEL`: the checks of one form of the FP8 cast + transpose, run in
# the environment the caller exported (its TEFL_DIAG_CT_* switches), from a diagnostic bundle
# (conformance beside this script): the fp8 family's --full conformance, then compute-sanitizer
# racecheck and memcheck on KERNEL over --ops quantize,bgrad_quantize (150 s each at most).
# Logs under $OUT (default /tmp/out). ct_rows16.sh and ct_minb.sh call it.
here=$(cd "$(dirname "$0")" && pwd)
label=$1 kernel=$2
out=${OUT:-/tmp/out}
mkdir -p "$out"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
t0=$SECONDS
"$here/conformance" nvidia --full --families fp8 --impl vendor.nvidia --jobs 8 > "$out/conf_fp8.log" 2>&1
echo "$label: conformance fp8 --full: rc $? in $((SECONDS - t0)) s: $(tail -1 "$out/conf_fp8.log")"
for tool in racecheck memcheck; do
  t0=$SECONDS
  timeout 150 "$san" --tool "$tool" --error-exitcode 9 --target-processes all --kernel-name "kns=$kernel" \
    "$here/conformance" nvidia --families fp8 --impl vendor.nvidia --ops quantize,bgrad_quantize > "$out/$tool.log" 2>&1
  echo "$label: $tool: rc $? in $((SECONDS - t0)) s: $(grep -E 'passed|SUMMARY' "$out/$tool.log" | tail -2 | tr '\n' ' ')"
done
