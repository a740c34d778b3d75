"""Softmax / log-softmax rows held by a thread-block cluster (Hopper, sm_90+): forward and backward in one launch each,
reading x (y and dy) from DRAM exactly once, for rows longer than one block of softmax_kernels holds in registers.

Shape legend: x, y, dy, dx (rows, C) C-contiguous (inner == 1), float32 / float16 / bfloat16 (STORAGE_HEADER's
LD / ST; every exp and sum in float); row r starts at element r * C, so its first 16-byte boundary lies h < VEC
elements in (VEC = 16 / itemsize values a vector; h = 0 for every row where VEC divides C): a row is h head scalars,
nb body vectors and tl < VEC tail scalars.  Every array of a launch starts on a 16-byte boundary (the host sends
other calls to softmax_kernels' plan), so a row's head is the same in x and y (y, dy and dx).

Why: softmax_kernels holds a row in ONE block's registers up to 16384 elements (the backward, two arrays, 8192).  A
longer row (32000, 50257, 65536, 128000 classes) runs chunk by chunk on one block: an online (max, sum), the first
chunks kept in shared memory (forward: <= 64 KB a block), the middle ones read again from L2, the last in registers;
and few rows are few blocks (64 rows of 50257 classes: 64 of 132 SMs busy).  The H200 forward of such rows ran at
0.68-0.97x PyTorch (18-52% of copy; session 21's sweep).  Here a cluster of CL blocks shares one row: more blocks for
few rows, and each value read once into registers however long the row (up to CL * NT * VPT vectors).

Tiling: grid rows * CL blocks of NT threads, cluster = CL consecutive blocks (__cluster_dims__), row blockIdx.x / CL;
block `rank` owns body vectors [nb * rank / CL, nb * (rank + 1) / CL); its thread t holds vectors lo + t + k * NT,
k < VPT (consecutive threads, consecutive 16-byte addresses) RAW in registers (V: 16 bytes each; 16-bit data stays
2 bytes a value, converted where used: LDE).  The head's h scalars are held by threads t < h of rank 0, the tail's tl
by threads NT - 1 - j of the last rank (one scalar a thread at most, even with CL = 1).
  smx_fwdc  each thread its max m_t (fmax: a NaN is skipped, its exp makes the sum NaN -- softmax_kernels' rows) and
            s_t = sum exp(v - m_t) (m_t = -inf: 0); the block's m_b (fmax over threads, warp order) and
            s_b = sum s_t exp(m_t - m_b) (warp order), stored by lane j into block j's shared memory (distributed
            shared memory; slot `rank`); cluster barrier; warp 0 reads the CL pairs (lane j: block j's) from its own
            shared memory and combines them in rank order:
            M = max m_b (an all -inf row: 0), S = sum s_b exp(m_b - M) -- the same bits in every block; then
            softmax y = exp(v - M) / S (float32: the kept exp(v - m_t) times exp(m_t - M) / S) or log-softmax
            y = v - M - log S, from the registers.  An all -inf row gives NaN (0 / 0; -inf + inf), a NaN or +inf
            entry a NaN row: as the reference and softmax_kernels.
  smx_bwdc  y and dy held; each thread s_t = sum dy y (softmax) or sum dy (log-softmax); the block's sum (warp order)
            stored into every block's slot `rank`; cluster barrier; S = the CL sums in rank order; dx = y (dy - S)
            or dy - exp(y) S from the registers (softmax_kernels' BWD_TERM / BWD_DX).
The partials travel by remote stores before the barrier (no remote load; session 25): a relaxed cluster arrive at the
start, waited on just before the stores, makes sure every block has started; nothing touches another block's shared
memory after the barrier, so a block leaves without waiting for its cluster.  Deterministic; nothing read back to the
host (capturable).

Registers (launch bounds at 256 threads, the same a thread at 512): <= 64 both ways (MINB_FWD, MINB_BWD 4 blocks an
SM; a 32-register forward faulted on the GPU, see MINB_FWD); the nvcc test builds every planned configuration
without spills.

Switch: CLUSTER (MINIDNN_SOFTMAX_CLUSTER, read at import; softmax_kernels.plan reads the attribute at planning time
and keys its plans on it -- tools set it and clear softmax_kernels._plans): "0" off, "1" the rule (the default since
session 21's run 10: `plan` -- rows softmax_kernels' one-chunk block path does not hold, 16-bit forwards only where
its chunked path reads part of a row again), "all" every row the kernels can hold (the tests, the A/B).  Measured
(run 10, H200, graph replays; docs/step_kernels.md): the rule's rows 0.96-2.8x the row kernels, 0.97-3.2x PyTorch.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from . import launch as _launch
from .bn_cluster import CLUSTER_HEADER, DSMEM_F32_HEADER
from .softmax_geometry import STASH_BYTES, dtype_of, row_config
from .storage import STORAGE_HEADER, type_info

__all__ = ["SOURCE", "CLUSTER", "plan", "Launch", "prepare", "options", "usable"]

CLUSTER = os.environ.get("MINIDNN_SOFTMAX_CLUSTER", "1")
SETTINGS = ("0", "1", "all")
if CLUSTER not in SETTINGS:
    raise ValueError(f"MINIDNN_SOFTMAX_CLUSTER={CLUSTER!r}: '0' (off), '1' (the rule) or 'all'")
CL_MAX = 8              # portable cluster sizes only
VPT_MAX = 4             # 16-byte vectors of one array a thread
NTS = (256, 512)        # threads a block
# VPT_FWD (session 24's VPT_F32, float32 only; every dtype since session 25): the forwards' 256-thread blocks hold up
# to this many vectors a thread (512-thread blocks and the backwards keep VPT_MAX -- smx_bwdc, two arrays, spills
# past it -- so the longest cluster row is unchanged).  SMXSASS counted ~17 of smx_fwdc's 31 instructions an element
# as fixed per-warp cost (prologue, edges, reductions, meeting, 1/S) over 14 elements a thread, and the kernel
# latency-bound (issue busy ~36%); twice the elements a thread at the same 1024 threads an SM halves that cost and
# doubles the bytes in flight.  H200, graph replays: float32 (session 24 runs 7-9, session 25 run 1) softmax /
# log-softmax (4096, 50257) 0.5921 -> 0.4783 / 0.5743 -> 0.4636 ms (66 -> 82%, 68 -> 85% of copy; 1.61x / 1.64x
# PyTorch), (4096, 32000) 1.13x / 1.17x, (64, 50257) 1.23x / 1.18x, (2048, 65537) 1.18x / 1.20x; bfloat16 (session
# 25 run 3) softmax / log-softmax (4096, 50257) at 4 x 256 x 7 1.17x / 1.21x (log-softmax 0.99x -> 1.20x PyTorch),
# (2048, 65536) 4 x 256 x 8 1.11x / 1.11x, (1024, 131072) 8 x 256 x 8 1.35x / 1.38x.  16-bit waited for session 25's
# remote-store exchange: with the remote loads before it, the 16-bit softmax forward at 4 x 256 x 8 faulted on every
# launch.  4 (MINIDNN_SOFTMAX_CLUSTER_VPT_FWD=4) is the rule before.
VPT_FWD = int(os.environ.get("MINIDNN_SOFTMAX_CLUSTER_VPT_FWD", "8"))
if not VPT_MAX <= VPT_FWD <= 8:
    raise ValueError(f"MINIDNN_SOFTMAX_CLUSTER_VPT_FWD={VPT_FWD}: {VPT_MAX} (the rule before) to 8 (the default; more "
                     "spills at the 64-register bound)")
# ... except where its plan puts fewer than this many blocks an SM and the VPT_MAX plan more (run 4, H200: at 64 rows
# the 16-bit forwards at 4 x 256 x 7-8 -- 256 blocks on 132 SMs, at most 4 resident an SM -- ran 0.86-0.89x the
# VPT_MAX plan's 448-512 blocks; 132 rows at 4 x 256 x 8, 528 blocks, level; float32 (64, 50257) at 7 x 256 x 8 has
# the VPT_MAX plan's 448 blocks and gained 1.23x)
WIDE_MIN_BLOCKS_PER_SM = 3
# launch bounds at 256 threads (nvcc 13, sm_90, every planned configuration without spills: the nvcc test).  The
# helper's first choice was 32 registers forward (eight blocks an SM: a wave of 75 float32 rows of 50257 classes
# instead of 56) and 51 backward (five blocks)
MINB_FWD = 4
MINB_BWD = 4
# Session 21 run 9 (H200): at MINB_FWD 8 (32 registers) the forward faulted -- compute-sanitizer: a misaligned
# remote shared read (the DSMEM exchange's ld.shared::cluster) -- or hung, in about half the launches of 132-1000
# rows; at MINB 4 and 2 the same calls ran clean 3 of 3 times each.  norm_gncl's cluster kernels (40 and 64
# registers) never showed it.  So both directions take 64 registers (the tested regime) until a 32-register build is
# understood.  (Session 25: that read is gone -- the partials now travel by remote stores, which ran clean where the
# loads faulted -- so a 32-register forward could be timed again, for VPT <= 4 plans: VPT_FWD's take 56-63.)
# "1": the backward takes clusters only for calls of at most this many rows per SM (0: no cap).  The helper's guess
# was 4 (softmax_kernels' stashed backward reaches 80-92% of copy at thousands of rows); run 10 (H200, graph replays)
# had the clusters ahead at every row count: float32 softmax backward (4096, 50257) 0.9085 -> 0.5979 ms (99% of
# copy), log-softmax 1.19x, bfloat16 log-softmax (4096, 50257) 1.01x, (4096, 32000) 1.03x -- so no cap
BWD_ROWS_PER_SM = 0
# "1": the forward's cap likewise (0: none -- the forward row kernels lost to PyTorch at every 50257-class row count
# measured); a module attribute for the A/B's verdict, should the clusters lose where many rows stream already
FWD_ROWS_PER_SM = 0
# The shape of a launch for the A/B (module attributes read at planning time -- set them and forget the plans, as
# tools/softmax_cluster_ab.py's "all:cl8:nt512" settings do): a cluster size / block size the plan must take where the
# row fits it (0: the rule's choice)
FORCE_CL = 0
FORCE_NT = 0
# The per-element exp of the log-softmax forward and of the 16-bit softmax forward: ex2.approx.ftz (the FEXP define;
# expf's ~9 instructions an element are two: a 16-bit softmax forward takes two exps an element -- its exps are not
# kept, that would double its registers --, and at ~25 instructions an element it would issue nearly as long as
# its bytes take to stream).  The float32 softmax forward keeps expf (its output carries the exp's error).
# MINIDNN_SOFTMAX_CLUSTER_FASTEXP=0: expf everywhere (the A/B's "all:exact"); read at planning time.
FAST_EXP = os.environ.get("MINIDNN_SOFTMAX_CLUSTER_FASTEXP", "1") != "0"

SOURCE = STORAGE_HEADER + r"""
#define VEC (16 / (int)sizeof(T))
#define NW (NT / 32)
#define NEG_INF (-(A)__int_as_float(0x7f800000))
// A 16-byte vector held raw: four 32-bit words (16-bit data: two values a word, converted where used -- the row
// stays in registers at its own bytes a value)
typedef uint4 V;
__device__ __forceinline__ unsigned int word(const V& u, int i)
{
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}
__device__ __forceinline__ void set_word(V& u, int i, unsigned int w)
{
    if (i == 0) u.x = w; else if (i == 1) u.y = w; else if (i == 2) u.z = w; else u.w = w;
}
// value e of raw vector u (e a compile-time constant after unrolling)
__device__ __forceinline__ A LDE(const V& u, int e)
{
#if STORAGE == 0
    return __uint_as_float(word(u, e));
#elif STORAGE == 2
    const unsigned int w = word(u, e >> 1);
    return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
#else
    const unsigned int w = word(u, e >> 1);
    float f;
    if (e & 1) asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi;}" : "=f"(f) : "r"(w));
    else asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo;}" : "=f"(f) : "r"(w));
    return f;
