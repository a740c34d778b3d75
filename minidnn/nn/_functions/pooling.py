"""Max and average pooling (1-D to 3-D) and adaptive pooling.

# x: (N, C, *in)  (or unbatched (C, *in))   y: (N, C, *out)
# out[d] = floor((in[d] + 2*padding[d] - kernel[d]) / stride[d]) + 1        (ceil with ceil_mode)

Pool is one Function over pooling_forward / pooling_backward.  Max pooling keeps the primitive's
argmax (the winning tap of each window, one byte per output) so backward does not search again.
Average pooling's backward is linear in dy and independent of x, so it is its own Function whose
derivative wrt dy is the average pooling forward: average pooling has double backward; max pooling
is first order only.

Adaptive pooling uses the primitive when the input size is a multiple of the output size (uniform
bins: kernel = stride = in / out); otherwise PyTorch's bins start = floor(i*in/out),
end = ceil((i+1)*in/out), one slice per output cell, composed from differentiable Tensor ops.
"""
from __future__ import annotations

import os

import numpy as np

from ... import backend as B
from ...autograd import Function, FunctionCtx, _state, is_grad_enabled
from ...backend import devices as _devices
from ...backend import pooling as _pool_primitive
from ...backend._common import SeenCalls
from ...backend.devices import array_module
from ...backend.errors import ArgumentError
from ...backend.layout import to_channels_first
from ...ops import stack
from ...tensor import Tensor
from ._util import batched, check_tensor, descriptor, handle_for, ntuple, plain_setting, wrap

__all__ = ["max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
           "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d"]


class MaxPool(Function):
    @staticmethod
    def forward(ctx, x, desc):
        ctx.desc = desc
        y, argmax = B.pooling_forward(handle_for(x), desc, x.data, return_argmax=True)
        ctx.argmax = argmax
        ctx.save_for_backward(x)
        return wrap(y)

    @staticmethod
    def backward(ctx, gy):
        x, = ctx.saved_tensors
        if not is_grad_enabled():       # first order: MaxPoolBackward's forward without its apply (records nothing)
            return wrap(B.pooling_backward(handle_for(x), ctx.desc, None, gy.data, x.data, argmax=ctx.argmax)), None
        return MaxPoolBackward.apply(gy, x, ctx.desc, ctx.argmax), None


class MaxPoolBackward(Function):
    """dx = dy scattered to each window's winner (the argmax the forward kept): linear in dy, so its own
    derivative gathers g at the winners; zero with respect to x (max is piecewise linear)."""

    @staticmethod
    def forward(ctx, dy, x, desc, argmax):
        ctx.desc, ctx.argmax, ctx.x_shape = desc, argmax, tuple(x.shape)
        return wrap(B.pooling_backward(handle_for(x), desc, None, dy.data, x.data, argmax=argmax))

    @staticmethod
    def backward(ctx, g):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        idx = wrap(_winners(g._xp(), ctx.argmax, ctx.x_shape, ctx.desc))
        gy = g.reshape(ctx.x_shape[:2] + (-1,)).gather(2, idx).reshape(tuple(ctx.argmax.shape))
        return gy, None, None, None


def _winners(xp, argmax, x_shape, desc):
    """(N, C, prod(O)) int64: the flat spatial index into x of each window's winning element (argmax holds its
    row-major tap index inside the window)."""
    nd = len(x_shape) - 2
    window, padding, stride = desc.resolve(nd)
    dilation = desc.dilation if isinstance(desc.dilation, tuple) else (desc.dilation,) * nd
    a = xp.asarray(argmax).astype(np.int64)
    taps = []
    for k in reversed(window):              # unravel the row-major tap index
        taps.append(a % k)
        a = a // k
    taps.reverse()
    flat = 0
    for d in range(nd):
        o = xp.arange(argmax.shape[2 + d], dtype=np.int64).reshape((-1,) + (1,) * (nd - 1 - d))
        flat = flat * x_shape[2 + d] + (o * stride[d] - padding[d] + taps[d] * dilation[d])
    return flat.reshape(tuple(argmax.shape[:2]) + (-1,))


