"""Small array helpers the autograd layer needs and only the backend may write per array module."""
from __future__ import annotations

import numpy as np

from .cuda import launch as _launch
from .devices import is_cuda_array

__all__ = ["index_add", "copy_into", "increment", "dense_copier"]

_INCREMENT = r"""
// a[0] += 1 for a one-element int64 counter; one thread of one block.
extern "C" __global__ void increment_i64(long long* a) { a[0] += 1; }
"""


def increment(a):
    """``a += 1`` in place for a one-element int64 counter (BatchNorm's ``num_batches_tracked``): on the GPU one
    raw launch (CuPy's ``+=`` builds an elementwise call around the scalar: ~15 µs of host time, once per
    BatchNorm layer per training step)."""
    if is_cuda_array(a) and a.dtype == np.int64 and a.size == 1 and a.flags.c_contiguous:
        with _launch.on_device(a.data.device_id):      # the counter's GPU, whichever is current
            _launch.launch(_launch.get_kernel(_INCREMENT, "increment_i64"), (1,), (1,), [a])
    else:
        a += 1
    return a


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


def dense_copier(dst):
    """For a C-contiguous CuPy array ``dst``: a function ``copy(src)`` doing ``dst[...] = src`` as one asynchronous
    device copy on the current stream, for a ``src`` the caller knows to be a C-contiguous CuPy array of dst's shape
    and dtype (``minidnn.compile``'s replay, whose graph key holds the arguments' shapes, dtypes and strides).  It
    checks nothing per call: ``copy_into``'s checks and CuPy's ``copy_from_device_async`` cost ~5 µs of host time
    per copy, paid before every replayed step.  None where ``dst`` is not such an array."""
    if not is_cuda_array(dst) or not dst.flags.c_contiguous or not dst.nbytes:
        return None
    cp = _launch.cupy()
    memcpy, current, ptr, nbytes = cp.cuda.runtime.memcpyAsync, cp.cuda.get_current_stream, dst.data.ptr, dst.nbytes

    def copy(src):
        memcpy(ptr, src.data.ptr, nbytes, 4, current().ptr)       # 4: cudaMemcpyDefault (any device, UVA)
    return copy


def index_add(target, key, values):
    """``target[key] += values`` with repeated indices accumulated (NumPy's add.at, CuPy's scatter_add)."""
    if is_cuda_array(target):
        import cupyx  # the backend is the one floor allowed to know CuPy
        cupyx.scatter_add(target, key, values)
    else:
        np.add.at(target, key, values)
    return target