#endif
}
// values e and e + 1 (e even; 4-byte data: e alone) rounded into word e / (VEC / 4) of u
__device__ __forceinline__ void STE(V& u, int e, A lo, A hi)
{
#if STORAGE == 0
    set_word(u, e, __float_as_uint(lo));
#else
    unsigned int w;
#if STORAGE == 2
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
#endif
    set_word(u, e >> 1, w);
#endif
}
#define STEP (STORAGE == 0 ? 1 : 2)     // values STE rounds at once
""" + CLUSTER_HEADER + r"""
// float32 softmax forward keeps exp(v - m_t) in place of v (the same registers); 16-bit data computes it again
#define KEEP (ALGO == 1 && STORAGE == 0)
#ifndef FEXP
#define FEXP 0
#endif
// The per-element exp of the forward: FEXP (plan: FAST_EXP, for the log-softmax forward and the 16-bit softmax
// forward) ex2.approx.ftz(d log2e) -- FMUL + MUFU.EX2 for expf's ~9 instructions (the row kernels' LSM epilogue):
// 2 ulp plus the product's rounding (|d| 2^-24 relative), far below a 16-bit output's rounding, and in log-softmax
// only inside S (log S within ~5e-7 absolute); else expf.  The per-block and per-cluster exps stay expf.
__device__ __forceinline__ A vexp(A d)
{
#if FEXP
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d * 1.4426950408889634f));
    return r;
