#!/usr/bin/env bash
# Session 24, run 2: SP_PIPE (the spatial cross-entropy past SP_CC with the next batch's loads in flight) -- its cuda
# tests (tests/backend/test_ce_sp_pipe.py, both settings in parallel), then the A/B against the default (pair) on the
# many-class shapes, PyTorch beside.  ~6 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s24_pipe.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-260} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_ce_sp_pipe.py -k pipe4;;tests/backend/test_ce_sp_pipe.py -k pipe3"
export CMDS="python3 tools/ce_sp_ab.py --rounds 3 --trials 5 --settings pair,pipe4,pipe3 --shapes 10x150x128x128,4x171x128x128,8x150x64x64"
exec bash tools/gpu_s9_parts.sh
