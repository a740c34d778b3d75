#!/usr/bin/env bash
# Session 20, device call 5: CLM actually running (CLM 2: whatever the driver's cluster occupancy) -- its cuda test
# (bitwise the global symmetric meeting, the launched kernels recorded) and the A/B p1s1 (the default) / p1s1c1 /
# p1s1c2 with the routes naming the driver's clusters at once; the float16 softmax stash case after its bound fix.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s20_run5.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-150} CTIME=${CTIME:-150} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_bn_s20_symm.py -k cluster;;tests/backend/test_softmax_s17_rows.py -k float16-9x50257"
export CMDS="python3 tools/bn_s18_ab.py --settings p1s1,p1s1c1,p1s1c2 --dtypes float32,bfloat16 --shapes 32x256x56x56,128x64x56x56 --rounds 9 --no-torch"
exec bash tools/gpu_s9_parts.sh
