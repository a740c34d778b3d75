"""Batch, layer and group normalisation (cuDNN's cudnnBatchNormalization*, cudnnNormalization*).

# x, y, dy, dx: (N, C, *S)   (batch norm with format="NHWC": (N, *S, C)); batch norm also takes (N, C)
# batch norm SPATIAL:         scale, bias, running_*, saved_*: (C,)        statistics over N and S
# batch norm PER_ACTIVATION:  scale, bias, running_*, saved_*: (C, *S)     statistics over N only
#                             (a (1, C, 1, 1) / (1, C, *S) shape is accepted too, as cuDNN's descriptors use)
# layer norm:  x (*B, *D) with D the last ``normalized_ndim`` dims; scale, bias: D;  mean, inv_std: B
# group norm:  x (N, C, *S), G groups of C/G channels; scale, bias: (C,);             mean, inv_std: (N, G)

All three share one recipe: xhat = (x - mean) * inv_std with inv_std = 1 / sqrt(var + epsilon) and the
*biased* variance, y = scale * xhat + bias.  ``scale`` and ``bias`` may be None (affine off: scale 1,
bias 0); backward then returns None for dscale and dbias.  Statistics come from the shifted one-pass
moments in _common.moments (float16 data accumulates in float32).

Batch-norm training updates the running statistics in place, cuDNN's and PyTorch's rule:
    running_mean = (1 - f) * running_mean + f * batch_mean
    running_var  = (1 - f) * running_var  + f * batch_var * m / (m - 1)     (unbiased, m values per statistic)
"""
from __future__ import annotations

import math
import os

import numpy as np

from ._common import (
    SeenCalls,
    begin,
    blend,
    check_float,
    check_ndim,
    check_out,
    moments,
    normalization_backward,
    parse_enum,
    seen_plan,
)
from .array_ops import in_layout_of, increment
from .cuda import norm_kernels as _norm_gpu  # the layer/group norm kernels (importing them needs no GPU)
from .devices import is_cuda_array as _is_cuda
from .errors import BadParamError, IdentityEnum
from .layout import TensorFormat, channels_last_perm, from_channels_first, resolve_format, to_channels_first

__all__ = ["BatchNormMode", "batch_normalization_forward_training", "batch_normalization_forward_inference",
           "batch_normalization_backward", "layer_normalization_forward", "layer_normalization_backward",
           "group_normalization_forward", "group_normalization_backward"]


class BatchNormMode(IdentityEnum):
    """cudnnBatchNormMode_t: SPATIAL keeps one mean and variance per channel, reduced over N and the spatial dims
    (BatchNorm1d/2d/3d); PER_ACTIVATION one per (C, *S) element, reduced over N only (after a fully connected layer)."""
    SPATIAL = "spatial"                 # one statistic per channel (BatchNorm1d/2d/3d)
    PER_ACTIVATION = "per_activation"   # one statistic per (C, *S) element (fully connected layers)


# ----------------------------------------------------------------------------------------------
# Steps shared by the three families.

def _check_epsilon(where, epsilon):
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise BadParamError(f"{where}: epsilon={epsilon} must be a finite number >= 0")


def _normalize(xp, x, axes, epsilon):
    """xhat, mean and inv_std (both with size-1 dims on ``axes``)."""
    mean, var = moments(xp, x, axes)
    inv_std = 1 / xp.sqrt(var + epsilon)
    return (x - mean) * inv_std, mean, var, inv_std


def _affine(xhat, scale, bias):
    y = xhat if scale is None else xhat * scale
    return y if bias is None else y + bias


def _backward(xp, xhat, dy, scale, inv_std, stat_axes, param_axes):
    """(dx, dscale, dbias) before blending; dscale and dbias are None when scale is None (affine off)."""
    dx = normalization_backward(xp, xhat, dy if scale is None else dy * scale, inv_std, stat_axes)
    if scale is None:
        return dx, None, None
    return dx, (dy * xhat).sum(axis=param_axes, keepdims=True), dy.sum(axis=param_axes, keepdims=True)


def _blend_backward(where, values, outs, x, param_shape, alpha_data, beta_data, alpha_param, beta_param):
    """Write dx, dscale, dbias with their two (alpha, beta) pairs, as cuDNN's backward does."""
    dx_v, dscale_v, dbias_v = values
    dx, dscale, dbias = outs
    dx = blend(dx_v, alpha_data, beta_data, dx, x.dtype)
    if dscale_v is None:
        return dx, None, None
    dscale = blend(dscale_v.reshape(param_shape), alpha_param, beta_param, dscale, dscale_v.dtype)
    dbias = blend(dbias_v.reshape(param_shape), alpha_param, beta_param, dbias, dbias_v.dtype)
    return dx, dscale, dbias


def _check_param(where, name, p, shapes):
    """A per-channel/per-element parameter: None or an array of one of ``shapes`` (the first is named)."""
    if p is None:
        return
    check_float(where, **{name: p})
    if tuple(p.shape) not in shapes:
        raise BadParamError(f"{where}: {name} has shape {tuple(p.shape)} but must have shape {shapes[0]}"
                            + (f" (or {', '.join(map(str, shapes[1:]))})" if len(shapes) > 1 else ""))


def _check_backward_outs(where, x, param_shape, scale, beta_data, beta_param, dx, dscale, dbias):
    check_out(where, "dx", dx, x.shape, x.dtype, beta_data)
    if scale is not None:
        check_out(where, "dscale", dscale, param_shape, dscale.dtype if dscale is not None else np.float64,
                  beta_param)
        check_out(where, "dbias", dbias, param_shape, dbias.dtype if dbias is not None else np.float64, beta_param)


# ----------------------------------------------------------------------------------------------
# Batch normalisation.

