"""The register-tiled depthwise/grouped kernels (conv_direct_source's dw_tile_forward, launched by
conv_igemm._tile_forward for the forward and for stride-1 backward data of NCHW rows; dw_tile_backward_data,
launched by conv_igemm._tile_backward_data for strided backward data) against float64 references.

Shapes with ragged tails (no tile divides them), N=1, stride 1 and 2, padding 0/1/2, dilation 2, 3x3/5x5/7x7,
channel multiplier 1 and 2, groups of 4 channels, more than one tile along either axis, several planes per block
with a partly idle last block, aligned rows (16-byte loads, vector stores) and views offset by one element (the
element paths); float32/float16/bfloat16; alpha/beta blending over a prior output; poisoned outputs (every element
must be written); and that the tile kernel is the one that runs where it applies.  Bounds as in
test_conv_cuda_kernels: |got - ref| <= 1.5 (2 u_in + KR 2^-23 + u_out) conv(|x|, |w|).
"""
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
    Handle,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_forward,
)
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402

F64 = np.float64

# (id, N, C, H, W, K, R, S, padding, stride, dilation, groups)
SHAPES = [
    ("dw-ragged", 2, 8, 9, 11, 8, 3, 3, 1, 1, 1, 8),
    ("dw-n1-pad0", 1, 5, 14, 14, 5, 3, 3, 0, 1, 1, 5),
    ("dw-pad2", 2, 3, 12, 20, 3, 3, 3, 2, 1, 1, 3),
    ("dw-stride2", 2, 8, 21, 37, 8, 3, 3, 1, 2, 1, 8),
    ("dw-stride2-odd", 1, 6, 7, 7, 6, 3, 3, 1, 2, 1, 6),
    ("dw-x2", 2, 6, 10, 9, 12, 3, 3, 1, 1, 1, 6),
    ("dw-x2-stride2", 2, 6, 10, 9, 12, 3, 3, 1, 2, 1, 6),
    ("dw-5x5", 2, 4, 13, 15, 4, 5, 5, 2, 1, 1, 4),
    ("dw-5x5-dil2", 1, 16, 11, 12, 16, 5, 5, 2, 1, 2, 16),
    ("dw-3x3-dil2", 2, 4, 16, 16, 4, 3, 3, 2, 1, 2, 4),
    ("dw-7x7", 1, 4, 9, 40, 4, 7, 7, 3, 1, 1, 4),
    ("groups-cg4", 2, 16, 8, 9, 16, 3, 3, 1, 1, 1, 4),
    ("dw-wide", 1, 2, 6, 150, 2, 3, 3, 1, 1, 1, 2),
    ("dw-tall", 1, 2, 70, 8, 2, 3, 3, 1, 1, 1, 2),
    ("dw-56-aligned", 2, 4, 56, 56, 4, 3, 3, 1, 1, 1, 4),
    ("dw-many-planes", 5, 333, 9, 9, 333, 3, 3, 1, 1, 1, 333),
    # dense convolutions of ONE input channel (groups 1, C 1): depthwise with channel multiplier K
    ("dense-c1-lenet", 4, 1, 32, 32, 6, 5, 5, 0, 1, 1, 1),          # LeNet-5's conv1, 32x32 -> 28x28
    ("dense-c1-k16-ragged", 2, 1, 13, 11, 16, 3, 3, 1, 1, 1, 1),
    ("dense-c1-k1", 3, 1, 9, 10, 1, 3, 3, 1, 1, 1, 1),
    ("dense-c1-pad2", 2, 1, 12, 19, 6, 5, 5, 2, 1, 1, 1),
    ("dense-c1-stride2", 2, 1, 15, 17, 6, 3, 3, 1, 2, 1, 1),
    ("dense-c1-k32-5x5-s2", 2, 1, 16, 16, 32, 5, 5, 2, 2, 1, 1),    # K at the limit, aligned rows
    # dense convolutions of 2..8 input channels (groups 1: Cg = C, Kg = K; each plane sums all C input planes)
    ("dense-c3-k16-ragged", 2, 3, 13, 11, 16, 3, 3, 1, 1, 1, 1),     # a 3-channel stem's geometry, ragged
    ("dense-c3-stem-32", 8, 3, 32, 32, 16, 3, 3, 1, 1, 1, 1),        # ResNet-20 / MobileNet-small stem, 8 images
    ("dense-c6-lenet-conv2", 4, 6, 14, 14, 16, 5, 5, 0, 1, 1, 1),    # LeNet-5's conv2, 14x14 -> 10x10
    ("dense-c8-k32", 2, 8, 9, 10, 32, 3, 3, 1, 1, 1, 1),             # both limits (Cg 8, Kg 32)
    ("dense-c3-stride2", 2, 3, 15, 17, 8, 3, 3, 1, 2, 1, 1),
    ("dense-c4-5x5-pad2", 2, 4, 12, 19, 6, 5, 5, 2, 1, 1, 1),
    ("dense-c2-aligned", 2, 2, 16, 16, 5, 3, 3, 1, 1, 1, 1),         # 16-byte rows
    # strided backward data: dw_tile_backward_data (gather form by residue class); forward / filter as above
    ("dw-56-s2", 2, 4, 56, 56, 4, 3, 3, 1, 2, 1, 4),                 # the bench's s2 geometry, aligned rows
    ("dw-s2-pad0", 2, 4, 12, 12, 4, 3, 3, 0, 2, 1, 4),
    ("dw-s2-5x5-pad2", 2, 4, 15, 17, 4, 5, 5, 2, 2, 1, 4),
    ("dw-s2-5x5-pad3", 1, 3, 14, 13, 3, 5, 5, 3, 2, 1, 3),
    ("dw-s2-dil2", 1, 4, 12, 13, 4, 3, 3, 2, 2, 2, 4),
    ("dw-s3", 2, 4, 13, 14, 4, 3, 3, 1, 3, 1, 4),                    # DVW = 3: scalar stores
    ("dw-s3-5x5-pad2", 1, 3, 17, 16, 3, 5, 5, 2, 3, 1, 3),
    ("dw-s2-7x7", 1, 2, 18, 16, 2, 7, 7, 3, 2, 1, 2),
    ("dw-s2-wide", 1, 2, 6, 150, 2, 3, 3, 1, 2, 1, 2),               # several w tiles
    ("dw-s2-many-planes", 5, 333, 9, 9, 333, 3, 3, 1, 2, 1, 333),    # TZ > 1, last block partly idle
    ("groups-cg4-s2", 2, 16, 9, 10, 16, 3, 3, 1, 2, 1, 4),
    ("dense-c3-stem-s2", 8, 3, 32, 32, 16, 3, 3, 1, 2, 1, 1),        # dense C 3: 16 dy planes per dx plane
    ("dw-s1-pad3", 2, 3, 8, 11, 3, 3, 3, 3, 1, 1, 3),                # stride 1, pad > R - 1: FLIP declines
]
DTYPES = ["float32", "float16", "bfloat16"]
DIRECTIONS = ["forward", "backward_data", "backward_filter"]


