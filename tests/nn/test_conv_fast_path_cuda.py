"""On a GPU: the fast path of a seen convolution (nn._functions.conv FAST_PATH, backend.convolution's settled calls;
docs/host_overhead.md round 13) gives the bits of the full path -- the forward, both first-order gradients -- over
NCHW and channels-last, strict fp32, TF32 and bfloat16 autocast, stride 2, groups, depthwise, 1x1, a few-channel
layer, conv1d, bias, each gradient pattern and a deterministic handle; the fast path served those calls (and with the
switch off, none); a CUDA-graph capture of a residual block's training step with the fast path on replays the bits
of the eager step with it off.  The launches are checked on the CPU too (test_conv_fast_path.py)."""
import collections

import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.nn.functional as F  # noqa: E402
from minidnn.backend import convolution as CV  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402

# name: (x shape, w shape, stride, padding, groups, bias, channels-last, x grad, w grad, conv1d); the 3x3 dense
# layers are >= 2^25 multiply-adds (the NCHW staging runs)
CASES = {
    "s1": ((32, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, False, False, True, True, False),
    "s2": ((32, 16, 32, 32), (32, 16, 3, 3), 2, 1, 1, False, False, True, True, False),
    "g2": ((32, 32, 32, 32), (32, 16, 3, 3), 1, 1, 2, False, False, True, True, False),
    "dw": ((32, 64, 16, 16), (64, 1, 3, 3), 1, 1, 64, False, False, True, True, False),
    "dw_s2": ((32, 64, 16, 16), (64, 1, 3, 3), 2, 1, 64, False, False, True, True, False),
    "1x1": ((32, 32, 16, 16), (64, 32, 1, 1), 1, 0, 1, False, False, True, True, False),
    "few": ((16, 3, 32, 32), (6, 3, 5, 5), 1, 0, 1, False, False, True, True, False),
    "bias": ((32, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, True, False, True, True, False),
    "cl": ((32, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, False, True, True, True, False),
    "cl_s2": ((32, 16, 32, 32), (32, 16, 3, 3), 2, 1, 1, False, True, True, True, False),
    "cl_dw": ((32, 64, 16, 16), (64, 1, 3, 3), 1, 1, 64, False, True, True, True, False),
    "w_only": ((32, 3, 32, 32), (16, 3, 3, 3), 1, 1, 1, False, False, False, True, False),
    "x_only": ((32, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, False, False, True, False, False),
    "conv1d": ((16, 32, 512), (32, 32, 3), 1, 1, 1, False, False, True, True, True),
}


@pytest.fixture(params=["fp32", "tf32", "bf16_autocast", "deterministic"])
def mode(request):
    old = (mdn.backends.cudnn.allow_tf32, mdn.backends.cudnn.deterministic)
    mdn.backends.cudnn.allow_tf32 = request.param == "tf32"
    mdn.backends.cudnn.deterministic = True if request.param == "deterministic" else None
    yield request.param
    mdn.backends.cudnn.allow_tf32, mdn.backends.cudnn.deterministic = old
    h = mdn.backend.get_default_handle("cuda:0")
    h.deterministic = False
    h.math_type = mdn.backend.MathType.DEFAULT


@pytest.fixture
def served(monkeypatch):
    count = collections.Counter()
    run = CV.SettledConvolution.first       # (run goes through first: each settled call counted once)

    def counted(self, *a, **k):
        count[self.direction] += 1
        return run(self, *a, **k)
    monkeypatch.setattr(CV.SettledConvolution, "first", counted)
    yield count
    C.FAST_PATH[0] = True


def _bits(t):
    a = cp.ascontiguousarray(t.data)
    return a.view(cp.uint32 if a.itemsize == 4 else cp.uint16).get()


def _layer_step(spec, mode, fast, seed):
    """The third of three identical forward + backward calls (the first two compile, plan and settle):
    (y, x.grad, w.grad, bias.grad) as host bit patterns, None where not computed."""
    xs, ws, st, pad, g, bias, cl, xg, wg, one_d = spec
    C.FAST_PATH[0] = fast
    rng = np.random.default_rng(seed)
    x = mdn.tensor(rng.standard_normal(xs).astype(np.float32)).to("cuda")
    if cl:
        x = x.to(memory_format=mdn.channels_last)
    w = mdn.tensor(rng.standard_normal(ws).astype(np.float32)).to("cuda")
    b = mdn.tensor(rng.standard_normal(ws[0]).astype(np.float32)).to("cuda") if bias else None
    x.requires_grad_(xg)
    w.requires_grad_(wg)
    if b is not None:
        b.requires_grad_()
    conv = F.conv1d if one_d else F.conv2d
    gy = None
    for _ in range(3):
        for t in (x, w, b):
            if t is not None:
                t.grad = None
        with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=mode == "bf16_autocast"):
            y = conv(x, w, b, st, pad, 1, g)
        if gy is None:                              # the same gy at every call
            gy = mdn.tensor(rng.standard_normal(y.shape).astype(np.float32)).to("cuda").to(y.dtype)
            if cl:
                gy = gy.to(memory_format=mdn.channels_last)
        y.backward(gy)
    return [None if t is None else _bits(t) for t in (y, x.grad, w.grad, None if b is None else b.grad)]


@pytest.mark.parametrize("name", list(CASES))
def test_the_fast_path_gives_the_full_paths_bits(name, mode, served):
    spec = CASES[name]
    seed = list(CASES).index(name)
    full = _layer_step(spec, mode, False, seed)
    assert not served
    fast = _layer_step(spec, mode, True, seed)
    for a, b, what in zip(full, fast, ("y", "dx", "dw", "db")):
        assert (a is None) == (b is None), what
        if a is not None:
            np.testing.assert_array_equal(a, b, err_msg=f"{name} {mode}: {what}")
    # the fast path served every convolution of the last two calls (the first call of a signature settles it)
    xg, wg = spec[7], spec[8]
    assert served[0] >= 2 and served[1] >= (2 if xg else 0) and served[2] >= (2 if wg else 0)
    assert (served[1] > 0) == xg and (served[2] > 0) == wg


def test_a_captured_block_step_with_the_fast_path_replays_the_eager_full_paths_bits(served):
    """A residual block (conv-bn-relu-conv-bn + x, relu) trained with SGD: eager with the fast path off, and
    captured (warm-up on a side stream, then mdn.cuda.graph) with it on; 5 steps each, the same parameters."""
    def make(fast):
        C.FAST_PATH[0] = fast
        mdn.manual_seed(0)
        nn = mdn.nn
        block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                              nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)).to("cuda")
        opt = mdn.optim.SGD(block.parameters(), lr=0.05, momentum=0.9)
        x = mdn.randn(32, 16, 32, 32, device="cuda")

        def step():
            loss = F.relu(block(x) + x).square().mean()
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
        return block, step

    eager, eager_step = make(False)
    for _ in range(3 + 5):
        eager_step()
    block, step = make(True)
    s = mdn.cuda.Stream()
    s.wait_stream(mdn.cuda.current_stream())
    with mdn.cuda.stream(s):
        for _ in range(3):
            step()
    mdn.cuda.current_stream().wait_stream(s)
    n = sum(served.values())
    g = mdn.cuda.CUDAGraph()
    with mdn.cuda.graph(g):
        step()
    # the captured step's convolutions, all by the fast path: 2 forwards, conv2's data and filter gradients, conv1's
    # filter gradient (its input needs none)
    assert sum(served.values()) - n == 5
    for _ in range(5):
        g.replay()
    mdn.cuda.synchronize()
    for p, q in zip(block.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())
