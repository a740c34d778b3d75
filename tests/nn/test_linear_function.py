"""F.linear as one node (nn/_functions/linear.py): values and gradients against float64 formulas over input ranks
1-3, with and without bias, every pattern of which operands want a gradient, zero-size dims; second derivatives
by gradgradcheck; one node recorded (not a transpose, a matmul and a bias add); mixed dtypes keep PyTorch's
promotion through the Tensor ops; PyTorch as an oracle where installed."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn.functional as F
from minidnn.nn._functions.linear import Linear


def _t(a, grad=True):
    return mdn.tensor(np.asarray(a, np.float64), requires_grad=grad)


@pytest.mark.parametrize("shape", [(5,), (4, 5), (2, 3, 5), (0, 5), (3, 0)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("wants", [(True, True, True), (False, True, True), (True, False, False)])
def test_values_and_gradients_against_float64(shape, with_bias, wants):
    rng = np.random.default_rng(len(shape) * 7 + shape[-1])
    out_f = 3
    xa = rng.standard_normal(shape)
    wa = rng.standard_normal((out_f, shape[-1]))
    ba = rng.standard_normal(out_f)
    x, w = _t(xa, wants[0]), _t(wa, wants[1])
    b = _t(ba, wants[2]) if with_bias else None
    y = F.linear(x, w, b)
    ref = xa @ wa.T + (ba if with_bias else 0)
    assert y.shape == ref.shape and y.grad_fn is not None
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-12, atol=1e-12)
    ga = rng.standard_normal(ref.shape)
    y.backward(mdn.tensor(ga))
    rows = int(np.prod(shape[:-1]))
    rows_x, rows_g = xa.reshape(rows, shape[-1]), ga.reshape(rows, out_f)
    if wants[0]:
        np.testing.assert_allclose(x.grad.numpy(), (ga @ wa).reshape(shape), rtol=1e-12, atol=1e-12)
    if wants[1]:
        np.testing.assert_allclose(w.grad.numpy(), rows_g.T @ rows_x, rtol=1e-12, atol=1e-12)
    if with_bias and wants[2]:
        np.testing.assert_allclose(b.grad.numpy(), rows_g.sum(0), rtol=1e-12, atol=1e-12)


def test_one_node_and_second_derivatives():
    rng = np.random.default_rng(3)
    x, w, b = _t(rng.standard_normal((2, 3, 4))), _t(rng.standard_normal((5, 4))), _t(rng.standard_normal(5))
    y = F.linear(x, w, b)
    assert type(y.grad_fn).__name__.startswith("Linear") or y.grad_fn._fn_cls is Linear
    assert [e[0] is not None for e in y.grad_fn.next_edges] == [True, True, True]
    assert mdn.autograd.gradcheck(lambda a, c, d: F.linear(a, c, d).tanh(), (x, w, b))
    assert mdn.autograd.gradgradcheck(lambda a, c, d: F.linear(a, c, d).tanh(), (x, w, b))


def test_mixed_dtypes_promote_as_before():
    x = mdn.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    w = mdn.tensor(np.ones((4, 3), np.float64), requires_grad=True)
    y = F.linear(x, w)
    assert y.dtype == mdn.float64
    y.sum().backward()
    assert x.grad.dtype == mdn.float32 and w.grad.dtype == mdn.float64


def test_against_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    xa, wa, ba = rng.standard_normal((6, 7)), rng.standard_normal((4, 7)), rng.standard_normal(4)
    x, w, b = _t(xa), _t(wa), _t(ba)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (xa, wa, ba))
    F.linear(x, w, b).square().sum().backward()
    torch.nn.functional.linear(tx, tw, tb).square().sum().backward()
    for m, t in ((x, tx), (w, tw), (b, tb)):
        np.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-12)
