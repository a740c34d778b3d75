#!/usr/bin/env bash
# Session 14, run 5: 16-bit dropout with 16-bit draws (DRAW16) and the small-call UNROLL_FIT -- the DROP16
# helper's cuda tests in parallel (each -k group its own process), then the two adoption A/Bs.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s14_run5.sh
cd "$(dirname "$0")/.."
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T=tests/backend/test_dropout16_draw.py
run() { local i=$1; shift; ( timeout -s INT -k 20 170 "$@" > $OUT/p$i.log 2>&1; echo "rc $?" >> $OUT/p$i.log ) & }
P="python3 -m pytest -q -m cuda -rf --tb=short -p no:cacheprovider"
run 1 $P $T -k "draw16_exact and bfloat16"
run 2 $P $T -k "draw16_exact and float16"
run 3 $P $T -k "both_forward or agree or another or switch"
run 4 $P $T -k "graph or statistics"
run 5 $P $T -k "unroll_fit"
run 6 env MINIDNN_DROPOUT_DRAW16=1 $P tests/backend/test_dropout_record.py -k "bitwise and (bfloat16 or float16)"
run 7 env MINIDNN_DROPOUT_DRAW16=1 $P tests/backend/test_dropout_cuda.py
wait
for i in 1 2 3 4 5 6 7; do echo "p$i: $(grep -E 'passed|failed|error' $OUT/p$i.log | tail -1) $(tail -1 $OUT/p$i.log)"; done
grep -hE "^(FAILED|ERROR)" $OUT/p*.log | head -20
timeout 150 python3 tools/dropout_ab.py --dtypes bfloat16,float16 --shapes 128x64x56x56,128x256 \
    --sides bits,bits+d16,bits+d16+nopipe,record+d16,torch --rounds 4 2>&1 | grep -vi warn | tee $OUT/ab1.log
timeout 120 python3 tools/dropout_ab.py --dtypes float32 --shapes 128x16x32x32,128x64x56x56 --sides bits,bits+fit,torch \
    --directions fwd,bwd --rounds 6 2>&1 | grep -vi warn | tee $OUT/ab2.log
