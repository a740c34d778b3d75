"""Normalisation layers: BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d, LayerNorm, GroupNorm, LocalResponseNorm.

BatchNorm follows PyTorch exactly: training normalises with the batch statistics and updates
running_mean / running_var (unbiased) in place with ``momentum`` (None: a cumulative average,
factor 1 / num_batches_tracked); eval uses the running statistics, unless track_running_stats=False,
in which case the batch statistics are used in both modes.
"""
from __future__ import annotations

import warnings

import numpy as np

from ...backend.errors import ArgumentError
from ...creation import ones, tensor, zeros
from .. import functional as F
from ..module import Module, registered
from ..parameter import Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
           "LayerNorm", "GroupNorm", "LocalResponseNorm"]


def _affine_parameters(module, shape, weight, bias, device, dtype):
    """weight = 1 and bias = 0 of ``shape`` (PyTorch's init), each registered as None when switched off."""
    module.register_parameter("weight", Parameter(ones(*shape, device=device, dtype=dtype)) if weight else None)
    module.register_parameter("bias", Parameter(zeros(*shape, device=device, dtype=dtype)) if bias else None)


class _NormBase(Module):
    """What batch and instance norm share (PyTorch's _NormBase): affine weight/bias, running statistics, repr."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None, *, bias=True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        _affine_parameters(self, (num_features,), affine, affine and bias, device, dtype)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, device=device, dtype=dtype))
            self.register_buffer("running_var", ones(num_features, device=device, dtype=dtype))
            self.register_buffer("num_batches_tracked", tensor(0, dtype=np.int64, device=device))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self):
        self.reset_running_stats()
        for p, value in ((self.weight, 1), (self.bias, 0)):
            if p is not None:
                p.data[...] = value

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


_STATE = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


class _BatchNorm(_NormBase):
    _dims = (4,)

    def forward(self, input):
        if input.ndim not in self._dims:
            raise ArgumentError(f"{type(self).__name__}: expected {' or '.join(f'{d}D' for d in self._dims)} input "
                             f"(got {input.ndim}D input of shape {tuple(input.shape)})")
        r = registered(self, _STATE)    # the five registered tensors in one read (module.registered)
        if r is None:
            return self._forward_reading(input)
        weight, bias, running_mean, running_var, counter = r
        factor = 0.0 if self.momentum is None else self.momentum
        tracking = self.training and self.track_running_stats and counter is not None
        if tracking and self.momentum is None:      # cumulative moving average over the batches so far
            factor = 1.0 / float(counter.item() + 1)
        use_batch_stats = self.training or (running_mean is None and running_var is None)
        update = not self.training or self.track_running_stats
        return F.batch_norm(input, running_mean if update else None, running_var if update else None,
                            weight, bias, use_batch_stats, factor, self.eps,
                            _counter=counter if tracking else None)

    def _forward_reading(self, input):
        """forward reading the module's attributes one by one (a type or instance ``registered`` does not serve)."""
        factor = 0.0 if self.momentum is None else self.momentum
        counter = self.num_batches_tracked
        tracking = self.training and self.track_running_stats and counter is not None
        if tracking and self.momentum is None:      # cumulative moving average over the batches so far
            factor = 1.0 / float(counter.item() + 1)
        # Batch statistics in training, and in eval when there are no running statistics to use.
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        update = not self.training or self.track_running_stats
        # the batch is counted by the training forward itself, in place and only once it went through (a failing
        # forward changes nothing); on the GPU by the statistics kernel: no counter launch per layer
        return F.batch_norm(input, self.running_mean if update else None, self.running_var if update else None,
                            self.weight, self.bias, use_batch_stats, factor, self.eps,
                            _counter=counter if tracking else None)

    def _macs(self, input, output):
        return input.numel()        # one multiply-add per element (the folded scale and shift)


class BatchNorm1d(_BatchNorm):
    """Over (N, C) or (N, C, L)."""
    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Over (N, C, H, W): one mean and variance per channel."""
    _dims = (4,)


class BatchNorm3d(_BatchNorm):
    _dims = (5,)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        _affine_parameters(self, self.normalized_shape, elementwise_affine, elementwise_affine and bias, device, dtype)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")

    def _macs(self, input, output):
        return input.numel()


class GroupNorm(Module):
    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None, *, bias=True):
        super().__init__()
        if num_channels % num_groups:
            raise ArgumentError(f"GroupNorm: num_channels={num_channels} must be divisible by num_groups={num_groups}")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        _affine_parameters(self, (num_channels,), affine, affine and bias, device, dtype)

    def forward(self, input):
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")

    def _macs(self, input, output):
        return input.numel()


class LocalResponseNorm(Module):
    def __init__(self, size, alpha=1e-4, beta=0.75, k=1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, input):
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self):
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class _InstanceNorm(_NormBase):
    """PyTorch's _InstanceNorm: no affine parameters and no running statistics by default; with
    ``track_running_stats`` the running statistics are updated in training and used in eval."""

    _batched_ndim = 3

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False, device=None,
                 dtype=None, *, bias=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)

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


class InstanceNorm1d(_InstanceNorm):
    """Instance normalisation of (N, C, L) or unbatched (C, L) (``nn.InstanceNorm1d``)."""
    _batched_ndim = 3


class InstanceNorm2d(_InstanceNorm):
    """Instance normalisation of (N, C, H, W) or unbatched (C, H, W) (``nn.InstanceNorm2d``)."""
    _batched_ndim = 4


class InstanceNorm3d(_InstanceNorm):
    """Instance normalisation of (N, C, D, H, W) or unbatched (C, D, H, W) (``nn.InstanceNorm3d``)."""
    _batched_ndim = 5
