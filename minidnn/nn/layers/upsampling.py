"""Upsample (and the UpsamplingNearest2d / UpsamplingBilinear2d shorthands): ``F.interpolate`` as a layer."""
from __future__ import annotations

from ..functional_extra import interpolate
from ..module import Module

__all__ = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]


class Upsample(Module):
    """PyTorch's nn.Upsample: ``size`` or ``scale_factor``; mode nearest | nearest-exact | linear | bilinear |
    trilinear | area; ``align_corners`` for the linear modes."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None):
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        self.scale_factor = float(scale_factor) if isinstance(scale_factor, (int, float)) else (
            tuple(float(s) for s in scale_factor) if scale_factor is not None else None)
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input):
        return interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                           recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self):
        info = f"size={self.size!r}" if self.scale_factor is None else f"scale_factor={self.scale_factor!r}"
        return info + f", mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
