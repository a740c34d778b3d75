"""Whole-tensor operations (cuDNN's cudnnAddTensor, cudnnOpTensor, cudnnScaleTensor, cudnnSetTensor,
cudnnTransformTensor, cudnnReduceTensor).

# y, a, c, x: any shape (N, C, *S) for the layout-aware ones; format="NHWC": (N, *S, C)
# b (add_tensor, op_tensor): same rank with every dim 1 or equal to y's/a's (e.g. bias (1, C, 1, 1)),
#                            or a 1-D (C,) per-channel vector (placed on the channel axis of ``format``)
# reduce_tensor: y has x's rank, every dim 1 (reduced) or equal to x's

These are pure NumPy/CuPy broadcasting; the functions exist so layers and notebooks can speak
cuDNN's vocabulary and get its validation and alpha/beta blending.
"""
from __future__ import annotations

import functools
import operator

import numpy as np

from ._common import SeenCalls, begin, blend, check_float, check_out, parse_enum, shape_str
from .cuda import act_kernels, norm_kernels  # add_arrays' and bias add's CUDA kernels (importing needs no GPU)
from .devices import is_cuda_array
from .errors import BadParamError, IdentityEnum
from .layout import TensorFormat, from_channels_first, in_memory_order, resolve_format, to_channels_first

__all__ = ["OpTensorOp", "ReduceTensorOp", "add_tensor", "op_tensor", "scale_tensor", "set_tensor",
           "transform_tensor", "reduce_tensor", "add_arrays", "settled_add_relu", "device_binary"]


def add_arrays(a, b):
    """``a + b`` for the engine (a residual add, the sum of two gradients of one tensor), in a's memory order.
    Two CuPy arrays of one shape, dtype and memory order (C-contiguous or channels-last) take one vectorised launch
    (act_kernels' ADD: summed in float, rounded once -- CuPy's bits; CuPy's own kernel runs 16-bit data at ~1/3 of
    the copy rate); anything else is NumPy's or CuPy's ``+`` (CuPy through in_memory_order: a channels-last sum
    stays channels-last)."""
    if type(a) is np.ndarray:
        return a + b
    if type(a) is type(b) and act_kernels.supports("ADD", a, b):       # (one shape, dtype and strides)
        return act_kernels.add(a, b)
    return in_memory_order(operator.add, a, b)


def settled_add_relu(a, b):
    """The one-launch (a + b, relu(a + b)) of two CuPy arrays of one shape, dtype and memory order, settled for a's
    signature (act_kernels.add_twin_plan: call it as ``plan(a, b)``; the sum has ``add_arrays``' bits, the ReLU the
    activation kernel's from that sum), for nn's speculative residual add (docs/fusion.md); None where add_arrays
    would not take act_kernels' ADD (NumPy arrays, other shapes, dtypes or strides)."""
    if type(a) is np.ndarray or type(a) is not type(b) or not act_kernels.supports("ADD", a, b):
        return None
    return act_kernels.add_twin_plan(a)


def device_binary(fn):
    """The CuPy form of a binary elementwise ``fn`` for ops.elementwise: ``add_arrays`` for ``operator.add``, else
    ``fn`` through in_memory_order (a channels-last result stays channels-last)."""
    return add_arrays if fn is operator.add else functools.partial(in_memory_order, fn)


class OpTensorOp(IdentityEnum):
    """cudnnOpTensorOp_t: the elementwise op of op_tensor, c = op(alpha1 * a, alpha2 * b) blended with beta * c; SQRT
    and NOT are unary (b ignored)."""
    ADD = "add"      # c = alpha1*a + alpha2*b
    MUL = "mul"      # c = (alpha1*a) * (alpha2*b)
    MIN = "min"
    MAX = "max"
    SQRT = "sqrt"    # unary: c = sqrt(alpha1*a); b ignored
    NOT = "not"      # unary logical not: c = 1 where alpha1*a == 0, else 0; b ignored


class ReduceTensorOp(IdentityEnum):
    """cudnnReduceTensorOp_t: the reduction of reduce_tensor over the dims where the output has size 1 (sum, product,
    min, max, max |x|, mean, the 1- and 2-norms, product of the nonzero entries)."""
    ADD = "add"
    MUL = "mul"
    MIN = "min"
    MAX = "max"
    AMAX = "amax"                    # max |x|
    AVG = "avg"
    NORM1 = "norm1"                  # sum |x|
    NORM2 = "norm2"                  # sqrt(sum x^2)
    MUL_NO_ZEROS = "mul_no_zeros"    # product of the non-zero entries


