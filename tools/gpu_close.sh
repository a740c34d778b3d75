#!/usr/bin/env bash
# The closing device run of a session on one GPU: the cuda tests of everything changed (three pytest processes),
# then tools/tile_sweep.py (the compiled kernels are cached by the tests), bench/graphs.py and the bf16
# channels-last kernel table.  Logs under $OUT.  ~300 s.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
run_tests() {
    local log=$1; shift
    timeout ${TLIMIT:-170} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 "$@" > $OUT/$log 2>&1
    echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/$log
}
run_tests t1.log tests/backend &
run_tests t2.log tests/nn tests/test_autograd.py tests/test_ops_grad.py &
run_tests t3.log tests/test_cuda_graphs.py tests/optim tests/amp tests/test_examples.py tests/test_tensor.py \
    tests/test_channels_last.py tests/test_dlpack_half.py
wait
cat $OUT/t1.log $OUT/t2.log $OUT/t3.log > $OUT/cuda_tests.log
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/cuda_tests.log | tail -30
[ -n "$NOBENCH" ] && exit 0
timeout ${SWLIMIT:-70} python3 tools/tile_sweep.py --reps 10 > $OUT/tile_sweep.log 2>&1
timeout ${GLIMIT:-90} python3 bench/graphs.py --steps 20 --opts sgd > $OUT/graphs.log 2>&1
timeout ${ALIMIT:-50} python3 tools/amp_kernels.py --modes bf16+cl --top 8 2>&1 | grep -vi warn > $OUT/amp_kernels.log
grep -E "<-|total|device" $OUT/tile_sweep.log | tail -40; cat $OUT/graphs.log $OUT/amp_kernels.log
echo "total: $(( $(date +%s) - start )) s"
