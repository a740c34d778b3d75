"""Channel-vectorised depthwise convolution kernels for channels-last (NHWC) activations (issues 9 item 2, 12).

Depthwise only (groups == C == K: one input and one output channel per group), 2-D, equal stride and dilation on
both axes, kernels up to 25 taps with sides <= 5 (1x1 .. 5x5).  Every thread owns CV consecutive channels (one
16-byte vector: 4 float32 / 8 float16-bfloat16; 8 bytes = 4 channels for 16-bit data where 8 channels' taps
would not fit in registers, i.e. over 9 taps) of a small spatial tile of outputs; its CV x R*S filter taps sit in
registers; x / dy are read as whole vectors (a warp's neighbouring threads read neighbouring vectors of one
pixel: coalesced along C); fp32 accumulation, alpha/beta blending.  A block is (CT channel-vector threads) x (SY
spatial threads): a channel slab of CT*CV channels over SY spatial tiles.

    dwn_forward            y[n,p,q,c] = sum_rs x[n, p*ST-pad_h+r*DL, q*ST-pad_w+s*DL, c] w[c,r,s]; a thread owns
                           VH x VQ outputs (walks its input window once, every landing tap compile-time).
                           FLIP=1: stride-1 backward data (dx = dy correlated with the flipped filter).
    dwn_backward_data_st   strided backward data (gather): dx[n,h,w,c] = sum over taps with (h+pad-r*DL) % ST == 0
                           (and the same for w) of dy[n, (h+pad-r*DL)/ST, ...] w[c,r,s]; a thread owns 1 x VQ dx.
    dwn_backward_filter    dw[c,r,s] = sum_{n,p,q} dy[n,p,q,c] x[n, p*ST-pad_h+r*DL, ...]: a thread accumulates
                           R*S x CV taps over the work items (n, row p, VQ columns) ty, ty+SY, ... of its block's
                           split; the block adds its SY threads' taps in ty order (shared memory, per tap), writes
                           dw (one split) or its partials; the block drawing the slab's last ticket adds the splits
                           in split order 0..S-1 (bitwise the same whichever block came last), applies alpha/beta
                           and resets the ticket.  One launch, deterministic.

V2 (session 7, default; ``MINIDNN_DW_NHWC_V2=0`` / ``V2[0] = False``: the session-5 kernels and configurations
above, exactly): the gather kernels' VH x VQ tile halves (VH first) while the grid has fewer than
FWD_MIN_BLOCKS_PER_SM blocks an SM, and a thread's CV x RS taps are read as RS whole vectors (WVEC, w's base
vector-aligned; else the scalar loads).  dwn_backward_filter's block sums take every thread in a fixed order
(taps in chunks of TC: segments of SEG rows per column, then the column's segments in order), and its splits
(about WGRAD2_BLOCKS_PER_SM blocks an SM) are summed in two ticket levels: the last block of each group of
``group`` splits adds the group's partials in split order, the last group adds the group sums in group order
(one level up to WGRAD2_ONE_LEVEL splits).  Still one launch, bitwise repeatable.  docs/conv_kernels.md,
"Session 7: channels-last depthwise for MobileNet".

Declines (the caller's old path runs): other groupings, > 25 taps, stride > 4, unequal strides / dilations, channels
not a whole number of vectors, element strides (N, H, W) not multiples of CV or base pointers not vector-aligned,
tensors of >= 2^31 elements, grids over 65535.  ``MINIDNN_DW_TILE=0`` (conv_igemm.TILE_ENABLED) or
``ENABLED[0] = False`` switches them off.  Index math emulated in tools/emulate_dw_nhwc.py.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from . import workspace as _ws

SOURCE = r"""
#ifndef ELEM
#define ELEM 0
#endif
#ifndef KR
#define KR 3
#define KS 3
#define ST 1
#define DL 1
#endif
#ifndef CV
#define CV 4
#endif
#ifndef VH
#define VH 1
#endif
#ifndef VQ
#define VQ 4
#endif
#ifndef FLIP
#define FLIP 0
#endif
#ifndef V2
#define V2 0            // session 7: filter gradient's two-stage block sums and two-level split tickets
#endif
#ifndef WVEC
#define WVEC 0          // 1: a thread's CV x RS taps read as RS whole vectors (w CV-vector aligned), not RS*CV scalars
#endif
#ifndef TC
#define TC 1            // V2 filter gradient: taps per shared-memory chunk of the block sums (a divisor of RS)
#endif
#ifndef SEG
#define SEG 8           // V2 filter gradient: rows per first-stage segment of the block sums
#endif
#if ELEM == 0
typedef float T;
#define EB 4
#else
typedef unsigned short T;
#define EB 2
#endif
#ifndef DWF32
#define DWF32 0         // 1: dwn_backward_filter of half data writes dw in float32 (autocast's weight gradients)
#endif
#if DWF32
typedef float DwT;
#else
typedef T DwT;
#endif
#if CV * EB == 16
typedef uint4 VecT;
#elif CV * EB == 8
typedef uint2 VecT;
#else
#error "CV * sizeof(T) must be 8 or 16 bytes"
#endif
#define RS (KR * KS)
#define IRH ((VH - 1) * ST + (KR - 1) * DL + 1)
#define IWN ((VQ - 1) * ST + (KS - 1) * DL + 1)
union VecU { VecT v; T e[CV]; };