def _broadcast_operand(where, name, b, target_shape, format):
    """``b`` reshaped to broadcast against ``target_shape`` (cuDNN's rule: each dim 1 or equal)."""
    ndim = len(target_shape)
    if b.ndim == 1 and ndim >= 2:
        # a (C,) vector: the per-channel bias of a conv layer (cuDNN would want (1, C, 1, 1))
        axis = ndim - 1 if resolve_format(b, format) is TensorFormat.NHWC else 1
        if b.shape[0] != target_shape[axis]:
            raise BadParamError(f"{where}: {name} of shape {shape_str(b)} is a per-channel vector but the target "
                                f"{tuple(target_shape)} has {target_shape[axis]} channels on axis {axis}")
        shape = [1] * ndim
        shape[axis] = b.shape[0]
        return b.reshape(shape)
    if b.ndim != ndim or any(nb not in (1, nt) for nb, nt in zip(b.shape, target_shape)):
        raise BadParamError(f"{where}: {name} of shape {shape_str(b)} does not broadcast to {tuple(target_shape)}: "
                            "it needs the same rank with every dim 1 or equal (or a 1-D per-channel vector)")
    return b


def add_tensor(handle, alpha, b, beta, y, format=None):
    """y = alpha * b + beta * y in place (b broadcast, e.g. a bias), returns y."""
    key = None
    if type(y) is not np.ndarray and y is not None and type(b) is type(y):
        try:        # a GPU call whose signature passed every check before: straight to the bias kernel
            key = (handle, alpha, beta, format, y.shape, y.strides, y.dtype, b.shape, b.strides, b.dtype,
                   y.data.device_id, b.data.device_id)
            axis = _ADD_SEEN.get(key)
        except (TypeError, AttributeError):
            key = axis = None
        if axis is not None:        # (a 1-D bias as it is: no reshaped view a call)
            norm_kernels.bias_add(y, b if b.ndim == 1 else b.reshape(-1), axis, alpha, beta, out=y)
            return y
    where = "add_tensor"
    handle, xp = begin(handle, where, b=b, y=y)
    if y is None:
        raise BadParamError(f"{where}: y is required (it is updated in place)")
    check_float(where, b=b, y=y)
    bb = _broadcast_operand(where, "b", b, y.shape, format)
    if _gpu_bias_add(y, bb, alpha, beta, key):
        return y                # one launch (backend/cuda/norm_kernels.py: bias_add)
    return blend(xp.broadcast_to(bb, y.shape), alpha, beta, y)


# add_tensor's seen GPU calls that took the bias kernel: (handle, alpha, beta, format, y's and b's shapes, strides
# and dtypes, their devices) -> the channel axis.  The key holds everything the checks and the kernel's support test
# read (the kernel plans its own launch by alignment).
_ADD_SEEN = SeenCalls()


def _gpu_bias_add(y, bb, alpha, beta, key=None):
    """y = alpha * b + beta * y by the CUDA bias-add kernel where b is per-channel (one dim of y, the others 1)
    and y a C-contiguous CuPy array; False: the reference runs.  ``key``: remember the call (``_ADD_SEEN``)."""
    if not is_cuda_array(y):
        return False
    axes = [i for i, s in enumerate(bb.shape) if s != 1]
    if len(axes) != 1 or not norm_kernels.supports_bias(y, bb.reshape(-1), axes[0]):
        return False
    norm_kernels.bias_add(y, bb.reshape(-1), axes[0], alpha, beta, out=y)
    _ADD_SEEN.remember(key, axes[0])
    return True


_BINARY = {OpTensorOp.ADD: lambda xp, a, b: a + b, OpTensorOp.MUL: lambda xp, a, b: a * b,
           OpTensorOp.MIN: lambda xp, a, b: xp.minimum(a, b), OpTensorOp.MAX: lambda xp, a, b: xp.maximum(a, b)}
_UNARY = {OpTensorOp.SQRT: lambda xp, a: xp.sqrt(a), OpTensorOp.NOT: lambda xp, a: (a == 0).astype(a.dtype)}


