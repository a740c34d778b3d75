"""Layers against PyTorch with the same weights: forward, gradients, running statistics, default
initialisation, extra_repr strings and multiply-add counts."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

import minidnn as mdn
from minidnn.nn import layers as L

torch = pytest.importorskip("torch")
TOL = dict(rtol=1.3e-6, atol=1e-5)


def _copy_from_torch(ours, theirs):
    """Copy every parameter and buffer of the torch module into ours, by name."""
    state = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    mine = dict(ours.named_parameters())
    mine.update({k: v for k, v in ours.named_buffers() if v is not None})
    assert set(state) == set(mine), (set(state) ^ set(mine))
    with mdn.no_grad():
        for k, v in state.items():
            mine[k].copy_(mdn.tensor(v))      # copy_ crosses devices explicitly (host -> GPU)


def _same_repr(ours, theirs):
    """extra_repr equal to torch's, allowing for the ``bias=`` that torch 2.13 added to the norm layers
    (the GPU machine's torch 2.11 prints without it)."""
    a, b = ours.extra_repr(), theirs.extra_repr()
    if "bias=" not in b:
        a = re.sub(r", bias=(True|False)", "", a)
    assert a == b


def _close(ours, theirs, **tol):
    np.testing.assert_allclose(np.asarray(ours.numpy() if hasattr(ours, "numpy") else ours),
                               theirs.detach().numpy(), **(tol or TOL))


def _run_both(ours, theirs, x, device, train=True):
    """Forward and backward through both modules with one upstream gradient; compares y, dx and every
    parameter gradient."""
    ours.train(train)
    theirs.train(train)
    xm = mdn.tensor(x, device=device, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    y, yt = ours(xm), theirs(xt)
    _close(y.cpu(), yt)
    gy = np.random.default_rng(5).standard_normal(yt.shape).astype(x.dtype)
    y.backward(mdn.tensor(gy, device=device))
    yt.backward(torch.from_numpy(gy))
    _close(xm.grad.cpu(), xt.grad)
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        _close(p.grad.cpu(), theirs_params[name].grad)


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name, args, kwargs, shape", [
    ("Conv1d", (3, 4, 3), dict(stride=2, padding=1), (2, 3, 9)),
    ("Conv2d", (3, 8, 3), dict(padding=1), (2, 3, 6, 6)),
    ("Conv2d", (4, 6, (3, 2)), dict(stride=2, dilation=(1, 2), groups=2, bias=False), (2, 4, 7, 7)),
    ("Conv2d", (4, 4, 3), dict(groups=4, padding="same"), (1, 4, 5, 5)),
    ("Conv3d", (2, 3, 2), dict(padding=1), (1, 2, 3, 4, 4)),
    ("ConvTranspose1d", (3, 2, 3), dict(stride=2), (2, 3, 4)),
    ("ConvTranspose2d", (4, 6, 3), dict(stride=2, padding=1, output_padding=1, groups=2), (2, 4, 3, 3)),
    ("ConvTranspose3d", (2, 2, 2), dict(stride=2, bias=False), (1, 2, 2, 2, 2)),
])
def test_conv_layers_match_torch(name, args, kwargs, shape, device):
    ours = getattr(L, name)(*args, **kwargs).to(device)
    theirs = getattr(torch.nn, name)(*args, **kwargs)
    _copy_from_torch(ours, theirs)
    _run_both(ours, theirs, _x(*shape), device)
    _same_repr(ours, theirs)


@pytest.mark.parametrize("name, kwargs, shape", [
    ("BatchNorm2d", dict(), (4, 3, 5, 5)),
    ("BatchNorm2d", dict(momentum=None), (4, 3, 2, 2)),
    ("BatchNorm1d", dict(momentum=0.3, eps=1e-3), (6, 3)),
    ("BatchNorm1d", dict(affine=False), (4, 3, 5)),
    ("BatchNorm3d", dict(), (2, 3, 2, 2, 2)),
    ("BatchNorm2d", dict(track_running_stats=False), (4, 3, 2, 2)),
])
def test_batchnorm_running_stats_after_steps_match_torch(name, kwargs, shape, device):
    ours = getattr(L, name)(3, **kwargs).to(device)
    theirs = getattr(torch.nn, name)(3, **kwargs)
    for step in range(4):       # training steps on shifted, scaled batches move the running statistics
        x = _x(*shape, seed=step) * (1 + step) + step
        _run_both(ours, theirs, x, device, train=True)
    for buf_name, buf in theirs.named_buffers():
        mine = getattr(ours, buf_name)
        np.testing.assert_allclose(mine.cpu().numpy(), buf.numpy(), rtol=1e-5, atol=1e-6, err_msg=buf_name)
    _run_both(ours, theirs, _x(*shape, seed=9) + 1, device, train=False)       # eval: the running statistics
    _same_repr(ours, theirs)


