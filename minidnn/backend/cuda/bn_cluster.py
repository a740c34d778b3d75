"""Batch norm training (SPATIAL, NCHW) with each channel held on-chip by a thread-block cluster (Hopper, sm_90+):
forward and backward in one launch each, reading x (and dy) from DRAM exactly once.

Shape legend: x, y, z (residual), dy, dx, dz viewed as (outer, C, inner), C-contiguous: NCHW / NCDHW / NCL with
outer = N, inner = H*W (D*H*W, L).  scale, bias, running statistics, dscale, dbias: (C,) in the parameter dtype;
mean, inv_std, coef: (C,) / (C, 2) in A (the accumulation type).  A channel's m = outer * inner values are
mv = m / VEC 16-byte vectors (VEC = 4 floats, 8 halves, 2 doubles); vector j lies at
((j / iv) * C + c) * inner + (j % iv) * VEC with iv = inner / VEC.

Why: the one-pass kernels of bn_kernels.py (bn_fwd1 / bn_bwd1) split a channel over blocks anywhere on the GPU, so
they meet through global memory (partials, a ticket, a flag: several dependent L2 round trips a round) and, with a
channel too large for the grid's shared memory, read part of x a second time from L2.  On an H200 that left them at
59-67% of copy bandwidth on (128, 64, 56, 56) and at ~9-11 us on ResNet-20's small tensors.  A cluster of CL blocks
(CL <= 8 portable, 16 where the driver allows a non-portable size) shares its blocks' shared memory and a hardware
barrier, and CL x ~200 KiB holds a whole channel of most training tensors: one DRAM read, statistics exchanged
through distributed shared memory, the elementwise pass from shared memory.

Tiling: one cluster per channel -- grid C * CL blocks of NT threads, cluster = CL consecutive blocks, channel
blockIdx.x / CL.  Block r (its rank in the cluster) owns vectors [mv * r / CL, mv * (r + 1) / CL); its thread t
visits j = lo + t + k * NT for k = 0, 1, ... (consecutive threads, consecutive addresses) and keeps vector k in
dynamic shared memory slot k * NT + t (forward: x; backward: x at slot 2k, the masked g at 2k + 1), UNROLL vectors
of each array in flight.
  bn_fwdc  pass 1: load x, keep it, accumulate the shifted sums sum(x - K), sum((x - K)^2) (K = the channel's first
           value: the reference's shifted one-pass moments, as bn_fwd1) in A per thread; the block adds them in
           double (warp butterflies, then the warps in order) and stores the pair into slot `rank` of every block's
           partials (distributed shared memory); cluster barrier; every block adds the CL pairs of its own slots in
           rank order (the same bits in every block), and derives mean and inv_std; block 0 writes them, the
           running statistics and BatchNorm's counter; pass 2 writes y = act((x - mean) * inv_std * scale + bias
           [+ z]) from the kept vectors.
  bn_bwdc  pass 1: load x, dy (and y after a fused ReLU: g = dy where y > 0), keep x and g, accumulate sum(g),
           sum(g * xhat); the same exchange; block 0 writes dbias, dscale, coef; pass 2 writes
           dx = scale * inv_std * (g - mean(g) - xhat * mean(g * xhat)) (and dz = g) from the kept vectors;
           built with DX_NHWC, dx's values go to their channels-last memory offsets instead (DX_NHWC_HEADER), the
           rest of the kernel as it is, so dx has the plain kernel's bits.
The partials travel by remote stores before the barrier, never by remote loads (session 25, as softmax_cluster): a
relaxed cluster arrive at the start, waited on before the first stores, makes sure every block has started; nothing
touches another block's shared memory after a channel's barrier, so a block leaves without waiting for its cluster.
Deterministic; nothing is read back to the host (capturable in a CUDA graph).
The launch takes the same arrays, in the same order, as bn_fwd1 / bn_bwd1 (the partial and ticket buffers are
not used), so bn_kernels' settled calls run either.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from .. import devices as _dev
from . import bn_nhwc as _nhwc
from . import launch as _launch
from .device_facts import smem_limits
from .storage import STORAGE_HEADER, type_info

__all__ = ["SOURCE", "DX_NHWC_HEADER", "SHADOW_HEADER", "plan", "prepare_forward", "prepare_backward", "ENABLED",
           "DX_NHWC"]

# MINIDNN_BN_CLUSTER: "1" (default) takes the cluster kernels where a channel fits; "0" leaves bn_fwd1 / bn_bwd1;
# a number 1/2/4/8/16 forces that cluster size where it fits (for the A/B tools).
_SWITCH = os.environ.get("MINIDNN_BN_CLUSTER", "1")
ENABLED = _SWITCH != "0"
FORCE_CL = int(_SWITCH) if _SWITCH.isdigit() and _SWITCH not in ("0", "1") else None
BLOCK_BYTES = 64 * 1024   # the most a block keeps on the default route (see plan)
CLUSTERS_CAP = None       # at most this many clusters (tests: the channel loop on small tensors)
NT = int(os.environ.get("MINIDNN_BN_CLUSTER_NT", "512"))        # threads a block
# MINIDNN_BN_CLUSTER_DX_NHWC: "0" gives bn_bwdc no channels-last dx variant (bn_kernels.dx_nhwc_call then has no
# call where the cluster kernels take the backward: dx written as x and staged by the convolution, as before)
DX_NHWC = os.environ.get("MINIDNN_BN_CLUSTER_DX_NHWC", "1") != "0"
UNROLL = 4            # vectors in flight per thread and array (see _options)
# cluster sizes tried, smallest first; 16 is non-portable (H100/H200 allow it; the plan asks the driver first)
SIZES = (1, 2, 4, 8, 16)
_NON_PORTABLE = 14          # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
_STATIC = 1024              # bytes of static shared memory a block (an upper bound: the partials and the warps' sums)
# (part[2][CL][2] doubles, warp_sum[NW][2], tot[2]: 784 bytes at NT 512 and CL 16; 1040 at MINIDNN_BN_CLUSTER_NT=1024
# and CL 16, 16 over -- harmless there, as dyn is a multiple of 16 KiB, except a forced two-block plan at exactly
# per_block2, which would then hold one block an SM)

# A backward dx in channels-last MEMORY for an NCHW x, shared by bn_kernels' bn_bwd1 and bn_bwdc built with
# -DDX_NHWC=1 (absent otherwise: the plain kernels' text and PTX).  Needs VEC and fast_div defined before it.
DX_NHWC_HEADER = r"""#if DX_NHWC || TWIN_NHWC
// dx in channels-last MEMORY (the same (N, C, H, W) values, strides (H*W*C, 1, W*C, C)), for a convolution
// backward whose 16-byte NHWC loader then reads dx as it is instead of staging a copy (docs/fusion.md, "dx in
// channels-last memory").  NCHW only (bn_bwd1: INNER1 0): the vector at NCHW offset `off` of channel c is
// off / VEC = (n * C + c) * iv + k, its VEC positions hw = k * VEC ... at n * inner * C + hw * C + c (32-bit: the
// tensor has < 2^31 elements).  Its lanes become VEC scalar stores C apart: a warp writes 32 * VEC 2-4-byte
// pieces of different 32-byte sectors, which L2 merges into whole sectors only while every channel of a line is
// written before the line leaves -- i.e. when every channel is written at once: bn_bwd1 in one round (the
// launch's data fits the L2 share, _onepass_launch), bn_bwdc with every channel's cluster resident (plan's one
// wave), the only plans these variants are built for.  Plain stores, not .cs: an evict-first partial line would
// go to DRAM half written.
__device__ __forceinline__ long long dx_nhwc_of(long long off, int c, int C, int inner, int iv, unsigned int iv_mul,
                                                unsigned int iv_shr)
{
    const unsigned int q = (unsigned int)off / VEC;
    const unsigned int r = fast_div(q, iv_mul, iv_shr);                 // n * C + c
    const unsigned int hw = (q - r * (unsigned int)iv) * VEC;
    return (long long)(r - (unsigned int)c) * inner + (long long)hw * C + c;
}
#endif
"""

# The twin's channels-last shadow (docs/fusion.md, "The twin's NHWC shadow"): the TWIN forward kernels (bn_fwd1,
# bn_fwdc) built with -DTWIN_NHWC=1 also store relu(y) of an NCHW x to one more array `shadow`, the last of their
# array arguments (SHADOW_PARAM), at dx_nhwc_of's channels-last offsets: the same (N, C, H, W) values in the memory
# a convolution's 16-byte NHWC loader reads as it is (the forward then stages nothing).  Absent (TWIN_NHWC 0), the
# kernels' text after preprocessing is unchanged.
SHADOW_HEADER = r"""
#ifndef TWIN_NHWC
#define TWIN_NHWC 0
#endif
#if TWIN_NHWC
#if !TWIN
#error "TWIN_NHWC: the shadow is the twin's (TWIN)"
#endif
#define SHADOW_PARAM , T* __restrict__ shadow
#else
#define SHADOW_PARAM
#endif
"""

# The cluster primitives every thread-block-cluster kernel uses (this file's, norm_gncl's): the block's rank in
# its cluster, the releasing arrive and the acquiring wait of the cluster barrier.
CLUSTER_HEADER = r"""
__device__ __forceinline__ unsigned int cluster_rank()
{
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_arrive()
{
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait()
{
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
"""

# The cluster kernels' exchange by remote stores (softmax_cluster, norm_gncl, bn_cluster): each block stores its
# partial into slot `rank` of every block's shared memory before the cluster barrier and reads its own after it
# (session 25: the remote LOADS after the barrier that this replaced faulted on the GPU in some softmax builds, and the
# stores ran clean, bitwise the same and 1-4% faster).
DSMEM_F32_HEADER = r"""
// An arrive without memory ordering: at a kernel's start, "this block has started" -- waited on just before the first
// remote store, so every block's shared memory exists when it is written.  (A releasing arrive would make ptxas put
// a MEMBAR.ALL.GPU before it.)
__device__ __forceinline__ void cluster_arrive_relaxed()
{
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
// The shared::cluster address of `local` (this block's shared memory) in the block of cluster rank `rank`.
__device__ __forceinline__ unsigned int cluster_addr(const void* local, unsigned int rank)
{
    unsigned long long g;
    unsigned int addr;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(g) : "l"(local));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(addr) : "r"((unsigned int)g), "r"(rank));
    return addr;
}
// Store the values at `local` (this block's address of the slot; aligned to the store's size) in the block of
// cluster rank `rank`: the exchange by remote stores BEFORE the cluster barrier (softmax_cluster, session 25: the
// remote loads after it faulted on the GPU in some builds).  The receiving block must have started: a relaxed arrive
// at the kernel's start, waited on before the first store.
__device__ __forceinline__ void remote_st(float* local, unsigned int rank, float a)
{
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(cluster_addr(local, rank)), "f"(a) : "memory");
}
__device__ __forceinline__ void remote_st2(float* local, unsigned int rank, float a, float b)
{
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" :: "r"(cluster_addr(local, rank)), "f"(a), "f"(b)
                 : "memory");
}
__device__ __forceinline__ void remote_st4(float* local, unsigned int rank, float a, float b, float c, float d)
{
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" :: "r"(cluster_addr(local, rank)), "f"(a),
                 "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void remote_st2d(double* local, unsigned int rank, double a, double b)
{
    asm volatile("st.shared::cluster.v2.f64 [%0], {%1, %2};" :: "r"(cluster_addr(local, rank)), "d"(a), "d"(b)
                 : "memory");
}
"""

SOURCE = STORAGE_HEADER + _nhwc.TWIN_HEADER + SHADOW_HEADER + r"""
typedef PARAM P;
#define VEC (16 / (int)sizeof(T))
#define NW (NT / 32)
union Pack { uint4 raw; T v[VEC]; };

__device__ __forceinline__ unsigned int fast_div(unsigned int n, unsigned int mul, unsigned int shr)
{
    return (__umulhi(n, mul) + n) >> shr;
}
""" + DX_NHWC_HEADER + r"""
""" + CLUSTER_HEADER + DSMEM_F32_HEADER + _nhwc.BN_OUT + r"""
// streaming (evict-first) loads and stores: nothing here is read again from L2
__device__ __forceinline__ Pack ldcs(const T* p)
{
    Pack r;
    r.raw = __ldcs(reinterpret_cast<const uint4*>(p));
    return r;
}
__device__ __forceinline__ void stcs(T* p, const Pack& v) { __stcs(reinterpret_cast<uint4*>(p), v.raw); }

extern __shared__ uint4 kept[];

// This block's vector range (the same for every channel) and the element offset of vector j of channel c.
struct Range {
    unsigned int lo, hi, iv, iv_mul, iv_shr;
    long long inner, plane;     // inner, C * inner
    __device__ __forceinline__ long long off(int c, unsigned int j) const
    {
        const unsigned int o = fast_div(j, iv_mul, iv_shr);
        return (long long)o * plane + (long long)c * inner + (long long)(j - o * iv) * VEC;
    }
    // vectors thread t visits
    __device__ __forceinline__ int count() const
    {
        const unsigned int j0 = lo + threadIdx.x;
        return j0 < hi ? (int)((hi - j0 - 1) / NT + 1) : 0;
    }
    __device__ __forceinline__ unsigned int vec_of(int k) const { return lo + threadIdx.x + (unsigned int)k * NT; }
};

__device__ __forceinline__ Range range_of(int outer, int C, int inner, int iv, unsigned int iv_mul,
                                          unsigned int iv_shr)
{
    Range r;
    const unsigned long long mv = (unsigned long long)outer * (unsigned int)iv;
    const unsigned int rank = cluster_rank();
    r.lo = (unsigned int)(mv * rank / CL);
    r.hi = (unsigned int)(mv * (rank + 1) / CL);
    r.iv = iv; r.iv_mul = iv_mul; r.iv_shr = iv_shr;
    r.inner = inner;
    r.plane = (long long)C * inner;
    return r;
}

// The channel loop (both kernels): cluster q of the G = gridDim.x / CL clusters takes channels q, q + G, ...
// The route launches a cluster a channel (G = C, one trip); fewer clusters (CLUSTERS_CAP) loop over several.  (A
// persistent grid keeping two buffers, the next channel's reads under this one's meeting, ran slower on an H100 --
// session 10 -- and was removed.)
//   arrive         (relaxed, at the kernel's start) this block has started
//   load(c)        pass 1 of channel c into the kept slots: the thread's sums (s1, s2)
//   wait           (once, before the first trip) every block of the cluster has started: its shared memory exists
//   publish        the block's sums in double (warp butterflies, the warps in order); lane j < CL of warp 0 stores
//                  them into slot `rank` of block j's part[i & 1]; arrive (release: the stores)
//   wait, gather   (acquire) every block adds the CL pairs of its OWN part[i & 1] in rank order (the same bits in
//                  every block)
//   store(c)       pass 2 from the kept vectors, then load(c + G)
// The partials travel by remote stores only (session 25; softmax_cluster's remote loads after the barrier faulted
// on the GPU in some builds): no block touches another's shared memory after a barrier, so there is no closing
// arrive / wait -- a block's last wait already follows every store into its shared memory.
// part is double-buffered by trip (channel i of the loop: part[i & 1]), so one barrier a trip suffices.  Block A
// stores into buffer i & 1 of block B at trips i and i + 2.  Its stores of trip i + 2 follow (in A's program order)
// its wait of trip i + 1, which returns only after B's arrive of trip i + 1, which B makes in its publish of trip
// i + 1 -- after its gather of trip i (and its pass 2 and next load) read buffer i & 1: B's reads happen before A's
// overwrite.  A's stores of trip i + 1 (the other buffer) may land while B still reads buffer i & 1 of trip i (A
// passed the wait of trip i, B may not have gathered yet): different slots.  And B's gather of trip i follows its
// wait of trip i, which follows every block's arrive of trip i, each after that block's stores of trip i (release /
// acquire): B reads complete pairs.  The first trip's stores follow the started-wait (B's shared memory exists).

// The block's sums (t1, t2) into slot `rank` of part (this trip's part[i & 1]) in every block of the cluster -- lane
// j < CL of warp 0 stores block j's, all CL stores in flight at once; each such lane adds the warps' sums in the same
// order (the same bits) -- then the releasing arrive.
__device__ __forceinline__ void publish(A s1, A s2, double (*part)[2])
{
    __shared__ double warp_sum[NW][2];
    double a = s1, b = s2;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    const int w = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) { warp_sum[w][0] = a; warp_sum[w][1] = b; }
    __syncthreads();
    if (threadIdx.x < CL) {
        double t1 = 0, t2 = 0;
        for (int i = 0; i < NW; ++i) { t1 += warp_sum[i][0]; t2 += warp_sum[i][1]; }
        remote_st2d(part[cluster_rank()], threadIdx.x, t1, t2);
    }
    cluster_arrive();
}

