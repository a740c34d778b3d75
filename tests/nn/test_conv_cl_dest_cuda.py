"""On a GPU: a channels-last ResNet-20 trained three SGD steps with the conv fast path (channels-first settled calls,
backward data blended into the residual block's pending gradient: docs/host_overhead.md round 22) and with it off
(the primitives, the engine's adds) from the same start: float32 parameters bit-identical (the same two values added
once either way), bfloat16 autocast close (the kernel adds in float32 and rounds once); the engine adds one
gradient a step with the fast path on (the loss's root), ten with it off.  The same on CPU under the fake CuPy:
test_conv_cl_dest.py."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.autograd as AG  # noqa: E402
import minidnn.nn.functional as F  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402


def _train(fast, amp, steps=3):
    C.FAST_PATH[0] = fast
    sums = []
    real = AG._add_grads
    def counted(*a):
        sums[-1] += 1
        return real(*a)
    AG._add_grads = counted
    try:
        mdn.manual_seed(0)
        m = mdn.models.resnet20(num_classes=10).to("cuda")
        m.to(memory_format=mdn.channels_last)
        x = mdn.randn(16, 3, 32, 32).to("cuda").to(memory_format=mdn.channels_last)
        y = mdn.randint(0, 10, (16,)).to("cuda")
        opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        for _ in range(steps):
            sums.append(0)
            with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
                loss = F.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return [cp.asnumpy(p.data).astype(np.float64) for p in m.parameters()], sums
    finally:
        AG._add_grads = real
        C.FAST_PATH[0] = True


@pytest.mark.parametrize("amp", [False, True])
def test_channels_last_resnet_steps_with_and_without_the_fast_path(amp):
    on, sums_on = _train(True, amp)
    off, sums_off = _train(False, amp)
    assert sums_on[-1] == 1 and sums_off[-1] == 10
    for a, b in zip(on, off):
        if amp:
            np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-3)
        else:
            assert np.array_equal(a, b)
