#!/usr/bin/env bash
# Device run for CUDA graphs and the fixes around them: cuda tests of the touched areas, then bench/graphs.py.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
set -o pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout ${LIMIT:-300} python3 -m pytest -q -m cuda -p no:cacheprovider ${ARGS:-tests/test_cuda_graphs.py} 2>&1 \
    | tee $OUT/tests.log | tail -40
timeout ${BLIMIT:-200} python3 bench/graphs.py --steps ${STEPS:-30} 2>&1 | tee $OUT/graphs_bench.log
