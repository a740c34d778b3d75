"""Pooling (cuDNN's cudnnPoolingForward / cudnnPoolingBackward), 1-D, 2-D and 3-D.

# x, dx: (N, C, *S)   with S = (W,), (H, W) or (D, H, W)       (format="NHWC": (N, *S, C))
# y, dy: (N, C, *O)   O[i] = floor((S[i] + 2*pad[i] - window[i]) / stride[i]) + 1   (ceil with ceil_mode)
# argmax: (N, C, *O)  index of the winning tap inside its window (row-major), MAX modes only

The reference walks the window *taps* (at most window[0]*window[1]*... iterations), never pixels or
samples: at tap k every output position o reads the padded input at k + o * stride, a strided slice.

Padding is zero padding.  Max pooling never picks a padded position (they count as -inf);
AVERAGE_COUNT_INCLUDE_PADDING divides by the window size clipped to the padded input,
AVERAGE_COUNT_EXCLUDE_PADDING by the number of real input elements in the window.

Determinism: MAX backward sends each window's gradient to the *first* maximum of the window
(row-major tap order, as cuDNN and PyTorch do), and accumulates overlapping windows tap by tap in a
fixed order, so MAX and MAX_DETERMINISTIC give bit-identical results in this reference.  The
distinction matters for a parallel GPU kernel (atomic adds in MAX), which must keep
MAX_DETERMINISTIC's fixed order.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from ._common import (
    SeenCalls,
    as_tuple,
    begin,
    blend,
    check_float,
    check_ndim,
    check_out,
    check_same,
    numpy_call_key,
    pad_axes,
    parse_enum,
    seen_plan,
    shape_str,
    tap_offsets,
)
from .cuda import pool_kernels  # the GPU fast path's kernels: imported once here, not per call (needs no GPU)
from .devices import is_cuda_array
from .errors import BadParamError, IdentityEnum
from .layout import (
    TensorFormat,
    channels_first_perm,
    channels_last_perm,
    from_channels_first,
    resolve_format,
    to_channels_first,
)

__all__ = ["PoolingMode", "PoolingDescriptor", "get_pooling_forward_output_dim",
           "pooling_forward", "pooling_backward", "FAST_PATHS"]

# Faster forms of this reference, registered by their modules (pooling_cpu.py: NumPy): each is a module or object
# with applies_forward(geom, x), pool_forward(geom, xc, xp) -> (value, argmax or None), applies_backward(geom, x)
# and pool_backward(geom, dyc, argmax, dtype, xp) -> padded dx.  The first that applies runs; else the taps below.
FAST_PATHS = []


class PoolingMode(IdentityEnum):
    """cudnnPoolingMode_t: MAX (padding counts as -inf; the gradient goes to each window's first maximum),
    MAX_DETERMINISTIC (the same, with a fixed accumulation order required of GPU kernels; bit-identical in this
    reference), and averages whose divisor counts the zero padding (AVERAGE_COUNT_INCLUDE_PADDING) or only real elements
    (AVERAGE_COUNT_EXCLUDE_PADDING)."""
    MAX = "max"
    MAX_DETERMINISTIC = "max_deterministic"
    AVERAGE_COUNT_INCLUDE_PADDING = "average_count_include_padding"
    AVERAGE_COUNT_EXCLUDE_PADDING = "average_count_exclude_padding"

    @property
    def is_max(self) -> bool:
        return self in (PoolingMode.MAX, PoolingMode.MAX_DETERMINISTIC)


def _int_or_tuple(value, name, minimum):
    """Normalise an int or a sequence of ints (kept as given: the spatial rank is known only at use)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        values = (int(value),)
        norm = int(value)
    else:
        try:
            values = norm = tuple(int(v) for v in value)
        except TypeError:
            raise BadParamError(f"PoolingDescriptor: {name}={value!r} must be an int or a sequence of ints") from None
        if not 1 <= len(values) <= 3:
            raise BadParamError(f"PoolingDescriptor: {name}={value!r} must have 1 to 3 entries (1-D to 3-D pooling)")
    if any(v < minimum for v in values):
        raise BadParamError(f"PoolingDescriptor: {name}={value!r} must be >= {minimum}")
    return norm


@dataclasses.dataclass(frozen=True)
class PoolingDescriptor:
    """Pooling settings.  ``window``, ``padding`` and ``stride`` are ints (same for every spatial dim)
    or one int per spatial dim; ``stride=None`` means stride = window (non-overlapping windows).

    ``ceil_mode=True`` rounds the output size up (PyTorch's ceil_mode), but, as in PyTorch, a last
    window is dropped if it would start in the right padding.  Padding must be smaller than the
    window so that every window holds at least one input element.  ``dilation`` spaces a max
    window's taps (the window then spans dilation * (window - 1) + 1 elements).
    """
    mode: PoolingMode
    window: int | tuple
    padding: int | tuple = 0
    stride: int | tuple | None = None
    ceil_mode: bool = False
    dilation: int | tuple = 1           # spacing of the window's taps (max modes; PyTorch's max_pool dilation)

    def __post_init__(self):
        object.__setattr__(self, "mode", parse_enum("PoolingDescriptor", PoolingMode, self.mode, "mode"))
        object.__setattr__(self, "window", _int_or_tuple(self.window, "window", 1))
        object.__setattr__(self, "padding", _int_or_tuple(self.padding, "padding", 0))
        stride = self.window if self.stride is None else _int_or_tuple(self.stride, "stride", 1)
        object.__setattr__(self, "stride", stride)
        object.__setattr__(self, "ceil_mode", bool(self.ceil_mode))
        object.__setattr__(self, "dilation", _int_or_tuple(self.dilation, "dilation", 1))
        if self.dilation not in (1, (1,), (1, 1), (1, 1, 1)) and not self.mode.is_max:
            raise BadParamError(f"PoolingDescriptor: dilation={self.dilation!r} is only defined for MAX modes, got "
                                f"{self.mode.name}")

    def resolve(self, nd: int, where: str = "pooling"):
        """(window, padding, stride) as tuples of ``nd`` ints, checked against each other."""
        window = as_tuple(self.window, nd, where, "window")
        padding = as_tuple(self.padding, nd, where, "padding")
        stride = as_tuple(self.stride, nd, where, "stride")
        for k, p in zip(window, padding):
            if p >= k:
                raise BadParamError(f"{where}: padding {padding} must be smaller than window {window} in every "
                                    "dim, or a window could hold only padding")
        return window, padding, stride


def _output_size(length, k, p, s, ceil_mode):
    """Output length for an effective window ``k``; None when not even one window fits.  In ceil mode a window may
    run past the padded end (PyTorch: ceil((length + 2p - k) / s) + 1), as long as it starts inside."""
    span = length + 2 * p - k
    if span < 0 and not ceil_mode:
        return None
    out = -(-span // s) + 1 if ceil_mode else span // s + 1
    if ceil_mode and (out - 1) * s >= length + p:
        out -= 1      # the last window would start in the right padding: drop it (PyTorch's rule)
    return out if out >= 1 else None


class _Geometry:
    """Everything about one pooling call that forward and backward share (channels-first view)."""

    def __init__(self, desc, x_shape, where):
        if not isinstance(desc, PoolingDescriptor):
            raise BadParamError(f"{where}: pooling_desc must be a PoolingDescriptor, got {type(desc).__name__}")
        nd = len(x_shape) - 2
        self.window, self.padding, self.stride = desc.resolve(nd, where)
        self.dilation = as_tuple(desc.dilation, nd, where, "dilation")
        self.span = tuple(d * (k - 1) + 1 for d, k in zip(self.dilation, self.window))     # effective window
        self.spatial = tuple(x_shape[2:])
        out = [_output_size(n, k, p, s, desc.ceil_mode)
               for n, k, p, s in zip(self.spatial, self.span, self.padding, self.stride)]
        if any(o is None for o in out):
            raise BadParamError(f"{where}: window {self.window} is larger than the padded input: spatial size "
                                f"{self.spatial} with padding {self.padding}")
        self.out_sizes = tuple(out)
        self.y_shape = tuple(x_shape[:2]) + self.out_sizes
        # ceil_mode windows may run past the right padding: pad enough for the last window to be sliced.
        self.pad_after = tuple(max(p, (o - 1) * s + k - n - p) for n, k, p, s, o in
                               zip(self.spatial, self.span, self.padding, self.stride, self.out_sizes))
        self.axes = tuple(range(2, 2 + nd))
        self.mode = desc.mode

    @property
    def padded_spatial(self):
        return tuple(p + n + a for p, n, a in zip(self.padding, self.spatial, self.pad_after))

    def pad(self, xp, x, value):
        return pad_axes(xp, x, self.axes, self.padding, self.pad_after, value)

    def crop(self, xpad):
        return xpad[(Ellipsis,) + tuple(slice(p, p + n) for p, n in zip(self.padding, self.spatial))]

    @property
    def dilated(self) -> bool:
        return any(d != 1 for d in self.dilation)

    def taps(self):
        if not self.dilated:
            return tap_offsets(self.window, self.stride, self.out_sizes)
        return ((t, tuple(slice(k * d, k * d + s * (o - 1) + 1, s)
                          for k, d, s, o in zip(ks, self.dilation, self.stride, self.out_sizes)))
                for t, ks in enumerate(itertools.product(*(range(k) for k in self.window))))

    def divisor(self, xp, dtype):
        """How many elements each average window divides by, broadcastable to y: (1, 1, *O).

        Separable: the count is the product of per-dim counts.  Including padding, a window is
        clipped to the padded input [-p, n + p) (only ceil_mode windows are ever clipped); excluding
        padding, to the real input [0, n).
        """
        include = self.mode is PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING
        count = xp.ones((1, 1) + (1,) * len(self.out_sizes), dtype=dtype)
        for d, (n, k, p, s, o) in enumerate(zip(self.spatial, self.window, self.padding, self.stride,
                                                self.out_sizes)):
            start = xp.arange(o) * s - p
            if include:
                c = xp.minimum(start + k, n + p) - start
            else:
                c = xp.minimum(start + k, n) - xp.maximum(start, 0)
            shape = [1] * count.ndim
            shape[2 + d] = o
            count = count * c.astype(dtype).reshape(shape)
        return count


def _in_format(cf_shape, fmt):
    """A channels-first shape written in the index order of ``fmt``."""
    return tuple(cf_shape[i] for i in channels_last_perm(len(cf_shape))) if fmt is TensorFormat.NHWC else cf_shape


def _window_max(xp, xpad, geom):
    """Max over each window and the tap that holds it: PyTorch's CPU rule ``val > max || isnan(val)`` in tap
    order, so the first maximum wins, and a NaN wins over everything, the last NaN of the window."""
    best = arg = None
    for t, sl in geom.taps():
        v = xpad[(Ellipsis,) + sl]
        if best is None:
            best = v.copy()
            arg = xp.zeros(v.shape, dtype=np.min_scalar_type(math.prod(geom.window) - 1))
            continue
        better = (v > best) | xp.isnan(v)
        best = xp.where(better, v, best)
        arg = xp.where(better, t, arg).astype(arg.dtype, copy=False)     # no boolean-mask write: it syncs CuPy
    return best, arg


def _prefer_real_taps(xp, xc, geom, best, arg):
    """A window whose maximum is -inf ties its padded taps (padding counts as -inf) with its real -inf elements:
    point it at its first real tap, as PyTorch does (its windows never pick padding)."""
    if not (any(geom.padding) or any(geom.pad_after)) or xc.size == 0:
        return arg
    valid = geom.pad(xp, xp.ones(xc.shape[2:], dtype=bool)[None, None], False)
    first_real = None
    for t, sl in reversed(list(geom.taps())):
        v = valid[(Ellipsis,) + sl]
        first_real = xp.where(v, t, t if first_real is None else first_real)
    return xp.where(best == -np.inf, first_real.astype(arg.dtype), arg)


def _max_and_argmax(xp, xc, geom, fast):
    """(window maxima, winning taps) from the fast form when one applies, else the reference tap loop."""
    best, arg = fast.pool_forward(geom, xc, xp) if fast is not None else \
        _window_max(xp, geom.pad(xp, xc, -np.inf), geom)
    return best, _prefer_real_taps(xp, xc, geom, best, arg)


def _prologue(where, handle, desc, x, format, **arrays):
    """Checks shared by forward and backward -> (xp, format, channels-first x, geometry)."""
    handle, xp = begin(handle, where, x=x, **arrays)
    check_float(where, x=x)
    check_ndim(where, "x", x, (3, 4, 5))
    fmt = resolve_format(x, format)
    xc = to_channels_first(x, fmt)
    return xp, fmt, xc, _Geometry(desc, xc.shape, where)


def get_pooling_forward_output_dim(pooling_desc: PoolingDescriptor, x_shape, format=None) -> tuple:
    """Shape of y for an x of ``x_shape`` (cuDNN's cudnnGetPoolingNdForwardOutputDim)."""
    where = "get_pooling_forward_output_dim"
    x_shape = tuple(int(n) for n in x_shape)
    if len(x_shape) not in (3, 4, 5):
        raise BadParamError(f"{where}: x shape {x_shape} must be 3-D, 4-D or 5-D (N, C, *spatial)")
    fmt = resolve_format(None, format)
    cf_shape = tuple(x_shape[i] for i in channels_first_perm(len(x_shape))) if fmt is TensorFormat.NHWC else x_shape
    return _in_format(_Geometry(pooling_desc, cf_shape, where).y_shape, fmt)


def pooling_forward(handle, pooling_desc: PoolingDescriptor, x, alpha=1.0, beta=0.0, y=None, format=None,
                    return_argmax=False):
    """y = alpha * pool(x) + beta * y.

    ``return_argmax=True`` (max modes only) returns ``(y, argmax)``, where argmax holds each window's
    winning tap; passing it to ``pooling_backward`` skips recomputing the maxima.
    """
    key, seen = _seen(_gpu_key("fwd", handle, pooling_desc, format, alpha, beta, return_argmax, y, x, None, None, None))
    if seen is not None:     # validated before: straight to the kernel
        fmt, plan = seen
        return _gpu_forward_result(plan(to_channels_first(x, fmt)), fmt, return_argmax)
    ckey, cseen = seen_plan(_CPU_SEEN, _cpu_key("fwd", handle, pooling_desc, format, alpha, beta, return_argmax, y, x))
    if cseen is not None:    # a NumPy call validated before: its format and geometry
        fmt, geom = cseen
        return _cpu_forward(np, fmt, to_channels_first(x, fmt), geom, x, alpha, beta, y, return_argmax)
    where = "pooling_forward"
    xp, fmt, xc, geom = _prologue(where, handle, pooling_desc, x, format, y=y)
    if return_argmax and not geom.mode.is_max:
        raise BadParamError(f"{where}: return_argmax=True needs a MAX mode, got {geom.mode.name}")
    y_shape = _in_format(geom.y_shape, fmt)
    check_out(where, "y", y, y_shape, x.dtype, beta)

    gpu = _gpu_pool_forward(geom, xc, fmt, alpha, beta, y, return_argmax, key=key)
    if gpu is not None:         # the CUDA kernel (see the GPU fast path block at the end of this file)
        return gpu
    _CPU_SEEN.remember(ckey, (fmt, geom))
    return _cpu_forward(xp, fmt, xc, geom, x, alpha, beta, y, return_argmax)


def _cpu_forward(xp, fmt, xc, geom, x, alpha, beta, y, return_argmax):
    fast = None if geom.dilated else next((f for f in FAST_PATHS if f.applies_forward(geom, xc)), None)
    if geom.mode.is_max:
        value, argmax = _max_and_argmax(xp, xc, geom, fast)
    elif fast is not None:
        value, argmax = fast.pool_forward(geom, xc, xp)
    else:
        xpad = geom.pad(xp, xc, 0)
        value = sum(xpad[(Ellipsis,) + sl] for _, sl in geom.taps()) / geom.divisor(xp, x.dtype)
        argmax = None
    y = blend(from_channels_first(value, fmt), alpha, beta, y, x.dtype)
    return (y, from_channels_first(argmax, fmt)) if return_argmax else y


def pooling_backward(handle, pooling_desc: PoolingDescriptor, y, dy, x, alpha=1.0, beta=0.0, dx=None, format=None,
                     argmax=None):
    """dx = alpha * (d pool / d x)^T dy + beta * dx   (cuDNN argument order: desc, y, dy, x).

    MAX modes route each window's gradient to its first maximum, recomputed from x (``y`` is only
    checked), or read from ``argmax`` returned by ``pooling_forward(..., return_argmax=True)``.
    """
    key, seen = _seen(_gpu_key("bwd", handle, pooling_desc, format, alpha, beta, None, dx, x, y, dy, argmax))
    if seen is not None:     # validated before: straight to the kernel
        fmt, plan = seen
        return from_channels_first(plan(to_channels_first(dy, fmt), None if argmax is None else
                                        to_channels_first(argmax, fmt)), fmt)
    ckey, cseen = seen_plan(_CPU_SEEN, _cpu_key("bwd", handle, pooling_desc, format, alpha, beta, None, dx, x, y, dy,
                                                argmax))
    if cseen is not None:    # a NumPy call validated before: its format and geometry
        fmt, geom = cseen
        return _cpu_backward(np, fmt, to_channels_first(x, fmt), to_channels_first(dy, fmt), geom, x, argmax, alpha,
                             beta, dx)
    where = "pooling_backward"
    xp, fmt, xc, geom = _prologue(where, handle, pooling_desc, x, format, y=y, dy=dy, dx=dx, argmax=argmax)
    dyc = to_channels_first(dy, fmt)
    if tuple(dyc.shape) != geom.y_shape:
        raise BadParamError(f"{where}: dy has shape {shape_str(dy)} but pooling x of shape {shape_str(x)} gives "
                            f"{_in_format(geom.y_shape, fmt)}")
    check_same(where, "dy", dy, y=y)
    if dy.dtype != x.dtype:
        raise BadParamError(f"{where}: dy has dtype {dy.dtype} but x has dtype {x.dtype}; they must match")
    if argmax is not None:
        if not geom.mode.is_max:
            raise BadParamError(f"{where}: argmax is only meaningful for MAX modes, got {geom.mode.name}")
        if tuple(argmax.shape) != tuple(dy.shape):
            raise BadParamError(f"{where}: argmax has shape {shape_str(argmax)} but dy has shape {shape_str(dy)}")
    check_out(where, "dx", dx, x.shape, x.dtype, beta)
    gpu = _gpu_pool_backward(geom, xc, dyc, fmt, argmax, alpha, beta, dx, key=key)
    if gpu is not None:         # the CUDA kernel (see the GPU fast path block at the end of this file)
        return gpu
    _CPU_SEEN.remember(ckey, (fmt, geom))
    return _cpu_backward(xp, fmt, xc, dyc, geom, x, argmax, alpha, beta, dx)


def _cpu_backward(xp, fmt, xc, dyc, geom, x, argmax, alpha, beta, dx):
    fast = None if geom.dilated else next((f for f in FAST_PATHS if f.applies_backward(geom, xc)), None)
    if fast is not None:
        arg = None
        if geom.mode.is_max:
            arg = _max_and_argmax(xp, xc, geom, fast)[1] if argmax is None else to_channels_first(argmax, fmt)
        dxpad = fast.pool_backward(geom, dyc, arg, x.dtype, xp)
        return blend(from_channels_first(geom.crop(dxpad), fmt), alpha, beta, dx, x.dtype)
    dxpad = xp.zeros(xc.shape[:2] + geom.padded_spatial, dtype=x.dtype)
    if geom.mode.is_max:
        if argmax is None:
            _, arg = _max_and_argmax(xp, xc, geom, None)
        else:
            arg = to_channels_first(argmax, fmt)
        zero = xp.zeros((), dtype=x.dtype)
        for t, sl in geom.taps():
            # One tap's slice never hits an input position twice (stride >= 1), so += on the view is exact.
            dxpad[(Ellipsis,) + sl] += xp.where(arg == t, dyc, zero)
    else:
        g = dyc / geom.divisor(xp, x.dtype)
        for _, sl in geom.taps():
            dxpad[(Ellipsis,) + sl] += g
    return blend(from_channels_first(geom.crop(dxpad), fmt), alpha, beta, dx, x.dtype)


# NumPy calls validated before, by their full signature (descriptor, format, blending, every array's shape, dtype,
# strides, all plain ndarrays, no output array) -> (format, geometry): the same call again skips the checks and the
# geometry (~15 us a call).  What runs after (the fast form's choice, the passes) is not remembered.
_CPU_SEEN = SeenCalls()


def _cpu_key(kind, handle, desc, format, alpha, beta, flag, out, x, y=None, dy=None, argmax=None):
    return numpy_call_key(handle, out, (kind, desc, format, alpha, beta, flag), (x, y, dy, argmax), strides=True)


from . import pooling_cpu as _pooling_cpu  # noqa: E402  (the NumPy fast form, beside the reference)

FAST_PATHS.append(_pooling_cpu)


# ----------------------------------------------------------------------------------------------
# GPU fast path (backend/cuda/pool_kernels.py), owned by the step-kernels work (issue 10): 2-D pooling of CuPy
# float32/float64 arrays without blending; None sends the call to the reference above.

# Calls the kernels took, by their full signature (descriptor, format, blending, every array's shape, dtype, strides,
# device) -> (format, the kernels' plan for it): the same call again skips the validation and the geometry, and goes
# straight to the plan (pool_kernels: one output allocation or two and one prepared launch).
_SEEN = SeenCalls()


def _sig(a):
    return None if a is None else (a.shape, a.dtype, a.strides, a.data.device_id)


def _gpu_key(kind, handle, desc, format, alpha, beta, flag, out, x, y, dy, argmax):
    if out is not None or not is_cuda_array(x):
        return None
    try:
        key = (kind, None if handle is None else handle.device, desc, format, alpha, beta, flag,
               (x.shape, x.dtype, x.strides, x.data.device_id), _sig(y), _sig(dy), _sig(argmax))
    except AttributeError:
        return None
    return key


def _seen(key):
    return seen_plan(_SEEN, key)


def _gpu_remember(key, fmt, plan):
    _SEEN.remember(key, (fmt, plan))


def _gpu_forward_result(out, fmt, return_argmax):
    value, argmax = out
    value = from_channels_first(value, fmt)
    return (value, from_channels_first(argmax, fmt)) if return_argmax else value


def _gpu_pool_forward(geom, xc, fmt, alpha, beta, y, return_argmax, key=None):
    if not (is_cuda_array(xc) and alpha == 1 and beta == 0 and y is None and pool_kernels.supports(geom, xc)):
        return None
    plan = pool_kernels.forward_plan(geom, xc)
    _gpu_remember(key, fmt, plan)
    return _gpu_forward_result(plan(xc), fmt, return_argmax)


def _gpu_pool_backward(geom, xc, dyc, fmt, argmax, alpha, beta, dx, key=None):
    arg = None if argmax is None else to_channels_first(argmax, fmt)
    if not (is_cuda_array(dyc) and alpha == 1 and beta == 0 and dx is None):
        return None
    if not pool_kernels.supports(geom, xc, dyc, arg) or (arg is not None
                                                         and arg.dtype != pool_kernels.arg_dtype(geom)):
        return None
    if geom.mode.is_max and arg is None:
        if not (is_cuda_array(xc) and pool_kernels.supports(geom, xc)):
            return None
        arg = pool_kernels.forward(geom, xc)[1]       # recomputed: this call is not remembered
        key = None
    # dx's memory order follows dy's; where dy's is ambiguous (1x1 output), x's -- and an NHWC call's dx is NHWC
    x_cl = fmt is TensorFormat.NHWC or pool_kernels.is_channels_last(xc)
    plan = pool_kernels.backward_plan(geom, dyc, arg if geom.mode.is_max else None, xc.shape, xc.dtype, x_cl)
    _gpu_remember(key, fmt, plan)
    return from_channels_first(plan(dyc, arg if geom.mode.is_max else None), fmt)
