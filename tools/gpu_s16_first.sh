#!/usr/bin/env bash
# Session 16's first device call: what session 15 changed after its last GPU run (no device time was left) --
# the twins' cuda tests merged into tests/nn/test_twins_cuda.py (one module for batch norm's and the add's; the
# training and capture runs in tests/nn/_twin_steps.py), the twin launch paths written once (bn_kernels /
# bn_nhwc training calls, norm._twin_of), then the in-process A/B of both twins and the benchmarks.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s16_first.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-230} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/nn/test_twins_cuda.py;;\
tests/backend/test_bn_twin.py tests/backend/test_add_twin.py tests/nn/test_bn_fast_path_cuda.py;;\
tests/backend/test_bn_nhwc_cuda.py tests/backend/test_bn_cluster.py tests/nn/test_fusion.py tests/test_tensor.py"
export CMDS="env SW=minidnn.nn._functions.norm:TWIN,minidnn.nn._functions.norm:ADD_TWIN python3 tools/step_sw_ab.py --models resnet20,mobilenet --rounds 10;;\
python3 bench/train_step.py --steps 60 --pipelined 10;;python3 bench/amp_step.py --steps 40 --pipelined 10"
exec bash tools/gpu_s9_parts.sh
