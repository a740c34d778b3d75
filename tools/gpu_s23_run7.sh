#!/usr/bin/env bash
# Session 23 run 7: the spatial cross-entropy's SP_SPLIT (few positions, many classes) -- every cuda test of the
# module, then the A/B rt0 (session 22's masked batches) / nosplit (SP_RT, one thread a position) / pair (the default:
# SPLIT where positions are few).  ~5 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s23_run7.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-220} CTIME=${CTIME:-150} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_ce_spatial.py -k against_float64;;tests/backend/test_ce_spatial.py -k not~against_float64"
export CMDS="python3 tools/ce_sp_ab.py --rounds 3 --trials 5 --settings rt0,nosplit,pair --shapes 8x150x64x64,4x171x128x128,2x150x128x128,16x150x128x128"
exec bash tools/gpu_s9_parts.sh
