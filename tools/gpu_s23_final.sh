#!/usr/bin/env bash
# Session 23's last device call: the spatial cross-entropy's cuda tests after REVIEW23's mends and the forward's
# split rule (half the resident threads), then the A/B of that rule at (4, 171, 128, 128) and of the pairs' threshold
# past SP_CC at 65536 / 81920 pairs (nosplit: one thread a position where positions are few; cc: pairs off; pair: the
# default).  ~4 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s23_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-150} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_ce_spatial.py -k against_float64;;tests/backend/test_ce_spatial.py -k not~against_float64"
export CMDS="python3 tools/ce_sp_ab.py --rounds 3 --trials 5 --settings nosplit,cc,pair --shapes 4x171x128x128,8x150x128x128,10x150x128x128"
exec bash tools/gpu_s9_parts.sh
