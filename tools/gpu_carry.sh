#!/usr/bin/env bash
# Device run for round 12 of docs/host_overhead.md (one GPU, ~4-6 min): the filter carry's cuda tests (backward data
# through the forward's KRSC copy, WKRSC=1, bitwise equal to its own CRSK copy; a ResNet block's gradients with the
# carry on and off), the shared-staging and VEC-loader tests it touches, then tools/carry_ab.py (per-layer GPU time
# carried vs not, and the ResNet-20 b128 eager step with the carry on/off alternated in one process).  Logs in $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 120 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout ${TLIMIT:-240} python3 -m pytest -q -m cuda -p no:cacheprovider tests/backend/test_conv_filter_carry_cuda.py \
    tests/backend/test_conv_staging_once_cuda.py \
    "tests/backend/test_conv_cuda_kernels.py::test_vec_loader_every_tile" \
    "tests/backend/test_conv_cuda_kernels.py::test_residue_backward_data_vec_loader" > $OUT/tests.log 2>&1
tail -5 $OUT/tests.log
timeout 200 python3 tools/carry_ab.py > $OUT/ab.txt 2>&1; cat $OUT/ab.txt
