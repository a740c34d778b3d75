#!/usr/bin/env bash
# Session 6, round 3 on the GPU: PART=pa (the vector pooling/activation kernels and the v2 layer/group-norm and
# bias-gradient kernels) or PART=bn (the on-chip batch-norm kernels) -- their cuda tests, kernel rows and the
# helpers' A/B sweeps.  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
t() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
if [ "$PART" = pa ]; then
  timeout 170 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_pool_act_vec.py \
    tests/backend/test_step_cuda_kernels.py -k "pool or activation or capture" > $OUT/tests_pa.log 2>&1
  t tests_pa; tail -4 $OUT/tests_pa.log
  timeout 170 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_norm_kernels.py \
    tests/backend/test_norm_kernels_v2.py > $OUT/tests_norm.log 2>&1
  t tests_norm; tail -4 $OUT/tests_norm.log
  timeout 100 python3 bench/kernels_gpu.py --sizes large,small --only pool,relu,ln,gn,bias --dtypes float32,bfloat16 > $OUT/kernels.log 2>&1
  t kernels; grep -v -i warn $OUT/kernels.log
  timeout 60 python3 tools/act_pool_sweep.py --part sweep,ab > $OUT/act_pool_sweep.log 2>&1
  t act_pool_sweep; grep -v -i warn $OUT/act_pool_sweep.log | tail -40
  timeout 60 python3 tools/norm_v2_bench.py --dtypes float32,bfloat16 --reps 20 > $OUT/norm_v2.log 2>&1
  t norm_v2; grep -v -i warn $OUT/norm_v2.log | tail -40
else
  timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_bn_onchip.py \
    tests/backend/test_bn_kernels.py tests/backend/test_bn_nhwc_cuda.py > $OUT/tests_bn.log 2>&1
  t tests_bn; tail -4 $OUT/tests_bn.log
  timeout 100 python3 bench/kernels_gpu.py --sizes large,small --only bn,bn_cl,bn2 --dtypes float32,bfloat16 > $OUT/kernels_bn.log 2>&1
  t kernels_bn; grep -v -i warn $OUT/kernels_bn.log
  timeout 90 python3 tools/bn_onchip_bench.py --shapes 128x64x56x56,128x16x32x32 > $OUT/bn_onchip.log 2>&1
  t bn_onchip; grep -v -i warn $OUT/bn_onchip.log | tail -40
fi
echo "total: $(( $(date +%s) - start )) s"
