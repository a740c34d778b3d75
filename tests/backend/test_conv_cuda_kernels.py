"""The CUDA convolution kernels (backend/cuda/conv_igemm.py: implicit GEMM and direct) against float64 references.

Every kernel, every direction, over a table of shapes with ragged tails (sizes no tile divides), N=1, C=K=1,
stride 2/3, dilation 2, padding 0-3, kernels 1x1 to 7x7, groups 1/2/4-channel/depthwise (and a channel
multiplier), 1-D, NCHW and NHWC memory; strict fp32 and TF32, float16 and bfloat16; alpha/beta blending with a
poisoned output (every element must be written); bitwise-repeatable filter gradients; the registry, heuristic
and find on CuPy arrays.  The reference is the backend's own GEMM algorithm run in float64 on the CPU (itself
tested against an independent float64 reference in test_convolution.py).

Tolerances are error bounds, not guesses: |got - ref| <= (2*u_in + KR*2^-23 + u_out) * conv(|x|, |w|) * 1.5,
where KR is the reduction length of the direction, u_in the rounding of the operands the multiplier sees (2^-11
for TF32, 0 for half inputs, which are exact in fp32) and u_out the rounding of the stored result.
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
    MathType,
    Status,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_forward,
    find_convolution_backward_data_algorithm,
    find_convolution_backward_filter_algorithm,
    find_convolution_forward_algorithm,
    get_convolution_backward_data_algorithm_v7,
    get_convolution_backward_filter_algorithm_v7,
    get_convolution_forward_algorithm_v7,
)
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402

F64 = np.float64


@pytest.fixture(autouse=True)
def _the_kernels():
    """This file tests the kernels: 1x1 NHWC problems too (not conv_pointwise's cublasLt product, which
    test_conv_pointwise.py tests)."""
    from minidnn.backend.cuda import conv_pointwise as PW
    PW.ENABLED[0] = False
    try:
        yield
    finally:
        PW.ENABLED[0] = True

# (id, N, C, H, W, K, R, S, padding, stride, dilation, groups)
SHAPES = [
    ("n1-c3-odd", 1, 3, 7, 9, 5, 3, 3, 1, 1, 1, 1),
    ("stride2-ragged", 2, 17, 11, 10, 33, 3, 3, 1, 2, 1, 1),
    ("dil2-pad2", 2, 8, 12, 13, 12, 3, 3, 2, 1, 2, 1),
    ("1x1", 3, 16, 9, 9, 16, 1, 1, 0, 1, 1, 1),
    ("groups2", 2, 12, 10, 10, 18, 3, 3, 1, 1, 1, 2),
    ("5x5-pad3", 2, 6, 13, 7, 6, 5, 5, 3, 1, 1, 1),
    ("c1-k1-stride3", 1, 1, 8, 8, 1, 3, 3, 0, 3, 1, 1),
    ("c40-k70", 2, 40, 6, 7, 70, 3, 3, 1, 1, 1, 1),
    ("c64-k64", 2, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1),
    ("7x7-stride2-pad3", 1, 4, 10, 11, 8, 7, 7, 3, 2, 1, 1),
    ("k128-pad0", 1, 24, 5, 6, 130, 3, 3, 0, 1, 1, 1),
    ("groups4-cg4", 2, 16, 8, 9, 16, 3, 3, 1, 1, 1, 4),
    ("depthwise", 2, 8, 9, 11, 8, 3, 3, 1, 1, 1, 8),
    ("depthwise-x2-stride2", 2, 6, 10, 9, 12, 3, 3, 1, 2, 1, 6),
    ("depthwise-5x5-dil2", 1, 16, 11, 12, 16, 5, 5, 2, 1, 2, 16),
    ("groups32-cg4-stride2", 2, 128, 7, 8, 128, 3, 3, 1, 2, 1, 32),
    ("depthwise-7x7-wide", 1, 4, 9, 40, 4, 7, 7, 3, 1, 1, 4),
    ("depthwise-stride2-wide", 2, 8, 21, 37, 8, 3, 3, 1, 2, 1, 8),
    ("1x1-stride2", 2, 8, 9, 8, 12, 1, 1, 0, 2, 1, 1),            # kernel < stride: dgrad stays one launch
    ("2x2-stride3-pad1", 2, 5, 10, 11, 7, 2, 2, 1, 3, 1, 1),      # (residue classes without a tap)
]
SMALL_GROUPS = [s for s in SHAPES if s[-1] > 1 and s[2] // s[-1] <= K.DIRECT_MAX_CG]


def _problem(shape, dtype="float32"):
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = shape
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    return make_problem("test", (N, C, H, W), (Kc, C // groups, R, S), desc, dtype), desc


def _data(p, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(p.x_shape)
    w = rng.standard_normal(p.w_shape)
    dy = rng.standard_normal(p.y_shape)
    return x, w, dy


def _ref(direction, desc, p, x, w, dy):
    """float64 on the CPU through the backend's GEMM reference, plus the same of the absolute values (the
    scale of the rounding error bound)."""
    def run(x, w, dy):
        if direction == "forward":
            return convolution_forward(None, x, w, desc, algo=ConvolutionFwdAlgo.GEMM)
        if direction == "backward_data":
            return convolution_backward_data(None, w, dy, desc, p.x_shape, algo=ConvolutionBwdDataAlgo.ALGO_1)
        return convolution_backward_filter(None, x, dy, desc, p.w_shape, algo=ConvolutionBwdFilterAlgo.ALGO_1)
    return run(x, w, dy), run(np.abs(x), np.abs(w), np.abs(dy))


def _reduction(direction, p):
    taps = math.prod(p.kernel)
    return {"forward": p.Cg * taps, "backward_data": p.Kg * taps,
            "backward_filter": p.N * math.prod(p.out_size)}[direction]


def _bound(direction, p, ref_abs, u_in, u_out):
    return 1.5 * (2 * u_in + _reduction(direction, p) * 2.0 ** -23 + u_out) * ref_abs + 1e-30


def _to_gpu(a, dtype, layout):
    g = cp.asarray(a.astype(dtype))
    if layout == "NHWC" and a.ndim == 4:
        # channels-last memory seen through a channels-first view, as convolution.py hands it to algorithms
        g = cp.ascontiguousarray(g.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return g


def _poisoned(shape, dtype, layout):
    return _to_gpu(np.full(shape, np.nan), dtype, layout)


def _check(got, ref, bound, what):
    got = cp.asnumpy(got).astype(F64)
    assert not np.isnan(got).any(), f"{what}: unwritten (NaN) elements"
    err = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"{what}: |got - ref| = {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst} "
                                  f"(got {got[worst]}, ref {ref[worst]})")


def _run_kernel(kind, direction, p, x, w, dy, tf32, precomp, out, alpha=1.0, beta=0.0, tile=None):
    if kind == "implicit":
        if direction == "forward":
            return K.implicit_forward(p, x, w, tf32, precomp, alpha, beta, out, tile)
        if direction == "backward_data":
            return K.implicit_backward_data(p, w, dy, tf32, precomp, alpha, beta, out, tile)
        return K.implicit_backward_filter(p, x, dy, tf32, precomp, alpha, beta, out, tile)
    if direction == "forward":
        return K.direct_forward(p, x, w, tf32, alpha, beta, out)
    if direction == "backward_data":
        return K.direct_backward_data(p, w, dy, tf32, alpha, beta, out)
    return K.direct_backward_filter(p, x, dy, tf32, alpha, beta, out)


def _out_shape(direction, p):
    return {"forward": p.y_shape, "backward_data": p.x_shape, "backward_filter": p.w_shape}[direction]


DIRECTIONS = ["forward", "backward_data", "backward_filter"]


def _compare(kind, shape, layout, tf32, dtype="float32", precomp=False, seed=0, tile=None):
    p, desc = _problem(shape, dtype)
    x, w, dy = _data(p, seed)
    u_in, u_out = (2.0 ** -11 if tf32 else 2.0 ** -24), 2.0 ** -24
    if dtype != "float32":
        npdt = np.float16 if dtype == "float16" else _bf16()
        x, w, dy = (a.astype(npdt).astype(F64) for a in (x, w, dy))        # the exact values the kernel sees
        u_in, u_out = 0.0, (2.0 ** -11 if dtype == "float16" else 2.0 ** -8)
    dt = np.float32 if dtype == "float32" else (np.float16 if dtype == "float16" else _bf16())
    xg, dyg = _to_gpu(x, dt, layout), _to_gpu(dy, dt, layout)
    wg = cp.asarray(w.astype(dt))
    for direction in DIRECTIONS:
        ref, ref_abs = _ref(direction, desc, p, x, w, dy)
        out = _poisoned(_out_shape(direction, p), dt, "NCHW" if direction == "backward_filter" else layout)
        got = _run_kernel(kind, direction, p, xg, wg, dyg, tf32, precomp, out, tile=tile)
        assert got is out
        _check(got, ref, _bound(direction, p, ref_abs, u_in, u_out),
               f"{kind} {direction} {shape[0]} {layout} {dtype} tf32={tf32} precomp={precomp} tile={tile}")


def _bf16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return ml_dtypes.bfloat16


# ---- implicit GEMM ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("math_mode", ["fp32", "tf32"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_implicit_gemm_matches_float64(shape, layout, math_mode):
    precomp = SHAPES.index(shape) % 2 == 1            # IMPLICIT_GEMM and IMPLICIT_PRECOMP_GEMM alternate
    _compare("implicit", shape, layout, math_mode == "tf32", precomp=precomp, seed=SHAPES.index(shape))


@pytest.mark.parametrize("tile", list(K.TILES))
@pytest.mark.parametrize("math_mode", ["fp32", "tf32"])
def test_every_tile(tile, math_mode):
    """Each tile shape on a problem it does not divide, table and no table."""
    shape = ("tiles", 2, 37, 9, 10, 70, 3, 3, 1, 1, 1, 1)
    _compare("implicit", shape, "NCHW", math_mode == "tf32", tile=tile, precomp=tile.startswith("64x6"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[4], SHAPES[8], SHAPES[10]], ids=lambda s: s[0])
def test_implicit_gemm_half_inputs(shape, dtype):
    _compare("implicit", shape, "NCHW", True, dtype=dtype, precomp=True, tile="64x32")   # one tile: fewer compiles


def test_implicit_gemm_1d():
    desc = ConvolutionDescriptor(2, 2, 2)
    p = make_problem("test", (3, 5, 23), (7, 5, 3), desc, "float32")
    rng = np.random.default_rng(5)
    x, w, dy = rng.standard_normal(p.x_shape), rng.standard_normal(p.w_shape), rng.standard_normal(p.y_shape)
    for direction in DIRECTIONS:
        ref, ref_abs = _ref(direction, desc, p, x, w, dy)
        for kind in ("implicit",):
            got = _run_kernel(kind, direction, p, cp.asarray(x, np.float32), cp.asarray(w, np.float32),
                              cp.asarray(dy, np.float32), False, True, None)
            _check(got, ref, _bound(direction, p, ref_abs, 2.0 ** -24, 2.0 ** -24), f"1-D {direction}")


def test_tf32_really_uses_tensor_cores_and_fp32_does_not():
    """A reduction of 576: TF32's 10-bit mantissa shows in the error, strict fp32 stays at fp32 rounding."""
    p, desc = _problem(SHAPES[8])
    x, w, dy = _data(p, 11)
    ref, _ = _ref("forward", desc, p, x, w, dy)
    xg, wg = cp.asarray(x, np.float32), cp.asarray(w, np.float32)
    rel = {}
    for tf32 in (False, True):
        got = cp.asnumpy(K.implicit_forward(p, xg, wg, tf32)).astype(F64)
        rel[tf32] = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel[False] < 1e-6 and 1e-5 < rel[True] < 3e-3, rel


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("kind", ["implicit", "direct"])
def test_alpha_beta_blending(kind, direction):
    shape = SHAPES[11]                                    # groups of 4 channels: both kernels run it
    p, desc = _problem(shape)
    x, w, dy = _data(p, 3)
    ref, ref_abs = _ref(direction, desc, p, x, w, dy)
    prior = np.random.default_rng(4).standard_normal(ref.shape).astype(np.float32)
    alpha, beta = 0.75, -0.5
    out = cp.asarray(prior)
    got = _run_kernel(kind, direction, p, cp.asarray(x, np.float32), cp.asarray(w, np.float32),
                      cp.asarray(dy, np.float32), False, True, out, alpha, beta)
    want = alpha * ref + beta * prior.astype(F64)
    bound = _bound(direction, p, abs(alpha) * ref_abs + abs(beta) * np.abs(prior), 2.0 ** -24, 2.0 ** -24)
    _check(got, want, bound, f"{kind} {direction} alpha/beta")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", ["stride2-ragged", "1x1-stride2", "2x2-stride3-pad1", "groups32-cg4-stride2"])
