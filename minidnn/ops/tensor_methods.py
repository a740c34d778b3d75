"""Tensor methods that are ops: conversion (``to``), in-place fills and ``x[key] = value``.  They live here, above
tensor.py, and ops/__init__.py binds them to Tensor with every other method (tensor.py imports nothing above it)."""
from __future__ import annotations

from .._tensor_convert import parse_to_args
from ..autograd import _state
from ..backend.errors import ArgumentError
from ..tensor import Tensor, _wrap
from .elementwise import where
from .indexing import index_put, setitem_array
from .linalg import transfer

__all__ = ["to", "zero_", "fill_", "setitem"]


def _constant_like(a, value):
    """``value`` everywhere, recorded as a where() on ``a`` so the gradient to ``a`` is zero (not
    ``a * 0``, which turns inf into nan).  ``value`` may be a tensor that requires grad."""
    return where(_wrap(a._xp().ones(a.shape, dtype=bool)), value, a)




def to(self, *args, dtype=None, device=None, copy=False, non_blocking=False, memory_format=None):
    """``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(other_tensor)``, and ``memory_format=``:
    differentiable."""
    device, dtype = parse_to_args(args, device, dtype)
    out = transfer(self, device=device, dtype=dtype, copy=copy)
    return out if memory_format is None else out.contiguous(memory_format)




def zero_(self):
    """Fill with zeros in place (recorded as a where() when x is part of a graph: its gradient is then 0)."""
    if self._check_inplace("zero_"):
        return self._inplace("zero_", lambda a: _constant_like(a, 0))
    self.data.fill(0)
    self._version += 1
    return self


def fill_(self, value):
    """Fill with ``value`` (a number or a 0-d tensor, which may require grad) in place."""
    if self._check_inplace("fill_"):
        return self._inplace("fill_", lambda a: _constant_like(a, value))
    self.data.fill(value.item() if isinstance(value, Tensor) else value)
    self._version += 1
    return self

def setitem(self, key, value):
    """``x[key] = value``: in place, recorded (index_put) when x or value needs a gradient."""
    if _state.grad_enabled and (self.requires_grad or (isinstance(value, Tensor) and value.requires_grad)):
        self._check_inplace("__setitem__")
        res = index_put(self._alias(), key, value)
        self.data, self.grad_fn, self.output_nr, self.requires_grad = res.data, res.grad_fn, 0, res.requires_grad
    else:
        v = value.data if isinstance(value, Tensor) else value
        if isinstance(value, Tensor) and value.device != self.device:
            raise RuntimeError(f"__setitem__: value on '{value.device}' assigned into a tensor on '{self.device}'")
        try:
            setitem_array(self, key, v)     # PyTorch's placement of advanced-index dims
        except ValueError as exc:       # NumPy's broadcast failure: say it in PyTorch's terms
            raise ArgumentError(f"__setitem__: cannot assign a value of shape {tuple(getattr(v, 'shape', ()))} "
                                f"into the selected region of a tensor of shape {tuple(self.shape)} ({exc})") from None
    self._version += 1
