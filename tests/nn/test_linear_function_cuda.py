"""F.linear as one node on the GPU (nn/_functions/linear.py): cuBLAS products and the bias kernel against float64,
fp32 and under bf16 autocast (dw and db float32 from the kernels, the cast node passing them through)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda
if not _dev.cuda_is_available():
    pytest.skip("needs a GPU with CuPy", allow_module_level=True)

import minidnn as mdn  # noqa: E402
import minidnn.nn.functional as F  # noqa: E402


@pytest.mark.parametrize("shape", [(64, 400), (2, 3, 120), (84,)])
@pytest.mark.parametrize("amp", [False, True])
def test_linear_on_the_gpu_against_float64(shape, amp):
    rng = np.random.default_rng(sum(shape))
    out_f = 10
    xa = rng.standard_normal(shape).astype(np.float32)
    wa = (rng.standard_normal((out_f, shape[-1])) / np.sqrt(shape[-1])).astype(np.float32)
    ba = rng.standard_normal(out_f).astype(np.float32)
    ga = rng.standard_normal(shape[:-1] + (out_f,)).astype(np.float32)
    x = mdn.tensor(xa, device="cuda", requires_grad=True)
    w = mdn.tensor(wa, device="cuda", requires_grad=True)
    b = mdn.tensor(ba, device="cuda", requires_grad=True)
    with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
        y = F.linear(x, w, b)
    y.backward(mdn.tensor(ga, device="cuda").to(y.dtype))
    x64, w64, g64 = xa.astype(np.float64), wa.astype(np.float64), ga.astype(np.float64)
    rows = int(np.prod(shape[:-1]))
    ref_y = x64 @ w64.T + ba
    ref = {"y": ref_y, "dx": g64 @ w64, "dw": g64.reshape(rows, out_f).T @ x64.reshape(rows, -1),
           "db": g64.reshape(rows, out_f).sum(0)}
    got = {"y": y.float().cpu().numpy(), "dx": x.grad.float().cpu().numpy(), "dw": w.grad.cpu().numpy(),
           "db": b.grad.cpu().numpy()}
    assert w.grad.dtype == mdn.float32 and b.grad.dtype == mdn.float32 and y.dtype == (mdn.bfloat16 if amp else
                                                                                        mdn.float32)
    tol = 2 ** -6 if amp else 1e-5
    for k in ref:
        scale = np.abs(ref[k]).max() + 1e-30
        assert np.abs(got[k] - ref[k]).max() <= tol * scale * (4 if amp else 1), k
