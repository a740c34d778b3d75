#!/usr/bin/env bash
# Session 14's closing device call: the cuda tests of everything the session changed or switched on (LSM "2",
# DRAW16 / UNROLL_FIT, outputs on reused pool memory and its out-of-memory retry, the AMPCL host paths), parallel
# parts; then the kernel table's dropout / softmax rows, train_step, amp_step, and EXTRA (the AMPCL A/B).
#   From a clean archive of HEAD:  OUT=$OUT EXTRA_PART="..." EXTRA="..." bash tools/gpu_s14_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-150} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_softmax_warp.py tests/backend/test_lsm_warp.py tests/backend/test_softmax.py;;\
tests/backend/test_dropout_cuda.py tests/backend/test_dropout16_draw.py tests/backend/test_dropout_record.py;;\
tests/nn/test_fresh_outputs_cuda.py tests/backend/test_workspace_cuda.py tests/nn/test_cl_fresh_alloc_cuda.py ${EXTRA_PART};;\
tests/test_cuda_graphs.py tests/amp tests/test_examples.py tests/optim;;\
tests/backend/test_conv_fused.py tests/backend/test_conv_pointwise.py tests/backend/test_depthwise_kernels.py \
tests/backend/test_dw_nhwc_cuda.py tests/backend/test_conv_wgrad_atomic.py;;\
tests/backend/test_bn_onchip.py tests/backend/test_bn_cluster.py tests/backend/test_norm_kernels_v2.py \
tests/backend/test_bn_nhwc_l2.py tests/backend/test_normalization.py"
export CMDS="python3 bench/kernels_gpu.py --only dropout,softmax --timing graph;;\
python3 bench/train_step.py --steps 30 --pipelined 10;;\
python3 bench/amp_step.py --steps 30 --pipelined 10${EXTRA:+;;$EXTRA}"
exec bash tools/gpu_s9_parts.sh
