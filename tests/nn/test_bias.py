"""The conv / linear bias (nn/_functions/bias.py): forward a broadcast add, db by convolution_backward_bias.
Checked against the same sums in float64 NumPy, and against PyTorch where installed."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn.functional as F


def _np(t):
    return t.detach().cpu().numpy().astype(np.float64)


@pytest.mark.parametrize("make", [
    lambda d: (F.conv2d, mdn.randn(3, 4, 6, 5, device=d), mdn.randn(7, 4, 3, 3, device=d), (0, 2, 3)),
    lambda d: (F.conv1d, mdn.randn(2, 3, 9, device=d), mdn.randn(5, 3, 2, device=d), (0, 2)),
    lambda d: (F.linear, mdn.randn(6, 4, device=d), mdn.randn(5, 4, device=d), (0,)),
    lambda d: (F.linear, mdn.randn(2, 3, 4, device=d), mdn.randn(5, 4, device=d), (0, 1)),
], ids=["conv2d", "conv1d", "linear", "linear-3d"])
def test_bias_gradient_is_the_sum_of_dy(device, make):
    op, x, w, axes = make(device)
    mdn.manual_seed(1)
    b = mdn.randn(w.shape[0], device=device, requires_grad=True)
    y = op(x, w, b)
    y0 = op(x, w)
    shape = (1, -1) + (1,) * (y.ndim - 2) if op is not F.linear else (-1,)
    np.testing.assert_allclose(_np(y), _np(y0) + _np(b).reshape(shape), rtol=1e-5, atol=1e-5)
    g = mdn.randn(*y.shape, device=device)
    y.backward(g)
    np.testing.assert_allclose(_np(b.grad), _np(g).sum(axis=axes), rtol=1e-5, atol=1e-4)


def test_bias_double_backward():
    x = mdn.randn(2, 3, 5, 5, dtype=mdn.float64)
    w = mdn.randn(4, 3, 3, 3, dtype=mdn.float64, requires_grad=True)
    b = mdn.randn(4, dtype=mdn.float64, requires_grad=True)
    assert mdn.autograd.gradcheck(lambda w, b: F.conv2d(x, w, b, padding=1), (w, b))
    assert mdn.autograd.gradgradcheck(lambda w, b: F.conv2d(x, w, b, padding=1).tanh(), (w, b))
    lin_x = mdn.randn(3, 5, dtype=mdn.float64, requires_grad=True)
    lin_w = mdn.randn(4, 5, dtype=mdn.float64)
    assert mdn.autograd.gradgradcheck(lambda x, b: F.linear(x, lin_w, b).sigmoid(), (lin_x, b))


@pytest.mark.cuda
def test_bias_gradient_is_one_column_sum_kernel():
    if not mdn.cuda.is_available():
        pytest.skip("no GPU")
    from minidnn.backend.cuda import launch
    y = mdn.randn(8, 16, 6, 6, device="cuda", requires_grad=True)
    b = mdn.randn(16, device="cuda", requires_grad=True)
    from minidnn.nn._functions.bias import add_bias
    out = add_bias(y, b)
    g = mdn.randn(*out.shape, device="cuda")
    out.backward(g, retain_graph=True)
    start = launch.launch_count()
    out.backward(g)
    assert 1 <= launch.launch_count() - start <= 2          # NCHW column sum: one or two kernels
    np.testing.assert_allclose(_np(b.grad), 2 * _np(g).sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-4)


def test_linear_with_no_output_features():
    x = mdn.randn(2, 3, requires_grad=True)
    w = mdn.randn(0, 3, requires_grad=True)
    b = mdn.randn(0, requires_grad=True)
    y = F.linear(x, w, b)
    assert y.shape == (2, 0)
    y.sum().backward()
    assert b.grad.shape == (0,) and x.grad.shape == (2, 3)
