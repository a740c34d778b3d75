#!/usr/bin/env bash
# Session 21 run 11 (the last): REVIEW21's mends on the GPU -- the cluster forward's NaN slices (tools/smcl_nan_check.py
# and the special / float64 cuda tests), the spatial cross-entropy past its grid and with specials in later batches
# (its cuda tests), and its timings after the unsigned counter.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s21_run11.sh      (~3 min on a fresh H200)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-150} CTIME=${CTIME:-90} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_softmax_cluster.py -k special~or~float64;;tests/backend/test_ce_spatial.py"
export CMDS="python3 tools/smcl_nan_check.py;;\
python3 tools/spatial_ce_gpu.py --dtypes float32,bfloat16 --trials 3 --shapes 32x21x128x128,16x19x256x256"
exec bash tools/gpu_s9_parts.sh
