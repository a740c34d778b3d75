"""Softmax and log-softmax on the GPU, forward and backward, over one run of consecutive dims.

Shape legend: x, y, dy, dx viewed as (outer, C, inner), C-contiguous: the softmax runs over C (the product of the
normalised dims) for each of the outer * inner rows; element (o, c, i) sits at (o * C + c) * inner + i.
    F.softmax(x, dim=-1), cross-entropy logits (N, C):  inner = 1      CHANNEL mode on NCHW: outer N, C, inner H*W
Tiling: one warp per row (8 rows per 256-thread block, grid-stride over rows); lane l handles c = l, l + 32, ...
Forward: pass 1 the row max (ACCURATE, LOG; FAST takes 0, as its reference formula exp(x) / sum exp(x)), pass 2
sum exp(x - max) (warp shuffle reductions, fixed order), pass 3 writes y = e / s or x - max - log s.
Backward: pass 1 sum(dy * y) (softmax) or sum(dy) (log-softmax), pass 2 dx = y * (dy - s) or dy - exp(y) * s.
Rows are re-read from L1/L2 (a row of 10..1000 classes is small); with inner = 1 the warp's reads are coalesced.
Data float32/float64, or float16/bfloat16 loaded into float (LD/ST of bn_kernels' STORAGE_HEADER): every sum and
exp in float, one rounding at the store.
"""
from __future__ import annotations

import math

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from .bn_kernels import STORAGE_HEADER, type_info

__all__ = ["supports", "collapse", "forward", "backward", "SOURCE", "WARP_REDUCE"]

THREADS = 256

# Shared with loss_kernels.py: butterfly sums / maxima over a warp (every lane gets the result).
WARP_REDUCE = r"""
template <class V> __device__ __forceinline__ V warp_sum(V v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <class V> __device__ __forceinline__ V warp_max(V v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) { const V u = __shfl_xor_sync(0xffffffffu, v, o); v = (u > v || u != u) ? u : v; }
    return v;
}
"""

SOURCE = STORAGE_HEADER + WARP_REDUCE + r"""

extern "C" __global__ void __launch_bounds__(256)
softmax_fwd(const T* __restrict__ x, T* __restrict__ y, const long long rows, const int C, const int inner)
{
    const int lane = threadIdx.x & 31;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((long long)gridDim.x * blockDim.x) >> 5) {
        const long long o = r / inner, i = r - o * inner;
        const T* xr = x + o * C * (long long)inner + i;
        T* yr = y + o * C * (long long)inner + i;
        A m = 0;
#if ALGO != 0
        m = -(A)__int_as_float(0x7f800000);     // -inf
        for (int c = lane; c < C; c += 32) { const A v = LD(xr[(long long)c * inner]); m = (v > m || v != v) ? v : m; }
        m = warp_max(m);
        if (m == -(A)__int_as_float(0x7f800000)) m = 0;        // an all -inf row: exp(-inf - 0) = 0
#endif
        A s = 0;
        for (int c = lane; c < C; c += 32) s += exp(LD(xr[(long long)c * inner]) - m);
        s = warp_sum(s);
#if ALGO == 2
        const A ls = log(s);
        for (int c = lane; c < C; c += 32) yr[(long long)c * inner] = ST(LD(xr[(long long)c * inner]) - m - ls);
#else
        const A inv = (A)1 / s;
        for (int c = lane; c < C; c += 32) yr[(long long)c * inner] = ST(exp(LD(xr[(long long)c * inner]) - m) * inv);
#endif
    }
}

extern "C" __global__ void __launch_bounds__(256)
softmax_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, const long long rows, const int C,
            const int inner)
{
    const int lane = threadIdx.x & 31;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((long long)gridDim.x * blockDim.x) >> 5) {
        const long long o = r / inner, i = r - o * inner;
        const long long base = o * C * (long long)inner + i;
        A s = 0;
        for (int c = lane; c < C; c += 32) {
            const long long a = base + (long long)c * inner;
#if ALGO == 2
            s += LD(dy[a]);
#else
            s += LD(dy[a]) * LD(y[a]);
#endif
        }
        s = warp_sum(s);
        for (int c = lane; c < C; c += 32) {
            const long long a = base + (long long)c * inner;
#if ALGO == 2
            dx[a] = ST(LD(dy[a]) - exp(LD(y[a])) * s);
#else
            dx[a] = ST(LD(y[a]) * (LD(dy[a]) - s));
#endif
        }
    }
}
"""

_ALGO = {"FAST": 0, "ACCURATE": 1, "LOG": 2}
_INT_MAX = 2 ** 31 - 1


def collapse(shape, axes):
    """(outer, C, inner) for a softmax over ``axes`` of a C-contiguous array, or None when the axes are not one run
    of consecutive dims."""
    axes = sorted(axes)
    if not axes or axes != list(range(axes[0], axes[-1] + 1)):
        return None
    return (math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]), math.prod(shape[axes[-1] + 1:]))


def supports(x, axes, *others) -> bool:
    return (_dev.is_cuda_array(x) and type_info(x.dtype) is not None and 0 < x.size <= _INT_MAX
            and x.flags.c_contiguous and collapse(x.shape, axes) is not None
            and all(o is not None and o.flags.c_contiguous and o.dtype == x.dtype for o in others))


def _grid(rows, dev):
    return (max(1, min((rows + 7) // 8, _launch.sm_count(dev) * 16)),)


_kernel_cache: dict = {}


def _kernel(name, dtype, algo):
    key = (name, dtype, algo)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _kernel_compiled(name, dtype, algo)
    return k


def _kernel_compiled(name, dtype, algo):
    scalar, accum, storage, _ = type_info(dtype)
    return _launch.get_kernel(SOURCE, name, (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}",
                                             f"-DALGO={_ALGO[algo]}", "-std=c++14"))


# ---- plans: kernel, grid and packed scalars once per call signature; a call = one allocation + one launch --------
_plans: dict = {}


class _Plan:
    __slots__ = ("dev", "go")

    def __call__(self, a, b=None):
        with _launch.on_device(self.dev):
            out = _launch._cp.empty(a.shape, a.dtype)
            if b is None:
                self.go(a, out)
            else:
                self.go(a, b, out)
        return out


def _plan(name, x, axes, algo_name, dev):
    outer, c, inner = collapse(x.shape, axes)
    rows = outer * inner
    p = _Plan()
    p.dev = dev
    p.go = _launch.prepare(_kernel(name, x.dtype, algo_name), _grid(rows, dev), (THREADS,),
                           [None] * (2 if name == "softmax_fwd" else 3) + [np.int64(rows), np.int32(c),
                                                                            np.int32(inner)])
    return p


def plan(x, axes, algo_name, backward=False):
    """The settled launch of softmax over ``axes`` of arrays shaped like x: ``plan(x)`` -> y, ``plan(y, dy)`` -> dx
    (``backward``)."""
    dev = x.data.device_id
    name = "softmax_bwd" if backward else "softmax_fwd"
    return _launch.planned(_plans, (name, x.shape, tuple(axes), algo_name, x.dtype, dev), _plan, name, x, axes,
                           algo_name, dev)


def forward(x, axes, algo_name):
    return plan(x, axes, algo_name)(x)


def backward(y, dy, axes, algo_name):
    return plan(y, axes, algo_name, True)(y, dy)
