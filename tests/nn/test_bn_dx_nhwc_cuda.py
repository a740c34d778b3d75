"""On a GPU: batch norm's dx in channels-last memory (nn/_functions/norm.py ``DX_NHWC``, docs/fusion.md) changes no bit
of training.  ResNet-20 (b32, float32 and bfloat16 autocast, NCHW) trains five SGD steps from the same start: with
the switch off and on; every loss,
gradient, parameter and running statistic must be bit-identical, and from the third step on the step launches one
kernel fewer per batch norm whose backward wrote dx channels-last (the convolution after it stages nothing) -- all
18 with the cluster kernels off (bn_bwd1 takes every batch-norm backward), however many bn_bwd1 takes with them on.
A residual block's step captured in a CUDA graph with the switch on replays the eager switch-off step's bits.  The
launches on the CPU: test_bn_dx_nhwc.py; the kernel's bits: tests/backend/test_bn_dx_nhwc.py."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models as MODELS  # noqa: E402
from minidnn.backend.cuda import bn_cluster  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn._functions import norm as N  # noqa: E402


def _bits(t):
    return cp.asnumpy(cp.ascontiguousarray(t.data)).reshape(-1).view(np.uint8).copy()


def _nhwc_calls():
    """Batch-norm backward calls a step makes that write dx channels-last (each remembered layer runs one form)."""
    return sum(bool(c) for e in N._REMEMBERED.values() for c in e.dx_calls)


def _train(on, amp, steps=5):
    N.DX_NHWC[0] = on
    N._REMEMBERED.clear()
    mdn.manual_seed(0)
    model = MODELS.resnet20().to("cuda")
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = mdn.randn(32, 3, 32, 32).to("cuda")
    labels = mdn.tensor(np.arange(32) % 10).to("cuda")
    out, launches = [], []
    for _ in range(steps):
        n0 = L.launch_count()
        with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        out.append(_bits(loss))
        out += [_bits(p.grad) for p in model.parameters()]
        opt.step()
        launches.append(L.launch_count() - n0)
    out += [_bits(p) for p in model.parameters()] + [_bits(b) for b in model.buffers()]
    return out, launches, _nhwc_calls()


@pytest.mark.parametrize("clusters", [False, True], ids=["bn_bwd1", "clusters"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_training_is_bitwise_the_same_with_dx_channels_last(amp, clusters, monkeypatch):
    monkeypatch.setattr(N, "DX_NHWC", [False])
    monkeypatch.setattr(bn_cluster, "ENABLED", clusters)
    off, off_launches, none = _train(False, amp)
    on, on_launches, saved = _train(True, amp)
    assert none == 0 and (saved == 18 if not clusters else 0 <= saved <= 18)
    assert len(on) == len(off)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a.shape == b.shape and np.array_equal(a, b), f"array {i} differs"
    assert [a - b for a, b in zip(off_launches[2:], on_launches[2:])] == [saved] * 3


def _block(on):
    N.DX_NHWC[0] = on
    N._REMEMBERED.clear()
    mdn.manual_seed(0)
    nn = mdn.nn
    block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)).to("cuda")
    opt = mdn.optim.SGD(block.parameters(), lr=0.05, momentum=0.9)
    x = mdn.randn(32, 16, 32, 32, device="cuda")

    def step():
        loss = F.relu(block(x) + x).square().mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
    return block, step


def test_a_captured_step_with_dx_channels_last_replays_the_eager_bits(monkeypatch):
    monkeypatch.setattr(N, "DX_NHWC", [False])
    monkeypatch.setattr(bn_cluster, "ENABLED", False)
    eager, eager_step = _block(False)
    for _ in range(3 + 5):
        eager_step()
    block, step = _block(True)
    s = mdn.cuda.Stream()
    s.wait_stream(mdn.cuda.current_stream())
    with mdn.cuda.stream(s):
        for _ in range(3):
            step()
    mdn.cuda.current_stream().wait_stream(s)
    assert _nhwc_calls() == 2       # both batch norms feed a convolution that stages dy
    g = mdn.cuda.CUDAGraph()
    with mdn.cuda.graph(g):
        step()
    for _ in range(5):
        g.replay()
    mdn.cuda.synchronize()
    for p, q in zip(block.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())
    for p, q in zip(block.buffers(), eager.buffers()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())
