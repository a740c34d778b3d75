"""The batch-norm fusions' GPU kernel (implicit-GEMM forward with PRO=1 / STATS=1, conv_igemm_source.py) against
the compositions it replaces (conv_epilogue.ENABLED off: x' = act_p(x * scale + shift), convolution_forward,
add_tensor, activation_forward, sums) and against float64.

Shapes with ragged tails (no tile divides M or K), N=1, C=1, K=1, stride 2, dilation 2, padding 0-3, 1x1 / 3x3 /
5x5, groups 1 and 2, many m-tiles (the statistics' last-block loop); NCHW and NHWC (the NHWC 16-byte loader where
channels allow, the element loader and its PRECOMP table elsewhere); strict fp32, TF32, bfloat16, float16.

Tolerances.  y, fused vs composition: the two run the same kernel configuration (tile, loader, k order: the
composition's convolution_forward of x' is the plain forward whose grid and arguments the fused launch holds,
test_conv_epilogue_bn_dispatch.py) on x' computed once with an fma (kernel) and once with a product and a sum
(composition).  Both x' lie within e = 2^-24 (|x scale| + 2 |x scale + shift|) of the exact value v, so each
operand the MMA reads (x' rounded to T, then to TF32 under TF32: cvt.rna) lies in [R(relu(v - e)), R(relu(v +
e))], R monotone: the operands differ by at most d = R(relu(v + e)) - R(relu(v - e)) per element -- 0 mostly, a
whole TF32 spacing (2^-10 |x'|) where the interval straddles a TF32 rounding boundary (the four tf32 failures of
the first GPU run: one flipped operand times |w| ~ 0.08 gave 7e-5).  Where no operand of an output's receptive
field can differ the two accumulations are bitwise equal (same operands, same order); elsewhere each fp32
accumulation of L = C/G*R*S products is within 2 L 2^-24 conv(|x'|, |w|) of its exact value.  With the epilogue
rounding once vs 3-4 times: |dy| <= |alpha1| (conv(d, |w|) + [conv(d, |w|) > 0] 4 L 2^-24 conv(|x'|, |w|)) +
4u (|alpha1 conv| + |alpha2 z| + |bias| + |y|).  y vs float64 (fp32 / TF32 only): (u_op + 2 L 2^-24)
conv(|x'|, |w|) + 4 * 2^-24 (|alpha2 z| + |bias| + |y|), u_op = 2^-23 (x' rounded) or 2^-10 (TF32 operands).
Statistics vs the float64 sums of the kernel's own y as stored: count * 2^-23 * sum |y| (sum of y^2 alike) --
they are of y as stored.
Determinism: y and the statistics of repeated calls bitwise equal.
"""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402
import ml_dtypes  # noqa: E402

from minidnn.backend import (  # noqa: E402
    ActivationDescriptor,
    ConvolutionDescriptor,
    ConvolutionFwdAlgo,
    Handle,
    MathType,
    convolution_bias_activation_forward,
    convolution_forward,
    fused_reason,
    get_convolution_forward_output_dim,
    scale_bias_activation_convolution_forward,
    scale_bias_activation_convolution_reason,
)
from minidnn.backend.cuda import conv_epilogue as E  # noqa: E402
from minidnn.backend.cuda import conv_pointwise as PW  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402

PRECOMP, IMPLICIT = ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, ConvolutionFwdAlgo.IMPLICIT_GEMM
RELU, IDENTITY = ActivationDescriptor("relu"), ActivationDescriptor("identity")

