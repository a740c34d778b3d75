"""The pieces DDP stands on, in one process: Tensor.register_post_accumulate_grad_hook (PyTorch's semantics),
SyncBatchNorm's conversion and its fallback to BatchNorm without a process group, and its function against
BatchNorm when the all-reduce is the identity (one rank)."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.distributed as dist
from minidnn import nn
from minidnn.nn import functional as F
from minidnn.nn.layers.sync_batchnorm import SyncBatchNormFunction


def test_post_accumulate_grad_hook_runs_after_grad_is_written():
    w = mdn.tensor([1.0, 2.0], dtype=mdn.float64, requires_grad=True)
    seen = []
    handle = w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy().copy()))
    (w * w + w * 3).sum().backward()             # w used twice: one accumulation, one call
    (w * 5).sum().backward()                     # accumulates into the existing grad
    assert len(seen) == 2
    np.testing.assert_array_equal(seen[0], [5.0, 7.0])
    np.testing.assert_array_equal(seen[1], [10.0, 12.0])
    mdn.autograd.grad((w * w).sum(), [w])        # autograd.grad writes no .grad: no call
    assert len(seen) == 2
    handle.remove()
    (w * w).sum().backward()
    assert len(seen) == 2
    with pytest.raises(RuntimeError, match="non-leaf"):
        (w * 2).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(RuntimeError, match="does not require grad"):
        mdn.zeros(2).register_post_accumulate_grad_hook(lambda t: None)


def test_convert_sync_batchnorm_shares_parameters_and_buffers():
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(3, affine=False)))
    bn = model[1]
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert converted is model
    assert type(model[1]) is nn.SyncBatchNorm and type(model[2][0]) is nn.SyncBatchNorm
    assert model[1].weight is bn.weight and model[1].running_mean is bn.running_mean
    assert model[2][0].weight is None and not model[2][0].affine
    single = nn.SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm1d(5))
    assert isinstance(single, nn.SyncBatchNorm)


def test_sync_batchnorm_without_a_group_is_batchnorm():
    assert not dist.is_initialized()
    x = mdn.tensor(np.random.default_rng(0).standard_normal((6, 3, 4)))
    a, b = nn.SyncBatchNorm(3).double(), nn.BatchNorm1d(3).double()
    np.testing.assert_allclose(a(x).numpy(), b(x).numpy(), rtol=1e-12)
    np.testing.assert_allclose(a.running_var.numpy(), b.running_var.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="expected at least 2D input"):
        a(mdn.zeros(3))
    with pytest.raises(ValueError, match="input has 4 channels"):
        a(mdn.zeros(2, 4))


@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 5), (2, 3, 4, 4)])
def test_sync_batchnorm_function_equals_batchnorm_on_one_rank(monkeypatch, shape):
    """With the all-reduce the identity the function must be BatchNorm: outputs, all gradients, running stats."""
    monkeypatch.setattr(dist, "_all_reduce_arrays", lambda arrays, op=None, tag=None: None)
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal(shape) * 3 + 2
    w0, b0, gy = rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal(shape)

    def run(fn):
        x, w, b = (mdn.tensor(v, requires_grad=True) for v in (x0, w0, b0))
        rm, rv = mdn.zeros(3, dtype=mdn.float64), mdn.ones(3, dtype=mdn.float64)
        (fn(x, w, b, rm, rv) * mdn.tensor(gy)).sum().backward()
        return [t.numpy() for t in (x.grad, w.grad, b.grad, rm, rv)]
    ours = run(lambda x, w, b, rm, rv: SyncBatchNormFunction.apply(x, w, b, rm, rv, 0.1, 1e-5))
    ref = run(lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5))
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
