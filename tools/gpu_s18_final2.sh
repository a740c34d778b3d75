#!/usr/bin/env bash
# Session 18, device call 10 (the last): the trimmed batch-norm kernels' cuda tests (PTX byte-identical to run 8's
# defaults), then the kernel table's group-norm (the one-text stash) and batch-norm rows on the three large size sets,
# PyTorch beside -- the closing note's figures.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s18_final2.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-100} CTIME=${CTIME:-200} TAIL=${TAIL:-120}
export PARTS="tests/backend/test_bn_s18_unroll.py;;tests/backend/test_bn_onchip.py -k float32"
export CMDS="python3 bench/kernels_gpu.py --sizes large,large2,large3 --dtypes float32,bfloat16 --timing graph --only gn,bn"
exec bash tools/gpu_s9_parts.sh
