#!/usr/bin/env bash
# Issue 10 on the GPU: the step-kernel tests, then the training-step benchmark with the per-kernel table.
# Usage (device machine, repo root): bash tools/gpu_step.sh      logs under $OUT (or ./gpu_step_out)
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-$PWD/gpu_step_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv 2>&1 | tee "$OUT/device.txt"
start=$(date +%s)
timeout 85 python3 -m pytest -q --maxfail=40 --no-header -p no:cacheprovider -m cuda tests/backend/test_step_cuda_kernels.py \
    -o addopts="" --durations=8 2>&1 | tee "$OUT/tests.log" | tail -40
echo "tests: $(( $(date +%s) - start )) s"
timeout $(( 140 - ($(date +%s) - start) )) python3 bench/train_step.py --device cuda --steps 20 --micro 2>&1 \
    | tee "$OUT/bench.log"
echo "total: $(( $(date +%s) - start )) s"
