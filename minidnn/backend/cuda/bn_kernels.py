"""Batch normalisation on the GPU (SPATIAL mode): training forward, backward, inference, fused ReLU / add + ReLU.

Shape legend: x, y, z (residual), dy, dx, dz viewed as (outer, C, inner), contiguous:
    NCHW / NCDHW / NCL:       outer = N,       inner = H*W (D*H*W, L)
    channels-last and (N, C): outer = N*H*W,   inner = 1                 ("INNER1" kernels)
scale, bias, running_mean, running_var, dscale, dbias: (C,) in x's dtype (float32 for float16/bfloat16 data);
mean, inv_std, coef: (C,) / (C, 2) in A (the accumulation type: double for float64 data, else float).
m = outer * inner values per channel.

Two launches per direction, each one pass over the data:
  bn_stats   (training forward)  per channel the shifted sums  sum(x - K), sum((x - K)^2), K = the channel's first
             element (the reference's shifted one-pass moments, _common.moments), then mean, inv_std, the
             running-statistics update and (when given) BatchNorm's step counter += 1;
  bn_grad    (backward)          per channel sum(g), sum(g * xhat) with g = dy (masked by y > 0 after a fused ReLU):
             dbias, dscale and the two means the dx formula needs;
  bn_apply   (forward, training or inference)  y = act((x - mean) * inv_std * scale + bias [+ z]);
  bn_dx      (backward)          dx = scale * inv_std * (g - mean(g) - xhat * mean(g * xhat)),  dz = g.
Tiling of the two reductions: a 256-thread block owns CT channels (CT = 1 for NCHW, 32 for INNER1) and one of
`splits` slices of the m values of each; thread (ty, tx) = (threadIdx.x / CT, threadIdx.x % CT) accumulates channel
blockIdx.y * CT + tx over rows ty, ty + RY, ... (RY = 256 / CT) of its slice -- consecutive threads read consecutive
addresses in both layouts.  A fixed-order shared-memory tree sums the RY rows; each block writes its partial sums;
the LAST block of a channel tile (threadfence + atomic ticket, reset by that block: the multi_tensor.py idiom) adds
the partials in double -- row ty of the block takes splits ty, ty + RY, ... in order, then a fixed-order tree over
the rows -- and finalises.  Deterministic: no float atomics, the same order at every call.  The two elementwise kernels
are grid-stride loops, 4 independent elements per thread per iteration.
Traffic: forward reads x twice and writes y (3 passes; the cuDNN/PyTorch floor without a grid barrier), backward
reads x, dy (y) twice and writes dx (dz).  Nothing is read back to the host: capturable in a CUDA graph.
Routes of a training call (settled once per signature below): NCHW calls that are latency-bound -- every channel's
cluster resident at once, <= 64 KB kept a block: the example models' tensors -- take bn_cluster.py's kernels (a
channel held on-chip by a thread-block cluster, one DRAM read; MINIDNN_BN_CLUSTER=0 switches them off); other aligned
calls the one-pass kernels bn_fwd1 / bn_bwd1 (ONEPASS_SOURCE: statistics and the elementwise pass in one launch);
channels-last rows bn_nhwc.py; the rest the two-launch kernels above.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .. import devices as _dev
from . import bn_cluster as _cluster
from . import bn_nhwc as _nhwc
from . import device_facts as _facts
from . import launch as _launch
from . import workspace as _ws
from .storage import STORAGE_HEADER, acc_dtype, param_dtype, type_info

__all__ = ["supports", "layout_of", "forward_training", "forward_inference", "backward", "SOURCE"]

THREADS = 256


def _env_int(name, default, lo, hi):
    """An integer switch from the environment, checked at import so a typo fails before any launch."""
    raw = os.environ.get(name, str(default))
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer in [{lo}, {hi}]") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name}={v}: expected an integer in [{lo}, {hi}]")
    return v


# The one-pass kernels keep UNROLL = 4 vectors in flight per thread and array (~32 KB an SM at 2 blocks).  Session 18
# (issue 10) timed 6 and 8 on the H200 (run 7, tools/bn_s18_ab.py, graph replays): u8 0.83-1.00x of u4 (and it
# spills in the bn + ReLU backward), u6 0.90-1.01x (no row gained beyond 1.3%) and, with the prefetch adopted in the
# same run, u6p1 0.93-1.00x of u4p1 on every row; so the unroll stopped being a switch in session 19
# (MINIDNN_BN_UNROLL is now ignored).  It is also the unit the split's minimum slice is counted in
# (onepass_geometry), so the split -- and the bits -- are the ones every earlier session measured.
ONEPASS_UNROLL = 4
# Blocks an SM (MINIDNN_BN_BPS, set_onepass(bps=)): the launch bounds, the grid (all resident at once) and the on-chip
# copy's share of shared memory (3: a third each, fewer slots).  Kept as a switch though 3 lost on most rows of run 7
# (3-11%: the other float32 rows and every bfloat16 one): it is the one setting that won a large row, (256, 32, 56,
# 56) float32 -- backward 1.144x and bn + ReLU backward 1.120x u4, at PREFETCH 1 still 1.016x / 1.009x the default
# (0.1161 / 0.1587 ms against 0.1180 / 0.1602); choosing it by shape would need more rows measured.
ONEPASS_BPS = _env_int("MINIDNN_BN_BPS", 2, 1, 4)
# L2 prefetches PREFETCH iterations ahead in the first pass of the copy's kernels, and of the next tile's first
# vectors before a meeting (MINIDNN_BN_PREFETCH; 0: off, the kernels' PTX as before): bytes in flight that take no
# register; same bits.  Default 1 since session 18's run 7 (H200, graph replays, tools/bn_s18_ab.py): forward 1.06-1.09x
# (fp32 (32, 256, 56, 56) 67% -> 72% of copy), backward 1.01-1.07x, bn + relu backward 0.99-1.04x, ResNet-20's
# (128, 16, 32, 32) level or faster.
ONEPASS_PREFETCH = _env_int("MINIDNN_BN_PREFETCH", 1, 0, 8)
# The symmetric meeting (MINIDNN_BN_SYMM, set_onepass(symm=); 0: off, the define absent, the last-arriver meeting of
# sessions 6-19): every block of a tile adds the partials itself once all have arrived, instead of the last arriver
# finalising and raising a flag the others poll and then reading the statistics back from L2 (the SYMM comment in
# ONEPASS_SOURCE).  The same sums in the same order: the same bits.  Default 1 since session 20's run 2; in its final
# form (run 6, H200, graph replays, tools/bn_s18_ab.py p1s1 / p1, 9 rounds) every large NCHW row faster -- float32
# forward 1.06x ((32, 256, 56, 56) 0.0706 -> 0.0668 ms, 70% -> 74% of copy), backward 1.05-1.09x (0.1124 -> 0.1034,
# 66% -> 72%), bn + ReLU backward 1.04-1.05x; bfloat16 1.04-1.07x forward, 1.05-1.06x backward; ResNet-20's
# (128, 16, 32, 32) float32 backward 1.17x (0.0117 -> 0.0100 ms), its forward (bn_cluster's route) level; on an H100
# (run 8) 1.03-1.07x on every large row (forwards 75-80% of copy, backwards 70-77%).
ONEPASS_SYMM = _env_int("MINIDNN_BN_SYMM", 1, 0, 1)

SOURCE = STORAGE_HEADER + r"""
typedef PARAM P;      // scale, bias, running statistics, dscale, dbias: x's dtype, or float32 for 16-bit data
""" + _nhwc.BN_FINALISE + r"""
#define CT (INNER1 ? 32 : 1)
#define RY (256 / CT)

// Sum v[2] over the RY rows of the block (fixed order tree); the result lands in sm[0][tx][*].
__device__ __forceinline__ void rows_sum(A (*sm)[CT][2], int ty, int tx, A v0, A v1)
{
    sm[ty][tx][0] = v0; sm[ty][tx][1] = v1;
    __syncthreads();
    for (int s = RY / 2; s > 0; s >>= 1) {
        if (ty < s) { sm[ty][tx][0] += sm[ty + s][tx][0]; sm[ty][tx][1] += sm[ty + s][tx][1]; }
        __syncthreads();
    }
}

// n / d for 0 <= n < 2^31 by multiply-high and shift (the divisor's (mul, shift) come from the host, _divider):
// a 32-bit hardware-free division, as PyTorch's IntDivider.
__device__ __forceinline__ unsigned int fast_div(unsigned int n, unsigned int mul, unsigned int shr)
{
    return (__umulhi(n, mul) + n) >> shr;
}

