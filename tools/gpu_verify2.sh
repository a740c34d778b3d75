#!/usr/bin/env bash
# A mid-session verification run: tools/gpu_close.sh's three cuda-test groups (no benchmarks), then
# bench/train_step.py in strict fp32 (eager step times and kernels per step beside PyTorch).  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
NOBENCH=1 TLIMIT=${TLIMIT:-170} bash tools/gpu_close.sh
timeout 110 python3 bench/train_step.py --steps 30 ${TS_ARGS} > $OUT/train_step.log 2>&1
grep -v -i warn $OUT/train_step.log
echo "total: $(( $(date +%s) - start )) s"
