#!/usr/bin/env bash
# Session 18, device call 9: batch norm round 2 (helpers BNH200B: NCHW TAIL / STAGE / PREFETCH_BWD; BNCL18: the
# channels-last PREFETCH) -- cuda tests (bitwise against the switches off), then the A/Bs (graph replays, settings
# rotated, PyTorch beside); and the group-norm stash's cuda tests after its one-text refactor (GNLEAN).
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s18_run9.sh
# (a record of run 9: its switches, tests and the channels-last A/B tool were removed after it -- 2a5e753)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-110} CTIME=${CTIME:-110} TAIL=${TAIL:-60}
B=tests/backend
export PARTS="$B/test_bn_s18_tail.py;;$B/test_bn_nhwc_s18.py;;$B/test_norm_s18_gn16c.py $B/test_norm_s18_gn16b.py"
export CMDS="python3 tools/bn_s18_ab.py --dtypes float32;;python3 tools/bn_s18_ab.py --dtypes bfloat16;;\
python3 tools/bn_nhwc_s18_ab.py --dtypes float32 --settings off,p1,p2 --rounds 15;;\
python3 tools/bn_nhwc_s18_ab.py --dtypes bfloat16 --settings off,p1,p2 --rounds 15"
exec bash tools/gpu_s9_parts.sh
