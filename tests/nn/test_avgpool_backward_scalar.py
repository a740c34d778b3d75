"""Average pooling's backward stands x's broadcast view on one kept 0-d array per module, dtype and device (its values
are never read): no allocation -- on a GPU no memset launch -- per call, NCHW and channels-last, and dx still the
float64 reference's."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn.nn import functional as F
from minidnn.nn._functions import pooling as P


def _reference_dx(g, k):
    """dx of a k x k, stride-k average pool: each dy spread evenly over its window (float64)."""
    return np.repeat(np.repeat(g, k, axis=2), k, axis=3) / (k * k)


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
def test_avg_pool_backward_allocates_no_scalar_per_call(monkeypatch, cl):
    calls = []
    real = np.zeros

    def zeros(*a, **k):
        calls.append(a)
        return real(*a, **k)
    monkeypatch.setattr(P, "_SHAPE_ONLY", {})
    monkeypatch.setattr(np, "zeros", zeros)
    rng = np.random.default_rng(0)
    for step in range(3):
        x = mdn.tensor(rng.standard_normal((2, 3, 6, 4)).astype(np.float32), requires_grad=True)
        if cl:
            x = x.detach().to(memory_format=mdn.channels_last).requires_grad_()
        y = F.avg_pool2d(x, 2)
        g = rng.standard_normal(y.shape).astype(np.float32)
        y.backward(mdn.tensor(g))
        np.testing.assert_allclose(x.grad.numpy(), _reference_dx(g.astype(np.float64), 2), rtol=1e-6, atol=1e-7)
        if cl:
            assert x.grad.is_contiguous(memory_format=mdn.channels_last)
    assert sum(1 for a in calls if a and a[0] == ()) == 1       # the kept scalar, made at the first call only
    assert len(P._SHAPE_ONLY) == 1
