"""Softmax cross-entropy with class-index targets on the GPU: log-softmax + NLL forward in one launch, backward in one.

Shape legend: x, dx (N, C, *d) viewed as (N, C, inner) with inner = prod(d), C-contiguous; target (N, *d) int32/int64;
weight (C,) (optional, x's dtype); lse (N, *d) in A (the row's log-sum-exp, saved for backward); loss () for
'mean'/'sum', (N, *d) for 'none'; denom () in A = sum of weight[target] over rows whose target != ignore_index
(the 'mean' denominator, kept on the device: no host read anywhere).  A = float for float32 data, double for float64;
float16/bfloat16 logits (and weights) are loaded into float (LD/ST of bn_kernels' STORAGE_HEADER), lse and denom float.
Per row (n, i): q_c = (1 - eps) * w[t] * [c == t] + eps / C * w_c (0 when t == ignore_index), and
    loss = -sum_c q_c * (x_c - lse) = -((1 - eps) * w[t] * (x_t - lse) + eps / C * (sum_c w_c x_c - lse * sum_c w_c))
    dx_c = (softmax_c * sum_c q_c - q_c) * g      (g = dloss, / denom for 'mean'; ignored rows: IGNORED_DX)
IGNORED_DX (session 24): an ignored row's dx is softmax * 0 -- 0, or NaN where the row's softmax is NaN (its lse NaN:
a NaN or +inf logit; or -inf: every logit -inf), as PyTorch's log_softmax + nll_loss backward and the CPU reference
give it; written as lse - lse (0 for a finite lse, NaN otherwise), so the kernels still read no x of an ignored row.
Logits (N, C) (inner = 1): SOURCE_ROWS below (ce_rows_fwd / ce_rows_bwd), the row read once into registers with
16-byte loads; up to 1024 classes the forward takes softmax_kernels' PIPE walk (persistent grid, the next row's
loads and target issued before the current row's reduction; MINIDNN_SOFTMAX_PIPE=0: without); rows of more than one
chunk (> 16K float32 classes) stream through a shared-memory stage, the next chunk copied in while the current one is
reduced (LONG; MINIDNN_CE_LONG=0: without).  inner > 1 (spatial targets, e.g. segmentation logits (N, C, H, W)):
SOURCE_SPATIAL (ce_sp_fwd / ce_sp_bwd), a thread a position (two where inner is even), coalesced across positions,
one online pass over the classes (its comment below; sessions 21-22).  MINIDNN_CE_SPATIAL=0 and
MINIDNN_SOFTMAX_V1=1: SOURCE (ce_fwd / ce_bwd), the tiling that follows, which reads a position's classes a warp at
a time -- 32 lines for 32 values where inner > 1.
Tiling: one warp per row (8 rows per 256-thread block, grid-stride over the rows); lane l takes classes l, l + 32, ...;
shuffle reductions for the max, sum exp(x - max) and the smoothing sums.  'mean'/'sum': each warp keeps its rows'
loss and weight sums, the block adds its 8 warps in order and writes one partial; the LAST block (threadfence +
ticket, reset by that block) adds the partials in block order and writes loss and denom -- deterministic, one launch.
A target outside [0, C) that is not ignore_index makes that row's loss (and gradient) NaN: the device cannot raise,
and a host check would be a synchronisation in every step.
"""
from __future__ import annotations

import math
import os
import re

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from . import softmax_kernels as _sk
from . import workspace as _ws
from .bn_kernels import STORAGE_HEADER, type_info
from .device_facts import sm80 as _sm80
from .softmax_kernels import ROW_HEADER, WARP_REDUCE, row_defines, row_io

__all__ = ["supports", "forward", "backward", "SOURCE", "SOURCE_ROWS"]

THREADS = 256
_REDUCTION = {"none": 0, "mean": 1, "sum": 2}

# ---- the logits' storage X, apart from T (session 11: autocast's cross-entropy on 16-bit logits) ---------------------
# XSTORAGE undefined: x and dx are T like every other array (the kernels of x's own dtype; X is T, STX is ST: the same
# instructions as before).  XSTORAGE 1 (float16) / 2 (bfloat16), with T = A = float (the float32 kernels' STORAGE 0):
# x is read as 16 bits and widened on load (LD, an overload on X: exact), dx is rounded once to 16 bits at its store
# (STX: cvt.rn, nearest even, as CuPy's astype); loss, lse, denom, the weights and dloss stay float.  Between that
# load and that store every line is the float32 kernel's own source and the planner gives the float32 tiling (VEC,
# G, NV, RAGGED, PIPE, FASTX, MINB, grid), so the sums run in the same order on the same values: the results are
# bitwise those of x.astype(float32) through the float32 kernel, and dx the float32 dx's .astype(x.dtype).
XIN_HEADER = r"""
#ifndef XSTORAGE
#define XSTORAGE (-1)
#endif
#if XSTORAGE < 0
typedef T X;
#define STX ST
#else
static_assert(sizeof(T) == 4 && sizeof(A) == 4, "XSTORAGE: 16-bit logits read into the float32 kernels");
typedef unsigned short X;
#if XSTORAGE == 1
__device__ __forceinline__ float LD(X h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ X STX(float f)
{ unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#else
__device__ __forceinline__ float LD(X h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ X STX(float f)
{ unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#endif
#endif
// IGNORED_DX (the module docstring): an ignored row's dx, softmax * 0 -- 0 where its lse is finite, NaN where it is
// NaN or -inf -- from the lse alone, so no x of the row is read.  Every backward kernel's ignored branch.
__device__ __forceinline__ A ignored_dx(const A lse) { return lse - lse; }
"""

# The row helpers of ROW_HEADER (softmax_kernels) for x and dx of type X: with XSTORAGE, overloads on X pointers of
# row_geo / load_chunk / store_chunk / load_edges / store_edges / pipe_issue / pipe_decode -- ROW_HEADER's own text
# (softmax_kernels.row_io("X"): one text for both element types) with VEC elements of 2 bytes a vector (XVBYTES =
# 2 VEC: 8-byte loads where float32's are 16) and STX at the stores.  A row r of x starts r * C elements from x, so
# with x on an XVBYTES boundary each row's head h is the one the float32 array (on a VBYTES boundary) has: the same
# split of the row into head, body vectors and tail.  aligned_x: the
# vector path only where x (and dx) sit on that boundary (RAGGED too: the float32 equivalent is the aligned array);
# else the scalar path -- correct, but the float32 kernel's order only for the aligned case, so the host hands a
# misaligned x to the float32 kernels through a cast instead (forward / backward below).
_ROW_X = row_io("X")
XROW_HEADER = r"""
#if XSTORAGE < 0
#define aligned_x aligned
#if PIPE
typedef RawRow XRow;
#endif
#else
#define XVBYTES (VEC * 2)
#if VEC == 1
typedef X XVR;
#elif VEC == 2
typedef unsigned int XVR;
#elif VEC == 4
typedef uint2 XVR;
#else
typedef uint4 XVR;
#endif
union XPack { XVR raw; X v[VEC]; };
""" + _ROW_X[0] + r"""
""" + _ROW_X[1] + r"""
#if PIPE
""" + _ROW_X[2] + r"""#endif
__device__ __forceinline__ bool aligned_x(const void* a, const void* b = 0)
{
    const unsigned long long x = (unsigned long long)a, y = b ? (unsigned long long)b : x;
    return VEC > 1 && ((x | y) % XVBYTES) == 0;
}
#endif
"""

SOURCE = STORAGE_HEADER + XIN_HEADER + WARP_REDUCE + r"""
typedef INDEX I;
#define NEG_INF (-(A)__int_as_float(0x7f800000))

// The row's max, log-sum-exp and, for smoothing, sum_c w_c x_c and sum_c w_c (every lane gets them).
__device__ __forceinline__ void row_stats(const X* xr, const T* w, int C, int inner, int lane,
                                          A& lse, A& swx, A& sw, const bool smooth)
{
    A m = NEG_INF;
    for (int c = lane; c < C; c += 32) { const A v = LD(xr[(long long)c * inner]); m = (v > m || v != v) ? v : m; }
    m = warp_max(m);
    const A shift = m == NEG_INF ? (A)0 : m;
    A s = 0, a = 0, b = 0;
    for (int c = lane; c < C; c += 32) {
        const A v = LD(xr[(long long)c * inner]);
        s += exp(v - shift);
        if (smooth) { const A wc = HAS_W ? LD(w[c]) : (A)1; a += wc * v; b += wc; }
    }
    s = warp_sum(s);
    lse = shift + log(s);
    if (smooth) { swx = warp_sum(a); sw = warp_sum(b); } else { swx = 0; sw = 0; }
}

extern "C" __global__ void __launch_bounds__(256)
ce_fwd(const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
       A* __restrict__ lse_out, A* __restrict__ partial, unsigned int* ticket, T* __restrict__ loss_out,
       A* __restrict__ denom_out, const long long rows, const int C, const int inner, const long long ignore_index,
       const double eps)
{
    __shared__ A warp_loss[8], warp_den[8];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool smooth = eps != 0.0;
    A acc_loss = 0, acc_den = 0;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((long long)gridDim.x * blockDim.x) >> 5) {
        const long long o = r / inner, i = r - o * inner;
        const X* xr = x + o * C * (long long)inner + i;
        A lse, swx, sw;
        row_stats(xr, w, C, inner, lane, lse, swx, sw, smooth);
        const long long t = (long long)target[r];
        const bool valid = t != ignore_index, in_range = t >= 0 && t < C;
        A per = 0, wt = 0;
        if (valid) {
            if (in_range) {
                wt = HAS_W ? LD(w[t]) : (A)1;
                per = -((A)(1.0 - eps) * wt * (LD(xr[t * inner]) - lse));
                if (smooth) per -= (A)(eps / C) * (swx - lse * sw);
            } else {
                per = wt = __int_as_float(0x7fffffff);      // NaN: a bad class index
            }
        }
        if (lane == 0) {
            lse_out[r] = lse;
            if (REDUCTION == 0) loss_rows[r] = ST(per);
        }
        acc_loss += per; acc_den += wt;
    }
    if (lane == 0) { warp_loss[warp] = acc_loss; warp_den[warp] = acc_den; }
    __syncthreads();
    if (threadIdx.x == 0) {
        A bl = 0, bd = 0;
        for (int k = 0; k < 8; ++k) { bl += warp_loss[k]; bd += warp_den[k]; }
        partial[2 * blockIdx.x] = bl; partial[2 * blockIdx.x + 1] = bd;
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        __threadfence();
        double tl = 0, td = 0;
        for (int b = 0; b < gridDim.x; ++b) { tl += (double)partial[2 * b]; td += (double)partial[2 * b + 1]; }
        denom_out[0] = (A)td;
        if (REDUCTION == 1) loss_out[0] = ST((A)(tl / td));
        if (REDUCTION == 2) loss_out[0] = ST((A)tl);
        *ticket = 0u;
    }
}

extern "C" __global__ void __launch_bounds__(256)
ce_bwd(const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, const A* __restrict__ lse_in,
       const T* __restrict__ g, const A* __restrict__ denom, X* __restrict__ dx, const long long rows, const int C,
       const int inner, const long long ignore_index, const double eps)
{
    const int lane = threadIdx.x & 31;
    const bool smooth = eps != 0.0;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((long long)gridDim.x * blockDim.x) >> 5) {
        const long long o = r / inner, i = r - o * inner;
        const long long base = o * C * (long long)inner + i;
        const long long t = (long long)target[r];
        if (t == ignore_index) {
            const A z = ignored_dx(lse_in[r]);
            for (int c = lane; c < C; c += 32) dx[base + (long long)c * inner] = STX(z);
            continue;
        }
        A gr = LD(g[REDUCTION == 0 ? r : 0]);
        if (REDUCTION == 1) gr /= denom[0];
        const bool in_range = t >= 0 && t < C;
        const A wt = in_range ? (HAS_W ? LD(w[t]) : (A)1) : (A)__int_as_float(0x7fffffff);
        A sw = (A)C;
        if (smooth && HAS_W) {
            A b = 0;
            for (int c = lane; c < C; c += 32) b += LD(w[c]);
            sw = warp_sum(b);
        }
        const A sumq = (A)(1.0 - eps) * wt + (smooth ? (A)(eps / C) * sw : (A)0);
        const A sumqg = sumq != (A)0 ? sumq * gr : (A)0;
        const A lse = lse_in[r];
        for (int c = lane; c < C; c += 32) {
            const long long a = base + (long long)c * inner;
            A q = (c == t) ? (A)(1.0 - eps) * wt : (A)0;
            if (smooth) q += (A)(eps / C) * (HAS_W ? LD(w[c]) : (A)1);
            const A qg = q != (A)0 ? q * gr : (A)0;
            dx[a] = STX(exp(LD(x[a]) - lse) * sumqg - qg);
        }
    }
}
"""
CE_GRID_SUM = r"""
// A forward's sums over the grid (ce_rows_fwd, ce_sp_fwd): each thread's loss and weight sums -> the warp's
// (shuffles) -> the block's (warps in order, thread 0) -> one partial a block; the LAST block (the ticket: with TAIL
// an acquire-release atomic, else __threadfence and atomicAdd) adds every block's partial -- thread t blocks t,
// t + NT, ... in double, then the warps' shuffle trees and the warps in order -- into the 'mean' denominator and the
// loss, and resets the ticket.  A fixed order for a grid: deterministic.  NT: threads a block.
#ifndef TAIL
#define TAIL 0                                      // CE_TAIL (session 12): the forward's ticket and last-block sums
#endif
#ifndef TAIL_LD
#define TAIL_LD 4                                   // partial pairs a thread of the last block loads at once
#endif
template <int NT> __device__ __forceinline__ void ce_grid_sum(A acc_loss, A acc_den, A* __restrict__ partial,
                                                            unsigned int* ticket, T* __restrict__ loss_out,
                                                            A* __restrict__ denom_out, const int lane, const int warp)
{
    __shared__ double red[2][NT / 32];
    __shared__ bool last;
    acc_loss = warp_sum(acc_loss); acc_den = warp_sum(acc_den);
    if (lane == 0) { red[0][warp] = acc_loss; red[1][warp] = acc_den; }
    __syncthreads();
    if (threadIdx.x == 0) {
        A bl = 0, bd = 0;
        for (int k = 0; k < NT / 32; ++k) { bl += (A)red[0][k]; bd += (A)red[1][k]; }
        partial[2 * blockIdx.x] = bl; partial[2 * blockIdx.x + 1] = bd;
#if TAIL
        // CE_TAIL: the ticket as one acquire-release atomic (MEMBAR.ALL.GPU, not __threadfence's MEMBAR.SC.GPU)
        unsigned int tk;
        asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(tk) : "l"(ticket) : "memory");
        last = tk == gridDim.x - 1;
#else
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
#endif
    }
    __syncthreads();
    if (last) {                                   // uniform over the block
        double tl = 0, td = 0;
#if TAIL
        // ordered after the other blocks' partials by thread 0's acquire and the barrier; the loads L2-only (.cg),
        // TAIL_LD a thread issued before the first add (one round trip, not one a trip), added in b order as below
        {
            A pl[TAIL_LD], pd[TAIL_LD];
#pragma unroll
            for (int k = 0; k < TAIL_LD; ++k) {
                const int b = threadIdx.x + k * NT;
                pl[k] = b < (int)gridDim.x ? __ldcg(partial + 2 * b) : (A)0;
                pd[k] = b < (int)gridDim.x ? __ldcg(partial + 2 * b + 1) : (A)0;
            }
#pragma unroll
            for (int k = 0; k < TAIL_LD; ++k)
                if (threadIdx.x + k * NT < (int)gridDim.x) { tl += (double)pl[k]; td += (double)pd[k]; }
        }
        for (int b = threadIdx.x + TAIL_LD * NT; b < (int)gridDim.x; b += NT) {
            tl += (double)__ldcg(partial + 2 * b); td += (double)__ldcg(partial + 2 * b + 1);
        }
#else
        __threadfence();
        for (int b = threadIdx.x; b < (int)gridDim.x; b += NT) {
            tl += (double)((volatile A*)partial)[2 * b]; td += (double)((volatile A*)partial)[2 * b + 1];
        }
#endif
        tl = warp_sum(tl); td = warp_sum(td);
        __syncthreads();
        if (lane == 0) { red[0][warp] = tl; red[1][warp] = td; }
        __syncthreads();
        if (threadIdx.x == 0) {
            tl = 0; td = 0;
            for (int k = 0; k < NT / 32; ++k) { tl += red[0][k]; td += red[1][k]; }
            denom_out[0] = (A)td;
            if (REDUCTION == 1) loss_out[0] = ST((A)(tl / td));
            if (REDUCTION == 2) loss_out[0] = ST((A)tl);
            *ticket = 0u;
        }
    }
}
"""

