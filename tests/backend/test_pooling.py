"""Pooling: one table of cases, each checked against a float64 loop reference, finite differences and PyTorch."""
import itertools
import math

import numpy as np
import pytest

from minidnn.backend import (
    BadParamError,
    PoolingDescriptor,
    PoolingMode,
    get_pooling_forward_output_dim,
    pooling_backward,
    pooling_forward,
)
from minidnn.backend._testing import numerical_gradient, to_numpy

MAX, MAXD = PoolingMode.MAX, PoolingMode.MAX_DETERMINISTIC
INC, EXC = PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING, PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING

# (x shape channels-first, mode, window, padding, stride, ceil_mode)
CASES = [
    ((2, 3, 7, 8), MAX, 3, 1, 2, False),
    ((2, 3, 6, 7), INC, 3, 1, 2, True),
    ((2, 2, 6, 7), EXC, 2, 1, 2, True),
    ((1, 2, 5, 7), MAXD, (2, 3), (1, 0), (1, 2), False),
    ((2, 2, 9), MAX, 3, 1, 1, False),
    ((2, 2, 10), EXC, 4, 2, 3, True),
    ((1, 2, 4, 5, 6), EXC, 2, 1, (1, 2, 2), False),
    ((1, 1, 5, 4, 5), MAX, 3, 1, 2, True),
    ((0, 3, 5, 5), MAX, 2, 0, None, False),
    ((1, 1, 3, 3), INC, 3, 0, None, False),
]
IDS = [f"{len(c[0]) - 2}d-{c[1].name.lower()}-{'x'.join(map(str, c[0]))}" + ("-ceil" if c[5] else "") for c in CASES]


def ref_pool(x, desc):
    """Float64 loop reference over output positions: clip each window to the input, count as documented."""
    nd = x.ndim - 2
    k, p, s = (np.broadcast_to(v, nd) for v in (desc.window, desc.padding, desc.stride))
    out = get_pooling_forward_output_dim(desc, x.shape)[2:]
    y = np.zeros(x.shape[:2] + tuple(out))
    windows = {}
    for o in np.ndindex(*out):
        start = [oi * si - pi for oi, si, pi in zip(o, s, p)]
        lo = [max(a, 0) for a in start]
        hi = [min(a + ki, n) for a, ki, n in zip(start, k, x.shape[2:])]
        region = (Ellipsis,) + tuple(slice(a, b) for a, b in zip(lo, hi))
        win = x[region].reshape(x.shape[:2] + (math.prod(b - a for a, b in zip(lo, hi)),))
        if desc.mode in (MAX, MAXD):
            y[(Ellipsis,) + o] = win.max(axis=-1) if x.shape[0] else 0
        else:
            if desc.mode is INC:
                count = math.prod(min(a + ki, n + pi) - a for a, ki, n, pi in zip(start, k, x.shape[2:], p))
            else:
                count = math.prod(b - a for a, b in zip(lo, hi))
            y[(Ellipsis,) + o] = win.sum(axis=-1) / count
        windows[o] = (region, lo, hi, None if desc.mode in (MAX, MAXD) else count)
    return y, windows


def ref_pool_backward(x, dy, desc):
    _, windows = ref_pool(x, desc)
    dx = np.zeros_like(x)
    for o, (region, lo, hi, count) in windows.items():
        g = dy[(Ellipsis,) + o]
        if count is None:   # max: first maximum of the window in row-major order gets it all
            win = x[region].reshape(x.shape[:2] + (math.prod(b - a for a, b in zip(lo, hi)),))
            for n, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
                idx = np.unravel_index(int(np.argmax(win[n, c])), [b - a for a, b in zip(lo, hi)])
                dx[(n, c) + tuple(a + i for a, i in zip(lo, idx))] += g[n, c]
        else:
            dx[region] += g[(Ellipsis,) + (None,) * len(lo)] / count
    return dx


def _desc(case):
    _, mode, window, padding, stride, ceil_mode = case
    return PoolingDescriptor(mode, window, padding, stride, ceil_mode)


def _nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


