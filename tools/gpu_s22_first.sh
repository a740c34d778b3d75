#!/usr/bin/env bash
# For session 22's first device call (~4 min on a fresh H200):
# - the spatial cross-entropy forward's grid sum, now loss_kernels.ce_grid_sum (session 21's final read, not
#   GPU-run): tests/backend/test_ce_spatial.py and tools/spatial_ce_gpu.py;
# - softmax_kernels.NAN_RESCALE (off by default), the row kernels' chunked-forward fix for NaN-only first chunks
#   (docs/step_kernels.md, session 21 "On the GPU", run 11): its cuda tests with the switch on (half-NaN rows all
#   NaN, other rows bitwise the default's), the cluster special-values tests, and the long-row cuda modules under
#   MINIDNN_NAN_RESCALE=1.  Adopting it: its default "1" in softmax_kernels.py (test_row_kernels_keep_nan_slices's
#   strict xfail then lifts itself), after test_ce_lowp_logits' widened-spill test passes with it on (nvcc: +4
#   bytes in some float16 widened ce_rows builds);
# - session 21's kernel-table kinds (softmax_long, spatial) in graph timing.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s22_first.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_nan_rescale.py tests/backend/test_ce_spatial.py;;tests/backend/test_softmax_cluster.py -k special~or~nan;;\
MINIDNN_NAN_RESCALE=1 tests/backend/test_lsm16_stash.py tests/backend/test_ce_long_cuda.py;;\
MINIDNN_NAN_RESCALE=1 tests/backend/test_softmax_cluster.py -k nan_slices"
export CMDS="env MINIDNN_NAN_RESCALE=1 python3 -m pytest -q -p no:cacheprovider tests/backend/test_ce_lowp_logits.py -k spills;;\
python3 bench/kernels_gpu.py --sizes large,large2,large3 --dtypes float32,bfloat16 --timing graph --only softmax_long,spatial;;\
python3 tools/spatial_ce_gpu.py --dtypes float32,bfloat16 --trials 3 --shapes 32x21x128x128,16x19x256x256"
exec bash tools/gpu_s9_parts.sh
