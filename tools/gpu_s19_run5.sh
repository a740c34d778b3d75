#!/usr/bin/env bash
# Session 19, device call 5: the cuda tests of the removed candidates (SWITCHES: bn ONEPASS_UNROLL, GN_PREFETCH,
# POOL_VEC_BWD 2, softmax LSM 1 / WARP 2; the lead: bn CL_ROUNDS, REGISTERED_ATTRS), and the A/B of a float32
# backward-stash rule for softmax rows where the cp.async stash does not fit (BWD_STASH 1 against the default 3).
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s19_run5.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-190} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_bn_s18_unroll.py tests/backend/test_bn_onchip.py -k not~compile;;\
tests/backend/test_lsm_warp.py tests/backend/test_pool_act_vec.py -k not~compile;;\
tests/backend/test_softmax_warp.py -k float32~and~not~compile;;\
tests/nn/test_host31_cuda.py tests/backend/test_norm_kernels.py -k (group_norm~or~bit_identical)~and~not~compile"
export CMDS="python3 tools/row_ab.py --ops smxbwd,lsmxbwd --dtypes float32,bfloat16 --shapes 4096x50257,4096x32001,2048x65536,8192x16385 --bwd-stash 3,1 --rounds 5"
exec bash tools/gpu_s9_parts.sh
