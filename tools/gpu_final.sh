#!/usr/bin/env bash
# The closing device run of a session (one machine start): cuda tests of everything changed, on the last GPU,
# beside bench/graphs.py and bench/amp_step.py on GPU 0; with >= 2 GPUs then bench/ddp_scaling.py on 1 and 2.
# Logs under $OUT.  Budget ~350 s on nvidia-h200-x2, ~260 s on one GPU (tests and benches then share it).
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $OUT/device.txt
n=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
last=$(( n - 1 ))
( CUDA_VISIBLE_DEVICES=$last timeout ${TLIMIT:-200} python3 -m pytest -q -m cuda -p no:cacheprovider -rf \
    ${ARGS:-tests/test_cuda_graphs.py tests/nn/test_double_backward.py tests/backend/test_softmax.py \
    tests/test_examples.py tests/backend/test_convolution.py tests/backend/test_conv_cuda_kernels.py tests/test_tensor.py \
    tests/nn tests/amp} \
    > $OUT/cuda_tests.log 2>&1; echo "rc $?" >> $OUT/cuda_tests.log ) &
tests=$!
( export CUDA_VISIBLE_DEVICES=0
  timeout ${GLIMIT:-100} python3 bench/graphs.py --steps ${STEPS:-20} > $OUT/graphs_fp32.log 2>&1
  timeout ${ALIMIT:-90} python3 bench/amp_step.py --steps ${STEPS:-20} > $OUT/amp.log 2>&1 ) &
bench=$!
wait $bench; echo "benches: $(( $(date +%s) - start )) s" | tee -a $OUT/amp.log
wait $tests; echo "tests: $(( $(date +%s) - start )) s" | tee -a $OUT/cuda_tests.log
tail -15 $OUT/cuda_tests.log; cat $OUT/graphs_fp32.log; tail -12 $OUT/amp.log
if [ "$n" -ge 2 ]; then
  timeout ${DLIMIT:-170} python3 bench/ddp_scaling.py --gpus 1,2 --steps 20 --warmup 6 --timeout 120 2>&1 \
      | tee $OUT/ddp_bench.log
fi
echo "total: $(( $(date +%s) - start )) s"
