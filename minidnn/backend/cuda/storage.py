"""The data conventions of the normalization, pooling, activation, softmax and loss kernels (bn_kernels, bn_nhwc,
norm_kernels, pool_kernels, act_kernels, softmax_kernels, loss_kernels): how a value is stored and loaded, and the
types each data dtype computes with.  No kernel here: every source that uses it starts with ``STORAGE_HEADER``."""
from __future__ import annotations

import numpy as np

from .. import devices as _dev

__all__ = ["STORAGE_HEADER", "LDE_HEADER", "type_info", "param_dtype", "acc_dtype"]

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

# Value e of a raw 16-byte vector V (VEC values of T; both defined by the source before it), converted where it is
# used -- shared by norm_kernels' and norm_gncl's kernels, whose rows stay raw in registers.  The source also defines
# LDE_SCALAR: true where a value is read as itself (32/64-bit data, or one value a vector) -- a macro, because
# norm_gncl's VEC is a sizeof expression the preprocessor cannot evaluate.
LDE_HEADER = r"""
// Value e of raw vector v, converted where it is used: for 16-bit data an asm volatile on the vector's 32-bit word
// (a shift / mask for bfloat16, a cvt for float16), which the compiler may not hoist into one float register per
// value -- so the row stays in registers at 2 bytes a value.  32/64-bit data: the value itself.
__device__ __forceinline__ A LDE(const V& v, int e)
{
#if LDE_SCALAR
    return LD(v.v[e]);
#else
    const int e0 = e & ~1;           // the vector's 32-bit word holding value e: values e0 (low half), e0 + 1
    const unsigned int w = ((unsigned int)v.v[e0 + 1] << 16) | v.v[e0];
    float f;
#if STORAGE == 2
    if (e & 1) asm volatile("and.b32 %0, %1, 0xffff0000;" : "=f"(f) : "r"(w));
    else asm volatile("shl.b32 %0, %1, 16;" : "=f"(f) : "r"(w));
#else
    if (e & 1) asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi;}" : "=f"(f) : "r"(w));
    else asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo;}" : "=f"(f) : "r"(w));
#endif
    return f;
#endif
}

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
