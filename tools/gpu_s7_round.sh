#!/usr/bin/env bash
# The per-round device command (sessions 7 and 8): $TESTS (cuda tests, TTIME s), then each command in $CMDS (";;"-separated, each under
# CTIME s) with its log under $OUT (at most 7 commands: the tool returns 8 files).  The compiled-kernel cache lives
# outside the snapshot when the caller says so (CUPY_CACHE_DIR), so a warm machine keeps it between rounds.
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
[ -n "$PRECOMPILE" ] && timeout 90 python3 tools/precompile_conv.py > /dev/null 2>&1
if [ -n "$TESTS" ]; then
  timeout ${TTIME:-200} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=30 $TESTS > $OUT/tests.log 2>&1
  echo "pytest rc=$? ($(( $(date +%s) - start )) s)"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -20; tail -2 $OUT/tests.log
fi
i=0
IFS=$'\n'; for c in $(echo "$CMDS" | sed 's/;;/\n/g'); do
  i=$((i+1)); eval "timeout ${CTIME:-150} $c" > $OUT/cmd$i.log 2>&1
  echo "== cmd$i rc=$? ($(( $(date +%s) - start )) s): $c"; grep -v -i warn $OUT/cmd$i.log | tail -${TAIL:-40}
done
echo "total: $(( $(date +%s) - start )) s"
