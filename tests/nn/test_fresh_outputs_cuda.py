"""On a GPU: outputs made on reused pool memory (backend/cuda/workspace.py ``fresh``, session 14).  Training steps of
the example models (float32 NCHW, bfloat16 autocast channels-last) are bit-identical with the reuse on and off; an
output's memory comes back to the next call of its site only when nothing holds it; ``minidnn.cuda``'s
memory_allocated leaves the idle kept memory out, memory_reserved counts it, empty_cache hands it back."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import minidnn as mdn  # noqa: E402
import minidnn.models as M  # noqa: E402
from minidnn.backend.cuda import workspace as W  # noqa: E402

_MODELS = {"resnet20": (lambda: M.resnet20(num_classes=10), (8, 3, 32, 32)),
           "mobilenet": (lambda: M.MobileNetSmall(num_classes=10, in_channels=3), (8, 3, 32, 32)),
           "lenet5": (lambda: M.LeNet5(num_classes=10, in_channels=1, input_size=32), (8, 1, 32, 32))}


@pytest.fixture(autouse=True)
def _deterministic(monkeypatch):
    mdn.backends.cudnn.deterministic = True         # (tests/conftest.py restores it)
    monkeypatch.setattr(W, "RECYCLE", [True])
    W.clear()
    yield
    W.clear()


def _train(name, amp, cl, steps=4):
    make, shape = _MODELS[name]
    mdn.manual_seed(0)
    m = make().to("cuda")
    x = mdn.randn(*shape).to("cuda")
    if cl:
        m, x = m.to(memory_format=mdn.channels_last), x.to(memory_format=mdn.channels_last)
    y = mdn.randint(0, 10, (shape[0],)).to("cuda")
    opt = mdn.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
            loss = mdn.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu().numpy().copy() for p in m.parameters()] + \
        [p.grad.detach().cpu().numpy().copy() for p in m.parameters()]


@pytest.mark.parametrize("name", sorted(_MODELS))
@pytest.mark.parametrize("amp,cl", [(False, False), (True, True)])
def test_training_steps_bit_identical_with_reuse_on_and_off(name, amp, cl):
    runs = []
    for on in (True, False, True):          # (the first run settles every signature; the last reuses its memory)
        W.RECYCLE[0] = on
        runs.append(_train(name, amp, cl))
    (l0, p0), (l1, p1), (l2, p2) = runs
    assert l1 == l2 and len(p1) == len(p2)
    for a, b in zip(p1, p2):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))
    assert W._local.kept_nbytes > 0


def test_memory_comes_back_only_when_free_and_the_counters():
    x = mdn.randn(64, 32, 16, 16).to("cuda")
    f = mdn.nn.functional.relu
    y = f(x)
    p = y.data.data.ptr
    z = f(x)                                 # y alive: other memory
    assert z.data.data.ptr != p
    del y
    base = mdn.cuda.memory_allocated()
    w = f(x)                                 # y's memory, as a new array
    assert w.data.data.ptr == p and mdn.cuda.memory_allocated() == base + w.numel() * 4
    assert np.array_equal(w.cpu().numpy(), np.maximum(x.cpu().numpy(), 0))
    v = w[1:]                                # a view keeps the memory
    del w
    u = f(x)
    assert u.data.data.ptr != p and v.shape == (63, 32, 16, 16)
    del u, v, z
    allocated, reserved = mdn.cuda.memory_allocated(), mdn.cuda.memory_reserved()
    assert allocated == base - 64 * 32 * 16 * 16 * 4 and reserved >= allocated + 2 * 64 * 32 * 16 * 16 * 4
    mdn.cuda.empty_cache()
    assert W._local.kept == {} and mdn.cuda.memory_reserved() < reserved
    assert mdn.cuda.memory_allocated() == allocated