class _BatchNormGeometry:
    """The channels-first view of x, the statistic axes and the parameter shapes of one call."""

    def __init__(self, where, mode, x, format):
        self.mode = parse_enum(where, BatchNormMode, mode, "mode")
        check_float(where, x=x)
        check_ndim(where, "x", x, (2, 3, 4, 5))
        self.fmt = resolve_format(x, format)
        self.xc = to_channels_first(x, self.fmt)
        nd = self.xc.ndim
        c_shape = self.xc.shape[1:2] if self.mode is BatchNormMode.SPATIAL else self.xc.shape[1:]
        # broadcast shape of a statistic against the channels-first x, e.g. (1, C, 1, 1)
        self.bshape = (1,) + tuple(c_shape) + (1,) * (nd - 1 - len(c_shape))
        self.axes = tuple(a for a in range(nd) if self.bshape[a] == 1)
        self.count = math.prod(self.xc.shape[a] for a in self.axes)
        # Parameters are indexed like x without N: (C,), or (C, *S) / (*S, C) for PER_ACTIVATION.
        self.param_shape = self._in_format(self.bshape)[1:] if self.mode is BatchNormMode.PER_ACTIVATION \
            else tuple(c_shape)
        self.accepted = (self.param_shape, self._in_format(self.bshape))

    def _in_format(self, cf_shape):
        if self.fmt is TensorFormat.NHWC and len(cf_shape) >= 3:
            return tuple(cf_shape[i] for i in channels_last_perm(len(cf_shape)))
        return tuple(cf_shape)

    def view(self, p):
        """Parameter ``p`` (any accepted shape) as a channels-first broadcastable view, or None."""
        if p is None:
            return None
        return to_channels_first(p.reshape(self._in_format(self.bshape)), self.fmt)

    def to_param(self, v, shape=None):
        """A channels-first statistic of shape bshape, back in parameter indexing (``shape`` or param_shape)."""
        return from_channels_first(v, self.fmt).reshape(shape or self.param_shape)


def _bn_prologue(where, handle, mode, x, format, epsilon, params, others):
    """Device checks for every array, then x, the parameters (``params``) and epsilon validated."""
    handle, xp = begin(handle, where, x=x, **params, **others)
    geom = _BatchNormGeometry(where, mode, x, format)
    for name, p in params.items():
        _check_param(where, name, p, geom.accepted)
    _check_epsilon(where, epsilon)
    return xp, geom


def batch_normalization_forward_training(handle, mode, x, scale, bias, exponential_average_factor,
                                         running_mean, running_var, epsilon, alpha=1.0, beta=0.0, y=None,
                                         format=None, counter=None):
    """Normalise with the batch's statistics -> (y, saved_mean, saved_inv_variance).

    running_mean / running_var (each may be None) are updated in place with factor f =
    ``exponential_average_factor`` (PyTorch's momentum).  saved_inv_variance is 1/sqrt(var + epsilon),
    what backward needs.  An empty batch returns an empty y, zero saved statistics and leaves the
    running statistics untouched; a single value per statistic (e.g. N=1 with PER_ACTIVATION) is an
    error, as in PyTorch, because the unbiased variance is undefined.

    ``counter`` (minidnn's extension; None by default): a one-element int64 array -- BatchNorm's
    ``num_batches_tracked`` -- incremented by one when the call succeeds; on the GPU by the statistics kernel
    itself, so a training step launches no separate counter kernel per layer.
    """
    key = _gpu_call_key(x, y, "train", handle, mode, format, exponential_average_factor, epsilon, alpha, beta,
                        scale, bias, running_mean, running_var, counter)
    if key is not None and (seen := _SEEN.get(key)) is not None:     # validated before: straight to the kernels
        return _gpu_bn_training(seen.at(x), x, scale, bias, exponential_average_factor, running_mean, running_var,
                                epsilon, alpha, beta, y, counter=counter, checked=True)
    where = "batch_normalization_forward_training"
    xp, geom = _bn_prologue(where, handle, mode, x, format, epsilon,
                            dict(scale=scale, bias=bias, running_mean=running_mean, running_var=running_var),
                            dict(y=y, counter=counter))
    check_out(where, "y", y, x.shape, x.dtype, beta)
    _check_counter(where, counter)
    f = exponential_average_factor
    if not 0 <= f <= 1:
        raise BadParamError(f"{where}: exponential_average_factor={f} must be in [0, 1]")
    if geom.count == 1 and x.size:
        raise BadParamError(f"{where}: expected more than 1 value per statistic when training, got x of shape "
                            f"{tuple(x.shape)} in mode {geom.mode.name}")

    if x.size == 0:
        zeros = xp.zeros(geom.param_shape, dtype=np.float32 if x.dtype == np.float16 else x.dtype)
        out = blend(xp.empty(x.shape, dtype=x.dtype), alpha, beta, y, x.dtype), zeros, zeros.copy()
        if counter is not None:
            increment(counter)
        return out
    fast = _gpu_bn_training(geom, x, scale, bias, f, running_mean, running_var, epsilon, alpha, beta, y, key=key,
                            counter=counter)
    if fast is not None:        # the CUDA kernels (see the GPU fast paths block at the end of this file)
        return fast
    xhat, mean, var, inv_std = _normalize(xp, geom.xc, geom.axes, epsilon)
    for running, batch in ((running_mean, mean), (running_var, var * (geom.count / (geom.count - 1)))):
        if running is not None:
            running[...] = (1 - f) * running + f * geom.to_param(batch, running.shape)
    value = from_channels_first(_affine(xhat, geom.view(scale), geom.view(bias)), geom.fmt)
    if counter is not None:
        increment(counter)
    return blend(value, alpha, beta, y, x.dtype), geom.to_param(mean), geom.to_param(inv_std)


def _check_counter(where, counter):
    if counter is not None and (counter.dtype != np.int64 or counter.size != 1):
        raise BadParamError(f"{where}: counter must be a one-element int64 array (BatchNorm's num_batches_tracked), "
                            f"got shape {tuple(counter.shape)} and dtype {counter.dtype}")


def batch_normalization_forward_inference(handle, mode, x, scale, bias, estimated_mean, estimated_variance,
                                          epsilon, alpha=1.0, beta=0.0, y=None, format=None):
    """y = alpha * (scale * (x - estimated_mean) / sqrt(estimated_variance + epsilon) + bias) + beta * y."""
    key = _gpu_call_key(x, y, "infer", handle, mode, format, epsilon, alpha, beta, scale, bias, estimated_mean,
                        estimated_variance)
    if key is not None and (seen := _SEEN.get(key)) is not None:     # validated before: straight to the kernel
        return _gpu_bn_inference(seen.at(x), x, scale, bias, estimated_mean, estimated_variance, epsilon, alpha, beta,
                                 y, checked=True)
    where = "batch_normalization_forward_inference"
    if estimated_mean is None or estimated_variance is None:
        raise BadParamError(f"{where}: estimated_mean and estimated_variance are required")
    xp, geom = _bn_prologue(where, handle, mode, x, format, epsilon,
                            dict(scale=scale, bias=bias, estimated_mean=estimated_mean,
                                 estimated_variance=estimated_variance), dict(y=y))
    check_out(where, "y", y, x.shape, x.dtype, beta)
    fast = _gpu_bn_inference(geom, x, scale, bias, estimated_mean, estimated_variance, epsilon, alpha, beta, y,
                             key=key)
    if fast is not None:        # the CUDA kernel (see the GPU fast paths block at the end of this file)
        return fast
    xhat = (geom.xc - geom.view(estimated_mean)) / xp.sqrt(geom.view(estimated_variance) + epsilon)
    value = from_channels_first(_affine(xhat, geom.view(scale), geom.view(bias)), geom.fmt)
    return blend(value, alpha, beta, y, x.dtype)