#else
    return exp(d);
#endif
}
static_assert(sizeof(A) == 4, "float sums only (the partials travel as f32 through DSMEM)");
#if ALGO != 1 && ALGO != 2
#error "ALGO: 1 (softmax, accurate) or 2 (log-softmax)"
#endif
""" + DSMEM_F32_HEADER + r"""
// The partials' exchange (session 25): each block writes its partial into slot `rank` of every block's part[]
// (DSMEM_F32_HEADER's remote_st / remote_st2) before the cluster barrier, and reads its own shared memory after it.
// No block touches another's shared memory after that barrier, so no closing arrive / wait keeps a block alive for
// the others; a relaxed arrive at the start, waited on just before the stores, makes sure every block of the cluster
// has started (its shared memory exists) before anything is written into it.  (The remote LOADS after the barrier
// that this replaced faulted on the GPU in some builds: docs/step_kernels.md, session 25.)
// Block sum / max (fmax: NaN skipped, as softmax_kernels' vmax): butterflies, then the warps in order by every
// thread; red[] reused only after the call's last barrier.
__device__ __forceinline__ A block_sum(A v, A* red)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    A t = red[0];
#pragma unroll
    for (int w = 1; w < NW; ++w) t += red[w];
    return t;
}
__device__ __forceinline__ A block_max(A v, A* red)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    A t = red[0];
#pragma unroll
    for (int w = 1; w < NW; ++w) t = fmax(t, red[w]);
    return t;
}
// Row r's geometry: head h (elements to the first 16-byte boundary: the base is on one), body nb vectors, tail tl.
struct Geo { int h, nb, tl; };
__device__ __forceinline__ Geo row_geo(long long r, int C)
{
    Geo q;
    q.h = (int)((VEC - (int)((unsigned long long)(r * C) % VEC)) % VEC);
    q.nb = (C - q.h) / VEC;
    q.tl = C - q.h - q.nb * VEC;
    return q;
}
// This thread's edge element (head: threads t < h of rank 0; tail: threads NT - 1 - j of the last rank), or -1.
__device__ __forceinline__ int edge_of(const Geo& q, int C, unsigned int rank)
{
    const int t = threadIdx.x;
    if (rank == 0 && t < q.h) return t;
    if (rank == CL - 1 && NT - 1 - t < q.tl) return C - q.tl + (NT - 1 - t);
    return -1;
}

