#!/usr/bin/env bash
# Closing device run of the third 2026-11-26 session, part 1 (~400 s on one GPU): every cuda test (tools/gpu_close.sh's
# three pytest groups), compute-sanitizer memcheck over the session's new kernels (the tiled depthwise filter
# gradient and dense few-channel direct paths, the one-pass batch norm, the multi-copy, the fused conv epilogue),
# then tools/conv_epilogue_bench.py.  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
NOBENCH=1 TLIMIT=${TLIMIT:-220} bash tools/gpu_close.sh
san() {
    local log=$1 lim=$2; shift 2
    timeout $lim compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -m cuda \
        -p no:cacheprovider -x "$@" > $OUT/$log 2>&1; echo "rc $?" >> $OUT/$log
}
san san_dw.log 80 tests/backend/test_depthwise_wgrad.py tests/backend/test_conv_dense_c1_direct.py -k "float32 and not bench" &
san san_bn.log 80 tests/backend/test_bn_kernels.py -k "float32" &
san san_epi.log 80 tests/backend/test_conv_epilogue_cuda.py tests/test_cuda_graphs.py -k "float32 or fp32 or dense_copier" &
wait
grep -hE "ERROR SUMMARY|passed|failed|^rc" $OUT/san_*.log
timeout 90 python3 tools/conv_epilogue_bench.py --reps 50 2>&1 | grep -vi warn > $OUT/epilogue_bench.log; tail -30 $OUT/epilogue_bench.log
echo "total: $(( $(date +%s) - start )) s"
