#!/usr/bin/env bash
# Session 8's first device call: every cuda test (tools/gpu_all_tests7.sh, TLIMIT each part), then the paired eager
# training steps (strict fp32, then TF32) as this session's baseline on this host.  Logs under $OUT.
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
TLIMIT=${TLIMIT:-330} OUT=/tmp/tlogs bash tools/gpu_all_tests7.sh
cat /tmp/tlogs/*.log /tmp/tlogs/*.txt > $OUT/tests_all.log 2>/dev/null  # one file back (the tool returns at most 8)
timeout ${TRAIN_T:-100} python3 bench/train_step.py --steps 30 > $OUT/train.log 2>&1; echo "== train rc=$? ($(( $(date +%s) - start )) s)"
grep -v -i warn $OUT/train.log | tail -12
timeout ${TF32_T:-90} python3 bench/train_step.py --steps 30 --tf32 > $OUT/train_tf32.log 2>&1; echo "== tf32 rc=$? ($(( $(date +%s) - start )) s)"
grep -v -i warn $OUT/train_tf32.log | tail -12
echo "total: $(( $(date +%s) - start )) s"
