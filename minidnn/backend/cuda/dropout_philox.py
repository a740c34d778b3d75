"""Dropout with a counter-based generator whose state lives on the device (capturable in a CUDA graph).

Shape legend: x, y (n,) any shape flattened; keep (n,) uint8 (1 = kept); state (2,) uint64 = [key, counter];
ticket (1,) uint32.
Tiling: a grid-stride loop over groups of 4 elements; each thread turns one Philox4x32-10 block
(counter = state[1] + group, key = state[0]) into four uniforms u = (r >> 8) * 2^-24 and keeps element
4*group + j when u_j >= p.  The last block to finish advances state[1] by the number of groups (the
threadFenceReduction ticket, as in multi_tensor.py), so the next launch -- eager or replayed from a graph --
draws fresh numbers without any host involvement.
"""
from __future__ import annotations

import math

import numpy as np

from . import launch as _launch

__all__ = ["supports", "dropout_forward"]

_SOURCE = r"""
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

_SCALARS = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
THREADS = 256


def supports(x) -> bool:
    return x.dtype in _SCALARS and x.size > 0


_plans: dict = {}


def _plan(shape, dtype, p, scale, dev):
    kernel = _launch.get_kernel(_SOURCE, "dropout_philox", (f"-DSCALAR={_SCALARS[dtype]}", "-std=c++14"))
    n = math.prod(shape)
    groups = (n + 3) // 4
    grid = max(1, min((groups + THREADS - 1) // THREADS, _launch.sm_count(dev) * 8))
    return _launch.prepare(kernel, (grid,), (THREADS,), [None] * 5 + [np.int64(n), np.float32(p), dtype.type(scale)])


def dropout_forward(x, p, scale, state, ticket):
    """(y, keep) for a contiguous-able GPU array ``x``; ``state``/``ticket`` are the engine's device arrays.  The
    launch is settled once per (shape, dtype, p, scale, device); the keep mask is allocated as bool (the kernel
    writes 0/1 bytes)."""
    cp = _launch.cupy()
    xc = x if x.flags.c_contiguous else cp.ascontiguousarray(x)
    dev = xc.data.device_id
    go = _launch.planned(_plans, (xc.shape, xc.dtype, p, scale, dev), _plan, xc.shape, xc.dtype, p, scale, dev)
    with _launch.on_device(dev):
        y = cp.empty(xc.shape, dtype=xc.dtype)
        keep = cp.empty(xc.shape, dtype=np.bool_)
        go(xc, y, keep, state, ticket)
    return y, keep
