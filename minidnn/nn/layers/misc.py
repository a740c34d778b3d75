"""Layers over the reshaping and distance ops of minidnn/nn/_functions/extra.py: CosineSimilarity,
PairwiseDistance, PixelShuffle / PixelUnshuffle, ChannelShuffle, Unfold / Fold, AlphaDropout and Bilinear, with
PyTorch's constructor arguments, parameters and repr (InstanceNorm is with the other normalisation layers)."""
from __future__ import annotations

import math

from ...backend.errors import ArgumentError
from ...creation import empty
from .. import functional as F
from .. import init
from ..module import Module
from ..parameter import Parameter

__all__ = ["CosineSimilarity", "PairwiseDistance", "PixelShuffle", "PixelUnshuffle", "ChannelShuffle", "Unfold",
           "Fold", "AlphaDropout", "Bilinear"]


class CosineSimilarity(Module):
    """Cosine similarity of x1 and x2 along ``dim`` (``nn.CosineSimilarity``)."""

    def __init__(self, dim=1, eps=1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        return F.cosine_similarity(x1, x2, self.dim, self.eps)


class PairwiseDistance(Module):
    """||x1 - x2 + eps||_p over the last dim (``nn.PairwiseDistance``)."""

    def __init__(self, p=2.0, eps=1e-6, keepdim=False):
        super().__init__()
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1, x2):
        return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class PixelShuffle(Module):
    """(*, C r^2, H, W) -> (*, C, H r, W r) (``nn.PixelShuffle``)."""

    def __init__(self, upscale_factor):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, input):
        return F.pixel_shuffle(input, self.upscale_factor)

    def extra_repr(self):
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """(*, C, H r, W r) -> (*, C r^2, H, W) (``nn.PixelUnshuffle``)."""

    def __init__(self, downscale_factor):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, input):
        return F.pixel_unshuffle(input, self.downscale_factor)

    def extra_repr(self):
        return f"downscale_factor={self.downscale_factor}"


class ChannelShuffle(Module):
    """Interleave the channels of ``groups`` groups (``nn.ChannelShuffle``, ShuffleNet)."""

    def __init__(self, groups):
        super().__init__()
        self.groups = groups

    def forward(self, input):
        return F.channel_shuffle(input, self.groups)

    def extra_repr(self):
        return f"groups={self.groups}"


class Unfold(Module):
    """Sliding local blocks, (N, C, H, W) -> (N, C kh kw, L) (``nn.Unfold``)."""

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.kernel_size, self.dilation, self.padding, self.stride = kernel_size, dilation, padding, stride

    def forward(self, input):
        return F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, dilation={self.dilation}, padding={self.padding}, "
                f"stride={self.stride}")


class Fold(Module):
    """Sum sliding local blocks back into (N, C, *output_size), the adjoint of Unfold (``nn.Fold``)."""

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.output_size, self.kernel_size = output_size, kernel_size
        self.dilation, self.padding, self.stride = dilation, padding, stride

    def forward(self, input):
        return F.fold(input, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self):
        return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride}")


class AlphaDropout(Module):
    """Alpha dropout for SELU networks, active in training mode only (``nn.AlphaDropout``)."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ArgumentError(f"AlphaDropout: dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input):
        return F.alpha_dropout(input, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Bilinear(Module):
    """y = x1^T A x2 + b with weight A (out_features, in1_features, in2_features), bias (out_features,), both
    initialised from U(-1/sqrt(in1_features), 1/sqrt(in1_features)) (``nn.Bilinear``)."""

    def __init__(self, in1_features, in2_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        self.weight = Parameter(empty(out_features, in1_features, in2_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.in1_features <= 0:
            raise ArgumentError(f"Bilinear: in1_features must be > 0, but got (in1_features={self.in1_features})")
        bound = 1 / math.sqrt(self.in1_features)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self):
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
