"""On a GPU: the twin's NHWC shadow (nn/_functions/norm.py ``TWIN_NHWC``, docs/fusion.md "The twin's NHWC shadow")
changes no bit of training.  ResNet-20 (b16, NCHW) trains five SGD steps from the same start with the switch off and
on, float32 and bfloat16 autocast: every loss, gradient, parameter and running statistic is bit-identical, from the
fourth step on the convolutions take the shadows (at least the 16 staged 3x3 inputs) and the step launches exactly
that many kernels fewer.  A residual block's step captured in a CUDA graph with the switch on (shadows written and
taken in the eager warm-up, none during the capture) replays the eager switch-off step's bits.  The launches on the
CPU: test_twin_nhwc.py; the kernels' bits: tests/backend/test_twin_nhwc.py."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models as MODELS  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402
from minidnn.nn._functions import norm as N  # noqa: E402
from tests.nn import _twin_steps as S  # noqa: E402


def _bits(t):
    return cp.asnumpy(cp.ascontiguousarray(t.data)).reshape(-1).view(np.uint8).copy()


def _taken(monkeypatch):
    """Counts the shadows the convolutions take."""
    n = [0]
    real = C._shadow_outcome

    def outcome(found, carry):
        o = found[0][found[1]]
        n[0] += carry.xshadow is None and o[1] is not None and carry.xs is o[1]
        return real(found, carry)
    monkeypatch.setattr(C, "_shadow_outcome", outcome)
    monkeypatch.setattr(N, "TWIN_NHWC", [True])
    return n


def _train(on, amp, taken, steps=5):
    N.TWIN_NHWC[0] = on
    N._REMEMBERED.clear()
    mdn.manual_seed(0)
    model = MODELS.resnet20().to("cuda")
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = mdn.randn(16, 3, 32, 32).to("cuda")
    labels = mdn.tensor(np.arange(16) % 10).to("cuda")
    out, launches, counts = [], [], []
    for _ in range(steps):
        n0, t0 = L.launch_count(), taken[0]
        with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        out.append(_bits(loss))
        out += [_bits(p.grad) for p in model.parameters()]
        opt.step()
        launches.append(L.launch_count() - n0)
        counts.append(taken[0] - t0)
    out += [_bits(p) for p in model.parameters()]
    out += [_bits(b) for b in model.buffers()]
    return out, launches, counts


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_training_is_bitwise_the_same_with_the_shadow(amp, monkeypatch):
    taken = _taken(monkeypatch)
    off, off_launches, off_counts = _train(False, amp, taken)
    on, on_launches, on_counts = _train(True, amp, taken)
    assert len(on) == len(off)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a.shape == b.shape and np.array_equal(a, b), f"array {i} differs"
    assert off_counts == [0] * 5 and on_counts[:3] == [0] * 3
    assert on_counts[3] == on_counts[4] >= 16, on_counts
    assert [a - b for a, b in zip(off_launches[3:], on_launches[3:])] == on_counts[3:]


def test_a_captured_step_with_the_shadow_replays_the_eager_bits(monkeypatch):
    taken = _taken(monkeypatch)
    N.TWIN_NHWC[0] = False
    eager, eager_step = S.residual_block("bn", True, False)
    for _ in range(4 + 5):
        eager_step()
    N.TWIN_NHWC[0] = True
    block, step = S.residual_block("bn", True, False)
    s = mdn.cuda.Stream()
    s.wait_stream(mdn.cuda.current_stream())
    with mdn.cuda.stream(s):
        for _ in range(4):
            step()
    mdn.cuda.current_stream().wait_stream(s)
    assert taken[0] == 1, "the fourth warm-up step took the shadow"
    g = mdn.cuda.CUDAGraph()
    with mdn.cuda.graph(g):
        step()
    assert taken[0] == 1, "no shadow while capturing"
    for _ in range(5):
        g.replay()
    mdn.cuda.synchronize()
    for p, q in zip(block.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())
    for p, q in zip(block.buffers(), eager.buffers()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())