# (id, x shape (channels-first), w shape, padding, stride, dilation, groups)
SHAPES = [
    ("n1-ragged-3x3", (1, 17, 11, 10), (33, 17, 3, 3), 1, 1, 1, 1),
    ("stride2-pad0-5x5", (2, 16, 13, 13), (24, 16, 5, 5), 0, 2, 1, 1),
    ("dil2-pad3", (2, 16, 12, 12), (20, 16, 3, 3), 3, 1, 2, 1),
    ("k70-1x1", (3, 16, 9, 7), (70, 16, 1, 1), 0, 1, 1, 1),
    ("groups2-pad2", (2, 32, 10, 10), (48, 16, 3, 3), 2, 1, 1, 2),
    ("c1-k1", (2, 1, 9, 9), (1, 1, 3, 3), 1, 1, 1, 1),
    ("many-tiles", (16, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1, 1),
]
MATHS = {"fp32": (np.float32, MathType.DEFAULT, 2.0 ** -24), "tf32": (np.float32, MathType.TENSOR_OP, 2.0 ** -24),
         "bf16": (ml_dtypes.bfloat16, MathType.DEFAULT, 2.0 ** -8), "fp16": (np.float16, MathType.DEFAULT, 2.0 ** -11)}
HALF_SHAPES = ("n1-ragged-3x3", "groups2-pad2")        # 16-bit data: two shapes keep the compiled variants few


def _arrays(shape, dtype, math_type, fmt, seed=0):
    _, xs, ws, pad, stride, dil, groups = shape
    rng = np.random.default_rng(seed)
    desc = ConvolutionDescriptor(pad, stride, dil, groups, math_type=math_type)
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    scale = (rng.uniform(0.5, 1.5, xs[1]) * rng.choice([-1, 1], xs[1])).astype(np.float32)
    shift = rng.uniform(-0.5, 1.0, xs[1]).astype(np.float32)      # mostly > 0: act_p(shift) != 0 in the padding
    if fmt == "NHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    ys = get_convolution_forward_output_dim(desc, x.shape, w.shape, format=fmt)
    z = rng.standard_normal(ys).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    return desc, *(cp.asarray(a) for a in (x, w, z, b, scale, shift))


def _f64(a):
    return cp.asnumpy(a).astype(np.float64)


def _cf(a, fmt):
    """A channels-first float64 NumPy copy."""
    a = _f64(a)
    return np.moveaxis(a, -1, 1) if fmt == "NHWC" else a


def _stats(K):
    return (cp.full(K, cp.nan, cp.float32), cp.full(K, cp.nan, cp.float32))


def _call(h, desc, algo, x, w, z, b, sc, sh, pro, fmt, stats):
    return scale_bias_activation_convolution_forward(h, x, sc, sh, pro, w, desc, algo, format=fmt, z=z, alpha1=0.75,
                                                     alpha2=-0.5, bias=b, activation_desc=RELU, stats=stats)


def _conv64(xa, w, shape):
    """float64 convolution of channels-first NumPy arrays (the CPU reference primitive)."""
    _, _, _, pad, stride, dil, groups = shape
    return convolution_forward(None, xa, w, ConvolutionDescriptor(pad, stride, dil, groups))


def _tf32(a):
    """float64 values rounded as cvt.rna.tf32.f32 does (10 stored mantissa bits, ties away from zero): monotone."""
    m, e = np.frexp(a)
    return np.ldexp(np.sign(m) * np.floor(np.abs(m) * 2.0 ** 11 + 0.5) / 2.0 ** 11, e)


def _operand_spread(xc, scale, shift, dtype, tf32):
    """Per element of x, the most the MMA operand x' of the fused kernel (fma, relu, rounded to ``dtype``, TF32)
    and of the composition (product, sum, relu, rounded) can differ: both come from a float32 value within e of
    the exact v = x * scale + shift, and every later step is monotone (module docstring)."""
    v = xc * scale + shift                                    # float64: within 2^-53 |v| of exact
    e = 2.0 ** -24 * (np.abs(xc * scale) + 2 * np.abs(v)) + 2.0 ** -50 * np.abs(v)

    def operand(t):
        t = np.maximum(t, 0).astype(dtype).astype(np.float64)
        return _tf32(t) if tf32 else t
    return operand(v + e) - operand(v - e)


def _check(got, ref, bound, what):
    assert got.shape == ref.shape, what
    bad = ~(np.abs(got - ref) <= bound)
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} off, worst {np.max(np.abs(got - ref) - bound):.3g}"


def _check_stats(stats, y, fmt, what):
    """The kernel's statistics against float64 sums of its own y (as stored)."""
    yc = _cf(y, fmt)
    count = yc.size // yc.shape[1]
    axes = (0, 2, 3) if yc.ndim == 4 else (0, 2)
    s, q = _f64(stats[0]), _f64(stats[1])
    _check(s, yc.sum(axis=axes), count * 2.0 ** -23 * np.abs(yc).sum(axis=axes) + 1e-30, what + " sum")
    _check(q, (yc * yc).sum(axis=axes), count * 2.0 ** -23 * (yc * yc).sum(axis=axes) + 1e-30, what + " sumsq")


CASES = [(s, fmt, m) for s in SHAPES for fmt in ("NCHW", "NHWC") for m in MATHS
         if m in ("fp32", "tf32") or s[0] in HALF_SHAPES]


