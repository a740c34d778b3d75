#!/usr/bin/env bash
# Where the eager step's host time goes after this session's fast paths (tools/profile_step.py dumps), and the AMP
# table (bench/amp_step.py, paired).  Logs under $OUT.  ~6 min.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout 100 python3 tools/profile_step.py --models lenet5,resnet20,mobilenet --steps 20 --top 30 \
    --dump $OUT/prof > $OUT/profile.log 2>&1
grep -E "^==" $OUT/profile.log
timeout 330 python3 bench/amp_step.py --steps 30 > $OUT/amp.log 2>&1
grep -v -i warn $OUT/amp.log
echo "total: $(( $(date +%s) - start )) s"
