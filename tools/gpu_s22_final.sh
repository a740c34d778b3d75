#!/usr/bin/env bash
# Session 22's last device call: the spatial cross-entropy on the shared ColWalk walker, and REVIEW22C's mends to the
# channel softmax (FAST_SCALE in the column kernels, new and old; expf PAIR forwards up to 18 classes; paired chunks
# with a partial last chunk; FAST on bfloat16; the split fill); then the spatial loss's figures on the walker (run 6
# had them on SpPos: pair 0.0139 / 0.0279 ms float32 forwards, 0.0099 / 0.0178 bfloat16).  ~4 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s22_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-170} CTIME=${CTIME:-120} TAIL=${TAIL:-30}
export PARTS="tests/backend/test_ce_spatial.py;;tests/backend/test_softmax_cols_s22.py tests/backend/test_softmax_rows_cuda.py::test_softmax_channel_columns;;tests/backend/test_softmax_cluster.py"
export CMDS="python3 tools/ce_sp_ab.py --rounds 3 --trials 5 --settings cc,pair"
exec bash tools/gpu_s9_parts.sh