// After the wait: the cluster's sums from this block's own part (part[r]: block r's pair) -- lane r of warp 0 reads
// rank r's pair, then the warp adds them in rank order by shuffles (the same bits in every block) -- through shared
// memory to every thread.
__device__ __forceinline__ void gather(const double (*part)[2], double& t1, double& t2)
{
    __shared__ double tot[2];
    if (threadIdx.x < 32) {
        double v0 = 0, v1 = 0;
        if (threadIdx.x < CL) { v0 = part[threadIdx.x][0]; v1 = part[threadIdx.x][1]; }
        double a = 0, b = 0;
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            a += __shfl_sync(0xffffffffu, v0, r);
            b += __shfl_sync(0xffffffffu, v1, r);
        }
        if (threadIdx.x == 0) { tot[0] = a; tot[1] = b; }
    }
    __syncthreads();
    t1 = tot[0]; t2 = tot[1];
}

#define SLOT(k, a, arrays) kept[((k) * (arrays) + (a)) * NT + threadIdx.x]

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, BPS)
bn_fwdc(const T* __restrict__ x, const T* __restrict__ z, T* __restrict__ y, void* unused_partial,
        void* unused_sync, A* __restrict__ mean_out, A* __restrict__ inv_std_out, const P* __restrict__ scale,
        const P* __restrict__ bias, P* running_mean, P* running_var, long long* counter TWIN_PARAM SHADOW_PARAM,
        const int outer, const int C, const int inner, const int iv, const unsigned int iv_mul,
        const unsigned int iv_shr, const double factor, const double eps, const int has_running,
        const int has_counter)
{
    __shared__ __align__(16) double part[2][CL][2];     // [trip & 1][rank]: block rank's pair, stored there by it
    cluster_arrive_relaxed();       // started (waited on before the first trip's stores)
    const int G = gridDim.x / CL;
    const Range rg = range_of(outer, C, inner, iv, iv_mul, iv_shr);
    const int n = rg.count();
    const bool lead = threadIdx.x == 0 && cluster_rank() == 0;
    auto load = [&](int c, A& K, A& s1, A& s2) {
        K = LD(x[(long long)c * inner]);        // shift: the channel's first value
        s1 = 0; s2 = 0;
        for (int k0 = 0; k0 < n; k0 += UNROLL) {
            Pack p[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (k0 + u < n) p[u] = ldcs(x + rg.off(c, rg.vec_of(k0 + u)));
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (k0 + u >= n) continue;
                SLOT(k0 + u, 0, 1) = p[u].raw;
#pragma unroll
                for (int e = 0; e < VEC; ++e) { const A d = LD(p[u].v[e]) - K; s1 += d; s2 += d * d; }
            }
        }
    };
    A K, s1, s2;
    int c = blockIdx.x / CL;
    load(c, K, s1, s2);
    cluster_wait();                 // every block of the cluster has started
    for (int i = 0; c < C; ++i, c += G) {
        publish(s1, s2, part[i & 1]);
        A Kn = 0, s1n = 0, s2n = 0;
        cluster_wait();
        double t1, t2;
        gather(part[i & 1], t1, t2);
        const double m = (double)outer * inner;
        const double md = t1 / m;
        const double var = fmax(t2 / m - md * md, 0.0);
        const double mean = (double)K + md;
        const A mu = (A)mean, inv = (A)(1.0 / sqrt(var + eps));
        if (lead) {
            mean_out[c] = mu;
            inv_std_out[c] = inv;
            if (has_running) {
                running_mean[c] = (P)((1.0 - factor) * (double)running_mean[c] + factor * mean);
                running_var[c] = (P)((1.0 - factor) * (double)running_var[c] + factor * var * m / (m - 1.0));
            }
            if (has_counter && c == 0) counter[0] += 1;     // BatchNorm's num_batches_tracked, once per call
        }
        const A kk = HAS_SCALE ? inv * (A)scale[c] : inv;
        const A bb = HAS_BIAS ? (A)bias[c] : (A)0;
        for (int k0 = 0; k0 < n; k0 += UNROLL) {
            Pack q[UNROLL];
            if (HAS_Z) {
#pragma unroll
                for (int u = 0; u < UNROLL; ++u)
                    if (k0 + u < n) q[u] = ldcs(z + rg.off(c, rg.vec_of(k0 + u)));
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (k0 + u >= n) continue;
                Pack p, o;
                p.raw = SLOT(k0 + u, 0, 1);
#pragma unroll
                for (int e = 0; e < VEC; ++e) BN_OUT(o.v[e], p.v[e], q[u].v[e], mu, kk, bb)
                stcs(y + rg.off(c, rg.vec_of(k0 + u)), o);
#if TWIN_NHWC
                {   // the twin, and its values again at their channels-last offsets: plain stores, which merge into
                    // whole sectors in L2 while every channel's cluster is resident and writing (one wave)
                    const long long o_ = rg.off(c, rg.vec_of(k0 + u)), d_ = dx_nhwc_of(o_, c, C, inner, iv, iv_mul,
                                                                                         iv_shr);
                    Pack r_;
#pragma unroll
                    for (int e = 0; e < VEC; ++e) r_.v[e] = relu_of_stored(o.v[e]);
                    stcs(twin + o_, r_);
#pragma unroll
                    for (int e = 0; e < VEC; ++e) shadow[d_ + (long long)e * C] = r_.v[e];
                }
#elif TWIN
                STORE_TWIN(stcs, twin + rg.off(c, rg.vec_of(k0 + u)), o);
#endif
            }
        }
        if (c + G < C) load(c + G, Kn, s1n, s2n);
        K = Kn; s1 = s1n; s2 = s2n;
    }
}

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, BPS)
bn_bwdc(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y, const A* __restrict__ mean,
        const A* __restrict__ inv_std, void* unused_partial, void* unused_sync, A* __restrict__ coef,
        P* __restrict__ dscale, P* __restrict__ dbias, const P* __restrict__ scale, T* __restrict__ dx,
        T* __restrict__ dz, const int outer, const int C, const int inner, const int iv, const unsigned int iv_mul,
        const unsigned int iv_shr)
{
    __shared__ __align__(16) double part[2][CL][2];     // [trip & 1][rank]: block rank's pair, stored there by it
    cluster_arrive_relaxed();       // started (waited on before the first trip's stores)
    const int G = gridDim.x / CL;
    const Range rg = range_of(outer, C, inner, iv, iv_mul, iv_shr);
    const int n = rg.count();
    const bool lead = threadIdx.x == 0 && cluster_rank() == 0;
    // pass 1: keeps x and g (dy, masked by y > 0 after a fused ReLU)
    auto load = [&](int c, A& s1, A& s2) {
        const A mu = mean[c], is = inv_std[c];
        s1 = 0; s2 = 0;
        for (int k0 = 0; k0 < n; k0 += UNROLL) {
            Pack p[UNROLL], g[UNROLL], r[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (k0 + u >= n) continue;
                const long long o = rg.off(c, rg.vec_of(k0 + u));
                g[u] = ldcs(dy + o); p[u] = ldcs(x + o);
                if (RELU) r[u] = ldcs(y + o);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (k0 + u >= n) continue;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    A gv = LD(g[u].v[e]);
                    if (RELU && LD(r[u].v[e]) <= (A)0) { gv = 0; g[u].v[e] = ST((A)0); }
                    s1 += gv;
                    s2 += gv * ((LD(p[u].v[e]) - mu) * is);
                }
                SLOT(k0 + u, 0, 2) = p[u].raw;
                SLOT(k0 + u, 1, 2) = g[u].raw;
            }
        }
    };
    A s1, s2;
    int c = blockIdx.x / CL;
    load(c, s1, s2);
    cluster_wait();                 // every block of the cluster has started
    for (int i = 0; c < C; ++i, c += G) {
        publish(s1, s2, part[i & 1]);
        A s1n = 0, s2n = 0;
        cluster_wait();
        double t1, t2;
        gather(part[i & 1], t1, t2);
        const double m = (double)outer * inner;
        const A c0 = (A)(t1 / m), c1 = (A)(t2 / m);
        if (lead) {
            coef[2 * c] = c0; coef[2 * c + 1] = c1;
#if HAS_SCALE
            dbias[c] = (P)t1; dscale[c] = (P)t2;
#endif
        }
        const A mu = mean[c], is = inv_std[c];
        const A kk = HAS_SCALE ? is * (A)scale[c] : is;
        for (int k0 = 0; k0 < n; k0 += UNROLL) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (k0 + u >= n) continue;
                const long long o = rg.off(c, rg.vec_of(k0 + u));
                Pack p, g, d;
                p.raw = SLOT(k0 + u, 0, 2);
                g.raw = SLOT(k0 + u, 1, 2);
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A xhat = (LD(p.v[e]) - mu) * is;
                    d.v[e] = ST(kk * (LD(g.v[e]) - c0 - xhat * c1));
                }
