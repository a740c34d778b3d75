"""Matrix products for the backend, honouring the handle's math type.

# a: (M, Ka) or (B, M, Ka)     b: (Ka, Kb) or (B, Ka, Kb)     -> (M, Kb) or (B, M, Kb)

Why a helper instead of ``xp.matmul`` everywhere:

* TF32.  On CuPy, float32 products may use TF32 tensor cores when the math type allows it
  (``MathType.TENSOR_OP``).  CuPy selects that with a process-wide compute type, so we set it around the
  one call and restore it afterwards.  Only the 2-D path of cuBLAS honours it: a batched (>= 3-D) matmul
  ignores it, so a batch that shares its right-hand matrix is reshaped into one 2-D product.
* Outer products.  A product whose inner dimension is 1 (depthwise convolution: one input channel per
  group) is an elementwise broadcast; sending it to cuBLAS as thousands of 1xK GEMMs is far slower.
* Groups.  ``grouped_matmul`` and ``grouped_gram`` are the block-diagonal products a grouped convolution
  is made of, written once here.
* Threads.  On NumPy, a product of at least ``threads.MIN_PARALLEL_BLAS_WORK`` multiply-adds gets all of
  minidnn's threads and a smaller one stays on one (``cpu_matmul``: the BLAS grain, docs/threads.md).
* CUDA graphs.  On a GPU the 2-D and batched products go to cuBLAS through backend/cuda/cublas.py, which binds
  the handle to the current stream itself, so a training step that multiplies matrices can be captured.
Nothing here imports CuPy: the array module comes from the arrays.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from . import threads
from .devices import array_module

__all__ = ["tf32_compute", "matmul", "lt_product", "cpu_matmul", "grouped_matmul", "grouped_gram"]


@contextlib.contextmanager
def tf32_compute(xp, enabled: bool):
    """Let CuPy's float32 2-D matmuls use TF32 inside the block (a no-op for NumPy or when disabled)."""
    if not enabled or xp is np:
        yield
        return
    linalg = xp._core._routines_linalg
    previous = linalg.get_compute_type(np.float32)
    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
    try:
        yield
    finally:
        linalg.set_compute_type(np.float32, previous)


def matmul(a, b, tf32: bool = False, out_dtype=None):
    """``a @ b`` with TF32 allowed when ``tf32`` (CuPy, float32 only; NumPy ignores it).  ``out_dtype`` float32 with
    float16/bfloat16 operands: the product's float32 sums unrounded (autocast's weight gradients)."""
    if out_dtype is not None and np.dtype(out_dtype) != a.dtype:
        return _float32_matmul(a, b, tf32, np.dtype(out_dtype))
    xp = array_module(a)
    if a.shape[-1] == 1:
        return a * b                          # inner dim 1: an outer product, by broadcasting
    if a.ndim > 2 and b.ndim == 2:
        # a shared right-hand matrix: one 2-D GEMM over all rows, which is also the TF32-capable path
        lead = a.shape[:-1]
        return matmul(a.reshape(-1, a.shape[-1]), b, tf32).reshape(*lead, b.shape[-1])
    # NumPy hands a product to BLAS only when each operand's last two axes are C- or F-ordered; any
    # other strides (a weight tap w[:, :, r, s] is one) fall back to a plain loop measured 280x slower
    # on a (3136, 16) x (16, 16) product.  The copy costs one pass over a (usually small) operand.
    a, b = _blas_ready(a), _blas_ready(b)
    if xp is not np:
        # cuBLAS called directly: capturable in a CUDA graph, and TF32 honoured by batched products too
        from .cuda import cublas
        if cublas.supports(a, b):
            return cublas.gemm(a, b, tf32)
        if a.ndim == b.ndim > 3 and a.shape[:-2] == b.shape[:-2]:      # several batch dims: one batched GEMM
            lead = a.shape[:-2]
            a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
            if cublas.supports(a3, b3):
                return cublas.gemm(a3, b3, tf32).reshape(*lead, a.shape[-2], b.shape[-1])
        with tf32_compute(xp, tf32 and a.dtype == np.float32 and a.ndim == 2 and b.ndim == 2):
            return xp.matmul(a, b)
    return cpu_matmul(a, b)


