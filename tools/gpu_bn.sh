#!/usr/bin/env bash
# The batch-norm kernels of issues 10 and 12 on one GPU: their cuda tests (the one-pass kernels against the float64
# reference, fused == unfused bit for bit, the nn channels-last fusion; the older batch-norm, fusion and
# channels-last tests), then bench/kernels_gpu.py's batch-norm rows -- NCHW, channels-last and the two-launch
# kernels for comparison, float32 and bfloat16, PyTorch's op beside each.  Logs under $OUT.  ~250 s.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/device.txt
# a hang in a kernel's wait (a grid larger than the resident blocks) shows as a timeout here, not as a dead run
timeout ${TLIMIT:-200} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 -x \
    tests/backend/test_bn_kernels.py > $OUT/bn_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/bn_tests.log
timeout ${T2LIMIT:-120} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 \
    tests/backend/test_step_cuda_kernels.py tests/nn/test_fusion.py tests/test_channels_last.py \
    -k "batch_norm or bn or fus or channels or step or repeated" > $OUT/bn_tests2.log 2>&1
echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/bn_tests2.log
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/bn_tests.log $OUT/bn_tests2.log | tail -30
[ -n "$NOBENCH" ] && exit 0
timeout ${BLIMIT:-150} python3 bench/kernels_gpu.py --only bn,bn_cl,bn2 --sizes large,small \
    --dtypes float32,bfloat16 > $OUT/bn_bench.log 2>&1
echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/bn_bench.log
cat $OUT/bn_bench.log
echo "total: $(( $(date +%s) - start )) s"
