#!/usr/bin/env bash
# For session 21's first device call: the one-pass batch norm's rounds under the symmetric meeting (session 20).
# The rounds' L2 shares (0.5 both, MINIDNN_BN_L2_SHARE / _BWD) were tuned on an H100 under the last-arriver meeting,
# whose rounds cost ~6.6 us; the symmetric meeting's cost less, so more / fewer, other-sized rounds may now win:
# p1s1 (the default) against backward shares of 0.85 (float32 (32, 256, 56, 56): 3 rounds, not 4) and 0.7, and a
# forward / backward share of 0.3 (more, smaller rounds) -- other splits, so other bits (tested against float64).
# Adopting one is MINIDNN_BN_L2_SHARE(_BWD)'s default in bn_kernels.py, after an H100 run shows it does not lose there.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s21_first.sh       (~3 min on a fresh H200)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-60} CTIME=${CTIME:-200} TAIL=${TAIL:-60}
export PARTS="tests/backend/test_bn_s20_symm.py -k step_counter"
export CMDS="python3 tools/bn_s18_ab.py --settings p1s1,p1s1l50_85,p1s1l50_70,p1s1l30 --dtypes float32 --rounds 9 --no-torch;;\
python3 tools/bn_s18_ab.py --settings p1s1,p1s1l50_85,p1s1l50_70,p1s1l30 --dtypes bfloat16 --rounds 9 --no-torch"
exec bash tools/gpu_s9_parts.sh
