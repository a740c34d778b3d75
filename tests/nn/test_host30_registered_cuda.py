"""On a GPU: host round 30's registered reads for layers and blocks (``nn.module.REGISTERED_LAYERS``,
docs/host_overhead.md) give the full path's bits -- ResNet-20 and MobileNet-small, fp32 NCHW and bf16 autocast
channels-last, three SGD steps from one start: every parameter and loss bit-identical and the same launches a step,
on and off.  Which objects the reads return in every shadowing case: test_host30_registered.py (CPU)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn import module as M  # noqa: E402


def _bits(a):
    return np.ascontiguousarray(cp.asnumpy(a)).view(np.uint8).copy()


def steps_on_and_off(model, amp_cl, switches):
    """Three SGD steps of ``model`` (fp32 NCHW, or bf16 autocast channels-last) from one start with every list of
    ``switches`` on, then off: ({on: per step, every parameter's and the loss's bits}, {on: launches per step})."""
    mdn.backends.cudnn.deterministic = True         # (tests/conftest.py restores it)
    params, launches = {}, {}
    try:
        for on in (None, True, False):      # None: one warm-up step (a process's first step makes a few more
            for s in switches:              # launches -- the ticket and kept arrays -- whatever the switches)
                s[0] = on is not False
            mdn.manual_seed(0)
            if model == "mobilenet":
                m = mdn.models.MobileNetSmall(num_classes=10, in_channels=3).to("cuda")
            else:
                m = mdn.models.resnet20(num_classes=10).to("cuda")
            x = mdn.randn(32, 3, 32, 32).to("cuda")
            if amp_cl:
                m.to(memory_format=mdn.channels_last)
                x = x.to(memory_format=mdn.channels_last)
            opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            y = mdn.randint(0, 10, (x.shape[0],)).to("cuda")
            seen, counts = [], []

            def step():
                with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp_cl):
                    loss = F.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                return loss
            for _ in range(1 if on is None else 3):
                n0 = L.launch_count()
                loss = step()       # (a step in a function: its graph goes with it, as in a training loop's)
                counts.append(L.launch_count() - n0)
                seen.append([_bits(p.data) for p in m.parameters()] + [_bits(loss.data)])
                del loss
            params[on], launches[on] = seen, counts
    finally:
        for s in switches:
            s[0] = True
    return params, launches


def assert_same(params, launches):
    assert launches[True] == launches[False]
    for a, b in zip(params[True], params[False]):
        assert len(a) == len(b)
        for pa, pb in zip(a, b):
            assert np.array_equal(pa, pb)


@pytest.mark.parametrize("amp_cl", [False, True], ids=["fp32", "bf16_cl"])
@pytest.mark.parametrize("model", ["resnet20", "mobilenet"])
def test_model_steps_bit_identical_on_and_off(model, amp_cl):
    assert_same(*steps_on_and_off(model, amp_cl, (M.REGISTERED_LAYERS,)))
