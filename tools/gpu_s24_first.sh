#!/usr/bin/env bash
# The next session's first device call (written by session 23, which had no device time left): the spatial
# cross-entropy's cuda tests on what session 23 could not run on the GPU -- the backward's split rule (half the
# resident threads, 959c53e), the SPLIT forward's shared array moved into the kernel with its static_assert (REVIEW23B's
# nits; the host test tests/backend/test_ce_split_host.py passes), the 'at' rename, the forward's one batch function
# (sp_fwd_batch: SASS identical in 147 of 162 builds; float64's and SP_RT=0's differ in address arithmetic only) --
# then the (4, 171, 128, 128)
# backward at split 2 (untimed) beside one thread a position, then Nsight Compute on the rows still under 70%
# (tools/ncu_s23.sh: channels-last batch norm, the many-class bfloat16 spatial forward).  ~5 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s24_first.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-220} CTIME=${CTIME:-200} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_ce_spatial.py -k against_float64;;tests/backend/test_ce_spatial.py -k not~against_float64"
export CMDS="python3 tools/ce_sp_ab.py --rounds 3 --trials 5 --settings nosplit,pair --shapes 4x171x128x128,8x150x64x64;;\
bash tools/ncu_s23.sh"
exec bash tools/gpu_s9_parts.sh
