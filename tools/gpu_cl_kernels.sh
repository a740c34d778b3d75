#!/usr/bin/env bash
# Where a channels-last bf16 step's GPU time goes (issue 12: bf16+cl graphed is slower than bf16 NCHW for minidnn and
# 2x faster for PyTorch): tools/amp_kernels.py per-kernel device time, minidnn beside PyTorch.  ~90 s.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
timeout 200 python3 tools/amp_kernels.py --models mobilenet,resnet20 --modes bf16,bf16+cl --top 30 > $OUT/cl_kernels.log 2>&1
grep -v -i warn $OUT/cl_kernels.log | grep -E "^==|us " | head -300
