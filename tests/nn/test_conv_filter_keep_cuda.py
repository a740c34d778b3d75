"""On a GPU: the convolution filters' kept KRSC copies (backend/cuda/conv_filter_keep.py) change no bit.
- ``krsc_many`` (one launch refreshing every kept copy) writes each copy bitwise as CuPy's transposing copy, for
  float32 / float16 / bfloat16 / float64 filters of several shapes in one table (grouped, 1x1, 5x5, odd sizes).
- ResNet-20 trains five SGD steps bit-identically with keeping on and off (float32 and bfloat16 autocast), with
  fewer launches a step once the copies are kept.
- A weight changed in place inside a forward (a pre-hook, after the refresh) is seen: every output is the one
  without keeping.
- A step captured in a CUDA graph with keeping on replays the eager (keeping off) step's bits: nothing kept is
  handed out while capturing.
The keeping rule's launches on the CPU: tests/backend/test_conv_filter_keep.py."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.backend.cuda import conv_filter_keep as K  # noqa: E402
from minidnn.backend.cuda import conv_igemm as IG  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402
from minidnn.tensor import Tensor  # noqa: E402
from tests.nn import _gpu_steps as G  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(K, "KEEP", [True])
    K.clear()
    yield
    K.clear()


def _bits(a):
    return cp.asnumpy(cp.ascontiguousarray(a)).reshape(-1).view(np.uint8).copy()


def _dtype(name):
    return np.dtype(pytest.importorskip("ml_dtypes").bfloat16) if name == "bfloat16" else np.dtype(name)


# (float64: nn never keeps one -- conv_igemm stages no 8-byte filter -- but krsc_many moves 8-byte words too)
@pytest.mark.parametrize("dtname", ["float32", "float16", "bfloat16", "float64"])
def test_krsc_many_is_the_transposing_copy(dtname):
    dt = _dtype(dtname)
    rng = np.random.default_rng(1)
    shapes = [(16, 16, 3, 3), (32, 8, 3, 3), (64, 32, 1, 1), (24, 12, 5, 5), (7, 5, 3, 2), (128, 64, 3, 3)]
    owners, calls = [], []
    for s in shapes:
        t = Tensor._from_array(cp.asarray(rng.standard_normal(s).astype(np.float32).astype(dt)))
        k, c = s[:2]
        run = IG._transposer(t.data.reshape(k, c, 1, t.data.size // (k * c))) or \
            (lambda w, d: d.__setitem__(Ellipsis, cp.moveaxis(w, 1, -1)))     # (no prepared transpose)
        owners.append(t)
        calls.append((run, (k, *s[2:], c)))
    for t, (run, shape) in zip(owners, calls):          # met: nothing kept yet
        assert K.krsc(cp, t.data, t, C._keep_state, run, shape) is None
    for t, (run, shape) in zip(owners, calls):          # kept: each copied by its own transpose
        d = K.krsc(cp, t.data, t, C._keep_state, run, shape)
        np.testing.assert_array_equal(_bits(d), _bits(cp.moveaxis(t.data, 1, -1)))
    for t in owners:                                    # new values, in place, seen through the versions
        t.data[...] = cp.asarray(rng.standard_normal(t.shape).astype(np.float32).astype(dt))
        t._version += 1
    n0 = L.launch_count()
    for t, (run, shape) in zip(owners, calls):
        d = K.krsc(cp, t.data, t, C._keep_state, run, shape)
        np.testing.assert_array_equal(_bits(d), _bits(cp.moveaxis(t.data, 1, -1)))
    assert L.launch_count() - n0 == 1                   # one krsc_many for all six


def _train(amp, keep):
    K.KEEP[0] = keep
    K.clear()
    out, launches, _ = G.train(lambda t: _bits(t.data), amp)
    return out, launches


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_resnet20_trains_bitwise_the_same_with_kept_filters(amp):
    off, off_launches = _train(amp, False)
    on, on_launches = _train(amp, True)
    assert len(on) == len(off)
    for i, (a, b) in enumerate(zip(on, off)):
        assert np.array_equal(a, b), f"array {i} differs"
    # a filter is kept from its second call, refreshed from its third (bf16: the kept low-precision weights exist
    # from the second step): from the fourth step the forward's 16 staged 3x3 filters (b16) are one refresh launch
    saved = [a - b for a, b in zip(off_launches[3:], on_launches[3:])]
    assert saved == [saved[0]] * 2 and saved[0] >= 10, (off_launches, on_launches)


def test_an_in_place_change_inside_a_forward_is_seen():
    """The second conv's weight changed in place by a forward pre-hook, after the forward's first conv refreshed
    every kept copy: its version moved, so it refreshes again (without the version check it would take the copy
    made before the change)."""
    def run(keep):
        K.KEEP[0] = keep
        K.clear()
        mdn.manual_seed(0)
        net = mdn.nn.Sequential(mdn.nn.Conv2d(16, 32, 3, padding=1, bias=False), mdn.nn.ReLU(),
                                mdn.nn.Conv2d(32, 32, 3, padding=1, bias=False)).to("cuda")

        def halve(module, inputs):
            with mdn.no_grad():
                module.weight.mul_(0.5)
        net[2].register_forward_pre_hook(halve)
        x = mdn.randn(64, 16, 32, 32).to("cuda")
        return [_bits(net(x).data) for _ in range(5)]
    for a, b in zip(run(True), run(False)):
        np.testing.assert_array_equal(a, b)


def test_a_captured_step_replays_the_eager_bits():
    def block(keep):
        K.KEEP[0] = keep
        K.clear()
        mdn.manual_seed(0)
        nn = mdn.nn
        net = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                            nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)).to("cuda")
        opt = mdn.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        x = mdn.randn(32, 16, 32, 32, device="cuda")

        def step():
            loss = F.relu(net(x) + x).square().mean()
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
        return net, step
    G.assert_replays_like_eager(block, warm=3)
