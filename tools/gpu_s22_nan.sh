#!/usr/bin/env bash
# Session 22: the row kernels' chunked forward now keeps a NaN sum unconditionally (s * 0 where the running max is
# -inf; the NAN_RESCALE switch is gone) -- the default kernel text of every chunked softmax / log-softmax forward and
# cross-entropy row forward changed, so their cuda modules run in full; then Nsight Compute on the kernels under 70%
# of copy (tools/ncu_s21.sh).  ~5 min on a fresh H200.   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s22_nan.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-300} CTIME=${CTIME:-200} TAIL=${TAIL:-30}
export PARTS="tests/backend/test_nan_rescale.py tests/backend/test_softmax_cluster.py tests/backend/test_ce_long_cuda.py;;\
tests/backend/test_softmax_rows_cuda.py;;tests/backend/test_softmax_s17_rows.py tests/backend/test_softmax_hint.py;;\
tests/backend/test_lsm_warp.py tests/backend/test_softmax_warp.py tests/backend/test_softmax_fwd_narrow.py;;\
tests/backend/test_ce_fwd_tail.py tests/backend/test_ce_lowp_logits_cuda.py"
export CMDS="bash tools/ncu_s21.sh"
exec bash tools/gpu_s9_parts.sh
