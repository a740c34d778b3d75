#!/usr/bin/env bash
# Session 15's first device call: what session 14 changed after its last GPU run -- round 26b's corrected
# single-layer channels-last depthwise test, the 16-bit CPU semantics fixes' cuda twins (GPU bfloat16 reductions:
# CuPy's own accumulators, unchecked), the tensor / softmax / elementwise cuda tests, then train_step and amp_step.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s15_first.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-150} TAIL=${TAIL:-40}
export PARTS="tests/nn/test_host26b_cuda.py;;\
tests/test_tensor.py tests/backend/test_softmax.py tests/backend/test_workspace_fresh.py tests/nn/test_fresh_outputs_cuda.py;;\
tests/amp tests/test_ops_grad.py"
export CMDS="python3 bench/train_step.py --steps 30 --pipelined 10;;python3 bench/amp_step.py --steps 30 --pipelined 10"
exec bash tools/gpu_s9_parts.sh
