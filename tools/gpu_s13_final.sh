#!/usr/bin/env bash
# Session 13's closing device call: the cuda tests of every area the session changed (nn / autograd with the
# depthwise settled route and round 25b on; graphs / optim / amp / examples; dropout; softmax rows, WARP, NARROW, CE
# tail; depthwise / dw-NHWC / activation; the norm and batch-norm files whose compile checks changed), 7 parallel
# parts, then train_step and amp_step (eager pipelined and graphed, PyTorch beside) and the dropout cache-hint A/B
# on the kernel table's dropout rows.  From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s13_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-240} CTIME=${CTIME:-150} TAIL=${TAIL:-40}
export PARTS="tests/nn tests/test_autograd.py tests/test_ops_grad.py;;\
tests/test_cuda_graphs.py tests/optim tests/amp tests/test_examples.py tests/test_tensor.py tests/test_channels_last.py \
tests/test_dlpack_half.py tests/test_grad_dest_cuda.py;;\
tests/backend/test_dropout_cuda.py tests/backend/test_dropout_record.py;;\
tests/backend/test_softmax_rows_cuda.py;;\
tests/backend/test_softmax.py tests/backend/test_softmax_warp.py tests/backend/test_softmax_fwd_narrow.py \
tests/backend/test_ce_fwd_tail.py;;\
tests/backend/test_depthwise_kernels.py tests/backend/test_dw_nhwc_cuda.py tests/backend/test_conv_dw_krsc_cuda.py \
tests/backend/test_depthwise_wgrad.py tests/backend/test_activation.py;;\
tests/backend/test_norm_kernels_v2.py tests/backend/test_ln_bwd3.py tests/backend/test_bn_nhwc_l2.py \
tests/backend/test_bn_cluster.py"
export CMDS="python3 bench/train_step.py --steps 30 --pipelined 10;;\
python3 bench/amp_step.py --steps 30 --pipelined 10;;\
env GREP='^dropout|^  stored|^==' bash tools/env_ab.sh 1 '' MINIDNN_DROPOUT_HINT=0,0 -- python3 bench/kernels_gpu.py \
--only dropout --timing graph"
exec bash tools/gpu_s9_parts.sh
