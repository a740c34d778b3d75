#!/usr/bin/env bash
# Session 18, device call 7: NCHW batch norm's bytes in flight on the H200 (helper BNH200: ONEPASS_UNROLL / _BPS /
# _PREFETCH): the cuda tests, then the A/B of the settings (graph replays, rotated, PyTorch beside), fp32 and bf16.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s18_run7.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-130} CTIME=${CTIME:-150} TAIL=${TAIL:-80}
export PARTS="tests/backend/test_bn_s18_unroll.py"
export CMDS="python3 tools/bn_s18_ab.py --dtypes float32;;python3 tools/bn_s18_ab.py --dtypes bfloat16 --settings u4,u6,u4p1,u4p2,b3u4"
exec bash tools/gpu_s9_parts.sh
