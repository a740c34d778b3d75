#!/usr/bin/env bash
# Session 6's closing figures on the GPU: the whole kernel table on large tensors (fp32, bf16), the paired eager
# training steps (strict fp32 and TF32) and the AMP table.  PART=k: the changed defaults' cuda tests and the kernel
# table; else the steps.  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
t() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
if [ "$PART" = k ]; then
timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=10 tests/backend/test_pool_act_vec.py \
  tests/backend/test_dropout_cuda.py tests/backend/test_cublas_lt_cuda.py tests/test_grad_dest_cuda.py \
  tests/nn/test_linear_function_cuda.py tests/backend/test_add_tensor_seen_cuda.py tests/test_cuda_graphs.py > $OUT/tests.log 2>&1
t tests; grep -E "^FAILED|passed|failed" $OUT/tests.log | tail -8
timeout 150 python3 bench/kernels_gpu.py --sizes large --dtypes float32,bfloat16 > $OUT/kernels.log 2>&1
t kernels; grep -v -i warn $OUT/kernels.log | grep -v CuPy
else
timeout 120 python3 bench/train_step.py --steps 30 > $OUT/train.log 2>&1
t train; grep -v -i warn $OUT/train.log | tail -12
timeout 120 python3 bench/train_step.py --steps 30 --tf32 > $OUT/train_tf32.log 2>&1
t train_tf32; grep -v -i warn $OUT/train_tf32.log | tail -12
timeout 200 python3 bench/amp_step.py --steps 30 > $OUT/amp.log 2>&1
t amp; grep -v -i warn $OUT/amp.log | tail -16
fi
echo "total: $(( $(date +%s) - start )) s"
