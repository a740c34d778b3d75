#!/usr/bin/env bash
# Dense few-channel convolutions on the direct kernels + the channels-last batch-norm dy fix (~250 s on one GPU):
# cuda tests (direct kernels, graphs, batch norm), tools/lenet_conv_ab.py with the stems in three math modes,
# kernel tables of LeNet-5 and ResNet-20, graphed LeNet-5 / ResNet-20.  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
(timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_depthwise_kernels.py \
    tests/backend/test_depthwise_wgrad.py tests/backend/test_conv_dense_c1_direct.py tests/test_cuda_graphs.py \
    > $OUT/tests_direct.log 2>&1; echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/tests_direct.log) &
timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 tests/backend/test_bn_kernels.py \
    tests/nn/test_fusion.py tests/test_channels_last.py tests/backend/test_convolution.py \
    > $OUT/tests_bn.log 2>&1; echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/tests_bn.log
wait
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/tests_direct.log $OUT/tests_bn.log | tail -30
timeout 90 python3 tools/lenet_conv_ab.py --stems --math fp32,tf32,bf16 2>&1 | grep -vi warn | tee $OUT/conv_ab.log
timeout 90 python3 tools/profile_step.py --kernels --models lenet5,resnet20 --top 25 2>&1 | grep -vi warn > $OUT/kernels.log
grep "==" $OUT/kernels.log
timeout 90 python3 bench/graphs.py --steps 30 --models lenet5,resnet20 --opts sgd 2>&1 | grep -vi warn
echo "total: $(( $(date +%s) - start )) s"
