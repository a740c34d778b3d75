#!/usr/bin/env bash
# LeNet-5 on the GPU (issue 11, ~200 s): the direct kernels for one-input-channel convolutions (cuda tests), the
# multi-copy replay of minidnn.compile (cuda graphs tests, tools/compile_overhead.py), the conv1/conv2 kernel A/B
# (tools/lenet_conv_ab.py), LeNet's kernel table beside PyTorch's and bench/graphs.py (fp32 and TF32).
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_depthwise_kernels.py \
    tests/backend/test_depthwise_wgrad.py tests/backend/test_conv_dense_c1_direct.py tests/test_cuda_graphs.py \
    > $OUT/tests.log 2>&1; echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/tests.log
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/tests.log | tail -20
timeout 60 python3 tools/lenet_conv_ab.py 2>&1 | grep -vi warn | tee $OUT/lenet_conv_ab.log
timeout 60 python3 tools/compile_overhead.py --model lenet5 2>&1 | grep -vi warn | tee $OUT/compile_overhead.log
timeout 60 python3 tools/profile_step.py --kernels --models lenet5 --top 40 2>&1 | grep -vi warn > $OUT/lenet_kernels.log
head -30 $OUT/lenet_kernels.log
timeout 60 python3 bench/graphs.py --steps 50 --models lenet5 --opts sgd,adam 2>&1 | grep -vi warn
timeout 60 python3 bench/graphs.py --steps 50 --models lenet5 --opts sgd --tf32 2>&1 | grep -vi warn
echo "total: $(( $(date +%s) - start )) s"
