"""On a GPU: host round 29's switches (docs/host_overhead.md) give the old path's bits and launches.

``_amp_state.LOWER_READY`` (a settled autocast step's lowered conv / linear calls in one frame by per-parameter
records) and ``_amp_state.REGION_LEAN`` (the region's bookkeeping: its end's flat-buffer count, the kept copy's busy
test over its armed weights): ResNet-20 and MobileNet-small, NCHW and channels-last, bfloat16 autocast (MobileNet
float16 too), four SGD steps from one start (the records serve from the fourth): every parameter and the loss
bit-identical and the same launches a step, both on and both off; with a graph held across regions (the kept copy
busy: a new one made) the same kept copies made and the same bits.  What each call receives, the cache, the
mutations: test_amphost17_ready.py (fake CuPy)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn import _amp_state as S  # noqa: E402
from minidnn.amp import autocast_mode as AM  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402


def _bits(a):
    return np.ascontiguousarray(cp.asnumpy(a)).view(np.uint8).copy()     # (channels-last arrays too)


def _steps(model, dtype, cl, on, hold=False):
    """SGD steps with both switches ``on`` (or off): per step the launches, the parameters' and loss's bits; the
    records' hits; the kept copies made.  Four steps (the first region casts each weight alone, the second makes
    the kept copy, the third the records, which serve the fourth); ``hold``: seven, the fourth step's graph kept
    through the fifth region (its kept weights saved: that region's kept copy is busy, a new one is made and the
    records go; the sixth makes them again, the seventh uses them)."""
    hits, made = [0], [0]
    real_weight, real_init = AM._ready_weight, AM._LowCopy.__init__

    def weight(t, s, low):
        r = real_weight(t, s, low)
        hits[0] += r is not None
        return r

    def init(self, fs, dt):
        made[0] += 1
        real_init(self, fs, dt)
    AM._ready_weight, AM._LowCopy.__init__ = weight, init
    S.LOWER_READY[0] = S.REGION_LEAN[0] = on
    try:
        mdn.manual_seed(0)
        if model == "mobilenet":
            m = mdn.models.MobileNetSmall(num_classes=10, in_channels=3).to("cuda")
        else:
            m = mdn.models.resnet20(num_classes=10).to("cuda")
        x = mdn.randn(32, 3, 32, 32).to("cuda")
        if cl:
            m.to(memory_format=mdn.channels_last)
            x = x.to(memory_format=mdn.channels_last)
        opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        y = mdn.randint(0, 10, (x.shape[0],)).to("cuda")
        seen, counts, held = [], [], None
        for i in range(7 if hold else 4):
            n0 = L.launch_count()
            with mdn.autocast("cuda", dtype=getattr(mdn, dtype)):
                loss = F.cross_entropy(m(x), y)
            if hold and i == 3:
                held = loss             # no backward yet: its graph holds the kept weights
            else:
                opt.zero_grad()
                if held is not None:    # (before the step changes the parameters its graph saved)
                    held.backward()
                    held = None
                loss.backward()
                opt.step()
            counts.append(L.launch_count() - n0)
            seen.append([_bits(p.data) for p in m.parameters()] + [_bits(loss.data)])
    finally:
        AM._ready_weight, AM._LowCopy.__init__ = real_weight, real_init
        S.LOWER_READY[0] = S.REGION_LEAN[0] = True
    return seen, counts, hits[0], made[0]


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("model, dtype", [("resnet20", "bfloat16"), ("mobilenet", "bfloat16"),
                                          ("mobilenet", "float16")])
def test_model_steps_bit_identical_on_and_off(model, dtype, cl):
    mdn.backends.cudnn.deterministic = True         # (tests/conftest.py restores it)
    _steps(model, dtype, cl, True)                  # (a warm-up: the first steps of a signature choose and compile)
    on = _steps(model, dtype, cl, True)
    off = _steps(model, dtype, cl, False)
    assert on[2] > 0 and off[2] == 0                # the records served with the switches on, never off
    assert on[1] == off[1] and on[3] == off[3]      # launches a step, kept copies made
    for a, b in zip(on[0], off[0]):
        for pa, pb in zip(a, b):
            assert np.array_equal(pa, pb)


@pytest.mark.parametrize("model", ["resnet20", "mobilenet"])
def test_held_graph_makes_the_same_kept_copies(model):
    mdn.backends.cudnn.deterministic = True
    _steps(model, "bfloat16", False, True, hold=True)
    on = _steps(model, "bfloat16", False, True, hold=True)
    off = _steps(model, "bfloat16", False, False, hold=True)
    assert on[3] == off[3] == 2 and on[2] > 0 and off[2] == 0     # the busy copy replaced alike
    assert on[1] == off[1]
    for a, b in zip(on[0], off[0]):
        for pa, pb in zip(a, b):
            assert np.array_equal(pa, pb)
