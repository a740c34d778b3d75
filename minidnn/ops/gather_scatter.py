"""Index-driven ops with PyTorch's semantics: gather/scatter/scatter_add, masked_fill, tril/triu/diag,
cumsum/cumprod.

    # x: (d0, ..., dn)   index: same ndim as x, index.size(d) <= x.size(d) for d != dim (gather) or
    #                    <= src.size(d) for every d (scatter); out[i][j][k] = x[i][index[i][j][k]][k] (dim=1)

Each op is an ``autograd.Function``: forward on arrays (xp-generic: NumPy or CuPy through the array
module), backward written with these same differentiable ops (gather <-> scatter_add), so
create_graph=True differentiates again.
"""
from __future__ import annotations

import numpy as np

from ..autograd import Function
from ..backend.array_ops import index_add
from ..backend.errors import ArgumentError, DTypeError
from ..tensor import Tensor, _wrap
from ._core import canonical_dim, check_pair, first_order_grads, wide_reduce

__all__ = ["gather", "scatter", "scatter_add", "masked_fill", "tril", "triu", "diag", "cumsum", "cumprod",
           "take_along_dim"]


def _grid(xp, shape, dim, index):
    """The full advanced-index tuple that addresses ``index``'s positions along ``dim`` (open grids elsewhere)."""
    key = []
    nd = len(shape)
    for d in range(nd):
        if d == dim:
            key.append(index)
        else:
            r = xp.arange(shape[d]).reshape((1,) * d + (-1,) + (1,) * (nd - d - 1))
            key.append(r)
    return tuple(key)


def _check_index(op, x, dim, index, other=None, other_name="src"):
    if not isinstance(index, Tensor):
        raise DTypeError(f"{op}: index must be a Tensor, got {type(index).__name__}")
    if index.dtype != np.int64 and index.dtype.kind not in "iu":
        raise DTypeError(f"{op}(): Expected dtype int64 for index, got {index.dtype}")
    check_pair(op, x, index)
    nd = x.ndim
    d = canonical_dim(op, dim, nd)
    if index.ndim != max(nd, 0) and not (nd == 0 and index.ndim <= 1):
        raise ArgumentError(f"{op}: Index tensor must have the same number of dimensions as input tensor (index "
                            f"{tuple(index.shape)}, input {tuple(x.shape)})")
    for i in range(index.ndim):
        if i != d and index.shape[i] > x.shape[i]:
            raise ArgumentError(f"{op}: Size does not match at dimension {i} expected index {tuple(index.shape)} to be "
                                f"no larger than self {tuple(x.shape)} apart from dimension {d}")
        if other is not None and index.shape[i] > other.shape[i]:
            raise ArgumentError(f"{op}: Size does not match at dimension {i} expected index {tuple(index.shape)} to be "
                                f"no larger than {other_name} {tuple(other.shape)}")
    if index.data.size:
        lo, hi = int(index.data.min()), int(index.data.max())
        n = x.shape[d] if nd else 1
        if lo < 0 or hi >= n:
            from ..backend.errors import DimensionError
            raise DimensionError(f"{op}: index {hi if hi >= n else lo} is out of bounds for dimension {d} with size "
                                 f"{n}")
    return d


class Gather(Function):
    @staticmethod
    def forward(ctx, x, dim, index):
        xd, idx = x.data, index.data
        ctx.in_shape, ctx.dim = xd.shape, dim
        ctx.save_for_backward(index)
        if xd.ndim == 0:
            return _wrap(xd.reshape(idx.shape) if idx.size else xd.reshape(-1)[:0].reshape(idx.shape))
        xp = x._xp()
        return _wrap(xd[_grid(xp, idx.shape, dim, idx)])

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        z = _wrap(g._xp().zeros(ctx.in_shape, dtype=g.dtype))
        return ScatterAdd.apply(z, ctx.dim, index, g), None, None


class ScatterAdd(Function):
    @staticmethod
    def forward(ctx, x, dim, index, src):
        ctx.dim = dim
        ctx.save_for_backward(index)
        out = x.data.copy()
        idx = index.data
        if idx.size:
            if out.ndim == 0:
                out = out + src.data.reshape(-1)[:idx.size].sum()
            else:
                xp = x._xp()
                sl = tuple(slice(0, s) for s in idx.shape)
                index_add(out, _grid(xp, idx.shape, dim, idx), src.data[sl].astype(out.dtype))
        return _wrap(out)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        gsrc = None
        if ctx.needs_input_grad[3]:
            gsrc = _pad_to(gather(g, ctx.dim, index), ctx._input_meta[3][0])
        return g if ctx.needs_input_grad[0] else None, None, None, gsrc


