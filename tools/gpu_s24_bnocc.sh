#!/usr/bin/env bash
# Session 24, run 4: the channels-last batch-norm one-launch kernels at 2 / 3 / 4 blocks an SM (tools/bn_cl_occ_ab.py),
# PyTorch beside.  ~5 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s24_bnocc.sh
cd "$(dirname "$0")/.."
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
timeout 480 python3 tools/bn_cl_occ_ab.py --rounds 3 --trials 5 --shapes 32x256x56x56,128x64x56x56,256x32x56x56 \
  2>&1 | tee $OUT/bnocc.log | grep -v -i warn
