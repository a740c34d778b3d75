#!/usr/bin/env bash
# Session 23: the spatial cross-entropy past SP_CC (SP_RT: unmasked full batches; pairs there too) -- its cuda tests,
# then the A/B on many-class shapes (rt0: session 22's masked batches; cc: SP_RT one position a thread; pair: the
# default) and one compiled-class shape as a control.  ~4 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s23_ce.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-150} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_ce_spatial.py"
export CMDS="python3 tools/ce_sp_ab.py --rounds 3 --trials 5 --settings rt0,cc,pair --shapes 16x150x128x128,8x150x64x64,4x171x128x128,32x21x128x128"
exec bash tools/gpu_s9_parts.sh
