"""matmul with NumPy's batching, broadcasting and 1-D rules, plus dtype/device transfer ops."""
from __future__ import annotations

import numpy as np

from .._amp_state import autocast_op
from ..autograd import Node, _state
from ..backend import blas as _blas
from ..backend import devices as _dev
from ..tensor import Tensor, _attach, _to_dtype, _wrap
from ._core import check_pair, fit, node, to_tensor
from ..backend.devices import is_floating as _is_floating
from ..backend.errors import ArgumentError

__all__ = ["matmul", "dot", "outer", "transfer", "astype", "clone"]


class MatmulBackward(Node):
    __slots__ = ("a_meta", "b_meta")

    def backward(self, g):
        a, b = self.saved_tensors_checked()
        ga = gb = None
        if a.ndim == 1 and b.ndim == 1:          # dot product: g is a scalar
            return (g * b if self.next_edges[0] else None, g * a if self.next_edges[1] else None)
        # Promote 1-D operands as NumPy does, then undo the promotion on the gradients.
        a2 = a.reshape(1, -1) if a.ndim == 1 else a
        b2 = b.reshape(-1, 1) if b.ndim == 1 else b
        g2 = g
        if a.ndim == 1:
            g2 = g2.unsqueeze(-2)
        if b.ndim == 1:
            g2 = g2.unsqueeze(-1)
        if self.next_edges[0]:
            ga = matmul(g2, b2.swapaxes(-1, -2))
            ga = fit(ga, a2.shape, a.dtype).reshape(a.shape)
        if self.next_edges[1]:
            gb = matmul(a2.swapaxes(-1, -2), g2)
            gb = fit(gb, b2.shape, b.dtype).reshape(b.shape)
        return ga, gb


@autocast_op("matmul")
def matmul(a, b):
    if not isinstance(b, Tensor):
        b = to_tensor(b, a)
    check_pair("matmul", a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ArgumentError(f"matmul: both operands need at least one dimension, got shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)} (use * for scalars)")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if ka != kb:
        raise ArgumentError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} are not aligned: {ka} (last dim of "
                         f"the first) != {kb} ({'second-to-last' if b.ndim > 1 else 'only'} dim of the second)")
    try:
        if type(a.data) is np.ndarray or a.ndim < 2 or b.ndim < 2:
            out = a.data @ b.data
        else:
            out = _blas.matmul(a.data, b.data)      # GPU: cuBLAS on the current stream (graph-capturable)
    except ValueError:
        raise ArgumentError(f"matmul: batch dimensions of {tuple(a.shape)} and {tuple(b.shape)} cannot be broadcast "
                         "together") from None
    if out.dtype != a.dtype and a.dtype == b.dtype:
        out = out.astype(a.dtype)       # NumPy returns bfloat16 products in float32: round once, as a GEMM would
    if _state.grad_enabled and (a.requires_grad or b.requires_grad):
        n = node(MatmulBackward, a if a.requires_grad else None, b if b.requires_grad else None)
        n.save(a, b)
        return _attach(out, n)
    return _wrap(out)


def dot(a, b):
    if a.ndim != 1 or b.ndim != 1:
        raise ArgumentError(f"dot: expected 1-D tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return matmul(a, b)


def outer(a, b):
    return a.reshape(-1, 1) * b.reshape(1, -1)


class TransferBackward(Node):
    __slots__ = ("src_device", "src_dtype")

    def backward(self, g):
        return (transfer(g, device=self.src_device, dtype=self.src_dtype),)


def transfer(x, device=None, dtype=None, copy=False):
    """``x`` on ``device`` with ``dtype``: the explicit (differentiable) way across devices and dtypes."""
    dt = _to_dtype(dtype)
    dev = _dev.device(device) if device is not None else x.device
    same_dev = dev == x.device
    if same_dev and (dt is None or dt == x.dtype) and not copy:
        return x
    out = _dev.to_device(x.data, dev, dtype=dt, copy=copy)
    if _state.grad_enabled and x.requires_grad and (dt is None or _is_floating(dt, complex_ok=True)):
        n = node(TransferBackward, x)
        n.src_device, n.src_dtype = x.device, x.dtype
        return _attach(out, n)
    return _wrap(out)


def astype(x, dtype):
    return transfer(x, dtype=dtype)


def clone(x):
    """A copy with its own memory; differentiable (the gradient passes through unchanged)."""
    return transfer(x, copy=True)
