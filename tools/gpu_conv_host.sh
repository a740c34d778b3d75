#!/usr/bin/env bash
# Device run for round 7 of docs/host_overhead.md (one GPU, ~400 s): the shared staging's cuda tests and the staging
# tests of the conv kernels, then the host time per convolution call on the GPU (small problems with the staging's
# size rule at 0: host-bound, so wall time per call = host time) and bench/train_step.py's kernels per step -- at
# HEAD and, where $BASE names a snapshot folder of 87c6ce0 (before round 7), there too, alternated.  Logs under $OUT.
#   BASE=/path/to/snapshot bash tools/gpu_conv_host.sh
export CUPY_CACHE_DIR=$PWD/.cupy_cache PYTHONUNBUFFERED=1 PYTHONPATH=. NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 100 python3 tools/precompile_conv.py > $OUT/precompile.log 2>&1
timeout ${TLIMIT:-150} python3 -m pytest -q -m cuda -p no:cacheprovider tests/backend/test_conv_staging_once_cuda.py \
    tests/backend/test_conv_staging_once.py tests/backend/test_conv_cuda_kernels.py -k "staging or staged or vec or nchw" \
    > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
cat > $OUT/host.py <<'PY'
import time, sys, cupy as cp, numpy as np
import minidnn as mdn, minidnn.backend as B
from minidnn.backend.cuda import conv_igemm as K
from minidnn.nn import functional as F
K.STAGE_MIN_MACS = 0
x = cp.asarray(np.random.default_rng(0).standard_normal((4, 16, 8, 8)).astype(np.float32))
w = cp.asarray(np.random.default_rng(1).standard_normal((16, 16, 3, 3)).astype(np.float32))
d = B.ConvolutionDescriptor((1, 1))
h = B.handle.configured_default_handle(x)
y = B.convolution_forward(h, x, w, d)
xt, wt = mdn.Tensor._from_array(x), mdn.Tensor._from_array(w)
xt.requires_grad = wt.requires_grad = True
def step():
    F.conv2d(xt, wt, padding=1).backward(mdn.Tensor._from_array(y))
ops = {"forward": lambda: B.convolution_forward(h, x, w, d),
       "backward data": lambda: B.convolution_backward_data(h, w, y, d, x.shape),
       "backward filter": lambda: B.convolution_backward_filter(h, x, y, d, w.shape),
       "F.conv2d fwd+bwd": step}
for name, f in ops.items():
    for _ in range(50): f()
    cp.cuda.Device().synchronize()
    best = 1e9
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(300): f()
        cp.cuda.Device().synchronize()
        best = min(best, (time.perf_counter() - t0) / 300)
    print(f"{sys.argv[1]:5s} {name:18s} {best * 1e6:7.1f} us per call (host-bound: 4x16x8x8, staged)")
PY
for r in 1 2; do
    timeout 40 python3 $OUT/host.py head >> $OUT/host.log 2>&1
    [ -n "$BASE" ] && (cd $BASE && PYTHONPATH=. timeout 40 python3 $OUT/host.py base >> $OUT/host.log 2>&1)
done
cat $OUT/host.log
timeout 100 python3 bench/train_step.py --steps 30 > $OUT/train_step.log 2>&1
[ -n "$BASE" ] && (cd $BASE && PYTHONPATH=. timeout 100 python3 bench/train_step.py --steps 30) > $OUT/train_step_base.log 2>&1
timeout 100 python3 bench/train_step.py --steps 30 > $OUT/train_step_2.log 2>&1
grep -v -i warn $OUT/train_step.log $OUT/train_step_base.log $OUT/train_step_2.log
echo "total: $(( $(date +%s) - start )) s"