class Scatter(Function):
    @staticmethod
    def forward(ctx, x, dim, index, src):
        ctx.dim = dim
        ctx.save_for_backward(index)
        out = x.data.copy()
        idx = index.data
        if idx.size:
            xp = x._xp()
            if isinstance(src, Tensor):
                sl = tuple(slice(0, s) for s in idx.shape)
                v = src.data[sl] if src.ndim else src.data
            else:
                v = src
            if out.ndim == 0:
                out[...] = v.reshape(-1)[0] if hasattr(v, "reshape") else v
            else:
                out[_grid(xp, idx.shape, dim, idx)] = v
        return _wrap(out)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        gx = gsrc = None
        if ctx.needs_input_grad[0]:
            gx = scatter(g, ctx.dim, index, 0.0)
        if len(ctx.needs_input_grad) > 3 and ctx.needs_input_grad[3]:
            gsrc = _pad_to(gather(g, ctx.dim, index), ctx._input_meta[3][0])
        return gx, None, None, gsrc


def _pad_to(t, shape):
    """``t`` (index-shaped) placed at the start of zeros(shape): src may be larger than index."""
    if tuple(t.shape) == tuple(shape):
        return t
    from .shape import pad
    widths = []
    for s, n in zip(reversed(t.shape), reversed(shape)):
        widths += [0, n - s]
    return pad(t, tuple(widths))


def gather(input, dim, index, *, sparse_grad=False):
    """``out[i][j][k] = input[i][index[i][j][k]][k]`` (dim=1); index may be smaller than input off ``dim``."""
    d = _check_index("gather", input, dim, index)
    return Gather.apply(input, d, index)


def take_along_dim(input, indices, dim=None):
    """Pick values of ``input`` at ``indices`` along ``dim`` (torch.take_along_dim): input and indices have the same
    rank and broadcast against each other off ``dim``; with ``dim=None`` both are flattened. Differentiable in ``input``
    (the gradient is scattered back, adding repeated indices)."""
    if dim is None:
        return gather(input.reshape(-1), 0, indices.reshape(-1))
    d = canonical_dim("take_along_dim", dim, input.ndim)
    if indices.ndim != input.ndim:
        raise ArgumentError(f"take_along_dim: input and indices should have the same number of dimensions, but got "
                            f"{input.ndim} dimensions for input (shape {tuple(input.shape)}), and {indices.ndim} "
                            f"dimensions for indices (shape {tuple(indices.shape)})")
    # PyTorch broadcasts input and indices against each other off ``dim`` (each keeps its own size along it)
    shape = list(input.shape)
    shape[d] = indices.shape[d]
    try:
        shape = list(np.broadcast_shapes(tuple(shape), tuple(indices.shape)))
    except ValueError:
        raise ArgumentError(f"take_along_dim: input {tuple(input.shape)} and indices {tuple(indices.shape)} are not "
                            f"broadcastable off dim {d}") from None
    if tuple(indices.shape) != tuple(shape):
        indices = indices.expand(*shape)
    shape[d] = input.shape[d]
    if tuple(input.shape) != tuple(shape):
        input = input.expand(*shape)
    return gather(input, d, indices)


def scatter(input, dim, index, src=None, value=None, *, reduce=None):
    """A copy of ``input`` with ``src`` (a tensor, or a number ``value``) written at ``index`` along ``dim``."""
    if src is None:
        src = value
    if src is None:
        raise ArgumentError("scatter: expected src or value")
    if reduce is not None:
        if reduce == "add":
            return scatter_add(input, dim, index, src if isinstance(src, Tensor) else
                               _wrap(input._xp().full(index.shape, src, dtype=input.dtype)))
        raise ArgumentError(f"scatter: reduce={reduce!r} is not supported (only 'add')")
    if isinstance(src, Tensor):
        if src.dtype != input.dtype:
            raise DTypeError(f"scatter(): Expected self.dtype to be equal to src.dtype ({input.dtype} vs {src.dtype})")
        d = _check_index("scatter", input, dim, index, src)
        return Scatter.apply(input, d, index, src)
    d = _check_index("scatter", input, dim, index)
    return Scatter.apply(input, d, index, src)


