"""A linear layer as one Function: the product, the bias, and their first-order gradients on raw arrays.

# x: (*, in)   w: (out, in)   b: (out,)   g = dy: (*, out)   rows = every leading index of x, flattened

    forward    y = x @ w.T  (one GEMM on the rows: cuBLAS on the GPU), then y += b in place (the backend's
               add_tensor: one bias kernel on the GPU)
    backward   dx = g @ w,  dw = g^T x  (one GEMM each),  db = the column sum of g (convolution_backward_bias)
    GPU        cublasLt where it takes the call (blas.lt_product): y = x @ w.T + b in one launch (epilogue BIAS),
               dw = g^T x and db in one launch (epilogue BGRADB: the row sums of g^T), dw and db written straight
               into the optimizer's flat-buffer slots where the engine offers them (_grad_dest); else the above
    again      under create_graph, the same formulas in differentiable Tensor ops

``F.linear`` used to record ``input @ weight.T`` and the bias add as three nodes (a transpose, a Matmul, a BiasAdd),
whose backward ran differentiable Tensor ops -- a matmul with its checks, transposes, and the transpose's gradient
(a strided view the leaf then copies) -- on every step; one node with array-level first-order backward is the host
cost a PyTorch user expects of a linear layer (docs/host_overhead.md round 16).  Under autocast, where the weight is
a float16/bfloat16 cast of a float32 parameter (``_amp_state.float32_grad_of``), dw comes back in float32 straight
from the GEMM (cuBLAS's float32 output; on the CPU the product of float32 copies), which the cast node passes
through -- or, for autocast's direct weights (no cast node: the edge goes to the parameter itself), which reaches
the parameter as it is; the bias's db likewise (docs/amp.md).
"""
from __future__ import annotations

import math
import os

import numpy as np

from ... import backend as B
from ..._amp_state import float32_grad_of, graph_weight, leaf_grad
from ..._grad_dest import destination
from ...autograd import Function, _state, is_grad_enabled
from ...backend import blas
from ...backend._common import SeenCalls
from ...tensor import Tensor
from ._util import apply_seen, handle_for, wrap

__all__ = ["Linear"]


def _product(a, b, dtype=None):
    """a @ b on 2-D arrays, in a's dtype (NumPy returns bfloat16 products in float32: rounded once, as a GEMM would)
    or in ``dtype`` (float32 of 16-bit operands)."""
    out = blas.matmul(a, b, out_dtype=dtype)
    want = a.dtype if dtype is None else np.dtype(dtype)
    return out if out.dtype == want else out.astype(want)


class Linear(Function):
    """y = x @ w.T (+ b) for x (*, in) with at least 2 dims, w (out, in), b (out,) or None, all of one dtype."""

    @staticmethod
    def forward(ctx, x, w, b):
        need = ctx.needs_input_grad
        ctx.save_for_backward(x if need[1] else None, w if need[0] else None)
        ctx.x_shape = tuple(x.shape)
        ctx.dw_dtype = float32_grad_of(w) if need[1] else None
        ctx.db_dtype = float32_grad_of(b) if b is not None and need[2] else None
        xd = x.data
        flat = xd.ndim == 2     # 2-D x (every classifier head): the arrays as they are, no reshaped views made
        ctx.rows = rows = math.prod(ctx.x_shape[:-1])          # (no -1 in the reshapes: a dim may be 0)
        x2 = xd if flat else xd.reshape(rows, ctx.x_shape[-1])
        wt = w.data.T
        y = blas.lt_product(x2, wt, bias=None if b is None else b.data)     # GPU: one launch, or None
        if y is None:
            y = _product(x2, wt)
            if b is not None:
                B.add_tensor(handle_for(x), 1.0, b.data, 1.0, y)        # in place: y is this call's own array
        return wrap(y if flat else y.reshape(*ctx.x_shape[:-1], y.shape[-1]))

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        if is_grad_enabled():       # create_graph: differentiable ops, gradients in the operands' dtypes
            g2 = g.reshape(ctx.rows, g.shape[-1])       # (autocast's direct weight and bias: as their cast nodes'
            return (g @ graph_weight(w) if need[0] else None,     # outputs, float32 gradients; _amp_state)
                    leaf_grad(ctx, 1, g2.T @ x.reshape(ctx.rows, ctx.x_shape[-1])) if need[1] else None,
                    leaf_grad(ctx, 2, g2.sum(0)) if need[2] else None)
        gd = g.data
        flat = len(ctx.x_shape) == 2 and gd.ndim == 2       # 2-D: no reshaped views (as the forward)
        g2 = gd if flat else gd.reshape(ctx.rows, gd.shape[-1])
        gx = None
        if need[0]:
            gx = blas.lt_product(g2, w.data)            # GPU: the prepared cublasLt call, or None
            gx = _product(g2, w.data) if gx is None else gx
            gx = wrap(gx if flat else gx.reshape(ctx.x_shape))
        gw = gb = None
        if need[1]:
            x2 = x.data if flat else x.data.reshape(ctx.rows, ctx.x_shape[-1])
            if type(gd) is not np.ndarray:
                gw, gb = _gpu_filter_and_bias(ctx, g2, x2, need[2])
            if gw is None:
                gw = wrap(_product(g2.T, x2, ctx.dw_dtype))
        if need[2] and gb is None:
            rows = g2.reshape(g2.shape[0], g2.shape[1], 1)          # (rows, out, 1): the channels on axis 1
            h = handle_for(g)
            gb = wrap(B.convolution_backward_bias(h, rows) if ctx.db_dtype is None else
                      B.convolution_backward_bias(h, rows, db_dtype=ctx.db_dtype))
        return gx, gw, gb


