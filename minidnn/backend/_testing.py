"""Test helpers for the backend primitives (private; imported by tests, never by the library).

Finite differences are slow by design (one forward per input element, a Python loop): use them
on small float64 arrays only.
"""
from __future__ import annotations

import numpy as np

from .devices import is_cuda_array


def to_numpy(a):
    """A NumPy copy of a NumPy or CuPy array (None stays None)."""
    if a is None:
        return None
    return a.get() if is_cuda_array(a) else np.asarray(a)


def numerical_gradient(f, x, eps=1e-6):
    """d f(x) / d x by central differences, for a scalar-valued ``f`` of a float64 array ``x``.

    ``x`` may live on any device; it is perturbed in place and restored.  Returns a NumPy array.
    """
    if not x.flags.c_contiguous:
        raise ValueError("numerical_gradient needs a C-contiguous x (it perturbs x through a flat view)")
    grad = np.zeros(x.shape)
    flat = x.reshape(-1)        # a view of x, since x is contiguous
    for i in range(flat.size):
        old = float(flat[i])
        flat[i] = old + eps
        up = float(f(x))
        flat[i] = old - eps
        down = float(f(x))
        flat[i] = old
        grad.reshape(-1)[i] = (up - down) / (2 * eps)
    return grad
