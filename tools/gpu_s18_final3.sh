#!/usr/bin/env bash
# Session 18, device call 12: the cuda tests of the last two changes -- norm_gncl's 16-bit route removed (helper
# GNCL16RM) and test_norm_kernels' group-norm launch count taught the 16-bit stash.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s18_final3.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-110} CTIME=${CTIME:-30} TAIL=${TAIL:-10}
export PARTS="tests/backend/test_norm_s17_gncl.py tests/backend/test_norm_s18_gn16.py -k not~compile;;\
tests/backend/test_norm_kernels.py -k test_group_norm"
export CMDS="nvidia-smi --query-gpu=name --format=csv,noheader"
exec bash tools/gpu_s9_parts.sh
