#!/usr/bin/env bash
# Session 20: GAP_UNROLL 2's cuda test (bitwise on / off) and its A/B against 1, PyTorch beside.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s20_gap.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-90} CTIME=${CTIME:-120} TAIL=${TAIL:-20}
export PARTS="tests/backend/test_gap_s20_unroll.py;;tests/backend/test_step_cuda_kernels.py -k global"
export CMDS="python3 tools/gap_ab.py --rounds 9"
exec bash tools/gpu_s9_parts.sh
