"""Small array helpers the autograd layer needs and only the backend may write per array module."""
from __future__ import annotations

import numpy as np

from .devices import is_cuda_array

__all__ = ["index_add", "copy_into"]


def copy_into(dst, src):
    """``dst[...] = src``.  Between CuPy arrays of one shape and dtype, both C-contiguous (a gradient landing in
    the optimizer's flat buffer), one asynchronous device copy on the current stream: CuPy's ``__setitem__``
    parses the index and chooses a path at every call (~10 µs of host time per copy, 65 copies per ResNet-20
    step)."""
    if (type(dst) is not np.ndarray and type(src) is type(dst) and dst.dtype == src.dtype
            and dst.shape == src.shape and dst.flags.c_contiguous and src.flags.c_contiguous):
        if dst.nbytes:
            dst.data.copy_from_device_async(src.data, dst.nbytes)
        return dst
    dst[...] = src
    return dst


def index_add(target, key, values):
    """``target[key] += values`` with repeated indices accumulated (NumPy's add.at, CuPy's scatter_add)."""
    if is_cuda_array(target):
        import cupyx  # the backend is the one floor allowed to know CuPy
        cupyx.scatter_add(target, key, values)
    else:
        np.add.at(target, key, values)
    return target


