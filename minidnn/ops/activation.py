"""Pointwise activations: ONE Function per op over the backend's activation primitive, whatever the binding
(``x.sigmoid()``, ``minidnn.sigmoid(x)`` and ``F.sigmoid(x)`` are the same function: bitwise-identical results).

# x, y, dy, dx: any shape (elementwise)

    forward   y  = activation_forward(x)                          (backend primitive: fast paths register there)
    backward  dx = ActivationGrad(dy, x) = f'(x) * dy              (activation_backward primitive)
    and again d(dx)/d(dy) = ActivationGrad(g, x);  d(dx)/dx = g * dy * f''(x)   (the table below, in Tensor ops,
                                                                               so it can be differentiated again)

The table of second derivatives (coef: ELU alpha, SWISH / SOFTPLUS beta; s = sigmoid, t = tanh,
phi = the standard normal density):

    relu, relu6, leaky_relu, hardtanh, clipped relu, identity   0 (piecewise linear)
    sigmoid     s (1 - s) (1 - 2 s)
    tanh        -2 t (1 - t^2)
    elu         x > 0: 0;  x <= 0: alpha e^x
    softplus    beta s(beta x) (1 - s(beta x))
    swish       beta s (1 - s) (2 + beta x (1 - 2 s)),  s = s(beta x)
    gelu        phi(x) (2 - x^2)
    gelu_tanh   with u = k (x + c x^3), u' = k (1 + 3 c x^2), u'' = 6 k c x, k = sqrt(2 / pi), c = 0.044715:
                (1 - t^2) u' + x/2 ((1 - t^2) u'' - 2 t (1 - t^2) u'^2),  t = tanh(u)
"""
from __future__ import annotations

import functools
import math
import warnings

from .. import backend as B
from .._amp_state import autocast_op
from ..autograd import Function, _state, is_grad_enabled
from ..backend.devices import is_floating as _is_floating
from ..backend.errors import DimensionError, DTypeError
from ..backend.handle import configured_default_handle
from ..tensor import Tensor, _wrap, get_default_dtype
from ._core import fusion_rule

__all__ = ["Activation", "ActivationGrad", "activation", "activation_grad", "relu", "sigmoid", "tanh", "Softmax",
           "softmax", "log_softmax"]

_Mode = B.ActivationMode
_PIECEWISE_LINEAR = {_Mode.RELU, _Mode.RELU6, _Mode.LEAKY_RELU, _Mode.HARDTANH, _Mode.CLIPPED_RELU, _Mode.IDENTITY}
_K = math.sqrt(2.0 / math.pi)
_C = 0.044715


def _second_derivative(mode, coef, x):
    """f''(x) as Tensor ops (differentiable again); None for the piecewise-linear modes (0 almost everywhere)."""
    if mode in _PIECEWISE_LINEAR:
        return None
    if mode is _Mode.SIGMOID:
        s = x.sigmoid()
        return s * (1.0 - s) * (1.0 - 2.0 * s)
    if mode is _Mode.TANH:
        t = x.tanh()
        return -2.0 * t * (1.0 - t * t)
    if mode is _Mode.ELU:
        return (x <= 0).to(dtype=x.dtype) * x.clamp(max=0.0).exp() * coef
    if mode is _Mode.SOFTPLUS:
        s = (x * coef).sigmoid()
        return s * (1.0 - s) * coef
    if mode is _Mode.SWISH:
        s = (x * coef).sigmoid()
        return s * (1.0 - s) * (2.0 + x * coef * (1.0 - 2.0 * s)) * coef
    if mode is _Mode.GELU:
        phi = (x * x * -0.5).exp() * (1.0 / math.sqrt(2.0 * math.pi))
        return phi * (2.0 - x * x)
    if mode is _Mode.GELU_TANH:
        u1 = (1.0 + 3.0 * _C * x * x) * _K
        t = ((x + _C * x * x * x) * _K).tanh()
        sech2 = 1.0 - t * t
        return sech2 * u1 + x * 0.5 * (sech2 * (6.0 * _K * _C) * x - 2.0 * t * sech2 * u1 * u1)
    raise NotImplementedError(f"{mode.name.lower()}: no second derivative in the table")


class Activation(Function):
    """y = f(x) through ``activation_forward``; dx = ActivationGrad(dy, x)."""

    @staticmethod
    def forward(ctx, x, desc):
        ctx.desc = desc
        ctx.save_for_backward(x)
        return _wrap(B.activation_forward(configured_default_handle(x.data), desc, x.data))

    @staticmethod
    def backward(ctx, gy):
        x, = ctx.saved_tensors
        if not _state.grad_enabled and (dx := B.activation.backward_seen(ctx.desc, x.data, gy.data)) is not None:
            return _wrap(dx), None      # a GPU signature the primitive ran before (host round 25b)
        return activation_grad(gy, x, ctx.desc), None


def activation_grad(dy, x, desc):
    """dx = f'(x) * dy: an ActivationGrad node under create_graph (differentiable again), else the primitive
    directly (first order: no Function recorded)."""
    if is_grad_enabled():
        return ActivationGrad.apply(dy, x, desc)
    return _activation_grad(dy, x, desc)