def test_strided_backward_data_blends_every_residue_class(name, layout):
    """A strided backward data runs its stride-1 residue classes of dx in one launch (a kernel smaller than the
    stride leaves classes without a tap: alpha*0 + beta*dx there): alpha/beta must reach every element once, in
    either memory layout, with fresh data each time."""
    shape = next(s for s in SHAPES if s[0] == name)
    p, desc = _problem(shape)
    x, w, dy = _data(p, None)
    ref, ref_abs = _ref("backward_data", desc, p, x, w, dy)
    prior = np.random.default_rng().standard_normal(ref.shape).astype(np.float32)
    alpha, beta = 0.75, -0.5
    out = _to_gpu(prior, np.float32, layout)
    got = K.implicit_backward_data(p, cp.asarray(w, np.float32), _to_gpu(dy, np.float32, layout), False,
                                   SHAPES.index(shape) % 2 == 1, alpha, beta, out)
    assert got is out
    want = alpha * ref + beta * prior.astype(F64)
    bound = _bound("backward_data", p, abs(alpha) * ref_abs + abs(beta) * np.abs(prior), 2.0 ** -24, 2.0 ** -24)
    _check(got, want, bound, f"strided backward data {name} {layout} alpha/beta")


def test_strided_backward_data_1d():
    desc = ConvolutionDescriptor(1, 2, 1)
    p = make_problem("test", (3, 5, 23), (7, 5, 4), desc, "float32")
    x, w, dy = _data(p, None)
    ref, ref_abs = _ref("backward_data", desc, p, x, w, dy)
    got = K.implicit_backward_data(p, cp.asarray(w, np.float32), cp.asarray(dy, np.float32), False, True)
    _check(got, ref, _bound("backward_data", p, ref_abs, 2.0 ** -24, 2.0 ** -24), "1-D stride 2 backward data")


