#!/usr/bin/env bash
# Session 15 run 4: batch norm's twin (helper TWIN) -- its cuda tests and the 16-bit mean / reduction tests in parallel
# parts, then the in-process step A/B of norm.TWIN (off / on, PyTorch beside), fp32 and bf16 channels-last.
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-170} TAIL=${TAIL:-14}
export PARTS="tests/backend/test_bn_twin.py;;tests/nn/test_bn_twin_cuda.py;;tests/test_tensor.py"
export CMDS="SW=minidnn.nn._functions.norm:TWIN python3 tools/step_sw_ab.py --models resnet20,mobilenet --rounds 8;;\
SW=minidnn.nn._functions.norm:TWIN python3 tools/step_sw_ab.py --models resnet20,mobilenet --rounds 6 --amp bf16 --cl"
exec bash tools/gpu_s9_parts.sh
