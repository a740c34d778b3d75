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


# ---- session 7 (conv_dw_nhwc.V2): MobileNet-small's depthwise layers at batch 128, both generations -------------
# (id, N, C, H, W, R, S, pad, stride, dil): the four 3x3 depthwise layers of MobileNetSmall(width=16)
MOBILENET_B128 = [
    ("mb-C16-s1-32", 128, 16, 32, 32, 3, 3, 1, 1, 1),
    ("mb-C32-s2-32", 128, 32, 32, 32, 3, 3, 1, 2, 1),
    ("mb-C64-s1-16", 128, 64, 16, 16, 3, 3, 1, 1, 1),
    ("mb-C64-s2-16", 128, 64, 16, 16, 3, 3, 1, 2, 1),
]
_REFS = {}


def _exact_refs(shape):
    """x, w, dy of multiples of 1/8 in [-1, 1] (exact in fp32 / fp16 / bf16; every float32 sum of these layers'
    products is exact, so any order gives the float64 reference bits before the output rounding) and the three
    float64 references, computed once per shape."""
    if shape[0] not in _REFS:
        _, N, C, H, W, R, S, pad, stride, dil = shape
        desc = ConvolutionDescriptor(pad, stride, dil, C)
        p = make_problem("test", (N, C, H, W), (C, 1, R, S), desc, "float32")
        rng = np.random.default_rng(7)
        x, w, dy = (rng.integers(-8, 9, s).astype(F64) / 8 for s in (p.x_shape, p.w_shape, p.y_shape))
        y = convolution_forward(None, x, w, desc, algo=ConvolutionFwdAlgo.GEMM)
        dx = convolution_backward_data(None, w, dy, desc, p.x_shape, algo=ConvolutionBwdDataAlgo.ALGO_1)
        dw = convolution_backward_filter(None, x, dy, desc, p.w_shape, algo=ConvolutionBwdFilterAlgo.ALGO_1)
        _REFS[shape[0]] = (x, w, dy, y, dx, dw)
    return _REFS[shape[0]]


def _rounded(ref, dtype):
    """ref rounded once (to nearest even) to ``dtype``: the kernels' only rounding on exact sums (float64 ->
    float32 is exact for these values)."""
    return ref.astype(np.float32).astype(_np_dtype(dtype)).astype(F64)


@pytest.mark.parametrize("v2", [True, False], ids=["v2", "v1"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", MOBILENET_B128, ids=[s[0] for s in MOBILENET_B128])
def test_dw_nhwc_mobilenet_b128(shape, dtype, v2, spy, monkeypatch):
    """The launches MobileNet-small's bf16 / fp32 channels_last step makes (V2: the shrunk forward tiles of the
    stride-2 layers, the two-level split sums of the filter gradient; V1: session 5's), each one launch, equal to
    the float64 reference rounded once, the filter gradient bitwise repeatable, tickets back at zero."""
    if dtype == "float16" and not v2:
        pytest.skip("float16 through V1: the session-5 test above")
    monkeypatch.setattr(D, "V2", [v2])
    _, N, C, H, W, R, S, pad, stride, dil = shape
    x, w, dy, y_ref, dx_ref, dw_ref = _exact_refs(shape)
    desc = ConvolutionDescriptor(pad, stride, dil, C)
    p = make_problem("test", (N, C, H, W), (C, 1, R, S), desc, dtype)
    dt = _np_dtype(dtype)
    wg = cp.asarray(w.astype(dt))
    n0 = L.launch_count()
    y = K.direct_forward(p, _nhwc(x, dt), wg)
    assert L.launch_count() - n0 == 1 and spy[-1] == ("forward", True)
    assert np.array_equal(cp.asnumpy(y).astype(F64), _rounded(y_ref, dtype))
    n0 = L.launch_count()
    dx = K.direct_backward_data(p, wg, _nhwc(dy, dt))
    assert L.launch_count() - n0 == 1 and spy[-1] == ("backward_data", True)
    assert np.array_equal(cp.asnumpy(dx).astype(F64), _rounded(dx_ref, dtype))
    xg, dyg = _nhwc(x, dt), _nhwc(dy, dt)
    outs = []
    for _ in range(2):
        n0 = L.launch_count()
        dw = K.direct_backward_filter(p, xg, dyg)
        assert L.launch_count() - n0 == 1 and spy[-1] == ("backward_filter", True)
        outs.append(cp.asnumpy(dw))
    assert np.array_equal(outs[0].view(np.uint8), outs[1].view(np.uint8)), "filter gradient not repeatable"
    assert np.array_equal(outs[0].astype(F64), _rounded(dw_ref, dtype))
    t = K._ticket_arrays.get(xg.data.device_id)
    assert t is None or int(cp.count_nonzero(t)) == 0, "tickets left non-zero"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[2], SHAPES[5], SHAPES[8]],
                         ids=["ragged", "stride2", "5x5-stride2", "two-slabs"])