FASTX_HEADER = r"""#if FASTX
// FASTX (session 9, round 2; float accumulation only): exp(v - sh) as 2^(v log2e - sh log2e), one FFMA and one
// MUFU.EX2 (ex2.approx.ftz: ~2 ulp, results below 2^-126 flushed to 0) instead of expf's ~9 instructions; and the
// forward reads x[t] with one load instead of a compare and select an element.  The pipe forward and the backward
// of 16-bit logits were issue-bound: ~21 instructions an element, 16 warps an SM (docs/step_kernels.md).
#define LOG2E_F 1.4426950408889634f
__device__ __forceinline__ float ex2_fast(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#define CE_EXP(v, sh, shl) ex2_fast(fmaf((v), LOG2E_F, -(shl)))
#else
#define CE_EXP(v, sh, shl) ((void)(shl), exp((v) - (sh)))
#endif
"""

# ---- spatial targets (inner > 1, e.g. segmentation logits (N, C, H, W)): one or two positions a thread ----------
# Shape legend as above; position r = o * inner + i (o < N, i < inner), its classes at x[(o * C + c) * inner + i].
# Tiling: a 256-thread block's threads take consecutive positions (grid-stride over the N * inner positions), so at
# each class c a warp reads consecutive elements of plane (o, c): coalesced, where SOURCE's warp a row reads 32
# classes of ONE position, 32 lines for 32 values (2-4% of copy at (32, 21, 128, 128), 0.3x PyTorch: session 21).
# The class count is compiled in (CC, the planner's SP_CC: up to 32 forward, 24 backward): a position's classes all
# loaded at once, the loops unrolled without masks; past it C is read at run time and walked U at a time (16 forward,
# 8 backward; SP_RT: the full batches without masks, x[t] loaded once).  PAIR (SP_PAIR, where inner is even, and CC
# or SP_RT with positions to fill the GPU twice): a thread takes positions r, r + 1 (never two images: inner even)
# with one 4- or 8-byte load a class, in batches of UP classes (registers); an x (or dx) off the 2-element boundary
# takes one position a thread inside the same build.  SPLIT (SP_SPLIT: SP_RT with too few positions to fill it once):
# 2-8 threads a position, each a slice of the classes.  (o, i) advance with the grid stride, no division.
#   ce_sp_fwd: per position, ONE pass over the classes, a batch at a time: the batch's max first (fmax: NaN skipped,
#              yet a NaN element makes its exp, so s and lse, NaN -- row_stats' NaN), the running sum rescaled once
#              when the max grows (s * 0 while m was -inf: a NaN sum kept), then one exp an element with no branch
#              (FASTX's ex2.approx where the row kernels take it); an -inf row keeps shift 0 as row_stats does; x[t]
#              picked on the way (an int compare; SP_RT: one load); the smoothing sums beside.  lse and the loss as
#              SOURCE's ce_fwd; 'mean' / 'sum': ce_grid_sum, the row forward's grid sum (the LAST block's 256 threads
#              add the partials: ~2 loads a thread where one thread's loop over 528 partials was a chain at the
#              kernel's end).
#   ce_sp_bwd: per position, dx_c = exp(x_c - lse) sum(q) g - q_c g, each element SOURCE's ce_bwd's expression
#              (the same bits wherever the smoothing sum of the weights is not needed: it is summed in class order
#              here, in lane order there); an ignored position's dx IGNORED_DX (0, NaN where lse is not finite).
SOURCE_SPATIAL = STORAGE_HEADER + XIN_HEADER + WARP_REDUCE + r"""
typedef INDEX I;
#ifndef FASTX
#define FASTX 0
#endif
""" + CE_GRID_SUM + FASTX_HEADER + _sk.COL_WALK + r"""
#define NEG_INF (-(A)__int_as_float(0x7f800000))
#ifndef U
#define U 16
#endif
#ifndef SP_MINB
#define SP_MINB 1
#endif
#ifndef CC
#define CC 0          // the class count at compile time (the planner's SP_CC: C <= CC_MAX), 0: C read at run time
#endif
#ifndef PAIR
#define PAIR 0        // two adjacent positions a thread, one 2-element load a class (the planner: inner even)
#endif
#ifndef SP_RT
#define SP_RT 0       // C read at run time: the unmasked full batches (sp_fwd_sums_rt, sp_bwd_rt; the planner's SP_RT)
#endif
#ifndef SPLIT
#define SPLIT 1       // threads a position, each a slice of the classes (the planner's SP_SPLIT: C read, few positions)
#endif
#define SP_PW (256 / SPLIT)
// a block step's positions and this thread's position in it (SPLIT 1: the plain walk's expressions, the same PTX)
#define SP_BW (SPLIT > 1 ? SP_PW : blockDim.x)
#define SP_LANE (SPLIT > 1 ? threadIdx.x % SP_PW : threadIdx.x)
// PAIR's batch: UP classes, fewer where CC is less (registers: U's batches of two positions spilled 20-104 bytes
// with C read at run time, so pairs there sum in other batches than one position a thread: not its bits)
#define PB (CC && CC < UP ? CC : UP)
// A batch of classes: every class at once where CC (no masks, no dead slots), else U; PAIR's batches hold two
// positions' values, so at most UP classes (with CC its batches unroll too: their bounds are compile-time).
#define UB (CC ? CC : U)
#define CN (CC ? CC : C)
#ifndef UP
#define UP 16
#endif

// P consecutive values of x at q (P = 2: q on a 2-element boundary, one 4- or 8-byte load) / of dx.
// x is read-only for the kernel's life: the loads through the non-coherent path (__ldg), as the kernels' own
// `const X* __restrict__` loads compiled before these helpers took a plain pointer (REVIEW22).
template <int P> __device__ __forceinline__ void sp_ld(const X* q, A* v)
{
    if (P == 1) {
        v[0] = LD(__ldg(q));
    } else if (sizeof(X) == 2) {
        const unsigned int u = __ldg((const unsigned int*)q);
        v[0] = LD((X)(u & 0xffffu));
        v[1] = LD((X)(u >> 16));
    } else if (sizeof(X) == 4) {
        const float2 u = __ldg((const float2*)q);
        v[0] = (A)u.x; v[1] = (A)u.y;
    } else {
        const double2 u = __ldg((const double2*)q);
        v[0] = (A)u.x; v[1] = (A)u.y;
    }
}
template <int P> __device__ __forceinline__ void sp_st(X* d, const A* v)
{
    if (P == 1) {
        d[0] = STX(v[0]);
    } else if (sizeof(X) == 2) {
        *(unsigned int*)d = (unsigned int)STX(v[0]) | ((unsigned int)STX(v[1]) << 16);
    } else if (sizeof(X) == 4) {
        *(float2*)d = make_float2((float)v[0], (float)v[1]);
    } else {
        *(double2*)d = make_double2((double)v[0], (double)v[1]);
    }
}

// One batch of B classes of the forward, from class cb + c0 (q: its element of the P positions; class c of position j
// at q[(c - cb - c0) * inner + j]): each position's running max m and sum s of exp(x - m) -- the batch's max first
// (fmax: NaN skipped, yet a NaN element makes its exp, so s and lse, NaN; an all -inf position so far keeps shift 0;
// a +inf max gives exp(inf - inf) = NaN), the sum rescaled once when the max grows (s * 0 while m was -inf: a NaN sum
// kept), then one exp an element with no branch; the smoothing sums beside (sm: a compile-time constant where the
// caller passes one).  MASKED: classes past cn are -inf and skipped (a compile-time test where cn is CC).  PICK: x[t]
// picked on the way (tc[j]: the class, -1 for none -- an int compare and a select an element; SP_RT loads it once).
template <int P, int B, bool MASKED, bool PICK> __device__ __forceinline__ void sp_fwd_batch(
    const X* q, const int cb, const int c0, const int cn, const int inner, const T* __restrict__ w, const bool sm,
    const int* tc, A* m, A* s, A* swx, A& sw, A* xt)
{
    A v[B][P];
#pragma unroll
    for (int k = 0; k < B; ++k) {
        if (!MASKED || c0 + k < cn) sp_ld<P>(q + k * inner, v[k]);
        else {
#pragma unroll
            for (int j = 0; j < P; ++j) v[k][j] = NEG_INF;
        }
    }
#pragma unroll
    for (int j = 0; j < P; ++j) {
        A bm = m[j];
#pragma unroll
        for (int k = 0; k < B; ++k) bm = fmax(bm, v[k][j]);
        const A sh = bm == NEG_INF ? (A)0 : bm;
        if (bm != m[j]) s[j] *= exp(m[j] - sh);
        m[j] = bm;
        const A shl = sh * (A)1.4426950408889634;
#pragma unroll
        for (int k = 0; k < B; ++k) {
            if (MASKED && c0 + k >= cn) break;
            const A u = v[k][j];
            s[j] += CE_EXP(u, sh, shl);
            if (PICK && c0 + k == tc[j]) xt[j] = u;
            if (sm) {
                const A wc = HAS_W ? LD(w[cb + c0 + k]) : (A)1;
                swx[j] += wc * u;
                if (j == 0) sw += wc;
            }
        }
    }
}

// The forward's sums over all classes of P positions at q, every batch masked (compile-time masks where CC), x[t]
// picked on the way, the smoothing tested at run time: the class count compiled in, or SP_RT off.
template <int P, int B> __device__ __forceinline__ void sp_fwd_sums(
    const X* q, const int C, const int inner, const int* tc, const T* __restrict__ w, const bool smooth,
    A* m, A* s, A* swx, A& sw, A* xt)
{
#pragma unroll
    for (int c0 = 0; c0 < CN; c0 += B)
        sp_fwd_batch<P, B, true, true>(q + c0 * inner, 0, c0, CN, inner, w, smooth, tc, m, s, swx, sw, xt);
}

#if CC == 0 && SP_RT
// The forward's sums where C is read at run time (many classes: ADE20K's 150, COCO-stuff's 171): sp_fwd_sums's
// batches in the same order, so the same bits -- but the full batches without masks (the masked batch only at the
// end: `c0 + k < C` was a compare and a select an element), the class pointer advanced once a batch, the smoothing
// sums compiled in or out (SM: a branch an element before), and x[t] loaded once a position by the caller (the same
// value, not an int compare and a select an element).  Classes cb .. cb + cn - 1 of the position(s) whose class cb
// is at q: all of them, or SPLIT's slice.
template <int P, int B, bool SM> __device__ __forceinline__ void sp_fwd_sums_rt(
    const X* q, const int cb, const int cn, const int inner, const T* __restrict__ w, A* m, A* s, A* swx, A& sw)
{
    int c0 = 0;
    for (; c0 + B <= cn; c0 += B, q += B * inner)
        sp_fwd_batch<P, B, false, false>(q, cb, c0, cn, inner, w, SM, nullptr, m, s, swx, sw, nullptr);
    if (c0 < cn) sp_fwd_batch<P, B, true, false>(q, cb, c0, cn, inner, w, SM, nullptr, m, s, swx, sw, nullptr);
}
#endif

// A position's lse and loss from its sums (SOURCE's ce_fwd); wt: its weight (the denominator's share).
__device__ __forceinline__ A sp_loss(const long long t, const int tc, const long long ignore_index, const double eps,
                                     const int C, const T* __restrict__ w, const bool smooth, const A m, const A s,
                                     const A swx, const A sw, const A xt, A& lse, A& wt)
{
    lse = (m == NEG_INF ? (A)0 : m) + log(s);
    A per = 0;
    wt = 0;
    if (t != ignore_index) {
        if (tc >= 0) {
            wt = HAS_W ? LD(w[tc]) : (A)1;
            per = -((A)(1.0 - eps) * wt * (xt - lse));
            if (smooth) per -= (A)(eps / C) * (swx - lse * sw);
        } else {
            per = wt = __int_as_float(0x7fffffff);      // NaN: a bad class index
        }
    }
    return per;
}

// P positions a thread from r0, the grid stride P x the threads: every position's lse (and 'none' loss); the
// thread's sums of the loss and of the weights into acc_loss / acc_den.
template <int P, int B> __device__ __forceinline__ void sp_fwd_loop(
    const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
    A* __restrict__ lse_out, const unsigned int n, const int C, const int inner, const long long ignore_index,
    const double eps, A& acc_loss, A& acc_den)
{
    const bool smooth = eps != 0.0;
    // x.size < 2^31 (the planner): int offsets; the position counter unsigned, so that r + step cannot overflow
    const unsigned int step = P * gridDim.x * blockDim.x;
    // the walk: position p.k = o * inner + i, p.off the offset of its class 0 (o * CN * inner + i)
    const unsigned int ci = (unsigned int)(CN * inner);
    for (ColWalk p(P * (blockIdx.x * blockDim.x + threadIdx.x), step, inner, ci); p.k < n; p.next(step, inner, ci)) {
        long long t[P];
        int tc[P];
        A m[P], s[P], swx[P], xt[P], sw = 0;
#pragma unroll
        for (int j = 0; j < P; ++j) {
            t[j] = (long long)target[p.k + j];
            tc[j] = (t[j] >= 0 && t[j] < C) ? (int)t[j] : -1;   // x[t]'s class, an int compare an element
            m[j] = NEG_INF; s[j] = 0; swx[j] = 0; xt[j] = 0;
        }
#if CC || !SP_RT
        sp_fwd_sums<P, B>(x + p.off, C, inner, tc, w, smooth, m, s, swx, sw, xt);
#else
#pragma unroll
        for (int j = 0; j < P; ++j)
            if (tc[j] >= 0) xt[j] = LD(__ldg(x + p.off + tc[j] * inner + j));
        if (smooth) sp_fwd_sums_rt<P, B, true>(x + p.off, 0, C, inner, w, m, s, swx, sw);
        else sp_fwd_sums_rt<P, B, false>(x + p.off, 0, C, inner, w, m, s, swx, sw);
#endif
#pragma unroll
        for (int j = 0; j < P; ++j) {
            A lse, wt;
            const A per = sp_loss(t[j], tc[j], ignore_index, eps, C, w, smooth, m[j], s[j], swx[j], sw, xt[j], lse,
                                  wt);
            lse_out[p.k + j] = lse;
            if (REDUCTION == 0) loss_rows[p.k + j] = ST(per);
            acc_loss += per; acc_den += wt;
        }
    }
}

#if SPLIT > 1
// SPLIT threads a position (the planner's SP_SPLIT: C read at run time and too few positions to fill the GPU one a
// thread): thread t takes position t % SP_PW of the block's step (a warp's 32 consecutive positions at each class:
// coalesced as before) and classes [cs, cs + cn), slice t / SP_PW of C, in sp_fwd_sums_rt's batches; the slices'
// (m, s, smoothing sums) meet in shared memory and slice 0 combines them in slice order -- the running sum rescaled
// to the larger max, s * 0 where a max was -inf (a NaN sum kept), as the batches do -- and loads x[t], writes lse and
// the loss.  Other bits than one thread a position (other batch boundaries), within rounding.  The walk is
// block-uniform: every thread meets at the barriers, past the last position too.
static_assert(SPLIT == 1 || (SP_RT && !PAIR && CC == 0), "SPLIT: C read at run time (SP_RT), one position a thread");
// (part: the slices' (m, s, swx, sw) -- the kernel's, so that both smoothing instantiations share one array)
template <bool SM> __device__ __forceinline__ void sp_fwd_split(
    const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
    A* __restrict__ lse_out, const unsigned int n, const int C, const int inner, const long long ignore_index,
    const double eps, A& acc_loss, A& acc_den, A (*part)[SPLIT][SP_PW])
{
    const int lp = threadIdx.x % SP_PW, sl = threadIdx.x / SP_PW;
    const int cs = (int)((long long)C * sl / SPLIT), cn = (int)((long long)C * (sl + 1) / SPLIT) - cs;
    const unsigned int step = gridDim.x * SP_PW;
    const unsigned int ci = (unsigned int)(C * inner);
    ColWalk p(blockIdx.x * SP_PW + lp, step, inner, ci);
    for (unsigned int b0 = blockIdx.x * SP_PW; b0 < n; b0 += step, p.next(step, inner, ci)) {
        const bool on = p.k < n;
        long long t = 0;
        int tc = -1;
        A m = NEG_INF, s = 0, swx = 0, sw = 0, xt = 0;
        if (on && sl == 0) {
            t = (long long)target[p.k];
            tc = (t >= 0 && t < C) ? (int)t : -1;
            if (tc >= 0) xt = LD(__ldg(x + p.off + tc * inner));
        }
        if (on) sp_fwd_sums_rt<1, U, SM>(x + p.off + cs * inner, cs, cn, inner, w, &m, &s, &swx, sw);
        part[0][sl][lp] = m; part[1][sl][lp] = s; part[2][sl][lp] = swx; part[3][sl][lp] = sw;
        __syncthreads();
        if (on && sl == 0) {
#pragma unroll
            for (int j = 1; j < SPLIT; ++j) {
                const A mj = part[0][j][lp], nm = fmax(m, mj);
                const A sh = nm == NEG_INF ? (A)0 : nm;
                s = s * exp(m - sh) + part[1][j][lp] * exp(mj - sh);
                m = nm;
                swx += part[2][j][lp]; sw += part[3][j][lp];
            }
            A lse, wt;
            const A per = sp_loss(t, tc, ignore_index, eps, C, w, SM, m, s, swx, sw, xt, lse, wt);
            lse_out[p.k] = lse;
            if (REDUCTION == 0) loss_rows[p.k] = ST(per);
            acc_loss += per; acc_den += wt;
        }
        __syncthreads();            // part[] is the next step's
    }
}
#endif

extern "C" __global__ void __launch_bounds__(256, SP_MINB)
ce_sp_fwd(const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
          A* __restrict__ lse_out, A* __restrict__ partial, unsigned int* ticket, T* __restrict__ loss_out,
          A* __restrict__ denom_out, const long long rows, const int C, const int inner, const long long ignore_index,
          const double eps)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    A acc_loss = 0, acc_den = 0;
    const unsigned int n = (unsigned int)rows;
#if SPLIT > 1
    __shared__ A part[4][SPLIT][SP_PW];
    if (eps != 0.0) sp_fwd_split<true>(x, target, w, loss_rows, lse_out, n, C, inner, ignore_index, eps, acc_loss,
                                       acc_den, part);
    else sp_fwd_split<false>(x, target, w, loss_rows, lse_out, n, C, inner, ignore_index, eps, acc_loss, acc_den,
                             part);
#else
#if PAIR
    // PAIR: inner even, so a pair never straddles two images; x on a 2-element boundary (else one a thread: a view)
    if (((size_t)x & (2 * sizeof(X) - 1)) == 0)
        sp_fwd_loop<2, PB>(x, target, w, loss_rows, lse_out, n, C, inner, ignore_index, eps,
                                            acc_loss, acc_den);
    else
#endif
        sp_fwd_loop<1, UB>(x, target, w, loss_rows, lse_out, n, C, inner, ignore_index, eps, acc_loss, acc_den);
#endif
    ce_grid_sum<256>(acc_loss, acc_den, partial, ticket, loss_out, denom_out, lane, warp);
}

#if CC == 0 && SP_RT
// The backward where C is read at run time: sp_bwd_loop's expression an element, batches of B classes -- the full
// ones without masks, the masked one last -- the class pointers advanced once a batch, the smoothing term compiled in
// or out (SM).  Without smoothing q_c g is 0 but at the target (q_t g where q_t != 0): one select, the same
// expression -- e sum(q) g - q_c g, contracted to one FMA as before (a separate subtraction at the target rounded
// twice: float32 dx off by an ulp there, run 4).
template <int P, int B, bool MASKED, bool SM> __device__ __forceinline__ void sp_bwd_batch(
    const X* q, X* d, const int cb, const int c0, const int cn, const int C, const int inner,
    const T* __restrict__ w, const double eps, const int* tc, const bool* keep, const A* sumqg, const A* qt,
    const A* qgt, const A* gr, const A* lse, const A* lsel)
{
    A v[B][P];
#pragma unroll
    for (int k = 0; k < B; ++k)
        if (!MASKED || c0 + k < cn) sp_ld<P>(q + k * inner, v[k]);
#pragma unroll
    for (int k = 0; k < B; ++k) {
        if (MASKED && c0 + k >= cn) break;
        const int c = cb + c0 + k;
        const A sm = SM ? (A)(eps / C) * (HAS_W ? LD(w[c]) : (A)1) : (A)0;
        A o[P];
#pragma unroll
        for (int j = 0; j < P; ++j) {
            if (SM) {
                const A qq = (c == tc[j] ? qt[j] : (A)0) + sm;
                const A qg = qq != (A)0 ? qq * gr[j] : (A)0;
                o[j] = CE_EXP(v[k][j], lse[j], lsel[j]) * sumqg[j] - qg;
            } else {
                o[j] = CE_EXP(v[k][j], lse[j], lsel[j]) * sumqg[j] - (c == tc[j] ? qgt[j] : (A)0);
            }
            if (P > 1 && !keep[j]) o[j] = ignored_dx(lse[j]);
        }
        sp_st<P>(d + k * inner, o);
    }
}
// (classes cb .. cb + cn - 1 of C, at q / d: all of them, or SPLIT's slice)
template <int P, int B, bool SM> __device__ __forceinline__ void sp_bwd_rt(
    const X* q, X* d, const int cb, const int cn, const int C, const int inner, const T* __restrict__ w,
    const double eps, const int* tc, const bool* keep, const A* sumqg, const A* qt, const A* gr, const A* lse,
    const A* lsel)
{
    A qgt[P];
#pragma unroll
    for (int j = 0; j < P; ++j) qgt[j] = qt[j] != (A)0 ? qt[j] * gr[j] : (A)0;
    int c0 = 0;
    for (; c0 + B <= cn; c0 += B, q += B * inner, d += B * inner)
        sp_bwd_batch<P, B, false, SM>(q, d, cb, c0, cn, C, inner, w, eps, tc, keep, sumqg, qt, qgt, gr, lse, lsel);
    if (c0 < cn)
        sp_bwd_batch<P, B, true, SM>(q, d, cb, c0, cn, C, inner, w, eps, tc, keep, sumqg, qt, qgt, gr, lse, lsel);
}
#endif

// The backward of P positions a thread: dx_c = exp(x_c - lse) sum(q) g - q_c g, each element SOURCE's ce_bwd's
// expression; an ignored position's dx IGNORED_DX (0, or NaN where its lse is not finite).
template <int P, int B> __device__ __forceinline__ void sp_bwd_loop(
    const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, const A* __restrict__ lse_in,
    const T* __restrict__ g, X* __restrict__ dx, const unsigned int n, const int C, const int inner,
    const long long ignore_index, const double eps, const A sw, const A gm)
{
    const bool smooth = eps != 0.0;
    // SPLIT > 1 (one position a thread): SP_PW consecutive positions a block step, thread t on position t % SP_PW,
    // classes [cs, cs + cn) -- slice t / SP_PW of C; else every class of P positions
    const unsigned int step = P * gridDim.x * SP_BW;
    const unsigned int ci = (unsigned int)(CN * inner);
    const int cs = SPLIT > 1 ? (int)((long long)C * (threadIdx.x / SP_PW) / SPLIT) : 0;
    const int cn = SPLIT > 1 ? (int)((long long)C * (threadIdx.x / SP_PW + 1) / SPLIT) - cs : CN;
    for (ColWalk p(P * (blockIdx.x * SP_BW + SP_LANE), step, inner, ci); p.k < n; p.next(step, inner, ci)) {
        const int base = (int)p.off;
        int tc[P];
        bool keep[P];
        A sumqg[P], qt[P], gr[P], lse[P], lsel[P];
#pragma unroll
        for (int j = 0; j < P; ++j) {
            const long long t = (long long)target[p.k + j];
            keep[j] = t != ignore_index;
            gr[j] = REDUCTION == 0 ? LD(g[p.k + j]) : gm;
            tc[j] = (t >= 0 && t < C) ? (int)t : -1;
            const A wt = tc[j] >= 0 ? (HAS_W ? LD(w[tc[j]]) : (A)1) : (A)__int_as_float(0x7fffffff);
            const A sumq = (A)(1.0 - eps) * wt + (smooth ? (A)(eps / C) * sw : (A)0);
            sumqg[j] = sumq != (A)0 ? sumq * gr[j] : (A)0;
            qt[j] = (A)(1.0 - eps) * wt;
            lse[j] = lse_in[p.k + j];
            lsel[j] = lse[j] * (A)1.4426950408889634;
        }
        if (P == 1 && !keep[0]) {
            const A z = ignored_dx(lse[0]);
            for (int c = cs; c < cs + cn; ++c) dx[base + c * inner] = STX(z);
            continue;
        }
#if CC == 0 && SP_RT
        const int at = base + cs * inner;           // class cs of the position(s)
        if (smooth)
            sp_bwd_rt<P, B, true>(x + at, dx + at, cs, cn, C, inner, w, eps, tc, keep, sumqg, qt, gr, lse, lsel);
        else
            sp_bwd_rt<P, B, false>(x + at, dx + at, cs, cn, C, inner, w, eps, tc, keep, sumqg, qt, gr, lse, lsel);
#else
#pragma unroll
        for (int c0 = 0; c0 < CN; c0 += B) {
            A v[B][P];
#pragma unroll
            for (int k = 0; k < B; ++k) {
                if (c0 + k < CN) sp_ld<P>(x + base + (c0 + k) * inner, v[k]);
            }
#pragma unroll
            for (int k = 0; k < B; ++k) {
                const int c = c0 + k;
                if (c >= CN) break;
                const A sm = smooth ? (A)(eps / C) * (HAS_W ? LD(w[c]) : (A)1) : (A)0;
                A o[P];
#pragma unroll
                for (int j = 0; j < P; ++j) {
                    const A q = (c == tc[j] ? qt[j] : (A)0) + sm;
                    const A qg = q != (A)0 ? q * gr[j] : (A)0;
                    o[j] = CE_EXP(v[k][j], lse[j], lsel[j]) * sumqg[j] - qg;
                    if (P > 1 && !keep[j]) o[j] = ignored_dx(lse[j]);
                }
                sp_st<P>(dx + base + c * inner, o);
            }
        }
#endif
    }
}

extern "C" __global__ void __launch_bounds__(256, SP_MINB)
ce_sp_bwd(const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, const A* __restrict__ lse_in,
          const T* __restrict__ g, const A* __restrict__ denom, X* __restrict__ dx, const long long rows, const int C,
          const int inner, const long long ignore_index, const double eps)
{
    const bool smooth = eps != 0.0;
    A sw = (A)C;
    if (smooth && HAS_W) {
        sw = 0;
        for (int c = 0; c < C; ++c) sw += LD(w[c]);      // the same address across the block: a broadcast
    }
    A gm = LD(g[0]);
    if (REDUCTION == 1) gm /= denom[0];
    const unsigned int n = (unsigned int)rows;
#if PAIR
    if ((((size_t)x | (size_t)dx) & (2 * sizeof(X) - 1)) == 0)
        sp_bwd_loop<2, PB>(x, target, w, lse_in, g, dx, n, C, inner, ignore_index, eps, sw, gm);
    else
#endif
        sp_bwd_loop<1, UB>(x, target, w, lse_in, g, dx, n, C, inner, ignore_index, eps, sw, gm);
}
"""


