"""Reductions: sum, mean, var, std, max, min, logsumexp, prod, and argmax/argmin (no grad).

``axis`` may be None, an int (negative counts from the end) or a tuple; ``keepdims``.  PyTorch's
spelling ``dim=`` / ``keepdim=`` is accepted too.  A 0-d tensor takes dim 0 and -1 (as in PyTorch).
``max(dim)``/``min(dim)`` return PyTorch's named tuple (values, indices) (ops/sorting.py); ``max()`` over
everything and ``amax``/``amin`` return values, their gradient split evenly among ties.
"""
from __future__ import annotations

import builtins

import numpy as np

from .._amp_state import autocast_op
from ..autograd import Function, _state
from ..backend.devices import is_floating as _is_floating
from ..backend.errors import ArgumentError, DTypeError
from ..tensor import Tensor, _wrap
from ._core import broadcast_to, canonical_dim, first_order_grads, wide_reduce

__all__ = ["sum", "mean", "var", "std", "max", "min", "amax", "amin", "logsumexp", "prod", "argmax", "argmin",
           "all", "any", "norm"]


def _axes(x, axis, dim, where="reduction"):
    """None (all dims) or a sorted tuple of canonical dims; () for a 0-d tensor given dim 0 or -1."""
    if dim is not None:
        if axis is not None:
            raise DTypeError(f"{where}: give either axis= or dim=, not both")
        axis = dim
    nd = x.ndim
    if axis is None:
        return None
    if isinstance(axis, (list, tuple)):
        ax = tuple(canonical_dim(where, a, nd) for a in axis)
        if len(set(ax)) != len(ax):
            raise ArgumentError(f"{where}: dim {builtins.next(a for a in ax if ax.count(a) > 1)} appears multiple "
                                f"times in the list of dims {tuple(axis)}")
        return tuple(sorted(ax)) if nd else ()
    d = canonical_dim(where, axis, nd)
    return (d,) if nd else ()


def _keep(keepdims, keepdim):
    return bool(keepdim) if keepdim is not None else bool(keepdims)


def _kept_shape(shape, axes):
    """The shape of the result with keepdims=True (reduced axes become 1)."""
    return tuple(1 if axes is None or i in axes else s for i, s in enumerate(shape))


def _count(shape, axes):
    return int(np.prod([s for i, s in enumerate(shape) if axes is None or i in axes], dtype=np.int64))


class Sum(Function):
    __slots__ = ("in_shape", "kept", "in_dtype")

    @staticmethod
    def backward(ctx, g):
        g = g.reshape(ctx.kept)         # a sum in another dtype (dtype=, a 16-bit mean) sends x's dtype back
        return (broadcast_to(g if ctx.in_dtype is None else g.to(ctx.in_dtype), ctx.in_shape),)


@autocast_op("sum")
def sum(x, axis=None, keepdims=False, *, dim=None, keepdim=None, dtype=None):
    """The sum over ``dim``/``axis`` (an int, a tuple, or None for all elements), keeping reduced dims as size 1 with
    ``keepdim``/``keepdims`` (torch.sum; either spelling, not both at once). Integer and bool inputs sum to int64 as
    in PyTorch; ``dtype`` sets the accumulation/result dtype. The gradient is g broadcast back, in x's dtype."""
    axes = _axes(x, axis, dim, "sum")
    kd = _keep(keepdims, keepdim)
    out = wide_reduce(x._xp().sum, x.data, dtype, axis=axes, keepdims=kd)
    if _state.grad_enabled and x.requires_grad:
        n = Sum.node(x)
        n.in_shape, n.kept = x.data.shape, _kept_shape(x.data.shape, axes)
        n.in_dtype = None if out.dtype == x.data.dtype else x.dtype
        return n.output(out)
    return _wrap(out)