__device__ __forceinline__ float cvt_in(float v) { return v; }
__device__ __forceinline__ float cvt_in(unsigned short h) {
#if ELEM == 2
    return __uint_as_float(((unsigned int)h) << 16);
#else
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#endif
}
__device__ __forceinline__ void cvt_out(float& d, float v) { d = v; }
__device__ __forceinline__ void cvt_out(unsigned short& d, float v) {
#if ELEM == 2
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(d) : "f"(v));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(d) : "f"(v));
#endif
}
__device__ __forceinline__ void load_vec(const T* p, float (&f)[CV]) {
    VecU u;
    u.v = __ldg(reinterpret_cast<const VecT*>(p));
    #pragma unroll
    for (int c = 0; c < CV; ++c) f[c] = cvt_in(u.e[c]);
}
// the CV channels c0.. c0+CV-1's RS taps (flipped for FLIP): w is (C, RS) contiguous, so they are the RS*CV
// consecutive elements from w + c0*RS; WVEC reads them as RS whole vectors (element e = c*RS + t of the run),
// else one scalar load each.  All indices compile-time after unrolling.
__device__ __forceinline__ void load_taps(const T* __restrict__ w, int c0, float (&wt)[RS][CV], bool flip) {
#if WVEC
    const VecT* wp = reinterpret_cast<const VecT*>(w + c0 * RS);
    #pragma unroll
    for (int v = 0; v < RS; ++v) {
        VecU u;
        u.v = __ldg(wp + v);
        #pragma unroll
        for (int k = 0; k < CV; ++k) {
            const int e = v * CV + k, c = e / RS, t = e - (e / RS) * RS;
            wt[flip ? RS - 1 - t : t][c] = cvt_in(u.e[k]);
        }
    }
#else
    #pragma unroll
    for (int c = 0; c < CV; ++c)
        #pragma unroll
        for (int t = 0; t < RS; ++t) wt[t][c] = cvt_in(__ldg(w + (c0 + c) * RS + (flip ? RS - 1 - t : t)));
#endif
}
// alpha * acc (+ beta * old) stored as one vector
__device__ __forceinline__ void store_vec(T* p, const float (&a)[CV], float alpha, float beta) {
    VecU u;
    float o[CV];
    #pragma unroll
    for (int c = 0; c < CV; ++c) o[c] = alpha * a[c];
    if (beta != 0.f) {
        u.v = *reinterpret_cast<const VecT*>(p);
        #pragma unroll
        for (int c = 0; c < CV; ++c) o[c] += beta * cvt_in(u.e[c]);
    }
    #pragma unroll
    for (int c = 0; c < CV; ++c) cvt_out(u.e[c], o[c]);
    *reinterpret_cast<VecT*>(p) = u.v;
}
// work item `it` -> (n, first output row, first output column) of a VH x VQ tile
__device__ __forceinline__ void decode_item(int it, int tiles, int tiles_q, int& n, int& p0, int& q0) {
    n = it / tiles;
    const int t = it - n * tiles, tp = t / tiles_q;
    p0 = tp * VH;
    q0 = (t - tp * tiles_q) * VQ;
}

// ---- forward (FLIP=1: stride-1 backward data) ----------------------------------------------------------------
// block (CT, SY): threadIdx.x = channel vector within the slab, threadIdx.y = work item within the block's SY;
// grid (channel slabs, item groups).  in: (N, H, W, C) through element strides (sin_n, sin_h, sin_w; channel
// stride 1); out: (N, P, Q, C) likewise; w: (C, 1, KR, KS) contiguous.
extern "C" __global__ void __launch_bounds__(256)
dwn_forward(const T* __restrict__ in, const T* __restrict__ w, T* __restrict__ out,
            int C, int H, int W, int P, int Q, int pad_h, int pad_w,
            int sin_n, int sin_h, int sin_w, int sout_n, int sout_h, int sout_w,
            int tiles_q, int tiles, int items, float alpha, float beta)
{
    const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * CV;
    const int it = blockIdx.y * blockDim.y + threadIdx.y;
    if (c0 >= C || it >= items) return;                 // no barrier below
    int n, p0, q0;
    decode_item(it, tiles, tiles_q, n, p0, q0);
    float wt[RS][CV];
    load_taps(w, c0, wt, FLIP != 0);
    float acc[VH][VQ][CV];
    #pragma unroll
    for (int i = 0; i < VH; ++i)
        #pragma unroll
        for (int j = 0; j < VQ; ++j)
            #pragma unroll
            for (int c = 0; c < CV; ++c) acc[i][j][c] = 0.f;
    const T* ib = in + n * sin_n + c0;
    const int hb = p0 * ST - pad_h, wb = q0 * ST - pad_w;
    #pragma unroll
    for (int ir = 0; ir < IRH; ++ir) {
        const int h = hb + ir;
        if ((unsigned)h >= (unsigned)H) continue;
        const T* row = ib + h * sin_h;
        #pragma unroll
        for (int ic = 0; ic < IWN; ++ic) {
            const int wq = wb + ic;
            if ((unsigned)wq >= (unsigned)W) continue;
            float xv[CV];
            load_vec(row + wq * sin_w, xv);
            #pragma unroll
            for (int i = 0; i < VH; ++i) {
                const int dr = ir - i * ST;                  // compile-time after unrolling
                if (dr < 0 || dr % DL != 0 || dr / DL >= KR) continue;
                #pragma unroll
                for (int j = 0; j < VQ; ++j) {
                    const int ds = ic - j * ST;
                    if (ds < 0 || ds % DL != 0 || ds / DL >= KS) continue;
                    const int t = (dr / DL) * KS + ds / DL;
                    #pragma unroll
                    for (int c = 0; c < CV; ++c) acc[i][j][c] = fmaf(wt[t][c], xv[c], acc[i][j][c]);
                }
            }
        }
    }
    T* ob = out + n * sout_n + c0;
    #pragma unroll
    for (int i = 0; i < VH; ++i) {
        if (p0 + i >= P) break;
        #pragma unroll
        for (int j = 0; j < VQ; ++j) {
            if (q0 + j >= Q) break;
            store_vec(ob + (p0 + i) * sout_h + (q0 + j) * sout_w, acc[i][j], alpha, beta);
        }
    }
}