@pytest.mark.parametrize("kind", ["implicit", "direct"])
def test_filter_gradient_is_bitwise_repeatable(kind):
    shape = ("big-reduction", 8, 16, 20, 20, 16, 3, 3, 1, 1, 1, 4 if kind == "direct" else 1)
    p, _ = _problem(shape)
    x, _, dy = _data(p, 9)
    xg, dyg = cp.asarray(x, np.float32), cp.asarray(dy, np.float32)
    first = cp.asnumpy(_run_kernel(kind, "backward_filter", p, xg, None, dyg, True, False, None))
    for _ in range(3):
        again = cp.asnumpy(_run_kernel(kind, "backward_filter", p, xg, None, dyg, True, False, None))
        assert np.array_equal(first.view(np.uint32), again.view(np.uint32))


# ---- direct (depthwise / small groups) -------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SMALL_GROUPS, ids=[s[0] for s in SMALL_GROUPS])
def test_direct_matches_float64(shape, layout):
    _compare("direct", shape, layout, False, seed=SMALL_GROUPS.index(shape))


def test_direct_half_and_1d():
    _compare("direct", SHAPES[13], "NCHW", False, dtype="float16")
    desc = ConvolutionDescriptor(1, 1, 1, 6)
    p = make_problem("test", (2, 6, 17), (6, 1, 3), desc, "float32")
    rng = np.random.default_rng(8)
    x, w, dy = rng.standard_normal(p.x_shape), rng.standard_normal(p.w_shape), rng.standard_normal(p.y_shape)
    for direction in DIRECTIONS:
        ref, ref_abs = _ref(direction, desc, p, x, w, dy)
        got = _run_kernel("direct", direction, p, cp.asarray(x, np.float32), cp.asarray(w, np.float32),
                          cp.asarray(dy, np.float32), False, False, None)
        _check(got, ref, _bound(direction, p, ref_abs, 2.0 ** -24, 2.0 ** -24), f"direct 1-D {direction}")


# ---- through the primitives: registry, heuristic, find -----------------------------------------------------

@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("math_type", [MathType.DEFAULT, MathType.TENSOR_OP])
def test_primitives_run_the_kernels_by_name(fmt, math_type):
    shape = SHAPES[1]
    p, desc = _problem(shape)
    desc = ConvolutionDescriptor(desc.padding, desc.stride, desc.dilation, desc.groups, math_type=math_type)
    x, w, dy = _data(p, 21)
    h = Handle("cuda")
    u_in = 2.0 ** -11 if math_type is MathType.TENSOR_OP else 2.0 ** -24
    nhwc = fmt == "NHWC"
    xd = cp.asarray(np.ascontiguousarray(np.moveaxis(x, 1, -1)) if nhwc else x, np.float32)
    dyd = cp.asarray(np.ascontiguousarray(np.moveaxis(dy, 1, -1)) if nhwc else dy, np.float32)
    wd = cp.asarray(w, np.float32)
    back = (lambda a: np.moveaxis(cp.asnumpy(a), -1, 1)) if nhwc else cp.asnumpy
    for algo in (ConvolutionFwdAlgo.IMPLICIT_GEMM, ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM):
        ref, ref_abs = _ref("forward", desc, p, x, w, dy)
        y0 = np.random.default_rng(1).standard_normal(ref.shape)
        y = cp.asarray(np.ascontiguousarray(np.moveaxis(y0, 1, -1)) if nhwc else y0, np.float32)
        got = convolution_forward(h, xd, wd, desc, algo=algo, alpha=2.0, beta=0.5, y=y, format=fmt)
        _check(back(got), 2 * ref + 0.5 * y0, _bound("forward", p, 2 * ref_abs + 0.5 * np.abs(y0), u_in, 2.0 ** -24),
               f"{algo} {fmt}")
    ref, ref_abs = _ref("backward_data", desc, p, x, w, dy)
    got = convolution_backward_data(h, wd, dyd, desc, xd.shape, algo=ConvolutionBwdDataAlgo.ALGO_0, format=fmt)
    _check(back(got), ref, _bound("backward_data", p, ref_abs, u_in, 2.0 ** -24), f"bwd data ALGO_0 {fmt}")
    ref, ref_abs = _ref("backward_filter", desc, p, x, w, dy)
    for algo in (ConvolutionBwdFilterAlgo.ALGO_0, ConvolutionBwdFilterAlgo.ALGO_3):
        got = convolution_backward_filter(h, xd, dyd, desc, w.shape, algo=algo, format=fmt)
        _check(got, ref, _bound("backward_filter", p, ref_abs, u_in, 2.0 ** -24), f"bwd filter {algo} {fmt}")