#if DX_NHWC
                // the same values at their channels-last offsets, plain stores: the stride-C scalars of a line
                // merge into whole sectors in L2 while every channel's cluster is resident and writing (one wave)
                const long long dn = dx_nhwc_of(o, c, C, inner, iv, iv_mul, iv_shr);
#pragma unroll
                for (int e = 0; e < VEC; ++e) dx[dn + (long long)e * C] = d.v[e];
#else
                stcs(dx + o, d);
#endif
                if (HAS_Z) stcs(dz + o, g);
            }
        }
        if (c + G < C) load(c + G, s1n, s2n);
        s1 = s1n; s2 = s2n;
    }
}
"""


def _cc(dev):
    try:
        return int(_launch.cupy().cuda.Device(dev).compute_capability)
    except Exception:       # noqa: BLE001 -- a fake CuPy: assume a Hopper
        return 90


def _slots(mv, cl):
    return -(-(-(-mv // cl)) // NT)


def plan(outer, c, inner, itemsize, backward, sm_count=132, smem=(233472, 232448), non_portable=True,
         force=None):
    """(CL, slots, dynamic shared memory bytes) of a cluster launch, or None where the cluster kernels are not the
    faster route (the caller keeps bn_fwd1 / bn_bwd1).  ``smem``: (per SM, the most a block may opt into).  A block
    keeps `slots` vectors a thread of each array (x; x and g backward).
    The rule, from the H100 sweep (docs/step_kernels.md, session 10): the clusters are faster where the call is
    latency-bound -- every cluster resident at once (one wave) and at most BLOCK_BYTES kept a block: ResNet-20's
    and MobileNet's tensors, 1.2-1.6x the one-pass kernels.  There the smallest CL giving at least a block to every
    other SM (each cluster member costs its share of the meeting: CL 16 ran 2-4x slower than CL 2 on
    (128, 64, 8, 8)).  Larger tensors stream better through bn_fwd1 / bn_bwd1 (their round fits L2 plus the grid's
    shared memory; the clusters' blocks alternate reading and writing, 65-76% of copy).
    ``force``: that CL wherever it fits (the A/B tools)."""
    vec = 16 // itemsize
    if inner % vec or c < 1 or outer < 1:
        return None
    mv = outer * inner // vec
    if mv >= 2 ** 31:
        return None
    arrays = 2 if backward else 1
    per_block = min(smem[1], smem[0] - 1024) - _STATIC
    per_block2 = (smem[0] // 2 - 1024) - _STATIC
    per_sm_threads = max(1, 2048 // NT)

    def buf(cl):
        return _slots(mv, cl) * NT * 16 * arrays

    def bps(nbytes):
        return min(per_sm_threads, 2 if nbytes <= per_block2 else 1)

    sizes = [s for s in SIZES if s <= 8 or non_portable]
    if force is not None:
        return (force, _slots(mv, force), buf(force)) if force in sizes and buf(force) <= per_block else None
    fits = [s for s in sizes if buf(s) <= per_block]
    one_wave = [s for s in fits if c * s <= sm_count * bps(buf(s))]
    if not one_wave:
        return None
    half = [s for s in one_wave if 2 * c * s >= sm_count]
    # (few channels of few values: the widest cluster that still gives every thread a vector)
    cl = min(half) if half else max(s for s in one_wave if s == 1 or mv // s >= NT)
    if buf(cl) > BLOCK_BYTES:
        return None
    return cl, _slots(mv, cl), buf(cl)


def _options(dtype, cl, relu, has_z, has_scale, has_bias, bps, backward=False, twin=False, dx_nhwc=False,
             twin_nhwc=False):
    """NVRTC options.  UNROLL: 4 vectors in flight per thread and array forward at two blocks an SM, twice that at
    one; the backward half of it (it loads 2-3 arrays; more spills at 64 registers).  ``twin``: bn_fwdc also
    writes relu(y) (bn_nhwc.TWIN_HEADER; the option absent otherwise); ``dx_nhwc``: bn_bwdc writes dx in
    channels-last memory (DX_NHWC_HEADER; absent otherwise); ``twin_nhwc`` (with ``twin``): bn_fwdc also writes the
    twin's channels-last shadow (SHADOW_HEADER; absent otherwise)."""
    scalar, accum, storage, pdt = type_info(dtype)
    unroll = (UNROLL if bps > 1 else 2 * UNROLL) // (2 if backward else 1)
    return (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}",
            f"-DPARAM={'double' if pdt == np.float64 else 'float'}", f"-DCL={cl}", f"-DNT={NT}",
            f"-DUNROLL={unroll}", f"-DBPS={bps}", f"-DRELU={int(relu)}", f"-DHAS_Z={int(has_z)}",
            f"-DHAS_SCALE={int(has_scale)}", f"-DHAS_BIAS={int(has_bias)}") + (("-DTWIN=1",) if twin else ()) \
        + (("-DDX_NHWC=1",) if dx_nhwc else ()) + (("-DTWIN_NHWC=1",) if twin_nhwc else ()) + ("-std=c++17",)


