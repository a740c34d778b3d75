#!/usr/bin/env bash
# Session 24, run 5: IGNORED_DX (an ignored row's dx softmax(x) * 0: NaN where its lse is not finite, as PyTorch and
# the CPU reference) in every GPU cross-entropy kernel -- its cuda test and every cross-entropy cuda module.
# ~4-5 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s24_ignored.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-300} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_ce_ignored_dx.py tests/backend/test_ce_long_cuda.py tests/backend/test_ce_lowp_logits_cuda.py tests/backend/test_nan_rescale.py tests/backend/test_ce_fwd_tail.py;;\
tests/backend/test_ce_spatial.py -k against_float64;;tests/backend/test_ce_spatial.py -k not~against_float64;;\
tests/backend/test_softmax_rows_cuda.py tests/backend/test_norm_ce_seen_cuda.py"
export CMDS=""
exec bash tools/gpu_s9_parts.sh
