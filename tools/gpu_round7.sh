#!/usr/bin/env bash
# Round 7: the NCHW staging's cuda tests (and the convolution-heavy suites it touches), then the step benchmarks
# (train_step strict fp32 / TF32, graphs SGD+Adam strict fp32 and SGD TF32, amp_step) and the NCHW conv table.
# If the staging tests fail, the benchmarks run with MINIDNN_CONV_STAGE=0 (and say so).  Logs under $OUT; ~540 s.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s)
stamp() { echo "[+$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 60 python3 tools/precompile_conv.py 2>&1 | tail -1
stamp tests
timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_conv_cuda_kernels.py \
    tests/backend/test_convolution.py > $OUT/t_conv.log 2>&1 &
timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/test_examples.py \
    tests/test_cuda_graphs.py tests/nn/test_fusion.py tests/nn/test_bias.py tests/nn/test_layers.py \
    > $OUT/t_models.log 2>&1
wait
grep -hE "^(FAILED|ERROR)|passed|failed" $OUT/t_conv.log $OUT/t_models.log | tail -20
if grep -qE "^(FAILED|ERROR)" $OUT/t_conv.log; then export MINIDNN_CONV_STAGE=0; echo "STAGING OFF for the benches"; fi
stamp benches
timeout 80 python3 bench/train_step.py --steps 30 > $OUT/train_step.log 2>&1
timeout 80 python3 bench/train_step.py --steps 30 --tf32 > $OUT/train_step_tf32.log 2>&1
grep -v -i warn $OUT/train_step.log $OUT/train_step_tf32.log
timeout 110 python3 bench/graphs.py --steps 20 > $OUT/graphs.log 2>&1
timeout 60 python3 bench/graphs.py --steps 20 --opts sgd --tf32 > $OUT/graphs_tf32.log 2>&1
grep -v -i warn $OUT/graphs.log $OUT/graphs_tf32.log
stamp amp
timeout 90 python3 bench/amp_step.py --steps 20 > $OUT/amp.log 2>&1; grep -v -i warn $OUT/amp.log | tail -16
timeout 50 python3 bench/conv_kernels.py > $OUT/conv_nchw.log 2>&1; tail -6 $OUT/conv_nchw.log
stamp done
