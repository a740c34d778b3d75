"""Shape ops: views and rearrangements whose backward rearranges the gradient back.

``transpose(*axes)`` follows NumPy (a full permutation; no axes reverses them) and, given two axes
of a tensor with more than two dimensions, swaps them as PyTorch's ``transpose(d0, d1)`` does.
"""
from __future__ import annotations

import numpy as np

from ..autograd import Function, _state
from ..backend.errors import ArgumentError, DimensionError
from ..tensor import _wrap
from ._core import broadcast_to, canonical_dim, canonical_dims, check_pair

__all__ = ["reshape", "flatten", "transpose", "permute", "swapaxes", "squeeze", "unsqueeze", "expand",
           "broadcast_to", "cat", "concatenate", "stack", "split", "chunk", "pad", "unbind", "moveaxis", "repeat",
           "tile", "flip", "movedim", "narrow", "select"]


class Reshape(Function):
    __slots__ = ("in_shape",)

    @staticmethod
    def backward(ctx, g):
        return (g.reshape(ctx.in_shape),)


def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def reshape(x, *shape):
    """The same elements in a new shape (torch.reshape): ints or one tuple, one -1 inferred; a view where the layout
    allows, else a copy. An impossible shape raises ArgumentError naming both shapes."""
    shape = _shape_args(shape)
    try:
        out = x.data.reshape(shape)
    except ValueError:
        raise ArgumentError(f"reshape: cannot reshape a tensor of shape {tuple(x.shape)} ({x.numel()} elements) into "
                         f"{shape}") from None
    if _state.grad_enabled and x.requires_grad:
        n = Reshape.node(x)
        n.in_shape = x.data.shape
        return n.output(out)
    return _wrap(out)


def flatten(x, start_dim=0, end_dim=-1):
    """Merge dims ``start_dim``..``end_dim`` (inclusive, negative dims allowed) into one (torch.flatten); a 0-d tensor
    becomes shape (1,). A reshape, so a view where the layout allows."""
    nd = x.ndim
    s, e = canonical_dim("flatten", start_dim, nd), canonical_dim("flatten", end_dim, nd)
    if nd == 0:
        return reshape(x, 1)
    if s > e:
        raise ArgumentError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for {nd} dimensions")
    shp = x.shape
    n = 1
    for d in shp[s:e + 1]:
        n *= d
    return reshape(x, shp[:s] + (n,) + shp[e + 1:])


class Permute(Function):
    __slots__ = ("inverse",)

    @staticmethod
    def backward(ctx, g):
        return (permute(g, ctx.inverse),)


def permute(x, *axes):
    """Reorder the dims (torch.permute): ``permute(x, 2, 0, 1)`` or with one tuple; the order must name every dim once.
    A strided view of the same memory; the gradient is permuted back."""
    axes = _shape_args(axes)
    nd = x.ndim
    if len(axes) != nd:
        raise ArgumentError(f"permute: number of dims {tuple(axes)} ({len(axes)}) does not match the {nd} dimensions "
                            f"of a tensor of shape {tuple(x.shape)}")
    axes = canonical_dims("permute", axes, nd)
    out = x.data.transpose(axes)
    if _state.grad_enabled and x.requires_grad:
        n = Permute.node(x)
        n.inverse = tuple(int(i) for i in np.argsort(axes))
        return n.output(out)
    return _wrap(out)


def transpose(x, *axes):
    """PyTorch's ``transpose(dim0, dim1)`` swaps two dims (on every rank, 2-D included); with no argument the dims
    are reversed and with a full permutation they are permuted, as NumPy's transpose does."""
    axes = _shape_args(axes)
    nd = x.ndim
    if not axes:
        return permute(x, tuple(range(nd))[::-1])
    if len(axes) == 2:
        return swapaxes(x, axes[0], axes[1])
    return permute(x, axes)


def swapaxes(x, axis1, axis2):
    """Exchange dims ``axis1`` and ``axis2`` (torch.swapaxes / transpose(x, d0, d1)): a strided view; a 0-d tensor is
    returned unchanged."""
    nd = x.ndim
    a, b = canonical_dim("transpose", axis1, nd), canonical_dim("transpose", axis2, nd)
    if nd == 0:
        return x
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    return permute(x, perm)


def moveaxis(x, source, destination):
    """PyTorch's movedim / NumPy's moveaxis: ints or equal-length sequences of dims."""
    nd = x.ndim
    src = (source,) if isinstance(source, (int, np.integer)) else tuple(source)
    dst = (destination,) if isinstance(destination, (int, np.integer)) else tuple(destination)
    if len(src) != len(dst):
        raise ArgumentError(f"movedim: Invalid source or destination dims: source ({list(src)} dims) should contain "
                            f"the same number of dims as destination ({list(dst)} dims)")
    src, dst = canonical_dims("movedim", src, nd), canonical_dims("movedim", dst, nd)
    rest = iter(i for i in range(nd) if i not in src)
    where = dict(zip(dst, src))
    return permute(x, [where[i] if i in where else next(rest) for i in range(nd)])


