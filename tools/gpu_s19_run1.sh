#!/usr/bin/env bash
# Session 19, device call 1: the cuda tests of session 18's two last mends (storage.LDE_HEADER, norm_gncl.geometry:
# PTX byte-identical / host-only, never run on a GPU) and a cProfile of the real-GPU eager steps (where the host time
# goes beyond the fake-CuPy step: launches, allocations, cuBLASLt calls), fp32 and bf16.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s19_run1.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-120} TAIL=${TAIL:-75}
export PARTS="tests/backend/test_norm_s17_gncl.py tests/backend/test_norm_s18_gn16.py tests/backend/test_norm_s18_gn16b.py -k not~compile;;\
tests/backend/test_norm_kernels.py -k group_norm~or~layer_norm"
export CMDS="python3 tools/profile_step.py --models mobilenet --steps 30 --top 45;;\
python3 tools/profile_step.py --models resnet20 --steps 30 --top 45;;\
python3 tools/profile_step.py --models mobilenet --steps 30 --top 30 --amp bf16"
exec bash tools/gpu_s9_parts.sh
