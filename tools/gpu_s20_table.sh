#!/usr/bin/env bash
# Session 20: the rest of the kernel table at HEAD (run 6 timed batch norm and softmax): pooling, cross-entropy,
# bias, dropout, layer / group norm and ReLU on the three large sets, float32 and bfloat16, PyTorch beside.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s20_table.sh
cd "$(dirname "$0")/.."
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
timeout ${CTIME:-330} python3 bench/kernels_gpu.py --sizes large,large2,large3 --dtypes float32,bfloat16 --timing graph \
    --only pool,ce,bias,dropout,ln,gn,relu > $OUT/table.log 2>&1
echo "rc $?"; grep -v -i warn $OUT/table.log
