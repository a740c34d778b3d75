#!/usr/bin/env bash
# Session 6, round 6 on the GPU: the last softmax/CE, layer/group-norm and batch-norm candidates -- short tests, the
# kernel rows, and each helper's sweep of its off-by-default candidates.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
t() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
pt() { name=$1; lim=$2; shift 2; timeout $lim python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=10 "$@" > $OUT/$name.log 2>&1; t $name; grep -E "^FAILED|passed|failed" $OUT/$name.log | tail -6; }
pt t_soft 100 tests/backend/test_softmax_rows_cuda.py -k "1000 or 4097 or misaligned or 33-"
pt t_norm 100 tests/backend/test_norm_kernels_v2.py -k "ln_fwd3 or gn_bwd16_routes or (group_norm_v2 and (bfloat16 or float16) and shape0)"
pt t_bn 120 tests/backend/test_bn_onchip.py -k "backward_share or channels_last_rounds or large_tensor"
timeout 90 python3 bench/kernels_gpu.py --sizes large --only softmax,ce,ln,gn,bn,bn_cl --dtypes float32,bfloat16 > $OUT/k.log 2>&1
t k; grep -v -i warn $OUT/k.log | grep -v CuPy
for e in MINIDNN_SOFTMAX_FWD_CAP=16 "MINIDNN_SOFTMAX_FWD_CAP=16 MINIDNN_SOFTMAX_FWD_REGS=48" MINIDNN_SOFTMAX_BWD_REGS=80; do
  echo "-- $e"; env $e timeout 40 python3 tools/softmax_shapes_gpu.py --rows 16384x1000 --trials 3 2>&1 | grep -v -i warn | tail -8
done
t soft_sweep
timeout 40 python3 tools/norm_v2_bench.py --quick --trials 3 > $OUT/norm.log 2>&1
t norm; grep -v -i warn $OUT/norm.log | tail -14
timeout 60 python3 tools/bn_onchip_bench.py --shapes 128x64x56x56,256x16x32x32 --shares "" --cl-rounds --plans > $OUT/bn.log 2>&1
t bn; grep -v -i warn $OUT/bn.log | grep -v "^# plan" | tail -40
echo "total: $(( $(date +%s) - start )) s"
