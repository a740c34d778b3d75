"""On a GPU: a model's first training run in a process gives the same bits as its later runs.  A conv signature's
first call is settled at once (nn/_functions/conv.py), so its backward takes the same gradient destinations as later
calls: a 16-bit dx blended into a residual block's pending gradient rounds once, where the engine's add after a fresh
dx rounded twice (session 11: ResNet-20's first bf16 autocast run differed from later ones from layer2.2 back)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models as M  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn._functions import conv as _conv  # noqa: E402


def _run(dtype, cl, batch):
    mdn.manual_seed(0)
    m = M.resnet20(num_classes=10).to("cuda")
    x = mdn.randn(batch, 3, 32, 32).to("cuda")
    if cl:
        m.to(memory_format=mdn.channels_last)
        x = x.to(memory_format=mdn.channels_last)
    y = mdn.randint(0, 10, (batch,)).to("cuda")
    opt = mdn.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    out = []
    for _ in range(2):
        if dtype is None:
            loss = F.cross_entropy(m(x), y)
        else:
            with mdn.autocast("cuda", dtype=dtype):
                loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        out += [loss.data] + [p.grad.data for p in m.parameters()]
        opt.step()
    return [cp.asnumpy(cp.ascontiguousarray(a)) for a in out + [p.data for p in m.parameters()]]


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dtype", [None, "bfloat16", "float16"])
def test_first_run_equals_later_runs(dtype, cl):
    mdn.backends.cudnn.deterministic = True      # (restored by tests/conftest.py)
    _conv._FAST_CONV.clear()                      # this process's first calls of every signature again
    _conv._SEEN_CONV.clear()
    batch = 13                                    # a batch no other test uses: fresh signatures anyway
    dt = None if dtype is None else getattr(mdn, dtype)
    first, second = _run(dt, cl, batch), _run(dt, cl, batch)
    for i, (a, b) in enumerate(zip(first, second)):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"result {i} differs"


@pytest.mark.parametrize("conv", ["conv1d", "conv2d"])
def test_only_the_bias_wants_a_gradient_on_a_seen_signature(conv):
    """Frozen weight, input without grad, trainable bias: every call of a seen signature (settled from the first
    since session 11) gives db = the sum of dy (the settled backward had no x or w to read)."""
    op = getattr(F, conv)
    x = mdn.randn(*((3, 4, 6, 5) if conv == "conv2d" else (2, 3, 9)), device="cuda")
    w = mdn.randn(*((7, 4, 3, 3) if conv == "conv2d" else (5, 3, 2)), device="cuda")
    b = mdn.randn(w.shape[0], device="cuda", requires_grad=True)
    axes = (0, 2, 3) if conv == "conv2d" else (0, 2)
    for _ in range(3):
        b.grad = None
        y = op(x, w, b)
        g = mdn.randn(*y.shape, device="cuda")
        y.backward(g)
        np.testing.assert_allclose(cp.asnumpy(b.grad.data), cp.asnumpy(g.data).sum(axis=axes), rtol=1e-5, atol=1e-4)
