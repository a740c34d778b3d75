#!/usr/bin/env bash
# Session 21 run 10: the cluster softmax rows at 64 registers (MINB 4: run 9 found the 32-register forward faulting)
# -- their cuda tests, then the A/B that decides MINIDNN_SOFTMAX_CLUSTER's default.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s21_run10.sh      (~4 min on a fresh H200)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-150} CTIME=${CTIME:-240} TAIL=${TAIL:-200}
export PARTS="tests/backend/test_softmax_cluster.py"
export CMDS="python3 tools/softmax_cluster_ab.py --rounds 3 --trials 5"
exec bash tools/gpu_s9_parts.sh
