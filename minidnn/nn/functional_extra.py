"""PyTorch's ``pad`` (every mode), ``interpolate``, ``normalize`` and ``scaled_dot_product_attention``, composed
from existing differentiable Tensor ops (re-exported by ``minidnn.nn.functional``).

Shapes: x (N, C, *spatial); pad = (left_last, right_last, left_second_last, ...) as in PyTorch.
Index tables (which input element each output element reads, and with what weight) are built with NumPy on the
host (they depend on shapes only) and applied by indexing, so forward and backward run on the input's device;
nothing here imports CuPy.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..autograd import Function
from ..backend import devices as _dev
from ..backend.errors import ArgumentError
from ..creation import tensor as _tensor
from ..ops import pad as _tensor_pad
from ..tensor import Tensor

__all__ = ["pad", "interpolate", "upsample", "normalize", "scaled_dot_product_attention"]


def _const(array, like):
    """A constant (no grad) on ``like``'s device and dtype."""
    return _tensor(np.asarray(array), dtype=like.dtype, device=like.device)


def _take(x, dim, index):
    """x indexed by the integer array ``index`` along ``dim`` (differentiable: repeats accumulate)."""
    return x[(slice(None),) * dim + (index,)]


# ------------------------------------------------------------------------------------------------------------
# pad
# ------------------------------------------------------------------------------------------------------------
def _pad_index(mode, n, left, right):
    i = np.arange(-left, n + right)
    if mode == "reflect":
        i = np.abs(i)
        return np.where(i >= n, 2 * (n - 1) - i, i)
    if mode == "replicate":
        return np.clip(i, 0, n - 1)
    return np.mod(i, n)                                          # circular


