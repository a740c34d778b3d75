"""Convolution with fused epilogue and prologue: cuDNN's cudnnConvolutionBiasActivationForward and cuDNN frontend's
ScaleBiasReluConvGenStats, on raw arrays.

# x: (N, C, *in)  w: (K, C/G, *kernel)  z, y: (N, K, *out)  bias: (K,) or (1, K, 1, ...)    1-D, 2-D or 3-D
# scale, shift: (C,) or (1, C, 1, ...)   stats: (sum, sumsq), each (K,)    (the compute type: float32, float64 data
#                                                                           float64)
# format="NHWC": x, z, y are indexed channels-last, (N, *spatial, C); bias (K,) or (1, ..., 1, K); w stays (K, C/G, ...)

    convolution_bias_activation_forward:         y = act(alpha1 * conv(x, w) + alpha2 * z + bias)
    scale_bias_activation_convolution_forward:   y = act(alpha1 * conv(act_p(x * scale + shift), w) + alpha2 * z + bias)
    either, with stats=(sum, sumsq):             sum[k] = sum over n and the output pixels of y[n, k, ...],
                                                 sumsq[k] = the same of y**2 (y as stored: rounded to its dtype)

The references are compositions of the existing primitives (convolution_forward, add_tensor, activation_forward;
the per-channel scale/shift and the sums in the compute type), so they run wherever those run, CPU and GPU.  The
GPU fast path (backend/cuda/conv_epilogue.py) runs where the plain convolution would run an implicit-GEMM kernel:
the same kernel applies the prologue to x as it lands in shared memory (padding stays zeros of the ACTIVATED
tensor), the epilogue (alpha1, z, bias, activation) to the accumulators in registers, writes y once and, with
stats, reduces the statistics in the same launch (block partials added in a fixed order by each column tile's last
block: bitwise repeatable) -- one launch instead of 3-8, y written once.  Where it declines (another algorithm --
the direct depthwise kernels among them --, float64, an activation the kernel lacks, y or the statistics
overlapping an input, MINIDNN_CONV_EPILOGUE=0), the composition runs.  ``fused_reason`` /
``scale_bias_activation_convolution_reason`` say which for a call.
"""
from __future__ import annotations

import numbers

import numpy as np

from ._common import SeenCalls, begin, check_out, seen_plan, shape_str
from .activation import ActivationDescriptor, activation_forward
from .conv_problem import make_problem
from .convolution import convolution_forward, forward_choice
from .devices import is_cuda_array
from .devices import is_floating as _is_floating
from .errors import BadParamError
from .handle import resolve_handle
from .layout import TensorFormat, channels_first_perm, channels_last_perm, resolve_format, to_channels_first
from .tensor_ops import add_tensor

__all__ = ["convolution_bias_activation_forward", "fused_reason", "scale_bias_activation_convolution_forward",
           "scale_bias_activation_convolution_reason"]


