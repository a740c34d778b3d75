#!/usr/bin/env bash
# The whole cuda half of the test suite on the device machine (one run), results under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
set -o pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout ${LIMIT:-480} python3 -m pytest -q -m cuda -p no:cacheprovider ${ARGS:-} 2>&1 | tee $OUT/cuda_tests.log | tail -60
