#!/usr/bin/env bash
# Session 14's first device call: the tests of session 13's changes that never ran on a GPU (the activation backward
# seen table in backend/activation.py, dropout's cache hint by size, the merged dropout forward kernels, the unified
# dropout runners), then the kernel table's dropout / softmax rows and the two step benchmarks.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s14_run1.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-150} TAIL=${TAIL:-45}
export PARTS="tests/nn/test_host25b_cuda.py tests/nn/test_relu_fast_path_cuda.py;;\
tests/backend/test_dropout_cuda.py;;\
tests/backend/test_dropout_record.py"
export CMDS="python3 bench/kernels_gpu.py --only dropout,softmax --timing graph;;\
python3 bench/train_step.py --steps 30 --pipelined 10;;\
python3 bench/amp_step.py --steps 30 --pipelined 10"
exec bash tools/gpu_s9_parts.sh
