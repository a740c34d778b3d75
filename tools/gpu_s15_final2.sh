#!/usr/bin/env bash
# Session 15's last device call (second form): the residual add's twin (helper TWIN2) -- its cuda tests, the batch-norm
# twin's and fast path's again (fixtures changed), the tensor cuda tests -- then its in-process step A/B, and
# train_step / amp_step with both twins on by default.
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-230} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_add_twin.py tests/nn/test_add_twin_cuda.py;;\
tests/nn/test_bn_fast_path_cuda.py tests/nn/test_bn_twin_cuda.py tests/backend/test_bn_twin.py;;\
tests/test_tensor.py tests/nn/test_fusion.py"
export CMDS="env SW=minidnn.nn._functions.norm:ADD_TWIN python3 tools/step_sw_ab.py --models resnet20 --rounds 10;;\
python3 bench/train_step.py --steps 60 --pipelined 10;;python3 bench/amp_step.py --steps 40 --pipelined 10"
exec bash tools/gpu_s9_parts.sh
