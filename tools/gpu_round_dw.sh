#!/usr/bin/env bash
# Device run for the strided depthwise backward data (dw_tile_backward_data), the NHWC depthwise kernels
# (conv_dw_nhwc) and the cached scratch buffers (cuda/workspace.py), ~450 s on one GPU: their cuda tests and the
# neighbours' (three processes), memcheck over the new kernels, bench/conv_gpu.py's depthwise rows,
# tools/dw_nhwc_bench.py, bench/train_step.py and bench/amp_step.py.  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
t() { local log=$1; shift; timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 "$@" \
      > $OUT/$log 2>&1; echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/$log; }
t ta.log tests/backend/test_depthwise_kernels.py tests/backend/test_dw_strided_dgrad_launch.py &
t tb.log tests/backend/test_dw_nhwc_cuda.py tests/backend/test_depthwise_wgrad.py tests/backend/test_workspace_cuda.py &
t tc.log tests/backend/test_bn_kernels.py tests/test_cuda_graphs.py tests/backend/test_conv_cuda_kernels.py \
    tests/nn/test_fusion.py tests/test_channels_last.py &
wait
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/ta.log $OUT/tb.log $OUT/tc.log | tail -30
timeout 80 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -m cuda -p no:cacheprovider -x \
    tests/backend/test_dw_nhwc_cuda.py tests/backend/test_workspace_cuda.py -k "float32 or fp32 or workspace" \
    > $OUT/san.log 2>&1; echo "rc $?" >> $OUT/san.log; grep -hE "ERROR SUMMARY|passed|failed|^rc" $OUT/san.log
timeout 60 python3 bench/conv_gpu.py --match depthwise --reps 10 2>&1 | grep -vi warn > $OUT/dw_bench.log
grep -E "^depthwise|geomean" $OUT/dw_bench.log
(timeout 40 python3 tools/dw_nhwc_bench.py --dtype bf16; timeout 40 python3 tools/dw_nhwc_bench.py --dtype fp32) 2>&1 \
    | grep -vi warn | tee $OUT/dw_nhwc_bench.log | tail -30
timeout 80 python3 bench/train_step.py --steps 30 2>&1 | grep -vi warn | tee $OUT/train_step.log
timeout 110 python3 bench/amp_step.py --steps 20 2>&1 | grep -vi warn > $OUT/amp.log; tail -9 $OUT/amp.log
echo "total: $(( $(date +%s) - start )) s"