def test_depthwise_direct_through_the_primitives_and_the_heuristic_picks_the_kernels():
    p, desc = _problem(SHAPES[12])
    x, w, dy = _data(p, 2)
    h = Handle("cuda")
    ranked = get_convolution_forward_algorithm_v7(h, p.x_shape, p.w_shape, desc)
    assert ranked[0].algo is ConvolutionFwdAlgo.DIRECT, ranked[:3]
    got = convolution_forward(h, cp.asarray(x, np.float32), cp.asarray(w, np.float32), desc)
    ref, ref_abs = _ref("forward", desc, p, x, w, dy)
    _check(got, ref, _bound("forward", p, ref_abs, 2.0 ** -24, 2.0 ** -24), "heuristic depthwise forward")
    assert get_convolution_backward_data_algorithm_v7(h, p.w_shape, p.y_shape, desc, p.x_shape)[0].algo \
        is ConvolutionBwdDataAlgo.ALGO_0
    assert get_convolution_backward_filter_algorithm_v7(h, p.x_shape, p.y_shape, desc, p.w_shape)[0].algo \
        is ConvolutionBwdFilterAlgo.ALGO_0
    dense, ddesc = _problem(SHAPES[8])
    assert get_convolution_forward_algorithm_v7(h, dense.x_shape, dense.w_shape, ddesc)[0].algo in \
        (ConvolutionFwdAlgo.IMPLICIT_GEMM, ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM)


def test_find_times_the_kernels():
    p, desc = _problem(SHAPES[8])
    x, w, dy = _data(p, 6)
    h = Handle("cuda")
    xd, wd, dyd = (cp.asarray(a, np.float32) for a in (x, w, dy))
    perfs = find_convolution_forward_algorithm(h, xd, wd, desc)
    ok = {perf.algo for perf in perfs if perf.status is Status.SUCCESS}
    assert {ConvolutionFwdAlgo.IMPLICIT_GEMM, ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM} <= ok
    assert all(perf.time > 0 for perf in perfs if perf.status is Status.SUCCESS)
    ok = {perf.algo for perf in find_convolution_backward_filter_algorithm(h, xd, dyd, desc, p.w_shape)
          if perf.status is Status.SUCCESS}
    assert ConvolutionBwdFilterAlgo.ALGO_3 in ok and ConvolutionBwdFilterAlgo.ALGO_0 in ok
    ok = {perf.algo for perf in find_convolution_backward_data_algorithm(h, wd, dyd, desc, p.x_shape)
          if perf.status is Status.SUCCESS}
    assert ConvolutionBwdDataAlgo.ALGO_0 in ok


def test_half_data_through_the_primitive_runs_natively():
    p, desc = _problem(SHAPES[8], "float16")
    x, w, dy = _data(p, 7)
    x, w = x.astype(np.float16).astype(F64), w.astype(np.float16).astype(F64)
    got = convolution_forward(Handle("cuda"), cp.asarray(x, np.float16), cp.asarray(w, np.float16), desc,
                              algo=ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM)
    assert got.dtype == np.float16
    ref, ref_abs = _ref("forward", desc, p, x, w, dy)
    _check(got, ref, _bound("forward", p, ref_abs, 0.0, 2.0 ** -11), "fp16 primitive")


# ---- the filter gradient's split-K in one launch (the last block of a tile adds the splits in order) ------------

# (id, N, C, H, W, K, R, S, padding, stride, dilation, groups): reductions N*P*Q that no split length divides
SPLIT_K_SHAPES = [
    ("splitk-ragged", 3, 7, 13, 11, 19, 3, 3, 1, 1, 1, 1),
    ("splitk-many", 16, 16, 19, 21, 24, 3, 3, 1, 1, 1, 1),
    ("splitk-groups2-stride2", 4, 12, 17, 15, 10, 3, 3, 1, 2, 1, 2),
    ("splitk-5x5-dil2-groups2", 5, 20, 14, 13, 14, 5, 5, 2, 1, 2, 2),
    ("splitk-k70-tall", 6, 40, 9, 10, 70, 3, 3, 1, 1, 1, 1),
]


