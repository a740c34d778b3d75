#!/usr/bin/env bash
# Session 19, device call 4: host round 31's cuda tests and its six switches' in-process A/B (fp32, bf16), the kernel
# modules' cuda tests after DEBT's shared texts (PTX / token identical; the group-norm tests' shared fixtures run here
# first), and the host-call probe with bfloat16 arrays.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s19_run4.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-230} CTIME=${CTIME:-150} TAIL=${TAIL:-40}
SW=minidnn.optim.optimizer:HOLD_ACCUMULATORS,minidnn.nn._functions._util:EXACT_GRADS,minidnn.nn._functions.conv:LEAN_CONV,minidnn.autograd:SLOT_GRAD_AS_IS,minidnn.backend.handle:BY_GPU,minidnn.nn.module:REGISTERED_ATTRS
export PARTS="tests/nn/test_host31_cuda.py tests/nn/test_host30_registered_cuda.py;;\
tests/backend/test_norm_s17_gncl.py tests/backend/test_norm_s18_gn16.py tests/backend/test_norm_s18_gn16b.py tests/backend/test_norm_s18_gn16c.py -k not~compile;;\
tests/backend/test_softmax_warp.py tests/backend/test_lsm_warp.py tests/backend/test_ce_long.py tests/backend/test_pool_act_vec.py tests/backend/test_pooling.py -k not~compile;;\
tests/backend/test_depthwise_kernels.py tests/backend/test_norm_kernels.py -k not~compile~and~not~group_norm;;\
tests/backend/test_bn_cluster.py tests/backend/test_bn_nhwc_cuda.py tests/test_cuda_graphs.py -k not~compile"
export CMDS="python3 tools/host_call_probe.py;;\
env SW=$SW python3 tools/step_sw_ab.py --models resnet20,mobilenet --rounds 12;;\
env SW=$SW python3 tools/step_sw_ab.py --models resnet20,mobilenet --rounds 12 --amp bf16"
exec bash tools/gpu_s9_parts.sh
