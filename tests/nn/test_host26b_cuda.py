"""On a GPU: host round 26b's switches (docs/host_overhead.md) give the full path's bits.

- ``_amp_state.LOWER_DIRECT_FAST`` (a lowered conv / linear call whose input is in the region's dtype takes its
  float32 weight / bias as the kept flat copy's direct weights without cast_inputs; since round 30 the same list
  as LOWER_READY, whose ``_lower_ready`` is the one shortcut): ResNet-20 and MobileNet-small,
  NCHW and channels-last, bfloat16 autocast (MobileNet float16 too), four SGD steps from one start (the kept copy
  serves from the third): every parameter bit-identical and the same launches a step, on and off.  Which objects
  each call receives, the cast cache and which calls take the shortcut: test_host26b_amp_direct.py (fake CuPy).
- ``pooling.AVGPOOL_CL_BWD`` (average pooling's channels-last backward on a seen signature; off by default until
  round 25b's fake test is moved): dx of three calls bit-identical on and off, channels-last, equal to the float64
  gradient within the dtype's rounding; the channels-last models' steps on = off.
- ``conv_igemm.DW_CL_SETTLE`` (the channels-last depthwise route settled): y, dx, dw of depthwise layers and
  MobileNet-small's channels-last steps on = off."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn import _amp_state as S  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn._functions import pooling as PL  # noqa: E402


def _bits(a):
    return np.ascontiguousarray(cp.asnumpy(a)).view(np.uint8).copy()     # (channels-last arrays too)


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("model, dtype", [("resnet20", "bfloat16"), ("mobilenet", "bfloat16"),
                                          ("mobilenet", "float16")])    # (fp16 once: its kernels compile anew)
def test_model_steps_bit_identical_on_and_off(model, dtype, cl):
    mdn.backends.cudnn.deterministic = True         # (tests/conftest.py restores it)
    params, launches, taken = {}, {}, {}
    real = S._ready
    n = [0]

    def counted(args):
        r = real(args)
        n[0] += r is not None
        return r
    S.set_lower_ready(counted)
    try:
        for on in (True, False):
            S.LOWER_DIRECT_FAST[0] = on
            n[0] = 0
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
            seen, counts = [], []
            for _ in range(4):
                n0 = L.launch_count()
                with mdn.autocast("cuda", dtype=getattr(mdn, dtype)):
                    loss = F.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                counts.append(L.launch_count() - n0)
                seen.append([_bits(p.data) for p in m.parameters()] + [_bits(loss.data)])
            params[on], launches[on], taken[on] = seen, counts, n[0]
    finally:
        S.LOWER_DIRECT_FAST[0] = True
        S.set_lower_ready(real)
    assert taken[False] == 0 and taken[True] > 0
    assert launches[True] == launches[False]
    for a, b in zip(params[True], params[False]):
        for pa, pb in zip(a, b):
            assert np.array_equal(pa, pb)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("pool", ["adaptive1", "adaptive2", "avg2"])
def test_channels_last_avgpool_backward_bits_on_and_off(pool, dtype):
    f = {"adaptive1": lambda t: F.adaptive_avg_pool2d(t, 1), "adaptive2": lambda t: F.adaptive_avg_pool2d(t, 2),
         "avg2": lambda t: F.avg_pool2d(t, 2)}[pool]
    mdn.manual_seed(0)
    x0 = mdn.randn(8, 16, 4, 4)
    g0 = mdn.randn(*f(x0).shape)

    def grad():
        x = x0.to("cuda").to(getattr(mdn, dtype)).to(memory_format=mdn.channels_last).requires_grad_()
        f(x).backward(g0.to("cuda").to(x.dtype))
        assert x.grad.is_contiguous(memory_format=mdn.channels_last)
        return x.grad
    got = {}
    saved = PL.AVGPOOL_CL_BWD[0]
    try:
        for on in (True, False):
            PL.AVGPOOL_CL_BWD[0] = on
            got[on] = [_bits(grad().data) for _ in range(3)]
        PL.AVGPOOL_CL_BWD[0] = True
        g = grad()
    finally:
        PL.AVGPOOL_CL_BWD[0] = saved
    for a, b in zip(got[True], got[False]):
        assert np.array_equal(a, b)
    xr = x0.double().requires_grad_()          # float64 reference: the same pooling's gradient on the CPU
    f(xr).backward(g0.double())
    tol = 1e-6 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(g.float().cpu().numpy(), xr.grad.numpy(), rtol=tol, atol=tol)


def _channels_last_steps_on_and_off(switch, model, amp):
    """Three SGD steps of ``model`` channels-last (bf16 autocast when ``amp``) with the one-element-list ``switch``
    on and off: every step's launches and parameter bits equal."""
    mdn.backends.cudnn.deterministic = True
    got, launches = {}, {}
    saved = switch[0]
    try:
        for on in (True, False):
            switch[0] = on
            mdn.manual_seed(0)
            m = (mdn.models.MobileNetSmall(num_classes=10, in_channels=3) if model == "mobilenet"
                 else mdn.models.resnet20(num_classes=10)).to("cuda").to(memory_format=mdn.channels_last)
            x = mdn.randn(32, 3, 32, 32).to("cuda").to(memory_format=mdn.channels_last)
            y = mdn.randint(0, 10, (32,)).to("cuda")
            opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            seen, counts = [], []
            for _ in range(3):
                n0 = L.launch_count()
                with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
                    loss = F.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                counts.append(L.launch_count() - n0)
                seen.append([_bits(p.data) for p in m.parameters()])
            got[on], launches[on] = seen, counts
    finally:
        switch[0] = saved
    assert launches[True] == launches[False]
    for a, b in zip(got[True], got[False]):
        for pa, pb in zip(a, b):
            assert np.array_equal(pa, pb)