// The block's share of an output row, vector vi = lo + k NT + t of thread t (vi < hi): each value from f(k, e) --
// the share's vector k, element e -- rounded STEP at a time and stored as one vector (the forward's y, the
// backward's dx).
template <class F> __device__ __forceinline__ void store_share(V* out, const int lo, const int hi, F f)
{
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = lo + k * NT + (int)threadIdx.x;
        if (vi < hi) {
            V w;
#pragma unroll
            for (int e = 0; e < VEC; e += STEP) {
                A o[2];
#pragma unroll
                for (int j = 0; j < STEP; ++j) o[j] = f(k, e + j);
                STE(w, e, o[0], o[STEP - 1]);
            }
            out[vi] = w;
        }
    }
}

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, MINB)
smx_fwdc(const T* __restrict__ x, T* __restrict__ y, const int C)
{
    __shared__ A red[NW];
    __shared__ __align__(8) float part[CL][2];     // block j's (m_b, s_b) in part[j], stored there by block j
    __shared__ A stat[2];
    cluster_arrive_relaxed();       // started (waited on before the stores)
    const unsigned int rank = cluster_rank();
    const long long r = blockIdx.x / CL;
    const Geo q = row_geo(r, C);
    const int lo = (int)((long long)q.nb * rank / CL), hi = (int)((long long)q.nb * (rank + 1) / CL);
    const T* xr = x + r * C;
    const V* xv = reinterpret_cast<const V*>(xr + q.h);
    V a[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = lo + k * NT + (int)threadIdx.x;
        if (vi < hi) a[k] = xv[vi];
    }
    const int ei = edge_of(q, C, rank);
    const A ev = ei >= 0 ? LD(xr[ei]) : NEG_INF;
    A m = ev;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
        if (lo + k * NT + (int)threadIdx.x < hi) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) m = fmax(m, LDE(a[k], e));
        }
    const A sh = m == NEG_INF ? (A)0 : m;
    A s = ei >= 0 ? vexp(ev - sh) : (A)0;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
        if (lo + k * NT + (int)threadIdx.x < hi) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A ex = vexp(LDE(a[k], e) - sh);
                s += ex;
