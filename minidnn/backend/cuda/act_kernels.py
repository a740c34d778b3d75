"""Pointwise activations on the GPU: y = f(x) and dx = f'(x) * dy, one launch each (the reference's CuPy form
launches 2-5 kernels for most backward modes: comparison, cast, product, ...).

Shape legend: x, y, dy, dx any shape (float32/float64, or float16/bfloat16 computed in float), all of one shape and
memory order, walked as flat (n,) memory: C-contiguous,
or channels-last (N, *S, C) contiguous for a channels-first (N, C, *S) view -- the outputs keep that order.
Tiling: a grid-stride loop; each thread moves one 16-byte vector per iteration (4 floats / 2 doubles) when the
pointers are aligned and n fills whole vectors, else 4 independent scalars (loads first, then the math).
MODE (the ActivationMode, a macro) and COEF (the descriptor's coefficient, an argument) choose f; f' follows the
reference's conventions at the kinks (relu'(0) = 0, a NaN input passes the gradient on, ...).
Traffic: forward reads x, writes y; backward reads x and dy, writes dx -- the memory floor of each.
"""
from __future__ import annotations

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from .bn_kernels import STORAGE_HEADER, type_info

__all__ = ["supports", "forward", "backward", "MODES", "SOURCE"]

THREADS = 256
MODES = ("IDENTITY", "RELU", "SIGMOID", "TANH", "CLIPPED_RELU", "ELU", "LEAKY_RELU", "GELU", "GELU_TANH", "SWISH",
         "SOFTPLUS", "HARDTANH", "RELU6")

SOURCE = STORAGE_HEADER + "".join(f"#define M_{m} {i}\n" for i, m in enumerate(MODES)) + r"""

__device__ __forceinline__ A sigm(A v) { return (A)0.5 * ((A)1 + tanh((A)0.5 * v)); }   // never overflows
__device__ __forceinline__ bool between(A v, A lo, A hi) { return !(v <= lo || v >= hi); }

__device__ __forceinline__ A act_f(A v, const A c)
{
#if MODE == M_IDENTITY
    return v;
#elif MODE == M_RELU
    return v > (A)0 ? v : (v != v ? v : (A)0);
#elif MODE == M_SIGMOID
    return sigm(v);
#elif MODE == M_TANH
    return tanh(v);
#elif MODE == M_CLIPPED_RELU
    return v != v ? v : fmin(fmax(v, (A)0), c);
#elif MODE == M_RELU6
    return v != v ? v : fmin(fmax(v, (A)0), (A)6);
#elif MODE == M_HARDTANH
    return v != v ? v : fmin(fmax(v, -c), c);
#elif MODE == M_ELU
    return v > (A)0 ? v : c * expm1(v);      // NaN stays NaN, as the reference
#elif MODE == M_LEAKY_RELU
    return v > (A)0 ? v : c * v;
#elif MODE == M_GELU
    return (A)0.5 * v * ((A)1 + erf(v * (A)0.70710678118654752440));
#elif MODE == M_GELU_TANH
    return (A)0.5 * v * ((A)1 + tanh((A)0.79788456080286535588 * (v + (A)0.044715 * v * v * v)));
#elif MODE == M_SWISH
    return v * sigm(c * v);
#elif MODE == M_SOFTPLUS
    const A u = c * v;     // logaddexp(0, u) / c
    return (fmax(u, (A)0) + log1p(exp(-fabs(u)))) / c;
#endif
}

__device__ __forceinline__ A act_df(A v, const A c)
{
#if MODE == M_IDENTITY
    return (A)1;
#elif MODE == M_RELU
    return v <= (A)0 ? (A)0 : (A)1;
#elif MODE == M_SIGMOID
    const A s = sigm(v); return s * ((A)1 - s);
#elif MODE == M_TANH
    const A t = tanh(v); return (A)1 - t * t;
#elif MODE == M_CLIPPED_RELU
    return between(v, (A)0, c) ? (A)1 : (A)0;
#elif MODE == M_RELU6
    return between(v, (A)0, (A)6) ? (A)1 : (A)0;
#elif MODE == M_HARDTANH
    return between(v, -c, c) ? (A)1 : (A)0;
#elif MODE == M_ELU
    return v <= (A)0 ? c * exp(v) : (A)1;
#elif MODE == M_LEAKY_RELU
    return v > (A)0 ? (A)1 : c;
#elif MODE == M_GELU
    return (A)0.5 * ((A)1 + erf(v * (A)0.70710678118654752440)) + v * exp((A)-0.5 * v * v) * (A)0.39894228040143267794;
#elif MODE == M_GELU_TANH
    const A k = (A)0.79788456080286535588, b = (A)0.044715;
    const A t = tanh(k * (v + b * v * v * v));
    return (A)0.5 * ((A)1 + t) + (A)0.5 * v * ((A)1 - t * t) * k * ((A)1 + (A)3 * b * v * v);
#elif MODE == M_SWISH
    const A s = sigm(c * v); return s + c * v * s * ((A)1 - s);
#elif MODE == M_SOFTPLUS
    return sigm(c * v);
#endif
}

// 16-byte vectors: VW elements of T (4 floats, 2 doubles); the host sets `vec` when every pointer is 16-byte
// aligned and n is a multiple of VW, else the scalar loop (4 independent elements per iteration) runs.
#define VW (16 / (int)sizeof(T))
struct alignas(16) Vec { T v[VW]; };

extern "C" __global__ void __launch_bounds__(256)
act_fwd(const T* __restrict__ x, T* __restrict__ y, const long long n, const double coef, const int vec)
{
    const A c = (A)coef;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        const long long nv = n / VW;
        for (long long k = tid; k < nv; k += stride) {
            Vec a = reinterpret_cast<const Vec*>(x)[k], b;
#pragma unroll
            for (int u = 0; u < VW; ++u) b.v[u] = ST(act_f(LD(a.v[u]), c));
            reinterpret_cast<Vec*>(y)[k] = b;
        }
        return;
    }
    for (long long i0 = tid; i0 < n; i0 += 4 * stride) {
        T v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) if (i0 + u * stride < n) v[u] = x[i0 + u * stride];
#pragma unroll
        for (int u = 0; u < 4; ++u) if (i0 + u * stride < n) y[i0 + u * stride] = ST(act_f(LD(v[u]), c));
    }
}

extern "C" __global__ void __launch_bounds__(256)
act_bwd(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, const long long n, const double coef,
        const int vec)
{
    const A c = (A)coef;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        const long long nv = n / VW;
        for (long long k = tid; k < nv; k += stride) {
            const Vec a = reinterpret_cast<const Vec*>(x)[k], g = reinterpret_cast<const Vec*>(dy)[k];
            Vec b;
#pragma unroll
            for (int u = 0; u < VW; ++u) b.v[u] = ST(act_df(LD(a.v[u]), c) * LD(g.v[u]));
            reinterpret_cast<Vec*>(dx)[k] = b;
        }
        return;
    }
    for (long long i0 = tid; i0 < n; i0 += 4 * stride) {
        T v[4], g[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) if (i0 + u * stride < n) { v[u] = x[i0 + u * stride]; g[u] = dy[i0 + u * stride]; }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (i0 + u * stride < n) dx[i0 + u * stride] = ST(act_df(LD(v[u]), c) * LD(g[u]));
    }
}
"""




