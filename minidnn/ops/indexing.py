"""Indexing: ``x[key]`` with ints, slices, None, Ellipsis, integer arrays and boolean masks.

Backward scatters the gradient into zeros of the input's shape; repeated integer indices add up.
Both directions are differentiable ops (getitem <-> scatter), so higher-order gradients work.
"""
from __future__ import annotations

import numpy as np

from ..autograd import Function, _state
from ..backend import devices as _dev
from ..backend.array_ops import index_add
from ..tensor import Tensor, _wrap

__all__ = ["getitem", "index_put", "scatter_into"]


# ------------------------------------------------------------------------------------------------
# PyTorch's placement rule.  NumPy counts an int as an advanced index whenever an index array is present,
# so in ``a[1, :, idx]`` the int and ``idx`` are "separated by a slice" and the indexed dims go first;
# PyTorch applies ints (and 0-d integer tensors) as plain selections, so only index arrays and masks are
# advanced and ``a[1, :, idx]`` keeps idx's dims where idx stood.  We index with NumPy and move the advanced
# dims from NumPy's place to PyTorch's when the two differ (docs/semantics.md).
# ------------------------------------------------------------------------------------------------
def _kind(k):
    """'int' (a plain selection in PyTorch), 'adv' (index array / mask / Python bool), 'slice', 'none',
    'ellipsis'."""
    if k is None:
        return "none"
    if k is Ellipsis:
        return "ellipsis"
    if isinstance(k, slice):
        return "slice"
    if isinstance(k, (bool, np.bool_)):
        return "adv"
    if isinstance(k, (int, np.integer)):
        return "int"
    if hasattr(k, "ndim") and hasattr(k, "dtype"):
        if k.ndim == 0 and k.dtype.kind in "iu":
            return "int"
        return "adv"
    return "adv"


def _consumes(k, kind):
    if kind in ("int", "slice"):
        return 1
    if kind == "adv":
        if isinstance(k, (bool, np.bool_)):
            return 0
        return k.ndim if k.dtype.kind == "b" else 1
    return 0


def _placement_move(key, ndim):
    """None, or (n_adv_dims, numpy_pos, torch_pos) when PyTorch places the advanced dims elsewhere than NumPy."""
    keys = key if isinstance(key, tuple) else (key,)
    kinds = [_kind(k) for k in keys]
    if "adv" not in kinds or "int" not in kinds:
        return None
    used = builtins_sum(_consumes(k, c) for k, c in zip(keys, kinds))
    ell = builtins_max(ndim - used, 0)
    out_dims = []        # output dims each element makes as a basic index
    for c in kinds:
        out_dims.append({"none": 1, "slice": 1, "ellipsis": ell}.get(c, 0))
    n_adv = 0
    for k, c in zip(keys, kinds):
        if c == "adv":
            if isinstance(k, (bool, np.bool_)) or k.dtype.kind == "b":
                n_adv = builtins_max(n_adv, 1)
            else:
                n_adv = builtins_max(n_adv, k.ndim)

    def pos(adv_set):
        idx = [i for i, c in enumerate(kinds) if c in adv_set]
        contiguous = all(kinds[i] in adv_set for i in range(idx[0], idx[-1] + 1))
        if not contiguous:
            return 0
        return builtins_sum(out_dims[:idx[0]])

    def pos_torch():
        idx = [i for i, c in enumerate(kinds) if c == "adv"]
        between = [kinds[i] for i in range(idx[0], idx[-1] + 1)]
        if not all(c in ("adv", "int") for c in between):
            return 0
        return builtins_sum(out_dims[:idx[0]])

    np_pos, t_pos = pos(("adv", "int")), pos_torch()
    if np_pos == t_pos or n_adv == 0:
        return None
    return n_adv, np_pos, t_pos


builtins_sum, builtins_max = sum, max


