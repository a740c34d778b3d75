#!/usr/bin/env bash
# Closing run, part 2 (~350 s on one GPU): the backend cuda tests in three processes by file (one process ran past
# 220 s in part 1), then the kernel benchmarks -- bench/conv_gpu.py (issue 9's table, fp32 and TF32) and
# bench/kernels_gpu.py.  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
files=(tests/backend/test_*.py)
n=${#files[@]}
for i in 0 1 2; do
    part=()
    for ((j = i; j < n; j += 3)); do part+=("${files[$j]}"); done
    (timeout 250 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 "${part[@]}" > $OUT/b$i.log 2>&1
     echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/b$i.log) &
done
wait
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/b0.log $OUT/b1.log $OUT/b2.log | tail -30
timeout 150 python3 bench/conv_gpu.py --reps 10 2>&1 | grep -vi warn > $OUT/conv_gpu.log; sed -n '/^| layer/,$p' $OUT/conv_gpu.log
timeout 90 python3 bench/kernels_gpu.py 2>&1 | grep -vi warn > $OUT/kernels_gpu.log; tail -45 $OUT/kernels_gpu.log
echo "total: $(( $(date +%s) - start )) s"