@pytest.mark.parametrize("fmt", [None, "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pooling_matches_reference(xp, rng, case, fmt):
    desc = _desc(case)
    x = rng.standard_normal(case[0])
    y_ref, _ = ref_pool(x, desc)
    dy = rng.standard_normal(y_ref.shape)
    dx_ref = ref_pool_backward(x, dy, desc)
    conv = _nhwc if fmt else (lambda a: a)
    xd, dyd = xp.asarray(conv(x)), xp.asarray(conv(dy))
    y = pooling_forward(None, desc, xd, format=fmt)
    dx = pooling_backward(None, desc, y, dyd, xd, format=fmt)
    np.testing.assert_allclose(to_numpy(y), conv(y_ref), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(to_numpy(dx), conv(dx_ref), rtol=1e-12, atol=1e-12)
    assert get_pooling_forward_output_dim(desc, xd.shape, fmt) == tuple(y.shape)
    if desc.mode.is_max and x.size:
        y2, argmax = pooling_forward(None, desc, xd, format=fmt, return_argmax=True)
        dx2 = pooling_backward(None, desc, y2, dyd, xd, format=fmt, argmax=argmax)
        np.testing.assert_array_equal(to_numpy(dx2), to_numpy(dx))


@pytest.mark.parametrize("case", [c for c in CASES if c[0][0] and math.prod(c[0]) <= 200], ids=lambda c: str(c[0]))
def test_pooling_backward_finite_differences(xp, rng, case):
    desc = _desc(case)
    x = xp.asarray(rng.permutation(np.prod(case[0])).reshape(case[0]) / 7.0)   # distinct values: no ties
    dy = xp.asarray(rng.standard_normal(pooling_forward(None, desc, x).shape))
    dx = pooling_backward(None, desc, None, dy, x)
    num = numerical_gradient(lambda v: (pooling_forward(None, desc, v) * dy).sum(), x, eps=1e-4)
    np.testing.assert_allclose(to_numpy(dx), num, rtol=1e-7, atol=1e-7)


def test_max_pooling_ties_go_to_first_and_padding_is_never_max(xp):
    x = xp.full((1, 1, 4, 4), -5.0)           # every window tied; padding (0) must not win over -5
    desc = PoolingDescriptor(MAX, 2, 1, 2)
    y = pooling_forward(None, desc, x)
    assert float(y.max()) == -5.0
    dx = to_numpy(pooling_backward(None, desc, y, xp.ones_like(y), x))
    expected = np.zeros((4, 4))
    expected[np.ix_([0, 1, 3], [0, 1, 3])] = 1    # first real element of each (clipped) window
    np.testing.assert_array_equal(dx[0, 0], expected)


def test_pooling_against_pytorch(rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for shape, mode, window, padding, stride, ceil_mode in CASES:
        nd = len(shape) - 2
        if not shape[0] or any(2 * p > k for p, k in zip(np.broadcast_to(padding, nd), np.broadcast_to(window, nd))):
            continue
        desc = PoolingDescriptor(mode, window, padding, stride, ceil_mode)
        x = rng.standard_normal(shape).astype(np.float32)
        xt = torch.tensor(x, requires_grad=True)
        if mode.is_max:
            yt = getattr(F, f"max_pool{nd}d")(xt, window, stride or window, padding, ceil_mode=ceil_mode)
        else:
            yt = getattr(F, f"avg_pool{nd}d")(xt, window, stride or window, padding, ceil_mode=ceil_mode,
                                              count_include_pad=mode is INC)
        dy = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
        yt.backward(torch.tensor(dy))
        y = pooling_forward(None, desc, x)
        np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1.3e-6, atol=1e-5)
        np.testing.assert_allclose(pooling_backward(None, desc, y, dy, x), xt.grad.numpy(), rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("make, match", [
    (lambda: PoolingDescriptor("MIN", 2), "unknown mode 'MIN'"),
    (lambda: PoolingDescriptor(MAX, 0), r"window=0 must be >= 1"),
    (lambda: PoolingDescriptor(MAX, 2, -1), r"padding=-1 must be >= 0"),
    (lambda: pooling_forward(None, PoolingDescriptor(MAX, 2, 2), np.ones((1, 1, 4, 4))),
     r"padding \(2, 2\) must be smaller than window \(2, 2\)"),
    (lambda: pooling_forward(None, PoolingDescriptor(MAX, 5), np.ones((1, 1, 4, 4))),
     r"window \(5, 5\) is larger than the padded input"),
    (lambda: pooling_forward(None, PoolingDescriptor(MAX, (2, 2)), np.ones((1, 1, 4))), r"has 2 entries but 1"),
    (lambda: pooling_forward(None, PoolingDescriptor(MAX, 2), np.ones((4, 4))), r"shape \(4, 4\) \(2-D\)"),
    (lambda: pooling_forward(None, PoolingDescriptor(MAX, 2), np.ones((1, 1, 4, 4), dtype=np.int32)),
     "dtype int32"),
    (lambda: pooling_backward(None, PoolingDescriptor(MAX, 2), None, np.ones((1, 1, 3, 3)), np.ones((1, 1, 4, 4))),
     r"dy has shape \(1, 1, 3, 3\) but pooling x of shape \(1, 1, 4, 4\) gives \(1, 1, 2, 2\)"),
    (lambda: pooling_forward(None, PoolingDescriptor(INC, 2), np.ones((1, 1, 4, 4)), return_argmax=True),
     "needs a MAX mode"),
])
def test_pooling_errors(make, match):
    with pytest.raises(BadParamError, match=match):
        make()
