#!/usr/bin/env bash
# Session 20, device call 1: what session 19 changed after its last GPU run -- BWD_STASH 4's cuda test and its A/B
# against 3 (tools/gpu_s20_stash4.sh's rows), the nn cuda tests (the conv node back on _util.apply_seen, round 31's
# switches), test_bn_s18_unroll (its compile check on tests/_nvcc.build), and the amp / graph cuda tests.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s20_run1.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-240} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
NN=$(ls tests/nn/*cuda*.py | tr '\n' ' ')
export PARTS="tests/backend/test_softmax_s17_rows.py -k stash~and~not~compile;;\
$NN;;\
tests/backend/test_bn_s18_unroll.py tests/test_cuda_graphs.py tests/test_grad_dest_cuda.py;;\
tests/amp"
export CMDS="python3 tools/row_ab.py --ops lsmxbwd --dtypes float32,bfloat16,float16 --shapes 4096x50257,300x50257,2048x49999 --bwd-stash 3,4 --rounds 7"
exec bash tools/gpu_s9_parts.sh
