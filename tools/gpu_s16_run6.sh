#!/usr/bin/env bash
# Session 16 run 6: the twin's NHWC shadow (norm.TWIN_NHWC; bn_fwd1 / bn_fwdc / the add's TWIN kernels with
# -DTWIN_NHWC) -- its cuda tests, the twins' and this session's other cuda tests beside, the in-process A/B.
#   From a clean archive:  OUT=$OUT bash tools/gpu_s16_run6.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-280} CTIME=${CTIME:-150} TAIL=${TAIL:-12}
export PARTS="tests/backend/test_twin_nhwc.py;;tests/nn/test_twin_nhwc_cuda.py;;tests/nn/test_twins_cuda.py;;\
tests/nn/test_conv_filter_keep_cuda.py tests/nn/test_bn_dx_nhwc_cuda.py tests/backend/test_add_twin.py tests/backend/test_bn_twin.py"
export CMDS="env SW=minidnn.nn._functions.norm:TWIN_NHWC python3 tools/step_sw_ab.py --models resnet20 --rounds 10;;\
env SW=minidnn.nn._functions.norm:TWIN_NHWC python3 tools/step_sw_ab.py --models resnet20 --rounds 10 --amp bf16"
exec bash tools/gpu_s9_parts.sh
