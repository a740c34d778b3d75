"""One call each of session 21's kernels under 70% of copy, for Nsight Compute (tools/ncu_s21.sh): the spatial
cross-entropy forward (ce_sp_fwd, float32 / bfloat16 (16, 19, 256, 256): 33% / 20% of copy), the channel softmax and
log-softmax forwards (softmax_cols_fwd, float32 (16, 19, 256, 256): 75% against 46% -- the log-softmax build takes
64 registers to softmax's 48), and the cluster softmax forward (smx_fwdc, float32 (4096, 50257): 66%).  Each is run
three times (compiles and plans first, the profiler's launch last).
    PYTHONPATH=. python3 tools/ncu_s21.py ce_f32 | ce_bf16 | cols_softmax | cols_log | cluster_f32"""
import sys

import cupy as cp
import ml_dtypes
import numpy as np

import minidnn.backend as B

what = sys.argv[1] if len(sys.argv) > 1 else "ce_f32"
rng = np.random.default_rng(0)
bf16 = np.dtype(ml_dtypes.bfloat16)
if what.startswith("ce_"):
    dt = bf16 if what == "ce_bf16" else np.dtype(np.float32)
    x = cp.asarray(rng.standard_normal((16, 19, 256, 256), dtype=np.float32).astype(dt))
    t = cp.asarray(rng.integers(0, 19, (16, 256, 256)))
    for _ in range(3):
        B.softmax_cross_entropy_forward(None, x, t)
elif what.startswith("cols_"):
    x = cp.asarray(rng.standard_normal((16, 19, 256, 256), dtype=np.float32))
    for _ in range(3):
        B.softmax_forward(None, "log" if what == "cols_log" else "accurate", "channel", x)
else:
    x = cp.asarray(rng.standard_normal((4096, 50257), dtype=np.float32))
    for _ in range(3):
        B.softmax_forward(None, "accurate", None, x, axis=-1)
cp.cuda.runtime.deviceSynchronize()
print("done", what)