# ---- rows (inner = 1): softmax_kernels' ROW_HEADER tiling, the row read once (ce_rows_fwd) ---------------------------
# ce_rows_fwd: G threads per row hold it in registers (NV vectors of VEC elements each, chunk by chunk past 16K
# classes; RAGGED rows: scalar head and tail, as softmax_kernels): online max / sum exp, sum w_c x_c and sum w_c for
# smoothing (SMOOTH: compile-time, eps is in the plan's key); x[t] taken from the registers of the thread holding it
# and summed over the group with the others' zeros (exact) -- no load that waits on target[r], which is issued with
# the row's loads.  That thread writes lse and the row's loss and keeps the sums; the block adds its threads'
# sums (warp shuffles, then the warps in order), the last block (ticket) all blocks' partials (each thread a strided
# share in double, then the same fixed-order tree).  ce_rows_bwd: the per-row scalars, then dx streamed chunk by
# chunk with the same vector loads and stores; sum_c w_c (smoothing with weights) once per block.
SOURCE_ROWS = STORAGE_HEADER + XIN_HEADER + WARP_REDUCE + ROW_HEADER + XROW_HEADER + r"""
typedef INDEX I;
#ifndef FASTX
#define FASTX 0
#endif
""" + CE_GRID_SUM + FASTX_HEADER + r"""
// The pieces of a row's forward that ce_fwd_body (chunks loaded and reduced in turn), ce_fwd_long (chunks staged
// ahead by cp.async) and ce_fwd_pipe (one chunk, the next row in flight) share, written once so that their sums
// stay the same adds in the same order: a thread keeps a running max m and a sum s of exp(x - m) over its chunks
// (s rescaled when m grows), with SMOOTH the weighted sums swx = sum(w[c] x[c]) and sw = sum(w[c]); the group then
// meets for the row's lse and its thread 0 writes the row's loss.
// FX: the exponentials as FASTX's (ex2.approx and one FFMA; LONG 2), else exp(v - sh).
template <bool FX> __device__ __forceinline__ A ce_exp(A v, A sh, A shl)
{
    return FX ? CE_EXP(v, sh, shl) : exp(v - sh);
}

// A chunk's max: its values a[] and, in the row's first chunk, the edges ed[].
__device__ __forceinline__ A ce_chunk_max(const A* a, const A* ed, int ch)
{
    A cm = NEG_INF;
#pragma unroll
    for (int e = 0; e < E; ++e) cm = vmax(cm, a[e]);
    if (ch == 0) {
#pragma unroll
        for (int j = 0; j < NE; ++j) cm = vmax(cm, ed[j]);
    }
    return cm;
}

// SMOOTH's sums over chunk ch's body values a[] (slots past the body add nothing).
__device__ __forceinline__ void ce_smooth_chunk(const A* a, int ch, const Geo& q, int g, const T* __restrict__ w,
                                                A& swx, A& sw)
{
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int v = ch * CV + k * G + g;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            const int c = q.h + v * VEC + j;
            if (v < q.nb) { const A wc = HAS_W ? LD(w[c]) : (A)1; swx += wc * a[k * VEC + j]; sw += wc; }
        }
    }
}

// Chunk ch (max cm: ce_chunk_max) into the running sums: m grows to cm (s rescaled), then exp(x - m) of the edges
// (chunk 0) and of a[] in element order, then SMOOTH's sums.  XT: x[t] is picked on the way -- from an edge whose
// class is t, or from a[ts] in chunk tch (ce_fwd_body's select: two instructions an element); LONG loads it instead.
template <bool XT, bool FX> __device__ __forceinline__ void ce_chunk_sums(
    const A* a, const A* ed, const A cm, const int ch, const Geo& q, const int g, const long long t, const int tch,
    const int ts, const T* __restrict__ w, A& m, A& s, A& swx, A& sw, A& xt)
{
    const bool smooth = SMOOTH;
    const A nm = vmax(m, cm);
    if (nm != m) s = m == NEG_INF ? s * (A)0 : s * exp(m - nm);   // s * 0 keeps a NaN sum (softmax_kernels' rows)
    m = nm;
    const A sh = m == NEG_INF ? (A)0 : m;
    const A shl = FX ? sh * (A)1.4426950408889634 : (A)0;
    if (ch == 0) {
#pragma unroll
        for (int j = 0; j < NE; ++j) {
            s += ce_exp<FX>(ed[j], sh, shl);
            if ((XT || smooth) && j < edge_n(q, g)) {
                const int c = edge_o(q, g) + j;
                if (XT && c == t) xt = ed[j];
                if (smooth) { const A wc = HAS_W ? LD(w[c]) : (A)1; swx += wc * ed[j]; sw += wc; }
            }
        }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) s += ce_exp<FX>(a[e], sh, shl);
    if (XT && ch == tch) {                       // x[t] from the registers of the thread that holds it
#pragma unroll
        for (int e = 0; e < E; ++e) xt = e == ts ? a[e] : xt;
    }
    if (smooth) ce_smooth_chunk(a, ch, q, g, w, swx, sw);
}

// The row's lse from each thread's m and s: the group's max M, then the group's sum of s rescaled to M.
__device__ __forceinline__ A ce_row_lse(const A m, const A s, A* sm)
{
    A M = g_max(m, sm);
    if (M == NEG_INF) M = 0;
    const A f = m == NEG_INF ? (A)0 : exp(m - M);
    return M + log(g_sum(s * f, sm));
}

// Row r's outputs, by the one thread that writes them: lse, the 'none' loss row, and the loss term and weight into
// the running sums -- -(1 - eps) w[t] (x[t] - lse) [- eps / C (swx - lse sw)]; 0 and 0 for ignore_index; NaN for a
// class index out of range.
__device__ __forceinline__ void ce_row_out(const int r, const long long t, const A xt, const A lse, const A swx,
    const A sw, const T* __restrict__ w, T* __restrict__ loss_rows, A* __restrict__ lse_out, const int C,
    const long long ignore_index, const double eps, A& acc_loss, A& acc_den)
{
    const bool valid = t != ignore_index, in_range = t >= 0 && t < C;
    A per = 0, wt = 0;
    if (valid) {
        if (in_range) {
            wt = HAS_W ? LD(w[t]) : (A)1;
            per = -((A)(1.0 - eps) * wt * (xt - lse));
            if (SMOOTH) per -= (A)(eps / C) * (swx - lse * sw);
        } else {
            per = wt = A_NAN;                       // a bad class index
        }
    }
    lse_out[r] = lse;
    if (REDUCTION == 0) loss_rows[r] = ST(per);
    acc_loss += per; acc_den += wt;
}

template <bool VA> __device__ __forceinline__ void ce_fwd_body(
    const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
    A* __restrict__ lse_out, const int rows, const int C, const long long ignore_index, const double eps, A* sm,
    A& acc_loss, A& acc_den)
{
    const int g = threadIdx.x % G;
    const bool smooth = SMOOTH;                  // compile-time: eps != 0
    for (int r0 = blockIdx.x * RPB; r0 < rows; r0 += gridDim.x * RPB) {      // uniform over the block
        const int r = r0 + (int)threadIdx.x / G;
        const bool live = r < rows;
        const X* xr = x + (size_t)(live ? r : 0) * C;
        const long long t = live ? (long long)target[r] : ignore_index;     // issued with the row's loads
        const Geo q = row_geo(xr, live ? C : 0, VA);
        const int nch = ONE ? 1 : (q.nb + CV - 1) / CV;
        A a[E], ed[NE1];
        A m = NEG_INF, s = 0, swx = 0, sw = 0, xt = 0;
        // Where x[t] sits when it is in this thread's body vectors: chunk tch, slot ts (else ts = -1): two
        // instructions an element (a compare with a constant, a select) instead of the element's class index and a
        // 64-bit compare.  Powers of two: shifts.
        int tch = -1, ts = -1;
        {
            const unsigned tb = (unsigned)((t >= 0 && t < C ? (int)t : -1) - q.h);    // offset into the body
            if (tb < (unsigned)(q.nb * VEC)) {
                const unsigned tv = tb / VEC;
                if ((int)(tv % G) == g) { tch = (int)(tv / CV); ts = (int)((tv % CV) / G) * VEC + (int)(tb % VEC); }
            }
        }
        load_edges(xr, q, g, NEG_INF, ed);
        for (int ch = 0; ch < nch; ++ch) {
            load_chunk<VA>(xr, ch, q, g, NEG_INF, a);
            ce_chunk_sums<true, false>(a, ed, ce_chunk_max(a, ed, ch), ch, q, g, t, tch, ts, w, m, s, swx, sw, xt);
        }
        const A lse = ce_row_lse(m, s, sm);
        xt = g_sum(xt, sm);                          // one thread holds it, the others add 0: exact
        if (smooth) { swx = g_sum(swx, sm); sw = g_sum(sw, sm); }
        if (g == 0 && live)
            ce_row_out(r, t, xt, lse, swx, sw, w, loss_rows, lse_out, C, ignore_index, eps, acc_loss, acc_den);
    }
}

#if PIPE
// PIPE (softmax_kernels' one-chunk warp rows; session 7): the cross-entropy forward is a pure read of the logits, so
// each group issues its NEXT row's loads and target before it reduces the current row (softmax_kernels'
// fwd_rows_pipe): a row of loads always in flight per warp.  Same sums, same order, as ce_fwd_body with one chunk.
template <int UNUSED> __device__ __forceinline__ void ce_fwd_pipe(
    const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
    A* __restrict__ lse_out, const int rows, const int C, const long long ignore_index, const double eps, A* sm,
    A& acc_loss, A& acc_den)
{
    const int g = threadIdx.x % G, stride = gridDim.x * RPB;
    const bool smooth = SMOOTH;
    int r0 = blockIdx.x * RPB;
    if (r0 >= rows) return;                                              // uniform over the block
    int r = r0 + (int)threadIdx.x / G;
    bool live = r < rows;
    Geo q = row_geo(x + (size_t)(live ? r : 0) * C, live ? C : 0, true);
    long long t = live ? (long long)target[r] : ignore_index;
    XRow cur, nxt;
    pipe_issue(x + (size_t)(live ? r : 0) * C, q, g, cur);
    for (; r0 < rows; r0 += stride) {                                    // uniform over the block
        const int rn = r + stride;
        const bool liven = rn < rows;
        const Geo qn = row_geo(x + (size_t)(liven ? rn : 0) * C, liven ? C : 0, true);
        long long tn = ignore_index;
        if (r0 + stride < rows) {
            if (liven) tn = (long long)target[rn];
            pipe_issue(x + (size_t)(liven ? rn : 0) * C, qn, g, nxt);
        }
        A a[E], ed[NE1];
        pipe_decode(cur, q, g, NEG_INF, a, ed);
        A m = NEG_INF, s = 0, swx = 0, sw = 0, xt = 0;
#if FASTX
        // x[t] by one load (every thread of the group; the row's lines were just read: L1), waited on only at the end
        if (live && t >= 0 && t < C) xt = LD(x[(size_t)r * C + t]);
        int ts = -1;
#else
        // x[t]'s slot in this thread's body (ts = -1: not here): as ce_fwd_body, one chunk
        int ts = -1;
        {
            const unsigned tb = (unsigned)((t >= 0 && t < C ? (int)t : -1) - q.h);
            if (tb < (unsigned)(q.nb * VEC)) {
                const unsigned tv = tb / VEC;
                if ((int)(tv % G) == g) ts = (int)(tv / G) * VEC + (int)(tb % VEC);
            }
        }
#endif
        m = ce_chunk_max(a, ed, 0);
        const A sh = m == NEG_INF ? (A)0 : m;
        const A shl = FASTX ? sh * (A)1.4426950408889634 : (A)0;
#pragma unroll
        for (int j = 0; j < NE; ++j) {
            s += CE_EXP(ed[j], sh, shl);
            if (j < edge_n(q, g)) {
                const int c = edge_o(q, g) + j;
                if (!FASTX && c == t) xt = ed[j];
                if (smooth) { const A wc = HAS_W ? LD(w[c]) : (A)1; swx += wc * ed[j]; sw += wc; }
            }
        }
#pragma unroll
        for (int e = 0; e < E; ++e) {
            s += CE_EXP(a[e], sh, shl);
            if (!FASTX) xt = e == ts ? a[e] : xt;
        }
        if (smooth) ce_smooth_chunk(a, 0, q, g, w, swx, sw);
        const A lse = ce_row_lse(m, s, sm);
        if (!FASTX) xt = g_sum(xt, sm);             // FASTX: every thread loaded it
        if (smooth) { swx = g_sum(swx, sm); sw = g_sum(sw, sm); }
        if (g == 0 && live)
            ce_row_out(r, t, xt, lse, swx, sw, w, loss_rows, lse_out, C, ignore_index, eps, acc_loss, acc_den);
        cur = nxt; q = qn; r = rn; live = liven; t = tn;
    }
}
#endif

#ifndef LONG
#define LONG 0
#endif
#if LONG
#if ONE || PIPE || G != BLOCK || VEC < 2
#error "LONG streams multi-chunk rows of one block (G == BLOCK) with vector loads"
#endif
static_assert(sizeof(A) == 4, "LONG: float accumulation (float64 keeps ce_fwd_body)");
// LONG (session 17, issue 10; MINIDNN_CE_LONG): the forward of rows longer than one chunk (ONE=0: > 16K float32
// classes; G = BLOCK = 512 threads a row, NV vectors of VEC a thread a chunk, two blocks an SM), streamed.
// ce_fwd_body issues a chunk's NV loads, waits, reduces the chunk and only then issues the next chunk's: at (4096,
// 32000) float32 a block had nothing in flight while it reduced a chunk, met for the row's lse (six barriers) or
// retired -- 55% of copy (64 registers, 248 bytes of spills: nvcc 13, sm_90).  Here a thread's next chunk -- this
// row's next, or after the last the block's next row's first (stride gridDim.x, as ce_fwd_body) -- is copied
// global -> shared by cp.async into the thread's own slots k * BLOCK + g of one stage (BLOCK * NV vectors: 64 KB
// float32, 32 KB 16-bit or widened; two blocks an SM take 128 / 64 of the 228 KB) as soon as the current chunk is
// in registers and its max taken: a chunk is in flight while the previous one is reduced and while the block meets.
// The next row's target and RAGGED edges (threads 0 and G - 1) are loaded before the meeting.  A thread reads back
// only the slots it copied (cp.async.wait_all: its own copies have landed; no barrier) and refills them only after
// its chunk's max consumed every value read from them.  x[t] is one load of thread 0, which uses it (ce_fwd_body: a
// select an element, then a block sum of x[t] and zeros -- the same value, two barriers a row).  The values in a[],
// the sums after the load and the grid (so each block's rows, and thread 0's running sums) are ce_fwd_body's: lse,
// the loss rows, the partial sums and 'mean' / 'sum' bitwise CE_LONG "0" (tests/backend/test_ce_long_cuda.py).
// LONG 2 (CE_LONG "2", planned only with FASTX: 16-bit logits): the elements' exp as FASTX's (ex2.approx.ftz and one
// FFMA for expf's ~9 instructions: a bfloat16 row is half the bytes of a float32 one for the same arithmetic, so
// issue, not memory, may bound it), against float64.
#if XSTORAGE < 0
typedef VR LVR;
typedef Pack LPack;
#else
typedef XVR LVR;
typedef XPack LPack;
#endif
static_assert(sizeof(LVR) == 16 || sizeof(LVR) == 8, "LONG: 16-byte vectors (8 for widened 16-bit logits)");
#ifndef LSLOTS
#define LSLOTS 1                                    // stage slots: 1 (a chunk ahead) | 3 (two ahead; whole rows)
#endif
#if LSLOTS != 1 && (LSLOTS != 3 || RAGGED)
#error "LSLOTS is 1, or 3 for whole rows (every row the same number of chunks, at least two)"
#endif
#define LSTAGE (BLOCK * NV)                         // vectors a slot

// Chunk ch of the row at p (geometry q) into this thread's stage slots k * BLOCK + g, as one commit group; slots
// past the body are not copied (long_take pads them).
__device__ __forceinline__ void long_issue(LVR* st, const X* __restrict__ p, int ch, const Geo& q, int g)
{
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int v = ch * CV + k * G + g;
        if (v < q.nb) {
            unsigned d;                             // the slot's shared-window address (conv_igemm's asm)
            asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(d) : "l"(st + k * BLOCK + g));
            const X* s = p + q.h + v * VEC;
            if (sizeof(LVR) == 16)                  // L2 only (.cg); an 8-byte copy must take .ca
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(d), "l"(s) : "memory");
            else
                asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" : : "r"(d), "l"(s) : "memory");
        }
    }
    asm volatile("cp.async.commit_group;" : : : "memory");
}

// This thread's copies of chunk ch landed (LSLOTS 3: all groups but the newest, the next chunk's); its slots into
// a[] as load_chunk<true> fills them (pad past the body).
__device__ __forceinline__ void long_take(const LVR* st, int ch, const Geo& q, int g, A* a)
{
#if LSLOTS == 3
    asm volatile("cp.async.wait_group 1;" : : : "memory");
#else
    asm volatile("cp.async.wait_all;" : : : "memory");
#endif
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int v = ch * CV + k * G + g;
        LPack u;
        u.raw = st[k * BLOCK + g];
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[k * VEC + j] = v < q.nb ? LD(u.v[j]) : NEG_INF;
    }
}

template <int UNUSED> __device__ __forceinline__ void ce_fwd_long(
    const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
    A* __restrict__ lse_out, const int rows, const int C, const long long ignore_index, const double eps, A* sm,
    A& acc_loss, A& acc_den)
{
    extern __shared__ __align__(16) unsigned char ce_stage[];
    __shared__ A acc[2];                         // thread 0's row sums (the only nonzero ones, as ce_fwd_body's):
    LVR* st = reinterpret_cast<LVR*>(ce_stage);  // the same adds, two registers fewer live through the chunks
    const int g = threadIdx.x;                   // G == BLOCK: one row a block
    const bool smooth = SMOOTH;
    int r = blockIdx.x;
    if (r >= rows) return;                       // uniform over the block
    if (g == 0) { acc[0] = acc_loss; acc[1] = acc_den; }
    Geo q = row_geo(x + (size_t)r * C, C, true);
    long long t = (long long)target[r];
    A ed[NE1];
    load_edges(x + (size_t)r * C, q, g, NEG_INF, ed);
    long_issue(st, x + (size_t)r * C, 0, q, g);
#if LSLOTS == 3
    // LSLOTS 3 (CE_LONG_SLOTS): two chunks in flight, slot (i mod 3) for the block's i-th chunk; whole rows have
    // the same geometry and at least two chunks, so chunk i + 2 is this row's or the next row's (of chunk i + 2 -
    // nch).  The slot refilled is the one read a chunk ago.
    long_issue(st + LSTAGE, x + (size_t)r * C, 1, q, g);
    int cs = 0;                                  // the slot of the chunk being read
#endif
    for (;;) {
        const X* xr = x + (size_t)r * C;
        const int nch = (q.nb + CV - 1) / CV;
        const int rn = r + (int)gridDim.x;
        A m = NEG_INF, s = 0, swx = 0, sw = 0, xt = 0;
        // x[t] by one load of thread 0 (the thread that uses it), waited on only at the row's end: ce_fwd_body's
        // per-element select and its block sum of one x[t] and zeros (exact: the same value) are gone
        if (g == 0 && t >= 0 && t < C) xt = LD(xr[t]);
        for (int ch = 0; ch < nch; ++ch) {
            A a[E];
#if LSLOTS == 3
            long_take(st + cs * LSTAGE, ch, q, g, a);
#else
            long_take(st, ch, q, g, a);
#endif
            const A cm = ce_chunk_max(a, ed, ch);
#if LSLOTS == 3
            {
                LVR* fill = st + (cs == 0 ? 2 : cs - 1) * LSTAGE;
                if (ch + 2 < nch) long_issue(fill, xr, ch + 2, q, g);
                else if (rn < rows) long_issue(fill, x + (size_t)rn * C, ch + 2 - nch, q, g);   // uniform
                else asm volatile("cp.async.commit_group;" : : : "memory");   // empty: wait_group 1 still counts
                cs = cs == 2 ? 0 : cs + 1;
            }
#else
            // the stage's values are all in a[] and consumed: it takes the next chunk now
            if (ch + 1 < nch) {
                long_issue(st, xr, ch + 1, q, g);
            } else if (rn < rows) {                  // uniform over the block
                const X* xn = x + (size_t)rn * C;
                long_issue(st, xn, 0, row_geo(xn, C, true), g);
            }
#endif
            // ce_fwd_body's sums, the same text (LONG 2: FASTX's exp); x[t] is thread 0's load above
            ce_chunk_sums<false, (LONG >= 2)>(a, ed, cm, ch, q, g, t, -1, -1, w, m, s, swx, sw, xt);
        }
        // the next row's target and RAGGED edges (threads 0 and G - 1), in flight while the block meets (ed is dead
        // here; its geometry again: fewer registers live through the last chunk than keeping it)
        Geo qn = q;
        long long tn = ignore_index;
        if (rn < rows) {
            qn = row_geo(x + (size_t)rn * C, C, true);
            tn = (long long)target[rn];
            load_edges(x + (size_t)rn * C, qn, g, NEG_INF, ed);
        }
        const A lse = ce_row_lse(m, s, sm);
        if (smooth) { swx = g_sum(swx, sm); sw = g_sum(sw, sm); }
        if (g == 0) ce_row_out(r, t, xt, lse, swx, sw, w, loss_rows, lse_out, C, ignore_index, eps, acc[0], acc[1]);
        if (rn >= rows) break;                   // uniform over the block
        r = rn; q = qn; t = tn;
    }
    if (g == 0) { acc_loss = acc[0]; acc_den = acc[1]; }
}
#endif

#ifndef P16
#define P16 0
#endif
#if P16
#if !PIPE || !FASTX || SMOOTH || STORAGE == 0 || VEC < 2 || RAGGED || XSTORAGE >= 0
#error "P16 is the FASTX pipe forward of 2-byte logits in whole vectors, without label smoothing"
#endif
// P16 (session 10; MINIDNN_CE_FWD16): the pipe forward of 16-bit logits on their packed words.  Session 9's FASTX
// pipe ran 397 instructions a row and lane (bf16 (16384, 1000): 56% of copy), ~100 of them per-element overhead of
// the decoded floats: a select for the pad slots (FSEL), the max (FMNMX), the decode.  Here:
// - a row (whole vectors: not RAGGED) stays packed, VEC / 2 32-bit words a vector, two values a word; slots past
//   the body are loaded as the -inf pair, so no select;
// - the max is taken on the words (max.bf16x2 / max.f16x2: two values an instruction, NaN skipped as fmax), then
//   over the two halves of the result;
// - each value: its decode (bf16: a shift or a mask), one FFMA and one ex2.approx (FASTX's exp), one FADD into one
//   of two running sums (low and high halves: two dependency chains).
// SASS (nvcc 13, sm_90, bf16 (16384, 1000)): ~300 instructions a row and lane.  The next row is in flight a group
// (as PIPE), in two slots that the walk is unrolled over (nothing copied).  The register budget, so the warps an SM,
// is the planner's (P16_REGS): a bf16 row is 2 KB a warp, and session 9's 16 warps an SM kept only 32 KB of loads in
// flight.
#define P16W (VEC / 2)                              // 32-bit words a vector
#ifndef FULLK
#define FULLK 0                                     // CE_TAIL "2": slots k < FULLK hold body vectors in every row
#endif
__device__ __forceinline__ float lg2_fast(float x)
{
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
union PW { VR raw; unsigned int w[P16W]; };
struct Slot16 { VR v[NV]; Geo q; long long t; int r; bool live; };
__device__ __forceinline__ unsigned int p16_neg_inf2() { return STORAGE == 1 ? 0xFC00FC00u : 0xFF80FF80u; }
__device__ __forceinline__ unsigned int p16_max2(unsigned int a, unsigned int b)
{
    unsigned int d;
#if STORAGE == 1
    asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#else
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#endif
    return d;
}
__device__ __forceinline__ float p16_lo(unsigned int w)
{
#if STORAGE == 2
    return __uint_as_float(w << 16);
#else
    return LD((T)(w & 0xffffu));
#endif
}
__device__ __forceinline__ float p16_hi(unsigned int w)
{
#if STORAGE == 2
    return __uint_as_float(w & 0xffff0000u);
#else
    return LD((T)(w >> 16));
#endif
}

// Row r's loads (r >= rows: none; every slot the -inf pair) and its target into slot s.
__device__ __forceinline__ void p16_issue(const T* __restrict__ x, const I* __restrict__ target, int r, int rows,
                                          int C, int g, long long ignore_index, Slot16& s)
{
    s.r = r;
    s.live = r < rows;
    const T* p = x + (size_t)(s.live ? r : 0) * C;
    s.q = row_geo(p, s.live ? C : 0, true);
    s.t = s.live ? (long long)target[r] : ignore_index;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int v = k * G + g;
        PW u;
        if (k < FULLK) {                    // CE_TAIL "2": a slot every live row fills (a dead row reads row 0)
            u.raw = *reinterpret_cast<const VR*>(p + v * VEC);
        } else {
#pragma unroll
            for (int i = 0; i < P16W; ++i) u.w[i] = p16_neg_inf2();
            if (v < s.q.nb) u.raw = *reinterpret_cast<const VR*>(p + s.q.h + v * VEC);
        }
        s.v[k] = u.raw;
    }
}

// One row of the walk: issue row r0 + stride into `fill`, reduce `cur` (row r0 of the block), advance r0.
// Same formulas as ce_fwd_pipe with FASTX; the sums' order differs (two partial sums a thread).
__device__ __forceinline__ bool p16_step(Slot16& cur, Slot16& fill, int& r0, const int stride,
    const T* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
    A* __restrict__ lse_out, const int rows, const int C, const long long ignore_index, const double eps, A* sm,
    A& acc_loss, A& acc_den)
{
    const int g = threadIdx.x % G;
    if (r0 + stride < rows)                                              // uniform over the block
        p16_issue(x, target, r0 + stride + (int)threadIdx.x / G, rows, C, g, ignore_index, fill);
    const long long t = cur.t;
    const bool in_range = t >= 0 && t < C;
    A xt = 0;
    if (cur.live && in_range) xt = LD(x[(size_t)cur.r * C + t]);       // the row's lines were just read: L1
    unsigned int mw = p16_neg_inf2();
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        PW u;
        u.raw = cur.v[k];
#pragma unroll
        for (int i = 0; i < P16W; ++i) mw = p16_max2(mw, u.w[i]);
    }
    const A m = vmax(p16_lo(mw), p16_hi(mw));
    const A sh = m == NEG_INF ? (A)0 : m;
    const A shl = sh * (A)1.4426950408889634;
    A s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        PW u;
        u.raw = cur.v[k];
#pragma unroll
        for (int i = 0; i < P16W; ++i) {
            s0 += CE_EXP(p16_lo(u.w[i]), sh, shl);
            s1 += CE_EXP(p16_hi(u.w[i]), sh, shl);
        }
    }
    A M = g_max(m, sm);
    if (M == NEG_INF) M = 0;
#if TAIL >= 2
    // CE_TAIL "2": the row's two transcendental calls as ex2 / lg2 approximations (FASTX's exp; lg2.approx: ~2^-22
    // absolute), ~30 instructions a row fewer than expf / logf
    const A f = m == NEG_INF ? (A)0 : ex2_fast((m - M) * LOG2E_F);
    const A lse = M + lg2_fast(g_sum((s0 + s1) * f, sm)) * 0.6931471805599453f;
#else
    const A f = m == NEG_INF ? (A)0 : exp(m - M);
    const A lse = M + log(g_sum((s0 + s1) * f, sm));
#endif
    if (g == 0 && cur.live)                     // P16 has no SMOOTH: no smoothing sums
        ce_row_out(cur.r, t, xt, lse, (A)0, (A)0, w, loss_rows, lse_out, C, ignore_index, eps, acc_loss, acc_den);
    r0 += stride;
    return r0 < rows;
}

template <int UNUSED> __device__ __forceinline__ void ce_fwd_p16(
    const T* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
    A* __restrict__ lse_out, const int rows, const int C, const long long ignore_index, const double eps, A* sm,
    A& acc_loss, A& acc_den)
{
    const int g = threadIdx.x % G, stride = gridDim.x * RPB, rr = (int)threadIdx.x / G;
    int r0 = blockIdx.x * RPB;
    if (r0 >= rows) return;                                              // uniform over the block
    Slot16 s0, s1;
    p16_issue(x, target, r0 + rr, rows, C, g, ignore_index, s0);
    for (;;) {
        if (!p16_step(s0, s1, r0, stride, x, target, w, loss_rows, lse_out, rows, C, ignore_index, eps, sm, acc_loss,
                      acc_den)) break;
        if (!p16_step(s1, s0, r0, stride, x, target, w, loss_rows, lse_out, rows, C, ignore_index, eps, sm, acc_loss,
                      acc_den)) break;
    }
}
#endif

extern "C" __global__ void __launch_bounds__(BLOCK, MINB)
ce_rows_fwd(const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
            A* __restrict__ lse_out, A* __restrict__ partial, unsigned int* ticket, T* __restrict__ loss_out,
            A* __restrict__ denom_out, const int rows, const int C, const long long ignore_index, const double eps)
{
    __shared__ A sm[BLOCK / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    A acc_loss = 0, acc_den = 0;
#if LONG
    // the host hands LONG only x on the vector boundary (forward: a copy otherwise): cp.async needs it, and without
    // ce_fwd_body's scalar fallback beside it the 16-bit LONG kernels do not spill
    ce_fwd_long<0>(x, target, w, loss_rows, lse_out, rows, C, ignore_index, eps, sm, acc_loss, acc_den);
#else
#if P16
    if (aligned(x)) ce_fwd_p16<0>(x, target, w, loss_rows, lse_out, rows, C, ignore_index, eps, sm, acc_loss, acc_den);
    else
#endif
#if PIPE
    if (aligned_x(x)) ce_fwd_pipe<0>(x, target, w, loss_rows, lse_out, rows, C, ignore_index, eps, sm, acc_loss,
                                   acc_den);
    else
#endif
    if (aligned_x(x)) ce_fwd_body<true>(x, target, w, loss_rows, lse_out, rows, C, ignore_index, eps, sm, acc_loss,
                                      acc_den);
    else ce_fwd_body<false>(x, target, w, loss_rows, lse_out, rows, C, ignore_index, eps, sm, acc_loss, acc_den);
#endif
    ce_grid_sum<BLOCK>(acc_loss, acc_den, partial, ticket, loss_out, denom_out, lane, warp);
}

// dx_c = exp(x_c - lse) * sum_q * g - q_c * g      (lsel = lse log2e: FASTX's exp)
__device__ __forceinline__ A ce_dx(A v, int c, long long t, const T* __restrict__ w, bool smooth, A qt, A ec, A gr,
                                   A lse, A lsel, A sumqg)
{
    A q = c == t ? qt : (A)0;
    if (smooth) q += ec * (HAS_W ? LD(w[c]) : (A)1);
    const A qg = q != (A)0 ? q * gr : (A)0;
    return CE_EXP(v, lse, lsel) * sumqg - qg;
}

template <bool VA> __device__ __forceinline__ void ce_bwd_body(
    const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, const A* __restrict__ lse_in,
    const T* __restrict__ gsrc, const A* __restrict__ denom, X* __restrict__ dx, const int rows, const int C,
    const long long ignore_index, const double eps, const A sw)
{
    const int g = threadIdx.x % G;
    const bool smooth = SMOOTH;                  // compile-time: eps != 0
    const A ec = (A)(eps / C);
    A a[E], ed[NE1];
    for (int r0 = blockIdx.x * RPB; r0 < rows; r0 += gridDim.x * RPB) {      // no reductions: a dead row just skips
        const int r = r0 + (int)threadIdx.x / G;
        if (r >= rows) continue;
        const size_t base = (size_t)r * C;
        const Geo q = row_geo(x + base, C, VA);
        const int nch = ONE ? 1 : (q.nb + CV - 1) / CV;
        const long long t = (long long)target[r];
        if (t == ignore_index) {
            const A z = ignored_dx(lse_in[r]);
#pragma unroll
            for (int e = 0; e < E; ++e) a[e] = z;
#pragma unroll
            for (int j = 0; j < NE1; ++j) ed[j] = z;
            for (int ch = 0; ch < nch; ++ch) store_chunk<VA>(dx + base, ch, q, g, a);
            store_edges(dx + base, q, g, ed);
            continue;
        }
        A gr = LD(gsrc[REDUCTION == 0 ? r : 0]);
        if (REDUCTION == 1) gr /= denom[0];
        const bool in_range = t >= 0 && t < C;
        const A wt = in_range ? (HAS_W ? LD(w[t]) : (A)1) : A_NAN;
        const A qt = (A)(1.0 - eps) * wt;
        const A sumq = qt + (smooth ? ec * sw : (A)0);
        const A sumqg = sumq != (A)0 ? sumq * gr : (A)0;
        const A lse = lse_in[r];
        const A lsel = FASTX ? lse * (A)1.4426950408889634 : (A)0;
        load_edges(x + base, q, g, (A)0, ed);
#pragma unroll
        for (int j = 0; j < NE; ++j)
            if (j < edge_n(q, g))
                ed[j] = ce_dx(ed[j], edge_o(q, g) + j, t, w, smooth, qt, ec, gr, lse, lsel, sumqg);
        store_edges(dx + base, q, g, ed);
        for (int ch = 0; ch < nch; ++ch) {
            load_chunk<VA>(x + base, ch, q, g, (A)0, a);
            if (FASTX && !smooth) {                  // q_c = 0 off the target: exp * sum_q g; x[t]'s slot below
#pragma unroll
                for (int e = 0; e < E; ++e) a[e] = CE_EXP(a[e], lse, lsel) * sumqg;
            } else {
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    const int v = ch * CV + k * G + g;
#pragma unroll
                    for (int j = 0; j < VEC; ++j) {
                        const int c = v < q.nb ? q.h + v * VEC + j : 0;
                        a[k * VEC + j] = ce_dx(a[k * VEC + j], c, v < q.nb ? t : -1, w, smooth, qt, ec, gr, lse,
                                               lsel, sumqg);
                    }
                }
            }
            store_chunk<VA>(dx + base, ch, q, g, a);
        }
        if (FASTX && !smooth && in_range) {
            // dx[t] again, by the thread that stored the body vector holding it (its own program order: this store
            // lands last), now with -q_t g; a target in the head or tail was done with the edges
            const unsigned tb = (unsigned)((int)t - q.h);
            if (tb < (unsigned)(q.nb * VEC) && (int)((tb / VEC) % G) == g)
                dx[base + t] = STX(ce_dx(LD(x[base + t]), (int)t, t, w, false, qt, ec, gr, lse, lsel, sumqg));
        }
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK, MINB)
ce_rows_bwd(const X* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w,
            const A* __restrict__ lse_in, const T* __restrict__ gsrc, const A* __restrict__ denom, X* __restrict__ dx,
            const int rows, const int C, const long long ignore_index, const double eps)
{
    A sw = (A)C;
    if (HAS_W && SMOOTH) {                        // sum_c w_c, once per block (fixed order)
        __shared__ A part[BLOCK / 32];
        A b = 0;
        for (int c = threadIdx.x; c < C; c += BLOCK) b += LD(w[c]);
        b = warp_sum(b);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = b;
        __syncthreads();
        sw = 0;
        for (int k = 0; k < BLOCK / 32; ++k) sw += part[k];
    }
    if (aligned_x(x, dx)) ce_bwd_body<true>(x, target, w, lse_in, gsrc, denom, dx, rows, C, ignore_index, eps, sw);
    else ce_bwd_body<false>(x, target, w, lse_in, gsrc, denom, dx, rows, C, ignore_index, eps, sw);
}
"""

