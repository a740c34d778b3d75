"""``minidnn.nn.init``: PyTorch's weight initialisations, same formulas, fan modes and gains.

Every function fills its tensor in place under ``no_grad`` and returns it.  Random values come from the
minidnn generator of the tensor's device, so ``minidnn.manual_seed`` makes initialisation reproducible.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from ..autograd import no_grad
from ..creation import randn

__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "zeros_", "ones_", "eye_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "default_layer_init_",
]

_LINEAR_FNS = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def calculate_gain(nonlinearity: str, param=None) -> float:
    """The recommended gain for ``nonlinearity``: linear/conv/sigmoid 1, tanh 5/3, relu sqrt(2),
    leaky_relu sqrt(2 / (1 + slope^2)) (slope ``param``, default 0.01), selu 3/4."""
    if nonlinearity in _LINEAR_FNS or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    """(fan_in, fan_out) of a weight laid out (out_features, in_features, *kernel): the kernel's spatial
    size multiplies both."""
    if tensor.dim() < 2:
        raise ValueError(f"Fan in and fan out can not be computed for tensor with fewer than 2 dimensions "
                         f"(shape {tuple(tensor.shape)})")
    receptive_field = int(np.prod(tensor.shape[2:])) if tensor.dim() > 2 else 1
    return tensor.shape[1] * receptive_field, tensor.shape[0] * receptive_field


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor, a: float = 0.0, b: float = 1.0):
    with no_grad():
        return tensor.uniform_(a, b)


def normal_(tensor, mean: float = 0.0, std: float = 1.0):
    with no_grad():
        return tensor.normal_(mean, std)


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0):
    """Normal(mean, std) restricted to [a, b], by rejection: redraw the out-of-range values until none is
    left (PyTorch uses the inverse CDF; the distribution is the same)."""
    lo, hi = (a - mean) / std, (b - mean) / std
    accept = 0.5 * (math.erf(hi / math.sqrt(2)) - math.erf(lo / math.sqrt(2)))
    if accept < 1e-4:
        raise ValueError(f"trunc_normal_: [a, b] = [{a}, {b}] holds only {accept:.2e} of Normal({mean}, {std}); "
                         "choose bounds nearer the mean")
    with no_grad():
        z = randn(*tensor.shape, dtype=np.float64, device=tensor.device).data
        bad = (z < lo) | (z > hi)
        while bool(bad.any()):
            fresh = randn(int(bad.sum()), dtype=np.float64, device=tensor.device).data
            z[bad] = fresh
            bad = (z < lo) | (z > hi)
        tensor.copy_((z * std + mean).clip(a, b).astype(tensor.dtype))
    return tensor


def constant_(tensor, val: float):
    with no_grad():
        return tensor.fill_(val)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def eye_(tensor):
    """The identity in a 2-D tensor (Linear layers keep their input)."""
    if tensor.dim() != 2:
        raise ValueError(f"Only tensors with 2 dimensions are supported, got shape {tuple(tensor.shape)}")
    with no_grad():
        xp = tensor._xp()
        tensor.copy_(xp.eye(*tensor.shape, dtype=tensor.dtype))
    return tensor


def xavier_uniform_(tensor, gain: float = 1.0):
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a)


def xavier_normal_(tensor, gain: float = 1.0):
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std)


def _kaiming_std(tensor, a, mode, nonlinearity):
    if 0 in tuple(tensor.shape):
        warnings.warn(f"Initializing zero-element tensors (shape {tuple(tensor.shape)}) is a no-op")
        return None
    fan = _calculate_correct_fan(tensor, mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"):
    """U(-bound, bound) with bound = gain * sqrt(3 / fan) (He et al., 2015); ``a`` is the leaky_relu slope."""
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"):
    """N(0, std^2) with std = gain / sqrt(fan)."""
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    return normal_(tensor, 0.0, std)


def default_layer_init_(weight, bias=None):
    """PyTorch's default for Linear and Conv layers: kaiming_uniform_(a=sqrt(5)) on the weight, i.e.
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias."""
    kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = _calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        uniform_(bias, -bound, bound)
    return weight


def orthogonal_(tensor, gain: float = 1.0):
    """A (semi-)orthogonal matrix from the QR decomposition of a Gaussian one, trailing dims flattened
    (Saxe et al., 2013); signs fixed by diag(R) so that the distribution is uniform."""
    if tensor.dim() < 2:
        raise ValueError(f"Only tensors with 2 or more dimensions are supported, got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    with no_grad():
        flat = randn(rows, cols, dtype=np.float64, device=tensor.device).data
        xp = tensor._xp()
        if rows < cols:
            flat = flat.T
        q, r = xp.linalg.qr(flat)
        q = q * xp.sign(xp.diag(r))
        if rows < cols:
            q = q.T
        tensor.copy_((q * gain).reshape(tensor.shape).astype(tensor.dtype))
    return tensor
