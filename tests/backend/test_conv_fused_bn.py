"""The batch-norm fusions of the convolution primitives, on the CPU (their reference compositions):
convolution_bias_activation_forward(..., stats=(sum, sumsq)) -- the per-channel statistics of y (cuDNN frontend's
GenStats) -- and scale_bias_activation_convolution_forward -- y = act(alpha1 * conv(act_p(x * scale + shift), w) +
alpha2 * z + bias) (ScaleBiasReluConv) -- against float64 loops over output pixels and taps written here (padding
taps skipped: zeros of the ACTIVATED tensor), against PyTorch where installed, and their errors (raised before any
work, nothing written).  The GPU kernel against these compositions: test_conv_epilogue_bn_cuda.py."""
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import (
    ActivationDescriptor,
    BadParamError,
    ConvolutionDescriptor,
    convolution_bias_activation_forward,
    scale_bias_activation_convolution_forward,
    scale_bias_activation_convolution_reason,
)
from minidnn.backend import conv_fused as CF

RELU, IDENTITY = ActivationDescriptor("relu"), ActivationDescriptor("identity")


def _act(v, desc):
    return np.maximum(v, 0.0) if desc.mode.name == "RELU" else v


def _loops(x, w, pad, stride, dil, groups, scale=None, shift=None, pro=None, z=None, alpha1=1.0, alpha2=1.0,
           bias=None, act=IDENTITY):
    """float64 loops, channels-first 2-D: (y, sum, sumsq).  The prologue is applied to in-bounds taps only."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    Kg = K // groups
    if pro is not None:
        xa = _act(x * scale.reshape(1, -1, 1, 1).astype(np.float64) + shift.reshape(1, -1, 1, 1), pro)
    else:
        xa = x
    P = (H + 2 * pad - dil * (R - 1) - 1) // stride + 1
    Q = (W + 2 * pad - dil * (S - 1) - 1) // stride + 1
    y = np.zeros((N, K, P, Q))
    for p in range(P):
        for q in range(Q):
            for r in range(R):
                for s in range(S):
                    h, ww = p * stride - pad + r * dil, q * stride - pad + s * dil
                    if not (0 <= h < H and 0 <= ww < W):
                        continue                        # padding: a zero of the activated tensor
                    for g in range(groups):
                        xs = xa[:, g * Cg:(g + 1) * Cg, h, ww]                     # (N, Cg)
                        ws = w[g * Kg:(g + 1) * Kg, :, r, s]                       # (Kg, Cg)
                        y[:, g * Kg:(g + 1) * Kg, p, q] += xs @ ws.T
    y = alpha1 * y
    if z is not None:
        y += alpha2 * z.astype(np.float64)
    if bias is not None:
        y += bias.reshape(1, -1, 1, 1)
    y = _act(y, act)
    return y, y.sum(axis=(0, 2, 3)), (y * y).sum(axis=(0, 2, 3))


# (id, x shape, K, R, padding, stride, dilation, groups)
SHAPES = [
    ("3x3-pad1", (2, 4, 7, 6), 5, 3, 1, 1, 1, 1),
    ("1x1-pad0", (3, 3, 5, 4), 4, 1, 0, 1, 1, 1),
    ("5x5-pad3-stride2", (2, 3, 9, 8), 4, 5, 3, 2, 1, 1),
    ("3x3-pad2-dil2", (1, 4, 9, 9), 3, 3, 2, 1, 2, 1),
    ("3x3-groups2", (2, 4, 6, 6), 6, 3, 1, 1, 1, 2),
    ("n1-c1-k1", (1, 1, 5, 5), 1, 3, 1, 1, 1, 1),
]


def _arrays(shape, dtype, seed=0):
    _, xs, K, R, pad, stride, dil, groups = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((K, xs[1] // groups, R, R)).astype(dtype)
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    ys = B.get_convolution_forward_output_dim(desc, x.shape, w.shape)
    z = rng.standard_normal(ys).astype(dtype)
    b = rng.standard_normal(K).astype(dtype)
    ct = np.float64 if dtype == np.float64 else np.float32
    scale = (rng.uniform(0.5, 1.5, xs[1]) * rng.choice([-1, 1], xs[1])).astype(ct)
    shift = rng.uniform(0.5, 1.5, xs[1]).astype(ct)         # > 0: act_p(shift) != 0, so padding is visible
    return desc, x, w, z, b, scale, shift


def _nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def _tol(dtype, length):
    """Absolute tolerance per unit of |terms|: the float32 composition rounds each product and partial sum."""
    return (4 * length * 2.0 ** -24) if dtype == np.float32 else (4 * length * 2.0 ** -53)


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_statistics_match_loops(shape, dtype, fmt):
    desc, x, w, z, b, _, _ = _arrays(shape, dtype)
    _, _, _, pad, stride, dil, groups = shape[1:]
    ref, rsum, rsq = _loops(x, w, pad, stride, dil, groups, z=z, alpha1=0.75, alpha2=-0.5, bias=b, act=RELU)
    ct = np.float64 if dtype == np.float64 else np.float32
    K = w.shape[0]
    stats = (np.full(K, np.nan, ct), np.full(K, np.nan, ct))
    xx, zz = (x, z) if fmt == "NCHW" else (_nhwc(x), _nhwc(z))
    y = convolution_bias_activation_forward(None, xx, w, desc, None, zz, 0.75, -0.5, b, RELU, format=fmt,
                                            stats=stats)
    yc = y if fmt == "NCHW" else np.moveaxis(y, -1, 1)
    count = ref.size // K
    red = x.shape[1] // groups * w.shape[2] * w.shape[3]
    mag = _loops(np.abs(x), np.abs(w), pad, stride, dil, groups, z=np.abs(z), alpha1=0.75, alpha2=0.5,
                 bias=np.abs(b))[0]
    np.testing.assert_allclose(yc, ref, rtol=0, atol=_tol(dtype, red + 3) * mag.max() + 1e-30)
    # sums of count values, each within the bound above
    err_s = _tol(dtype, red + 3 + count) * (mag.sum(axis=(0, 2, 3)))
    err_q = _tol(dtype, red + 3 + count) * 2 * (mag * mag).sum(axis=(0, 2, 3))
    assert np.all(np.abs(stats[0] - rsum) <= err_s), (stats[0], rsum)
    assert np.all(np.abs(stats[1] - rsq) <= err_q), (stats[1], rsq)


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("pro", [RELU, IDENTITY], ids=["relu", "identity"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_prologue_matches_loops(shape, dtype, pro, fmt):
    desc, x, w, z, b, scale, shift = _arrays(shape, dtype, seed=1)
    _, _, _, pad, stride, dil, groups = shape[1:]
    ref, rsum, rsq = _loops(x, w, pad, stride, dil, groups, scale, shift, pro, z, 1.25, 0.5, b, RELU)
    K = w.shape[0]
    ct = scale.dtype
    stats = (np.zeros(K, ct), np.zeros(K, ct))
    xx, zz = (x, z) if fmt == "NCHW" else (_nhwc(x), _nhwc(z))
    y = scale_bias_activation_convolution_forward(None, xx, scale, shift, pro, w, desc, None, format=fmt, z=zz,
                                                  alpha1=1.25, alpha2=0.5, bias=b, activation_desc=RELU,
                                                  stats=stats)
    yc = y if fmt == "NCHW" else np.moveaxis(y, -1, 1)
    red = x.shape[1] // groups * w.shape[2] * w.shape[3]
    xa = np.abs(x.astype(np.float64) * scale.reshape(1, -1, 1, 1)) + shift.reshape(1, -1, 1, 1)
    mag = _loops(xa, np.abs(w), pad, stride, dil, groups, z=np.abs(z), alpha1=1.25, alpha2=0.5, bias=np.abs(b))[0]
    np.testing.assert_allclose(yc, ref, rtol=0, atol=_tol(dtype, red + 5) * mag.max() + 1e-30)
    count = ref.size // K
    assert np.all(np.abs(stats[0] - rsum) <= _tol(dtype, red + 5 + count) * mag.sum(axis=(0, 2, 3)))
    assert np.all(np.abs(stats[1] - rsq) <= _tol(dtype, red + 5 + count) * 2 * (mag * mag).sum(axis=(0, 2, 3)))


def test_padding_is_a_zero_of_the_activated_tensor():
    """x = 0 everywhere, shift = 1: act_p(x * s + shift) = 1 inside, 0 in the padding; an all-ones 3x3 filter then
    counts each output's in-bounds taps (4 at a corner, 6 on an edge, 9 inside), not 9 everywhere."""
    x = np.zeros((1, 1, 4, 4), np.float32)
    w = np.ones((1, 1, 3, 3), np.float32)
    one = np.ones(1, np.float32)
    y = scale_bias_activation_convolution_forward(None, x, one, one, RELU, w, ConvolutionDescriptor(1))
    expected = np.array([[4, 6, 6, 4], [6, 9, 9, 6], [6, 9, 9, 6], [4, 6, 6, 4]], np.float32)
    np.testing.assert_array_equal(y[0, 0], expected)