#if KEEP
                set_word(a[k], e, __float_as_uint(ex));
#endif
            }
        }
    const A mb = block_max(m, red);
    // s * 0 where m_t is -inf, not 0: a thread whose values are all NaN (fmax skipped them) keeps its NaN sum
    const A sb = block_sum(s * (m == NEG_INF ? (A)0 : exp(m - mb)), red);
    cluster_wait();                 // every block of the cluster has started
    if (threadIdx.x < CL) remote_st2(part[rank], threadIdx.x, mb, sb);
    cluster_arrive();
    cluster_wait();
    if (threadIdx.x < 32) {         // the CL pairs in rank order, by warp 0: the same bits in every block
        A pm = NEG_INF, ps = 0;
        if (threadIdx.x < CL) { pm = part[threadIdx.x][0]; ps = part[threadIdx.x][1]; }
        A M = NEG_INF;
#pragma unroll
        for (int j = 0; j < CL; ++j) M = fmax(M, __shfl_sync(0xffffffffu, pm, j));
        if (M == NEG_INF) M = 0;    // an all -inf row: exp(-inf - 0) = 0, S = 0, y NaN as the reference
        const A c = ps * (pm == NEG_INF ? (A)0 : exp(pm - M));     // (a block of all NaN: its NaN sum stays)
        A S = 0;
#pragma unroll
        for (int j = 0; j < CL; ++j) S += __shfl_sync(0xffffffffu, c, j);
        if (threadIdx.x == 0) { stat[0] = M; stat[1] = S; }
    }
    __syncthreads();
    const A M = stat[0], S = stat[1];
#if ALGO == 2
    const A ls = log(S);
#else
    const A inv = (A)1 / S;
#if KEEP
    const A finv = (m == NEG_INF ? (A)0 : exp(m - M)) * inv;