def _bf16():
    return pytest.importorskip("ml_dtypes").bfloat16


def _np_dtype(dtype):
    return {"float32": np.float32, "float16": np.float16}.get(dtype) or _bf16()


def _problem(shape, dtype="float32"):
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = shape
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    return make_problem("test", (N, C, H, W), (Kc, C // groups, R, S), desc, dtype), desc


def _ref(direction, desc, p, x, w, dy):
    def run(x, w, dy):
        if direction == "forward":
            return convolution_forward(None, x, w, desc, algo=ConvolutionFwdAlgo.GEMM)
        if direction == "backward_data":
            return convolution_backward_data(None, w, dy, desc, p.x_shape, algo=ConvolutionBwdDataAlgo.ALGO_1)
        return convolution_backward_filter(None, x, dy, desc, p.w_shape, algo=ConvolutionBwdFilterAlgo.ALGO_1)
    return run(x, w, dy), run(np.abs(x), np.abs(w), np.abs(dy))


def _bound(direction, p, ref_abs, u_in, u_out):
    taps = math.prod(p.kernel)
    red = {"forward": p.Cg * taps, "backward_data": p.Kg * taps,
           "backward_filter": p.N * math.prod(p.out_size)}[direction]
    # float16 outputs below 2^-14 are subnormal: their spacing (2^-24) is absolute, not relative to the value
    tiny = 2.0 ** -24 if u_out == 2.0 ** -11 else 0.0
    return 1.5 * (2 * u_in + red * 2.0 ** -23 + u_out) * ref_abs + tiny + 1e-30


def _check(got, ref, bound, what):
    got = cp.asnumpy(got).astype(F64)
    assert not np.isnan(got).any(), f"{what}: unwritten (NaN) elements"
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"{what}: |got - ref| = {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst} "
                                  f"(got {got[worst]}, ref {ref[worst]})")


def _offset_view(a, dt):
    """``a`` on the GPU as a view starting one element into a wider array (rows still of unit stride, but no
    16-byte alignment anywhere: the element loads and scalar stores)."""
    N, C, H, W = a.shape
    big = cp.asarray(np.full((N, C, H, W + 1), np.nan).astype(dt))
    v = big[:, :, :, 1:]
    v[...] = cp.asarray(a.astype(dt))
    return v


@pytest.fixture
def tile_runs(monkeypatch):
    """Records each _tile_forward call's result (True: dw_tile_forward ran) and each _tile_backward_data call's
    ("dgrad": dw_tile_backward_data ran, "dgrad-declined": not)."""
    seen = []
    orig, orig_dgrad = K._tile_forward, K._tile_backward_data

    def spy(*args, **kwargs):
        ran = orig(*args, **kwargs)
        seen.append(ran)
        return ran

    def spy_dgrad(*args, **kwargs):
        ran = orig_dgrad(*args, **kwargs)
        seen.append("dgrad" if ran else "dgrad-declined")
        return ran
    monkeypatch.setattr(K, "_tile_forward", spy)
    monkeypatch.setattr(K, "_tile_backward_data", spy_dgrad)
    return seen


def _compare(shape, dtype, tile_runs, alpha=1.0, beta=0.0, offset=False, seed=0):
    p, desc = _problem(shape, dtype)
    rng = np.random.default_rng(seed)
    x, w, dy = (rng.standard_normal(s) for s in (p.x_shape, p.w_shape, p.y_shape))
    u_in, u_out = 2.0 ** -24, 2.0 ** -24
    dt = _np_dtype(dtype)
    if dtype != "float32":
        x, w, dy = (a.astype(dt).astype(F64) for a in (x, w, dy))          # the exact values the kernel sees
        u_in, u_out = 0.0, (2.0 ** -11 if dtype == "float16" else 2.0 ** -8)
    to_gpu = (lambda a: _offset_view(a, dt)) if offset else (lambda a: cp.asarray(a.astype(dt)))
    xg, dyg, wg = to_gpu(x), to_gpu(dy), cp.asarray(w.astype(dt))
    for direction in DIRECTIONS:
        ref, ref_abs = _ref(direction, desc, p, x, w, dy)
        prior = rng.standard_normal(ref.shape)
        if dtype != "float32":
            prior = prior.astype(dt).astype(F64)
        if beta != 0:
            out = to_gpu(prior) if direction != "backward_filter" else cp.asarray(prior.astype(dt))
        else:
            out = to_gpu(np.full(ref.shape, np.nan)) if direction != "backward_filter" else \
                cp.asarray(np.full(ref.shape, np.nan).astype(dt))
        del tile_runs[:]
        if direction == "forward":
            got = K.direct_forward(p, xg, wg, False, alpha, beta, out)
        elif direction == "backward_data":
            got = K.direct_backward_data(p, wg, dyg, False, alpha, beta, out)
        else:
            got = K.direct_backward_filter(p, xg, dyg, False, alpha, beta, out)
        assert got is out
        want = alpha * ref + beta * prior
        bound = _bound(direction, p, abs(alpha) * ref_abs + abs(beta) * np.abs(prior), u_in, u_out)
        _check(got, want, bound, f"{direction} {shape[0]} {dtype} alpha={alpha} beta={beta} offset={offset}")
        flip_ok = max(p.stride) == 1 and all(d * (r - 1) >= q for d, r, q in zip(p.dilation, p.kernel, p.padding))
        if direction == "forward" or (direction == "backward_data" and flip_ok):
            assert tile_runs == [True], f"{direction} {shape[0]}: the tile kernel did not run ({tile_runs})"
        elif direction == "backward_data":       # strided, or stride 1 with pad > dil*(R-1): the gather form
            assert tile_runs == ["dgrad"], f"{direction} {shape[0]}: dw_tile_backward_data did not run ({tile_runs})"
        else:
            assert tile_runs == [], f"{direction} {shape[0]}: {tile_runs}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_tile_kernel_matches_float64(shape, dtype, tile_runs):
    _compare(shape, dtype, tile_runs, seed=SHAPES.index(shape))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["dw-ragged", "dw-56-aligned", "dw-x2-stride2", "dw-many-planes", "dense-c1-lenet",
                                  "dense-c6-lenet-conv2", "dense-c3-stride2", "dw-56-s2", "dw-s3", "dw-s2-dil2"])
