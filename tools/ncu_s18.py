"""One call each of the kernels session 18 profiles with Nsight Compute (tools/ncu_s18.sh): group norm G=32 on
(32, 256, 56, 56) bfloat16 forward + backward (the stash kernels: gn_fwds, gn_bwdp or gn_bwds per
MINIDNN_GN_STASH16_BWD), and batch norm's training forward + backward on the same shape in float32 (bn_fwd1 /
bn_bwd1: the rows under 70% of copy).  Run twice first (compiles, plans), then once more for the profiler's window."""
import sys

import numpy as np

import minidnn as mdn
import minidnn.nn.functional as F

what = sys.argv[1] if len(sys.argv) > 1 else "gn"
rng = np.random.default_rng(0)
shape = (32, 256, 56, 56)
if what == "gn":
    x = mdn.tensor(rng.standard_normal(shape).astype(np.float32), device="cuda").to(mdn.bfloat16).requires_grad_()
    w = mdn.ones(256, device="cuda", dtype=mdn.bfloat16, requires_grad=True)
    b = mdn.zeros(256, device="cuda", dtype=mdn.bfloat16, requires_grad=True)
    dy = mdn.tensor(rng.standard_normal(shape).astype(np.float32), device="cuda").to(mdn.bfloat16)
    step = lambda: F.group_norm(x, 32, w, b).backward(dy)       # noqa: E731
else:
    x = mdn.tensor(rng.standard_normal(shape).astype(np.float32), device="cuda", requires_grad=True)
    bn = mdn.nn.BatchNorm2d(256).to("cuda")
    dy = mdn.tensor(rng.standard_normal(shape).astype(np.float32), device="cuda")
    step = lambda: bn(x).backward(dy)       # noqa: E731
for _ in range(3):
    step()
mdn.cuda.synchronize()
print("done", what)
