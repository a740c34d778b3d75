"""On a GPU: autocast's direct weights and its kept flat copy (session 11) against the cast node per weight and the
fresh copy per region, bit for bit.

For conv2d (NCHW and channels-last, the implicit-GEMM and the direct kernels, stride 2 with groups, depthwise 3x3 at
stride 1 and 2) and linear (with and without bias, 2-D and 3-D input), in bfloat16 and float16 autocast: y, dx, dw,
db with ``_amp_state.DIRECT_WEIGHTS`` off and on are the same bits and dtypes (dw and db float32), on the first call
and on the seen-signature (fast) path; a weight used twice; the gradients landing in a fused optimizer's flat-buffer
slots; MobileNet-small and ResNet-20 (NCHW and channels-last) three SGD steps with the flat-buffer cast bit-identical
parameters (each switch alone and both); a region's graph kept alive across the next region and an optimizer step;
a captured autocast training step against eager; create_graph's gradients and second-order gradients.  The graph
and the CPU half: test_direct_weights.py, test_kept_low_copy.py.
"""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models as M  # noqa: E402
from minidnn import _amp_state  # noqa: E402
from minidnn.amp import autocast_mode  # noqa: E402
from minidnn.autograd import AccumulateGrad  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402

DTYPES = {"bf16": mdn.bfloat16, "fp16": mdn.float16}


@pytest.fixture(autouse=True)
def _deterministic():
    """Bit comparisons need the deterministic filter-gradient kernels: the default handle may take the split-K sums
    by float atomics (ALGO_3), whose bits differ between runs (tests/conftest.py restores the flag)."""
    mdn.backends.cudnn.deterministic = True


@pytest.fixture
def both():
    """both(fn, switch="direct") -> (fn() with the switch off, fn() with it on): autocast's direct weights
    ("direct"), its kept flat copy ("keep"), or both ("all"); the switches restored after."""
    old = _amp_state.DIRECT_WEIGHTS[0], autocast_mode.KEEP_LOW_COPY[0]

    def run(fn, switch="direct"):
        out = []
        for on in (False, True):
            if switch in ("direct", "all"):
                _amp_state.DIRECT_WEIGHTS[0] = on
            if switch in ("keep", "all"):
                autocast_mode.KEEP_LOW_COPY[0] = on
            out.append(fn())
        return out
    yield run
    _amp_state.DIRECT_WEIGHTS[0], autocast_mode.KEEP_LOW_COPY[0] = old


def _same(old, new):
    assert len(old) == len(new)
    for i, (a, b) in enumerate(zip(old, new)):
        if a is None or b is None:
            assert a is None and b is None, i
            continue
        a = a.data if isinstance(a, mdn.Tensor) else a
        b = b.data if isinstance(b, mdn.Tensor) else b
        assert a.dtype == b.dtype and a.shape == b.shape, (i, a.dtype, b.dtype)
        assert np.array_equal(cp.asnumpy(cp.ascontiguousarray(a)).view(np.uint8),
                              cp.asnumpy(cp.ascontiguousarray(b)).view(np.uint8)), f"result {i} differs"


CONVS = [   # (x shape, w shape, kwargs)
    ((8, 3, 32, 32), (16, 3, 3, 3), dict(padding=1)),             # a few-channel stem: the direct kernels
    ((4, 32, 16, 16), (64, 32, 3, 3), dict(padding=1)),           # implicit GEMM
    ((4, 64, 8, 8), (128, 64, 1, 1), {}),                          # 1x1
    ((4, 16, 9, 9), (16, 4, 3, 3), dict(stride=2, padding=1, groups=4)),
    ((8, 32, 16, 16), (32, 1, 3, 3), dict(padding=1, groups=32)),             # depthwise
    ((8, 32, 16, 16), (32, 1, 3, 3), dict(stride=2, padding=1, groups=32)),   # depthwise, stride 2
]


@pytest.mark.parametrize("case", range(len(CONVS)))
@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_conv2d_bits(both, case, cl, dt, bias):
    xs, ws, kw = CONVS[case]

    def run():
        mdn.manual_seed(case)
        x = mdn.randn(*xs).to("cuda")
        w = (mdn.randn(*ws) * 0.2).to("cuda").requires_grad_()
        b = mdn.randn(ws[0]).to("cuda").requires_grad_()
        if cl:
            x = x.to(memory_format=mdn.channels_last)
            w = w.detach().to(memory_format=mdn.channels_last).requires_grad_()
        x.requires_grad_()
        out = []
        for _ in range(3):      # the first call, then the seen-signature path
            x.grad = w.grad = b.grad = None
            with mdn.autocast("cuda", dtype=DTYPES[dt]):
                y = F.conv2d(x, w, b if bias else None, **kw)
            r = mdn.randn(*y.shape).to("cuda")
            (y.float() * r).sum().backward()
            assert w.grad.dtype == np.float32
            out += [y, x.grad, w.grad, b.grad]
        return out
    _same(*both(run))


