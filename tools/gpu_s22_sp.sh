#!/usr/bin/env bash
# Session 22: the spatial cross-entropy kernels with the class count compiled in (loss_kernels.SP_CC), an fmax batch
# max, an int target compare and (o, i) advanced without a division: their cuda tests, then the A/B against SP_CC
# "0,0" (C read at run time, U at a time) with PyTorch beside, and float32 with FASTX's exp (MINIDNN_CE_FAST=1) for
# a figure.  ~3 min on a fresh H200.   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s22_sp.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_ce_spatial.py"
export CMDS="python3 tools/spatial_ce_gpu.py --dtypes float32,bfloat16 --trials 3 --shapes 32x21x128x128,16x19x256x256,8x150x64x64 --sp-cc '0,0;32,24';;\
env MINIDNN_CE_FAST=1 python3 tools/spatial_ce_gpu.py --dtypes float32 --trials 3 --shapes 32x21x128x128,16x19x256x256"
exec bash tools/gpu_s9_parts.sh
