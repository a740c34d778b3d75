#!/usr/bin/env bash
# Probe run 2: tools/gpu_depthwise.sh (the tiled depthwise filter gradient's tests and bench, tile on/off), then
# minidnn.compile's overhead piece by piece and where LeNet-5's copies / small kernels come from
# (tools/copy_callers.py, with the convolution algorithm of every problem).  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
(timeout 60 python3 tools/compile_overhead.py --model lenet5 > $OUT/compile_overhead.log 2>&1
 timeout 60 python3 tools/copy_callers.py --model lenet5 > $OUT/copy_callers.log 2>&1) &
BENCH_TIMEOUT=60 bash tools/gpu_depthwise.sh > $OUT/depthwise.log 2>&1
wait
grep -E "passed|failed|^FAILED|^ERROR" $OUT/dw_*tests.log | tail -20
grep -E "^depthwise|geomean" $OUT/dw_bench.log $OUT/dw_bench_tile_off.log
grep -v -i warn $OUT/compile_overhead.log; grep "^algorithm" $OUT/copy_callers.log
echo "total: $(( $(date +%s) - start )) s"
