#!/usr/bin/env bash
# Session 23 run 5: the three changes' cuda tests side by side -- SP_RT's bitwise fix and pair rule (spatial
# cross-entropy), SMCLP's pipelined cluster forward (smx_fwdp, PIPE "1" / "late"), BNCL23's channel rounds for
# channels-last batch norm -- then their A/Bs (graph replays, PyTorch beside).  ~7 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s23_run5.sh
# (A record of run 5: both helpers' candidates, their tests and tools were removed after it -- 55819c0 -- so only
# its spatial part still runs at later commits.)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-170} TAIL=${TAIL:-80}
export PARTS="tests/backend/test_ce_spatial.py -k rt_bitwise~or~route~or~grid_stride~or~pairs;;\
tests/backend/test_softmax_cluster_pipe.py;;tests/backend/test_bn_nhwc_rounds.py"
export CMDS="python3 tools/softmax_cluster_ab.py --ops smx,lsmx --dtypes float32,bfloat16 --shapes 300x50257,4096x50257,4096x32000,2048x65536 --settings 1,1:pipe,1:pipelate;;\
python3 tools/bn_nhwc_rounds_ab.py --rounds 3;;\
python3 tools/ce_sp_ab.py --rounds 3 --trials 5 --settings rt0,pair --shapes 16x150x128x128,4x171x128x128"
exec bash tools/gpu_s9_parts.sh
