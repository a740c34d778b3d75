"""Pointwise activations, softmax / log-softmax and dropout.

# x, y, dy, dx: any shape (elementwise);  softmax: one distribution along ``dim``

Every activation with an ActivationMode is the one ``Activation`` Function of minidnn/ops/activation.py
(forward activation_forward, backward ActivationGrad = activation_backward(x, dy), and a table of second
derivatives so every gradient can be differentiated again); ``x.relu()``, ``minidnn.relu`` and ``F.relu`` are
the same Function.

Dropout draws its mask from minidnn's per-device generator (the one ``minidnn.manual_seed`` seeds),
through the dropout primitive; its backward (multiply by the same mask) is its own derivative.
"""
from __future__ import annotations

import os

import numpy as np

from ... import backend as B
from ..._amp_state import autocast_op
from ...autograd import Function, FunctionCtx, _state
from ...backend import activation as _act_primitive
from ...backend._common import SeenCalls
from ...backend.devices import array_module, is_floating
from ...backend.errors import ArgumentError
from ...backend.handle import configured_default_handle
from ...creation import _generator
from ...ops.activation import Activation, ActivationGrad, Softmax, _descriptor, log_softmax, softmax  # noqa: F401  # noqa: F401
from ...ops.activation import activation as _ops_activation
from ...ops.activation import relu as _ops_relu
from ...ops.activation import sigmoid as _ops_sigmoid
from ...ops.activation import tanh as _ops_tanh
from ...tensor import Tensor
from ._util import check_tensor, handle_for, wrap

__all__ = ["relu", "relu6", "leaky_relu", "elu", "gelu", "silu", "sigmoid", "tanh", "hardtanh", "softplus",
           "softmax", "log_softmax", "dropout", "dropout1d", "dropout2d", "dropout3d"]

_Mode = B.ActivationMode


def _activation(op, x, mode, coef=None):
    check_tensor(op, "input", x)
    return _ops_activation(op, x, mode, coef)


# ``inplace`` is accepted for PyTorch compatibility; the result is always a new tensor.
def relu(input, inplace=False):
    """max(x, 0) elementwise (F.relu), the same op as minidnn.relu and Tensor.relu; the gradient is 1 where x > 0, 0
    elsewhere (NaN passes through). ``inplace`` is accepted for compatibility; the result is always a new tensor."""
    if RELU_FAST[0] and type(input) is Tensor and type(input.data) is not np.ndarray:
        producer = input.grad_fn
        if producer is not None and _state.grad_enabled and (rule := _fuse_relu_rule(producer)) is not None:
            # ops' relu written out with its lookups done once (round 25b): a floating x asks the producer's rule
            # (an integer x: ops' relu, its integer path); where the rule declines, the plain ReLU -- ops' steps
            if not FUSED_DIRECT[0] or input.data.dtype.kind in "iu":
                return _ops_relu(input)
            fused = rule(producer, input)
            return fused if fused is not None else _ops_activation("relu", input, _Mode.RELU)
        sig = _relu_sig(input.data)
        entry = _RELU_SEEN.get(sig) if sig is not None else None
        if entry is None:
            y = _ops_relu(input)
            if sig is not None:
                _relu_remember(input, sig, y)
            return y
        y = _relu_remembered(input, entry)
        if y is not None:
            return y
        y = _ops_relu(input)
        if not _state.anomaly:      # a cleared table or a changed kernel setting: the plan learnt again
            _relu_remember(input, sig, y)
        return y
    return _ops_relu(input)


