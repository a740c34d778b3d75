"""The data conventions of the normalization, pooling, activation, softmax and loss kernels (bn_kernels, bn_nhwc,
norm_kernels, pool_kernels, act_kernels, softmax_kernels, loss_kernels): how a value is stored and loaded, and the
types each data dtype computes with.  No kernel here: every source that uses it starts with ``STORAGE_HEADER``."""
from __future__ import annotations

import numpy as np

from .. import devices as _dev

__all__ = ["STORAGE_HEADER", "type_info", "param_dtype", "acc_dtype"]

# Storage of the data arrays (shared by bn, pool and act kernels): SCALAR itself (STORAGE 0: float, double) or the
# 16 bits of a float16 (1) / bfloat16 (2) converted to and from A = float with PTX (no headers needed).
STORAGE_HEADER = r"""
typedef ACCUM A;
#if STORAGE == 0
typedef SCALAR T;
__device__ __forceinline__ A LD(T v) { return (A)v; }
__device__ __forceinline__ T ST(A v) { return (T)v; }
#else
typedef unsigned short T;
#if STORAGE == 1
__device__ __forceinline__ float LD(T h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ T ST(float f)
{ unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#else
__device__ __forceinline__ float LD(T h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ T ST(float f)
{ unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#endif
#endif
"""

# x's dtype name -> (SCALAR, ACCUM, STORAGE, parameter dtype)
_TYPES = {"float32": ("float", "float", 0, np.dtype(np.float32)),
          "float64": ("double", "double", 0, np.dtype(np.float64)),
          "float16": ("float", "float", 1, np.dtype(np.float32)),
          "bfloat16": ("float", "float", 2, np.dtype(np.float32))}


def type_info(dtype):
    """(SCALAR, ACCUM, STORAGE, parameter dtype) of data of ``dtype``, or None where no kernel exists."""
    return _TYPES.get(_dev.dtype_name(dtype))


def param_dtype(dtype):
    return _TYPES[_dev.dtype_name(dtype)][3]


def acc_dtype(dtype):
    return np.dtype(np.float64) if _dev.dtype_name(dtype) == "float64" else np.dtype(np.float32)
