"""convolution_bias_activation_forward: y = act(alpha1 * conv(x, w) + alpha2 * z + bias), against the composition
of the primitives it is made of, against PyTorch, and its errors (raised before any work)."""
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import (
    ActivationDescriptor,
    ActivationMode,
    BadParamError,
    ConvolutionDescriptor,
    ConvolutionFwdAlgo,
    Handle,
    NotSupportedError,
    convolution_bias_activation_forward,
    convolution_forward,
    to_device,
)
from minidnn.backend import conv_fused as CF
from minidnn.backend._testing import to_numpy

RELU, IDENTITY = ActivationDescriptor(ActivationMode.RELU), ActivationDescriptor(ActivationMode.IDENTITY)

# (id, x shape channels-first, w shape, padding, stride, dilation, groups, format, z?, bias form, activation)
CASES = [
    ("2d-relu", (2, 3, 7, 6), (4, 3, 3, 3), 1, 1, 1, 1, None, True, "K", RELU),
    ("2d-identity", (2, 3, 7, 6), (4, 3, 3, 3), 1, 1, 1, 1, None, True, "K", IDENTITY),
    ("2d-no-z", (2, 3, 7, 6), (4, 3, 3, 3), 0, 1, 1, 1, None, False, "K", RELU),
    ("2d-cudnn-bias", (1, 4, 8, 8), (6, 2, 3, 3), 1, 2, 1, 2, None, True, "1K11", RELU),
    ("2d-no-bias", (2, 3, 5, 5), (4, 3, 1, 1), 0, 1, 1, 1, None, True, None, RELU),
    ("2d-dilated-sigmoid", (1, 2, 9, 9), (3, 2, 3, 3), 2, 1, 2, 1, None, True, "K",
     ActivationDescriptor(ActivationMode.SIGMOID)),
    ("2d-depthwise-clipped", (2, 4, 6, 6), (4, 1, 3, 3), 1, 1, 1, 4, None, True, "K",
     ActivationDescriptor(ActivationMode.CLIPPED_RELU, 0.5)),
    ("2d-nhwc", (2, 3, 6, 5), (4, 3, 3, 3), 1, 1, 1, 1, "NHWC", True, "K", RELU),
    ("2d-nhwc-cudnn-bias", (2, 3, 6, 5), (4, 3, 3, 3), 1, 1, 1, 1, "NHWC", True, "1K11", RELU),
    ("1d", (2, 3, 11), (5, 3, 3), 1, 2, 1, 1, None, True, "K", RELU),
    ("3d", (1, 2, 4, 5, 4), (3, 2, 3, 3, 3), 1, 1, 1, 1, None, True, "K", RELU),
    ("batch-0", (0, 3, 6, 6), (4, 3, 3, 3), 1, 1, 1, 1, None, True, "K", RELU),
]
ALPHAS = (0.75, -0.5)


def _case_arrays(case, dtype, seed=0):
    _, xs, ws, pad, stride, dil, groups, fmt, with_z, bias_form, act = case
    rng = np.random.default_rng(seed)
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    if fmt == "NHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    y_shape = B.get_convolution_forward_output_dim(desc, x.shape, w.shape, format=fmt)
    z = rng.standard_normal(y_shape).astype(dtype) if with_z else None
    K = ws[0]
    bias = None
    if bias_form == "K":
        bias = rng.standard_normal(K).astype(dtype)
    elif bias_form == "1K11":
        shape = [1] * len(xs)
        shape[-1 if fmt == "NHWC" else 1] = K
        bias = rng.standard_normal(shape).astype(dtype)
    return desc, x, w, z, bias, act, fmt