// Walk this thread's elements of channel c, 4 independent loads per iteration: calls f(value) for each.
// NCHW: j = o * inner + i over the channel's m values (o, i by the fast divider of inner); INNER1: rows o.
template <class F>
__device__ __forceinline__ void for_channel(const T* __restrict__ x, int outer, int C, int inner, unsigned int in_mul,
                                            unsigned int in_shr, int c, int ty, F f)
{
#if INNER1
    const unsigned int m = (unsigned int)outer;
#else
    const unsigned int m = (unsigned int)outer * (unsigned int)inner;
#endif
    const unsigned int step = gridDim.x * RY;
    for (unsigned int j = blockIdx.x * RY + ty; j < m; j += 4 * step) {
        T v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const unsigned int jj = j + u * step;
            if (jj < m) {
#if INNER1
                v[u] = x[(long long)jj * C + c];
#else
                const unsigned int o = fast_div(jj, in_mul, in_shr), i = jj - o * (unsigned int)inner;
                v[u] = x[((long long)o * C + c) * inner + i];
#endif
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (j + u * step < m) f(j + u * step, v[u]);
    }
}

// The address of the jj-th value of channel c (for the second operand of the backward reduction).
__device__ __forceinline__ long long channel_addr(unsigned int jj, int C, int inner, unsigned int in_mul,
                                                  unsigned int in_shr, int c)
{
#if INNER1
    return (long long)jj * C + c;
#else
    const unsigned int o = fast_div(jj, in_mul, in_shr), i = jj - o * (unsigned int)inner;
    return ((long long)o * C + c) * inner + i;
#endif
}

// Every thread fences its own partial-sum stores (several threads of a channels-last tile write them) before the
// block takes its ticket.
__device__ __forceinline__ bool last_block(unsigned int* ticket)
{
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket + blockIdx.y, 1u) == gridDim.x - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// In the last block of a channel tile: the totals (in double) of channel c's gridDim.x partial pairs.  Row ty of
// the block sums partials ty, ty + RY, ... in order, then a fixed-order tree adds the RY rows: the same split of
// the work at every call (deterministic), and RY loads in flight instead of one thread walking every partial (a
// channels-last tile has ~10^3 splits: that walk was most of the kernel's time).  Every thread of the block calls it.
__device__ __forceinline__ void partials_total(const A* __restrict__ partial, int c, int C, int ty, int tx,
                                               double& t1, double& t2)
{
    __shared__ double sd[RY][CT][2];
    double a1 = 0, a2 = 0;
    if (c < C) {
        const A* p = partial + (long long)c * gridDim.x * 2;
        for (int b = ty; b < (int)gridDim.x; b += RY) { a1 += (double)p[2 * b]; a2 += (double)p[2 * b + 1]; }
    }
    sd[ty][tx][0] = a1; sd[ty][tx][1] = a2;
    __syncthreads();
    for (int s = RY / 2; s > 0; s >>= 1) {
        if (ty < s) { sd[ty][tx][0] += sd[ty + s][tx][0]; sd[ty][tx][1] += sd[ty + s][tx][1]; }
        __syncthreads();
    }
    t1 = sd[0][tx][0]; t2 = sd[0][tx][1];
}

// The two-launch reductions' meeting (bn_stats, bn_grad): the block's rows' sums (s1, s2) of channel c go to its
// partial pair; the last block of the channel tile to arrive gets the totals over every block (partials_total) and
// true, every other block false (it is done).  Every thread of the block calls it.
__device__ __forceinline__ bool channel_totals(A (*sm)[CT][2], A* __restrict__ partial, unsigned int* ticket, int c,
                                               int C, int ty, int tx, A s1, A s2, double& t1, double& t2)
{
    rows_sum(sm, ty, tx, s1, s2);
    if (ty == 0 && c < C) {
        A* p = partial + ((long long)c * gridDim.x + blockIdx.x) * 2;
        p[0] = sm[0][tx][0]; p[1] = sm[0][tx][1];
    }
    if (!last_block(ticket)) return false;
    partials_total(partial, c, C, ty, tx, t1, t2);
    return true;
}

extern "C" __global__ void __launch_bounds__(256)
bn_stats(const T* __restrict__ x, A* __restrict__ partial, unsigned int* ticket,
         A* __restrict__ mean_out, A* __restrict__ inv_std_out, P* running_mean, P* running_var, long long* counter,
         const int outer, const int C, const int inner, const unsigned int in_mul, const unsigned int in_shr,
         const double factor, const double eps, const int has_running, const int has_counter)
{
    __shared__ A sm[RY][CT][2];
    const int tx = threadIdx.x % CT, ty = threadIdx.x / CT;
    const int c = blockIdx.y * CT + tx;
    A s1 = 0, s2 = 0;
    if (c < C) {
        const A k = LD(x[INNER1 ? c : (long long)c * inner]);     // shift: the channel's first element
        for_channel(x, outer, C, inner, in_mul, in_shr, c, ty, [&](unsigned int, T v) {
            const A d = LD(v) - k; s1 += d; s2 += d * d; });
    }
    double t1, t2;
    if (!channel_totals(sm, partial, ticket, c, C, ty, tx, s1, s2, t1, t2)) return;
    if (ty == 0 && c < C) {
        BN_FINALISE(c, (double)outer * inner, x[INNER1 ? c : (long long)c * inner])
    }
    if (threadIdx.x == 0) {
        ticket[blockIdx.y] = 0u;
        if (has_counter && blockIdx.y == 0) counter[0] += 1;    // BatchNorm's num_batches_tracked, once per call
    }
}

// Backward reduction.  RELU: g = dy where y > 0 (y the fused forward's output; !(y <= 0) lets a NaN through, as the
// reference's relu' does).  Writes dscale = sum(g * xhat), dbias = sum(g) (when HAS_SCALE) and coef = (mean(g),
// mean(g * xhat)) for bn_dx.
extern "C" __global__ void __launch_bounds__(256)
bn_grad(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y, const A* __restrict__ mean,
        const A* __restrict__ inv_std, A* __restrict__ partial, unsigned int* ticket, A* __restrict__ coef,
        P* __restrict__ dscale, P* __restrict__ dbias, const int outer, const int C, const int inner,
        const unsigned int in_mul, const unsigned int in_shr)
{
    __shared__ A sm[RY][CT][2];
    const int tx = threadIdx.x % CT, ty = threadIdx.x / CT;
    const int c = blockIdx.y * CT + tx;
    A s1 = 0, s2 = 0;
    if (c < C) {
        const A mu = mean[c], is = inv_std[c];
        // walk dy (4 loads in flight); x and y at the same address follow (L1/L2 hits are not guaranteed: they
        // are separate streams, but each is read once here and coalesced)
        for_channel(dy, outer, C, inner, in_mul, in_shr, c, ty, [&](unsigned int jj, T dv) {
            const long long a = channel_addr(jj, C, inner, in_mul, in_shr, c);
            A g = LD(dv);
#if RELU
            if (LD(y[a]) <= (A)0) g = 0;
#endif
            s1 += g; s2 += g * ((LD(x[a]) - mu) * is);
        });
    }
    double t1, t2;
    if (!channel_totals(sm, partial, ticket, c, C, ty, tx, s1, s2, t1, t2)) return;
    if (ty == 0 && c < C) {
        const double m = (double)outer * inner;
        coef[2 * c] = (A)(t1 / m); coef[2 * c + 1] = (A)(t2 / m);
#if HAS_SCALE
        dbias[c] = (P)t1; dscale[c] = (P)t2;
#endif
    }
    if (threadIdx.x == 0) ticket[blockIdx.y] = 0u;
}

// channel of flat index i (< 2^31): (i / inner) % C, by fast dividers of inner and C
__device__ __forceinline__ int channel_of(long long i, int C, unsigned int c_mul, unsigned int c_shr, int inner,
                                          unsigned int in_mul, unsigned int in_shr)
{
    unsigned int q = (unsigned int)i;
#if !INNER1
    q = fast_div(q, in_mul, in_shr);
#endif
    return (int)(q - fast_div(q, c_mul, c_shr) * (unsigned int)C);
}

// y = act((x - mean) * inv * scale + bias [+ z]); FROM_VAR: inv = 1 / sqrt(var + eps) (inference: stat2 = var).
extern "C" __global__ void __launch_bounds__(256)
bn_apply(const T* __restrict__ x, const T* __restrict__ z, T* __restrict__ y, const void* stat1, const void* stat2,
         const P* __restrict__ scale, const P* __restrict__ bias, const long long n, const int C, const int inner,
         const unsigned int c_mul, const unsigned int c_shr, const unsigned int in_mul, const unsigned int in_shr,
         const double eps)
{
#if FROM_VAR
    typedef P S;      // inference: the running statistics
#else
    typedef A S;
#endif
    const S* mean = (const S*)stat1;
    const S* st2 = (const S*)stat2;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x; i0 < n; i0 += 4 * stride) {
        T xv[4], zv[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long i = i0 + u * stride;
            if (i < n) { xv[u] = x[i]; zv[u] = HAS_Z ? z[i] : x[i]; }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long i = i0 + u * stride;
            if (i >= n) break;
            const int c = channel_of(i, C, c_mul, c_shr, inner, in_mul, in_shr);
#if FROM_VAR
            const A inv = (A)1 / sqrt((A)st2[c] + (A)eps);
#else
            const A inv = (A)st2[c];
#endif
            const A k = HAS_SCALE ? inv * (A)scale[c] : inv;
            A v = (LD(xv[u]) - (A)mean[c]) * k;
            if (HAS_BIAS) v += (A)bias[c];
            if (HAS_Z) v += LD(zv[u]);
#if RELU
            v = v > (A)0 ? v : (v != v ? v : (A)0);      // max(v, 0) keeping NaN, as numpy's maximum
#endif
            y[i] = ST(v);
        }
    }
}

// dx = scale * inv_std * (g - coef0 - xhat * coef1); g = dy masked by y > 0 (RELU); HAS_Z: dz = g.
extern "C" __global__ void __launch_bounds__(256)
bn_dx(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y, const A* __restrict__ mean,
      const A* __restrict__ inv_std, const A* __restrict__ coef, const P* __restrict__ scale, T* __restrict__ dx,
      T* __restrict__ dz, const long long n, const int C, const int inner, const unsigned int c_mul,
      const unsigned int c_shr, const unsigned int in_mul, const unsigned int in_shr)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x; i0 < n; i0 += 4 * stride) {
        T xv[4], gv[4], yv[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long i = i0 + u * stride;
            if (i < n) { xv[u] = x[i]; gv[u] = dy[i]; yv[u] = RELU ? y[i] : x[i]; }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long i = i0 + u * stride;
            if (i >= n) break;
            const int c = channel_of(i, C, c_mul, c_shr, inner, in_mul, in_shr);
            const A is = inv_std[c];
            A g = LD(gv[u]);
            if (RELU && LD(yv[u]) <= (A)0) g = 0;
            const A xhat = (LD(xv[u]) - mean[c]) * is;
            const A k = HAS_SCALE ? is * (A)scale[c] : is;
            dx[i] = ST(k * (g - coef[2 * c] - xhat * coef[2 * c + 1]));
            if (HAS_Z) dz[i] = ST(g);
        }
    }
}
"""

# The one-pass kernels (bn_fwd1, bn_bwd1): the statistics and the elementwise pass in ONE launch.  A tile (one
# channel NCHW; TW = TPR * VEC consecutive channels channels-last) is split over `per` blocks; each block reads its
# slice, publishes its partial sums, meets the tile's other blocks (the last one adds the partials in a fixed order
# and finalises), then reads the same slice again -- from L2: a launch takes at most an L2-sized share of the data
# in flight (`_ROUND_SHARE`) -- and writes the output.  The grid (`per` blocks times the tiles of one round, at most
# the resident blocks: BPS per SM) loops over rounds of tiles.  DRAM traffic is the compulsory one (x read once,
# y written once) where a round fits in L2.  Defines: VEC (values per 16-byte vector, or 1), TPR (threads side by
# side over a channels-last tile), UNROLL (vectors in flight per thread and array), BPS (blocks per SM), CACHE (the
# on-chip copy, NCHW: each thread keeps the first ks vectors of its slice -- x forward, x and the masked g backward --
# in dynamic shared memory across the meeting, and re-reads the rest newest first; a round then takes the grid's
# shared memory plus _ROUND_SHARE_ONCHIP (0.5) of L2.  (128, 64, 56, 56) float32 on an H100: forward 2 rounds of 32
# channels, backward 4 rounds of 16; measured 0.094 ms (74% of copy) and 0.147 ms (71%); with 0.3 of L2 (3 and 5
# rounds) 0.101 / 0.155, without the copy 0.112 / 0.175.)
ONEPASS_SOURCE = STORAGE_HEADER + _nhwc.TWIN_HEADER + _cluster.SHADOW_HEADER + r"""
typedef PARAM P;
__device__ __forceinline__ unsigned int fast_div(unsigned int n, unsigned int mul, unsigned int shr)
{
    return (__umulhi(n, mul) + n) >> shr;
}
""" + r"""// ---- one-pass kernels (bn_fwd1, bn_bwd1): statistics and the elementwise pass in one launch ----------
#define NCH (INNER1 ? VEC : 1)          // channels a thread accumulates (its vector's lanes, channels-last)
#define TX (INNER1 ? TPR : 1)           // threads side by side over a tile's channels
#define RW (256 / TX)                   // rows of threads
#define TW (TX * NCH)                   // channels of a tile
#if VEC == 1
typedef T VT;
#else
typedef uint4 VT;                       // 16 bytes: 2 doubles, 4 floats or 8 halves
#endif
union Pack { VT raw; T v[VEC]; };
""" + _nhwc.BN_FINALISE + _nhwc.BN_OUT + r"""

// first pass: plain loads (they fill L2); second pass: the same addresses again, streaming ("last use") loads that
// hit L2, and streaming stores so the outputs do not push the first pass's lines out
__device__ __forceinline__ Pack ld1(const T* p) { Pack r; r.raw = *reinterpret_cast<const VT*>(p); return r; }
__device__ __forceinline__ Pack ld2(const T* p)
{
    Pack r;
#if VEC == 1
    r.raw = *p;
#else
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.raw.x), "=r"(r.raw.y), "=r"(r.raw.z),
                 "=r"(r.raw.w) : "l"(p));
#endif
    return r;
}
__device__ __forceinline__ void st2(T* p, const Pack& v)
{
#if VEC == 1
    *p = v.raw;
#else
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(v.raw.x), "r"(v.raw.y),
                 "r"(v.raw.z), "r"(v.raw.w) : "memory");
#endif
}

// The element offsets of this block's slice of tile t, visited as (thread, unrolled step): one function object
// call per vector with its offset.  NCHW: the channel's m / VEC vectors split into `per` contiguous ranges, vector
// j at ((j / iv) * C + c) * inner + (j % iv) * VEC; channels-last: rows split likewise, thread (ty, tx) reads
// row r's channels t * TW + tx * VEC ... at r * C + t * TW + tx * VEC.
struct Slice {
    unsigned int lo, hi, first;
    long long base;
};

__device__ __forceinline__ Slice slice_of(int t, int s, int per, int outer, int C, int inner, int iv)
{
    Slice sl;
#if INNER1
    const unsigned long long m = (unsigned long long)outer;
    sl.first = threadIdx.x / TX;
    sl.base = (long long)t * TW + (threadIdx.x % TX) * VEC;
#else
    const unsigned long long m = (unsigned long long)outer * (unsigned int)iv;
    sl.first = threadIdx.x;
    sl.base = (long long)t * inner;
#endif
    sl.lo = (unsigned int)(m * s / per);
    sl.hi = (unsigned int)(m * (s + 1) / per);
    return sl;
}

template <class F>
__device__ __forceinline__ void walk(const Slice& sl, int C, int inner, int iv, unsigned int iv_mul,
                                     unsigned int iv_shr, bool valid, F f)
{
    if (!valid) return;
    for (unsigned int j = sl.lo + sl.first; j < sl.hi; j += RW * UNROLL) {
        long long off[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const unsigned int jj = j + u * RW;
#if INNER1
            off[u] = jj < sl.hi ? (long long)jj * C + sl.base : -1;
#else
            const unsigned int o = fast_div(jj, iv_mul, iv_shr);
            off[u] = jj < sl.hi ? ((long long)o * C) * inner + sl.base + (long long)(jj - o * iv) * VEC : -1;
#endif
        }
        f(off);
    }
}

// The on-chip copy (CACHE: MINIDNN_BN_ONCHIP, the default).  A thread's walk of its slice is a sequence: its k-th
// vector (k = 0 .. n - 1) is j = lo + first + k * RW, the order walk() visits.  The first `ks` vectors of each cached
// array -- x forward; x and g (dy, masked by a fused ReLU's y) backward -- stay in dynamic shared memory across the
// meeting: slot (k, a) of thread tid at cache_sm[(k * NCACHE + a) * 256 + tid] (a warp's slots are consecutive: no
// bank conflicts; each thread reads back only its own slots, so a round's tile may reuse them without a barrier).
// The elementwise pass visits the same vectors: the uncached ones newest first (what L2 still holds), then the
// cached ones.  A round may then take the L2 share plus the whole grid's shared memory (onepass_geometry).
#if CACHE
extern __shared__ VT cache_sm[];
#define CACHE_PARAM , const int ks
#else
#define CACHE_PARAM
#endif

