"""Convolution + scaled residual + bias + activation (cuDNN's cudnnConvolutionBiasActivationForward).

# x: (N, C, *in)  w: (K, C/G, *kernel)  z, y: (N, K, *out)  bias: (K,) or (1, K, 1, ...)    1-D, 2-D or 3-D
# format="NHWC": x, z, y are indexed channels-last, (N, *spatial, C); bias (K,) or (1, ..., 1, K); w stays (K, C/G, ...)

    y = act(alpha1 * conv(x, w) + alpha2 * z + bias)

The reference is the composition of the existing primitives (convolution_forward, add_tensor, activation_forward),
so it runs wherever they run, CPU and GPU.  The GPU fast path (backend/cuda/conv_epilogue.py) runs where the plain
convolution would run an implicit-GEMM kernel: the same kernel with its fused epilogue applies alpha1, z, the bias
and the activation to the accumulators in registers and writes y once -- one launch instead of 3-4, y written once
instead of read and written 3-4 times.  Where it declines (another algorithm -- the direct depthwise kernels among
them --, float64, an activation the epilogue lacks, y overlapping an input, MINIDNN_CONV_EPILOGUE=0), the
composition runs.  ``fused_reason`` says which for a call.
"""
from __future__ import annotations

import numbers

import numpy as np

from ._common import begin, check_out, shape_str
from .activation import ActivationDescriptor, activation_forward
from .conv_problem import make_problem
from .convolution import convolution_forward, forward_choice
from .devices import is_cuda_array
from .devices import is_floating as _is_floating
from .errors import BadParamError
from .layout import TensorFormat, channels_first_perm, channels_last_perm, resolve_format, to_channels_first
from .tensor_ops import add_tensor

__all__ = ["convolution_bias_activation_forward", "fused_reason"]


