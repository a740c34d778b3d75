"""Loss-scaling primitives for mixed precision (what ``minidnn.amp.GradScaler`` runs), on raw arrays.

# g: any floating array (a gradient, or a flat gradient buffer)   scale: (1,) float32   found_inf: (k,) float32
# growth_tracker: (1,) int32

    unscale_and_check_(grads, found_inf, scale)   g *= float32(1 / double(scale)) in place for every g; found_inf[0]
                                                  becomes 1 if any element of any g is inf or NaN (never reset here)
    update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)
                                                  PyTorch's _amp_update_scale_: back off on overflow, grow after
                                                  growth_interval clean steps; then found_inf is zeroed for the
                                                  next iteration

Both stay on the device: nothing is read back to the host, so a scaled training step can be captured in a CUDA
graph.  The reference below is xp-generic (NumPy or CuPy); on a GPU ``update_scale_`` runs as one single-thread
kernel (backend/cuda/amp.py) instead of a dozen tiny array operations.
"""
from __future__ import annotations

import numpy as np

from .devices import array_module, device_of

__all__ = ["unscale_and_check_", "update_scale_", "inv_scale_of"]


def inv_scale_of(scale):
    """float32(1 / double(scale)), as a (1,) array on scale's device (PyTorch's ``scale.double().reciprocal()``)."""
    xp = array_module(scale)
    return xp.reciprocal(scale.astype(np.float64)).astype(np.float32)


def unscale_and_check_(grads, found_inf, scale):
    """Multiply every array of ``grads`` in place by 1/scale and record in ``found_inf[0]`` whether any holds a
    non-finite value (PyTorch's ``_amp_foreach_non_finite_check_and_unscale_``)."""
    if not grads:
        return
    xp = array_module(found_inf)
    inv = inv_scale_of(scale)
    for g in grads:
        if g.size == 0:
            continue
        bad = xp.logical_not(xp.isfinite(g)).any()
        xp.maximum(found_inf[:1], bad.astype(found_inf.dtype), out=found_inf[:1])
        # The product is formed in float32 (or wider) and rounded once into g's dtype.
        work = g.astype(np.promote_types(g.dtype, np.float32), copy=False)
        xp.multiply(work, inv.astype(work.dtype), out=work)
        if work is not g:
            g[...] = work


def update_scale_(scale, growth_tracker, found_inf, growth_factor: float, backoff_factor: float,
                  growth_interval: int):
    """One scale update from ``found_inf`` (any non-zero entry counts as an overflow), then zero ``found_inf``."""
    if device_of(scale).type == "cuda":
        from .cuda import amp as _cuda_amp
        _cuda_amp.update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)
        return
    xp = array_module(scale)
    found = found_inf.sum() > 0
    successful = xp.where(found, 0, growth_tracker + 1).astype(growth_tracker.dtype)
    grow = successful == growth_interval
    grown = (scale.astype(np.float64) * growth_factor).astype(np.float32)
    grown = xp.where(xp.isfinite(grown), grown, scale)
    backed = (scale.astype(np.float64) * backoff_factor).astype(np.float32)
    scale[...] = xp.where(found, backed, xp.where(grow, grown, scale))
    growth_tracker[...] = xp.where(grow, 0, successful)
    found_inf[...] = 0
