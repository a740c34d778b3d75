"""Dropout with a counter-based generator whose state lives on the device (capturable in a CUDA graph).

Shape legend: x, y, dy, dx (n,) any shape walked as flat C-order memory (float32/float64, or float16/bfloat16
stored in 16 bits and computed in float); keep (n,) bool (1 byte: 1 = kept, PyTorch's mask too);
state (2,) uint64 = [key, counter]; ticket (1,) uint32.

The random stream (unchanged since the first kernel): element i of a call is decided by Philox4x32-10 block
``counter = state[1] + i // 4`` (key = state[0], the 64-bit counter in words 0-1, words 2-3 zero), word i % 4 = r:
kept  <=>  (r >> 8) * 2^-24 >= p (p as float32)  <=>  (r >> 8) >= THRESH = ceil(float32(p) * 2^24).
A call advances state[1] by ceil(n / 4): one Philox block per 4 elements, all four words used.

Tiling (dropout_fwd): a grid-stride loop over groups of V elements (V = 4 for 4- and 8-byte data, 8 for 16-bit
data): per group a thread makes V / 4 Philox4x32-10 calls, loads x with 16-byte vectors, writes y with 16-byte
vectors and the V mask bytes with one 4- or 8-byte store (a warp writes 128 or 256 contiguous mask bytes).  UNROLL
groups per iteration, all loads first (the Philox math of one group overlaps the loads of the others).  The grid is
persistent (at most BLOCKS_PER_SM blocks per SM, all resident), so that the ticket closing the launch is cheap: the
last block to finish (threadFenceReduction ticket, as in multi_tensor.py) advances state[1], and the next launch --
eager or replayed from a graph -- draws fresh numbers without any host involvement.
dropout_bwd: the same walk without the generator: dx = dy * (keep ? scale : 0).
Unaligned inputs (a view whose pointer is not 16-byte aligned) and the last partial group take per-element loads
and stores in the same loop (``vec`` = 0: inputs not aligned).  Products are x * (keep ? scale : 0), as the
reference (so a NaN or inf dropped gives NaN, as in PyTorch), with scale = 1 / (1 - p) rounded to A.
Traffic: forward reads x, writes y and keep (2 x itemsize + 1 bytes per element); backward reads dy and keep,
writes dx: the floor of each.

MINIDNN_DROPOUT_V1=1 restores the first kernel (per-element loads and stores, float32/float64 only; 16-bit data
and backward through CuPy), for an A/B on the GPU.  MINIDNN_DROPOUT_UNROLL / MINIDNN_DROPOUT_BPS ("fwd,bwd" pairs)
set UNROLL and the blocks per SM (tools/dropout_bench.py sweeps them).
"""
from __future__ import annotations

import math
import os

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from .storage import STORAGE_HEADER, type_info

__all__ = ["supports", "supports_backward", "dropout_forward", "dropout_backward", "threshold", "SOURCE"]

V1 = os.environ.get("MINIDNN_DROPOUT_V1", "0") == "1"
THREADS = 256
# groups in flight per thread and iteration; blocks per SM at most (0: no cap), forward and backward.  Read once;
# tools/dropout_bench.py sets them (and clears _plans) to sweep.
UNROLL_FWD, UNROLL_BWD = (int(v) for v in os.environ.get("MINIDNN_DROPOUT_UNROLL", "1,2").split(","))
BPS_FWD, BPS_BWD = (int(v) for v in os.environ.get("MINIDNN_DROPOUT_BPS", "8,8").split(","))

