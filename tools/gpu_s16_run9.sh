#!/usr/bin/env bash
# Session 16 run 9: after the second review (the twin's slot on the fused node, no shadow taken while capturing, the
# DX_NHWC capture rule for dx_nhwc_call only) and the shared GPU test helpers -- this session's cuda tests, the
# twins', the graphs', training accuracy and the examples; the A/B of all three defaults against none.
#   From a clean archive:  OUT=$OUT bash tools/gpu_s16_run9.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-280} CTIME=${CTIME:-150} TAIL=${TAIL:-8}
export PARTS="tests/nn/test_twin_nhwc_cuda.py tests/nn/test_conv_filter_keep_cuda.py;;tests/nn/test_bn_dx_nhwc_cuda.py tests/nn/test_twins_cuda.py;;\
tests/backend/test_twin_nhwc.py tests/backend/test_bn_dx_nhwc.py tests/nn/test_bn_fast_path_cuda.py tests/test_cuda_graphs.py;;\
tests/amp/test_amp_training.py tests/test_examples.py"
SW3=minidnn.backend.cuda.conv_filter_keep:KEEP,minidnn.nn._functions.norm:DX_NHWC,minidnn.nn._functions.norm:TWIN_NHWC
export CMDS="env SW=$SW3 python3 tools/step_sw_ab.py --models resnet20 --rounds 12;;\
env SW=$SW3 python3 tools/step_sw_ab.py --models resnet20 --rounds 12 --amp bf16"
exec bash tools/gpu_s9_parts.sh
