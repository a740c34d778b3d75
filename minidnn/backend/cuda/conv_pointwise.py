"""1x1 convolutions as plain matrix products through cublasLt (session 7; docs/conv_kernels.md "Session 7").

# x, dx: (N, C, H, W)  y, dy: (N, K, H, W)  w, dw: (K, C, 1, 1)     channels-first index order; the activations must
#                                                                   be NHWC-contiguous, so that, with M = N*H*W,
#   x2d = x as (M, C), y2d / dy2d as (M, K), w2d = w as (K, C) -- each a row-major matrix at the array's own address:
#   forward         y2d  = x2d  @ w2d^T       (M, K)
#   backward data   dx2d = dy2d @ w2d         (M, C)
#   backward filter dw2d = dy2d^T @ x2d       (K, C)   float32 dw from half data where asked (C in CUDA_R_32F)
# A 1x1, stride-1, unpadded, ungrouped convolution IS this product: no gather, no tap, nothing to tile that cuBLAS
# does not tile better (its split-K GEMM plus reduce ran MobileNet-small's pointwise filter gradients in ~6-12 µs
# against 20-80 µs of the implicit-GEMM kernel in session 7's run 2).

``settle(direction, p, a, b, out, tf32, alpha, beta, fallback)`` is conv_igemm's hook: for a call of the implicit-GEMM
entry points (``_run_igemm`` / ``settled_call``, which nn's settled-call replay keeps) without a fused epilogue, it
returns a ``GemmCall`` -- one prepared cublasLt product (``cublas._lt_prepare``: descriptors, layouts and the
heuristic's algorithm made once, alpha and beta its own), called with the arrays' pointers as they are (no view, no
copy) -- or None where the problem or the layouts do not qualify or cublasLt offers no algorithm (the kernel runs).
A call whose pointers are not ALIGN-byte aligned (16: what the product was prepared for; CuPy's pool gives 512) runs
the kernel's settled call instead.  Deterministic (cuBLAS: the same bits run to run on one GPU).
Switch: ``ENABLED[0] = False`` or MINIDNN_CONV_1X1_GEMM=0 at import (part of conv_igemm's call keys).
"""
from __future__ import annotations

import os

import numpy as np

from . import cublas as _cublas
from . import launch as _launch
from . import workspace as _ws

__all__ = ["ENABLED", "supports", "GemmCall", "settle"]

ENABLED = [os.environ.get("MINIDNN_CONV_1X1_GEMM", "1") != "0"]
# NCHW activations as a product batched over the images (session 9): MINIDNN_CONV_1X1_NCHW=0 leaves them to the kernel
NCHW = [os.environ.get("MINIDNN_CONV_1X1_NCHW", "1") != "0"]
# The pointers' alignment the prepared products are promised (cublasLt's heuristic is told: MIN_ALIGNMENT_*): 16
# bytes, so that filters inside an optimizer's flat buffer (128-byte aligned slices; 64 bytes once cast to 16 bits)
# take the product too.  Session 7's calls assumed cublasLt's default 256.  MINIDNN_CONV_1X1_ALIGN=256 for that.
ALIGN = int(os.environ.get("MINIDNN_CONV_1X1_ALIGN", "16"))
_ALIGN = ALIGN - 1
_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


def supports(p) -> str | None:
    """None where the problem is a plain product (pure: the problem only), else why not."""
    if p.nd != 2:
        return "not a 2-D convolution"
    if p.groups != 1:
        return "grouped"
    if tuple(p.kernel) != (1, 1) or tuple(p.stride) != (1, 1) or tuple(p.padding) != (0, 0):
        return "not a 1x1, stride-1, unpadded convolution"
    if p.N == 0 or p.C == 0 or p.K == 0:
        return "empty"
    return None


def _nhwc(a) -> bool:
    return a.ndim == 4 and a.transpose(0, 2, 3, 1).flags.c_contiguous


def _rows(a):
    """An NHWC-contiguous (N, ch, H, W) array as its (N*H*W, ch) row-major matrix (a view)."""
    n, c, h, w = a.shape
    return a.transpose(0, 2, 3, 1).reshape(n * h * w, c)


