"""Small array helpers the autograd layer needs and only the backend may write per array module."""
from __future__ import annotations

import numpy as np

from .cuda import launch as _launch
from .devices import is_cuda_array

__all__ = ["index_add", "copy_into", "copy_like", "in_layout_of", "increment", "dense_copier"]

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


def copy_like(template, src):
    """A copy of ``src`` (``template``'s shape) laid out in memory as ``template`` is where that is a dense
    permutation of the axes (a channels-last tensor), else C-ordered: PyTorch's gradient layout contract, a
    leaf's ``.grad`` takes the leaf's strides."""
    if template.flags.c_contiguous or template.ndim < 2 or src.shape != template.shape:
        return src.copy()
    order = sorted(range(template.ndim), key=lambda i: -template.strides[i])     # outermost axis first
    inverse = sorted(range(template.ndim), key=order.__getitem__)
    dense = src.transpose(order).copy()                                           # C order in template's order
    out = dense.transpose(inverse)
    return out if out.strides == template.strides else src.copy()


def in_layout_of(a, template):
    """``a`` (``template``'s shape) laid out in memory as ``template``: ``a`` itself where its strides already are
    template's, else ``copy_like`` (one copy).  PyTorch makes a gradient contiguous in its input's memory format the
    same way (a batch-norm backward given a dy in another order than x)."""
    if a is None or a.strides == template.strides or a.shape != template.shape:
        return a
    return copy_like(template, a)


def dense_copier(dsts):
    """For C-contiguous CuPy arrays ``dsts`` on one GPU: a function ``copy(*srcs)`` doing ``dst[...] = src`` for each
    pair, for srcs the caller knows to be C-contiguous CuPy arrays of their dst's shape and dtype (``minidnn.compile``'s
    replay, whose graph key holds the arguments' shapes, dtypes and strides).  Nothing is checked per call, and up to
    four arrays go in one launch (cuda/copy_kernels.py): ``copy_into``'s checks plus a ``cudaMemcpyAsync`` cost
    ~5 µs of host time per array, paid before every replayed step.  None where ``dsts`` are not such arrays."""
    if not dsts or not all(is_cuda_array(d) and d.flags.c_contiguous for d in dsts) \
            or len({d.data.device_id for d in dsts}) != 1:
        return None
    from .cuda import copy_kernels
    copiers = [copy_kernels.multi_copier(dsts[i:i + copy_kernels.MAX_PAIRS])
               for i in range(0, len(dsts), copy_kernels.MAX_PAIRS)]
    if len(copiers) == 1:
        return copiers[0]

    def copy(*srcs):
        for k, c in enumerate(copiers):
            c(*srcs[k * copy_kernels.MAX_PAIRS:(k + 1) * copy_kernels.MAX_PAIRS])
    return copy


def index_add(target, key, values):
    """``target[key] += values`` with repeated indices accumulated (NumPy's add.at, CuPy's scatter_add)."""
    if is_cuda_array(target):
        import cupyx  # the backend is the one floor allowed to know CuPy
        cupyx.scatter_add(target, key, values)
    else:
        np.add.at(target, key, values)
    return target


