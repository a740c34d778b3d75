"""One call each of the kernels session 23 left under 70% of copy, for Nsight Compute (tools/ncu_s23.sh): the
channels-last batch-norm backward and forward (bnc_bwd1 / bnc_fwd1, float32 (32, 256, 56, 56): 56-60%; channel rounds
did not help, session 23 run 5), and the spatial cross-entropy's bfloat16 forward past 32 classes (ce_sp_fwd,
(4, 171, 128, 128) and (10, 150, 128, 128): 57-62%).  Each is run three times (compiles and plans first, the
profiler's launch last), through bench/kernels_gpu.py's cases (the kernel table's calls).
    PYTHONPATH=. python3 tools/ncu_s23.py bncl_bwd | bncl_fwd | ce171_bf16 | ce150_bf16"""
import os
import sys

import cupy as cp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import kernels_gpu as KG  # noqa: E402

what = sys.argv[1] if len(sys.argv) > 1 else "bncl_bwd"
if what.startswith("bncl_"):
    cases = KG.Cases(cp, None, "float32")
    label = "batch norm NHWC bwd" if what == "bncl_bwd" else "batch norm NHWC fwd (train)"
    rows = cases.bn((32, 256, 56, 56), layout="nhwc")
else:
    cases = KG.Cases(cp, None, "bfloat16")
    label = "spatial ce fwd"
    rows = cases.spatial((4, 171, 128, 128) if what == "ce171_bf16" else (10, 150, 128, 128))
fn = next(r[2][0] for r in rows if r[0] == label)
for _ in range(3):
    fn()
cp.cuda.runtime.deviceSynchronize()
print("done", what)
