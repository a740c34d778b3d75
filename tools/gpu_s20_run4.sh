#!/usr/bin/env bash
# Session 20, device call 4: the one-pass batch norm with the symmetric meeting on by default (run 3's shortened
# chain, the tree for tiles past 32 blocks) and CLM (the meeting in a cluster's shared memory, off): the symmetric /
# cluster cuda tests (bitwise) and every one-pass batch-norm cuda test under the new default; the softmax stash tests
# again (run 3 stopped on a test bug); then the A/B p1s1 (the default) / p1s1c1, PyTorch beside.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s20_run4.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-170} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_bn_s20_symm.py tests/backend/test_bn_s18_unroll.py;;\
tests/backend/test_bn_onchip.py -x;;\
tests/backend/test_normalization.py tests/backend/test_bn_kernels.py tests/backend/test_bn_twin.py tests/backend/test_bn_dx_nhwc.py;;\
tests/nn/test_bn_fast_path_cuda.py tests/nn/test_bn_dx_nhwc_cuda.py tests/nn/test_twins_cuda.py tests/nn/test_twin_nhwc_cuda.py tests/test_cuda_graphs.py;;\
tests/backend/test_softmax_s17_rows.py -k stash"
export CMDS="python3 tools/bn_s18_ab.py --settings p1s1,p1s1c1 --dtypes float32,bfloat16 --rounds 9"
exec bash tools/gpu_s9_parts.sh