__device__ __forceinline__ int slice_len(const Slice& sl)
{
    const unsigned int j0 = sl.lo + sl.first;
    return j0 < sl.hi ? (int)((sl.hi - j0 - 1) / RW + 1) : 0;
}

// Visit the thread's vectors k = kb .. ke - 1 (REV: ke - 1 down to kb), UNROLL at a time: f(off[UNROLL], kk[UNROLL])
// with the element offsets (as walk() computes them) and k, -1 past the range.
template <bool REV, class F>
__device__ __forceinline__ void seq_walk(const Slice& sl, int C, int inner, int iv, unsigned int iv_mul,
                                         unsigned int iv_shr, bool valid, int kb, int ke, F f)
{
    if (!valid) return;
    for (int i = 0; i < ke - kb; i += UNROLL) {
        long long off[UNROLL];
        int kk[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const bool in = i + u < ke - kb;
            const int k = REV ? ke - 1 - (i + u) : kb + i + u;
            const unsigned int jj = sl.lo + sl.first + (unsigned int)(in ? k : 0) * RW;
#if INNER1
            off[u] = in ? (long long)jj * C + sl.base : -1;
#else
            const unsigned int o = fast_div(jj, iv_mul, iv_shr);
            off[u] = in ? ((long long)o * C) * inner + sl.base + (long long)(jj - o * iv) * VEC : -1;
#endif
            kk[u] = in ? k : -1;
        }
        f(off, kk);
    }
}

// PREFETCH (session 18, MINIDNN_BN_PREFETCH; 0 = off, the define absent): more bytes in flight without registers.
// The first pass asks L2 (prefetch.global.L2: no register, no value) for the vectors PREFETCH iterations
// (PREFETCH * UNROLL vectors) ahead of the ones it loads, and a block about to meet asks for the first
// PREFETCH * UNROLL vectors of its next tile, so DRAM keeps streaming through the meeting.  The values, and the
// order of every sum, are the plain kernel's: the bits too.
#ifndef PREFETCH
#define PREFETCH 0
#endif
// vector k of the thread's slice (the order walk() and seq_walk() visit) as an element offset; -1 past the slice
__device__ __forceinline__ long long vec_off(const Slice& sl, int C, int inner, int iv, unsigned int iv_mul,
                                             unsigned int iv_shr, unsigned int k)
{
    const unsigned long long jl = (unsigned long long)sl.lo + sl.first + (unsigned long long)k * RW;
    if (jl >= sl.hi) return -1;
    const unsigned int jj = (unsigned int)jl;
#if INNER1
    return (long long)jj * C + sl.base;
#else
    const unsigned int o = fast_div(jj, iv_mul, iv_shr);
    return ((long long)o * C) * inner + sl.base + (long long)(jj - o * iv) * VEC;
#endif
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" :: "l"(p)); }

// L2 prefetches of vectors kb .. kb + cnt - 1 of each of the first NA arrays of `ptrs` (NA: 1 forward, 2 or 3
// backward) where they are in the slice
template <int NA>
__device__ __forceinline__ void prefetch_range(const Slice& sl, int C, int inner, int iv, unsigned int iv_mul,
                                               unsigned int iv_shr, bool valid, int kb, int cnt,
                                               const T* p0, const T* p1, const T* p2)
{
    if (!valid) return;
    for (int k = kb; k < kb + cnt; ++k) {
        const long long po = vec_off(sl, C, inner, iv, iv_mul, iv_shr, (unsigned int)k);
        if (po < 0) break;
        prefetch_l2(p0 + po);
        if (NA > 1) prefetch_l2(p1 + po);
        if (NA > 2) prefetch_l2(p2 + po);
    }
}

// The block's sums of v[NCH][2] over its RW rows of threads (fixed-order tree); thread row 0 holds the result.
__device__ __forceinline__ void block_sum(A (*sm)[TW][2], A (&v)[NCH][2])
{
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
#pragma unroll
    for (int k = 0; k < NCH; ++k) { sm[ty][tx * NCH + k][0] = v[k][0]; sm[ty][tx * NCH + k][1] = v[k][1]; }
    __syncthreads();
    for (int s = RW / 2; s > 0; s >>= 1) {
        if (ty < s) {
#pragma unroll
            for (int k = 0; k < NCH; ++k) {
                sm[ty][tx * NCH + k][0] += sm[ty + s][tx * NCH + k][0];
                sm[ty][tx * NCH + k][1] += sm[ty + s][tx * NCH + k][1];
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int k = 0; k < NCH; ++k) { v[k][0] = sm[0][tx * NCH + k][0]; v[k][1] = sm[0][tx * NCH + k][1]; }
}

// SYMM (session 20, MINIDNN_BN_SYMM, the default; 0 = off, the define absent: the last-arriver meeting below).
// Every block of the tile waits for the arrival count to reach `per`, then adds the partials itself -- the same
// loads in the same order as the last arriver's, so every block gets the statistics bit for bit -- and keeps its
// finalised values in shared memory (SYMM_KEEP; read back by STAT_LD).  That drops from the chain every block waits
// on: the last block's fence, its fin stores, a fence, the flag's atomic, the waiters' flag poll and fence, and the
// statistics' load from L2 -- ~4 of the ~7 dependent L2 round trips of a meeting (docs/step_kernels.md, "Session 7":
// 6.6 us a round).  Only block s == 0 updates the running statistics and the step counter; every block stores the
// same mean / inv_std (coef, dscale, dbias) values, which nobody reads inside the launch.
#ifndef SYMM
#define SYMM 0
#endif
#if SYMM
#define SYMM_DECL __shared__ A sym[TW][2];
#define SYMM_KEEP(c, a0, a1) { sym[(c) - t * TW][0] = (a0); sym[(c) - t * TW][1] = (a1); }
#define STAT_LD(p, off, c, j) sym[(c) - t * TW][j]
#define SYMM_ONCE && s == 0
#else
#define SYMM_DECL
#define SYMM_KEEP(c, a0, a1)
#define STAT_LD(p, off, c, j) __ldcg(p + off)
#define SYMM_ONCE
#endif

// The block's sums of tile t (thread row 0's v, after block_sum) to its slots of `partial`, then a fence and a
// barrier: what every form of the meeting publishes before its arrival.
__device__ __forceinline__ void publish(const A (&v)[NCH][2], A* __restrict__ partial, int t, int s, int per, int C)
{
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    if (ty == 0) {
#pragma unroll
        for (int k = 0; k < NCH; ++k) {
            const int c = t * TW + tx * NCH + k;
            if (c < C) { A* p = partial + ((long long)c * per + s) * 2; p[0] = v[k][0]; p[1] = v[k][1]; }
        }
    }
    __threadfence();
    __syncthreads();
}

// Thread (q, k)'s share of channel c's partials (blocks q, q + rq, ... in order, in double): the first step of every
// combine, whichever block runs it.
__device__ __forceinline__ void gather(const A* __restrict__ partial, int c, int C, int per, int q, int rq,
                                       double& a1, double& a2)
{
    double x1 = 0, x2 = 0;
    if (c < C) {
        const A* p = partial + (long long)c * per * 2;
        for (int b = q; b < per; b += rq) { x1 += (double)__ldcg(p + 2 * b); x2 += (double)__ldcg(p + 2 * b + 1); }
    }
    a1 = x1; a2 = x2;
}

// The fixed-order tree over q of the threads' shares (a1, a2) in `sd`, then fin(c, t1, t2) on row q == 0: the
// combine's second step, whichever block runs it.
template <class Fin>
__device__ __forceinline__ void tree_fin(double (*sd)[2], double a1, double a2, int q, int k, int rq, int c, int C,
                                         Fin fin)
{
    sd[threadIdx.x][0] = a1; sd[threadIdx.x][1] = a2;
    __syncthreads();
    for (int h = rq / 2; h > 0; h >>= 1) {
        if (q < h) {
            sd[threadIdx.x][0] += sd[threadIdx.x + h * TW][0];
            sd[threadIdx.x][1] += sd[threadIdx.x + h * TW][1];
        }
        __syncthreads();
    }
    if (q == 0 && c < C) fin(c, sd[k][0], sd[k][1]);
}

#if SYMM
// The symmetric meeting: thread 0 adds the block's arrival, waits (an acquiring poll) for the count to reach `per`,
// and takes its departure ticket (its value is used only at the end); then every block adds the partials as the
// last arriver would -- thread (q, k): channel k, partials q, q + 256 / TW, ... in order, then the fixed tree over q
// -- and calls fin(k) on row q == 0, which keeps the values in shared memory (SYMM_KEEP).  Exact shortcuts, the same
// additions: a one-block tile (per == 1) takes its block sums directly (0 + p in double is p); in NCHW tiles
// (TW == 1) of at most 256 blocks the tree's levels h >= per add zeros (x + 0 is x: no sum here is -0) and are
// skipped, and its levels 16 .. 1 are warp 0's shuffles, lane q < h taking q + h as sd[q] did -- a tile of at most
// 32 blocks meets with no barrier in its tree, one of 33-64 with one (past 256 blocks every level runs).
// The last block to depart resets the counters (every block has passed its wait by then).
template <class Fin>
__device__ __forceinline__ void meet(A (&v)[NCH][2], A* __restrict__ partial, unsigned int* sync, int t, int s,
                                     int per, int C, A (*sm)[TW][2], Fin fin)
{
    __shared__ double sd[256][2];
    block_sum(sm, v);
    const int k = threadIdx.x % TW, q = threadIdx.x / TW, rq = 256 / TW;
    const int c = t * TW + k;
    if (per == 1) {
        if (q == 0 && c < C) fin(c, (double)sm[0][k][0], (double)sm[0][k][1]);
        __syncthreads();
        return;
    }
    publish(v, partial, t, s, per, C);
    unsigned int dep = 0;
    if (threadIdx.x == 0) {
        atomicAdd(sync + 3 * t, 1u);
        for (;;) {  // acquire: the partials published before each arrival are visible after the barrier below
            unsigned int n;
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(n) : "l"(sync + 3 * t) : "memory");
            if (n >= (unsigned int)per) break;
            __nanosleep(32);
        }
        dep = atomicAdd(sync + 3 * t + 2, 1u);      // the departure (after the wait): its value is used at the end
    }
    __syncthreads();
    double a1, a2;
    gather(partial, c, C, per, q, rq, a1, a2);
    if (TW == 1) {
        // levels h >= per add zeros (skipped); the levels from 128 down to 32 that do add go through shared memory
        // (partials past 32 blocks), then warp 0 takes 16 .. 1 by shuffles
        int hp = 1;
        while (hp < per && hp < 256) hp <<= 1;      // (past 256 blocks a thread holds several partials: all levels)
        if (hp > 32) {
            sd[threadIdx.x][0] = a1; sd[threadIdx.x][1] = a2;
            __syncthreads();
            for (int h = hp / 2; h >= 32; h >>= 1) {
                if (q < h) {
                    sd[threadIdx.x][0] += sd[threadIdx.x + h][0];
                    sd[threadIdx.x][1] += sd[threadIdx.x + h][1];
                }
                __syncthreads();
            }
            a1 = sd[threadIdx.x][0]; a2 = sd[threadIdx.x][1];
        }
        if (threadIdx.x < 32) {
#pragma unroll
            for (int h = 16; h > 0; h >>= 1) {
                a1 += __shfl_down_sync(0xffffffffu, a1, h);
                a2 += __shfl_down_sync(0xffffffffu, a2, h);
            }
            if (threadIdx.x == 0 && c < C) fin(c, a1, a2);
        }
    } else {
        tree_fin(sd, a1, a2, q, k, rq, c, C, fin);
    }
    if (threadIdx.x == 0 && dep == (unsigned int)per - 1) { sync[3 * t] = 0u; sync[3 * t + 2] = 0u; }
    __syncthreads();        // fin's SYMM_KEEP before the statistics are read
}

__device__ __forceinline__ void depart(unsigned int*, int, int) {}
#else
// Publish this block's partials of tile t, then meet the tile's other blocks.  The last to arrive adds every
// block's partials in double (thread (q, k): channel k of the tile, partials q, q + 256 / TW, ... in order, then a
// fixed-order tree over q: the same order whichever block is last, so the result is bitwise repeatable), calls
// fin(k, t1, t2) on row q == 0 and raises the tile's flag; the others wait for the flag.  sync[3t..3t+2]: arrivals,
// flag, departures (reset by the last block to leave: see depart()).  All `per` blocks of a tile are resident at
// once (the grid never exceeds the resident blocks), so the wait ends.
template <class Fin>
__device__ __forceinline__ void meet(A (&v)[NCH][2], A* __restrict__ partial, unsigned int* sync, int t, int s,
                                     int per, int C, A (*sm)[TW][2], Fin fin)
{
    __shared__ double sd[256][2];
    __shared__ bool last;
    block_sum(sm, v);
    publish(v, partial, t, s, per, C);
    if (threadIdx.x == 0) last = atomicAdd(sync + 3 * t, 1u) == (unsigned int)per - 1;
    __syncthreads();
    if (last) {
        __threadfence();
        const int k = threadIdx.x % TW, q = threadIdx.x / TW, rq = 256 / TW;
        const int c = t * TW + k;
        double a1, a2;
        gather(partial, c, C, per, q, rq, a1, a2);
        tree_fin(sd, a1, a2, q, k, rq, c, C, fin);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) atomicExch(sync + 3 * t + 1, 1u);
    } else {
        if (threadIdx.x == 0) {
            while (*(volatile unsigned int*)(sync + 3 * t + 1) == 0u) __nanosleep(64);
            __threadfence();
        }
        __syncthreads();
    }
}

// After every thread has read the tile's statistics: the last block of the tile to leave resets its counters
// (every block has passed the wait by then), so the next launch finds them zero.
__device__ __forceinline__ void depart(unsigned int* sync, int t, int per)
{
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(sync + 3 * t + 2, 1u) == (unsigned int)per - 1) {
        sync[3 * t] = 0u; sync[3 * t + 1] = 0u; sync[3 * t + 2] = 0u;
    }
}
#endif

