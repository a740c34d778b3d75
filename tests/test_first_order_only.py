"""Ops whose gradient is computed on arrays are first order only: differentiating that gradient again raises a named
error instead of silently giving a zero second derivative (prod over an input with zeros, cumprod)."""
import numpy as np
import pytest

import minidnn as mdn


def test_prod_with_zeros_and_cumprod_are_first_order_only():
    x = mdn.tensor([[1.0, 0.0, 3.0], [2.0, 4.0, 0.5]], dtype=mdn.float64, requires_grad=True)
    y = x.prod(1).sum()
    g, = mdn.autograd.grad(y, x)
    np.testing.assert_allclose(g.numpy(), [[0, 3, 0], [2, 1, 8]])
    g, = mdn.autograd.grad(x.prod(1).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), [[0, 3, 0], [2, 1, 8]])
    with pytest.raises(RuntimeError, match="prod .over an input with zeros.: double backward"):
        g.sum().backward()
    c = x.cumprod(1).sum()
    g, = mdn.autograd.grad(c, x, create_graph=True)
    with pytest.raises(RuntimeError, match="cumprod: double backward"):
        g.sum().backward()
    x2 = mdn.tensor([[1.0, 2.0, 3.0]], dtype=mdn.float64, requires_grad=True)
    assert mdn.autograd.gradgradcheck(lambda t: t.prod(1), (x2,))
