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
A call whose pointers are not 256-byte aligned (cublasLt's default alignment assumption; CuPy's pool gives 512)
runs the kernel's settled call instead.  Deterministic (cuBLAS: the same bits run to run on one GPU).
Switch: ``ENABLED[0] = False`` or MINIDNN_CONV_1X1_GEMM=0 at import (part of conv_igemm's call keys).
"""
from __future__ import annotations

import os

import numpy as np

from . import cublas as _cublas
from . import launch as _launch

__all__ = ["ENABLED", "supports", "GemmCall", "settle"]

ENABLED = [os.environ.get("MINIDNN_CONV_1X1_GEMM", "1") != "0"]
_ALIGN = 255
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
    where the pointers are not 256-byte aligned.  Called as conv_igemm's settled calls are."""
    __slots__ = ("direction", "lt", "fallback")

    def __call__(self, cp, a, b, out, extra=(), carry=None):
        if (a.data.ptr | b.data.ptr | out.data.ptr) & _ALIGN:
            return self.fallback(cp, a, b, out, extra, carry)
        # the product's left and right operands at their own addresses: forward (x, w), backward data (dy, w),
        # backward filter (dy, x) -- conv_igemm passes (x, w), (w, dy), (x, dy)
        if self.direction == 0:
            left, right = a, b
        else:
            left, right = b, a
        self.lt.run(left, right, out, None, cp.cuda.get_current_stream().ptr)
        _launch.count_launches()


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


def settle(direction, p, a, b, out, tf32, alpha, beta, fallback):
    """The GemmCall of a qualifying call (see the module's docstring), or None (launches nothing)."""
    if not (ENABLED[0] and _cublas.LT[0]) or supports(p) is not None:
        return None
    if a.dtype not in _DTYPES and a.dtype.name != "bfloat16":
        return None
    ops = _operands(direction, a, b, out)
    if ops is None:
        return None
    left, right, out2 = ops
    wide = out.dtype != left.dtype                   # (backward filter: float32 dw from half data)
    cp = _launch.cupy()
    handle, ws, _ = _cublas._lt_state(cp)
    lt = _cublas._lt_prepare(left, right, out2, np.float32 if wide else None, tf32, None, None, handle, ws)
    if lt is None:
        return None
    if not hasattr(lt, "alpha"):        # a stand-in product without its scalars (tools/record_launches.py's fake)
        return None
    lt.alpha.value, lt.beta.value = float(alpha), float(beta)
    call = GemmCall()
    call.direction, call.lt, call.fallback = direction, lt, fallback
    return call
