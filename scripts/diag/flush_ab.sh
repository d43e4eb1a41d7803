#!/usr/bin/env bash
# Whether the peers' L2 flush moves their times: bench --vs torch on the cases ONLY names
# (default: the two rmsnorm forward anchors, layernorm forward, gelu), run PAIRS (2) times in
# turns with the peers flushing by torch's `zero_()` and by the driver's memset that tefl's
# side always flushes with (TEFL_BENCH_PEER_FLUSH=zero / memset). Each run's table rows are
# printed with its flush; the logs go to $OUT/flush-<flush>-<k>.log. Copy it into the nvidia
# bundle (beside `bench` and `peers/`) and run it there on the GPU machine.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" "$here"/peers/*.whl 2>/dev/null && export PYTHONPATH="$site"
only=${ONLY:-rmsnorm_fwd,layernorm_fwd 16384,gelu}
for k in $(seq "${PAIRS:-2}"); do
  for f in zero memset; do
    log=$out/flush-$f-$k.log
    TEFL_BENCH_WARMUP=${WARMUP:-0.5} TEFL_BENCH_PEER_FLUSH=$f timeout "${EACH:-200}" "$here/bench" --backend nvidia \
      --vs torch --only "$only" --rounds "${ROUNDS:-2}" > "$log" 2> "$log.err"
    echo "== peers flush $f, pair $k (rc=$?)"
    grep -E "^(copy|op |rmsnorm|layernorm|gelu|swiglu|softmax|rope|quantize)" "$log" | head -20
  done
done
