#!/usr/bin/env bash
# Fourth session's closing run (~8 min on one GPU): (1) the test-order leak check -- a TF32 test file, then
# test_conv_fused.py's strict-fp32 cases in the same process (tests/conftest.py now restores the cudnn flags and
# the default handles' settings after each test); (2) tools/amp_accuracy_ab.py: bf16 digits accuracy with autocast's
# float32 weight gradients on/off over 6 seeds, fp32 beside; (3) bench/conv_gpu.py (issue 9's table, fp32 + TF32);
# (4) bench/amp_step.py.  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout 120 python3 -m pytest -q -m cuda -p no:cacheprovider -rf tests/backend/test_conv_filter_carry_cuda.py \
    tests/backend/test_conv_staging_once_cuda.py tests/backend/test_conv_fused.py > $OUT/order.log 2>&1
tail -6 $OUT/order.log; echo "after $(( $(date +%s) - start )) s"
timeout 150 python3 tools/amp_accuracy_ab.py --seeds 6 2>&1 | grep -vi warn | tee $OUT/amp_accuracy.log
echo "after $(( $(date +%s) - start )) s"
timeout 170 python3 bench/conv_gpu.py --reps 10 2>&1 | grep -vi warn > $OUT/conv_gpu.log; sed -n '/^| layer/,$p' $OUT/conv_gpu.log | tail -40
echo "after $(( $(date +%s) - start )) s"
timeout 120 python3 bench/amp_step.py --steps 20 2>&1 | grep -vi warn > $OUT/amp.log; tail -10 $OUT/amp.log
echo "total: $(( $(date +%s) - start )) s"