SOURCE = STORAGE_HEADER + r"""
#if STORAGE != 0
#define V 8                                 // elements per group: 16 bytes of 16-bit data
typedef uint2 MaskVec;
#else
#define V 4                                 // 16 bytes of float, 32 of double
typedef unsigned int MaskVec;
#endif
#define PH (V / 4)                          // Philox calls per group
#define NLD (V * (int)sizeof(T) / 16)       // 16-byte vectors per group
union Pack { uint4 raw[NLD]; T v[V]; };
#if WIDE
typedef long long I;                        // group and element indices: 64-bit only where n >= 2^31
#else
typedef unsigned int I;                     // n < 2^31: every element index h * V + j fits
#endif
union Mask { MaskVec raw; unsigned char b[V]; };

// Philox4x32-10 of the counter (ctr, 0) under key (k0, k1): each round two 32x32 -> 64-bit products.
__device__ __forceinline__ uint4 philox(unsigned long long ctr, unsigned int k0, unsigned int k1)
{
    unsigned int c0 = (unsigned int)ctr, c1 = (unsigned int)(ctr >> 32), c2 = 0u, c3 = 0u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const unsigned long long p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;
        const unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0, n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
        c1 = (unsigned int)p1; c3 = (unsigned int)p0; c0 = n0; c2 = n2;
    }
    return make_uint4(c0, c1, c2, c3);
}

// x[h*V .. h*V+V) of group h: one or two 16-byte loads when vec and the group is whole, else element by element.
__device__ __forceinline__ Pack load_group(const T* __restrict__ x, I h, I full, long long n, int vec)
{
    Pack a;
    if (vec && h < full) {
        const uint4* p = reinterpret_cast<const uint4*>(x + h * V);
#pragma unroll
        for (int j = 0; j < NLD; ++j) a.raw[j] = p[j];
    } else {
#pragma unroll
        for (int j = 0; j < NLD; ++j) a.raw[j] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int j = 0; j < V; ++j) if (h * V + j < n) a.v[j] = x[h * V + j];
    }
    return a;
}

__device__ __forceinline__ void store_group(T* __restrict__ y, const Pack& a, I h, I full, long long n)
{
    if (h < full) {                         // the outputs are fresh allocations: always aligned
        uint4* p = reinterpret_cast<uint4*>(y + h * V);
#pragma unroll
        for (int j = 0; j < NLD; ++j) p[j] = a.raw[j];
    } else {
#pragma unroll
        for (int j = 0; j < V; ++j) if (h * V + j < n) y[h * V + j] = a.v[j];
    }
}

extern "C" __global__ void __launch_bounds__(256)
dropout_fwd(const T* __restrict__ x, T* __restrict__ y, unsigned char* __restrict__ keep,
            unsigned long long* __restrict__ state, unsigned int* __restrict__ ticket, const long long n,
            const unsigned int thresh, const A scale, const int vec)
{
    const unsigned long long key = state[0], base = state[1];
    const unsigned int k0 = (unsigned int)key, k1 = (unsigned int)(key >> 32);
    const I groups = (I)((n + V - 1) / V), full = (I)(n / V);
    const I stride = (I)gridDim.x * blockDim.x;
    for (I h0 = (I)blockIdx.x * blockDim.x + threadIdx.x; h0 < groups; h0 += UNROLL * stride) {
        Pack in[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const I h = h0 + u * stride;
            if (h < groups) in[u] = load_group(x, h, full, n, vec);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const I h = h0 + u * stride;
            if (h < groups) {
                Pack out;
                Mask m;
#pragma unroll
                for (int q = 0; q < PH; ++q) {
                    const uint4 r4 = philox(base + (unsigned long long)(h * PH + q), k0, k1);
                    const unsigned int r[4] = {r4.x, r4.y, r4.z, r4.w};
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const bool kept = (r[j] >> 8) >= thresh;
                        m.b[4 * q + j] = kept ? 1 : 0;
                        out.v[4 * q + j] = ST(LD(in[u].v[4 * q + j]) * (kept ? scale : (A)0));
                    }
                }
                store_group(y, out, h, full, n);
                if (h < full) {
                    reinterpret_cast<MaskVec*>(keep)[h] = m.raw;
                } else {
#pragma unroll
                    for (int j = 0; j < V; ++j) if (h * V + j < n) keep[h * V + j] = m.b[j];
                }
            }
        }
    }
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        state[1] = base + (unsigned long long)((n + 3) / 4);    // one Philox block per 4 elements
        *ticket = 0u;
    }
}

extern "C" __global__ void __launch_bounds__(256)
dropout_bwd(const T* __restrict__ dy, const unsigned char* __restrict__ keep, T* __restrict__ dx, const long long n,
            const A scale, const int vec)
{
    const I groups = (I)((n + V - 1) / V), full = (I)(n / V);
    const I stride = (I)gridDim.x * blockDim.x;
    for (I h0 = (I)blockIdx.x * blockDim.x + threadIdx.x; h0 < groups; h0 += UNROLL * stride) {
        Pack g[UNROLL];
        Mask m[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const I h = h0 + u * stride;
            if (h < groups) {
                g[u] = load_group(dy, h, full, n, vec);
                if (vec && h < full) {
                    m[u].raw = reinterpret_cast<const MaskVec*>(keep)[h];
                } else {
#pragma unroll
                    for (int j = 0; j < V; ++j) m[u].b[j] = h * V + j < n ? keep[h * V + j] : 0;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const I h = h0 + u * stride;
            if (h < groups) {
                Pack out;
#pragma unroll
                for (int j = 0; j < V; ++j) out.v[j] = ST(LD(g[u].v[j]) * (m[u].b[j] ? scale : (A)0));
                store_group(dx, out, h, full, n);
            }
        }
    }
}
"""