#endif
#endif
    T* yr = y + r * C;
    store_share(reinterpret_cast<V*>(yr + q.h), lo, hi, [&](int k, int e) {
#if ALGO == 2
        return LDE(a[k], e) - M - ls;
#elif KEEP
        return LDE(a[k], e) * finv;
#else
        return vexp(LDE(a[k], e) - M) * inv;
#endif
    });
    if (ei >= 0) {
#if ALGO == 2
        yr[ei] = ST(ev - M - ls);
#else
        yr[ei] = ST(vexp(ev - M) * inv);
#endif
    }
}

#if ALGO == 2
#define BWD_TERM(y, g) (g)
#define BWD_DX(y, g, s) ((g) - exp(y) * (s))
#else
#define BWD_TERM(y, g) ((g) * (y))
#define BWD_DX(y, g, s) ((y) * ((g) - (s)))
#endif

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, MINB)
smx_bwdc(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, const int C)
{
    __shared__ A red[NW];
    __shared__ float part[CL];      // block j's sum in part[j], stored there by block j
    __shared__ A stat[1];
    cluster_arrive_relaxed();       // started (waited on before the stores)
    const unsigned int rank = cluster_rank();
    const long long r = blockIdx.x / CL;
    const Geo q = row_geo(r, C);
    const int lo = (int)((long long)q.nb * rank / CL), hi = (int)((long long)q.nb * (rank + 1) / CL);
    const long long base = r * C;
    const V* yv = reinterpret_cast<const V*>(y + base + q.h);
    const V* gv = reinterpret_cast<const V*>(dy + base + q.h);
    V a[VPT], b[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = lo + k * NT + (int)threadIdx.x;
        if (vi < hi) { b[k] = gv[vi]; a[k] = yv[vi]; }
    }
    const int ei = edge_of(q, C, rank);
    A ey = 0, eg = 0;
    if (ei >= 0) { ey = LD(y[base + ei]); eg = LD(dy[base + ei]); }
    A s = 0;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
        if (lo + k * NT + (int)threadIdx.x < hi) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) s += BWD_TERM(LDE(a[k], e), LDE(b[k], e));
        }
    if (ei >= 0) s += BWD_TERM(ey, eg);
    const A sb = block_sum(s, red);
    cluster_wait();                 // every block of the cluster has started
    if (threadIdx.x < CL) remote_st(part + rank, threadIdx.x, sb);
    cluster_arrive();
    cluster_wait();
    if (threadIdx.x < 32) {         // the CL sums in rank order, by warp 0
        const A p = threadIdx.x < CL ? part[threadIdx.x] : (A)0;
        A S = 0;
#pragma unroll
        for (int j = 0; j < CL; ++j) S += __shfl_sync(0xffffffffu, p, j);
        if (threadIdx.x == 0) stat[0] = S;
    }
    __syncthreads();
    const A S = stat[0];
    store_share(reinterpret_cast<V*>(dx + base + q.h), lo, hi,
                [&](int k, int e) { return BWD_DX(LDE(a[k], e), LDE(b[k], e), S); });
    if (ei >= 0) dx[base + ei] = ST(BWD_DX(ey, eg, S));
}
"""


class Launch(NamedTuple):
    """One planned cluster launch: blocks a cluster, threads a block, vectors of an array a thread, the launch
    bounds' blocks an SM, and the grid (rows * cl blocks)."""
    cl: int
    nt: int
    vpt: int
    minb: int
    grid: int
    fexp: int = 0       # the forward's per-element exp ex2.approx (FAST_EXP)


def minb(backward, nt):
    """The launch bounds' blocks an SM at ``nt`` threads (the same registers a thread as at 256)."""
    return (MINB_BWD if backward else MINB_FWD) * 256 // nt


def body_vectors(c, itemsize):
    """The most 16-byte body vectors a row of ``c`` elements has (head 0)."""
    return c // (16 // itemsize)


