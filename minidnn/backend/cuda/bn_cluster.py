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
           double (warp butterflies, then the warps in order); cluster barrier; every block adds the CL blocks'
           partials in rank order from distributed shared memory (the same bits in every block), and derives mean
           and inv_std; block 0 writes them, the running statistics and BatchNorm's counter; pass 2 writes
           y = act((x - mean) * inv_std * scale + bias [+ z]) from the kept vectors.
  bn_bwdc  pass 1: load x, dy (and y after a fused ReLU: g = dy where y > 0), keep x and g, accumulate sum(g),
           sum(g * xhat); the same exchange; block 0 writes dbias, dscale, coef; pass 2 writes
           dx = scale * inv_std * (g - mean(g) - xhat * mean(g * xhat)) (and dz = g) from the kept vectors.
A second cluster barrier (arrive after the exchange, wait at the end) keeps every block's partials alive until the
other blocks have read them.  Deterministic; nothing is read back to the host (capturable in a CUDA graph).
The launch takes the same arrays, in the same order, as bn_fwd1 / bn_bwd1 (the partial and ticket buffers are
not used), so bn_kernels' settled calls run either.
"""
from __future__ import annotations

import os

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from .storage import STORAGE_HEADER, type_info

__all__ = ["SOURCE", "plan", "prepare_forward", "prepare_backward", "ENABLED"]

# MINIDNN_BN_CLUSTER: "1" (default) takes the cluster kernels where a channel fits; "0" leaves bn_fwd1 / bn_bwd1;
# a number 1/2/4/8/16 forces that cluster size where it fits (for the A/B tools).
_SWITCH = os.environ.get("MINIDNN_BN_CLUSTER", "1")
ENABLED = _SWITCH != "0"
FORCE_CL = int(_SWITCH) if _SWITCH.isdigit() and _SWITCH not in ("0", "1") else None
NT = int(os.environ.get("MINIDNN_BN_CLUSTER_NT", "512"))        # threads a block
UNROLL = 4                                                       # vectors in flight per thread and array
# cluster sizes tried, smallest first; 16 is non-portable (H100/H200 allow it; the plan asks the driver first)
SIZES = (1, 2, 4, 8, 16)
_NON_PORTABLE = 14          # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
_STATIC = 1024              # bytes of static shared memory a block (an upper bound: the partials and the warps' sums)

SOURCE = STORAGE_HEADER + r"""
typedef PARAM P;
#define VEC (16 / (int)sizeof(T))
#define NW (NT / 32)
union Pack { uint4 raw; T v[VEC]; };

__device__ __forceinline__ unsigned int fast_div(unsigned int n, unsigned int mul, unsigned int shr)
{
    return (__umulhi(n, mul) + n) >> shr;
}
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
// a double in block `rank`'s shared memory at the address of `p` in ours (distributed shared memory)
__device__ __forceinline__ double ld_cluster(const double* p, unsigned int rank)
{
    unsigned long long g;
    unsigned int local, remote;
    double v;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(g) : "l"(p));
    local = (unsigned int)g;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(remote) : "memory");
    return v;
}
// streaming (evict-first) loads and stores: nothing here is read again from L2
__device__ __forceinline__ Pack ldcs(const T* p)
{
    Pack r;
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.raw.x), "=r"(r.raw.y), "=r"(r.raw.z),
                 "=r"(r.raw.w) : "l"(p));
    return r;
}
__device__ __forceinline__ void stcs(T* p, const Pack& v)
{
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(v.raw.x), "r"(v.raw.y),
                 "r"(v.raw.z), "r"(v.raw.w) : "memory");
}

extern __shared__ uint4 kept[];

// This block's vector range and the element offset of vector j (see the legend).
struct Range {
    unsigned int lo, hi, iv, iv_mul, iv_shr;
    long long cbase, plane;     // the channel's first element, C * inner
    __device__ __forceinline__ long long off(unsigned int j) const
    {
        const unsigned int o = fast_div(j, iv_mul, iv_shr);
        return (long long)o * plane + cbase + (long long)(j - o * iv) * VEC;
    }
    // vectors thread t visits
    __device__ __forceinline__ int count() const
    {
        const unsigned int j0 = lo + threadIdx.x;
        return j0 < hi ? (int)((hi - j0 - 1) / NT + 1) : 0;
    }
};

