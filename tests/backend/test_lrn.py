"""LRN across channels and divisive normalisation: float64 loop references, finite differences, PyTorch."""
import numpy as np
import pytest

from minidnn.backend import (
    BadParamError,
    DivNormMode,
    LRNDescriptor,
    divisive_normalization_backward,
    divisive_normalization_forward,
    lrn_cross_channel_backward,
    lrn_cross_channel_forward,
)
from minidnn.backend._testing import numerical_gradient, to_numpy

# (x shape, LRNDescriptor(n, alpha, beta, k))
LRN_CASES = [((2, 7, 3, 4), LRNDescriptor(5, 0.5, 0.75, 1.5)), ((2, 6, 5), LRNDescriptor(4, 1.0, 0.6, 1.0)),
             ((1, 5, 2, 2, 3), LRNDescriptor(3, 2.0, 1.0, 2.0)), ((3, 4), LRNDescriptor(2, 0.3, 0.75, 1.0)),
             ((2, 3, 2, 2), LRNDescriptor(1, 1.0, 0.5, 1.0)), ((0, 4, 2, 2), LRNDescriptor())]
IDS = [f"{'x'.join(map(str, s))}-n{d.n}" for s, d in LRN_CASES]


def ref_lrn(x, d):
    y = np.empty_like(x)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - d.n // 2), min(x.shape[1], c + (d.n - 1) // 2 + 1)
        y[:, c] = x[:, c] * (d.k + d.alpha / d.n * (x[:, lo:hi] ** 2).sum(axis=1)) ** -d.beta
    return y


def _nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1)) if a.ndim >= 3 else a


@pytest.mark.parametrize("fmt", [None, "NHWC"])
@pytest.mark.parametrize("shape, desc", LRN_CASES, ids=IDS)
def test_lrn_matches_reference(xp, rng, shape, desc, fmt):
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    conv = _nhwc if fmt else (lambda a: a)
    xd, dyd = xp.asarray(conv(x)), xp.asarray(conv(dy))
    y = lrn_cross_channel_forward(None, desc, xd, format=fmt)
    np.testing.assert_allclose(to_numpy(y), conv(ref_lrn(x, desc)), rtol=1e-12, atol=1e-14)
    dx = lrn_cross_channel_backward(None, desc, y, dyd, xd, format=fmt)
    if x.size and x.size <= 150:
        num = numerical_gradient(lambda v: (lrn_cross_channel_forward(None, desc, v, format=fmt) * dyd).sum(),
                                 xp.asarray(conv(x)))
        np.testing.assert_allclose(to_numpy(dx), num, rtol=1e-6, atol=1e-9)
    else:   # adjoint identity against a finite-difference directional derivative
        v = rng.standard_normal(x.shape)
        f = lambda t: float((lrn_cross_channel_forward(None, desc, xp.asarray(conv(x + t * v)), format=fmt)  # noqa
                             * dyd).sum())
        np.testing.assert_allclose(float((to_numpy(dx) * conv(v)).sum()), (f(1e-6) - f(-1e-6)) / 2e-6,
                                   rtol=1e-6, atol=1e-9)


def test_lrn_against_pytorch(rng):
    torch = pytest.importorskip("torch")
    for shape, d in LRN_CASES:
        if len(shape) < 3 or not shape[0]:
            continue
        x, dy = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
        xt = torch.tensor(x, requires_grad=True)
        yt = torch.nn.functional.local_response_norm(xt, d.n, d.alpha, d.beta, d.k)
        yt.backward(torch.tensor(dy))
        y = lrn_cross_channel_forward(None, d, x)
        np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1.3e-6, atol=1e-5)
        np.testing.assert_allclose(lrn_cross_channel_backward(None, d, y, dy, x), xt.grad.numpy(), rtol=1.3e-6,
                                   atol=1e-5)


