"""Local response normalisation across channels, and divisive (local contrast) normalisation.

# x, y, dy, dx, means, dmeans: (N, C, *S)   (format="NHWC": (N, *S, C)); LRN also takes (N, C)
# LRNDescriptor(n, alpha, beta, k): window size n, scale alpha, exponent beta, offset k

Both use a zero-padded window of n entries placed like PyTorch's local_response_norm: output i
sums inputs i - n//2 ... i + (n-1)//2 (centred for odd n; for even n one more entry *before* i
than after, which is PyTorch's choice; cuDNN documents the opposite for even n).

LRN across channels (cudnnLRNCrossChannelForward/Backward):
    S[c] = k + alpha / n * sum_{c' in window(c)} x[c']^2          y = x * S^(-beta)

Divisive normalisation (cudnnDivisiveNormalizationForward/Backward; Jarrett et al. 2009's local
contrast normalisation).  Per sample and channel, over a window of n entries along *every* spatial
dim (n^d taps, zero padded, always divided by n^d like average pooling with padding counted):
    m = mean_window(x), or ``means`` when given (PRECOMPUTED_MEANS)     subtractive step
    z = x - m
    v = mean_window(z^2)                                                   local variance
    y = z * (k + alpha * v)^(-beta)                                        divisive step
The window is uniform (a box), not a Gaussian, and the divisor is the smooth (k + alpha v)^beta
rather than Jarrett's max(c, sigma), so the map is differentiable everywhere; beta = 0.5, alpha = 1
and a small k give z / sqrt(k + local variance).  When ``means`` is given it is an independent input:
backward returns its gradient dmeans = -dz instead of differentiating through the window mean.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ._common import begin, blend, check_float, check_ndim, check_out, check_same, parse_enum, window_sum
from .errors import BadParamError, IdentityEnum
from .layout import from_channels_first, resolve_format, to_channels_first

__all__ = ["LRNDescriptor", "LRNMode", "DivNormMode", "lrn_cross_channel_forward", "lrn_cross_channel_backward",
           "divisive_normalization_forward", "divisive_normalization_backward"]


class LRNMode(IdentityEnum):
    """cudnnLRNMode_t: local response normalization across channels (the window runs along dim 1), cuDNN's only mode."""
    CROSS_CHANNEL_DIM1 = "cross_channel_dim1"   # the only mode cuDNN has: the window runs along dim 1 (C)


class DivNormMode(IdentityEnum):
    """cudnnDivNormMode_t: divisive normalization with precomputed means (cuDNN's only mode); passing means=None
    computes them here."""
    PRECOMPUTED_MEANS = "precomputed_means"     # cuDNN's only mode; means=None computes them here


@dataclasses.dataclass(frozen=True)
class LRNDescriptor:
    """cuDNN's ranges: 1 <= n <= 16, k >= 1e-5, beta >= 0.01 (alpha any finite number)."""
    n: int = 5
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 2.0

    def __post_init__(self):
        if not (isinstance(self.n, (int, np.integer)) and 1 <= self.n <= 16):
            raise BadParamError(f"LRNDescriptor: n={self.n!r} must be an int in [1, 16]")
        if not math.isfinite(self.alpha):
            raise BadParamError(f"LRNDescriptor: alpha={self.alpha} must be finite")
        if not self.beta >= 0.01:
            raise BadParamError(f"LRNDescriptor: beta={self.beta} must be >= 0.01")
        if not self.k >= 1e-5:
            raise BadParamError(f"LRNDescriptor: k={self.k} must be >= 1e-5")
        for name in ("alpha", "beta", "k"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "n", int(self.n))


def _before(n):
    return n // 2                 # window of output i starts at i - n//2 (PyTorch's placement)


def _adjoint_before(n):
    return n - 1 - n // 2         # the transposed window (see _common.window_sum)


def _prologue(where, handle, desc, x, format, ndims, **arrays):
    handle, xp = begin(handle, where, x=x, **arrays)
    if not isinstance(desc, LRNDescriptor):
        raise BadParamError(f"{where}: lrn_desc must be an LRNDescriptor, got {type(desc).__name__}")
    check_float(where, x=x)
    check_ndim(where, "x", x, ndims)
    fmt = resolve_format(x, format)
    return xp, fmt


# ----------------------------------------------------------------------------------------------
# LRN across channels.

def _lrn_denominator(xp, desc, xc):
    return desc.k + (desc.alpha / desc.n) * window_sum(xp, xc * xc, (1,), desc.n, _before(desc.n))


def lrn_cross_channel_forward(handle, lrn_desc: LRNDescriptor, x, alpha=1.0, beta=0.0, y=None, format=None,
                              mode=LRNMode.CROSS_CHANNEL_DIM1):
    """y = alpha * x * S^(-lrn.beta) + beta * y, S = k + lrn.alpha / n * (window sum of x^2 across channels)."""
    where = "lrn_cross_channel_forward"
    xp, fmt = _prologue(where, handle, lrn_desc, x, format, (2, 3, 4, 5), y=y)
    parse_enum(where, LRNMode, mode, "mode")
    check_out(where, "y", y, x.shape, x.dtype, beta)
    xc = to_channels_first(x, fmt)
    value = xc * _lrn_denominator(xp, lrn_desc, xc) ** -lrn_desc.beta
    return blend(from_channels_first(value, fmt), alpha, beta, y, x.dtype)


