#!/usr/bin/env bash
# One device-tool run for the register-tiled depthwise kernels (dw_tile_forward: forward and stride-1 backward data
# with FLIP=1; dw_tile_backward_filter: the filter gradient): their cuda tests, the rest of the direct-kernel
# tests, then bench/conv_kernels.py's depthwise rows beside cuDNN, with the tile kernels on and, as the same card's
# baseline, off (MINIDNN_DW_TILE=0: the plane kernels).  Logs under $OUT.  Wall <= 395 s (150+90+30+60+65).
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/gpu_depthwise_out}; mkdir -p "$OUT"
set -o pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/dw_device.txt
timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short --maxfail=30 -rf \
    tests/backend/test_depthwise_wgrad.py 2>&1 | tee $OUT/dw_wgrad_tests.log | tail -40
timeout 90 python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short --maxfail=30 -rf \
    tests/backend/test_depthwise_kernels.py 2>&1 | tee $OUT/dw_tests.log | tail -30
timeout 30 python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short --maxfail=20 -rf \
    tests/backend/test_conv_cuda_kernels.py -k "direct or depthwise or alpha_beta or repeatable" 2>&1 \
    | tee $OUT/dw_direct_tests.log | tail -20
timeout ${BENCH_TIMEOUT:-60} python3 bench/conv_kernels.py --reps ${REPS:-20} --match depthwise 2>&1 \
    | tee $OUT/dw_bench.log
MINIDNN_DW_TILE=0 timeout 65 python3 bench/conv_kernels.py --reps ${REPS:-20} --match depthwise 2>&1 \
    | tee $OUT/dw_bench_tile_off.log | grep -E "^depthwise|geomean"
