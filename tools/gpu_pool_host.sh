#!/usr/bin/env bash
# Issue 10, pooling and host-path round on the device: the cuda tests of the kernels this round changed -- global
# average pooling and the disjoint-window backward (pool_kernels), the per-signature plans of the activation,
# softmax, cross-entropy and pooling launches, the group/layer norm re-centring (norm_kernels) -- in two pytest
# processes (NVRTC compiles on two cores, ~90 s), then bench/kernels_gpu.py (every step kernel beside PyTorch;
# the small-shape rows measure the host path per call).  Logs under $OUT.
# Usage (device machine, repo root): bash tools/gpu_pool_host.sh      (BENCH_ARGS="--only ..." to narrow the bench)
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
set -o pipefail
OUT=${OUT:-$PWD/gpu_pool_host_out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader 2>&1 | tee "$OUT/device.txt"
run_tests() {
    local log=$1; shift
    timeout ${TLIMIT:-100} python3 -m pytest -q -m cuda -p no:cacheprovider -o addopts="" -rf --maxfail=30 \
        --no-header "$@" > "$OUT/$log" 2>&1
    echo "rc $? after $(( $(date +%s) - start )) s" >> "$OUT/$log"
}
run_tests tests_a.log tests/backend/test_step_cuda_kernels.py tests/backend/test_launch.py \
    -k "pool or activation or softmax or cross_entropy or graph or repeated or launch or prepare" &
run_tests tests_b.log tests/backend/test_norm_kernels.py
wait
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " "$OUT/tests_a.log" "$OUT/tests_b.log" | tail -40
left=$(( 200 - ($(date +%s) - start) )); [ $left -lt 60 ] && left=60
timeout $left python3 bench/kernels_gpu.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
echo "total: $(( $(date +%s) - start )) s"
