#!/usr/bin/env bash
# Session 20: this session's two defaults on an H100 (every A/B of the session ran on an H200) -- batch norm's
# symmetric meeting against the last-arriver one, and the log-softmax backward's BWD_STASH 6 against 4.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s20_h100.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-60} CTIME=${CTIME:-150} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_bn_s20_symm.py -k 264"
export CMDS="python3 tools/bn_s18_ab.py --settings p1s1,p1 --dtypes float32,bfloat16 --shapes 32x256x56x56,256x32x56x56,128x64x56x56 --rounds 7 --no-torch;;\
python3 tools/row_ab.py --ops lsmxbwd --dtypes bfloat16,float16 --shapes 4096x50257,2048x65536,4096x32000 --bwd-stash 4,6 --rounds 4"
exec bash tools/gpu_s9_parts.sh
