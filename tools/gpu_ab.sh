#!/usr/bin/env bash
# A session's closing device run: the cuda tests of everything the session changed (three pytest processes on the
# one GPU), then the eager step before (.base: the session's first commit) and after (this tree) on the same machine,
# alternated, then bench/graphs.py and bench/amp_step.py.  Run from the snapshot folder; logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
BASE=${BASE:-$PWD/../.base}
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
run_tests() {
    local log=$1; shift
    PYTHONPATH=. timeout ${TLIMIT:-200} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 "$@" \
        > $OUT/$log 2>&1; echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/$log
}
run_tests t1.log tests/backend &
run_tests t2.log tests/nn &
run_tests t3.log tests/test_cuda_graphs.py tests/optim tests/amp tests/test_examples.py tests/test_tensor.py \
    tests/distributed
wait
cat $OUT/t1.log $OUT/t2.log $OUT/t3.log > $OUT/cuda_tests.log
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/cuda_tests.log | tail -30
[ -n "$NOBENCH" ] && exit 0
for round in 1 2; do
  for side in base new; do
    root=$PWD; [ $side = base ] && root=$BASE
    PYTHONPATH=$root timeout 80 python3 bench/train_step.py --steps 30 2>&1 | grep -E "^(lenet5|resnet20|mobilenet) " \
        | sed "s/^/$side r$round /" | tee -a $OUT/ab.log
  done
done
PYTHONPATH=. timeout ${GLIMIT:-100} python3 bench/graphs.py --steps 20 > $OUT/graphs.log 2>&1
PYTHONPATH=. timeout ${ALIMIT:-90} python3 bench/amp_step.py --steps 20 > $OUT/amp.log 2>&1
cat $OUT/graphs.log; tail -12 $OUT/amp.log
echo "total: $(( $(date +%s) - start )) s"
