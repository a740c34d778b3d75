"""On a GPU: the scratch buffers of backend/cuda/workspace.py (docs/host_overhead.md round 9) change no bits.
Convolutions (staged forward, backward data, split-K backward filter, the first-order nn backward in a shared-
staging scope) and batch norm (one-pass and two-launch kernels, forward and backward) over shapes that change
between calls (A, B, A, B: the buffers grow, are reused by smaller calls, and are reused after another shape)
equal, bit for bit, the same calls with the cache off (every buffer fresh); a captured step replays the eager bits
while the cache holds eager buffers; ``pair``'s arrays are separate arrays (base None, own data, disjoint, in-place
updates independent).  The CPU side: test_workspace.py."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.backend import ConvolutionDescriptor  # noqa: E402
from minidnn.backend import convolution_backward_data as bwd_data  # noqa: E402
from minidnn.backend import convolution_backward_filter as bwd_filter  # noqa: E402
from minidnn.backend import convolution_forward as fwd  # noqa: E402
from minidnn.backend.cuda import bn_kernels as BK  # noqa: E402
from minidnn.backend.cuda import workspace as W  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402

CONV = [((32, 16, 32, 32), (16, 16, 3, 3)), ((64, 32, 16, 16), (32, 32, 3, 3)), ((16, 64, 8, 8), (64, 64, 3, 3))]
BN = [(32, 16, 32, 32), (64, 64, 8, 8), (8, 32, 16, 16)]


def _bits(a):
    return cp.asnumpy(cp.ascontiguousarray(a)).view(np.uint8)


def _conv_run(xs, ws, seed):
    rs = cp.random.RandomState(seed)
    x, w = rs.standard_normal(xs, dtype=np.float32), rs.standard_normal(ws, dtype=np.float32)
    d = ConvolutionDescriptor((1, 1))
    y = fwd(None, x, w, d)
    dx = bwd_data(None, w, y, d, xs)
    dw = bwd_filter(None, x, y, d, ws)
    xt, wt = mdn.Tensor._from_array(x), mdn.Tensor._from_array(w)
    xt.requires_grad = wt.requires_grad = True
    yt = F.conv2d(xt, wt, padding=1)
    yt.backward(mdn.Tensor._from_array(y))
    return [_bits(a) for a in (y, dx, dw, xt.grad.data, wt.grad.data)]


def _bn_run(shape, seed):
    rs = cp.random.RandomState(seed)
    x = rs.standard_normal(shape, dtype=np.float32)
    dy = rs.standard_normal(shape, dtype=np.float32)
    c = shape[1]
    scale, bias = rs.standard_normal((c,), dtype=np.float32), rs.standard_normal((c,), dtype=np.float32)
    rm, rv = cp.zeros((c,), np.float32), cp.ones((c,), np.float32)
    y, mean, inv = BK.forward_training(x, scale, bias, 0.1, rm, rv, 1e-5, relu=True)
    dx, dz, ds, db = BK.backward(x, dy, scale, mean, inv, y=y, want_dz=True)
    return [_bits(a) for a in (y, mean, inv, rm, rv, dx, dz, ds, db)]


def _both(run, cases, monkeypatch):
    order = [cases[i % len(cases)] for i in range(2 * len(cases))] + list(reversed(cases))
    monkeypatch.setattr(W, "ENABLED", [False])
    W.clear()
    fresh = [run(c, i) for i, c in enumerate(order)]
    monkeypatch.setattr(W, "ENABLED", [True])
    W.clear()
    cached = [run(c, i) for i, c in enumerate(order)]
    assert W.cached_bytes() > 0
    for i, (a, b) in enumerate(zip(fresh, cached)):
        for j, (u, v) in enumerate(zip(a, b)):
            assert np.array_equal(u, v), (order[i], j)


def test_conv_bits_with_and_without_the_cache(monkeypatch):
    _both(lambda c, i: _conv_run(*c, i), CONV, monkeypatch)


@pytest.mark.parametrize("onepass", [True, False])
def test_bn_bits_with_and_without_the_cache(monkeypatch, onepass):
    monkeypatch.setattr(BK, "ONEPASS", onepass)
    _both(_bn_run, BN, monkeypatch)


def test_channels_last_bn_with_and_without_the_cache(monkeypatch):
    def run(shape, seed):
        rs = cp.random.RandomState(seed)
        n, c, h, w = shape
        x = rs.standard_normal((n, h, w, c), dtype=np.float32).transpose(0, 3, 1, 2)
        dy = cp.ascontiguousarray(rs.standard_normal((n, h, w, c), dtype=np.float32)).transpose(0, 3, 1, 2)
        sc = cp.ones((c,), np.float32)
        y, m, i = BK.forward_training(x, sc, sc, 0.1, None, None, 1e-5)
        return [_bits(a) for a in (y, m, i, *BK.backward(x, dy, sc, m, i)[::2])]
    _both(run, BN, monkeypatch)


def test_captured_step_replays_the_eager_bits_with_the_cache_warm():
    W.clear()
    xs, ws = CONV[0]
    rs = cp.random.RandomState(0)
    x, w = rs.standard_normal(xs, dtype=np.float32), rs.standard_normal(ws, dtype=np.float32)
    d = ConvolutionDescriptor((1, 1))
    sc = cp.ones((xs[1],), np.float32)

    def step():
        y = fwd(None, x, w, d)
        yb, m, i = BK.forward_training(y, sc, sc, 0.1, None, None, 1e-5, relu=True)
        dx, _, ds, db = BK.backward(y, yb, sc, m, i, y=yb)
        return yb, bwd_data(None, w, dx, d, xs), bwd_filter(None, x, dx, d, ws), ds, db
    s = mdn.cuda.Stream()
    s.wait_stream(mdn.cuda.current_stream())
    with mdn.cuda.stream(s):
        for _ in range(3):
            eager = [_bits(a) for a in step()]
    mdn.cuda.current_stream().wait_stream(s)
    held = {k: v.data.ptr for k, v in W._local.table.items()}
    g = mdn.cuda.CUDAGraph()
    with mdn.cuda.graph(g, stream=s):
        out = step()
    assert {k: v.data.ptr for k, v in W._local.table.items()} == held        # nothing captured was cached
    g.replay()
    cp.cuda.Device().synchronize()
    assert all(np.array_equal(a, _bits(b)) for a, b in zip(eager, out))
    with mdn.cuda.stream(s):                                                  # eager again, on the cached buffers
        again = [_bits(a) for a in step()]
    assert all(np.array_equal(a, b) for a, b in zip(eager, again))


def test_pair_arrays_behave_as_separate_arrays():
    a, b = W.pair(cp, (10,), np.float32)
    assert a.base is None and b.base is None and a.flags.owndata and b.flags.owndata
    assert a.flags.c_contiguous and b.flags.c_contiguous and a.shape == b.shape == (10,)
    assert b.data.ptr - a.data.ptr >= 40 and b.data.ptr % 256 == 0
    a[...] = 1
    b[...] = 2
    a += 5
    assert (a == 6).all() and (b == 2).all()
    del a
    b += 1
    assert (b == 3).all()
