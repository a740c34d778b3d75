#!/usr/bin/env bash
# Session 16 run 11: the batch-norm kernel files' whole cuda suites (bn_cluster, bn_nhwc), which runs 1-2 cut at
# their time limit -- this session changed bn_cluster.py / bn_kernels.py (DX_NHWC, the shadow), split four ways.
#   From a clean archive:  OUT=$OUT bash tools/gpu_s16_run11.sh
cd "$(dirname "$0")/.."
export TLIMIT=${TLIMIT:-290} TAIL=${TAIL:-8} CMDS=""
T=tests/backend/test_bn_nhwc_cuda.py
export PARTS="tests/backend/test_bn_cluster.py;;$T -k against_the_float64_reference and (float32 or float64);;\
$T -k against_the_float64_reference and (float16 or bfloat16);;$T -k not against_the_float64_reference"
exec bash tools/gpu_s9_parts.sh
