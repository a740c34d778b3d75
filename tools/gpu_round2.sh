#!/usr/bin/env bash
# Device run: graphs/dropout/random/amp cuda tests, then bench/amp_step.py (eager and graphed).
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
set -o pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout ${LIMIT:-300} python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda_graphs.py tests/backend/test_dropout.py \
    tests/test_random.py tests/data tests/amp tests/test_channels_last.py 2>&1 | tee $OUT/tests.log | tail -25
timeout ${BLIMIT:-240} python3 bench/amp_step.py --steps ${STEPS:-20} 2>&1 | tee $OUT/amp_bench.log
