#!/usr/bin/env bash
# Session 18, device call 3: the 16-bit group-norm stash's variant 2 (persistent blocks, helper GN16B): its cuda
# tests and the variant-1 tests, then the A/B of old / stash / stash2, PyTorch beside, graph replays.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s18_run3.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-150} CTIME=${CTIME:-170} TAIL=${TAIL:-45}
export PARTS="tests/backend/test_norm_s18_gn16b.py;;tests/backend/test_norm_s18_gn16.py tests/backend/test_norm_kernels.py"
export CMDS="python3 tools/norm_s17_ab.py --rows big,ragged --dtypes bfloat16,float16 --ln '' --rounds 3 --settings stash,stash2"
exec bash tools/gpu_s9_parts.sh
