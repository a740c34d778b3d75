"""Normal, Bernoulli and Uniform against torch.distributions: densities, entropies, moments and their gradients wrt
the parameters on every device; draws (shapes, dtypes, statistics, seeding, rsample's gradients); validate_args
errors with PyTorch's messages; kl_divergence within each family."""
from __future__ import annotations

import math

import numpy as np
import pytest

import minidnn as mdn
from minidnn.distributions import Bernoulli, Normal, Uniform, kl_divergence


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is the test oracle for the distributions")


def _pair(torch, device, a, grad=True):
    return (mdn.tensor(a, device=device, requires_grad=grad), torch.tensor(a, requires_grad=grad))


def _close(ours, theirs, rtol=1e-7, atol=1e-9):
    np.testing.assert_allclose(ours.detach().cpu().numpy(), theirs.detach().numpy(), rtol=rtol, atol=atol)


CASES = {
    "normal": (lambda D, p: D.Normal(p[0], p[1]), [np.array([0.0, -1.5, 2.0]), np.array([1.0, 0.3, 2.5])],
               np.array([[0.5, -1.0, 4.0], [0.0, 0.0, 0.0]])),
    "normal_bcast": (lambda D, p: D.Normal(p[0], p[1]), [np.array([[0.0], [1.0]]), np.array([0.5, 2.0])],
                     np.array([0.3, -0.2])),
    "bernoulli_probs": (lambda D, p: D.Bernoulli(probs=p[0]), [np.array([0.1, 0.5, 0.9, 0.3])],
                        np.array([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])),
    "bernoulli_logits": (lambda D, p: D.Bernoulli(logits=p[0]), [np.array([-3.0, 0.0, 2.0])],
                         np.array([1.0, 0.0, 1.0])),
    "uniform": (lambda D, p: D.Uniform(p[0], p[1]), [np.array([0.0, -2.0]), np.array([1.0, 3.0])],
                np.array([[0.5, -1.0], [0.99, 2.5]])),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(CASES))
def test_densities_moments_and_gradients_match_torch(torch, device, name, dtype):
    make, params, value = CASES[name]
    tol = dict(rtol=1e-7, atol=1e-9) if dtype == np.float64 else dict(rtol=1.3e-6, atol=1e-5)
    ours_p, theirs_p = zip(*(_pair(torch, device, p.astype(dtype)) for p in params))
    ours, theirs = make(mdn.distributions, ours_p), make(torch.distributions, theirs_p)
    assert ours.batch_shape == tuple(theirs.batch_shape) and ours.has_rsample == theirs.has_rsample
    v, tv = mdn.tensor(value.astype(dtype), device=device), torch.tensor(value.astype(dtype))
    total, ttotal = ours.log_prob(v).sum() + ours.entropy().sum(), theirs.log_prob(tv).sum() + theirs.entropy().sum()
    _close(ours.log_prob(v), theirs.log_prob(tv), **tol)
    _close(ours.entropy(), theirs.entropy(), **tol)
    assert ours.log_prob(v).dtype == dtype
    for attr in ("mean", "variance", "stddev", "mode"):
        if attr == "mode" and name.startswith("uniform"):
            assert np.isnan(ours.mode.cpu().numpy()).all()
            continue
        np.testing.assert_allclose(getattr(ours, attr).detach().cpu().numpy(), getattr(theirs, attr).detach().numpy(),
                                   **tol, equal_nan=True, err_msg=attr)
    if name.startswith("bernoulli"):
        _close(ours.probs, theirs.probs, **tol)
        _close(ours.logits, theirs.logits, **tol)
        total = total + ours.variance.sum()
        ttotal = ttotal + theirs.variance.sum()
    total.backward()
    ttotal.backward()
    for o, t in zip(ours_p, theirs_p):
        np.testing.assert_allclose(o.grad.cpu().numpy(), t.grad.numpy(), **tol)


def test_bernoulli_edges_match_torch(torch, device):
    p = np.array([0.0, 1.0, 0.5])
    ours, theirs = Bernoulli(mdn.tensor(p, device=device)), torch.distributions.Bernoulli(torch.tensor(p))
    _close(ours.entropy(), theirs.entropy())
    _close(ours.logits, theirs.logits)
    v = np.array([0.0, 1.0, 1.0])
    _close(ours.log_prob(mdn.tensor(v, device=device)), theirs.log_prob(torch.tensor(v)))
    np.testing.assert_array_equal(ours.mode.cpu().numpy(), theirs.mode.numpy())
    _close(ours.enumerate_support(), theirs.enumerate_support())
    assert tuple(ours.enumerate_support(expand=False).shape) == (2, 1)