@pytest.mark.parametrize("shape, fmt, math", CASES, ids=[f"{s[0]}-{f}-{m}" for s, f, m in CASES])
def test_prologue_and_statistics_match_the_composition(shape, fmt, math):
    dtype, math_type, u = MATHS[math]
    desc, x, w, z, b, sc, sh = _arrays(shape, dtype, math_type, fmt, seed=SHAPES.index(shape))
    h = Handle("cuda")
    algo = PRECOMP if fmt == "NCHW" else IMPLICIT
    K = shape[2][0]
    assert scale_bias_activation_convolution_reason(h, x, sc, sh, RELU, w, desc, algo, format=fmt, z=z, alpha1=0.75,
                                                    alpha2=-0.5, bias=b, activation_desc=RELU,
                                                    stats=_stats(K)) is None
    st = _stats(K)
    y = _call(h, desc, algo, x, w, z, b, sc, sh, RELU, fmt, st)
    E.ENABLED[0] = PW.ENABLED[0] = False     # (the composition: the same kernel, not the 1x1 cublasLt product)
    try:
        st_ref = _stats(K)
        ref = _call(h, desc, algo, x, w, z, b, sc, sh, RELU, fmt, st_ref)
    finally:
        E.ENABLED[0] = PW.ENABLED[0] = True
    # x' (float64, from the data) and the magnitudes of every term
    xc = _cf(x, fmt)
    ch = (1, -1, 1, 1)
    xa = np.maximum(xc * _f64(sc).reshape(ch) + _f64(sh).reshape(ch), 0)
    wc = _f64(w)
    conv_abs = _conv64(np.abs(xa), np.abs(wc), shape)
    yc, rc, zc = _cf(y, fmt), _cf(ref, fmt), _cf(z, fmt)
    other = 0.5 * np.abs(zc) + np.abs(_f64(b)).reshape(ch) + np.abs(rc)
    what = f"{shape[0]} {fmt} {math}"
    L_red = np.prod(shape[2][1:])
    d = _operand_spread(xc, _f64(sc).reshape(ch), _f64(sh).reshape(ch), dtype, math == "tf32")
    conv_d = _conv64(d, np.abs(wc), shape)
    order = np.where(conv_d > 0, 4 * L_red * 2.0 ** -24 * conv_abs, 0.0)
    bound = 0.75 * (conv_d + order) + 4 * u * (0.75 * conv_abs + other)
    _check(yc, rc, bound + 1e-30, what + " vs composition")
    if math in ("fp32", "tf32"):
        u_op = 2.0 ** -10 if math == "tf32" else 2.0 ** -23
        exact = np.maximum(0.75 * _conv64(xa, wc, shape) - 0.5 * zc + _f64(b).reshape(ch), 0)
        _check(yc, exact, (u_op + 2 * L_red * 2.0 ** -24) * 0.75 * conv_abs + 4 * 2.0 ** -24 * other + 1e-30,
               what + " vs float64")
    _check_stats(st, y, fmt, what)
    # and against the composition's statistics of its own y (the two y within the bound above)
    count = yc.size // K
    _check(_f64(st[0]), _f64(st_ref[0]), count * (2 * bound).max() + 1e-6,
           what + " sum vs composition")


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[4], SHAPES[6]], ids=lambda s: s[0])
def test_statistics_alone_and_bitwise_repeatable(shape, fmt):
    """convolution_bias_activation_forward(..., stats=): the statistics of y from the same launch, deterministic."""
    desc, x, w, z, b, _, _ = _arrays(shape, np.float32, MathType.DEFAULT, fmt, seed=3)
    K = shape[2][0]
    assert fused_reason(None, x, w, desc, None, z, 0.75, -0.5, b, RELU, format=fmt, stats=_stats(K)) is None
    runs = []
    for _ in range(3):
        st = _stats(K)
        y = convolution_bias_activation_forward(None, x, w, desc, None, z, 0.75, -0.5, b, RELU, format=fmt,
                                                stats=st)
        runs.append((y, st))
    y0, st0 = runs[0]
    plain = convolution_bias_activation_forward(None, x, w, desc, None, z, 0.75, -0.5, b, RELU, format=fmt)
    assert cp.array_equal(y0, plain)                       # STATS=1 leaves y's bits alone
    for y, st in runs[1:]:
        assert cp.array_equal(y, y0)
        assert cp.array_equal(st[0], st0[0]) and cp.array_equal(st[1], st0[1])
    _check_stats(st0, y0, fmt, f"{shape[0]} {fmt} stats alone")


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_padding_is_a_zero_of_the_activated_tensor(fmt):
    """x = 0, scale = 1, shift = 1, relu: x' = 1 inside and 0 in the padding; an all-ones 3x3 filter counts the
    in-bounds taps times C (4C at a corner, 6C on an edge, 9C inside) -- 9C everywhere if the padding were
    act(shift).  Exact (small integers in float32)."""
    C = 8
    x = cp.zeros((2, C, 5, 6), cp.float32)
    if fmt == "NHWC":
        x = cp.ascontiguousarray(cp.moveaxis(x, 1, -1))
    w = cp.ones((3, C, 3, 3), cp.float32)
    one = cp.ones(C, cp.float32)
    for algo in (IMPLICIT, PRECOMP):
        desc = ConvolutionDescriptor(1)
        assert scale_bias_activation_convolution_reason(None, x, one, one, RELU, w, desc, algo, format=fmt) is None
        st = _stats(3)
        y = scale_bias_activation_convolution_forward(None, x, one, one, RELU, w, desc, algo, format=fmt, stats=st)
        yc = _cf(y, fmt)
        rows = np.array([2, 3, 3, 3, 2])[:, None] * np.array([2, 3, 3, 3, 3, 2])[None, :]
        assert np.array_equal(yc, np.broadcast_to(C * rows, yc.shape).astype(np.float64)), algo
        assert np.array_equal(_f64(st[0]), np.full(3, 2 * C * rows.sum(), np.float64))
        assert np.array_equal(_f64(st[1]), np.full(3, 2 * ((C * rows.astype(np.float64)) ** 2).sum()))


