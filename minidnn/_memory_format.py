"""Memory formats (PyTorch's ``torch.memory_format``): the order in which a tensor's elements lie in memory.

A channels-last tensor keeps PyTorch's indexing, x.shape == (N, C, H, W), with strides of an (N, H, W, C) buffer,
so every op sees the usual shape while convolution, normalization and pooling kernels read channels innermost.
``relayout`` makes such a copy; ``is_in`` tests the strides.  The backend reads the same strides
(``backend.memory_format``) and allocates its outputs in the memory order of its inputs.
"""
from __future__ import annotations

from .backend import devices as _dev

__all__ = ["memory_format", "contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
           "relayout", "is_in"]


class memory_format:
    """A memory layout: contiguous_format, channels_last (4-D), channels_last_3d (5-D), preserve_format."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"minidnn.{self.name}"


contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
preserve_format = memory_format("preserve_format")
_RANK = {channels_last: 4, channels_last_3d: 5}


def _check(arr, fmt, where):
    if not isinstance(fmt, memory_format):
        raise TypeError(f"{where}: memory_format must be minidnn.contiguous_format, channels_last, channels_last_3d "
                        f"or preserve_format, got {fmt!r}")
    rank = _RANK.get(fmt)
    if rank is not None and arr.ndim != rank:
        raise RuntimeError(f"{where}: required rank {rank} tensor to use {fmt.name} format, got shape "
                           f"{tuple(arr.shape)}")


def _last_perm(ndim):
    return (0, *range(2, ndim), 1)


def _first_perm(ndim):
    return (0, ndim - 1, *range(1, ndim - 1))


# the axes of a channels-last array from the innermost in memory out: C, then W, H, (D), then N
_INNER_FIRST = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}


def is_in(arr, fmt, where="is_contiguous") -> bool:
    """Whether ``arr``'s strides are those of ``fmt`` (preserve_format: always).  Channels-last is read from the
    strides by the arrays' own contiguity rule (what the channels-last view's ``flags.c_contiguous`` says: an empty
    array is in every format, extent-1 axes' strides do not count) without making that view."""
    if fmt is contiguous_format:
        return bool(arr.flags.c_contiguous)
    if fmt is preserve_format:
        return True
    shape = arr.shape
    if type(fmt) is not memory_format or _RANK.get(fmt) != len(shape):
        _check(arr, fmt, where)     # raises: not a format, or not of its rank
        return False
    strides = arr.strides
    want = arr.itemsize
    for i in _INNER_FIRST[len(shape)]:
        n = shape[i]
        if n != 1:
            if strides[i] != want:
                return n == 0 or 0 in shape     # (size 0: contiguous whatever the strides)
            want *= n
    return True


def relayout(arr, fmt, where="contiguous"):
    """A copy of ``arr`` (same shape and values) laid out in ``fmt``; ``arr`` itself if it already is."""
    _check(arr, fmt, where)
    if is_in(arr, fmt, where):
        return arr
    xp = _dev.array_module(arr)
    if fmt is contiguous_format:
        return xp.ascontiguousarray(arr)
    return xp.ascontiguousarray(arr.transpose(_last_perm(arr.ndim))).transpose(_first_perm(arr.ndim))