def rows_path_holds(c, itemsize):
    """Whether softmax_kernels' forward holds a row of ``c`` elements on chip without reading part of it again from
    L2: its chunks but the last fit the block's stash (STASH_BYTES), the last its registers.  Run 10 (H200): for
    16-bit rows it does (32000 classes: 84% of copy) the clusters lost 0-7% ((4096, 32000) log-softmax 0.1491 ->
    0.1602 ms); past it they won 2-181% (50257 and 65536 classes); float32 rows gained 4-107% everywhere."""
    cfg = row_config(c, itemsize, 4, 1, STASH_BYTES)
    return -(-(c // cfg.vec) // (cfg.g * cfg.nv)) <= cfg.sch + 1


def one_chunk_holds(c, itemsize, backward):
    """Whether softmax_kernels' row path holds rows of ``c`` elements in one chunk (row_config: 16384 elements of a
    one-array row, 8192 of the backward's two)."""
    return row_config(c, itemsize, 4, 2 if backward else 1).one


def _cc(dev):
    try:
        return int(_launch.cupy().cuda.Device(dev).compute_capability)
    except Exception:       # noqa: BLE001 -- a fake CuPy: assume a Hopper
        return 90


def _sms(dev):
    try:
        return _launch.sm_count(dev)
    except Exception:       # noqa: BLE001 -- no device to ask: an H100 / H200's
        return 132


def choose(rows, nvec, backward, sms, cl=0, nt=0, wide=0):
    """(CL, NT, VPT) holding ``nvec`` body vectors a row, or None: the smallest NT, then the smallest CL, whose
    blocks hold their share in at most VPT_MAX vectors a thread (the most bytes in flight a thread; the most rows
    resident at once when the call has more rows than block slots); then, while rows * CL leaves SMs without a
    block, a larger CL (smaller shares: every SM reads) where CL_MAX allows.  ``cl`` / ``nt`` (non-zero): that
    cluster size / block size only (FORCE_CL / FORCE_NT: the A/B of the rule's shape; no growing of CL then).
    ``wide`` (non-zero): the most vectors a thread of a 256-thread block may hold instead (VPT_FWD: the
    forwards)."""
    for t in ((nt,) if nt else NTS):
        for c in ((cl,) if cl else range(1, CL_MAX + 1)):
            vpt = -(-nvec // (c * t))
            if vpt <= (wide if wide and t == 256 else VPT_MAX) and t in NTS and 1 <= c <= CL_MAX:
                while not cl and rows * c < sms and c < CL_MAX and nvec >= (c + 1) * 32:
                    c += 1
                return c, t, -(-nvec // (c * t))
    return None


def plan(rows, c, dtype, algo_name, backward, dev, setting=None, force=None, fast_exp=None):
    """The cluster launch (Launch) of ``rows`` softmax rows of ``c`` elements of ``dtype`` under ``setting``
    (CLUSTER when None), or None: the kernels take float32 / float16 / bfloat16 rows of ACCURATE (softmax) or LOG,
    on compute capability 9.0+, whose body fits CL_MAX * 512 * VPT_MAX vectors (float32 <= 65539 elements, 16-bit
    <= 131078) -- FAST (no max) is refused: its overflow guard (softmax_kernels' fast_scale) has no cluster
    version.  "1" (the default since session 21's run 10) takes only rows softmax_kernels' one-chunk block path
    does not hold, 16-bit forwards only where its chunked path would read part of a row again (rows_path_holds),
    and calls of at most BWD_ROWS_PER_SM / FWD_ROWS_PER_SM rows an SM (0: no cap, the defaults); "all" every row of
    at least 32 vectors.  ``force``: (CL, NT) where the row fits them, 0 for the rule's (tests; else FORCE_CL,
    FORCE_NT); ``fast_exp``: FAST_EXP when None."""
    setting = CLUSTER if setting is None else setting
    if setting not in SETTINGS:
        raise ValueError(f"softmax_cluster.CLUSTER = {setting!r} (MINIDNN_SOFTMAX_CLUSTER): '0', '1' or 'all'")
    item = np.dtype(dtype).itemsize
    if setting == "0" or algo_name not in ("ACCURATE", "LOG") or item not in (2, 4) or type_info(dtype) is None:
        return None
    if _cc(dev) < 90:
        return None
    nvec = body_vectors(c, item)
    if nvec < 32 or rows < 1:
        return None
    sms = _sms(dev)
    if setting == "1":
        if one_chunk_holds(c, item, backward) or (not backward and item == 2 and rows_path_holds(c, item)):
            return None
        cap = BWD_ROWS_PER_SM if backward else FWD_ROWS_PER_SM
        if cap and rows > cap * sms:
            return None
    shape = force or (FORCE_CL, FORCE_NT)
    got = choose(rows, nvec, backward, sms, *shape, wide=VPT_FWD if not backward and VPT_FWD > VPT_MAX else 0)
    if got and got[2] > VPT_MAX and rows * got[0] < WIDE_MIN_BLOCKS_PER_SM * sms:
        narrow = choose(rows, nvec, backward, sms, *shape)
        if narrow and narrow[0] > got[0]:
            got = narrow
    if got is None or rows * got[0] >= 2 ** 31:
        return None
    cl, nt, vpt = got
    fexp = (FAST_EXP if fast_exp is None else fast_exp) and not backward and (algo_name == "LOG" or item == 2)
    return Launch(cl, nt, vpt, minb(backward, nt), rows * cl, int(fexp))


def usable(dev) -> bool:
    """The GPU has clusters (compute capability 9.0 or newer)."""
    return _cc(dev) >= 90


_ALGO = {"ACCURATE": 1, "LOG": 2}


def options(dtype, algo_name, launch):
    """NVRTC options of one configuration."""
    scalar, accum, storage, _ = type_info(dtype)
    return (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DALGO={_ALGO[algo_name]}",
            f"-DCL={launch.cl}", f"-DNT={launch.nt}", f"-DVPT={launch.vpt}", f"-DMINB={launch.minb}",
            *(("-DFEXP=1",) if launch.fexp else ()), "-std=c++17")


def kernel_name(backward):
    return "smx_bwdc" if backward else "smx_fwdc"


def prepare(rows, c, dtype, algo_name, backward, launch):
    """A Prepared launch called as go(x, y) or go(y, dy, dx).  (No cache hint: the forward's streaming stores,
    st.global.cs as the row kernels' HINT_FWD, spilled 4-12 bytes at the 32-register bound -- nvcc 13, sm_90.)"""
    k = _launch.get_kernel(SOURCE, kernel_name(backward), options(dtype, algo_name, launch))
    return _launch.prepare(k, (launch.grid,), (launch.nt,), [None] * (3 if backward else 2) + [np.int32(c)])


def _compile_one(job):
    """Compile one configuration with NVRTC into CuPy's on-disk cache (a worker of precompile: _launch.get_kernel's
    options, so the later launch loads the cubin)."""
    dtype_name, algo_name, backward, launch = job
    _launch.cupy().RawModule(code=SOURCE, options=options(dtype_of(dtype_name), algo_name, Launch(*launch))
                             ).get_function(kernel_name(backward))
    return job


def precompile(jobs, procs=None):
    """Compile the distinct (dtype name, algo, backward, Launch) configurations into CuPy's disk cache
    (CUPY_CACHE_DIR) with a process a core (spawned, up to 16), as softmax_kernels.precompile; the grid is not part of
    a build.  Returns how many were compiled."""
    return _launch.compile_in_parallel(
        _compile_one, {(d, a, bool(b), tuple(launch._replace(grid=1))) for d, a, b, launch in jobs}, procs)


if __name__ == "__main__":      # write the source with one configuration's defines, for an nvcc check
    import sys
    opts = options(np.dtype(np.float32), "ACCURATE", Launch(8, 512, 4, minb(False, 512), 8))[:-1]
    _launch.write_source(sys.argv[1] if len(sys.argv) > 1 else "/tmp/softmax_cluster.cu", SOURCE,
                         [o[2:] for o in opts])
