#!/usr/bin/env bash
# Session 6's closing figures on the GPU: the whole kernel table on large tensors (fp32, bf16), the paired eager
# training steps (strict fp32 and TF32) and the AMP table.  Logs under $OUT.  ~8 min.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
t() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout 150 python3 bench/kernels_gpu.py --sizes large --dtypes float32,bfloat16 > $OUT/kernels.log 2>&1
t kernels; grep -v -i warn $OUT/kernels.log | grep -v CuPy
timeout 120 python3 bench/train_step.py --steps 30 > $OUT/train.log 2>&1
t train; grep -v -i warn $OUT/train.log | tail -12
timeout 120 python3 bench/train_step.py --steps 30 --tf32 > $OUT/train_tf32.log 2>&1
t train_tf32; grep -v -i warn $OUT/train_tf32.log | tail -12
timeout 200 python3 bench/amp_step.py --steps 30 > $OUT/amp.log 2>&1
t amp; grep -v -i warn $OUT/amp.log | tail -16
echo "total: $(( $(date +%s) - start )) s"
