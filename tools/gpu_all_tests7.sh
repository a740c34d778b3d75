#!/usr/bin/env bash
# Every cuda test, in ten pytest processes: the backend's test files split eight ways (C-locale order, so every
# machine cuts the same parts; NVRTC compiles are CPU work, and eight parts keep each under TLIMIT), nn/autograd,
# and graphs/optim/amp/examples/tensor.  Logs under $OUT.  CUPY_CACHE_DIR may point outside the snapshot (a warm
# machine keeps its compiled kernels between calls).
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache} PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
t() { local log=$1; shift; timeout ${TLIMIT:-400} python3 -m pytest -q -m cuda -p no:cacheprovider -rf --maxfail=30 "$@" \
      > $OUT/$log 2>&1; echo "rc $? after $(( $(date +%s) - start )) s" >> $OUT/$log; }
mapfile -t files < <(ls tests/backend/test_*.py | LC_ALL=C sort); n=${#files[@]}
P=${PARTS:-8}
for ((i = 0; i < P; i++)); do
    part=(); for ((j = i; j < n; j += P)); do part+=("${files[$j]}"); done
    t b$i.log "${part[@]}" &
done
t n.log tests/nn tests/test_autograd.py tests/test_ops_grad.py &
t g.log tests/test_cuda_graphs.py tests/optim tests/amp tests/test_examples.py tests/test_tensor.py \
    tests/test_channels_last.py tests/test_dlpack_half.py tests/test_grad_dest_cuda.py &
wait
for f in $OUT/b*.log $OUT/n.log $OUT/g.log; do echo "$(basename $f): $(grep -E 'passed|failed' $f | tail -1) $(tail -1 $f)"; done
grep -hE "^(FAILED|ERROR)" $OUT/b*.log $OUT/n.log $OUT/g.log | head -40
echo "total: $(( $(date +%s) - start )) s"
