#!/usr/bin/env bash
# Session 20, device call 2: batch norm's symmetric meeting (bn_kernels.ONEPASS_SYMM) -- its cuda tests (bitwise the
# last arriver's, three calls in a row, the counter once) and the softmax graph test after its stream fix, then the
# A/B p1 (the default) against p1s1 on the four NCHW shapes, float32 and bfloat16, PyTorch beside.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s20_run2.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-150} CTIME=${CTIME:-170} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_bn_s20_symm.py;;tests/backend/test_softmax_s17_rows.py -k in_a_graph"
export CMDS="python3 tools/bn_s18_ab.py --settings p1,p1s1 --dtypes float32 --rounds 11;;\
python3 tools/bn_s18_ab.py --settings p1,p1s1 --dtypes bfloat16 --rounds 11"
exec bash tools/gpu_s9_parts.sh