// ---- strided backward data (gather; one dx row per thread, VH unused) ------------------------------------
// dy: (N, P, Q, C) strides sdy_*; dx: (N, H, W, C) strides sdx_*; items over (n, dx row, VQ dx columns).
extern "C" __global__ void __launch_bounds__(256)
dwn_backward_data_st(const T* __restrict__ w, const T* __restrict__ dy, T* __restrict__ dx,
                     int C, int H, int W, int P, int Q, int pad_h, int pad_w,
                     int sdy_n, int sdy_h, int sdy_w, int sdx_n, int sdx_h, int sdx_w,
                     int tiles_q, int tiles, int items, float alpha, float beta)
{
    const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * CV;
    const int it = blockIdx.y * blockDim.y + threadIdx.y;
    if (c0 >= C || it >= items) return;
    const int n = it / tiles, t0 = it - n * tiles, h = t0 / tiles_q, w0 = (t0 - h * tiles_q) * VQ;   // one row
    float wt[RS][CV];
    load_taps(w, c0, wt, false);
    const T* db = dy + n * sdy_n + c0;
    T* xb = dx + n * sdx_n + h * sdx_h + c0;
    #pragma unroll
    for (int j = 0; j < VQ; ++j) {
        const int wq = w0 + j;
        if (wq >= W) break;
        float acc[CV];
        #pragma unroll
        for (int c = 0; c < CV; ++c) acc[c] = 0.f;
        #pragma unroll
        for (int r = 0; r < KR; ++r) {
            const int hh = h + pad_h - r * DL;
            if (hh < 0 || hh % ST != 0 || hh / ST >= P) continue;     // ST compile-time: shifts / multiplies
            const T* drow = db + (hh / ST) * sdy_h;
            #pragma unroll
            for (int s = 0; s < KS; ++s) {
                const int ww = wq + pad_w - s * DL;
                if (ww < 0 || ww % ST != 0 || ww / ST >= Q) continue;
                float dv[CV];
                load_vec(drow + (ww / ST) * sdy_w, dv);
                #pragma unroll
                for (int c = 0; c < CV; ++c) acc[c] = fmaf(wt[r * KS + s][c], dv[c], acc[c]);
            }
        }
        store_vec(xb + wq * sdx_w, acc, alpha, beta);
    }
}

