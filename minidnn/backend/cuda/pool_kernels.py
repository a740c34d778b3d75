"""2-D max and average pooling on the GPU, forward and backward (global average pooling is the window = input case).

Shape legend (channels-first indices, any strides: NCHW or channels-last memory, even broadcast inputs):
    x, dx: (N, C, H, W)      y, dy, argmax: (N, C, OH, OW)      window (KH, KW), padding (PH, PW), stride (SH, SW),
    dilation (DH, DW) (max modes);  argmax = the winning tap kh * KW + kw of each window (uint8, or uint16 > 256 taps)
Outputs (y, argmax, dx) are allocated in the memory order of the input that decides it (x forward, dy backward):
CL = 1 means channels-last, and the linear thread index then walks (n, h, w, c) so consecutive threads touch
consecutive channels; CL = 0 walks (n, c, h, w).  Either way the writes are coalesced.

Tiling: one thread per OUTPUT element in forward -- it visits the real taps of its window in row-major order
(padding is never read: it counts as -inf / is excluded), keeping the first maximum (a NaN wins, as the reference)
and its tap, or the sum divided by the window's count (INCLUDE: clipped to the padded input, EXCLUDE: to the real
input); one thread per INPUT element in backward -- it gathers, tap by tap, the outputs whose window holds it
(oh = (h + PH - kh*DH) / SH when divisible) and adds dy where argmax == tap (max) or dy / count (average): a fixed
order, no atomics, so MAX and MAX_DETERMINISTIC are the same bits.  A grid-stride loop covers any size.
Traffic: forward reads x once (overlapping windows through L1/L2) and writes y (+ 1 byte argmax); backward reads dy
and argmax about (K/S)^2 times through the cache and writes dx once.

Special cases with kernels of their own (chosen per call signature, the plan below):
  pool_bwd_disjoint  non-overlapping windows (stride == window, no padding, no dilation, every input element in
             exactly one window: the common 2x2/2): one thread per OUTPUT element writes its whole window -- dy at
             the argmax tap and 0 elsewhere (max), dy / count everywhere (average) -- no gather, no atomics,
             deterministic; NCHW rows of a 2-wide window as one 2-element store (PAIR).
  gap_fwd    global average pooling (average, window = the whole input, no padding), NCHW: a TEAM of threads per
             (n, c) plane (a warp, or 64..256 threads where the planes are few and long), 16-byte vectors where
             the plane fills them, two accumulator chains per thread, warp shuffles, warps added in order: a fixed
             order, in float (double for float64).  Reads x once.
  gap_fwd_cl the same for channels-last memory: a block owns 32 consecutive channels (lane = channel, one coalesced
             128-byte row per warp load) of one sample and 8 rows; rows l = ty, ty + 8, ... of the H*W positions in
             4 chains, then a fixed-order sum over the 8 rows in shared memory.
  gap_bwd    dx = dy[n, c] / (H*W): one elementwise pass, 16-byte vectors (a vector stays in one plane (NCHW) or
             one position's channels (channels-last)).  Writes dx once, reads dy (N*C values) through the cache.
Vector kernels (VEC_SOURCE, float32 / float16 / bfloat16; VW = 16 / itemsize elements per 16-byte vector; the same
rules and arithmetic order as the generic kernels, so the same bits; MINIDNN_POOL_V1=1 switches them off;
MINIDNN_POOL_VEC_BWD=0 keeps the backward on the previous kernels):
  pool_fwd_rows / pool_bwd_rows  NCHW, windows KH x KW <= 4 x 4 (template macros) with stride = window, no padding or
             dilation, every window inside x (the backward: tiling x exactly): a thread owns OV = VW adjacent outputs
             of one output row, reading KH input rows of KW * OV contiguous values as KW 16-byte vectors each (where W
             is a multiple of VW and x 16-byte aligned; scalar loads otherwise), writing y and the uint8 argmax in
             aligned chunks of SV = gcd(OW, VW); the backward reads those chunks of dy and argmax and writes its
             KH x (KW * OV) block of dx as vectors.  2x2/2 float32: 4 loads of 16 bytes -> 4 outputs.
  pool_fwd_clv / pool_bwd_clv    channels-last memory with C % VW == 0, any window, padding, stride, dilation, ceil
             mode: a thread owns one 16-byte vector of channels of one output (forward) or input (backward, the
             gather) position, each tap one vector load; disjoint windows (DISJ, MINIDNN_POOL_VEC_BWD=1): the
             backward reads the one window holding its position, no per-tap divisions.
  A call whose pointers are not 16-byte aligned takes the kernel that needs no alignment (chosen per call).
Host cost: everything but the arrays (kernel, grid, packed scalars, output shapes) is settled once per call
signature (``forward_plan`` / ``backward_plan``, a bounded table); the pooling primitive keeps the plan of a call it
validated, so a repeated call is a dict lookup, the output allocation(s) and one prepared launch.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from . import workspace as _ws
from .bn_kernels import STORAGE_HEADER, _divider, type_info
from .bn_nhwc import strided_spec
from .softmax_kernels import WARP_REDUCE

__all__ = ["supports", "forward", "backward", "SOURCE"]

THREADS = 256

SOURCE = STORAGE_HEADER + WARP_REDUCE + r"""
typedef ARGT ARG;

// The geometry travels as 14 int arguments (no struct: plain scalars are what every CuPy passes reliably).
#define GEO_ARGS const int N, const int C, const int H, const int W, const int OH, const int OW, const int KH, \
                 const int KW, const int PH, const int PW, const int SH, const int SW, const int DH, const int DW
struct Geo { int N, C, H, W, OH, OW, KH, KW, PH, PW, SH, SW, DH, DW; };
#define MAKE_GEO const Geo g = {N, C, H, W, OH, OW, KH, KW, PH, PW, SH, SW, DH, DW};

// n / d for 0 <= n < 2^31 by multiply-high and shift ((mul, shift) from the host: bn_kernels._divider)
__device__ __forceinline__ unsigned int fast_div(unsigned int n, unsigned int mul, unsigned int shr)
{
    return (__umulhi(n, mul) + n) >> shr;
}

// (n, c, h, w) of linear index i of an (N, C, H, W) array laid out NCHW (CL 0) or NHWC (CL 1); the three divisors
// (the inner three dims in memory order) come as fast dividers: no hardware division in the index math.
#define DIV_ARGS const unsigned int d0m, const unsigned int d0s, const unsigned int d1m, const unsigned int d1s, \
                 const unsigned int d2m, const unsigned int d2s
__device__ __forceinline__ void unravel(unsigned int i, int C, int H, int W, int& n, int& c, int& h, int& w,
                                        unsigned int d0m, unsigned int d0s, unsigned int d1m, unsigned int d1s,
                                        unsigned int d2m, unsigned int d2s)
{
    unsigned int q;
#if CL
    q = fast_div(i, d0m, d0s); c = (int)(i - q * C); i = q;
    q = fast_div(i, d1m, d1s); w = (int)(i - q * W); i = q;
    q = fast_div(i, d2m, d2s); h = (int)(i - q * H); n = (int)q;
#else
    q = fast_div(i, d0m, d0s); w = (int)(i - q * W); i = q;
    q = fast_div(i, d1m, d1s); h = (int)(i - q * H); i = q;
    q = fast_div(i, d2m, d2s); c = (int)(i - q * C); n = (int)q;
#endif
}

