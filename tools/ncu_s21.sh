#!/usr/bin/env bash
# Session 21's kernels under 70% of copy in Nsight Compute (tools/ncu_s21.py): where the spatial cross-entropy
# forward, the channel log-softmax forward and the cluster softmax forward spend their time (bytes in flight,
# stalls, occupancy, issue).  One launch each (the third call), clocks left alone; reports as text under $OUT.
# ~2 min on a fresh H200.   OUT=$OUT bash tools/ncu_s21.sh
cd "$(dirname "$0")/.."
NCU_TIME=70 exec bash tools/ncu_prof.sh tools/ncu_s21.py ce_f32:ce_sp_fwd ce_bf16:ce_sp_fwd \
  cols_softmax:softmax_cols_fwd cols_log:softmax_cols_fwd cluster_f32:smx_fwdc
