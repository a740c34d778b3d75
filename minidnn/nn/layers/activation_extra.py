"""More activation layers (PReLU, Mish, Hardswish, ...): each wraps its op of minidnn/nn/_functions/extra.py with
PyTorch's constructor arguments and repr.  ``inplace=True`` is accepted (and shown) but the result is a new tensor."""
from __future__ import annotations

from ...creation import full
from .. import functional as F
from ..module import Module
from ..parameter import Parameter

__all__ = ["PReLU", "Mish", "Hardswish", "Hardsigmoid", "SELU", "CELU", "GLU", "Softsign", "LogSigmoid", "Softmin",
           "Tanhshrink", "Softshrink", "Hardshrink", "Threshold", "RReLU"]


class _Inplace(Module):
    """An activation whose only argument is PyTorch's ``inplace`` flag."""

    _fn = None

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return type(self)._fn(input)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class _NoArgs(Module):
    _fn = None

    def forward(self, input):
        return type(self)._fn(input)


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
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


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


class Softmin(Module):
    """softmax(-x) along ``dim`` (``nn.Softmin``)."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.softmin(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


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
        return f"threshold={self.threshold}, value={self.value}" + (", inplace=True" if self.inplace else "")


class RReLU(Module):
    """Randomised leaky ReLU (``nn.RReLU``): slopes drawn from U(lower, upper) in training, (lower + upper) / 2 in
    eval."""

    def __init__(self, lower=1.0 / 8, upper=1.0 / 3, inplace=False):
        super().__init__()
        self.lower, self.upper, self.inplace = lower, upper, inplace

    def forward(self, input):
        return F.rrelu(input, self.lower, self.upper, self.training)

    def extra_repr(self):
        return f"lower={self.lower}, upper={self.upper}" + (", inplace=True" if self.inplace else "")
