#!/usr/bin/env bash
# Session 14, run 4: outputs on reused pool memory (workspace.fresh, MINIDNN_RECYCLE) -- the cuda tests of every
# kernel family it touches (conv, batch norm NCHW / NHWC, activations, pooling), the models, graphs and amp, in
# parallel parts; then the in-process A/B of the switch beside PyTorch (tools/step_sw_ab.py) and train_step.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s14_run4.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-150} TAIL=${TAIL:-30}
export PARTS="tests/nn/test_fresh_outputs_cuda.py tests/nn/test_cl_fresh_alloc_cuda.py tests/backend/test_workspace_cuda.py \
tests/backend/test_conv_staging_once_cuda.py tests/backend/test_conv_filter_carry_cuda.py;;\
tests/test_cuda_graphs.py tests/amp tests/optim tests/test_examples.py tests/test_channels_last.py;;\
tests/nn;;\
tests/backend/test_bn_kernels.py tests/backend/test_bn_nhwc_cuda.py;;\
tests/backend/test_activation.py tests/backend/test_pooling.py tests/backend/test_pool_act_vec.py;;\
tests/backend/test_conv_cuda_kernels.py tests/backend/test_conv_epilogue_cuda.py tests/backend/test_conv_epilogue_bn_cuda.py;;\
tests/backend/test_norm_ce_seen_cuda.py tests/backend/test_conv_dw_krsc_cuda.py tests/test_autograd.py"
export CMDS="env SW=minidnn.backend.cuda.workspace:RECYCLE python3 tools/step_sw_ab.py --rounds 8 --turn 10;;\
env SW=minidnn.backend.cuda.workspace:RECYCLE python3 tools/step_sw_ab.py --rounds 6 --turn 10 --amp bf16 --models resnet20,mobilenet"
exec bash tools/gpu_s9_parts.sh
