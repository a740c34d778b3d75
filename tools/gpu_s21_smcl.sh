#!/usr/bin/env bash
# Session 21 (helper SMCL, issue 10): softmax / log-softmax rows on thread-block clusters (softmax_cluster.py).
# First the cuda tests of the cluster kernels (float64 on the device, special values as the row kernels, misaligned
# views, graph replays, repeatability), then the A/B that decides MINIDNN_SOFTMAX_CLUSTER's default: the row kernels
# ("0") against the clusters ("all", and the rule "1" where it plans otherwise) and PyTorch, forward and backward of
# both algorithms, float32 and bfloat16, 50257-class rows at 64..4096 rows, 32000 at 300 / 4096, (2048, 65536),
# (128, 128000); then the rule's own choices on bfloat16: ex2.approx against expf ("all:exact"), 512-thread blocks,
# 8-block clusters -- docs/step_kernels.md, "Session 21: softmax rows on thread-block clusters".
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s21_smcl.sh       (~3-4 min on a fresh H200)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-150} CTIME=${CTIME:-240} TAIL=${TAIL:-300}
export PARTS="tests/backend/test_softmax_cluster.py"
export CMDS="python3 tools/softmax_cluster_ab.py --rounds 3 --trials 5;;\
python3 tools/softmax_cluster_ab.py --ops smx,lsmx,lsmxbwd --dtypes bfloat16 --shapes 300x50257,4096x32000 --settings all,all:exact,all:nt512,all:cl8 --no-torch --rounds 3"
exec bash tools/gpu_s9_parts.sh
