#!/usr/bin/env bash
# (MINIDNN_SOFTMAX_CLUSTER_VPT_F32 was renamed MINIDNN_SOFTMAX_CLUSTER_VPT_FWD in session 25: the name below is a
# record of run 1, ignored since.)
# The next session's first device call (written by session 24, which measured VPT_F32 with its last device seconds):
# the cluster softmax module's cuda tests with MINIDNN_SOFTMAX_CLUSTER_VPT_F32=8 (the float32 forwards' 256-thread
# blocks at up to 8 vectors a thread; off by default until these pass), and beside it the default; then the A/B of
# the rule's untimed plan (4096, 32000) -> 4 x 256 x 8 and a few more rows.  If all pass and nothing loses: set the
# default to 8 in softmax_cluster.py (VPT_F32), update test_softmax_cluster's PLANS / routing expectations (the
# VPT_F32 = 8 plans are in test_vpt_f32_plans).  Last, run 8's bfloat16 VPT 8 fault: three fresh processes (is it
# intermittent?), then under compute-sanitizer (look the offset up in a local -ftz=true build: docs/step_kernels.md,
# VPT8FAULT).  ~5-6 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s25_first.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-150} TAIL=${TAIL:-40}
export PARTS="MINIDNN_SOFTMAX_CLUSTER_VPT_F32=8 tests/backend/test_softmax_cluster.py tests/backend/test_nan_rescale.py;;\
tests/backend/test_softmax_cluster.py"
export CMDS="python3 tools/softmax_cluster_ab.py --ops smx,lsmx --dtypes float32 --shapes 4096x32000,4096x50257,64x50257,2048x65537 --settings 1:vpt4,1:vpt8 --rounds 3;;\
python3 tools/softmax_cluster_ab.py --ops smx --dtypes bfloat16 --shapes 2048x65536 --settings 1,1:vpt8 --rounds 1 --no-torch 2>&1 | grep -E 'values|vpt8|failed' | head -3;;\
python3 tools/softmax_cluster_ab.py --ops smx --dtypes bfloat16 --shapes 2048x65536 --settings 1,1:vpt8 --rounds 1 --no-torch 2>&1 | grep -E 'values|vpt8|failed' | head -3;;\
python3 tools/softmax_cluster_ab.py --ops smx --dtypes bfloat16 --shapes 2048x65536 --settings 1,1:vpt8 --rounds 1 --no-torch 2>&1 | grep -E 'values|vpt8|failed' | head -3;;\
compute-sanitizer --tool memcheck python3 tools/softmax_cluster_ab.py --ops smx --dtypes bfloat16 --shapes 2048x65536 --settings 1:vpt8 --rounds 1 --trials 1 --no-torch --no-precompile 2>&1 | grep -v -i warn | head -40"
exec bash tools/gpu_s9_parts.sh
