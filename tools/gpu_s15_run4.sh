#!/usr/bin/env bash
# Session 15 run 4/5: batch norm's twin (helper TWIN) -- its kernel cuda tests, then the in-process step A/B of
# norm.TWIN (off / on, PyTorch beside).  (Run 4 also ran tests/nn/test_bn_twin_cuda.py: 6 passed.)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-200} TAIL=${TAIL:-14}
export PARTS="tests/backend/test_bn_twin.py"
export CMDS="env SW=minidnn.nn._functions.norm:TWIN python3 tools/step_sw_ab.py --models resnet20,mobilenet --rounds 10"
exec bash tools/gpu_s9_parts.sh
