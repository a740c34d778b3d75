"""The register-tiled depthwise/grouped filter gradient (conv_direct_source's dw_tile_backward_filter, launched by
conv_igemm._tile_backward_filter from direct_backward_filter) against float64 references.

Shapes with ragged tails (no tile divides them): N=1, C=1, odd H and W, stride 1/2/3, dilation 2, padding 0-3,
kernels 1x1/3x3/5x5/7x7, channel multiplier 2 and groups of 4 channels, rows split over many blocks (tickets, the
last block adding the splits in order) and rows kept in one block; NCHW (the tile kernel) and NHWC (the generic
kernel, which keeps what the tile kernel declines); float32/float16/bfloat16 with fp32 accumulation; alpha/beta
blending over a prior dw (also a non-contiguous one); poisoned outputs; bitwise-equal repeated runs; one launch;
tickets left at zero.  Bound as in test_conv_cuda_kernels: |got - ref| <= 1.5 (2 u_in + NPQ 2^-23 + u_out)
conv(|x|, |dy|).  The index math is also checked without a GPU: tests/backend/test_dw_tile_emulation.py.
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
    ConvolutionBwdFilterAlgo,
    ConvolutionDescriptor,
    Handle,
    convolution_backward_filter,
)
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402

F64 = np.float64

# (id, N, C, H, W, K, R, S, padding, stride, dilation, groups)
SHAPES = [
    ("ragged-3x3", 2, 8, 9, 11, 8, 3, 3, 1, 1, 1, 8),
    ("n1-c1", 1, 1, 13, 7, 1, 3, 3, 1, 1, 1, 1),
    ("1x1-pad0", 3, 4, 9, 9, 4, 1, 1, 0, 1, 1, 4),
    ("1x1-stride2", 2, 3, 11, 10, 3, 1, 1, 0, 2, 1, 3),
    ("stride2-odd", 2, 6, 15, 17, 6, 3, 3, 1, 2, 1, 6),
    ("stride3-pad2", 2, 4, 19, 23, 4, 3, 3, 2, 3, 1, 4),
    ("5x5-pad3", 2, 4, 13, 15, 4, 5, 5, 3, 1, 1, 4),
    ("5x5-dil2", 1, 5, 17, 12, 5, 5, 5, 2, 1, 2, 5),
    ("3x3-dil2-pad0", 2, 4, 16, 16, 4, 3, 3, 0, 1, 2, 4),
    ("7x7-pad3", 1, 3, 21, 40, 3, 7, 7, 3, 1, 1, 3),
    ("7x7-stride2", 2, 2, 23, 29, 2, 7, 7, 3, 2, 1, 2),
    ("multiplier2", 2, 6, 10, 9, 12, 3, 3, 1, 1, 1, 6),
    ("multiplier2-stride2", 2, 6, 10, 9, 12, 3, 3, 1, 2, 1, 6),
    ("groups-cg4", 2, 16, 8, 9, 16, 3, 3, 1, 1, 1, 4),
    ("wide", 1, 2, 6, 150, 2, 3, 3, 1, 1, 1, 2),
    ("tall", 1, 2, 70, 8, 2, 3, 3, 1, 1, 1, 2),
    ("56-many-splits", 32, 4, 56, 56, 4, 3, 3, 1, 1, 1, 4),     # 4 rows: ~32 splits each (tickets)
    ("14-few-rows", 9, 3, 14, 14, 3, 3, 3, 1, 1, 1, 3),
    ("many-rows", 3, 333, 7, 9, 333, 3, 3, 1, 1, 1, 333),
    # dense convolutions of ONE input channel (groups 1, C 1): depthwise with channel multiplier K
    ("dense-c1-lenet-b64", 64, 1, 32, 32, 6, 5, 5, 0, 1, 1, 1),    # LeNet-5's conv1 in the step: 6 rows, splits
    ("dense-c1-k16-ragged", 2, 1, 13, 11, 16, 3, 3, 1, 1, 1, 1),
    ("dense-c1-k1", 3, 1, 9, 10, 1, 3, 3, 1, 1, 1, 1),
    ("dense-c1-pad2", 2, 1, 12, 19, 6, 5, 5, 2, 1, 1, 1),
    ("dense-c1-stride2", 2, 1, 15, 17, 6, 3, 3, 1, 2, 1, 1),
    ("dense-c1-k32-5x5-s2", 2, 1, 16, 16, 32, 5, 5, 2, 2, 1, 1),
    # dense convolutions of 2..8 input channels (groups 1): K * C filter rows, row k * C + c pairs dy's k with x's c
    ("dense-c6-lenet-conv2-b64", 64, 6, 14, 14, 16, 5, 5, 0, 1, 1, 1),  # LeNet-5's conv2 in the step: 96 rows, splits
    ("dense-c3-stem-32", 16, 3, 32, 32, 16, 3, 3, 1, 1, 1, 1),          # the 3-channel 32x32 stems, 16 images
    ("dense-c3-k16-ragged", 2, 3, 13, 11, 16, 3, 3, 1, 1, 1, 1),
    ("dense-c8-k32", 2, 8, 9, 10, 32, 3, 3, 1, 1, 1, 1),                # both limits: 256 rows
    ("dense-c3-stride2", 2, 3, 15, 17, 8, 3, 3, 1, 2, 1, 1),
    ("dense-c4-5x5-pad2", 2, 4, 12, 19, 6, 5, 5, 2, 1, 1, 1),
    ("dense-c2-aligned", 2, 2, 16, 16, 5, 3, 3, 1, 1, 1, 1),
]
DTYPES = ["float32", "float16", "bfloat16"]


def _shape(name):
    return next(s for s in SHAPES if s[0] == name)


def _np_dtype(dtype):
    if dtype == "bfloat16":
        return pytest.importorskip("ml_dtypes").bfloat16
    return {"float32": np.float32, "float16": np.float16}[dtype]


def _problem(shape, dtype="float32"):
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = shape
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    return make_problem("test", (N, C, H, W), (Kc, C // groups, R, S), desc, dtype), desc


def _ref(desc, p, x, dy):
    def run(a, b):
        return convolution_backward_filter(None, a, b, desc, p.w_shape, algo=ConvolutionBwdFilterAlgo.ALGO_1)
    return run(x, dy), run(np.abs(x), np.abs(dy))


def _bound(p, ref_abs, u_in, u_out):
    return 1.5 * (2 * u_in + p.N * math.prod(p.out_size) * 2.0 ** -23 + u_out) * ref_abs + 1e-30


@pytest.fixture
def wgrad_runs(monkeypatch):
    """Records each _tile_backward_filter call's result (True: dw_tile_backward_filter ran)."""
    seen = []
    orig = K._tile_backward_filter

    def spy(*args, **kwargs):
        ran = orig(*args, **kwargs)
        seen.append(ran)
        return ran
    monkeypatch.setattr(K, "_tile_backward_filter", spy)
    return seen