# Session 9, round 2: FASTX (above) for the row kernels of 2-byte logits by default.  MINIDNN_CE_FAST=16 (default:
# 16-bit logits) | 1 (float32 too) | 0 (none: the accurate expf and the register select of x[t]).  Module attribute,
# read at planning time (tools/ktable_ab.py flips it).
CE_FAST = os.environ.get("MINIDNN_CE_FAST", "16")


def ce_fast(dtype) -> bool:
    """Whether the row kernels of ``dtype`` logits take FASTX (CE_FAST; float accumulation only)."""
    item = np.dtype(dtype).itemsize
    return (CE_FAST == "1" and item <= 4) or (CE_FAST == "16" and item == 2)


# Session 10: P16 (SOURCE_ROWS above), the pipe forward of 2-byte logits on packed words, the next row in flight a
# group.  MINIDNN_CE_FWD16=0 (session 9's FASTX pipe) | bf16 ("1" for bfloat16 only) | 1 (the default: P16, 64
# registers: four 256-thread blocks an SM, 32 warps).  nvcc 13, sm_90, bf16 (16384, 1000): 64 registers, no spills.
# tools/ktable_ab.py row cefwd16a ("1" against "0"); module attribute read at planning time.  (Session 10's "2", two
# rows ahead at 80 registers, measured even with "1" on the H200 -- 0.0117 / 0.0118 ms -- was removed in session 11.)
# Measured (H100, session 10 runs 4-5, graph replays): bf16 (16384, 1000) 0.0141 -> 0.0119 ms (78% -> 93% of copy,
# off/on 1.18-1.19): the default is "1".  (Run 3's float16 failure was the test's: the 'sum' of 13001 rows is stored in
# float16, as PyTorch's, and overflows to inf on every setting; its reference is now rounded to float16 too.)
CE_FWD16 = os.environ.get("MINIDNN_CE_FWD16", "1")
P16_REGS = 64