@pytest.mark.parametrize("ctor, shape", [
    (lambda nn: nn.LayerNorm(5), (3, 5)),
    (lambda nn: nn.LayerNorm((3, 4), eps=1e-3, elementwise_affine=False), (2, 3, 4)),
    (lambda nn: nn.LayerNorm((4,), bias=False), (2, 3, 4)),
    (lambda nn: nn.GroupNorm(2, 6), (2, 6, 3, 3)),
    (lambda nn: nn.GroupNorm(3, 3, affine=False), (2, 3, 4)),
    (lambda nn: nn.LocalResponseNorm(3, alpha=0.1, k=2.0), (2, 5, 3, 3)),
])
def test_norm_layers_match_torch(ctor, shape, device):
    ours, theirs = ctor(L).to(device), ctor(torch.nn)
    with torch.no_grad():
        for p in theirs.parameters():       # non-trivial affine parameters
            p.add_(torch.randn(p.shape) * 0.5)
    _copy_from_torch(ours, theirs)
    _run_both(ours, theirs, _x(*shape), device)
    _same_repr(ours, theirs)


@pytest.mark.parametrize("ctor, shape", [
    (lambda nn: nn.MaxPool2d(3, 2, 1), (2, 3, 7, 7)),
    (lambda nn: nn.MaxPool1d(2), (2, 3, 8)),
    (lambda nn: nn.MaxPool2d(2, ceil_mode=True), (1, 2, 5, 5)),
    (lambda nn: nn.AvgPool2d(3, 2, 1, count_include_pad=False), (2, 3, 7, 7)),
    (lambda nn: nn.AvgPool1d(3, 2, 1), (2, 3, 8)),
    (lambda nn: nn.AdaptiveAvgPool2d((1, 1)), (2, 3, 4, 4)),
    (lambda nn: nn.AdaptiveAvgPool2d(3), (2, 3, 5, 7)),
    (lambda nn: nn.AdaptiveMaxPool2d(2), (2, 3, 4, 4)),
    (lambda nn: nn.ReLU(), (3, 4)),
    (lambda nn: nn.ReLU6(), (3, 4)),
    (lambda nn: nn.LeakyReLU(0.1), (3, 4)),
    (lambda nn: nn.ELU(alpha=0.5), (3, 4)),
    (lambda nn: nn.GELU(approximate="tanh"), (3, 4)),
    (lambda nn: nn.SiLU(), (3, 4)),
    (lambda nn: nn.Sigmoid(), (3, 4)),
    (lambda nn: nn.Tanh(), (3, 4)),
    (lambda nn: nn.Hardtanh(-2.0, 2.0), (3, 4)),
    (lambda nn: nn.Softplus(beta=2, threshold=10), (3, 4)),
    (lambda nn: nn.Softmax(dim=1), (3, 4)),
    (lambda nn: nn.LogSoftmax(dim=-1), (3, 4)),
])
def test_parameter_free_layers_match_torch(ctor, shape, device):
    ours, theirs = ctor(L).to(device), ctor(torch.nn)
    _run_both(ours, theirs, _x(*shape) * 3, device)
    _same_repr(ours, theirs)


@pytest.mark.parametrize("ctor", [lambda nn: nn.ReLU(inplace=True), lambda nn: nn.ReLU6(inplace=True),
                                  lambda nn: nn.Hardtanh(0.0, 2.0, inplace=True), lambda nn: nn.LeakyReLU(inplace=True),
                                  lambda nn: nn.ELU(inplace=True), lambda nn: nn.SiLU(inplace=True),
                                  lambda nn: nn.MaxPool2d((2, 3), (1, 2))])
def test_extra_repr_matches_torch(ctor):
    _same_repr(ctor(L), ctor(torch.nn))


