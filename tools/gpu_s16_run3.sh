#!/usr/bin/env bash
# Session 16 run 3: the kept filter copies after review, batch norm's channels-last dx (bn_bwd1 and the cluster
# bn_bwdc, DX_NHWC) with the convolution's NCHW calls on a channels-last dy -- their cuda tests and the conv / BN
# tests around them, the in-process A/B of DX_NHWC (ResNet-20, fp32 and bf16 autocast), then the benchmarks.
#   From a clean archive:  OUT=$OUT bash tools/gpu_s16_run3.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-280} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/nn/test_conv_filter_keep_cuda.py tests/backend/test_conv_filter_carry_cuda.py tests/backend/test_conv_staging_once_cuda.py;;\
tests/backend/test_bn_dx_nhwc.py;;tests/nn/test_bn_dx_nhwc_cuda.py;;tests/nn/test_twins_cuda.py tests/nn/test_bn_fast_path_cuda.py;;\
tests/nn/test_conv_fast_path_cuda.py tests/nn/test_conv_cl_dest_cuda.py tests/nn/test_conv_cl_first_cuda.py tests/nn/test_seen_paths_cuda.py tests/nn/test_first_call_repro_cuda.py;;\
tests/nn/test_host26b_cuda.py tests/nn/test_conv_bias_node_cuda.py tests/test_cuda_graphs.py"
export CMDS="env SW=minidnn.nn._functions.norm:DX_NHWC python3 tools/step_sw_ab.py --models resnet20 --rounds 10;;\
env SW=minidnn.nn._functions.norm:DX_NHWC python3 tools/step_sw_ab.py --models resnet20 --rounds 10 --amp bf16;;\
python3 bench/train_step.py --steps 60 --pipelined 10;;python3 bench/amp_step.py --steps 40 --pipelined 10"
exec bash tools/gpu_s9_parts.sh