def _to_gpu(a, dt, layout):
    g = cp.asarray(a.astype(dt))
    if layout == "NHWC":
        g = cp.ascontiguousarray(g.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return g


def _compare(shape, dtype, layout, runs, alpha=1.0, beta=0.0, strided_out=False, seed=0):
    p, desc = _problem(shape, dtype)
    rng = np.random.default_rng(seed)
    x, dy = (rng.standard_normal(s) for s in (p.x_shape, p.y_shape))
    u_in, u_out = 2.0 ** -24, 2.0 ** -24
    dt = _np_dtype(dtype)
    if dtype != "float32":
        x, dy = (a.astype(dt).astype(F64) for a in (x, dy))          # the exact values the kernel sees
        u_in, u_out = 0.0, (2.0 ** -11 if dtype == "float16" else 2.0 ** -8)
    ref, ref_abs = _ref(desc, p, x, dy)
    prior = rng.standard_normal(p.w_shape).astype(dt).astype(F64)
    start = prior if beta != 0 else np.full(p.w_shape, np.nan)
    if strided_out:        # a non-contiguous dw: computed contiguous, blended afterwards
        big = cp.asarray(np.full((p.w_shape[0], p.w_shape[1] + 1, *p.w_shape[2:]), np.nan).astype(dt))
        out = big[:, 1:]
        out[...] = cp.asarray(start.astype(dt))
    else:
        out = cp.asarray(start.astype(dt))
    del runs[:]
    got = K.direct_backward_filter(p, _to_gpu(x, dt, layout), _to_gpu(dy, dt, layout), False, alpha, beta, out)
    assert got is out
    got = cp.asnumpy(got).astype(F64)
    want = alpha * ref + beta * prior
    bound = _bound(p, abs(alpha) * ref_abs + abs(beta) * np.abs(prior), u_in, u_out)
    what = f"{shape[0]} {dtype} {layout} alpha={alpha} beta={beta} strided_out={strided_out}"
    assert not np.isnan(got).any(), f"{what}: unwritten (NaN) elements"
    err = np.abs(got - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"{what}: |got - ref| = {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst} "
                                  f"(got {got[worst]}, ref {want[worst]})")
    if layout == "NCHW":
        assert runs == [True], f"{what}: the tile kernel did not run ({runs})"
    else:       # NHWC: conv_dw_nhwc's kernels where they apply (before the tile path: no call), else the generic one
        assert runs in ([], [False]), f"{what}: {runs}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_wgrad_tile_matches_float64(shape, dtype, wgrad_runs):
    _compare(shape, dtype, "NCHW", wgrad_runs, seed=SHAPES.index(shape))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", ["ragged-3x3", "stride3-pad2", "5x5-dil2", "multiplier2-stride2",
                                  "dense-c1-lenet-b64", "dense-c1-k16-ragged", "dense-c1-stride2",
                                  "dense-c6-lenet-conv2-b64", "dense-c3-k16-ragged", "dense-c3-stride2"])