def test_identity_prologue_and_one_launch_per_call():
    shape = SHAPES[4]
    desc, x, w, z, b, sc, sh = _arrays(shape, np.float32, MathType.DEFAULT, "NCHW", seed=8)
    K = shape[2][0]
    y = scale_bias_activation_convolution_forward(None, x, sc, sh, IDENTITY, w, desc, None, stats=_stats(K))
    xa = _f64(x) * _f64(sc).reshape(1, -1, 1, 1) + _f64(sh).reshape(1, -1, 1, 1)
    exact = _conv64(xa, _f64(w), shape)
    bound = 4 * 2.0 ** -24 * np.prod(shape[2][1:]) * _conv64(np.abs(xa), np.abs(_f64(w)), shape) + 1e-30
    _check(_f64(y), exact, bound, "identity prologue")
    for _ in range(2):
        scale_bias_activation_convolution_forward(None, x, sc, sh, RELU, w, desc, None, stats=_stats(K))
    n0 = L.launch_count()
    scale_bias_activation_convolution_forward(None, x, sc, sh, RELU, w, desc, None, stats=_stats(K))
    n1 = L.launch_count()
    convolution_forward(None, x, w, desc)
    n2 = L.launch_count()
    assert n1 - n0 == n2 - n1 == 1                           # the statistics need no second kernel


def test_declined_prologue_runs_the_composition():
    shape = ("dw", (2, 16, 12, 12), (16, 1, 3, 3), 1, 1, 1, 16)
    desc, x, w, z, b, sc, sh = _arrays(shape, np.float32, MathType.DEFAULT, "NCHW")
    why = scale_bias_activation_convolution_reason(None, x, sc, sh, RELU, w, desc, None, stats=_stats(16))
    assert "DIRECT" in why
    st = _stats(16)
    y = scale_bias_activation_convolution_forward(None, x, sc, sh, RELU, w, desc, None, stats=st)
    xa = np.maximum(_f64(x) * _f64(sc).reshape(1, -1, 1, 1) + _f64(sh).reshape(1, -1, 1, 1), 0)
    _check(_f64(y), _conv64(xa, _f64(w), shape), 1e-5 * (1 + np.abs(_conv64(xa, np.abs(_f64(w)), shape))), "dw")
    _check_stats(st, y, "NCHW", "dw")


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_remembered_call_bitwise_equal_to_a_fresh_one(fmt):
    """conv_fused's validated-signature shortcut: the remembered call's y and statistics are the fresh call's bits
    (the table cleared between), for both fused primitives; a bad call after a remembered one still raises."""
    from minidnn.backend import conv_fused as CF
    from minidnn.backend.errors import BadParamError
    shape = SHAPES[4]
    desc, x, w, z, b, sc, sh = _arrays(shape, np.float32, MathType.TENSOR_OP, fmt, seed=5)
    h = Handle("cuda", math_type=MathType.TENSOR_OP)
    K = shape[2][0]
    calls = {
        "stats": lambda st: convolution_bias_activation_forward(h, x, w, desc, None, z, 0.75, -0.5, b, RELU,
                                                                format=fmt, stats=st),
        "bnrelu": lambda st: _call(h, desc, None, x, w, z, b, sc, sh, RELU, fmt, st),
    }
    for name, call in calls.items():
        CF._SEEN.clear()
        st0 = _stats(K)
        y0 = call(st0)
        assert len(CF._SEEN) == 1, name
        st1 = _stats(K)
        y1 = call(st1)                                       # remembered
        assert cp.array_equal(y0, y1), name
        assert cp.array_equal(st0[0], st1[0]) and cp.array_equal(st0[1], st1[1]), name
        with pytest.raises(BadParamError, match="overlaps"):
            call((x.reshape(-1)[:K], _stats(K)[1]))
