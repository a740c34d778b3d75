#!/usr/bin/env bash
# Session 13 run 5: the warp-row softmax (softmax_kernels.FWD_WARP) cuda tests in three parallel parts, then its A/Bs
# (tools/row_ab.py: "0" today's PIPE vs "1" / "2" vs PyTorch, graph replays, settings alternated per round) and
# the occupancy probe.  From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s13_run5.sh
cd "$(dirname "$0")/.."
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; start=$(date +%s)
t() { local log=$1; shift; timeout -s INT -k 20 ${TLIMIT:-170} python3 -m pytest -q -m cuda -rf --tb=short \
      -p no:cacheprovider tests/backend/test_softmax_warp.py "$@" > $OUT/$log 2>&1; echo "rc $?" >> $OUT/$log; }
t w1.log -k "6001x1000 or 2113x1024 or graph" &
t w2.log -k "3003x1001 or 5001x513" &
t w3.log -k "bfloat16 or float16" &
wait
for f in $OUT/w*.log; do echo "$(basename $f): $(grep -E 'passed|failed' $f | tail -1) $(tail -1 $f)"; done
grep -hE "^(FAILED|ERROR)" $OUT/w*.log | head -20
c() { local log=$1; shift; timeout ${CTIME:-150} "$@" > $OUT/$log 2>&1; echo "== $log rc=$? ($(( $(date +%s) - start )) s): $*"
      grep -v -i warn $OUT/$log | tail -${TAIL:-60}; }
c ab_fwd.log python3 tools/row_ab.py --dtypes float32 --ops smx,lsmx --rounds 3
c ab_bwd.log python3 tools/row_ab.py --dtypes float32,bfloat16 --ops lsmxbwd --rounds 3
c ab_bf16.log python3 tools/row_ab.py --dtypes bfloat16 --ops smx,lsmx --shapes 16384x1000,16384x513 --rounds 2
c probe.log python3 tools/row_ab.py --dtypes float32 --ops smx,lsmx --shapes 16384x1000 --settings 0,1,1@48,1@40,1@64 --rounds 4
echo "total: $(( $(date +%s) - start )) s"
