#!/usr/bin/env bash
# Session 24, run 6 (the last): IGNORED_DX's cuda test with REVIEW24's rows-ragged route, then where a real GPU host
# spends the eager fp32 / bf16 steps (tools/gpu_step_profile.py) for the closing note.  ~4-5 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s24_final.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-150} CTIME=${CTIME:-170} TAIL=${TAIL:-70}
export PARTS="tests/backend/test_ce_ignored_dx.py"
export CMDS="python3 tools/gpu_step_profile.py --models resnet20,mobilenet --modes fp32,bf16 --steps 20 --top 8"
exec bash tools/gpu_s9_parts.sh
