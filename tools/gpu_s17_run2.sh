#!/usr/bin/env bash
# Session 17's second device call: the softmax rows' cache hints (helper ROWHINT: cuda tests, the A/B of HINT 0/1/2)
# and channels-last batch norm's SPLIT meeting (helper BNCL: cuda tests, the A/B off / on / PyTorch).
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s17_run2.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-170} CTIME=${CTIME:-150} TAIL=${TAIL:-45}
export PARTS="tests/backend/test_softmax_hint.py -k float32;;tests/backend/test_softmax_hint.py -k bfloat16;;\
tests/backend/test_bn_nhwc_s17.py"
export CMDS="python3 tools/row_ab.py --ops smx,lsmx,lsmxbwd,smxbwd --dtypes float32 --shapes 16384x1000,32768x1000 --hint 0,1,2 --rounds 3;;\
timeout 165 python3 tools/bn_nhwc_s17_ab.py --rounds 3 --phases;;\
timeout 95 python3 tools/row_ab.py --ops smx,lsmx --dtypes bfloat16 --shapes 16384x1000 --hint 0,1,2 --rounds 2"
exec bash tools/gpu_s9_parts.sh
