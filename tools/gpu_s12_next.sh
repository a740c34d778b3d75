#!/usr/bin/env bash
# Session 13's first GPU call: the cuda tests of what session 12 changed after its last GPU run (softmax NARROW "16"
# as the accurate / log default, the fast softmax's flush-to-zero fix, channels-last batch norm KEEP above L2), each
# file in its own pytest process (tools/gpu_s9_parts.sh), then the A/B tools of the adopted defaults.  ~5-6 minutes
# on a fresh machine (NVRTC compiles).  Run from a clean archive of HEAD:
#   OUT=$OUT TLIMIT=280 CTIME=150 bash tools/gpu_s12_next.sh
cd "$(dirname "$0")/.."
export PARTS="tests/backend/test_softmax_fwd_narrow.py --tb=short;;tests/backend/test_bn_nhwc_l2.py --tb=short;;\
tests/backend/test_bn_nhwc_cuda.py --tb=short;;tests/backend/test_softmax_rows_cuda.py --tb=short;;\
tests/backend/test_softmax.py tests/nn/test_functional.py --tb=short"
export CMDS="python3 tools/bn_nhwc_ab.py;;python3 tools/row_ab.py --rounds 2"
exec bash tools/gpu_s9_parts.sh