# ReLU of a GPU tensor on a seen signature (docs/host_overhead.md round 20).  The full path is ops' relu: a fusion rule
# of the producer, else Activation.apply -> activation_forward -> its validated-call table (_SEEN) -> the kernels'
# plan.  After a full-path call that ran the plain Activation on the kernels, the signature -- x's shape, strides,
# dtype and device -- is remembered with the primitive's key and plan; the same signature again launches the plan and
# records the node Activation.apply records (the same fields, the same saved tensor and version), skipping apply's
# passes and the primitive's two keys.  Checked per call, not keyed: the producer's fusion rule (a producer offering
# one takes the full path, which asks it), anomaly mode (the full path records a trace), and the primitive's table
# still holding the plan under the key (a cleared table or a changed kernel setting re-validates through the full
# path, which learns the plan again).  Switch: RELU_FAST[0] = False, or MINIDNN_RELU_FAST=0 at import.
RELU_FAST = [os.environ.get("MINIDNN_RELU_FAST", "1") != "0"]
FUSED_DIRECT = [os.environ.get("MINIDNN_RELU_FUSED_DIRECT", "1") != "0"]     # round 25b: the rule asked directly
_RELU_SEEN = SeenCalls()
_RELU = _descriptor(_Mode.RELU, None)
_new = object.__new__


def _relu_sig(xd):
    try:
        return xd.shape, xd.strides, xd.dtype, xd.data.device_id
    except AttributeError:
        return None


def _fuse_relu_rule(node):
    """The producer's consumer-fusion rule for a ReLU (ops._core.fusion_rule's lookup), or None."""
    return getattr(getattr(node, "_fn_cls", None) or type(node), "fuse_relu", None)


def _relu_remember(x, sig, y):
    node = y.grad_fn
    if (node is not None and getattr(node, "_fn_cls", None) is not Activation) or not is_floating(sig[2]):
        return      # a fused node recorded it, or the integer path ran
    xd = x.data
    key = _act_primitive._gpu_key("fwd", configured_default_handle(xd), _RELU, xd, None, None, 1.0, 0.0, None)
    plan = _act_primitive._SEEN.get(key) if key is not None else None
    if plan is not None:
        _RELU_SEEN.remember(sig, (key, plan, ((xd.shape, xd.dtype),)))
    else:
        _RELU_SEEN.pop(sig, None)       # (a stale entry goes: the kernels no longer take this call)


def _relu_remembered(x, entry):
    """relu(x) as the full path computes and records it on a remembered signature (the caller checked the producer's
    fusion rule), or None (nothing was done)."""
    key, plan, meta = entry
    if _state.anomaly or _act_primitive._SEEN.get(key) is not plan:
        return None
    xd = x.data
    y = plan(xd)
    if not (_state.grad_enabled and x.requires_grad):
        return Tensor._from_array(y)
    ctx = _new(FunctionCtx)         # what Activation.apply(x, desc) records
    ctx._fn_cls = Activation
    ctx.needs_input_grad = (True, False)
    ctx.next_edges = (x._edge(), None)
    ctx._input_meta = meta + (None,)
    ctx._n_inputs = 2
    ctx.desc = _RELU
    ctx.saved = (x,)
    ctx.versions = (x._version,)
    ctx._out_meta = ((y.shape, y.dtype, array_module(y)),)
    ctx.num_outputs = 1
    return Function.output(ctx, y)


def relu6(input, inplace=False):
    """min(max(x, 0), 6) elementwise (F.relu6; the primitive's RELU6 mode). ``inplace`` is accepted; the result is a new
    tensor."""
    return _activation("relu6", input, _Mode.RELU6)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    """x where x > 0, else negative_slope * x (F.leaky_relu; the primitive's LEAKY_RELU mode). ``inplace`` is accepted;
    the result is a new tensor."""
    return _activation("leaky_relu", input, _Mode.LEAKY_RELU, negative_slope)


def elu(input, alpha=1.0, inplace=False):
    """x where x > 0, else alpha * (exp(x) - 1) (F.elu; the primitive's ELU mode). ``inplace`` is accepted; the result
    is a new tensor."""
    return _activation("elu", input, _Mode.ELU, alpha)


def gelu(input, approximate="none"):
    """x * Phi(x) with Phi the standard normal CDF (F.gelu): the exact erf form, or with ``approximate='tanh'`` 0.5 x (1
    + tanh(sqrt(2/pi) (x + 0.044715 x^3))); any other value raises ArgumentError."""
    if approximate not in ("none", "tanh"):
        raise ArgumentError(f"gelu: approximate={approximate!r} must be 'none' or 'tanh'")
    return _activation("gelu", input, _Mode.GELU if approximate == "none" else _Mode.GELU_TANH)


