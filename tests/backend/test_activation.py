"""Activations: one table of modes; float64 references written with Python's math, finite differences, PyTorch."""
import math

import numpy as np
import pytest

from minidnn.backend import ActivationDescriptor, ActivationMode, BadParamError, activation_backward, activation_forward
from minidnn.backend._testing import numerical_gradient, to_numpy

M = ActivationMode


def _sig(v):
    return 1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v))


# mode, coef, scalar reference f(v, c), PyTorch equivalent (name, kwargs) or None
TABLE = [
    (M.RELU, None, lambda v, c: max(v, 0.0), ("relu", {})),
    (M.SIGMOID, None, lambda v, c: _sig(v), ("sigmoid", {})),
    (M.TANH, None, lambda v, c: math.tanh(v), ("tanh", {})),
    (M.CLIPPED_RELU, 1.5, lambda v, c: min(max(v, 0.0), c), ("hardtanh", {"min_val": 0.0, "max_val": 1.5})),
    (M.ELU, 0.7, lambda v, c: v if v > 0 else c * (math.exp(v) - 1), ("elu", {"alpha": 0.7})),
    (M.IDENTITY, None, lambda v, c: v, None),
    (M.LEAKY_RELU, 0.2, lambda v, c: v if v > 0 else c * v, ("leaky_relu", {"negative_slope": 0.2})),
    (M.GELU, None, lambda v, c: 0.5 * v * (1 + math.erf(v / math.sqrt(2))), ("gelu", {})),
    (M.GELU_TANH, None, lambda v, c: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))),
     ("gelu", {"approximate": "tanh"})),
    (M.SWISH, None, lambda v, c: v * _sig(c * v), ("silu", {})),
    (M.SWISH, 1.7, lambda v, c: v * _sig(c * v), None),
    (M.SOFTPLUS, 2.0, lambda v, c: math.log1p(math.exp(c * v)) / c, ("softplus", {"beta": 2.0})),
    (M.HARDTANH, None, lambda v, c: min(max(v, -c), c), ("hardtanh", {})),
    (M.RELU6, None, lambda v, c: min(max(v, 0.0), 6.0), ("relu6", {})),
]
IDS = [f"{m.name.lower()}-{c}" for m, c, _, _ in TABLE]


def _x(rng, shape=(2, 3, 4)):
    # spread over [-8, 8] but away from the kinks (0, +-1, 1.5, 6) so finite differences are smooth
    x = rng.uniform(-8, 8, size=shape)
    for kink in (0.0, 1.0, -1.0, 1.5, 6.0):
        x[np.abs(x - kink) < 1e-3] += 0.01
    return x


@pytest.mark.parametrize("mode, coef, ref, _torch", TABLE, ids=IDS)
def test_activation_matches_reference(xp, rng, mode, coef, ref, _torch):
    desc = ActivationDescriptor(mode, coef)
    x = _x(rng)
    xd = xp.asarray(x)
    y = activation_forward(None, desc, xd)
    np.testing.assert_allclose(to_numpy(y), np.vectorize(lambda v: ref(v, desc.coef))(x), rtol=1e-12, atol=1e-14)
    dy = xp.asarray(rng.standard_normal(x.shape))
    dx = activation_backward(None, desc, y, dy, xd)
    num = numerical_gradient(lambda v: (activation_forward(None, desc, v) * dy).sum(), xd)
    np.testing.assert_allclose(to_numpy(dx), num, rtol=1e-6, atol=1e-8)
    # float32 and empty inputs keep their dtype and shape
    x32 = xp.asarray(x.astype(np.float32))
    assert activation_forward(None, desc, x32).dtype == np.float32
    assert activation_backward(None, desc, None, x32, x32).dtype == np.float32
    assert activation_forward(None, desc, xp.zeros((0, 3))).shape == (0, 3)


@pytest.mark.parametrize("mode, coef, ref, torch_fn", [t for t in TABLE if t[3]],
                         ids=[i for i, t in zip(IDS, TABLE) if t[3]])
def test_activation_against_pytorch(rng, mode, coef, ref, torch_fn):
    torch = pytest.importorskip("torch")
    name, kwargs = torch_fn
    fn = getattr(torch, name) if name in ("sigmoid", "tanh") else getattr(torch.nn.functional, name)
    x = _x(rng).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    yt = fn(xt, **kwargs)
    yt.backward(torch.tensor(dy))
    desc = ActivationDescriptor(mode, coef)
    np.testing.assert_allclose(activation_forward(None, desc, x), yt.detach().numpy(), rtol=1.3e-6, atol=1e-5)
    np.testing.assert_allclose(activation_backward(None, desc, None, dy, x), xt.grad.numpy(), rtol=1.3e-6, atol=1e-5)


def test_activation_derivatives_at_kinks_follow_pytorch():
    x = np.array([0.0, 0.0])
    ones = np.ones(2)
    assert activation_backward(None, ActivationDescriptor(M.RELU), None, ones, x).tolist() == [0.0, 0.0]
    assert activation_backward(None, ActivationDescriptor(M.LEAKY_RELU, 0.1), None, ones, x).tolist() == [0.1, 0.1]
    assert activation_forward(None, ActivationDescriptor(M.ELU), np.array([1000.0, -1000.0])).tolist() == [1000.0, -1.0]


@pytest.mark.parametrize("make, match", [
    (lambda: ActivationDescriptor("SELU"), "unknown mode 'SELU'"),
    (lambda: ActivationDescriptor(M.CLIPPED_RELU), "CLIPPED_RELU needs coef"),
    (lambda: ActivationDescriptor(M.SOFTPLUS, 0.0), r"SOFTPLUS needs a finite coef > 0, got 0.0"),
    (lambda: activation_forward(None, "relu", np.ones(3)), "must be an ActivationDescriptor, got str"),
    (lambda: activation_backward(None, ActivationDescriptor(M.RELU), None, np.ones(3), np.ones(4)),
     r"dy has shape \(3,\) but x has shape \(4,\)"),
    (lambda: activation_forward(None, ActivationDescriptor(M.RELU), np.ones(3), beta=1.0),
     "beta=1.0 blends into the existing y, so y must be given"),
])
def test_activation_errors(make, match):
    with pytest.raises(BadParamError, match=match):
        make()
