#!/usr/bin/env bash
# Session 17's first device call: autocast host round 29's cuda tests (tests/amp) and its in-process A/B
# (LOWER_READY, REGION_LEAN off / on, bf16); where the device host spends an eager fp32 / bf16 step (cProfile);
# the kernel table on the two new large size sets (large2, large3), graph replays, PyTorch beside.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s17_run1.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-300} TAIL=${TAIL:-60}
export PARTS="tests/amp"
export CMDS="env SW=minidnn._amp_state:LOWER_READY,minidnn._amp_state:REGION_LEAN python3 tools/step_sw_ab.py --amp bf16 --models resnet20,mobilenet --rounds 8;;\
python3 tools/gpu_step_profile.py --models resnet20 --modes fp32,bf16,fp32,bf16 --top 12;;\
python3 bench/kernels_gpu.py --sizes large2,large3 --dtypes float32,bfloat16 --timing graph"
exec bash tools/gpu_s9_parts.sh
