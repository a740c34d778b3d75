"""Softmax and log-softmax (cuDNN's cudnnSoftmaxForward / cudnnSoftmaxBackward).

# x, y, dy, dx: (N, C, *S) for the modes (format="NHWC": (N, *S, C)); any shape with ``axis=``
# mode INSTANCE: normalise over every dim but N (one distribution per sample)
# mode CHANNEL:  normalise over C alone (one distribution per sample and spatial position)

``axis=`` (an int or a tuple of ints, negative allowed) overrides ``mode`` and ``format`` and
normalises over exactly those dims, which is what ``F.softmax(x, dim)`` needs.

Algorithms: FAST computes exp(x) / sum(exp(x)) as written (overflows for x > ~88 in float32);
ACCURATE subtracts the max first (same result, never overflows); LOG returns log-softmax,
x - max - log(sum(exp(x - max))).
"""
from __future__ import annotations

import enum

from ._common import begin, blend, check_float, check_out, check_same, parse_enum
from .errors import BadParamError
from .layout import TensorFormat, resolve_format

__all__ = ["SoftmaxAlgorithm", "SoftmaxMode", "softmax_forward", "softmax_backward"]


class SoftmaxAlgorithm(enum.Enum):
    FAST = "fast"
    ACCURATE = "accurate"
    LOG = "log"


class SoftmaxMode(enum.Enum):
    INSTANCE = "instance"
    CHANNEL = "channel"


def _reduction_axes(where, x, mode, format, axis):
    """The dims one distribution spans."""
    if axis is not None:
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        if not all(-x.ndim <= a < x.ndim for a in axes) or x.ndim == 0:
            raise BadParamError(f"{where}: axis={axis} is out of range for x of shape {tuple(x.shape)}")
        axes = tuple(sorted({a % x.ndim for a in axes}))
    else:
        mode = parse_enum(where, SoftmaxMode, mode, "mode")
        if x.ndim < 2:
            raise BadParamError(f"{where}: mode {mode.name} needs x of at least 2 dims (N, C, ...), got shape "
                                f"{tuple(x.shape)}; pass axis= for other shapes")
        if mode is SoftmaxMode.INSTANCE:
            axes = tuple(range(1, x.ndim))
        else:
            axes = (x.ndim - 1,) if resolve_format(x, format) is TensorFormat.NHWC and x.ndim >= 3 else (1,)
    return axes


def softmax_forward(handle, algo, mode, x, alpha=1.0, beta=0.0, y=None, format=None, axis=None):
    """y = alpha * softmax(x) + beta * y  (log-softmax for algo LOG)."""
    where = "softmax_forward"
    handle, xp = begin(handle, where, x=x, y=y)
    algo = parse_enum(where, SoftmaxAlgorithm, algo, "algorithm")
    check_float(where, x=x)
    axes = _reduction_axes(where, x, mode, format, axis)
    check_out(where, "y", y, x.shape, x.dtype, beta)

    if x.size == 0:             # an empty tensor (possibly over an empty dim, as PyTorch allows): empty result
        value = xp.empty_like(x)
    elif (gpu := _gpu_softmax(x, None, axes, algo, alpha, beta, y)) is not None:
        return gpu              # the CUDA kernel (see the GPU fast path block at the end of this file)
    elif algo is SoftmaxAlgorithm.FAST:
        e = xp.exp(x)
        value = e / e.sum(axis=axes, keepdims=True)
    else:
        z = x - x.max(axis=axes, keepdims=True)
        e = xp.exp(z)
        s = e.sum(axis=axes, keepdims=True)
        value = z - xp.log(s) if algo is SoftmaxAlgorithm.LOG else e / s
    return blend(value, alpha, beta, y, x.dtype)


def softmax_backward(handle, algo, mode, y, dy, alpha=1.0, beta=0.0, dx=None, format=None, axis=None):
    """dx = alpha * J^T dy + beta * dx, from the forward output y alone.

    softmax:      dx = y * (dy - sum(dy * y))
    log-softmax:  dx = dy - exp(y) * sum(dy)
    """
    where = "softmax_backward"
    handle, xp = begin(handle, where, y=y, dy=dy, dx=dx)
    algo = parse_enum(where, SoftmaxAlgorithm, algo, "algorithm")
    check_float(where, y=y)
    check_same(where, "y", y, dy=dy)
    axes = _reduction_axes(where, y, mode, format, axis)
    check_out(where, "dx", dx, y.shape, y.dtype, beta)

    if y.size == 0:
        value = xp.empty_like(y)
    elif (gpu := _gpu_softmax(y, dy, axes, algo, alpha, beta, dx)) is not None:
        return gpu              # the CUDA kernel (see the GPU fast path block at the end of this file)
    elif algo is SoftmaxAlgorithm.LOG:
        value = dy - xp.exp(y) * dy.sum(axis=axes, keepdims=True)
    else:
        value = y * (dy - (dy * y).sum(axis=axes, keepdims=True))
    return blend(value, alpha, beta, dx, y.dtype)


# ----------------------------------------------------------------------------------------------
# GPU fast path (backend/cuda/softmax_kernels.py), owned by the step-kernels work (issue 10): C-contiguous CuPy
# float32/float64 arrays, the normalised dims consecutive, no blending; None sends the call to the reference above.

def _gpu_softmax(x, dy, axes, algo, alpha, beta, out):
    from .devices import is_cuda_array
    if not (is_cuda_array(x) and alpha == 1 and beta == 0 and out is None):
        return None
    from .cuda import softmax_kernels
    if not softmax_kernels.supports(x, axes, *(() if dy is None else (dy,))):
        return None
    if dy is None:
        return softmax_kernels.forward(x, axes, algo.name)
    return softmax_kernels.backward(x, dy, axes, algo.name)
