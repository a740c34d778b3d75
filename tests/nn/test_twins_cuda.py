"""On a GPU: the speculative twins (docs/fusion.md) change no bit of training -- batch norm's forward that also
writes relu(y) (nn/_functions/norm.py ``TWIN``) and the residual add that also writes relu(a) (``ADD_TWIN``).
ResNet-20 (both twins) and MobileNet-small (batch norm's) train five SGD steps from the same start with the switch
off and on, and every loss, gradient, parameter and running statistic must be bit-identical; from the third step on
the twin is written and taken at every BN -> ReLU pair (10 in ResNet-20, 9 in MobileNet-small) or residual block (9)
and the step launches that many kernels fewer.  A residual block's step captured in a CUDA graph with the switch on
(the twin taken during the capture) replays the eager switch-off step's bits.  The launches on the CPU:
test_bn_twin.py, test_add_twin.py; the kernels' bits: tests/backend/test_bn_twin.py, test_add_twin.py."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

from tests.nn import _gpu_steps as G  # noqa: E402
from tests.nn import _twin_steps as S  # noqa: E402


def _bits(t):
    return cp.asnumpy(cp.ascontiguousarray(t.data)).reshape(-1).view(np.uint8).copy()


# batch norm's: two combinations a model (tests/backend/test_bn_twin.py covers every dtype and route), its launches
# compared from the fourth step; the add's: ResNet-20 in all four, from the third
@pytest.mark.parametrize("kind, name, amp, cl, start", [
    ("bn", "resnet20", False, False, 3), ("bn", "resnet20", True, True, 3),
    ("bn", "mobilenet", False, False, 3), ("bn", "mobilenet", True, True, 3),
    ("add", "resnet20", False, False, 2), ("add", "resnet20", True, False, 2),
    ("add", "resnet20", False, True, 2), ("add", "resnet20", True, True, 2)],
    ids=["bn-resnet20-fp32_nchw", "bn-resnet20-bf16_cl", "bn-mobilenet-fp32_nchw", "bn-mobilenet-bf16_cl",
         "add-resnet20-fp32_nchw", "add-resnet20-bf16_nchw", "add-resnet20-fp32_cl", "add-resnet20-bf16_cl"])
def test_training_is_bitwise_the_same_with_the_twin(kind, name, amp, cl, start, monkeypatch):
    taken = S.counter(monkeypatch, kind)
    off, off_launches, off_counts = S.train(kind, name, False, amp, cl, taken, _bits)
    on, on_launches, on_counts = S.train(kind, name, True, amp, cl, taken, _bits)
    assert len(on) == len(off)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a.shape == b.shape and np.array_equal(a, b), f"array {i} differs"
    pairs = S.PAIRS[kind][name]
    assert off_counts == [(0, 0)] * 5
    assert on_counts[:2] == [(0, 0)] * 2 and on_counts[2:] == [(pairs, pairs)] * 3
    assert [a - b for a, b in zip(off_launches[start:], on_launches[start:])] == [pairs] * (5 - start)


@pytest.mark.parametrize("kind", list(S.KINDS))
@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
def test_a_captured_step_with_the_twin_replays_the_eager_bits(kind, cl, monkeypatch):
    """The residual block trained with SGD: eager with the twin off, and captured (warm-up on a side stream, then
    mdn.cuda.graph) with it on; 5 steps each, the same parameters."""
    taken = S.counter(monkeypatch, kind)
    before = {}

    def warmed():
        before.update(taken)

    def captured():
        assert taken["written"] - before["written"] == 1 and taken["taken"] - before["taken"] == 1
    G.assert_replays_like_eager(lambda on: S.residual_block(kind, on, cl), warm=3, before_capture=warmed,
                                after_capture=captured)
