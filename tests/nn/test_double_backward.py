"""Second derivatives: every activation and softmax/log-softmax, through every binding (x.f(), minidnn.f, F.f),
checked by gradgradcheck in float64 and against PyTorch's double backward (a gradient penalty)."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn.functional as F

ACTIVATIONS = {
    "relu": (lambda m, x: m.relu(x), None),
    "sigmoid": (lambda m, x: m.sigmoid(x), None),
    "tanh": (lambda m, x: m.tanh(x), None),
    "gelu": (lambda m, x: m.gelu(x), None),
    "gelu_tanh": (lambda m, x: m.gelu(x, approximate="tanh"), None),
    "silu": (lambda m, x: m.silu(x), None),
    "elu": (lambda m, x: m.elu(x, alpha=0.7), None),
    "softplus": (lambda m, x: m.softplus(x, beta=1.5), None),
    "leaky_relu": (lambda m, x: m.leaky_relu(x, 0.1), None),
    "hardtanh": (lambda m, x: m.hardtanh(x), None),
    "relu6": (lambda m, x: m.relu6(x * 4), None),
    "softmax": (lambda m, x: m.softmax(x, 1), None),
    "log_softmax": (lambda m, x: m.log_softmax(x, -1), None),
    "max_pool2d": (lambda m, x: m.max_pool2d(x.unsqueeze(0), 2), None),
    "max_pool1d_strided": (lambda m, x: m.max_pool1d(x, 3, 2, 1), None),
    "avg_pool2d": (lambda m, x: m.avg_pool2d(x.unsqueeze(0), 2), None),
    "adaptive_max_pool2d": (lambda m, x: m.adaptive_max_pool2d(x.unsqueeze(0), (2, 3)), None),
    "local_response_norm": (lambda m, x: m.local_response_norm(x.unsqueeze(0), 3, alpha=0.5, k=1.5), None),
    "batch_norm": (lambda m, x: m.batch_norm(x, None, None, training=True), None),
    "layer_norm": (lambda m, x: m.layer_norm(x, (5,)), None),
    "group_norm": (lambda m, x: m.group_norm(x, 2), None),
    "cross_entropy": (lambda m, x: m.cross_entropy(x, _target(m, x)), None),
    "cross_entropy_smooth_sum": (lambda m, x: m.cross_entropy(x, _target(m, x), reduction="sum",
                                                               label_smoothing=0.1), None),
}


def _target(lib, like):
    """The class-index target (3, 5) of the cross-entropy rows, as ``lib``'s tensor on ``like``'s device."""
    idx = np.array([[0, 1, 2, 3, 0], [3, 3, 1, 0, 2], [1, 2, 0, 0, 3]])
    if lib.__name__.startswith("torch"):
        return pytest.importorskip("torch").tensor(idx)
    return mdn.tensor(idx, device=like.device)


def _x(seed=0, shape=(3, 4, 5)):
    return np.random.default_rng(seed).standard_normal(shape) * 2


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_gradgradcheck(name):
    f = ACTIVATIONS[name][0]
    x = mdn.tensor(_x(), dtype=mdn.float64, requires_grad=True)
    assert mdn.autograd.gradgradcheck(lambda t: f(F, t) ** 2, (x,))


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm", "group_norm"])
def test_normalization_second_derivative_wrt_weight_and_bias(norm, affine):
    rng = np.random.default_rng(4)
    x = mdn.tensor(rng.standard_normal((3, 4, 5)), dtype=mdn.float64, requires_grad=True)
    n = 5 if norm == "layer_norm" else 4
    w = mdn.tensor(rng.standard_normal(n) + 1, dtype=mdn.float64, requires_grad=True) if affine else None
    b = mdn.tensor(rng.standard_normal(n), dtype=mdn.float64, requires_grad=True) if affine else None
    call = {"batch_norm": lambda a, *wb: F.batch_norm(a, None, None, *wb, training=True),
            "layer_norm": lambda a, *wb: F.layer_norm(a, (5,), *wb),
            "group_norm": lambda a, *wb: F.group_norm(a, 2, *wb)}[norm]
    inputs = (x, w, b) if affine else (x,)
    assert mdn.autograd.gradgradcheck(lambda *t: call(*t) ** 2, inputs)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_gradient_penalty_matches_torch(name, device):
    """On the GPU the first-order backward runs the CUDA kernels; the penalty's gradient goes through the same
    differentiable formulas as on the CPU."""
    torch = pytest.importorskip("torch")
    f = ACTIVATIONS[name][0]
    a = _x(1)
    x = mdn.tensor(a, dtype=mdn.float64, device=device, requires_grad=True)
    (g,) = mdn.autograd.grad((f(F, x) ** 2).sum(), [x], create_graph=True)
    (g * g).sum().backward()
    xt = torch.tensor(a, requires_grad=True)
    (gt,) = torch.autograd.grad((f(torch.nn.functional, xt) ** 2).sum(), [xt], create_graph=True)
    (gt * gt).sum().backward()
    np.testing.assert_allclose(g.detach().cpu().numpy(), gt.detach().numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(x.grad.cpu().numpy(), xt.grad.numpy(), rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh"])
def test_every_binding_is_the_same_function(name):
    """x.f(), minidnn.f(x) and F.f(x): one Function, bitwise-identical values and gradients (float32)."""
    a = np.random.default_rng(2).standard_normal(10_000).astype(np.float32) * 8
    outs, grads = [], []
    for call in (lambda t: getattr(t, name)(), lambda t: getattr(mdn, name)(t), lambda t: getattr(F, name)(t)):
        x = mdn.tensor(a, requires_grad=True)
        y = call(x)
        y.sum().backward()
        outs.append(y.detach().numpy())
        grads.append(x.grad.numpy())
    for o, g in zip(outs[1:], grads[1:]):
        assert np.array_equal(o, outs[0]) and np.array_equal(g, grads[0])
    x = mdn.tensor(a)
    assert np.array_equal(x.softmax(0).numpy(), F.softmax(x, 0).numpy())
    assert np.array_equal(mdn.log_softmax(x, 0).numpy(), F.log_softmax(x, 0).numpy())


def test_integer_input_becomes_the_default_float():
    x = mdn.tensor([-2, 0, 3])
    assert x.sigmoid().dtype == mdn.float32 and x.tanh().dtype == mdn.float32
    assert mdn.relu(x).dtype == mdn.int64 and F.relu(x).tolist() == [0, 0, 3]     # relu keeps integers


def test_cross_entropy_gradient_penalty_with_masked_logits_matches_torch():
    # a masked class (-inf logit) contributes nothing to the loss, its gradient or the penalty's gradient
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(0).standard_normal((4, 5))
    a[:, 4] = -np.inf
    a[0, 3] = -np.inf
    t = np.array([0, 1, 2, 1])
    x = mdn.tensor(a, dtype=mdn.float64, requires_grad=True)
    (g,) = mdn.autograd.grad(F.cross_entropy(x, mdn.tensor(t)), [x], create_graph=True)
    (g[:, :4] ** 2).sum().backward()
    xt = torch.tensor(a, requires_grad=True)
    (gt,) = torch.autograd.grad(torch.nn.functional.cross_entropy(xt, torch.tensor(t)), [xt], create_graph=True)
    (gt[:, :4] ** 2).sum().backward()
    np.testing.assert_allclose(g.detach().numpy(), gt.detach().numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-15)
    assert np.isfinite(x.grad.numpy()).all()


@pytest.mark.parametrize("kw", [{}, {"reduction": "sum"}, {"reduction": "none"}, {"label_smoothing": 0.2},
                                {"ignore_index": 1, "weight": True}])
def test_fused_cross_entropy_wiring_equals_the_reference(kw, monkeypatch, device):
    """F.cross_entropy's fused path (one softmax-cross-entropy primitive each way; on the GPU its kernels) gives
    the reference path's loss, gradient and second derivative.  On the CPU the path is forced, so the wiring
    (what forward keeps for backward and for the create_graph path) runs through the primitive's reference."""
    from minidnn.nn._functions import loss as L
    rng = np.random.default_rng(3)
    a, t = rng.standard_normal((6, 5, 2)), rng.integers(0, 5, (6, 2))
    kw = dict(kw)
    if kw.pop("weight", False):
        kw["weight"] = mdn.tensor(rng.random(5) + 0.5, dtype=mdn.float64, device=device)
    results = []
    for fused in (False, True):
        monkeypatch.setattr(L, "_fused_cross_entropy",
                            lambda x, tg, w=None, fused=fused: fused and not tg.is_floating_point())
        x = mdn.tensor(a, dtype=mdn.float64, device=device, requires_grad=True)
        loss = F.cross_entropy(x, mdn.tensor(t, device=device), **kw)
        (g,) = mdn.autograd.grad(loss.sum(), [x], create_graph=True)
        (g * g).sum().backward()
        x2 = mdn.tensor(a, dtype=mdn.float64, device=device, requires_grad=True)
        F.cross_entropy(x2, mdn.tensor(t, device=device), **kw).sum().backward()
        results.append([r.detach().cpu().numpy() for r in (loss, g, x.grad, x2.grad)])
    for ref, fused in zip(*results):
        np.testing.assert_allclose(fused, ref, rtol=1e-12, atol=1e-14)