__device__ __forceinline__ long long lin(int n, int c, int h, int w, int C, int H, int W)
{
#if CL
    return (((long long)n * H + h) * W + w) * C + c;
#else
    return (((long long)n * C + c) * H + h) * W + w;
#endif
}

// Elements of the window starting at s0 (size K) counted: INCLUDE -> clipped to [-P, L + P), else to [0, L).
__device__ __forceinline__ int window_count(int s0, int K, int L, int P)
{
#if INCLUDE_PAD
    return min(s0 + K, L + P) - s0;
#else
    return min(s0 + K, L) - max(s0, 0);
#endif
}

extern "C" __global__ void __launch_bounds__(256)
pool_fwd(const T* __restrict__ x, T* __restrict__ y, ARG* __restrict__ argmax, GEO_ARGS,
         const long long xsn, const long long xsc, const long long xsh, const long long xsw, DIV_ARGS)
{
    MAKE_GEO
    const unsigned int total = (unsigned int)g.N * g.C * g.OH * g.OW;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int n, c, oh, ow;
        unravel(i, g.C, g.OH, g.OW, n, c, oh, ow, d0m, d0s, d1m, d1s, d2m, d2s);
        const int h0 = oh * g.SH - g.PH, w0 = ow * g.SW - g.PW;
        const T* xb = x + n * xsn + c * xsc;
#if IS_MAX
        A best = 0; int arg = -1;
        for (int kh = 0; kh < g.KH; ++kh) {
            const int h = h0 + kh * g.DH;
            if (h < 0 || h >= g.H) continue;
            for (int kw = 0; kw < g.KW; ++kw) {
                const int w = w0 + kw * g.DW;
                if (w < 0 || w >= g.W) continue;
                const A v = LD(xb[h * xsh + w * xsw]);
                if (arg < 0 || v > best || (v != v && best == best)) { best = v; arg = kh * g.KW + kw; }
            }
        }
        y[i] = ST(best);
        argmax[i] = (ARG)arg;
#else
        A s = 0;
        for (int kh = 0; kh < g.KH; ++kh) {
            const int h = h0 + kh;
            if (h < 0 || h >= g.H) continue;
            for (int kw = 0; kw < g.KW; ++kw) {
                const int w = w0 + kw;
                if (w < 0 || w >= g.W) continue;
                s += LD(xb[h * xsh + w * xsw]);
            }
        }
        const A count = (A)(window_count(h0, g.KH, g.H, g.PH) * window_count(w0, g.KW, g.W, g.PW));
        y[i] = ST(s / count);
#endif
    }
}

// The backward kernels' arguments (pool_bwd, pool_bwd_disjoint: the host launches either with the same list): dy,
// argmax (max pooling; unread for average), dx, the geometry, dy's and argmax's element strides, the dividers.
#define BWD_ARGS const T* __restrict__ dy, const ARG* __restrict__ argmax, T* __restrict__ dx, GEO_ARGS, \
                 const long long dsn, const long long dsc, const long long dsh, const long long dsw, \
                 const long long asn, const long long asc, const long long ash, const long long asw, DIV_ARGS

extern "C" __global__ void __launch_bounds__(256)
pool_bwd(BWD_ARGS)
{
    MAKE_GEO
    const unsigned int total = (unsigned int)g.N * g.C * g.H * g.W;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int n, c, h, w;
        unravel(i, g.C, g.H, g.W, n, c, h, w, d0m, d0s, d1m, d1s, d2m, d2s);
        const T* db = dy + n * dsn + c * dsc;
        A s = 0;
        for (int kh = 0; kh < g.KH; ++kh) {
            const int th = h + g.PH - kh * g.DH;
            if (th < 0 || th % g.SH) continue;
            const int oh = th / g.SH;
            if (oh >= g.OH) continue;
            for (int kw = 0; kw < g.KW; ++kw) {
                const int tw = w + g.PW - kw * g.DW;
                if (tw < 0 || tw % g.SW) continue;
                const int ow = tw / g.SW;
                if (ow >= g.OW) continue;
#if IS_MAX
                if ((int)argmax[n * asn + c * asc + oh * ash + ow * asw] == kh * g.KW + kw)
                    s += LD(db[oh * dsh + ow * dsw]);
#else
                const int count = window_count(oh * g.SH - g.PH, g.KH, g.H, g.PH)
                                * window_count(ow * g.SW - g.PW, g.KW, g.W, g.PW);
                s += LD(db[oh * dsh + ow * dsw]) / (A)count;
#endif
            }
        }
        dx[i] = ST(s);
    }
}

// Non-overlapping windows: one thread per output element writes its window of dx (each input element is in exactly
// one window).  s = 0 + v keeps the gather's bits (a -0 gradient lands as +0, as there).
struct alignas(2 * sizeof(T)) Pair { T a, b; };
extern "C" __global__ void __launch_bounds__(256)
pool_bwd_disjoint(BWD_ARGS)
{
    MAKE_GEO
    const unsigned int total = (unsigned int)g.N * g.C * g.OH * g.OW;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int n, c, oh, ow;
        unravel(i, g.C, g.OH, g.OW, n, c, oh, ow, d0m, d0s, d1m, d1s, d2m, d2s);
        const A v = LD(dy[n * dsn + c * dsc + oh * dsh + ow * dsw]);
        const int h0 = oh * g.KH, w0 = ow * g.KW;
        const int nh = min(g.KH, g.H - h0), nw = min(g.KW, g.W - w0);     // ceil mode clips the last windows
#if IS_MAX
        const int win = (int)argmax[n * asn + c * asc + oh * ash + ow * asw];
#else
        const A q = v / (A)(nh * nw);
#endif
        for (int kh = 0; kh < nh; ++kh) {
#if PAIR
            A s0 = 0, s1 = 0;
#if IS_MAX
            if (win == kh * 2) s0 += v;
            if (win == kh * 2 + 1) s1 += v;
#else
            s0 += q; s1 += q;
#endif
            Pair o; o.a = ST(s0); o.b = ST(s1);
            *reinterpret_cast<Pair*>(dx + lin(n, c, h0 + kh, w0, g.C, g.H, g.W)) = o;
#else
            for (int kw = 0; kw < nw; ++kw) {
                A s = 0;
#if IS_MAX
                if (win == kh * g.KW + kw) s += v;
#else
                s += q;
#endif
                dx[lin(n, c, h0 + kh, w0 + kw, g.C, g.H, g.W)] = ST(s);
            }
#endif
        }
    }
}