class AvgPool(Function):
    @staticmethod
    def forward(ctx, x, desc):
        ctx.desc = desc
        ctx.x_shape, ctx.dtype = tuple(x.shape), x.dtype
        ctx.channels_last = x.ndim >= 3 and B.memory_format(x.data) is B.TensorFormat.NHWC
        return wrap(B.pooling_forward(handle_for(x), desc, x.data))

    @staticmethod
    def backward(ctx, gy):
        if not is_grad_enabled():       # first order: AvgPoolBackward's forward without its apply
            if AVGPOOL_FAST[0] and type(gd := gy.data) is not np.ndarray:
                if not ctx.channels_last:
                    return _avg_backward_seen(gy, gd, ctx.desc, ctx.x_shape), None
                if AVGPOOL_CL_BWD[0]:
                    return _avg_backward_seen_cl(gy, gd, ctx.desc, ctx.x_shape), None
            return AvgPoolBackward.forward(_FIRST_ORDER, gy, ctx.desc, ctx.x_shape, ctx.channels_last), None
        return AvgPoolBackward.apply(gy, ctx.desc, ctx.x_shape, ctx.channels_last), None


_SHAPE_ONLY: dict = {}


def _shape_only(xp, a):
    """A 0-d array of ``a``'s module, dtype and device, made once: what x's broadcast view stands on where only its
    shape and dtype are read (its value never is)."""
    dev = _devices.device_of(a)
    key = (xp.__name__, a.dtype, dev)
    z = _SHAPE_ONLY.get(key)
    if z is None:
        with _devices.device_guard(dev):        # on a's device, whichever is current
            z = _SHAPE_ONLY[key] = xp.zeros((), dtype=a.dtype)
    return z


class AvgPoolBackward(Function):
    """dx = (d avgpool / d x)^T dy: linear in dy, so its own derivative is the average pooling forward.
    ``channels_last``: x was channels-last in memory, and so is dx (computed through NHWC-indexed views)."""

    @staticmethod
    def forward(ctx, dy, desc, x_shape, channels_last=False):
        ctx.desc = desc
        xp = dy._xp()
        # The primitive reads x only for its shape and dtype (average pooling ignores the values): a broadcast
        # scalar costs no memory, and one kept per array type, dtype and device costs no allocation or memset launch
        # a call (its value is never read).
        x_like = xp.broadcast_to(_shape_only(xp, dy.data), x_shape)
        if channels_last:
            last = B.channels_last_perm(len(x_shape))
            dx = B.pooling_backward(handle_for(dy), desc, None, dy.data.transpose(last), x_like.transpose(last),
                                    format="NHWC")
            return wrap(xp.ascontiguousarray(dx).transpose(B.channels_first_perm(dx.ndim)))
        return wrap(B.pooling_backward(handle_for(dy), desc, None, dy.data, x_like))

    @staticmethod
    def backward(ctx, g):
        return AvgPool.apply(g, ctx.desc), None, None, None


class _Unrecorded:
    """The ctx a first-order backward hands a backward Function's forward when it calls it without ``apply`` (grad
    is off there, so apply would record nothing): the attributes that forward sets go nowhere."""
    __slots__ = ()

    def __setattr__(self, name, value):
        pass


_FIRST_ORDER = _Unrecorded()


# A pooling call whose settings passed _pool's checks before, for an input of the same shape and dtype, reuses that
# call's descriptor and goes straight to apply (the checks below read nothing else: x's type, dtype and shape, the
# settings).  Settings key only as plain ints or tuples of ints (stride also None), ceil_mode only as a bool: 1.0 or
# a list hash like valid values but the checks treat them differently, so they keep the full path (as conv's seen
# calls, round 10 of docs/host_overhead.md).  Unbatched inputs are not remembered (the key's shape is the batched one).
_SEEN_POOL = SeenCalls()


def _pool_key(op, x, mode, kernel_size, stride, padding, ceil_mode, dilation):
    if type(x) is not Tensor or type(ceil_mode) is not bool:
        return None
    k, p, d = plain_setting(kernel_size), plain_setting(padding), plain_setting(dilation)
    s = None if stride is None else plain_setting(stride)
    if k is None or p is None or d is None or (s is None and stride is not None):
        return None
    xd = x.data
    return op, mode, xd.shape, xd.dtype, k, s, p, d, ceil_mode


