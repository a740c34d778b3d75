#!/usr/bin/env bash
# The device command of sessions 5 and 6: the cuda tests named in $TESTS (limit TTIME s), then the jobs in $JOBS --
# kernels (bench/kernels_gpu.py, KSIZES / KOPTS), prof (tools/profile_step.py, POPTS), the host-path A/Bs (conv_ab,
# bn_ab), bn_nhwc, the paired steps (train, train_tf32, amp) and the channels-last kernel profile (cl).  TAIL lines of
# each log are printed; logs under $OUT.
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
if [ -n "$TESTS" ]; then
  timeout ${TTIME:-200} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=30 $TESTS > $OUT/tests.log 2>&1
  echo "pytest rc=$?"; tail -5 $OUT/tests.log
fi
for job in $JOBS; do
  case $job in
    kernels) timeout 300 python3 bench/kernels_gpu.py --sizes ${KSIZES:-large} ${KOPTS} > $OUT/kernels.log 2>&1 ;;
    prof) timeout 200 python3 tools/profile_step.py ${POPTS} > $OUT/prof.log 2>&1 ;;
    conv_ab) timeout 150 python3 tools/conv_fast_ab.py --rounds 7 --steps 30 > $OUT/conv_ab.log 2>&1 ;;
    bn_ab) timeout 150 python3 tools/bn_fast_ab.py --rounds 7 --steps 30 > $OUT/bn_ab.log 2>&1 ;;
    bn_nhwc) timeout 150 python3 tools/bn_nhwc_bench.py > $OUT/bn_nhwc.log 2>&1 ;;
    train) timeout 200 python3 bench/train_step.py --steps 30 > $OUT/train.log 2>&1 ;;
    train_tf32) timeout 200 python3 bench/train_step.py --steps 30 --tf32 > $OUT/train_tf32.log 2>&1 ;;
    amp) timeout 300 python3 bench/amp_step.py --steps 30 > $OUT/amp.log 2>&1 ;;
    cl) timeout 200 python3 tools/amp_kernels.py --models mobilenet,resnet20 --modes bf16,bf16+cl --top 12 > $OUT/cl.log 2>&1 ;;
  esac
  echo "== $job ($(( $(date +%s) - start )) s)"; grep -v -i warn $OUT/$job.log | tail -${TAIL:-25}
done
echo "total: $(( $(date +%s) - start )) s"
