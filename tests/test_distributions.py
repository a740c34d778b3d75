"""distributions.Categorical against torch.distributions.Categorical: probs/logits derivation, log_prob with
broadcasting, entropy (with -inf logits and zero probs), their gradients, sample shapes and frequencies,
generator reproducibility, errors."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn import distributions as D

torch = pytest.importorskip("torch", reason="PyTorch is the oracle for distributions")
TD = torch.distributions


def _close(a, b, **kw):
    np.testing.assert_allclose(a.detach().cpu().numpy(), b.detach().numpy(), **(kw or dict(rtol=1e-12, atol=1e-14)))


def _params(kind, device, seed=0, shape=(3, 5)):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) if kind == "logits" else rng.random(shape) + 0.05
    if kind == "probs_with_zero":
        x[..., 1] = 0
        kind = "probs"
    if kind == "logits_with_neg_inf":
        x[..., 2] = -np.inf
        kind = "logits"
    a, t = mdn.tensor(x, device=device, requires_grad=True), torch.tensor(x, requires_grad=True)
    return kind, a, t


@pytest.mark.parametrize("kind", ["probs", "logits", "probs_with_zero", "logits_with_neg_inf"])
@pytest.mark.parametrize("shape,value", [((5,), [0, 3, 4]), ((3, 5), [[0, 4, 2], [1, 1, 3]]), ((3, 5), 2),
                                         ((2, 3, 4), [[1], [3]])])
def test_log_prob_entropy_and_gradients_match(kind, shape, value, device):
    if kind.startswith("logits_with") and np.ndim(value) and 2 in np.ravel(value):
        value = np.where(np.asarray(value) == 2, 0, value)        # -inf log-prob has a NaN gradient in both
    k, a, t = _params(kind, device, shape=shape)
    d, td = D.Categorical(**{k: a}), TD.Categorical(**{k: t})
    assert d.batch_shape == tuple(td.batch_shape) and d.event_shape == tuple(td.event_shape)
    assert d.param_shape == tuple(td.param_shape)
    _close(d.probs, td.probs)
    _close(d.logits, td.logits)
    v = np.asarray(value)
    lp, tlp = d.log_prob(mdn.tensor(v, device=device)), td.log_prob(torch.tensor(v))
    _close(lp, tlp)
    ent, tent = d.entropy(), td.entropy()
    _close(ent, tent)
    (lp.sum() + 0.5 * ent.sum()).backward()
    (tlp.sum() + 0.5 * tent.sum()).backward()
    _close(a.grad, t.grad)


def test_sample_shapes_frequencies_and_generator():
    probs = np.array([[0.1, 0.2, 0.7], [0.5, 0.0, 0.5]])
    d = D.Categorical(probs=mdn.tensor(probs))
    assert tuple(d.sample().shape) == (2,) and d.sample().dtype == np.int64
    s = d.sample((20000,)).numpy()
    assert s.shape == (20000, 2)
    freq = np.stack([np.bincount(s[:, i], minlength=3) / s.shape[0] for i in range(2)])
    np.testing.assert_allclose(freq, probs, atol=0.015)
    assert (s[:, 1] != 1).all()
    g1, g2 = mdn.Generator().manual_seed(5), mdn.Generator().manual_seed(5)
    np.testing.assert_array_equal(d.sample((4, 3), generator=g1).numpy(), d.sample((4, 3), generator=g2).numpy())
    mdn.manual_seed(3)
    a = d.sample((7,)).numpy()
    mdn.manual_seed(3)
    np.testing.assert_array_equal(a, d.sample((7,)).numpy())


def test_enumerate_support_mode_and_kl():
    rng = np.random.default_rng(1)
    p, q = rng.random((2, 4)), rng.random((2, 4))
    d, td = D.Categorical(probs=mdn.tensor(p)), TD.Categorical(probs=torch.tensor(p))
    np.testing.assert_array_equal(d.enumerate_support().numpy(), td.enumerate_support().numpy())
    np.testing.assert_array_equal(d.enumerate_support(False).numpy(), td.enumerate_support(False).numpy())
    np.testing.assert_array_equal(d.mode.numpy(), td.mode.numpy())
    kl = D.kl_divergence(d, D.Categorical(probs=mdn.tensor(q)))
    tkl = TD.kl_divergence(td, TD.Categorical(probs=torch.tensor(q)))
    _close(kl, tkl)


@pytest.mark.parametrize("call", [
    lambda m: m.Categorical(),
    lambda m: m.Categorical(probs=m_t(m, [0.5, 0.5]), logits=m_t(m, [0.0, 0.0])),
    lambda m: m.Categorical(probs=m_t(m, [-0.1, 1.1])),
    lambda m: m.Categorical(logits=m_t(m, [0.0, 1.0])).log_prob(m_t(m, [2], True)),
])
def test_errors(call):
    with pytest.raises((ValueError, RuntimeError)):
        call(D)
    with pytest.raises((ValueError, RuntimeError)):
        call(TD)


def m_t(mod, x, integer=False):
    dt = np.int64 if integer else np.float64
    return torch.tensor(np.asarray(x, dt)) if mod is TD else mdn.tensor(np.asarray(x, dt))
