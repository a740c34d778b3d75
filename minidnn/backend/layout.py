"""Memory layouts (cuDNN's tensor formats) for 3-, 4- and 5-D activations.

# x: NCHW = (N, C, H, W)          NHWC = (N, H, W, C)
#    NCDHW = (N, C, D, H, W)      NDHWC = (N, D, H, W, C)       NCW / NWC for 1-D
Two ways to meet channels-last data, as in cuDNN and PyTorch:

* ``format="NHWC"`` passed explicitly: the arrays are *indexed* channels-last, x.shape == (N, H, W, C)
  (the TensorFlow convention, handy on raw NumPy arrays).  Outputs come back indexed the same way.
* ``format=None`` (default): arrays are indexed channels-first, x.shape == (N, C, H, W), whatever their
  memory order.  ``memory_format(x)`` reads the memory order from the strides (PyTorch's
  channels_last memory format), so primitives can allocate outputs in the same memory order.

Primitives compute in the channels-first index order; a channels-last array is a transposed *view*
of a channels-first one, so supporting NHWC costs no copy in the reference code.
"""
from __future__ import annotations

from .errors import BadParamError, IdentityEnum

__all__ = ["TensorFormat", "memory_format", "resolve_format", "to_channels_first", "from_channels_first",
           "channels_last_perm", "channels_first_perm", "in_memory_order"]


class TensorFormat(IdentityEnum):
    """cudnnTensorFormat_t: where the channel dim lives. NCHW is channels first and NHWC channels last, for every rank
    >= 3 (NCW/NWC and the 5-D NCDHW/NDHWC follow the same rule, so NCDHW and NDHWC are aliases)."""
    NCHW = "NCHW"      # channels first, any rank >= 3 (NCW, NCHW, NCDHW)
    NHWC = "NHWC"      # channels last, any rank >= 3 (NWC, NHWC, NDHWC)
    # cuDNN spells the 5-D formats separately; they are aliases of the same rule here.
    NCDHW = "NCHW"
    NDHWC = "NHWC"


def channels_last_perm(ndim: int) -> tuple:
    """Axes that turn a channels-first array into channels-last: (0, 2, ..., ndim-1, 1)."""
    return (0, *range(2, ndim), 1)


def channels_first_perm(ndim: int) -> tuple:
    """Axes that turn a channels-last array into channels-first: (0, ndim-1, 1, ..., ndim-2)."""
    return (0, ndim - 1, *range(1, ndim - 1))


def memory_format(x) -> TensorFormat:
    """Read the memory order from the strides: channels-last when the channel axis (1) is the densest
    of a non-trivial array whose axis 1 has stride 1 and whose last axis does not."""
    if x.ndim < 3:
        return TensorFormat.NCHW
    strides = x.strides
    c_axis_dense = strides[1] == x.itemsize and x.shape[1] > 1
    last_dense = strides[-1] == x.itemsize and x.shape[-1] > 1
    if c_axis_dense and not last_dense:
        return TensorFormat.NHWC
    return TensorFormat.NCHW


def resolve_format(x, fmt) -> TensorFormat:
    """``fmt`` may be a TensorFormat, its name, or None (channels-first indexing)."""
    if fmt is None:
        return TensorFormat.NCHW
    if isinstance(fmt, str):
        key = fmt.upper()
        aliases = {"NCW": "NCHW", "NWC": "NHWC", "NCDHW": "NCHW", "NDHWC": "NHWC"}
        key = aliases.get(key, key)
        try:
            return TensorFormat[key]
        except KeyError:
            raise BadParamError(f"unknown tensor format {fmt!r}: expected NCHW/NHWC "
                                "(or NCW/NWC, NCDHW/NDHWC)") from None
    if isinstance(fmt, TensorFormat):
        return TensorFormat.NHWC if fmt.value == "NHWC" else TensorFormat.NCHW
    raise BadParamError(f"tensor format must be a TensorFormat or a string, got {type(fmt).__name__}")


def to_channels_first(x, fmt: TensorFormat):
    """A channels-first view of ``x`` stored in ``fmt`` (no copy)."""
    if fmt is TensorFormat.NHWC and x.ndim >= 3:
        return x.transpose(channels_first_perm(x.ndim))
    return x


def from_channels_first(x, fmt: TensorFormat):
    """A view of channels-first ``x`` in the logical index order of ``fmt`` (no copy)."""
    if fmt is TensorFormat.NHWC and x.ndim >= 3:
        return x.transpose(channels_last_perm(x.ndim))
    return x


def in_memory_order(fn, *arrays):
    """``fn(*arrays)`` for an elementwise ``fn``, computed on NHWC views when the largest array operand is a
    channels-last GPU array, every other one of its shape is channels-last too, and the rest broadcast to it (a
    per-channel (1, C, 1, 1) bias, say: its NHWC view (1, 1, 1, C) broadcasts the same way), so the result stays
    channels-last (CuPy allocates C-ordered outputs, where NumPy follows its inputs' memory order).  Anything else
    goes to ``fn`` unchanged."""
    first = None
    for a in arrays:
        if getattr(a, "ndim", 0) >= 3 and (first is None or a.size > first.size):
            first = a
    if first is None or type(first).__module__.startswith("numpy") or first.flags.c_contiguous \
            or memory_format(first) is not TensorFormat.NHWC:
        return fn(*arrays)
    nd, shape = first.ndim, tuple(first.shape)
    perm = channels_last_perm(nd)
    views = []
    for a in arrays:
        k = getattr(a, "ndim", 0)
        if not k:
            views.append(a)
            continue
        if tuple(a.shape) == shape:
            if memory_format(a) is not TensorFormat.NHWC:
                return fn(*arrays)
        elif k > nd or any(d != 1 and d != s for d, s in zip(a.shape, shape[nd - k:])):
            return fn(*arrays)      # a shape that does not broadcast to ``first``'s (the result is larger)
        elif k < nd:
            a = a.reshape((1,) * (nd - k) + tuple(a.shape))
        views.append(a.transpose(perm))
    return fn(*views).transpose(channels_first_perm(nd))
