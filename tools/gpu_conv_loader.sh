#!/usr/bin/env bash
# One device-tool run for the NHWC 16-byte loader (conv_igemm VEC=1) and the one-launch split-K filter gradient:
# the implicit-GEMM cuda tests (float64 references, launch counts, loader choice), then bench/conv_kernels.py
# --layout nhwc: ResNet-20's 3x3 layers at batch 128, element loader vs VEC loader vs PyTorch channels_last
# (cudnn.benchmark on; strict fp32 asked of PyTorch where minidnn is strict), bf16 / TF32 / strict fp32.
# Logs under $OUT; wall < 575 s (the device tool's 600 s per command).
# Usage (repo root):  bash tools/gpu_conv_loader.sh [extra pytest args]
set -uo pipefail
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/gpu_conv_loader_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/loader_device.txt"
# every implicit-GEMM configuration into the disk cache, one process per core (~112 NVRTC runs otherwise serial)
timeout ${PRE_TIMEOUT:-120} python3 tools/precompile_conv.py 2>&1 | tee "$OUT/loader_precompile.log" | tail -3
# the new tests first (split-K, VEC), then the rest of the kernel table (regressions of the element loader)
timeout ${NEW_TIMEOUT:-200} python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short --maxfail=30 -rf \
    -k "split_k or one_launch or vec" tests/backend/test_conv_cuda_kernels.py "$@" 2>&1 \
    | tee "$OUT/loader_tests_new.log" | tail -40
timeout ${REST_TIMEOUT:-120} python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short --maxfail=30 -rf \
    -k "not (split_k or one_launch or vec)" tests/backend/test_conv_cuda_kernels.py "$@" 2>&1 \
    | tee "$OUT/loader_tests_rest.log" | tail -25
timeout ${BENCH_TIMEOUT:-130} python3 bench/conv_kernels.py --layout nhwc --reps ${REPS:-20} 2>&1 \
    | tee "$OUT/loader_bench.log"
