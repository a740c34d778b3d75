#!/usr/bin/env bash
# Session 6, round 4 on the GPU: the second round of each kernel area (dropout, softmax/CE, pooling/activation,
# layer/group norm, batch norm) -- short test selections, then their kernel rows and sweeps.  PART=a or b.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
t() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
pt() { name=$1; lim=$2; shift 2; timeout $lim python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=10 "$@" > $OUT/$name.log 2>&1; t $name; grep -E "^FAILED|passed|failed" $OUT/$name.log | tail -8; }
if [ "$PART" = a ]; then
  pt t_drop 120 tests/backend/test_dropout_cuda.py
  pt t_soft 170 tests/backend/test_softmax_rows_cuda.py "tests/backend/test_step_cuda_kernels.py::test_softmax_forward_backward" "tests/backend/test_step_cuda_kernels.py::test_softmax_cross_entropy"
  timeout 120 python3 bench/kernels_gpu.py --sizes large,small --only softmax,ce,dropout --dtypes float32,bfloat16 > $OUT/k_a.log 2>&1
  t k_a; grep -v -i warn $OUT/k_a.log | grep -v CuPy
  timeout 60 python3 tools/dropout_bench.py --dtypes float32,bfloat16 > $OUT/drop_bench.log 2>&1
  t drop_bench; grep -v -i warn $OUT/drop_bench.log | grep -E "56, 56|256, 1024|dtype" | head -60
  timeout 60 python3 tools/softmax_shapes_gpu.py --quick > $OUT/soft_shapes.log 2>&1
  t soft_shapes; grep -v -i warn $OUT/soft_shapes.log | tail -40
  MINIDNN_SOFTMAX_BWD_WARP=1 timeout 60 python3 tools/softmax_shapes_gpu.py --quick > $OUT/soft_bwdwarp.log 2>&1
  t soft_bwdwarp; grep -v -i warn $OUT/soft_bwdwarp.log | grep bwd | tail -20
else
  pt t_pool 120 tests/backend/test_pool_act_vec.py tests/backend/test_step_cuda_kernels.py -k "pool"
  pt t_norm 120 tests/backend/test_norm_kernels_v2.py
  timeout 40 python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short "tests/backend/test_bn_onchip.py::test_against_the_float64_reference_with_the_copy_holding_none_part_or_all[None-bn_activation-nchw-(3, 40, 13, 21)-float32]" "tests/backend/test_bn_onchip.py::test_against_the_float64_reference_with_the_copy_holding_none_part_or_all[0-bn_activation-nchw-(3, 40, 13, 21)-float16]" > $OUT/t_bn_one.log 2>&1
  t t_bn_one; grep -E "^E |Error|passed|failed" $OUT/t_bn_one.log | head -30
  timeout 110 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --tb=line tests/backend/test_bn_onchip.py > $OUT/t_bn.log 2>&1
  t t_bn; grep -E "^FAILED|passed|failed|^/" $OUT/t_bn.log | tail -12
  timeout 150 python3 bench/kernels_gpu.py --sizes large,small --only pool,relu,ln,gn,bias,bn,bn_cl --dtypes float32,bfloat16 > $OUT/k_b.log 2>&1
  t k_b; grep -v -i warn $OUT/k_b.log | grep -v CuPy
  timeout 50 python3 tools/bn_onchip_bench.py --shapes 128x64x56x56,256x16x32x32 --plans > $OUT/bn_onchip.log 2>&1
  t bn_onchip; grep -v -i warn $OUT/bn_onchip.log | tail -40
  timeout 25 python3 tools/bn_onchip_bench.py --shapes 256x16x32x32 --dtypes bfloat16 --layouts nchw --eager > $OUT/bn_eager.log 2>&1
  t bn_eager; grep -v -i warn $OUT/bn_eager.log | tail -12
  timeout 40 python3 tools/bn_onchip_bench.py --shapes 128x64x56x56 --dtypes float32 --layouts nhwc --ops "bwd,relu bwd,add bwd" --nhwc-sweep > $OUT/bn_sweep.log 2>&1
  t bn_sweep; grep -v -i warn $OUT/bn_sweep.log | tail -12
fi
echo "total: $(( $(date +%s) - start )) s"
