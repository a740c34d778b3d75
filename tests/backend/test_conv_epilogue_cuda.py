"""The fused GPU path of convolution_bias_activation_forward (backend/cuda/conv_epilogue.py: the implicit-GEMM forward
with its EPI=1 epilogue) against the composition it replaces (conv_epilogue.ENABLED off: convolution_forward ->
add_tensor -> activation_forward, the same convolution kernel underneath).

Shapes with ragged tails (no tile divides M or K), N=1, K not a multiple of the tile, stride 2, dilation 2, groups,
1x1, a 3-channel stem, 1-D; NCHW and NHWC (the NHWC 16-byte loader where channels allow); strict fp32, TF32,
bfloat16 and float16; with and without z and bias; every epilogue activation; alpha1/alpha2 values (alpha2 = 0 with a
NaN z, which the composition never reads); y given (poisoned with NaN), y aliasing z; one launch per call.

Tolerance: the two differ only in the epilogue's roundings (the composition rounds the convolution, the sum with
z, the sum with the bias and the activation to the data type one after the other; the kernel rounds once), so
|fused - composition| <= 4 * u * (|alpha1 * conv| + |alpha2 * z| + |bias| + |y|) + tiny, u the data type's unit
roundoff (2^-24 float32, 2^-11 float16, 2^-8 bfloat16); every activation here has a slope of at most max(1, coef).
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
)
from minidnn.backend.cuda import conv_epilogue as E  # noqa: E402
from minidnn.backend.cuda import conv_pointwise as PW  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402

# (id, x shape (channels-first), w shape, padding, stride, dilation, groups)
SHAPES = [
    ("n1-ragged", (1, 17, 11, 10), (33, 17, 3, 3), 1, 1, 1, 1),
    ("stride2", (2, 16, 13, 13), (24, 16, 3, 3), 1, 2, 1, 1),
    ("k70-1x1", (3, 16, 9, 7), (70, 16, 1, 1), 0, 1, 1, 1),
    ("groups2", (2, 32, 10, 10), (48, 16, 3, 3), 1, 1, 1, 2),
    ("dil2", (2, 16, 12, 12), (20, 16, 3, 3), 2, 1, 2, 1),
    ("c3-stem", (2, 3, 15, 15), (16, 3, 3, 3), 1, 1, 1, 1),
    ("k130-wide", (2, 24, 9, 9), (130, 24, 3, 3), 1, 1, 1, 1),
    ("1d", (2, 16, 37), (20, 16, 5), 2, 1, 1, 1),
]
MATHS = {"fp32": (np.float32, MathType.DEFAULT, 2.0 ** -24), "tf32": (np.float32, MathType.TENSOR_OP, 2.0 ** -24),
         "bf16": (ml_dtypes.bfloat16, MathType.DEFAULT, 2.0 ** -8), "fp16": (np.float16, MathType.DEFAULT, 2.0 ** -11)}
ACTS = [ActivationDescriptor("identity"), ActivationDescriptor("relu"), ActivationDescriptor("sigmoid"),
        ActivationDescriptor("tanh"), ActivationDescriptor("clipped_relu", 0.75), ActivationDescriptor("elu", 0.6),
        ActivationDescriptor("leaky_relu", 0.1), ActivationDescriptor("relu6"), ActivationDescriptor("hardtanh", 0.8),
        ActivationDescriptor("swish", 1.5)]


def _arrays(shape, dtype, fmt, with_z, with_bias, seed=0):
    _, xs, ws, pad, stride, dil, groups = shape
    nd = len(xs) - 2
    rng = np.random.default_rng(seed)
    desc = ConvolutionDescriptor((pad,) * nd, (stride,) * nd, (dil,) * nd, groups)
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    if fmt == "NHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    from minidnn.backend import get_convolution_forward_output_dim
    ys = get_convolution_forward_output_dim(desc, x.shape, w.shape, format=fmt)
    z = rng.standard_normal(ys).astype(dtype) if with_z else None
    b = rng.standard_normal(ws[0]).astype(dtype) if with_bias else None
    return desc, *(None if a is None else cp.asarray(a) for a in (x, w, z, b))


def _f64(a):
    return cp.asnumpy(a).astype(np.float64)


def _both(h, desc, algo, x, w, z, a1, a2, b, act, fmt, u):
    """(fused, composition, bound) of one call."""
    fused = convolution_bias_activation_forward(h, x, w, desc, algo, z, a1, a2, b, act, format=fmt)
    E.ENABLED[0] = PW.ENABLED[0] = False     # (the composition: the same kernel, not the 1x1 cublasLt product)
    try:
        comp = convolution_bias_activation_forward(h, x, w, desc, algo, z, a1, a2, b, act, format=fmt)
        conv = convolution_forward(h, x, w, desc, algo=algo, format=fmt)
    finally:
        E.ENABLED[0] = PW.ENABLED[0] = True
    mag = np.abs(a1 * _f64(conv)) + np.abs(_f64(comp))
    if z is not None and a2 != 0:
        mag += np.abs(a2 * _f64(z))
    if b is not None:
        ch = -1 if fmt == "NHWC" else 1
        mag += np.abs(_f64(b)).reshape([-1 if i == ch % mag.ndim else 1 for i in range(mag.ndim)])
    slope = max(1.0, getattr(act, "coef", None) or 1.0)
    return _f64(fused), _f64(comp), 4 * u * slope * mag + 1e-30


def _check(got, ref, bound, what):
    assert got.shape == ref.shape, what
    bad = ~(np.abs(got - ref) <= bound)
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} off, worst {np.max(np.abs(got - ref) - bound):.3g}"


@pytest.mark.parametrize("algo", [ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, ConvolutionFwdAlgo.IMPLICIT_GEMM])
@pytest.mark.parametrize("math", list(MATHS))
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_fused_matches_the_composition(shape, fmt, math, algo):
    if fmt == "NHWC" and len(shape[1]) == 3:
        pytest.skip("1-D NHWC is the same kernel as 2-D (height 1)")
    dtype, math_type, u = MATHS[math]
    desc, x, w, z, b = _arrays(shape, dtype, fmt, True, True, seed=SHAPES.index(shape))
    desc = ConvolutionDescriptor(desc.padding, desc.stride, desc.dilation, desc.groups, math_type=math_type)
    h = Handle("cuda")
    act = ActivationDescriptor("relu")
    assert fused_reason(h, x, w, desc, algo, z, 0.75, -0.5, b, act, format=fmt) is None
    got, ref, bound = _both(h, desc, algo, x, w, z, 0.75, -0.5, b, act, fmt, u)
    _check(got, ref, bound, f"{shape[0]} {fmt} {math} {algo.name}")


@pytest.mark.parametrize("math", list(MATHS))
@pytest.mark.parametrize("with_z, with_bias", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("act", ACTS, ids=[a.mode.name for a in ACTS])
def test_every_activation_with_and_without_z_and_bias(act, with_z, with_bias, math):
    dtype, math_type, u = MATHS[math]
    for fmt in ("NCHW", "NHWC"):
        desc, x, w, z, b = _arrays(SHAPES[3], dtype, fmt, with_z, with_bias, seed=7)
        desc = ConvolutionDescriptor(desc.padding, desc.stride, desc.dilation, desc.groups, math_type=math_type)
        got, ref, bound = _both(Handle("cuda"), desc, None, x, w, z, 1.25, 0.5, b, act, fmt, u)
        _check(got, ref, bound, f"{act.mode.name} z={with_z} bias={with_bias} {math} {fmt}")


@pytest.mark.parametrize("a1, a2", [(1.0, 1.0), (0.5, -2.0), (-1.0, 0.0), (2.0, 0.25)])
def test_alphas(a1, a2):
    desc, x, w, z, b = _arrays(SHAPES[1], np.float32, "NCHW", True, True, seed=3)
    if a2 == 0:
        z[...] = cp.nan                     # never read when alpha2 is 0 (nor by the composition)
    got, ref, bound = _both(Handle("cuda"), desc, None, x, w, z, a1, a2, b, ActivationDescriptor("relu"), "NCHW",
                            2.0 ** -24)
    assert np.isfinite(got).all()
    _check(got, ref, bound, f"alphas {a1} {a2}")


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_output_buffer_and_y_aliasing_z(fmt):
    desc, x, w, z, b = _arrays(SHAPES[0], np.float32, fmt, True, True, seed=5)
    act = ActivationDescriptor("relu")
    got, ref, bound = _both(Handle("cuda"), desc, None, x, w, z, 0.75, -0.5, b, act, fmt, 2.0 ** -24)
    buf = cp.full(z.shape, cp.nan, dtype=z.dtype)
    out = convolution_bias_activation_forward(None, x, w, desc, None, z, 0.75, -0.5, b, act, y=buf, format=fmt)
    assert out is buf
    _check(_f64(out), ref, bound, "y given")
    zz = z.copy()
    out = convolution_bias_activation_forward(None, x, w, desc, None, zz, 0.75, -0.5, b, act, y=zz, format=fmt)
    assert out is zz
    _check(_f64(zz), ref, bound, "y is z")


def test_cudnn_bias_shape_and_bitwise_repeatable():
    desc, x, w, z, b = _arrays(SHAPES[2], np.float32, "NCHW", True, True, seed=9)
    act = ActivationDescriptor("relu")
    y1 = convolution_bias_activation_forward(None, x, w, desc, None, z, 0.75, -0.5, b, act)
    y2 = convolution_bias_activation_forward(None, x, w, desc, None, z, 0.75, -0.5, b.reshape(1, -1, 1, 1), act)
    assert cp.array_equal(y1, y2)


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_one_launch_per_call(fmt):
    """NCHW below the staging size, a contiguous filter: the fused call is the plain forward's one launch; NHWC
    with a channels-last (KRSC) filter likewise (no filter copy)."""
    desc, x, w, z, b = _arrays(SHAPES[1], np.float32, fmt, True, True, seed=11)
    if fmt == "NHWC":
        w = cp.ascontiguousarray(cp.moveaxis(w, 1, -1)).transpose(0, 3, 1, 2)     # channels-last filter
    act = ActivationDescriptor("relu")
    for _ in range(2):
        convolution_bias_activation_forward(None, x, w, desc, None, z, 0.75, -0.5, b, act, format=fmt)
    n0 = L.launch_count()
    convolution_bias_activation_forward(None, x, w, desc, None, z, 0.75, -0.5, b, act, format=fmt)
    n1 = L.launch_count()
    convolution_forward(None, x, w, desc, format=fmt)
    n2 = L.launch_count()
    assert n1 - n0 == 1 and n2 - n1 == 1


def test_direct_problems_run_the_composition():
    """Depthwise (the direct kernels): no fused epilogue there yet; the composition runs and agrees."""
    shape = ("dw", (2, 16, 12, 12), (16, 1, 3, 3), 1, 1, 1, 16)
    desc, x, w, z, b = _arrays(shape, np.float32, "NCHW", True, True)
    act = ActivationDescriptor("relu")
    assert "DIRECT" in fused_reason(None, x, w, desc, None, z, 0.75, -0.5, b, act)
    got, ref, bound = _both(Handle("cuda"), desc, None, x, w, z, 0.75, -0.5, b, act, "NCHW", 2.0 ** -24)
    assert np.array_equal(got, ref)