def test_tile_kernel_blends_alpha_beta(name, dtype, tile_runs):
    shape = next(s for s in SHAPES if s[0] == name)
    _compare(shape, dtype, tile_runs, alpha=0.75, beta=-0.5, seed=7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["dw-56-aligned", "dw-ragged", "dw-5x5-dil2", "dense-c1-lenet", "dense-c3-k16-ragged",
                                  "dw-56-s2", "dw-s3"])
def test_tile_kernel_unaligned_views(name, dtype, tile_runs):
    shape = next(s for s in SHAPES if s[0] == name)
    _compare(shape, dtype, tile_runs, offset=True, seed=11)
    _compare(shape, dtype, tile_runs, alpha=0.5, beta=2.0, offset=True, seed=12)


def test_several_planes_per_block_is_exercised():
    """dw-many-planes runs with TZ > 1 planes per block and a last block partly idle (on any SM count here)."""
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = next(s for s in SHAPES if s[0] == "dw-many-planes")
    sms = K._launch.sm_count()
    tx, ty, tz, vh, pitch = K.tile_config(H, W, N * Kc, R, S, stride, dil, sms)
    assert tz > 1 and (N * Kc) % tz != 0, (tz, sms)


def test_tile_kernel_is_chosen_where_it_applies(tile_runs):
    """Eligible NCHW problems run dw_tile_forward (forward, stride-1 backward data) through the primitives too;
    NHWC memory does not reach it, and TILE_ENABLED = False gives the plane kernel the same answer."""
    shape = next(s for s in SHAPES if s[0] == "dw-56-aligned")
    p, desc = _problem(shape)
    rng = np.random.default_rng(3)
    x, w, dy = (rng.standard_normal(s) for s in (p.x_shape, p.w_shape, p.y_shape))
    xg, wg, dyg = (cp.asarray(a, np.float32) for a in (x, w, dy))
    h = Handle("cuda")
    del tile_runs[:]
    y = convolution_forward(h, xg, wg, desc)
    dx = convolution_backward_data(h, wg, dyg, desc, p.x_shape)
    assert tile_runs == [True, True], tile_runs
    for direction, got in (("forward", y), ("backward_data", dx)):
        ref, ref_abs = _ref(direction, desc, p, x, w, dy)
        _check(got, ref, _bound(direction, p, ref_abs, 2.0 ** -24, 2.0 ** -24), f"primitive {direction}")
    # NHWC memory: not a plane problem, the generic kernel
    del tile_runs[:]
    x_nhwc = cp.ascontiguousarray(xg.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    y_nhwc = K.direct_forward(p, x_nhwc, wg)
    assert tile_runs == []
    cp.testing.assert_allclose(y_nhwc, y, rtol=1e-5, atol=1e-5)
    # switched off: the plane kernel, same results within rounding
    old = K.TILE_ENABLED[0]
    K.TILE_ENABLED[0] = False
    try:
        del tile_runs[:]
        y_plane = K.direct_forward(p, xg, wg)
        assert tile_runs == [False]
    finally:
        K.TILE_ENABLED[0] = old
    cp.testing.assert_allclose(y_plane, y, rtol=1e-5, atol=1e-5)


def test_tile_kernel_is_one_launch_and_repeatable():
    shape = next(s for s in SHAPES if s[0] == "dw-many-planes")
    p, _ = _problem(shape)
    rng = np.random.default_rng(5)
    xg, wg = cp.asarray(rng.standard_normal(p.x_shape), np.float32), cp.asarray(rng.standard_normal(p.w_shape),
                                                                                np.float32)
    first = K.direct_forward(p, xg, wg)
    before = K._launch.launch_count()
    again = K.direct_forward(p, xg, wg)
    assert K._launch.launch_count() - before == 1
    assert cp.array_equal(first.view(cp.uint32), again.view(cp.uint32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", ["dense-c1-lenet", "dense-c1-k16-ragged", "dense-c1-stride2", "dense-c3-stem-32",
                                  "dense-c6-lenet-conv2", "dense-c8-k32", "dense-c3-stride2"])
def test_dense_few_channels_through_the_primitives(name, fmt, dtype):
    """Dense (groups == 1) with C 1..8 through the primitives with the heuristic's choice (algo=None): DIRECT /
    ALGO_0 / ALGO_0 (the direct kernels), against float64, in both formats, each call's bits repeated; NCHW stride 1
    is one launch per direction."""
    from minidnn.backend import (
        get_convolution_backward_data_algorithm_v7,
        get_convolution_backward_filter_algorithm_v7,
        get_convolution_forward_algorithm_v7,
    )
    p, desc = _problem(next(s for s in SHAPES if s[0] == name), dtype)
    dt = _np_dtype(dtype)
    h = Handle("cuda")
    kw = dict(dtype=dtype, format=fmt)
    cl = (lambda s: (s[0], *s[2:], s[1])) if fmt == "NHWC" else (lambda s: s)
    assert get_convolution_forward_algorithm_v7(h, cl(p.x_shape), p.w_shape, desc, **kw)[0].algo \
        is ConvolutionFwdAlgo.DIRECT
    assert get_convolution_backward_data_algorithm_v7(h, p.w_shape, cl(p.y_shape), desc, cl(p.x_shape),
                                                      **kw)[0].algo is ConvolutionBwdDataAlgo.ALGO_0
    assert get_convolution_backward_filter_algorithm_v7(h, cl(p.x_shape), cl(p.y_shape), desc, p.w_shape,
                                                        **kw)[0].algo is ConvolutionBwdFilterAlgo.ALGO_0
    rng = np.random.default_rng(21)
    x, w, dy = (rng.standard_normal(s).astype(dt).astype(F64) for s in (p.x_shape, p.w_shape, p.y_shape))
    u_in, u_out = (2.0 ** -24, 2.0 ** -24) if dtype == "float32" else (0.0, 2.0 ** -8)
    to_fmt = (lambda a: a.transpose(0, 2, 3, 1)) if fmt == "NHWC" else (lambda a: a)
    xg, dyg = (cp.asarray(np.ascontiguousarray(to_fmt(a)).astype(dt)) for a in (x, dy))
    wg = cp.asarray(w.astype(dt))
    calls = {"forward": lambda: convolution_forward(h, xg, wg, desc, format=fmt),
             "backward_data": lambda: convolution_backward_data(h, wg, dyg, desc, cl(p.x_shape), format=fmt),
             "backward_filter": lambda: convolution_backward_filter(h, xg, dyg, desc, p.w_shape, format=fmt)}
    for direction, call in calls.items():
        got = call()
        before = K._launch.launch_count()
        again = call()
        launches = K._launch.launch_count() - before
        ref, ref_abs = _ref(direction, desc, p, x, w, dy)
        if direction != "backward_filter" and fmt == "NHWC":
            got, again = (a.transpose(0, 3, 1, 2) for a in (got, again))
        _check(got, ref, _bound(direction, p, ref_abs, u_in, u_out), f"{name} {fmt} {dtype} {direction}")
        uint = cp.uint32 if dtype == "float32" else cp.uint16
        assert cp.array_equal(cp.ascontiguousarray(got).view(uint), cp.ascontiguousarray(again).view(uint))
        if fmt == "NCHW" and (max(p.stride) == 1 or direction == "backward_data"):
            assert launches == 1, f"{name} {direction}: {launches} launches"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", ["dw-56-s2", "dw-s3", "dw-x2-stride2", "dense-c3-stem-s2"])
def test_strided_backward_data_through_the_primitive(name, fmt, dtype, tile_runs):
    """Strided backward data through convolution_backward_data (ALGO_0, the direct fast path): NCHW is one launch of
    dw_tile_backward_data, NHWC does not reach it (conv_dw_nhwc or the generic kernel); both against float64,
    alpha/beta blended, each call's bits repeated (deterministic: no atomics)."""
    p, desc = _problem(next(s for s in SHAPES if s[0] == name), dtype)
    dt = _np_dtype(dtype)
    h = Handle("cuda")
    rng = np.random.default_rng(31)
    w, dy = (rng.standard_normal(s).astype(dt).astype(F64) for s in (p.w_shape, p.y_shape))
    prior = rng.standard_normal(p.x_shape).astype(dt).astype(F64)
    u_in, u_out = (2.0 ** -24, 2.0 ** -24) if dtype == "float32" else (0.0, 2.0 ** -8)
    to_fmt, back = ((lambda a: a.transpose(0, 2, 3, 1)), (lambda a: a.transpose(0, 3, 1, 2))) if fmt == "NHWC" \
        else ((lambda a: a), (lambda a: a))
    cl = (lambda s: (s[0], *s[2:], s[1])) if fmt == "NHWC" else (lambda s: s)
    dyg, wg = cp.asarray(np.ascontiguousarray(to_fmt(dy)).astype(dt)), cp.asarray(w.astype(dt))
    ref, ref_abs = _ref("backward_data", desc, p, np.zeros(p.x_shape), w, dy)
    for alpha, beta in ((1.0, 0.0), (0.75, -0.5)):
        outs = []
        for _ in range(2):
            out = cp.asarray(np.ascontiguousarray(to_fmt(prior)).astype(dt))
            del tile_runs[:]
            before = K._launch.launch_count()
            got = convolution_backward_data(h, wg, dyg, desc, cl(p.x_shape), algo=ConvolutionBwdDataAlgo.ALGO_0,
                                            alpha=alpha, beta=beta, dx=out, format=fmt)
            launches = K._launch.launch_count() - before
            outs.append(got)
        assert tile_runs == (["dgrad"] if fmt == "NCHW" else []), tile_runs
        if fmt == "NCHW":
            assert launches == 1, launches
        want = alpha * ref + beta * prior
        bound = _bound("backward_data", p, abs(alpha) * ref_abs + abs(beta) * np.abs(prior), u_in, u_out)
        if beta != 0 and dtype != "float32":
            bound = bound + 2 * u_out * np.abs(want)   # 16-bit blend: alpha * dx rounded, then the blend (<= 1 ulp)
        _check(back(outs[0]), want, bound, f"{name} {fmt} {dtype} alpha={alpha} beta={beta}")
        uint = cp.uint32 if dtype == "float32" else cp.uint16
        assert cp.array_equal(cp.ascontiguousarray(outs[0]).view(uint), cp.ascontiguousarray(outs[1]).view(uint))


def test_strided_backward_data_switched_off_takes_the_old_kernel(tile_runs):
    """TILE_ENABLED = False (MINIDNN_DW_TILE=0): the per-element direct_backward_data kernel, same answer."""
    shape = next(s for s in SHAPES if s[0] == "dw-56-s2")
    p, _ = _problem(shape)
    rng = np.random.default_rng(33)
    wg, dyg = (cp.asarray(rng.standard_normal(s), np.float32) for s in (p.w_shape, p.y_shape))
    dx = K.direct_backward_data(p, wg, dyg)
    assert tile_runs == ["dgrad"]
    old = K.TILE_ENABLED[0]
    K.TILE_ENABLED[0] = False
    try:
        del tile_runs[:]
        dx_old = K.direct_backward_data(p, wg, dyg)
        assert tile_runs == ["dgrad-declined"]
    finally:
        K.TILE_ENABLED[0] = old
    cp.testing.assert_allclose(dx_old, dx, rtol=1e-5, atol=1e-5)