def scatter_add(input, dim, index, src):
    """A copy of ``input`` with ``src`` added at ``index`` along ``dim`` (repeated indices accumulate)."""
    if not isinstance(src, Tensor):
        raise DTypeError(f"scatter_add: src must be a Tensor, got {type(src).__name__}")
    if src.dtype != input.dtype:
        raise DTypeError(f"scatter_add(): Expected self.dtype to be equal to src.dtype ({input.dtype} vs {src.dtype})")
    d = _check_index("scatter_add", input, dim, index, src)
    return ScatterAdd.apply(input, d, index, src)


def masked_fill(input, mask, value):
    """``value`` where ``mask`` (bool) holds, else input, both broadcast together (PyTorch's out-of-place rule);
    input's dtype; ``value`` may be a 0-d tensor (its gradient is the sum over the filled places)."""
    if not isinstance(mask, Tensor) or mask.dtype != np.bool_:
        raise DTypeError(f"masked_fill only supports boolean masks, but got mask with dtype "
                         f"{getattr(mask, 'dtype', type(mask).__name__)}")
    check_pair("masked_fill", input, mask)
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ArgumentError(f"masked_fill only supports a 0-dimensional value tensor, but got tensor with "
                                f"{value.ndim} dimension(s)")
        if value.dtype != input.dtype:
            value = value.astype(input.dtype)
    else:
        value = _wrap(input._xp().asarray(value).astype(input.dtype))
    try:        # out of place, PyTorch broadcasts input and mask together (expand_outplace)
        np.broadcast_shapes(tuple(input.shape), tuple(mask.shape))
    except ValueError:
        raise ArgumentError(f"masked_fill: the mask of shape {tuple(mask.shape)} and the input of shape "
                            f"{tuple(input.shape)} are not broadcastable") from None
    from .elementwise import where
    return where(mask, value, input)


def _tri_mask(xp, shape, diagonal, lower):
    r, c = shape[-2], shape[-1]
    i = xp.arange(r).reshape(-1, 1)
    j = xp.arange(c).reshape(1, -1)
    return (j - i <= diagonal) if lower else (j - i >= diagonal)


def _tri(op, input, diagonal, lower):
    if input.ndim < 2:
        raise ArgumentError(f"{op}: input tensor must have at least 2 dimensions, got shape {tuple(input.shape)}")
    from .elementwise import where
    mask = _wrap(_tri_mask(input._xp(), input.shape, int(diagonal), lower))
    return where(mask, input, _wrap(input._xp().zeros((), dtype=input.dtype)))


def tril(input, diagonal=0):
    """The lower triangle (j - i <= diagonal) of the last two dims; zeros elsewhere (never 0 * inf)."""
    return _tri("tril", input, diagonal, True)


def triu(input, diagonal=0):
    """The upper triangle (j - i >= diagonal) of the last two dims."""
    return _tri("triu", input, diagonal, False)


def _diag_index(xp, rows, cols, k):
    n = max(0, min(rows, cols - k) if k >= 0 else min(rows + k, cols))
    i = xp.arange(n) + (max(-k, 0))
    return i, i + k


class Diag(Function):
    @staticmethod
    def forward(ctx, x, k):
        xp = x._xp()
        ctx.k, ctx.in_shape = k, x.shape
        if x.ndim == 1:
            n = x.shape[0] + abs(k)
            out = xp.zeros((n, n), dtype=x.dtype)
            i, j = _diag_index(xp, n, n, k)
            out[i, j] = x.data
            return _wrap(out)
        i, j = _diag_index(xp, x.shape[0], x.shape[1], k)
        return _wrap(x.data[i, j])

    @staticmethod
    def backward(ctx, g):
        if len(ctx.in_shape) == 1:
            return diag(g, ctx.k), None
        from .shape import pad
        rows, cols = ctx.in_shape
        full = diag(g, ctx.k)                    # (n + |k|) square with g on the k-th diagonal
        n = full.shape[0]
        full = full[:min(rows, n), :min(cols, n)]
        return pad(full, (0, cols - full.shape[1], 0, rows - full.shape[0])), None


def diag(input, diagonal=0):
    """1-D input: the square matrix with it on the ``diagonal``-th diagonal; 2-D input: that diagonal."""
    if input.ndim not in (1, 2):
        raise ArgumentError(f"diag(): Supports 1D or 2D tensors. Got {input.ndim}D (shape {tuple(input.shape)})")
    return Diag.apply(input, int(diagonal))