movedim = moveaxis


def squeeze(x, axis=None, *, dim=None):
    """Remove size-1 dims (torch.squeeze): all of them, or only ``dim`` (an int or a tuple); a named dim whose size is
    not 1 is left in place, as in PyTorch."""
    if dim is not None:
        axis = dim
    shp = x.shape
    if axis is None:
        new = tuple(s for s in shp if s != 1)
    else:
        axes = set(canonical_dims("squeeze", (axis,) if isinstance(axis, (int, np.integer)) else axis, x.ndim))
        new = tuple(s for i, s in enumerate(shp) if not (i in axes and s == 1))   # PyTorch: non-1 axes stay
    return reshape(x, new)


def unsqueeze(x, dim):
    """Insert a size-1 dim at ``dim`` (torch.unsqueeze; -1 appends, valid range [-ndim-1, ndim]). A view."""
    d = canonical_dim("unsqueeze", dim, x.ndim, extra=1)
    shp = x.shape
    return reshape(x, shp[:d] + (1,) + shp[d:])


def expand(x, *shape):
    """Broadcast to ``shape``; -1 keeps a dimension (PyTorch's expand)."""
    shape = _shape_args(shape)
    lead = len(shape) - x.ndim
    full = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape))
    return broadcast_to(x, full)


class Cat(Function):
    __slots__ = ("axis", "bounds")

    @staticmethod
    def backward(ctx, g):
        out = []
        for (lo, hi) in ctx.bounds:
            idx = (slice(None),) * ctx.axis + (slice(lo, hi),)
            out.append(g[idx])
        return tuple(out)


def _device_check(op, tensors):
    for t in tensors[1:]:
        check_pair(op, tensors[0], t)


def cat(tensors, axis=0, *, dim=None):
    """Concatenate tensors along ``dim`` (torch.cat; ``axis`` is NumPy's spelling): all tensors on one device with equal
    shapes except along ``dim``; an empty list and 0-d tensors raise ArgumentError. The gradient is sliced back to each
    input."""
    if dim is not None:
        axis = dim
    tensors = list(tensors)
    if not tensors:
        raise ArgumentError("cat: expected a non-empty list of tensors")
    _device_check("cat", tensors)
    nd = tensors[0].ndim
    if nd == 0:
        raise ArgumentError("cat: zero-dimensional tensors cannot be concatenated (tensor 0 has shape (); use stack)")
    axis = canonical_dim("cat", axis, nd)
    for i, t in enumerate(tensors):
        if t.ndim != nd or any(t.shape[d] != tensors[0].shape[d] for d in range(nd) if d != axis):
            raise ArgumentError(f"cat: tensor {i} has shape {tuple(t.shape)} but tensor 0 has "
                                f"{tuple(tensors[0].shape)}; all dimensions except {axis} must match")
    xp = tensors[0]._xp()
    out = xp.concatenate([t.data for t in tensors], axis=axis)
    if _state.grad_enabled and any(t.requires_grad for t in tensors):
        n = Cat.node_of(*tensors)
        bounds, lo = [], 0
        for t in tensors:
            bounds.append((lo, lo + t.shape[axis]))
            lo += t.shape[axis]
        n.axis, n.bounds = axis, bounds
        return n.output(out)
    return _wrap(out)


concatenate = cat


def stack(tensors, axis=0, *, dim=None):
    """Join equally shaped tensors along a new dim ``dim`` (torch.stack; ``dim`` may be ndim, appending it); different
    shapes raise ArgumentError naming them."""
    if dim is not None:
        axis = dim
    tensors = list(tensors)
    if not tensors:
        raise ArgumentError("stack: expected a non-empty list of tensors")
    axis = canonical_dim("stack", axis, tensors[0].ndim, extra=1)
    for i, t in enumerate(tensors):
        if t.shape != tensors[0].shape:
            raise ArgumentError(f"stack: expects each tensor to be equal size, but got {tuple(tensors[0].shape)} at "
                                f"entry 0 and {tuple(t.shape)} at entry {i}")
    return cat([unsqueeze(t, axis) for t in tensors], axis)