_kernels: dict = {}


def _kernel(name, dtype, cl, relu, has_z, has_scale, has_bias, bps, dev, twin=False, dx_nhwc=False,
            twin_nhwc=False):
    key = (name, _dev.dtype_name(dtype), cl, relu, has_z, has_scale, has_bias, bps, NT, dev, twin, dx_nhwc) \
        + ((True,) if twin_nhwc else ())
    k = _kernels.get(key)
    if k is None:
        k = _launch.get_kernel(SOURCE, name, _options(dtype, cl, relu, has_z, has_scale, has_bias, bps,
                                                      name == "bn_bwdc", twin, dx_nhwc, twin_nhwc))
        if cl > 8:      # (a fake CuPy has no such call)
            setter = getattr(_launch.cupy().cuda.driver, "funcSetAttribute", None)
            if setter is not None:
                setter(k.kernel.ptr, _NON_PORTABLE, 1)
        _kernels[key] = k
    return k


class _LaunchConfig(ctypes.Structure):      # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("numAttrs", ctypes.c_uint)]


def driver_max_clusters(kernel, cl, dyn):
    """Clusters of ``kernel`` the GPU holds at once with ``dyn`` bytes of shared memory a block, as the driver says
    (cuOccupancyMaxActiveClusters, which knows how the SMs group: 0 where such a cluster cannot be scheduled at
    all, e.g. 16 blocks on a GPU partition of fewer SMs a group), or None where it cannot be asked (a fake CuPy)."""
    try:
        _launch._opt_in(kernel, dyn)       # the query counts with the shared memory the launch will opt into
        lib = ctypes.CDLL("libcuda.so.1")
        cfg = _LaunchConfig(cl, 1, 1, NT, 1, 1, int(dyn), None, None, 0)
        n = ctypes.c_int(0)
        if lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(kernel.kernel.ptr),
                                            ctypes.byref(cfg)) == 0:
            return int(n.value)
    except Exception:       # noqa: BLE001 -- no driver library, or a fake CuPy
        pass
    return None


