#!/usr/bin/env bash
# Session 22: COLS22's channel softmax kernels (softmax_kernels COLS_V2, on by default) on the GPU for the first time:
# their cuda tests (with the old channel test), then tools/cols_ab.py old / new / new without PAIR / new without the
# fast exp, PyTorch beside (graph replays, alternated rounds).  ~5 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s22_cols.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-240} CTIME=${CTIME:-260} TAIL=${TAIL:-120}
export PARTS="tests/backend/test_softmax_cols_s22.py tests/backend/test_softmax_rows_cuda.py::test_softmax_channel_columns"
export CMDS="python3 tools/cols_ab.py --settings 0,1,1np,1nx --rounds 3 --trials 5"
exec bash tools/gpu_s9_parts.sh
