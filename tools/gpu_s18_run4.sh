#!/usr/bin/env bash
# Session 18, device call 4: the cuda tests of helper CLEAN's refactors (device_facts, the cross-entropy forward's
# shared chunk code, the batch-norm meeting written once), helper HOST30's round 30 (registered reads, one autocast
# shortcut) and the settled group-norm stash; then the A/Bs: REGISTERED_LAYERS (fp32 and bf16 steps) and the
# cross-entropy LONG settings after the fold (PyTorch beside).
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s18_run4.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-230} CTIME=${CTIME:-130} TAIL=${TAIL:-30}
B=tests/backend
export PARTS="$B/test_ce_long_cuda.py;;\
$B/test_softmax_rows_cuda.py -k cross_entropy_rows;;\
$B/test_softmax_rows_cuda.py $B/test_ce_fwd_tail.py -k ce_fast_rows~or~ce_fwd16_rows~or~ce_tail~or~ce_f32;;\
$B/test_softmax_hint.py $B/test_bn_nhwc_l2.py $B/test_bn_kernels.py;;\
$B/test_dropout_cuda.py -k forward_and_backward_exact;;\
tests/nn/test_host30_registered_cuda.py tests/nn/test_host25_cuda.py tests/amp/test_amphost17_cuda.py tests/nn/test_host26b_cuda.py;;\
$B/test_norm_s18_gn16.py $B/test_norm_s18_gn16b.py;;\
tests/nn/test_twins_cuda.py tests/test_cuda_graphs.py"
export CMDS="env SW=minidnn.nn.module:REGISTERED_LAYERS python3 tools/step_sw_ab.py --models resnet20,mobilenet --rounds 12;;\
env SW=minidnn.nn.module:REGISTERED_LAYERS python3 tools/step_sw_ab.py --models resnet20,mobilenet --rounds 12 --amp bf16;;\
python3 tools/ce_long_ab.py --dtypes float32,bfloat16 --shapes 4096x32000,2048x50257 --settings 0,1,2 --rounds 5"
exec bash tools/gpu_s9_parts.sh
