#!/usr/bin/env bash
# One iteration of host-overhead work on the device: the cuda tests of the launch path (two pytest processes),
# then the launch micro-benchmark, the eager step benchmark and the eager-step profile.  Logs under $OUT.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
run_tests() {
    local log=$1; shift
    timeout ${TLIMIT:-200} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=20 "$@" > $OUT/$log 2>&1
    echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/$log
}
run_tests t1.log ${ARGS:-tests/backend} &
run_tests t2.log ${ARGS2:-tests/test_cuda_graphs.py tests/optim tests/amp tests/test_examples.py}
wait
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/t1.log $OUT/t2.log | tail -30
[ -n "$NOBENCH" ] && exit 0
timeout 60 python3 tools/launch_micro.py > $OUT/launch.log 2>&1
timeout ${SLIMIT:-90} python3 bench/train_step.py --steps 30 > $OUT/train_step.log 2>&1
timeout ${SLIMIT:-90} python3 bench/train_step.py --steps 30 --tf32 > $OUT/train_step_tf32.log 2>&1
timeout 60 python3 tools/profile_step.py --models ${PMODELS:-resnet20} --steps 10 --top 45 --dump $OUT > $OUT/profile.log 2>&1
cat $OUT/launch.log; for f in train_step train_step_tf32; do sed -n '/^training/,/^$/p' $OUT/$f.log; done
grep "^==" $OUT/profile.log
echo "total: $(( $(date +%s) - start )) s"