// channel of lane e of the thread's vector (channels-last: consecutive channels; NCHW: the tile's one channel)
#define LANE_CH(e) (INNER1 ? (e) : 0)

""" + _cluster.DX_NHWC_HEADER + r"""

extern "C" __global__ void __launch_bounds__(256, BPS)
bn_fwd1(const T* __restrict__ x, const T* __restrict__ z, T* __restrict__ y, A* __restrict__ partial,
        unsigned int* sync, A* __restrict__ mean_out, A* __restrict__ inv_std_out, const P* __restrict__ scale,
        const P* __restrict__ bias, P* running_mean, P* running_var, long long* counter TWIN_PARAM SHADOW_PARAM,
        const int outer, const int C, const int inner, const int iv, const unsigned int iv_mul,
        const unsigned int iv_shr, const int tiles, const int per, const double factor, const double eps,
        const int has_running, const int has_counter CACHE_PARAM)
{
    __shared__ A sm[RW][TW][2];
    SYMM_DECL
    const int rounds_step = gridDim.x / per, s = blockIdx.x % per;
    for (int t = blockIdx.x / per; t < tiles; t += rounds_step) {
        const Slice sl = slice_of(t, s, per, outer, C, inner, iv);
        const bool valid = !INNER1 || sl.base < C;
        A kshift[NCH], v[NCH][2];
#pragma unroll
        for (int e = 0; e < NCH; ++e) {
            kshift[e] = valid ? LD(x[sl.base + e]) : (A)0;      // shift: the channel's first element
            v[e][0] = 0; v[e][1] = 0;
        }
        auto sums = [&](const long long (&off)[UNROLL], const Pack (&p)[UNROLL]) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (off[u] < 0) continue;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A d = LD(p[u].v[e]) - kshift[LANE_CH(e)];
                    v[LANE_CH(e)][0] += d; v[LANE_CH(e)][1] += d * d;
                }
            }
        };
#if CACHE
        const int n = slice_len(sl), kc = min(ks, n);
        seq_walk<false>(sl, C, inner, iv, iv_mul, iv_shr, valid, 0, n,
                        [&](const long long (&off)[UNROLL], const int (&k)[UNROLL]) {
            Pack p[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {     // (this form, not a one-line if: the PTX run 9 timed)
                if (off[u] < 0) continue;
                p[u] = ld1(x + off[u]);
            }
#if PREFETCH
            if (k[0] >= 0)
                prefetch_range<1>(sl, C, inner, iv, iv_mul, iv_shr, true, k[0] + PREFETCH * UNROLL, UNROLL, x, x, x);
#endif
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (off[u] >= 0 && k[u] < kc) cache_sm[k[u] * 256 + threadIdx.x] = p[u].raw;
            sums(off, p);
        });
#else
        walk(sl, C, inner, iv, iv_mul, iv_shr, valid, [&](const long long (&off)[UNROLL]) {
            Pack p[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) if (off[u] >= 0) p[u] = ld1(x + off[u]);
            sums(off, p);
        });
#endif
#if PREFETCH
        if (t + rounds_step < tiles) {
            const Slice sn = slice_of(t + rounds_step, s, per, outer, C, inner, iv);
            prefetch_range<1>(sn, C, inner, iv, iv_mul, iv_shr, !INNER1 || sn.base < C, 0, PREFETCH * UNROLL,
                              x, x, x);
        }
#endif
        meet(v, partial, sync, t, s, per, C, sm, [&](int c, double t1, double t2) {
#if SYMM
            const int hr_ = has_running;
            const int has_running = hr_ && s == 0;          // the running statistics: one block of the tile
#endif
            BN_FINALISE(c, INNER1 ? (double)outer : (double)outer * inner, x[INNER1 ? c : (long long)c * inner])
            SYMM_KEEP(c, (A)mean, (A)(1.0 / sqrt(var + eps)))
            if (has_counter && c == 0 SYMM_ONCE) counter[0] += 1;     // num_batches_tracked, once per call
        });
        A mu[NCH], kk[NCH], bb[NCH];
#pragma unroll
        for (int e = 0; e < NCH; ++e) {
            const int c = INNER1 ? (int)sl.base + e : t;
            const bool ok = valid && c < C;
            mu[e] = ok ? STAT_LD(mean_out, c, c, 0) : (A)0;
            const A inv = ok ? STAT_LD(inv_std_out, c, c, 1) : (A)0;
            kk[e] = HAS_SCALE && ok ? inv * (A)scale[c] : inv;
            bb[e] = HAS_BIAS && ok ? (A)bias[c] : (A)0;
        }
        depart(sync, t, per);
        auto out = [&](const long long (&off)[UNROLL], const Pack (&p)[UNROLL]) {
            Pack q[UNROLL];
            if (HAS_Z) {
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) if (off[u] >= 0) q[u] = ld2(z + off[u]);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (off[u] < 0) continue;
                Pack o;
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    BN_OUT(o.v[e], p[u].v[e], q[u].v[e], mu[LANE_CH(e)], kk[LANE_CH(e)], bb[LANE_CH(e)])
                st2(y + off[u], o);
#if TWIN_NHWC
                {   // the twin, and its values again at their channels-last offsets (NCHW, one round: plain stores
                    // that merge into whole sectors in L2, as DX_NHWC's)
                    Pack r_;
#pragma unroll
                    for (int e = 0; e < VEC; ++e) r_.v[e] = relu_of_stored(o.v[e]);
                    st2(twin + off[u], r_);
                    const long long d_ = dx_nhwc_of(off[u], t, C, inner, iv, iv_mul, iv_shr);
#pragma unroll
                    for (int e = 0; e < VEC; ++e) shadow[d_ + (long long)e * C] = r_.v[e];
                }
#elif TWIN
                STORE_TWIN(st2, twin + off[u], o);
#endif
            }
        };
#if CACHE
        seq_walk<true>(sl, C, inner, iv, iv_mul, iv_shr, valid, kc, n,
                       [&](const long long (&off)[UNROLL], const int (&)[UNROLL]) {
            Pack p[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) if (off[u] >= 0) p[u] = ld2(x + off[u]);
            out(off, p);
        });
        seq_walk<false>(sl, C, inner, iv, iv_mul, iv_shr, valid, 0, kc,
                        [&](const long long (&off)[UNROLL], const int (&k)[UNROLL]) {
            Pack p[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) if (off[u] >= 0) p[u].raw = cache_sm[k[u] * 256 + threadIdx.x];
            out(off, p);
        });
#else
        walk(sl, C, inner, iv, iv_mul, iv_shr, valid, [&](const long long (&off)[UNROLL]) {
            Pack p[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) if (off[u] >= 0) p[u] = ld2(x + off[u]);
            out(off, p);
        });
#endif
    }
}

// Backward in one launch: per channel sum(g), sum(g * xhat) (g = dy, masked by y > 0 after a fused ReLU), then
// dx = scale * inv_std * (g - mean(g) - xhat * mean(g * xhat)) and dz = g from the same slice read again.
extern "C" __global__ void __launch_bounds__(256, BPS)
bn_bwd1(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y, const A* __restrict__ mean,
        const A* __restrict__ inv_std, A* __restrict__ partial, unsigned int* sync, A* __restrict__ coef,
        P* __restrict__ dscale, P* __restrict__ dbias, const P* __restrict__ scale, T* __restrict__ dx,
        T* __restrict__ dz, const int outer, const int C, const int inner, const int iv, const unsigned int iv_mul,
        const unsigned int iv_shr, const int tiles, const int per CACHE_PARAM)
{
    __shared__ A sm[RW][TW][2];
    SYMM_DECL
    const int rounds_step = gridDim.x / per, s = blockIdx.x % per;
    for (int t = blockIdx.x / per; t < tiles; t += rounds_step) {
        const Slice sl = slice_of(t, s, per, outer, C, inner, iv);
        const bool valid = !INNER1 || sl.base < C;
        A mu[NCH], is[NCH], v[NCH][2];
#pragma unroll
        for (int e = 0; e < NCH; ++e) {
            const int c = INNER1 ? (int)sl.base + e : t;
            mu[e] = valid ? mean[c] : (A)0;
            is[e] = valid ? inv_std[c] : (A)0;
            v[e][0] = 0; v[e][1] = 0;
        }
        // g[u] leaves masked (dy where y > 0 after a fused ReLU): what the on-chip copy keeps
        auto sums = [&](const long long (&off)[UNROLL], const Pack (&p)[UNROLL], Pack (&g)[UNROLL],
                        const Pack (&r)[UNROLL]) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (off[u] < 0) continue;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    A gv = LD(g[u].v[e]);
                    if (RELU && LD(r[u].v[e]) <= (A)0) { gv = 0; g[u].v[e] = ST((A)0); }
                    v[LANE_CH(e)][0] += gv;
                    v[LANE_CH(e)][1] += gv * ((LD(p[u].v[e]) - mu[LANE_CH(e)]) * is[LANE_CH(e)]);
                }
            }
        };
        auto load1 = [&](const long long (&off)[UNROLL], Pack (&p)[UNROLL], Pack (&g)[UNROLL], Pack (&r)[UNROLL]) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (off[u] < 0) continue;
                g[u] = ld1(dy + off[u]); p[u] = ld1(x + off[u]);
                if (RELU) r[u] = ld1(y + off[u]);
            }
        };
#if CACHE
        const int n = slice_len(sl), kc = min(ks, n);
        seq_walk<false>(sl, C, inner, iv, iv_mul, iv_shr, valid, 0, n,
                        [&](const long long (&off)[UNROLL], const int (&k)[UNROLL]) {
            Pack p[UNROLL], g[UNROLL], r[UNROLL];
            load1(off, p, g, r);
#if PREFETCH
            if (k[0] >= 0)
                prefetch_range<RELU ? 3 : 2>(sl, C, inner, iv, iv_mul, iv_shr, true, k[0] + PREFETCH * UNROLL,
                                             UNROLL, dy, x, y);
#endif
            sums(off, p, g, r);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (off[u] < 0 || k[u] >= kc) continue;
                cache_sm[(2 * k[u]) * 256 + threadIdx.x] = p[u].raw;
                cache_sm[(2 * k[u] + 1) * 256 + threadIdx.x] = g[u].raw;
            }
        });
#else
        walk(sl, C, inner, iv, iv_mul, iv_shr, valid, [&](const long long (&off)[UNROLL]) {
            Pack p[UNROLL], g[UNROLL], r[UNROLL];
            load1(off, p, g, r);
            sums(off, p, g, r);
        });
#endif
#if PREFETCH
        if (t + rounds_step < tiles) {
            const Slice sn = slice_of(t + rounds_step, s, per, outer, C, inner, iv);
            prefetch_range<RELU ? 3 : 2>(sn, C, inner, iv, iv_mul, iv_shr, !INNER1 || sn.base < C, 0,
                                         PREFETCH * UNROLL, dy, x, y);
        }
#endif
        meet(v, partial, sync, t, s, per, C, sm, [&](int c, double t1, double t2) {
            const double m = INNER1 ? (double)outer : (double)outer * inner;
            coef[2 * c] = (A)(t1 / m); coef[2 * c + 1] = (A)(t2 / m);
            SYMM_KEEP(c, (A)(t1 / m), (A)(t2 / m))
#if HAS_SCALE
            dbias[c] = (P)t1; dscale[c] = (P)t2;
#endif
        });
        A c0[NCH], c1[NCH], kk[NCH];
