"""The NHWC depthwise kernels (conv_dw_nhwc, hooked into conv_igemm.direct_*) on a GPU against float64 references:
forward, backward data (stride 1: FLIP forward; strides 2-3 / large padding: the gather kernel) and the filter
gradient, float32 / bfloat16 (float16 for a few), alpha/beta over poisoned or prior outputs, exactly one launch
per direction (the new kernel, asserted by a spy), bitwise-equal repeated filter gradients, tickets left at zero,
and MINIDNN_DW_TILE's switch (TILE_ENABLED off: the old path runs).  Index math without a GPU:
tests/backend/test_dw_nhwc_emulation.py."""
import math

import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

from minidnn.backend import (  # noqa: E402
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionDescriptor,
    ConvolutionFwdAlgo,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_forward,
)
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.cuda import conv_dw_nhwc as D  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402

F64 = np.float64
# (id, N, C, H, W, R, S, pad, stride, dil)
SHAPES = [
    ("ragged-3x3", 2, 16, 9, 11, 3, 3, 1, 1, 1),
    ("c40-n1", 1, 40, 7, 6, 3, 3, 1, 1, 1),
    ("stride2", 2, 16, 11, 13, 3, 3, 1, 2, 1),
    ("pad2", 1, 16, 9, 10, 3, 3, 2, 1, 1),
    ("5x5-pad2", 2, 16, 12, 11, 5, 5, 2, 1, 1),
    ("5x5-stride2", 2, 24, 13, 9, 5, 5, 2, 2, 1),
    ("dil2", 1, 8, 10, 12, 3, 3, 2, 1, 2),
    ("stride3", 1, 8, 11, 9, 3, 3, 1, 3, 1),
    ("two-slabs", 2, 272, 5, 7, 3, 3, 1, 1, 1),
    ("mobilenet-56-b8", 8, 16, 56, 56, 3, 3, 1, 2, 1),
    ("mobilenet-14-b16", 16, 96, 14, 14, 5, 5, 2, 1, 1),
]


def _np_dtype(dtype):
    if dtype == "bfloat16":
        return pytest.importorskip("ml_dtypes").bfloat16
    return {"float32": np.float32, "float16": np.float16}[dtype]


