#!/usr/bin/env bash
# Closing device run, part 2 of 2 (one GPU, ~480 s): the training-step benchmarks, minidnn beside PyTorch from
# the same run -- bench/train_step.py (strict fp32 and TF32: eager, kernels per step), bench/graphs.py (eager /
# CUDA-graphed / minidnn.compile; SGD and Adam strict fp32, SGD TF32), bench/amp_step.py (bf16/fp16, channels-last),
# and bench/host_overhead.py --device cuda at HEAD and at $BASE (a snapshot folder of an earlier commit, if given)
# alternated twice.  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout 90 python3 bench/train_step.py --steps 30 > $OUT/train_step.log 2>&1
timeout 90 python3 bench/train_step.py --steps 30 --tf32 > $OUT/train_step_tf32.log 2>&1
grep -v -i warn $OUT/train_step.log $OUT/train_step_tf32.log
timeout 120 python3 bench/graphs.py --steps 20 > $OUT/graphs.log 2>&1
timeout 70 python3 bench/graphs.py --steps 20 --opts sgd --tf32 > $OUT/graphs_tf32.log 2>&1
cat $OUT/graphs.log $OUT/graphs_tf32.log | grep -v -i warn
timeout 100 python3 bench/amp_step.py --steps 20 > $OUT/amp.log 2>&1; tail -14 $OUT/amp.log
if [ -n "$BASE" ]; then
    for r in 1 2; do
        timeout 40 python3 bench/host_overhead.py --device cuda --steps 50 > $OUT/host_head_$r.log 2>&1
        (cd $BASE && PYTHONPATH=. timeout 40 python3 bench/host_overhead.py --device cuda --steps 50) \
            > $OUT/host_base_$r.log 2>&1
    done
    tail -5 $OUT/host_head_*.log $OUT/host_base_*.log
fi
echo "total: $(( $(date +%s) - start )) s"
