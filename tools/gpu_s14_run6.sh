#!/usr/bin/env bash
# Session 14, run 6: the log-softmax forward candidates (softmax_kernels.FWD_LSM "1" / "2") -- the LSM helper's cuda
# tests in two parallel groups, then its adoption A/B (fp32 shapes), bf16 and the blocks-per-SM probe.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s14_run6.sh
cd "$(dirname "$0")/.."
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T=tests/backend/test_lsm_warp.py
P="python3 -m pytest -q -m cuda -rf --tb=short -p no:cacheprovider"
( timeout -s INT -k 20 150 $P $T -k "float32 or graph" > $OUT/p1.log 2>&1; echo "rc $?" >> $OUT/p1.log ) &
( timeout -s INT -k 20 150 $P $T -k "bfloat16 or float16" > $OUT/p2.log 2>&1; echo "rc $?" >> $OUT/p2.log ) &
wait
for i in 1 2; do echo "p$i: $(grep -E 'passed|failed|error' $OUT/p$i.log | tail -1) $(tail -1 $OUT/p$i.log)"; done
grep -hE "^(FAILED|ERROR)" $OUT/p*.log | head -20
timeout 150 python3 tools/row_ab.py --ops lsm --dtypes float32 --shapes 16384x1000,32768x1000,16384x513 --rounds 3 \
    2>&1 | grep -vi warn | tee $OUT/ab1.log
timeout 100 python3 tools/row_ab.py --ops lsm --dtypes bfloat16 --shapes 16384x1000,16384x513 --rounds 3 2>&1 \
    | grep -vi warn | tee $OUT/ab2.log
timeout 100 python3 tools/row_ab.py --ops lsm --dtypes float32 --shapes 16384x1000 --lsm 0,2,0@56,2@56,smx --rounds 4 \
    2>&1 | grep -vi warn | tee $OUT/ab3.log