def _filter_splits(p, dtype, tile=None):
    """The split count the launcher settles for the filter gradient of ``p``."""
    from minidnn.backend.cuda import launch as L
    crs, kr = p.Cg * math.prod(p.kernel), p.N * math.prod(p.out_size)
    tile = tile or K.choose_tile(crs, p.Kg, p.groups, L.sm_count())
    BM, BN, BK = K.TILES[tile][:3]
    if dtype != "float32":
        BK = 32
    tiles = -(-crs // BM) * -(-p.Kg // BN) * p.groups
    return K.filter_splits(kr, tiles, p.groups, BK, L.sm_count())[0]


def _np_dtype(dtype):
    return np.float32 if dtype == "float32" else (np.float16 if dtype == "float16" else _bf16())


@pytest.mark.parametrize("mode", ["fp32", "tf32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SPLIT_K_SHAPES, ids=[s[0] for s in SPLIT_K_SHAPES])
def test_split_k_filter_gradient_blends_and_writes_every_element(shape, layout, mode):
    """Split-K > 1 with a ragged last split and ragged tiles: beta = 0 into a NaN-poisoned dw (every element
    written once), then alpha/beta blending over a prior dw, both against float64."""
    dtype = "float32" if mode in ("fp32", "tf32") else mode
    p, desc = _problem(shape, dtype)
    assert _filter_splits(p, dtype) > 1, "the shape must exercise split-K"
    x, w, dy = _data(p, SPLIT_K_SHAPES.index(shape))
    u_in, u_out = (2.0 ** -11 if mode == "tf32" else 2.0 ** -24), 2.0 ** -24
    dt = _np_dtype(dtype)
    if dtype != "float32":
        x, dy = (a.astype(dt).astype(F64) for a in (x, dy))
        u_in, u_out = 0.0, (2.0 ** -11 if dtype == "float16" else 2.0 ** -8)
    xg, dyg = _to_gpu(x, dt, layout), _to_gpu(dy, dt, layout)
    ref, ref_abs = _ref("backward_filter", desc, p, x, w, dy)
    precomp = SPLIT_K_SHAPES.index(shape) % 2 == 0
    out = _poisoned(p.w_shape, dt, "NCHW")
    got = K.implicit_backward_filter(p, xg, dyg, mode != "fp32", precomp, out=out)
    assert got is out
    _check(got, ref, _bound("backward_filter", p, ref_abs, u_in, u_out), f"split-K {shape[0]} {layout} {mode}")
    prior = np.random.default_rng(4).standard_normal(ref.shape).astype(dt).astype(F64)
    alpha, beta = 0.75, -0.5
    out = cp.asarray(prior.astype(dt))
    got = K.implicit_backward_filter(p, xg, dyg, mode != "fp32", precomp, alpha, beta, out)
    want = alpha * ref + beta * prior
    bound = _bound("backward_filter", p, abs(alpha) * ref_abs + abs(beta) * np.abs(prior), u_in, u_out)
    _check(got, want, bound, f"split-K {shape[0]} {layout} {mode} alpha/beta")


@pytest.mark.parametrize("mode", ["fp32", "tf32", "bfloat16"])
def test_split_k_is_bitwise_repeatable_and_leaves_the_tickets_zeroed(mode):
    """Two runs give the same bits whichever block of a tile finishes last; the ticket counters are back at 0."""
    dtype = "float32" if mode != "bfloat16" else mode
    shape = SPLIT_K_SHAPES[1]
    p, _ = _problem(shape, dtype)
    assert _filter_splits(p, dtype) > 8
    x, _, dy = _data(p, 12)
    dt = _np_dtype(dtype)
    xg, dyg = _to_gpu(x, dt, "NHWC"), _to_gpu(dy, dt, "NHWC")
    runs = [cp.asnumpy(K.implicit_backward_filter(p, xg, dyg, mode != "fp32", False)) for _ in range(3)]
    bits = [r.view(np.uint16 if dt != np.float32 else np.uint32) for r in runs]
    assert all(np.array_equal(bits[0], b) for b in bits[1:])
    cp.cuda.Device().synchronize()
    tickets = K._ticket_arrays[cp.cuda.runtime.getDevice()]
    assert int(cp.count_nonzero(tickets)) == 0


def test_split_k_sums_the_splits_in_order():
    """The result is the float32 sum of the per-split partial products taken in split order 0..S-1: each split's
    product is computed by the kernel itself (the same launch restricted to one split's slice of the batch, one
    image per split), then added on the host in order -- bitwise equal to the one-launch split-K."""
    # one image per split: N*P*Q = 4 * 8*16, 128 rows (8 slices of 16) per split when the launcher picks 4 splits
    shape = ("splitk-per-image", 4, 8, 8, 16, 8, 3, 3, 1, 1, 1, 1)
    p, desc = _problem(shape)
    if _filter_splits(p, "float32") != 4:
        pytest.skip("the launcher picks another split count on this GPU")
    x, _, dy = _data(p, 13)
    xg, dyg = cp.asarray(x, np.float32), cp.asarray(dy, np.float32)
    whole = cp.asnumpy(K.implicit_backward_filter(p, xg, dyg, False, False))
    p1, _ = _problem(("one", 1, 8, 8, 16, 8, 3, 3, 1, 1, 1, 1))
    if _filter_splits(p1, "float32") != 1:
        pytest.skip("a single image would itself be split on this GPU")
    total = np.zeros(p.w_shape, np.float32)
    for n in range(4):
        total = total + cp.asnumpy(K.implicit_backward_filter(p1, xg[n:n + 1], dyg[n:n + 1], False, False))
    assert np.array_equal(whole.view(np.uint32), total.view(np.uint32))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_filter_gradient_is_one_launch(layout):
    """The split-K reduction lives in the main kernel: one launch per filter gradient, kernel or primitive."""
    from minidnn.backend.cuda import launch as L
    shape = SPLIT_K_SHAPES[1]
    p, desc = _problem(shape)
    assert _filter_splits(p, "float32") > 1
    x, _, dy = _data(p, 14)
    xg, dyg = _to_gpu(x, np.float32, layout), _to_gpu(dy, np.float32, layout)
    K.implicit_backward_filter(p, xg, dyg, True, True)                  # compile and plan
    before = L.launch_count()
    K.implicit_backward_filter(p, xg, dyg, True, True)
    assert L.launch_count() - before == 1
    out = cp.zeros(p.w_shape, np.float32)
    before = L.launch_count()
    K.implicit_backward_filter(p, xg, dyg, True, True, 0.5, 0.25, out)
    assert L.launch_count() - before == 1
    h = Handle("cuda")
    fmt = layout
    xd = cp.ascontiguousarray(xg.transpose(0, 2, 3, 1)) if layout == "NHWC" else xg
    dyd = cp.ascontiguousarray(dyg.transpose(0, 2, 3, 1)) if layout == "NHWC" else dyg
    convolution_backward_filter(h, xd, dyd, desc, p.w_shape, algo=ConvolutionBwdFilterAlgo.ALGO_3, format=fmt)
    before = L.launch_count()
    convolution_backward_filter(h, xd, dyd, desc, p.w_shape, algo=ConvolutionBwdFilterAlgo.ALGO_3, format=fmt)
    assert L.launch_count() - before == 1


# ---- the NHWC 16-byte loader (the kernel's VEC=1 variant: forward, stride-1 backward data, backward filter) -------

# (id, N, C, H, W, K, R, S, padding, stride, dilation, groups); K ragged against every tile, N = 1, C per group
# 4 (float32 only) to 64, 1x1 / 3x3 / 5x5, stride 2 (forward; backward data through the stride-1 residue classes),
# padding 0-2, dilation 2, groups 2.  Backward data vectorises over K/G: where that is not a whole vector the
# element loader runs it (still checked here); the filter gradient vectorises over both.
VEC_SHAPES = [
    ("v-c4-k6", 2, 4, 9, 11, 6, 3, 3, 1, 1, 1, 1),
    ("v-c8-k12-n1-pad0", 1, 8, 7, 10, 12, 3, 3, 0, 1, 1, 1),
    ("v-c16-k16-stride2", 3, 16, 13, 12, 16, 3, 3, 1, 2, 1, 1),
    ("v-c24-k40-5x5-pad2", 2, 24, 11, 9, 40, 5, 5, 2, 1, 1, 1),
    ("v-c64-k72-1x1", 2, 64, 7, 6, 72, 1, 1, 0, 1, 1, 1),
    ("v-c16-k24-dil2-pad2", 2, 16, 12, 13, 24, 3, 3, 2, 1, 2, 1),
    ("v-groups2-c32-k48", 2, 32, 9, 8, 48, 3, 3, 1, 1, 1, 2),
    ("v-groups2-c16-k16-stride2", 2, 16, 11, 10, 16, 3, 3, 1, 2, 1, 2),
    ("v-c64-k70-5x5-stride2", 1, 64, 10, 9, 70, 5, 5, 2, 2, 1, 1),
    ("v-c32-k32-wide-m", 4, 32, 17, 19, 32, 3, 3, 1, 1, 1, 1),
]
VEC_DIRECTIONS = ["forward", "backward_data", "backward_filter"]


def _channels_last_filter(w):
    """A (K, Cg, R, S) CuPy filter whose memory is KRSC (channels_last), seen in KCRS index order."""
    return cp.ascontiguousarray(w.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def _vec_ran(direction, p):
    """Whether a plan of ``p`` for ``direction`` (0 forward, 1 backward data, 2 backward filter) with the VEC loader
    was made (the plan key's vec flag); a strided backward data plans its stride-1 residue-class sub-problems
    instead."""
    return any(k[0] == direction and bool(k[10]) and (k[1] == p or (direction == 1 and k[1].N == p.N
                                                                     and k[1].C == p.C and k[1].K == p.K))
               for k in K._plans)


def _compare_vec(shape, mode, w_layout, tile=None, seed=0):
    dtype = "float32" if mode in ("fp32", "tf32") else mode
    tf32 = mode != "fp32"
    p, desc = _problem(shape, dtype)
    x, w, dy = _data(p, seed)
    u_in, u_out = (2.0 ** -11 if mode == "tf32" else 2.0 ** -24), 2.0 ** -24
    dt = _np_dtype(dtype)
    if dtype != "float32":
        x, w, dy = (a.astype(dt).astype(F64) for a in (x, w, dy))
        u_in, u_out = 0.0, (2.0 ** -11 if dtype == "float16" else 2.0 ** -8)
    xg, dyg = _to_gpu(x, dt, "NHWC"), _to_gpu(dy, dt, "NHWC")
    wg = cp.asarray(w.astype(dt))
    if w_layout == "KRSC":
        wg = _channels_last_filter(wg)
    width = 16 // np.dtype(dt).itemsize
    for d, direction in enumerate(VEC_DIRECTIONS):
        if d == 2:
            expect_vec = p.Cg % width == 0 and p.Kg % width == 0
            eligible = K.vec_eligible(2, p, xg, dyg) is None
        else:
            ch = p.Cg if d == 0 else p.Kg
            expect_vec = ch % width == 0 and (d == 0 or max(p.stride) == 1 or K._split_by_residue(p))
            eligible = K.vec_eligible(d, p, xg if d == 0 else dyg) is None
        assert eligible == expect_vec
        out_layout = "NCHW" if d == 2 else "NHWC"          # dw: (K, Cg, R, S) contiguous, blended in the kernel
        ref, ref_abs = _ref(direction, desc, p, x, w, dy)
        what = f"VEC {direction} {shape[0]} {mode} w {w_layout} tile={tile}"
        K._plans.clear()
        out = _poisoned(_out_shape(direction, p), dt, out_layout)
        got = _run_kernel("implicit", direction, p, xg, wg, dyg, tf32, d == 0, out, tile=tile)
        assert got is out
        _check(got, ref, _bound(direction, p, ref_abs, u_in, u_out), what)
        assert _vec_ran(d, p) == expect_vec, f"{what}: VEC loader ran {_vec_ran(d, p)}, expected {expect_vec}"
        prior = np.random.default_rng(seed + 1).standard_normal(ref.shape).astype(dt).astype(F64)
        alpha, beta = 0.75, -0.5
        out = _to_gpu(prior, dt, out_layout)
        got = _run_kernel("implicit", direction, p, xg, wg, dyg, tf32, d == 1, out, alpha, beta, tile=tile)
        bound = _bound(direction, p, abs(alpha) * ref_abs + abs(beta) * np.abs(prior), u_in, u_out)
        _check(got, alpha * ref + beta * prior, bound, what + " alpha/beta")


@pytest.mark.parametrize("w_layout", ["KCRS", "KRSC"])
@pytest.mark.parametrize("mode", ["fp32", "tf32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", VEC_SHAPES, ids=[s[0] for s in VEC_SHAPES])
def test_vec_loader_matches_float64(shape, mode, w_layout):
    if mode in ("float16", "bfloat16") and shape[2] // shape[-1] % 8:
        pytest.skip("16-bit vectors need 8 input channels per group (the element loader runs it: tested above)")
    _compare_vec(shape, mode, w_layout, seed=VEC_SHAPES.index(shape))


@pytest.mark.parametrize("w_layout", ["KCRS", "KRSC"])
@pytest.mark.parametrize("tile", list(K.TILES))
@pytest.mark.parametrize("mode", ["fp32", "tf32", "bfloat16"])
def test_vec_loader_every_tile(tile, mode, w_layout):
    """Each tile under VEC=1 on a problem no tile divides (M = 3*11*13, K = 40), both filter layouts (backward
    data's WKRSC=1 read and its transposing copy)."""
    _compare_vec(("v-tiles", 3, 24, 11, 13, 40, 3, 3, 1, 1, 1, 1), mode, w_layout, tile=tile)


def test_vec_loader_is_chosen_only_where_it_applies():
    """Eligible: NHWC activations with whole 16-byte vectors of channels per group.  Not: 3 channels (C % 4), NCHW
    memory, a base address off 16 bytes (a channel slice starting at channel 1), strided backward data that stays
    one launch (1x1 stride 2), a filter gradient with one NCHW operand, switched off."""
    ok, _ = _problem(("ok", 2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1))
    c3, _ = _problem(("c3", 2, 3, 8, 8, 16, 3, 3, 1, 1, 1, 1))
    x = _to_gpu(np.ones(ok.x_shape), np.float32, "NHWC")
    assert K.vec_eligible(0, ok, x) is None and K.vec_eligible(1, ok, x) is None
    assert "multiple of 4" in K.vec_eligible(0, c3, _to_gpu(np.ones(c3.x_shape), np.float32, "NHWC"))
    assert "channel stride 1" in K.vec_eligible(0, ok, _to_gpu(np.ones(ok.x_shape), np.float32, "NCHW"))
    wide = _to_gpu(np.ones((2, 20, 8, 8)), np.float32, "NHWC")
    assert "aligned" in K.vec_eligible(0, ok, wide[:, 1:17])
    s2, _ = _problem(("1x1-s2", 2, 16, 8, 8, 16, 1, 1, 0, 2, 1, 1))
    assert K.vec_supports(1, s2) is None                 # strided, undilated: its residue classes in one launch
    s2d, _ = _problem(("s2-dil2", 2, 16, 9, 9, 16, 3, 3, 2, 2, 2, 1))
    assert "stride 1" in K.vec_supports(1, s2d)
    assert K.vec_eligible(2, ok, x, x) is None
    assert "channel stride 1" in K.vec_eligible(2, ok, x, _to_gpu(np.ones(ok.x_shape), np.float32, "NCHW"))
    k6, _ = _problem(("k6", 2, 16, 8, 8, 6, 3, 3, 1, 1, 1, 1))
    assert "output channels" in K.vec_supports(2, k6)
    K.VEC_ENABLED[0] = False
    try:
        assert K.vec_eligible(0, ok, x) is not None
    finally:
        K.VEC_ENABLED[0] = True
    # and the plans say which loader ran: VEC for the eligible problem, the element loader for C = 3
    K._plans.clear()
    w = cp.ones(ok.w_shape, np.float32)
    K.implicit_forward(ok, x, w, True, True)
    assert _vec_ran(0, ok)
    K._plans.clear()
    K.implicit_forward(c3, _to_gpu(np.ones(c3.x_shape), np.float32, "NHWC"), cp.ones(c3.w_shape, np.float32), True)
    assert not _vec_ran(0, c3) and K._plans
    # a misaligned channel slice still computes (element loader), and correctly
    p, desc = _problem(("slice", 2, 16, 8, 8, 8, 3, 3, 1, 1, 1, 1))
    xs = np.random.default_rng(3).standard_normal((2, 20, 8, 8))
    wv = np.random.default_rng(4).standard_normal(p.w_shape)
    got = K.implicit_forward(p, _to_gpu(xs, np.float32, "NHWC")[:, 1:17], cp.asarray(wv, np.float32))
    ref, ref_abs = _ref("forward", desc, p, xs[:, 1:17], wv, np.zeros(p.y_shape))
    _check(got, ref, _bound("forward", p, ref_abs, 2.0 ** -24, 2.0 ** -24), "misaligned NHWC slice")


def test_vec_forward_and_backward_data_one_launch_with_a_channels_last_filter():
    """Forward and backward data read a channels-last filter directly (one launch each, backward data through
    WKRSC=1); with a KCRS filter each makes one transposing CuPy copy first (counted)."""
    from minidnn.backend.cuda import launch as L
    p, _ = _problem(("cl", 2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1))
    x = _to_gpu(np.ones(p.x_shape), np.float32, "NHWC")
    dy = _to_gpu(np.ones(p.y_shape), np.float32, "NHWC")
    w = _channels_last_filter(cp.ones(p.w_shape, np.float32))
    K.implicit_forward(p, x, w, True)
    K.implicit_backward_data(p, w, dy, True)
    before = L.launch_count()
    K.implicit_forward(p, x, w, True)
    assert L.launch_count() - before == 1
    before = L.launch_count()
    K.implicit_backward_data(p, w, dy, True)
    assert L.launch_count() - before == 1
    assert any(k[0] == 1 and k[10] == "krsc" for k in K._plans)
    w_kcrs = cp.ones(p.w_shape, np.float32)
    for run in (lambda: K.implicit_forward(p, x, w_kcrs, True), lambda: K.implicit_backward_data(p, w_kcrs, dy, True)):
        run()
        before = L.launch_count()
        run()
        assert L.launch_count() - before == 2


# ---- strided backward data: every residue class of dx in ONE launch, the original filter read through a tap map ------

# (id, N, C, H, W, K, R, S, padding, stride, dilation, groups): stride 2/3 and (3, 2), kernels smaller than the stride
# (classes without a tap), H < stride (empty classes), ragged against every tile, groups
RESID_SHAPES = [
    ("r-3x3-s2-ragged", 3, 16, 11, 13, 40, 3, 3, 1, 2, 1, 1),
    ("r-1x1-s2", 2, 16, 9, 8, 24, 1, 1, 0, 2, 1, 1),
    ("r-2x2-s3-pad1", 2, 8, 10, 11, 16, 2, 2, 1, 3, 1, 1),
    ("r-5x5-s3-pad2", 1, 16, 13, 12, 16, 5, 5, 2, 3, 1, 1),
    ("r-3x3-s32-asym", 2, 8, 10, 9, 16, 3, 3, 1, (3, 2), 1, 1),
    ("r-h1-s2", 2, 8, 1, 9, 8, 3, 3, 1, 2, 1, 1),
    ("r-groups2-s2", 2, 32, 7, 8, 32, 3, 3, 1, 2, 1, 2),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precomp", [False, True])
@pytest.mark.parametrize("shape", RESID_SHAPES, ids=[s[0] for s in RESID_SHAPES])
def test_residue_backward_data_element_loader(shape, precomp, layout):
    """The element loader (VEC off) on the one-launch residue classes, with and without the per-class tap table,
    strict fp32, poisoned output (every dx element written once) and alpha/beta."""
    p, desc = _problem(shape)
    x, w, dy = _data(p, RESID_SHAPES.index(shape))
    ref, ref_abs = _ref("backward_data", desc, p, x, w, dy)
    K.VEC_ENABLED[0] = False
    try:
        for tile in K.TILES:
            out = _poisoned(p.x_shape, np.float32, layout)
            got = K.implicit_backward_data(p, cp.asarray(w, np.float32), _to_gpu(dy, np.float32, layout), False,
                                           precomp, out=out, tile=tile)
            _check(got, ref, _bound("backward_data", p, ref_abs, 2.0 ** -24, 2.0 ** -24),
                   f"residue {shape[0]} {layout} precomp={precomp} tile={tile}")
        prior = np.random.default_rng(1).standard_normal(ref.shape).astype(np.float32)
        out = _to_gpu(prior, np.float32, layout)
        got = K.implicit_backward_data(p, cp.asarray(w, np.float32), _to_gpu(dy, np.float32, layout), False, precomp,
                                       0.75, -0.5, out)
        bound = _bound("backward_data", p, 0.75 * ref_abs + 0.5 * np.abs(prior), 2.0 ** -24, 2.0 ** -24)
        _check(got, 0.75 * ref - 0.5 * prior.astype(F64), bound, f"residue {shape[0]} {layout} alpha/beta")
    finally:
        K.VEC_ENABLED[0] = True


@pytest.mark.parametrize("w_layout", ["KCRS", "KRSC"])
@pytest.mark.parametrize("mode", ["fp32", "tf32", "bfloat16"])
@pytest.mark.parametrize("shape", RESID_SHAPES, ids=[s[0] for s in RESID_SHAPES])
def test_residue_backward_data_vec_loader(shape, mode, w_layout):
    """The VEC loader on the one-launch residue classes (NHWC dy and dx): B from the (G, Cg, R, S, Kg) copy of the
    whole filter, or (KRSC) the channels-last filter itself through WKRSC=1; all three directions checked."""
    _compare_vec(shape, mode, w_layout, seed=RESID_SHAPES.index(shape))


@pytest.mark.parametrize("tile", list(K.TILES))
@pytest.mark.parametrize("mode", ["fp32", "bfloat16"])
def test_residue_backward_data_vec_every_tile(tile, mode):
    _compare_vec(("r-tiles", 3, 24, 11, 13, 40, 3, 3, 1, 2, 1, 1), mode, "KRSC", tile=tile)


@pytest.mark.parametrize("layout, w_layout, launches", [("NCHW", "KCRS", 1), ("NHWC", "KRSC", 1),
                                                        ("NHWC", "KCRS", 2)])
@pytest.mark.parametrize("name", ["r-3x3-s2-ragged", "r-1x1-s2", "r-2x2-s3-pad1"])
def test_strided_backward_data_is_one_launch(name, layout, w_layout, launches):
    """Strided backward data: one launch (element loader with a KCRS filter, VEC loader with a channels-last one), two
    where the VEC loader needs its one (G, Cg, R, S, Kg) transpose of a KCRS filter -- never per residue class."""
    from minidnn.backend.cuda import launch as L
    shape = next(s for s in RESID_SHAPES if s[0] == name)
    p, desc = _problem(shape)
    if p.kernel == (1, 1):
        launches = 1        # a 1x1 KCRS filter is already KRSC in memory: read as it is, no transpose
    x, w, dy = _data(p, 5)
    wg = cp.asarray(w, np.float32)
    if w_layout == "KRSC":
        wg = _channels_last_filter(wg)
    dyg = _to_gpu(dy, np.float32, layout)
    ref, ref_abs = _ref("backward_data", desc, p, x, w, dy)
    for precomp in (False, True):
        K.implicit_backward_data(p, wg, dyg, True, precomp)              # compile, plan, upload the table
        before = L.launch_count()
        got = K.implicit_backward_data(p, wg, dyg, True, precomp)
        assert L.launch_count() - before == launches
        _check(got, ref, _bound("backward_data", p, ref_abs, 2.0 ** -11, 2.0 ** -24), f"{name} {layout} {w_layout}")
    vec = layout == "NHWC" and p.Kg % 4 == 0
    assert any(k[0] == 1 and k[1] == p and bool(k[10]) == vec for k in K._plans)


# ---- NCHW staging: plain NCHW activations copied to NHWC so the VEC loader runs them --------------------------
@pytest.fixture
def stage_everything(monkeypatch):
    monkeypatch.setattr(K, "STAGE_MIN_MACS", 0)     # the test shapes are far below the size rule
    monkeypatch.setattr(K, "STAGE_ENABLED", [True])
    K._plans.clear()
    yield
    K._plans.clear()


@pytest.mark.parametrize("mode", ["fp32", "tf32", "bfloat16"])
@pytest.mark.parametrize("shape", VEC_SHAPES, ids=[s[0] for s in VEC_SHAPES])
def test_nchw_staging_matches_float64(stage_everything, shape, mode):
    """NCHW x / dy (and NCHW y / dx written through strides by the epilogue) with the NHWC copy the staging makes:
    every direction against float64, alpha/beta blending, and the VEC loader actually ran where it applies."""
    dtype = "float32" if mode in ("fp32", "tf32") else mode
    if dtype == "bfloat16" and shape[2] // shape[-1] % 8:
        pytest.skip("16-bit vectors need 8 input channels per group")
    tf32 = mode != "fp32"
    p, desc = _problem(shape, dtype)
    x, w, dy = _data(p, VEC_SHAPES.index(shape))
    u_in, u_out = (2.0 ** -11 if mode == "tf32" else 2.0 ** -24), 2.0 ** -24
    dt = _np_dtype(dtype)
    if dtype != "float32":
        x, w, dy = (a.astype(dt).astype(F64) for a in (x, w, dy))
        u_in, u_out = 0.0, 2.0 ** -8
    xg, dyg, wg = _to_gpu(x, dt, "NCHW"), _to_gpu(dy, dt, "NCHW"), cp.asarray(w.astype(dt))
    for d, direction in enumerate(VEC_DIRECTIONS):
        expect_vec = K.vec_supports(d, p) is None
        ref, ref_abs = _ref(direction, desc, p, x, w, dy)
        what = f"staged {direction} {shape[0]} {mode}"
        K._plans.clear()
        got = _run_kernel("implicit", direction, p, xg, wg, dyg, tf32, d == 0, _poisoned(_out_shape(direction, p),
                                                                                        dt, "NCHW"))
        _check(got, ref, _bound(direction, p, ref_abs, u_in, u_out), what)
        assert _vec_ran(d, p) == expect_vec, f"{what}: VEC loader ran {_vec_ran(d, p)}, expected {expect_vec}"
        prior = np.random.default_rng(7).standard_normal(ref.shape).astype(dt).astype(F64)
        out = _to_gpu(prior, dt, "NCHW")
        got = _run_kernel("implicit", direction, p, xg, wg, dyg, tf32, False, out, 0.75, -0.5)
        bound = _bound(direction, p, 0.75 * ref_abs + 0.5 * np.abs(prior), u_in, u_out)
        _check(got, 0.75 * ref - 0.5 * prior, bound, what + " alpha/beta")


def test_nchw_staging_size_rule_and_switch(monkeypatch):
    mid, _ = _problem(("mid", 128, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1))         # ~3.0e8: ResNet-20's first stage
    small, _ = _problem(("small", 2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1))
    c3, _ = _problem(("c3", 32, 3, 56, 56, 64, 3, 3, 1, 1, 1, 1))
    assert K._stageable(0, mid) and K._stageable(1, mid) and K._stageable(2, mid)
    assert not K._stageable(0, small)                   # below STAGE_MIN_MACS: the extra launch is not worth it
    assert not K._stageable(0, c3)                      # 3 channels: no whole vectors
    monkeypatch.setattr(K, "STAGE_ENABLED", [False])
    assert not K._stageable(0, mid)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (3, 40, 33, 1), (1, 64, 8, 8), (2, 33, 1, 70)])
def test_nchw_to_nhwc_copy_kernel(shape, dtype):
    """The staging copy (one prepared transpose launch) equals CuPy's transpose, ragged tiles included."""
    from minidnn.backend.cuda import launch as L
    dt = np.float32 if dtype == "float32" else _bf16()
    a = cp.asarray(np.random.default_rng(1).standard_normal(shape).astype(dt))
    before = L.launch_count()
    t = K._nhwc_copy(cp, a)
    assert L.launch_count() - before == 1
    assert t.shape == a.shape and t.strides[1] == a.itemsize       # NHWC memory seen as NCHW
    assert cp.array_equal(t.view(cp.uint16 if dtype != "float32" else cp.uint32),
                          a.view(cp.uint16 if dtype != "float32" else cp.uint32))


def test_nchw_staging_eager_and_graphed_give_the_same_bits():
    """The staging rule reads the problem alone: an eager call and its CUDA-graph capture compute the same bits."""
    p, desc = _problem(("mid", 64, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1))
    assert K._stageable(0, p)
    x, w, dy = _data(p, 3)
    xg, wg = cp.asarray(x, np.float32), cp.asarray(w, np.float32)
    eager = K.implicit_forward(p, xg, wg)               # also compiles and plans before the capture
    assert _vec_ran(0, p)
    y = cp.empty(p.y_shape, np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            K.implicit_forward(p, xg, wg, out=y)
        finally:
            g = s.end_capture()
        g.launch(s)
    s.synchronize()
    assert cp.array_equal(y, eager)
    ref, ref_abs = _ref("forward", desc, p, x, w, dy)
    _check(eager, ref, _bound("forward", p, ref_abs, 2.0 ** -24, 2.0 ** -24), "staged forward")
