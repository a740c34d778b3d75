#!/usr/bin/env bash
# Session 25, run 4: the cluster softmax with the partials exchanged by remote stores only (no PUSH switch left) and
# VPT_FWD = 8 for every dtype's forward -- the softmax cuda tests (cluster module, row kernels, NaN rescale); the A/B
# of the new rule against the VPT 4 rule ("1:vpt4") on 16-bit rows, few rows included (run 2's float16 (64, 65536)
# at 4 x 256 x 8 was 0.92x in one trial), and float32 again; then bench/kernels_gpu.py's long rows beside PyTorch.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s25_run4.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-240} CTIME=${CTIME:-170} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_softmax_cluster.py tests/backend/test_nan_rescale.py;;tests/backend/test_softmax_rows_cuda.py;;\
tests/backend/test_softmax_s17_rows.py tests/backend/test_softmax_fwd_narrow.py tests/backend/test_lsm16_stash.py"
AB="python3 tools/softmax_cluster_ab.py"
S="grep -v -i warn | grep -v 'values against' | cut -c1-200"
export CMDS="$AB --ops smx,lsmx --dtypes bfloat16 --shapes 64x50257,64x65536,132x65536,300x50257,8x131072 --settings 1,1:vpt4 --rounds 3 2>&1 | $S;;\
$AB --ops smx,lsmx --dtypes float16 --shapes 64x65536,4096x50257 --settings 1,1:vpt4 --rounds 3 2>&1 | $S;;\
$AB --ops smx,lsmx,smxbwd --dtypes float32 --shapes 4096x50257,64x50257 --settings 1,1:vpt4 --rounds 2 2>&1 | $S;;\
python3 bench/kernels_gpu.py --only softmax_long --sizes large,large2,large3 --dtypes float32,bfloat16 --timing graph 2>&1 | grep -v -i warn"
exec bash tools/gpu_s9_parts.sh