def _to_torch_order(arr_or_tensor, move):
    n, src, dst = move
    if isinstance(arr_or_tensor, Tensor):
        from .shape import movedim
        return movedim(arr_or_tensor, tuple(range(src, src + n)), tuple(range(dst, dst + n)))
    xp = _dev.array_module(arr_or_tensor)
    return xp.moveaxis(arr_or_tensor, tuple(range(src, src + n)), tuple(range(dst, dst + n)))


def _to_numpy_order(v, move):
    n, src, dst = move
    return _to_torch_order(v, (n, dst, src))


def setitem_array(x, key, value):
    """``x.data[key] = value`` with PyTorch's placement (``x`` a Tensor, value an array or a number)."""
    k = _normalize_key(key, x)
    move = _placement_move(k, x.ndim)
    if move is not None and hasattr(value, "shape"):
        xp = x._xp()
        target = _to_torch_order(xp.empty(x.data[k].shape, dtype=bool), move).shape
        value = _to_numpy_order(xp.broadcast_to(value, target), move)
    x.data[k] = value


def _normalize_key(key, like=None):
    """Tensors become their arrays, lists become arrays (NumPy semantics)."""
    return tuple(_normalize_one(k, like) for k in key) if isinstance(key, tuple) else _normalize_one(key, like)


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


class GetItem(Function):
    __slots__ = ("key", "in_shape", "in_dtype", "basic")

    @staticmethod
    def backward(ctx, g):
        return (scatter_into(g, ctx.key, ctx.in_shape, ctx.basic),)


class ScatterInto(Function):
    __slots__ = ("key",)

    @staticmethod
    def backward(ctx, g):
        return (getitem(g, ctx.key, normalized=True),)


def getitem(x, key, normalized=False):
    if not normalized:
        k = _normalize_key(key, x)
        move = _placement_move(k, x.ndim)
        if move is not None:
            return _to_torch_order(getitem(x, k, normalized=True), move)
    else:
        k = key
    try:       # (NumPy gives an element as a scalar copy: made a 0-d view, as PyTorch's and CuPy's)
        out = x.data[k]
        out = x.data[(*k, None) if type(k) is tuple else (k, None)].reshape(()) if isinstance(out, np.generic) else out
    except IndexError as e:
        raise IndexError(f"index {key!r} is invalid for a tensor of shape {tuple(x.shape)}: {e}") from None
    if _state.grad_enabled and x.requires_grad:
        n = GetItem.node(x)
        n.key, n.in_shape, n.in_dtype, n.basic = k, x.data.shape, x.data.dtype, _is_basic(k)
        return n.output(out)
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
        n = ScatterInto.node(g)
        n.key = key
        return n.output(out)
    return _wrap(out)


class IndexPut(Function):
    __slots__ = ("key", "v_meta")

    @staticmethod
    def backward(ctx, g):
        gx = None
        if ctx.next_edges[0]:
            mask = _wrap(g._xp().ones(g.shape, dtype=g.dtype))
            mask.data[ctx.key] = 0
            gx = g * mask
        gv = None
        if ctx.v_meta is not None and ctx.next_edges[1]:
            from ._core import fit
            gv = fit(getitem(g, ctx.key, normalized=True), ctx.v_meta)
        return gx, gv


def index_put(x, key, value):
    """Out-of-place ``x[key] = value`` (what ``__setitem__`` records on graph tensors)."""
    k = _normalize_key(key, x)
    move = _placement_move(k, x.ndim)
    if move is not None and isinstance(value, Tensor):
        target = _to_torch_order(x._xp().empty(x.data[k].shape, dtype=bool), move).shape
        from ._core import broadcast_to
        value = _to_numpy_order(broadcast_to(value, target), move)
    out = x.data.copy()
    v = value.data if isinstance(value, Tensor) else value
    out[k] = v
    vt = value if isinstance(value, Tensor) and value.requires_grad else None
    if _state.grad_enabled and (x.requires_grad or vt is not None):
        n = IndexPut.node(x, vt)
        n.key = k
        n.v_meta = (value.data.shape, value.data.dtype) if vt is not None else None
        return n.output(out)
    return _wrap(out)
