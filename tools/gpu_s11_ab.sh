#!/usr/bin/env bash
# Session 11: eager A/B of two trees on one GPU, alternated (base, new, base, new): bench/amp_step.py (or $BENCH)
# run from each tree in turn, each under its own timeout; the output of every run to $OUT/<tree>_<i>.log and its
# table lines to stdout.  Usage: OUT=... TREES=".snapb .snap" REPS=2 BENCH="bench/amp_step.py --steps 20 --no-graphs"
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; start=$(date +%s)
for i in $(seq 1 ${REPS:-2}); do
  for t in ${TREES:-.snapb .snap}; do
    ( cd $t && PYTHONPATH=. timeout ${CTIME:-120} python3 ${BENCH:-bench/amp_step.py --steps 20 --no-graphs} ) \
      > $OUT/${t#.}_$i.log 2>&1
    echo "== $t run $i rc=$? ($(( $(date +%s) - start )) s)"; grep -v -i warn $OUT/${t#.}_$i.log | tail -${TAIL:-14}
  done
done
