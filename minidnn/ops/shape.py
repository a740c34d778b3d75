"""Shape ops: views and rearrangements whose backward rearranges the gradient back.

``transpose(*axes)`` follows NumPy (a full permutation; no axes reverses them) and, given two axes
of a tensor with more than two dimensions, swaps them as PyTorch's ``transpose(d0, d1)`` does.
"""
from __future__ import annotations

import numpy as np

from ..autograd import Node, _state
from ..tensor import _attach, _wrap
from ._core import broadcast_to, check_pair, node
from ..backend.errors import ArgumentError

__all__ = ["reshape", "flatten", "transpose", "permute", "swapaxes", "squeeze", "unsqueeze", "expand",
           "broadcast_to", "cat", "concatenate", "stack", "split", "chunk", "pad", "unbind", "moveaxis", "repeat",
           "tile", "flip"]


class ReshapeBackward(Node):
    __slots__ = ("in_shape",)

    def backward(self, g):
        return (g.reshape(self.in_shape),)


def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def reshape(x, *shape):
    shape = _shape_args(shape)
    try:
        out = x.data.reshape(shape)
    except ValueError:
        raise ArgumentError(f"reshape: cannot reshape a tensor of shape {tuple(x.shape)} ({x.numel()} elements) into "
                         f"{shape}") from None
    if _state.grad_enabled and x.requires_grad:
        n = node(ReshapeBackward, x)
        n.in_shape = x.data.shape
        return _attach(out, n)
    return _wrap(out)


def flatten(x, start_dim=0, end_dim=-1):
    nd = x.ndim
    if nd == 0:
        return reshape(x, 1)
    s, e = start_dim % nd, end_dim % nd
    if s > e:
        raise ArgumentError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for {nd} dimensions")
    shp = x.shape
    n = 1
    for d in shp[s:e + 1]:
        n *= d
    return reshape(x, shp[:s] + (n,) + shp[e + 1:])


class PermuteBackward(Node):
    __slots__ = ("inverse",)

    def backward(self, g):
        return (permute(g, self.inverse),)


def permute(x, *axes):
    axes = _shape_args(axes)
    nd = x.ndim
    if len(axes) != nd or not all(-nd <= a < nd for a in axes) or sorted(a % nd for a in axes) != list(range(nd)):
        raise ArgumentError(f"permute: {tuple(axes)} is not a permutation of the {nd} dimensions of a tensor of shape "
                         f"{tuple(x.shape)}")
    axes = tuple(a % nd for a in axes)
    out = x.data.transpose(axes)
    if _state.grad_enabled and x.requires_grad:
        n = node(PermuteBackward, x)
        n.inverse = tuple(int(i) for i in np.argsort(axes))
        return _attach(out, n)
    return _wrap(out)


def transpose(x, *axes):
    axes = _shape_args(axes)
    nd = x.ndim
    if not axes:
        return permute(x, tuple(range(nd))[::-1])
    if len(axes) == 2 and nd != 2:
        return swapaxes(x, axes[0], axes[1])
    return permute(x, axes)


def swapaxes(x, axis1, axis2):
    nd = x.ndim
    for a in (axis1, axis2):
        if not -nd <= a < nd:
            raise IndexError(f"swapaxes/transpose: axis {a} is out of range for a tensor of shape {tuple(x.shape)}")
    perm = list(range(nd))
    a, b = axis1 % nd, axis2 % nd
    perm[a], perm[b] = perm[b], perm[a]
    return permute(x, perm)


def moveaxis(x, source, destination):
    nd = x.ndim
    perm = [i for i in range(nd) if i != source % nd]
    perm.insert(destination % nd, source % nd)
    return permute(x, perm)


def squeeze(x, axis=None, *, dim=None):
    if dim is not None:
        axis = dim
    shp = x.shape
    if axis is None:
        new = tuple(s for s in shp if s != 1)
    else:
        axes = {a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis)}
        new = tuple(s for i, s in enumerate(shp) if not (i in axes and s == 1))   # PyTorch: non-1 axes stay
    return reshape(x, new)


def unsqueeze(x, dim):
    nd = x.ndim + 1
    if not -nd <= dim < nd:
        raise IndexError(f"unsqueeze: dim {dim} out of range for a result with {nd} dimensions")
    d = dim % nd
    shp = x.shape
    return reshape(x, shp[:d] + (1,) + shp[d:])


def expand(x, *shape):
    """Broadcast to ``shape``; -1 keeps a dimension (PyTorch's expand)."""
    shape = _shape_args(shape)
    lead = len(shape) - x.ndim
    full = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape))
    return broadcast_to(x, full)


class CatBackward(Node):
    __slots__ = ("axis", "bounds")

    def backward(self, g):
        out = []
        for (lo, hi) in self.bounds:
            idx = (slice(None),) * self.axis + (slice(lo, hi),)
            out.append(g[idx])
        return tuple(out)


def _device_check(op, tensors):
    for t in tensors[1:]:
        check_pair(op, tensors[0], t)


