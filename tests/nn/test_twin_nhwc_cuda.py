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

from minidnn.nn._functions import conv as C  # noqa: E402
from minidnn.nn._functions import norm as N  # noqa: E402
from tests.nn import _gpu_steps as G  # noqa: E402
from tests.nn import _twin_steps as S  # noqa: E402


def _bits(t):
    return cp.asnumpy(cp.ascontiguousarray(t.data)).reshape(-1).view(np.uint8).copy()


def _taken(monkeypatch):
    """Counts the shadows the convolutions take."""
    n = [0]
    real = C._shadow_outcome

    def outcome(node, carry):
        o = node.sh
        n[0] += carry.xshadow is None and o[1] is not None and carry.xs is o[1]
        return real(node, carry)
    monkeypatch.setattr(C, "_shadow_outcome", outcome)
    monkeypatch.setattr(N, "TWIN_NHWC", [True])
    return n


def _train(on, amp, taken):
    N.TWIN_NHWC[0] = on
    N._REMEMBERED.clear()
    counts, last = [], [taken[0]]

    def after_step():       # shadows taken in the step
        counts.append(taken[0] - last[0])
        last[0] = taken[0]
    out, launches, _ = G.train(_bits, amp, after_step=after_step)
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
    monkeypatch.setattr(N, "TWIN", [N.TWIN[0]])         # (residual_block sets it)

    def block(on):
        N.TWIN_NHWC[0] = on
        return S.residual_block("bn", True, False)

    def warmed():
        assert taken[0] == 1, "the fourth warm-up step took the shadow"

    def captured():
        assert taken[0] == 1, "no shadow while capturing"
    G.assert_replays_like_eager(block, warm=4, before_capture=warmed, after_capture=captured)
