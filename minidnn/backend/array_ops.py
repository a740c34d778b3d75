"""Small array helpers the autograd layer needs and only the backend may write per array module."""
from __future__ import annotations

import numpy as np

from .devices import is_cuda_array

__all__ = ["index_add"]


def index_add(target, key, values):
    """``target[key] += values`` with repeated indices accumulated (NumPy's add.at, CuPy's scatter_add)."""
    if is_cuda_array(target):
        import cupyx  # the backend is the one floor allowed to know CuPy
        cupyx.scatter_add(target, key, values)
    else:
        np.add.at(target, key, values)
    return target


