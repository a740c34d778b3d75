#!/usr/bin/env bash
# Session 21: cross-entropy with spatial targets on a thread a position (loss_kernels.SOURCE_SPATIAL) -- its cuda
# tests, the cross-entropy cuda tests that now route (N, C, *d) logits to it, and the timings new / old
# (MINIDNN_CE_SPATIAL=0: the warp-a-position kernels) beside PyTorch, tools/spatial_ce_gpu.py.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s21_spatial.sh      (~3 min on a fresh H200)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-150} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_ce_spatial.py;;tests/backend/test_step_cuda_kernels.py -k cross_entropy;;\
tests/backend/test_ce_lowp_logits_cuda.py tests/backend/test_norm_ce_seen_cuda.py"
export CMDS="python3 tools/spatial_ce_gpu.py --dtypes float32,bfloat16 --trials 5;;\
env MINIDNN_CE_SPATIAL=0 python3 tools/spatial_ce_gpu.py --dtypes float32,bfloat16 --trials 3"
exec bash tools/gpu_s9_parts.sh