def batch_normalization_backward(handle, mode, x, dy, scale, saved_mean, saved_inv_variance, epsilon,
                                 alpha_data=1.0, beta_data=0.0, alpha_param=1.0, beta_param=0.0,
                                 dx=None, dscale=None, dbias=None, format=None):
    """-> (dx, dscale, dbias), blended with (alpha_data, beta_data) and (alpha_param, beta_param).

    saved_mean / saved_inv_variance come from the training forward; pass both as None to recompute
    them from x and epsilon (as cuDNN allows).  dscale and dbias take scale's shape and are None when
    scale is None.  ``dx`` may be laid out in any memory order (the caller's layout, as cuDNN's dxDesc:
    e.g. channels-last memory for an NCHW x, which a convolution's NHWC loader then reads as it is); on
    the GPU, with beta_data 0, the kernels write it there themselves where they can (bn_kernels.backward).
    """
    key = _gpu_call_key(x, None if dx is None and dscale is None and dbias is None else x, "backward", handle,
                        mode, format,
                        epsilon, alpha_data, beta_data, alpha_param, beta_param, dy, scale, saved_mean,
                        saved_inv_variance)
    if key is not None and (seen := _SEEN.get(key)) is not None:     # validated before: straight to the kernels
        return _gpu_bn_backward(seen.at(x), x, dy, scale, saved_mean, saved_inv_variance, seen.grad_shape,
                                (alpha_data, beta_data, alpha_param, beta_param), (dx, dscale, dbias), checked=True)
    where = "batch_normalization_backward"
    xp, geom = _bn_prologue(where, handle, mode, x, format, epsilon,
                            dict(scale=scale, saved_mean=saved_mean, saved_inv_variance=saved_inv_variance),
                            dict(dy=dy, dx=dx, dscale=dscale, dbias=dbias))
    if tuple(dy.shape) != tuple(x.shape) or dy.dtype != x.dtype:
        raise BadParamError(f"{where}: dy ({tuple(dy.shape)}, {dy.dtype}) must match x ({tuple(x.shape)}, {x.dtype})")
    if (saved_mean is None) != (saved_inv_variance is None):
        raise BadParamError(f"{where}: give both saved_mean and saved_inv_variance, or neither (to recompute)")
    param_shape = tuple(scale.shape) if scale is not None else geom.param_shape
    _check_backward_outs(where, x, param_shape, scale, beta_data, beta_param, dx, dscale, dbias)

    if x.size == 0:
        values = (xp.zeros(x.shape, x.dtype),) + ((None, None) if scale is None else
                                                  (xp.zeros(param_shape, scale.dtype),) * 2)
    elif (fast := _gpu_bn_backward(geom, x, dy, scale, saved_mean, saved_inv_variance, param_shape,
                                   (alpha_data, beta_data, alpha_param, beta_param), (dx, dscale, dbias),
                                   key=key)) is not None:
        return fast             # the CUDA kernels (see the GPU fast paths block at the end of this file)
    else:
        dyc = to_channels_first(dy, geom.fmt)
        if saved_mean is None:
            xhat, _, _, inv_std = _normalize(xp, geom.xc, geom.axes, epsilon)
        else:
            inv_std = geom.view(saved_inv_variance)
            xhat = (geom.xc - geom.view(saved_mean)) * inv_std
        dx_v, dscale_v, dbias_v = _backward(xp, xhat, dyc, geom.view(scale), inv_std, geom.axes, geom.axes)
        values = (from_channels_first(dx_v, geom.fmt),
                  None if scale is None else geom.to_param(dscale_v, param_shape),
                  None if scale is None else geom.to_param(dbias_v, param_shape))
    return _blend_backward(where, values, (dx, dscale, dbias), x, param_shape,
                           alpha_data, beta_data, alpha_param, beta_param)


# ----------------------------------------------------------------------------------------------
# Layer normalisation: statistics per sample over the last ``normalized_ndim`` dims.

def _ln_geometry(where, x, normalized_ndim, params):
    check_float(where, x=x)
    k = normalized_ndim
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= x.ndim):
        raise BadParamError(f"{where}: normalized_ndim={k} must be an int in [1, {x.ndim}] for x of shape "
                            f"{tuple(x.shape)}")
    normalized_shape = tuple(x.shape[x.ndim - k:])
    if math.prod(normalized_shape) == 0:
        raise BadParamError(f"{where}: cannot normalise over the empty dims {normalized_shape} of x {tuple(x.shape)}")
    for name, p in params.items():
        _check_param(where, name, p, (normalized_shape,))
    return tuple(range(x.ndim - k, x.ndim)), tuple(range(x.ndim - k)), normalized_shape


def layer_normalization_forward(handle, x, scale, bias, normalized_ndim, epsilon, alpha=1.0, beta=0.0, y=None):
    """-> (y, mean, inv_std); mean and inv_std have shape x.shape[:-normalized_ndim] (PyTorch's LayerNorm)."""
    key, seen = _norm_seen(_norm_key("ln", handle, y, x, normalized_ndim, epsilon, (alpha, beta), scale, bias))
    if seen:                    # validated before: straight to the kernel
        return _norm_gpu.layer_norm_forward(x, normalized_ndim, scale, bias, epsilon)
    where = "layer_normalization_forward"
    handle, xp = begin(handle, where, x=x, scale=scale, bias=bias, y=y)
    axes, _, _ = _ln_geometry(where, x, normalized_ndim, dict(scale=scale, bias=bias))
    _check_epsilon(where, epsilon)
    check_out(where, "y", y, x.shape, x.dtype, beta)
    if (fast := _gpu_norm_forward("ln", x, normalized_ndim, scale, bias, epsilon, alpha, beta, y)) is not None:
        _NORM_SEEN.remember(key, True)
        return fast             # the CUDA kernel (backend/cuda/norm_kernels.py; the block at the end of this file)
    xhat, mean, _, inv_std = _normalize(xp, x, axes, epsilon)
    stat_shape = x.shape[:x.ndim - normalized_ndim]
    return (blend(_affine(xhat, scale, bias), alpha, beta, y, x.dtype),
            mean.reshape(stat_shape), inv_std.reshape(stat_shape))


