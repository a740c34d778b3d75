#!/usr/bin/env bash
# Session 16 run 11: the batch-norm kernel files' whole cuda suites (bn_cluster, bn_nhwc), which runs 1-2 cut at
# their time limit -- this session changed bn_cluster.py / bn_kernels.py (DX_NHWC, the shadow), split four ways
# (-k expressions with spaces, which gpu_s9_parts.sh's PARTS cannot carry).
#   From a clean archive:  OUT=$OUT bash tools/gpu_s16_run11.sh
cd "$(dirname "$0")/.."
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T=tests/backend/test_bn_nhwc_cuda.py
run() { timeout -s INT -k 20 290 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=30 "$@"; }
run tests/backend/test_bn_cluster.py > $OUT/p1.log 2>&1 &
run $T -k "against_the_float64_reference and (float32 or float64)" > $OUT/p2.log 2>&1 &
run $T -k "against_the_float64_reference and (float16 or bfloat16)" > $OUT/p3.log 2>&1 &
run $T -k "not against_the_float64_reference" > $OUT/p4.log 2>&1 &
wait
for f in $OUT/p*.log; do echo "$(basename $f): $(grep -E 'passed|failed' $f | tail -1)"; done
grep -hE "^(FAILED|ERROR)" $OUT/p*.log | head -30
