"""On a GPU: dy staged once in a convolution's backward (backend.convolution_shared_staging) gives the bits of the
two calls made apart (the same kernels read the same NHWC data); the VEC loader's filter copies made by the staging's
transpose kernel equal CuPy's copies bit for bit; a settled call (conv_igemm._calls) computes what its first call
computed; an eager shared-staging backward and its CUDA-graph capture agree bit for bit; staging switched off
(conv_igemm.STAGE_ENABLED, MINIDNN_CONV_STAGE=0) still gives equal bits with and without the scope.  The launches
themselves are checked on the CPU too (test_conv_staging_once.py)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.backend import (  # noqa: E402
    ConvolutionDescriptor,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_shared_staging,
)
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402

# (N, C, H, W, K, R, S, pad, stride, groups): every one >= 2^25 multiply-adds, so staged
SHAPES = [(32, 16, 32, 32, 16, 3, 3, 1, 1, 1),       # ResNet-20 stage 1
          (64, 16, 32, 32, 32, 3, 3, 1, 2, 1),       # stride 2: backward data's residue classes
          (64, 64, 8, 8, 64, 3, 3, 1, 1, 1),         # stage 3
          (32, 64, 16, 16, 64, 3, 3, 1, 1, 4),       # groups
          (64, 32, 16, 16, 64, 1, 1, 0, 1, 1)]       # pointwise


def _bits(a):
    a = cp.ascontiguousarray(a)
    return a.view(cp.uint32 if a.itemsize == 4 else cp.uint16)


def _dtype(mode):
    if mode == "bfloat16":
        return pytest.importorskip("ml_dtypes").bfloat16
    return np.float32


def _arrays(shape, dt, seed=0):
    n, c, h, w, k, r, s, pad, stride, groups = shape
    desc = ConvolutionDescriptor((pad, pad), (stride, stride), (1, 1), groups)
    rng = np.random.default_rng(seed)
    x = cp.asarray(rng.standard_normal((n, c, h, w)).astype(dt))
    wt = cp.asarray(rng.standard_normal((k, c // groups, r, s)).astype(dt))
    p = make_problem("t", x.shape, wt.shape, desc, np.dtype(dt).name)
    dy = cp.asarray(rng.standard_normal(p.y_shape).astype(dt))
    return desc, p, x, wt, dy


def _both(h, desc, x, w, dy):
    """(dx, dw) by the two primitives."""
    return (convolution_backward_data(h, w, dy, desc, x.shape), convolution_backward_filter(h, x, dy, desc, w.shape))


@pytest.fixture(params=["fp32", "tf32", "bfloat16"])
def mode(request):
    old = mdn.backends.cudnn.allow_tf32
    mdn.backends.cudnn.allow_tf32 = request.param == "tf32"
    yield request.param
    mdn.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_shared_staging_gives_the_bits_of_the_calls_made_apart(shape, mode, monkeypatch):
    from minidnn.backend.cuda import conv_pointwise as PW
    monkeypatch.setattr(PW, "ENABLED", [False])    # the staging is tested (a 1x1 NCHW problem would take the product)
    dt = _dtype(mode)
    if mode == "bfloat16" and (shape[1] // shape[9]) % 8:
        pytest.skip("16-bit vectors need 8 channels per group")
    desc, p, x, w, dy = _arrays(shape, dt)
    assert K._stageable(1, p) or K._stageable(2, p)
    h = mdn.backend.handle.configured_default_handle(x)
    apart = _both(h, desc, x, w, dy)           # compiles, plans
    n0 = L.launch_count()
    apart = _both(h, desc, x, w, dy)
    n_apart = L.launch_count() - n0
    n0 = L.launch_count()
    with convolution_shared_staging():
        shared = _both(h, desc, x, w, dy)
    n_shared = L.launch_count() - n0
    for a, b in zip(apart, shared):
        assert cp.array_equal(_bits(a), _bits(b))
    if K._stageable(1, p) and K._stageable(2, p):
        assert n_shared == n_apart - 1          # dy copied once
    # the nn path (ConvForward's first-order backward) takes the shared form
    xt, wt = mdn.Tensor._from_array(x), mdn.Tensor._from_array(w)
    xt.requires_grad = wt.requires_grad = True
    y = F.conv2d(xt, wt, None, desc.stride, desc.padding, 1, desc.groups)
    y.backward(mdn.Tensor._from_array(dy))
    assert cp.array_equal(_bits(xt.grad.data), _bits(apart[0]))
    assert cp.array_equal(_bits(wt.grad.data), _bits(apart[1]))


@pytest.mark.parametrize("mode", ["float32", "bfloat16"])
@pytest.mark.parametrize("wshape,groups", [((16, 16, 3, 3), 1), ((64, 16, 3, 3), 4), ((32, 8, 5), 1),
                                           ((64, 32, 1, 1), 1), ((70, 40, 3, 3), 1)])
def test_filter_copies_equal_cupys(wshape, groups, mode):
    dt = _dtype("bfloat16" if mode == "bfloat16" else "fp32")
    w = cp.asarray(np.random.default_rng(1).standard_normal(wshape).astype(dt))
    k, cg = wshape[:2]
    nd = len(wshape) - 2
    x_shape = (2, cg * groups, *([9] * nd))
    desc = ConvolutionDescriptor((0,) * nd, (1,) * nd, (1,) * nd, groups)
    p = make_problem("t", x_shape, wshape, desc, np.dtype(dt).name)
    krsc = cp.ascontiguousarray(cp.moveaxis(w, 1, -1))
    wg = w.reshape(groups, k // groups, cg, *wshape[2:])
    crsk = cp.ascontiguousarray(wg.transpose(0, 2, *range(3, 3 + nd), 1))
    for form, ref in (("krsc", krsc), ("crsk", crsk)):
        n0 = L.launch_count()
        got = K._filter_copy(cp, p, w, form)
        assert L.launch_count() - n0 == 1
        assert got.shape == ref.shape and got.flags.c_contiguous
        assert cp.array_equal(_bits(got), _bits(ref))


@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_a_settled_call_computes_what_its_first_call_computed(shape):
    desc, p, x, w, dy = _arrays(shape, np.float32, 2)
    h = mdn.backend.handle.configured_default_handle(x)
    runs = []
    for _ in range(2):
        K._calls.clear()
        first = _both(h, desc, x, w, dy)
        again = _both(h, desc, x, w, dy)
        for a, b in zip(first, again):
            assert cp.array_equal(_bits(a), _bits(b))
        runs.append(first)
    for a, b in zip(*runs):
        assert cp.array_equal(_bits(a), _bits(b))


def test_shared_staging_eager_and_graphed_give_the_same_bits():
    desc, p, x, w, dy = _arrays(SHAPES[0], np.float32, 3)
    with K.shared_staging():                    # compiles and plans before the capture
        eager = (K.implicit_backward_data(p, w, dy, False, True), K.implicit_backward_filter(p, x, dy))
    dx, dw = cp.empty(p.x_shape, np.float32), cp.empty(p.w_shape, np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            with K.shared_staging():
                K.implicit_backward_data(p, w, dy, False, True, out=dx)
                K.implicit_backward_filter(p, x, dy, out=dw)
        finally:
            g = s.end_capture()
        g.launch(s)
    s.synchronize()
    assert cp.array_equal(dx, eager[0]) and cp.array_equal(dw, eager[1])


def test_staging_switched_off_still_equal(monkeypatch):
    monkeypatch.setattr(K, "STAGE_ENABLED", [False])
    desc, p, x, w, dy = _arrays(SHAPES[0], np.float32, 4)
    h = mdn.backend.handle.configured_default_handle(x)
    apart = _both(h, desc, x, w, dy)
    with convolution_shared_staging():
        shared = _both(h, desc, x, w, dy)
    for a, b in zip(apart, shared):
        assert cp.array_equal(_bits(a), _bits(b))