def _memory_order(a):
    """'C' for C-contiguous, 'CL' for a channels-first view of channels-last memory, else None."""
    if a.flags.c_contiguous:
        return "C"
    if a.ndim >= 3 and a.transpose((0, *range(2, a.ndim), 1)).flags.c_contiguous:
        return "CL"
    return None


def supports(mode_name, x, *others) -> bool:
    if not (_dev.is_cuda_array(x) and type_info(x.dtype) is not None and x.size > 0 and mode_name in MODES):
        return False
    order = _memory_order(x)
    return order is not None and all(
        o is not None and tuple(o.shape) == tuple(x.shape) and o.dtype == x.dtype
        and tuple(o.strides) == tuple(x.strides)
        for o in others)


_kernel_cache: dict = {}


def _kernel(name, dtype, mode_name):
    key = (name, dtype, mode_name)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _kernel_compiled(name, dtype, mode_name)
    return k


def _kernel_compiled(name, dtype, mode_name):
    scalar, accum, storage, _ = type_info(dtype)
    return _launch.get_kernel(SOURCE, name, (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}",
                                             f"-DMODE=M_{mode_name}", "-std=c++14"))


def _grid(n, dev):
    return (max(1, min((n + THREADS * 4 - 1) // (THREADS * 4), _launch.sm_count(dev) * 8)),)


# ---- plans: everything but the arrays, once per call signature ------------------------------------------------

class _Plan:
    """A settled activation call: ``plan(x)`` -> y, ``plan(x, dy)`` -> dx.  The output is allocated in x's memory
    order (``mem`` shape, viewed back channels-first through ``back``); the prepared launch takes the arrays' pointers
    directly (no flat views); ``vec`` is the same launch with 16-byte vectors, taken when every input pointer is
    16-byte aligned (a fresh output always is; n filling whole vectors is part of the signature)."""
    __slots__ = ("dev", "mem", "back", "dtype", "go", "vec")

    def __call__(self, x, dy=None):
        with _launch.on_device(self.dev):
            out = _launch._cp.empty(self.mem, self.dtype)
            vec = self.vec
            if dy is None:
                (vec if vec is not None and not x.data.ptr & 15 else self.go)(x, out)
            else:
                (vec if vec is not None and not (x.data.ptr | dy.data.ptr) & 15 else self.go)(x, dy, out)
        return out if self.back is None else out.transpose(self.back)


_plans: dict = {}


def plan(mode_name, coef, x, backward=False):
    """The plan of ``forward(mode_name, coef, x)`` (or of ``backward``: call it with x, dy), built once per
    signature."""
    dev = x.data.device_id
    return _launch.planned(_plans, (backward, mode_name, coef, x.shape, x.strides, x.dtype, dev), _plan,
                           mode_name, coef, x, backward, dev)


def _plan(mode_name, coef, x, backward, dev):
    p = _Plan()
    p.dev, p.dtype = dev, x.dtype
    if x.flags.c_contiguous:
        p.mem, p.back = x.shape, None
    else:                                   # channels-last memory of a channels-first view (supports)
        perm = (0, *range(2, x.ndim), 1)
        p.mem, p.back = tuple(x.shape[i] for i in perm), (0, x.ndim - 1, *range(1, x.ndim - 1))
    n = x.size
    k = _kernel("act_bwd" if backward else "act_fwd", x.dtype, mode_name)
    head = [None] * (3 if backward else 2) + [np.int64(n), np.float64(coef)]
    p.go = _launch.prepare(k, _grid(n, dev), (THREADS,), head + [np.int32(0)])
    p.vec = _launch.prepare(k, _grid(n, dev), (THREADS,), head + [np.int32(1)]) \
        if n % (16 // x.itemsize) == 0 else None
    return p


def forward(mode_name, coef, x):
    return plan(mode_name, coef, x)(x)


def backward(mode_name, coef, x, dy):
    return plan(mode_name, coef, x, True)(x, dy)
