#!/usr/bin/env bash
# Closing device run, part 1 of 2 (one GPU, ~420 s): every cuda test (tools/gpu_close.sh's three pytest groups),
# compute-sanitizer memcheck over a subset of the kernel tests (the implicit-GEMM split-K and VEC cases, batch norm,
# layer/group norm, pooling), then the kernel benchmarks: bench/kernels_gpu.py and bench/conv_kernels.py in NCHW
# and NHWC.  Logs under $OUT.  Part 2 (step benchmarks): tools/gpu_close_bench.sh.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
NOBENCH=1 TLIMIT=${TLIMIT:-200} bash tools/gpu_close.sh
timeout ${SANLIMIT:-90} compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -m cuda \
    -p no:cacheprovider -x tests/backend/test_conv_cuda_kernels.py tests/backend/test_depthwise_kernels.py -k "(split_k_filter_gradient_blends and fp32) or residue_backward_data_element or (vec_loader_matches and fp32) or (float32 and not bench)" \
    > $OUT/sanitizer_conv.log 2>&1; echo "rc $?" >> $OUT/sanitizer_conv.log
timeout ${SANLIMIT2:-60} compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -m cuda \
    -p no:cacheprovider -x tests/backend/test_norm_kernels.py tests/nn/test_fusion.py -k "float32 or fus or bn" \
    > $OUT/sanitizer_norm.log 2>&1; echo "rc $?" >> $OUT/sanitizer_norm.log
grep -hE "ERROR SUMMARY|passed|failed|^rc" $OUT/sanitizer_conv.log $OUT/sanitizer_norm.log
timeout ${KLIMIT:-60} python3 bench/kernels_gpu.py > $OUT/kernels_gpu.log 2>&1
timeout ${CLIMIT:-70} python3 bench/conv_kernels.py > $OUT/conv_nchw.log 2>&1
timeout ${CLIMIT:-70} python3 bench/conv_kernels.py --layout nhwc > $OUT/conv_nhwc.log 2>&1
tail -12 $OUT/conv_nchw.log; tail -5 $OUT/conv_nhwc.log
echo "total: $(( $(date +%s) - start )) s"
