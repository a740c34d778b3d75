"""Softmax and log-softmax on the GPU, forward and backward, over one run of consecutive dims.

Shape legend: x, y, dy, dx viewed as (outer, C, inner), C-contiguous: the softmax runs over C (the product of the
normalised dims) for each of the outer * inner rows; element (o, c, i) sits at (o * C + c) * inner + i.
    F.softmax(x, dim=-1), cross-entropy logits (N, C):  inner = 1      CHANNEL mode on NCHW: outer N, C, inner H*W
Data float32/float64, or float16/bfloat16 loaded into float (LD/ST of the STORAGE_HEADER): every sum and exp in
float, one rounding at the store.

Rows (inner = 1: softmax_rows_fwd / softmax_rows_bwd, the tiling of ROW_HEADER below, shared with loss_kernels):
G threads own a row -- G a power of two <= 32 (a sub-warp group; BLOCK / G rows per block) or G = BLOCK (one row per
block) -- each holding NV vectors of VEC elements (16-byte loads where C % VEC == 0 and the arrays are aligned):
thread g of the group holds elements (k * G + g) * VEC + j of a chunk of G * NV * VEC elements.  row_config picks G
and NV so that a row of up to 1024 (float64: 512) elements is one chunk of a warp and one of up to 16384 (8192) is
one chunk of a block: the row is read ONCE into registers; each thread takes its own max m_t and sum
s_t = sum exp(v - m_t) (keeping the exps), then the group's max M and S = sum s_t exp(m_t - M) (shuffles, shared
memory across warps; fixed order), and writes y = e exp(m_t - M) / S or v - M - log S from registers.  A longer
row runs chunk by chunk: an online (max, sum) over the chunks, then a second read of the row (from L2) to write.
Backward the same: y and dy read once, the group's sum(dy * y) (softmax) or sum(dy) (log-softmax), then
dx = y (dy - s) or dy - exp(y) s.  FAST skips the max (its formula is exp(x) / sum exp(x) as written).
Columns (inner > 1, e.g. a channel softmax on NCHW: softmax_cols_fwd / _bwd): one thread per (o, i), consecutive
threads on consecutive i (coalesced); C <= 32 values kept in registers (CREG), else a max pass, a sum pass and the
write pass over the column (re-read through L1/L2).
MINIDNN_SOFTMAX_V1=1 launches the previous kernels instead (one warp per row, scalar loads, three passes over the
row: SOURCE_V1) -- kept for a GPU A/B.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from .bn_kernels import STORAGE_HEADER, type_info

__all__ = ["supports", "collapse", "forward", "backward", "row_config", "SOURCE", "SOURCE_V1", "ROW_HEADER",
           "WARP_REDUCE"]

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

# ---- the previous kernels (MINIDNN_SOFTMAX_V1=1): one warp per row, scalar loads, three passes ----------------
SOURCE_V1 = STORAGE_HEADER + WARP_REDUCE + r"""

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