def uses_p16(defines, dtype, eps) -> bool:
    """Whether the forward takes P16 (CE_FWD16); otherwise it keeps session 9's kernels.  P16 needs 2-byte logits,
    FASTX, the PIPE path, whole vectors (not RAGGED: a 1001-class row's edges spilled) and no label smoothing
    (``defines``: row_defines' strings)."""
    d = dict(x.split("=", 1) for x in defines)
    on = CE_FWD16 == "1" or (CE_FWD16 == "bf16" and _dev.dtype_name(dtype) == "bfloat16")
    return bool(on and np.dtype(dtype).itemsize == 2 and ce_fast(dtype) and not eps
                and d.get("PIPE") == "1" and d.get("RAGGED") == "0")


# Session 12 (issue 10: the bf16 (16384, 1000) forward at 67% of copy, 0.0118 ms for 32.9 MB): CE_TAIL, the forward's
# fixed costs (docs/step_kernels.md, "Session 12: cross-entropy and softmax forward").  MINIDNN_CE_TAIL=2 (default
# since GPU run 3 of session 12: bf16 (16384, 1000) 0.0119 -> 0.0105 ms, (65536, 128) 0.0122 -> 0.0086, (128, 10)
# 0.0040 -> 0.0027; float32 0.0202 -> 0.0197, (65536, 128) 0.0222 -> 0.0200) | 1 (the row forward's ticket as one
# acquire-release atomic instead of __threadfence's sequentially consistent fence, and the last block's partial sums
# loaded TAIL_LD a thread at once through L2 instead of one volatile system-scope round trip a trip: the same sums in
# the same order, bitwise "0") | 0 (session 11's kernels, for an A/B).  "2" is "1" everywhere but P16 (16-bit logits
# in their own dtype), which also loads its always-whole vector slots without the -inf preset and bound check
# (FULLK: a layout fact) and takes the row's exp(m - M) and log as ex2 / lg2 approximations (~2^-22 in lse, not
# bitwise "0").  The float32 kernel and the widened one (16-bit logits read as float32: XSTORAGE, never P16) both
# take "1" -- bitwise "0", so the widened path stays bitwise the cast path (tests/backend/test_ce_lowp_logits_cuda.py);
# "2"'s math there would save ~30 instructions a row of ~600 (float32 keeps expf an element) for an unmeasured gain.
# Module attribute read at planning time (tools/row_ab.py flips it).
CE_TAIL = os.environ.get("MINIDNN_CE_TAIL", "2")


