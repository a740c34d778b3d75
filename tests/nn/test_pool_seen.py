"""Pooling's validated-call shortcut and its first-order backward without a second apply (docs/host_overhead.md
round 20): a remembered call gives the values of a fresh one against a float64 loop reference, every bad call still
raises what the full path raises whatever was remembered before, and values that hash like valid settings but are
treated differently by the checks never meet a remembered key."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn.backend.errors import ArgumentError, DTypeError
from minidnn.nn import functional as F
from minidnn.nn._functions import pooling as pool_mod


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _t(a, grad=True):
    t = mdn.tensor(np.asarray(a))
    t.requires_grad = grad
    return t


def _max_pool_ref(x, k, s, gy):
    """float64 loops: y = window maxima (first maximum in scan order), dx = gy at each window's winner."""
    n, c, h, w = x.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    y = np.zeros((n, c, oh, ow))
    dx = np.zeros(x.shape)
    for b in range(n):
        for ch in range(c):
            for i in range(oh):
                for j in range(ow):
                    win = x[b, ch, i * s:i * s + k, j * s:j * s + k].astype(np.float64)
                    r, q = np.unravel_index(int(np.argmax(win)), win.shape)
                    y[b, ch, i, j] = win[r, q]
                    dx[b, ch, i * s + r, j * s + q] += gy[b, ch, i, j]
    return y, dx


def _avg_pool_ref(x, k, s, gy):
    n, c, h, w = x.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    y = np.zeros((n, c, oh, ow))
    dx = np.zeros(x.shape)
    for i in range(oh):
        for j in range(ow):
            y[:, :, i, j] = x[:, :, i * s:i * s + k, j * s:j * s + k].astype(np.float64).mean(axis=(2, 3))
            dx[:, :, i * s:i * s + k, j * s:j * s + k] += gy[:, :, i, j][:, :, None, None] / (k * k)
    return y, dx


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("k,s", [(2, 2), (3, 2), (3, 1)])
def test_remembered_pool_matches_reference(rng, kind, k, s):
    pool_mod._SEEN_POOL.clear()
    f = F.max_pool2d if kind == "max" else F.avg_pool2d
    ref = _max_pool_ref if kind == "max" else _avg_pool_ref
    xa = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    results = []
    for call in range(3):           # the full path, then remembered calls
        x = _t(xa)
        y = f(x, k, s)
        gy = rng.standard_normal(tuple(y.shape)).astype(np.float32)
        y.backward(mdn.tensor(gy))
        y_ref, dx_ref = ref(xa, k, s, gy)
        np.testing.assert_allclose(y.data, y_ref, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(x.grad.data, dx_ref, rtol=1e-5, atol=1e-6)
        results.append(y.data.copy())
        if call == 0:
            assert len(pool_mod._SEEN_POOL) == 1
    assert all(np.array_equal(results[0], r) for r in results[1:])


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_first_order_backward_equals_recorded_backward(rng, kind):
    """The first-order backward (no second apply) gives the bits of the create_graph path's Function."""
    f = F.max_pool2d if kind == "max" else F.avg_pool2d
    xa = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    gy = rng.standard_normal((2, 4, 4, 4)).astype(np.float32)
    x1 = _t(xa)
    g1, = mdn.autograd.grad(f(x1, 2), x1, mdn.tensor(gy))
    x2 = _t(xa)
    g2, = mdn.autograd.grad(f(x2, 2), x2, _t(gy), create_graph=True)
    assert g2.requires_grad and g2.grad_fn is not None
    assert np.array_equal(g1.data, g2.data)


def test_bad_pool_calls_raise_after_remembered(rng):
    pool_mod._SEEN_POOL.clear()
    xa = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    F.max_pool2d(_t(xa), 2)
    F.max_pool2d(_t(xa), 2, 2, 1)
    with pytest.raises(ArgumentError, match="pad should be at most half"):
        F.max_pool2d(_t(xa), 2, 2, 2)
    with pytest.raises(ArgumentError, match="must be positive"):
        F.max_pool2d(_t(xa), 0)
    with pytest.raises(DTypeError, match="floating-point"):
        F.max_pool2d(mdn.tensor(np.zeros((2, 3, 8, 8), np.int64)), 2)
    with pytest.raises(ArgumentError, match="too small"):
        F.max_pool2d(_t(xa[:, :, :1, :1]), 2)
    with pytest.raises(ArgumentError, match="expected a 3-D"):
        F.max_pool2d(_t(xa[0, 0]), 2)
    with pytest.raises(DTypeError, match="must be a Tensor"):
        F.max_pool2d(xa, 2)


def test_settings_that_hash_alike_are_not_remembered(rng):
    pool_mod._SEEN_POOL.clear()
    xa = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    y_ref = F.max_pool2d(_t(xa), 2).data.copy()
    n = len(pool_mod._SEEN_POOL)
    for kwargs in (dict(kernel_size=2.0), dict(kernel_size=2, stride=[]), dict(kernel_size=[2, 2]),
                   dict(kernel_size=2, ceil_mode=0)):
        try:
            y = F.max_pool2d(_t(xa), **kwargs)
        except (ArgumentError, DTypeError, TypeError):
            continue
        assert np.array_equal(y.data, y_ref)
    assert len(pool_mod._SEEN_POOL) == n       # none of those keys was remembered
    with pytest.raises(DTypeError):
        F.max_pool2d(_t(xa), 2.0)               # 2.0 == 2 and hashes alike: still the full path's error
    # unbatched input: the full path every time (its squeeze), not remembered
    y = F.max_pool2d(_t(xa[0]), 2)
    assert tuple(y.shape) == (3, 4, 4) and len(pool_mod._SEEN_POOL) == n
