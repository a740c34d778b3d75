#!/usr/bin/env bash
# The rows session 23 left under 70% of copy in Nsight Compute (tools/ncu_s23.py): where the channels-last batch-norm
# kernels and the many-class spatial cross-entropy's bfloat16 forward spend their time (stalls, bytes in flight,
# occupancy, issue).  ~2 min on a fresh H200 (not yet run: session 23 had no device time left).
#   OUT=$OUT bash tools/ncu_s23.sh
cd "$(dirname "$0")/.."
exec bash tools/ncu_prof.sh tools/ncu_s23.py bncl_bwd:bnc_bwd1 bncl_fwd:bnc_fwd1 ce171_bf16:ce_sp_fwd ce150_bf16:ce_sp_fwd