def tail_defines(defines) -> tuple:
    """The CE_TAIL defines added to a row forward's ``defines`` (row_defines' strings, P16=1 if taken)."""
    if CE_TAIL not in ("1", "2"):
        return ()
    d = dict(x.split("=", 1) for x in defines)
    if CE_TAIL == "2" and d.get("P16") == "1":
        return ("TAIL=2",)
    return ("TAIL=1",)


# Session 17 (issue 10: the (4096, 32000) forward at 55% of copy float32, 52% bfloat16, against 78-93% for one-chunk
# rows): LONG (SOURCE_ROWS above), the multi-chunk row forward streamed through a shared-memory stage with cp.async,
# for rows of more than one chunk (ONE=0) with vector loads and float accumulation; the tiling, MINB and grid stay the
# plan's, and x[t] is one load of the thread that uses it (not a select an element and a block sum): every output is
# bitwise "0"'s.  MINIDNN_CE_LONG=1 | 2 (the default since session 17's run 3: "1" with FASTX's exp -- ex2.approx,
# one FFMA -- where the plan has FASTX, i.e. native 16-bit logits, as their one-chunk rows already compute: not
# bitwise, against float64; elsewhere "1") | 0 (ce_fwd_body, for an A/B).  Run 3 (H100, graph replays, "0" / this):
# float32 (4096, 32000) "1" 1.35x (64% -> 87% of copy), (2048, 50257) 1.19x, (1024, 128256) 1.21x; bfloat16 "1"
# 1.10 / 1.10 / 0.98x, "2" 1.18 / 1.47 / 1.01x (85% / 80% / 85%); widened bf16 1.08 / 1.00 / 1.02x.  Module attribute
# read at planning time (tools/ce_long_ab.py flips it).
# Spatial targets (inner > 1): SOURCE_SPATIAL's thread a position (True, the default since session 21) or SOURCE's
# warp a position (False: MINIDNN_CE_SPATIAL=0; read at import -- tools set the attribute and clear _plans).
CE_SPATIAL = os.environ.get("MINIDNN_CE_SPATIAL", "1") != "0"
# SP_CC (session 22): the spatial kernels' class count at compile time (CC) up to these C, forward / backward: a
# position's classes all loaded at once, the loops unrolled without masks or dead slots (C = 19 was a batch of 16 and
# one of 3 in 16 masked slots: ~46 instructions an element, ncu).  The bounds: nvcc 13 at 64 registers, no spill in
# any configuration (the backward with weights and smoothing spilled 4 bytes from 30 classes).  MINIDNN_CE_SP_CC=
# "fwd,bwd" ("0,0": C at run time, U at a time).
def _sp_cc(text):
    m = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+)\s*", text)
    if m is None:
        raise ValueError(f"MINIDNN_CE_SP_CC={text!r}: two class counts 'forward,backward' (e.g. '32,24'; '0,0': none)")
    return int(m.group(1)), int(m.group(2))


