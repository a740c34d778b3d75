"""On a GPU: round 25's host paths (docs/host_overhead.md) give the full path's bits.  The direct kernels' settled
route for depthwise problems and strided backward data (``conv_igemm.DW_SETTLE``): y, dx, dw of depthwise layers
(stride 1 and 2, 3x3 and 5x5, fp32 and bf16 autocast, dw into the optimizer's slot) and of a dense few-channel
strided layer, three calls each, bit-identical with the switch on and off, and MobileNet-small trains three SGD steps
from one start with every parameter bit-identical and the same launches a step; with the switch on the third step
enters no full direct_* function.  The registered reads (``module.REGISTERED_READS``) ride along in the model steps
(on and off alike).  Launches and the settled route's choices are checked on the CPU under the fake CuPy
(test_host25_dw_settle.py, test_host25_registered.py)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.backend.cuda import conv_dw_nhwc as DWN  # noqa: E402
from minidnn.backend.cuda import conv_igemm as CI  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn import module as M  # noqa: E402


def _bits(a):
    return cp.asnumpy(a).view(np.uint8).copy()


@pytest.mark.parametrize("cin,cout,k,stride,groups,hw,amp", [
    (16, 16, 3, 1, 16, 32, False), (32, 32, 3, 2, 32, 32, False), (64, 64, 3, 2, 64, 16, False),
    (8, 8, 5, 1, 8, 15, False), (32, 32, 3, 2, 32, 17, True), (16, 16, 3, 1, 16, 32, True),
    (3, 8, 3, 2, 1, 20, False)])
def test_layer_bits_with_the_settled_route_on_and_off(cin, cout, k, stride, groups, hw, amp):
    res, saved = {}, CI.DW_SETTLE[0]
    for on in (True, False):
        CI.DW_SETTLE[0] = on
        try:
            mdn.manual_seed(0)
            conv = mdn.nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, groups=groups, bias=False).to("cuda")
            opt = mdn.optim.SGD(conv.parameters(), lr=0.1)       # dw into its flat-buffer slot
            out = []
            for i in range(3):
                x = mdn.randn(8, cin, hw, hw).to("cuda").requires_grad_()
                with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
                    y = conv(x)
                opt.zero_grad()
                (y.float() * y.float()).sum().backward()
                out += [_bits(y.data), _bits(x.grad.data), _bits(conv.weight.grad.data)]
            res[on] = out
        finally:
            CI.DW_SETTLE[0] = saved
    for a, b in zip(res[True], res[False]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("amp", [False, True])
def test_mobilenet_steps_bit_identical_with_the_settled_route_on_and_off(amp):
    params, launches, entered = {}, {}, {}
    real, saved = DWN.supports, CI.DW_SETTLE[0]
    calls = [0]

    def counted(*a, **k):
        calls[0] += 1
        return real(*a, **k)
    DWN.supports = counted
    try:
        for on in (True, False):
            CI.DW_SETTLE[0] = on
            M.REGISTERED_READS[0] = on
            mdn.manual_seed(0)
            m = mdn.models.MobileNetSmall(num_classes=10, in_channels=3).to("cuda")
            x = mdn.randn(32, 3, 32, 32).to("cuda")
            opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            y = mdn.randint(0, 10, (x.shape[0],)).to("cuda")
            seen, counts = [], []
            for _ in range(3):
                n0 = L.launch_count()
                calls[0] = 0
                with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
                    loss = F.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                counts.append(L.launch_count() - n0)
                seen.append([_bits(p.data) for p in m.parameters()])
            params[on], launches[on], entered[on] = seen, counts, calls[0]
    finally:
        DWN.supports = real
        CI.DW_SETTLE[0] = saved
        M.REGISTERED_READS[0] = True
    assert launches[True] == launches[False]
    assert entered[True] == 0 and entered[False] >= 12
    for a, b in zip(params[True], params[False]):
        for pa, pb in zip(a, b):
            assert np.array_equal(pa, pb)