def pad(input, pad, mode="constant", value=None):
    """PyTorch's ``F.pad``: ``pad`` pairs (left, right) from the last dimension backwards.  'constant' pads with
    ``value`` (negative pads crop); 'reflect' mirrors without repeating the edge, 'replicate' repeats the edge,
    'circular' wraps around; these three pad the last 1, 2 or 3 dims of a (C, *) or (N, C, *) input."""
    pad = tuple(pad)
    if len(pad) % 2:
        raise ArgumentError(f"pad: padding length must be divisible by 2, got {len(pad)} ({pad})")
    if not all(isinstance(p, numbers.Integral) for p in pad):
        raise ArgumentError(f"pad: padding sizes must be integers, got {pad}")
    if len(pad) // 2 > input.ndim:
        raise ArgumentError(f"pad: padding length {len(pad)} is too large for an input of {input.ndim} dims "
                            f"(shape {tuple(input.shape)})")
    if mode == "constant":
        if min(pad, default=0) < 0:            # negative amounts crop (PyTorch's constant_pad_nd)
            crop = [slice(None)] * input.ndim
            for j in range(len(pad) // 2):
                n = input.shape[input.ndim - 1 - j]
                crop[input.ndim - 1 - j] = slice(max(-pad[2 * j], 0), n - max(-pad[2 * j + 1], 0))
            input = input[tuple(crop)]
            pad = tuple(max(p, 0) for p in pad)
        return _tensor_pad(input, pad, mode="constant", value=0.0 if value is None else value)
    if mode not in ("reflect", "replicate", "circular"):
        raise NotImplementedError(f"pad: unknown padding mode {mode!r} (constant, reflect, replicate, circular)")
    if value is not None and value != 0:
        raise ArgumentError(f'Padding mode "{mode}" doesn\'t take in value argument.')
    k = len(pad) // 2
    if k > 3 or input.ndim not in (k + 1, k + 2):
        raise NotImplementedError(f"pad: mode {mode!r} pads the last 1, 2 or 3 dims of a {k + 1}-D or {k + 2}-D "
                                  f"input; got pad {pad} for an input of shape {tuple(input.shape)}")
    x = input
    for j in range(k):
        dim = input.ndim - 1 - j
        left, right = pad[2 * j], pad[2 * j + 1]
        n = input.shape[dim]
        if mode == "reflect" and (left >= n or right >= n):
            raise ArgumentError(f"pad: reflect padding size should be less than the corresponding input dimension, "
                                f"but got padding ({left}, {right}) at dimension {dim} of input {tuple(input.shape)}")
        if mode == "circular" and (left > n or right > n):
            raise ArgumentError(f"pad: circular padding may wrap around at most once: padding ({left}, {right}) at "
                                f"dimension {dim} of input {tuple(input.shape)}")
        if mode == "replicate" and n == 0 and (left or right):
            raise ArgumentError(f"pad: cannot replicate-pad an empty dimension {dim} of input {tuple(input.shape)}")
        if min(left, right) < 0:                  # negative pads crop first, as PyTorch does
            a, b = max(-left, 0), n - max(-right, 0)
            x = x[(slice(None),) * dim + (slice(a, b),)]
            n, left, right = b - a, max(left, 0), max(right, 0)
        if left or right:
            x = _take(x, dim, _pad_index(mode, n, left, right))
    return x


# ------------------------------------------------------------------------------------------------------------
# interpolate
# ------------------------------------------------------------------------------------------------------------
_LINEAR_MODES = {"linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}
_CUBIC_A = -0.75          # PyTorch's (and OpenCV's) cubic convolution coefficient


def _cubic_weights(t):
    """The 4 tap weights of Keys' cubic convolution at fractional offsets t (PyTorch's formulas)."""
    A = _CUBIC_A

    def near(x):                                                    # |x| <= 1
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def far(x):                                                     # 1 < |x| < 2
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    return [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]


def _output_sizes(name, x, size, scale_factor, k):
    spatial = tuple(x.shape[2:])
    if (size is None) == (scale_factor is None):
        raise ArgumentError(f"{name}: only one of size or scale_factor should be defined")
    if size is not None:
        sizes = tuple(size) if isinstance(size, (tuple, list)) else (size,) * k
        if len(sizes) != k:
            raise ArgumentError(f"{name}: Input and output must have the same number of spatial dimensions, but got "
                                f"input with spatial dimensions of {list(spatial)} and output size of {list(sizes)}. "
                                "Please provide input tensor in (N, C, d1, d2, ...,dK) format and output size in "
                                "(o1, o2, ...,oK) format.")
        return tuple(int(s) for s in sizes), None
    scales = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * k
    if len(scales) != k:
        raise ArgumentError(f"{name}: Input and scale_factor must have the same number of spatial dimensions, but "
                            f"got input with spatial dimensions of {list(spatial)} and scale_factor of shape "
                            f"{list(scales)}.")
    return tuple(int(math.floor(n * float(s))) for n, s in zip(spatial, scales)), tuple(float(s) for s in scales)


def _source_scale(n_in, n_out, scale, align_corners):
    """PyTorch's area_pixel_compute_scale: the step in input coordinates per output element."""
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """PyTorch's ``F.interpolate`` for x (N, C, *spatial): modes 'nearest', 'nearest-exact', 'linear' (3-D),
    'bilinear' and 'bicubic' (4-D), 'trilinear' (5-D) and 'area'.  Linear modes are separable: one gather of the two
    neighbours and a weighted sum per spatial dim."""
    name = "interpolate"
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported")
    k = input.ndim - 2
    if k < 1 or k > 3:
        raise ArgumentError(f"{name}: expected a 3-D, 4-D or 5-D input (N, C, *spatial), got shape "
                            f"{tuple(input.shape)}")
    if mode in ("nearest", "nearest-exact", "area"):
        if align_corners is not None:
            raise ArgumentError("align_corners option can only be set with the interpolating modes: "
                                "linear | bilinear | bicubic | trilinear")
    elif mode in _LINEAR_MODES:
        if _LINEAR_MODES[mode] != k:
            raise NotImplementedError(f"{name}: mode {mode!r} expects a {_LINEAR_MODES[mode] + 2}-D input, got shape "
                                      f"{tuple(input.shape)}")
        align_corners = bool(align_corners)
    else:
        raise NotImplementedError(f"{name}: mode {mode!r} is not supported (nearest, nearest-exact, linear, "
                                  "bilinear, bicubic, trilinear, area)")
    out_sizes, scales = _output_sizes(name, input, size, scale_factor, k)
    if recompute_scale_factor:
        scales = None
    if any(s <= 0 for s in out_sizes):
        raise ArgumentError(f"{name}: output size {out_sizes} must be positive (input {tuple(input.shape)})")
    if mode == "area":
        from ._functions.pooling import adaptive_avg_pool1d, adaptive_avg_pool2d
        if k == 1:
            return adaptive_avg_pool1d(input, out_sizes)
        if k == 2:
            return adaptive_avg_pool2d(input, out_sizes)
        raise NotImplementedError(f"{name}: mode 'area' on a 5-D input is not supported")
    x = input
    for j in range(k):
        dim, n_in, n_out = 2 + j, input.shape[2 + j], out_sizes[j]
        scale = scales[j] if scales is not None else None
        dst = np.arange(n_out)
        if n_out == n_in and mode != "nearest-exact":
            continue                                             # PyTorch's kernels copy equal sizes through
        if mode in ("nearest", "nearest-exact"):
            if mode == "nearest" and n_out == 2 * n_in:
                index = dst >> 1
            else:                       # float32 arithmetic, as PyTorch's kernels compute the source index
                s = np.float32(1.0 / scale if scale is not None and scale > 0 else n_in / n_out)
                src = dst.astype(np.float32) + np.float32(0.5 if mode == "nearest-exact" else 0.0)
                index = np.minimum(np.floor(src * s).astype(np.int64), n_in - 1)
            x = _take(x, dim, index)
            continue
        s = _source_scale(n_in, n_out, scale, align_corners)
        if mode == "bicubic":            # 4 taps at floor(src) - 1 .. + 2, clamped to the edge; src not clamped
            src = dst * s if align_corners else s * (dst + 0.5) - 0.5
            base = np.floor(src).astype(np.int64)
            shape = (n_out,) + (1,) * (x.ndim - dim - 1)
            taps = [_take(x, dim, np.clip(base - 1 + j, 0, n_in - 1)) * _const(w.reshape(shape), x)
                    for j, w in enumerate(_cubic_weights(src - base))]
            x = taps[0] + taps[1] + taps[2] + taps[3]
            continue
        src = dst * s if align_corners else np.maximum(s * (dst + 0.5) - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        w1 = np.clip(src - i0, 0.0, 1.0)
        shape = (n_out,) + (1,) * (x.ndim - dim - 1)
        x = (_take(x, dim, i0) * _const((1.0 - w1).reshape(shape), x)
             + _take(x, dim, i1) * _const(w1.reshape(shape), x))
    return x


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """Deprecated PyTorch alias of ``interpolate``."""
    return interpolate(input, size, scale_factor, mode, align_corners)


# ------------------------------------------------------------------------------------------------------------
# normalize
# ------------------------------------------------------------------------------------------------------------
class _NormKeepdim(Function):
    """||x||_p over ``dim`` (kept); its gradient is 0 where the norm is 0 (PyTorch's subgradient), not NaN."""

    @staticmethod
    def forward(ctx, x, p, dim):
        xp = _dev.array_module(x.data)
        a = x.data
        if p == math.inf:
            n = xp.max(xp.abs(a), axis=dim, keepdims=True) if a.shape[dim] else xp.zeros_like(a.sum(dim, keepdims=True))
        elif p == 2:
            n = xp.sqrt(xp.sum(a * a, axis=dim, keepdims=True))
        else:
            n = xp.sum(xp.abs(a) ** p, axis=dim, keepdims=True) ** (1.0 / p)
        ctx.p, ctx.dim = p, dim
        ctx.save_for_backward(x)
        ctx.n = n
        return Tensor._from_array(n)

    @staticmethod
    def backward(ctx, g):
        # Written in Tensor ops (the norm through this Function again), so create_graph=True differentiates it.
        from ..ops import where
        x, = ctx.saved_tensors
        p, dim = ctx.p, ctx.dim
        n = _NormKeepdim.apply(x, p, dim)
        zero = Tensor._from_array(ctx.n == 0)
        if p == math.inf:
            hit = Tensor._from_array((_dev.array_module(x.data).abs(x.data) == ctx.n).astype(x.dtype))
            d = x.sign() * hit / hit.sum(dim, keepdim=True).clamp(min=1)
        elif p == 2:
            d = x / where(zero, 1.0, n)
        else:
            d = x.sign() * x.abs() ** (p - 1) / where(zero, 1.0, n) ** (p - 1)
        return where(zero, 0.0, d) * g, None, None


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """input / max(||input||_p over dim, eps)."""
    if out is not None:
        raise NotImplementedError("normalize: out= is not supported")
    if input.ndim == 0:
        raise ArgumentError("normalize: expected a tensor with at least one dimension, got a 0-d tensor")
    if not -input.ndim <= dim < input.ndim:
        raise ArgumentError(f"normalize: dim {dim} is out of range for a tensor of shape {tuple(input.shape)}")
    dim = dim % input.ndim
    if p <= 0:
        raise ArgumentError(f"normalize: p must be positive, got {p}")
    norm = _NormKeepdim.apply(input, float(p), dim)
    return input / norm.clamp(min=eps)


# ------------------------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ------------------------------------------------------------------------------------------------------------
def _attention_bias(attn_mask, is_causal, L, S, like):
    """The additive bias of PyTorch's reference: -inf where a bool mask is False or above the causal diagonal."""
    bias = None
    if is_causal:
        bias = _const(np.where(np.tril(np.ones((L, S), dtype=bool)), 0.0, -np.inf), like)
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            m = attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask
            xp = _dev.array_module(m)
            bias = Tensor._from_array(xp.where(m, 0.0, -np.inf).astype(like.dtype))
            bias = _dev_to(bias, like)
        else:
            bias = attn_mask if isinstance(attn_mask, Tensor) else _const(attn_mask, like)
    return bias


def _dev_to(t, like):
    return t if t.device == like.device else t.to(like.device)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(q k^T * scale + bias) v for q (*, L, E), k (*, S, E), v (*, S, Ev); ``attn_mask`` bool (True:
    attend) or float (added), broadcastable to (*, L, S); ``is_causal``: the lower-triangular mask; dropout on
    the attention weights whenever dropout_p > 0 (as PyTorch's function does).  A query whose keys are all
    masked gets zero weights (output 0, gradient 0), as PyTorch's safe softmax gives, not NaN."""
    from ..ops import where
    from ._functions.activation import dropout, softmax
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise ArgumentError(f"scaled_dot_product_attention: query, key and value need at least 2 dims, got "
                            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ArgumentError(f"scaled_dot_product_attention: query {tuple(query.shape)} and key {tuple(key.shape)} "
                            f"must share the last dim, key and value {tuple(value.shape)} the sequence dim")
    if is_causal and attn_mask is not None:
        raise ArgumentError("scaled_dot_product_attention: _scaled_dot_product_attention: Explicit attn_mask should "
                            "not be set when is_causal=True")
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        hq, hk = query.shape[-3], key.shape[-3]
        if hq % hk:
            raise ArgumentError(f"scaled_dot_product_attention: {hq} query heads are not a multiple of {hk} key heads")
        r = hq // hk

        def repeat(t):
            lead = tuple(t.shape[:-3])
            return t.unsqueeze(-3).expand(*lead, hk, r, *t.shape[-2:]).reshape(*lead, hq, *t.shape[-2:])
        key, value = repeat(key), repeat(value)
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query @ key.transpose(-2, -1)) * scale
    bias = _attention_bias(attn_mask, is_causal, L, S, query)
    dead = None
    if bias is not None:
        scores = scores + bias
        xp = _dev.array_module(scores.data)
        rows = xp.all(xp.isneginf(scores.data), axis=-1, keepdims=True)
        if bool(rows.any()):          # PyTorch's safe softmax: a row with every key masked attends to nothing
            dead = Tensor._from_array(rows)
            scores = where(dead, 0.0, scores)
    weights = softmax(scores, dim=-1)
    if dead is not None:
        weights = where(dead, 0.0, weights)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p, training=True)
    return weights @ value