// ---- global average pooling ----
#define GBLOCK (TEAM == 32 ? 256 : TEAM)      // a team of more than a warp is the whole block (uniform barriers)
#define GTPB (GBLOCK / TEAM)
struct alignas(sizeof(T) * VEC) GV { T v[VEC]; };

extern "C" __global__ void __launch_bounds__(256)
gap_fwd(const T* __restrict__ x, T* __restrict__ y, const int planes, const int L)
{
#if TEAM > 32
    __shared__ A red[GBLOCK / 32];
#endif
    const int t = threadIdx.x % TEAM;
    const int nvec = L / VEC;
    for (int p = blockIdx.x * GTPB + threadIdx.x / TEAM; p < planes; p += gridDim.x * GTPB) {
        const GV* xp = reinterpret_cast<const GV*>(x + (long long)p * L);
        A s0 = 0, s1 = 0;
        int vi = t;
        for (; vi + TEAM < nvec; vi += 2 * TEAM) {
            const GV a = xp[vi], b = xp[vi + TEAM];
#pragma unroll
            for (int e = 0; e < VEC; ++e) { s0 += LD(a.v[e]); s1 += LD(b.v[e]); }
        }
        if (vi < nvec) {
            const GV a = xp[vi];
#pragma unroll
            for (int e = 0; e < VEC; ++e) s0 += LD(a.v[e]);
        }
        A s = warp_sum(s0 + s1);
#if TEAM > 32
        __syncthreads();                       // the previous plane's readers are done with red
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
        __syncthreads();
        s = 0;
#pragma unroll
        for (int w = 0; w < TEAM / 32; ++w) s += red[w];
#endif
        if (t == 0) y[p] = ST(s / (A)L);
    }
}

extern "C" __global__ void __launch_bounds__(256)
gap_fwd_cl(const T* __restrict__ x, T* __restrict__ y, const int N, const int L, const int C)
{
    __shared__ A sm[8][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int tiles = (C + 31) >> 5;
    for (int u = blockIdx.x; u < N * tiles; u += gridDim.x) {       // uniform over the block
        const int n = u / tiles, c = (u - n * tiles) * 32 + tx;
        A s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        if (c < C) {
            const T* xb = x + (long long)n * L * C + c;
            int l = ty;
            for (; l + 24 < L; l += 32) {
                const T a = xb[(long long)l * C], b = xb[(long long)(l + 8) * C];
                const T d = xb[(long long)(l + 16) * C], e = xb[(long long)(l + 24) * C];
                s0 += LD(a); s1 += LD(b); s2 += LD(d); s3 += LD(e);
            }
            for (; l < L; l += 8) s0 += LD(xb[(long long)l * C]);
        }
        sm[ty][tx] = (s0 + s1) + (s2 + s3);
        __syncthreads();
        if (ty == 0 && c < C) {
            A s = 0;
#pragma unroll
            for (int r = 0; r < 8; ++r) s += sm[r][tx];
            y[(long long)n * C + c] = ST(s / (A)L);
        }
        __syncthreads();
    }
}

// dx = dy[n, c] / L over (N, C, L) NCHW or (N, L, C) channels-last memory, VEC values per thread per iteration.
extern "C" __global__ void __launch_bounds__(256)
gap_bwd(const T* __restrict__ dy, T* __restrict__ dx, const long long total, const int C, const int L,
        const long long dsn, const long long dsc, const unsigned int lm, const unsigned int ls,
        const unsigned int cm, const unsigned int cs)
{
    const long long nv = total / VEC, step = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < nv; k += step) {
        const unsigned int i0 = (unsigned int)(k * VEC);
        GV o;
#if CL
        const unsigned int q = fast_div(i0, cm, cs);            // n * L + l
        const int c0 = (int)(i0 - q * (unsigned int)C);
        const long long n = fast_div(q, lm, ls);
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = ST(LD(dy[n * dsn + (c0 + e) * dsc]) / (A)L);
#else
        const unsigned int p = fast_div(i0, lm, ls);            // n * C + c
        const unsigned int n = fast_div(p, cm, cs);
        const long long c = p - n * (unsigned int)C;
        const T v = ST(LD(dy[n * dsn + c * dsc]) / (A)L);
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = v;
#endif
        reinterpret_cast<GV*>(dx)[k] = o;
    }
}
"""

# ---- vectorized kernels (16-bit and float32 data): their own source, compiled per window shape --------------------
VEC_SOURCE = STORAGE_HEADER + r"""
typedef ARGT ARG;
#define VW (16 / (int)sizeof(T))       // elements of a 16-byte vector: 4 floats, 8 halves
#ifndef OV
#define OV VW                          // rows kernels: outputs per thread, adjacent in one output row
#endif
#define NV (KW * OV / VW)              // pool_bwd_rows with VOUT: 16-byte vectors of one dx row per thread
struct alignas(16) Vec { T v[VW]; };

__device__ __forceinline__ unsigned int fast_div(unsigned int n, unsigned int mul, unsigned int shr)
{
    return (__umulhi(n, mul) + n) >> shr;
}

// S consecutive elements of type E at p (aligned to S * sizeof(E)) moved as one access
template <int B> struct Raw;
template <> struct Raw<1> { typedef unsigned char t; };
template <> struct Raw<2> { typedef unsigned short t; };
template <> struct Raw<4> { typedef unsigned int t; };
template <> struct Raw<8> { typedef uint2 t; };
template <> struct Raw<16> { typedef uint4 t; };
template <int S, class E> __device__ __forceinline__ void put(E* p, const E* v)
{
    typedef typename Raw<S * sizeof(E)>::t R;
    union { R r; E e[S]; } u;
#pragma unroll
    for (int i = 0; i < S; ++i) u.e[i] = v[i];
    *reinterpret_cast<R*>(p) = u.r;
}
template <int S, class E> __device__ __forceinline__ void get(const E* __restrict__ p, E* v)
{
    typedef typename Raw<S * sizeof(E)>::t R;
    union { R r; E e[S]; } u;
    u.r = *reinterpret_cast<const R*>(p);
#pragma unroll
    for (int i = 0; i < S; ++i) v[i] = u.e[i];
}

__device__ __forceinline__ int window_count(int s0, int K, int L, int P)
{
#if INCLUDE_PAD
    return min(s0 + K, L + P) - s0;
#else
    return min(s0 + K, L) - max(s0, 0);
#endif
}