def _nhwc(a, dt):
    return cp.ascontiguousarray(cp.asarray(a.astype(dt)).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def _setup(shape, dtype, seed):
    _, N, C, H, W, R, S, pad, stride, dil = shape
    desc = ConvolutionDescriptor(pad, stride, dil, C)
    p = make_problem("test", (N, C, H, W), (C, 1, R, S), desc, dtype)
    rng = np.random.default_rng(seed)
    dt = _np_dtype(dtype)
    x, w, dy = (rng.standard_normal(s).astype(dt).astype(F64) for s in (p.x_shape, p.w_shape, p.y_shape))
    return p, desc, dt, x, w, dy, rng


def _u(dtype):
    return {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]


@pytest.fixture
def spy(monkeypatch):
    seen = []
    for name in ("forward", "backward_data", "backward_filter"):
        orig = getattr(D, name)

        def wrap(*a, _orig=orig, _name=name, **k):
            ran = _orig(*a, **k)
            seen.append((_name, ran))
            return ran
        monkeypatch.setattr(D, name, wrap)
    return seen


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("ab", [(1.0, 0.0), (0.75, -0.5)], ids=["plain", "alpha-beta"])
def test_dw_nhwc_three_directions(shape, dtype, ab, spy):
    alpha, beta = ab
    p, desc, dt, x, w, dy, rng = _setup(shape, dtype, 0)
    u = _u(dtype)
    npq = math.prod(p.kernel) + p.N * math.prod(p.out_size)
    bound = lambda ref_abs, prior: 1.5 * (2 * 2.0 ** -24 * npq + u) * (abs(alpha) * ref_abs + abs(beta * prior)) + 1e-30  # noqa: E731
    # forward
    ref = convolution_forward(None, x, w, desc, algo=ConvolutionFwdAlgo.GEMM)
    ref_abs = convolution_forward(None, np.abs(x), np.abs(w), desc, algo=ConvolutionFwdAlgo.GEMM)
    prior = rng.standard_normal(ref.shape).astype(dt).astype(F64) if beta else np.full(ref.shape, np.nan)
    y = _nhwc(prior, dt)
    n0 = L.launch_count()
    K.direct_forward(p, _nhwc(x, dt), cp.asarray(w.astype(dt)), alpha=alpha, beta=beta, out=y)
    assert L.launch_count() - n0 == 1 and spy[-1] == ("forward", True)
    got = cp.asnumpy(y).astype(F64)
    want = alpha * ref + (beta * prior if beta else 0)
    assert (np.abs(got - want) <= bound(ref_abs, np.nan_to_num(prior))).all()
    # backward data
    ref = convolution_backward_data(None, w, dy, desc, p.x_shape, algo=ConvolutionBwdDataAlgo.ALGO_1)
    ref_abs = convolution_backward_data(None, np.abs(w), np.abs(dy), desc, p.x_shape,
                                        algo=ConvolutionBwdDataAlgo.ALGO_1)
    prior = rng.standard_normal(ref.shape).astype(dt).astype(F64) if beta else np.full(ref.shape, np.nan)
    dx = _nhwc(prior, dt)
    n0 = L.launch_count()
    K.direct_backward_data(p, cp.asarray(w.astype(dt)), _nhwc(dy, dt), alpha=alpha, beta=beta, out=dx)
    assert L.launch_count() - n0 == 1 and spy[-1] == ("backward_data", True)
    got = cp.asnumpy(dx).astype(F64)
    want = alpha * ref + (beta * prior if beta else 0)
    assert (np.abs(got - want) <= bound(ref_abs, np.nan_to_num(prior))).all()
    # backward filter
    ref = convolution_backward_filter(None, x, dy, desc, p.w_shape, algo=ConvolutionBwdFilterAlgo.ALGO_1)
    ref_abs = convolution_backward_filter(None, np.abs(x), np.abs(dy), desc, p.w_shape,
                                          algo=ConvolutionBwdFilterAlgo.ALGO_1)
    prior = rng.standard_normal(ref.shape).astype(dt).astype(F64) if beta else np.full(ref.shape, np.nan)
    xg, dyg = _nhwc(x, dt), _nhwc(dy, dt)
    outs = []
    for _ in range(2):
        dw = cp.asarray(prior.astype(dt))
        n0 = L.launch_count()
        K.direct_backward_filter(p, xg, dyg, alpha=alpha, beta=beta, out=dw)
        assert L.launch_count() - n0 == 1 and spy[-1] == ("backward_filter", True)
        outs.append(cp.asnumpy(dw))
    assert np.array_equal(outs[0].view(np.uint8), outs[1].view(np.uint8)), "filter gradient not repeatable"
    got = outs[0].astype(F64)
    want = alpha * ref + (beta * prior if beta else 0)
    assert (np.abs(got - want) <= bound(ref_abs, np.nan_to_num(prior))).all()
    t = K._ticket_arrays.get(xg.data.device_id)
    assert t is None or int(cp.count_nonzero(t)) == 0, "tickets left non-zero"


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[4]], ids=["3x3", "5x5"])
def test_dw_nhwc_float16(shape, spy):
    p, desc, dt, x, w, dy, _ = _setup(shape, "float16", 1)
    ref = convolution_forward(None, x, w, desc, algo=ConvolutionFwdAlgo.GEMM)
    y = K.direct_forward(p, _nhwc(x, dt), cp.asarray(w.astype(dt)))
    assert spy[-1] == ("forward", True)
    np.testing.assert_allclose(cp.asnumpy(y).astype(F64), ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())


def test_dw_nhwc_declines(spy, monkeypatch):
    p, desc, dt, x, w, dy, _ = _setup(("c12-bf16", 1, 12, 6, 7, 3, 3, 1, 1, 1), "bfloat16", 2)
    K.direct_forward(p, _nhwc(x, dt), cp.asarray(w.astype(dt)))       # 12 bf16 channels: not whole 8-vectors
    assert spy[-1] == ("forward", False)
    p, desc, dt, x, w, dy, _ = _setup(SHAPES[0], "float32", 2)
    K.direct_forward(p, cp.asarray(x.astype(dt)), cp.asarray(w.astype(dt)))   # NCHW
    assert spy[-1] == ("forward", False)
    monkeypatch.setattr(K, "TILE_ENABLED", [False])                   # MINIDNN_DW_TILE=0: the old path
    n = len(spy)
    ref = convolution_forward(None, x, w, desc, algo=ConvolutionFwdAlgo.GEMM)
    y = K.direct_forward(p, _nhwc(x, dt), cp.asarray(w.astype(dt)))
    assert len(spy) == n
    np.testing.assert_allclose(cp.asnumpy(y), ref, rtol=1e-5, atol=1e-5)
