#!/usr/bin/env bash
# Issue 17's done-when checks on the kernels changed since the last sanitizer run (the norm
# forward's kept-x path, 32dbad1): memcheck and racecheck on norm_fwd over the norms' full
# conformance (its 8192x8192 cases take the kept loads), then the torch oracle. Copy it into a
# folder beside the nvidia bundle's (target/bundle/checks), or set BUNDLE to that bundle.
b=${BUNDLE:-$(cd "$(dirname "$0")/../nvidia" && pwd)}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
echo "sanitizer: $san"
for tool in memcheck racecheck; do
  s0=$(date +%s)
  timeout "${SAN_T:-200}" "$san" --tool "$tool" --kernel-name kns=norm_fwd --error-exitcode 9 --target-processes all \
    "$b/conformance" nvidia --full --families norms --impl vendor.nvidia --jobs 4 > "$OUT/san-$tool.log" 2>&1
  echo "$tool rc $? in $(( $(date +%s) - s0 )) s"
  grep -E "SUMMARY|passed, " "$OUT/san-$tool.log" | sort | uniq -c | tail -8
done
s0=$(date +%s)
d=$(mktemp -d)
( timeout 200 "$b/torch_oracle" nvidia "$d" && timeout 100 python3 "$b/torch_oracle.py" "$d" ) > "$OUT/oracle.log" 2>&1
echo "oracle rc $? in $(( $(date +%s) - s0 )) s"; tail -5 "$OUT/oracle.log"