def test_uniform_outside_support_and_cdf(torch, device):
    ours = Uniform(mdn.tensor([0.0, 1.0], device=device), mdn.tensor([2.0, 3.0], device=device), validate_args=False)
    theirs = torch.distributions.Uniform(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0]), validate_args=False)
    v = np.array([[-1.0, 2.0], [2.0, 3.5]], dtype=np.float32)
    _close(ours.log_prob(mdn.tensor(v, device=device)), theirs.log_prob(torch.tensor(v)))
    _close(ours.cdf(mdn.tensor(v, device=device)), theirs.cdf(torch.tensor(v)))
    u = np.array([0.25, 0.5], dtype=np.float32)
    _close(ours.icdf(mdn.tensor(u, device=device)), theirs.icdf(torch.tensor(u)))
    assert ours.support.startswith("Interval(lower_bound=") and Uniform(0.0, 1.0).support == str(
        torch.distributions.Uniform(0.0, 1.0).support)


@pytest.mark.parametrize("kind", ["normal", "uniform", "bernoulli"])
def test_samples_shapes_statistics_and_seeding(device, kind):
    if kind == "normal":
        d = Normal(mdn.tensor([1.0, -2.0], device=device), mdn.tensor([0.5, 2.0], device=device))
    elif kind == "uniform":
        d = Uniform(mdn.tensor([1.0, -2.0], device=device), mdn.tensor([2.0, 4.0], device=device))
    else:
        d = Bernoulli(mdn.tensor([0.2, 0.7], device=device))
    mdn.manual_seed(7)
    s = d.sample((20000,))
    assert tuple(s.shape) == (20000, 2) and s.dtype == np.float32 and not s.requires_grad
    a = s.cpu().numpy()
    np.testing.assert_allclose(a.mean(0), d.mean.detach().cpu().numpy(), atol=0.05)
    np.testing.assert_allclose(a.std(0), d.stddev.detach().cpu().numpy() if kind != "bernoulli"
                               else np.sqrt(d.variance.cpu().numpy()), rtol=0.03)
    if kind == "uniform":
        assert (a >= np.array([1.0, -2.0])).all() and (a < np.array([2.0, 4.0])).all()
    if kind == "bernoulli":
        assert set(np.unique(a)) <= {0.0, 1.0}
    mdn.manual_seed(7)
    np.testing.assert_array_equal(d.sample((20000,)).cpu().numpy(), a)
    assert tuple(d.sample().shape) == (2,)
    assert tuple(d.sample(3).shape) == (3, 2)


def test_rsample_carries_gradients(device):
    loc = mdn.tensor([0.5, -1.0], device=device, requires_grad=True)
    scale = mdn.tensor([2.0, 0.5], device=device, requires_grad=True)
    x = Normal(loc, scale).rsample((4,))
    eps = ((x - loc) / scale).detach()
    x.sum().backward()
    np.testing.assert_allclose(loc.grad.cpu().numpy(), [4.0, 4.0])
    np.testing.assert_allclose(scale.grad.cpu().numpy(), eps.sum(0).cpu().numpy(), rtol=1e-6)
    low = mdn.tensor([0.0], device=device, requires_grad=True)
    high = mdn.tensor([3.0], device=device, requires_grad=True)
    y = Uniform(low, high).rsample((5,))
    u = (y / 3.0).detach()
    y.sum().backward()
    np.testing.assert_allclose(high.grad.cpu().numpy(), u.sum(0).cpu().numpy(), rtol=1e-6)
    np.testing.assert_allclose(low.grad.cpu().numpy(), 5 - u.sum(0).cpu().numpy(), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="rsample"):
        Bernoulli(mdn.tensor([0.3])).rsample()


