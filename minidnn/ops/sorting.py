"""Ops that return values with their indices, as PyTorch's named tuples: max/min over a dim, sort, topk,
median, mode, kthvalue; and argsort.

    # x: (d0, ..., dn), dim d: values and indices have x's shape with d reduced (or kept as 1 with keepdim=True),
    # or the first k along d (topk, sort: k = n)

Indices come from the array module (NumPy or CuPy: xp-generic); the values are ``gather(x, dim, indices)``,
so their gradient goes to the chosen element only (PyTorch's rule for these ops; ``amax``/``x.max()`` without a
dim split it among ties instead).  NaN counts as larger than every number (PyTorch's order): max/median pick
it, ascending sorts put it last.
"""
from __future__ import annotations

import builtins
import collections

import numpy as np

from ..backend.errors import ArgumentError, DimensionError
from ..tensor import Tensor, _wrap
from ._core import canonical_dim
from .gather_scatter import gather

__all__ = ["sort", "argsort", "topk", "median", "mode", "kthvalue", "return_types"]


class _ReturnTypes:
    """``minidnn.return_types.max`` etc.: named tuples ``(values, indices)`` like ``torch.return_types``."""

    def __init__(self):
        for name in ("max", "min", "sort", "topk", "median", "mode", "kthvalue", "aminmax", "cummax", "cummin"):
            fields = ("min", "max") if name == "aminmax" else ("values", "indices")
            setattr(self, name, collections.namedtuple(name, fields, module="minidnn.return_types"))


return_types = _ReturnTypes()


def _nan_last_argsort(xp, a, axis, descending):
    """Stable argsort along ``axis`` with NaN as the largest value; descending keeps ties in index order."""
    if not descending:
        return xp.argsort(a, axis=axis, kind="stable")
    # Stable descending: sort the reversed array ascending, reverse the result, map back to positions.
    n = a.shape[axis]
    rev = xp.flip(a, axis)
    idx = xp.flip(xp.argsort(rev, axis=axis, kind="stable"), axis)
    return (n - 1) - idx


def _with_indices(op, x, dim, idx_kept, keepdim):
    """(values, indices) named tuple from kept-dim indices."""
    values = gather(x, dim, _wrap(idx_kept))
    if not keepdim:
        values = values.squeeze(dim)
        idx_kept = idx_kept.squeeze(dim) if idx_kept.ndim else idx_kept
    return getattr(return_types, op)(values, _wrap(idx_kept))


def _prep(op, x, dim):
    if not isinstance(x, Tensor):
        raise ArgumentError(f"{op}: expected a Tensor, got {type(x).__name__}")
    d = canonical_dim(op, dim, x.ndim)
    if x.ndim == 0:
        return x.reshape(1), 0, True
    return x, d, False


def _finish(nt, scalar, keepdim, op):
    if not scalar:
        return nt
    v, i = nt
    return getattr(return_types, op)(v.reshape(()), _wrap(i.data.reshape(())))


def max_dim(x, dim, keepdim=False, which="max"):
    """``x.max(dim)``: (values, indices) along dim; NaN wins; the first index among ties."""
    x1, d, scalar = _prep(which, x, dim)
    if x1.shape[d] == 0:
        raise DimensionError(f"{which}(): Expected reduction dim {dim} to have non-zero size (input shape "
                             f"{tuple(x.shape)})")
    xp = x1._xp()
    a = x1.data
    idx = a.argmax(axis=d) if which == "max" else a.argmin(axis=d)
    if a.dtype.kind in "fcV":
        nan = xp.isnan(a)
        idx = xp.where(nan.any(axis=d), nan.argmax(axis=d), idx)
    idx = xp.expand_dims(idx.astype(np.int64), d)
    return _finish(_with_indices(which, x1, d, idx, keepdim or scalar), scalar, keepdim, which)


def sort(input, dim=-1, descending=False, stable=False):
    """(values, indices) sorted along ``dim`` (stable; NaN last ascending, first descending)."""
    x1, d, scalar = _prep("sort", input, dim)
    idx = _nan_last_argsort(x1._xp(), x1.data, d, bool(descending)).astype(np.int64)
    values = gather(x1, d, _wrap(idx))
    nt = return_types.sort(values, _wrap(idx))
    return _finish(nt, scalar, True, "sort")


def argsort(input, dim=-1, descending=False, stable=False):
    """The int64 indices that sort ``input`` along ``dim`` (torch.argsort), ascending unless ``descending``;
    ``stable=True`` keeps equal elements in their original order. The ``indices`` of sort()."""
    return sort(input, dim, descending, stable).indices


