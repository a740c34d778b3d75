"""The reference convolution: im2col + one matrix product.  This file is the spec; every other
algorithm is tested against it.

# x: (N, C, H, W)  w: (K, C/G, R, S)  y: (N, K, P, Q)        (shown 2-D; 1-D and 3-D are the same code)
# cols: (N*P*Q, C*R*S)   row m = one output pixel (n, p, q); its columns = every input value its window sees
# G groups: channels split in G blocks; block g of y sees only block g of x (w (K, C/G, ...) holds one
#           filter per output channel, for the C/G input channels of its group).  Depthwise: G == C.

A cross-correlation is a matrix product once each output pixel's receptive field is laid out as a row:

    forward           y_rows (N*P*Q, K)   = cols (N*P*Q, C*R*S)  @ w_mat (C*R*S, K)
    backward data     dcols               = dy_rows (N*P*Q, K)   @ w_mat^T,  then col2im (scatter back)
    backward filter   dw_mat (K, C*R*S)   = dy_rows^T            @ cols      (a sum over every pixel)

With groups the matrix w_mat is block-diagonal (one (C/G*R*S, K/G) block per group); ``grouped_matmul``
multiplies by it without forming it.  Everything is written once with ``xp`` so it runs on NumPy and CuPy.
Rows are laid out channels-last (N, P, Q, K), so a y_rows matrix *is* an NHWC array: returning it as a
transposed view costs nothing, and NHWC inputs feed im2col without a transpose.
"""
from __future__ import annotations

import itertools
import math

from ._common import pad_axes
from .blas import grouped_gram, grouped_matmul
from .conv_problem import ConvProblem
from .devices import array_module

__all__ = ["im2col", "col2im", "gemm_forward", "gemm_backward_data", "gemm_backward_filter",
           "to_rows", "from_rows", "forward_weights", "data_weights"]


# ---- layout helpers shared by the algorithms --------------------------------------------------------

def to_rows(a):
    """(N, C, *S) -> (N*S, C): one row per pixel, channels along the row (a copy unless a is NHWC in memory)."""
    nd = a.ndim - 2
    return a.transpose(0, *range(2, 2 + nd), 1).reshape(-1, a.shape[1])


def from_rows(rows, n, spatial):
    """(N*S, C) -> a channels-first (N, C, *S) view of channels-last memory (no copy)."""
    nd = len(spatial)
    return rows.reshape(n, *spatial, rows.shape[-1]).transpose(0, nd + 1, *range(1, nd + 1))


def forward_weights(w, groups):
    """w (K, C/G, *k) -> (G, C/G*k, K/G): the per-group blocks of w_mat, for ``rows @ block``."""
    K = w.shape[0]
    return w.reshape(groups, K // groups, -1).transpose(0, 2, 1)


def data_weights(w, groups):
    """w (K, C/G, *k) -> (G, K/G, C/G*k): the transposed blocks, mapping output rows back to input rows."""
    K = w.shape[0]
    return w.reshape(groups, K // groups, -1)


# ---- im2col / col2im ----------------------------------------------------------------------------------

def _padded(x, p: ConvProblem):
    nd = p.nd
    return pad_axes(array_module(x), x, range(2, 2 + nd), p.padding, p.padding)


def _window_view(xpad, p: ConvProblem):
    """A (N, C, *out, *kernel) view of the padded input, no copy: element [n, c, o.., r..] is
    xpad[n, c, o*stride + r*dilation].  ``as_strided`` exists in both NumPy and CuPy."""
    xp = array_module(xpad)
    sp = xpad.strides[2:]
    shape = (*xpad.shape[:2], *p.out_size, *p.kernel)
    strides = (*xpad.strides[:2], *(st * s for st, s in zip(sp, p.stride)),
               *(st * d for st, d in zip(sp, p.dilation)))
    return xp.lib.stride_tricks.as_strided(xpad, shape=shape, strides=strides)


def im2col(x, p: ConvProblem):
    """x (N, C, *in) -> cols (N*out, C*kernel): one copy of the sliding windows, ordered (pixel, channel, tap)."""
    nd = p.nd
    windows = _window_view(_padded(x, p), p)
    order = (0, *range(2, 2 + nd), 1, *range(2 + nd, 2 + 2 * nd))     # (N, *out, C, *kernel)
    return windows.transpose(order).reshape(p.N * math.prod(p.out_size), p.C * math.prod(p.kernel))


def col2im(cols, p: ConvProblem):
    """The adjoint of im2col: add every column entry back onto the input pixel it was copied from.

    A loop over the kernel taps; each tap adds one strided slice (all pixels, all channels at once).  Taps
    overlap only across iterations, so no two threads ever add to one element concurrently: the sum order
    is fixed and the result deterministic (an atomic scatter-add would not be).
    """
    xp = array_module(cols)
    nd = p.nd
    dxpad = xp.zeros((p.N, p.C, *p.padded_size), dtype=cols.dtype)
    # (N, *out, C, *kernel) -> view (N, C, *kernel, *out): a tap indexes the leading kernel axes
    view = cols.reshape(p.N, *p.out_size, p.C, *p.kernel).transpose(
        0, nd + 1, *range(nd + 2, 2 * nd + 2), *range(1, nd + 1))
    for tap in _all_taps(p.kernel):
        window = tuple(slice(r * d, r * d + s * (o - 1) + 1, s)
                       for r, d, s, o in zip(tap, p.dilation, p.stride, p.out_size))
        dxpad[(slice(None), slice(None)) + window] += view[(slice(None), slice(None)) + tap]
    crop = tuple(slice(q, q + i) for q, i in zip(p.padding, p.in_size))
    return dxpad[(slice(None), slice(None)) + crop]


def _all_taps(kernel):
    return itertools.product(*(range(r) for r in kernel))


# ---- the three directions -------------------------------------------------------------------------------

def gemm_forward(p: ConvProblem, x, w, tf32=False):
    y_rows = grouped_matmul(im2col(x, p), forward_weights(w, p.groups), tf32)        # (N*out, K)
    return from_rows(y_rows, p.N, p.out_size)


def gemm_backward_data(p: ConvProblem, w, dy, tf32=False):
    dcols = grouped_matmul(to_rows(dy), data_weights(w, p.groups), tf32)               # (N*out, C*kernel)
    return col2im(dcols, p)


def gemm_backward_filter(p: ConvProblem, x, dy, tf32=False):
    dw = grouped_gram(to_rows(dy), im2col(x, p), p.groups, tf32)                       # (G, K/G, C/G*kernel)
    return dw.reshape(p.w_shape)