def _check_scalar(where, name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise BadParamError(f"{where}: {name} must be a finite real number, got {value!r}")


def _check_inputs(where, x, w, conv_desc, z, alpha1, alpha2, bias, activation_desc, y, fmt):
    """Every rule, before any computation; returns y's shape in ``fmt``'s index order."""
    for name, a in (("x", x), ("w", w)):
        if a is None or not hasattr(a, "shape"):
            raise BadParamError(f"{where}: {name} must be an array, got {type(a).__name__}")
    if not isinstance(activation_desc, ActivationDescriptor):
        raise BadParamError(f"{where}: activation_desc must be an ActivationDescriptor, got "
                            f"{type(activation_desc).__name__}")
    _check_scalar(where, "alpha1", alpha1)
    _check_scalar(where, "alpha2", alpha2)
    arrays = {"x": x, "w": w, "z": z, "bias": bias}
    for name, a in arrays.items():
        if a is not None and not _is_floating(np.dtype(a.dtype)):
            raise BadParamError(f"{where}: {name} has dtype {a.dtype}, but only floating-point dtypes "
                                "(float16, bfloat16, float32, float64) are supported")
        if a is not None and a.dtype != x.dtype:
            raise BadParamError(f"{where}: x has dtype {x.dtype} but {name} {shape_str(a)} has dtype {a.dtype}; "
                                "they must match")
    x_cf = tuple(x.shape[i] for i in channels_first_perm(x.ndim)) \
        if fmt is TensorFormat.NHWC and x.ndim >= 3 else tuple(x.shape)
    p = make_problem(where, x_cf, w.shape, conv_desc, x.dtype)
    y_shape = tuple(p.y_shape[i] for i in channels_last_perm(len(p.y_shape))) \
        if fmt is TensorFormat.NHWC else p.y_shape
    if z is not None and tuple(z.shape) != y_shape:
        raise BadParamError(f"{where}: z has shape {shape_str(z)} but the convolution of x {shape_str(x)} with "
                            f"w {shape_str(w)} ({conv_desc}) has output shape {y_shape}; z must have y's shape")
    if bias is not None:
        channel_axis = len(y_shape) - 1 if fmt is TensorFormat.NHWC else 1
        broadcast = tuple(p.K if i == channel_axis else 1 for i in range(len(y_shape)))
        if tuple(bias.shape) not in ((p.K,), broadcast):
            raise BadParamError(f"{where}: bias has shape {shape_str(bias)} but w {shape_str(w)} has K={p.K} output "
                                f"channels: bias must be ({p.K},) or {broadcast}")
    check_out(where, "y", y, y_shape, x.dtype, 0.0)
    return y_shape


def convolution_bias_activation_forward(handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc,
                                        y=None, format=None):
    """y = act(alpha1 * conv(x, w) + alpha2 * z + bias): cuDNN's cudnnConvolutionBiasActivationForward.

    Shapes as in ``convolution_forward``: x (N, C, *in), w (K, C/groups, *kernel), y and z (N, K, *out), or
    channels-last x, z, y with ``format="NHWC"``.  ``z`` (the residual, e.g. a skip connection) may be None: no
    residual term, ``alpha2`` unused; it may also be the same array as ``y`` (cuDNN's in-place residual add).
    ``bias`` is (K,) or cuDNN's (1, K, 1, 1) ((1, 1, 1, K) with NHWC); None means no bias (cuDNN requires one).
    Note that alpha1 scales the convolution only, not the bias.  ``activation_desc``: cuDNN allows RELU and
    IDENTITY (and CLIPPED_RELU); any mode of ``activation_forward`` works here.  ``algo`` is a ConvolutionFwdAlgo,
    or None for the handle's selection (heuristic, or the benchmark cache with handle.benchmark).  ``y``, if
    given, is overwritten and returned (there is no beta: cuDNN has none either).

    Every shape, dtype, device and descriptor is checked before any work (BadParamError naming them).  On CUDA
    arrays, where the convolution runs an implicit-GEMM kernel, ONE launch of that kernel with the fused epilogue
    computes y; elsewhere the reference runs, the composition convolution_forward -> add_tensor (alpha2 * z, bias)
    -> activation_forward: several passes over y.  ``fused_reason`` tells which, and why.
    """
    where = "convolution_bias_activation_forward"
    handle, _ = begin(handle, where, x=x, w=w, z=z, bias=bias, y=y)
    fmt = resolve_format(None, format)
    y_shape = _check_inputs(where, x, w, conv_desc, z, alpha1, alpha2, bias, activation_desc, y, fmt)
    if is_cuda_array(x):
        fused = _fused(handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y, format, fmt,
                       y_shape)
        if not isinstance(fused, str):
            return fused
    acc = convolution_forward(handle, x, w, conv_desc, algo=algo, alpha=alpha1, format=format)   # fresh array
    if z is not None and alpha2 != 0:
        add_tensor(handle, alpha2, z, 1.0, acc)
    if bias is not None:
        add_tensor(handle, 1.0, bias, 1.0, acc, format=format)
    return activation_forward(handle, activation_desc, acc, y=y)


# ---- the GPU fast path -----------------------------------------------------------------------------------------

def _span(a):
    """[first, last] byte addresses ``a`` can touch (its strides may be negative: a flipped view)."""
    lo = hi = a.data.ptr
    for n, st in zip(a.shape, a.strides):
        if n > 1:
            if st < 0:
                lo += (n - 1) * st
            else:
                hi += (n - 1) * st
    return lo, hi + a.itemsize - 1


def _overlap(a, b):
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a.size > 0 and b.size > 0 and a0 <= b1 and b0 <= a1


def _fused(handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y, format, fmt, y_shape):
    """y from the fused kernel, or the reason (a str) the composition runs instead."""
    from .cuda import conv_epilogue as E
    mode = activation_desc.mode.name
    why = E.early_reason(mode)
    if why is not None:
        return why
    h, plan, algorithm, xa, wa = forward_choice(handle, x, w, conv_desc, algo, format)
    p = plan.p
    if algorithm is None or p.N == 0:
        return "an empty batch (nothing to compute)"
    why = E.supports(algorithm.algo.name, p, mode)
    if why is not None:
        return why
    if z is not None and alpha2 == 0:
        z = None                            # the composition never reads it either
    z_is_y = False
    if y is not None:
        for name, a in (("x", x), ("w", w), ("bias", bias)):
            if a is not None and _overlap(y, a):
                return f"y overlaps {name} (the kernel would read what it writes)"
        if z is not None and _overlap(y, z):
            if z.data.ptr != y.data.ptr or z.strides != y.strides:
                return "z overlaps y without being y"
            z, z_is_y = None, True
    xp = h.xp
    if y is None:
        y = xp.empty(y_shape, dtype=x.dtype)
    zc = None if z is None else to_channels_first(z, fmt)
    b = None if bias is None else xp.ascontiguousarray(bias.reshape(-1))
    with h.activate():
        E.forward(p, xa, wa, algorithm.algo.name, plan.tf32, float(alpha1), zc, float(alpha2), b, mode,
                  activation_desc.coef, to_channels_first(y, fmt), z_is_y)
    return y


def fused_reason(handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y=None, format=None):
    """None if convolution_bias_activation_forward with these arguments runs the fused GPU kernel, else why the
    composition runs (a sentence; the rules on y overlapping an input aside).  Nothing is computed (the algorithm
    choice may be, with handle.benchmark)."""
    from .cuda import conv_epilogue as E
    if not is_cuda_array(x):
        return "not CUDA arrays (the composition is the CPU path)"
    mode = activation_desc.mode.name
    why = E.early_reason(mode)
    if why is not None:
        return why
    h, plan, algorithm, _, _ = forward_choice(handle, x, w, conv_desc, algo, format)
    if algorithm is None or plan.p.N == 0:
        return "an empty batch (nothing to compute)"
    return E.supports(algorithm.algo.name, plan.p, mode)
