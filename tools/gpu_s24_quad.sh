#!/usr/bin/env bash
# Session 24, run 3: SP_QUAD (the spatial cross-entropy past SP_CC, four positions a thread: 256-byte class segments
# a warp in 16-bit) -- the cuda tests of tests/backend/test_ce_sp_pipe.py (quads; the pipe's again), then the A/B
# against the default (pair) and quads everywhere possible (quad0), PyTorch beside.  ~5 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s24_quad.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-260} TAIL=${TAIL:-80}
export PARTS="tests/backend/test_ce_sp_pipe.py -k quad;;tests/backend/test_ce_sp_pipe.py -k not~quad"
export CMDS="python3 tools/ce_sp_ab.py --rounds 3 --trials 5 --settings pair,quad,quad0 --shapes 16x150x128x128,10x150x128x128,8x150x128x128,4x171x128x128"
exec bash tools/gpu_s9_parts.sh
