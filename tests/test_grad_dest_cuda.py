"""Gradient destinations on the GPU (minidnn/_grad_dest.py, used by the conv fast path's backward): ResNet-20
trained with them on and off from the same start -- the residual blocks' second input gradients blended into the
pending one by backward data's beta = 1 epilogue, the weights' gradients written into the fused optimizer's flat
buffer.  float32: the same bits as the engine's add and copy; bfloat16 autocast: within one rounding of the
16-bit gradients (the kernel adds in float32 and rounds once)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda
if not _dev.cuda_is_available():
    pytest.skip("needs a GPU with CuPy", allow_module_level=True)

import minidnn as mdn  # noqa: E402
import minidnn._grad_dest as G  # noqa: E402
import minidnn.autograd as A  # noqa: E402
import minidnn.models as M  # noqa: E402
import minidnn.nn.functional as F  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402


@pytest.fixture
def taken(monkeypatch):
    """Counts of the destinations the conv backward used, by beta, and of the engine's copies of a leaf's
    gradient into the optimizer's flat buffer ("copies")."""
    counts = {0.0: 0, 1.0: 0, "copies": 0}      # (and "per step", filled by _train)
    real = C._landed
    real_copy = A._copy_into

    def copy_into(*args):
        counts["copies"] += 1
        return real_copy(*args)
    monkeypatch.setattr(A, "_copy_into", copy_into)

    def landed(result, dest):
        if dest is not None and result is dest[0]:
            counts[dest[1]] += 1
        return real(result, dest)
    monkeypatch.setattr(C, "_landed", landed)
    yield counts
    G.ENABLED[0] = True


def _train(enabled, amp, channels_last=False, steps=3, counts=None):
    """(parameters, gradients) after ``steps`` steps; ``counts`` (the fixture's): each step's leaf copies appended
    to counts["per step"]."""
    G.ENABLED[0] = enabled
    mdn.manual_seed(0)
    model = M.resnet20(num_classes=10).to("cuda")
    x = mdn.randn(16, 3, 32, 32, device="cuda")
    if channels_last:
        model.to(memory_format=mdn.channels_last)
        x = x.to(memory_format=mdn.channels_last)
    y = mdn.randint(0, 10, (16,), device="cuda")
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(steps):
        before = None if counts is None else counts["copies"]
        with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if counts is not None:
            counts.setdefault("per step", []).append(counts["copies"] - before)
    mdn.cuda.synchronize()
    return [p.detach().cpu().numpy().copy() for p in model.parameters()], \
        [p.grad.detach().cpu().numpy().copy() for p in model.parameters()]


def test_fp32_resnet20_same_bits_with_destinations(taken):
    off_p, off_g = _train(False, False, steps=4, counts=taken)
    assert taken[0.0] == taken[1.0] == 0 and taken.pop("per step") == [65] * 4, taken      # 65 parameters
    on_p, on_g = _train(True, False, steps=4, counts=taken)
    # 9 residual blocks' input gradients blended per step (beta 1), every implicit-GEMM conv weight's gradient
    # written into the flat buffer (beta 0); batch norm's weight and bias too once its backward is remembered (the
    # third step: tools/grad_dest_probe.py on an H100), and the linear layer's two from cublasLt's product and its
    # row-sum epilogue, and the stem's direct-kernel conv too (round 21): then nothing is copied
    assert taken[1.0] >= 9 * 3 and taken[0.0] >= 21 * 3, taken
    assert taken["per step"][-2:] == [0, 0], taken
    for a, b in zip(off_p, on_p):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(off_g, on_g):
        np.testing.assert_array_equal(a, b)


def test_bf16_autocast_resnet20_within_a_rounding(taken):
    off_p, off_g = _train(False, True, steps=1)
    on_p, on_g = _train(True, True, steps=1)
    assert taken[1.0] >= 1, taken
    # one rounding of a bf16 sum differs (2^-8 relative) and the difference travels through the layers below it:
    # every gradient within a few bf16 roundings of the engine's, as a whole
    for a, b in zip(off_g, on_g):
        assert np.linalg.norm(b - a) <= 2 ** -5 * np.linalg.norm(a), (np.linalg.norm(b - a), np.linalg.norm(a))


def test_channels_last_unchanged(taken):
    off_p, _ = _train(False, False, channels_last=True, steps=2)
    on_p, _ = _train(True, False, channels_last=True, steps=2)
    for a, b in zip(off_p, on_p):
        np.testing.assert_array_equal(a, b)


def test_bf16_autocast_weights_land_through_the_cast(taken):
    # a conv weight reaches the engine through autocast's cast node, which passes the float32 filter gradient
    # through: its flat-buffer slot is offered through the cast (no copy left, as in fp32; the stem's direct-kernel
    # filter gradient too since round 21)
    _train(True, True, steps=4, counts=taken)
    assert taken["per step"][-2:] == [0, 0], taken