def test_wgrad_nhwc_keeps_the_generic_kernel(name, dtype, wgrad_runs):
    _compare(_shape(name), dtype, "NHWC", wgrad_runs, seed=3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["ragged-3x3", "56-many-splits", "14-few-rows", "7x7-stride2", "groups-cg4",
                                  "dense-c1-lenet-b64", "dense-c1-pad2", "dense-c6-lenet-conv2-b64",
                                  "dense-c3-stride2"])
def test_wgrad_tile_blends_alpha_beta(name, dtype, wgrad_runs):
    _compare(_shape(name), dtype, "NCHW", wgrad_runs, alpha=0.75, beta=-0.5, seed=7)
    _compare(_shape(name), dtype, "NCHW", wgrad_runs, alpha=2.0, beta=1.0, strided_out=True, seed=8)


def test_wgrad_tile_splits_are_exercised():
    """56-many-splits runs each filter row over several blocks (tickets); 14-few-rows keeps several TZ slices."""
    sms = K._launch.sm_count()
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = _shape("56-many-splits")
    assert K.wgrad_config(N, Kc, H, W, R, S, stride, dil, sms)[6] > 4
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = _shape("14-few-rows")
    assert K.wgrad_config(N, Kc, H, W, R, S, stride, dil, sms)[2] > 1
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = _shape("dense-c1-lenet-b64")     # 6 rows of 64 tiles
    assert K.wgrad_config(N, Kc, H - R + 1, W - S + 1, R, S, stride, dil, sms)[6] > 1
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = _shape("dense-c6-lenet-conv2-b64")   # 96 rows (k * 6 + c)
    assert K.wgrad_config(N, Kc * C, H - R + 1, W - S + 1, R, S, stride, dil, sms)[6] > 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["56-many-splits", "many-rows", "7x7-pad3", "dense-c1-lenet-b64",
                                  "dense-c6-lenet-conv2-b64", "dense-c3-stem-32"])
