#!/usr/bin/env bash
# Session 7's closing figures on the GPU, in one call under 600 s: the AMP table (bench/amp_step.py: bf16 / fp16,
# channels_last on and off, eager and graphed, PyTorch beside), the paired eager training steps (strict fp32, then
# TF32), then the kernel-table rows this session changed ($KONLY).  Each job has its own time limit; logs under $OUT.
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
t() { echo "== $1 rc=$2 ($(( $(date +%s) - start )) s)"; }
timeout 90 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
if [ -n "$TESTS" ]; then
timeout ${TTIME:-60} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 $TESTS > $OUT/tests.log 2>&1; t tests $?
grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -20; tail -1 $OUT/tests.log
fi
timeout ${AMP_T:-230} python3 bench/amp_step.py --steps 30 > $OUT/amp.log 2>&1; t amp $?
grep -v -i warn $OUT/amp.log | tail -14
timeout ${TRAIN_T:-110} python3 bench/train_step.py --steps 30 > $OUT/train.log 2>&1; t train $?
grep -v -i warn $OUT/train.log | tail -12
timeout ${TF32_T:-100} python3 bench/train_step.py --steps 30 --tf32 > $OUT/train_tf32.log 2>&1; t train_tf32 $?
grep -v -i warn $OUT/train_tf32.log | tail -12
if [ -n "$KONLY" ]; then
timeout ${K_T:-90} python3 bench/kernels_gpu.py --sizes large --only $KONLY --dtypes float32,bfloat16 > $OUT/kernels.log 2>&1
t kernels $?; grep -v -i warn $OUT/kernels.log | grep -v CuPy
fi
echo "total: $(( $(date +%s) - start )) s"
