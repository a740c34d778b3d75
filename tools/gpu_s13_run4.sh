#!/usr/bin/env bash
# Session 13 run 4: the cuda tests of host round 25 (the depthwise settled route both ways, registered reads, scratch
# partials) and of the dropout 'bits' default / 16-bit pipe floor, then the A/Bs: dropout_ab, train_step and
# amp_step with round 25's switches off / on (tools/env_ab.sh, alternated).  From a clean archive of HEAD:
#   OUT=$OUT bash tools/gpu_s13_run4.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-240} CTIME=${CTIME:-170}
export PARTS="tests/nn/test_host25_cuda.py tests/nn/test_seen_paths_cuda.py tests/backend/test_depthwise_wgrad.py \
tests/backend/test_dw_nhwc_cuda.py --tb=short;;MINIDNN_CONV_DW_SETTLE=1 tests/nn/test_conv_fast_path_cuda.py \
tests/nn/test_conv_bias_node_cuda.py tests/test_cuda_graphs.py tests/backend/test_depthwise_kernels.py --tb=short;;\
MINIDNN_CONV_DW_SETTLE=1 tests/nn/test_first_call_repro_cuda.py tests/nn/test_models.py tests/amp --tb=short;;\
tests/backend/test_dropout_record.py --tb=short;;tests/backend/test_dropout_cuda.py --tb=short"
OFF="MINIDNN_CONV_DW_SETTLE=0 MINIDNN_MODULE_REGISTERED_READS=0"
export CMDS="python3 tools/dropout_ab.py --rounds 3;;\
env GREP='^(mobilenet|lenet5) |^==' bash tools/env_ab.sh 2 '$OFF' MINIDNN_CONV_DW_SETTLE=1 -- python3 bench/train_step.py \
--models mobilenet,lenet5 --optimizers sgd --math fp32 --steps 30 --pipelined 10;;\
env GREP='^mobilenet|^==' bash tools/env_ab.sh 1 '$OFF' MINIDNN_CONV_DW_SETTLE=1 -- python3 bench/amp_step.py \
--models mobilenet --steps 30 --pipelined 10 --no-graphs"
exec bash tools/gpu_s9_parts.sh
