#!/usr/bin/env bash
# One device run over the session's helper work (~300 s on one GPU): the one-pass batch-norm kernels
# (tools/gpu_bn.sh, tests + bench rows) in parallel with the shared-staging / conv cuda tests, then
# minidnn.compile's overhead (tools/compile_overhead.py) and bench/train_step.py (eager, kernels per step).
# Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
(timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 \
    tests/backend/test_conv_staging_once_cuda.py tests/backend/test_conv_staging_once.py \
    tests/backend/test_conv_cuda_kernels.py tests/test_cuda_graphs.py > $OUT/conv_tests.log 2>&1
 echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/conv_tests.log) &
NOBENCH=1 bash tools/gpu_bn.sh > $OUT/bn.log 2>&1
wait
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/conv_tests.log $OUT/bn_tests.log $OUT/bn_tests2.log | tail -40
timeout ${BLIMIT:-120} python3 bench/kernels_gpu.py --only bn,bn_cl,bn2 --sizes large,small \
    --dtypes float32,bfloat16 > $OUT/bn_bench.log 2>&1
grep -v -i warn $OUT/bn_bench.log | tail -40
timeout 60 python3 tools/compile_overhead.py --model lenet5 2>&1 | grep -vi warn | tee $OUT/compile_overhead.log
timeout 100 python3 bench/train_step.py --steps 30 2>&1 | grep -vi warn | tee $OUT/train_step.log
echo "total: $(( $(date +%s) - start )) s"
