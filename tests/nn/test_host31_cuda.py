"""On a GPU: host round 31's cuts (docs/host_overhead.md) give the full path's bits -- the optimizer keeping its
parameters' accumulators (optim.optimizer.HOLD_ACCUMULATORS), the settled backwards' unchecked results
(nn._functions._util.EXACT_GRADS), the convolution's lean key and node (nn._functions.conv.LEAN_CONV), a slot's
gradient kept as .grad (autograd.SLOT_GRAD_AS_IS), handles by GPU number (backend.handle.BY_GPU) and the registry
readers (nn.module.REGISTERED_ATTRS: the models are built anew each way, so "off" builds none).  ResNet-20 and
MobileNet-small, fp32 NCHW and bf16 autocast channels-last, three SGD steps from one start: every parameter and loss
bit-identical and the same launches a step, all on and all off.  The CPU and fake-CuPy checks of each:
test_host31_lean.py, test_host31_attrs.py."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn import autograd as AG  # noqa: E402
from minidnn.backend import handle as H  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn import module as M  # noqa: E402
from minidnn.nn._functions import _util as U  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402
from minidnn.optim import optimizer as O  # noqa: E402

SWITCHES = (O.HOLD_ACCUMULATORS, U.EXACT_GRADS, C.LEAN_CONV, AG.SLOT_GRAD_AS_IS, H.BY_GPU, M.REGISTERED_ATTRS)


def _bits(a):
    return np.ascontiguousarray(cp.asnumpy(a)).view(np.uint8).copy()


@pytest.mark.parametrize("amp_cl", [False, True], ids=["fp32", "bf16_cl"])
@pytest.mark.parametrize("model", ["resnet20", "mobilenet"])
def test_model_steps_bit_identical_on_and_off(model, amp_cl):
    mdn.backends.cudnn.deterministic = True         # (tests/conftest.py restores it)
    params, launches = {}, {}
    try:
        for on in (True, False):
            for s in SWITCHES:
                s[0] = on
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
            for _ in range(3):
                n0 = L.launch_count()
                loss = step()
                counts.append(L.launch_count() - n0)
                seen.append([_bits(p.data) for p in m.parameters()] + [_bits(loss.data)])
                del loss
            params[on], launches[on] = seen, counts
    finally:
        for s in SWITCHES:
            s[0] = True
    assert launches[True] == launches[False]
    for a, b in zip(params[True], params[False]):
        assert len(a) == len(b)
        for pa, pb in zip(a, b):
            assert np.array_equal(pa, pb)