def ref_window_mean(a, n):
    """Zero-padded n^d box mean over the spatial dims, by a loop over positions."""
    out = np.empty_like(a)
    for pos in np.ndindex(*a.shape[2:]):
        region = tuple(slice(max(0, p - n // 2), p + (n - 1) // 2 + 1) for p in pos)
        out[(Ellipsis,) + pos] = a[(Ellipsis,) + region].sum(axis=tuple(range(2, a.ndim))) / n ** (a.ndim - 2)
    return out


def ref_divnorm(x, d, means):
    z = x - (ref_window_mean(x, d.n) if means is None else means)
    return z * (d.k + d.alpha * ref_window_mean(z * z, d.n)) ** -d.beta


DIV_CASES = [((1, 2, 4, 5), LRNDescriptor(3, 1.0, 0.5, 0.1), False), ((2, 1, 5, 4), LRNDescriptor(2, 0.5, 0.75, 1.0),
             True), ((1, 2, 6), LRNDescriptor(4, 1.0, 0.5, 0.5), False), ((1, 1, 3, 3, 3), LRNDescriptor(3), True)]


@pytest.mark.parametrize("fmt", [None, "NHWC"])
@pytest.mark.parametrize("shape, desc, with_means", DIV_CASES, ids=[f"{'x'.join(map(str, c[0]))}-n{c[1].n}-"
                                                                     f"{'means' if c[2] else 'computed'}"
                                                                     for c in DIV_CASES])
def test_divisive_normalization_matches_reference(xp, rng, shape, desc, with_means, fmt):
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    means = rng.standard_normal(shape) * 0.3 if with_means else None
    conv = _nhwc if fmt else (lambda a: a)
    xd, dyd = xp.asarray(conv(x)), xp.asarray(conv(dy))
    md = None if means is None else xp.asarray(conv(means))
    mode = DivNormMode.PRECOMPUTED_MEANS
    y = divisive_normalization_forward(None, desc, mode, xd, md, format=fmt)
    np.testing.assert_allclose(to_numpy(y), conv(ref_divnorm(x, desc, means)), rtol=1e-12, atol=1e-14)
    dx, dmeans = divisive_normalization_backward(None, desc, mode, xd, md, dyd, format=fmt)
    loss = lambda x_, m_: (divisive_normalization_forward(None, desc, mode, x_, m_, format=fmt) * dyd).sum()  # noqa
    np.testing.assert_allclose(to_numpy(dx), numerical_gradient(lambda v: loss(v, md), xd), rtol=1e-6, atol=1e-9)
    if with_means:
        np.testing.assert_allclose(to_numpy(dmeans), numerical_gradient(lambda m: loss(xd, m), md), rtol=1e-6,
                                   atol=1e-9)
    else:
        assert dmeans is None


@pytest.mark.parametrize("make, match", [
    (lambda: LRNDescriptor(n=17), r"n=17 must be an int in \[1, 16\]"),
    (lambda: LRNDescriptor(k=1e-6), "k=1e-06 must be >= 1e-5"),
    (lambda: LRNDescriptor(beta=0.001), "beta=0.001 must be >= 0.01"),
    (lambda: lrn_cross_channel_forward(None, LRNDescriptor(), np.ones(4)), r"shape \(4,\) \(1-D\)"),
    (lambda: lrn_cross_channel_backward(None, LRNDescriptor(), None, np.ones((2, 3)), np.ones((2, 4))),
     r"dy has shape \(2, 3\) but x has shape \(2, 4\)"),
    (lambda: divisive_normalization_forward(None, LRNDescriptor(), "MEANS", np.ones((1, 1, 3))), "unknown mode"),
    (lambda: divisive_normalization_forward(None, LRNDescriptor(), DivNormMode.PRECOMPUTED_MEANS, np.ones((1, 1, 3)),
                                            np.ones((1, 1, 4))), r"means has shape \(1, 1, 4\) but x has shape"),
])
def test_lrn_errors(make, match):
    with pytest.raises(BadParamError, match=match):
        make()
