"""On a GPU: nn's remembered batch-norm calls (nn/_functions/norm.py ``_Remembered``, docs/host_overhead.md round 14)
give the full path's bits.  A small network with the three forms -- conv -> batch norm -> ReLU (the fused BN+ReLU
node), batch norm + a residual -> ReLU (BN+add+ReLU), a plain batch norm -- trains three steps from the same
start with the remembered calls on and off; every forward output, running mean and variance, num_batches_tracked,
every gradient (x, the residual, the conv weight, each batch norm's weight and bias) and an eval-mode forward after
the steps must be bit-identical, over NCHW and channels-last, float32 and bf16 autocast, fusion on and off, the
one-pass and the two-launch kernels; the launches per step are the same, and with the switch on the third step
reaches no batch-norm primitive (the remembered objects served it).  The launches and nodes are checked on the CPU
too (test_bn_fast_path.py)."""
import collections

import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.backend as B  # noqa: E402
from minidnn.backend.cuda import bn_kernels as K  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn._functions import norm as N  # noqa: E402

nn = mdn.nn
_PRIMS = ("batch_normalization_forward_training", "batch_normalization_backward", "batch_normalization_backward_ex")


def _bits(a):
    a = cp.asnumpy(cp.ascontiguousarray(a))
    return a.view(np.uint8).copy() if a.dtype.itemsize else a


def _run(fast, cl, amp, shape, calls):
    N.FAST[0] = fast
    N._REMEMBERED.clear()
    c = shape[1]
    mdn.manual_seed(0)
    conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
    bns = [nn.BatchNorm2d(c) for _ in range(3)]
    model = nn.ModuleList([conv, *bns]).to("cuda")
    x = mdn.randn(*shape).to("cuda")
    z = mdn.randn(*shape).to("cuda")
    w = mdn.randn(*shape).to("cuda")
    if cl:
        model.to(memory_format=mdn.channels_last)
        x, z, w = (t.to(memory_format=mdn.channels_last) for t in (x, z, w))
    x.requires_grad_()
    z.requires_grad_()
    out, launches = [], []
    for step in range(3):
        calls.clear()
        n0 = L.launch_count()
        with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
            h = conv(x)
            r1 = F.relu(bns[0](h))
            r2 = F.relu(bns[1](r1) + z)
            y3 = bns[2](r2)
        # y3's gradient in x's layout (a loss's own backward may hand the plain batch norm dy in another layout on
        # CuPy -- its elementwise outputs follow the first operand -- and such a dy takes the full path by design)
        y3.backward(w.to(y3.dtype))
        launches.append(L.launch_count() - n0)
        out += [r1.data, r2.data, y3.data, x.grad.data, z.grad.data, conv.weight.grad.data]
        for b in bns:
            out += [b.running_mean.data, b.running_var.data, b.num_batches_tracked.data, b.weight.grad.data,
                    b.bias.grad.data]
        x.grad = z.grad = None
        model.zero_grad()
    last = dict(calls)
    model.eval()
    with mdn.no_grad():
        out.append(bns[1](F.relu(bns[0](conv(x)))).data)
    N.FAST[0] = True
    return [_bits(a) for a in out], launches, last


class _Count:
    def __init__(self, monkeypatch):
        self.calls = collections.Counter()
        for name in _PRIMS:
            def counted(*a, _f=getattr(B, name), _n=name, **k):
                self.calls[_n] += 1
                return _f(*a, **k)
            monkeypatch.setattr(B, name, counted)


@pytest.mark.parametrize("shape", [(8, 16, 12, 12), (32, 64, 8, 8)])
@pytest.mark.parametrize("onepass", [True, False])
@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("cl", [False, True])
def test_remembered_calls_give_the_full_paths_bits(cl, amp, fusion, onepass, shape, monkeypatch):
    monkeypatch.setattr(K, "ONEPASS", onepass)
    monkeypatch.setattr(B.cudnn, "fusion", fusion)
    monkeypatch.setattr(N, "TWIN", [False])  # launch for launch: the twin drops the ReLU's (test_twins_cuda.py)
    monkeypatch.setattr(N, "ADD_TWIN", [False])  # (the residual add's twin likewise)
    monkeypatch.setattr(N, "DX_NHWC", [False])  # (and the remembered backward's dx for the conv: test_bn_dx_nhwc*)
    count = _Count(monkeypatch)
    fast, fast_launches, fast_calls = _run(True, cl, amp, shape, count.calls)
    full, full_launches, full_calls = _run(False, cl, amp, shape, count.calls)
    assert fast_launches == full_launches
    assert full_calls["batch_normalization_forward_training"] == 3
    assert fast_calls == {}, "the third step's batch-norm calls are all served by the remembered objects"
    assert len(fast) == len(full)
    for i, (a, b) in enumerate(zip(fast, full)):
        assert a.shape == b.shape and np.array_equal(a, b), f"array {i} differs"
