#!/usr/bin/env bash
# Session 20's closing device calls.  PART=1: the batch-norm cuda tests after REVIEW20's mends (the acquiring poll,
# tiles past 256 blocks, counters back at zero), the A/B of the default symmetric meeting against the last-arriver
# one (and one block an SM, BPS 1: run 5's cluster observation), then the kernel table's batch-norm and softmax rows
# (PyTorch beside).  PART=2: the training-step tables (fp32 / TF32 and mixed precision), PyTorch beside.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s20_final.sh   |   PART=2 OUT=$OUT bash tools/gpu_s20_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-170} CTIME=${CTIME:-280} TAIL=${TAIL:-200}
if [ "${PART:-1}" = 2 ]; then
  export PARTS="tests/backend/test_bn_s20_symm.py -k step_counter"
  export CMDS="python3 bench/train_step.py --steps 60 --pipelined 10;;\
python3 bench/amp_step.py --steps 30 --pipelined 10 --modes fp32,bf16,fp32+cl,bf16+cl"
else
  export PARTS="tests/backend/test_bn_s20_symm.py tests/backend/test_bn_s18_unroll.py;;\
tests/backend/test_bn_onchip.py -x;;\
tests/backend/test_normalization.py tests/backend/test_bn_kernels.py tests/backend/test_bn_twin.py tests/backend/test_bn_dx_nhwc.py;;\
tests/nn/test_bn_fast_path_cuda.py tests/nn/test_bn_dx_nhwc_cuda.py tests/nn/test_twins_cuda.py tests/test_cuda_graphs.py"
  export CMDS="python3 tools/bn_s18_ab.py --settings p1s1,p1,b1p1s1 --dtypes float32,bfloat16 --rounds 9 --no-torch;;\
python3 bench/kernels_gpu.py --sizes large,large2,large3 --dtypes float32,bfloat16 --timing graph --only bn,bn_cl,softmax"
fi
exec bash tools/gpu_s9_parts.sh