def _composition(desc, x, w, z, bias, act, fmt, alpha1, alpha2):
    """The definition, spelled out with NumPy around the convolution primitive."""
    t = convolution_forward(None, x, w, desc, format=fmt).astype(np.float64) * alpha1
    if z is not None:
        t = t + alpha2 * z
    if bias is not None:
        t = t + (bias.reshape([-1 if i == (t.ndim - 1 if fmt == "NHWC" else 1) else 1 for i in range(t.ndim)])
                 if bias.ndim == 1 else bias)
    return B.activation_forward(None, act, t)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_the_composition(device, case, dtype):
    desc, x, w, z, bias, act, fmt = _case_arrays(case, dtype)
    xd, wd, zd, bd = (None if a is None else to_device(a, device) for a in (x, w, z, bias))
    y = convolution_bias_activation_forward(None, xd, wd, desc, None, zd, *ALPHAS, bd, act, format=fmt)
    expected = _composition(desc, x, w, z, bias, act, fmt, *ALPHAS)
    assert y.dtype == dtype and y.shape == expected.shape
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(to_numpy(y), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("algo", [ConvolutionFwdAlgo.GEMM, ConvolutionFwdAlgo.DIRECT, ConvolutionFwdAlgo.FFT,
                                  ConvolutionFwdAlgo.WINOGRAD_NONFUSED])
def test_explicit_algorithms_and_benchmark_mode(device, algo):
    desc, x, w, z, bias, act, fmt = _case_arrays(CASES[0], np.float64)
    xd, wd, zd, bd = (to_device(a, device) for a in (x, w, z, bias))
    expected = _composition(desc, x, w, z, bias, act, fmt, *ALPHAS)
    y = convolution_bias_activation_forward(Handle(device), xd, wd, desc, algo, zd, *ALPHAS, bd, act)
    np.testing.assert_allclose(to_numpy(y), expected, rtol=1e-10, atol=1e-10)
    y = convolution_bias_activation_forward(Handle(device, benchmark=True), xd, wd, desc, None, zd, *ALPHAS, bd, act)
    np.testing.assert_allclose(to_numpy(y), expected, rtol=1e-10, atol=1e-10)


def test_output_buffer_and_in_place_residual(device):
    desc, x, w, z, bias, act, fmt = _case_arrays(CASES[0], np.float32)
    xd, wd, zd, bd = (to_device(a, device) for a in (x, w, z, bias))
    expected = _composition(desc, x, w, z, bias, act, fmt, *ALPHAS)
    buf = to_device(np.full(z.shape, np.nan, np.float32), device)
    out = convolution_bias_activation_forward(None, xd, wd, desc, None, zd, *ALPHAS, bd, act, y=buf)
    assert out is buf                                       # written in place; the NaN never leaked
    np.testing.assert_allclose(to_numpy(out), expected, rtol=1e-5, atol=1e-5)
    out = convolution_bias_activation_forward(None, xd, wd, desc, None, zd, *ALPHAS, bd, act, y=zd)    # y is z
    assert out is zd
    np.testing.assert_allclose(to_numpy(zd), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(np.float32, (1.3e-6, 1e-5)), (np.float64, (1e-7, 1e-7))])