# ---- rows held in registers (shared with loss_kernels.py) ---------------------------------------------------------
# Compile-time: G threads per row, BLOCK threads per block, NV vectors of VEC elements per thread and chunk,
# VBYTES = VEC * sizeof(T).  Every index is 32-bit: supports() keeps x.size <= 2^31 - 1.
ROW_HEADER = r"""
#if VEC == 1
typedef T VR;
#elif VBYTES == 16
typedef uint4 VR;
#elif VBYTES == 8
typedef uint2 VR;
#else
typedef unsigned int VR;
#endif
union Pack { VR raw; T v[VEC]; };
#define E (NV * VEC)                       // elements a thread holds per chunk
#define CHUNK (G * E)                      // elements a group covers per chunk
#define RPB (BLOCK / G)                    // rows per block (1 when G == BLOCK)
#define NEG_INF (-(A)__int_as_float(0x7f800000))
#define A_NAN ((A)__int_as_float(0x7fffffff))

__device__ __forceinline__ A vmax(A a, A b) { return (b > a || b != b) ? b : a; }      // NaN wins

// Sum / max over the G threads of a row (every one gets it): shuffles within the warp, then (G == BLOCK > 32) the
// warps' values through sm[BLOCK / 32] in warp order.  Fixed order: deterministic.
template <class V> __device__ __forceinline__ V g_sum(V v, V* sm)
{
#pragma unroll
    for (int o = (G < 32 ? G : 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
#if G > 32
    __syncthreads();                       // sm is free: the previous reduction's reads are done
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sm[0];
#pragma unroll
    for (int k = 1; k < G / 32; ++k) v += sm[k];
#endif
    return v;
}
template <class V> __device__ __forceinline__ V g_max(V v, V* sm)
{
#pragma unroll
    for (int o = (G < 32 ? G : 32) / 2; o > 0; o >>= 1) v = vmax(v, __shfl_xor_sync(0xffffffffu, v, o));
#if G > 32
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sm[0];
#pragma unroll
    for (int k = 1; k < G / 32; ++k) v = vmax(v, sm[k]);
#endif
    return v;
}

// Chunk c0 of a row p of C elements into a[E] (as A), thread g's slots; slots past the row get `pad`.
// VA: 16-byte (VBYTES) vector loads (the caller checked the alignment), else element by element.
template <bool VA> __device__ __forceinline__ void load_chunk(const T* __restrict__ p, int c0, int C, int g, A pad,
                                                              A* a)
{
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = c0 + (k * G + g) * VEC;
        Pack q;
        if (VA) {
            if (c < C) q.raw = *reinterpret_cast<const VR*>(p + c);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) if (c < C) q.v[j] = p[c + j];
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[k * VEC + j] = c < C ? LD(q.v[j]) : pad;
    }
}

template <bool VA> __device__ __forceinline__ void store_chunk(T* __restrict__ p, int c0, int C, int g, const A* a)
{
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int c = c0 + (k * G + g) * VEC;
        if (c < C) {
            Pack q;
#pragma unroll
            for (int j = 0; j < VEC; ++j) q.v[j] = ST(a[k * VEC + j]);
            if (VA) *reinterpret_cast<VR*>(p + c) = q.raw;
            else {
#pragma unroll
                for (int j = 0; j < VEC; ++j) p[c + j] = q.v[j];
            }
        }
    }
}

// Every pointer on a VBYTES boundary (rows are too: C % VEC == 0), so the vector loads may be used.
__device__ __forceinline__ bool aligned(const void* a, const void* b = 0, const void* c = 0)
{
    return VEC > 1 && (((unsigned long long)a | (unsigned long long)b | (unsigned long long)c) % VBYTES) == 0;
}
"""

