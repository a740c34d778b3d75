#!/usr/bin/env bash
# Session 22: the spatial cross-entropy kernels with the class count compiled in (loss_kernels.SP_CC), an fmax batch
# max, an int target compare, (o, i) advanced without a division, and two positions a thread (SP_PAIR): their cuda
# tests, then the A/B of SP_PAIR off / on (SP_CC 32,24) with PyTorch beside.  ~3 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s22_sp.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_ce_spatial.py"
# (runs 3-4 ran tools/spatial_ce_gpu.py --sp-cc, an eager one-pass A/B whose figures followed the settings' order;
# that option is gone -- tools/ce_sp_ab.py is the A/B, graph replays in alternated rounds)
export CMDS="python3 tools/ce_sp_ab.py --rounds 3 --trials 5 --settings read,cc,pair"
exec bash tools/gpu_s9_parts.sh