# The first kernel (per-element loads and stores, a float compare per element), kept for MINIDNN_DROPOUT_V1=1.
_SOURCE_V1 = r"""
typedef SCALAR T;
__device__ __forceinline__ void philox_round(unsigned int c[4], const unsigned int k[2])
{
    const unsigned int m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
    const unsigned int hi0 = __umulhi(m0, c[0]), lo0 = m0 * c[0];
    const unsigned int hi1 = __umulhi(m1, c[2]), lo1 = m1 * c[2];
    const unsigned int n0 = hi1 ^ c[1] ^ k[0], n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
}

extern "C" __global__ void __launch_bounds__(256)
dropout_philox(const T* __restrict__ x, T* __restrict__ y, unsigned char* __restrict__ keep,
               unsigned long long* state, unsigned int* ticket, const long long n, const float p, const T scale)
{
    const unsigned long long key = state[0], base = state[1];
    const long long groups = (n + 3) / 4;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
         g += (long long)gridDim.x * blockDim.x) {
        const unsigned long long ctr = base + (unsigned long long)g;
        unsigned int c[4] = {(unsigned int)ctr, (unsigned int)(ctr >> 32), 0u, 0u};
        unsigned int k[2] = {(unsigned int)key, (unsigned int)(key >> 32)};
#pragma unroll
        for (int r = 0; r < 10; ++r) {
            philox_round(c, k);
            k[0] += 0x9E3779B9u; k[1] += 0xBB67AE85u;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const long long i = 4 * g + j;
            if (i < n) {
                const float u = (float)(c[j] >> 8) * (1.0f / 16777216.0f);
                const bool kept = u >= p;
                keep[i] = kept ? 1 : 0;
                y[i] = kept ? x[i] * scale : (T)0;
            }
        }
    }
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        state[1] = base + (unsigned long long)groups;
        *ticket = 0u;
    }
}
"""

_V1_SCALARS = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def threshold(p: float) -> int:
    """THRESH: the least 24-bit draw ``r >> 8`` that keeps an element, ceil(float32(p) * 2^24) (exact: a float32
    times a power of two is exact in float64).  p = 0 keeps everything (0), a p that rounds to 1 nothing (2^24)."""
    return int(math.ceil(float(np.float32(p)) * 16777216.0))


def supports(x, p) -> bool:
    """The forward kernel takes x (any p in [0, 1]: p = 0 and p = 1 draw too, so every call advances the stream)."""
    if V1:
        return x.dtype in _V1_SCALARS and x.size > 0 and 0.0 < p < 1.0
    return _dev.is_cuda_array(x) and x.size > 0 and type_info(x.dtype) is not None


def supports_backward(dy, keep) -> bool:
    return (not V1 and _dev.is_cuda_array(dy) and dy.size > 0 and type_info(dy.dtype) is not None
            and _dev.is_cuda_array(keep) and keep.dtype == np.bool_ and tuple(keep.shape) == tuple(dy.shape))


def _options(dtype, unroll, wide):
    scalar, accum, storage, _ = type_info(dtype)
    return (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DUNROLL={unroll}",
            f"-DWIDE={int(wide)}", "-std=c++14")


