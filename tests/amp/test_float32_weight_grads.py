"""Autocast's weight gradients in float32 straight from the filter-gradient / GEMM sums (docs/amp.md).

A weight autocast casts from float32 gets its gradient in float32 from the kernel that sums it (conv backward
filter, the linear layer's GEMM, the bias column sum): the cast node passes it through, with no launch, and the
bf16/fp16 rounding of dw that PyTorch makes is skipped.  The oracle is float64 arithmetic on the same low-precision
operands (x and the weight rounded as the forward saw them, dy as backward saw it): our dw must match it to float32
accuracy -- far inside bf16's 2^-8 -- which a rounded dw could not.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import minidnn as mdn
import minidnn.backend as B
import minidnn.nn.functional as F
from minidnn.backend.errors import BadParamError

BF16 = np.dtype(ml_dtypes.bfloat16)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _low(a, dt):
    return np.asarray(a, dtype=np.float32).astype(dt).astype(np.float64)


def _dw_ref(x, dy, w_shape, padding, stride, groups):
    desc = B.ConvolutionDescriptor(padding, stride, 1, groups)
    return B.convolution_backward_filter(None, x, dy, desc, w_shape)


def _not_rounded(v, dt):
    """Some entry of float32 ``v`` is not a value of ``dt``: nothing rounded it."""
    return bool(np.any(v.astype(dt).astype(np.float32) != v))


CONVS = [  # (N, C, H, W, K, R, padding, stride, groups)
    (2, 3, 9, 9, 8, 3, 1, 1, 1),
    (3, 8, 8, 8, 8, 3, 1, 2, 2),
    (2, 6, 7, 7, 6, 3, 1, 1, 6),        # depthwise
    (2, 16, 6, 6, 24, 1, 0, 1, 1),
]


@pytest.mark.parametrize("shape", CONVS)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dt", [BF16, np.dtype(np.float16)], ids=["bf16", "fp16"])
def test_conv_weight_grad_is_float32_sum(device, rng, shape, channels_last, dt):
    N, C, H, W, K, R, pad, st, g = shape
    if device == "cpu" and dt == np.float16:
        pytest.skip("CPU autocast is bfloat16 only")
    x0 = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w0 = (rng.standard_normal((K, C // g, R, R)) * 0.3).astype(np.float32)
    x = mdn.tensor(x0, device=device)
    w = mdn.tensor(w0, device=device, requires_grad=True)
    if channels_last:
        x = x.to(memory_format=mdn.channels_last)
    with mdn.autocast(device, dtype=dt):
        y = F.conv2d(x, w, padding=pad, stride=st, groups=g)
    assert y.dtype == dt
    r = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    (y.float() * mdn.tensor(r, device=device)).sum().backward()
    assert w.grad.dtype == np.float32
    got = w.grad.numpy() if device == "cpu" else w.grad.cpu().numpy()
    ref = _dw_ref(_low(x0, dt), _low(r, dt), w0.shape, pad, st, g)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
    assert _not_rounded(got, dt)


@pytest.mark.parametrize("lead", [(5,), (2, 3)])
def test_linear_weight_and_bias_grads_are_float32_sums(device, rng, lead):
    x0 = rng.standard_normal(lead + (12,)).astype(np.float32)
    w0 = rng.standard_normal((7, 12)).astype(np.float32)
    b0 = rng.standard_normal(7).astype(np.float32)
    x = mdn.tensor(x0, device=device, requires_grad=True)
    w = mdn.tensor(w0, device=device, requires_grad=True)
    b = mdn.tensor(b0, device=device, requires_grad=True)
    with mdn.autocast(device, dtype=BF16):
        y = F.linear(x, w, b)
    assert y.dtype == BF16
    r = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    (y.float() * mdn.tensor(r, device=device)).sum().backward()
    assert w.grad.dtype == b.grad.dtype == x.grad.dtype == np.float32
    host = (lambda t: t.numpy()) if device == "cpu" else (lambda t: t.cpu().numpy())
    g = _low(r, BF16).reshape(-1, 7)
    xl = _low(x0, BF16).reshape(-1, 12)
    np.testing.assert_allclose(host(w.grad), g.T @ xl, rtol=2e-5, atol=1e-5 * np.abs(g.T @ xl).max())
    np.testing.assert_allclose(host(b.grad), g.sum(0), rtol=2e-5, atol=1e-5)
    assert _not_rounded(host(w.grad), BF16)
    # dx still goes back through the input's cast (bf16 gradient, then float32): rounded values
    gx = host(x.grad)
    assert not _not_rounded(gx, BF16)
    np.testing.assert_allclose(gx, (g @ _low(w0, BF16)).reshape(x0.shape), rtol=2e-2, atol=2e-2)


def test_forward_and_input_grads_unchanged(rng):
    """The marked cast changes only the weight gradient: the forward and dx are bit for bit the plain ops'."""
    x0 = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w0 = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    x = mdn.tensor(x0, requires_grad=True)
    w = mdn.tensor(w0, requires_grad=True)
    with mdn.autocast("cpu"):
        y = F.conv2d(x, w, padding=1)
    y.float().sum().backward()
    xb = mdn.tensor(x0.astype(BF16), requires_grad=True)
    wb = mdn.tensor(w0.astype(BF16), requires_grad=True)
    yb = F.conv2d(xb, wb, padding=1)
    yb.float().sum().backward()
    assert np.array_equal(y.numpy().view(np.uint16), yb.numpy().view(np.uint16))
    assert np.array_equal(x.grad.numpy(), xb.grad.numpy().astype(np.float32))
    # the plain bf16 call (no autocast) keeps dw in bf16, the kernel's rounding of the same float32 sums
    assert wb.grad.dtype == BF16
    assert np.array_equal(w.grad.numpy().astype(BF16).view(np.uint16), wb.grad.numpy().view(np.uint16))


