#!/usr/bin/env bash
# RMSNorm forward diagnostic (the bench and conformance built with scripts/diag/norm_fwd.patch beside it): each config
# its own process, rounds in turns. DIAG_GPF: gamma prefetched to L1 before the reduction;
# DIAG_XNA: x loaded L1::no_allocate; DIAG_NOLOOP: one row a block, no grid-stride loop;
# DIAG_GFIRST: every gamma vector loaded after the reduction before any output (48 registers
# at 10 blocks of 128 an SM: ptxas then issues them before the barrier, as Triton's kernel does).
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export TEFL_BENCH_WARMUP=${TEFL_BENCH_WARMUP:-1}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
"$here/bench" --backend nvidia --only "rmsnorm_fwd 8192" > /dev/null 2>&1  # compile base kernels
configs=("base" "TEFL_DIAG_NORM_DEFS=DIAG_GPF" "TEFL_DIAG_NORM_DEFS=DIAG_XNA" "TEFL_DIAG_NORM_DEFS=DIAG_NOLOOP" "TEFL_DIAG_NORM_DEFS=DIAG_NOLOOP,DIAG_GPF,DIAG_XNA" "TEFL_DIAG_NORM_MINB=10" "TEFL_DIAG_NORM_DEFS=DIAG_GFIRST TEFL_DIAG_NORM_MINB=10" "TEFL_DIAG_NORM_DEFS=DIAG_GFIRST,DIAG_NOLOOP TEFL_DIAG_NORM_MINB=10")
for round in $(seq 1 "${ROUNDS:-3}"); do
  for i in "${!configs[@]}"; do
    c=${configs[$i]}
    envs=(); [ "$c" != base ] && envs=($c)
    env "${envs[@]}" "$here/bench" --backend nvidia --only "${ONLY:-copy,rmsnorm_fwd 8192,rmsnorm_fwd 16384,layernorm_fwd}" --json "$out/d-$i-$round.json" > "$out/d-$i-$round.log" 2>&1
    python3 - "$out/d-$i-$round.json" "$c" "$round" <<'PY'
import json,sys
try:
    rows=json.load(open(sys.argv[1]))["results"]
except Exception as e:
    print(f"r{sys.argv[3]} {sys.argv[2]}: no json ({e})", flush=True); sys.exit(0)
cg=rows[0].get("copy_gbps") if rows else None
parts=[f'{r["op"]}={r["median_ms"]:.4f}' for r in rows]
print(f"r{sys.argv[3]} {sys.argv[2]:45s} copy={cg and round(cg)} " + "  ".join(parts), flush=True)
PY
  done
done
# The attention forward, bshd against thd (the same tensors), each in processes of its own, in
# turns, so that neither always runs after the other.
if [ "${ATTN:-1}" = 1 ]; then
  for round in 1 2; do
    for form in "attn_fwd thd" "attn_fwd causal"; do
      "$here/bench" --backend nvidia --only "$form" --rounds 2 2>&1 | grep -E "bench rounds" | sed "s/^/r$round /" | tee -a "$out/attn.log"
    done
  done
fi
# CHECK="NAME=VALUE ...": the norms family's conformance on the diagnostic build (its
# `conformance` beside this script) with those switches set, so that a form that wins above is
# checked against the oracle in the same session. ROUNDS=0 ATTN=0 runs only this.
if [ -n "${CHECK:-}" ]; then
  env $CHECK "$here/conformance" nvidia --impl vendor.nvidia --families norms 2>&1 | tail -3 | sed "s/^/check [$CHECK] /"
fi