__device__ __forceinline__ Range range_of(int c, int outer, int C, int inner, int iv, unsigned int iv_mul,
                                          unsigned int iv_shr)
{
    Range r;
    const unsigned long long mv = (unsigned long long)outer * (unsigned int)iv;
    const unsigned int rank = cluster_rank();
    r.lo = (unsigned int)(mv * rank / CL);
    r.hi = (unsigned int)(mv * (rank + 1) / CL);
    r.iv = iv; r.iv_mul = iv_mul; r.iv_shr = iv_shr;
    r.cbase = (long long)c * inner;
    r.plane = (long long)C * inner;
    return r;
}

// The cluster's sums of (a, b): this block's in double (fixed order), published in `part`, then every block adds
// the CL blocks' partials in rank order.  Ends with the cluster barrier's second phase ARRIVED (every thread must
// call cluster_wait() before it exits, so the partials outlive the readers).
__device__ __forceinline__ void cluster_sum(double a, double b, double& t1, double& t2)
{
    __shared__ double warp_sum[NW][2];
    __shared__ double part[2];
    __shared__ double tot[2];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    const int w = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) { warp_sum[w][0] = a; warp_sum[w][1] = b; }
    __syncthreads();
    if (threadIdx.x == 0) {
        double s1 = 0, s2 = 0;
        for (int i = 0; i < NW; ++i) { s1 += warp_sum[i][0]; s2 += warp_sum[i][1]; }
        part[0] = s1; part[1] = s2;
    }
    cluster_arrive();
    cluster_wait();             // every block's partials are in place
    if (threadIdx.x == 0) {
        double s1 = 0, s2 = 0;
        for (unsigned int r = 0; r < CL; ++r) { s1 += ld_cluster(&part[0], r); s2 += ld_cluster(&part[1], r); }
        tot[0] = s1; tot[1] = s2;
    }
    cluster_arrive();           // this block is done reading the others' partials
    __syncthreads();
    t1 = tot[0]; t2 = tot[1];
}

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, BPS)
bn_fwdc(const T* __restrict__ x, const T* __restrict__ z, T* __restrict__ y, void* unused_partial,
        void* unused_sync, A* __restrict__ mean_out, A* __restrict__ inv_std_out, const P* __restrict__ scale,
        const P* __restrict__ bias, P* running_mean, P* running_var, long long* counter,
        const int outer, const int C, const int inner, const int iv, const unsigned int iv_mul,
        const unsigned int iv_shr, const double factor, const double eps, const int has_running,
        const int has_counter)
{
    const int c = blockIdx.x / CL;
    const Range rg = range_of(c, outer, C, inner, iv, iv_mul, iv_shr);
    const int n = rg.count();
    const A K = LD(x[rg.cbase]);        // shift: the channel's first value
    A s1 = 0, s2 = 0;
    for (int k0 = 0; k0 < n; k0 += UNROLL) {
        Pack p[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (k0 + u < n) p[u] = ldcs(x + rg.off(rg.lo + threadIdx.x + (unsigned int)(k0 + u) * NT));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (k0 + u >= n) continue;
            kept[(k0 + u) * NT + threadIdx.x] = p[u].raw;
#pragma unroll
            for (int e = 0; e < VEC; ++e) { const A d = LD(p[u].v[e]) - K; s1 += d; s2 += d * d; }
        }
    }
    double t1, t2;
    cluster_sum((double)s1, (double)s2, t1, t2);
    const double m = (double)outer * inner;
    const double md = t1 / m;
    const double var = fmax(t2 / m - md * md, 0.0);
    const double mean = (double)K + md;
    const A mu = (A)mean, inv = (A)(1.0 / sqrt(var + eps));
    if (threadIdx.x == 0 && cluster_rank() == 0) {
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
        long long off[UNROLL];
        Pack q[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            off[u] = k0 + u < n ? rg.off(rg.lo + threadIdx.x + (unsigned int)(k0 + u) * NT) : -1;
            if (HAS_Z && off[u] >= 0) q[u] = ldcs(z + off[u]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (off[u] < 0) continue;
            Pack p, o;
            p.raw = kept[(k0 + u) * NT + threadIdx.x];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                A w = (LD(p.v[e]) - mu) * kk;
                if (HAS_BIAS) w += bb;
                if (HAS_Z) w += LD(q[u].v[e]);
#if RELU
                w = w > (A)0 ? w : (w != w ? w : (A)0);      // max(w, 0) keeping NaN, as numpy's maximum
#endif
                o.v[e] = ST(w);
            }
            stcs(y + off[u], o);
        }
    }
    cluster_wait();
}

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, BPS)
bn_bwdc(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y, const A* __restrict__ mean,
        const A* __restrict__ inv_std, void* unused_partial, void* unused_sync, A* __restrict__ coef,
        P* __restrict__ dscale, P* __restrict__ dbias, const P* __restrict__ scale, T* __restrict__ dx,
        T* __restrict__ dz, const int outer, const int C, const int inner, const int iv, const unsigned int iv_mul,
        const unsigned int iv_shr)
{
    const int c = blockIdx.x / CL;
    const Range rg = range_of(c, outer, C, inner, iv, iv_mul, iv_shr);
    const int n = rg.count();
    const A mu = mean[c], is = inv_std[c];
    A s1 = 0, s2 = 0;
    for (int k0 = 0; k0 < n; k0 += UNROLL) {
        Pack p[UNROLL], g[UNROLL], r[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (k0 + u >= n) continue;
            const long long o = rg.off(rg.lo + threadIdx.x + (unsigned int)(k0 + u) * NT);
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
            kept[(2 * (k0 + u)) * NT + threadIdx.x] = p[u].raw;
            kept[(2 * (k0 + u) + 1) * NT + threadIdx.x] = g[u].raw;
        }
    }
    double t1, t2;
    cluster_sum((double)s1, (double)s2, t1, t2);
    const double m = (double)outer * inner;
    const A c0 = (A)(t1 / m), c1 = (A)(t2 / m);
    if (threadIdx.x == 0 && cluster_rank() == 0) {
        coef[2 * c] = c0; coef[2 * c + 1] = c1;
#if HAS_SCALE
        dbias[c] = (P)t1; dscale[c] = (P)t2;
#endif
    }
    const A kk = HAS_SCALE ? is * (A)scale[c] : is;
    for (int k0 = 0; k0 < n; k0 += UNROLL) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (k0 + u >= n) continue;
            const long long o = rg.off(rg.lo + threadIdx.x + (unsigned int)(k0 + u) * NT);
            Pack p, g, d, dzv;
            p.raw = kept[(2 * (k0 + u)) * NT + threadIdx.x];
            g.raw = kept[(2 * (k0 + u) + 1) * NT + threadIdx.x];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A gv = LD(g.v[e]);
                const A xhat = (LD(p.v[e]) - mu) * is;
                d.v[e] = ST(kk * (gv - c0 - xhat * c1));
                if (HAS_Z) dzv.v[e] = g.v[e];
            }
            stcs(dx + o, d);
            if (HAS_Z) stcs(dz + o, dzv);
        }
    }
    cluster_wait();
}
"""


def _cc(dev):
    try:
        return int(_launch.cupy().cuda.Device(dev).compute_capability)
    except Exception:       # noqa: BLE001 -- a fake CuPy: assume a Hopper
        return 90


def plan(outer, c, inner, itemsize, backward, sm_count=132, smem=(233472, 232448), non_portable=True,
         force=None):
    """(CL, slots, dynamic shared memory bytes) of a cluster launch, or None where a channel does not fit a
    cluster's shared memory (the caller keeps bn_fwd1 / bn_bwd1).  ``smem``: (per SM, the most a block may opt
    into).  The choice: the smallest cluster whose C * CL blocks cover the SMs with two blocks an SM fitting the
    shared memory; else the smallest covering the SMs at one block an SM; else the largest that fits."""
    vec = 16 // itemsize
    if inner % vec or c < 1 or outer < 1:
        return None
    mv = outer * inner // vec
    if mv >= 2 ** 31:
        return None
    arrays = 2 if backward else 1
    per_block = min(smem[1], smem[0] - 1024) - _STATIC
    per_block2 = (smem[0] // 2 - 1024) - _STATIC

    def dyn(cl):
        slots = -(-(-(-mv // cl)) // NT)
        return slots * NT * 16 * arrays

    sizes = [s for s in SIZES if s <= 8 or non_portable]
    if force is not None:
        return (force, -(-(-(-mv // force)) // NT), dyn(force)) if force in sizes and dyn(force) <= per_block \
            else None
    fits = [s for s in sizes if dyn(s) <= per_block]
    if not fits:
        return None
    cover = [s for s in fits if c * s >= sm_count]
    two = [s for s in cover if dyn(s) <= per_block2]
    cl = min(two) if two else min(cover) if cover else max(fits)
    return cl, -(-(-(-mv // cl)) // NT), dyn(cl)


def _options(dtype, cl, relu, has_z, has_scale, has_bias, bps):
    scalar, accum, storage, pdt = type_info(dtype)
    return (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}",
            f"-DPARAM={'double' if pdt == np.float64 else 'float'}", f"-DCL={cl}", f"-DNT={NT}",
            f"-DUNROLL={UNROLL}", f"-DBPS={bps}", f"-DRELU={int(relu)}", f"-DHAS_Z={int(has_z)}",
            f"-DHAS_SCALE={int(has_scale)}", f"-DHAS_BIAS={int(has_bias)}", "-std=c++17")


_kernels: dict = {}


def _kernel(name, dtype, cl, relu, has_z, has_scale, has_bias, bps, dev):
    key = (name, _dev.dtype_name(dtype), cl, relu, has_z, has_scale, has_bias, bps, dev)
    k = _kernels.get(key)
    if k is None:
        k = _launch.get_kernel(SOURCE, name, _options(dtype, cl, relu, has_z, has_scale, has_bias, bps))
        if cl > 8:      # (a fake CuPy has no such call)
            setter = getattr(_launch.cupy().cuda.driver, "funcSetAttribute", None)
            if setter is not None:
                setter(k.kernel.ptr, _NON_PORTABLE, 1)
        _kernels[key] = k
    return k


def usable(dev) -> bool:
    """Whether the cluster kernels may run on GPU ``dev`` (switched on, compute capability 9.0 or newer)."""
    return ENABLED and _cc(dev) >= 90


def _prepare(name, xc, outer, c, inner, backward, flags, tail, dev):
    from . import bn_kernels as _bn
    from . import bn_nhwc as _nhwc
    item = xc.dtype.itemsize
    p = plan(outer, c, inner, item, backward, _launch.sm_count(dev), _nhwc.smem_limits(dev), force=FORCE_CL)
    if p is None:
        return None
    cl, _slots, dyn = p
    bps = 2 if dyn <= (_nhwc.smem_limits(dev)[0] // 2 - 1024 - _STATIC) else 1
    k = _kernel(name, xc.dtype, cl, flags.get("relu", False), flags.get("has_z", False),
                flags.get("has_scale", False), flags.get("has_bias", False), bps, dev)
    iv = inner // (16 // item)
    geo = [np.int32(outer), np.int32(c), np.int32(inner), np.int32(iv), *_bn._divider(iv)]
    n_arrays = 13 if backward else 12
    return _launch.prepare(k, (c * cl,), (NT,), [None] * n_arrays + geo + list(tail), shared_mem=dyn)


def prepare_forward(xc, outer, c, inner, factor, eps, has_running, has_counter, relu, has_z, has_scale, has_bias,
                    dev):
    """A Prepared bn_fwdc launch taking bn_fwd1's arrays, or None where the channel does not fit a cluster."""
    return _prepare("bn_fwdc", xc, outer, c, inner, False,
                    dict(relu=relu, has_z=has_z, has_scale=has_scale, has_bias=has_bias),
                    (np.float64(factor), np.float64(eps), np.int32(has_running), np.int32(has_counter)), dev)


def prepare_backward(xc, outer, c, inner, relu, has_scale, want_dz, dev):
    """A Prepared bn_bwdc launch taking bn_bwd1's arrays, or None where x and g of a channel do not fit."""
    return _prepare("bn_bwdc", xc, outer, c, inner, True, dict(relu=relu, has_z=want_dz, has_scale=has_scale), (),
                    dev)


if __name__ == "__main__":      # write the source with one configuration's defines, for an nvcc check
    import sys
    _launch.write_source(sys.argv[1] if len(sys.argv) > 1 else "/tmp/bn_cluster.cu", SOURCE,
                         [d[2:] for d in _options(np.float32, 8, True, True, True, True, 1)[:-1]])
