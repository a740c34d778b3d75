"""MultiheadAttention: PyTorch's parameters (in_proj_weight (3E, E) or q/k/v_proj_weight, in_proj_bias, out_proj,
bias_k/bias_v), initialisation, masks and outputs, composed from linear, matmul, softmax and dropout.

Shapes (batch_first=False): query (L, N, E), key (S, N, kdim), value (S, N, vdim); batch_first: (N, L, E);
unbatched: (L, E).  key_padding_mask (N, S) (True: ignore that key); attn_mask (L, S) or (N*num_heads, L, S)
(True: NOT allowed to attend; float: added).  Output (L, N, E) and weights (N, L, S) averaged over heads, or
(N, num_heads, L, S).
"""
from __future__ import annotations

import math

import numpy as np

from ...backend import devices as _dev
from ...backend.errors import ArgumentError
from ...creation import empty, zeros
from ...ops import cat
from ...tensor import Tensor
from .. import init
from .._functions.activation import dropout as _dropout
from .._functions.activation import softmax as _softmax
from ..functional import linear
from ..functional_extra import scaled_dot_product_attention
from ..module import Module
from ..parameter import Parameter
from .linear import Linear

__all__ = ["MultiheadAttention"]


def _as_float_mask(mask, name, like):
    """PyTorch's _canonical_mask: a bool mask becomes 0 / -inf (True masked); a float mask is used as given."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise ArgumentError(f"MultiheadAttention: {name} must be a Tensor, got {type(mask).__name__}")
    if mask.dtype == np.bool_:
        xp = _dev.array_module(mask.data)
        out = Tensor._from_array(xp.where(mask.data, -np.inf, 0.0).astype(like.dtype))
        return out if out.device == like.device else out.to(like.device)
    if not np.issubdtype(mask.dtype, np.floating):
        raise ArgumentError(f"MultiheadAttention: only bool and floating types of {name} are supported, got "
                            f"{mask.dtype}")
    return mask


def _pad_last(mask):
    """One more (unmasked) key column."""
    if mask is None:
        return None
    from ..functional_extra import pad
    return pad(mask, (0, 1))


def multi_head_attention_forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                                 attn_mask=None, average_attn_weights=True, is_causal=False):
    E, H = self.embed_dim, self.num_heads
    hd = E // H
    batched = query.ndim == 3
    if not batched:
        if query.ndim != 2 or key.ndim != 2 or value.ndim != 2:
            raise ArgumentError(f"MultiheadAttention: query, key and value must all be 2-D (unbatched) or 3-D, got "
                                f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    elif self.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    L, N, e = query.shape
    S = key.shape[0]
    if e != E:
        raise ArgumentError(f"MultiheadAttention: was expecting embedding dimension of {E}, but got {e}")
    if key.shape[:2] != value.shape[:2] or key.shape[1] != N:
        raise ArgumentError(f"MultiheadAttention: key {tuple(key.shape)} and value {tuple(value.shape)} must share "
                            f"(S, N) with query's batch {N}")
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                           "method `generate_square_subsequent_mask` to create this mask.")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (N, S):
        raise ArgumentError(f"MultiheadAttention: expected key_padding_mask of shape {(N, S)}, got "
                            f"{tuple(key_padding_mask.shape)}")
    # in-projection
    if self._qkv_same_embed_dim:
        wq, wk, wv = self.in_proj_weight[:E], self.in_proj_weight[E:2 * E], self.in_proj_weight[2 * E:]
    else:
        wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
    b = self.in_proj_bias
    bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
    q, k, v = linear(query, wq, bq), linear(key, wk, bk), linear(value, wv, bv)
    attn_mask = _as_float_mask(attn_mask, "attn_mask", q)
    key_padding_mask = _as_float_mask(key_padding_mask, "key_padding_mask", q)
    if attn_mask is not None:
        if attn_mask.ndim == 2:
            if tuple(attn_mask.shape) != (L, S):
                raise RuntimeError(f"The shape of the 2D attn_mask is {tuple(attn_mask.shape)}, but should be "
                                   f"{(L, S)}.")
            attn_mask = attn_mask.unsqueeze(0)
        elif attn_mask.ndim == 3:
            if tuple(attn_mask.shape) != (N * H, L, S):
                raise RuntimeError(f"The shape of the 3D attn_mask is {tuple(attn_mask.shape)}, but should be "
                                   f"{(N * H, L, S)}.")
        else:
            raise RuntimeError(f"attn_mask's dimension {attn_mask.ndim} is not supported")
    if self.bias_k is not None:
        k = cat([k, self.bias_k.expand(1, N, E)], 0)
        v = cat([v, self.bias_v.expand(1, N, E)], 0)
        attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
    q = q.reshape(L, N * H, hd).transpose(0, 1)                    # (N*H, L, hd)
    k = k.reshape(k.shape[0], N * H, hd).transpose(0, 1)           # (N*H, S, hd)
    v = v.reshape(v.shape[0], N * H, hd).transpose(0, 1)
    if self.add_zero_attn:
        z = zeros(N * H, 1, hd, dtype=q.dtype, device=q.device)
        k, v = cat([k, z], 1), cat([v, z], 1)
        attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
    S = k.shape[1]
    if key_padding_mask is not None:
        kpm = key_padding_mask.reshape(N, 1, 1, S).expand(N, H, 1, S).reshape(N * H, 1, S)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    p = self.dropout if self.training else 0.0
    if need_weights:
        scores = (q * math.sqrt(1.0 / hd)) @ k.transpose(-2, -1)
        if attn_mask is not None:
            scores = scores + attn_mask
        weights = _softmax(scores, dim=-1)
        if p > 0.0:
            weights = _dropout(weights, p, training=True)
        out = weights @ v                                          # (N*H, L, hd)
    else:
        mask = None if attn_mask is None else (
            attn_mask.reshape(N, H, -1, S) if attn_mask.shape[0] == N * H else attn_mask.unsqueeze(0))
        out = scaled_dot_product_attention(q.reshape(N, H, L, hd), k.reshape(N, H, S, hd), v.reshape(N, H, S, hd),
                                           mask, p).reshape(N * H, L, hd)
        weights = None
    out = out.transpose(0, 1).reshape(L * N, E)
    out = linear(out, self.out_proj.weight, self.out_proj.bias).reshape(L, N, E)
    if weights is not None:
        weights = weights.reshape(N, H, L, S)
        if average_attn_weights:
            weights = weights.mean(dim=1)
    if not batched:
        out = out.squeeze(1)
        if weights is not None:
            weights = weights.squeeze(0)
    elif self.batch_first:
        out = out.transpose(0, 1)
    return out, weights


class MultiheadAttention(Module):
    """PyTorch's nn.MultiheadAttention: forward(query, key, value, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False) -> (output, weights or None)."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and "
                             f"num_heads={num_heads} instead")
        if embed_dim % num_heads:
            raise AssertionError(f"embed_dim must be divisible by num_heads (embed_dim={embed_dim}, "
                                 f"num_heads={num_heads})")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        kw = dict(device=device, dtype=dtype)
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = Parameter(empty(embed_dim, embed_dim, **kw))
            self.k_proj_weight = Parameter(empty(embed_dim, self.kdim, **kw))
            self.v_proj_weight = Parameter(empty(embed_dim, self.vdim, **kw))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = Parameter(empty(3 * embed_dim, embed_dim, **kw))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(empty(3 * embed_dim, **kw))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, **kw)
        if add_bias_kv:
            self.bias_k = Parameter(empty(1, 1, embed_dim, **kw))
            self.bias_v = Parameter(empty(1, 1, embed_dim, **kw))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        return multi_head_attention_forward(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                                            average_attn_weights, is_causal)

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"