def test_dw_nhwc_v2_two_level_and_small_tiles(shape, dtype, spy, monkeypatch):
    """V2 with WGRAD2_ONE_LEVEL = 1 (every multi-split filter gradient sums in groups, then groups) and
    FWD_MIN_BLOCKS_PER_SM huge (forward / backward-data tiles down to one output per thread), alpha/beta, against
    float64 with random normal data; bitwise-equal repeats."""
    monkeypatch.setattr(D, "V2", [True])
    monkeypatch.setattr(D, "WGRAD2_ONE_LEVEL", 1)
    monkeypatch.setattr(D, "FWD_MIN_BLOCKS_PER_SM", 10 ** 6)
    monkeypatch.setattr(D, "WGRAD2_BLOCKS_PER_SM", 64)          # many splits even on these small shapes
    D._fwd_plans.clear(), D._dgrad_plans.clear(), D._wgrad_plans.clear()     # plans are keyed without the knobs
    try:
        test_dw_nhwc_three_directions(shape, dtype, (0.75, -0.5), spy)
        p, *_ = _setup(shape, dtype, 0)
        (R, S), st = p.kernel, p.stride[0]
        cv = D.vector(2 if dtype == "bfloat16" else 4, R * S)
        vh, vq = D.tile("backward_filter", cv, st)
        items = p.N * -(-p.out_size[0] // vh) * -(-p.out_size[1] // vq)
        ct, sy, slabs, splits, per_split, group = D.wgrad_config(p.C, cv, items, L.sm_count(), True)
        assert splits == 1 or splits > group, (splits, group)    # two levels wherever there is more than one split
    finally:
        D._fwd_plans.clear(), D._dgrad_plans.clear(), D._wgrad_plans.clear()   # plans built under the patches


@pytest.mark.parametrize("v2", [True, False], ids=["v2", "v1"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dw_nhwc_float32_dw_from_half(dtype, v2, spy, monkeypatch):
    """A float32 filter gradient of half data (autocast's weights, DWF32): the sums unrounded."""
    monkeypatch.setattr(D, "V2", [v2])
    shape = MOBILENET_B128[3]
    x, w, dy, *_, dw_ref = _exact_refs(shape)
    _, N, C, H, W, R, S, pad, stride, dil = shape
    p = make_problem("test", (N, C, H, W), (C, 1, R, S), ConvolutionDescriptor(pad, stride, dil, C), dtype)
    dt = _np_dtype(dtype)
    dw = K.direct_backward_filter(p, _nhwc(x, dt), _nhwc(dy, dt), out_dtype=np.float32)
    assert spy[-1] == ("backward_filter", True) and dw.dtype == np.float32
    assert np.array_equal(cp.asnumpy(dw).astype(F64), dw_ref)                 # exact sums: no rounding at all


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dw_nhwc_v2_unaligned_taps(dtype, spy, monkeypatch):
    """V2 with a filter whose base is not vector-aligned (a view one element into a buffer): the scalar tap loads
    (WVEC=0), forward and stride-1 backward data."""
    monkeypatch.setattr(D, "V2", [True])
    p, desc, dt, x, w, dy, _ = _setup(SHAPES[0], dtype, 3)
    buf = cp.zeros(w.size + 1, dtype=dt)
    buf[1:] = cp.asarray(w.astype(dt).ravel())
    wv = buf[1:].reshape(w.shape)
    assert wv.data.ptr % 16 != 0 and not D._w_vec_ok(wv, D.vector(wv.itemsize, 9))
    y = K.direct_forward(p, _nhwc(x, dt), wv)
    assert spy[-1] == ("forward", True)
    ref = convolution_forward(None, x, w, desc, algo=ConvolutionFwdAlgo.GEMM)
    np.testing.assert_allclose(cp.asnumpy(y).astype(F64), ref, rtol=4 * _u(dtype), atol=4 * _u(dtype) * 9)
    dx = K.direct_backward_data(p, wv, _nhwc(dy, dt))
    assert spy[-1] == ("backward_data", True)
    ref = convolution_backward_data(None, w, dy, desc, p.x_shape, algo=ConvolutionBwdDataAlgo.ALGO_1)
    np.testing.assert_allclose(cp.asnumpy(dx).astype(F64), ref, rtol=4 * _u(dtype), atol=4 * _u(dtype) * 9)
