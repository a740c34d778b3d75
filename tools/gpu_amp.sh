#!/usr/bin/env bash
# One device-tool run for the mixed-precision work: its cuda tests, then bench/amp_step.py. Results under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
set -o pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
python3 -m pytest -q -m cuda -p no:cacheprovider tests/amp tests/test_channels_last.py tests/optim tests/test_dlpack_half.py \
    2>&1 | tee $OUT/amp_tests.log | tail -40
python3 bench/amp_step.py --steps ${STEPS:-20} 2>&1 | tee $OUT/amp_bench.log
