#!/usr/bin/env bash
# Session 22, second spatial cross-entropy call: the pair test's weights mended (x's dtype), then tools/ce_sp_ab.py
# (graph replays in alternated rounds: C read / compiled in / two positions a thread, PyTorch beside) -- run 4's
# one-pass timings put the first setting of each shape 1.0-1.6x off the same kernel's figure in run 3.
#   ~3 min on a fresh H200.  From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s22_sp2.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-240} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_ce_spatial.py -k pairs~or~special~or~4d"
export CMDS="python3 tools/ce_sp_ab.py --rounds 3 --trials 5"
exec bash tools/gpu_s9_parts.sh
