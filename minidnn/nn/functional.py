"""minidnn.nn.functional (``import minidnn.nn.functional as F``): PyTorch's functional API.

Names, argument order, defaults and semantics follow ``torch.nn.functional``.  Each op is an
autograd Function over a ``minidnn.backend`` primitive (see minidnn/nn/_functions/); the default
backend handle of the input's device is used (settings: ``minidnn.backends.cudnn``).

Double backward (create_graph=True, then backward again) works for every op here: piecewise-linear
ops differentiate their own backward, the others (normalizations, softmax, cross_entropy, smooth activations,
local_response_norm) run their fast first-order kernels normally and, under create_graph, re-express the gradient
in differentiable Tensor ops from the same formula.  Only SyncBatchNorm (minidnn.nn) is first order: differentiating
its gradient raises an error naming the op, never a silent zero.
"""
from __future__ import annotations

from .._amp_state import autocast_op
from ..backend.errors import ArgumentError
from ._functions import extra as _extra
from ._functions import linear as _linear
from ._functions.activation import (  # noqa: F401
    dropout,
    dropout1d,
    dropout2d,
    dropout3d,
    elu,
    gelu,
    hardtanh,
    leaky_relu,
    log_softmax,
    relu,
    relu6,
    sigmoid,
    silu,
    softmax,
    softplus,
    tanh,
)
from ._functions.bias import add_bias
from ._functions.conv import conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d  # noqa: F401
from ._functions.extra import *  # noqa: F401,F403  (its __all__ joins this one's below)
from ._functions.linear import Linear
from ._functions.loss import (  # noqa: F401
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cross_entropy,
    l1_loss,
    mse_loss,
    nll_loss,
    one_hot,
    smooth_l1_loss,
)
from ._functions.norm import batch_norm, group_norm, layer_norm, local_response_norm  # noqa: F401
from ._functions.pooling import (  # noqa: F401
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    max_pool1d,
    max_pool2d,
    max_pool3d,
)
from .functional_extra import interpolate, normalize, pad, scaled_dot_product_attention, upsample  # noqa: F401,E402

__all__ = [
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "linear",
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "batch_norm", "layer_norm", "group_norm", "local_response_norm",
    "dropout", "dropout1d", "dropout2d", "dropout3d",
    "relu", "relu6", "leaky_relu", "elu", "gelu", "silu", "sigmoid", "tanh", "hardtanh", "softplus",
    "softmax", "log_softmax",
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "one_hot", "pad",
    "interpolate", "upsample", "normalize", "scaled_dot_product_attention",
] + _extra.__all__


@autocast_op("linear")
def linear(input, weight, bias=None):
    """input @ weight.T + bias: input (*, in_features), weight (out_features, in_features), bias (out_features,)."""
    key = _linear.linear_key(input, weight, bias)       # GPU tensors: a seen signature skips the checks and apply's
    if key is not None:                                 # passes (docs/host_overhead.md round 24)
        y = _linear.linear_seen(input, weight, bias, key)
        if y is not None:
            return y
    if weight.ndim != 2 or input.shape[-1] != weight.shape[1]:
        raise ArgumentError(f"linear: input {tuple(input.shape)} has {input.shape[-1] if input.ndim else 0} features "
                         f"but weight {tuple(weight.shape)} expects {weight.shape[-1] if weight.ndim else '?'}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ArgumentError(f"linear: bias has shape {tuple(bias.shape)} but weight {tuple(weight.shape)} has "
                         f"{weight.shape[0]} outputs")
    if input.dtype == weight.dtype and (bias is None or bias.dtype == input.dtype):
        y = Linear.apply(input, weight, bias)           # one node; autocast's float32 weights get float32 dw
        _linear.remember_linear(key, y)
        return y
    y = input @ weight.T                                # mixed dtypes: PyTorch's promotion, by the Tensor ops
    return add_bias(y, bias, channels_last=True)
