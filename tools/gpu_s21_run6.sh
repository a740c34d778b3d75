#!/usr/bin/env bash
# Session 21 run 6: helper SMCL's cluster softmax rows (cuda tests, the A/B that decides MINIDNN_SOFTMAX_CLUSTER's
# default) and the spatial cross-entropy's batch-max forward (cuda tests, timings beside PyTorch).
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s21_run6.sh      (~5-6 min on a fresh H200)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-170} CTIME=${CTIME:-240} TAIL=${TAIL:-200}
export PARTS="tests/backend/test_softmax_cluster.py;;tests/backend/test_ce_spatial.py;;\
tests/backend/test_step_cuda_kernels.py -k cross_entropy"
export CMDS="python3 tools/spatial_ce_gpu.py --dtypes float32,bfloat16 --trials 5 --shapes 32x21x128x128,16x19x256x256,8x150x64x64;;\
python3 tools/softmax_cluster_ab.py --rounds 3 --trials 5;;\
python3 tools/softmax_cluster_ab.py --ops smx,lsmx,lsmxbwd --dtypes bfloat16 --shapes 300x50257,4096x32000 --settings all,all:exact,all:nt512,all:cl8 --no-torch --rounds 3"
exec bash tools/gpu_s9_parts.sh
