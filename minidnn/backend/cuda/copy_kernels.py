"""Several dense device-to-device copies in one launch (``minidnn.compile``'s replay fills a captured step's static
input buffers from the new arguments: one launch for up to four of them, where a ``cudaMemcpyAsync`` each cost
~4.5 µs of host time on an H200 host -- paid before every replayed step).

The reference is ``dst[...] = src`` per pair (``array_ops.copy_into``); tests/test_cuda_graphs.py checks the kernel
against it over alignments, sizes and pair counts.
"""
from __future__ import annotations

import numpy as np

from . import launch as _launch

MAX_PAIRS = 4

SOURCE = r"""
// multi_copy: d_i[0 : n_i) = s_i[0 : n_i) for i < 4 byte ranges (n_i == 0: pair unused, pointers may be null).
// Shape legend: s_i, d_i  byte buffers of n_i bytes each, either disjoint or the same buffer (a no-op copy).
// Tiling: blockIdx.y = the pair i; blockIdx.x with 256 threads strides over that pair's range in 16-byte words
// when s_i, d_i and n_i are all multiples of 16 (CuPy's allocations are 256-byte aligned), else in bytes.
// Each thread copies every (gridDim.x * 256)-th word of its pair.
extern "C" __global__ void __launch_bounds__(256)
multi_copy(const char* s0, char* d0, const char* s1, char* d1, const char* s2, char* d2, const char* s3, char* d3,
           const long long n0, const long long n1, const long long n2, const long long n3)
{
    const char* s; char* d; long long n;
    switch (blockIdx.y) {
        case 0: s = s0; d = d0; n = n0; break;
        case 1: s = s1; d = d1; n = n1; break;
        case 2: s = s2; d = d2; n = n2; break;
        default: s = s3; d = d3; n = n3; break;
    }
    const long long step = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((((unsigned long long)s | (unsigned long long)d | (unsigned long long)n) & 15) == 0) {
        const uint4* sv = reinterpret_cast<const uint4*>(s);
        uint4* dv = reinterpret_cast<uint4*>(d);
        for (const long long words = n >> 4; i < words; i += step) dv[i] = sv[i];
    } else {
        for (; i < n; i += step) d[i] = s[i];
    }
}
"""


def multi_copier(dsts):
    """For 1..4 C-contiguous CuPy arrays ``dsts`` on one device: ``copy(*srcs)`` copies each src (a C-contiguous
    array of its dst's shape and dtype -- the caller's guarantee; nothing is checked per call) into its dst, all in
    one launch on the current stream (``launch.bind_pointers``: the pointers packed, the launch made, nothing
    else -- ~2 µs of host time less than a generic prepared launch)."""
    if not 1 <= len(dsts) <= MAX_PAIRS:
        raise ValueError(f"multi_copier: 1 to {MAX_PAIRS} arrays, got {len(dsts)}")
    sizes = [int(d.nbytes) for d in dsts] + [0] * (MAX_PAIRS - len(dsts))
    blocks = min(max(1, -(-max(sizes) // (16 * 256))), 1024)
    dev = dsts[0].data.device_id
    with _launch.on_device(dev):
        kernel = _launch.get_kernel(SOURCE, "multi_copy")
    prepared = _launch.prepare(kernel, (blocks, len(dsts)), (256,),
                               [None] * (2 * MAX_PAIRS) + [np.int64(n) for n in sizes])
    go = _launch.bind_pointers(prepared, dev)
    dptrs = [d.data.ptr for d in dsts]
    pad = (0,) * (2 * (MAX_PAIRS - len(dsts)))
    if len(dsts) == 1:
        d0 = dptrs[0]
        return lambda s0: go(s0.data.ptr, d0, *pad)
    if len(dsts) == 2:
        d0, d1 = dptrs
        return lambda s0, s1: go(s0.data.ptr, d0, s1.data.ptr, d1, *pad)

    def copy(*srcs):
        ptrs = []
        for s, d in zip(srcs, dptrs):
            ptrs += (s.data.ptr, d)
        go(*ptrs, *pad)
    return copy