def split(x, split_size_or_sections, axis=0, *, dim=None):
    """PyTorch's split: an int is a chunk size (the last may be smaller); a list gives the sizes."""
    if dim is not None:
        axis = dim
    axis = canonical_dim("split", axis, x.ndim)
    if x.ndim == 0:
        raise ArgumentError("split: a 0-d tensor cannot be split")
    n = x.shape[axis]
    if isinstance(split_size_or_sections, (int, np.integer)):
        s = split_size_or_sections
        if s <= 0 and not (s == 0 and n == 0):
            raise ArgumentError(f"split: split_size can only be 0 if dimension size is 0, and must not be negative; "
                                f"got split_size {s} for dimension {axis} of size {n}")
        if s == 0:
            return (x,)
        # PyTorch: max(ceil(n / s), 1) pieces, so an empty dim gives one empty piece
        sizes = [s] * (n // s) + ([n % s] if n % s else []) if n else [0]
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
    """Split ``x`` into ``chunks`` pieces along ``dim`` (torch.chunk): each of size ceil(n / chunks), the last smaller,
    so fewer than ``chunks`` pieces may come back; an empty dim gives ``chunks`` empty pieces. The pieces are
    differentiable slices."""
    if dim is not None:
        axis = dim
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks <= 0:
        raise ArgumentError(f"chunk: expects `chunks` to be greater than 0, got: {chunks}")
    axis = canonical_dim("chunk", axis, x.ndim)
    if x.ndim == 0:
        raise ArgumentError("chunk: a 0-d tensor cannot be chunked")
    n = x.shape[axis]
    if n == 0:          # PyTorch: an empty dim gives `chunks` empty pieces
        return split(x, [0] * chunks, axis)
    return split(x, -(-n // chunks), axis)


def unbind(x, axis=0, *, dim=None):
    """The slices of ``x`` along ``dim`` as a tuple of tensors with that dim removed (torch.unbind); each is
    differentiable. A 0-d tensor raises ArgumentError."""
    if dim is not None:
        axis = dim
    axis = canonical_dim("unbind", axis, x.ndim)
    if x.ndim == 0:
        raise ArgumentError("unbind: Dimension specified as 0 but tensor has no dimensions")
    return tuple(x[(slice(None),) * axis + (i,)] for i in range(x.shape[axis]))


class Pad(Function):
    __slots__ = ("slices",)

    @staticmethod
    def backward(ctx, g):
        return (g[ctx.slices],)


def pad(x, pad, mode="constant", value=0.0):
    """Constant padding.  ``pad`` is PyTorch's flat tuple (left, right) pairs starting from the LAST
    dimension, or NumPy's per-dimension ``((before, after), ...)``.  Negative amounts are not allowed."""
    if mode != "constant":
        raise NotImplementedError(f"pad: mode {mode!r} is not implemented (only 'constant')")
    nd = x.ndim
    if len(pad) and isinstance(pad[0], (tuple, list)):
        widths = [tuple(int(v) for v in p) for p in pad]
        if len(widths) != nd:
            raise ArgumentError(f"pad: NumPy-style widths need one (before, after) pair per dimension ({nd}), "
                                f"got {len(widths)}")
    else:
        if len(pad) % 2 or len(pad) // 2 > nd:
            raise ArgumentError(f"pad: expected an even number of values, at most 2 per dimension ({nd}), "
                                f"got {len(pad)}")
        widths = [(0, 0)] * nd
        for i in range(len(pad) // 2):
            widths[nd - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if any(a < 0 or b < 0 for a, b in widths):
        raise ArgumentError(f"pad: negative padding {widths} is not supported")
    xp = x._xp()
    out = xp.pad(x.data, widths, mode="constant", constant_values=value)
    if _state.grad_enabled and x.requires_grad:
        n = Pad.node(x)
        n.slices = tuple(slice(a, a + s) for (a, _), s in zip(widths, x.shape))
        return n.output(out)
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
    """Reverse the order of elements along ``dims`` (an int or a tuple; torch.flip); a 0-d tensor comes back
    unchanged (as x[...]). Differentiable (the gradient is flipped back)."""
    dims = canonical_dims("flip", (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims), x.ndim)
    if x.ndim == 0:
        return x[...]
    idx = [slice(None)] * x.ndim
    for d in dims:
        idx[d] = slice(None, None, -1)
    return x[tuple(idx)]


def narrow(x, dim, start, length):
    """PyTorch's narrow: the slice [start, start + length) of ``dim`` (a view; start may be negative)."""
    d = canonical_dim("narrow", dim, x.ndim)
    if x.ndim == 0:
        raise ArgumentError("narrow: cannot be applied to a 0-dim tensor")
    n = x.shape[d]
    if not -n <= start <= n:
        raise DimensionError(f"narrow: start ({start}) out of range (expected to be in range of [{-n}, {n}])")
    start = start % n if start < 0 else start
    if length < 0 or start + length > n:
        raise ArgumentError(f"narrow: start ({start}) + length ({length}) exceeds dimension size ({n})")
    return x[(slice(None),) * d + (slice(start, start + length),)]


def select(x, dim, index):
    """PyTorch's select: index ``index`` of ``dim``, that dim removed (a view)."""
    d = canonical_dim("select", dim, x.ndim)
    if x.ndim == 0:
        raise DimensionError("select: select() cannot be applied to a 0-dim tensor")
    n = x.shape[d]
    if not -n <= index < n:
        raise DimensionError(f"select: index {index} out of range for tensor of size {tuple(x.shape)} at dimension {d}")
    return x[(slice(None),) * d + (int(index),)]
