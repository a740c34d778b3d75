"""A per-channel bias added to a convolution's or a linear layer's output.

# y: (N, C, *S) with the channels on axis 1 (conv), or (*, C) with the channels last (linear);  b: (C,)

    forward   y + b broadcast along the channel axis (the same broadcast add as ``y + b.reshape(...)``)
    backward  dy passes on to y unchanged;  db = sum of dy over every other axis, by the backend's
              ``convolution_backward_bias`` (on the GPU one column-sum kernel: a broadcast Tensor add's gradient
              went through a generic reduction, ~10 µs per bias on LeNet-sized outputs)
    again     under create_graph, db is the same sum in differentiable Tensor ops
"""
from __future__ import annotations

import math

from ... import backend as B
from ..._amp_state import float32_grad_of
from ...autograd import Function, is_grad_enabled
from ._util import handle_for, wrap

__all__ = ["add_bias", "bias_forward", "bias_grad"]


def bias_forward(ctx, y, b, channels_last=False, fresh=False):
    """y + b along the channel axis, for BiasAdd and for ConvForward's own bias.  ``fresh``: y is the caller's own
    new output, which nothing else holds or saved (a convolution's): on the GPU the backend's bias kernel adds b in
    place (one launch, add_tensor's seen-call shortcut), not a broadcast Tensor add.  Keeps on ``ctx`` what
    bias_grad reads."""
    ctx.channels_last = channels_last
    ctx.b_dtype = b.dtype
    ctx.db_dtype = float32_grad_of(b)       # autocast's cast of a float32 bias: db in float32 (docs/amp.md)
    yd = y.data
    if fresh and not channels_last and B.is_cuda_array(yd) and yd.flags.c_contiguous:
        B.add_tensor(handle_for(y), 1.0, b.data, 1.0, yd)
        return wrap(yd)
    shape = (-1,) if channels_last else (1, -1) + (1,) * (y.ndim - 2)
    return y + b.reshape(shape)


def bias_grad(ctx, g, db=None):
    """The bias's gradient: the sum of g over every axis but the channels (set by bias_forward) -- the backend's
    column sum, written into ``db`` (a leaf's gradient slot, _grad_dest.py) where given --, under create_graph the
    same sum in differentiable Tensor ops."""
    if is_grad_enabled():       # create_graph: the sum in differentiable ops
        gb = g.sum(tuple(range(g.ndim - 1)) if ctx.channels_last else (0,) + tuple(range(2, g.ndim)))
    else:
        dy = g.data
        if ctx.channels_last or dy.ndim < 3:        # (*, C) -> (rows, C, 1): channels on axis 1
            dy = dy.reshape(math.prod(dy.shape[:-1]), dy.shape[-1], 1)    # (no -1: C may be 0)
        gb = wrap(B.convolution_backward_bias(handle_for(g), dy, db=db, db_dtype=ctx.db_dtype))
    if gb.dtype != ctx.b_dtype and ctx.db_dtype is None:
        gb = gb.to(dtype=ctx.b_dtype)
    return gb


class BiasAdd(Function):
    @staticmethod
    def forward(ctx, y, b, channels_last, fresh=False):
        return bias_forward(ctx, y, b, channels_last, fresh)

    @staticmethod
    def backward(ctx, g):
        need = ctx.needs_input_grad
        return (g if need[0] else None), (bias_grad(ctx, g) if need[1] else None), None, None


def add_bias(y, bias, channels_last=False, fresh=False):
    """y + bias along y's channel axis (axis 1, or the last axis with ``channels_last``: a linear layer's output);
    ``bias`` None returns y.  ``fresh``: y is the caller's own new output, which nothing else refers to or saved (a
    convolution's): on the GPU the bias is added in place."""
    if bias is None:
        return y
    if y.dtype != bias.dtype or y.ndim < 2 or (y.ndim > 5 and not channels_last):
        # mixed dtypes (PyTorch's promotion) and shapes the column sum does not take: the plain broadcast add
        return y + (bias if channels_last else bias.reshape((1, -1) + (1,) * (y.ndim - 2)))
    return BiasAdd.apply(y, bias, channels_last, fresh)
