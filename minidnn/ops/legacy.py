"""PyTorch's legacy typed constructors: ``LongTensor([1, 2])`` (data) or ``FloatTensor(2, 3)`` (an uninitialised
tensor of that size), and ``isinstance(t, LongTensor)`` (a cpu tensor of that dtype)."""
from __future__ import annotations

import numbers

import numpy as np

from ..backend.errors import DTypeError
from ..creation import empty, tensor
from ..tensor import Tensor

__all__ = ["FloatTensor", "DoubleTensor", "HalfTensor", "LongTensor", "IntTensor", "ShortTensor", "CharTensor",
           "ByteTensor", "BoolTensor"]


class _LegacyMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, Tensor) and obj.dtype == cls.dtype and obj.device.type == "cpu"


def _legacy(name, dtype):
    def __new__(cls, *args, device=None):
        if not args:
            return empty(0, dtype=cls.dtype, device=device)
        if all(isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in args):
            return empty(*args, dtype=cls.dtype, device=device)       # a size
        if len(args) == 1:
            data = args[0]
            if isinstance(data, tuple) and type(data).__name__ == "Size":
                return empty(*data, dtype=cls.dtype, device=device)
            return tensor(data, dtype=cls.dtype, device=device)
        raise DTypeError(f"{name}(): expected a size (ints) or one sequence of data, got {args!r}")
    return _LegacyMeta(name, (), {"__new__": __new__, "dtype": np.dtype(dtype), "__doc__": f"{dtype} tensors"})


FloatTensor = _legacy("FloatTensor", "float32")
DoubleTensor = _legacy("DoubleTensor", "float64")
HalfTensor = _legacy("HalfTensor", "float16")
LongTensor = _legacy("LongTensor", "int64")
IntTensor = _legacy("IntTensor", "int32")
ShortTensor = _legacy("ShortTensor", "int16")
CharTensor = _legacy("CharTensor", "int8")
ByteTensor = _legacy("ByteTensor", "uint8")
BoolTensor = _legacy("BoolTensor", "bool")
