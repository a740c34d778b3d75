"""The CPU fast path of softmax cross-entropy (backend/softmax.py ``_cpu_ce_forward`` / ``_cpu_ce_backward``, issue
16): against the primitive's reference (the fast path switched off) and a float64 loop, for every reduction, label
smoothing, ignored rows (some, all), float32 and float64; the bounds error before any work; the rows it leaves to
the reference (class weights, N-d logits, a non-finite row); nn's cross_entropy taking it on the CPU."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.backend as B
import minidnn.nn.functional as F
from minidnn.backend import softmax as S
from minidnn.backend.errors import BadParamError


def _loop(x, t, eps, ignore, reduction):
    """float64 loop: per-row -((1-eps) logp[t] + eps/C sum_c logp_c), ignored rows 0; mean over valid rows."""
    x = x.astype(np.float64)
    n, c = x.shape
    per = np.zeros(n)
    g = np.zeros_like(x)
    valid = 0
    for i in range(n):
        if t[i] == ignore:
            continue
        valid += 1
        m = x[i].max()
        lse = m + np.log(np.exp(x[i] - m).sum())
        logp = x[i] - lse
        per[i] = -((1 - eps) * logp[t[i]] + eps / c * logp.sum())
        q = np.full(c, eps / c)
        q[t[i]] += 1 - eps
        g[i] = np.exp(logp) - q
    if reduction == "none":
        return per, g
    if reduction == "sum":
        return per.sum(), g
    return per.sum() / valid, g / valid


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("ignore", [-100, 2])
def test_fast_path_against_the_reference_and_a_loop(dtype, reduction, eps, ignore, monkeypatch):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((33, 10)) * 3).astype(dtype)
    t = rng.integers(0, 10, 33)
    dloss = np.asarray(1.5 if reduction != "none" else rng.standard_normal(33), dtype=dtype)
    fast = B.softmax_cross_entropy_forward(None, x, t, None, ignore, eps, reduction)
    dfast = B.softmax_cross_entropy_backward(None, x, t, dloss, fast[1], fast[2], None, ignore, eps, reduction)
    monkeypatch.setattr(S, "_cpu_ce_forward", lambda *a: None)
    monkeypatch.setattr(S, "_cpu_ce_backward", lambda *a: None)
    ref = B.softmax_cross_entropy_forward(None, x, t, None, ignore, eps, reduction)
    dref = B.softmax_cross_entropy_backward(None, x, t, dloss, ref[1], ref[2], None, ignore, eps, reduction)
    tol = 2e-6 if dtype == np.float32 else 1e-13
    for a, b in zip(fast, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    assert dfast.dtype == dref.dtype
    np.testing.assert_allclose(dfast, dref, rtol=tol, atol=tol)
    want, gwant = _loop(x, t, eps, ignore, reduction)
    np.testing.assert_allclose(fast[0], want, rtol=tol * 4, atol=tol * 4)
    gscale = dloss if reduction != "none" else dloss[:, None]
    np.testing.assert_allclose(dfast, gwant * gscale, rtol=tol * 4, atol=tol * 4)


def test_every_row_ignored_gives_nan_mean_and_zero_gradient():
    x = np.ones((4, 3), np.float32)
    t = np.full(4, -100)
    loss, lse, denom = B.softmax_cross_entropy_forward(None, x, t, None, -100, 0.1, "mean")
    assert np.isnan(loss) and denom == 0
    dx = B.softmax_cross_entropy_backward(None, x, t, np.asarray(1.0, np.float32), lse, denom, None, -100, 0.1,
                                          "mean")
    assert (dx == 0).all()


def test_out_of_bounds_target_is_an_error_before_work():
    with pytest.raises(BadParamError, match="target 5 is out of bounds for 5 classes"):
        B.softmax_cross_entropy_forward(None, np.zeros((2, 5), np.float32), np.array([0, 5]), None, -100, 0.0, "mean")


def test_rows_left_to_the_reference():
    x = np.zeros((2, 3), np.float32)
    t = np.array([0, 1])
    assert S._cpu_ce_forward(x, t, np.ones(3, np.float32), -100, 0.0, "mean", "w") is None     # class weights
    assert S._cpu_ce_forward(x[:, :, None], t[:, None], None, -100, 0.0, "mean", "w") is None  # N-d
    x[1, 2] = np.inf
    assert S._cpu_ce_forward(x, t, None, -100, 0.0, "mean", "w") is None                       # non-finite row


def test_nn_cross_entropy_takes_it_on_the_cpu(monkeypatch):
    calls = []
    orig = S._cpu_ce_forward
    monkeypatch.setattr(S, "_cpu_ce_forward", lambda *a: calls.append(1) or orig(*a))
    rng = np.random.default_rng(1)
    x = mdn.tensor(rng.standard_normal((8, 4)).astype(np.float32), requires_grad=True)
    t = mdn.tensor(rng.integers(0, 4, 8))
    loss = F.cross_entropy(x, t, label_smoothing=0.2)
    loss.backward()
    assert calls == [1]
    x2 = mdn.tensor(x.detach().numpy(), requires_grad=True)
    mdn.backends.cudnn.fusion = False
    try:
        loss2 = F.cross_entropy(x2, t, label_smoothing=0.2)
        loss2.backward()
    finally:
        mdn.backends.cudnn.fusion = True
    np.testing.assert_allclose(loss.item(), loss2.item(), rtol=2e-6)
    np.testing.assert_allclose(x.grad.numpy(), x2.grad.numpy(), rtol=2e-5, atol=1e-7)


def test_a_row_with_an_infinite_logit_is_nan_as_pytorch():
    """A +inf or NaN logit makes the row's loss and gradient NaN (PyTorch; the GPU kernels' shift keeps a +inf
    maximum too); a wholly masked (-inf) row is NaN; an -inf on other classes only is finite."""
    x = np.array([[np.inf, 0.0, 1.0], [np.nan, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [0.5, -np.inf, 1.0]],
                 np.float32)
    t = np.array([1, 1, 1, 2])
    with np.errstate(all="ignore"):
        loss, lse, denom = B.softmax_cross_entropy_forward(None, x, t, None, -100, 0.0, "none")
        dx = B.softmax_cross_entropy_backward(None, x, t, np.ones(4, np.float32), lse, denom, None, -100, 0.0, "none")
    assert np.isnan(loss[:3]).all() and np.isfinite(loss[3])
    assert np.isnan(dx[:3]).all() and np.isfinite(dx[3]).all()
    np.testing.assert_allclose(dx[3], [np.exp(0.5) / (np.exp(0.5) + np.e), 0.0,
                                       np.e / (np.exp(0.5) + np.e) - 1], rtol=1e-5)
