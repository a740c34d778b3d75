#!/usr/bin/env bash
# Session 13 run 6: host round 25b's cuda tests and A/B (switches off vs on, tools/env_ab.sh), the warp-row softmax
# tests again (the graph test's race fixed; the "auto" default), then the kernel table's softmax / dropout rows
# (graph replays, PyTorch beside).  From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s13_run6.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/nn/test_host25b_cuda.py tests/nn/test_relu_fast_path_cuda.py tests/nn/test_seen_paths_cuda.py \
tests/nn/test_bn_fast_path_cuda.py --tb=short;;tests/backend/test_softmax_warp.py --tb=short;;\
tests/nn/test_functional.py tests/nn/test_layers.py --tb=short"
OFF="MINIDNN_AVGPOOL_FAST=0 MINIDNN_ACT_BWD_SEEN=0 MINIDNN_RELU_FUSED_DIRECT=0"
export CMDS="env GREP='^(mobilenet|lenet5) |^==' bash tools/env_ab.sh 2 '$OFF' '' -- python3 bench/train_step.py \
--models mobilenet,lenet5 --optimizers sgd --math fp32 --steps 30 --pipelined 10;;\
python3 bench/kernels_gpu.py --only softmax,dropout --timing graph"
exec bash tools/gpu_s9_parts.sh