def _activation_grad(dy, x, desc):
    return _wrap(B.activation_backward(configured_default_handle(x.data), desc, None, dy.data, x.data))


class ActivationGrad(Function):
    """dx = f'(x) * dy through ``activation_backward``; linear in dy, and f'' from the table for x."""

    @staticmethod
    def forward(ctx, dy, x, desc):
        ctx.desc = desc
        ctx.save_for_backward(dy, x)
        return _activation_grad(dy, x, desc)

    @staticmethod
    def backward(ctx, g):
        dy, x = ctx.saved_tensors
        gdy = ActivationGrad.apply(g, x, ctx.desc) if ctx.needs_input_grad[0] else None
        gx = None
        if ctx.needs_input_grad[1]:
            d2 = _second_derivative(ctx.desc.mode, ctx.desc.coef, x)
            gx = None if d2 is None else g * dy * d2
        return gdy, gx, None


@functools.lru_cache(maxsize=None)
def _descriptor(mode, coef):
    """Descriptors are immutable and validated on construction: build each (mode, coef) once."""
    return B.ActivationDescriptor(mode, coef)


def activation(op, x, mode, coef=None):
    """``mode`` applied to the Tensor ``x`` (an integer tensor is first cast to the default float dtype, as in
    PyTorch)."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}(): argument 'input' must be Tensor, not {type(x).__name__}")
    if not _is_floating(x.dtype):
        if x.dtype.kind == "c":
            raise DTypeError(f"{op}: complex input (dtype {x.dtype}) is not supported")
        x = x.to(dtype=get_default_dtype())
    return Activation.apply(x, _descriptor(mode, coef))


def relu(input):
    """max(x, 0) elementwise (torch.relu / F.relu / Tensor.relu); an integer tensor stays integer, as in PyTorch."""
    if isinstance(input, Tensor) and input.data.dtype.kind in "iu":
        from .elementwise import relu as integer_relu  # no gradient to carry: the plain array form
        return integer_relu(input)
    producer = getattr(input, "grad_fn", None)
    if producer is not None and _state.grad_enabled:
        # consumer fusion: the op that made ``input`` may record relu(input) as one fused node (batch norm + ReLU:
        # its ``fuse_relu`` rule, docs/fusion.md); None runs the plain ReLU
        rule = fusion_rule(producer, "fuse_relu")
        fused = rule(producer, input) if rule is not None else None
        if fused is not None:
            return fused
    return activation("relu", input, _Mode.RELU)


def sigmoid(input):
    """1 / (1 + exp(-x)) elementwise (torch.sigmoid / F.sigmoid / Tensor.sigmoid)."""
    return activation("sigmoid", input, _Mode.SIGMOID)


def tanh(input):
    """tanh(x) elementwise (torch.tanh / F.tanh / Tensor.tanh)."""
    return activation("tanh", input, _Mode.TANH)


# ---- softmax -----------------------------------------------------------------------------------------

class Softmax(Function):
    @staticmethod
    def forward(ctx, x, dim, algo):
        y = B.softmax_forward(configured_default_handle(x.data), algo, None, x.data, axis=dim)
        ctx.y, ctx.dim, ctx.algo = y, dim, algo     # backward needs only the output
        ctx.save_for_backward(x)                    # (double backward recomputes y from x)
        return _wrap(y)

    @staticmethod
    def backward(ctx, gy):
        x, = ctx.saved_tensors
        if is_grad_enabled():           # create_graph: the same formula in differentiable ops, y recomputed from x
            y = Softmax.apply(x, ctx.dim, ctx.algo)
            if ctx.algo is B.SoftmaxAlgorithm.LOG:
                return gy - y.exp() * gy.sum(ctx.dim, keepdim=True), None, None
            return y * (gy - (gy * y).sum(ctx.dim, keepdim=True)), None, None
        dx = B.softmax_backward(configured_default_handle(x.data), ctx.algo, None, ctx.y, gy.data, axis=ctx.dim)
        return _wrap(dx), None, None


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
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}(): argument 'input' must be Tensor, not {type(x).__name__}")
    if dtype is not None:
        x = x.to(dtype=dtype)
    dim = _softmax_dim(op, x, dim)
    if x.ndim == 0:
        return Softmax.apply(x.reshape(1), 0, algo).reshape(())
    return Softmax.apply(x, dim, algo)


@autocast_op("softmax")
def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """exp(x) / sum(exp(x)) along ``dim`` (torch.softmax / F.softmax / Tensor.softmax); ``dtype`` casts first."""
    return _softmax("softmax", input, dim, dtype, B.SoftmaxAlgorithm.ACCURATE)


@autocast_op("log_softmax")
def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """x - logsumexp(x) along ``dim`` (torch.log_softmax / F.log_softmax / Tensor.log_softmax)."""
    return _softmax("log_softmax", input, dim, dtype, B.SoftmaxAlgorithm.LOG)
