"""Pooling layers (PyTorch's signatures and repr strings; the arguments are kept as given)."""
from __future__ import annotations

import math

from .. import functional as F
from .._functions._util import ntuple
from ..module import Module

__all__ = ["MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
           "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d"]


class _WindowMacs:
    """One operation (add or compare) per window tap per output element."""
    _nd = 2

    def _macs(self, input, output):
        return output.numel() * math.prod(ntuple(self.kernel_size, self._nd, type(self).__name__, "kernel_size"))


class _MaxPoolNd(_WindowMacs, Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input):
        return self._function(input, self.kernel_size, self.stride, self.padding, self.dilation,
                              ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool1d(_MaxPoolNd):
    _function = staticmethod(F.max_pool1d)
    _nd = 1


class MaxPool2d(_MaxPoolNd):
    _function = staticmethod(F.max_pool2d)
    _nd = 2


class MaxPool3d(_MaxPoolNd):
    _function = staticmethod(F.max_pool3d)
    _nd = 3


class _AvgPoolNd(_WindowMacs, Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, input):
        if self._nd == 1:
            return self._function(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                                  self.count_include_pad)
        return self._function(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                              self.count_include_pad, self.divisor_override)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd):
    _function = staticmethod(F.avg_pool1d)
    _nd = 1

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        # PyTorch keeps AvgPool1d's sizes as 1-tuples (its repr shows kernel_size=(3,))
        name = "AvgPool1d"
        super().__init__(ntuple(kernel_size, 1, name, "kernel_size"),
                         ntuple(stride if stride is not None else kernel_size, 1, name, "stride"),
                         ntuple(padding, 1, name, "padding"), ceil_mode, count_include_pad)


class AvgPool2d(_AvgPoolNd):
    _function = staticmethod(F.avg_pool2d)
    _nd = 2


class AvgPool3d(_AvgPoolNd):
    _function = staticmethod(F.avg_pool3d)
    _nd = 3


class _AdaptivePool(Module):
    _nd = 2
    _max = False

    def __init__(self, output_size, return_indices=False):
        super().__init__()
        self.output_size = output_size
        if self._max:
            self.return_indices = return_indices

    def forward(self, input):
        if self._max:
            return self._function(input, self.output_size, self.return_indices)
        return self._function(input, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"

    def _macs(self, input, output):
        return input.numel()        # every input element is read (added or compared) once


class AdaptiveAvgPool1d(_AdaptivePool):
    _function = staticmethod(F.adaptive_avg_pool1d)
    _nd = 1


class AdaptiveAvgPool2d(_AdaptivePool):
    _function = staticmethod(F.adaptive_avg_pool2d)
    _nd = 2


class AdaptiveMaxPool1d(_AdaptivePool):
    _function = staticmethod(F.adaptive_max_pool1d)
    _nd, _max = 1, True


class AdaptiveMaxPool2d(_AdaptivePool):
    _function = staticmethod(F.adaptive_max_pool2d)
    _nd, _max = 2, True
