#!/usr/bin/env bash
# Probe run (issue 11/12, ~200 s on one GPU): minidnn.compile's overhead over a hand capture piece by piece
# (tools/compile_overhead.py), LeNet-5's device kernels beside PyTorch's (strict fp32 and TF32), LeNet graphed
# (bench/graphs.py), and the bf16 ResNet-20 kernel table (tools/amp_kernels.py).  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout 60 python3 tools/compile_overhead.py --model lenet5 > $OUT/compile_overhead.log 2>&1
timeout 60 python3 tools/compile_overhead.py --model lenet5 --tf32 > $OUT/compile_overhead_tf32.log 2>&1
cat $OUT/compile_overhead.log $OUT/compile_overhead_tf32.log | grep -vi warn
timeout 60 python3 tools/profile_step.py --kernels --models lenet5 --top 40 > $OUT/lenet_kernels.log 2>&1
timeout 60 python3 tools/profile_step.py --kernels --models lenet5 --top 40 --tf32 > $OUT/lenet_kernels_tf32.log 2>&1
timeout 60 python3 bench/graphs.py --steps 50 --models lenet5 --opts sgd > $OUT/graphs_lenet.log 2>&1
timeout 60 python3 bench/graphs.py --steps 50 --models lenet5 --opts sgd --tf32 > $OUT/graphs_lenet_tf32.log 2>&1
cat $OUT/graphs_lenet.log $OUT/graphs_lenet_tf32.log | grep -vi warn
timeout 80 python3 tools/amp_kernels.py --models resnet20 --modes bf16 --top 30 2>&1 | grep -vi warn > $OUT/amp_kernels.log
echo "total: $(( $(date +%s) - start )) s"
