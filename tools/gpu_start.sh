#!/usr/bin/env bash
# The opening device run of a session: the cuda tests of the code as it stands (tools/gpu_close.sh's three pytest
# groups, no benchmarks), then the eager step's host profile dumped as pstats files (tools/profile_step.py --dump)
# and bench/train_step.py (strict fp32 and TF32) as the session's baseline.  Logs under $OUT.  ~400 s.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
NOBENCH=1 TLIMIT=${TLIMIT:-170} bash tools/gpu_close.sh
timeout 90 python3 tools/profile_step.py --models resnet20,mobilenet,lenet5 --steps 20 --top 30 \
    --dump $OUT/prof > $OUT/profile.log 2>&1
grep -E "wall|host|launch" $OUT/profile.log | head -20
timeout 110 python3 bench/train_step.py --steps 30 > $OUT/train_step.log 2>&1
timeout 110 python3 bench/train_step.py --steps 30 --tf32 > $OUT/train_step_tf32.log 2>&1
cat $OUT/train_step.log $OUT/train_step_tf32.log | grep -v -i warn
echo "total: $(( $(date +%s) - start )) s"