def silu(input, inplace=False):
    """x * sigmoid(x), also called swish (F.silu; the primitive's SWISH mode with beta 1). ``inplace`` is accepted; the
    result is a new tensor."""
    return _activation("silu", input, _Mode.SWISH, 1.0)


def sigmoid(input):
    """1 / (1 + exp(-x)) elementwise (F.sigmoid), the same op as minidnn.sigmoid and Tensor.sigmoid; gradient g * y * (1
    - y)."""
    return _ops_sigmoid(input)


def tanh(input):
    """The hyperbolic tangent elementwise (F.tanh), the same op as minidnn.tanh and Tensor.tanh; gradient g * (1 -
    y^2)."""
    return _ops_tanh(input)


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
    # PyTorch's hardtanh_backward passes the gradient only strictly inside (min_val, max_val) (and through NaN),
    # clamp's at the bounds too: clamp the values, route the gradient by the strict mask.
    from ...ops import isnan, where
    xd = input.detach()
    inside = ((xd > min_val) & (xd < max_val)) | isnan(xd)
    return where(inside, input, xd.clamp(min_val, max_val))


@autocast_op("softplus")
def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta * x)) / beta, and x itself (gradient 1) where beta * x > threshold, as PyTorch."""
    y = _activation("softplus", input, _Mode.SOFTPLUS, beta)
    from ...ops import where
    return where(input.detach() * beta > threshold, input, y)


# ---- softmax: minidnn/ops/activation.py (one Function for x.softmax, minidnn.softmax and F.softmax) ---------


# ---- dropout ---------------------------------------------------------------------------------------------

class _SeededDropoutDescriptor(B.DropoutDescriptor):
    """A dropout descriptor that draws from minidnn's generator for the device (seeded by manual_seed)
    instead of a private one, so dropout masks follow ``minidnn.manual_seed`` like ``rand`` does."""

    __slots__ = ()

    def generator(self, dev_spec):
        return _generator(dev_spec)         # (the engine lookup parses the device)


_SEEDED: dict = {}      # p -> its _SeededDropoutDescriptor (immutable; one per p, not one per call: host cost)


def _seeded(p):
    desc = _SEEDED.get(p)
    if desc is None:
        if len(_SEEDED) >= 256:
            _SEEDED.clear()
        desc = _SEEDED[p] = _SeededDropoutDescriptor(p)
    return desc


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
    """dy * mask / (1 - p): linear in dy with a fixed mask, so it is its own derivative.  ``mask`` is the primitive's
    reserve, passed through untouched: a bool array, or on a GPU a PhiloxReserve (the record of the numbers the
    forward drew; the backward kernel draws them again), which every later backward reads the same way."""

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
    return Dropout.apply(input, _seeded(p))


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
    return x * Dropout.apply(ones, _seeded(p))


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of a (N, C, L) or (C, L) input with probability ``p`` and scale the kept ones by 1/(1-p)
    (torch.nn.functional.dropout1d): one mask value per (sample, channel), shared by the length. Identity when not
    ``training`` or p = 0; ``inplace`` is accepted for compatibility, the result is a new tensor."""
    return _channel_dropout("dropout1d", input, p, training, 1)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of a (N, C, H, W) or (C, H, W) input with probability ``p`` and scale the kept ones by
    1/(1-p) (torch.nn.functional.dropout2d): one mask value per (sample, channel), shared by the spatial positions.
    Identity when not ``training`` or p = 0; ``inplace`` is accepted for compatibility, the result is a new tensor."""
    return _channel_dropout("dropout2d", input, p, training, 2)


def dropout3d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of a (N, C, D, H, W) or (C, D, H, W) input with probability ``p`` and scale the kept ones by
    1/(1-p) (torch.nn.functional.dropout3d): one mask value per (sample, channel), shared by the spatial positions.
    Identity when not ``training`` or p = 0; ``inplace`` is accepted for compatibility, the result is a new tensor."""
    return _channel_dropout("dropout3d", input, p, training, 3)
