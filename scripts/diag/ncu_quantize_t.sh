#!/usr/bin/env bash
# Nsight Compute on the FP8 cast (16384 x 8192 bf16 -> e4m3, the bench's shape): tefl's
# `quantize` (95% of the copy in the README's H100 run) against `cast_transpose_8x8` (the cast
# with the codes' transpose, 82-83%), each the fifth launch of its process (ncu's defaults:
# base clocks, caches flushed before the kernel), with the DRAM bytes read and written and the
# L2's sectors beside the usual sections: whether the transpose's kernel moves more bytes than
# it must (537 MB: 2 read, 1 + 1 written an element) or the same bytes more slowly. Copy it and
# ncu_profile.sh into the nvidia bundle (beside `bench`) and run it there on the GPU machine;
# $OUT gets both reports, their details pages and their SASS source pages as CSV.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ncu_profile.sh"
ncu_sections="$ncu_sections --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_requests_op_write.sum"
export TEFL_BENCH_WARMUP=0.1
ncu_profile cast '^quantize$' 200 "$here/bench" --backend nvidia --only "quantize 16384"
ncu_profile cast_t cast_transpose_8x8 200 "$here/bench" --backend nvidia --only quantize_t
ncu_summary cast cast_t
for r in cast cast_t; do
  echo "=== $r bytes"
  grep -E "dram__bytes_(read|write)\.sum|lts__t_sectors_op_(read|write)\.sum|lts__t_requests_op_write" "$out/$r.txt"
done