def topk(input, k, dim=-1, largest=True, sorted=True):
    """The ``k`` largest (``largest=False``: smallest) along ``dim``, as (values, indices)."""
    x1, d, scalar = _prep("topk", input, dim)
    n = x1.shape[d]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= n:
        raise ArgumentError(f"topk: selected index k={k!r} out of range (dim {dim} has size {n})")
    idx = _nan_last_argsort(x1._xp(), x1.data, d, bool(largest)).astype(np.int64)
    idx = idx[(slice(None),) * d + (slice(0, int(k)),)]
    nt = return_types.topk(gather(x1, d, _wrap(idx)), _wrap(idx))
    return _finish(nt, scalar, True, "topk")


def kthvalue(input, k, dim=-1, keepdim=False):
    """The ``k``-th smallest (1-based) along ``dim``, as (values, indices)."""
    x1, d, scalar = _prep("kthvalue", input, dim)
    n = x1.shape[d]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ArgumentError(f"kthvalue(): selected number k={k!r} out of range for dimension {dim} of size {n}")
    idx = _nan_last_argsort(x1._xp(), x1.data, d, False).astype(np.int64)
    idx = idx[(slice(None),) * d + (slice(int(k) - 1, int(k)),)]
    return _finish(_with_indices("kthvalue", x1, d, idx, keepdim or scalar), scalar, keepdim, "kthvalue")


def median(input, dim=None, keepdim=False):
    """The lower median (PyTorch's: the smaller middle element for even counts); NaN if the slice holds one.
    Without ``dim``: a 0-d tensor over all elements; with ``dim``: (values, indices)."""
    if dim is None:
        flat = input.reshape(-1)
        if flat.shape[0] == 0:
            return _wrap(input._xp().asarray(np.nan, dtype=input.dtype))
        return median(flat, 0).values
    x1, d, scalar = _prep("median", input, dim)
    n = x1.shape[d]
    if n == 0:
        raise DimensionError(f"median(): Expected reduction dim {dim} to have non-zero size")
    xp = x1._xp()
    order = _nan_last_argsort(xp, x1.data, d, False).astype(np.int64)
    pos = xp.full(x1.shape[:d] + (1,) + x1.shape[d + 1:], (n - 1) // 2, dtype=np.int64)
    if x1.dtype.kind in "fV":
        nan_count = xp.isnan(x1.data).sum(axis=d, keepdims=True)
        pos = xp.where(nan_count > 0, n - nan_count, pos)      # the first NaN in sorted order
    idx = xp.take_along_axis(order, pos, axis=d)
    return _finish(_with_indices("median", x1, d, idx, keepdim or scalar), scalar, keepdim, "median")


def mode(input, dim=-1, keepdim=False):
    """The most frequent value along ``dim`` (the smallest among equally frequent ones) and an index of it."""
    x1, d, scalar = _prep("mode", input, dim)
    n = x1.shape[d]
    if n == 0:
        raise DimensionError(f"mode(): Expected reduction dim {dim} to have non-zero size")
    xp = x1._xp()
    a = xp.moveaxis(x1.data, d, -1)
    order = xp.argsort(a, axis=-1, kind="stable")
    s = xp.take_along_axis(a, order, axis=-1)
    # run lengths in the sorted row: for each position, the length of the run it ends
    new = xp.concatenate([xp.ones(s.shape[:-1] + (1,), dtype=bool), s[..., 1:] != s[..., :-1]], axis=-1)
    pos = xp.broadcast_to(xp.arange(n), s.shape)
    start = xp.maximum.accumulate(xp.where(new, pos, 0), axis=-1) if type(s) is np.ndarray else \
        _running_max(xp, xp.where(new, pos, 0))
    run = pos - start + 1
    best_end = run.argmax(axis=-1)          # first maximal run = the smallest most frequent value
    best = xp.take_along_axis(order, best_end[..., None], axis=-1)   # last index of that value (sorted stably)
    idx = xp.moveaxis(best, -1, d).astype(np.int64)
    return _finish(_with_indices("mode", x1, d, idx, keepdim or scalar), scalar, keepdim, "mode")


def _running_max(xp, a):
    out = a.copy()
    for j in range(1, a.shape[-1]):
        out[..., j] = xp.maximum(out[..., j], out[..., j - 1])
    return out


_ = builtins
