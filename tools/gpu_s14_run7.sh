#!/usr/bin/env bash
# Session 14, run 7: the flipped defaults (LSM "2", DRAW16, UNROLL_FIT) and the out-of-memory retry / data_ptr /
# element views under their cuda tests, parallel parts; then the kernel table's dropout / softmax rows.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s14_run7.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-170} CTIME=${CTIME:-120} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_softmax_warp.py tests/backend/test_lsm_warp.py tests/backend/test_softmax.py;;\
tests/backend/test_dropout_cuda.py tests/backend/test_dropout16_draw.py;;\
tests/backend/test_dropout_record.py tests/test_tensor.py tests/nn/test_fresh_outputs_cuda.py tests/backend/test_workspace_cuda.py;;\
tests/backend/test_conv_fused.py tests/backend/test_conv_pointwise.py tests/backend/test_depthwise_kernels.py \
tests/backend/test_dw_nhwc_cuda.py;;\
tests/backend/test_bn_onchip.py tests/backend/test_bn_cluster.py tests/backend/test_norm_kernels_v2.py \
tests/backend/test_bn_nhwc_l2.py tests/backend/test_normalization.py"
export CMDS="python3 bench/kernels_gpu.py --only dropout,softmax --timing graph"
exec bash tools/gpu_s9_parts.sh
