#!/usr/bin/env bash
# Closing run, part 3 (~520 s on one GPU): the step benchmarks, minidnn beside PyTorch from the same run --
# bench/train_step.py (strict fp32, TF32: eager, kernels per step), bench/graphs.py (eager / graphed / compile; SGD
# and Adam strict fp32, SGD TF32) and bench/amp_step.py (bf16/fp16, channels-last).  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout 80 python3 bench/train_step.py --steps 30 2>&1 | grep -vi warn > $OUT/train_step.log
timeout 80 python3 bench/train_step.py --steps 30 --tf32 2>&1 | grep -vi warn > $OUT/train_step_tf32.log
cat $OUT/train_step.log $OUT/train_step_tf32.log
timeout 130 python3 bench/graphs.py --steps 20 2>&1 | grep -vi warn > $OUT/graphs.log
timeout 70 python3 bench/graphs.py --steps 20 --opts sgd --tf32 2>&1 | grep -vi warn > $OUT/graphs_tf32.log
cat $OUT/graphs.log $OUT/graphs_tf32.log
timeout 110 python3 bench/amp_step.py --steps 20 2>&1 | grep -vi warn > $OUT/amp.log; tail -14 $OUT/amp.log
echo "total: $(( $(date +%s) - start )) s"
