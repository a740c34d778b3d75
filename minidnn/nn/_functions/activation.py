"""Pointwise activations, softmax / log-softmax and dropout.

# x, y, dy, dx: any shape (elementwise);  softmax: one distribution along ``dim``

Every activation with an ActivationMode (relu too: one path for all, so the GPU fast path of the
activation primitive serves every one of them) is ``Activation``: forward activation_forward,
backward ``ActivationGrad`` = activation_backward(x, dy).  ActivationGrad is linear in dy, so its
derivative wrt dy is itself; its derivative wrt x needs f'' which the primitive does not have: for
the piecewise-linear modes (relu, relu6, leaky_relu, hardtanh, clipped relu) f'' = 0 and double
backward works; for the smooth ones (elu, gelu, silu, sigmoid, tanh, softplus) it raises.

Dropout draws its mask from minidnn's per-device generator (the one ``minidnn.manual_seed`` seeds),
through the dropout primitive; its backward (multiply by the same mask) is its own derivative.
"""
from __future__ import annotations

from ..._amp_state import autocast_op
import functools

import warnings

from ... import backend as B
from ...autograd import Function
from ...tensor import Tensor
from ...creation import _generator
from ._util import check_tensor, first_order_grads, handle_for, wrap
from ...backend.errors import ArgumentError, DimensionError

__all__ = ["relu", "relu6", "leaky_relu", "elu", "gelu", "silu", "sigmoid", "tanh", "hardtanh", "softplus",
           "softmax", "log_softmax", "dropout", "dropout1d", "dropout2d", "dropout3d"]

_Mode = B.ActivationMode
_PIECEWISE_LINEAR = {_Mode.RELU, _Mode.RELU6, _Mode.LEAKY_RELU, _Mode.HARDTANH, _Mode.CLIPPED_RELU,
                     _Mode.IDENTITY}


class Activation(Function):
    @staticmethod
    def forward(ctx, x, desc):
        ctx.desc = desc
        ctx.save_for_backward(x)
        return wrap(B.activation_forward(handle_for(x), desc, x.data))

    @staticmethod
    def backward(ctx, gy):
        x, = ctx.saved_tensors
        return ActivationGrad.apply(gy, x, ctx.desc), None


class ActivationGrad(Function):
    """dx = f'(x) * dy."""

    @staticmethod
    def forward(ctx, dy, x, desc):
        ctx.desc = desc
        ctx.save_for_backward(x)
        return wrap(B.activation_backward(handle_for(x), desc, None, dy.data, x.data))

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        if ctx.needs_input_grad[1] and ctx.desc.mode not in _PIECEWISE_LINEAR:
            raise RuntimeError(f"{ctx.desc.mode.name.lower()}: double backward wrt the input is not implemented "
                               "(the activation primitive has no second derivative); it is for the piecewise-linear "
                               "activations relu, relu6, leaky_relu, hardtanh")
        gdy = ActivationGrad.apply(g, x, ctx.desc) if ctx.needs_input_grad[0] else None
        return gdy, None, None      # f'' = 0 almost everywhere for the piecewise-linear modes


@functools.lru_cache(maxsize=None)
def _descriptor(mode, coef):
    """Descriptors are immutable and validated on construction: build each (mode, coef) once."""
    return B.ActivationDescriptor(mode, coef)


def _activation(op, x, mode, coef=None):
    check_tensor(op, "input", x)
    return Activation.apply(x, _descriptor(mode, coef))


# ``inplace`` is accepted for PyTorch compatibility; the result is always a new tensor.
def relu(input, inplace=False):
    return _activation("relu", input, _Mode.RELU)


def relu6(input, inplace=False):
    return _activation("relu6", input, _Mode.RELU6)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return _activation("leaky_relu", input, _Mode.LEAKY_RELU, negative_slope)


def elu(input, alpha=1.0, inplace=False):
    return _activation("elu", input, _Mode.ELU, alpha)


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ArgumentError(f"gelu: approximate={approximate!r} must be 'none' or 'tanh'")
    return _activation("gelu", input, _Mode.GELU if approximate == "none" else _Mode.GELU_TANH)


def silu(input, inplace=False):
    return _activation("silu", input, _Mode.SWISH, 1.0)


def sigmoid(input):
    return _activation("sigmoid", input, _Mode.SIGMOID)


def tanh(input):
    return _activation("tanh", input, _Mode.TANH)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """clamp(x, min_val, max_val); the primitive's modes cover the symmetric, [0, c] and [0, 6] cases,
    other ranges use the Tensor clamp."""
    if min_val > max_val:
        raise ArgumentError(f"hardtanh: min_val={min_val} must not exceed max_val={max_val}")
    if min_val == -max_val and max_val > 0:
        return _activation("hardtanh", input, _Mode.HARDTANH, max_val)
    if min_val == 0 and max_val > 0:
        return _activation("hardtanh", input, _Mode.CLIPPED_RELU, max_val)
    check_tensor("hardtanh", "input", input)
    return input.clamp(min_val, max_val)


