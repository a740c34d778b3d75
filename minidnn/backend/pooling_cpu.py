"""Fast CPU (NumPy) pooling, registered beside the reference in pooling.py.

# x, dx: (N, C, *S)  channels-first index order (any memory layout)   y, dy, argmax: (N, C, *O)
# windows: (N, C, *O, *window)  a strided view of the padded x: [n, c, o.., k..] = xpad[n, c, o*stride + k]

The reference walks the window taps: one strided slice, one compare and one ``where`` per tap, and its
backward adds one masked copy of dy per tap.  Here the taps are one axis of an ``as_strided`` view:

forward, MAX          the windows reshaped to (..., taps) (one gather), ``argmax`` along the last axis (the
                      first maximum, a NaN winning as in the reference), the maxima read back through it;
forward, AVERAGE      the same gather summed along its last axis, divided by the reference's divisor;
backward, stride >= window (non-overlapping windows, e.g. the usual 2x2 / stride 2)
                      each dy value goes straight into its window: a one-hot of the stored argmax times dy
                      (MAX) or dy / divisor (AVERAGE) written through a *writable* window view of the padded
                      dx -- windows do not overlap, so one assignment is exact, no loop and no scatter-add.
Overlapping windows (stride < window) keep the reference's backward (its tap loop adds in a fixed order).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["applies_forward", "applies_backward", "pool_forward", "pool_backward"]

_ENABLED = [True]


def applies_forward(geom, x) -> bool:
    return _ENABLED[0] and type(x) is np.ndarray


def applies_backward(geom, x) -> bool:
    return applies_forward(geom, x) and all(s >= k for s, k in zip(geom.stride, geom.window))


def _window_view(xpad, geom, writeable=False):
    nd = len(geom.window)
    lead, spatial = xpad.strides[:2], xpad.strides[2:]
    shape = (*xpad.shape[:2], *geom.out_sizes, *geom.window)
    strides = (*lead, *(st * s for st, s in zip(spatial, geom.stride)), *spatial)
    assert len(shape) == 2 + 2 * nd
    return np.lib.stride_tricks.as_strided(xpad, shape=shape, strides=strides, writeable=writeable)


def _gathered(xpad, geom):
    """(N, C, *O, taps): every window's values in row-major tap order (one copy)."""
    return _window_view(xpad, geom).reshape(*xpad.shape[:2], *geom.out_sizes, math.prod(geom.window))


def pool_forward(geom, xc, xp):
    """(value, argmax or None) for channels-first xc, as the reference computes them."""
    if geom.mode.is_max:
        cols = _gathered(geom.pad(xp, xc, -np.inf), geom)
        arg = cols.argmax(axis=-1)
        value = np.take_along_axis(cols, arg[..., None], axis=-1)[..., 0]
        return value, arg.astype(np.min_scalar_type(math.prod(geom.window) - 1))
    cols = _gathered(geom.pad(xp, xc, 0), geom)
    return cols.sum(axis=-1) / geom.divisor(xp, xc.dtype), None


def pool_backward(geom, dyc, arg, dtype, xp):
    """Padded dx for non-overlapping windows (see applies_backward); the caller crops and blends."""
    taps = math.prod(geom.window)
    dxpad = np.zeros(dyc.shape[:2] + geom.padded_spatial, dtype=dtype)
    if geom.mode.is_max:
        spread = (np.arange(taps, dtype=arg.dtype) == arg[..., None]) * dyc[..., None].astype(dtype, copy=False)
    else:
        spread = np.broadcast_to((dyc / geom.divisor(xp, dtype))[..., None], (*dyc.shape, taps))
    _window_view(dxpad, geom, writeable=True)[...] = spread.reshape(*dyc.shape, *geom.window)
    return dxpad
