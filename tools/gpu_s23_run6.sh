#!/usr/bin/env bash
# Session 23 run 6: the cluster softmax forward's launch shape on the rows still under target -- bfloat16
# log-softmax / softmax (4096, 50257) (0.99x PyTorch in session 21) and (2048, 65536), float32 (4096, 50257) (66% of
# copy) -- the rule's CL x NT against forced ones (graph replays, PyTorch beside).  ~3 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s23_run6.sh
cd "$(dirname "$0")/.."
export PYTHONPATH=. CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
timeout 200 python3 tools/softmax_cluster_ab.py --ops lsmx,smx --dtypes bfloat16 --shapes 4096x50257,2048x65536 \
  --settings 1,all:nt512,all:cl8,all:cl8:nt512 --rounds 3 2>&1 | tee $OUT/bf16.txt | grep -v "^\s*File\|Traceback"
timeout 150 python3 tools/softmax_cluster_ab.py --ops smx,lsmx --dtypes float32 --shapes 4096x50257 \
  --settings 1,all:cl8 --rounds 3 2>&1 | tee $OUT/f32.txt | grep -v "^\s*File\|Traceback"