def layer_normalization_backward(handle, x, dy, scale, mean, inv_std, normalized_ndim, alpha_data=1.0,
                                 beta_data=0.0, alpha_param=1.0, beta_param=0.0, dx=None, dscale=None, dbias=None):
    """-> (dx, dscale, dbias) from the forward's mean and inv_std; dscale/dbias None when scale is None."""
    key, seen = _norm_seen(_norm_key("ln_bwd", handle, dx if dscale is None and dbias is None else x, x,
                                     normalized_ndim, 0.0, (alpha_data, beta_data, alpha_param, beta_param), scale, dy,
                                     mean, inv_std))
    if seen:                    # validated before: straight to the kernels
        return _gpu_norm_backward_seen(_norm_gpu.layer_norm_backward(x, dy, normalized_ndim, scale, mean, inv_std),
                                       scale)
    where = "layer_normalization_backward"
    handle, xp = begin(handle, where, x=x, dy=dy, scale=scale, mean=mean, inv_std=inv_std, dx=dx, dscale=dscale,
                       dbias=dbias)
    axes, lead_axes, normalized_shape = _ln_geometry(where, x, normalized_ndim, dict(scale=scale))
    _check_dy_and_stats(where, x, dy, dict(mean=mean, inv_std=inv_std), x.shape[:x.ndim - normalized_ndim])
    _check_backward_outs(where, x, normalized_shape, scale, beta_data, beta_param, dx, dscale, dbias)
    if (fast := _gpu_norm_backward("ln", x, dy, normalized_ndim, scale, mean, inv_std, normalized_shape,
                                   (alpha_data, beta_data, alpha_param, beta_param), (dx, dscale, dbias))) is not None:
        _NORM_SEEN.remember(key, True)
        return fast
    stat_shape = x.shape[:x.ndim - normalized_ndim] + (1,) * normalized_ndim
    inv_std = inv_std.reshape(stat_shape)
    xhat = (x - mean.reshape(stat_shape)) * inv_std
    values = _backward(xp, xhat, dy, scale, inv_std, axes, lead_axes)
    return _blend_backward(where, values, (dx, dscale, dbias), x, normalized_shape,
                           alpha_data, beta_data, alpha_param, beta_param)


def _check_dy_and_stats(where, x, dy, stats, stat_shape):
    if dy is None or tuple(dy.shape) != tuple(x.shape) or dy.dtype != x.dtype:
        raise BadParamError(f"{where}: dy ({None if dy is None else (tuple(dy.shape), str(dy.dtype))}) must match "
                            f"x ({tuple(x.shape)}, {x.dtype})")
    for name, s in stats.items():
        if s is None or tuple(s.shape) != tuple(stat_shape):
            raise BadParamError(f"{where}: {name} must be the forward's statistic of shape {tuple(stat_shape)}, got "
                                f"{None if s is None else tuple(s.shape)}")


# ----------------------------------------------------------------------------------------------
# Group normalisation: statistics per sample and group of C/G channels; scale and bias per channel.

