#!/usr/bin/env bash
# One device run on nvidia-h200-x2 covering a whole session's GPU work (device time is scarce: one machine start).
# Phase A, in parallel: GPU 0 times bench/graphs.py (eager / graphed / minidnn.compile beside PyTorch, fp32 then TF32),
# GPU 1 runs the cuda tests of the areas changed together (double backward, graphs, resume, step kernels, amp).
# Phase B, both GPUs: tools/gpu_ddp.sh (NCCL tests and bench/ddp_scaling.py).  Logs under $OUT.  Budget: ~450 s.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $OUT/device.txt
( CUDA_VISIBLE_DEVICES=1 timeout ${TLIMIT:-210} python3 -m pytest -q -m cuda -p no:cacheprovider -rf \
    ${ARGS:-tests/nn/test_double_backward.py tests/test_cuda_graphs.py tests/data/test_resume_examples.py \
    tests/backend/test_step_cuda_kernels.py tests/amp} > $OUT/cuda_tests.log 2>&1; echo "rc $?" >> $OUT/cuda_tests.log ) &
tests=$!
( export CUDA_VISIBLE_DEVICES=0
  timeout ${GLIMIT:-130} python3 bench/graphs.py --steps ${STEPS:-20} > $OUT/graphs_fp32.log 2>&1
  timeout $(( ${GLIMIT2:-205} - ($(date +%s) - start) )) python3 bench/graphs.py --steps ${STEPS:-20} --opts sgd --tf32 \
    > $OUT/graphs_tf32.log 2>&1 ) &
bench=$!
wait $bench; echo "bench: $(( $(date +%s) - start )) s" | tee -a $OUT/graphs_fp32.log
wait $tests; echo "phase A: $(( $(date +%s) - start )) s" | tee -a $OUT/cuda_tests.log
tail -25 $OUT/cuda_tests.log; cat $OUT/graphs_fp32.log $OUT/graphs_tf32.log | tail -30
TLIMIT=100 BLIMIT=80 bash tools/gpu_ddp.sh > $OUT/ddp.log 2>&1
tail -30 $OUT/ddp.log
echo "total: $(( $(date +%s) - start )) s"
