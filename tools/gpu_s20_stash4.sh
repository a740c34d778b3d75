#!/usr/bin/env bash
# For session 20's first device call: BWD_STASH 4 (built in session 19, never GPU-run) -- the stash rows' cuda test
# (modes 0-4 bitwise / against float64, the dy-only cp.async stash included) and the A/B that decides adoption (4
# against the default 3 on the rows where they differ, PyTorch beside).  Adopting 4 is BWD_STASH's default "4".
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s20_stash4.sh      (~3 min on a fresh H200)
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-120} CTIME=${CTIME:-200} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_softmax_s17_rows.py -k stash~and~not~compile"
export CMDS="python3 tools/row_ab.py --ops lsmxbwd --dtypes float32,bfloat16,float16 --shapes 4096x50257,300x50257,2048x49999 --bwd-stash 3,4 --rounds 7"
exec bash tools/gpu_s9_parts.sh
