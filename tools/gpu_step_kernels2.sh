#!/usr/bin/env bash
# Issue 10, second round on the device: the cuda tests of the layer/group norm, bias-add and 16-bit softmax /
# cross-entropy kernels (tests/backend/test_norm_kernels.py, plus the softmax/cross-entropy rows of
# test_step_cuda_kernels.py whose kernel sources changed), in two pytest processes (NVRTC compiles on two cores),
# then bench/kernels_gpu.py (every step kernel beside PyTorch).  ~150 s.  Logs under $OUT.
# Usage (device machine, repo root): bash tools/gpu_step_kernels2.sh
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
set -o pipefail
OUT=${OUT:-$PWD/gpu_step_kernels2_out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader 2>&1 | tee "$OUT/device.txt"
run_tests() {
    local log=$1; shift
    timeout ${TLIMIT:-80} python3 -m pytest -q -m cuda -p no:cacheprovider -o addopts="" -rf --maxfail=30 \
        --no-header "$@" > "$OUT/$log" 2>&1
    echo "rc $? after $(( $(date +%s) - start )) s" >> "$OUT/$log"
}
run_tests tests_a.log tests/backend/test_norm_kernels.py -k "layer_norm or softmax or cross_entropy" \
    tests/backend/test_step_cuda_kernels.py &
run_tests tests_b.log tests/backend/test_norm_kernels.py -k "group_norm or bias or nn_norm"
wait
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " "$OUT/tests_a.log" "$OUT/tests_b.log" | tail -40
left=$(( 150 - ($(date +%s) - start) )); [ $left -lt 45 ] && left=45
timeout $left python3 bench/kernels_gpu.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
echo "total: $(( $(date +%s) - start )) s"
