#!/usr/bin/env bash
# Issue 9's batch-norm fusions on the GPU (~6-7 min): the fused kernels compiled in parallel first
# (tools/precompile_conv.py --bn: the options the tests and bench launch; then the plain ones), their cuda tests and
# dispatch / seen-call tests, the fused-epilogue tests they share code with, then tools/conv_epilogue_bench.py --bn
# (fused vs composition vs plain conv vs PyTorch; host-included and CUDA-graph GPU-only columns).  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 150 python3 tools/precompile_conv.py --bn 2>&1 | tail -2 | tee $OUT/precompile.log
timeout 150 python3 tools/precompile_conv.py 2>&1 | tail -2 | tee -a $OUT/precompile.log
echo "precompiled after $(( $(date +%s) - start )) s"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rf --maxfail=40 tests/backend/test_conv_epilogue_bn_cuda.py \
    tests/backend/test_conv_fused_bn.py tests/backend/test_conv_epilogue_bn_dispatch.py \
    tests/backend/test_conv_fused_seen.py tests/backend/test_conv_epilogue_cuda.py > $OUT/tests.log 2>&1
echo "tests rc $? after $(( $(date +%s) - start )) s" >> $OUT/tests.log
grep -hE "^(FAILED|ERROR)|passed|failed|rc " $OUT/tests.log | tail -45
timeout 300 python3 tools/conv_epilogue_bench.py --bn --reps 50 2>&1 | grep -vi warn | tee $OUT/bench_bn.log
echo "total: $(( $(date +%s) - start )) s"
