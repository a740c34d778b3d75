#!/usr/bin/env bash
# Session 22, second COLS_V2 call: the 16-bit forwards' fast exp as 2^((v - sh) log2e) (run 7: a 1-class bfloat16
# log-softmax gave -3.6e-7 where 0 is exact) and the pair-view test's class counts; the cuda tests, then the 16-bit
# forwards' A/B (ex2 form against expf, PyTorch beside).  ~2 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s22_cols2.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-150} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_softmax_cols_s22.py tests/backend/test_softmax_rows_cuda.py::test_softmax_channel_columns"
export CMDS="python3 tools/cols_ab.py --ops smx,lsmx --dtypes bfloat16 --settings 1,1nx --rounds 3 --trials 5"
exec bash tools/gpu_s9_parts.sh
