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

from minidnn.backend.cuda import bn_cluster  # noqa: E402
from minidnn.nn._functions import norm as N  # noqa: E402
from tests.nn import _gpu_steps as G  # noqa: E402
from tests.nn import _twin_steps as S  # noqa: E402


def _bits(t):
    return cp.asnumpy(cp.ascontiguousarray(t.data)).reshape(-1).view(np.uint8).copy()


def _nhwc_calls():
    """Batch-norm backward calls a step makes that write dx channels-last (each remembered layer runs one form)."""
    return sum(bool(c) for e in N._REMEMBERED.values() for c in e.dx_calls)


def _train(on, amp):
    N.DX_NHWC[0] = on
    N._REMEMBERED.clear()
    out, launches, calls = G.train(_bits, amp, batch=32, after_step=_nhwc_calls)   # (while the model
    return out, launches, calls[-1]                                                         # and its entries live)


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


def test_a_captured_step_with_dx_channels_last_replays_the_eager_bits(monkeypatch):
    monkeypatch.setattr(N, "DX_NHWC", [False])
    monkeypatch.setattr(bn_cluster, "ENABLED", False)
    monkeypatch.setattr(N, "TWIN", [N.TWIN[0]])         # (residual_block sets it)

    def block(on):
        N.DX_NHWC[0] = on
        return S.residual_block("bn", False, False)
    G.assert_replays_like_eager(block, warm=3)
