#!/usr/bin/env bash
# Bench forms of a diagnostic build in turns: `forms_in_turns.sh ONLY FORM...`, each FORM
# "base" or space-separated VAR=VALUE settings, each run its own process (`bench --backend
# nvidia --only ONLY $BENCH_ARGS`, no peers), ROUNDS (2) rounds in turns after one run of each
# bench that compiles the kernels. A BENCH=PATH word in a form runs that bench binary instead of
# the one beside this script (another build: e.g. `forms_in_turns.sh copy,quantize
# BENCH=../ab/bench_old base` times the bundle's build before against this one). Prints each
# run's rows as "name time rate;" (and a diagnostic bench's read_after lines). CHECK_FAMILY=F
# then runs the conformance of family F (vendor.nvidia, with CHECK_ARGS added) in each form but
# base and the BENCH ones, a line a form.
# The diagnostic scripts beside it (rope_warp.sh, norm_keep.sh, ...) call it; copy it into the
# bundle folder with them.
here=$(cd "$(dirname "$0")" && pwd)
only=$1
shift
export TEFL_BENCH_WARMUP=${TEFL_BENCH_WARMUP:-0.5}
nvidia-smi --query-gpu=name --format=csv,noheader
# form F's bench binary into $bin and its settings into envs.
split() {
  bin="$here/bench" envs=()
  local words=() w
  [ "$1" != base ] && read -r -a words <<< "$1"
  for w in "${words[@]}"; do
    case $w in BENCH=*) bin=${w#BENCH=} ;; *) envs+=("$w") ;; esac
  done
}
warmed=" "
for f in base "$@"; do
  split "$f"
  case $warmed in *" $bin "*) continue ;; esac
  "$bin" --backend nvidia --only "$only" > /dev/null 2>&1
  warmed="$warmed$bin "
done
for r in $(seq 1 "${ROUNDS:-2}"); do
  for f in "$@"; do
    split "$f"
    # shellcheck disable=SC2086 # BENCH_ARGS are words of their own
    line=$(env "${envs[@]}" "$bin" --backend nvidia --only "$only" ${BENCH_ARGS:-} 2>&1 \
      | grep -E "(GB|TFLOP)/s|^read_after" | grep -v "^bench" \
      | sed -E 's/ +/ /g; s/((GB|TFLOP)\/s).*/\1;/; s/ ms$/ ms;/' | tr '\n' ' ')
    echo "r$r $f: $line"
  done
done
if [ -n "${CHECK_FAMILY:-}" ]; then
  for f in "$@"; do
    split "$f"
    [ "$f" = base ] || [ "$bin" != "$here/bench" ] && continue
    # shellcheck disable=SC2086 # CHECK_ARGS are words of their own
    echo "$f: $(env "${envs[@]}" "$here/conformance" nvidia --impl vendor.nvidia --families "$CHECK_FAMILY" ${CHECK_ARGS:-} 2>&1 | tail -1)"
  done
fi
