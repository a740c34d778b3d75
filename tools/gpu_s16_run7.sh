#!/usr/bin/env bash
# Session 16 run 7 (last): everything this session made default -- kept filter copies, batch norm's channels-last
# dx, the twin's NHWC shadow -- their cuda tests, ResNet-20 trained to accuracy in fp32/bf16/fp16 and the examples on
# the GPU; the A/B of all three together against none; the benchmarks.   From a clean archive:
#   OUT=$OUT bash tools/gpu_s16_run7.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-280} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/nn/test_twins_cuda.py;;tests/nn/test_twin_nhwc_cuda.py tests/nn/test_conv_filter_keep_cuda.py tests/nn/test_bn_dx_nhwc_cuda.py;;\
tests/amp/test_amp_training.py tests/test_examples.py;;tests/backend/test_twin_nhwc.py tests/backend/test_bn_dx_nhwc.py tests/nn/test_bn_fast_path_cuda.py"
SW3=minidnn.backend.cuda.conv_filter_keep:KEEP,minidnn.nn._functions.norm:DX_NHWC,minidnn.nn._functions.norm:TWIN_NHWC
export CMDS="env SW=$SW3 python3 tools/step_sw_ab.py --models resnet20 --rounds 12;;\
env SW=$SW3 python3 tools/step_sw_ab.py --models resnet20 --rounds 12 --amp bf16;;\
python3 bench/train_step.py --steps 60 --pipelined 10;;python3 bench/amp_step.py --steps 40 --pipelined 10"
exec bash tools/gpu_s9_parts.sh