class GemmCall:
    """A settled 1x1 call as one cublasLt product; ``fallback``: the kernel's settled call (conv_igemm._Call), run
    where the pointers are not ALIGN-byte aligned.  Called as conv_igemm's settled calls are, which pass (x, w),
    (w, dy), (x, dy) as (a, b); ``left_a``: whether the product's left operand is ``a`` -- NHWC forward only
    (x2d @ w2d^T), NCHW backward data only (w2d^T @ dy[n]).  ``reduce`` (NCHW filter gradient): the batched
    product wrote one (K, C) float32 partial per image into scratch; a second product, ones (1, N) @ partials
    (N, K*C), adds them in image order into dw."""
    __slots__ = ("lt", "fallback", "left_a", "reduce", "partials", "ones")

    def __call__(self, cp, a, b, out, extra=(), carry=None):
        if (a.data.ptr | b.data.ptr | out.data.ptr) & _ALIGN:
            return self.fallback(cp, a, b, out, extra, carry)
        left, right = (a, b) if self.left_a else (b, a)
        stream = cp.cuda.get_current_stream().ptr
        if self.reduce is None:
            self.lt.run(left, right, out, None, stream)
            _launch.count_launches()
            return
        part = _ws.scratch_flat(cp, out.data.device_id, "conv.pw_partials", self.partials, np.float32)
        self.lt.run(left, right, part, None, stream)
        self.reduce.run(self.ones, part, out, None, stream)
        _launch.count_launches(2)


def _operands(direction, a, b, out):
    """(left, right, out) as the 2-D matrices of the product, or None where a layout does not fit."""
    if direction == 0:
        x, w, y = a, b, out
        if not (_nhwc(x) and _nhwc(y) and w[:, :, 0, 0].flags.c_contiguous):
            return None
        return _rows(x), w[:, :, 0, 0].T, _rows(y)
    if direction == 1:
        w, dy, dx = a, b, out
        if not (_nhwc(dy) and _nhwc(dx) and w[:, :, 0, 0].flags.c_contiguous):
            return None
        return _rows(dy), w[:, :, 0, 0], _rows(dx)
    x, dy, dw = a, b, out
    if not (_nhwc(x) and _nhwc(dy) and dw.ndim == 4 and dw.flags.c_contiguous):
        return None
    return _rows(dy).T, _rows(x), dw[:, :, 0, 0]


def _nchw_operands(direction, a, b, out):
    """The NCHW form (C-contiguous activations and filter): (left, right, out, batch) -- the first image's matrices
    of a product batched over the N images, ``batch`` = (N, left's, right's, out's batch strides in elements; 0: the
    filter, the same for every image) -- or None.  With S = H*W:
        forward         y[n] (K, S)  = w2d (K, C)   @ x[n] (C, S)
        backward data   dx[n] (C, S) = w2d^T (C, K) @ dy[n] (K, S)
        backward filter part[n] (K, C) = dy[n] (K, S) @ x[n]^T (S, C)      (then summed over n: GemmCall.reduce)
    Every image's matrices must start ALIGN-byte aligned (the alignment the product is prepared for), so the batch
    strides (C*S, K*S elements) must be multiples of ALIGN bytes."""
    if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
        return None
    if direction == 0:
        x, w, y = a, b, out
    elif direction == 1:
        w, dy, dx = a, b, out
        x, y = dx, dy
    else:
        x, y = a, b
    n, c, h, wd = x.shape
    k, s, e = y.shape[1], h * wd, x.itemsize
    if (c * s * e) % ALIGN or (k * s * e) % ALIGN:
        return None
    if direction == 0:
        return w.reshape(k, c), x[0].reshape(c, s), y[0].reshape(k, s), (n, 0, c * s, k * s)
    if direction == 1:
        return w.reshape(k, c).T, dy[0].reshape(k, s), dx[0].reshape(c, s), (n, 0, k * s, c * s)
    return y[0].reshape(k, s), x[0].reshape(c, s).T, None, (n, k * s, c * s, k * c)