def test_defaults_are_the_plain_convolution_of_the_transformed_input():
    desc, x, w, _, _, scale, shift = _arrays(SHAPES[0], np.float64, seed=2)
    y = scale_bias_activation_convolution_forward(None, x, scale, shift, RELU, w, desc)
    xa = np.maximum(x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1), 0)
    np.testing.assert_allclose(y, B.convolution_forward(None, xa, w, desc), rtol=1e-12, atol=1e-12)


def test_broadcast_forms_and_float16_statistics_of_the_stored_y():
    desc, x, w, z, b, scale, shift = _arrays(SHAPES[0], np.float16, seed=3)
    K = w.shape[0]
    s1 = (np.zeros(K, np.float32), np.zeros(K, np.float32))
    y1 = scale_bias_activation_convolution_forward(None, x, scale, shift, RELU, w, desc, z=z, bias=b,
                                                   activation_desc=RELU, stats=s1)
    s2 = (np.zeros(K, np.float32), np.zeros(K, np.float32))
    y2 = scale_bias_activation_convolution_forward(None, x, scale.reshape(1, -1, 1, 1), shift.reshape(1, -1, 1, 1),
                                                   RELU, w, desc, z=z, bias=b.reshape(1, -1, 1, 1),
                                                   activation_desc=RELU, stats=s2)
    assert y1.dtype == np.float16
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(s1[0], s2[0])
    yf = y1.astype(np.float32)                  # the statistics are of the rounded (stored) y
    np.testing.assert_allclose(s1[0], yf.sum(axis=(0, 2, 3)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s1[1], (yf * yf).sum(axis=(0, 2, 3)), rtol=1e-6, atol=1e-6)


def test_against_pytorch_batch_norm_relu_conv():
    """The fusion of a training step's bn -> relu -> conv (-> the next bn's batch statistics), against PyTorch."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6, 8, 8))
    w = rng.standard_normal((5, 6, 3, 3))
    gamma, beta = rng.uniform(0.5, 2, 6), rng.standard_normal(6)
    tx = torch.from_numpy(x)
    t = F.batch_norm(tx, None, None, torch.from_numpy(gamma), torch.from_numpy(beta), training=True, eps=1e-5)
    ref = F.conv2d(F.relu(t), torch.from_numpy(w), stride=2, padding=1)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    scale = gamma / np.sqrt(var + 1e-5)
    shift = beta - mean * scale
    stats = (np.zeros(5), np.zeros(5))
    y = scale_bias_activation_convolution_forward(None, x, scale, shift, RELU, w, ConvolutionDescriptor(1, 2),
                                                  stats=stats)
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-10, atol=1e-10)
    count = y.size // 5
    np.testing.assert_allclose(stats[0] / count, ref.mean(dim=(0, 2, 3)).numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(stats[1] / count - (stats[0] / count) ** 2, ref.var(dim=(0, 2, 3), unbiased=False),
                               rtol=1e-9, atol=1e-12)


def test_one_dimensional_and_batch_zero():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 11)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3)).astype(np.float32)
    sc, sh = np.full(3, 0.5, np.float32), np.full(3, -0.25, np.float32)
    desc = ConvolutionDescriptor(2, 2)
    stats = (np.zeros(4, np.float32), np.zeros(4, np.float32))
    y = scale_bias_activation_convolution_forward(None, x, sc, sh, RELU, w, desc, stats=stats)
    ref2 = B.convolution_forward(None, np.maximum(x * 0.5 - 0.25, 0), w, desc)
    np.testing.assert_allclose(y, ref2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(stats[0], y.astype(np.float64).sum(axis=(0, 2)), rtol=1e-5)
    x0 = np.zeros((0, 3, 11), np.float32)
    stats = (np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32))
    y0 = scale_bias_activation_convolution_forward(None, x0, sc, sh, RELU, w, desc, stats=stats)
    assert y0.shape == (0, 4, 7)
    np.testing.assert_array_equal(stats[0], 0)
    np.testing.assert_array_equal(stats[1], 0)


def test_reason_on_the_cpu():
    desc, x, w, _, _, scale, shift = _arrays(SHAPES[0], np.float32)
    why = scale_bias_activation_convolution_reason(None, x, scale, shift, RELU, w, desc)
    assert "CPU" in why
    assert "CPU" in B.fused_reason(None, x, w, desc, None, None, 1.0, 0.0, None, RELU,
                                   stats=(np.zeros(5, np.float32), np.zeros(5, np.float32)))


# ---- bad inputs: a clear error naming the values, before any work, nothing written --------------------------

def _good(dtype=np.float32):
    desc, x, w, z, b, scale, shift = _arrays(SHAPES[0], dtype)
    return dict(x=x, scale=scale, shift=shift, prologue_desc=RELU, w=w, conv_desc=desc, z=z, bias=b,
                stats=(np.zeros(5, np.float32), np.zeros(5, np.float32)))


_S = np.zeros(10, np.float32)
BAD = [
    ("scale shape", dict(scale=np.zeros(3, np.float32)), r"scale has shape \(3,\) but x \(2, 4, 7, 6\) has C=4"),
    ("shift rank", dict(shift=np.zeros((4, 1), np.float32)), r"shift must be \(4,\) or \(1, 4, 1, 1\)"),
    ("scale dtype", dict(scale=np.zeros(4, np.float64)), "scale has dtype float64 but must be float32 for x of"),
    ("scale missing", dict(scale=None), "scale must be an array, got NoneType"),
    ("prologue desc", dict(prologue_desc="relu"), "prologue_desc must be an ActivationDescriptor, got str"),
    ("stats not a pair", dict(stats=np.zeros(5, np.float32)), r"stats must be a pair of arrays \(sum, sumsq\)"),
    ("stats shape", dict(stats=(np.zeros(4, np.float32), np.zeros(5, np.float32))),
     r"stats\[0\] \(sum\) has shape \(4,\) but w \(5, 4, 3, 3\) has K=5"),
    ("stats dtype", dict(stats=(np.zeros(5, np.float32), np.zeros(5, np.float16))),
     r"stats\[1\] \(sumsq\) has dtype float16 but must be float32"),
    ("stats overlap", dict(stats=(_S[:5], _S[3:8])), "overlap; they must be distinct"),
    ("stats same", dict(stats=(_S[:5], _S[:5])), "overlap; they must be distinct"),
    ("z shape", dict(z=np.zeros((2, 5, 7, 5), np.float32)), r"z has shape \(2, 5, 7, 5\) but"),
    ("x dtype", dict(x=np.zeros((2, 4, 7, 6), np.float64)), "x has dtype float64 but w"),
]


@pytest.mark.parametrize("name, change, message", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_raise_before_any_work(monkeypatch, name, change, message):
    calls = []
    real = CF.convolution_forward
    monkeypatch.setattr(CF, "convolution_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = {**_good(), **change}
    stats = args["stats"]
    before = [np.array(a, copy=True) for a in stats] if isinstance(stats, tuple) else None
    with pytest.raises(BadParamError, match=message):
        scale_bias_activation_convolution_forward(None, **args)
    assert calls == []
    if before is not None:
        for a, b in zip(stats, before):
            np.testing.assert_array_equal(a, b)


def test_statistics_overlapping_an_input_or_y_is_an_error():
    g = _good()
    y = np.zeros((2, 5, 7, 6), np.float32)
    for stats, what in (((g["x"].reshape(-1)[:5], np.zeros(5, np.float32)), "overlaps x"),
                        ((np.zeros(5, np.float32), y.reshape(-1)[:5]), "overlaps y"),
                        ((g["scale"][:5] if g["scale"].size >= 5 else g["bias"], np.zeros(5, np.float32)),
                         "overlaps")):
        with pytest.raises(BadParamError, match=what):
            convolution_bias_activation_forward(None, g["x"], g["w"], g["conv_desc"], None, None, 1.0, 0.0,
                                                g["bias"], RELU, y=y, stats=stats)
