#!/usr/bin/env bash
# Session 17's third device call: group norm in clusters and layer norm v3kw (helper NORMGN), autocast host round 29
# (helper AMPHOST), the cross-entropy forward on long rows (helper CELONG): their cuda tests, then each A/B.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s17_run3.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-170} CTIME=${CTIME:-150} TAIL=${TAIL:-45}
export PARTS="tests/backend/test_norm_s17_gncl.py;;tests/backend/test_norm_s17_ln.py tests/amp/test_amphost17_cuda.py;;\
tests/backend/test_ce_long_cuda.py"
export CMDS="python3 tools/norm_s17_ab.py --rounds 3;;\
timeout 100 env SW=minidnn._amp_state:LOWER_READY,minidnn._amp_state:REGION_LEAN python3 tools/step_sw_ab.py --amp bf16 --models resnet20,mobilenet --rounds 10 --turn 10;;\
python3 tools/ce_long_ab.py --rounds 3"
exec bash tools/gpu_s9_parts.sh
