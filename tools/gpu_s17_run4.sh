#!/usr/bin/env bash
# Session 17's fourth device call: softmax rows of 257-512 classes on the WARP grid and the long backward rows'
# shared-memory stash (helper ROWSM: cuda tests, A/Bs), and the cuda tests of what runs 2-3 made the default
# (cross-entropy long rows, group norm clusters / layer norm v3kw, channels-last batch norm SPLIT).
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s17_run4.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-210} CTIME=${CTIME:-150} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_softmax_s17_rows.py;;tests/backend/test_ce_long_cuda.py -k small;;\
tests/backend/test_ce_long_cuda.py -k big;;tests/backend/test_norm_s17_gncl.py tests/backend/test_norm_s17_ln.py;;\
tests/backend/test_bn_nhwc_s17.py tests/backend/test_norm_kernels.py"
export CMDS="python3 tools/row_ab.py --ops smx,lsmx,lsmxbwd --dtypes float32,bfloat16 --shapes 65536x512,16384x512 --warp-from 513,257 --rounds 3;;\
python3 tools/row_ab.py --ops smxbwd,lsmxbwd --dtypes float32,bfloat16 --shapes 4096x32000,4096x50257 --bwd-stash 0,1,2,3 --rounds 3"
exec bash tools/gpu_s9_parts.sh