def _pool_call(x, desc):
    """(MaxPool or AvgPool).apply(x, desc) of checked settings, on the seen paths where they apply."""
    if desc.mode.is_max:
        if MAXPOOL_FAST[0] and type(x.data) is not np.ndarray:
            y = _max_pool_seen(x, desc)
            if y is not None:
                return y
        return MaxPool.apply(x, desc)
    return _avg_pool_call(x, desc)


def _pool(op, nd, x, mode, kernel_size, stride, padding, ceil_mode, dilation=1):
    key = _pool_key(op, x, mode, kernel_size, stride, padding, ceil_mode, dilation)
    desc = _SEEN_POOL.get(key) if key is not None else None
    if desc is not None:
        return _pool_call(x, desc)
    check_tensor(op, "input", x)
    x, unbatched = batched(op, x, nd)
    kernel = ntuple(kernel_size, nd, op, "kernel_size")
    # PyTorch: stride None (or an empty list) means stride = kernel_size
    stride = kernel if stride is None or (not isinstance(stride, int) and len(stride) == 0) \
        else ntuple(stride, nd, op, "stride")
    padding = ntuple(padding, nd, op, "padding")
    dilation = ntuple(dilation, nd, op, "dilation")
    if any(k < 1 for k in kernel) or any(s < 1 for s in stride) or any(d < 1 for d in dilation):
        raise ArgumentError(f"{op}: kernel_size {kernel}, stride {stride} and dilation {dilation} must be positive")
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ArgumentError(f"{op}: pad should be at most half of the kernel size: padding {padding}, kernel "
                            f"{kernel}")
    span = tuple(d * (k - 1) + 1 for d, k in zip(dilation, kernel))
    # PyTorch's output size; ceil mode may let the one window run past the padded end
    for n, p, k, s in zip(x.shape[2:], padding, span, stride):
        out = (-(-(n + 2 * p - k) // s) if ceil_mode else (n + 2 * p - k) // s) + 1
        if ceil_mode and (out - 1) * s >= n + p:
            out -= 1
        if out < 1:
            raise ArgumentError(f"{op}: Output size is too small: input {tuple(x.shape)}, kernel {kernel}, padding "
                                f"{padding}, stride {stride}, dilation {dilation}, ceil_mode={ceil_mode}")
    desc = descriptor(B.PoolingDescriptor, mode, kernel, padding, stride, ceil_mode, dilation)
    if not unbatched and key is not None:
        _SEEN_POOL.remember(key, desc)
    y = (MaxPool if desc.mode.is_max else AvgPool).apply(x, desc)
    return y.squeeze(0) if unbatched else y


# Max pooling of a GPU tensor on a seen signature (docs/host_overhead.md round 24).  The full path is MaxPool.apply ->
# pooling_forward -> its validated-call table (_SEEN) -> the kernels' plan.  After a full-path call whose primitive
# call the table remembers, the signature -- the descriptor, x's shape, dtype, strides and device -- is remembered
# with the primitive's key and entry; the same signature again runs the plan and records the node MaxPool.apply
# records (the same fields, saved tensor and version, argmax), skipping apply's passes, the handle and the primitive's
# key.  Checked per call: anomaly mode (the full path records a trace) and that the primitive's table still holds the
# entry under the key (a cleared table or changed kernel settings re-validate).  Switch: MAXPOOL_FAST[0] = False, or
# MINIDNN_MAXPOOL_FAST=0 at import.
MAXPOOL_FAST = [os.environ.get("MINIDNN_MAXPOOL_FAST", "1") != "0"]
_MAXPOOL_SEEN = SeenCalls()
_new = object.__new__


def _max_pool_sig(desc, xd):
    try:
        return desc, xd.shape, xd.dtype, xd.strides, xd.data.device_id
    except AttributeError:
        return None


def _max_pool_seen(x, desc):
    """MaxPool.apply(x, desc) as the full path computes and records it on a remembered signature, or None (nothing
    was done; the caller runs apply and this learns the signature)."""
    xd = x.data
    sig = _max_pool_sig(desc, xd)
    if sig is None or _state.anomaly:
        return None
    entry = _MAXPOOL_SEEN.get(sig)
    if entry is False:          # the primitive's kernels do not take this call (its reference runs): the full path
        return None
    if entry is None or _pool_primitive._SEEN.get(entry[0]) is not entry[1]:
        return _max_pool_learn(x, desc, sig)        # (again after a cleared table or changed kernel settings)
    fmt, plan = entry[1]
    y, argmax = _pool_primitive._gpu_forward_result(plan(to_channels_first(xd, fmt)), fmt, True)
    if not (_state.grad_enabled and x.requires_grad):
        return Tensor._from_array(y)
    ctx = _pool_node(MaxPool, x, desc, y)     # what MaxPool.apply(x, desc) records
    ctx.argmax = argmax
    ctx.saved = (x,)
    ctx.versions = (x._version,)
    return Function.output(ctx, y)


def _pool_node(cls, x, desc, y):
    """The node ``cls.apply(x, desc)`` records for a pooling output y of x (requiring grad), but for the fields its
    forward keeps (the seen paths set those)."""
    xd = x.data
    ctx = _new(FunctionCtx)
    ctx._fn_cls = cls
    ctx.needs_input_grad = (True, False)
    ctx.desc = desc
    ctx.next_edges = (x._edge(), None)
    ctx._input_meta = ((xd.shape, xd.dtype), None)
    ctx._n_inputs = 2
    ctx._out_meta = ((y.shape, y.dtype, array_module(y)),)
    ctx.num_outputs = 1
    return ctx


def _max_pool_learn(x, desc, sig):
    """The full path (MaxPool.apply), then the signature remembered with the primitive's key and entry where its
    table holds the call (the kernels' plan ran), else as False (the full path from then on)."""
    y = MaxPool.apply(x, desc)
    xd = x.data
    pkey = _pool_primitive._gpu_key("fwd", handle_for(x), desc, None, 1.0, 0.0, True, None, xd, None, None, None)
    seen = _pool_primitive._SEEN.get(pkey) if pkey is not None else None
    _MAXPOOL_SEEN.remember(sig, False if seen is None else (pkey, seen))
    return y


# Average pooling of a GPU tensor on a seen signature, forward and first-order backward (docs/host_overhead.md round
# 25b), as max pooling's above.  Forward: after a full-path AvgPool.apply whose primitive call the table remembers,
# the signature (descriptor, x's shape, dtype, strides, device) is remembered with the primitive's key and entry and
# what AvgPool.forward keeps (x's shape, dtype, channels-last flag: all read from the signature's fields); the same
# signature again runs the plan and records AvgPool.apply's node.  Backward (AvgPoolBackward.forward's first-order
# call, NCHW x only): the primitive's key reads the handle's device (dy's: handle_for), the descriptor, dy's shape,
# dtype, strides and device, and x's stand-in -- a broadcast scalar of dy's dtype and device, of x's shape, so its
# strides are zeros --; the signature holds the descriptor (by identity: the entry keeps it), x's shape and dy's
# fields.  Checked per call: anomaly mode (forward) and that the primitive's table still holds the entry under the
# key; else the full path, which learns again.  Adaptive average / max pooling with uniform bins: its checks read the
# op, x's shape and dtype and output_size (int or tuple of ints only), so a seen (op, shape, dtype, output_size) reuses
# the descriptor and goes to the calls above (unbatched inputs keep the full path).
# Switch: AVGPOOL_FAST[0] = False, or MINIDNN_AVGPOOL_FAST=0 at import (all three).
AVGPOOL_FAST = [os.environ.get("MINIDNN_AVGPOOL_FAST", "1") != "0"]
# The backward of a channels-last x on a seen signature too (host round 26b: the full path's NHWC views of dy and
# of x's stand-in, the primitive's key and handle): AVGPOOL_CL_BWD[0] = True, or MINIDNN_AVGPOOL_CL_BWD=1 at import
# (off by default until tests/nn/test_host25b_seen.py expects the channels-last backward off the full path).
AVGPOOL_CL_BWD = [os.environ.get("MINIDNN_AVGPOOL_CL_BWD", "0") != "0"]
_AVGPOOL_SEEN = SeenCalls()
_AVGPOOL_BWD_SEEN = SeenCalls()
_SEEN_ADAPTIVE = SeenCalls()


def _avg_pool_call(x, desc):
    """AvgPool.apply(x, desc), on the seen path where it applies."""
    if AVGPOOL_FAST[0] and type(x.data) is not np.ndarray:
        y = _avg_pool_seen(x, desc)
        if y is not None:
            return y
    return AvgPool.apply(x, desc)


def _avg_pool_seen(x, desc):
    """AvgPool.apply(x, desc) as the full path computes and records it on a remembered signature, or None (nothing
    was done; the caller runs apply) -- learning the signature through apply where it is not yet remembered."""
    xd = x.data
    sig = _max_pool_sig(desc, xd)
    if sig is None or _state.anomaly:
        return None
    entry = _AVGPOOL_SEEN.get(sig)
    if entry is False:
        return None
    if entry is None or _pool_primitive._SEEN.get(entry[0]) is not entry[1]:
        y = AvgPool.apply(x, desc)
        pkey = _pool_primitive._gpu_key("fwd", handle_for(x), desc, None, 1.0, 0.0, False, None, xd, None, None, None)
        seen = _pool_primitive._SEEN.get(pkey) if pkey is not None else None
        _AVGPOOL_SEEN.remember(sig, False if seen is None else (
            pkey, seen, tuple(xd.shape), xd.ndim >= 3 and B.memory_format(xd) is B.TensorFormat.NHWC))
        return y
    pkey, (fmt, plan), x_shape, channels_last = entry
    y = _pool_primitive._gpu_forward_result(plan(to_channels_first(xd, fmt)), fmt, False)
    if not (_state.grad_enabled and x.requires_grad):
        return Tensor._from_array(y)
    ctx = _pool_node(AvgPool, x, desc, y)     # what AvgPool.apply(x, desc) records
    ctx.x_shape, ctx.dtype, ctx.channels_last = x_shape, xd.dtype, channels_last
    return Function.output(ctx, y)


def _avg_backward_seen(gy, gd, desc, x_shape):
    """AvgPoolBackward.forward's first-order dx of an NCHW x (see above)."""
    try:
        sig = (id(desc), x_shape, gd.shape, gd.strides, gd.dtype, gd.data.device_id)
    except AttributeError:
        sig = None
    entry = _AVGPOOL_BWD_SEEN.get(sig) if sig is not None else None
    if entry is not None and entry[0] is desc and _pool_primitive._SEEN.get(entry[1]) is entry[2]:
        fmt, plan = entry[2]
        return wrap(_pool_primitive.from_channels_first(plan(to_channels_first(gd, fmt), None), fmt))
    dx = AvgPoolBackward.forward(_FIRST_ORDER, gy, desc, x_shape, False)
    if sig is not None:
        xp = gy._xp()
        x_like = xp.broadcast_to(_shape_only(xp, gd), x_shape)      # the stand-in AvgPoolBackward passed
        pkey = _pool_primitive._gpu_key("bwd", handle_for(gy), desc, None, 1.0, 0.0, None, None, x_like, None, gd,
                                        None)
        seen = _pool_primitive._SEEN.get(pkey) if pkey is not None else None
        if seen is not None:
            _AVGPOOL_BWD_SEEN.remember(sig, (desc, pkey, seen))
        else:
            _AVGPOOL_BWD_SEEN.pop(sig, None)
    return dx


def _avg_backward_seen_cl(gy, gd, desc, x_shape):
    """AvgPoolBackward.forward's first-order dx of a channels-last x: the same primitive plan on dy's NHWC view, the
    result made contiguous and seen channels-first as that forward does.  The signature is _avg_backward_seen's with
    "NHWC" after it (the primitive's key reads dy's and x's stand-in's NHWC views: determined by the same fields)."""
    try:
        sig = (id(desc), x_shape, gd.shape, gd.strides, gd.dtype, gd.data.device_id, "NHWC")
    except AttributeError:
        sig = None
    entry = _AVGPOOL_BWD_SEEN.get(sig) if sig is not None else None
    if entry is not None and entry[0] is desc and _pool_primitive._SEEN.get(entry[1]) is entry[2]:
        fmt, plan = entry[2]
        dx = _pool_primitive.from_channels_first(plan(to_channels_first(gd.transpose(entry[3]), fmt), None), fmt)
        return wrap(gy._xp().ascontiguousarray(dx).transpose(entry[4]))
    dx = AvgPoolBackward.forward(_FIRST_ORDER, gy, desc, x_shape, True)
    if sig is not None:
        xp = gy._xp()
        last = B.channels_last_perm(len(x_shape))
        x_like = xp.broadcast_to(_shape_only(xp, gd), x_shape)      # the stand-in AvgPoolBackward passed
        pkey = _pool_primitive._gpu_key("bwd", handle_for(gy), desc, "NHWC", 1.0, 0.0, None, None,
                                        x_like.transpose(last), None, gd.transpose(last), None)
        seen = _pool_primitive._SEEN.get(pkey) if pkey is not None else None
        if seen is not None:
            _AVGPOOL_BWD_SEEN.remember(sig, (desc, pkey, seen, last, B.channels_first_perm(len(x_shape))))
        else:
            _AVGPOOL_BWD_SEEN.pop(sig, None)
    return dx


def _max_pool(op, nd, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    if return_indices:
        raise NotImplementedError(f"{op}: return_indices=True is not supported (max_unpool is not implemented)")
    return _pool(op, nd, x, B.PoolingMode.MAX, kernel_size, stride, padding, ceil_mode, dilation)


def _avg_pool(op, nd, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None):
    if divisor_override is not None:
        raise NotImplementedError(f"{op}: divisor_override={divisor_override} is not supported")
    mode = B.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING if count_include_pad \
        else B.PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING
    return _pool(op, nd, x, mode, kernel_size, stride, padding, ceil_mode)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over ``kernel_size`` windows of a (N, C, L) or (C, L) input (F.max_pool1d): ``stride`` defaults to
    kernel_size, ``padding`` (at most half the kernel) counts as -inf, ``dilation`` spaces the taps, ``ceil_mode``
    rounds the output size up. The gradient goes to each window's first maximum; ``return_indices=True`` raises
    NotImplementedError."""
    return _max_pool("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over kernel_size windows (stride defaults to kernel_size); padding counts as -inf."""
    return _max_pool("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over ``kernel_size`` windows of a (N, C, D, H, W) or (C, D, H, W) input (F.max_pool3d): ``stride`` defaults
    to kernel_size, ``padding`` (at most half the kernel) counts as -inf, ``dilation`` spaces the taps, ``ceil_mode``
    rounds the output size up. The gradient goes to each window's first maximum; ``return_indices=True`` raises
    NotImplementedError."""
    return _max_pool("max_pool3d", 3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Average over ``kernel_size`` windows of a (N, C, L) or (C, L) input (F.avg_pool1d): ``stride`` defaults to
    kernel_size, ``padding`` (at most half the kernel) pads zeros that ``count_include_pad`` counts in the divisor;
    ``ceil_mode`` rounds the output size up (a window may not start in the right padding)."""
    return _avg_pool("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """Mean over kernel_size windows; ``count_include_pad`` counts zero padding in the divisor."""
    return _avg_pool("avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """Average over ``kernel_size`` windows of a (N, C, D, H, W) or (C, D, H, W) input (F.avg_pool3d): ``stride``
    defaults to kernel_size, ``padding`` (at most half the kernel) pads zeros that ``count_include_pad`` counts in the
    divisor; ``ceil_mode`` rounds the output size up (a window may not start in the right padding). ``divisor_override``
    is not supported (NotImplementedError)."""
    return _avg_pool("avg_pool3d", 3, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


# ---- adaptive pooling ------------------------------------------------------------------------------------

def _adaptive(op, nd, x, output_size, is_max):
    key = None
    if AVGPOOL_FAST[0] and type(x) is Tensor and (o := plain_setting(output_size)) is not None:
        xd = x.data
        key = (op, xd.shape, xd.dtype, o)
        desc = _SEEN_ADAPTIVE.get(key)
        if desc is not None:        # uniform bins, checked before for this input shape and dtype
            return _pool_call(x, desc)
    check_tensor(op, "input", x)
    x, unbatched = batched(op, x, nd)
    in_sizes = tuple(x.shape[2:])
    if output_size is None or isinstance(output_size, int):
        output_size = (output_size,) * nd
    out = tuple(n if o is None else int(o) for o, n in zip(output_size, in_sizes))     # None keeps that size
    if len(out) != nd or any(o < 1 for o in out):
        raise ArgumentError(f"{op}: output_size={output_size!r} must be {nd} positive ints (or None)")
    if all(n % o == 0 for n, o in zip(in_sizes, out)):
        k = tuple(n // o for n, o in zip(in_sizes, out))
        mode = B.PoolingMode.MAX if is_max else B.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING
        desc = descriptor(B.PoolingDescriptor, mode, k, 0, k)
        if key is not None and not unbatched:
            _SEEN_ADAPTIVE.remember(key, desc)
        y = (MaxPool if is_max else AvgPool).apply(x, desc)
    else:
        y = _adaptive_bins(x, in_sizes, out, is_max)
    return y.squeeze(0) if unbatched else y


def _adaptive_bins(x, in_sizes, out, is_max):
    """Non-uniform bins, one output cell at a time (slow, but only for sizes that do not divide)."""
    axes = tuple(range(2, 2 + len(out)))

    def bins(n, o):
        return [(i * n // o, -(-(i + 1) * n // o)) for i in range(o)]

    def cells(prefix, dim):
        if dim == len(out):
            window = x[(slice(None), slice(None)) + prefix]
            return _window_max(window) if is_max else window.mean(axis=axes)
        # children are (N, C, *out[dim+1:]): stacking on axis 2 puts this dim in its place
        return stack([cells(prefix + (slice(a, b),), dim + 1) for a, b in bins(in_sizes[dim], out[dim])], axis=2)
    return cells((), 0)


def _window_max(window):
    """(N, C, *w) -> (N, C): the max of each window and a gradient to one winner, chosen as PyTorch's CPU max pooling
    kernels choose it (``val > maxval || isnan(val)`` in scan order): the first maximum, or the last NaN."""
    flat = window.reshape(tuple(window.shape[:2]) + (-1,))
    xp = flat._xp()
    xd = flat.data
    nan = xp.isnan(xd)
    last_nan = xd.shape[-1] - 1 - xp.argmax(nan[..., ::-1], axis=-1)
    first_max = xp.argmax(xp.where(nan, -xp.inf, xd), axis=-1)
    idx = xp.where(nan.any(axis=-1), last_nan, first_max)[..., None]
    return flat.gather(2, wrap(idx.astype(np.int64))).squeeze(2)


def adaptive_avg_pool1d(input, output_size):
    """Average pooling of a (N, C, L) or (C, L) input to the fixed output size ``output_size`` (an int or a 1-tuple,
    None keeps that input size) (F.adaptive_avg_pool1d): bin i spans [floor(i * n / out), ceil((i + 1) * n / out)),
    PyTorch's bins, so bins may overlap when n is not a multiple of out."""
    return _adaptive("adaptive_avg_pool1d", 1, input, output_size, is_max=False)


def adaptive_avg_pool2d(input, output_size):
    """Average pooling to a fixed output size (H_out, W_out); None keeps that input size."""
    return _adaptive("adaptive_avg_pool2d", 2, input, output_size, is_max=False)


def adaptive_max_pool1d(input, output_size, return_indices=False):
    """Max pooling of a (N, C, L) or (C, L) input to the fixed output size ``output_size`` (an int or a 1-tuple, None
    keeps that input size) (F.adaptive_max_pool1d), over PyTorch's bins [floor(i * n / out), ceil((i + 1) * n / out));
    the gradient goes to each bin's first maximum. ``return_indices=True`` raises NotImplementedError."""
    if return_indices:
        raise NotImplementedError("adaptive_max_pool1d: return_indices=True is not supported")
    return _adaptive("adaptive_max_pool1d", 1, input, output_size, is_max=True)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """Max pooling of a (N, C, H, W) or (C, H, W) input to the fixed output size ``output_size`` (an int or a 2-tuple,
    None keeps that input size) (F.adaptive_max_pool2d), over PyTorch's bins [floor(i * n / out), ceil((i + 1) * n /
    out)); the gradient goes to each bin's first maximum. ``return_indices=True`` raises NotImplementedError."""
    if return_indices:
        raise NotImplementedError("adaptive_max_pool2d: return_indices=True is not supported")
    return _adaptive("adaptive_max_pool2d", 2, input, output_size, is_max=True)
