#!/usr/bin/env bash
# Session 16 run 2: the kept filter copies (conv_filter_keep) on a GPU -- their cuda tests beside the carry / staging
# ones they sit on, the part of run 1 its time limit cut (bn_nhwc, cluster, fusion, tensor), then the in-process A/B
# of KEEP on ResNet-20, float32 and bf16 autocast.   From a clean archive:  OUT=$OUT bash tools/gpu_s16_run2.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-300} CTIME=${CTIME:-140} TAIL=${TAIL:-12}
export PARTS="tests/nn/test_conv_filter_keep_cuda.py tests/backend/test_conv_filter_carry_cuda.py tests/backend/test_conv_staging_once_cuda.py;;\
tests/backend/test_bn_nhwc_cuda.py tests/backend/test_bn_cluster.py;;tests/nn/test_fusion.py;;tests/test_tensor.py tests/test_cuda_graphs.py"
export CMDS="env SW=minidnn.backend.cuda.conv_filter_keep:KEEP python3 tools/step_sw_ab.py --models resnet20 --rounds 10;;\
env SW=minidnn.backend.cuda.conv_filter_keep:KEEP python3 tools/step_sw_ab.py --models resnet20 --rounds 10 --amp bf16"
exec bash tools/gpu_s9_parts.sh