def _targets(kind, shape, seed=3):
    rng = np.random.default_rng(seed)
    if kind == "index":
        return rng.integers(0, shape[1], (shape[0],) + shape[2:])
    if kind == "prob01":
        return rng.uniform(0.05, 0.95, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("ctor, target_kind, squash", [
    (lambda nn, w: nn.CrossEntropyLoss(), "index", False),
    (lambda nn, w: nn.CrossEntropyLoss(weight=w, label_smoothing=0.1, ignore_index=2), "index", False),
    (lambda nn, w: nn.NLLLoss(weight=w, reduction="sum"), "index", False),
    (lambda nn, w: nn.MSELoss(), "real", False),
    (lambda nn, w: nn.L1Loss(reduction="none"), "real", False),
    (lambda nn, w: nn.SmoothL1Loss(beta=0.5), "real", False),
    (lambda nn, w: nn.BCELoss(), "prob01", True),
    (lambda nn, w: nn.BCEWithLogitsLoss(pos_weight=w), "prob01", False),
])
def test_loss_layers_match_torch(ctor, target_kind, squash, device):
    shape = (6, 4)
    w = np.random.default_rng(4).uniform(0.5, 2, 4).astype(np.float32)
    ours = ctor(L, mdn.tensor(w, device=device))
    theirs = ctor(torch.nn, torch.from_numpy(w))
    x, t = _x(*shape), _targets(target_kind, shape)
    if squash:
        x = 1 / (1 + np.exp(-x))
    xm = mdn.tensor(x, device=device, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    y, yt = ours(xm, mdn.tensor(t, device=device)), theirs(xt, torch.from_numpy(t))
    _close(y.cpu(), yt)
    y.sum().backward()
    yt.sum().backward()
    _close(xm.grad.cpu(), xt.grad)
    assert repr(ours) == repr(theirs)


def test_dropout_layers_train_and_eval(device):
    x = mdn.ones(50, 40, 2, 2, device=device)
    for layer in (L.Dropout(0.25), L.Dropout2d(0.25)):
        y = layer(x).numpy()
        assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)} and 0.15 < (y == 0).mean() < 0.35
        layer.eval()
        assert layer(x) is x
    assert L.Dropout(0.2).extra_repr() == torch.nn.Dropout(0.2).extra_repr()
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        L.Dropout(1.5)


# ---- default initialisation (PyTorch's rules) ---------------------------------------------------------

def test_conv_default_init_statistics():
    mdn.manual_seed(0)
    conv = L.Conv2d(64, 128, 3)         # fan_in = 64 * 9 = 576; bound 1/sqrt(576) = 1/24 for weight and bias
    bound = 1 / math.sqrt(64 * 9)
    w, b = conv.weight.numpy(), conv.bias.numpy()
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.01 * bound       # uniform(-a, a) has std a / sqrt(3)
    assert abs(w.mean()) < 0.01 * bound
    t = L.ConvTranspose2d(16, 32, 3, groups=2)       # fan_in from weight (16, 16, 3, 3): 16 * 9
    assert np.abs(t.weight.numpy()).max() <= 1 / math.sqrt(16 * 9)
    assert t.weight.shape == (16, 16, 3, 3)


def test_norm_default_init():
    bn = L.BatchNorm2d(5)
    assert (bn.weight.numpy() == 1).all() and (bn.bias.numpy() == 0).all()
    assert (bn.running_mean.numpy() == 0).all() and (bn.running_var.numpy() == 1).all()
    assert bn.num_batches_tracked.item() == 0 and bn.num_batches_tracked.dtype == np.int64
    assert list(dict(bn.state_dict())) == list(torch.nn.BatchNorm2d(5).state_dict())
    assert L.BatchNorm2d(5, affine=False, track_running_stats=False).running_mean is None
    assert list(dict(L.LayerNorm(4).named_parameters())) == ["weight", "bias"]


# ---- multiply-adds for summary ---------------------------------------------------------------------------

def test_macs():
    x = mdn.randn(2, 4, 8, 8)
    conv = L.Conv2d(4, 6, 3, padding=1, groups=2)
    y = conv(x)
    assert conv._macs(x, y) == y.numel() * 2 * 9
    t = L.ConvTranspose2d(4, 6, 3, stride=2)
    assert t._macs(x, t(x)) == x.numel() * 6 * 9
    bn = L.BatchNorm2d(4)
    assert bn._macs(x, bn(x)) == x.numel()
    pool = L.MaxPool2d(2)
    assert pool._macs(x, pool(x)) == 2 * 4 * 4 * 4 * 4
