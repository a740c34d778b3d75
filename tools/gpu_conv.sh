#!/usr/bin/env bash
# One device-tool run for issue 9's CUDA convolution kernels: their cuda tests, then bench/conv_kernels.py
# (minidnn's kernels and autotuner beside PyTorch/cuDNN from the same run).  Logs under $OUT.  Wall < 150 s.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/gpu_conv_out}; mkdir -p "$OUT"
set -o pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/conv_device.txt
timeout 85 python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short --maxfail=40 -rf \
    tests/backend/test_conv_cuda_kernels.py 2>&1 | tee $OUT/conv_tests.log | tail -60
timeout ${BENCH_TIMEOUT:-55} python3 bench/conv_kernels.py --reps ${REPS:-10} 2>&1 | tee $OUT/conv_bench.log
