#!/usr/bin/env bash
# Device run for issue 12's float32 weight gradients under autocast (one GPU, ~4-6 min): the cuda cases of
# tests/amp/test_float32_weight_grads.py (every filter-gradient kernel family writing float32 dw from bf16/fp16 data
# against float64 -- implicit GEMM with split-K NCHW/NHWC, groups 2, the direct kernels, depthwise NCHW/NHWC/5x5,
# ALGO_0 bitwise against the plain kernel's rounding, ALGO_3 by value; cuBLAS's float32 C and the column sum's
# float32 db; the nn path on cuda), the rest of tests/amp's cuda cases, then the casts per step
# (tools/amp_kernels.py --casts: expect no Transfer.backward astype left) and bench/amp_step.py eager + graphed.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout ${TLIMIT:-150} python3 -m pytest -q -m cuda -p no:cacheprovider tests/amp/test_float32_weight_grads.py \
    > $OUT/wgrad_tests.log 2>&1; tail -15 $OUT/wgrad_tests.log
timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider tests/amp --ignore=tests/amp/test_float32_weight_grads.py \
    > $OUT/amp_tests.log 2>&1; tail -5 $OUT/amp_tests.log
timeout 60 python3 tools/amp_kernels.py --models resnet20 --modes bf16 --casts > $OUT/casts.txt 2>&1; tail -30 $OUT/casts.txt
timeout 150 python3 bench/amp_step.py --steps ${STEPS:-20} > $OUT/amp_bench.log 2>&1; cat $OUT/amp_bench.log
