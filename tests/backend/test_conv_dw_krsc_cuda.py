"""On a GPU: a channels-last weight's filter gradient written by the NHWC loader straight into its channels-last
gradient slot (DWKRSC=1; the fused optimizers keep the weight channels-last, session 8) has the bits of the gradient
written in KCRS memory (the same accumulators, only the store addresses differ) -- over fp32 strict / TF32 / bf16
autocast, stride 1 and 2, 3x3 and 5x5 -- and the channels-last step trains as the unfused optimizer does.  The
launches are checked on the CPU (test_conv_dw_krsc.py)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402

SHAPES = [(16, 32, 16, 3, 1, 1), (32, 32, 16, 3, 2, 1), (64, 64, 9, 5, 1, 2)]     # C, K, H=W, R=S, stride, pad


def _bits(a):
    a = cp.ascontiguousarray(a)
    return cp.asnumpy(a.view(cp.uint32 if a.itemsize == 4 else cp.uint16))


@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_slot_gets_the_bits_of_the_kcrs_gradient(shape, mode):
    c, k, hw, r, stride, pad = shape
    old, old_tf32 = C.CL_DW_SLOT[0], mdn.backends.cudnn.allow_tf32
    mdn.backends.cudnn.allow_tf32 = mode == "tf32"
    rng = np.random.default_rng(sum(shape))
    xa = rng.standard_normal((8, c, hw, hw)).astype(np.float32)
    grads = {}
    try:
        for on in (True, False, True):
            C.CL_DW_SLOT[0] = on
            mdn.manual_seed(2)
            conv = mdn.nn.Conv2d(c, k, r, stride=stride, padding=pad, bias=False).to("cuda")
            conv.to(memory_format=mdn.channels_last)
            opt = mdn.optim.SGD(conv.parameters(), lr=0.0)              # fused: the weight's slot is channels-last
            x = mdn.tensor(xa, device="cuda").to(memory_format=mdn.channels_last)
            for _ in range(2):                                            # the second time: the settled calls
                opt.zero_grad()
                with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=mode == "bf16"):
                    y = conv(x)
                g = mdn.tensor(np.linspace(-1, 1, y.numel()).reshape(y.shape).astype(np.float32),
                               device="cuda").to(dtype=y.dtype, memory_format=mdn.channels_last)
                y.backward(g)
            w = conv.weight
            assert w.is_contiguous(memory_format=mdn.channels_last) and w.grad.data is w._grad_storage
            assert w.grad.is_contiguous(memory_format=mdn.channels_last)
            grads[on] = _bits(w.grad.data)
            ref = mdn.tensor(cp.asnumpy(w.grad.data), dtype=mdn.float64)
            # against float64: dw[k, c, r, s] = sum over n, p, q of x * dy
            xd = mdn.tensor(xa.astype(np.float64), requires_grad=True)
            wd = mdn.tensor(cp.asnumpy(w.data).astype(np.float64), requires_grad=True)
            yd = mdn.nn.functional.conv2d(xd, wd, None, stride, pad)
            yd.backward(mdn.tensor(cp.asnumpy(g.float().data).astype(np.float64)))
            tol = 1e-5 if mode == "fp32" else 3e-2
            np.testing.assert_allclose(ref.numpy(), wd.grad.numpy(), rtol=tol, atol=tol * np.abs(wd.grad.numpy()).max())
    finally:
        C.CL_DW_SLOT[0], mdn.backends.cudnn.allow_tf32 = old, old_tf32
    assert np.array_equal(grads[True], grads[False])


def test_a_channels_last_model_trains_as_with_the_unfused_optimizer():
    from minidnn.models import resnet20
    runs = []
    for fused in (True, False):
        mdn.manual_seed(5)
        model = resnet20(num_classes=10).to("cuda").to(memory_format=mdn.channels_last)
        opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=fused)
        x = mdn.randn(16, 3, 32, 32, device="cuda").to(memory_format=mdn.channels_last)
        t = mdn.randint(0, 10, (16,), device="cuda")
        for _ in range(3):
            opt.zero_grad()
            mdn.nn.functional.cross_entropy(model(x), t).backward()
            opt.step()
        runs.append([cp.asnumpy(p.data) for p in model.parameters()])
        if fused:
            assert all(p.is_contiguous(memory_format=mdn.channels_last) for p in model.parameters() if p.ndim == 4)
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