@pytest.mark.parametrize("lead", [(64,), (4, 16)])
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_linear_bits(both, lead, dt, bias):
    def run():
        mdn.manual_seed(3)
        x = mdn.randn(*lead, 96).to("cuda").requires_grad_()
        w = (mdn.randn(40, 96) * 0.1).to("cuda").requires_grad_()
        b = mdn.randn(40).to("cuda").requires_grad_()
        out = []
        for _ in range(3):
            x.grad = w.grad = b.grad = None
            with mdn.autocast("cuda", dtype=DTYPES[dt]):
                y = F.linear(x, w, b if bias else None)
            (y.float() * y.float().detach()).sum().backward()
            out += [y, x.grad, w.grad, b.grad]
        return out
    _same(*both(run))


@pytest.mark.parametrize("dt", list(DTYPES))
def test_weight_used_twice_and_graph(both, dt):
    def run():
        mdn.manual_seed(4)
        x = mdn.randn(4, 16, 12, 12).to("cuda")
        w = (mdn.randn(16, 16, 3, 3) * 0.1).to("cuda").requires_grad_()
        b = mdn.randn(16).to("cuda").requires_grad_()
        with mdn.autocast("cuda", dtype=DTYPES[dt]):
            y = F.conv2d(F.relu(F.conv2d(x, w, b, padding=1)), w, b, padding=1)
        direct = type(y.grad_fn.next_functions[1][0]) is AccumulateGrad
        assert direct == _amp_state.DIRECT_WEIGHTS[0]
        y.float().square().sum().backward()
        return [y, w.grad, b.grad]
    _same(*both(run))


def _model_steps(name, cl, dt, steps=3):
    mdn.manual_seed(0)
    m = (M.MobileNetSmall(num_classes=10, in_channels=3) if name == "mobilenet" else M.resnet20(num_classes=10))
    m = m.to("cuda")
    x = mdn.randn(16, 3, 32, 32).to("cuda")
    if cl:
        m.to(memory_format=mdn.channels_last)
        x = x.to(memory_format=mdn.channels_last)
    y = mdn.randint(0, 10, (16,)).to("cuda")
    opt = mdn.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    out = []
    for _ in range(steps):      # the flat-buffer cast from the second region on
        with mdn.autocast("cuda", dtype=DTYPES[dt]):
            loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        out += [loss] + [p.grad.clone() for p in m.parameters()]
        opt.step()
    return out + list(m.parameters())


@pytest.mark.parametrize("switch", ["direct", "keep", "all"])
@pytest.mark.parametrize("name", ["mobilenet", "resnet20"])
@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("dt", list(DTYPES))
def test_training_steps_bits(both, name, cl, dt, switch):
    _same(*both(lambda: _model_steps(name, cl, dt), switch))


@pytest.mark.parametrize("dt", list(DTYPES))
def test_kept_copy_not_written_over_while_a_graph_holds_it(both, dt):
    """Region A's graph alive while the optimizer steps and region B runs: A's backward sees A's weights (the kept
    copy is not refilled under it), on the GPU's copy kernels and streams."""
    def run():
        mdn.manual_seed(0)
        nn = mdn.nn     # no batch norm: it saves float32 parameters, whose new versions would raise after the step
        m = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(), nn.Conv2d(16, 32, 1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(32 * 8 * 8, 10)).to("cuda")
        x = mdn.randn(8, 3, 16, 16).to("cuda")
        y = mdn.randint(0, 10, (8,)).to("cuda")
        opt = mdn.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        for _ in range(2):
            with mdn.autocast("cuda", dtype=DTYPES[dt]):
                loss = F.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with mdn.autocast("cuda", dtype=DTYPES[dt]):
            loss_a = F.cross_entropy(m(x), y)
        with mdn.autocast("cuda", dtype=DTYPES[dt]):
            loss_b = F.cross_entropy(m(x * 2), y)
        opt.zero_grad()
        loss_b.backward()
        opt.step()
        opt.zero_grad()
        loss_a.backward()
        return [loss_a, loss_b] + [p.grad.clone() for p in m.parameters()]
    _same(*both(run, "keep"))


