#!/usr/bin/env bash
# Round 8 (closing): every cuda test, then the step benchmarks (graphs strict fp32 SGD+Adam and TF32 SGD,
# train_step strict fp32 with kernels per step, amp_step) and the NCHW conv table as eager calls see it and with
# staging forced (MINIDNN_CONV_STAGE=always in that version of conv_igemm).  Logs under $OUT; ~560 s.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s)
stamp() { echo "[+$(( $(date +%s) - T0 )) s] $*"; }
timeout 60 python3 tools/precompile_conv.py 2>&1 | tail -1
stamp tests
NOBENCH=1 TLIMIT=${TLIMIT:-170} bash tools/gpu_close.sh
stamp graphs
timeout 110 python3 bench/graphs.py --steps 20 > $OUT/graphs.log 2>&1
timeout 60 python3 bench/graphs.py --steps 20 --opts sgd --tf32 > $OUT/graphs_tf32.log 2>&1
grep -v -i warn $OUT/graphs.log $OUT/graphs_tf32.log
stamp train_step
timeout 70 python3 bench/train_step.py --steps 30 > $OUT/train_step.log 2>&1; grep -v -i warn $OUT/train_step.log
stamp amp
timeout 90 python3 bench/amp_step.py --steps 20 > $OUT/amp.log 2>&1; grep -v -i warn $OUT/amp.log | tail -10
stamp conv
timeout 45 python3 bench/conv_kernels.py > $OUT/conv_nchw.log 2>&1; tail -5 $OUT/conv_nchw.log
MINIDNN_CONV_STAGE=always timeout 45 python3 bench/conv_kernels.py > $OUT/conv_nchw_staged.log 2>&1
tail -5 $OUT/conv_nchw_staged.log
stamp done