SOURCE = STORAGE_HEADER + ROW_HEADER + r"""
// ---- rows (inner = 1) --------------------------------------------------------------------------------------------
template <bool VA> __device__ __forceinline__ void fwd_rows(const T* __restrict__ x, T* __restrict__ y, int rows,
                                                            int C, A* sm)
{
    const int g = threadIdx.x % G;
    const int nch = (C + CHUNK - 1) / CHUNK;
    for (int r0 = blockIdx.x * RPB; r0 < rows; r0 += gridDim.x * RPB) {      // uniform over the block
        const int r = r0 + (int)threadIdx.x / G;
        const bool live = r < rows;                                          // a dead group still shuffles
        const int cl = live ? C : 0;
        const T* xr = x + (size_t)(live ? r : 0) * C;
        T* yr = y + (size_t)(live ? r : 0) * C;
        A a[E];
        A m = ALGO == 0 ? (A)0 : NEG_INF, s = 0;
        for (int ch = 0; ch < nch; ++ch) {           // one chunk on the register path
            load_chunk<VA>(xr, ch * CHUNK, cl, g, NEG_INF, a);
#if ALGO != 0
            A cm = NEG_INF;
#pragma unroll
            for (int e = 0; e < E; ++e) cm = vmax(cm, a[e]);
            const A nm = vmax(m, cm);
            if (nm != m) s = m == NEG_INF ? (A)0 : s * exp(m - nm);        // online: rescale the running sum
            m = nm;
#endif
            const A sh = m == NEG_INF ? (A)0 : m;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const A ex = exp(a[e] - sh);
                s += ex;
#if ALGO != 2
                a[e] = ex;                           // softmax keeps exp(v - m_t)
#endif
            }
        }
#if ALGO != 0
        A M = g_max(m, sm);
        if (M == NEG_INF) M = 0;           // an all -inf row: exp(-inf - 0) = 0, S = 0, y NaN as the reference
        const A f = m == NEG_INF ? (A)0 : exp(m - M);
#else
        const A M = 0, f = 1;
#endif
        const A S = g_sum(s * f, sm);
#if ALGO == 2
        const A ls = log(S);
#else
        const A inv = (A)1 / S;
#endif
        if (nch == 1) {
#pragma unroll
            for (int e = 0; e < E; ++e) {
#if ALGO == 2
                a[e] = a[e] - M - ls;
#else
                a[e] = a[e] * f * inv;
#endif
            }
            if (live) store_chunk<VA>(yr, 0, C, g, a);
        } else if (live) {
            for (int ch = 0; ch < nch; ++ch) {
                load_chunk<VA>(xr, ch * CHUNK, C, g, (A)0, a);
#pragma unroll
                for (int e = 0; e < E; ++e) {
#if ALGO == 2
                    a[e] = a[e] - M - ls;
#else
                    a[e] = exp(a[e] - M) * inv;
#endif
                }
                store_chunk<VA>(yr, ch * CHUNK, C, g, a);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK)
softmax_rows_fwd(const T* __restrict__ x, T* __restrict__ y, const int rows, const int C)
{
    __shared__ A sm[BLOCK / 32];
    if (aligned(x, y)) fwd_rows<true>(x, y, rows, C, sm);
    else fwd_rows<false>(x, y, rows, C, sm);
}

template <bool VA> __device__ __forceinline__ void bwd_rows(const T* __restrict__ y, const T* __restrict__ dy,
                                                            T* __restrict__ dx, int rows, int C, A* sm)
{
    const int g = threadIdx.x % G;
    const int nch = (C + CHUNK - 1) / CHUNK;
    for (int r0 = blockIdx.x * RPB; r0 < rows; r0 += gridDim.x * RPB) {
        const int r = r0 + (int)threadIdx.x / G;
        const bool live = r < rows;
        const int cl = live ? C : 0;
        const size_t base = (size_t)(live ? r : 0) * C;
        A a[E], b[E];
        A s = 0;
        for (int ch = 0; ch < nch; ++ch) {
            load_chunk<VA>(dy + base, ch * CHUNK, cl, g, (A)0, b);
#if ALGO == 2
#pragma unroll
            for (int e = 0; e < E; ++e) s += b[e];
            if (nch == 1) load_chunk<VA>(y + base, 0, cl, g, (A)0, a);
#else
            load_chunk<VA>(y + base, ch * CHUNK, cl, g, (A)0, a);
#pragma unroll
            for (int e = 0; e < E; ++e) s += b[e] * a[e];
#endif
        }
        s = g_sum(s, sm);
        if (!live) continue;
        for (int ch = 0; ch < nch; ++ch) {
            if (nch > 1) {
                load_chunk<VA>(dy + base, ch * CHUNK, C, g, (A)0, b);
                load_chunk<VA>(y + base, ch * CHUNK, C, g, (A)0, a);
            }
#pragma unroll
            for (int e = 0; e < E; ++e) {
#if ALGO == 2
                a[e] = b[e] - exp(a[e]) * s;
#else
                a[e] = a[e] * (b[e] - s);
#endif
            }
            store_chunk<VA>(dx + base, ch * CHUNK, C, g, a);
        }
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK)
softmax_rows_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, const int rows, const int C)
{
    __shared__ A sm[BLOCK / 32];
    if (aligned(y, dy, dx)) bwd_rows<true>(y, dy, dx, rows, C, sm);
    else bwd_rows<false>(y, dy, dx, rows, C, sm);
}

// ---- columns (inner > 1): one thread per (o, i); element c at base + c * inner -----------------------------------
extern "C" __global__ void __launch_bounds__(256)
softmax_cols_fwd(const T* __restrict__ x, T* __restrict__ y, const int cols, const int C, const int inner)
{
    for (int col = blockIdx.x * 256 + threadIdx.x; col < cols; col += gridDim.x * 256) {
        const int o = col / inner, i = col - o * inner;
        const T* xc = x + (size_t)o * C * inner + i;
        T* yc = y + (size_t)o * C * inner + i;
#if CREG
        A a[CREG];
        A m = ALGO == 0 ? (A)0 : NEG_INF;
#pragma unroll
        for (int c = 0; c < CREG; ++c) {
            a[c] = c < C ? LD(xc[(size_t)c * inner]) : NEG_INF;
#if ALGO != 0
            m = vmax(m, a[c]);
#endif
        }
        if (m == NEG_INF) m = 0;
        A s = 0;
#pragma unroll
        for (int c = 0; c < CREG; ++c) {
            const A ex = exp(a[c] - m);
            s += ex;
#if ALGO != 2
            a[c] = ex;
#endif
        }
#if ALGO == 2
        const A ls = log(s);
#pragma unroll
        for (int c = 0; c < CREG; ++c) if (c < C) yc[(size_t)c * inner] = ST(a[c] - m - ls);
#else
        const A inv = (A)1 / s;
#pragma unroll
        for (int c = 0; c < CREG; ++c) if (c < C) yc[(size_t)c * inner] = ST(a[c] * inv);
#endif
#else
        A m = 0;
#if ALGO != 0
        m = NEG_INF;
        for (int c = 0; c < C; ++c) m = vmax(m, LD(xc[(size_t)c * inner]));
        if (m == NEG_INF) m = 0;
#endif
        A s = 0;
        for (int c = 0; c < C; ++c) s += exp(LD(xc[(size_t)c * inner]) - m);
#if ALGO == 2
        const A ls = log(s);
        for (int c = 0; c < C; ++c) yc[(size_t)c * inner] = ST(LD(xc[(size_t)c * inner]) - m - ls);
#else
        const A inv = (A)1 / s;
        for (int c = 0; c < C; ++c) yc[(size_t)c * inner] = ST(exp(LD(xc[(size_t)c * inner]) - m) * inv);
#endif
#endif
    }
}

extern "C" __global__ void __launch_bounds__(256)
softmax_cols_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, const int cols, const int C,
                 const int inner)
{
    for (int col = blockIdx.x * 256 + threadIdx.x; col < cols; col += gridDim.x * 256) {
        const int o = col / inner, i = col - o * inner;
        const size_t base = (size_t)o * C * inner + i;
#if CREG
        A a[CREG], b[CREG];
        A s = 0;
#pragma unroll
        for (int c = 0; c < CREG; ++c) {
            a[c] = c < C ? LD(y[base + (size_t)c * inner]) : (A)0;
            b[c] = c < C ? LD(dy[base + (size_t)c * inner]) : (A)0;
#if ALGO == 2
            s += b[c];
#else
            s += b[c] * a[c];
#endif
        }
#pragma unroll
        for (int c = 0; c < CREG; ++c) {
#if ALGO == 2
            if (c < C) dx[base + (size_t)c * inner] = ST(b[c] - exp(a[c]) * s);
#else
            if (c < C) dx[base + (size_t)c * inner] = ST(a[c] * (b[c] - s));
#endif
        }
#else
        A s = 0;
        for (int c = 0; c < C; ++c) {
            const size_t k = base + (size_t)c * inner;
#if ALGO == 2
            s += LD(dy[k]);
#else
            s += LD(dy[k]) * LD(y[k]);
#endif
        }
        for (int c = 0; c < C; ++c) {
            const size_t k = base + (size_t)c * inner;
#if ALGO == 2
            dx[k] = ST(LD(dy[k]) - exp(LD(y[k])) * s);
#else
            dx[k] = ST(LD(y[k]) * (LD(dy[k]) - s));
#endif
        }
#endif
    }
}
"""


