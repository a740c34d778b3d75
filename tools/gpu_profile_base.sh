#!/usr/bin/env bash
# A session's opening baseline without tests: the eager step's host profile at the benchmark's shapes on the real
# GPU host (tools/profile_step.py --dump: pstats files per model), then bench/train_step.py strict fp32 and
# bench/amp_step.py (bf16).  Logs under $OUT.  ~250 s.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout 100 python3 tools/profile_step.py --models resnet20,mobilenet,lenet5 --steps 20 --top 40 \
    --dump $OUT/prof > $OUT/profile.log 2>&1
grep -E "wall|host|launch" $OUT/profile.log | head -20
timeout 120 python3 bench/train_step.py --steps 30 > $OUT/train_step.log 2>&1
cat $OUT/train_step.log | grep -v -i warn
echo "total: $(( $(date +%s) - start )) s"
