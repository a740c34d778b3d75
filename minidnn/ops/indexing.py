"""Indexing: ``x[key]`` with ints, slices, None, Ellipsis, integer arrays and boolean masks.

Backward scatters the gradient into zeros of the input's shape; repeated integer indices add up.
Both directions are differentiable ops (getitem <-> scatter), so higher-order gradients work.
"""
from __future__ import annotations

import numpy as np

from ..autograd import Node, _state
from ..backend.array_ops import index_add
from ..backend import devices as _dev
from ..tensor import Tensor, _attach, _wrap
from ._core import node

__all__ = ["getitem", "index_put", "scatter_into"]


def _normalize_key(key, like=None):
    """Tensors become their arrays, lists become arrays (NumPy semantics)."""
    if isinstance(key, tuple):
        return tuple(_normalize_one(k, like) for k in key)
    return _normalize_one(key, like)


def _normalize_one(k, like):
    if isinstance(k, Tensor):
        if like is not None and k.device != like.device and k.device.type != "cpu":
            raise RuntimeError(f"indexing: index tensor on '{k.device}' used on a tensor on '{like.device}'")
        d = k.data
        if like is not None and type(d) is not type(like.data):
            d = _dev.to_device(d, like.device)
        return d
    if isinstance(k, list):
        arr = np.asarray(k)
        return _dev.to_device(arr, like.device) if like is not None and like.device.type != "cpu" else arr
    if isinstance(k, np.ndarray) and like is not None and like.device.type != "cpu":
        return _dev.to_device(k, like.device)
    return k


def _is_basic(key):
    keys = key if isinstance(key, tuple) else (key,)
    return all(k is None or k is Ellipsis or isinstance(k, (int, slice, np.integer)) for k in keys)


class GetItemBackward(Node):
    __slots__ = ("key", "in_shape", "in_dtype", "basic")

    def backward(self, g):
        return (scatter_into(g, self.key, self.in_shape, self.basic),)


class ScatterBackward(Node):
    __slots__ = ("key",)

    def backward(self, g):
        return (getitem(g, self.key, normalized=True),)


def getitem(x, key, normalized=False):
    k = key if normalized else _normalize_key(key, x)
    try:
        out = x.data[k]
    except IndexError as e:
        raise IndexError(f"index {key!r} is invalid for a tensor of shape {tuple(x.shape)}: {e}") from None
    if _state.grad_enabled and x.requires_grad:
        n = node(GetItemBackward, x)
        n.key, n.in_shape, n.in_dtype, n.basic = k, x.data.shape, x.data.dtype, _is_basic(k)
        return _attach(out, n)
    return _wrap(out)


def scatter_into(g, key, shape, basic=None):
    """zeros(shape) with ``g`` added at ``key`` (repeated indices accumulate)."""
    xp = g._xp()
    out = xp.zeros(shape, dtype=g.dtype)
    if basic is None:
        basic = _is_basic(key)
    if basic:
        out[key] = g.data           # basic indexing never repeats an element
    else:
        index_add(out, key, g.data)
    if _state.grad_enabled and g.requires_grad:
        n = node(ScatterBackward, g)
        n.key = key
        return _attach(out, n)
    return _wrap(out)


class IndexPutBackward(Node):
    __slots__ = ("key", "v_meta")

    def backward(self, g):
        gx = None
        if self.next_edges[0]:
            mask = _wrap(g._xp().ones(g.shape, dtype=g.dtype))
            mask.data[self.key] = 0
            gx = g * mask
        gv = None
        if self.v_meta is not None and self.next_edges[1]:
            from ._core import fit
            gv = fit(getitem(g, self.key, normalized=True), *self.v_meta)
        return gx, gv


def index_put(x, key, value):
    """Out-of-place ``x[key] = value`` (what ``__setitem__`` records on graph tensors)."""
    k = _normalize_key(key, x)
    out = x.data.copy()
    v = value.data if isinstance(value, Tensor) else value
    out[k] = v
    vt = value if isinstance(value, Tensor) and value.requires_grad else None
    if _state.grad_enabled and (x.requires_grad or vt is not None):
        n = node(IndexPutBackward, x if x.requires_grad else None, vt)
        n.key = k
        n.v_meta = (value.data.shape, value.data.dtype) if vt is not None else None
        return _attach(out, n)
    return _wrap(out)
