#!/usr/bin/env bash
# The kernel durations of bench's timed calls, as the bench runs them (after its L2 flush, at
# the card's own clocks): Nsight Compute with --cache-control none --clock-control none and one
# metric (gpu__time_duration.sum, one pass, no replay) on every launch of the kernels that
# KERNELS matches, tefl's and its peers' (the peers' Python process followed), for the case
# ONLY names. Each side's last REPS (20) launches are its timed calls (the warm-up's launches
# come first, few of them under ncu); their median is printed beside bench's own figure for
# that side, so the gap between the two is what the events hold besides the kernel. PEER_FLUSH
# (zero or memset) is passed to the peers as TEFL_BENCH_PEER_FLUSH. Copy it into the nvidia
# bundle (beside `bench` and `peers/`) and run it there on the GPU machine.
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu not found"; exit 3; }
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" "$here"/peers/*.whl 2>/dev/null && export PYTHONPATH="$site"
only=${ONLY:-rmsnorm_fwd 8192}
kernels=${KERNELS:-norm_fwd|rms_norm_kernel|triton_}
tag=${PEER_FLUSH:-zero}
TEFL_BENCH_WARMUP=0.1 TEFL_BENCH_PEER_FLUSH=$tag timeout 500 "$ncu" --target-processes all --cache-control none \
  --clock-control none --metrics gpu__time_duration.sum --kernel-name "regex:$kernels" --csv --print-units base \
  "$here/bench" --backend nvidia --vs torch --only "$only" > "$out/durations-$tag.csv" 2> "$out/durations-$tag.err"
echo "rc=$? ($tag)"
grep -E "^(rmsnorm|layernorm|gelu|swiglu|softmax|rope|copy)" "$out/durations-$tag.csv" | head -5
python3 - "$out/durations-$tag.csv" "${REPS:-20}" <<'PY'
import collections, csv, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
head = next((r for r in rows if "Kernel Name" in r), None)
if head is None:
    sys.exit("no ncu rows")
k, v, pid = head.index("Kernel Name"), head.index("Metric Value"), head.index("Process ID")
by = collections.defaultdict(list)
for r in rows:
    if r is head or r[k] == "Kernel Name":
        continue
    try:
        by[(r[pid], r[k][:40])].append(float(r[v].replace(",", "")) / 1e3)
    except ValueError:
        pass
for (p, name), ds in by.items():
    last = ds[-int(sys.argv[2]):]
    print(f"pid {p} {name:40s} launches {len(ds):5d}  last {len(last)}: median {statistics.median(last):.2f} us, "
          f"min {min(last):.2f}, max {max(last):.2f}")
PY
