#!/usr/bin/env bash
# Session 25, run 5 (the closing check): the cluster softmax's cuda tests (with NaN rescale's) at HEAD -- run 4's
# code plus WIDE_MIN_BLOCKS_PER_SM (few-row 16-bit forwards back on the VPT_MAX plan) -- and the A/B showing the
# few-row plans now equal to "1:vpt4" while 132 rows keep the wide plan.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s25_run5.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-120} TAIL=${TAIL:-30}
export PARTS="tests/backend/test_softmax_cluster.py tests/backend/test_nan_rescale.py"
export CMDS="python3 tools/softmax_cluster_ab.py --ops smx,lsmx --dtypes bfloat16,float32 --shapes 64x50257,132x65536 --settings 1,1:vpt4 --rounds 2 2>&1 | grep -v -i warn | grep -v 'values against' | cut -c1-200"
exec bash tools/gpu_s9_parts.sh
