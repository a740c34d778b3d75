#!/usr/bin/env bash
# Session 15 run 6: host round 27 (helper HOST27: launch.py, workspace.fresh, the engine) and batch norm's twin now on
# by default -- the cuda tests of the touched paths in parallel parts, host27_paths' per-call timing, then the
# in-process step A/B of the round's switch (tools.host27_paths:NEW, old / new forms, PyTorch beside).
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-220} CTIME=${CTIME:-200} TAIL=${TAIL:-16}
export PARTS="tests/backend/test_launch.py tests/backend/test_workspace_cuda.py tests/test_grad_dest_cuda.py tests/backend/test_host27_launch.py tests/backend/test_host27_engine.py;;\
tests/nn/test_fresh_outputs_cuda.py tests/test_cuda_graphs.py;;\
tests/nn/test_bn_fast_path_cuda.py tests/nn/test_cl_fresh_alloc_cuda.py tests/nn/test_bn_twin_cuda.py;;\
tests/amp"
export CMDS="python3 tools/host27_paths.py;;\
env SW=tools.host27_paths:NEW python3 tools/step_sw_ab.py --models resnet20,mobilenet,lenet5 --rounds 8 --turn 10"
exec bash tools/gpu_s9_parts.sh