def _grid(kernel, n, dtype, dev, unroll, bps):
    """Blocks: enough for every group once, capped at ``bps`` blocks per SM and at what the kernel's registers let
    stay resident (so the grid-stride loop runs in one wave); ``bps`` = 0: no cap (one group set per thread)."""
    groups = -(-n // (8 if dtype.itemsize == 2 else 4))
    need = max(1, -(-groups // (THREADS * unroll)))
    if not bps:
        return (need,)
    regs = getattr(kernel, "num_regs", 0) or 32
    resident = max(1, min(bps, 65536 // (THREADS * (-(-regs // 8) * 8)), 2048 // THREADS))
    return (min(need, _launch.sm_count(dev) * resident),)


class _Plan:
    """A settled launch pair: ``vec`` (every input aligned: vector loads) and ``go`` (element loads)."""
    __slots__ = ("vec", "go")

    def __init__(self, name, n, dtype, dev, unroll, bps, arrays, scalars):
        kernel = _launch.get_kernel(SOURCE, name, _options(dtype, unroll, n >= 2 ** 31))
        grid = _grid(kernel, n, dtype, dev, unroll, bps)
        head = [None] * arrays + scalars
        self.vec = _launch.prepare(kernel, grid, (THREADS,), head + [np.int32(1)])
        self.go = _launch.prepare(kernel, grid, (THREADS,), head + [np.int32(0)])


_plans: dict = {}


def _acc(dtype):
    return np.float64 if dtype == np.float64 else np.float32


def _plan_fwd(n, dtype, p, scale, dev):
    if V1:
        kernel = _launch.get_kernel(_SOURCE_V1, "dropout_philox", (f"-DSCALAR={_V1_SCALARS[dtype]}", "-std=c++14"))
        grid = max(1, min((n + 3) // 4 // THREADS + 1, _launch.sm_count(dev) * 8))
        return _launch.prepare(kernel, (grid,), (THREADS,), [None] * 5 + [np.int64(n), np.float32(p),
                                                                           dtype.type(scale)])
    return _Plan("dropout_fwd", n, dtype, dev, UNROLL_FWD, BPS_FWD, 5,
                 [np.int64(n), np.uint32(threshold(p)), _acc(dtype)(scale)])


def _plan_bwd(n, dtype, scale, dev):
    return _Plan("dropout_bwd", n, dtype, dev, UNROLL_BWD, BPS_BWD, 3, [np.int64(n), _acc(dtype)(scale)])


def dropout_forward(x, p, scale, state, ticket):
    """(y, keep) for a GPU array ``x`` (a non-contiguous one is copied first); ``state``/``ticket`` are the engine's
    device arrays.  One launch, settled once per (size, dtype, p, scale, device); y and keep come out C-contiguous."""
    cp = _launch.cupy()
    if not x.flags.c_contiguous:
        x = cp.ascontiguousarray(x)
    dev = x.data.device_id
    plan = _launch.planned(_plans, ("f", x.size, x.dtype, p, scale, dev), _plan_fwd, x.size, x.dtype, p, scale, dev)
    with _launch.on_device(dev):
        y = cp.empty(x.shape, dtype=x.dtype)
        keep = cp.empty(x.shape, dtype=np.bool_)
        if V1:
            plan(x, y, keep, state, ticket)
        else:
            (plan.go if x.data.ptr & 15 else plan.vec)(x, y, keep, state, ticket)
    return y, keep


def dropout_backward(dy, keep, scale):
    """dx = dy * (keep ? scale : 0) for GPU arrays of one shape (non-contiguous ones are copied first); one launch."""
    cp = _launch.cupy()
    if not dy.flags.c_contiguous:
        dy = cp.ascontiguousarray(dy)
    if not keep.flags.c_contiguous:
        keep = cp.ascontiguousarray(keep)
    dev = dy.data.device_id
    plan = _launch.planned(_plans, ("b", dy.size, dy.dtype, scale, dev), _plan_bwd, dy.size, dy.dtype, scale, dev)
    with _launch.on_device(dev):
        dx = cp.empty(dy.shape, dtype=dy.dtype)
        (plan.go if (dy.data.ptr & 15) or (keep.data.ptr & (7 if dy.itemsize == 2 else 3)) else plan.vec)(
            dy, keep, dx)
    return dx


if __name__ == "__main__":      # the sources nvcc compile-checks: python -m minidnn.backend.cuda.dropout_philox DIR
    import sys
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    for name in ("float32", "float64", "float16", "bfloat16"):
        import ml_dtypes
        scalar, accum, storage, _ = type_info(np.dtype(getattr(ml_dtypes, name, None) or name))
        _launch.write_source(os.path.join(out, f"dropout_{name}.cu"), SOURCE,
                             (f"SCALAR={scalar}", f"ACCUM={accum}", f"STORAGE={storage}", "UNROLL=1", "WIDE=0"))