_ones = {}
# The filter gradient's per-image partials live in a kept scratch buffer (workspace.scratch_flat: grown to the
# largest asked): above this size (e.g. N 128 of 1x1 2048 -> 512 convolutions: 512 MiB) the kernel runs instead.
PARTIALS_MAX_BYTES = 64 << 20


def _ones_row(cp, n, dev):
    """A kept (1, n) float32 row of ones on device ``dev`` (the partial sums' reduction; graphs may read it)."""
    t = _ones.get((n, dev))
    if t is None:
        t = _ones[(n, dev)] = cp.empty((1, n), dtype=np.float32)
        t.fill(1.0)
    return t


def settle(direction, p, a, b, out, tf32, alpha, beta, fallback):
    """The GemmCall of a qualifying call (see the module's docstring), or None (launches nothing)."""
    if not (ENABLED[0] and _cublas.LT[0]) or supports(p) is not None:
        return None
    if a.dtype not in _DTYPES and a.dtype.name != "bfloat16":
        return None
    ops = _operands(direction, a, b, out)
    if ops is None:
        return _settle_nchw(direction, a, b, out, tf32, alpha, beta, fallback) if NCHW[0] else None
    left, right, out2 = ops
    wide = out.dtype != left.dtype                   # (backward filter: float32 dw from half data)
    cp = _launch.cupy()
    handle, ws, _ = _cublas._lt_state(cp)
    lt = _cublas._lt_prepare(left, right, out2, np.float32 if wide else None, tf32, None, None, handle, ws,
                             align=ALIGN)
    if lt is None:
        return None
    if not hasattr(lt, "alpha"):        # a stand-in product without its scalars (tools/record_launches.py's fake)
        return None
    lt.alpha.value, lt.beta.value = float(alpha), float(beta)
    call = GemmCall()
    call.lt, call.fallback, call.left_a, call.reduce = lt, fallback, direction == 0, None
    return call


def _settle_nchw(direction, a, b, out, tf32, alpha, beta, fallback):
    """The NCHW form's GemmCall (``_nchw_operands``), or None."""
    ops = _nchw_operands(direction, a, b, out)
    if ops is None:
        return None
    left, right, out2, batch = ops
    cp = _launch.cupy()
    handle, ws, _ = _cublas._lt_state(cp)
    call = GemmCall()
    call.fallback, call.left_a = fallback, direction == 1
    if direction < 2:
        lt = _cublas._lt_prepare(left, right, out2, None, tf32, None, None, handle, ws, batch, align=ALIGN)
        if lt is None or not hasattr(lt, "alpha"):
            return None
        lt.alpha.value, lt.beta.value = float(alpha), float(beta)
        call.lt, call.reduce = lt, None
        return call
    # the filter gradient: float32 partials (one (K, C) per image), then ones (1, N) @ partials (N, K*C) -> dw, the
    # sum in strict fp32 (TF32 would round the partials), blended into dw by alpha, beta
    n, k, c = batch[0], out.shape[0], out.shape[1]
    if out.dtype != np.float32 or n * k * c * 4 > PARTIALS_MAX_BYTES:
        return None
    lt = _cublas._lt_prepare(left, right, _Matrix((k, c)), None if left.dtype == np.float32 else np.float32, tf32,
                             None, None, handle, ws, batch, align=ALIGN)
    ones = _ones_row(cp, n, out.data.device_id)
    red = _cublas._lt_prepare(ones, _Matrix((n, k * c)), out.reshape(1, k * c), None, False, None, None, handle, ws,
                              None, True, ALIGN)
    if lt is None or red is None or not hasattr(lt, "alpha"):
        return None
    lt.alpha.value, lt.beta.value = 1.0, 0.0
    red.alpha.value, red.beta.value = float(alpha), float(beta)
    call.lt, call.reduce, call.partials, call.ones = lt, red, n * k * c, ones
    return call


class _Matrix:
    """A C-contiguous float32 matrix described, not allocated (the partials, for _lt_prepare's checks)."""
    ndim, dtype, itemsize = 2, np.dtype(np.float32), 4

    def __init__(self, shape):
        self.shape, self.strides = shape, (shape[1] * 4, 4)
        self.flags = self

    c_contiguous = True
