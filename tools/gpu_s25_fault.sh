#!/usr/bin/env bash
# Session 25, run 2: where does the bfloat16 cluster softmax forward at 8 vectors a thread fault?  Run 1 (3 of 3
# fresh processes, and compute-sanitizer: "Invalid __remote_shared__ read of size 4 at smx_fwdc+0x2b90 ... Access to
# 0x7fa1 in CTA 0 is misaligned") put it on the DSMEM exchange's load of part[1], whose address nvcc's SASS builds
# only as (rank << 24) | 0x424.  Each variant in a fresh process (a fault takes the context): the failing plan's
# cubin as the device's NVRTC built it (CuPy's cache, copied to $OUT/cubin_a; a 32-byte hash heads each file), then
# one factor changed at a time -- a tail, float16, exact exp, log-softmax, CL 8, VPT 7 exactly filled, fewer rows,
# and the default plan as control.
#   From a clean archive of HEAD:  OUT=$OUT bash tools/gpu_s25_fault.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-200} CTIME=${CTIME:-120} TAIL=${TAIL:-6} PARTS=""
AB="python3 tools/softmax_cluster_ab.py --rounds 1 --trials 1 --no-torch"
G="2>&1 | grep -E 'values|failed|Error|CL ' | cut -c1-200 | head -4"
export CMDS="rm -rf /tmp/cca; CUPY_CACHE_DIR=/tmp/cca $AB --ops smx --dtypes bfloat16 --shapes 2048x65536 --settings 1:vpt8 $G; mkdir -p $OUT/cubin_a; cp /tmp/cca/* $OUT/cubin_a/ 2>/dev/null; ls /tmp/cca | wc -l;;\
$AB --ops smx --dtypes bfloat16 --shapes 2048x65535 --settings 1,1:vpt8 $G;;\
$AB --ops smx --dtypes float16 --shapes 2048x65536 --settings 1,1:vpt8 $G;;\
$AB --ops smx --dtypes bfloat16 --shapes 2048x65536 --settings 1,1:vpt8:exact $G;;\
$AB --ops lsmx --dtypes bfloat16 --shapes 2048x65536 --settings 1,1:vpt8 $G;;\
$AB --ops smx --dtypes bfloat16 --shapes 1024x131072 --settings 1,1:vpt8 $G;;\
$AB --ops smx --dtypes bfloat16 --shapes 2048x57344 --settings 1,1:vpt7 $G;;\
$AB --ops smx --dtypes bfloat16 --shapes 64x65536 --settings 1,1:vpt8 $G;;\
$AB --ops smx --dtypes bfloat16 --shapes 2048x65536 --settings 1,1:cl5:nt256:vpt8 $G;;\
$AB --ops smx --dtypes float32 --shapes 4096x65536 --settings 1,1:vpt8 $G"
exec bash tools/gpu_s9_parts.sh
