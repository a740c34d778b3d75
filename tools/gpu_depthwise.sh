#!/usr/bin/env bash
# One device-tool run for the register-tiled depthwise kernel (dw_tile_forward): its cuda tests, the rest of the
# direct-kernel tests, then bench/conv_kernels.py (depthwise/grouped rows beside cuDNN).  Logs under $OUT.  Wall <= 160 s (70 + 25 + 60).
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/gpu_depthwise_out}; mkdir -p "$OUT"
set -o pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/dw_device.txt
timeout 70 python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short --maxfail=30 -rf \
    tests/backend/test_depthwise_kernels.py 2>&1 | tee $OUT/dw_tests.log | tail -40
timeout 25 python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short --maxfail=20 -rf \
    tests/backend/test_conv_cuda_kernels.py -k "direct or depthwise or alpha_beta or repeatable" 2>&1 \
    | tee $OUT/dw_direct_tests.log | tail -20
timeout ${BENCH_TIMEOUT:-60} python3 bench/conv_kernels.py --reps ${REPS:-10} 2>&1 | tee $OUT/dw_bench.log