def lt_product(a, b, out=None, out_dtype=None, tf32=False, bias=None, row_sums=None):
    """GPU arrays: ``a @ b`` in one cublasLt launch with its epilogue -- ``bias`` added to every row, or
    ``row_sums`` (True or an array) the sums of a's rows -- written into ``out`` where given (backend/cuda/cublas.py
    ``lt_product``); None for NumPy arrays or where cublasLt takes no such call (the caller's other path)."""
    if type(a) is np.ndarray:
        return None
    lt = _LT_PRODUCT[0]
    if lt is None:      # imported on the first GPU call (a function-level import costs ~1 us a call: 9 a LeNet step)
        from .cuda import cublas
        lt = _LT_PRODUCT[0] = cublas.lt_product
    return lt(a, b, out, out_dtype, tf32, bias, row_sums)


_LT_PRODUCT = [None]


def _float32_matmul(a, b, tf32, dt):
    """a @ b in float32 from float16/bfloat16 operands: cuBLAS writes its float32 sums (one launch); NumPy multiplies
    float32 copies (exact products, float32 sums: what the GPU's tensor cores compute, up to the order)."""
    if dt != np.float32 or a.dtype.itemsize != 2 or b.dtype != a.dtype:
        raise ValueError(f"matmul: a {dt} product of {a.dtype} and {b.dtype} operands (only float32 of float16/"
                         "bfloat16)")
    if array_module(a) is np:
        return cpu_matmul(a.astype(dt), b.astype(dt))
    from .cuda import cublas
    a, b = _blas_ready(a), _blas_ready(b)
    if cublas.supports(a, b):
        return cublas.gemm(a, b, tf32, out_dtype=dt)
    return matmul(a, b, tf32).astype(dt)


def cpu_matmul(a, b, out=None):
    """``np.matmul(a, b, out=out)`` on NumPy arrays, with BLAS on all of minidnn's threads where the product has
    at least ``threads.MIN_PARALLEL_BLAS_WORK`` multiply-adds and on one thread below (``set_num_threads``).  For
    products the calling thread runs, not those inside the threads' own loops."""
    lead = math.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])) if a.ndim > 2 or b.ndim > 2 else 1
    work = lead * (a.shape[-2] if a.ndim > 1 else 1) * a.shape[-1] * (b.shape[-1] if b.ndim > 1 else 1)
    if work < threads.MIN_PARALLEL_BLAS_WORK:
        return np.matmul(a, b, out=out)
    with threads.blas_threads_for(work):
        return np.matmul(a, b, out=out)


def _blas_ready(m):
    if m.ndim < 2:
        return m
    item = m.itemsize
    s0, s1 = m.strides[-2], m.strides[-1]
    if (s1 == item and s0 >= m.shape[-1] * item) or (s0 == item and s1 >= m.shape[-2] * item):
        return m
    return m.copy()


def grouped_matmul(a, b, tf32: bool = False):
    """a (M, G*Ka) times the block-diagonal matrix of b (G, Ka, Kb): (M, G*Kb).

    Row m, group g: ``out[m, g*Kb:(g+1)*Kb] = a[m, g*Ka:(g+1)*Ka] @ b[g]``.  One GEMM when G == 1, else
    one batched GEMM over the groups (no Python loop over them).
    """
    G, Ka, Kb = b.shape
    M = a.shape[0]
    if G == 1:
        return matmul(a, b[0], tf32)
    per_group = a.reshape(M, G, Ka).transpose(1, 0, 2)            # (G, M, Ka)
    return matmul(per_group, b, tf32).transpose(1, 0, 2).reshape(M, G * Kb)


def grouped_gram(a, b, groups: int, tf32: bool = False):
    """Per group, the product a_g^T b_g summed over the M rows: a (M, G*A), b (M, G*B) -> (G, A, B)."""
    M = a.shape[0]
    A, B = a.shape[1] // groups, b.shape[1] // groups
    if groups == 1:
        return matmul(a.T, b, tf32)[None]
    a3, b3 = a.reshape(M, groups, A), b.reshape(M, groups, B)
    if A == 1 or B == 1:
        # depthwise: a reduction over rows of an elementwise product beats G skinny batched GEMMs
        return (a3[:, :, :, None] * b3[:, :, None, :]).sum(axis=0)
    return matmul(a3.transpose(1, 2, 0), b3.transpose(1, 0, 2), tf32)
