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


@pytest.mark.parametrize("amp_cl", [False, True], ids=["fp32", "bf16_cl"])
@pytest.mark.parametrize("model", ["resnet20", "mobilenet"])
def test_model_steps_bit_identical_on_and_off(model, amp_cl):
    mdn.backends.cudnn.deterministic = True         # (tests/conftest.py restores it)
    params, launches = {}, {}
    try:
        for on in (True, False):
            M.REGISTERED_LAYERS[0] = on
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
            for _ in range(3):
                n0 = L.launch_count()
                with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp_cl):
                    loss = F.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                counts.append(L.launch_count() - n0)
                seen.append([_bits(p.data) for p in m.parameters()] + [_bits(loss.data)])
            params[on], launches[on] = seen, counts
    finally:
        M.REGISTERED_LAYERS[0] = True
    assert launches[True] == launches[False]
    for a, b in zip(params[True], params[False]):
        assert len(a) == len(b)
        for pa, pb in zip(a, b):
            assert np.array_equal(pa, pb)
