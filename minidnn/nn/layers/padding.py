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


for _d in (1, 2, 3):
    globals()[f"ConstantPad{_d}d"] = _make(f"ConstantPad{_d}d", "constant", _d, constant=True)
    globals()[f"ZeroPad{_d}d"] = _make(f"ZeroPad{_d}d", "constant", _d, zero=True)
    globals()[f"ReflectionPad{_d}d"] = _make(f"ReflectionPad{_d}d", "reflect", _d)
    globals()[f"ReplicationPad{_d}d"] = _make(f"ReplicationPad{_d}d", "replicate", _d)
    globals()[f"CircularPad{_d}d"] = _make(f"CircularPad{_d}d", "circular", _d)
for _cls in __all__:                 # defined in this module (pickling, repr)
    globals()[_cls].__module__ = __name__