def _check_scalar(where, name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise BadParamError(f"{where}: {name} must be a finite real number, got {value!r}")


def compute_dtype(dtype):
    """The type of the per-channel parameters and statistics for data of ``dtype``: float64 for float64, else
    float32 (float16 / bfloat16 data are scaled and summed in float32, as cuDNN and PyTorch's batch norm do)."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _shares(a, b):
    """Whether arrays ``a`` and ``b`` may share memory (CuPy: their byte spans intersect; NumPy: its bounds test)."""
    if a is None or b is None:
        return False
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.may_share_memory(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    return _overlap(a, b)


def _channel_operand(where, name, a, count, ndim, fmt, dtype, x_dtype, what):
    """``a`` must be (count,) or the broadcast form (1, count, 1, ...) ((1, ..., 1, count) with NHWC) of dtype."""
    channel_axis = ndim - 1 if fmt is TensorFormat.NHWC else 1
    broadcast = tuple(count if i == channel_axis else 1 for i in range(ndim))
    if tuple(a.shape) not in ((count,), broadcast):
        raise BadParamError(f"{where}: {name} has shape {shape_str(a)} but {what}: {name} must be ({count},) or "
                            f"{broadcast}")
    if a.dtype != dtype:
        raise BadParamError(f"{where}: {name} has dtype {a.dtype} but must be {dtype} for x of dtype {x_dtype} "
                            "(per-channel parameters and statistics are float32, float64 for float64 data)")


def _check_inputs(where, x, w, conv_desc, z, alpha1, alpha2, bias, activation_desc, y, fmt, stats=None,
                  prologue=None):
    """Every rule, before any computation; returns y's shape in ``fmt``'s index order.  ``prologue``: None or
    (scale, shift, prologue_desc); ``stats``: None or the (sum, sumsq) pair."""
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
    ct = compute_dtype(x.dtype)
    inputs = {"x": x, "w": w, "z": z, "bias": bias}
    if prologue is not None:
        scale, shift, pro_desc = prologue
        if not isinstance(pro_desc, ActivationDescriptor):
            raise BadParamError(f"{where}: prologue_desc must be an ActivationDescriptor, got "
                                f"{type(pro_desc).__name__}")
        for name, a in (("scale", scale), ("shift", shift)):
            if a is None or not hasattr(a, "shape"):
                raise BadParamError(f"{where}: {name} must be an array, got {type(a).__name__}")
            _channel_operand(where, name, a, p.C, x.ndim, fmt, ct, x.dtype, f"x {shape_str(x)} has C={p.C} channels")
        inputs.update(scale=scale, shift=shift)
    if stats is not None:
        if not isinstance(stats, (tuple, list)) or len(stats) != 2 or \
                not all(hasattr(a, "shape") for a in stats):
            raise BadParamError(f"{where}: stats must be a pair of arrays (sum, sumsq), got {type(stats).__name__}")
        for name, a in zip(("stats[0] (sum)", "stats[1] (sumsq)"), stats):
            if tuple(a.shape) != (p.K,):
                raise BadParamError(f"{where}: {name} has shape {shape_str(a)} but w {shape_str(w)} has K={p.K} "
                                    f"output channels: it must be ({p.K},)")
            if a.dtype != ct:
                raise BadParamError(f"{where}: {name} has dtype {a.dtype} but must be {ct} for x of dtype "
                                    f"{x.dtype} (statistics are float32, float64 for float64 data)")
            for iname, b in list(inputs.items()) + [("y", y)]:
                if _shares(a, b):
                    raise BadParamError(f"{where}: {name} overlaps {iname}: the statistics are outputs of their own")
        if _shares(stats[0], stats[1]):
            raise BadParamError(f"{where}: stats[0] (sum) and stats[1] (sumsq) overlap; they must be distinct arrays")
    return y_shape


def _device_arrays(x, w, z, bias, y, stats, prologue):
    named = dict(x=x, w=w, z=z, bias=bias, y=y)
    if stats is not None and isinstance(stats, (tuple, list)) and len(stats) == 2:
        named.update(stats_sum=stats[0], stats_sumsq=stats[1])
    if prologue is not None:
        named.update(scale=prologue[0], shift=prologue[1])
    return {k: v for k, v in named.items() if v is None or hasattr(v, "shape")}


def convolution_bias_activation_forward(handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc,
                                        y=None, format=None, *, stats=None):
    """y = act(alpha1 * conv(x, w) + alpha2 * z + bias): cuDNN's cudnnConvolutionBiasActivationForward.

    Shapes as in ``convolution_forward``: x (N, C, *in), w (K, C/groups, *kernel), y and z (N, K, *out), or
    channels-last x, z, y with ``format="NHWC"``.  ``z`` (the residual, e.g. a skip connection) may be None: no
    residual term, ``alpha2`` unused; it may also be the same array as ``y`` (cuDNN's in-place residual add).
    ``bias`` is (K,) or cuDNN's (1, K, 1, 1) ((1, 1, 1, K) with NHWC); None means no bias (cuDNN requires one).
    Note that alpha1 scales the convolution only, not the bias.  ``activation_desc``: cuDNN allows RELU and
    IDENTITY (and CLIPPED_RELU); any mode of ``activation_forward`` works here.  ``algo`` is a ConvolutionFwdAlgo,
    or None for the handle's selection (heuristic, or the benchmark cache with handle.benchmark).  ``y``, if
    given, is overwritten and returned (there is no beta: cuDNN has none either).

    ``stats`` (keyword-only; cuDNN frontend's GenStats): None, or a pair (sum, sumsq) of (K,) arrays of the compute
    type (float32; float64 for float64 data), overwritten with sum[k] = the sum of y[:, k] over the batch and the
    output pixels and sumsq[k] = the sum of its squares -- the statistics training-mode batch norm needs (mean =
    sum / count, var = sumsq / count - mean**2, count = N * output pixels).  They are of y AS STORED: for float16
    / bfloat16 y, of the rounded values, summed in float32.  On the GPU kernel path they come from the same launch,
    reduced in a fixed order (bitwise repeatable).

    Every shape, dtype, device and descriptor is checked before any work (BadParamError naming them).  On CUDA
    arrays, where the convolution runs an implicit-GEMM kernel, ONE launch of that kernel with the fused epilogue
    computes y (and the statistics); elsewhere the reference runs, the composition convolution_forward ->
    add_tensor (alpha2 * z, bias) -> activation_forward (-> the sums): several passes over y.  ``fused_reason``
    tells which, and why.
    """
    where = "convolution_bias_activation_forward"
    return _forward(where, handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y, format, stats,
                    None)


def scale_bias_activation_convolution_forward(handle, x, scale, shift, prologue_desc, w, conv_desc, algo=None,
                                              y=None, format=None, *, z=None, alpha1=1.0, alpha2=1.0, bias=None,
                                              activation_desc=None, stats=None):
    """y = act(alpha1 * conv(act_p(x * scale + shift), w) + alpha2 * z + bias): batch-norm apply fused into the
    convolution that follows it (cuDNN frontend's ScaleBiasReluConv(GenStats)).

    ``scale``, ``shift``: per input channel, (C,) or the broadcast form (1, C, 1, 1) ((1, 1, 1, C) with NHWC), of
    the compute type (float32; float64 for float64 data) -- for a training batch norm of mean m, variance v and
    affine (gamma, beta): scale = gamma / sqrt(v + eps), shift = beta - m * scale.  ``prologue_desc``: the
    activation act_p applied after the scale and shift (an ActivationDescriptor; the GPU kernel computes IDENTITY
    and RELU, other modes run the composition).  The convolution pads the ACTIVATED tensor with zeros (the
    padding taps are 0, not act_p(shift)): it is conv2d(relu(bn(x))) exactly.  The keyword-only ``z``, ``alpha1``,
    ``alpha2``, ``bias``, ``activation_desc`` (default IDENTITY) are convolution_bias_activation_forward's
    epilogue; ``stats`` its statistics of y.  Shapes, formats, ``algo`` and ``y`` as there.

    The reference is the composition: x' = act_p(x * scale + shift) (the product and sum in the compute type,
    rounded to x's dtype; activation_forward), then convolution_bias_activation_forward(x', ...).  On CUDA arrays
    where the convolution runs an implicit-GEMM kernel, ONE launch computes it all: the kernel transforms each
    element of x as it lands in shared memory.  ``scale_bias_activation_convolution_reason`` tells which ran.
    """
    where = "scale_bias_activation_convolution_forward"
    if activation_desc is None:
        activation_desc = _IDENTITY
    return _forward(where, handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y, format, stats,
                    (scale, shift, prologue_desc))


_IDENTITY = ActivationDescriptor("identity")


def _forward(where, handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y, format, stats,
             prologue):
    key, seen = _seen(where, handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y, format,
                      stats, prologue)
    arrays = None
    if seen is not None:
        arrays = (x, w, z, bias) + ((None, None) if prologue is None else prologue[:2]) + (y,) + \
            ((None, None) if stats is None else tuple(stats))
        if seen.pairs and _any_overlap(seen, arrays):
            seen = None                 # the full path: it raises, or runs the composition, as it always did
    if seen is not None:
        handle, fmt, y_shape = seen.handle, seen.fmt, seen.y_shape
    else:
        handle, _ = begin(handle, where, **_device_arrays(x, w, z, bias, y, stats, prologue))
        fmt = resolve_format(None, format)
        y_shape = _check_inputs(where, x, w, conv_desc, z, alpha1, alpha2, bias, activation_desc, y, fmt, stats,
                                prologue)
        if key is not None:
            _SEEN.remember(key, _Seen(handle, fmt, y_shape, x, w, z, bias, y, stats, prologue))
    if is_cuda_array(x):
        fused = _fused(handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y, format, fmt,
                       y_shape, stats, prologue, seen)
        if not isinstance(fused, str):
            return fused
    xin = x if prologue is None else _apply_prologue(handle, x, prologue, fmt)
    acc = convolution_forward(handle, xin, w, conv_desc, algo=algo, alpha=alpha1, format=format)   # fresh array
    if z is not None and alpha2 != 0:
        add_tensor(handle, alpha2, z, 1.0, acc)
    if bias is not None:
        add_tensor(handle, 1.0, bias, 1.0, acc, format=format)
    out = activation_forward(handle, activation_desc, acc, y=y)
    if stats is not None:
        _statistics(out, fmt, stats)
    return out


# ---- the validated-signature shortcut (host cost per call; docs/host_overhead.md) -----------------------------
# A CUDA call whose signature -- the primitive, the handle (by identity) and every setting of it a check or the
# algorithm choice reads, the descriptors' values, ``algo``, the format, alpha1 / alpha2 (type and value: 1.0 and
# True hash alike but the checks tell them apart), each array's type, shape, dtype, strides and device (None where
# absent), the stats container's type and length, and the conv_epilogue switch -- passed every check before skips
# the checks: they would pass again and give the same format and y shape.  What the checks read that the signature
# leaves out are the arrays' addresses (the statistics must overlap no input, nor each other; y overlapping an
# input runs the composition): every call still compares the byte spans of those arrays, from offsets the entry
# computed once, and any overlap sends the call down the full path, which raises or declines as it always did.
# The algorithm is still chosen at every call (forward_choice: the selector's caches), the fused kernel's rule
# looked up per chosen algorithm.  NumPy arrays, and anything that cannot key a dict, take the full path.
_SEEN = SeenCalls()
_E = []         # conv_epilogue, imported on the first CUDA call (a function-level import costs ~2 us per call)


def _epilogue():
    if not _E:
        from .cuda import conv_epilogue
        _E.append(conv_epilogue)
    return _E[0]


def _sig(a):
    return None if a is None else (type(a), a.shape, a.dtype, a.strides, a.data.device_id)


def _seen(where, handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y, format, stats,
          prologue):
    """(key, the remembered _Seen or None) of a call; (None, None) for a call the shortcut does not serve."""
    if type(x) is np.ndarray or not is_cuda_array(x):
        return None, None
    try:
        h = handle if handle is not None else resolve_handle(None, x)
        key = (where, h, h.device, h.math_type, h.deterministic, h.benchmark, h.workspace_limit, conv_desc, algo,
               format, type(alpha1), alpha1, type(alpha2), alpha2, type(activation_desc), activation_desc.mode,
               activation_desc.coef, _epilogue().ENABLED[0], _sig(x), _sig(w), _sig(z), _sig(bias), _sig(y),
               None if stats is None else (type(stats), len(stats), *map(_sig, stats)),
               None if prologue is None else (_sig(prologue[0]), _sig(prologue[1]), type(prologue[2]),
                                              prologue[2].mode, prologue[2].coef))
    except (AttributeError, TypeError, ValueError):
        return None, None
    return seen_plan(_SEEN, key)


# the arrays of a call, in _forward's order: x, w, z, bias, scale, shift, y, sum, sumsq
_INPUTS, _Y, _SUMS = (0, 1, 2, 3, 4, 5), 6, (7, 8)


class _Seen:
    """What a validated call settled (the resolved handle, the format, y's shape), each array's byte span as
    offsets from its address, and the (i, j) array pairs whose overlap the checks forbid or the fused path
    declines; ``reasons``: the fused kernel's rule per chosen algorithm name."""
    __slots__ = ("handle", "fmt", "y_shape", "offsets", "pairs", "reasons")

    def __init__(self, handle, fmt, y_shape, x, w, z, bias, y, stats, prologue):
        self.handle, self.fmt, self.y_shape, self.reasons = handle, fmt, y_shape, {}
        arrays = (x, w, z, bias) + ((None, None) if prologue is None else prologue[:2]) + (y,) + \
            ((None, None) if stats is None else tuple(stats))
        self.offsets = tuple(None if a is None or a.size == 0 else _offsets(a) for a in arrays)
        present = [i for i, off in enumerate(self.offsets) if off is not None]
        pairs = set()
        for i in present:
            if i in _SUMS:                              # the statistics against every other array
                pairs.update((min(i, j), max(i, j)) for j in present if j != i)
            elif i == _Y:                               # y against every input
                pairs.update((j, i) for j in present if j in _INPUTS)
        self.pairs = tuple(sorted(pairs))


def _offsets(a):
    """(first, last) byte offsets from ``a``'s address that it can touch (strides may be negative)."""
    lo = hi = 0
    for n, st in zip(a.shape, a.strides):
        if n > 1:
            if st < 0:
                lo += (n - 1) * st
            else:
                hi += (n - 1) * st
    return lo, hi + a.itemsize - 1


def _any_overlap(seen, arrays):
    spans = [None if off is None else (a.data.ptr + off[0], a.data.ptr + off[1])
             for a, off in zip(arrays, seen.offsets)]
    for i, j in seen.pairs:
        (a0, a1), (b0, b1) = spans[i], spans[j]
        if a0 <= b1 and b0 <= a1:
            return True
    return False


def _channel_view(a, ndim, fmt):
    """A (C,) or broadcast-form per-channel array, shaped to broadcast against ``fmt``-ordered data of ``ndim``."""
    axis = ndim - 1 if fmt is TensorFormat.NHWC else 1
    return a.reshape([-1 if i == axis else 1 for i in range(ndim)])


def _apply_prologue(handle, x, prologue, fmt):
    """x' = act_p(x * scale + shift): the product and sum in the compute type, rounded once to x's dtype."""
    scale, shift, pro_desc = prologue
    ct = compute_dtype(x.dtype)
    t = x.astype(ct) * _channel_view(scale, x.ndim, fmt) + _channel_view(shift, x.ndim, fmt)
    return activation_forward(handle, pro_desc, t.astype(x.dtype, copy=False))


def _statistics(y, fmt, stats):
    """stats[0][k] = sum of y over every axis but the channel's, stats[1][k] = the same of y**2, in the compute
    type (y as stored: its dtype's values, widened)."""
    axis = y.ndim - 1 if fmt is TensorFormat.NHWC else 1
    axes = tuple(i for i in range(y.ndim) if i != axis)
    yc = y.astype(stats[0].dtype)
    stats[0][...] = yc.sum(axis=axes)
    stats[1][...] = (yc * yc).sum(axis=axes)


# ---- the GPU fast path -----------------------------------------------------------------------------------------

def _span(a):
    """[first, last] byte addresses ``a`` can touch (its strides may be negative: a flipped view)."""
    lo, hi = _offsets(a)
    return a.data.ptr + lo, a.data.ptr + hi


def _overlap(a, b):
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a.size > 0 and b.size > 0 and a0 <= b1 and b0 <= a1


def _contiguous_1d(a):
    return a.size <= 1 or a.strides[-1] == a.itemsize


def _early(handle, x, w, conv_desc, algo, activation_desc, format, stats, prologue, seen=None):
    """(forward_choice's result, None) where the kernel may run, or (None, the reason the composition runs).
    ``seen``: the call's _Seen, whose per-algorithm rule it reads and fills."""
    E = _epilogue()
    pro_mode = None if prologue is None else prologue[2].mode.name
    why = E.early_reason(activation_desc.mode.name, pro_mode)
    if why is not None:
        return None, why
    if stats is not None and not all(_contiguous_1d(a) for a in stats):
        return None, "strided statistics arrays (the kernel writes contiguous (K,) arrays)"
    choice = forward_choice(handle, x, w, conv_desc, algo, format)
    algorithm, p = choice[2], choice[1].p
    if algorithm is None or p.N == 0:
        return None, "an empty batch (nothing to compute)"
    name = algorithm.algo.name
    if seen is not None and name in seen.reasons:
        why = seen.reasons[name]
    else:
        why = E.supports(name, p, activation_desc.mode.name, pro_mode)
        if seen is not None:
            seen.reasons[name] = why
    return (choice, None) if why is None else (None, why)


def _flat(xp, a):
    """``a`` as a contiguous 1-D array (itself where it is one)."""
    return a if a.ndim == 1 and _contiguous_1d(a) else xp.ascontiguousarray(a.reshape(-1))


def _fused(handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y, format, fmt, y_shape,
           stats=None, prologue=None, seen=None):
    """y from the fused kernel, or the reason (a str) the composition runs instead.  ``seen``: the call's _Seen
    (its overlaps already ruled out), or None."""
    choice, why = _early(handle, x, w, conv_desc, algo, activation_desc, format, stats, prologue, seen)
    if why is not None:
        return why
    h, plan, algorithm, xa, wa = choice
    p = plan.p
    mode = activation_desc.mode.name
    if z is not None and alpha2 == 0:
        z = None                            # the composition never reads it either
    z_is_y = False
    if y is not None and seen is None:
        others = (("x", x), ("w", w), ("bias", bias)) + \
            (() if prologue is None else (("scale", prologue[0]), ("shift", prologue[1])))
        for name, a in others:
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
    b = None if bias is None else _flat(xp, bias)
    pro = None if prologue is None else (_flat(xp, prologue[0]), _flat(xp, prologue[1]), prologue[2].mode.name)
    with h.activate():
        _epilogue().forward(p, xa, wa, algorithm.algo.name, plan.tf32, float(alpha1), zc, float(alpha2), b, mode,
                            activation_desc.coef, to_channels_first(y, fmt), z_is_y, pro, stats)
    return y


def fused_reason(handle, x, w, conv_desc, algo, z, alpha1, alpha2, bias, activation_desc, y=None, format=None, *,
                 stats=None):
    """None if convolution_bias_activation_forward with these arguments runs the fused GPU kernel, else why the
    composition runs (a sentence; the rules on y overlapping an input aside).  Nothing is computed (the algorithm
    choice may be, with handle.benchmark)."""
    if not is_cuda_array(x):
        return "not CUDA arrays (the composition is the CPU path)"
    return _early(handle, x, w, conv_desc, algo, activation_desc, format, stats, None)[1]


def scale_bias_activation_convolution_reason(handle, x, scale, shift, prologue_desc, w, conv_desc, algo=None,
                                             y=None, format=None, *, z=None, alpha1=1.0, alpha2=1.0, bias=None,
                                             activation_desc=None, stats=None):
    """None if scale_bias_activation_convolution_forward with these (same) arguments runs the fused GPU kernel,
    else why the composition runs (a sentence; the rules on y overlapping an input aside).  Nothing is computed."""
    if not is_cuda_array(x):
        return "not CUDA arrays (the composition is the CPU path)"
    return _early(handle, x, w, conv_desc, algo, activation_desc or _IDENTITY, format, stats,
                  (scale, shift, prologue_desc))[1]
