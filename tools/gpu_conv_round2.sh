#!/usr/bin/env bash
# One device-tool run (~300 s) for round 2 of the implicit-GEMM loaders: strided backward data as ONE launch (residue
# classes on blockIdx.z, the original filter read through a tap mapping), then the timings.
#   1. tools/precompile_conv.py: every implicit-GEMM configuration into CUPY_CACHE_DIR, one process per core
#   2. cuda tests: the new residue / strided / launch-count tests first, then the rest of the implicit-GEMM file
#   3. bench/conv_kernels.py --layout nhwc: ResNet-20's 3x3 layers, element vs VEC loader vs PyTorch channels_last
#      (bf16 / TF32 / strict fp32; the strided "dgrad" cells are the one-launch residue classes -- the previous
#      run, docs/measurements/conv_kernels_nhwc_2026-11-26_h200.txt, is the old per-class split on an H200)
#   4. tools/tile_sweep.py (NCHW, every tile per ResNet-20 layer and direction, fp32 and TF32: the 16->32 s2 and
#      32->64 s2 "dgrad" rows against docs/measurements/tile_sweep_2026-11-26_h200.txt)
#   5. bench/conv_kernels.py (NCHW, the issue-9 layer table with PyTorch beside it)
# Logs under $OUT (round2_*.log).  Usage (repo root):  bash tools/gpu_conv_round2.sh [extra pytest args]
set -uo pipefail
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/gpu_conv_round2_out}; mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[round2 +$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/round2_device.txt"
stamp precompile
timeout ${PRE_TIMEOUT:-60} python3 tools/precompile_conv.py 2>&1 | tee "$OUT/round2_precompile.log" | tail -2
stamp "tests (new)"
NEW="residue or strided or one_launch or vec_loader_is_chosen"
timeout ${NEW_TIMEOUT:-90} python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short --maxfail=30 -rf \
    -k "$NEW" tests/backend/test_conv_cuda_kernels.py "$@" 2>&1 | tee "$OUT/round2_tests_new.log" | tail -30
stamp "tests (rest)"
timeout ${REST_TIMEOUT:-60} python3 -m pytest -q -m cuda -p no:cacheprovider --tb=short --maxfail=30 -rf \
    -k "not ($NEW)" tests/backend/test_conv_cuda_kernels.py "$@" 2>&1 | tee "$OUT/round2_tests_rest.log" | tail -20
stamp "bench nhwc"
timeout ${NHWC_TIMEOUT:-60} python3 bench/conv_kernels.py --layout nhwc --reps ${REPS:-20} 2>&1 \
    | tee "$OUT/round2_bench_nhwc.log"
stamp "tile sweep (NCHW)"
timeout ${SWEEP_TIMEOUT:-60} python3 tools/tile_sweep.py --reps ${REPS:-20} --modes fp32,tf32 2>&1 \
    | tee "$OUT/round2_tile_sweep.log" | grep -E "device|dgrad|total"
stamp "bench nchw"
timeout ${NCHW_TIMEOUT:-60} python3 bench/conv_kernels.py --reps ${REPS:-20} 2>&1 | tee "$OUT/round2_bench_nchw.log" \
    | tail -22
stamp done