@pytest.mark.parametrize("stride, padding, dilation, groups", [(1, 1, 1, 1), (2, 0, 1, 1), (1, 2, 2, 2)])
def test_against_pytorch(dtype, tol, stride, padding, dilation, groups):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 9, 8)).astype(dtype)
    w = rng.standard_normal((6, 4 // groups, 3, 3)).astype(dtype)
    b = rng.standard_normal(6).astype(dtype)
    desc = ConvolutionDescriptor(padding, stride, dilation, groups)
    z = rng.standard_normal(B.get_convolution_forward_output_dim(desc, x.shape, w.shape)).astype(dtype)
    tx, tw, tb, tz = (torch.from_numpy(a) for a in (x, w, b, z))
    conv = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    rtol, atol = tol
    # cuDNN's definition: alpha1 scales the convolution, not the bias
    alpha1, alpha2 = 0.8, 0.3
    y = convolution_bias_activation_forward(None, x, w, desc, None, z, alpha1, alpha2, b, RELU)
    ref = F.relu(F.conv2d(tx, tw, **conv) * alpha1 + alpha2 * tz + tb.view(1, -1, 1, 1))
    np.testing.assert_allclose(y, ref.numpy(), rtol=rtol, atol=atol)
    # with alpha1 = 1 it is PyTorch's conv-with-bias + scaled residual + ReLU
    y = convolution_bias_activation_forward(None, x, w, desc, None, z, 1.0, alpha2, b, RELU)
    ref = F.relu(F.conv2d(tx, tw, tb, **conv) * 1.0 + alpha2 * tz)
    np.testing.assert_allclose(y, ref.numpy(), rtol=rtol, atol=atol)


# ---- bad inputs: a clear error naming the values, and no work done ---------------------------------------------

def _good():
    desc, x, w, z, bias, act, fmt = _case_arrays(CASES[0], np.float32)
    return dict(x=x, w=w, conv_desc=desc, algo=None, z=z, alpha1=1.0, alpha2=1.0, bias=bias, activation_desc=act)


BAD = [
    ("z shape", dict(z=np.zeros((2, 4, 7, 5), np.float32)),
     r"z has shape \(2, 4, 7, 5\) but .* output shape \(2, 4, 7, 6\)"),
    ("bias shape", dict(bias=np.zeros(3, np.float32)), r"bias has shape \(3,\) but w \(4, 3, 3, 3\) has K=4"),
    ("bias rank", dict(bias=np.zeros((4, 1), np.float32)), r"bias must be \(4,\) or \(1, 4, 1, 1\)"),
    ("z dtype", dict(z=np.zeros((2, 4, 7, 6), np.float64)), "x has dtype float32 but z .* has dtype float64"),
    ("bias dtype", dict(bias=np.zeros(4, np.float16)), "x has dtype float32 but bias .* has dtype float16"),
    ("w dtype", dict(w=np.zeros((4, 3, 3, 3), np.float64)), "x has dtype float32 but w"),
    ("integer x", dict(x=np.zeros((2, 3, 7, 6), np.int32)), "x has dtype int32, but only floating-point"),
    ("channels", dict(w=np.zeros((4, 2, 3, 3), np.float32)), "x has 3 channels but w .* expects 2"),
    ("w rank", dict(w=np.zeros((4, 3, 3), np.float32)), "is 4-D but w .* is 3-D"),
    ("activation", dict(activation_desc="relu"), "activation_desc must be an ActivationDescriptor, got str"),
    ("descriptor", dict(conv_desc=(1, 1)), "conv_desc must be a ConvolutionDescriptor"),
    ("alpha1 nan", dict(alpha1=float("nan")), "alpha1 must be a finite real number"),
    ("alpha2 type", dict(alpha2="2"), "alpha2 must be a finite real number"),
    ("y shape", dict(y=np.zeros((2, 4, 7, 7), np.float32)), r"y has shape \(2, 4, 7, 7\) but the result has shape"),
    ("y dtype", dict(y=np.zeros((2, 4, 7, 6), np.float64)), "y has dtype float64 but the result has dtype float32"),
    ("algo", dict(algo="NOT_AN_ALGO"), "algo='NOT_AN_ALGO' is not a ConvolutionFwdAlgo"),
]


@pytest.mark.parametrize("name, change, message", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_raise_before_any_work(monkeypatch, name, change, message):
    calls = []
    real = CF.convolution_forward
    if name != "algo":      # the algorithm is checked by convolution_forward itself, before it computes
        monkeypatch.setattr(CF, "convolution_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = {**_good(), **change}
    y = args.get("y")
    before = None if y is None else y.copy()
    with pytest.raises(BadParamError, match=message):
        convolution_bias_activation_forward(None, **args)
    assert calls == []
    if y is not None:
        np.testing.assert_array_equal(y, before)            # the output buffer untouched


def test_unsupported_algorithm_names_the_rule():
    args = {**_good(), "conv_desc": ConvolutionDescriptor(1, stride=2), "z": None,
            "algo": ConvolutionFwdAlgo.WINOGRAD_NONFUSED}
    with pytest.raises(NotSupportedError, match="WINOGRAD_NONFUSED cannot run"):
        convolution_bias_activation_forward(None, **args)


def test_docstring_names_the_fused_gpu_path():
    assert "fused epilogue" in convolution_bias_activation_forward.__doc__
    assert "convolution_bias_activation_forward" in B.__dict__
