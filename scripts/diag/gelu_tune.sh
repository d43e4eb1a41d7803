#!/usr/bin/env bash
# gelu on this card (16384x8192 bf16): the heuristic's launch shape against torch over three
# rounds, then the autotuner's pick (its timings, from the autotune cache) against torch, then the
# heuristic again. Copy it into a folder beside the nvidia bundle's (target/bundle/gelu), or set
# BUNDLE to that bundle. The Hopper tune configs' gelu list was ordered on an H200 (2026-12-01).
b=${BUNDLE:-$(cd "$(dirname "$0")/../nvidia" && pwd)}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
export TEFL_BENCH_WARMUP=${TEFL_BENCH_WARMUP:-1}
heur=$(mktemp -d) tuned=$(mktemp -d)
vs() { "$b/bench" --backend nvidia --only gelu --vs torch --rounds 3 2>&1 | grep -E "bench rounds|^gelu"; }
TEFL_CACHE_DIR=$heur vs
TEFL_AUTOTUNE=1 TEFL_CACHE_DIR=$tuned "$b/bench" --backend nvidia --only gelu --reps 5 > /dev/null 2>&1
for f in "$tuned"/autotune/*/*.json; do echo "$f"; head -c 3000 "$f"; echo; done
TEFL_AUTOTUNE=1 TEFL_CACHE_DIR=$tuned vs
TEFL_CACHE_DIR=$heur vs
