#!/usr/bin/env bash
# Session 9's closing device call: every cuda test (tools/gpu_all_tests7.sh in $PARTS backend parts, TLIMIT each),
# then each ";;"-separated command of $CMDS (CTIME each).  Logs under $OUT (one file for all the tests' logs: the
# tool returns at most 8 files).
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
PARTS=${PARTS:-12} TLIMIT=${TLIMIT:-330} OUT=/tmp/tlogs bash tools/gpu_all_tests7.sh | tail -25
cat /tmp/tlogs/*.log /tmp/tlogs/*.txt > $OUT/tests_all.log 2>/dev/null
i=0
IFS=$'\n'; for c in $(echo "$CMDS" | sed 's/;;/\n/g'); do
  i=$((i+1)); eval "timeout ${CTIME:-150} $c" > $OUT/cmd$i.log 2>&1
  echo "== cmd$i rc=$? ($(( $(date +%s) - start )) s): $c"; grep -v -i warn $OUT/cmd$i.log | tail -${TAIL:-30}
done
echo "total: $(( $(date +%s) - start )) s"