#if ROWS
// NCHW rows: windows KH x KW (macros) with stride = window, no padding or dilation, every window inside x.
// Thread t owns OV adjacent outputs of output row r = (n * C + c) * OH + oh: t = r * segs + s, ow0 = s * OV.  It
// reads KH input rows of KW * OV contiguous values (KW 16-byte vectors each where VIN: rows 16-byte aligned), keeps
// each window's first maximum and its tap (a NaN wins: the generic kernel's rule) or its row-major sum / (KH * KW),
// and writes its outputs (and argmax entries) in chunks of SV elements (SV divides OW: aligned, whole chunks).
// A warp's threads cover consecutive rows: contiguous reads and writes.
extern "C" __global__ void __launch_bounds__(256)
pool_fwd_rows(const T* __restrict__ x, T* __restrict__ y, ARG* __restrict__ argmax, const int H, const int W,
              const int OH, const int OW, const unsigned int total, const int segs, const unsigned int sgm,
              const unsigned int sgs, const unsigned int ohm, const unsigned int ohs)
{
    for (unsigned int t = blockIdx.x * 256 + threadIdx.x; t < total; t += gridDim.x * 256) {
        const unsigned int r = fast_div(t, sgm, sgs);
        const int ow0 = (int)(t - r * segs) * OV;
        const unsigned int nc = fast_div(r, ohm, ohs);
        const int oh = (int)(r - nc * OH);
        const int cnt = min(OV, OW - ow0), c0 = ow0 * KW;
        const T* xr = x + ((long long)nc * H + oh * KH) * W + c0;
        T v[KH][KW * OV];
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {
#if VIN
#pragma unroll
            for (int j = 0; j < KW; ++j) {
                Vec a;
                if (c0 + j * VW < W) a = *reinterpret_cast<const Vec*>(xr + kh * W + j * VW);
                else {
#pragma unroll
                    for (int e = 0; e < VW; ++e) a.v[e] = 0;
                }
#pragma unroll
                for (int e = 0; e < VW; ++e) v[kh][j * VW + e] = a.v[e];
            }
#else
#pragma unroll
            for (int e = 0; e < KW * OV; ++e) v[kh][e] = c0 + e < W ? xr[kh * W + e] : (T)0;
#endif
        }
        T out[OV];
#if IS_MAX
        ARG arg[OV];
#endif
#pragma unroll
        for (int j = 0; j < OV; ++j) {
#if IS_MAX
            A best = LD(v[0][j * KW]); int a = 0;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh)
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    if (kh == 0 && kw == 0) continue;
                    const A u = LD(v[kh][j * KW + kw]);
                    if (u > best || (u != u && best == best)) { best = u; a = kh * KW + kw; }
                }
            out[j] = ST(best);
            arg[j] = (ARG)a;
#else
            A s = 0;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh)
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) s += LD(v[kh][j * KW + kw]);
            out[j] = ST(s / (A)(KH * KW));
#endif
        }
        const long long o = (long long)r * OW + ow0;
#pragma unroll
        for (int q = 0; q < OV; q += SV) {      // SV divides OW and ow0, so it divides cnt: whole chunks
            if (q < cnt) {
                put<SV>(y + o + q, out + q);
#if IS_MAX
                put<SV>(argmax + o + q, arg + q);
#endif
            }
        }
    }
}

// The backward of the same windows when they tile x exactly (OH * KH == H, OW * KW == W), dy and argmax
// C-contiguous: thread t reads its OV dy values and argmax entries (chunks of SV where VDY: 16-byte aligned
// pointers) and writes its KH x (KW * OV) block of dx -- dy at the argmax tap and 0 elsewhere (max), dy / (KH * KW)
// everywhere (average); s = 0 + v as the gather kernel (a -0 lands as +0) -- in NV = KW * OV / VW 16-byte vectors
// per row where VOUT (W % VW == 0).  OV = VW / KW where KW divides VW (the host's default, -DOV): each thread
// writes ONE vector of each of its KH rows, so a warp's store of a row is 512 contiguous bytes (with OV = VW the
// lanes' vectors sit 32 bytes apart and every store instruction half-fills its sectors).  No gather, no atomics.
extern "C" __global__ void __launch_bounds__(256)
pool_bwd_rows(const T* __restrict__ dy, const ARG* __restrict__ argmax, T* __restrict__ dx, const int H,
              const int W, const int OH, const int OW, const unsigned int total, const int segs,
              const unsigned int sgm, const unsigned int sgs, const unsigned int ohm, const unsigned int ohs)
{
    for (unsigned int t = blockIdx.x * 256 + threadIdx.x; t < total; t += gridDim.x * 256) {
        const unsigned int r = fast_div(t, sgm, sgs);
        const int ow0 = (int)(t - r * segs) * OV;
        const unsigned int nc = fast_div(r, ohm, ohs);
        const int oh = (int)(r - nc * OH);
        const int cnt = min(OV, OW - ow0), c0 = ow0 * KW;
        const long long o = (long long)r * OW + ow0;
        T g[OV];
#if IS_MAX
        ARG arg[OV];
#endif
#pragma unroll
        for (int q = 0; q < OV; q += SV) {      // whole chunks of SV (it divides cnt), as the forward's stores
#if VDY
            if (q < cnt) {
                get<SV>(dy + o + q, g + q);
#if IS_MAX
                get<SV>(argmax + o + q, arg + q);
#endif
            } else {
#pragma unroll
                for (int j = q; j < q + SV; ++j) {
                    g[j] = 0;
#if IS_MAX
                    arg[j] = 0;
#endif
                }
            }
#else
#pragma unroll
            for (int j = q; j < q + SV; ++j) {
                g[j] = j < cnt ? dy[o + j] : (T)0;
#if IS_MAX
                arg[j] = j < cnt ? argmax[o + j] : (ARG)0;
#endif
            }
#endif
        }
        T* dr = dx + ((long long)nc * H + oh * KH) * W + c0;
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {
            T row[KW * OV];
#pragma unroll
            for (int j = 0; j < OV; ++j) {
#if !IS_MAX
                const A q = LD(g[j]) / (A)(KH * KW);
#endif
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    A s = 0;
#if IS_MAX
                    if ((int)arg[j] == kh * KW + kw) s += LD(g[j]);
#else
                    s += q;
#endif
                    row[j * KW + kw] = ST(s);
                }
            }
#if VOUT
#pragma unroll
            for (int j = 0; j < NV; ++j)
                if (j * VW < cnt * KW) put<VW>(dr + kh * W + j * VW, row + j * VW);
#else
#pragma unroll
            for (int e = 0; e < KW * OV; ++e) if (e < cnt * KW) dr[kh * W + e] = row[e];
#endif
        }
    }
}
#else
// Channels-last memory, any window, padding, stride, dilation, ceil mode, C % VW == 0: thread i owns VW channels
// (one 16-byte vector) of one output position (forward: i = ((n * OH + oh) * OW + ow) * G + g, G = C / VW) or one
// input position (backward: i = ((n * H + h) * W + w) * G + g).  The generic kernels' loops and rules lane by lane,
// each tap one 16-byte load (and a VW-entry argmax load): the same bits as the generic kernels.
#define GEO_ARGS const int N, const int C, const int H, const int W, const int OH, const int OW, const int KH, \
                 const int KW, const int PH, const int PW, const int SH, const int SW, const int DH, const int DW

