"""Eval-mode batch norm under bfloat16 autocast (CPU): its backward hands x's dtype back to the layer before it and
float32 gradients to its float32 parameters, as PyTorch's (it had returned float32 dx for a bfloat16 x, and the conv
before it refused the float32 dy in its filter gradient)."""
import numpy as np
import pytest

import minidnn as mdn

torch = pytest.importorskip("torch")


def _pair(seed=0):
    rng = np.random.default_rng(seed)
    conv_w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    conv_b = rng.standard_normal(4).astype(np.float32) * 0.1
    bn = [rng.standard_normal(4).astype(np.float32) * 0.5 + 1, rng.standard_normal(4).astype(np.float32) * 0.1,
          rng.standard_normal(4).astype(np.float32) * 0.2, rng.uniform(0.5, 2.0, 4).astype(np.float32)]
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    g = rng.standard_normal((2, 4, 7, 7)).astype(np.float32)
    return conv_w, conv_b, bn, x, g


def _ours(conv_w, conv_b, bn, x, g, relu):
    nn = mdn.nn
    conv, norm = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
    conv.weight.data[...] = conv_w
    conv.bias.data[...] = conv_b
    norm.weight.data[...], norm.bias.data[...] = bn[0], bn[1]
    norm.running_mean.data[...], norm.running_var.data[...] = bn[2], bn[3]
    m = nn.Sequential(conv, norm, nn.ReLU()) if relu else nn.Sequential(conv, norm)
    m.eval()
    xt = mdn.tensor(x, requires_grad=True)
    with mdn.autocast("cpu", dtype=mdn.bfloat16):
        y = m(xt)
    y.backward(mdn.tensor(g).to(y.dtype))
    return y, xt.grad, [p.grad for p in m.parameters()]


def _theirs(conv_w, conv_b, bn, x, g, relu):
    nn = torch.nn
    conv, norm = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(conv_w))
        conv.bias.copy_(torch.from_numpy(conv_b))
        norm.weight.copy_(torch.from_numpy(bn[0]))
        norm.bias.copy_(torch.from_numpy(bn[1]))
        norm.running_mean.copy_(torch.from_numpy(bn[2]))
        norm.running_var.copy_(torch.from_numpy(bn[3]))
    m = nn.Sequential(conv, norm, nn.ReLU()) if relu else nn.Sequential(conv, norm)
    m.eval()
    xt = torch.from_numpy(x).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(xt)
    y.backward(torch.from_numpy(g).to(y.dtype))
    return y, xt.grad, [p.grad for p in m.parameters()]


def _np(t):
    return np.asarray(t.detach().float().numpy(), dtype=np.float64)


@pytest.mark.parametrize("relu", [False, True])
def test_eval_batch_norm_backward_dtypes_and_values_against_torch(relu):
    args = _pair()
    y, dx, grads = _ours(*args, relu)
    ty, tdx, tgrads = _theirs(*args, relu)
    assert str(y.dtype).endswith("bfloat16") and str(ty.dtype).endswith("bfloat16")
    assert str(dx.dtype).endswith("float32") and str(tdx.dtype).endswith("float32")
    for p, tp in zip(grads, tgrads):
        assert str(p.dtype).endswith("float32") and str(tp.dtype).endswith("float32")
    scale = max(1.0, float(np.abs(_np(ty)).max()))
    np.testing.assert_allclose(_np(y), _np(ty), rtol=0, atol=2e-2 * scale)    # bfloat16 outputs: a few ulps
    for a, b in [(dx, tdx)] + list(zip(grads, tgrads)):
        a, b = _np(a), _np(b)
        np.testing.assert_allclose(a, b, rtol=0, atol=3e-2 * max(1.0, float(np.abs(b).max())))


def test_eval_batch_norm_dx_dtype_is_the_input_dtype():
    """The node alone: a bfloat16 x with float32 statistics gets a bfloat16 dx and float32 dweight / dbias."""
    x = mdn.randn(2, 3, 4, 4).to(mdn.bfloat16).requires_grad_()
    w, b = mdn.ones(3, requires_grad=True), mdn.zeros(3, requires_grad=True)
    rm, rv = mdn.zeros(3), mdn.ones(3) * 4
    y = mdn.nn.functional.batch_norm(x, rm, rv, w, b, training=False)
    g = mdn.randn(2, 3, 4, 4).to(y.dtype)
    y.backward(g)
    assert x.grad.dtype == mdn.bfloat16 and w.grad.dtype == mdn.float32 and b.grad.dtype == mdn.float32
    g64 = g.double().numpy()
    np.testing.assert_allclose(x.grad.double().numpy(), (g64 * 0.5).astype(np.float32), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(b.grad.double().numpy(), g64.sum((0, 2, 3)), rtol=1e-5, atol=1e-5)
    xhat = x.detach().double().numpy() * 0.5
    np.testing.assert_allclose(w.grad.double().numpy(), (g64 * xhat).sum((0, 2, 3)), rtol=1e-5, atol=1e-5)
