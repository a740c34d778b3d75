#!/usr/bin/env bash
# Session 5's new GPU paths, tested: the conv fast path (+ gradient destinations), nn's remembered batch-norm calls,
# the channels-last whole-row batch-norm kernels (bn_nhwc), and the suites they touch (conv carry/staging, graphs,
# bn kernels, fusion).  Logs under $OUT.  ~6-8 min on a bare machine (compiles).
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout ${TLIMIT:-480} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=30 \
    tests/nn/test_conv_fast_path_cuda.py tests/test_grad_dest_cuda.py tests/nn/test_bn_fast_path_cuda.py \
    tests/backend/test_bn_nhwc_cuda.py tests/backend/test_bn_kernels.py tests/nn/test_fusion.py \
    tests/backend/test_conv_filter_carry_cuda.py tests/backend/test_conv_staging_once_cuda.py \
    tests/test_cuda_graphs.py ${EXTRA_TESTS} > $OUT/tests.log 2>&1
echo "pytest rc=$?"
tail -30 $OUT/tests.log | grep -v -i "warn"
echo "total: $(( $(date +%s) - start )) s"
