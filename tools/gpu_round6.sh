#!/usr/bin/env bash
# The session's verification run of everything the helpers and the lead changed (one GPU, <= ~540 s): precompile
# the implicit-GEMM configurations, every cuda test (tools/gpu_close.sh's three pytest groups), compute-sanitizer
# memcheck over a subset (implicit GEMM split-K / VEC / residue, norm, pooling), then the kernel benchmarks:
# bench/kernels_gpu.py, bench/conv_kernels.py --layout nhwc, tools/tile_sweep.py (NCHW fp32/TF32), the NCHW layer table.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s)
stamp() { echo "[+$(( $(date +%s) - T0 )) s] $*"; }
timeout 60 python3 tools/precompile_conv.py 2>&1 | tail -1
stamp tests
NOBENCH=1 TLIMIT=${TLIMIT:-200} bash tools/gpu_close.sh
stamp sanitizer
timeout ${SANLIMIT:-80} compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -m cuda \
    -p no:cacheprovider -x tests/backend/test_conv_cuda_kernels.py \
    -k "(split_k_filter_gradient_blends and fp32) or residue_backward_data_element or (vec_loader_matches and fp32)" \
    > $OUT/sanitizer_conv.log 2>&1
echo "rc $?" >> $OUT/sanitizer_conv.log
timeout ${SANLIMIT2:-50} compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -m cuda \
    -p no:cacheprovider -x tests/nn/test_fusion.py tests/backend/test_norm_kernels.py \
    -k "fus or (group_norm and float32) or bias" > $OUT/sanitizer_norm.log 2>&1
echo "rc $?" >> $OUT/sanitizer_norm.log
grep -hE "ERROR SUMMARY|passed|failed|^rc" $OUT/sanitizer_conv.log $OUT/sanitizer_norm.log
stamp kernels_gpu
timeout 60 python3 bench/kernels_gpu.py > $OUT/kernels_gpu.log 2>&1; grep -E "device|ok|<70|slower" $OUT/kernels_gpu.log | head -50
stamp conv
timeout 60 python3 bench/conv_kernels.py --layout nhwc > $OUT/conv_nhwc.log 2>&1; tail -8 $OUT/conv_nhwc.log
timeout 60 python3 tools/tile_sweep.py --reps 20 --modes fp32,tf32 > $OUT/tile_sweep.log 2>&1
grep -E "device|dgrad|total" $OUT/tile_sweep.log | tail -20
timeout 60 python3 bench/conv_kernels.py > $OUT/conv_nchw.log 2>&1; tail -22 $OUT/conv_nchw.log
stamp done
