#!/usr/bin/env bash
# Final device run of the third session (~380 s on one GPU): the atomic filter gradient's and the conv kernels' cuda
# tests + every backend/graph test touched since the last full run (three processes), the atomic-vs-deterministic
# bench, minidnn.compile's overhead (LeNet-5, fp32 and TF32), bench/graphs.py (all models) and bench/conv_gpu.py.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
t() { local log=$1; shift; timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=30 "$@" \
      > $OUT/$log 2>&1; echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/$log; }
t t1.log tests/backend/test_conv_wgrad_atomic.py tests/backend/test_launch.py &
t t2.log tests/backend/test_conv_cuda_kernels.py tests/backend/test_convolution.py tests/backend/test_autotune.py &
t t3.log tests/test_cuda_graphs.py tests/nn/test_layers.py tests/nn/test_models.py tests/test_examples.py tests/backend/test_conv_epilogue_cuda.py &
wait
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/t1.log $OUT/t2.log $OUT/t3.log | tail -30
timeout 60 python3 tools/wgrad_atomic_bench.py --reps 50 2>&1 | grep -vi warn | tee $OUT/wgrad_atomic.log | tail -12
timeout 60 python3 tools/compile_overhead.py --model lenet5 2>&1 | grep -vi warn | tee $OUT/compile_overhead.log
timeout 60 python3 tools/compile_overhead.py --model lenet5 --tf32 2>&1 | grep -vi warn | tee $OUT/compile_overhead_tf32.log
timeout 130 python3 bench/graphs.py --steps 30 2>&1 | grep -vi warn > $OUT/graphs.log
timeout 70 python3 bench/graphs.py --steps 30 --opts sgd --tf32 2>&1 | grep -vi warn > $OUT/graphs_tf32.log
cat $OUT/graphs.log $OUT/graphs_tf32.log
echo "total: $(( $(date +%s) - start )) s"