def _gn_geometry(where, x, num_groups, params):
    check_float(where, x=x)
    check_ndim(where, "x", x, (2, 3, 4, 5))
    c = x.shape[1]
    if not (isinstance(num_groups, (int, np.integer)) and num_groups >= 1 and c % num_groups == 0):
        raise BadParamError(f"{where}: num_groups={num_groups} must be a positive divisor of the {c} channels of x "
                            f"{tuple(x.shape)}")
    if c // num_groups * math.prod(x.shape[2:]) == 0:
        raise BadParamError(f"{where}: each group of x {tuple(x.shape)} is empty")
    for name, p in params.items():
        _check_param(where, name, p, ((c,),))
    bshape = (1, c) + (1,) * (x.ndim - 2)
    # explicit group size rather than -1: reshape cannot infer it when the batch is empty
    grouped = (x.shape[0], num_groups, c // num_groups * math.prod(x.shape[2:]))
    return grouped, bshape, tuple(a for a in range(x.ndim) if a != 1)


def group_normalization_forward(handle, x, num_groups, scale, bias, epsilon, alpha=1.0, beta=0.0, y=None):
    """-> (y, mean, inv_std) with mean, inv_std of shape (N, num_groups) (PyTorch's GroupNorm)."""
    key, seen = _norm_seen(_norm_key("gn", handle, y, x, num_groups, epsilon, (alpha, beta), scale, bias))
    if seen:                    # validated before: straight to the kernel
        return _norm_gpu.group_norm_forward(x, num_groups, scale, bias, epsilon)
    where = "group_normalization_forward"
    handle, xp = begin(handle, where, x=x, scale=scale, bias=bias, y=y)
    grouped, bshape, _ = _gn_geometry(where, x, num_groups, dict(scale=scale, bias=bias))
    _check_epsilon(where, epsilon)
    check_out(where, "y", y, x.shape, x.dtype, beta)
    if (fast := _gpu_norm_forward("gn", x, num_groups, scale, bias, epsilon, alpha, beta, y)) is not None:
        _NORM_SEEN.remember(key, True)
        return fast
    xhat, mean, _, inv_std = _normalize(xp, x.reshape(grouped), (2,), epsilon)
    value = _affine(xhat.reshape(x.shape), None if scale is None else scale.reshape(bshape),
                    None if bias is None else bias.reshape(bshape))
    return blend(value, alpha, beta, y, x.dtype), mean[..., 0], inv_std[..., 0]


def group_normalization_backward(handle, x, dy, num_groups, scale, mean, inv_std, alpha_data=1.0, beta_data=0.0,
                                 alpha_param=1.0, beta_param=0.0, dx=None, dscale=None, dbias=None):
    """-> (dx, dscale, dbias) from the forward's mean and inv_std; dscale/dbias None when scale is None."""
    key, seen = _norm_seen(_norm_key("gn_bwd", handle, dx if dscale is None and dbias is None else x, x, num_groups,
                                     0.0, (alpha_data, beta_data, alpha_param, beta_param), scale, dy, mean, inv_std))
    if seen:                    # validated before: straight to the kernels
        return _gpu_norm_backward_seen(_norm_gpu.group_norm_backward(x, dy, num_groups, scale, mean, inv_std),
                                       scale)
    where = "group_normalization_backward"
    handle, xp = begin(handle, where, x=x, dy=dy, scale=scale, mean=mean, inv_std=inv_std, dx=dx, dscale=dscale,
                       dbias=dbias)
    grouped, bshape, param_axes = _gn_geometry(where, x, num_groups, dict(scale=scale))
    _check_dy_and_stats(where, x, dy, dict(mean=mean, inv_std=inv_std), (x.shape[0], num_groups))
    _check_backward_outs(where, x, (x.shape[1],), scale, beta_data, beta_param, dx, dscale, dbias)
    if (fast := _gpu_norm_backward("gn", x, dy, num_groups, scale, mean, inv_std, (x.shape[1],),
                                   (alpha_data, beta_data, alpha_param, beta_param), (dx, dscale, dbias))) is not None:
        _NORM_SEEN.remember(key, True)
        return fast
    inv_std_g = inv_std[..., None]
    xhat_g = (x.reshape(grouped) - mean[..., None]) * inv_std_g
    # Per-channel scale acts before the grouped statistics: fold it into dxhat in x's shape, then group.
    dxhat = dy if scale is None else dy * scale.reshape(bshape)
    dx_v = normalization_backward(xp, xhat_g, dxhat.reshape(grouped), inv_std_g, (2,)).reshape(x.shape)
    if scale is None:
        values = (dx_v, None, None)
    else:
        xhat = xhat_g.reshape(x.shape)
        values = (dx_v, (dy * xhat).sum(axis=param_axes), dy.sum(axis=param_axes))
    return _blend_backward(where, values, (dx, dscale, dbias), x, (x.shape[1],),
                           alpha_data, beta_data, alpha_param, beta_param)


# ----------------------------------------------------------------------------------------------
# Layer and group norm on the GPU (backend/cuda/norm_kernels.py): C-contiguous CuPy x (float32/64, float16,
# bfloat16), parameters of x's dtype or float32, no blending, no output buffers.  None sends the call to the
# reference above.  ``kind`` is "ln" (``arg`` = normalized_ndim) or "gn" (``arg`` = num_groups).

def _gpu_norm_forward(kind, x, arg, scale, bias, epsilon, alpha, beta, y):
    if not (_is_cuda(x) and _gpu_plain(alpha, beta, y)):
        return None
    if kind == "ln":
        if not _norm_gpu.supports_layer_norm(x, arg, scale, bias):
            return None
        return _norm_gpu.layer_norm_forward(x, arg, scale, bias, epsilon)
    if not _norm_gpu.supports_group_norm(x, arg, scale, bias):
        return None
    return _norm_gpu.group_norm_forward(x, arg, scale, bias, epsilon)


def _gpu_norm_backward_seen(grads, scale):
    """_gpu_norm_backward's result for a seen call: dscale and dbias shaped like scale, as it reshapes them."""
    dx, dscale, dbias = grads
    if dscale is not None and dscale.shape != scale.shape:
        dscale, dbias = dscale.reshape(scale.shape), dbias.reshape(scale.shape)
    return dx, dscale, dbias


# Layer- and group-norm calls the kernels took, by their full signature: the kind, the handle's device (None: x's
# default handle), normalized_ndim / num_groups, epsilon, the blending factors and every array's shape, dtype,
# strides and device.  The same call again skips the validation (which it would pass again: every check reads only
# these) and the kernels' support tests -- one dict lookup, then the kernel module's call with its own plan
# (which picks the variant by the arrays' 16-byte alignment per call).  docs/host_overhead.md round 18.
# Switch: SEEN_ON[0] = False (or MINIDNN_NORM_SEEN=0 at import): every call takes the full path.
_NORM_SEEN = SeenCalls()
SEEN_ON = [os.environ.get("MINIDNN_NORM_SEEN", "1") != "0"]


def _norm_key(kind, handle, out, x, arg, epsilon, blending, *arrays):
    """The signature of a layer/group norm GPU call without output arrays, or None (not cached): an output array,
    a switch off, a non-CuPy x, an ``arg`` or epsilon not a plain int / float (1.0 or 1 + 0j hash like 1 and 1.0
    but fail the checks), an array argument that is not a CuPy array or None."""
    if out is not None or not SEEN_ON[0] or type(arg) is not int or type(epsilon) is not float \
            or not _is_cuda(x):
        return None
    try:
        return (kind, None if handle is None else handle.device, arg, epsilon, blending,
                (x.shape, x.dtype, x.strides, x.data.device_id),
                *[None if a is None else (a.shape, a.dtype, a.strides, a.data.device_id) for a in arrays])
    except AttributeError:
        return None


def _norm_seen(key):
    return seen_plan(_NORM_SEEN, key)


def _gpu_norm_backward(kind, x, dy, arg, scale, mean, inv_std, param_shape, blending, outs):
    if not (_is_cuda(x) and blending == (1.0, 0.0, 1.0, 0.0) and all(o is None for o in outs)):
        return None
    if not _norm_gpu.supports_stats(x, mean, inv_std):
        return None
    if kind == "ln":
        if not _norm_gpu.supports_layer_norm(x, arg, scale, None, dy):
            return None
        dx, dscale, dbias = _norm_gpu.layer_norm_backward(x, dy, arg, scale, mean, inv_std)
    else:
        if not _norm_gpu.supports_group_norm(x, arg, scale, None, dy):
            return None
        dx, dscale, dbias = _norm_gpu.group_norm_backward(x, dy, arg, scale, mean, inv_std)
    if dscale is not None and dscale.shape != tuple(param_shape):
        dscale, dbias = dscale.reshape(param_shape), dbias.reshape(param_shape)
    return dx, dscale, dbias


# ----------------------------------------------------------------------------------------------
# GPU fast paths and fused batch-norm primitives (backend/cuda/bn_kernels.py).  Owned by the step-kernels work
# (issue 10); the reference above stays the spec.  Each helper returns None when the kernels do not take the call
# (CPU arrays, PER_ACTIVATION, float16, blending, odd layouts), and the reference runs.

class BatchNormOps(IdentityEnum):
    """cuDNN's cudnnBatchNormOps_t: what the *_ex primitives fuse after the normalisation."""
    BN = "bn"                                   # y = bn(x)
    BN_ACTIVATION = "bn_activation"             # y = relu(bn(x))
    BN_ADD_ACTIVATION = "bn_add_activation"     # y = relu(bn(x) + z)


_GPU = []


def _gpu_kernels():
    if not _GPU:
        from .cuda import bn_kernels
        from .devices import is_cuda_array
        _GPU.extend((is_cuda_array, bn_kernels))
    return _GPU


def _gpu_plain(alpha, beta, *outs):
    return alpha == 1 and beta == 0 and all(o is None for o in outs)


# Calls the kernels took, by their full signature (every array's shape, dtype, strides and device; every setting):
# the same call again skips the validation, which it would pass again, and the geometry (host cost per step).
_SEEN = SeenCalls()


class _SeenGeometry:
    """What a validated call decided: the format, the parameter shape, the gradient parameter shape."""
    mode = BatchNormMode.SPATIAL
    want_dz = False         # backward_ex: whether the call returns dz (BN_ADD_ACTIVATION)

    def __init__(self, geom, grad_shape=None):
        self.fmt, self.param_shape, self.grad_shape = geom.fmt, geom.param_shape, grad_shape

    def at(self, x):
        return _SeenCall(self, to_channels_first(x, self.fmt))


class _SeenCall:
    __slots__ = ("mode", "fmt", "param_shape", "xc")

    def __init__(self, seen, xc):
        self.mode, self.fmt, self.param_shape, self.xc = seen.mode, seen.fmt, seen.param_shape, xc


def _gpu_call_key(x, out, *settings_and_arrays):
    """The signature of a CUDA call without output buffers (None for anything else: those are never cached)."""
    is_cuda, _ = _gpu_kernels()
    if out is not None or not is_cuda(x):
        return None
    try:
        # arrays by what a check reads (data.device_id: x.device would build a CuPy Device per array)
        key = [a if not hasattr(a, "strides") else (a.shape, a.dtype, a.strides, a.data.device_id)
               for a in settings_and_arrays]
        key[1] = None if key[1] is None else getattr(key[1], "device", id(key[1]))
        key.append((x.shape, x.dtype, x.strides, x.data.device_id))
        key = tuple(key)
        hash(key)
    except (TypeError, AttributeError):
        return None
    return key


def _gpu_remember(key, geom, grad_shape=None):
    _SEEN.remember(key, _SeenGeometry(geom, grad_shape))


def _gpu_bn_training(geom, x, scale, bias, f, running_mean, running_var, epsilon, alpha, beta, y, z=None,
                     relu=False, key=None, checked=False, counter=None):
    is_cuda, k = _gpu_kernels()
    if not checked and not (_gpu_plain(alpha, beta, y)
                            and _kernels_take_training(geom, x, scale, bias, running_mean, running_var, z, counter)):
        return None
    _gpu_remember(key, geom)
    zc = None if z is None else to_channels_first(z, geom.fmt)
    yc, mean, inv_std = k.forward_training(geom.xc, scale, bias, f, running_mean, running_var, epsilon, zc, relu,
                                           counter)
    if mean.shape != geom.param_shape:
        mean, inv_std = mean.reshape(geom.param_shape), inv_std.reshape(geom.param_shape)
    return from_channels_first(yc, geom.fmt), mean, inv_std


def _kernels_take_training(geom, x, scale, bias, running_mean, running_var, z, counter):
    """Whether the kernels take a validated training call without blending (else the reference runs)."""
    is_cuda, k = _gpu_kernels()
    return (is_cuda(x) and geom.mode is BatchNormMode.SPATIAL and (counter is None or counter.flags.c_contiguous)
            and k.supports(geom.xc, scale, bias, running_mean, running_var,
                           others=(None if z is None else to_channels_first(z, geom.fmt),)))


def _gpu_bn_inference(geom, x, scale, bias, mean, var, epsilon, alpha, beta, y, z=None, relu=False, key=None,
                      checked=False):
    is_cuda, k = _gpu_kernels()
    if not checked and not (is_cuda(x) and geom.mode is BatchNormMode.SPATIAL and _gpu_plain(alpha, beta, y)
                            and k.supports(geom.xc, scale, bias, mean, var,
                                           others=(None if z is None else to_channels_first(z, geom.fmt),))):
        return None
    _gpu_remember(key, geom)
    zc = None if z is None else to_channels_first(z, geom.fmt)
    return from_channels_first(k.forward_inference(geom.xc, scale, bias, mean, var, epsilon, zc, relu), geom.fmt)


def _gpu_bn_backward(geom, x, dy, scale, saved_mean, saved_inv, param_shape, blending, outs, y=None, want_dz=False,
                     key=None, checked=False):
    is_cuda, k = _gpu_kernels()
    if not checked and not is_cuda(x):
        return None
    # a dy in another memory order than x (the gradient of a cast or a broadcast reaching a channels-last batch
    # norm) is copied into x's order, once: the kernels take it, and dx comes back in x's order, as x.grad must
    dyc = in_layout_of(to_channels_first(dy, geom.fmt), geom.xc)
    yc = None if y is None else to_channels_first(y, geom.fmt)
    # a dx destination (alpha 1, beta 0: its old contents unread) in any memory order -- the caller's layout, as
    # cuDNN's dxDesc: the kernels write into it (an NCHW x's dx in channels-last memory too: DX_NHWC) or copy
    dest = outs[0]
    if not checked and not (blending == (1.0, 0.0, 1.0, 0.0) and outs[1] is None and outs[2] is None
                            and (dest is None or is_cuda(dest))
                            and _kernels_take_backward(geom, dyc, yc, scale, saved_mean, saved_inv, param_shape)):
        return None
    if dest is None:
        _gpu_remember(key, geom, param_shape)
    if saved_mean.ndim != 1:
        saved_mean, saved_inv = saved_mean.reshape(-1), saved_inv.reshape(-1)
    dx, dz, dscale, dbias = k.backward(geom.xc, dyc, scale, saved_mean, saved_inv, yc, want_dz,
                                       None if dest is None else to_channels_first(dest, geom.fmt))
    dx = from_channels_first(dx, geom.fmt) if dest is None else dest
    dz = None if dz is None else from_channels_first(dz, geom.fmt)
    if scale is None:
        return (dx, dz, None, None) if want_dz else (dx, None, None)
    if dscale.shape != tuple(param_shape):
        dscale, dbias = dscale.reshape(param_shape), dbias.reshape(param_shape)
    return (dx, dz, dscale, dbias) if want_dz else (dx, dscale, dbias)


def _kernels_take_backward(geom, dyc, yc, scale, saved_mean, saved_inv, param_shape):
    """Whether the kernels take a validated backward call without blending or output arrays (dyc in x's layout)."""
    acc = np.float64 if geom.xc.dtype == np.float64 else np.float32
    return (geom.mode is BatchNormMode.SPATIAL and saved_mean is not None
            and saved_mean.dtype == acc and saved_inv.dtype == acc
            and saved_mean.flags.c_contiguous and saved_inv.flags.c_contiguous
            and (scale is None or tuple(scale.shape) == tuple(param_shape))
            and _gpu_kernels()[1].supports(geom.xc, scale, others=(dyc, yc)))


# ----------------------------------------------------------------------------------------------
# nn's remembered batch-norm calls (nn/_functions/norm.py, docs/host_overhead.md round 14).  After a call of nn's
# full path went through a primitive below and passed its checks, nn asks here for what the primitive ran: the
# kernels' settled call (bn_kernels.training_call / backward_call, act_kernels' plan for the fused node's ReLU), or
# None where the primitive ran anything else -- the reference, a copy of dy into x's memory order, results reshaped
# or transposed after the kernels.  nn then serves the same signature by calling that object directly.  Each
# function decides with the primitive's own predicate (_kernels_take_*), for the primitive's defaults as nn calls it:
# mode SPATIAL, format None (channels-first indexing), no blending, no output arrays.

def settled_training(x, scale, bias, factor, running_mean, running_var, epsilon, counter=None, twin=False):
    """The kernels' settled call of batch_normalization_forward_training(handle, SPATIAL, x, scale, bias, factor,
    running_mean, running_var, epsilon, counter=counter), a call the caller has just made successfully; or None.
    ``twin``: the call that also returns relu(y), the bits the ReLU kernel would write from y (bn_kernels.twin_call:
    (y, mean, inv_std, relu(y))); None where the kernels have none for this call."""
    if not (_is_cuda(x) and x.size):
        return None
    geom = _BatchNormGeometry("settled_training", BatchNormMode.SPATIAL, x, None)
    if geom.count <= 1 or geom.param_shape != tuple(x.shape[1:2]) \
            or not _kernels_take_training(geom, x, scale, bias, running_mean, running_var, None, counter):
        return None
    if twin:
        return _gpu_kernels()[1].twin_call(x, scale, bias, factor, running_mean, running_var, epsilon, counter) \
            or None
    return _gpu_kernels()[1].training_call(x, scale, bias, factor, running_mean, running_var, epsilon, None, False,
                                           counter)


def settled_backward(x, dy, scale, saved_mean, saved_inv_variance, y=None, want_dz=False, dx_channels_last=False):
    """The kernels' settled call of batch_normalization_backward(handle, SPATIAL, x, dy, scale, saved_mean,
    saved_inv_variance, epsilon) (``y`` None) or of batch_normalization_backward_ex with BN_ACTIVATION (``y``, not
    ``want_dz``) or BN_ADD_ACTIVATION (``want_dz``), a call the caller has just made successfully; or None.  None
    also where dy is not laid out as x is (the primitive copies it first).  ``dx_channels_last`` (an NCHW x): the
    call that writes dx in channels-last memory itself (the primitives given such a ``dx``:
    bn_kernels.dx_nhwc_call), or None where the kernels do not write it so for this call."""
    if not (_is_cuda(x) and x.size and dy.strides == x.strides and dy.dtype == x.dtype and dy.shape == x.shape):
        return None
    geom = _BatchNormGeometry("settled_backward", BatchNormMode.SPATIAL, x, None)
    param_shape = tuple(scale.shape) if scale is not None else geom.param_shape
    if param_shape != tuple(x.shape[1:2]) or saved_mean is None or saved_mean.ndim != 1 \
            or not _kernels_take_backward(geom, dy, y, scale, saved_mean, saved_inv_variance, param_shape):
        return None
    if dx_channels_last:
        return _gpu_kernels()[1].dx_nhwc_call(x, dy, scale, saved_mean, y, want_dz) or None
    return _gpu_kernels()[1].backward_call(x, dy, scale, saved_mean, y, want_dz)


def settled_activation(desc, x):
    """The activation kernels' plan that activation_forward(handle, desc, x) runs for a CuPy x, by the rule of
    backend/activation.py's GPU path (the kernels' dtypes and modes, C or channels-last memory, no blending); or
    None.  (Here rather than there: that module is another work's; the rule is two lines, kept in step by tests.)"""
    from .cuda import act_kernels
    if not (_is_cuda(x) and act_kernels.supports(desc.mode.name, x)):
        return None
    return act_kernels.plan(desc.mode.name, desc.coef, x)


def _bn_ops_prologue(where, bn_ops, x, z, format):
    bn_ops = parse_enum(where, BatchNormOps, bn_ops, "bn_ops")
    if bn_ops is BatchNormOps.BN_ADD_ACTIVATION:
        if z is None or tuple(z.shape) != tuple(x.shape) or z.dtype != x.dtype:
            raise BadParamError(f"{where}: BN_ADD_ACTIVATION adds z, which must match x ({tuple(x.shape)}, {x.dtype}),"
                                f" got {None if z is None else (tuple(z.shape), str(z.dtype))}")
    elif z is not None:
        raise BadParamError(f"{where}: z is only used by BN_ADD_ACTIVATION, got bn_ops={bn_ops.name}")
    return bn_ops


def _relu_after(xp, v, z):
    v = v if z is None else v + z
    return xp.maximum(v, 0)


def batch_normalization_forward_training_ex(handle, mode, bn_ops, x, z, scale, bias, exponential_average_factor,
                                            running_mean, running_var, epsilon, format=None):
    """cuDNN's cudnnBatchNormalizationForwardTrainingEx: y = bn(x), relu(bn(x)) or relu(bn(x) + z) by ``bn_ops``
    -> (y, saved_mean, saved_inv_variance).  The reference is the composition; on the GPU one fused pass writes y."""
    key = _gpu_call_key(x, None, "train_ex", handle, mode, format, exponential_average_factor, epsilon, bn_ops, z,
                        scale, bias, running_mean, running_var)
    if key is not None and (seen := _SEEN.get(key)) is not None:     # validated before: straight to the kernels
        return _gpu_bn_training(seen.at(x), x, scale, bias, exponential_average_factor, running_mean, running_var,
                                epsilon, 1.0, 0.0, None, z, True, checked=True)
    where = "batch_normalization_forward_training_ex"
    bn_ops = _bn_ops_prologue(where, bn_ops, x, z, format)
    if bn_ops is not BatchNormOps.BN and x.size:
        xp, geom = _bn_prologue(where, handle, mode, x, format, epsilon,
                                dict(scale=scale, bias=bias, running_mean=running_mean, running_var=running_var),
                                dict(z=z))
        if not 0 <= exponential_average_factor <= 1:
            raise BadParamError(f"{where}: exponential_average_factor={exponential_average_factor} must be in [0, 1]")
        fast = _gpu_bn_training(geom, x, scale, bias, exponential_average_factor, running_mean, running_var, epsilon,
                                1.0, 0.0, None, z, True, key=key) if geom.count > 1 else None
        if fast is not None:
            return fast
    y, mean, inv_std = batch_normalization_forward_training(handle, mode, x, scale, bias, exponential_average_factor,
                                                            running_mean, running_var, epsilon, format=format)
    if bn_ops is not BatchNormOps.BN:
        y = _relu_after(begin(handle, where, x=x)[1], y, z)
    return y, mean, inv_std


def batch_normalization_forward_inference_ex(handle, mode, bn_ops, x, z, scale, bias, estimated_mean,
                                             estimated_variance, epsilon, format=None):
    """Inference batch norm followed by ``bn_ops``' ReLU (after adding z); one fused pass on the GPU."""
    where = "batch_normalization_forward_inference_ex"
    bn_ops = _bn_ops_prologue(where, bn_ops, x, z, format)
    if bn_ops is not BatchNormOps.BN and x.size and estimated_mean is not None and estimated_variance is not None:
        xp, geom = _bn_prologue(where, handle, mode, x, format, epsilon,
                                dict(scale=scale, bias=bias, estimated_mean=estimated_mean,
                                     estimated_variance=estimated_variance), dict(z=z))
        fast = _gpu_bn_inference(geom, x, scale, bias, estimated_mean, estimated_variance, epsilon, 1.0, 0.0, None,
                                 z, True)
        if fast is not None:
            return fast
    y = batch_normalization_forward_inference(handle, mode, x, scale, bias, estimated_mean, estimated_variance,
                                              epsilon, format=format)
    if bn_ops is not BatchNormOps.BN:
        y = _relu_after(begin(handle, where, x=x)[1], y, z)
    return y


def batch_normalization_backward_ex(handle, mode, bn_ops, x, y, dy, scale, saved_mean, saved_inv_variance, epsilon,
                                    format=None, dx=None):
    """cuDNN's cudnnBatchNormalizationBackwardEx -> (dx, dz, dscale, dbias): ``y`` is the fused forward's output
    (its ReLU mask), dz the residual's gradient (None unless BN_ADD_ACTIVATION).  dscale, dbias None without scale.
    ``dx``: an array of x's shape and dtype, any memory order (e.g. channels-last memory for an NCHW x), that
    receives dx (written, not blended: batch_normalization_backward's beta_data 0) and is returned."""
    key = _gpu_call_key(x, dx, "backward_ex", handle, mode, format, epsilon, bn_ops, y, dy, scale, saved_mean,
                        saved_inv_variance)
    if key is not None and (seen := _SEEN.get(key)) is not None:     # validated before: straight to the kernels
        want_dz = seen.want_dz
        out = _gpu_bn_backward(seen.at(x), x, dy, scale, saved_mean, saved_inv_variance, seen.grad_shape,
                               (1.0, 0.0, 1.0, 0.0), (None, None, None), y, want_dz=want_dz, checked=True)
        return out if want_dz else (out[0], None, *out[1:])
    where = "batch_normalization_backward_ex"
    bn_ops = parse_enum(where, BatchNormOps, bn_ops, "bn_ops")
    handle, xp = begin(handle, where, x=x, y=y, dy=dy, scale=scale, saved_mean=saved_mean,
                       saved_inv_variance=saved_inv_variance, dx=dx)
    check_out(where, "dx", dx, x.shape, x.dtype, 0.0)
    want_dz = bn_ops is BatchNormOps.BN_ADD_ACTIVATION
    if bn_ops is not BatchNormOps.BN:
        if y is None or tuple(y.shape) != tuple(x.shape) or y.dtype != x.dtype:
            got = None if y is None else (tuple(y.shape), str(y.dtype))
            raise BadParamError(f"{where}: {bn_ops.name} needs y, the forward's output, matching x "
                                f"({tuple(x.shape)}, {x.dtype}), got {got}")
        if x.size and tuple(dy.shape) == tuple(x.shape) and dy.dtype == x.dtype and saved_mean is not None \
                and saved_inv_variance is not None:
            _, geom = _bn_prologue(where, handle, mode, x, format, epsilon,
                                   dict(scale=scale, saved_mean=saved_mean, saved_inv_variance=saved_inv_variance),
                                   dict(dy=dy))
            param_shape = tuple(scale.shape) if scale is not None else geom.param_shape
            fast = _gpu_bn_backward(geom, x, dy, scale, saved_mean, saved_inv_variance, param_shape,
                                    (1.0, 0.0, 1.0, 0.0), (dx, None, None), y, want_dz=want_dz, key=key)
            if fast is not None:
                if key is not None:
                    _SEEN[key].want_dz = want_dz
                return fast if want_dz else (fast[0], None, *fast[1:])
        g = xp.where(y <= 0, xp.zeros((), dtype=dy.dtype), dy)
    else:
        g = dy
    dx, dscale, dbias = batch_normalization_backward(handle, mode, x, g, scale, saved_mean, saved_inv_variance,
                                                     epsilon, format=format, dx=dx)
    return dx, (g if want_dz else None), dscale, dbias


__all__ += ["BatchNormOps", "batch_normalization_forward_training_ex", "batch_normalization_forward_inference_ex",
            "batch_normalization_backward_ex"]
