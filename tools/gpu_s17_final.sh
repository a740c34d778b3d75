#!/usr/bin/env bash
# Session 17's last device call (the device budget allows one): the cuda tests changed after run 4 (softmax's
# stash-3 default, the BN NHWC rule test, group norm's NT=512 test), then the kernel table on the three large size
# sets for the kernels this session changed, and the mixed-precision step (issue 12) -- PyTorch beside, same run.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s17_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-140} CTIME=${CTIME:-270} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_softmax_s17_rows.py;;tests/backend/test_bn_nhwc_s17.py -k rule_on;;\
tests/backend/test_norm_s17_gncl.py -k 512"
export CMDS="python3 bench/kernels_gpu.py --sizes large,large2,large3 --dtypes float32,bfloat16 --timing graph --only bn_cl,softmax,ce,ln,gn;;\
timeout 150 python3 bench/amp_step.py --steps 40 --pipelined 10"
exec bash tools/gpu_s9_parts.sh
