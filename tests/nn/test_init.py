"""nn.init: gains and fans against PyTorch's own functions; the statistics of every initialiser."""
import math

import numpy as np
import pytest

import minidnn as mdn
from minidnn import nn
from minidnn.nn import init

FAN_SHAPES = [(2, 3), (4, 3, 5), (8, 4, 3, 3), (2, 3, 2, 2, 2), (1, 7)]


@pytest.mark.parametrize("shape", FAN_SHAPES)
def test_fans_match_torch(shape):
    torch = pytest.importorskip("torch")
    ours = init._calculate_fan_in_and_fan_out(mdn.zeros(*shape))
    assert ours == torch.nn.init._calculate_fan_in_and_fan_out(torch.zeros(shape))


def test_fans_need_two_dims():
    with pytest.raises(ValueError, match=r"fewer than 2 dimensions \(shape \(5,\)\)"):
        init._calculate_fan_in_and_fan_out(mdn.zeros(5))


@pytest.mark.parametrize("nonlinearity,param", [
    ("linear", None), ("conv1d", None), ("conv2d", None), ("conv3d", None), ("conv_transpose2d", None),
    ("sigmoid", None), ("tanh", None), ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2),
    ("leaky_relu", 1), ("leaky_relu", math.sqrt(5)), ("selu", None)])
def test_gain_matches_torch(nonlinearity, param):
    torch = pytest.importorskip("torch")
    assert init.calculate_gain(nonlinearity, param) == pytest.approx(torch.nn.init.calculate_gain(nonlinearity, param))


def test_gain_errors():
    with pytest.raises(ValueError, match="Unsupported nonlinearity gelu"):
        init.calculate_gain("gelu")
    with pytest.raises(ValueError, match="not a valid number"):
        init.calculate_gain("leaky_relu", True)


def _std_ok(arr, expected, rel=0.03):
    assert abs(arr.std() - expected) < rel * expected, (arr.std(), expected)


def test_uniform_normal_constant(device):
    mdn.manual_seed(0)
    t = mdn.empty(200, 300, device=device)
    assert init.uniform_(t, -2.0, 3.0) is t
    a = t.cpu().numpy()
    assert a.min() >= -2.0 and a.max() <= 3.0 and abs(a.mean() - 0.5) < 0.05
    _std_ok(a, 5 / math.sqrt(12))
    a = init.normal_(t, 1.0, 0.5).cpu().numpy()
    assert abs(a.mean() - 1.0) < 0.01
    _std_ok(a, 0.5)
    assert (init.constant_(t, 0.25).cpu().numpy() == 0.25).all()
    assert not init.zeros_(t).cpu().numpy().any()
    assert (init.ones_(t).cpu().numpy() == 1).all()
    np.testing.assert_array_equal(init.eye_(mdn.empty(3, 5, device=device)).cpu().numpy(), np.eye(3, 5))
    with pytest.raises(ValueError, match="2 dimensions"):
        init.eye_(mdn.empty(2, 2, 2))


@pytest.mark.parametrize("shape", [(256, 512), (64, 32, 3, 3)])
@pytest.mark.parametrize("gain", [1.0, 2.0])
def test_xavier(shape, gain):
    w = mdn.empty(*shape)
    fan_in, fan_out = init._calculate_fan_in_and_fan_out(w)
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    a = init.xavier_uniform_(w, gain=gain).numpy()
    assert np.abs(a).max() <= math.sqrt(3) * std
    _std_ok(a, std)
    _std_ok(init.xavier_normal_(w, gain=gain).numpy(), std)


@pytest.mark.parametrize("mode", ["fan_in", "fan_out"])
@pytest.mark.parametrize("nonlinearity,a", [("leaky_relu", 0), ("relu", 0), ("leaky_relu", math.sqrt(5)),
                                            ("tanh", 0)])
def test_kaiming(mode, nonlinearity, a):
    w = mdn.empty(128, 64, 3, 3)
    fan = 64 * 9 if mode == "fan_in" else 128 * 9
    std = init.calculate_gain(nonlinearity, a) / math.sqrt(fan)
    arr = init.kaiming_uniform_(w, a=a, mode=mode, nonlinearity=nonlinearity).numpy()
    assert np.abs(arr).max() <= math.sqrt(3) * std
    _std_ok(arr, std)
    _std_ok(init.kaiming_normal_(w, a=a, mode=mode, nonlinearity=nonlinearity).numpy(), std)


def test_kaiming_errors_and_empty():
    with pytest.raises(ValueError, match="Mode fan_avg not supported"):
        init.kaiming_uniform_(mdn.empty(3, 3), mode="fan_avg")
    with pytest.warns(UserWarning, match="zero-element"):
        init.kaiming_uniform_(mdn.empty(0, 3))


def test_trunc_normal():
    mdn.manual_seed(1)
    t = init.trunc_normal_(mdn.empty(400, 500), mean=0.5, std=1.0, a=-1.0, b=1.5)
    arr = t.numpy()
    assert arr.min() >= -1.0 and arr.max() <= 1.5
    # Moments of the truncated normal (alpha, beta: standardised bounds).
    alpha, beta = -1.5, 1.0
    pdf = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)      # noqa: E731
    z = 0.5 * (math.erf(beta / math.sqrt(2)) - math.erf(alpha / math.sqrt(2)))
    mean = 0.5 + (pdf(alpha) - pdf(beta)) / z
    var = 1 + (alpha * pdf(alpha) - beta * pdf(beta)) / z - ((pdf(alpha) - pdf(beta)) / z) ** 2
    assert abs(arr.mean() - mean) < 0.01
    _std_ok(arr, math.sqrt(var), rel=0.01)
    with pytest.raises(ValueError, match="nearer the mean"):
        init.trunc_normal_(mdn.empty(2), mean=0, std=1, a=10, b=11)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (5, 2, 3)])
def test_orthogonal(shape):
    q = init.orthogonal_(mdn.empty(*shape, dtype=mdn.float64), gain=2.0).numpy().reshape(shape[0], -1)
    small = q @ q.T if q.shape[0] <= q.shape[1] else q.T @ q
    np.testing.assert_allclose(small, 4.0 * np.eye(small.shape[0]), atol=1e-12)


def test_in_place_on_parameters_and_seeded():
    p = nn.Parameter(mdn.zeros(30, 20))
    data = p.data
    mdn.manual_seed(123)
    init.kaiming_normal_(p)
    assert p.data is data and p.grad_fn is None and p.requires_grad   # in place, no graph recorded
    first = p.numpy().copy()
    mdn.manual_seed(123)
    init.kaiming_normal_(p)
    np.testing.assert_array_equal(p.numpy(), first)
    d = init.xavier_uniform_(mdn.empty(8, 8, dtype=mdn.float64))
    assert d.dtype == np.float64
