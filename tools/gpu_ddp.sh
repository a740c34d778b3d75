#!/usr/bin/env bash
# Device run for issue 17 (data parallel through NCCL), meant for nvidia-h200-x2 (runs on any GPU count:
# >= 2-GPU tests skip on one GPU).  1) the cuda tests of tests/distributed (world-of-one NCCL communicator, DDP
# eager and CUDA-graphed; on >= 2 GPUs: collectives and loss curve of N ranks == one GPU with batch N*B);
# 2) bench/ddp_scaling.py: ResNet-20, 128 images per GPU, images/s on 1..N GPUs, minidnn (graphed) beside PyTorch DDP.
# Logs: $OUT/device.txt, $OUT/ddp_tests.log, $OUT/ddp_bench.log.  Budget: < 200 s.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
export NCCL_NVLS_ENABLE=0        # no NVLink multicast (KINDS.md)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $OUT/device.txt
nvidia-smi topo -m >> $OUT/device.txt 2>&1
start=$(date +%s)
timeout ${TLIMIT:-110} python3 -m pytest -q -m cuda -p no:cacheprovider -rs tests/distributed 2>&1 \
    | tee $OUT/ddp_tests.log | tail -30
echo "tests: $(( $(date +%s) - start )) s" | tee -a $OUT/ddp_tests.log
timeout ${BLIMIT:-85} python3 bench/ddp_scaling.py --steps ${STEPS:-20} --warmup 6 --timeout 60 2>&1 \
    | tee $OUT/ddp_bench.log
echo "total: $(( $(date +%s) - start )) s" | tee -a $OUT/ddp_bench.log
