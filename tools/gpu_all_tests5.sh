#!/usr/bin/env bash
# Every cuda test in six pytest processes (the backend's files split four ways, in C-locale order: one part ran
# past 240 s when the device's locale put the heavy files together), then minidnn.compile's overhead
# on LeNet-5 (tools/compile_overhead.py, strict fp32 and TF32) and bench/graphs.py for LeNet-5.  ~300 s on one GPU.
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
t() { local log=$1; shift; timeout ${TLIMIT:-240} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=30 "$@" \
      > $OUT/$log 2>&1; echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/$log; }
mapfile -t files < <(ls tests/backend/test_*.py | LC_ALL=C sort); n=${#files[@]}    # one order on every machine
for i in 0 1 2 3; do
    part=(); for ((j = i; j < n; j += 4)); do part+=("${files[$j]}"); done
    t b$i.log "${part[@]}" &
done
t n.log tests/nn tests/test_autograd.py tests/test_ops_grad.py &
t g.log tests/test_cuda_graphs.py tests/optim tests/amp tests/test_examples.py tests/test_tensor.py \
    tests/test_channels_last.py tests/test_dlpack_half.py tests/test_grad_dest_cuda.py &
wait
grep -hE "^(FAILED|ERROR)|passed|failed|^rc " $OUT/b0.log $OUT/b1.log $OUT/b2.log $OUT/b3.log $OUT/n.log $OUT/g.log | tail -40
timeout 60 python3 tools/compile_overhead.py --model lenet5 2>&1 | grep -vi warn | tee $OUT/compile_overhead.log
timeout 60 python3 tools/compile_overhead.py --model lenet5 --tf32 2>&1 | grep -vi warn | tee $OUT/compile_overhead_tf32.log
echo "total: $(( $(date +%s) - start )) s"
