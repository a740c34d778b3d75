#!/usr/bin/env bash
# Session 18, device call 1: the cuda tests of session 17's last changes, never run on a GPU (the sm_80 gates, the
# kept-copy relayout fix and record rule, CLUSTER_HEADER, SPLIT / STASH / CE_LONG / GN_CLUSTER defaults), and the
# model-level cuda tests (twins, graphs, channels_last) under the new defaults.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s18_run1.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-420} CTIME=${CTIME:-100} TAIL=${TAIL:-30}
A=tests/amp; B=tests/backend
export PARTS="$A/test_float32_weight_grads.py $A/test_amp_training.py;;\
$A/test_amphost17_cuda.py $A/test_autocast.py $A/test_cast_cache.py $A/test_cast_inputs.py $A/test_direct_weights_cuda.py $A/test_grad_scaler.py $A/test_master_weights.py;;\
$B/test_softmax_s17_rows.py $B/test_softmax_hint.py $B/test_softmax_rows_cuda.py $B/test_softmax_warp.py $B/test_softmax.py;;\
$B/test_ce_long_cuda.py $B/test_ce_long.py $B/test_ce_lowp_logits_cuda.py $B/test_norm_ce_seen_cuda.py $B/test_norm_s17_gncl.py $B/test_norm_s17_ln.py;;\
$B/test_bn_nhwc_cuda.py $B/test_bn_nhwc_s17.py $B/test_bn_nhwc_l2.py;;\
$B/test_bn_cluster.py $B/test_bn_onchip.py;;\
tests/nn/test_twins_cuda.py tests/nn/test_twin_nhwc_cuda.py tests/nn/test_seen_paths_cuda.py;;\
tests/test_cuda_graphs.py tests/test_channels_last.py"
export CMDS="nvidia-smi --query-gpu=name --format=csv"
exec bash tools/gpu_s9_parts.sh
