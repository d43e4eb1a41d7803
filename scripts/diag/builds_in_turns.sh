#!/usr/bin/env bash
# Two builds' bench binaries in turns: `builds_in_turns.sh ONLY OLD_BENCH NEW_BENCH`, each run
# its own process (`bench --backend nvidia --only ONLY $BENCH_ARGS`, no peers), ROUNDS (3)
# rounds in turns after one run of each that compiles the kernels. Prints each run's rows as
# "name time rate;". For a kernel change against the bundle it replaces: copy the old bundle's
# bench aside (target/bundle/ab/bench_old) before `cargo xtask bundle nvidia`, then carry both.
only=$1 old=$2 new=$3
export TEFL_BENCH_WARMUP=${TEFL_BENCH_WARMUP:-0.5}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for b in "$old" "$new"; do "$b" --backend nvidia --only "$only" > /dev/null 2>&1; done
for r in $(seq 1 "${ROUNDS:-3}"); do
  for b in "$old" "$new"; do
    # shellcheck disable=SC2086 # BENCH_ARGS are words of their own
    line=$("$b" --backend nvidia --only "$only" ${BENCH_ARGS:-} 2>&1 | grep -E "(GB|TFLOP)/s" | grep -v "^bench" \
      | sed -E 's/ +/ /g; s/((GB|TFLOP)\/s).*/\1;/' | tr '\n' ' ')
    echo "r$r $(basename "$b"): $line"
  done
done
