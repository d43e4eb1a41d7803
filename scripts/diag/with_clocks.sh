#!/usr/bin/env bash
# Runs a command while nvidia-smi logs the GPU's SM clock, power draw, temperature and active
# clock-event (throttle) reasons every INTERVAL_MS (100) milliseconds, so that timings that
# drift from round to round can be set beside the clock they ran at. The command's output lines
# are printed with the seconds since the start; then, for each second of the run, the SM
# clock's min / max, the highest power and temperature and the event reasons seen.
#
#   bash scripts/diag/with_clocks.sh target/bundle/nvidia/bench --backend nvidia \
#       --only "attn_fwd causal" --rounds 5
#
# Then, for bench's plain lines, each phase (tefl's round of a case, from `bench: CASE: tefl,
# round K of N`; each peer, from `bench peers: SPEC: PEER`; to the next line): its mean and
# lowest SM clock and mean power, so that each side's time can be set beside the clock it ran
# at (a warm-up and its timed calls together).
# The raw samples go to $OUT/clocks.csv and the stamped lines to $OUT/stamped.log (OUT defaults
# to /tmp/out). GPU (default 0) picks the card. Exits with the command's status.
set -u
[ $# -gt 0 ] || { echo "usage: with_clocks.sh COMMAND [ARGS...]" >&2; exit 2; }
out=${OUT:-/tmp/out}
mkdir -p "$out"
csv=$out/clocks.csv
fields=timestamp,clocks.sm,power.draw,temperature.gpu
# The reasons' field was renamed (clocks_throttle_reasons -> clocks_event_reasons); take the
# one this driver knows, or none.
for reasons in clocks_event_reasons.active clocks_throttle_reasons.active; do
  if nvidia-smi -i "${GPU:-0}" --query-gpu="$reasons" --format=csv,noheader > /dev/null 2>&1; then
    fields=$fields,$reasons
    break
  fi
done
nvidia-smi -i "${GPU:-0}" --query-gpu="$fields" --format=csv,noheader,nounits -lms "${INTERVAL_MS:-100}" > "$csv" 2>&1 &
logger=$!
t0=$(date +%s.%N)
"$@" 2>&1 | while IFS= read -r line; do
  printf '[%6.1f s] %s\n' "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "$line"
done | tee "$out/stamped.log"
rc=${PIPESTATUS[0]}
kill "$logger" 2> /dev/null
wait "$logger" 2> /dev/null
python3 - "$csv" "$t0" "$out/stamped.log" <<'PY'
import csv, datetime, re, sys
path, t0, stamped = sys.argv[1], float(sys.argv[2]), sys.argv[3]
start = datetime.datetime.fromtimestamp(t0)
seconds = {}
samples = []
for row in csv.reader(open(path)):
    row = [c.strip() for c in row]
    if len(row) < 4:
        continue
    try:
        when = datetime.datetime.strptime(row[0], "%Y/%m/%d %H:%M:%S.%f")
        clock, power, temp = float(row[1]), float(row[2]), float(row[3])
    except ValueError:
        continue  # a header, "[N/A]" or an error line
    at = (when - start).total_seconds()
    samples.append((at, clock, power))
    s = max(0, int(at))
    b = seconds.setdefault(s, [clock, clock, power, temp, set()])
    b[0], b[1] = min(b[0], clock), max(b[1], clock)
    b[2], b[3] = max(b[2], power), max(b[3], temp)
    if len(row) > 4 and row[4] not in ("0x0000000000000000", "[N/A]"):
        b[4].add(row[4])
if not seconds:
    print(f"clocks: no samples in {path}")
    sys.exit(0)
print("second  sm MHz (min-max)  power W  temp C  event reasons")
for s in sorted(seconds):
    lo, hi, p, t, r = seconds[s]
    print(f"{s:6d}  {lo:6.0f}-{hi:<6.0f}     {p:7.1f}  {t:6.0f}  {' '.join(sorted(r)) or '-'}")
# bench's phases: from each line that starts one (tefl's round, `bench: CASE: tefl, round K of
# N`; a peer, `bench peers: SPEC: PEER`) to the next stamped line, with the samples inside.
lines = []
for text in open(stamped, errors="replace"):
    m = re.match(r"\[\s*([0-9.]+) s\] (.*)", text.rstrip("\n"))
    if m:
        lines.append((float(m.group(1)), m.group(2)))
phase = re.compile(r"bench: (.+): tefl, round \d+ of \d+$|bench peers: (.+): (\w+)$")
rows = []
for i, (at, text) in enumerate(lines):
    if not phase.match(text) or i + 1 == len(lines):
        continue
    end = lines[i + 1][0]
    inside = [(c, p) for t, c, p in samples if at <= t < end]
    if inside:
        mean = sum(c for c, _ in inside) / len(inside)
        rows.append(f"{at:7.1f}  {end - at:5.1f}  {mean:6.0f} {min(c for c, _ in inside):6.0f}  "
                    f"{sum(p for _, p in inside) / len(inside):6.1f}  {text.split(': ', 1)[1]}")
if rows:
    print("phase at s  length s  sm MHz mean / min  power W mean  what")
    print("\n".join(rows))
PY
exit "$rc"