def test_create_graph_keeps_the_plain_formula(rng):
    x = mdn.tensor(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    w = mdn.tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), requires_grad=True)
    with mdn.autocast("cpu"):
        y = F.conv2d(x, w, padding=1)
    (gw,) = mdn.autograd.grad(y.float().square().sum(), [w], create_graph=True)
    assert gw.dtype == np.float32 and gw.requires_grad
    assert not _not_rounded(gw.detach().numpy(), BF16)      # bf16 dw, then the cast node: rounded values
    gw.sum().backward()
    assert w.grad is not None and w.grad.dtype == np.float32


def test_backend_dw_dtype_checks():
    x = np.zeros((1, 2, 4, 4), np.float32)
    dy = np.zeros((1, 3, 2, 2), np.float32)
    desc = B.ConvolutionDescriptor(0, 1, 1, 1)
    with pytest.raises(BadParamError, match="dw_dtype"):
        B.convolution_backward_filter(None, x, dy, desc, (3, 2, 3, 3), dw_dtype=np.float16)
    out = B.convolution_backward_filter(None, x, dy, desc, (3, 2, 3, 3), dw_dtype=np.float32)   # its own dtype
    assert out.dtype == np.float32
    xb, dyb = x.astype(BF16), dy.astype(BF16)
    with pytest.raises(BadParamError, match="dw"):
        B.convolution_backward_filter(None, xb, dyb, desc, (3, 2, 3, 3), dw_dtype=np.float32,
                                      dw=np.zeros((3, 2, 3, 3), BF16))
    with pytest.raises(BadParamError, match="db_dtype"):
        B.convolution_backward_bias(None, dy, db_dtype=np.float16)
    assert B.convolution_backward_bias(None, dyb, db_dtype=np.float32).dtype == np.float32


def _fake_step(model, amp):
    env = dict(os.environ, MODE="count", AMP=amp, CL="0")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fake_gpu_step.py"), ROOT, model, "2"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    total = int(re.search(r"launches \d+ kernels \+ \d+ CuPy operations = (\d+)", out.stdout).group(1))
    casts = re.search(r"CuPy operations: (\{.*\})", out.stdout)
    return total, casts.group(1) if casts else "{}"


@pytest.mark.parametrize("model", ["resnet20", "mobilenet"])
def test_bf16_step_launches_at_most_four_more_than_fp32(model):
    """Under the fake CuPy (kernels recorded, never run): no weight-gradient cast is left -- the remaining extra
    launches are the input's cast, the flat weight cast, and the loss's logits/dlogits casts."""
    fp32, _ = _fake_step(model, "")
    bf16, ops = _fake_step(model, "bf16")
    assert bf16 - fp32 <= 4, (fp32, bf16, ops)
    assert "'astype->float32': 1" in ops or "astype->float32" not in ops, ops      # the logits' cast only