def lrn_cross_channel_backward(handle, lrn_desc: LRNDescriptor, y, dy, x, alpha=1.0, beta=0.0, dx=None, format=None,
                               mode=LRNMode.CROSS_CHANNEL_DIM1):
    """dx = alpha * J^T dy + beta * dx  (cuDNN order: desc, y, dy, x; S is recomputed from x, y is checked only).

    dx[j] = dy[j] S[j]^(-b) - (2 a b / n) x[j] sum_{c : j in window(c)} dy[c] x[c] S[c]^(-b-1)
    """
    where = "lrn_cross_channel_backward"
    xp, fmt = _prologue(where, handle, lrn_desc, x, format, (2, 3, 4, 5), y=y, dy=dy, dx=dx)
    parse_enum(where, LRNMode, mode, "mode")
    check_same(where, "x", x, y=y, dy=dy)
    check_out(where, "dx", dx, x.shape, x.dtype, beta)
    xc, dyc = to_channels_first(x, fmt), to_channels_first(dy, fmt)
    d = lrn_desc
    s = _lrn_denominator(xp, d, xc)
    back = window_sum(xp, dyc * xc * s ** (-d.beta - 1), (1,), d.n, _adjoint_before(d.n))
    value = dyc * s ** -d.beta - (2 * d.alpha * d.beta / d.n) * xc * back
    return blend(from_channels_first(value, fmt), alpha, beta, dx, x.dtype)


# ----------------------------------------------------------------------------------------------
# Divisive normalisation over spatial windows.

def _spatial_mean(xp, a, n, adjoint=False):
    """Zero-padded box mean over every spatial dim of a channels-first array (or its adjoint)."""
    axes = tuple(range(2, a.ndim))
    before = _adjoint_before(n) if adjoint else _before(n)
    return window_sum(xp, a, axes, n, before) / n ** len(axes)


def _divnorm_prologue(where, handle, desc, mode, x, means, format, **arrays):
    xp, fmt = _prologue(where, handle, desc, x, format, (3, 4, 5), means=means, **arrays)
    parse_enum(where, DivNormMode, mode, "mode")
    check_same(where, "x", x, means=means)
    return xp, fmt


def _divnorm_parts(xp, desc, xc, means_c):
    z = xc - (_spatial_mean(xp, xc, desc.n) if means_c is None else means_c)
    denom = desc.k + desc.alpha * _spatial_mean(xp, z * z, desc.n)
    return z, denom


def divisive_normalization_forward(handle, lrn_desc: LRNDescriptor, mode, x, means=None, alpha=1.0, beta=0.0,
                                   y=None, format=None):
    """y = alpha * z * (k + lrn.alpha * mean_window(z^2))^(-lrn.beta) + beta * y, z = x - means (see module doc)."""
    where = "divisive_normalization_forward"
    xp, fmt = _divnorm_prologue(where, handle, lrn_desc, mode, x, means, format, y=y)
    check_out(where, "y", y, x.shape, x.dtype, beta)
    means_c = None if means is None else to_channels_first(means, fmt)
    z, denom = _divnorm_parts(xp, lrn_desc, to_channels_first(x, fmt), means_c)
    return blend(from_channels_first(z * denom ** -lrn_desc.beta, fmt), alpha, beta, y, x.dtype)


def divisive_normalization_backward(handle, lrn_desc: LRNDescriptor, mode, x, means, dy, alpha=1.0, beta=0.0,
                                    dx=None, dmeans=None, format=None):
    """-> (dx, dmeans), both blended with alpha/beta; dmeans is None when means is None (computed inside).

    dz = dy D^(-b) - 2 a b z * mean_window^T(dy z D^(-b-1)),   D = k + a * mean_window(z^2)
    dx = dz - mean_window^T(dz) when the means are computed here, else dx = dz and dmeans = -dz.
    """
    where = "divisive_normalization_backward"
    xp, fmt = _divnorm_prologue(where, handle, lrn_desc, mode, x, means, format, dy=dy, dx=dx, dmeans=dmeans)
    check_same(where, "x", x, dy=dy)
    check_out(where, "dx", dx, x.shape, x.dtype, beta)
    if means is not None:
        check_out(where, "dmeans", dmeans, x.shape, x.dtype, beta)
    d = lrn_desc
    means_c = None if means is None else to_channels_first(means, fmt)
    dyc = to_channels_first(dy, fmt)
    z, denom = _divnorm_parts(xp, d, to_channels_first(x, fmt), means_c)
    dz = dyc * denom ** -d.beta - 2 * d.alpha * d.beta * z * _spatial_mean(xp, dyc * z * denom ** (-d.beta - 1),
                                                                            d.n, adjoint=True)
    if means is None:
        dx_v = dz - _spatial_mean(xp, dz, d.n, adjoint=True)
        return blend(from_channels_first(dx_v, fmt), alpha, beta, dx, x.dtype), None
    return (blend(from_channels_first(dz, fmt), alpha, beta, dx, x.dtype),
            blend(from_channels_first(-dz, fmt), alpha, beta, dmeans, x.dtype))
