#!/usr/bin/env bash
# GPU half of the data-pipeline / randomness tests (minidnn.Generator on cuda, cuda rng state round trips,
# dropout masks, pin_memory with async copies, GPU datasets refused with workers).  For the device tool:
#   run command: bash tools/gpu_data_random.sh
set -o pipefail
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp}
PYTHONPATH=. python3 -m pytest -q -m cuda tests/test_random.py tests/data 2>&1 | tee "$OUT/log"
PYTHONPATH=. python3 -m pytest -q tests/test_random.py tests/data/test_loader_workers.py -k "cuda or pin" 2>&1 | tee -a "$OUT/log"
