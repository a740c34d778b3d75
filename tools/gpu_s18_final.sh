#!/usr/bin/env bash
# Session 18's last device call: the kernel table's group-norm and cross-entropy rows on the three large size sets
# (the stash kernels, the folded cross-entropy forward), the mixed-precision step with the fp32+cl row, and the fp32 /
# TF32 training steps (issue 10) -- PyTorch beside, same run.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s18_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-60} CTIME=${CTIME:-250} TAIL=${TAIL:-40}
export PARTS=""
export CMDS="python3 bench/kernels_gpu.py --sizes large,large2,large3 --dtypes float32,bfloat16 --timing graph --only gn,ce;;\
python3 bench/amp_step.py --steps 30 --pipelined 10 --modes fp32,bf16,fp32+cl,bf16+cl;;\
python3 bench/train_step.py --steps 60 --pipelined 10"
exec bash tools/gpu_s9_parts.sh
