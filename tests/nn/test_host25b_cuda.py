"""On a GPU: round 25b's host paths (docs/host_overhead.md) give the full path's bits.  Average and uniform adaptive
pooling on a seen signature (``pooling.AVGPOOL_FAST``: forward and first-order backward), the activations'
first-order backward on the remembered plan (``backend.activation.BWD_SEEN``) and F.relu asking batch norm's fusion
rule directly (``nn._functions.activation.FUSED_DIRECT``): y and dx of three calls each bit-identical with the
switch on and off and equal to a float64 reference within float32 / bfloat16 rounding; MobileNet-small and LeNet-5
train three SGD steps from one start (fp32 and bf16 autocast) with every parameter bit-identical and the same
launches a step with all three switches on and off.  Launches, nodes and which calls take the full path are checked
on the CPU under the fake CuPy (test_host25b_seen.py)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.backend import activation as PA  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn._functions import activation as NA  # noqa: E402
from minidnn.nn._functions import pooling as PL  # noqa: E402

_SWITCHES = (PL.AVGPOOL_FAST, PA.BWD_SEEN, NA.FUSED_DIRECT)


def _bits(a):
    return np.ascontiguousarray(cp.asnumpy(a)).view(np.uint8).copy()     # (channels-last arrays too)


def _set(on):
    for s in _SWITCHES:
        s[0] = on


def _f64(t):
    return cp.asnumpy(t.data.astype(cp.float32)).astype(np.float64)


@pytest.mark.parametrize("op,shape,dtype,cl", [
    ("adaptive1", (16, 64, 4, 4), "float32", False), ("adaptive1", (16, 64, 8, 8), "bfloat16", False),
    ("adaptive2", (8, 32, 8, 8), "float32", False), ("avg2", (8, 32, 8, 8), "float32", False),
    ("adaptive1", (16, 64, 4, 4), "float32", True)])
def test_average_pooling_bits_on_and_off(op, shape, dtype, cl):
    res = {}
    try:
        for on in (True, False):
            _set(on)
            mdn.manual_seed(0)
            out = []
            for _ in range(3):
                x = mdn.randn(*shape).to("cuda").to(getattr(mdn, dtype))
                if cl:
                    x = x.to(memory_format=mdn.channels_last)
                x.requires_grad_()
                y = F.adaptive_avg_pool2d(x, 1) if op == "adaptive1" else \
                    F.adaptive_avg_pool2d(x, (2, 2)) if op == "adaptive2" else F.avg_pool2d(x, 2)
                g = mdn.randn(*y.shape).to("cuda").to(y.dtype)
                y.backward(g)
                out += [_bits(y.data), _bits(x.grad.data)]
                # float64 reference: the mean over each window; dx spreads g / window over it
                xs, gs = _f64(x), _f64(g)
                n, c, h, w = shape
                oh, ow = y.shape[2:]
                kh, kw = h // oh, w // ow
                ref = xs.reshape(n, c, oh, kh, ow, kw).mean(axis=(3, 5))
                dref = np.repeat(np.repeat(gs / (kh * kw), kh, axis=2), kw, axis=3)
                tol = 1e-5 if dtype == "float32" else 1e-2
                np.testing.assert_allclose(_f64(y), ref, rtol=tol, atol=tol)
                np.testing.assert_allclose(_f64(x.grad), dref, rtol=tol, atol=tol)
            res[on] = out
    finally:
        _set(True)
    for a, b in zip(res[True], res[False]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("act,dtype,cl", [("relu", "float32", False), ("relu", "bfloat16", False),
                                          ("relu", "float32", True), ("silu", "float32", False),
                                          ("relu", "float16", False)])
def test_activation_backward_bits_on_and_off(act, dtype, cl):
    res = {}
    try:
        for on in (True, False):
            _set(on)
            mdn.manual_seed(0)
            out = []
            for _ in range(3):
                leaf = mdn.randn(8, 16, 12, 12).to("cuda").to(getattr(mdn, dtype))
                if cl:
                    leaf = leaf.to(memory_format=mdn.channels_last)
                leaf.requires_grad_()
                x = leaf * 1.0
                y = F.relu(x) if act == "relu" else F.silu(x)
                g = mdn.randn(*y.shape).to("cuda").to(y.dtype)
                if cl:
                    g = g.to(memory_format=mdn.channels_last)
                y.backward(g)
                out += [_bits(y.data), _bits(leaf.grad.data)]
                xs, gs = _f64(x), _f64(g)
                if act == "relu":
                    dref = np.where(xs > 0, gs, 0.0)
                else:
                    s = 1.0 / (1.0 + np.exp(-xs))
                    dref = gs * s * (1.0 + xs * (1.0 - s))
                tol = 1e-5 if dtype == "float32" else 1e-2
                np.testing.assert_allclose(_f64(leaf.grad), dref, rtol=tol, atol=tol)
            res[on] = out
    finally:
        _set(True)
    for a, b in zip(res[True], res[False]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("model,amp", [("mobilenet", False), ("mobilenet", True), ("lenet5", False)])
def test_model_steps_bit_identical_on_and_off(model, amp):
    params, launches = {}, {}
    try:
        for on in (True, False):
            _set(on)
            mdn.manual_seed(0)
            if model == "mobilenet":
                m = mdn.models.MobileNetSmall(num_classes=10, in_channels=3).to("cuda")
                x = mdn.randn(32, 3, 32, 32).to("cuda")
            else:
                m = mdn.models.LeNet5(num_classes=10, in_channels=1, input_size=32).to("cuda")
                x = mdn.randn(64, 1, 32, 32).to("cuda")
            opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            y = mdn.randint(0, 10, (x.shape[0],)).to("cuda")
            seen, counts = [], []
            for _ in range(3):
                n0 = L.launch_count()
                with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
                    loss = F.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                counts.append(L.launch_count() - n0)
                seen.append([_bits(p.data) for p in m.parameters()])
            params[on], launches[on] = seen, counts
    finally:
        _set(True)
    assert launches[True] == launches[False]
    for a, b in zip(params[True], params[False]):
        for pa, pb in zip(a, b):
            assert np.array_equal(pa, pb)
