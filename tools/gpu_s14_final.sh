#!/usr/bin/env bash
# Session 14's closing device call: the AMPCL host paths' cuda tests (round 26b) beside the amp / graph / fast-path
# tests, parallel parts; then train_step and amp_step (eager and graphed, PyTorch beside) and round 26b's A/B of
# its two default-on switches (tools/step_sw_ab.py: switch off / on alternated in one process, PyTorch beside).
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s14_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-130} CTIME=${CTIME:-120} TAIL=${TAIL:-40}
export PARTS="tests/nn/test_host26b_cuda.py;;\
tests/amp tests/test_cuda_graphs.py;;\
tests/nn/test_host25b_cuda.py tests/nn/test_fresh_outputs_cuda.py tests/nn/test_cl_fresh_alloc_cuda.py"
export CMDS="python3 bench/train_step.py --steps 30 --pipelined 10;;\
python3 bench/amp_step.py --steps 30 --pipelined 10;;\
env SW=minidnn._amp_state:LOWER_DIRECT_FAST python3 tools/step_sw_ab.py --amp bf16 --models resnet20,mobilenet --rounds 6 --turn 10;;\
env SW=minidnn.backend.cuda.conv_igemm:DW_CL_SETTLE python3 tools/step_sw_ab.py --cl --amp bf16 --models mobilenet --rounds 6 --turn 10"
exec bash tools/gpu_s9_parts.sh