def _pow2_at_least(n):
    return 1 << max(0, int(n) - 1).bit_length()


def row_config(c, itemsize, acc_itemsize, arrays=1):
    """(G, NV, VEC, BLOCK) of the row kernels for rows of ``c`` elements of ``itemsize`` bytes computed in
    ``acc_itemsize``-byte floats, ``arrays`` rows held at once (2: softmax backward's y and dy): VEC the widest
    vector (<= 16 bytes) that divides the row; a warp-or-less group while a thread holds <= 32 (float64: 16)
    elements per array, else a block of up to 512 threads holding <= 32 (16) elements, half that for two arrays;
    a longer row runs in chunks of G * NV * VEC.  NV is a power of two (fewer distinct compilations)."""
    vec = max(1, 16 // itemsize)
    while c % vec:
        vec //= 2
    nvec = c // vec
    cap = 32 if acc_itemsize <= 4 else 16            # elements a warp-path thread keeps per array
    g = min(32, _pow2_at_least(nvec))
    nv = _pow2_at_least(-(-nvec // g))
    if nv * vec <= cap:
        return g, nv, vec, 256
    cap //= arrays                                   # a block-path thread (512 threads: <= 128 registers each)
    block = min(512, max(64, _pow2_at_least(-(-c // cap))))
    nv = max(1, min(_pow2_at_least(-(-nvec // block)), cap // vec))
    return block, nv, vec, block


def col_reg(c):
    """CREG of the column kernels: the register array's length (8, 16, 32), 0 for the three-pass loop."""
    return next((k for k in (8, 16, 32) if c <= k), 0)


_ALGO = {"FAST": 0, "ACCURATE": 1, "LOG": 2}
_INT_MAX = 2 ** 31 - 1
V1 = os.environ.get("MINIDNN_SOFTMAX_V1", "0") == "1"


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


def _grid(groups, dev, per_sm=16):
    return (max(1, min(groups, _launch.sm_count(dev) * per_sm)),)


_kernel_cache: dict = {}


def _kernel(name, dtype, algo, defines=()):
    key = (name, dtype, algo, defines)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _kernel_compiled(name, dtype, algo, defines)
    return k


def _kernel_compiled(name, dtype, algo, defines):
    scalar, accum, storage, _ = type_info(dtype)
    opts = (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DALGO={_ALGO[algo]}", "-std=c++14")
    return _launch.get_kernel(SOURCE_V1 if name in ("softmax_fwd", "softmax_bwd") else SOURCE, name,
                              opts + tuple(f"-D{d}" for d in defines))


def row_defines(c, dtype, arrays=1):
    """The row kernels' compile-time tiling for rows of ``c`` elements of ``dtype`` (see row_config), as
    NAME=VALUE strings, and the threads per block."""
    item = np.dtype(dtype).itemsize
    g, nv, vec, block = row_config(c, item, 8 if item == 8 else 4, arrays)
    return (f"G={g}", f"NV={nv}", f"VEC={vec}", f"VBYTES={vec * item}", f"BLOCK={block}"), g, block


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


def _plan(backward, x, axes, algo_name, dev):
    outer, c, inner = collapse(x.shape, axes)
    rows = outer * inner
    arrays = [None] * (3 if backward else 2)
    if backward and algo_name == "FAST":
        algo_name = "ACCURATE"              # the same backward: one compilation
    p = _Plan()
    p.dev = dev
    if V1:
        name = "softmax_bwd" if backward else "softmax_fwd"
        p.go = _launch.prepare(_kernel(name, x.dtype, algo_name), _grid((rows + 7) // 8, dev), (THREADS,),
                               arrays + [np.int64(rows), np.int32(c), np.int32(inner)])
    elif inner == 1:
        defines, g, block = row_defines(c, x.dtype, 2 if backward else 1)
        name = "softmax_rows_bwd" if backward else "softmax_rows_fwd"
        p.go = _launch.prepare(_kernel(name, x.dtype, algo_name, defines), _grid(-(-rows // (block // g)), dev),
                               (block,), arrays + [np.int32(rows), np.int32(c)])
    else:
        name = "softmax_cols_bwd" if backward else "softmax_cols_fwd"
        p.go = _launch.prepare(_kernel(name, x.dtype, algo_name, (f"CREG={col_reg(c)}",)),
                               _grid(-(-rows // 256), dev, 32), (256,), arrays + [np.int32(rows), np.int32(c),
                                                                               np.int32(inner)])
    return p


def plan(x, axes, algo_name, backward=False):
    """The settled launch of softmax over ``axes`` of arrays shaped like x: ``plan(x)`` -> y, ``plan(y, dy)`` -> dx
    (``backward``)."""
    dev = x.data.device_id
    return _launch.planned(_plans, (backward, x.shape, tuple(axes), algo_name, x.dtype, dev), _plan, backward, x,
                           axes, algo_name, dev)


def forward(x, axes, algo_name):
    return plan(x, axes, algo_name)(x)


def backward(y, dy, axes, algo_name):
    return plan(y, axes, algo_name, True)(y, dy)


def _compile_check(out_dir):
    """Write every row/column configuration's source for nvcc (python -m minidnn.backend.cuda.softmax_kernels DIR)."""
    import os.path
    files = []
    for dtype, scalar, accum, storage in (("float32", "float", "float", 0), ("float64", "double", "double", 0),
                                          ("bfloat16", "float", "float", 2)):
        item = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
        for c in (1, 7, 10, 31, 33, 1000, 1024, 1025, 4097, 16384, 32768):
            for algo, arrays in ((0, 1), (1, 1), (2, 1), (1, 2), (2, 2)):
                g, nv, vec, block = row_config(c, item, 8 if item == 8 else 4, arrays)
                path = os.path.join(out_dir, f"rows_{dtype}_{c}_{algo}_{arrays}.cu")
                _launch.write_source(path, SOURCE, (f"SCALAR={scalar}", f"ACCUM={accum}", f"STORAGE={storage}",
                                                    f"ALGO={algo}", f"G={g}", f"NV={nv}", f"VEC={vec}",
                                                    f"VBYTES={vec * item}", f"BLOCK={block}", "CREG=" +
                                                    str(col_reg(c))))
                files.append(path)
    return files


if __name__ == "__main__":
    import sys
    print("\n".join(_compile_check(sys.argv[1])))
