#!/usr/bin/env bash
# Session 20, device call 3: the symmetric meeting's shortened chain (one-block tiles direct, the departure ticket
# under the partials' loads, warp-0 shuffles) -- its cuda tests (bitwise the last arriver's) and the A/B p1 / p1s1
# (run 2 timed the first SYMM) -- and helper LSM16's BWD_STASH 5 / 6 (16-bit log-softmax backward): its cuda tests
# and the A/B against 4, PyTorch beside.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s20_run3.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-170} CTIME=${CTIME:-260} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_bn_s20_symm.py tests/backend/test_bn_s18_unroll.py;;\
tests/backend/test_softmax_s17_rows.py -k stash -x;;tests/backend/test_lsm16_stash.py"
export CMDS="python3 tools/bn_s18_ab.py --settings p1,p1s1 --dtypes float32,bfloat16 --rounds 9 --no-torch;;\
python3 tools/row_ab.py --ops lsmxbwd --dtypes bfloat16,float16 --shapes 4096x50257,300x50257,2048x49999,2048x65536,8192x16385,4096x32001,4096x32000 --bwd-stash 4,5,6 --rounds 4"
exec bash tools/gpu_s9_parts.sh