def test_numbers_as_parameters_and_repr(torch):
    n = Normal(0.0, 1.0)
    assert n.batch_shape == () and n.loc.dtype == np.float32
    assert repr(n) == repr(torch.distributions.Normal(0.0, 1.0))
    assert repr(Normal(mdn.zeros(2), 1.0)) == "Normal(loc: (2,), scale: (2,))"
    assert Normal(mdn.zeros(2, dtype=mdn.float64), 1.0).scale.dtype == np.float64
    assert repr(Uniform(0.0, 2.0)) == repr(torch.distributions.Uniform(0.0, 2.0))
    assert abs(float(Normal(0.0, 1.0).log_prob(mdn.tensor(0.0))) + 0.5 * math.log(2 * math.pi)) < 1e-6


@pytest.mark.parametrize("call,match", [
    (lambda: Normal(mdn.zeros(2), mdn.tensor([1.0, -1.0])),
     r"Expected parameter scale \(Tensor of shape \(2,\)\) of distribution Normal\(loc: \(2,\), scale: \(2,\)\) to "
     r"satisfy the constraint GreaterThan\(lower_bound=0.0\), but found invalid values"),
    (lambda: Normal(mdn.tensor([math.nan]), 1.0), r"parameter loc .* constraint Real\(\)"),
    (lambda: Normal(0.0, 1.0).log_prob(mdn.tensor([math.nan])),
     r"Expected value argument \(Tensor of shape \(1,\)\) to be within the support \(Real\(\)\) of the distribution "
     r"Normal\(loc: 0.0, scale: 1.0\)"),
    (lambda: Normal(mdn.zeros(2), 1.0).log_prob(mdn.zeros(3)),
     r"Value is not broadcastable with batch_shape\+event_shape: \(3,\) vs \(2,\)"),
    (lambda: Normal(0.0, 1.0).log_prob(0.5), r"value argument to log_prob must be a Tensor"),
    (lambda: Bernoulli(mdn.tensor([0.5, 1.5])), r"parameter probs .* Interval\(lower_bound=0.0, upper_bound=1.0\)"),
    (lambda: Bernoulli(mdn.tensor([0.5, 0.2])).log_prob(mdn.tensor([0.5, 1.0])), r"support \(Boolean\(\)\)"),
    (lambda: Bernoulli(), r"Either `probs` or `logits` must be specified, but not both"),
    (lambda: Bernoulli(probs=mdn.tensor(0.5), logits=mdn.tensor(0.0)), r"Either `probs` or `logits`"),
    (lambda: Uniform(mdn.tensor([1.0, 2.0]), mdn.tensor([0.0, 3.0])), r"parameter low .* LessThan"),
    (lambda: Uniform(0.0, 1.0).log_prob(mdn.tensor([2.0])),
     r"support \(Interval\(lower_bound=0.0, upper_bound=1.0\)\)"),
    (lambda: Normal(mdn.zeros(2), mdn.ones(3)), r"\[\(2,\), \(3,\)\] do not broadcast"),
])
def test_validate_args_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_validate_args_false_skips_the_checks():
    assert Normal(0.0, -1.0, validate_args=False).batch_shape == ()
    with np.errstate(invalid="ignore"):             # log of a negative scale: NaN, as in PyTorch
        assert np.isnan(float(Normal(0.0, -1.0, validate_args=False).entropy()))
    b = Bernoulli(mdn.tensor([0.5]), validate_args=False)
    assert np.isfinite(b.log_prob(mdn.tensor([0.5])).numpy()).all()


def test_kl_divergence_matches_torch(torch, device):
    def both(cls, *params):
        ours = getattr(mdn.distributions, cls)(*(mdn.tensor(p, device=device) for p in params))
        theirs = getattr(torch.distributions, cls)(*(torch.tensor(p) for p in params))
        return ours, theirs
    pairs = [
        (both("Normal", [0.0, 1.0], [1.0, 2.0]), both("Normal", [0.5, -1.0], [0.5, 3.0])),
        (both("Bernoulli", [0.0, 0.3, 1.0, 0.5]), both("Bernoulli", [0.2, 0.0, 1.0, 1.0])),
        (both("Uniform", [0.0, 0.0], [1.0, 2.0]), both("Uniform", [-1.0, 0.5], [2.0, 3.0])),
    ]
    for (p, tp), (q, tq) in pairs:
        np.testing.assert_allclose(kl_divergence(p, q).cpu().numpy(), torch.distributions.kl_divergence(tp, tq).numpy(),
                                   rtol=1e-6, atol=1e-7)
    with pytest.raises(NotImplementedError, match="Normal and Uniform"):
        kl_divergence(pairs[0][0][0], pairs[2][0][0])
