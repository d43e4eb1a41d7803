#!/usr/bin/env bash
# Runs rmsnorm_torch_loop.py on the GPU machine from a folder that holds it, bench_peers.py
# (tests/src/) and bench_peers_module.py, tefl's wheel built with the nvidia feature (`cd
# tefl-python && maturin build --release --features nvidia --out FOLDER`) and, in FOLDER/peers, the bench's peer wheels
# (FlagGems, sqlalchemy, greenlet: target/bundle/peers): the wheels installed to a scratch
# folder, then the script once a flush (FLUSHES, default "zero memset"), its arguments passed on
# (shapes as ROWSxCOLS); SIDES, ROUNDS and REPS reach the script. Its phase lines ("bench peers:
# SHAPE: SIDE") stay in the output, for with_clocks.sh.
here=$(cd "$(dirname "$0")" && pwd)
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" "$here"/*.whl "$here"/peers/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=$site
for f in ${FLUSHES:-zero memset}; do
  TEFL_BENCH_WARMUP=${TEFL_BENCH_WARMUP:-0.5} TEFL_BENCH_PEER_FLUSH=$f python3 "$here/rmsnorm_torch_loop.py" "$@" 2>&1 \
    | grep -v Warning | grep -E "^(NVIDIA|[0-9]+x|bench peers|context|cuCtx)|rror"
done
