"""clip_grad_norm_ / clip_grad_value_: against PyTorch, over flat optimizer buffers and loose gradients."""
import math

import numpy as np
import pytest

import minidnn as mdn
from minidnn import optim
from minidnn.backend import devices as _dev
from minidnn.nn import Parameter
from minidnn.nn.utils import clip_grad_norm_, clip_grad_value_

SHAPES = [(4, 3), (7,), (2, 2, 2)]


def _setup(device, fused_optimizer, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    params = [Parameter(mdn.tensor(rng.standard_normal(s), device=device)) for s in SHAPES]
    opt = optim.SGD(params, lr=0.1) if fused_optimizer else None
    grads = [scale * rng.standard_normal(s) for s in SHAPES]
    loss = None
    for p, g in zip(params, grads):
        term = (p * mdn.tensor(g, dtype=p.dtype, device=device)).sum()
        loss = term if loss is None else loss + term
    loss.backward()
    return params, grads, opt


@pytest.mark.parametrize("fused_optimizer", [True, False])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 3.0, 0.0])
@pytest.mark.parametrize("max_norm", [1.0, 1e4])
def test_clip_grad_norm_matches_pytorch(norm_type, max_norm, fused_optimizer, device):
    torch = pytest.importorskip("torch")
    params, grads, opt = _setup(device, fused_optimizer)
    tparams = [torch.zeros(s, dtype=torch.float32, requires_grad=True) for s in SHAPES]
    for tp, g in zip(tparams, grads):
        tp.grad = torch.tensor(g, dtype=torch.float32)
    total = clip_grad_norm_(params, max_norm, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(tparams, max_norm, norm_type=norm_type)
    assert isinstance(total, mdn.Tensor) and total.device == _dev.device(device)
    assert float(total) == pytest.approx(float(ttotal), rel=1e-5)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-6)
    if fused_optimizer:       # scaled in place: still the flat buffer's views
        (fs,) = opt._flat_sets[0]
        assert all(p.grad.data is fs.grad_views[j] for j, p in enumerate(params))


def test_clip_uses_the_flat_buffer_only_when_every_gradient_is_there(device):
    from minidnn.nn.utils.clip_grad import _grad_arrays
    params, _, opt = _setup(device, True)
    (fs,) = opt._flat_sets[0]
    assert len(_grad_arrays(params)) == 1 and _grad_arrays(params)[0] is fs.grad
    assert len(_grad_arrays(params[:2])) == 2            # a subset: per-tensor
    params[1].grad = None
    assert len(_grad_arrays(params)) == 2


def test_clip_grad_norm_nonfinite(device):
    params, _, _ = _setup(device, True)
    params[0].grad.data[0, 0] = np.inf
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    assert math.isinf(float(clip_grad_norm_(params, 1.0)))


def test_clip_grad_norm_without_grads_returns_zero():
    p = Parameter(mdn.zeros(3))
    assert float(clip_grad_norm_([p], 1.0)) == 0.0


@pytest.mark.parametrize("fused_optimizer", [True, False])
def test_clip_grad_value(fused_optimizer, device):
    params, grads, _ = _setup(device, fused_optimizer)
    clip_grad_value_(params, 0.5)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.numpy(), np.clip(g, -0.5, 0.5).astype(np.float32), rtol=1e-6)