# ---- the kernels' float32 output (GPU): every filter-gradient kernel family, against float64 ---------------------
KERNEL_CASES = [  # (N, C, H, W, K, R, padding, stride, groups, format): which kernel runs it
    (64, 32, 16, 16, 32, 3, 1, 1, 1, "NCHW"),     # implicit GEMM (DIR 2), split-K over N*P*Q = 16384
    (64, 32, 16, 16, 32, 3, 1, 1, 1, "NHWC"),     # implicit GEMM, the VEC loader
    (32, 32, 8, 8, 64, 3, 1, 1, 2, "NHWC"),       # implicit GEMM, groups 2
    (32, 16, 16, 16, 32, 3, 1, 2, 2, "NCHW"),     # direct kernels (8 channels per group), stride 2
    (32, 3, 32, 32, 16, 3, 1, 1, 1, "NCHW"),      # a few-channel stem: the direct kernels
    (64, 32, 16, 16, 32, 3, 1, 1, 32, "NCHW"),    # depthwise, register-tiled planes
    (64, 32, 16, 16, 32, 3, 1, 2, 32, "NHWC"),    # depthwise NHWC (dwn_backward_filter)
    (16, 8, 12, 12, 8, 5, 2, 1, 8, "NCHW"),       # depthwise 5x5
]


@pytest.mark.cuda
@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: "x".join(map(str, c[:9])) + c[9])
@pytest.mark.parametrize("dt", [BF16, np.dtype(np.float16)], ids=["bf16", "fp16"])
@pytest.mark.parametrize("algo", ["ALGO_0", "ALGO_3"])
def test_kernel_float32_dw(device, rng, case, dt, algo):
    if device != "cuda":
        pytest.skip("the CUDA kernels' option")
    N, C, H, W, K, R, pad, st, g, fmt = case
    desc = B.ConvolutionDescriptor(pad, st, 1, g)
    w_shape = (K, C // g, R, R)
    P = (H + 2 * pad - R) // st + 1
    x64 = rng.standard_normal((N, C, H, W)).astype(dt).astype(np.float64)
    dy64 = rng.standard_normal((N, K, P, P)).astype(dt).astype(np.float64)
    ref = _dw_ref(x64, dy64, w_shape, pad, st, g)
    bound = _dw_ref(np.abs(x64), np.abs(dy64), w_shape, pad, st, g)     # sum of |terms| per dw entry
    xp = mdn.backend.devices.device("cuda").xp
    perm = (0, 2, 3, 1) if fmt == "NHWC" else (0, 1, 2, 3)
    x = xp.asarray(np.ascontiguousarray(x64.astype(dt).transpose(perm)))
    dy = xp.asarray(np.ascontiguousarray(dy64.astype(dt).transpose(perm)))
    a = getattr(B.ConvolutionBwdFilterAlgo, algo)
    if a == B.ConvolutionBwdFilterAlgo.ALGO_3 and (g > 1 and C // g <= 8):
        pytest.skip("ALGO_3 is the implicit GEMM: not for few channels per group")
    try:
        wide = B.convolution_backward_filter(None, x, dy, desc, w_shape, algo=a, format=fmt, dw_dtype=np.float32)
    except mdn.backend.errors.NotSupportedError as exc:
        pytest.skip(str(exc))
    plain = B.convolution_backward_filter(None, x, dy, desc, w_shape, algo=a, format=fmt)
    assert wide.dtype == np.float32 and plain.dtype == dt
    got = xp.asnumpy(wide)
    assert np.all(np.abs(got - ref) <= 3e-6 * bound + 1e-30), np.max(np.abs(got - ref) / bound)
    assert _not_rounded(got, dt)
    if algo == "ALGO_0":            # deterministic: the plain kernel rounds the very same float32 sums
        assert np.array_equal(got.astype(dt).view(np.uint16), xp.asnumpy(plain).view(np.uint16))


@pytest.mark.cuda
@pytest.mark.parametrize("dt", [BF16, np.dtype(np.float16)], ids=["bf16", "fp16"])
def test_gemm_and_bias_grad_float32_output(device, rng, dt):
    if device != "cuda":
        pytest.skip("cuBLAS's and the column sum's float32 output")
    from minidnn.backend import blas
    xp = mdn.backend.devices.device("cuda").xp
    a64 = rng.standard_normal((300, 40)).astype(dt).astype(np.float64)
    b64 = rng.standard_normal((300, 24)).astype(dt).astype(np.float64)
    a, b = xp.asarray(a64.astype(dt)), xp.asarray(b64.astype(dt))
    got = blas.matmul(a.T, b, out_dtype=np.float32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(xp.asnumpy(got), a64.T @ b64, rtol=0, atol=3e-6 * (np.abs(a64).T @ np.abs(b64)).max())
    db = B.convolution_backward_bias(None, b.reshape(300, 24, 1), db_dtype=np.float32)
    assert db.dtype == np.float32
    np.testing.assert_allclose(xp.asnumpy(db), b64.sum(0), rtol=0, atol=3e-6 * np.abs(b64).sum(0).max())
    plain = B.convolution_backward_bias(None, b.reshape(300, 24, 1))
    assert np.array_equal(xp.asnumpy(db).astype(dt).view(np.uint16), xp.asnumpy(plain).view(np.uint16))
