#!/usr/bin/env bash
# Session 6, round 5 on the GPU: pooling's vector backward (opt-in) and 16-bit ReLU launch; layer norm ln_fwd3 and
# group norm's compile-time flags -- short tests, kernel rows, sweeps.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
t() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_pool_act_vec.py > $OUT/t_pool.log 2>&1
t t_pool; grep -E "^FAILED|passed|failed" $OUT/t_pool.log | tail -6
timeout 120 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_norm_kernels_v2.py -k "(ln_fwd3 and bfloat16) or (group_norm_v2 and (bfloat16 or float32) and (shape0 or shape2 or shape5)) or (layer_norm_v2 and bfloat16 and not misaligned)" > $OUT/t_norm.log 2>&1
t t_norm; grep -E "^FAILED|passed|failed" $OUT/t_norm.log | tail -6
timeout 60 python3 bench/kernels_gpu.py --sizes large --only pool,relu,ln,gn,bias --dtypes float32,bfloat16 > $OUT/k.log 2>&1
t k; grep -v -i warn $OUT/k.log | grep -v CuPy
timeout 60 python3 tools/act_pool_sweep.py --part sweep,ab > $OUT/sweep.log 2>&1
t sweep; grep -v -i warn $OUT/sweep.log | tail -45
timeout 50 python3 tools/norm_v2_bench.py --trials 3 > $OUT/norm.log 2>&1
t norm; grep -v -i warn $OUT/norm.log | tail -45
echo "total: $(( $(date +%s) - start )) s"
