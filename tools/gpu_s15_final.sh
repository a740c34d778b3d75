#!/usr/bin/env bash
# Session 15's last device call: the batch-norm fast-path cuda tests with the twin off there (run 6's failure), then
# train_step and amp_step with more turns than session 14's (60 / 40 steps in turns of 10: the host's drift).
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-150} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/nn/test_bn_fast_path_cuda.py"
export CMDS="python3 bench/train_step.py --steps 60 --pipelined 10;;python3 bench/amp_step.py --steps 40 --pipelined 10"
exec bash tools/gpu_s9_parts.sh
