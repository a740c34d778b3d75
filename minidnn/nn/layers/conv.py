"""Convolution layers: Conv1d/2d/3d and ConvTranspose1d/2d/3d (PyTorch's signatures, init and repr).

# Conv:           weight (out_channels, in_channels / groups, *kernel_size)
# ConvTranspose:  weight (in_channels, out_channels / groups, *kernel_size)
# bias: (out_channels,)
"""
from __future__ import annotations

import math

from ...backend.errors import ArgumentError
from ...creation import empty
from .. import functional as F
from .. import init
from .._functions._util import ntuple
from ..module import REGISTERED_LAYERS, Module, registered
from ..parameter import Parameter

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]


class _ConvNd(Module):
    _nd = 2
    _transposed = False

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
                 output_padding=0, device=None, dtype=None):
        super().__init__()
        name = type(self).__name__
        nd = self._nd
        if groups <= 0:
            raise ArgumentError(f"{name}: groups must be a positive integer, got {groups}")
        if in_channels % groups:
            raise ArgumentError(f"{name}: in_channels={in_channels} must be divisible by groups={groups}")
        if out_channels % groups:
            raise ArgumentError(f"{name}: out_channels={out_channels} must be divisible by groups={groups}")
        if padding_mode != "zeros":
            raise NotImplementedError(f"{name}: padding_mode={padding_mode!r} is not supported (only 'zeros')")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ArgumentError(f"{name}: padding={padding!r} must be 'same', 'valid', an int or a tuple")
            if padding == "same" and any(s != 1 for s in ntuple(stride, nd, name, "stride")):
                raise ArgumentError(f"{name}: padding='same' is not supported for strided convolutions")
        else:
            padding = ntuple(padding, nd, name, "padding")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = ntuple(kernel_size, nd, name, "kernel_size")
        self.stride = ntuple(stride, nd, name, "stride")
        self.padding = padding
        self.dilation = ntuple(dilation, nd, name, "dilation")
        self.output_padding = ntuple(output_padding, nd, name, "output_padding")
        self.groups = groups
        self.transposed = self._transposed
        self.padding_mode = padding_mode
        shape = ((in_channels, out_channels // groups) if self._transposed
                 else (out_channels, in_channels // groups)) + self.kernel_size
        self.weight = Parameter(empty(*shape, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.default_layer_init_(self.weight, self.bias)

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        nd = self._nd
        if self.padding != (0,) * nd:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * nd:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * nd:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s

    def _macs(self, input, output):
        # one multiply-add per kernel tap per (output element) -- for a transposed conv, per input element
        taps = math.prod(self.kernel_size)
        if self._transposed:
            return input.numel() * (self.out_channels // self.groups) * taps
        return output.numel() * (self.in_channels // self.groups) * taps


_WEIGHT_BIAS = ("weight", "bias")


class _Conv(_ConvNd):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device=device, dtype=dtype)

    def forward(self, input):
        r = registered(self, _WEIGHT_BIAS) if REGISTERED_LAYERS[0] else None     # (module.registered: one read)
        if r is None:
            return self._function(input, self.weight, self.bias, self.stride, self.padding, self.dilation,
                                  self.groups)
        return self._function(input, r[0], r[1], self.stride, self.padding, self.dilation, self.groups)


class _ConvTranspose(_ConvNd):
    _transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, output_padding, device=device, dtype=dtype)

    def forward(self, input, output_size=None):
        if output_size is not None:
            raise NotImplementedError(f"{type(self).__name__}: output_size is not supported; pass output_padding")
        return self._function(input, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                              self.groups, self.dilation)


class Conv1d(_Conv):
    _function = staticmethod(F.conv1d)
    _nd = 1


class Conv2d(_Conv):
    """2-D convolution over (N, C_in, H, W); weight (out_channels, in_channels / groups, kH, kW)."""
    _function = staticmethod(F.conv2d)
    _nd = 2


class Conv3d(_Conv):
    _function = staticmethod(F.conv3d)
    _nd = 3


class ConvTranspose1d(_ConvTranspose):
    _function = staticmethod(F.conv_transpose1d)
    _nd = 1


class ConvTranspose2d(_ConvTranspose):
    """The adjoint of Conv2d: weight (in_channels, out_channels / groups, kH, kW)."""
    _function = staticmethod(F.conv_transpose2d)
    _nd = 2


class ConvTranspose3d(_ConvTranspose):
    _function = staticmethod(F.conv_transpose3d)
    _nd = 3