def cat(tensors, axis=0, *, dim=None):
    if dim is not None:
        axis = dim
    tensors = list(tensors)
    if not tensors:
        raise ArgumentError("cat: expected a non-empty list of tensors")
    _device_check("cat", tensors)
    nd = tensors[0].ndim
    if nd == 0:
        raise ArgumentError("cat: zero-dimensional tensors cannot be concatenated (tensor 0 has shape (); use stack)")
    if not -nd <= axis < nd:
        raise IndexError(f"cat: dim {axis} is out of range for tensors of shape {tuple(tensors[0].shape)}")
    axis = axis % nd
    for i, t in enumerate(tensors):
        if t.ndim != nd or any(t.shape[d] != tensors[0].shape[d] for d in range(nd) if d != axis):
            raise ArgumentError(f"cat: tensor {i} has shape {tuple(t.shape)} but tensor 0 has {tuple(tensors[0].shape)}; "
                             f"all dimensions except {axis} must match")
    xp = tensors[0]._xp()
    out = xp.concatenate([t.data for t in tensors], axis=axis)
    if _state.grad_enabled and any(t.requires_grad for t in tensors):
        n = node(CatBackward, *[t if t.requires_grad else None for t in tensors])
        bounds, lo = [], 0
        for t in tensors:
            bounds.append((lo, lo + t.shape[axis]))
            lo += t.shape[axis]
        n.axis, n.bounds = axis, bounds
        return _attach(out, n)
    return _wrap(out)


concatenate = cat


def stack(tensors, axis=0, *, dim=None):
    if dim is not None:
        axis = dim
    tensors = list(tensors)
    if not tensors:
        raise ArgumentError("stack: expected a non-empty list of tensors")
    for i, t in enumerate(tensors):
        if t.shape != tensors[0].shape:
            raise ArgumentError(f"stack: tensor {i} has shape {tuple(t.shape)} but tensor 0 has "
                             f"{tuple(tensors[0].shape)}; all must be equal")
    return cat([unsqueeze(t, axis) for t in tensors], axis % (tensors[0].ndim + 1))


def split(x, split_size_or_sections, axis=0, *, dim=None):
    """PyTorch's split: an int is a chunk size (the last may be smaller); a list gives the sizes."""
    if dim is not None:
        axis = dim
    axis = axis % x.ndim
    n = x.shape[axis]
    if isinstance(split_size_or_sections, int):
        s = split_size_or_sections
        if s <= 0:
            raise ArgumentError(f"split: split_size must be positive, got {s}")
        sizes = [s] * (n // s) + ([n % s] if n % s else [])
    else:
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise ArgumentError(f"split: sections {sizes} sum to {sum(sizes)} but dimension {axis} has size {n}")
    out, lo = [], 0
    for s in sizes:
        out.append(x[(slice(None),) * axis + (slice(lo, lo + s),)])
        lo += s
    return tuple(out)


def chunk(x, chunks, axis=0, *, dim=None):
    if dim is not None:
        axis = dim
    n = x.shape[axis % x.ndim]
    size = -(-n // chunks) if n else 1
    return split(x, size, axis)


def unbind(x, axis=0, *, dim=None):
    if dim is not None:
        axis = dim
    axis = axis % x.ndim
    return tuple(x[(slice(None),) * axis + (i,)] for i in range(x.shape[axis]))


class PadBackward(Node):
    __slots__ = ("slices",)

    def backward(self, g):
        return (g[self.slices],)


def pad(x, pad, mode="constant", value=0.0):
    """Constant padding.  ``pad`` is PyTorch's flat tuple (left, right) pairs starting from the LAST
    dimension, or NumPy's per-dimension ``((before, after), ...)``.  Negative amounts are not allowed."""
    if mode != "constant":
        raise NotImplementedError(f"pad: mode {mode!r} is not implemented (only 'constant')")
    nd = x.ndim
    if len(pad) and isinstance(pad[0], (tuple, list)):
        widths = [tuple(int(v) for v in p) for p in pad]
        if len(widths) != nd:
            raise ArgumentError(f"pad: NumPy-style widths need one (before, after) pair per dimension ({nd}), got {len(widths)}")
    else:
        if len(pad) % 2 or len(pad) // 2 > nd:
            raise ArgumentError(f"pad: expected an even number of values, at most 2 per dimension ({nd}), got {len(pad)}")
        widths = [(0, 0)] * nd
        for i in range(len(pad) // 2):
            widths[nd - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if any(a < 0 or b < 0 for a, b in widths):
        raise ArgumentError(f"pad: negative padding {widths} is not supported")
    xp = x._xp()
    out = xp.pad(x.data, widths, mode="constant", constant_values=value)
    if _state.grad_enabled and x.requires_grad:
        n = node(PadBackward, x)
        n.slices = tuple(slice(a, a + s) for (a, _), s in zip(widths, x.shape))
        return _attach(out, n)
    return _wrap(out)


def repeat(x, *sizes):
    """PyTorch's repeat (NumPy's tile): differentiable through expand + reshape."""
    sizes = _shape_args(sizes)
    if len(sizes) < x.ndim:
        raise ArgumentError(f"repeat: {len(sizes)} repeat counts for a tensor with {x.ndim} dimensions")
    x = reshape(x, (1,) * (len(sizes) - x.ndim) + tuple(x.shape))
    inter = []
    for s, r in zip(x.shape, sizes):
        inter += [1, s]
    big = []
    for s, r in zip(x.shape, sizes):
        big += [r, s]
    y = broadcast_to(reshape(x, inter), big)
    return reshape(y, tuple(s * r for s, r in zip(x.shape, sizes)))


tile = repeat


def flip(x, dims):
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    idx = [slice(None)] * x.ndim
    for d in dims:
        idx[d % x.ndim] = slice(None, None, -1)
    return x[tuple(idx)]