def _slot(ctx, i, shape, dtype):
    """The leaf's flat-buffer slot the engine offers for input i's gradient (beta 0), or None."""
    d = destination(ctx, i, shape, dtype)
    return d[0] if d is not None and not d[1] else None


def _gpu_filter_and_bias(ctx, g2, x2, with_bias):
    """(dw, db or None) Tensors from one cublasLt launch -- dw = g^T x with db, g's column sums, from its epilogue
    where db has dw's dtype -- each written into its flat-buffer slot where offered; (None, None) where cublasLt
    takes no such call."""
    dt = np.dtype(ctx.dw_dtype) if ctx.dw_dtype is not None else g2.dtype
    fused = with_bias and (np.dtype(ctx.db_dtype) if ctx.db_dtype is not None else g2.dtype) == dt
    dw_slot = _slot(ctx, 1, (g2.shape[1], x2.shape[1]), dt)
    db_slot = _slot(ctx, 2, (g2.shape[1],), dt) if fused else None
    r = blas.lt_product(g2.T, x2, out=dw_slot, out_dtype=ctx.dw_dtype,
                        row_sums=(True if db_slot is None else db_slot) if fused else None)
    if r is None:
        return None, None
    return (wrap(r[0]), wrap(r[1])) if fused else (wrap(r), None)


# F.linear of GPU tensors on a seen signature (docs/host_overhead.md round 24).  The full path is F.linear's checks
# (weight 2-D, features matching, the bias's shape, one dtype) and Linear.apply.  After a full-path call that took
# Linear.apply, the signature -- the three arrays' types, shapes, dtypes and devices, whether the bias is given -- is
# remembered; the same signature again skips the checks (they read only what the key holds) and runs Linear.forward
# with the node Function.apply records (the same fields: needs_input_grad, edges, input and output metadata, the
# output's autograd fields), without apply's generic passes over the arguments and outputs.  Anomaly mode takes the
# full path (it records a trace).  Switch: LINEAR_FAST[0] = False, or MINIDNN_LINEAR_FAST=0 at import.
LINEAR_FAST = [os.environ.get("MINIDNN_LINEAR_FAST", "1") != "0"]
_LINEAR_SEEN = SeenCalls()


def linear_key(x, w, b):
    """The seen-call key of F.linear(x, w, b) on GPU arrays, or None (the full path, not remembered)."""
    if not (isinstance(x, Tensor) and isinstance(w, Tensor) and (b is None or isinstance(b, Tensor))):
        return None
    xd, wd = x.data, w.data
    if type(xd) is np.ndarray or type(wd) is not type(xd):
        return None
    try:
        if b is None:
            return xd.shape, xd.dtype, xd.data.device_id, wd.shape, wd.dtype, wd.data.device_id, None
        bd = b.data
        if type(bd) is not type(xd):
            return None
        return (xd.shape, xd.dtype, xd.data.device_id, wd.shape, wd.dtype, wd.data.device_id,
                (bd.shape, bd.dtype, bd.data.device_id))
    except AttributeError:
        return None


def remember_linear(key, y):
    """After F.linear's checks passed and Linear.apply returned ``y`` for this key (apply's device check passed too)."""
    if key is not None and LINEAR_FAST[0] and isinstance(y, Tensor):
        _LINEAR_SEEN.remember(key, True)


def linear_seen(x, w, b, key):
    """Linear.apply(x, w, b) as apply computes and records it, on a remembered key; None: not remembered (nothing
    was done)."""
    if key not in _LINEAR_SEEN or not LINEAR_FAST[0] or _state.anomaly:
        return None
    return apply_seen(Linear, x, w, b)