#pragma unroll
        for (int e = 0; e < NCH; ++e) {
            const int c = INNER1 ? (int)sl.base + e : t;
            const bool ok = valid && c < C;
            c0[e] = ok ? STAT_LD(coef, 2 * c, c, 0) : (A)0;
            c1[e] = ok ? STAT_LD(coef, 2 * c + 1, c, 1) : (A)0;
            kk[e] = HAS_SCALE && ok ? is[e] * (A)scale[c] : is[e];
        }
        depart(sync, t, per);
        // mask: g = dy masked by y > 0 here (read from memory); else g is masked already (the on-chip copy)
        auto out = [&](const long long (&off)[UNROLL], const Pack (&p)[UNROLL], const Pack (&g)[UNROLL],
                       const Pack (&r)[UNROLL], bool mask) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (off[u] < 0) continue;
                Pack o, oz;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    A gv = LD(g[u].v[e]);
                    if (RELU && mask && LD(r[u].v[e]) <= (A)0) gv = 0;
                    const int ch = LANE_CH(e);
                    const A xhat = (LD(p[u].v[e]) - mu[ch]) * is[ch];
                    o.v[e] = ST(kk[ch] * (gv - c0[ch] - xhat * c1[ch]));
                    if (HAS_Z) oz.v[e] = ST(gv);
                }
#if DX_NHWC
                const long long d = dx_nhwc_of(off[u], t, C, inner, iv, iv_mul, iv_shr);
#pragma unroll
                for (int e = 0; e < VEC; ++e) dx[d + (long long)e * C] = o.v[e];
#else
                st2(dx + off[u], o);
#endif
                if (HAS_Z) st2(dz + off[u], oz);
            }
        };
        auto load2 = [&](const long long (&off)[UNROLL], Pack (&p)[UNROLL], Pack (&g)[UNROLL], Pack (&r)[UNROLL]) {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (off[u] < 0) continue;
                g[u] = ld2(dy + off[u]); p[u] = ld2(x + off[u]);
                if (RELU) r[u] = ld2(y + off[u]);
            }
        };
#if CACHE
        seq_walk<true>(sl, C, inner, iv, iv_mul, iv_shr, valid, kc, n,
                       [&](const long long (&off)[UNROLL], const int (&)[UNROLL]) {
            Pack p[UNROLL], g[UNROLL], r[UNROLL];
            load2(off, p, g, r);
            out(off, p, g, r, true);
        });
        seq_walk<false>(sl, C, inner, iv, iv_mul, iv_shr, valid, 0, kc,
                        [&](const long long (&off)[UNROLL], const int (&k)[UNROLL]) {
            Pack p[UNROLL], g[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (off[u] < 0) continue;
                p[u].raw = cache_sm[(2 * k[u]) * 256 + threadIdx.x];
                g[u].raw = cache_sm[(2 * k[u] + 1) * 256 + threadIdx.x];
            }
            out(off, p, g, g, false);
        });
#else
        walk(sl, C, inner, iv, iv_mul, iv_shr, valid, [&](const long long (&off)[UNROLL]) {
            Pack p[UNROLL], g[UNROLL], r[UNROLL];
            load2(off, p, g, r);
            out(off, p, g, r, true);
        });
#endif
    }
}
"""

_INT_MAX = 2 ** 31 - 1
_tickets: dict = {}


def _options(dtype, inner1, **flags):
    scalar, accum, storage, pdt = type_info(dtype)
    opts = [f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}",
            f"-DPARAM={'double' if pdt == np.float64 else 'float'}", f"-DINNER1={int(inner1)}", "-std=c++17"]
    for name in ("RELU", "HAS_Z", "HAS_SCALE", "HAS_BIAS", "FROM_VAR", "CACHE"):
        opts.append(f"-D{name}={int(bool(flags.get(name.lower(), False)))}")
    if flags.get("twin"):           # bn_nhwc.TWIN_HEADER: absent unless the call asks for relu(y) too
        opts.append("-DTWIN=1")
    if flags.get("dx_nhwc"):        # bn_bwd1 writing dx in channels-last memory (absent: the plain kernel's PTX)
        opts.append("-DDX_NHWC=1")
    if flags.get("twin_nhwc"):      # bn_fwd1's twin's channels-last shadow (bn_cluster.SHADOW_HEADER; absent: TWIN's)
        opts.append("-DTWIN_NHWC=1")
    return tuple(opts)


def _onepass_options(dtype, inner1, vec, tpr, **flags):
    """NVRTC options of the one-pass kernels: the data/flag defines of ``_options`` plus the vector width, the
    threads per channels-last row, the unroll (vectors in flight per thread and array) and the blocks per SM."""
    pf = (f"-DPREFETCH={ONEPASS_PREFETCH}",) if ONEPASS_PREFETCH else ()    # absent when off: the PTX as before
    sy = ("-DSYMM=1",) if ONEPASS_SYMM else ()
    return _options(dtype, inner1, **flags) + (f"-DVEC={vec}", f"-DTPR={tpr}", f"-DUNROLL={ONEPASS_UNROLL}",
                                               f"-DBPS={ONEPASS_BPS}") + pf + sy


_dividers: dict = {}


def _divider(d):
    """(mul, shift) of the device's fast_div for divisor d >= 1 (exact for numerators below 2**31), cached."""
    r = _dividers.get(d)
    if r is None:
        r = _dividers[d] = _make_divider(d)
    return r


def _make_divider(d):
    d = int(d)
    shift = max(0, (d - 1).bit_length())
    mul = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return np.uint32(mul & 0xFFFFFFFF), np.uint32(shift)


_kernel_cache: dict = {}


def _kernel(name, dtype, inner1, **flags):
    key = (name, dtype, inner1, tuple(sorted(flags.items())))
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _kernel_compiled(name, dtype, inner1, **flags)
    return k


def _kernel1(name, dtype, inner1, vec, tpr, **flags):
    key = (name, dtype, inner1, vec, tpr, ONEPASS_BPS, ONEPASS_PREFETCH, ONEPASS_SYMM, tuple(sorted(flags.items())))
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _launch.get_kernel(ONEPASS_SOURCE, name,
                                                    _onepass_options(dtype, inner1, vec, tpr, **flags))
    return k


def _kernel_compiled(name, dtype, inner1, **flags):
    return _launch.get_kernel(SOURCE, name, _options(dtype, inner1, **flags))