// Thread index i = ((n * R + y) * X + x) * G + g (forward: an output position, R, X = OH, OW; backward: an input
// position, R, X = H, W) taken apart by the fast dividers of G, X and R.
__device__ __forceinline__ void clv_position(unsigned int i, int G, int X, int R, unsigned int gm, unsigned int gs,
                                             unsigned int xm, unsigned int xs, unsigned int rm, unsigned int rs,
                                             int& n, int& y, int& x, int& g)
{
    unsigned int p = fast_div(i, gm, gs);
    g = (int)(i - p * G);
    unsigned int q = fast_div(p, xm, xs);
    x = (int)(p - q * X);
    p = fast_div(q, rm, rs);
    y = (int)(q - p * R);
    n = (int)p;
}

extern "C" __global__ void __launch_bounds__(256)
pool_fwd_clv(const T* __restrict__ x, T* __restrict__ y, ARG* __restrict__ argmax, GEO_ARGS,
             const unsigned int total, const unsigned int gm, const unsigned int gs, const unsigned int owm,
             const unsigned int ows, const unsigned int ohm, const unsigned int ohs)
{
    const int G = C / VW;
    for (unsigned int i = blockIdx.x * 256 + threadIdx.x; i < total; i += gridDim.x * 256) {
        int n, oh, ow, g;
        clv_position(i, G, OW, OH, gm, gs, owm, ows, ohm, ohs, n, oh, ow, g);
        const int h0 = oh * SH - PH, w0 = ow * SW - PW;
        const T* xb = x + (long long)n * H * W * C + g * VW;
#if IS_MAX
        A best[VW]; int arg[VW];
#pragma unroll
        for (int e = 0; e < VW; ++e) { best[e] = 0; arg[e] = -1; }
        for (int kh = 0; kh < KH; ++kh) {
            const int h = h0 + kh * DH;
            if (h < 0 || h >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {
                const int w = w0 + kw * DW;
                if (w < 0 || w >= W) continue;
                const Vec a = *reinterpret_cast<const Vec*>(xb + ((long long)h * W + w) * C);
                const int tap = kh * KW + kw;
#pragma unroll
                for (int e = 0; e < VW; ++e) {
                    const A v = LD(a.v[e]);
                    if (arg[e] < 0 || v > best[e] || (v != v && best[e] == best[e])) { best[e] = v; arg[e] = tap; }
                }
            }
        }
        Vec o; ARG ao[VW];
#pragma unroll
        for (int e = 0; e < VW; ++e) { o.v[e] = ST(best[e]); ao[e] = (ARG)arg[e]; }
        put<VW>(argmax + (long long)i * VW, ao);
#else
        A s[VW];
#pragma unroll
        for (int e = 0; e < VW; ++e) s[e] = 0;
        for (int kh = 0; kh < KH; ++kh) {
            const int h = h0 + kh;
            if (h < 0 || h >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {
                const int w = w0 + kw;
                if (w < 0 || w >= W) continue;
                const Vec a = *reinterpret_cast<const Vec*>(xb + ((long long)h * W + w) * C);
#pragma unroll
                for (int e = 0; e < VW; ++e) s[e] += LD(a.v[e]);
            }
        }
        const A count = (A)(window_count(h0, KH, H, PH) * window_count(w0, KW, W, PW));
        Vec o;
#pragma unroll
        for (int e = 0; e < VW; ++e) o.v[e] = ST(s[e] / count);
#endif
        reinterpret_cast<Vec*>(y)[i] = o;
    }
}

extern "C" __global__ void __launch_bounds__(256)
pool_bwd_clv(const T* __restrict__ dy, const ARG* __restrict__ argmax, T* __restrict__ dx, GEO_ARGS,
             const unsigned int total, const unsigned int gm, const unsigned int gs, const unsigned int wm,
             const unsigned int ws, const unsigned int hm, const unsigned int hs)
{
    const int G = C / VW;
    for (unsigned int i = blockIdx.x * 256 + threadIdx.x; i < total; i += gridDim.x * 256) {
        int n, h, w, g;
        clv_position(i, G, W, H, gm, gs, wm, ws, hm, hs, n, h, w, g);
        const long long base = (long long)n * OH * OW * C + g * VW;
        A s[VW];
#pragma unroll
        for (int e = 0; e < VW; ++e) s[e] = 0;
#if DISJ
        // disjoint windows (stride = window, no padding or dilation, OH * KH >= H, OW * KW >= W): the one window
        // holding (h, w) is (h / SH, w / SW) at tap (h % SH, w % SW) -- the gather's single surviving term, without
        // its 2 * KH * KW runtime divisions
        {
            const int oh = h / SH, ow = w / SW;
            const long long o = base + ((long long)oh * OW + ow) * C;
            const Vec d = *reinterpret_cast<const Vec*>(dy + o);
#if IS_MAX
            ARG a[VW];
            get<VW>(argmax + o, a);
            const int tap = (h - oh * SH) * KW + (w - ow * SW);
#pragma unroll
            for (int e = 0; e < VW; ++e) if ((int)a[e] == tap) s[e] += LD(d.v[e]);
#else
            const int count = window_count(oh * SH - PH, KH, H, PH) * window_count(ow * SW - PW, KW, W, PW);
#pragma unroll
            for (int e = 0; e < VW; ++e) s[e] += LD(d.v[e]) / (A)count;
#endif
        }
#else
        for (int kh = 0; kh < KH; ++kh) {
            const int th = h + PH - kh * DH;
            if (th < 0 || th % SH) continue;
            const int oh = th / SH;
            if (oh >= OH) continue;
            for (int kw = 0; kw < KW; ++kw) {
                const int tw = w + PW - kw * DW;
                if (tw < 0 || tw % SW) continue;
                const int ow = tw / SW;
                if (ow >= OW) continue;
                const long long o = base + ((long long)oh * OW + ow) * C;
                const Vec d = *reinterpret_cast<const Vec*>(dy + o);
#if IS_MAX
                ARG a[VW];
                get<VW>(argmax + o, a);
                const int tap = kh * KW + kw;
#pragma unroll
                for (int e = 0; e < VW; ++e) if ((int)a[e] == tap) s[e] += LD(d.v[e]);
#else
                const int count = window_count(oh * SH - PH, KH, H, PH) * window_count(ow * SW - PW, KW, W, PW);
#pragma unroll
                for (int e = 0; e < VW; ++e) s[e] += LD(d.v[e]) / (A)count;
#endif
            }
        }
#endif
        Vec o;
#pragma unroll
        for (int e = 0; e < VW; ++e) o.v[e] = ST(s[e]);
        reinterpret_cast<Vec*>(dx)[i] = o;
    }
}
#endif
"""

_ARG = {np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short"}
_INT_MAX = 2 ** 31 - 1


_kernel_cache: dict = {}


def _kernel(name, dtype, arg_dtype, cl, is_max, include_pad, pair=False, team=32, vec=1):
    key = (name, dtype, arg_dtype, cl, is_max, include_pad, pair, team, vec)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _launch.get_kernel(SOURCE, name, options(*key[1:]))
    return k


def _vec_kernel(name, dtype, arg_dtype, is_max, include_pad, rows, kh=0, kw=0, sv=1, vin=0, vdy=0, vout=0, ov=0,
                disj=0):
    key = (name, dtype, arg_dtype, is_max, include_pad, rows, kh, kw, sv, vin, vdy, vout, ov, disj)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _launch.get_kernel(VEC_SOURCE, name, vec_options(*key[1:]))
    return k


def vec_options(dtype, arg_dtype, is_max, include_pad, rows, kh=0, kw=0, sv=1, vin=0, vdy=0, vout=0, ov=0, disj=0):
    """NVRTC (and nvcc -D) options of one configuration of VEC_SOURCE: the rows kernels (``rows``: window kh x kw,
    store chunk sv, vector input rows vin, chunked dy reads vdy, vector dx rows vout, outputs per thread ov (0: VW))
    or the channels-last ones (``disj``: pool_bwd_clv's disjoint-window form)."""
    scalar, accum, storage, _ = type_info(dtype)
    head = (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DARGT={_ARG[np.dtype(arg_dtype)]}",
            f"-DIS_MAX={int(is_max)}", f"-DINCLUDE_PAD={int(include_pad)}", f"-DROWS={int(rows)}")
    if rows:
        head += (f"-DKH={int(kh)}", f"-DKW={int(kw)}", f"-DSV={int(sv)}", f"-DVIN={int(vin)}", f"-DVDY={int(vdy)}",
                 f"-DVOUT={int(vout)}")
        if ov:
            head += (f"-DOV={int(ov)}",)
    else:
        head += (f"-DDISJ={int(disj)}",)
    return head + ("-std=c++14",)


def options(dtype, arg_dtype, cl, is_max, include_pad, pair=False, team=32, vec=1):
    """NVRTC options of one configuration (also what nvcc needs as -D options: tests compile every kernel)."""
    scalar, accum, storage, _ = type_info(dtype)
    return (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DARGT={_ARG[np.dtype(arg_dtype)]}",
            f"-DCL={int(cl)}", f"-DIS_MAX={int(is_max)}", f"-DINCLUDE_PAD={int(include_pad)}",
            f"-DPAIR={int(pair)}", f"-DTEAM={int(team)}", f"-DVEC={int(vec)}", "-std=c++14")


def is_channels_last(a) -> bool:
    """Channels-last memory (N, H, W, C contiguous) of a 4-D channels-first view (C > 1, H*W > 1)."""
    return (not a.flags.c_contiguous) and a.transpose(0, 2, 3, 1).flags.c_contiguous


def supports(geom, xc, *others) -> bool:
    """2-D pooling of float32/float64/float16/bfloat16 CuPy arrays under 2**31 elements, fewer than 65536 taps."""
    return (_dev.is_cuda_array(xc) and xc.ndim == 4 and type_info(xc.dtype) is not None and xc.size > 0
            and 0 < xc.size <= _INT_MAX and math.prod(geom.y_shape) <= _INT_MAX
            and math.prod(geom.window) <= 65536
            and all(o is None or (_dev.is_cuda_array(o) and o.dtype.itemsize and all(
                s % o.itemsize == 0 for s in o.strides)) for o in others)
            and all(s % xc.itemsize == 0 for s in xc.strides))


def arg_dtype(geom):
    return np.min_scalar_type(math.prod(geom.window) - 1) if math.prod(geom.window) > 1 else np.dtype(np.uint8)


def is_global_average(geom) -> bool:
    """Average pooling whose one window is the whole (unpadded) input: adaptive pooling to 1x1."""
    return (not geom.mode.is_max and tuple(geom.window) == tuple(geom.spatial) and not any(geom.padding)
            and tuple(geom.out_sizes) == (1, 1))


def is_disjoint(geom) -> bool:
    """Windows that tile the input: stride == window, no padding or dilation, and every input element inside a
    window (floor mode leaves no uncovered tail rows or columns)."""
    (h, w), (oh, ow) = geom.spatial, geom.out_sizes
    (kh, kw) = geom.window
    return (tuple(geom.stride) == tuple(geom.window) and not any(geom.padding) and not geom.dilated
            and oh * kh >= h and ow * kw >= w)


def _geo(geom, n, c):
    (h, w), (oh, ow) = geom.spatial, geom.out_sizes
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = geom.window, geom.padding, geom.stride, geom.dilation
    return [np.int32(v) for v in (n, c, h, w, oh, ow, kh, kw, ph, pw, sh, sw, dh, dw)]


def _dividers(c, h, w, cl):
    order = (c, w, h) if cl else (w, h, c)
    return [v for d in order for v in _divider(d)]


def _strides(a):
    return [np.int64(s // a.itemsize) for s in a.strides]


def _grid(total, dev, per_thread=1):
    return (max(1, min((total + THREADS * per_thread - 1) // (THREADS * per_thread), _launch.sm_count(dev) * 16)),)


def _full_grid(total):
    """One thread per work item, no cap (the vector kernels: blocks finish and new ones start where the hardware has
    room, so no partial last wave of a capped grid-stride grid)."""
    return (max(1, -(-total // THREADS)),)


def _vec(n, dtype):
    """16-byte vectors of ``dtype`` when ``n`` values fill them, else 1."""
    v = 16 // np.dtype(dtype).itemsize
    return v if n % v == 0 else 1


# The vectorized kernels (VEC_SOURCE) take 4- and 2-byte data (float64 keeps the generic kernels: 16 bytes hold
# only 2 doubles, and it is the reference-precision path, not a bandwidth target).  MINIDNN_POOL_V1=1 switches them
# off: every 2-D call then takes the generic / disjoint kernels, as before (a GPU A/B).
V1 = os.environ.get("MINIDNN_POOL_V1", "0") == "1"
# The vector BACKWARD kernels (pool_bwd_rows / pool_bwd_clv): one full 16-byte vector of each dx row a thread where
# KW divides VW, disjoint windows read once -- faster than the disjoint / gather kernels (session 6 run 12, H100,
# (128, 64, 56, 56) max / avg 2x2: float32 0.051 / 0.048 ms, 89-90% of copy, NHWC 88-89%; bfloat16 0.030 / 0.029,
# 75-79%, NHWC 68-82%): the default.  MINIDNN_POOL_VEC_BWD=0 (VEC_BWD = False): the previous kernels.  (The first
# form, OV = VW outputs a thread at every window and the gather for disjoint channels-last windows, was slower than
# the previous kernels -- run 8: max 2x2 float32 0.107 ms against 0.055 -- and its setting "2" went in session 19.)
VEC_BWD = os.environ.get("MINIDNN_POOL_VEC_BWD", "1") not in ("0", "")
ROWS_MAX_WINDOW = 4         # rows kernels: KH, KW <= 4 (each thread holds KH * KW vectors in registers)


def _vw(dtype):
    """Elements of a 16-byte vector where the vector kernels take ``dtype``, else 0."""
    size = np.dtype(dtype).itemsize
    return 16 // size if not V1 and size in (2, 4) else 0


def _cl_contiguous(a):
    return a.transpose(0, 2, 3, 1).flags.c_contiguous


def _rows_shape(geom, n, c, vw):
    """(threads, segments per row) of the rows kernels: OV = vw outputs per thread."""
    segs = -(-geom.out_sizes[1] // vw)
    return n * c * geom.out_sizes[0] * segs, segs


def rows_applies(geom, n, c, dtype, exact=False):
    """The rows kernels' windows: stride = window <= 4 x 4, no padding or dilation, every window inside x (forward),
    tiling x exactly (``exact``: the backward, which writes every element of dx)."""
    vw = _vw(dtype)
    (h, w), (oh, ow), (kh, kw) = geom.spatial, geom.out_sizes, geom.window
    if not vw or tuple(geom.stride) != tuple(geom.window) or any(geom.padding) or geom.dilated \
            or kh > ROWS_MAX_WINDOW or kw > ROWS_MAX_WINDOW:
        return False
    if (oh * kh, ow * kw) != (h, w) if exact else (oh * kh > h or ow * kw > w):
        return False
    return _rows_shape(geom, n, c, vw // kw if exact and vw % kw == 0 else vw)[0] < _INT_MAX


def clv_applies(geom, c, dtype, positions):
    """The channels-last vector kernels: C a multiple of the vector width, under 2**31 vectors."""
    vw = _vw(dtype)
    return bool(vw) and c % vw == 0 and positions * (c // vw) < _INT_MAX


def bwd_outputs_per_thread(geom, vw):
    """pool_bwd_rows' OV: VW / KW where KW divides VW (one 16-byte vector of each dx row a thread, contiguous across
    a warp), else VW (KW vectors a row)."""
    kw = geom.window[1]
    return vw // kw if vw % kw == 0 else vw


def _rows_args(geom, n, c, h, w, vw):
    total, segs = _rows_shape(geom, n, c, vw)
    oh, ow = geom.out_sizes
    return [None, None, None] + [np.int32(v) for v in (h, w, oh, ow)] + \
        [np.uint32(total), np.int32(segs), *_divider(segs), *_divider(oh)], total


# ---- plans: everything but the arrays, once per call signature ------------------------------------------------

class _Plan:
    """A settled pooling call: ``plan(a, b)`` allocates the output(s) on ``dev`` in memory shape ``mem`` (viewed
    channels-first through ``back``), and makes the prepared launch, ``go`` (``go16``: a kernel with 16-byte
    vectors, taken when the input pointers (x; dy and argmax) are 16-byte aligned, ``go`` the one that needs no
    alignment)."""
    __slots__ = ("dev", "mem", "back", "spec", "dtype", "adt", "go", "go16", "kind")

    def __call__(self, a, b=None):
        cp = _launch._cp
        with _launch.on_device(self.dev):
            spec = self.spec         # a channels-last global average: the output made in one step (round 22b)
            out = _ws.fresh(cp, self.dev, "pool", self.mem, self.dtype, spec)
            kind = self.kind
            if kind == 0:                                      # pooling forward: (x) -> y, argmax or None
                arg = None if self.adt is None else _ws.fresh(cp, self.dev, "pool.arg", self.mem, self.adt)
                go = self.go16
                (go if go is not None and not a.data.ptr & 15 else self.go)(a, out, out if arg is None else arg)
                if self.back is not None:                     # (spec is None: the windowed kernels write the
                    out = out.transpose(self.back)            # NHWC-shaped allocation, tools/emulate_pool_vec.py)
                    if arg is not None:
                        arg = arg.transpose(self.back)
                return out, arg
            if kind == 1:                                      # pooling backward: (dy, argmax or None) -> dx
                b = a if b is None else b
                go = self.go16
                (go if go is not None and not (a.data.ptr | b.data.ptr) & 15 else self.go)(a, b, out)
            else:                                              # global average: (x) -> y, or (dy) -> dx
                go = self.go16
                (go if go is not None and not a.data.ptr & 15 else self.go)(a, out)
        if spec is None and self.back is not None:
            out = out.transpose(self.back)
        return (out, None) if kind == 2 else out


_plans: dict = {}


def _geom_key(geom):
    return (geom.mode, geom.window, geom.padding, geom.stride, geom.dilation, geom.spatial, geom.out_sizes)


def forward_plan(geom, xc):
    """The plan of ``pool(xc)``: calling it with xc gives (y, argmax or None) as channels-first views in x's memory
    order (channels-last stays channels-last)."""
    dev = xc.data.device_id
    return _launch.planned(_plans, ("fwd", xc.shape, xc.strides, xc.dtype, dev) + _geom_key(geom),
                           _forward_plan, geom, xc, dev)


def _out_layout(plan, shape, cl, global_average=False):
    n, c, h, w = shape
    plan.mem, plan.back = ((n, h, w, c), (0, 3, 1, 2)) if cl else (tuple(shape), None)
    plan.spec = strided_spec(plan.mem, plan.back, plan.dtype) if global_average else None


def _forward_plan(geom, xc, dev):
    plan = _Plan()
    plan.dev, plan.dtype = dev, xc.dtype
    n, c, h, w = xc.shape
    cl = is_channels_last(xc)
    if is_global_average(geom) and (xc.flags.c_contiguous or cl):
        plan.kind, plan.adt = 2, None
        _out_layout(plan, geom.y_shape, cl, True)
        L = h * w
        if xc.flags.c_contiguous:          # NCHW (also C == 1 or H*W == 1, where both orders coincide)
            planes, vec = n * c, _vec(L, xc.dtype)
            team = 32
            while team < 256 and planes * team < _launch.sm_count(dev) * 2048 and L // vec >= team * 4:
                team *= 2
            tpb = (256 if team == 32 else team) // team
            grid = (max(1, min((planes + tpb - 1) // tpb, _launch.sm_count(dev) * (2048 // team // tpb))),)
            block = (256 if team == 32 else team,)
            args = [None, None, np.int32(planes), np.int32(L)]
            plan.go = _launch.prepare(_kernel("gap_fwd", xc.dtype, np.uint8, False, False, False, team=team),
                                      grid, block, args)
            plan.go16 = None if vec == 1 else _launch.prepare(
                _kernel("gap_fwd", xc.dtype, np.uint8, False, False, False, team=team, vec=vec), grid, block, args)
        else:
            tiles = (c + 31) // 32
            grid = (max(1, min(n * tiles, _launch.sm_count(dev) * 8)),)
            plan.go = _launch.prepare(_kernel("gap_fwd_cl", xc.dtype, np.uint8, True, False, False), grid,
                                      (THREADS,), [None, None, np.int32(n), np.int32(L), np.int32(c)])
            plan.go16 = None
        return plan
    is_max = geom.mode.is_max
    adt = arg_dtype(geom)
    plan.kind, plan.adt = 0, (adt if is_max else None)
    _out_layout(plan, geom.y_shape, cl)
    include = geom.mode.name == "AVERAGE_COUNT_INCLUDE_PADDING"
    plan.go16 = None
    if not cl and xc.flags.c_contiguous and rows_applies(geom, n, c, xc.dtype):
        vw = _vw(xc.dtype)
        args, total = _rows_args(geom, n, c, h, w, vw)
        kh, kw = geom.window
        sv = math.gcd(geom.out_sizes[1], vw)
        grid = _full_grid(total)
        plan.go = _launch.prepare(_vec_kernel("pool_fwd_rows", xc.dtype, adt, is_max, include, True, kh, kw, sv),
                                  grid, (THREADS,), args)
        if w % vw == 0:
            plan.go16 = _launch.prepare(_vec_kernel("pool_fwd_rows", xc.dtype, adt, is_max, include, True, kh, kw,
                                                    sv, vin=1), grid, (THREADS,), args)
        return plan
    k = _kernel("pool_fwd", xc.dtype, adt, cl, is_max, include)
    plan.go = _launch.prepare(k, _grid(math.prod(geom.y_shape), dev), (THREADS,),
                              [None, None, None] + _geo(geom, n, c) + _strides(xc) + _dividers(c, *geom.out_sizes, cl))
    oh, ow = geom.out_sizes
    if cl and clv_applies(geom, c, xc.dtype, n * oh * ow):
        vw = _vw(xc.dtype)
        total = n * oh * ow * (c // vw)
        plan.go16 = _launch.prepare(_vec_kernel("pool_fwd_clv", xc.dtype, adt, is_max, include, False),
                                    _full_grid(total), (THREADS,), [None, None, None] + _geo(geom, n, c) +
                                    [np.uint32(total), *_divider(c // vw), *_divider(ow), *_divider(oh)])
    return plan


def backward_plan(geom, dyc, argmax_c, x_shape, dtype, x_channels_last=False):
    """The plan of the backward: calling it with (dyc, argmax_c) gives dx (a channels-first view, in dy's memory
    order; in x's when dy's spatial size is 1 and its order ambiguous)."""
    dev = dyc.data.device_id
    key = ("bwd", dyc.shape, dyc.strides, None if argmax_c is None else (argmax_c.strides, argmax_c.dtype),
           tuple(x_shape), dtype, bool(x_channels_last), dev) + _geom_key(geom)
    return _launch.planned(_plans, key, _backward_plan, geom, dyc, argmax_c, x_shape, dtype, x_channels_last, dev)


def _backward_plan(geom, dyc, argmax_c, x_shape, dtype, x_channels_last, dev):
    plan = _Plan()
    plan.dev, plan.dtype, plan.adt, plan.go16 = dev, dtype, None, None
    cl = is_channels_last(dyc) if dyc.shape[2] * dyc.shape[3] > 1 else bool(x_channels_last)
    n, c, h, w = x_shape
    _out_layout(plan, x_shape, cl, is_global_average(geom))
    total = n * c * h * w
    if is_global_average(geom):
        plan.kind = 3
        L = h * w
        vec = _vec(c if cl else L, dtype)
        dsn, dsc = _strides(dyc)[:2]
        args = [None, None, np.int64(total), np.int32(c), np.int32(L), dsn, dsc, *_divider(L), *_divider(c)]
        plan.go = _launch.prepare(_kernel("gap_bwd", dtype, np.uint8, cl, False, False, vec=vec),
                                  _grid(total // vec, dev, 4), (THREADS,), args)
        return plan
    plan.kind = 1
    is_max = geom.mode.is_max
    adt = argmax_c.dtype if is_max else np.dtype(np.uint8)
    arg = argmax_c if is_max else dyc
    include = geom.mode.name == "AVERAGE_COUNT_INCLUDE_PADDING"
    tail = _strides(dyc) + _strides(arg)
    vw = _vw(dtype) if VEC_BWD else 0
    if not cl and dyc.flags.c_contiguous and arg.flags.c_contiguous and vw \
            and rows_applies(geom, n, c, dtype, exact=True):
        ov = bwd_outputs_per_thread(geom, vw)
        args, total = _rows_args(geom, n, c, h, w, ov)
        kh, kw = geom.window
        sv = math.gcd(geom.out_sizes[1], ov)
        grid, vout, ovd = _full_grid(total), int(w % vw == 0), (0 if ov == vw else ov)
        plan.go = _launch.prepare(_vec_kernel("pool_bwd_rows", dtype, adt, is_max, include, True, kh, kw, sv,
                                              vout=vout, ov=ovd), grid, (THREADS,), args)
        plan.go16 = _launch.prepare(_vec_kernel("pool_bwd_rows", dtype, adt, is_max, include, True, kh, kw, sv,
                                                vdy=1, vout=vout, ov=ovd), grid, (THREADS,), args)
        return plan
    oh, ow = geom.out_sizes
    if cl and vw and _cl_contiguous(dyc) and _cl_contiguous(arg) and clv_applies(geom, c, dtype, n * h * w):
        total = n * h * w * (c // vw)
        disj = int(is_disjoint(geom))
        plan.go16 = _launch.prepare(_vec_kernel("pool_bwd_clv", dtype, adt, is_max, include, False, disj=disj),
                                    _full_grid(total), (THREADS,), [None, None, None] + _geo(geom, n, c) +
                                    [np.uint32(total), *_divider(c // vw), *_divider(w), *_divider(h)])
    if is_disjoint(geom):
        pair = not cl and geom.window[1] == 2 and w % 2 == 0
        k = _kernel("pool_bwd_disjoint", dtype, adt, cl, is_max, include, pair=pair)
        plan.go = _launch.prepare(k, _grid(math.prod(geom.y_shape), dev), (THREADS,),
                                  [None, None, None] + _geo(geom, n, c) + tail + _dividers(c, *geom.out_sizes, cl))
        return plan
    k = _kernel("pool_bwd", dtype, adt, cl, is_max, include)
    plan.go = _launch.prepare(k, _grid(total, dev), (THREADS,),
                              [None, None, None] + _geo(geom, n, c) + tail + _dividers(c, h, w, cl))
    return plan


def forward(geom, xc):
    """(y, argmax or None) as channels-first views in x's memory order (channels-last stays channels-last)."""
    return forward_plan(geom, xc)(xc)


def backward(geom, dyc, argmax_c, x_shape, dtype, x_channels_last=False):
    """dx (channels-first view, in dy's memory order; in x's when dy's spatial size is 1 and its order ambiguous)
    from dy and, for max modes, the forward's argmax."""
    return backward_plan(geom, dyc, argmax_c if geom.mode.is_max else None, x_shape, dtype,
                         x_channels_last)(dyc, argmax_c if geom.mode.is_max else None)


if __name__ == "__main__":       # python -m minidnn.backend.cuda.pool_kernels out.cu NAME=VALUE ...: source for nvcc
    import sys
    defs = dict(a.split("=", 1) for a in sys.argv[2:])
    with open(sys.argv[1], "w") as f:
        f.write("".join(f"#define {k} {v}\n" for k, v in defs.items()) + SOURCE)