SP_CC = _sp_cc(os.environ.get("MINIDNN_CE_SP_CC", "32,24"))
# SP_PAIR (session 22): two adjacent positions a thread where inner is even, one 4-byte (16-bit) or 8-byte (float32)
# load a class -- half the load instructions and requests for the same bytes (run 3: the bfloat16 forward took as
# long as float32's for half the bytes, 23-42% of copy).  Its batches hold UP classes of both positions (SP_UP,
# forward / backward: registers).  A call whose x (or dx) is off a 2-element boundary takes one position a thread.
# MINIDNN_CE_SP_PAIR=0 | 1.
SP_PAIR = os.environ.get("MINIDNN_CE_SP_PAIR", "1") == "1"
SP_UP = (12, 6)     # nvcc 13, 64 registers: no spill in any planned build (the backward at 8-12 spilled)
# SP_RT (session 23): where C is read at run time (past SP_CC: ADE20K's 150 classes, COCO-stuff's 171), the full
# batches of classes without a mask, the class pointer advanced once a batch, the smoothing terms compiled in or out
# and x[t] loaded once a position (sp_fwd_sums_rt / sp_bwd_rt): the same batches and expressions, so one position a
# thread gives the same bits (pairs, now taken past SP_CC too, sum the forward in UP's batches: other bits);
# nvcc 13 SASS (bfloat16, (16, 150, 128, 128)): the forward's batch of 16 classes 570 -> 139 instructions, the
# backward's of 8 327 -> 102 (float32 742 -> 236, 422 -> 149) -- session 23's run 3 had the forward at 34% of copy
# in bfloat16, 60% in float32: bound by instructions, not bytes.  Not float64 (its weighted, smoothed forward spilled
# 4 bytes at 128 registers).  MINIDNN_CE_SP_RT=0: the masked batches (A/B).
SP_RT = os.environ.get("MINIDNN_CE_SP_RT", "1") != "0"
# Past SP_CC, pairs only where they still give every SM this many 256-thread blocks of pairs: session 23's run 4
# (H200, graph replays) had pairs 2-19% ahead at (16, 150, 128, 128) (131072 pairs) and 16-45% behind at
# (4, 171, 128, 128) and (8, 150, 64, 64) (32768 and 16384: under a block an SM).  (A module attribute: tests set 0.)
SP_RT_PAIR_BLOCKS = 2
# SP_SPLIT (session 23): past SP_CC with too few positions to fill the GPU one a thread (ADE20K's 150 classes at
# (8, 150, 64, 64): 32768 positions, 128 blocks for 132 SMs -- run 4: 52% / 31% of copy forward float32 / bfloat16),
# SPLIT threads a position, each a slice of at least SP_SPLIT_MIN classes: the forward's slices meet in shared memory
# (sp_fwd_split), the backward's need not meet (every dx its own).  SPLIT the smallest power of two up to 8 that gives
# the device half its resident threads.  H200, graph replays, against one thread a position: run 7 (split to all the
# resident threads) backward 1.10-1.43x at 32768 and 65536 positions ((8, 150, 64, 64), (4, 171, 128, 128): split 4),
# forward 1.15x at 32768 but 0.89-0.91x at 65536; run 8 (half) forward 1.04-1.05x at 65536 (split 2), while the
# backward's split 2 at 131072 positions ((8, 150, 128, 128), the full-threads rule) lost 1-5%.
# MINIDNN_CE_SP_SPLIT=0: one thread a position (A/B).
SP_SPLIT = os.environ.get("MINIDNN_CE_SP_SPLIT", "1") != "0"
SP_SPLIT_MIN = 32         # classes a slice (two of the forward's batches)


def sp_split(rows, c, threads):
    """Threads a position for ``rows`` positions of ``c`` classes (C read at run time) on a device that holds
    ``threads`` at once: SP_SPLIT's rule."""
    s = 1
    while SP_SPLIT and s < 8 and rows * s < threads and c // (2 * s) >= SP_SPLIT_MIN:
        s *= 2
    return s

CE_LONG = os.environ.get("MINIDNN_CE_LONG", "2")
# MINIDNN_CE_LONG_SLOTS=1 (default: one stage slot, a chunk in flight a block) | 3 (three slots, two chunks in flight,
# where the rows are whole -- not RAGGED -- and MINB blocks of three slots fit an SM: 16-bit and widened logits'
# 32 KB slots at two blocks an SM, float32's 64 KB with smoothing's one; an occupancy / latency probe, unmeasured).
# The slots change no value: bitwise the one-slot kernel.
CE_LONG_SLOTS = os.environ.get("MINIDNN_CE_LONG_SLOTS", "1")
SM_SHARED = 228 * 1024          # an H100 / H200 SM's shared memory; 1 KB of it reserved a block


def _slot_bytes(d) -> int:
    vbytes = 2 * int(d["VEC"]) if "XSTORAGE" in d else int(d["VBYTES"])
    return int(d["BLOCK"]) * int(d["NV"]) * vbytes


def long_defines(defines, fast) -> tuple:
    """("LONG=n",) -- n = 2 under CE_LONG "2" where the plan has FASTX (``fast``), else 1 -- plus ("LSLOTS=3",)
    under CE_LONG_SLOTS "3" where it fits, for a row forward of ``defines`` (row_defines' strings) that takes LONG;
    else ()."""
    d = dict(x.split("=", 1) for x in defines)
    on = (CE_LONG in ("1", "2") and d.get("ONE") == "0" and d.get("PIPE") == "0" and d.get("G") == d.get("BLOCK")
          and int(d.get("VEC", 1)) > 1 and d.get("ACCUM") == "float" and "WARP" not in d)
    if not on:
        return ()
    out = (f"LONG={2 if CE_LONG == '2' and fast else 1}",)
    minb = int(d["MINB"])
    if CE_LONG_SLOTS == "3" and d.get("RAGGED") == "0" and minb * (3 * _slot_bytes(d) + 2048) <= SM_SHARED:
        out += ("LSLOTS=3",)
    return out


def long_stage_bytes(defines) -> int:
    """The dynamic shared memory of a LONG forward: LSLOTS slots of BLOCK * NV vectors of VBYTES (widened 16-bit:
    2 VEC bytes)."""
    d = dict(x.split("=", 1) for x in defines)
    if d.get("LONG") not in ("1", "2"):
        return 0
    return int(d.get("LSLOTS", 1)) * _slot_bytes(d)


_INDEX = {np.dtype(np.int64): "long long", np.dtype(np.int32): "int"}
_F32 = np.dtype(np.float32)
_INT_MAX = 2 ** 31 - 1
_tickets: dict = {}