def _cum_dtype(x, dtype):
    if dtype is not None:
        from ..tensor import _to_dtype
        return _to_dtype(dtype)
    return np.dtype(np.int64) if x.dtype.kind in "biu" else x.dtype


class Cumsum(Function):
    @staticmethod
    def forward(ctx, x, dim, dtype):
        ctx.dim = dim
        xd = x.data
        if xd.ndim == 0:
            return _wrap(xd.astype(dtype))
        return _wrap(wide_reduce(x._xp().cumsum, xd, dtype, axis=dim))

    @staticmethod
    def backward(ctx, g):
        if g.ndim == 0:
            return g, None, None
        from .shape import flip
        gx = flip(cumsum(flip(g, (ctx.dim,)), ctx.dim), (ctx.dim,))
        return gx, None, None


def cumsum(input, dim, *, dtype=None):
    """Running sums along ``dim``; integer/bool inputs give int64 (PyTorch's rule) unless ``dtype``."""
    d = canonical_dim("cumsum", dim, input.ndim)
    dt = _cum_dtype(input, dtype)
    if dt != input.dtype and input.dtype.kind == "f":
        input = input.astype(dt)
    return Cumsum.apply(input, d, dt)


class Cumprod(Function):
    @staticmethod
    def forward(ctx, x, dim, dtype):
        ctx.dim = dim
        xd = x.data
        y = xd.astype(dtype) if xd.ndim == 0 else wide_reduce(x._xp().cumprod, xd, dtype, axis=dim)
        ctx.save_for_backward(x)
        return _wrap(y)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):     # inf/nan land as in PyTorch
            gx = _cumprod_grad(x._xp(), x.data, g.data, ctx.dim)
        # computed on arrays: under create_graph, wired to a node that raises if differentiated again
        return (*first_order_grads("cumprod", [gx], g, x), None, None)


def _cumprod_grad(xp, x, g, dim):
    """PyTorch's cumprod gradient (FunctionsManual cumprod_backward, its O(n) form), so infinities and NaNs land
    where PyTorch puts them.  w = y * g.  Without zeros: reversed_cumsum(w) / x.  With zeros, per slice: before
    the first zero z1 the same formula on w masked to [0, z1); at z1, y[z1 - 1] * sum over [z1, z2) of
    g * (running product of x with x[z1] taken as 1); after z1, 0."""
    if x.size <= 1 or x.shape[dim] == 1:
        return g.astype(x.dtype, copy=False)

    def rcumsum(a):
        return xp.flip(xp.cumsum(xp.flip(a, dim), axis=dim), dim)

    y = xp.cumprod(x, axis=dim)
    w = y * g
    is_zero = x == 0
    if not bool(is_zero.any()):
        return (rcumsum(w) / x).astype(x.dtype, copy=False)
    zeros_before = xp.cumsum(is_zero, axis=dim)
    mask = zeros_before == 0
    out = xp.where(mask, rcumsum(xp.where(mask, w, 0)) / x, 0)
    mask = zeros_before == 1
    first = xp.argmax(mask, axis=dim)[(slice(None),) * dim + (None,)]     # 0 where the slice has no zero
    pos = xp.arange(x.shape[dim]).reshape((-1,) + (1,) * (x.ndim - dim - 1))
    first_mask = mask & (pos == first)
    mask &= ~first_mask
    prev = xp.take_along_axis(y, xp.maximum(first - 1, 0), axis=dim)
    prev = xp.where(first == 0, 1, prev)
    at_zero = (xp.cumprod(xp.where(mask, x, 1), axis=dim) * xp.where(zeros_before != 1, 0, g)).sum(
        axis=dim, keepdims=True) * prev
    out = xp.where(first_mask, at_zero, out)
    return out.astype(x.dtype, copy=False)


def cumprod(input, dim, *, dtype=None):
    """Running products along ``dim``; integer/bool inputs give int64 unless ``dtype``.  The gradient is
    exact where the input holds zeros."""
    d = canonical_dim("cumprod", dim, input.ndim)
    dt = _cum_dtype(input, dtype)
    if dt != input.dtype and input.dtype.kind == "f":
        input = input.astype(dt)
    return Cumprod.apply(input, d, dt)