def mean(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """The arithmetic mean over ``dim``/``axis`` (None: all elements), with ``keepdim``/``keepdims`` (torch.mean).
    Floating (or complex) inputs only: integer tensors raise DTypeError (call .float() first); an empty reduction gives
    NaN."""
    axes = _axes(x, axis, dim, "mean")
    if not _is_floating(x.dtype, complex_ok=True):
        raise DTypeError(f"mean: input dtype should be floating point, got {x.dtype} (use .float() first)")
    n, half = _count(x.shape, axes), x.data.dtype.itemsize == 2 and x.data.size > 1   # 16-bit: float32 sum, 1 rounding
    m = sum(x, axes, _keep(keepdims, keepdim), dtype=np.float32 if half else None) * (1.0 / n if n else float("nan"))
    return m.to(x.dtype) if half else m


class Var(Function):
    """d var / dx = 2 (x - mean) / (N - correction), PyTorch's formula (the divisor is not clamped here, so
    N == correction gives nan gradients as in PyTorch); std's gradient is g / (2 std), 0 where std == 0."""
    __slots__ = ("in_shape", "kept", "axes", "scale", "std_out")
    retain_inputs = True

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        g = g.reshape(ctx.kept)
        if ctx.std_out is not None:
            s = ctx.std_out
            g = g * _wrap((s.data != 0).astype(s.dtype)) / (s * 2.0 + _wrap((s.data == 0).astype(s.dtype)))
        m = mean(x, ctx.axes, True)
        if ctx.scale is None:      # all dims (or 0-d) with N <= correction: PyTorch's nan where x == mean, else inf
            xp = x._xp()           # (x == mean, not x - mean == 0: an infinite x equals its mean, inf - inf is nan)
            w = xp.where(x.data == m.data, np.nan, np.inf).astype(x.dtype)
            return (broadcast_to(g, ctx.in_shape) * _wrap(w),)
        d = x - m
        return (broadcast_to(g, ctx.in_shape) * d * ctx.scale,)


def _var(x, axis, keepdims, dim, keepdim, correction, unbiased, ddof, name):
    corr = 1
    for c in (ddof, correction):
        if c is not None:
            corr = c
    if unbiased is not None:
        corr = 1 if unbiased else 0
    if not _is_floating(x.dtype):
        raise DTypeError(f"{name}: input dtype should be floating point, got {x.dtype} (use .float() first)")
    axes = _axes(x, axis, dim, name)
    kd = _keep(keepdims, keepdim)
    n = _count(x.shape, axes)
    xd = x.data
    xp = x._xp()
    # Accumulated in float64 as PyTorch's Welford kernel does; a constant slice has exactly its value as mean
    # (Welford's running mean never moves off it), so its variance is exactly 0 and std's gradient there is 0.
    acc = xd.astype(np.float64, copy=False) if _is_floating(xd.dtype) and xd.dtype.itemsize < 8 else xd
    denom = n - corr
    with np.errstate(invalid="ignore", over="ignore"):      # inf/nan inputs give nan silently, as in PyTorch
        m = acc.sum(axis=axes, keepdims=True) * (1.0 / n if n else float("nan"))
        if n:
            hi = acc.max(axis=axes, keepdims=True)
            m = xp.where(hi == acc.min(axis=axes, keepdims=True), hi, m)
        d = acc - m
        # PyTorch divides by max(0, N - correction): inf where the sum of squares is positive, nan where it is 0
        out = (d * d).sum(axis=axes, keepdims=kd) * (1.0 / denom if denom > 0 else float("inf"))
    if name == "std":
        out = xp.sqrt(out)
    out = out.astype(xd.dtype, copy=False)
    if not (_state.grad_enabled and x.requires_grad):
        return _wrap(out)
    n_ = Var.node(x)
    n_.in_shape, n_.kept, n_.axes = xd.shape, _kept_shape(xd.shape, axes), axes
    if denom <= 0 and (axes is None or xd.ndim == 0):
        n_.scale = None
    else:
        n_.scale = 2.0 / denom if denom != 0 else float("inf")
    n_.std_out = _wrap(out.reshape(n_.kept)) if name == "std" else None
    return n_.output(out)


def var(x, axis=None, keepdims=False, *, dim=None, keepdim=None, correction=None, unbiased=None, ddof=None):
    """Variance with ``correction`` (PyTorch's default 1: unbiased); ``unbiased``/``ddof`` also accepted."""
    return _var(x, axis, keepdims, dim, keepdim, correction, unbiased, ddof, "var")


def std(x, axis=None, keepdims=False, *, dim=None, keepdim=None, correction=None, unbiased=None, ddof=None):
    """Standard deviation: sqrt(var) with the same ``correction`` rules; its gradient is 0 where it is 0."""
    return _var(x, axis, keepdims, dim, keepdim, correction, unbiased, ddof, "std")


class Extremum(Function):
    """Gradient of max/min: split evenly among the elements equal to the extremum."""
    __slots__ = ("in_shape", "kept", "axes", "out_kept")
    retain_inputs = True

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        y = ctx.out_kept
        mask = _wrap((x.data == y).astype(x.dtype))
        count = mask.sum(ctx.axes, keepdims=True)
        return (broadcast_to(g.reshape(ctx.kept), ctx.in_shape) * (mask / count),)


def _extremum(x, axis, keepdims, dim, keepdim, which):
    axes = _axes(x, axis, dim, which)
    if x.data.size == 0 and (axes is None or builtins.any(x.shape[a] == 0 for a in axes)):
        from ..backend.errors import DimensionError
        raise DimensionError(f"{which}(): cannot reduce an empty tensor of shape {tuple(x.shape)} over dims "
                             f"{axes if axes is not None else 'all'} (Expected reduction dim to have non-zero size)")
    kd = _keep(keepdims, keepdim)
    fn = x.data.max if which in ("max", "amax") else x.data.min
    kept = fn(axis=axes, keepdims=True)
    out = kept if kd else kept.reshape(tuple(s for i, s in enumerate(kept.shape)
                                             if axes is not None and i not in axes))
    if _state.grad_enabled and x.requires_grad:
        n = Extremum.node(x)
        n.in_shape, n.kept, n.axes, n.out_kept = x.data.shape, _kept_shape(x.data.shape, axes), axes, kept
        return n.output(out)
    return _wrap(out)


def _named_or_values(x, axis, keepdims, dim, keepdim, which):
    d = dim if dim is not None else axis
    if dim is not None and axis is not None:
        raise DTypeError(f"{which}: give either axis= or dim=, not both")
    if d is None or isinstance(d, (tuple, list)):      # all dims (or minidnn's tuple of dims): values only
        return _extremum(x, d, keepdims, None, keepdim, which)
    from .sorting import max_dim
    return max_dim(x, d, _keep(keepdims, keepdim), which)


def max(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """``max(x)``: the largest element; ``max(x, dim, keepdim=False)``: the named tuple (values, indices), as
    ``torch.max``; ``max(x, other)``: the elementwise maximum."""
    if isinstance(axis, Tensor):        # x.max(other): elementwise, as torch.max(a, b)
        from .elementwise import maximum
        return maximum(x, axis)
    return _named_or_values(x, axis, keepdims, dim, keepdim, "max")


def min(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """``min(x)``: the smallest element; ``min(x, dim, keepdim=False)``: the named tuple (values, indices) of the
    minimum along ``dim``, as torch.min; a tuple of dims returns values only; ``min(x, other)`` with a Tensor is the
    elementwise minimum. Reducing an empty dim raises DimensionError. The values' gradient is split evenly among tied
    minima when all dims are reduced (amin's rule) and goes to the returned index with ``dim``."""
    if isinstance(axis, Tensor):
        from .elementwise import minimum
        return minimum(x, axis)
    return _named_or_values(x, axis, keepdims, dim, keepdim, "min")


def amax(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """The largest values over ``dim`` (an int or a tuple; all by default); the gradient is split among ties."""
    return _extremum(x, dim if axis is None else axis, bool(keepdim) or bool(keepdims), None, None, "amax")


def amin(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """The smallest values over ``dim`` (an int or a tuple; all dims by default), values only (torch.amin), with
    ``keepdim``; the gradient is split evenly among tied minima. Reducing an empty dim raises DimensionError."""
    return _extremum(x, dim if axis is None else axis, bool(keepdim) or bool(keepdims), None, None, "amin")


@autocast_op("logsumexp")
def logsumexp(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """log(sum(exp(x))) computed stably (the max is subtracted first)."""
    axes = _axes(x, axis, dim, "logsumexp")
    kd = _keep(keepdims, keepdim)
    xp = x._xp()
    if x.data.size == 0:
        m = xp.zeros(_kept_shape(x.data.shape, axes), dtype=x.dtype)
    else:
        m = x.data.max(axis=axes, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    shift = _wrap(m)
    out = (x - shift).exp().sum(axes, True).log() + shift
    if not kd:
        out = out.reshape(tuple(s for i, s in enumerate(out.shape) if axes is not None and i not in axes))
    return out


class Prod(Function):
    __slots__ = ("in_shape", "kept", "axes", "has_zero")
    retain_inputs = True

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        gk = broadcast_to(g.reshape(ctx.kept), ctx.in_shape)
        if not ctx.has_zero:
            y = prod(x, ctx.axes, True)
            return (gk * y / x,)
        # With zeros, d prod / d x_i = product of the others: exclusive products along the reduced
        # axes (moved last and flattened), built from cumulative products from both ends.
        xd = x.data
        xp = x._xp()
        axes = ctx.axes if ctx.axes is not None else tuple(range(xd.ndim))
        rest = [i for i in range(xd.ndim) if i not in axes]
        perm = rest + list(axes)
        moved = xd.transpose(perm)
        flat = moved.reshape(moved.shape[:len(rest)] + (-1,))
        ones = xp.ones(flat.shape[:-1] + (1,), dtype=flat.dtype)
        left = xp.cumprod(xp.concatenate([ones, flat[..., :-1]], axis=-1), axis=-1)
        right = xp.flip(xp.cumprod(xp.flip(xp.concatenate([flat[..., 1:], ones], axis=-1), -1), axis=-1), -1)
        excl = (left * right).reshape(moved.shape).transpose(np.argsort(perm))
        # arrays, not a graph: under create_graph the exclusive products are wired to a node that raises if
        # differentiated again (without zeros, prod / x above is differentiable to any order)
        excl, = first_order_grads("prod (over an input with zeros)", [excl], x)
        return (gk * excl,)


@autocast_op("prod")
def prod(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """The product over ``dim``/``axis`` (None: all elements), with ``keepdim``/``keepdims`` (torch.prod). The gradient
    is prod / x without zeros and, when the input has zeros, the exact product of the other elements (exclusive
    cumulative products), so a single zero still gets its gradient."""
    axes = _axes(x, axis, dim, "prod")
    kd = _keep(keepdims, keepdim)
    out = wide_reduce(x._xp().prod, x.data, None, axis=axes, keepdims=kd)
    if _state.grad_enabled and x.requires_grad:
        n = Prod.node(x)
        n.in_shape, n.kept, n.axes = x.data.shape, _kept_shape(x.data.shape, axes), axes
        n.has_zero = bool((x.data == 0).any())
        return n.output(out)
    return _wrap(out)


def _arg(x, axis, keepdims, dim, keepdim, fn):
    if dim is not None:
        axis = dim
    kd = _keep(keepdims, keepdim)
    if axis is None:
        r = fn(x.data.reshape(-1), axis=0)
        return _wrap(r.reshape((1,) * x.ndim) if kd else r)
    return _wrap(fn(x.data, axis=int(axis), keepdims=kd))


def argmax(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """The int64 index of the largest value along ``dim``/``axis`` (torch.argmax); None gives the index into the
    flattened tensor (shape (1,) * ndim with ``keepdim``). Ties give the first index; NaN counts as the maximum. Not
    differentiable."""
    return _arg(x, axis, keepdims, dim, keepdim, lambda a, axis, keepdims=False: a.argmax(axis=axis, keepdims=keepdims)
                if keepdims else a.argmax(axis=axis))


def argmin(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """The int64 index of the smallest value along ``dim``/``axis`` (torch.argmin); None gives the index into the
    flattened tensor (shape (1,) * ndim with ``keepdim``). Ties give the first index; NaN counts as the minimum. Not
    differentiable."""
    return _arg(x, axis, keepdims, dim, keepdim, lambda a, axis, keepdims=False: a.argmin(axis=axis, keepdims=keepdims)
                if keepdims else a.argmin(axis=axis))


def all(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """True where every element over ``dim``/``axis`` is nonzero (torch.all; None reduces everything to a 0-d bool
    tensor); ``keepdim``/``keepdims`` keeps the reduced dims. An empty reduction is True."""
    return _wrap(x.data.all(axis=_axes(x, axis, dim, "all"), keepdims=_keep(keepdims, keepdim)))


def any(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """True where some element over ``dim``/``axis`` is nonzero (torch.any; None reduces everything to a 0-d bool
    tensor); ``keepdim``/``keepdims`` keeps the reduced dims. An empty reduction is False."""
    return _wrap(x.data.any(axis=_axes(x, axis, dim, "any"), keepdims=_keep(keepdims, keepdim)))


def norm(x, p=2, axis=None, keepdims=False, *, dim=None, keepdim=None):
    """The p-norm over ``axis`` (all elements by default)."""
    if p == 2:
        return (x * x).sum(axis, keepdims, dim=dim, keepdim=keepdim).sqrt()
    if p == 1:
        return x.abs().sum(axis, keepdims, dim=dim, keepdim=keepdim)
    if p == float("inf"):
        return x.abs().amax(dim if dim is not None else axis, bool(keepdims) or bool(keepdim))
    return (x.abs() ** p).sum(axis, keepdims, dim=dim, keepdim=keepdim) ** (1.0 / p)