def supports(x, target, weight, widen=False) -> bool:
    """Class-index targets: float32/float64/float16/bfloat16 C-contiguous CuPy logits (N, C, *d), int32/int64
    contiguous targets, weight None or (C,) contiguous in x's dtype.  ``widen`` (XSTORAGE): 16-bit logits computed
    in float32, the weight float32."""
    wdtype = _F32 if widen else x.dtype
    return (_dev.is_cuda_array(x) and type_info(x.dtype) is not None and x.ndim >= 2 and 0 < x.size <= _INT_MAX
            and (not widen or x.dtype.itemsize == 2)
            and x.flags.c_contiguous and _dev.is_cuda_array(target) and np.dtype(target.dtype) in _INDEX
            and target.flags.c_contiguous and target.size * x.shape[1] == x.size
            and (weight is None or (_dev.is_cuda_array(weight) and weight.dtype == wdtype
                                    and weight.flags.c_contiguous and weight.size == x.shape[1])))


_kernel_cache: dict = {}
_SOURCES = {"ROWS": SOURCE_ROWS, "WARPS": SOURCE, "SPATIAL": SOURCE_SPATIAL}


def _kernel(source, name, defines):
    key = (source, name, defines)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _launch.get_kernel(_SOURCES[source], name,
                                                    tuple(f"-D{d}" for d in defines) + ("-std=c++14",))
    return k


def launch_spec(name, shape, dtype, index_dtype, weighted, reduction, eps=0.0, widen=False, sm80=True, sms=132):
    """(source key, kernel name, NAME=VALUE defines, grid groups, blocks per SM cap, threads a block) of ``name``
    ("ce_fwd" / "ce_bwd") for logits of ``shape``: the planner's choice, also what the nvcc check compiles.
    ``widen``: 16-bit ``dtype`` logits through the float32 kernels -- float32's whole plan, plus XSTORAGE.
    ``sm80``: the device runs cp.async (compute capability 8.0+); below it no LONG (its stage is filled by cp.async).
    ``sms``: the device's SMs (SP_RT's pairs need positions to fill them twice over)."""
    n, c = shape[:2]
    inner = math.prod(shape) // (n * c)
    rows = n * inner
    xstorage = type_info(dtype)[2] if widen else None
    if widen:
        dtype = _F32
    scalar, accum, storage, _ = type_info(dtype)
    base = (f"SCALAR={scalar}", f"ACCUM={accum}", f"STORAGE={storage}", f"INDEX={_INDEX[np.dtype(index_dtype)]}",
            f"HAS_W={int(weighted)}", f"REDUCTION={_REDUCTION[reduction]}") \
        + ((f"XSTORAGE={xstorage}",) if widen else ())
    if inner == 1 and not _sk.V1:       # the row kernels
        # registers: 64 a thread (four 256-thread blocks an SM), 80 with label smoothing's sums (64 spilled)
        # None: softmax's FWD_REGS (64); the forward's PIPE path (softmax_kernels.uses_pipe): pipe_regs at least
        defines, cfg = row_defines(c, dtype, regs=80 if eps else None, pipe=name == "ce_fwd")
        if name == "ce_fwd" and uses_p16(defines, dtype, eps):   # P16: its own register budget (MINB, the last define)
            minb = max(int(defines[-1].split("=")[1]), 65536 // (cfg.block * P16_REGS))
            defines = defines[:-1] + (f"MINB={minb}", "P16=1")
        if name == "ce_fwd":
            extra = tail_defines(defines)
            if extra == ("TAIL=2",):                  # FULLK: slots k with k * G + g < C / VEC for every g
                extra += (f"FULLK={min(cfg.nv, (c // cfg.vec) // cfg.g)}",)
            defines = defines + extra
            if sm80:
                defines = defines + long_defines(base + defines, ce_fast(dtype))
        # forward: no more blocks than fit the device at once (MINB an SM), each looping over its rows -- every
        # block ends with a partial, a threadfence and the ticket (one of 2-4 per SM at (16384, 1000), not ~16)
        # (float64: MINB = 1, registers uncapped -- left at 16)
        minb = int(dict(d.split("=") for d in defines)["MINB"])
        per_sm = minb if name == "ce_fwd" and minb > 1 else 16
        if xstorage == 1 and name == "ce_bwd" and minb > 1:
            # float16 widened backward: one block fewer an SM (its cvt.f32.f16 loads spilled 88 bytes at 64 registers,
            # 1000 classes; bfloat16's shifts do not).  No sum crosses rows in the backward: its values do not depend
            # on the blocks an SM.  (The forward's grid, so its partial sums, follows MINB: float32's, unchanged.)
            defines = tuple(f"MINB={minb - 1}" if d.startswith("MINB=") else d for d in defines)
        return ("ROWS", name.replace("ce_", "ce_rows_"),
                base + defines + (f"SMOOTH={int(eps != 0)}", f"FASTX={int(ce_fast(dtype))}"),
                -(-rows // (cfg.block // cfg.g)), per_sm, cfg.block)
    if CE_SPATIAL and not _sk.V1:       # inner > 1: a thread a position (SOURCE_SPATIAL); the forward's grid at most
        # the resident blocks (SP_MINB an SM: each block ends with a partial and the ticket)
        minb = 2 if accum == "double" else 4         # <= 64 registers (float, 16-bit): four blocks an SM, no spill
        # U: a position's loads issued together -- the forward 16 (8 in float64), the backward 8 (its stores and
        # exps beside: 16 spilled at 64 registers); more registers lost blocks an SM or spilled (nvcc, session 21)
        u = 16 if name == "ce_fwd" and accum != "double" else 8
        tail = ("TAIL=1",) if name == "ce_fwd" and CE_TAIL in ("1", "2") else ()     # ce_grid_sum's, as the rows'
        cc = (f"CC={c}",) if c <= SP_CC[name == "ce_bwd"] and accum != "double" else ()    # SP_CC's comment
        rt = ("SP_RT=1",) if not cc and SP_RT and accum != "double" else ()              # SP_RT's comment
        rt_pair = rt and rows // 2 >= sms * SP_RT_PAIR_BLOCKS * THREADS                  # SP_RT_PAIR_BLOCKS'
        pair = SP_PAIR and inner % 2 == 0 and bool(cc or rt_pair)                         # SP_PAIR's comment
        # (half the resident threads: SP_SPLIT's comment)
        split = sp_split(rows, c, sms * minb * THREADS // 2) if rt and not pair else 1
        return ("SPATIAL", name.replace("ce_", "ce_sp_"),
                base + (f"SP_MINB={minb}", f"U={u}", f"FASTX={int(ce_fast(dtype))}") + tail + cc + rt
                + (("PAIR=1", f"UP={SP_UP[name == 'ce_bwd']}") if pair else ())
                + ((f"SPLIT={split}",) if split > 1 else ()), -(-rows * split // (THREADS * (1 + pair))),
                minb if name == "ce_fwd" else 16, THREADS)
    return ("WARPS", name, base, (rows + 7) // 8, 8, THREADS)


def _grid(groups, dev, per_sm):
    return max(1, min(groups, _launch.sm_count(dev) * per_sm))


def _ticket(cp, dev):
    return _ws.kept_zeroed(_tickets, cp, 1, dev, 1)


# ---- plans: kernel, grid, packed scalars and output shapes once per call signature -------------------------------
_plans: dict = {}


class _Plan:
    __slots__ = ("dev", "go", "tshape", "acc", "dtype", "grid", "none", "xshape", "xdtype", "xalign", "xlong")


def _plan(name, x, target, weight, ignore_index, eps, reduction, dev, widen=False):
    n, c = x.shape[:2]
    inner = x.size // (n * c)
    rows = n * inner
    p = _Plan()
    p.dev, p.tshape, p.xshape, p.none = dev, target.shape, x.shape, reduction == "none"
    p.xdtype = x.dtype                               # x's and dx's dtype
    p.dtype = _F32 if widen else x.dtype             # the loss's and dloss's (T)
    p.acc = np.dtype(np.float64 if x.dtype == np.float64 else np.float32)
    arrays = [None] * (9 if name == "ce_fwd" else 7)
    source, kname, defines, groups, per_sm, block = launch_spec(name, x.shape, x.dtype, target.dtype,
                                                                weight is not None, reduction, eps, widen,
                                                                sm80=_sm80(dev), sms=_launch.sm_count(dev))
    # widen: the byte boundary x must sit on for the float32 kernel's row split (XVBYTES; 0: none -- scalar loads)
    vec = int(dict(d.split("=", 1) for d in defines).get("VEC", 1))
    # (the spatial PAIR build: 4 bytes, where its pairs are -- off it the kernel takes one position a thread, whose
    # batches and grid are not the aligned float32 copy's, so the cast keeps widen bitwise the float32 kernels')
    p.xalign = 2 * vec if widen and source == "ROWS" and vec > 1 else 4 if widen and "PAIR=1" in defines else 0
    # LONG (not widened): the boundary its copies need -- VBYTES unless RAGGED (each row's own head then); 0: none
    d = dict(x.split("=", 1) for x in defines)
    p.xlong = int(d["VBYTES"]) if d.get("LONG") in ("1", "2") and not widen and d.get("RAGGED") == "0" else 0
    p.grid = _grid(groups, dev, per_sm)
    if source == "ROWS":
        tail = [np.int32(rows), np.int32(c), np.int64(ignore_index), np.float64(eps)]
    else:
        tail = [np.int64(rows), np.int32(c), np.int32(inner), np.int64(ignore_index), np.float64(eps)]
    p.go = _launch.prepare(_kernel(source, kname, defines), (p.grid,), (block,), arrays + tail,
                           shared_mem=long_stage_bytes(defines))
    return p


def _key(name, x, target, weight, ignore_index, eps, reduction, widen):
    return (name, x.shape, x.dtype, target.shape, target.dtype, weight is None, ignore_index, eps, reduction,
            x.data.device_id, widen)


def forward(x, target, weight, ignore_index, eps, reduction, widen=False):
    """-> (loss, lse, denom) as described in the legend.  ``widen`` (16-bit x): loss, lse and denom those of
    x.astype(float32) through the float32 kernel, bitwise, without that copy (XSTORAGE)."""
    p = _launch.planned(_plans, _key("ce_fwd", x, target, weight, ignore_index, eps, reduction, widen), _plan,
                        "ce_fwd", x, target, weight, ignore_index, eps, reduction, x.data.device_id, widen)
    if p.xalign and x.data.ptr % p.xalign:      # off the float32 row split's boundary (a view): the cast, as before
        return forward(x.astype(_F32), target, weight, ignore_index, eps, reduction)
    if p.xlong and x.data.ptr % p.xlong:        # a LONG plan's x off the vector boundary (a view): an aligned copy
        return forward(x.copy(), target, weight, ignore_index, eps, reduction)
    cp = _launch._cp
    with _launch.on_device(p.dev):
        lse = cp.empty(p.tshape, dtype=p.acc)
        loss_rows = cp.empty(p.tshape, dtype=p.dtype) if p.none else None
        if p.dtype == p.acc:                     # loss and denom: two arrays of one allocation (workspace.pair)
            loss, denom = _ws.pair(cp, (), p.acc)
        else:
            loss, denom = cp.empty((), dtype=p.dtype), cp.empty((), dtype=p.acc)
        # the blocks' partial sums: read only by this launch's last block -- a kept scratch buffer (workspace.scratch)
        partial = _ws.scratch_flat(cp, p.dev, "ce.partial", 2 * p.grid, p.acc)
        p.go(x, target, x if weight is None else weight, loss if loss_rows is None else loss_rows, lse, partial,
             _ticket(cp, p.dev), loss, denom)
    return (loss if loss_rows is None else loss_rows), lse, denom


def backward(x, target, weight, lse, denom, g, ignore_index, eps, reduction, widen=False):
    """dx for the incoming gradient ``g`` (shape () for 'mean'/'sum', target's shape for 'none').  ``widen``
    (16-bit x, float32 g): dx in x's dtype, bitwise the float32 kernel's dx of x.astype(float32), then .astype."""
    p = _launch.planned(_plans, _key("ce_bwd", x, target, weight, ignore_index, eps, reduction, widen), _plan,
                        "ce_bwd", x, target, weight, ignore_index, eps, reduction, x.data.device_id, widen)
    if p.xalign and x.data.ptr % p.xalign:      # as forward
        return backward(x.astype(_F32), target, weight, lse, denom, g, ignore_index, eps, reduction).astype(x.dtype)
    cp = _launch._cp
    with _launch.on_device(p.dev):
        dx = cp.empty(p.xshape, dtype=p.xdtype)
        if g.dtype != p.dtype or not g.flags.c_contiguous:
            g = cp.ascontiguousarray(g, dtype=p.dtype)
        p.go(x, target, x if weight is None else weight, lse, g, denom, dx)
    return dx


def _compile_check(out_dir):
    """Write the planned row kernels' sources for nvcc over a few row lengths (python -m
    minidnn.backend.cuda.loss_kernels DIR)."""
    import os.path
    files = []
    for dtype, widen in (("float32", False), ("float64", False), ("bfloat16", False), ("bfloat16", True)):
        for c in (1, 10, 33, 1000, 1025, 4097, 32768, 50257):
            for name in ("ce_fwd", "ce_bwd"):
                for hw, red, eps in ((0, "mean", 0.0), (1, "none", 0.0), (1, "sum", 0.1)):
                    source, kname, defines, *_ = launch_spec(name, (8, c), _sk._dtype_of(dtype), np.int64, hw, red,
                                                             eps, widen)
                    path = os.path.join(out_dir, f"{kname}_{dtype}{'w' * widen}_{c}_{hw}{red}{eps}.cu")
                    _launch.write_source(path, _SOURCES[source], defines)
                    files.append(path)
    return files


if __name__ == "__main__":
    import sys
    print("\n".join(_compile_check(sys.argv[1])))
