"""Tensor methods that spell out another op: dtype/device conversions (``x.float()``, ``x.cuda()``) are ``to``;
in-place arithmetic (``x.add_(y)``, ``x += y``, ``x.clamp_(0, 1)``) is the out-of-place op written into x through
``Tensor._inplace`` (tensor.py keeps that mechanism: the leaf check, the version bump, the history rebinding).
ops/__init__.py binds them to Tensor beside every other method."""
from __future__ import annotations

import numpy as np

__all__ = ["cpu", "cuda", "type", "float", "double", "half", "long", "int", "bool",
           "add_", "sub_", "mul_", "div_", "pow_", "clamp_", "neg_", "exp_", "sqrt_", "relu_"]


# -- conversions: each is to() -------------------------------------------------------------------------------------
def cpu(self):
    """This tensor on the CPU (itself if it is there already): PyTorch's Tensor.cpu."""
    return self.to("cpu")


def cuda(self, device=None):
    """This tensor on a GPU: the current one, ``cuda:<device>`` for an int, or the device given (Tensor.cuda)."""
    return self.to("cuda" if device is None else (f"cuda:{device}" if isinstance(device, int) else device))


def type(self, dtype=None):
    """The dtype's name without an argument; else this tensor cast to ``dtype`` (PyTorch's Tensor.type)."""
    return str(self.dtype) if dtype is None else self.to(dtype=dtype)


def float(self):
    """Cast to float32 (Tensor.float)."""
    return self.to(dtype=np.float32)


def double(self):
    """Cast to float64 (Tensor.double)."""
    return self.to(dtype=np.float64)


def half(self):
    """Cast to float16 (Tensor.half)."""
    return self.to(dtype=np.float16)


def long(self):
    """Cast to int64 (Tensor.long)."""
    return self.to(dtype=np.int64)


def int(self):
    """Cast to int32 (Tensor.int)."""
    return self.to(dtype=np.int32)


def bool(self):
    """Cast to bool (Tensor.bool)."""
    return self.to(dtype=np.bool_)


# -- in-place arithmetic: the out-of-place op, written into self -------------------------------------------------
def add_(self, other, alpha=1):
    """self += alpha * other in place (Tensor.add_); the result must cast to self's dtype."""
    if alpha != 1:
        return self._inplace("add_", lambda a, b: a + b * alpha, other)
    return self._inplace("add_", lambda a, b: a + b, other)


def sub_(self, other, alpha=1):
    """self -= alpha * other in place (Tensor.sub_)."""
    return self._inplace("sub_", lambda a, b: a - b * alpha, other)


def mul_(self, other):
    """self *= other in place (Tensor.mul_)."""
    return self._inplace("mul_", lambda a, b: a * b, other)


def div_(self, other):
    """self /= other in place (Tensor.div_): true division, so an integer tensor refuses the float result."""
    return self._inplace("div_", lambda a, b: a / b, other)


def pow_(self, other):
    """self **= other in place (Tensor.pow_)."""
    return self._inplace("pow_", lambda a, b: a ** b, other)


def clamp_(self, min=None, max=None):
    """Clamp into [min, max] in place (Tensor.clamp_ / clip_)."""
    return self._inplace("clamp_", lambda a: a.clip(min, max))


def neg_(self):
    """self = -self in place (Tensor.neg_)."""
    return self._inplace("neg_", lambda a: -a)


def exp_(self):
    """self = exp(self) in place (Tensor.exp_)."""
    return self._inplace("exp_", lambda a: a.exp())


def sqrt_(self):
    """self = sqrt(self) in place (Tensor.sqrt_)."""
    return self._inplace("sqrt_", lambda a: a.sqrt())


def relu_(self):
    """self = max(self, 0) in place (Tensor.relu_)."""
    return self._inplace("relu_", lambda a: a.relu())