@autocast_op("softplus")
def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta * x)) / beta.  PyTorch switches to x where beta * x > threshold; the primitive's
    stable logaddexp form differs from that by at most exp(-threshold) / beta (2e-9 by default)."""
    return _activation("softplus", input, _Mode.SOFTPLUS, beta)


# ---- softmax -----------------------------------------------------------------------------------------

class Softmax(Function):
    @staticmethod
    def forward(ctx, x, dim, algo):
        y = B.softmax_forward(handle_for(x), algo, None, x.data, axis=dim)
        ctx.y, ctx.dim, ctx.algo = y, dim, algo     # backward needs only the output
        ctx.save_for_backward(x)                    # (kept to wire the double-backward guard)
        return wrap(y)

    @staticmethod
    def backward(ctx, gy):
        x, = ctx.saved_tensors
        dx = B.softmax_backward(handle_for(x), ctx.algo, None, ctx.y, gy.data, axis=ctx.dim)
        return first_order_grads(ctx.algo.name.lower() + "_softmax", [dx], gy, x)[0], None, None


def _softmax_dim(op, x, dim):
    if dim is None:
        # PyTorch's legacy implicit choice, with its warning
        dim = 0 if x.ndim in (0, 1, 3) else 1
        warnings.warn(f"Implicit dimension choice for {op} has been deprecated. Change the call to include dim=X "
                      "as an argument.", stacklevel=3)
    if not -max(x.ndim, 1) <= dim < max(x.ndim, 1):
        raise DimensionError(f"{op}: Dimension out of range (expected to be in range of [{-max(x.ndim, 1)}, "
                             f"{max(x.ndim, 1) - 1}], but got {dim}) for input of shape {tuple(x.shape)}")
    return dim % max(x.ndim, 1)


def _softmax(op, x, dim, dtype, algo):
    check_tensor(op, "input", x)
    if dtype is not None:
        x = x.to(dtype=dtype)
    dim = _softmax_dim(op, x, dim)
    if x.ndim == 0:
        return Softmax.apply(x.reshape(1), 0, algo).reshape(())
    return Softmax.apply(x, dim, algo)


@autocast_op("softmax")
def softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax("softmax", input, dim, dtype, B.SoftmaxAlgorithm.ACCURATE)


@autocast_op("log_softmax")
def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax("log_softmax", input, dim, dtype, B.SoftmaxAlgorithm.LOG)


# ---- dropout ---------------------------------------------------------------------------------------------

class _SeededDropoutDescriptor(B.DropoutDescriptor):
    """A dropout descriptor that draws from minidnn's generator for the device (seeded by manual_seed)
    instead of a private one, so dropout masks follow ``minidnn.manual_seed`` like ``rand`` does."""

    __slots__ = ()

    def generator(self, dev_spec):
        return _generator(B.device(dev_spec))


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, desc):
        y, mask = B.dropout_forward(handle_for(x), desc, x.data)
        ctx.desc, ctx.mask = desc, mask
        return wrap(y)

    @staticmethod
    def backward(ctx, gy):
        return DropoutMask.apply(gy, ctx.desc, ctx.mask), None


class DropoutMask(Function):
    """dy * mask / (1 - p): linear in dy with a fixed mask, so it is its own derivative."""

    @staticmethod
    def forward(ctx, dy, desc, mask):
        ctx.desc, ctx.mask = desc, mask
        return wrap(B.dropout_backward(handle_for(dy), desc, dy.data, mask))

    @staticmethod
    def backward(ctx, g):
        return DropoutMask.apply(g, ctx.desc, ctx.mask), None, None


def _check_p(op, p):
    if not 0.0 <= p <= 1.0:
        raise ArgumentError(f"{op}: dropout probability has to be between 0 and 1, but got {p}")


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero each element with probability p and scale the rest by 1/(1-p) (identity when not training)."""
    check_tensor("dropout", "input", input)
    _check_p("dropout", p)
    if not training or p == 0.0:
        return input
    return Dropout.apply(input, _SeededDropoutDescriptor(p))


def _channel_dropout(op, x, p, training, nd):
    """Zero whole channels: one mask value per (sample, channel), broadcast over the spatial dims."""
    check_tensor(op, "input", x)
    _check_p(op, p)
    if x.ndim not in (nd + 1, nd + 2):
        raise ArgumentError(f"{op}: expected a {nd + 1}-D or {nd + 2}-D input, got shape {tuple(x.shape)}")
    if not training or p == 0.0:
        return x
    lead = x.ndim - nd
    xp = x._xp()
    ones = Tensor._from_array(xp.ones(tuple(x.shape[:lead]) + (1,) * nd, dtype=x.dtype))
    return x * Dropout.apply(ones, _SeededDropoutDescriptor(p))


def dropout1d(input, p=0.5, training=True, inplace=False):
    return _channel_dropout("dropout1d", input, p, training, 1)


def dropout2d(input, p=0.5, training=True, inplace=False):
    return _channel_dropout("dropout2d", input, p, training, 2)


def dropout3d(input, p=0.5, training=True, inplace=False):
    return _channel_dropout("dropout3d", input, p, training, 3)