@pytest.mark.parametrize("model", ["resnet20", "mobilenet"])
def test_channels_last_steps_with_avgpool_switch(model):
    _channels_last_steps_on_and_off(PL.AVGPOOL_CL_BWD, model, True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layer", ["s1", "s2", "k5", "w_view"])
def test_channels_last_depthwise_settled_bits_on_and_off(layer, dtype):
    """conv_igemm.DW_CL_SETTLE: y, dx and dw of three calls of a channels-last depthwise layer (autocast for bf16:
    dw in float32) bit-identical with the switch on and off; the settled calls taken on (conv_dw_nhwc.supports asked
    less often than off from the second call)."""
    from minidnn.backend.cuda import conv_dw_nhwc as DWN
    from minidnn.backend.cuda import conv_igemm as CI
    k, stride = (5, 1) if layer == "k5" else (3, 2 if layer == "s2" else 1)
    asked = [0]
    real = DWN.supports

    def counted(*a, **kw):
        asked[0] += 1
        return real(*a, **kw)
    got = {}
    DWN.supports = counted
    try:
        for on in (True, False):
            CI.DW_CL_SETTLE[0] = on
            mdn.manual_seed(0)
            conv = mdn.nn.Conv2d(32, 32, k, stride=stride, padding=k // 2, groups=32, bias=False).to("cuda")
            conv = conv.to(memory_format=mdn.channels_last)
            if layer == "w_view":       # a weight that is not contiguous: the route's copy of it
                conv.weight.data = mdn.randn(32, 1, 4, 3).to("cuda").data[:, :, :3]
            x0 = mdn.randn(16, 32, 16, 16).to("cuda").to(memory_format=mdn.channels_last)
            out = []
            for i in range(3):
                asked[0] = 0 if i == 2 else asked[0]
                x = x0.detach().requires_grad_()
                with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=dtype == "bfloat16"):
                    y = conv(x)
                y.backward(mdn.ones_like(y) * 0.5 + y.detach() * 0.25)
                out.append([_bits(y.data), _bits(x.grad.data), _bits(conv.weight.grad.data)])
                conv.weight.grad = None
            got[on] = (out, asked[0])
    finally:
        DWN.supports = real
        CI.DW_CL_SETTLE[0] = True
    # settled: fewer asks than the full functions' every direction (the filter gradient into a fresh .grad, as here,
    # still takes the full function's test, and the w_view copy's; run 8 on the H200 and the fake: on 1-2, off 2-3)
    assert got[True][1] < got[False][1]
    for a, b in zip(got[True][0], got[False][0]):
        for pa, pb in zip(a, b):
            assert np.array_equal(pa, pb)


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_mobilenet_channels_last_steps_dw_cl_settle(amp):
    from minidnn.backend.cuda import conv_igemm as CI
    _channels_last_steps_on_and_off(CI.DW_CL_SETTLE, "mobilenet", amp)
