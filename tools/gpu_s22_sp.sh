#!/usr/bin/env bash
# Session 22: the spatial cross-entropy kernels with the class count compiled in (loss_kernels.SP_CC), an fmax batch
# max, an int target compare, (o, i) advanced without a division, and two positions a thread (SP_PAIR): their cuda
# tests, then the A/B of SP_PAIR off / on (SP_CC 32,24) with PyTorch beside.  ~3 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s22_sp.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_ce_spatial.py"
export CMDS="python3 tools/spatial_ce_gpu.py --dtypes float32,bfloat16 --trials 3 --shapes 32x21x128x128,16x19x256x256 --sp-cc '32,24,0;32,24,1'"
exec bash tools/gpu_s9_parts.sh
