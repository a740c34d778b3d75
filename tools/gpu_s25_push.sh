#!/usr/bin/env bash
# Session 25, run 3: softmax_cluster.PUSH (the partials exchanged by remote stores before the cluster barrier, no
# remote load, no closing wait) -- the module's cuda tests with it and by default (with the new bitwise push test);
# its A/B against the default on float32 and bfloat16 rows, both directions; whether the 16-bit VPT 8 fault (a remote
# load, runs 1-2) goes with the remote loads (fresh processes); if so what 16-bit VPT 8 is worth; and the failing
# pull build's cubin as the device's NVRTC makes it (tarred: a $OUT brings back at most 8 files).
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s25_push.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-170} TAIL=${TAIL:-40}
export PARTS="MINIDNN_SOFTMAX_CLUSTER_PUSH=1 tests/backend/test_softmax_cluster.py;;tests/backend/test_softmax_cluster.py"
AB="python3 tools/softmax_cluster_ab.py"
G="2>&1 | grep -E 'values|failed|Error|CL ' | cut -c1-220 | head -6"
export CMDS="$AB --ops smx,lsmx,smxbwd,lsmxbwd --dtypes float32 --shapes 4096x50257,64x50257 --settings 1,1:push --rounds 3;;\
$AB --ops smx,lsmx,smxbwd --dtypes bfloat16 --shapes 4096x50257,2048x65536 --settings 1,1:push --rounds 3;;\
$AB --ops smx --dtypes bfloat16 --shapes 2048x65536 --settings 1,1:vpt8:push --rounds 1 --trials 1 --no-torch $G;;\
$AB --ops smx --dtypes bfloat16 --shapes 2048x65536 --settings 1,1:vpt8:push --rounds 1 --trials 1 --no-torch $G;;\
$AB --ops smx --dtypes float16 --shapes 64x65536 --settings 1,1:vpt8:push --rounds 1 --trials 1 --no-torch $G;;\
$AB --ops smx,lsmx --dtypes bfloat16 --shapes 4096x50257,2048x65536,1024x131072 --settings 1,1:vpt8:push --rounds 2 2>&1 | grep -v -i warn | cut -c1-230;;\
rm -rf /tmp/cca; CUPY_CACHE_DIR=/tmp/cca python3 -c 'from minidnn.backend.cuda import softmax_cluster as S; S._compile_one((\"bfloat16\", \"ACCURATE\", False, (4, 256, 8, 4, 1, 1, 0))); S._compile_one((\"bfloat16\", \"ACCURATE\", False, (8, 256, 8, 4, 1, 1, 0)))'; tar -czf $OUT/cca.tgz -C /tmp cca; ls -la /tmp/cca"
exec bash tools/gpu_s9_parts.sh
