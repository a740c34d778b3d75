"""Padding layers (PyTorch's names): constant, zero, reflection, replication and circular, 1-D to 3-D.
``padding``: an int (every side) or PyTorch's tuple (left, right[, top, bottom[, front, back]])."""
from __future__ import annotations

from ..functional_extra import pad
from ..module import Module

__all__ = ["ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d",
           "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d",
           "ReplicationPad3d", "CircularPad1d", "CircularPad2d", "CircularPad3d"]


class _PadNd(Module):
    mode = "constant"
    dims = 1

    def __init__(self, padding, value=None):
        super().__init__()
        if isinstance(padding, int):
            padding = (padding,) * (2 * self.dims)
        padding = tuple(padding)
        if len(padding) != 2 * self.dims or not all(isinstance(p, int) for p in padding):
            raise ValueError(f"{type(self).__name__}: padding must be an int or a tuple of {2 * self.dims} ints, "
                             f"got {padding}")
        self.padding = padding
        self.value = value

    def forward(self, input):
        if self.mode == "constant":
            return pad(input, self.padding, "constant", self.value)
        return pad(input, self.padding, self.mode)

    def extra_repr(self):
        return f"padding={self.padding}" + (f", value={self.value}" if self.mode == "constant" else "")


def _make(name, mode, dims, constant=False, zero=False):
    def __init__(self, padding, *args, **kwargs):
        if constant:
            _PadNd.__init__(self, padding, *args, **kwargs)       # (padding, value)
        else:
            _PadNd.__init__(self, padding, 0.0 if zero else None)
    return type(name, (_PadNd,), {"mode": mode, "dims": dims, "__init__": __init__,
                                  "__doc__": f"{mode} padding of the last {dims} dim(s) (PyTorch's {name})."})


ConstantPad1d = _make("ConstantPad1d", "constant", 1, constant=True)
ConstantPad2d = _make("ConstantPad2d", "constant", 2, constant=True)
ConstantPad3d = _make("ConstantPad3d", "constant", 3, constant=True)
ZeroPad1d = _make("ZeroPad1d", "constant", 1, zero=True)
ZeroPad2d = _make("ZeroPad2d", "constant", 2, zero=True)
ZeroPad3d = _make("ZeroPad3d", "constant", 3, zero=True)
ReflectionPad1d = _make("ReflectionPad1d", "reflect", 1)
ReflectionPad2d = _make("ReflectionPad2d", "reflect", 2)
ReflectionPad3d = _make("ReflectionPad3d", "reflect", 3)
ReplicationPad1d = _make("ReplicationPad1d", "replicate", 1)
ReplicationPad2d = _make("ReplicationPad2d", "replicate", 2)
ReplicationPad3d = _make("ReplicationPad3d", "replicate", 3)
CircularPad1d = _make("CircularPad1d", "circular", 1)
CircularPad2d = _make("CircularPad2d", "circular", 2)
CircularPad3d = _make("CircularPad3d", "circular", 3)