// ---- filter gradient -------------------------------------------------------------------------------------------
// block (CT, SY), grid (channel slabs, splits); split b takes items [b*per_split, min(items, (b+1)*per_split)),
// thread ty its items begin+ty, begin+ty+SY, ...  Dynamic shared memory: SY * CT * CV floats.
// partial[((slab * splits + b) * RS + t) * SLAB + col], SLAB = CT * CV, col = channel within the slab.
extern "C" __global__ void __launch_bounds__(256)
dwn_backward_filter(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ partial,
                    unsigned int* __restrict__ tickets, DwT* __restrict__ dw,
                    int C, int H, int W, int P, int Q, int pad_h, int pad_w,
                    int sx_n, int sx_h, int sx_w, int sdy_n, int sdy_h, int sdy_w,
                    int tiles_q, int tiles, int items, int per_split, int group, float alpha, float beta)
{
    extern __shared__ float buf[];
    __shared__ int s_last;
    const int CT = blockDim.x, SY = blockDim.y, SLAB = CT * CV, nthr = CT * SY;
    const int tx = threadIdx.x, ty = threadIdx.y, l = ty * CT + tx;
    const int slab = blockIdx.x, c0 = slab * SLAB + tx * CV;
    const int begin = blockIdx.y * per_split, end = min(items, begin + per_split);
    float acc[RS][CV];
    #pragma unroll
    for (int t = 0; t < RS; ++t)
        #pragma unroll
        for (int c = 0; c < CV; ++c) acc[t][c] = 0.f;
    if (c0 < C) {
        const T* xc = x + c0;
        const T* dc = dy + c0;
        for (int it = begin + ty; it < end; it += SY) {
            int n, p0, q0;
            decode_item(it, tiles, tiles_q, n, p0, q0);
            float d[VH][VQ][CV];
            #pragma unroll
            for (int i = 0; i < VH; ++i)
                #pragma unroll
                for (int j = 0; j < VQ; ++j) {
                    if (p0 + i < P && q0 + j < Q) {
                        load_vec(dc + n * sdy_n + (p0 + i) * sdy_h + (q0 + j) * sdy_w, d[i][j]);
                    } else {
                        #pragma unroll
                        for (int c = 0; c < CV; ++c) d[i][j][c] = 0.f;
                    }
                }
            const T* xn = xc + n * sx_n;
            const int hb = p0 * ST - pad_h, wb = q0 * ST - pad_w;
            #pragma unroll
            for (int ir = 0; ir < IRH; ++ir) {
                const int h = hb + ir;
                if ((unsigned)h >= (unsigned)H) continue;
                #pragma unroll
                for (int ic = 0; ic < IWN; ++ic) {
                    const int wq = wb + ic;
                    if ((unsigned)wq >= (unsigned)W) continue;
                    float xv[CV];
                    load_vec(xn + h * sx_h + wq * sx_w, xv);
                    #pragma unroll
                    for (int i = 0; i < VH; ++i) {
                        const int dr = ir - i * ST;
                        if (dr < 0 || dr % DL != 0 || dr / DL >= KR) continue;
                        #pragma unroll
                        for (int j = 0; j < VQ; ++j) {
                            const int ds = ic - j * ST;
                            if (ds < 0 || ds % DL != 0 || ds / DL >= KS) continue;
                            const int t = (dr / DL) * KS + ds / DL;
                            #pragma unroll
                            for (int c = 0; c < CV; ++c) acc[t][c] = fmaf(d[i][j][c], xv[c], acc[t][c]);
                        }
                    }
                }
            }
        }
    }
#if V2
    // V2 block sums, every thread taking part, in a fixed order: taps in chunks of TC (a divisor of RS); the chunk's
    // COLS = TC*SLAB columns of SY rows go to shared memory (buf[ty*COLS + k*SLAB + tx*CV + c]); stage 1 adds
    // segments of SEG rows (task = (segment, column)), stage 2 adds a column's segments in segment order.
    // Dynamic shared memory: (SY + NSEG) * COLS floats.
    const int splits = gridDim.y, COLS = TC * SLAB, NSEG = (SY + SEG - 1) / SEG;
    float* segs = buf + SY * COLS;
    DwT* dws = dw + (long long)(slab * SLAB) * RS;
    float* part = partial + (long long)(slab * splits + blockIdx.y) * RS * SLAB;
    #pragma unroll
    for (int t0 = 0; t0 < RS; t0 += TC) {
        #pragma unroll
        for (int k = 0; k < TC; ++k)
            #pragma unroll
            for (int c = 0; c < CV; ++c) buf[ty * COLS + k * SLAB + tx * CV + c] = acc[t0 + k][c];
        __syncthreads();
        for (int task = l; task < NSEG * COLS; task += nthr) {
            const int sg = task / COLS, col = task - sg * COLS, y0 = sg * SEG;
            float v = 0.f;
            #pragma unroll
            for (int k = 0; k < SEG; ++k)
                if (y0 + k < SY) v += buf[(y0 + k) * COLS + col];
            segs[sg * COLS + col] = v;
        }
        __syncthreads();
        for (int col = l; col < COLS; col += nthr) {
            float v = 0.f;
            for (int sg = 0; sg < NSEG; ++sg) v += segs[sg * COLS + col];
            const int t = t0 + col / SLAB, cc = col - (col / SLAB) * SLAB;
            if (splits == 1) {
                if (slab * SLAB + cc < C) {
                    DwT* dst = dws + cc * RS + t;
                    const float old = beta != 0.f ? beta * cvt_in(*dst) : 0.f;
                    cvt_out(*dst, alpha * v + old);
                }
            } else {
                part[t * SLAB + cc] = v;
            }
        }
        __syncthreads();                   // buf / segs taken by the next chunk
    }
    if (splits == 1) return;
    // two-level split sums: the splits form groups of `group`; the last block of a group (its ticket) adds the
    // group's partials in split order (NG == 1: into dw), writes the group sum and draws the slab's ticket; the
    // last group adds the NG group sums in group order into dw.  Tickets per slab: NG group tickets + 1, each
    // reset by the block that drew its last value.  Order fixed: bitwise the same whichever blocks came last.
    const int NG = (splits + group - 1) / group, g = blockIdx.y / group;
    const int gb = g * group, ge = min(splits, gb + group);
    const long long RSL = (long long)RS * SLAB;
    unsigned int* tk = tickets + slab * (NG + 1);
    __threadfence();                       // this block's partials visible device-wide ...
    __syncthreads();                       // ... before thread 0 draws the group's ticket
    if (l == 0) s_last = atomicAdd(tk + g, 1u) == (unsigned)(ge - gb - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();                       // the group's partials, published before their tickets
    const float* ps = partial + slab * splits * RSL;
    float* gsum = partial + (long long)gridDim.x * splits * RSL + slab * NG * RSL;
    for (int idx = l; idx < RS * SLAB; idx += nthr) {
        const int t = idx / SLAB, col = idx - t * SLAB;
        float v = 0.f;
        #pragma unroll 8
        for (int b = gb; b < ge; ++b) v += __ldcg(ps + b * RSL + idx);          // split order within the group
        if (NG > 1) {
            gsum[g * RSL + idx] = v;
        } else if (slab * SLAB + col < C) {
            DwT* dst = dws + col * RS + t;
            const float old = beta != 0.f ? beta * cvt_in(*dst) : 0.f;
            cvt_out(*dst, alpha * v + old);
        }
    }
    if (l == 0) tk[g] = 0u;                // every block of the group has drawn
    if (NG == 1) return;
    __threadfence();                       // the group sum visible ...
    __syncthreads();                       // ... (and every thread past s_last) before the slab's ticket
    if (l == 0) s_last = atomicAdd(tk + NG, 1u) == (unsigned)(NG - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int idx = l; idx < RS * SLAB; idx += nthr) {
        const int t = idx / SLAB, col = idx - t * SLAB;
        if (slab * SLAB + col >= C) continue;
        float v = 0.f;
        #pragma unroll 8
        for (int gg = 0; gg < NG; ++gg) v += __ldcg(gsum + gg * RSL + idx);       // group order
        DwT* dst = dws + col * RS + t;
        const float old = beta != 0.f ? beta * cvt_in(*dst) : 0.f;
        cvt_out(*dst, alpha * v + old);
    }
    if (l == 0) tk[NG] = 0u;
#else
    // the block's sum per (tap, channel): SY rows added in ty order by the thread owning the column
    const int splits = gridDim.y;
    DwT* dws = dw + (long long)(slab * SLAB) * RS;
    float* part = partial + (long long)(slab * splits + blockIdx.y) * RS * SLAB;
    #pragma unroll
    for (int t = 0; t < RS; ++t) {
        #pragma unroll
        for (int c = 0; c < CV; ++c) buf[ty * SLAB + tx * CV + c] = acc[t][c];
        __syncthreads();
        for (int col = l; col < SLAB; col += nthr) {
            float v = 0.f;
            for (int yy = 0; yy < SY; ++yy) v += buf[yy * SLAB + col];
            if (splits == 1) {
                if (slab * SLAB + col < C) {
                    DwT* dst = dws + col * RS + t;
                    const float old = beta != 0.f ? beta * cvt_in(*dst) : 0.f;
                    cvt_out(*dst, alpha * v + old);
                }
            } else {
                part[t * SLAB + col] = v;
            }
        }
        __syncthreads();
    }
    if (splits == 1) return;
    __threadfence();                       // this block's partials visible device-wide ...
    __syncthreads();                       // ... before thread 0 draws the slab's ticket
    if (l == 0) s_last = atomicAdd(tickets + slab, 1u) == (unsigned)splits - 1u;
    __syncthreads();
    if (!s_last) return;
    __threadfence();                       // the other splits' partials, published before their tickets
    const float* ps = partial + (long long)slab * splits * RS * SLAB;
    for (int idx = l; idx < RS * SLAB; idx += nthr) {
        const int t = idx / SLAB, col = idx - t * SLAB;
        if (slab * SLAB + col >= C) continue;
        float v = 0.f;
        for (int b = 0; b < splits; ++b) v += __ldcg(ps + (long long)b * RS * SLAB + idx);   // split order
        DwT* dst = dws + col * RS + t;
        const float old = beta != 0.f ? beta * cvt_in(*dst) : 0.f;
        cvt_out(*dst, alpha * v + old);
    }
    if (l == 0) tickets[slab] = 0u;        // every split has drawn: free for the next launch
#endif
}
"""

ENABLED = [os.environ.get("MINIDNN_DW_TILE", "1") != "0"]     # also off with conv_igemm.TILE_ENABLED[0] = False
# session 7 (MobileNet-small's small layers): smaller per-thread tiles where the grid would not fill the GPU, taps
# read as vectors, the filter gradient's parallel block sums and two-level split sums; MINIDNN_DW_NHWC_V2=0: the
# session-5 kernels and configurations exactly (the GPU A/B)
V2 = [os.environ.get("MINIDNN_DW_NHWC_V2", "1") != "0"]
MAX_TAPS = 25
MAX_STRIDE = 4
WGRAD_TARGET_BLOCKS_PER_SM = 8
FWD_MIN_BLOCKS_PER_SM = 1.5          # V2 forward / backward data: the tile shrinks until the grid has this many
WGRAD2_BLOCKS_PER_SM = 2             # V2 filter gradient: blocks aimed at (one resident wave at ~128 registers)
WGRAD2_ONE_LEVEL = 16                # V2 filter gradient: up to this many splits, one level of split sums
SEG = 8                              # the kernel's SEG: rows per first-stage segment of the V2 block sums
_ELEM = {"float32": 0, "float16": 1, "bfloat16": 2}
_fwd_plans: dict = {}
_dgrad_plans: dict = {}
_wgrad_plans: dict = {}


# ---- configuration (shared with tools/emulate_dw_nhwc.py) --------------------------------------------------------

def vector(itemsize, taps):
    """CV: channels per thread -- one 16-byte vector, but 4 channels (8 bytes) for 16-bit data over 9 taps (8
    channels x 25 taps of fp32 weights / accumulators would not fit in registers)."""
    cv = 16 // itemsize
    return 4 if cv * taps > 72 else cv


def tile(direction, cv, stride):
    """(VH, VQ) outputs per thread: 32 fp32 accumulators in the forward (2 x 4 for CV 4, 1 x 4 for CV 8), one row
    for strided backward data and for the filter gradient (whose taps are the accumulators; VQ*CV = 16 dy values)."""
    if direction == "forward":
        return (2 if cv == 4 else 1), 4
    if direction == "backward_data_st":
        return 1, 4
    return 1, (4 if cv == 4 else 2)


def gather_tile(direction, cv, stride, N, C, rows, cols, sms, v2):
    """(VH, VQ) of dwn_forward ("forward": the forward and stride-1 backward data) or dwn_backward_data_st over
    ``rows`` x ``cols`` outputs per image: session 5's tile (``tile``), but with V2 halved (VH first, then VQ)
    while the grid has fewer than FWD_MIN_BLOCKS_PER_SM blocks per SM (MobileNet-small's 16^2 / 8^2 layers at
    batch 128 ran 64-128 blocks of 256 threads on 132 SMs): more threads, each with a shorter load chain."""
    vh, vq = tile(direction, cv, stride)
    while v2 and (vh > 1 or vq > 1):
        ct, sy, slabs, groups = grid_config(C, cv, N * -(-rows // vh) * -(-cols // vq))
        if slabs * groups >= FWD_MIN_BLOCKS_PER_SM * sms:
            break
        vh, vq = (vh // 2, vq) if vh > 1 else (vh, vq // 2)
    return vh, vq


def chunk_taps(taps, cv):
    """TC of the V2 filter gradient: the largest divisor of RS with TC*CV <= 32 (block sums in shared memory of
    at most 256 * 32 floats per chunk)."""
    return max(d for d in range(1, taps + 1) if taps % d == 0 and d * cv <= 32) if cv <= 32 else 1


def channel_threads(nvec):
    """CT: channel-vector threads per block -- every vector up to 32, else the CT in 16..32 wasting fewest."""
    if nvec <= 32:
        return nvec
    return min(range(16, 33), key=lambda t: (-(-nvec // t) * t, -t))


def grid_config(C, cv, items):
    """(CT, SY, slabs, item groups) of the forward / backward-data kernels: CT x SY <= 256 threads (SY >= 1)."""
    ct = channel_threads(C // cv)
    sy = max(1, min(256 // ct, items))
    return ct, sy, -(-(C // cv) // ct), -(-items // sy)


def wgrad_config(C, cv, items, sms=132, v2=False):
    """(CT, SY, slabs, splits, per_split, group) of dwn_backward_filter: SY >= CV spatial threads (so the CT*SY
    threads cover the CT*CV columns of session 5's block reduction).  Session 5: splits aiming at
    WGRAD_TARGET_BLOCKS_PER_SM blocks per SM, each thread taking >= 2 items where the split has them, one level of
    split sums (group = splits).  V2: WGRAD2_BLOCKS_PER_SM blocks per SM (one item per thread allowed: the sums
    no longer cost a serial pass per thread), split sums in groups of ~sqrt(splits) past WGRAD2_ONE_LEVEL."""
    ct = channel_threads(C // cv)
    sy = max(cv, 256 // ct)
    while sy // 2 >= cv and sy // 2 * 4 >= items:      # small problems: fewer idle rows (SY stays >= CV)
        sy //= 2
    slabs = -(-(C // cv) // ct)
    steps = -(-items // sy)
    if v2:
        want = max(1, -(-WGRAD2_BLOCKS_PER_SM * sms // slabs))
        iters = max(1, -(-steps // want), -(-steps // 65535))
    else:
        want = max(1, -(-WGRAD_TARGET_BLOCKS_PER_SM * sms // slabs))
        iters = max(min(2, steps), -(-steps // want), -(-steps // 65535))
    per_split = iters * sy
    splits = -(-items // per_split)
    group = splits
    if v2 and splits > WGRAD2_ONE_LEVEL:
        group = min(splits - 1, math.isqrt(splits - 1) + 1)     # ceil(sqrt(splits)): <= group groups of <= group
    return ct, sy, slabs, splits, per_split, group


def window_ok(R, S, stride, dil, vq):
    return (vq - 1) * stride + (S - 1) * dil + 1 <= 24 and (R - 1) * dil + 2 * stride <= 24


# ---- eligibility -----------------------------------------------------------------------------------------------

def _vec_ok(a, cv, base=True):
    """a (N, C, H, W)-indexed view: channel stride 1, other element strides multiples of CV, base CV-aligned
    (``base`` False: the layout only, whatever the base address)."""
    item = a.itemsize
    if a.ndim != 4 or a.strides[1] != item or a.size >= 2 ** 31:
        return False
    if any((s // item) % cv or s % item for s in (a.strides[0], a.strides[2], a.strides[3])):
        return False
    return not base or a.data.ptr % (cv * item) == 0


def supports(direction, p, *acts) -> str | None:
    """None where the kernel of ``direction`` ("forward", "backward_data", "backward_filter") takes the problem
    with these activations (channels-first views), else why not."""
    if not ENABLED[0]:
        return "switched off (MINIDNN_DW_TILE=0 / ENABLED)"
    return _why_not(p, acts, True)


def declines_layout(p, *acts) -> bool:
    """True where ``supports`` declines every call of this problem whose activations have these arrays' shapes,
    strides and dtype, whatever their base addresses and the switches (ENABLED, V2) say: the direct kernels' route
    after this module's decline can then be settled once per signature (conv_igemm.settle_direct).  False where a
    call of that signature may be taken (an aligned base, the module switched on)."""
    return _why_not(p, acts, False) is not None


def _why_not(p, acts, base):
    if p.nd != 2 or p.groups != p.C or p.K != p.C:
        return "depthwise (groups == C == K) 2-D only"
    (R, S), st, dil = p.kernel, p.stride[0], p.dilation[0]
    if p.stride[1] != st or p.dilation[1] != dil or st > MAX_STRIDE or R * S > MAX_TAPS or max(R, S) > 5:
        return "equal strides <= 4 and dilations, <= 5x5 taps"
    if p.dtype not in _ELEM:
        return f"dtype {p.dtype}"
    cv = vector(acts[0].itemsize, R * S)
    if p.C % cv:
        return f"channels not whole {cv}-channel vectors"
    if not window_ok(R, S, st, dil, 4):
        return "window over 24 columns"
    if not all(_vec_ok(a, cv, base) for a in acts):
        return "activations not channels-last with vector-aligned strides and base"
    return None


def _opts(dtype_name, R, S, st, dil, cv, vh, vq, flip=0, v2=False, wvec=False, tc=1):
    o = (f"-DELEM={_ELEM[dtype_name]}", f"-DKR={R}", f"-DKS={S}", f"-DST={st}", f"-DDL={dil}", f"-DCV={cv}",
         f"-DVH={vh}", f"-DVQ={vq}", f"-DFLIP={flip}")
    return o + (("-DV2=1", f"-DWVEC={int(wvec)}", f"-DTC={tc}", f"-DSEG={SEG}") if v2 else ())


def _w_vec_ok(w, cv):
    """The V2 gather kernels read a thread's taps as vectors: w contiguous, its base CV-vector aligned."""
    return w.flags.c_contiguous and w.data.ptr % (cv * w.itemsize) == 0


def _el(a):
    return tuple(int(s) // a.itemsize for s in a.strides)


# ---- launchers -------------------------------------------------------------------------------------------------

def _gather_plan(name, p, inp, out, in_hw, out_hw, pad, st, flip, alpha, beta, v2=False, wvec=False, sms=132):
    """Prepared launch of dwn_forward (the forward, or FLIP stride-1 backward data) or dwn_backward_data_st."""
    (H, W), (P, Q) = in_hw, out_hw
    R, S = p.kernel
    cv = vector(inp.itemsize, R * S)
    direction = "backward_data_st" if name == "dwn_backward_data_st" else "forward"
    # items run over the kernel's own outputs: y for the forward kernel, dx for the strided gather
    rows, cols = (H, W) if direction == "backward_data_st" else (P, Q)
    vh, vq = gather_tile(direction, cv, st, p.N, p.C, rows, cols, sms, v2)
    tiles_q = -(-cols // vq)
    tiles = -(-rows // vh) * tiles_q
    items = p.N * tiles
    if items >= 2 ** 31:
        return None
    ct, sy, slabs, groups = grid_config(p.C, cv, items)
    if groups > 65535:
        return None
    k = _launch.get_kernel(SOURCE, name, _opts(_dev.dtype_name(inp.dtype), R, S, st, p.dilation[0], cv, vh, vq,
                                               int(flip), v2, wvec))
    si, so = _el(inp), _el(out)
    args = [None, None, None, *(np.int32(v) for v in (p.C, H, W, P, Q, pad[0], pad[1], si[0], si[2], si[3], so[0],
                                                      so[2], so[3], tiles_q, tiles, items)),
            np.float32(alpha), np.float32(beta)]
    return _launch.prepare(k, (slabs, groups, 1), (ct, sy, 1), args)


def forward(p, x, w, y, alpha=1.0, beta=0.0) -> bool:
    """y = alpha * conv(x, w) + beta * y for NHWC depthwise ``p`` (channels-first views x, y; contiguous w) in
    one launch; False (nothing launched) where it declines."""
    if supports("forward", p, x, y) is not None:
        return False
    v2 = V2[0]
    wvec = v2 and _w_vec_ok(w, vector(x.itemsize, p.kernel[0] * p.kernel[1]))
    key = (p, x.strides, y.strides, float(alpha), float(beta), x.data.device_id, v2, wvec)
    run = _launch.planned(_fwd_plans, key, _gather_plan, "dwn_forward", p, x, y, p.in_size, p.out_size, p.padding,
                          p.stride[0], False, alpha, beta, v2, wvec, _launch.sm_count())
    if run is None:
        return False
    run(x, w, y)
    return True


def backward_data(p, w, dy, dx, alpha=1.0, beta=0.0) -> bool:
    """dx = alpha * conv_transpose(dy, w) + beta * dx, one launch: stride 1 through dwn_forward reading the filter
    flipped (where the flipped padding dil*(R-1) - pad is >= 0), strides 2-4 (and stride 1 with larger padding)
    through the gather kernel; False where it declines."""
    if supports("backward_data", p, dy, dx) is not None:
        return False
    w = _launch.cupy().ascontiguousarray(w)
    v2 = V2[0]
    wvec = v2 and _w_vec_ok(w, vector(dy.itemsize, p.kernel[0] * p.kernel[1]))
    key = (p, dy.strides, dx.strides, float(alpha), float(beta), dy.data.device_id, v2, wvec)
    run = _launch.planned(_dgrad_plans, key, _dgrad_plan, p, dy, dx, alpha, beta, v2, wvec, _launch.sm_count())
    if run is None:
        return False
    if run.gather:
        run(w, dy, dx)
    else:
        run(dy, w, dx)
    return True


class _Dgrad:
    __slots__ = ("run", "gather")

    def __init__(self, run, gather):
        self.run, self.gather = run, gather

    def __call__(self, *arrays):
        self.run(*arrays)


def _dgrad_plan(p, dy, dx, alpha, beta, v2=False, wvec=False, sms=132):
    st, dil = p.stride[0], p.dilation[0]
    fpad = tuple(dil * (r - 1) - q for r, q in zip(p.kernel, p.padding))
    if st == 1 and min(fpad) >= 0:
        run = _gather_plan("dwn_forward", p, dy, dx, p.out_size, p.in_size, fpad, 1, True, alpha, beta, v2, wvec,
                           sms)
        return None if run is None else _Dgrad(run, False)
    run = _gather_plan("dwn_backward_data_st", p, dy, dx, p.in_size, p.out_size, p.padding, st, False, alpha, beta,
                       v2, wvec, sms)
    return None if run is None else _Dgrad(run, True)


def wgrad_shared_floats(ct, sy, cv, taps, v2):
    """Dynamic shared memory (floats) of dwn_backward_filter: session 5 one tap's SY x SLAB; V2 one chunk's
    (SY + NSEG) x TC*SLAB."""
    if not v2:
        return sy * ct * cv
    return (sy + -(-sy // SEG)) * chunk_taps(taps, cv) * ct * cv


def _wgrad_plan(p, x, dy, alpha, beta, sms, wide=False, v2=False):
    (H, W), (P, Q), (R, S) = p.in_size, p.out_size, p.kernel
    cv = vector(x.itemsize, R * S)
    vh, vq = tile("backward_filter", cv, p.stride[0])
    tiles_q = -(-Q // vq)
    tiles = -(-P // vh) * tiles_q
    items = p.N * tiles
    if items >= 2 ** 31:
        return None
    ct, sy, slabs, splits, per_split, group = wgrad_config(p.C, cv, items, sms, v2)
    if splits > 65535:
        return None
    tc = chunk_taps(R * S, cv)
    k = _launch.get_kernel(SOURCE, "dwn_backward_filter", _opts(_dev.dtype_name(x.dtype), R, S, p.stride[0],
                                                               p.dilation[0], cv, vh, vq, 0, v2, False, tc)
                           + (("-DDWF32=1",) if wide else ()))
    sx, sd = _el(x), _el(dy)
    args = [None] * 5 + [np.int32(v) for v in (p.C, H, W, P, Q, p.padding[0], p.padding[1], sx[0], sx[2], sx[3],
                                               sd[0], sd[2], sd[3], tiles_q, tiles, items, per_split, group)]
    args += [np.float32(alpha), np.float32(beta)]
    run = _launch.prepare(k, (slabs, splits, 1), (ct, sy, 1), args,
                          shared_mem=4 * wgrad_shared_floats(ct, sy, cv, R * S, v2))
    if splits == 1:
        return run, 0, None
    ng = -(-splits // group)
    slab_floats = R * S * ct * cv
    partial = slabs * splits * slab_floats + (slabs * ng * slab_floats if ng > 1 else 0)
    counters = slabs * (ng + 1) if v2 else slabs
    return run, partial, _ws.split_tickets(_launch.cupy(), counters, x.data.device_id)


def backward_filter(p, x, dy, dw, alpha=1.0, beta=0.0) -> bool:
    """dw = alpha * wgrad(x, dy) + beta * dw into the contiguous (C, 1, R, S) ``dw``, one launch, deterministic;
    False where it declines.  A float32 ``dw`` for half x, dy takes the sums unrounded (DWF32=1)."""
    if supports("backward_filter", p, x, dy) is not None or not dw.flags.c_contiguous:
        return False
    v2 = V2[0]
    key = (p, x.strides, dy.strides, float(alpha), float(beta), x.data.device_id, v2)
    wide = dw.dtype != x.dtype
    if wide:
        key += (dw.dtype,)
    plan = _launch.planned(_wgrad_plans, key, _wgrad_plan, p, x, dy, alpha, beta, _launch.sm_count(), wide, v2)
    if plan is None:
        return False
    run, partial_size, tickets = plan
    # split sums written and read within this launch (each split before its ticket): a scratch buffer (workspace.py)
    partial = _ws.scratch_flat(_launch.cupy(), x.data.device_id, "conv.splitk", partial_size, np.float32) \
        if partial_size else None
    run(x, dy, partial, tickets, dw)
    return True


if __name__ == "__main__":      # python -m minidnn.backend.cuda.conv_dw_nhwc OUT.cu NAME=VALUE ... (for nvcc)
    import sys

    from minidnn.backend.cuda.launch import write_source
    write_source(sys.argv[1], SOURCE, sys.argv[2:])
