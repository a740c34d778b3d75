#!/usr/bin/env bash
# Session 6, round 2 on the GPU: the softmax/cross-entropy and dropout kernels, the cublasLt linear and in-place
# conv bias -- their cuda tests, then their kernel rows and the helpers' shape sweeps, then the paired train step.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
t() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
timeout 250 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_softmax_rows_cuda.py \
  tests/backend/test_dropout_cuda.py tests/backend/test_dropout.py tests/backend/test_cublas_lt_cuda.py \
  tests/backend/test_add_tensor_seen_cuda.py tests/nn/test_linear_function_cuda.py > $OUT/tests1.log 2>&1
t tests1; tail -4 $OUT/tests1.log
timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_step_cuda_kernels.py \
  tests/test_cuda_graphs.py tests/test_random.py tests/nn/test_conv_fast_path_cuda.py -k "softmax or cross_entropy or graph or dropout or Dropout or seed or conv" > $OUT/tests2.log 2>&1
t tests2; tail -4 $OUT/tests2.log
timeout 150 python3 bench/kernels_gpu.py --sizes large,small --only softmax,ce,dropout --dtypes float32,bfloat16 > $OUT/kernels.log 2>&1
t kernels; grep -v -i warn $OUT/kernels.log
timeout 100 python3 tools/softmax_shapes_gpu.py --quick > $OUT/softmax_shapes.log 2>&1
MINIDNN_SOFTMAX_V1=1 timeout 60 python3 tools/softmax_shapes_gpu.py --quick --dtypes float32 > $OUT/softmax_v1.log 2>&1
t softmax_shapes; tail -30 $OUT/softmax_shapes.log; tail -15 $OUT/softmax_v1.log
timeout 100 python3 tools/dropout_bench.py > $OUT/dropout_bench.log 2>&1
t dropout_bench; tail -30 $OUT/dropout_bench.log
echo "total: $(( $(date +%s) - start )) s"