def test_wgrad_tile_is_one_launch_bitwise_repeatable(name, dtype):
    p, _ = _problem(_shape(name), dtype)
    rng = np.random.default_rng(5)
    dt = _np_dtype(dtype)
    xg, dyg = (cp.asarray(rng.standard_normal(s).astype(dt)) for s in (p.x_shape, p.y_shape))
    first = K.direct_backward_filter(p, xg, dyg)
    uint = cp.uint32 if dtype == "float32" else cp.uint16
    for _ in range(3):
        before = K._launch.launch_count()
        again = K.direct_backward_filter(p, xg, dyg)
        assert K._launch.launch_count() - before == 1
        assert cp.array_equal(first.view(uint), again.view(uint)), "repeated runs differ"
    tickets = K._ticket_arrays.get(xg.data.device_id)
    if tickets is not None:
        assert int(tickets.max()) == 0, "a ticket was left drawn"


def test_wgrad_switch_and_primitive(wgrad_runs):
    """Through the primitive's ALGO_0 (handle.deterministic default) the tile kernel runs; TILE_ENABLED = False
    gives the plane kernel (two launches) the same answer within rounding; an interleaved implicit-GEMM split-K
    filter gradient (which shares the ticket array) leaves both right."""
    shape = _shape("56-many-splits")
    p, desc = _problem(shape)
    rng = np.random.default_rng(9)
    x, dy = (rng.standard_normal(s) for s in (p.x_shape, p.y_shape))
    xg, dyg = cp.asarray(x, np.float32), cp.asarray(dy, np.float32)
    h = Handle("cuda")
    del wgrad_runs[:]
    dw = convolution_backward_filter(h, xg, dyg, desc, p.w_shape, algo=ConvolutionBwdFilterAlgo.ALGO_0)
    assert wgrad_runs == [True], wgrad_runs
    ref, ref_abs = _ref(desc, p, x, dy)
    bound = _bound(p, ref_abs, 2.0 ** -24, 2.0 ** -24)
    assert (np.abs(cp.asnumpy(dw).astype(F64) - ref) <= bound).all()
    old = K.TILE_ENABLED[0]
    K.TILE_ENABLED[0] = False
    try:
        del wgrad_runs[:]
        before = K._launch.launch_count()
        dw_plane = K.direct_backward_filter(p, xg, dyg)
        assert K._launch.launch_count() - before == 2 and wgrad_runs == [False]
    finally:
        K.TILE_ENABLED[0] = old
    assert (np.abs(cp.asnumpy(dw_plane).astype(F64) - ref) <= bound).all()
    # a dense split-K filter gradient between two tile runs: the shared tickets stay consistent
    pd = make_problem("dense", (8, 16, 16, 16), (16, 16, 3, 3), ConvolutionDescriptor(1), "float32")
    xd = cp.asarray(rng.standard_normal(pd.x_shape), np.float32)
    dyd = cp.asarray(rng.standard_normal(pd.y_shape), np.float32)
    a = K.implicit_backward_filter(pd, xd, dyd)
    again = K.direct_backward_filter(p, xg, dyg)
    b = K.implicit_backward_filter(pd, xd, dyd)
    assert cp.array_equal(again.view(cp.uint32), K.direct_backward_filter(p, xg, dyg).view(cp.uint32))
    assert cp.array_equal(a.view(cp.uint32), b.view(cp.uint32))


def test_dgrad_tile_reads_the_filter_flipped_in_one_launch():
    """Stride-1 backward data through dw_tile_forward with FLIP=1: one launch (no flipped copy of w), and the same
    answer as the plane kernel on the flipped copy."""
    p, _ = _problem(_shape("groups-cg4"))
    rng = np.random.default_rng(2)
    wg = cp.asarray(rng.standard_normal(p.w_shape), np.float32)
    dyg = cp.asarray(rng.standard_normal(p.y_shape), np.float32)
    K.direct_backward_data(p, wg, dyg)
    before = K._launch.launch_count()
    dx = K.direct_backward_data(p, wg, dyg)
    assert K._launch.launch_count() - before == 1
    old = K.TILE_ENABLED[0]
    K.TILE_ENABLED[0] = False
    try:
        dx_plane = K.direct_backward_data(p, wg, dyg)
    finally:
        K.TILE_ENABLED[0] = old
    cp.testing.assert_allclose(dx, dx_plane, rtol=1e-5, atol=1e-5)
