"""Layers over the reshaping, distance and normalisation ops of minidnn/nn/_functions/extra.py: CosineSimilarity,
PairwiseDistance, PixelShuffle / PixelUnshuffle, ChannelShuffle, Unfold / Fold, AlphaDropout, InstanceNorm1d/2d/3d
and Bilinear, with PyTorch's constructor arguments, parameters, buffers and repr."""
from __future__ import annotations

import math
import warnings

import numpy as np

from ...backend.errors import ArgumentError
from ...creation import empty, tensor, zeros
from .. import functional as F
from .. import init
from ..module import Module
from ..parameter import Parameter
from .normalization import _affine_parameters

__all__ = ["CosineSimilarity", "PairwiseDistance", "PixelShuffle", "PixelUnshuffle", "ChannelShuffle", "Unfold",
           "Fold", "AlphaDropout", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "Bilinear"]


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


class _InstanceNorm(Module):
    """PyTorch's _InstanceNorm: no affine parameters and no running statistics by default; with
    ``track_running_stats`` the running statistics are updated in training and used in eval."""

    _batched_ndim = 3

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False, device=None,
                 dtype=None, *, bias=True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        _affine_parameters(self, (num_features,), affine, affine and bias, device, dtype)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, device=device, dtype=dtype))
            self.register_buffer("running_var", zeros(num_features, device=device, dtype=dtype) + 1)
            self.register_buffer("num_batches_tracked", tensor(0, dtype=np.int64, device=device))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def forward(self, input):
        name, nd = type(self).__name__, self._batched_ndim
        if input.ndim not in (nd - 1, nd):
            raise ArgumentError(f"{name}: expected {nd - 1}D or {nd}D input (got {input.ndim}D input of shape "
                                f"{tuple(input.shape)})")
        feature_dim = input.ndim - (nd - 1)
        if input.shape[feature_dim] != self.num_features:
            if self.affine:
                raise ArgumentError(f"{name}: expected input's size at dim={feature_dim} to match num_features "
                                    f"({self.num_features}), but got: {input.shape[feature_dim]}.")
            warnings.warn(f"input's size at dim={feature_dim} does not match num_features. You can silence this "
                          "warning by not passing in num_features, which is not used because affine=False",
                          stacklevel=2)
        x = input.unsqueeze(0) if input.ndim == nd - 1 else input
        y = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            self.training or not self.track_running_stats,
                            self.momentum if self.momentum is not None else 0.0, self.eps)
        return y.squeeze(0) if input.ndim == nd - 1 else y

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class InstanceNorm1d(_InstanceNorm):
    """Instance normalisation of (N, C, L) or unbatched (C, L) (``nn.InstanceNorm1d``)."""
    _batched_ndim = 3


class InstanceNorm2d(_InstanceNorm):
    """Instance normalisation of (N, C, H, W) or unbatched (C, H, W) (``nn.InstanceNorm2d``)."""
    _batched_ndim = 4


class InstanceNorm3d(_InstanceNorm):
    """Instance normalisation of (N, C, D, H, W) or unbatched (C, D, H, W) (``nn.InstanceNorm3d``)."""
    _batched_ndim = 5


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