def usable(dev) -> bool:
    """Whether the cluster kernels may run on GPU ``dev`` (switched on, compute capability 9.0 or newer)."""
    return ENABLED and _cc(dev) >= 90


def _prepare(name, xc, outer, c, inner, backward, flags, tail, divider, dev):
    item = xc.dtype.itemsize
    smem = smem_limits(dev)
    p = plan(outer, c, inner, item, backward, _launch.sm_count(dev), smem, force=FORCE_CL)
    if p is None:
        return None
    cl, _, dyn = p
    bps = 2 if dyn <= (smem[0] // 2 - 1024 - _STATIC) else 1
    twin = flags.get("twin", False)
    k = _kernel(name, xc.dtype, cl, flags.get("relu", False), flags.get("has_z", False),
                flags.get("has_scale", False), flags.get("has_bias", False), bps, dev, twin,
                flags.get("dx_nhwc", False), flags.get("twin_nhwc", False))
    if driver_max_clusters(k, cl, dyn) == 0:       # not schedulable here: the one-pass kernels
        return None
    clusters = c if CLUSTERS_CAP is None else max(1, min(c, CLUSTERS_CAP))  # (tests: several channels a cluster)
    iv = inner // (16 // item)
    geo = [np.int32(outer), np.int32(c), np.int32(inner), np.int32(iv), *divider(iv)]
    n_arrays = (13 if backward or twin else 12) + bool(flags.get("twin_nhwc"))
    return _launch.prepare(k, (clusters * cl,), (NT,), [None] * n_arrays + geo + list(tail),
                           shared_mem=dyn)


def prepare_forward(xc, outer, c, inner, factor, eps, has_running, has_counter, relu, has_z, has_scale, has_bias,
                    divider, dev, twin=False, twin_nhwc=False):
    """A Prepared bn_fwdc launch taking bn_fwd1's arrays, or None where the channel does not fit a cluster.
    ``divider(d)``: the kernels' (multiplier, shift) for dividing by d (bn_kernels._divider).  ``twin``: the TWIN
    kernel, taking relu(y)'s array last; ``twin_nhwc`` (with twin): also the twin's channels-last shadow, the last
    array (None where dx_nhwc_of's 32-bit offsets would not reach)."""
    if twin_nhwc and (not twin or xc.size >= 2 ** 31):
        return None
    return _prepare("bn_fwdc", xc, outer, c, inner, False,
                    dict(relu=relu, has_z=has_z, has_scale=has_scale, has_bias=has_bias, twin=twin,
                         twin_nhwc=twin_nhwc),
                    (np.float64(factor), np.float64(eps), np.int32(has_running), np.int32(has_counter)), divider,
                    dev)


def prepare_backward(xc, outer, c, inner, relu, has_scale, want_dz, divider, dev, dx_nhwc=False):
    """A Prepared bn_bwdc launch taking bn_bwd1's arrays, or None where x and g of a channel do not fit.
    ``dx_nhwc``: the DX_NHWC kernel (dx's array in channels-last memory; the same grid, shared memory and scalars
    as the plain launch), None where DX_NHWC is switched off or dx_nhwc_of's 32-bit offsets would not reach."""
    if dx_nhwc and (not DX_NHWC or xc.size >= 2 ** 31):
        return None
    flags = dict(relu=relu, has_z=want_dz, has_scale=has_scale)
    if dx_nhwc:
        flags["dx_nhwc"] = True
    return _prepare("bn_bwdc", xc, outer, c, inner, True, flags, (), divider, dev)


if __name__ == "__main__":      # write the source with one configuration's defines, for an nvcc check
    import sys
    _launch.write_source(sys.argv[1] if len(sys.argv) > 1 else "/tmp/bn_cluster.cu", SOURCE,
                         [d[2:] for d in _options(np.float32, 8, True, True, True, True, 1)[:-1]])
