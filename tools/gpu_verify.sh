#!/usr/bin/env bash
# First device run of a session: the cuda tests of what changed since the last GPU run, then (sequentially, so the
# tests do not share the GPU with the timings) bench/graphs.py, bench/train_step.py, bench/amp_step.py and the
# eager-step host profile (tools/profile_step.py).  Logs under $OUT; budget ~8 min on one GPU.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $OUT/device.txt
run_tests() {  # $1: log name, rest: test paths
    local log=$1; shift
    timeout ${TLIMIT:-300} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 "$@" \
        > $OUT/$log 2>&1; echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/$log
}
# two pytest processes on the one GPU: the cuda tests are mostly host-bound (small shapes)
run_tests cuda_tests.log ${ARGS:-tests/backend} &
run_tests cuda_tests2.log ${ARGS2:-tests/test_cuda_graphs.py tests/test_examples.py tests/nn tests/amp tests/test_tensor.py}
wait
cat $OUT/cuda_tests2.log >> $OUT/cuda_tests.log
grep -E "^(FAILED|ERROR)|passed|failed|^rc " $OUT/cuda_tests.log | tail -30
[ -n "$NOBENCH" ] && exit 0
timeout ${GLIMIT:-90} python3 bench/graphs.py --steps ${STEPS:-20} > $OUT/graphs.log 2>&1
timeout ${SLIMIT:-60} python3 bench/train_step.py --steps ${STEPS:-20} > $OUT/train_step.log 2>&1
timeout ${PLIMIT:-60} python3 tools/profile_step.py --models resnet20,mobilenet --steps 10 --top 45 > $OUT/profile.log 2>&1
timeout ${ALIMIT:-80} python3 bench/amp_step.py --steps ${STEPS:-20} > $OUT/amp.log 2>&1
cat $OUT/graphs.log $OUT/train_step.log; grep "^==" $OUT/profile.log; tail -14 $OUT/amp.log
echo "total: $(( $(date +%s) - start )) s"
