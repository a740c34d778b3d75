"""Activation layers: each wraps its functional op (PyTorch's constructor arguments and repr strings); the ones
whose only argument is ``inplace`` (or none) share ``_Inplace`` / ``_NoArgs``.

``inplace=True`` is accepted for compatibility (and shown in the repr) but the result is always a
new tensor: the activation primitive writes a fresh output.
"""
from __future__ import annotations

from ...backend.errors import ArgumentError
from ...creation import full
from .. import functional as F
from ..module import Module
from ..parameter import Parameter

__all__ = ["ReLU", "ReLU6", "LeakyReLU", "ELU", "GELU", "SiLU", "Sigmoid", "Tanh", "Hardtanh", "Softplus", "Softmax",
           "LogSoftmax", "PReLU", "Mish", "Hardswish", "Hardsigmoid", "SELU", "CELU", "GLU", "Softsign",
           "LogSigmoid", "Softmin", "Tanhshrink", "Softshrink", "Hardshrink", "Threshold", "RReLU"]


def _inplace_suffix(inplace, first=False):
    if not inplace:
        return ""
    return "inplace=True" if first else ", inplace=True"


class _Inplace(Module):
    """An activation whose only argument is PyTorch's ``inplace`` flag."""

    _fn = None

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return type(self)._fn(input)

    def extra_repr(self):
        return _inplace_suffix(self.inplace, first=True)


class _NoArgs(Module):
    """An activation without arguments."""

    _fn = None

    def forward(self, input):
        return type(self)._fn(input)


class ReLU(_Inplace):
    _fn = staticmethod(F.relu)


class SiLU(_Inplace):
    _fn = staticmethod(F.silu)


class Hardtanh(Module):
    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        super().__init__()
        if max_val <= min_val:
            raise ArgumentError(f"Hardtanh: max_val={max_val} must be greater than min_val={min_val}")
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, input):
        return F.hardtanh(input, self.min_val, self.max_val)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}{_inplace_suffix(self.inplace)}"


class ReLU6(Hardtanh):
    def __init__(self, inplace=False):
        super().__init__(0.0, 6.0, inplace)

    def forward(self, input):
        return F.relu6(input)

    def extra_repr(self):
        return _inplace_suffix(self.inplace, first=True)


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}{_inplace_suffix(self.inplace)}"


class ELU(Module):
    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input):
        return F.elu(input, self.alpha)

    def extra_repr(self):
        return f"alpha={self.alpha}{_inplace_suffix(self.inplace)}"


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Sigmoid(_NoArgs):
    _fn = staticmethod(F.sigmoid)


class Tanh(_NoArgs):
    _fn = staticmethod(F.tanh)


class Softplus(Module):
    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class Softmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.softmax(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    def forward(self, input):
        return F.log_softmax(input, self.dim)


class PReLU(Module):
    """x where x > 0, else a * x with a learnable slope ``a``: one shared (num_parameters=1) or one per channel
    (dim 1 of the input), initialised to ``init`` (``nn.PReLU``)."""

    def __init__(self, num_parameters=1, init=0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters, self.init = num_parameters, init
        self.weight = Parameter(full((num_parameters,), init, device=device, dtype=dtype))

    def reset_parameters(self):
        self.weight.data[...] = self.init

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


class Mish(_Inplace):
    """x * tanh(softplus(x)) (``nn.Mish``)."""
    _fn = staticmethod(F.mish)


class Hardswish(_Inplace):
    """x * relu6(x + 3) / 6 (``nn.Hardswish``)."""
    _fn = staticmethod(F.hardswish)


class Hardsigmoid(_Inplace):
    """relu6(x + 3) / 6 (``nn.Hardsigmoid``)."""
    _fn = staticmethod(F.hardsigmoid)


class SELU(_Inplace):
    """scale * elu(x, alpha) with the self-normalising constants (``nn.SELU``)."""
    _fn = staticmethod(F.selu)


class CELU(Module):
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1)) (``nn.CELU``)."""

    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input):
        return F.celu(input, self.alpha)

    def extra_repr(self):
        return f"alpha={self.alpha}{_inplace_suffix(self.inplace)}"


class GLU(Module):
    """a * sigmoid(b) for the two halves a, b of the input along ``dim`` (``nn.GLU``)."""

    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.glu(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softsign(_NoArgs):
    """x / (1 + |x|) (``nn.Softsign``)."""
    _fn = staticmethod(F.softsign)


class LogSigmoid(_NoArgs):
    """log(sigmoid(x)) (``nn.LogSigmoid``)."""
    _fn = staticmethod(F.logsigmoid)


class Tanhshrink(_NoArgs):
    """x - tanh(x) (``nn.Tanhshrink``)."""
    _fn = staticmethod(F.tanhshrink)


class Softmin(Softmax):
    """softmax(-x) along ``dim`` (``nn.Softmin``)."""

    def forward(self, input):
        return F.softmin(input, self.dim)


class Softshrink(Module):
    """x -+ lambd outside [-lambd, lambd], 0 inside (``nn.Softshrink``)."""

    def __init__(self, lambd=0.5):
        super().__init__()
        self.lambd = lambd

    def forward(self, input):
        return F.softshrink(input, self.lambd)

    def extra_repr(self):
        return str(self.lambd)


class Hardshrink(Softshrink):
    """x outside [-lambd, lambd], 0 inside (``nn.Hardshrink``)."""

    def forward(self, input):
        return F.hardshrink(input, self.lambd)


class Threshold(Module):
    """x where x > threshold, else ``value`` (``nn.Threshold``)."""

    def __init__(self, threshold, value, inplace=False):
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input):
        return F.threshold(input, self.threshold, self.value)

    def extra_repr(self):
        return f"threshold={self.threshold}, value={self.value}" + _inplace_suffix(self.inplace)


class RReLU(Module):
    """Randomised leaky ReLU (``nn.RReLU``): slopes drawn from U(lower, upper) in training, (lower + upper) / 2 in
    eval."""

    def __init__(self, lower=1.0 / 8, upper=1.0 / 3, inplace=False):
        super().__init__()
        self.lower, self.upper, self.inplace = lower, upper, inplace

    def forward(self, input):
        return F.rrelu(input, self.lower, self.upper, self.training)

    def extra_repr(self):
        return f"lower={self.lower}, upper={self.upper}" + _inplace_suffix(self.inplace)