def op_tensor(handle, op, a, b=None, alpha1=1.0, alpha2=1.0, beta=0.0, c=None, format=None):
    """c = op(alpha1 * a, alpha2 * b) + beta * c; SQRT and NOT use a only.  b broadcasts to a's shape."""
    where = "op_tensor"
    handle, xp = begin(handle, where, a=a, b=b, c=c)
    op = parse_enum(where, OpTensorOp, op, "op")
    check_float(where, a=a, b=b)
    if op in _BINARY:
        if b is None:
            raise BadParamError(f"{where}: op {op.name} needs b")
        bb = _broadcast_operand(where, "b", b, a.shape, format)
    check_out(where, "c", c, a.shape, a.dtype, beta)
    if op in _UNARY:
        value = _UNARY[op](xp, alpha1 * a)
    else:
        value = xp.broadcast_to(_BINARY[op](xp, alpha1 * a, alpha2 * bb), a.shape)
    return blend(value, 1, beta, c, a.dtype)


def scale_tensor(handle, y, alpha):
    """y *= alpha in place; returns y."""
    begin(handle, "scale_tensor", y=y)
    y *= alpha
    return y


def set_tensor(handle, y, value):
    """Every element of y = value, in place; returns y."""
    begin(handle, "set_tensor", y=y)
    y[...] = value
    return y


def transform_tensor(handle, x, src_format, dst_format, alpha=1.0, beta=0.0, y=None):
    """Change layout, e.g. NCHW -> NHWC (any rank >= 3): y = alpha * x re-indexed + beta * y.

    ``x`` is indexed in ``src_format``; the result is indexed in ``dst_format`` and C-contiguous, so
    its memory order really is ``dst_format`` (the point of the operation).
    """
    where = "transform_tensor"
    handle, xp = begin(handle, where, x=x, y=y)
    src, dst = resolve_format(x, src_format), resolve_format(x, dst_format)
    view = from_channels_first(to_channels_first(x, src), dst)
    check_out(where, "y", y, view.shape, x.dtype, beta)
    return blend(xp.ascontiguousarray(view), alpha, beta, y, x.dtype)


_REDUCE = {
    ReduceTensorOp.ADD: lambda xp, x, ax: x.sum(axis=ax, keepdims=True),
    ReduceTensorOp.MUL: lambda xp, x, ax: x.prod(axis=ax, keepdims=True),
    ReduceTensorOp.MIN: lambda xp, x, ax: x.min(axis=ax, keepdims=True),
    ReduceTensorOp.MAX: lambda xp, x, ax: x.max(axis=ax, keepdims=True),
    ReduceTensorOp.AMAX: lambda xp, x, ax: xp.abs(x).max(axis=ax, keepdims=True),
    ReduceTensorOp.AVG: lambda xp, x, ax: x.mean(axis=ax, keepdims=True),
    ReduceTensorOp.NORM1: lambda xp, x, ax: xp.abs(x).sum(axis=ax, keepdims=True),
    ReduceTensorOp.NORM2: lambda xp, x, ax: xp.sqrt((x * x).sum(axis=ax, keepdims=True)),
    ReduceTensorOp.MUL_NO_ZEROS: lambda xp, x, ax: xp.where(x == 0, 1, x).prod(axis=ax, keepdims=True),
}


def reduce_tensor(handle, op, x, alpha=1.0, beta=0.0, y=None, out_shape=None):
    """y = alpha * reduce_op(x over the dims where y is 1) + beta * y.

    The reduced dims are read from y's shape (cuDNN's rule) or, without y, from ``out_shape``;
    with neither, every dim is reduced (y has shape (1, ..., 1)).
    """
    where = "reduce_tensor"
    handle, xp = begin(handle, where, x=x, y=y)
    op = parse_enum(where, ReduceTensorOp, op, "op")
    check_float(where, x=x)
    target = tuple(y.shape) if y is not None else (tuple(out_shape) if out_shape is not None else (1,) * x.ndim)
    if out_shape is not None and y is not None and tuple(out_shape) != target:
        raise BadParamError(f"{where}: out_shape {tuple(out_shape)} disagrees with y's shape {target}")
    if len(target) != x.ndim or any(t not in (1, n) for t, n in zip(target, x.shape)):
        raise BadParamError(f"{where}: output shape {target} must have x's rank ({tuple(x.shape)}) with every dim "
                            "1 (reduced) or equal to x's")
    axes = tuple(a for a, (t, n) in enumerate(zip(target, x.shape)) if t == 1 and n != 1)
    if op in (ReduceTensorOp.MIN, ReduceTensorOp.MAX, ReduceTensorOp.AMAX) and any(x.shape[a] == 0 for a in axes):
        raise BadParamError(f"{where}: {op.name} over an empty dim of x {tuple(x.shape)} has no value")
    check_out(where, "y", y, target, x.dtype, beta)
    value = _REDUCE[op](xp, x, axes).reshape(target)
    return blend(value, alpha, beta, y, x.dtype)
