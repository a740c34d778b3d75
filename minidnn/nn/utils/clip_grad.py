"""Gradient clipping: PyTorch's ``clip_grad_norm_`` and ``clip_grad_value_``.

Gradients that live in a fused optimizer's flat buffer (every parameter of the buffer passed and holding its
gradient there) are reduced and scaled as ONE array; other gradients are reduced one by one and their norms
combined with one small reduction.  Nothing is read back to the host unless ``error_if_nonfinite``.
"""
from __future__ import annotations

import math

import numpy as np

from ...backend import devices as _dev
from ...tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _as_list(parameters):
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def _grad_arrays(params, use_flat=True):
    """Arrays to reduce/scale: whole flat gradient buffers where possible, else per-parameter gradients."""
    from ...backend.ownership import owner_of
    chosen = {id(p) for p in params if p.grad is not None}
    arrays, covered, seen_sets = [], set(), set()
    for p in params:
        if p.grad is None or id(p) in covered:
            continue
        owner = owner_of(p)
        if use_flat and owner is not None and id(owner[0]) not in seen_sets:
            fs = owner[0]
            seen_sets.add(id(fs))
            if all(id(q) in chosen and q.grad.data is fs.grad_views[j] for j, q in enumerate(fs.params)):
                arrays.append(fs.grad)          # padding is zero: it changes no norm and scales to zero
                covered.update(id(q) for q in fs.params)
                continue
        if id(p) not in covered:
            covered.add(id(p))
            arrays.append(p.grad.data)
    return arrays


def _vector_norm(xp, x, norm_type):
    x = x.reshape(-1)
    if norm_type == math.inf:
        return xp.abs(x).max() if x.size else xp.zeros((), x.dtype)
    if norm_type == 2.0:
        return xp.sqrt(xp.dot(x, x))
    if norm_type == 1.0:
        return xp.abs(x).sum()
    if norm_type == 0.0:
        return (x != 0).sum().astype(x.dtype)
    return (xp.abs(x) ** norm_type).sum() ** (1.0 / norm_type)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale all gradients so that their joint ``norm_type`` norm is at most ``max_norm``; returns that total
    norm (before clipping) as a 0-d Tensor.  ``foreach`` is accepted for PyTorch compatibility (the flat-buffer
    path is always taken where it applies)."""
    params = _as_list(parameters)
    norm_type = float(norm_type)
    if norm_type < 0 or math.isnan(norm_type):
        raise ValueError(f"clip_grad_norm_: norm_type must be >= 0 or inf, got {norm_type}")
    # PyTorch's total "0-norm" counts the tensors with a nonzero gradient (the 0-norm of the per-tensor norms):
    # it depends on the tensor boundaries, so it is always taken tensor by tensor.
    arrays = _grad_arrays(params, use_flat=norm_type != 0.0)
    if not arrays:
        return Tensor._from_array(_dev.array_module(params[0].data).zeros((), dtype=params[0].dtype)
                                  if params else _dev.CPU.xp.zeros((), dtype="float32"))
    first_dev = _dev.device_of(arrays[0])
    xp = _dev.array_module(arrays[0])
    with _dev.device_guard(first_dev):
        norms = [_dev.to_device(xp_norm, first_dev) for xp_norm in
                 (_vector_norm(_dev.array_module(a), a, norm_type) for a in arrays)]
        total = norms[0] if len(norms) == 1 else _vector_norm(xp, xp.stack([xp.asarray(n) for n in norms]),
                                                              norm_type)
        total = xp.asarray(total)
        if error_if_nonfinite and not bool(xp.isfinite(total)):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                               "so it cannot be clipped. To disable this error and scale the gradients by the "
                               "non-finite norm anyway, set `error_if_nonfinite=False`")
        coef = xp.minimum(max_norm / (total + 1e-6), 1.0)
    with np.errstate(invalid="ignore"):       # a non-finite norm scales by 0 or nan, as in PyTorch
        for a in arrays:
            a *= _dev.to_device(coef, _dev.device_of(a), dtype=a.dtype)
    return Tensor._from_array(total)


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient elementwise into [-clip_value, clip_value], in place."""
    clip_value = float(clip_value)
    for a in _grad_arrays(_as_list(parameters)):
        _dev.array_module(a).clip(a, -clip_value, clip_value, out=a)