def layout_of(xc):
    """(outer, C, inner, contiguous memory view) of a channels-first CuPy view ``xc``, or None when its memory is
    neither channels-first nor channels-last contiguous."""
    c = xc.shape[1]
    if xc.flags.c_contiguous:
        inner = math.prod(xc.shape[2:])
        return (xc.shape[0], c, inner, xc)
    if xc.ndim >= 3:
        perm = (0, *range(2, xc.ndim), 1)
        cl = xc.transpose(perm)
        if cl.flags.c_contiguous:
            return (xc.size // c if c else 0, c, 1, cl)
    return None


def _empty_like_layout(cp, xc, dtype=None):
    """An uninitialised channels-first view laid out in memory like ``xc`` (channels-first or channels-last)."""
    dtype = dtype or xc.dtype
    if xc.flags.c_contiguous or xc.ndim < 3:
        return cp.empty(xc.shape, dtype=dtype)
    perm = (0, *range(2, xc.ndim), 1)
    back = (0, xc.ndim - 1, *range(1, xc.ndim - 1))
    return cp.empty(tuple(xc.shape[i] for i in perm), dtype=dtype).transpose(back)


def _mem(a):
    """The contiguous memory view of a channels-first array laid out as layout_of found it."""
    return a if a.flags.c_contiguous else a.transpose((0, *range(2, a.ndim), 1))


def _vec_ok(p, c, dtype):
    return p is None or (p.size == c and p.dtype == dtype and p.flags.c_contiguous)


def supports(xc, *params, others=()) -> bool:
    """True where the kernels take this call: float32/float64 CuPy x with at least one value per channel, laid out
    channels-first or channels-last contiguously, parameters (C,) (or (1, C, 1, 1)) contiguous in x's dtype,
    ``others`` (dy, y, z) in x's layout, and fewer than 2**31 elements."""
    if not _dev.is_cuda_array(xc) or type_info(xc.dtype) is None or xc.size == 0 or xc.size > _INT_MAX:
        return False
    lay = layout_of(xc)
    if lay is None:
        return False
    c = xc.shape[1]
    if lay[2] > 1 and c > 65535:       # one grid row (gridDim.y) per channel
        return False
    if not all(_vec_ok(p, c, param_dtype(xc.dtype)) for p in params):
        return False
    for o in others:
        if o is None:
            continue
        if tuple(o.shape) != tuple(xc.shape) or o.dtype != xc.dtype or layout_of(o) is None \
                or _mem(o).shape != lay[3].shape or not _mem(o).flags.c_contiguous:
            return False
    return True


def _ticket(cp, n, dev):
    return _ws.kept_zeroed(_tickets, cp, n, dev, 1024)


_grids: dict = {}


def _reduce_grid(outer, c, inner, inner1, dev_id):
    key = (outer, c, inner, dev_id)
    g = _grids.get(key)
    if g is None:
        g = _grids[key] = _make_reduce_grid(outer, c, inner, inner1, dev_id)
    return g


def _make_reduce_grid(outer, c, inner, inner1, dev_id):
    tiles = (c + 31) // 32 if inner1 else c
    ry = 8 if inner1 else THREADS
    rows = outer if inner1 else outer * inner
    # blocks: ~8 per SM for the channel-first kernels; ~2 per SM channels-last, where a tile holds 32 channels and
    # the last block's sum over the splits grows with their number
    want = max(1, (_launch.sm_count(dev_id) * (2 if inner1 else 8) + tiles - 1) // tiles)
    splits = max(1, min(want, (rows + ry * 8 - 1) // (ry * 8), 65535))
    return splits, tiles


def _elementwise_grid(n, dev_id):
    return max(1, min((n + THREADS * 4 - 1) // (THREADS * 4), _launch.sm_count(dev_id) * 8))


def _p(a, fallback):
    return fallback if a is None else a


# ---- the launches --------------------------------------------------------------------------------------------
# Everything but the arrays -- geometry, grid, kernels, the packed scalar arguments -- is settled once per call
# signature and kept (``_plans``, bounded): a repeated call allocates its outputs and makes two prepared launches
# (host cost: docs/host_overhead.md).
_plans: dict = {}


def _planned(key, build, *args):
    return _launch.planned(_plans, key, build, *args)


def _stats_plan(xc, outer, c, inner, factor, eps, has_running, has_counter, dev):
    inner1 = inner == 1
    splits, tiles = _reduce_grid(outer, c, inner, inner1, dev)
    stats = _launch.prepare(_kernel("bn_stats", xc.dtype, inner1), (splits, tiles), (THREADS,),
                            [None] * 8 + [np.int32(outer), np.int32(c), np.int32(inner), *_divider(inner),
                                          np.float64(factor), np.float64(eps), np.int32(has_running),
                                          np.int32(has_counter)])
    return stats, c * splits * 2, tiles, acc_dtype(xc.dtype)


def _apply_plan(xc, outer, c, inner, relu, has_z, has_scale, has_bias, eps, from_var, dev):
    n = xc.size
    k = _kernel("bn_apply", xc.dtype, inner == 1, relu=relu, has_z=has_z, has_scale=has_scale,
                has_bias=has_bias, from_var=from_var)
    return _launch.prepare(k, (_elementwise_grid(n, dev),), (THREADS,),
                           [None] * 7 + [np.int64(n), np.int32(c), np.int32(inner), *_divider(c), *_divider(inner),
                                         np.float64(eps)])


# ---- the one-pass launches ------------------------------------------------------------------------------------
# MINIDNN_BN_ONEPASS=0 switches them off (the two-launch kernels above then run: for comparison or debugging).
ONEPASS = os.environ.get("MINIDNN_BN_ONEPASS", "1") != "0"
# Share of L2 the data of one round of tiles may take (x, or x, dy and y backward), so the second read of a slice
# finds it there; the outputs are written with streaming stores and stay out of the way.
_ROUND_SHARE = 0.5
# With the on-chip copy (ONCHIP, MINIDNN_BN_ONCHIP: default on; NCHW): a round takes the grid's shared memory plus
# this share of L2 (MINIDNN_BN_L2_SHARE), which the elementwise pass re-reads newest first.  Measured on an H100
# (tools/bn_onchip_bench.py, (128, 64, 56, 56)): half of L2 beat 0.3 on every NCHW row (float32 forward 68 -> 74% of
# copy in 2 rounds instead of 3, backward 67 -> 71% in 4 instead of 5; bfloat16 66 -> 70%, 63 -> 67%) and 1.5 (one
# round, past L2: 67% / 64%); small tensors (one round at any share) did not move.  The paper case for less (the
# round's streaming outputs pass through L2, two 25 MB halves) lost to the fewer meetings.
ONCHIP = os.environ.get("MINIDNN_BN_ONCHIP", "1") != "0"
_ROUND_SHARE_ONCHIP = float(os.environ.get("MINIDNN_BN_L2_SHARE", "0.5"))
# The backward's share of L2 (MINIDNN_BN_L2_SHARE_BWD; None: _ROUND_SHARE_ONCHIP).  Its round holds x and dy where
# the forward's holds x, so at one share it takes twice the rounds of a forward (float32 (128, 64, 56, 56): 4 of 16
# channels, 256 of the 264 resident blocks); about 0.85 gives it 3 rounds over the whole grid (264), 1.5 two
# (measured 0.161 ms against 0.147 at 0.5).  tools/bn_onchip_bench.py --bwd-shares times others.
_ROUND_SHARE_ONCHIP_BWD = float(os.environ["MINIDNN_BN_L2_SHARE_BWD"]) if os.environ.get("MINIDNN_BN_L2_SHARE_BWD") \
    else None
_L2_DEFAULT = 50 * 2 ** 20


def _l2_bytes(dev):
    """GPU ``dev``'s L2 bytes (device_facts' cache); an H100's where the device does not say, so the rounds still
    split as they would there."""
    return _facts.l2_info(dev)[0] or _L2_DEFAULT


def _aligned(*arrays):
    """Whether every array's memory starts on a 16-byte boundary (the one-pass kernels' vectors need it)."""
    for a in arrays:
        if a is not None and a.data.ptr & 15:
            return False
    return True


def _onchip_share(backward):
    """The share of L2 a round of the on-chip copy's launch takes beside shared memory (forward or backward)."""
    if backward and _ROUND_SHARE_ONCHIP_BWD is not None:
        return _ROUND_SHARE_ONCHIP_BWD
    return _ROUND_SHARE_ONCHIP


def onepass_geometry(outer, c, inner, itemsize, arrays, aligned, sm_count, l2_bytes, blocks_per_sm=None,
                     cache_block_bytes=0, share=None):
    """(vec, tpr, tiles, per, grid) of a one-pass launch: the vector width (16 bytes of values, or 1 where rows or
    planes do not fill vectors or a pointer is misaligned), the threads side by side over a channels-last row, the
    channel tiles, the blocks per tile and the grid (rounds of grid / per tiles, at most the resident blocks).
    ``arrays``: the full-size arrays read twice (1 forward, 3 backward: the same for the plain and the fused
    forms, so their sums are split the same way and round alike; 2 backward with the on-chip copy, which keeps x
    and the masked g).  ``cache_block_bytes``: the on-chip copy's shared memory per block (NCHW): a round may
    then take that much per resident block plus ``share`` of L2 (None: _ROUND_SHARE_ONCHIP), the rounds balanced
    (equal tiles)."""
    bps = ONEPASS_BPS if blocks_per_sm is None else blocks_per_sm
    resident = max(1, sm_count * bps)
    vec = 16 // itemsize
    inner1 = inner == 1
    if not aligned or (c if inner1 else inner) % vec:
        vec = 1
    onchip = cache_block_bytes > 0
    if share is None:
        share = _ROUND_SHARE_ONCHIP
    budget = l2_bytes * share + resident * cache_block_bytes if onchip else l2_bytes * _ROUND_SHARE
    if inner1:
        # the widest tile (up to 32 threads per row and no wider than the channels) whose data fits the budget,
        # and at least a 32-byte sector of each row (narrower, the neighbouring tile fetches the same sectors again)
        tpr = 1
        while tpr < 32 and tpr * vec < c and (tpr * vec * itemsize < 32
                                              or outer * 2 * tpr * vec * itemsize * arrays <= budget):
            tpr *= 2
        tw = tpr * vec
        tiles = -(-c // tw)
        values = outer * tw
        vectors = outer                 # rows: one vector per thread and row
        min_per_block = THREADS // tpr * ONEPASS_UNROLL * 2
    else:
        tpr, tiles, values = 1, c, outer * inner
        vectors = values // vec
        min_per_block = THREADS * ONEPASS_UNROLL * 2
    rounds_of = max(1, min(tiles, resident, int(budget // max(1, values * itemsize * arrays))))
    if onchip:
        rounds_of = -(-tiles // -(-tiles // rounds_of))
    per = max(1, min(resident // rounds_of, -(-vectors // min_per_block)))
    return vec, tpr, tiles, per, rounds_of * per


def onchip_slots(outer, inner, vec, per, ks_max):
    """Slots per thread of the on-chip copy (NCHW): the vectors a thread visits in its slice (the longest slice's
    vectors over 256 threads), at most ``ks_max``."""
    longest = -(-outer * (inner // vec) // per)        # vectors of the longest slice
    return max(0, min(ks_max, -(-longest // THREADS)))


def onepass_routes(inner, tiles, per, grid):
    """Whether a call of this one-pass geometry takes the one-pass kernels (else the two-launch ones run).
    Channels-last only where one round holds every tile: a round then reads whole rows, contiguous memory.  Where
    the L2 share splits the channels over rounds, each round reads a 32-64-byte piece of every row (e.g. 16 of 64
    float channels: 64 bytes of each 256-byte row, 4 rounds) and the backward's round outgrows the share (its
    second read misses L2); measured on an H200 (docs/step_kernels.md) that ran 1.25x (forward) to 2.9x (backward)
    slower than the two-launch kernels, which read whole rows.  NCHW tiles are contiguous channels: always.
    (Channels-last rounds with the on-chip copy lost too: 0.43-0.75x of bn_nhwc's one round, session 6, H100.)"""
    return inner != 1 or grid // per >= tiles


def _resident_per_sm(kernel, shared_mem=0):
    """Blocks of ``kernel`` one SM holds at once with ``shared_mem`` bytes of dynamic shared memory (the driver's
    occupancy), capped at ONEPASS_BPS; ONEPASS_BPS where the query is unavailable (the launch bounds promise it)."""
    try:
        if shared_mem:
            _launch._opt_in(kernel, shared_mem)
        occ = _launch.cupy().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, THREADS,
                                                                                   int(shared_mem))
        return max(0, min(ONEPASS_BPS, int(occ)))
    except Exception:       # noqa: BLE001 -- an old CuPy or a fake one: the launch bounds' promise
        return ONEPASS_BPS


def _onchip_slot_max(name, vec, item, smem_limits, static):
    """(bytes of one slot, the most slots a block keeps) of the on-chip copy: slots of 256 vectors of each cached
    array (x forward; x and g backward) in what the SM's shared memory holds for ONEPASS_BPS blocks."""
    slot = THREADS * vec * item * (1 if name == "bn_fwd1" else 2)
    ks_max = _nhwc.cache_slots(*smem_limits, static, ONEPASS_BPS, slot)
    return slot, (ks_max if _nhwc.SLOTS_CAP is None else min(ks_max, _nhwc.SLOTS_CAP))


def onepass_plan(outer, c, inner, itemsize, backward, dev=None, sm_count=132, l2_bytes=50 * 2 ** 20,
                 smem_limits=(233472, 232448), static=8192 + 16):
    """What _onepass_launch settles for an aligned NCHW call, assuming the driver keeps ONEPASS_BPS blocks per SM:
    dict(vec, tiles, per, grid, rounds, ks, dyn).  ``dev``: that GPU's SMs, L2 and shared memory (else an H100's);
    for the tools and tests (the launch itself also asks the driver for occupancy and the kernel's static memory)."""
    if dev is not None:
        sm_count, l2_bytes, smem_limits = _launch.sm_count(dev), _l2_bytes(dev), _facts.smem_limits(dev)
    name = "bn_bwd1" if backward else "bn_fwd1"
    arrays = (2 if ONCHIP else 3) if backward else 1
    vec, tpr, tiles, per, grid = onepass_geometry(outer, c, inner, itemsize, arrays, True, sm_count, l2_bytes)
    ks = dyn = 0
    if ONCHIP and inner != 1:
        slot, ks_max = _onchip_slot_max(name, vec, itemsize, smem_limits, static)
        if ks_max:
            vec, tpr, tiles, per, grid = onepass_geometry(outer, c, inner, itemsize, arrays, True, sm_count,
                                                          l2_bytes, cache_block_bytes=ks_max * slot,
                                                          share=_onchip_share(backward))
            ks = onchip_slots(outer, inner, vec, per, ks_max)
            dyn = ks * slot
    return dict(vec=vec, tiles=tiles, per=per, grid=grid, rounds=-(-tiles // (grid // per)), ks=ks, dyn=dyn)


def _onepass_launch(name, xc, outer, c, inner, arrays, aligned, dev, flags, n_arrays, tail=()):
    item = xc.dtype.itemsize
    inner1 = inner == 1
    onchip = ONCHIP and not inner1
    sms, l2 = _launch.sm_count(dev), _l2_bytes(dev)
    vec, tpr, tiles, per, grid = onepass_geometry(outer, c, inner, item, arrays, aligned, sms, l2)
    k = _kernel1(name, xc.dtype, inner1, vec, tpr, cache=onchip, **flags)
    ks = dyn = 0
    if onchip:
        slot, ks_max = _onchip_slot_max(name, vec, item, _facts.smem_limits(dev), _nhwc.static_smem(k, 8192 + 16))
        if ks_max and _resident_per_sm(k, ks_max * slot) >= ONEPASS_BPS:
            vec, tpr, tiles, per, grid = onepass_geometry(outer, c, inner, item, arrays, aligned, sms, l2,
                                                          cache_block_bytes=ks_max * slot,
                                                          share=_onchip_share(name == "bn_bwd1"))
            ks = onchip_slots(outer, inner, vec, per, ks_max)
            dyn = ks * slot
    bps = _resident_per_sm(k, dyn)
    if bps < 1:
        return None
    if bps < ONEPASS_BPS:
        ks = dyn = 0
        vec, tpr, tiles, per, grid = onepass_geometry(outer, c, inner, item, arrays, aligned, sms, l2, bps)
        k = _kernel1(name, xc.dtype, inner1, vec, tpr, cache=onchip, **flags)
    if not onepass_routes(inner, tiles, per, grid):
        return None
    if (flags.get("dx_nhwc") or flags.get("twin_nhwc")) and (inner1 or grid // per < tiles or xc.size >= 2 ** 31):
        return None         # dx's channels-last stores merge in L2 only when one round writes every channel
    iv = inner // vec if not inner1 else 1
    geo = [np.int32(outer), np.int32(c), np.int32(inner), np.int32(iv), *_divider(iv), np.int32(tiles),
           np.int32(per)]
    args = [None] * n_arrays + geo + list(tail) + ([np.int32(ks)] if onchip else [])
    return _launch.prepare(k, (grid,), (THREADS,), args, shared_mem=dyn), c * per * 2, 3 * tiles


def _fwd1_plan(xc, outer, c, inner, factor, eps, has_running, has_counter, relu, has_z, has_scale, has_bias,
               aligned, dev, twin=False, twin_nhwc=False):
    """(prepared launch, partial elements, sync counters, A) of the one-launch forward (bn_fwdc or bn_fwd1), or None.
    ``twin``: the same route's TWIN kernel (one more array: relu(y)), None where that is not the plain plan's launch
    with one more store (bn_nhwc.same_launch); ``twin_nhwc`` (with twin): that kernel built with TWIN_NHWC (the
    twin's channels-last shadow too, the last array), None where it would not run in one round (NCHW only)."""
    if aligned and inner != 1 and _cluster.usable(dev):       # a channel on-chip in one cluster (bn_cluster.py)
        k = _cluster.prepare_forward(xc, outer, c, inner, factor, eps, has_running, has_counter, relu, has_z,
                                     has_scale, has_bias, _divider, dev, twin)
        if k is not None and twin_nhwc:     # (the TWIN kernel is compiled already: the twin call settled first)
            k = _cluster.prepare_forward(xc, outer, c, inner, factor, eps, has_running, has_counter, relu, has_z,
                                         has_scale, has_bias, _divider, dev, twin, True)
            return None if k is None else (k, 2, 1, acc_dtype(xc.dtype))
        if k is not None:
            return k, 2, 1, acc_dtype(xc.dtype)
    flags = dict(relu=relu, has_z=has_z, has_scale=has_scale, has_bias=has_bias)
    if twin:
        flags["twin"] = True
    if twin_nhwc:
        flags["twin_nhwc"] = True
    r = _onepass_launch("bn_fwd1", xc, outer, c, inner, 1, aligned, dev, flags, (13 if twin else 12) + twin_nhwc,
                        (np.float64(factor), np.float64(eps), np.int32(has_running), np.int32(has_counter)))
    return None if r is None else (*r, acc_dtype(xc.dtype))


def _bwd1_plan(xc, outer, c, inner, relu, has_scale, want_dz, aligned, dev, dx_nhwc=False):
    """(prepared launch, partial elements, sync counters, P) of the one-launch backward (bn_bwdc or bn_bwd1), or
    None.  ``dx_nhwc``: the route's kernel built with DX_NHWC (dx in channels-last memory) -- bn_bwdc where the
    clusters take the plain call, else bn_bwd1 -- None where there is none (the cluster variant switched off,
    bn_bwd1 in more than one round; the caller also checks it is the plain plan's launch: _dx_nhwc_call)."""
    if aligned and inner != 1 and _cluster.usable(dev):
        k = _cluster.prepare_backward(xc, outer, c, inner, relu, has_scale, want_dz, _divider, dev)
        if k is not None and dx_nhwc:       # (the plain kernel is compiled already: the plain call settled first)
            k = _cluster.prepare_backward(xc, outer, c, inner, relu, has_scale, want_dz, _divider, dev, dx_nhwc=True)
            return None if k is None else (k, 2, 1, param_dtype(xc.dtype))
        if k is not None:
            return k, 2, 1, param_dtype(xc.dtype)
    flags = dict(relu=relu, has_z=want_dz, has_scale=has_scale)
    if dx_nhwc:
        flags["dx_nhwc"] = True
    r = _onepass_launch("bn_bwd1", xc, outer, c, inner, 2 if ONCHIP and inner != 1 else 3, aligned,
                        dev, flags, 13)
    return None if r is None else (*r, param_dtype(xc.dtype))


def forward_training(xc, scale, bias, factor, running_mean, running_var, eps, z=None, relu=False, counter=None):
    """(y channels-first view in xc's layout, saved mean (C,), saved inv_std (C,)); running stats updated in place,
    and ``counter`` (a one-element int64 array, or None) incremented by the same launch."""
    return training_call(xc, scale, bias, factor, running_mean, running_var, eps, z, relu, counter)(
        xc, z, scale, bias, running_mean, running_var, counter)


# ---- settled calls ---------------------------------------------------------------------------------------------
# A call's whole host side -- which route (one-pass or two-launch), its prepared launches, the scratch sizes, the
# output's memory order -- settled once per call signature (``_calls``, bounded) into one object that a repeated
# call runs directly: forward_training and backward go through it, and nn's remembered batch-norm calls
# (nn/_functions/norm.py, docs/host_overhead.md round 14) hold it and call it without the lookups above it.  The
# launches take the channels-first views themselves: a view and its memory-order transpose share one pointer, and
# a prepared launch reads only ``a.data.ptr``.  The object checks what may change between two calls of one
# signature -- the MINIDNN_BN_ONEPASS switch (``ONEPASS``, tests flip it) and, for the one-pass kernels, the
# 16-byte alignment of the inputs -- and returns None where either differs (the caller then takes the full path).
_calls: dict = {}


def _switches():
    """The module switches a settled call depends on (tests and tools flip them at run time)."""
    return ONEPASS, ONCHIP, _cluster.ENABLED, _cluster.FORCE_CL, _cluster.NT, _cluster.CLUSTERS_CAP, \
        ONEPASS_BPS, ONEPASS_PREFETCH, ONEPASS_SYMM, _ROUND_SHARE_ONCHIP, _ROUND_SHARE_ONCHIP_BWD


def set_onepass(bps=None, prefetch=None, symm=None, shares=None):
    """Set the one-pass kernels' blocks per SM, L2 prefetch distance, symmetric meeting and the rounds' L2 shares
    (``shares``: (forward, backward or None for the forward's), MINIDNN_BN_L2_SHARE / _BWD) (None: keep) for an
    in-process A/B.  Settled calls made under other values see the change through _switches() and settle again; the
    plans are dropped too."""
    global ONEPASS_BPS, ONEPASS_PREFETCH, ONEPASS_SYMM, _ROUND_SHARE_ONCHIP, _ROUND_SHARE_ONCHIP_BWD
    for name, v, lo, hi in (("bps", bps, 1, 4), ("prefetch", prefetch, 0, 8), ("symm", symm, 0, 1)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi):
            raise ValueError(f"set_onepass: {name}={v!r}, expected an integer in [{lo}, {hi}]")
    if shares is not None and not (
            isinstance(shares, tuple) and len(shares) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                    for v in (shares[0],) + ((shares[1],) if shares[1] is not None else ()))):
        raise ValueError(f"set_onepass: shares={shares!r}, expected (forward, backward or None), each > 0")
    if bps is not None:
        ONEPASS_BPS = int(bps)
    if prefetch is not None:
        ONEPASS_PREFETCH = int(prefetch)
    if symm is not None:
        ONEPASS_SYMM = int(symm)
    if shares is not None:
        _ROUND_SHARE_ONCHIP = float(shares[0])
        _ROUND_SHARE_ONCHIP_BWD = None if shares[1] is None else float(shares[1])
    _calls.clear()
    _plans.clear()


def _rows_to_nhwc():
    """Whether (R, C) rows go to bn_nhwc (MINIDNN_BN_NHWC)."""
    return _nhwc.ENABLED


def _memory_order(xc):
    """(shape of the memory, the transpose back to channels-first or None) of an array laid out like ``xc``."""
    if xc.flags.c_contiguous or xc.ndim < 3:
        return xc.shape, None
    perm = (0, *range(2, xc.ndim), 1)
    return tuple(xc.shape[i] for i in perm), (0, xc.ndim - 1, *range(1, xc.ndim - 1))


class _TrainingCall:
    """forward_training settled: ``call(xc, z, scale, bias, running_mean, running_var, counter)`` -> (y, mean,
    inv_std), or None where ONEPASS or the inputs' alignment is not what it was settled for, or where bn_nhwc has
    been switched on since (``rows``: an (R, C)-row call, which bn_nhwc takes when on)."""
    __slots__ = ("onepass", "aligned", "dev", "c", "dtype", "mem", "back", "acc", "n_partial", "n_sync", "launch1",
                 "stats", "apply", "rows", "twin", "shadow")

    def __call__(self, xc, z, scale, bias, running_mean, running_var, counter):
        if self.onepass != _switches() or (self.rows and _rows_to_nhwc()) \
                or (self.aligned is not None and _aligned(xc, z) is not self.aligned):
            return None
        cp, dev, acc = _launch.cupy(), self.dev, self.acc
        if self.shadow is not None and _ws.eager_stream(cp) is None:      # twin_nhwc_call's: not while capturing
            return None
        with _launch.on_device(dev):
            mean, inv_std = _ws.fresh_pair(cp, dev, "bn.stats", (self.c,), acc)
            partial = _ws.scratch_flat(cp, dev, "bn.partial", self.n_partial, acc)
            if self.launch1 is not None:
                y = _ws.fresh(cp, dev, "bn.y", self.mem, self.dtype)
                twin = (_ws.fresh(cp, dev, "bn.twin", self.mem, self.dtype),) if self.twin else ()   # twin_call's
                if self.shadow is not None:     # twin_nhwc_call's: the twin's channels-last shadow too
                    twin += (_ws.fresh(cp, dev, "bn.shadow", self.shadow[0], self.dtype),)
                self.launch1(xc, z, y, partial, _ticket(cp, self.n_sync, dev), mean, inv_std, scale, bias,
                             running_mean, running_var, counter, *twin)
                if len(twin) == 2:  # (the shadow: only for an NCHW x, whose y and twin are channels-first)
                    return y, mean, inv_std, twin[0], twin[1].transpose(self.shadow[1])
                if twin:            # relu(y) too, laid out as y
                    back = self.back
                    return (y, mean, inv_std, twin[0]) if back is None else \
                        (y.transpose(back), mean, inv_std, twin[0].transpose(back))
            else:
                # dummies for absent running statistics (never touched), float32/64
                self.stats(xc, partial, _ticket(cp, self.n_sync, dev), mean, inv_std, _p(running_mean, inv_std),
                           _p(running_var, inv_std), _p(counter, inv_std))
                y = _ws.fresh(cp, dev, "bn.y", self.mem, self.dtype)
                self.apply(xc, xc if z is None else z, y, mean, inv_std, _p(scale, xc), _p(bias, xc))
        return (y if self.back is None else y.transpose(self.back)), mean, inv_std


def training_call(xc, scale, bias, factor, running_mean, running_var, eps, z=None, relu=False, counter=None):
    """The settled call of ``forward_training`` with these arguments (see _TrainingCall), made once per signature."""
    dev = xc.data.device_id
    flags = (factor, eps, running_mean is not None, counter is not None, relu, z is not None, scale is not None,
             bias is not None)
    key = ("train", _switches(), _aligned(xc, z), xc.shape, xc.strides, xc.dtype, dev) + flags + _nhwc.switch()
    call = _calls.get(key)
    if call is None:
        call = _launch.planned(_calls, key, _training_call, xc, dev, key[2], *flags)
    return call


def twin_call(xc, scale, bias, factor, running_mean, running_var, eps, counter=None):
    """training_call's twin (no z, no fused ReLU): called as it, it returns (y, mean, inv_std, relu(y)), relu(y) laid
    out as y, with the bits the ReLU kernel would write from y (TWIN_HEADER) -- or None, nothing launched, where the
    plain call would (the same protocol).  False where this signature's route has no twin: the plain call's own
    one-launch kernel (bn_fwdc, bn_fwd1, bn_nhwc's bnc_fwd1) with one more store, the same grid and arguments, so
    y, the statistics and the running statistics are the plain call's bits."""
    dev = xc.data.device_id
    flags = (factor, eps, running_mean is not None, counter is not None, False, False, scale is not None,
             bias is not None)
    key = ("twin", _switches(), _aligned(xc, None), xc.shape, xc.strides, xc.dtype, dev) + flags + _nhwc.switch()
    call = _calls.get(key)
    if call is None:
        call = _launch.planned(_calls, key, _twin_call, xc, dev, key[2], flags,
                               training_call(xc, scale, bias, factor, running_mean, running_var, eps, None, False,
                                             counter))
    return call


def _twin_call(xc, dev, aligned, flags, plain):
    if isinstance(plain, _nhwc.TrainingCall):       # (R, C) rows: bn_nhwc's call with the twin, per alignment
        return _nhwc.training_call(xc, *flags[:4], False, False, *flags[6:], twin=True)
    if plain.launch1 is None:                       # the two-launch route: no twin
        return False
    outer, c, inner, _ = layout_of(xc)
    t = _variant(plain, _fwd1_plan(xc, outer, c, inner, *flags, aligned, dev, twin=True))
    if t:
        t.twin = True
    return t


def _variant(base, one):
    """A copy of the settled call ``base`` (a _TrainingCall or _BackwardCall) that makes ``one``'s launch instead
    (the twin, the shadow, the channels-last dx), or False where ``one`` (a plan: launch, partial elements, sync
    counters, accumulator dtype) is not base's own launch with one more option: the same grid, shared memory,
    scalars and scratch sizes (bn_nhwc.same_launch), so the same sums and bits."""
    acc = base.acc if type(base) is _TrainingCall else base.pdt
    if one is None or not _nhwc.same_launch(base.launch1, one[0]) or one[1:] != (base.n_partial, base.n_sync, acc):
        return False
    t = type(base)()
    for name in type(base).__slots__:
        setattr(t, name, getattr(base, name))
    t.launch1 = one[0]
    return t


def twin_nhwc_call(xc, scale, bias, factor, running_mean, running_var, eps, counter=None):
    """twin_call's variant for an NCHW 4-D xc that also returns the twin's channels-last shadow: (y, mean, inv_std,
    relu(y), shadow), shadow the channels-first view of an NHWC-memory array holding relu(y)'s values (what a
    convolution's 16-byte NHWC loader reads as it is, docs/fusion.md "The twin's NHWC shadow"); y, the statistics
    and relu(y) bitwise the twin call's.  Called as it (None, nothing launched, where the twin call would -- and
    while the stream captures a CUDA graph: the scattered stores cost device time, as DX_NHWC's).  False where
    this signature has none: only the twin call's own one-launch kernel (bn_fwd1 in one round, bn_fwdc) built with
    TWIN_NHWC, the same grid, shared memory and scalars (bn_nhwc.same_launch)."""
    dev = xc.data.device_id
    flags = (factor, eps, running_mean is not None, counter is not None, False, False, scale is not None,
             bias is not None)
    key = ("twin_nhwc", _switches(), _aligned(xc, None), xc.shape, xc.strides, xc.dtype, dev) + flags \
        + _nhwc.switch()
    call = _calls.get(key)
    if call is None:
        call = _launch.planned(_calls, key, _twin_nhwc_call, xc, dev, key[2], flags,
                               twin_call(xc, scale, bias, factor, running_mean, running_var, eps, counter))
    return call


def _twin_nhwc_call(xc, dev, aligned, flags, twin):
    if type(twin) is not _TrainingCall or twin.launch1 is None or twin.back is not None or xc.ndim != 4 \
            or not xc.flags.c_contiguous:
        return False
    outer, c, inner, _ = layout_of(xc)
    if inner == 1:
        return False
    t = _variant(twin, _fwd1_plan(xc, outer, c, inner, *flags, aligned, dev, twin=True, twin_nhwc=True))
    if t:
        n, ch, h, w = xc.shape
        t.shadow = ((n, h, w, ch), (0, 3, 1, 2))
    return t


def _training_call(xc, dev, aligned, factor, eps, has_running, has_counter, relu, has_z, has_scale, has_bias):
    outer, c, inner, xm = layout_of(xc)
    if inner == 1 and _rows_to_nhwc():      # (R, C) rows (channels-last, 2-D): bn_nhwc's whole-row kernels
        return _nhwc.training_call(xc, factor, eps, has_running, has_counter, relu, has_z, has_scale, has_bias)
    t = _TrainingCall()
    t.onepass, t.dev, t.c, t.dtype, t.rows, t.twin, t.shadow = _switches(), dev, c, xc.dtype, inner == 1, False, None
    t.mem, t.back = _memory_order(xc)
    sig = (xc.shape, xc.strides, xc.dtype, dev)
    one = _planned(("fwd1", _switches(), factor, eps, has_running, has_counter, relu, has_z, has_scale,
                    has_bias, aligned) + sig,
                   _fwd1_plan, xc, outer, c, inner, factor, eps, has_running, has_counter, relu, has_z, has_scale,
                   has_bias, aligned, dev) if ONEPASS else None
    if one is not None:
        t.launch1, t.n_partial, t.n_sync, t.acc = one
        t.aligned, t.stats, t.apply = aligned, None, None
        return t
    t.launch1, t.aligned = None, None
    t.stats, t.n_partial, t.n_sync, t.acc = _planned(("stats", factor, eps, has_running, has_counter) + sig,
                                                     _stats_plan, xc, outer, c, inner, factor, eps, has_running,
                                                     has_counter, dev)
    flags = (relu, has_z, has_scale, has_bias, eps, False)
    t.apply = _planned(("apply", xc.shape, xc.strides, xc.dtype, dev) + flags, _apply_plan,
                       xc, outer, c, inner, *flags, dev)
    return t


def forward_inference(xc, scale, bias, est_mean, est_var, eps, z=None, relu=False):
    cp = _launch.cupy()
    outer, c, inner, xm = layout_of(xc)
    if inner == 1 and _nhwc.ENABLED:
        return _nhwc.forward_inference(xc, scale, bias, est_mean, est_var, eps, z, relu)
    dev = xc.data.device_id
    with _launch.on_device(dev):
        return _apply(cp, xc, xm, est_mean, est_var, scale, bias, z, relu, eps, True, outer, c, inner, dev)


def _apply(cp, xc, xm, stat1, stat2, scale, bias, z, relu, eps, from_var, outer, c, inner, dev):
    flags = (relu, z is not None, scale is not None, bias is not None, eps, from_var)
    apply = _planned(("apply", xc.shape, xc.strides, xc.dtype, dev) + flags, _apply_plan,
                     xc, outer, c, inner, *flags, dev)
    y = _empty_like_layout(cp, xc)
    apply(xm, xm if z is None else _mem(z), _mem(y), stat1, stat2, _p(scale, xm), _p(bias, xm))
    return y


def _backward_plan(xc, outer, c, inner, relu, has_scale, want_dz, dev):
    inner1 = inner == 1
    splits, tiles = _reduce_grid(outer, c, inner, inner1, dev)
    grad = _launch.prepare(_kernel("bn_grad", xc.dtype, inner1, relu=relu, has_scale=has_scale), (splits, tiles),
                           (THREADS,), [None] * 10 + [np.int32(outer), np.int32(c), np.int32(inner),
                                                      *_divider(inner)])
    n = xc.size
    dx = _launch.prepare(_kernel("bn_dx", xc.dtype, inner1, relu=relu, has_z=want_dz, has_scale=has_scale),
                         (_elementwise_grid(n, dev),), (THREADS,),
                         [None] * 9 + [np.int64(n), np.int32(c), np.int32(inner), *_divider(c), *_divider(inner)])
    return grad, dx, c * splits * 2, tiles, param_dtype(xc.dtype)


def backward(xc, dyc, scale, mean, inv_std, y=None, want_dz=False, dx=None):
    """(dx, dz or None, dscale or None, dbias or None); ``y`` (the fused forward's output) masks dy when the forward
    applied a ReLU; ``want_dz`` also returns g, the gradient of the residual added before the ReLU.  ``dx``: a
    channels-first CuPy array of xc's shape and dtype, any memory order, that receives dx (the caller's layout, as
    cuDNN's dxDesc): written by the kernels where it is laid out as xc or, for an NCHW xc, as channels-last memory
    (dx_nhwc_call); else dx is copied into it (one more launch)."""
    if dx is None:
        return backward_call(xc, dyc, scale, mean, y, want_dz)(xc, dyc, scale, mean, inv_std, y)
    out = None
    if dx.ndim >= 3 and xc.flags.c_contiguous and not dx.flags.c_contiguous and _mem(dx).flags.c_contiguous:
        call = dx_nhwc_call(xc, dyc, scale, mean, y, want_dz)
        out = call(xc, dyc, scale, mean, inv_std, y, dx=dx) if call else None
    if out is None:
        call = backward_call(xc, dyc, scale, mean, y, want_dz)
        out = call(xc, dyc, scale, mean, inv_std, y, dx=dx) if writes_into(call, dx) else \
            call(xc, dyc, scale, mean, inv_std, y)
    if out[0] is not dx:
        dx[...] = out[0]
    return (dx, *out[1:])


def writes_into(call, dx):
    """Whether settled backward call ``call`` can write its dx into the channels-first array ``dx`` (laid out as it
    writes dx: a _BackwardCall's dx memory, C-contiguous, 16-byte aligned where the kernels use vectors)."""
    if type(call) is not _BackwardCall or dx.data.ptr & 15:
        return False
    return (dx if call.dx_back is None else _mem(dx)).flags.c_contiguous and \
        tuple(dx.shape) == tuple(call.dx_mem[i] for i in (call.dx_back or range(dx.ndim)))


class _BackwardCall:
    """backward settled (see _TrainingCall): ``call(xc, dyc, scale, mean, inv_std, y)`` -> (dx, dz, dscale, dbias), or
    None where ONEPASS or the inputs' alignment is not what it was settled for, or bn_nhwc was switched on since."""
    __slots__ = ("onepass", "aligned", "dev", "c", "dtype", "mem", "back", "acc", "pdt", "n_partial", "n_sync",
                 "has_scale", "want_dz", "launch1", "grad", "dx", "rows", "dx_mem", "dx_back")

    def __call__(self, xc, dyc, scale, mean, inv_std, y, dscale=None, dbias=None, dx=None):
        """``dscale``, ``dbias`` (with a scale): (C,) C-contiguous arrays of the parameter dtype the kernels write
        the parameter gradients into (gradient destinations, minidnn/_grad_dest.py), instead of new ones.  ``dx``:
        the channels-first view of an array laid out as this call writes dx (``writes_into``), written instead of a
        new one and returned."""
        if self.onepass != _switches() or (self.rows and _rows_to_nhwc()) \
                or (self.aligned is not None and _aligned(xc, dyc, y) is not self.aligned):
            return None
        cp, dev, acc, c = _launch.cupy(), self.dev, self.acc, self.c
        if self.dx_back is not None and self.back is None and _ws.eager_stream(cp) is None:
            return None                 # dx_nhwc_call's: not while the stream captures a CUDA graph
        with _launch.on_device(dev):
            partial = _ws.scratch_flat(cp, dev, "bn.partial", self.n_partial, acc)
            coef = _ws.scratch_flat(cp, dev, "bn.coef", c * 2, acc)
            if not self.has_scale:
                dscale = dbias = None
            elif dscale is None or dbias is None:
                dscale, dbias = _ws.fresh_pair(cp, dev, "bn.dparams", (c,), self.pdt)
            given = dx is not None
            if self.launch1 is not None:
                if not given:
                    dx = _ws.fresh(cp, dev, "bn.dx", self.dx_mem, self.dtype)      # (dx_nhwc_call: NHWC memory)
                dz = _ws.fresh(cp, dev, "bn.dx", self.mem, self.dtype) if self.want_dz else None
                self.launch1(xc, dyc, y, mean, inv_std, partial, _ticket(cp, self.n_sync, dev), coef, dscale,
                             dbias, scale, dx, dz)
            else:
                ym = xc if y is None else y
                self.grad(xc, dyc, ym, mean, inv_std, partial, _ticket(cp, self.n_sync, dev), coef,
                          _p(dscale, coef), _p(dbias, coef))
                if not given:
                    dx = _ws.fresh(cp, dev, "bn.dx", self.mem, self.dtype)
                dz = _ws.fresh(cp, dev, "bn.dx", self.mem, self.dtype) if self.want_dz else None
                self.dx(xc, dyc, ym, mean, inv_std, coef, _p(scale, xc), dx, xc if dz is None else dz)
        back = self.back
        if self.dx_back is not None and not given:
            dx = dx.transpose(self.dx_back)
        if back is not None and dz is not None:
            dz = dz.transpose(back)
        return dx, dz, dscale, dbias


def backward_call(xc, dyc, scale, mean, y=None, want_dz=False):
    """The settled call of ``backward`` with these arguments (see _BackwardCall), made once per signature."""
    dev = xc.data.device_id
    flags = (y is not None, scale is not None, want_dz)
    key = ("backward", _switches(), _aligned(xc, dyc, y), xc.shape, xc.strides, xc.dtype, dev, mean.dtype) + flags \
        + _nhwc.switch()
    call = _calls.get(key)
    if call is None:
        call = _launch.planned(_calls, key, _backward_call, xc, dev, key[2], mean.dtype, *flags)
    return call


def dx_nhwc_call(xc, dyc, scale, mean, y=None, want_dz=False):
    """backward_call's variant for an NCHW xc that returns dx in channels-last MEMORY (the same (N, C, *S) values,
    strides (S*C, 1, ..., C): the layout a convolution's 16-byte NHWC loader reads as it is; docs/fusion.md), the
    dx values bitwise the plain call's; dz, dscale, dbias unchanged.  Called as backward_call's object (the same
    protocol: None, nothing launched, where the plain call would).  False where this signature has no such call:
    only bn_bwd1 in ONE round and bn_bwdc (every channel's cluster resident: one wave) write it (DX_NHWC) -- a
    warp's dx stores become stride-C scalars, which L2 merges into whole sectors only while every channel's lines
    are resident -- and only where that launch is the plain call's own (the same grid, shared memory and scalars,
    so the same sums: bn_nhwc.same_launch).  The multi-round and two-launch routes, channels-last inputs and, with
    bn_cluster.DX_NHWC off, the cluster kernels keep writing dx as x.  The call is also None while the stream
    captures a CUDA graph: the scattered stores cost device time (session 16 run 4, ResNet-20 b128 graph replays:
    fp32 +8%, bf16 +17% with the cluster route), which is what a replayed step is made of, while the staging launch
    they save costs an eager step host time."""
    dev = xc.data.device_id
    flags = (y is not None, scale is not None, want_dz)
    key = ("dx_nhwc", _switches(), _aligned(xc, dyc, y), xc.shape, xc.strides, xc.dtype, dev, mean.dtype) + flags \
        + _nhwc.switch() + (_cluster.DX_NHWC,)
    call = _calls.get(key)
    if call is None:
        call = _launch.planned(_calls, key, _dx_nhwc_call, xc, dev, key[2], flags,
                               backward_call(xc, dyc, scale, mean, y, want_dz))
    return call


def _dx_nhwc_call(xc, dev, aligned, flags, plain):
    if not isinstance(plain, _BackwardCall) or plain.launch1 is None or plain.back is not None or xc.ndim < 3 \
            or not xc.flags.c_contiguous:
        return False
    outer, c, inner, _ = layout_of(xc)
    if inner == 1:
        return False
    t = _variant(plain, _bwd1_plan(xc, outer, c, inner, *flags, aligned, dev, dx_nhwc=True))
    if t:
        nd = xc.ndim
        t.dx_mem = tuple(xc.shape[i] for i in (0, *range(2, nd), 1))
        t.dx_back = (0, nd - 1, *range(1, nd - 1))
    return t


def _backward_call(xc, dev, aligned, acc, relu, has_scale, want_dz):
    outer, c, inner, xm = layout_of(xc)
    if inner == 1 and _rows_to_nhwc():
        return _nhwc.backward_call(xc, relu, has_scale, want_dz)
    t = _BackwardCall()
    t.onepass, t.dev, t.c, t.dtype, t.acc, t.rows = _switches(), dev, c, xc.dtype, acc, inner == 1
    t.mem, t.back = _memory_order(xc)
    t.dx_mem, t.dx_back = t.mem, t.back
    t.has_scale, t.want_dz = has_scale, want_dz
    one = _planned(("bwd1", _switches(), xc.shape, xc.strides, xc.dtype, dev, relu, has_scale, want_dz,
                    aligned), _bwd1_plan, xc, outer, c, inner, relu, has_scale, want_dz, aligned,
                   dev) if ONEPASS else None
    if one is not None:
        t.launch1, t.n_partial, t.n_sync, t.pdt = one
        t.aligned, t.grad, t.dx = aligned, None, None
        return t
    t.launch1, t.aligned = None, None
    t.grad, t.dx, t.n_partial, t.n_sync, t.pdt = _planned(("backward", xc.shape, xc.strides, xc.dtype, dev, relu,
                                                           has_scale, want_dz), _backward_plan,
                                                          xc, outer, c, inner, relu, has_scale, want_dz, dev)
    return t
