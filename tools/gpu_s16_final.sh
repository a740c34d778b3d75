#!/usr/bin/env bash
# Session 16's last device call, after the review of the whole change (workspace.eager_stream for every eager-only
# path, bn_kernels._variant, shared GPU test runs): the cuda tests of everything the session touched, then the
# benchmarks.   From a clean archive:  OUT=$OUT bash tools/gpu_s16_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-240} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/nn/test_twins_cuda.py tests/nn/test_twin_nhwc_cuda.py;;\
tests/nn/test_conv_filter_keep_cuda.py tests/nn/test_bn_dx_nhwc_cuda.py tests/amp/test_amp_training.py;;\
tests/backend/test_twin_nhwc.py tests/backend/test_bn_dx_nhwc.py tests/backend/test_bn_twin.py tests/backend/test_add_twin.py tests/nn/test_bn_fast_path_cuda.py;;\
tests/test_cuda_graphs.py tests/backend/test_conv_filter_carry_cuda.py tests/backend/test_conv_staging_once_cuda.py tests/amp/test_direct_weights_cuda.py"
export CMDS="python3 bench/train_step.py --steps 60 --pipelined 10;;python3 bench/amp_step.py --steps 40 --pipelined 10"
exec bash tools/gpu_s9_parts.sh
