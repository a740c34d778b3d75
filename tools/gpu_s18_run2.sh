#!/usr/bin/env bash
# Session 18, device call 2: the 16-bit group-norm stash (norm_gn16, helper GN16): its cuda tests, then the A/B that
# decides adoption (old looped kernels / clusters / stash, PyTorch beside, graph replays).
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s18_run2.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-150} CTIME=${CTIME:-170} TAIL=${TAIL:-45}
export PARTS="tests/backend/test_norm_s18_gn16.py"
export CMDS="python3 tools/norm_s17_ab.py --rows big,ragged,tuned --dtypes bfloat16,float16 --ln '' --rounds 3"
exec bash tools/gpu_s9_parts.sh
