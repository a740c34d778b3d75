#!/usr/bin/env bash
# The next session's first device call (written by session 25, whose device time ran out): the residual risk of the
# cluster exchange by remote stores that REVIEW25 named -- the remote LOADS it replaced faulted at an address the
# SASS could not form (cause unknown), and the stores take the same shared-window path, so a corrupted store would
# write silently instead of faulting.  (1) compute-sanitizer memcheck on the builds that faulted before (bfloat16 /
# float16 softmax forward at 4 x 256 x 8) and two defaults; (2) a bitwise stress: 10^4 repeats of each, every output
# compared with the first (tools/smcl_repro.py REPEAT); (3) the same stress on a group norm and a batch norm cluster
# shape through their cuda tests' repeat cases.  ~4-5 min on a fresh H200.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s26_first.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-170} TAIL=${TAIL:-40}
export PARTS="tests/backend/test_norm_s17_gncl.py -k repeat;;tests/backend/test_bn_cluster.py -k bitwise"
R="python3 tools/smcl_repro.py bfloat16:2048x65536:fwd:ACCURATE:4,256 float16:2048x65536:fwd:ACCURATE:4,256 float32:4096x50257:fwd:ACCURATE bfloat16:4096x50257:bwd:LOG"
export CMDS="compute-sanitizer --tool memcheck $R 2>&1 | grep -v -i warn | tail -30;;\
REPEAT=10000 $R 2>&1 | grep -v -i warn | tail -20"
exec bash tools/gpu_s9_parts.sh