def test_kept_copy_sees_views_made_elsewhere():
    """Another op's cast of a parameter (a cast node's output: a fresh CuPy view of the kept copy) kept past its
    region: the next region makes a new copy (busy() sees the view through the copy's refcount: CuPy views hold
    their base) rather than change the kept Tensor's values."""
    old = _amp_state.DIRECT_WEIGHTS[0], autocast_mode.KEEP_LOW_COPY[0]
    _amp_state.DIRECT_WEIGHTS[0] = autocast_mode.KEEP_LOW_COPY[0] = True
    try:
        mdn.manual_seed(0)
        nn = mdn.nn
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 5)).to("cuda")
        opt = mdn.optim.SGD(m.parameters(), lr=0.1)
        x, y = mdn.randn(4, 3, 8, 8).to("cuda"), mdn.randint(0, 5, (4,)).to("cuda")
        kept = before = None
        for step in range(4):
            with mdn.autocast("cuda", dtype=mdn.bfloat16):
                loss = F.cross_entropy(m(x), y)
                if step == 2:
                    mdn.matmul(mdn.ones(1, 5).to("cuda"), m[3].weight)
                    kept = _amp_state._state()["cache"][id(m[3].weight)][2]
                    assert type(kept.grad_fn) is autocast_mode.AutocastCast
                    before = cp.asnumpy(kept.data).copy()
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert kept.data.base is not None
        np.testing.assert_array_equal(cp.asnumpy(kept.data).view(np.uint16), before.view(np.uint16))
    finally:
        _amp_state.DIRECT_WEIGHTS[0], autocast_mode.KEEP_LOW_COPY[0] = old


@pytest.mark.parametrize("dt", list(DTYPES))
def test_captured_autocast_step_equals_eager(dt):
    """A bf16/fp16 autocast training step captured into a CUDA graph (its regions cast afresh from the graph's
    pool while capturing) and replayed equals the eager steps, which use the kept copy."""
    def setup():
        mdn.manual_seed(0)
        m = M.resnet20(num_classes=10).to("cuda")
        opt = mdn.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        x = mdn.randn(8, 3, 32, 32).to("cuda")
        y = mdn.randint(0, 10, (8,)).to("cuda")

        def step():
            with mdn.autocast("cuda", dtype=DTYPES[dt]):
                loss = F.cross_entropy(m(x), y)
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
        return m, step
    eager_m, eager_step = setup()
    m, step = setup()
    s = mdn.cuda.Stream()
    s.wait_stream(mdn.cuda.current_stream())
    with mdn.cuda.stream(s):
        for _ in range(3):
            step()
    mdn.cuda.current_stream().wait_stream(s)
    g = mdn.cuda.CUDAGraph()
    with mdn.cuda.graph(g):
        step()
    for _ in range(3 + 6):
        eager_step()
    for _ in range(6):
        g.replay()
    for _ in range(2):      # eager again after the replays: the kept copy refilled from the replayed parameters
        eager_step()
        step()
    mdn.cuda.synchronize()
    _same(list(eager_m.parameters()), list(m.parameters()))


@pytest.mark.parametrize("dt", list(DTYPES))
def test_create_graph_bits(both, dt):
    def run():
        mdn.manual_seed(5)
        x = mdn.randn(2, 8, 10, 10).to("cuda").requires_grad_()
        w = (mdn.randn(8, 8, 3, 3) * 0.2).to("cuda").requires_grad_()
        b = mdn.randn(8).to("cuda").requires_grad_()
        lw = (mdn.randn(4, 8 * 10 * 10) * 0.05).to("cuda").requires_grad_()
        with mdn.autocast("cuda", dtype=DTYPES[dt]):
            h = F.conv2d(x, w, b, padding=1)
            z = F.linear(h.flatten(1), lw)
        loss = z.float().square().sum()
        gx, gw, gb, glw = mdn.autograd.grad(loss, [x, w, b, lw], create_graph=True)
        assert gw.dtype == gb.dtype == glw.dtype == np.float32
        (gx.square().sum() + gw.square().sum() + gb.sum() + glw.square().sum()).backward()
        return [gx, gw, gb, glw, x.grad, w.grad, b.grad, lw.grad]
    _same(*both(run))
