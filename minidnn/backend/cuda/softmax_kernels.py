"""Softmax and log-softmax on the GPU, forward and backward, over one run of consecutive dims.

Shape legend: x, y, dy, dx viewed as (outer, C, inner), C-contiguous: the softmax runs over C (the product of the
normalised dims) for each of the outer * inner rows; element (o, c, i) sits at (o * C + c) * inner + i.
    F.softmax(x, dim=-1), cross-entropy logits (N, C):  inner = 1      CHANNEL mode on NCHW: outer N, C, inner H*W
Data float32/float64, or float16/bfloat16 loaded into float (LD/ST of the STORAGE_HEADER): every sum and exp in
float, one rounding at the store.

Rows (inner = 1: softmax_rows_fwd / softmax_rows_bwd, the tiling of ROW_HEADER below, shared with loss_kernels):
G threads own a row -- G a power of two <= 32 (a sub-warp group; BLOCK / G rows per block) or G = BLOCK (one row per
block) -- each holding NV vectors of VEC elements (16-byte loads): a row is h head elements, nb body vectors and
tl < VEC tail elements; thread g holds body vectors ch * G * NV + k * G + g of chunk ch, thread 0 the head and
thread G - 1 the tail as scalars.  h = tl = 0 where VEC divides C; RAGGED rows (C >= 32 wide vectors, no wide vector
dividing it, e.g. 4097 classes) keep the wide vectors, each row its own head (rows start at r * C elements).
row_config picks G and NV so that a row of up to 1024 (float64: 512) elements is one chunk of a warp and one of up
to 16384 (8192) is one chunk of a block (ONE: straight-line code, every load issued before the first reduction):
the row is read ONCE into registers; each thread takes its own max m_t and sum s_t = sum exp(v - m_t) (keeping the
exps), then the group's max M and S = sum s_t exp(m_t - M) (shuffles, shared memory across warps; fixed order), and
writes y = e exp(m_t - M) / S or v - M - log S from registers.  A longer row runs chunk by chunk: an online
(max, sum) over the chunks; its last chunk stays in registers, the first SCH (forward: up to 64 KB a block) are kept
in shared memory, only the ones between are read again (from L2).  Backward: y and dy read once (both arrays held:
half the elements a thread), the group's sum(dy * y) (softmax) or sum(dy) (log-softmax), then dx = y (dy - s) or
dy - exp(y) s.  FAST skips the max (its formula is exp(x) / sum exp(x) as written).  Registers capped by
__launch_bounds__(BLOCK, MINB): 64 a thread holding one array (four 256-thread blocks an SM), 80 holding two.
Columns (inner > 1, e.g. a channel softmax on NCHW: SOURCE_COLS): one thread per (o, i), consecutive threads on
consecutive i (coalesced).  COLS_V2 (session 22, the default: softmax_cols2_fwd / _bwd): the class count compiled in
where a column fits the registers (no masks, no dead slots), two 16-bit columns a thread where inner is even (PAIR),
past that a column's classes split over 2-8 threads meeting in shared memory (SPLIT: one read), past SPLIT chunks
of 8 loads and a one-pass online forward; 32-bit offsets walked without a division.  COLS_V2=0: the session-7
softmax_cols_fwd / _bwd (C <= 32 in registers, CREG slots; else a max pass, a sum pass and the write pass).
launch_spec() is the planner's choice of kernel, defines and launch shape; the cpu test compiles every one it makes
for a set of shapes with nvcc.  The backward's warp path holds 32 + 32 elements a thread for log-softmax and 2-byte
data, 16 + 16 for float32/float64 softmax (bwd_warp: measured); MINIDNN_SOFTMAX_BWD_WARP=1 / =0 force one for a GPU A/B.
PIPE (session 7, the default for one-array one-chunk rows of a warp or less with vector loads: softmax and
cross-entropy forward up to 1024 classes): a persistent grid of the resident blocks; each group walks rows r,
r + gridDim.x * RPB, ... and issues its NEXT row's loads (raw vectors held in registers: RawRow) before it reduces and
writes the current one -- a row of loads in flight per warp while it computes.  MINIDNN_SOFTMAX_PIPE=0 gives the
session-6 forward (a grid of one row a group, loads then compute).
HINT (session 17): cache hints of the one-chunk row kernels' loads and stores (evict-first), only for calls whose
arrays exceed L2 (call_hint; MINIDNN_SOFTMAX_HINT="fwd,bwd", ROW_HEADER's HINT define): by default the forward's
streaming stores ("2,0"), the backward none (its hint measured level).
CLUSTER (session 21, softmax_cluster.py): a row longer than one block's registers held by a thread-block cluster
(sm_90+; CL <= 8 blocks, each its slice of the row raw in registers, one meeting through distributed shared memory),
so each value is read once however long the row, and few rows still fill the SMs.  MINIDNN_SOFTMAX_CLUSTER="1" (the
default since session 21's run 10: rows the one-chunk block path does not hold, 16-bit forwards only where the
chunked path reads part of a row again) | "0" (off) | "all" (every row it holds); _plan routes calls on 16-byte
boundaries there, the others to the row plan; the setting is part of plan()'s key.
MINIDNN_SOFTMAX_V1=1 launches the previous kernels instead (one warp per row, scalar loads, three passes over the
row: SOURCE_V1) -- kept for a GPU A/B.
"""
from __future__ import annotations

import math
import os
import re
from typing import NamedTuple

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from . import softmax_cluster as _smc
from .bn_kernels import STORAGE_HEADER, type_info
from .device_facts import beyond_l2, sm80, smem_limits
from .softmax_geometry import STASH_BYTES, RowConfig, _pow2_at_least, row_config
from .softmax_geometry import dtype_of as _dtype_of

__all__ = ["supports", "collapse", "forward", "backward", "row_config", "SOURCE", "SOURCE_V1", "ROW_HEADER",
           "WARP_REDUCE", "SOURCE_COLS", "launch_spec", "Spec", "RowConfig"]

THREADS = 256

# Shared with loss_kernels.py: butterfly sums / maxima over a warp (every lane gets the result).
WARP_REDUCE = r"""
template <class V> __device__ __forceinline__ V warp_sum(V v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <class V> __device__ __forceinline__ V warp_max(V v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) { const V u = __shfl_xor_sync(0xffffffffu, v, o); v = (u > v || u != u) ? u : v; }
    return v;
}
"""

# ---- the previous kernels (MINIDNN_SOFTMAX_V1=1): one warp per row, scalar loads, three passes ----------------
SOURCE_V1 = STORAGE_HEADER + WARP_REDUCE + r"""

extern "C" __global__ void __launch_bounds__(256)
softmax_fwd(const T* __restrict__ x, T* __restrict__ y, const long long rows, const int C, const int inner)
{
    const int lane = threadIdx.x & 31;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((long long)gridDim.x * blockDim.x) >> 5) {
        const long long o = r / inner, i = r - o * inner;
        const T* xr = x + o * C * (long long)inner + i;
        T* yr = y + o * C * (long long)inner + i;
        A m = 0;
#if ALGO != 0
        m = -(A)__int_as_float(0x7f800000);     // -inf
        for (int c = lane; c < C; c += 32) { const A v = LD(xr[(long long)c * inner]); m = (v > m || v != v) ? v : m; }
        m = warp_max(m);
        if (m == -(A)__int_as_float(0x7f800000)) m = 0;        // an all -inf row: exp(-inf - 0) = 0
#endif
        A s = 0;
        for (int c = lane; c < C; c += 32) s += exp(LD(xr[(long long)c * inner]) - m);
        s = warp_sum(s);
#if ALGO == 2
        const A ls = log(s);
        for (int c = lane; c < C; c += 32) yr[(long long)c * inner] = ST(LD(xr[(long long)c * inner]) - m - ls);
#else
        const A inv = (A)1 / s;
        for (int c = lane; c < C; c += 32) yr[(long long)c * inner] = ST(exp(LD(xr[(long long)c * inner]) - m) * inv);
#endif
    }
}

extern "C" __global__ void __launch_bounds__(256)
softmax_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, const long long rows, const int C,
            const int inner)
{
    const int lane = threadIdx.x & 31;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((long long)gridDim.x * blockDim.x) >> 5) {
        const long long o = r / inner, i = r - o * inner;
        const long long base = o * C * (long long)inner + i;
        A s = 0;
        for (int c = lane; c < C; c += 32) {
            const long long a = base + (long long)c * inner;
#if ALGO == 2
            s += LD(dy[a]);
#else
            s += LD(dy[a]) * LD(y[a]);
#endif
        }
        s = warp_sum(s);
        for (int c = lane; c < C; c += 32) {
            const long long a = base + (long long)c * inner;
#if ALGO == 2
            dx[a] = ST(LD(dy[a]) - exp(LD(y[a])) * s);
#else
            dx[a] = ST(LD(y[a]) * (LD(dy[a]) - s));
#endif
        }
    }
}
"""

# ---- rows held in registers (shared with loss_kernels.py) ---------------------------------------------------------
# Compile-time: G threads per row, BLOCK threads per block, NV vectors of VEC elements per thread and chunk,
# VBYTES = VEC * sizeof(T); RAGGED: rows whose length is not a multiple of VEC (each row's own head to the next
# VBYTES boundary and its tail as scalars, the body as vectors); ONE: the row is one chunk (straight-line code).
# Every index is 32-bit: supports() keeps x.size <= 2^31 - 1.
# The row helpers on one element type, written once: row_geo, load_chunk, store_chunk (_ROW_IO_A), load_edges,
# store_edges (_ROW_IO_B) and PIPE's raw row, pipe_issue and pipe_decode (_ROW_IO_PIPE) -- ROW_HEADER's for the
# arrays' T, and loss_kernels' XROW_HEADER's for its 16-bit logits X (row_io("X")).  ELEM is the element type, ELEM_PACK
# / ELEM_VR its vector union and raw word, ELEM_VBYTES the vector's bytes, ELEM_ST the store conversion, ELEM_ROW the
# raw row.  loss_kernels defines no HINT (the source's 0): its X helpers compile the #else branches.
_ROW_IO_A = r"""__device__ __forceinline__ Geo row_geo(const ELEM* p, int C, bool va)
{
    Geo q;
    q.h = 0;
#if RAGGED
    if (va) {
        q.h = (int)(((ELEM_VBYTES - (unsigned)((unsigned long long)p % ELEM_VBYTES)) % ELEM_VBYTES) / sizeof(ELEM));
        if (q.h > C) q.h = C;
    }
#endif
    q.nb = (C - q.h) / VEC;
    q.tl = C - q.h - q.nb * VEC;
    return q;
}

// Body vector v = ch * CV + k * G + g (elements h + v * VEC + j) into slots a[k * VEC + j]; slots past the body get
// `pad`.  VA: ELEM_VBYTES vector loads (the caller checked the alignment), else element by element.
template <bool VA> __device__ __forceinline__ void load_chunk(const ELEM* __restrict__ p, int ch, const Geo& q, int g,
                                                              A pad, A* a)
{
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int v = ch * CV + k * G + g;
        const int c = q.h + v * VEC;
        ELEM_PACK u;
        if (VA) {
#if HINT == 1 || HINT == 3
            u.raw = ldh(v < q.nb, reinterpret_cast<const ELEM_VR*>(p + q.h + (ch * CV + g) * VEC) + k * G);
#else
            if (v < q.nb) u.raw = *reinterpret_cast<const ELEM_VR*>(p + c);
#endif
        } else {
#pragma unroll
#if HINT == 1 || HINT == 3
            for (int j = 0; j < VEC; ++j) if (v < q.nb) u.v[j] = HLD(p + (c + j));
#else
            for (int j = 0; j < VEC; ++j) if (v < q.nb) u.v[j] = p[c + j];
#endif
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[k * VEC + j] = v < q.nb ? LD(u.v[j]) : pad;
    }
}

template <bool VA> __device__ __forceinline__ void store_chunk(ELEM* __restrict__ p, int ch, const Geo& q, int g,
                                                               const A* a)
{
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int v = ch * CV + k * G + g;
#if HINT
        if (VA) {
            ELEM_PACK u;
#pragma unroll
            for (int j = 0; j < VEC; ++j) u.v[j] = ELEM_ST(a[k * VEC + j]);
            sth(v >= 0 && v < q.nb, reinterpret_cast<ELEM_VR*>(p + q.h + (ch * CV + g) * VEC) + k * G, u.raw);
            continue;
        }
#endif
        if (v >= 0 && v < q.nb) {
            const int c = q.h + v * VEC;
            ELEM_PACK u;
#pragma unroll
            for (int j = 0; j < VEC; ++j) u.v[j] = ELEM_ST(a[k * VEC + j]);
            if (VA) *reinterpret_cast<ELEM_VR*>(p + c) = u.raw;
            else {
#pragma unroll
                for (int j = 0; j < VEC; ++j) p[c + j] = u.v[j];
            }
        }
    }
}
"""
_ROW_IO_B = r"""__device__ __forceinline__ void load_edges(const ELEM* __restrict__ p, const Geo& q, int g, A pad,
                                           A* ed)
{
#pragma unroll
    for (int j = 0; j < NE; ++j) {
#if HINT == 1 || HINT == 3
        const ELEM t = ldh(j < edge_n(q, g), p + (edge_o(q, g) + j));
        ed[j] = j < edge_n(q, g) ? LD(t) : pad;
#else
        ed[j] = j < edge_n(q, g) ? LD(p[edge_o(q, g) + j]) : pad;
#endif
    }
}
__device__ __forceinline__ void store_edges(ELEM* __restrict__ p, const Geo& q, int g, const A* ed)
{
#pragma unroll
    for (int j = 0; j < NE; ++j) {
#if HINT
        sth(j < edge_n(q, g), p + (edge_o(q, g) + j), ELEM_ST(ed[j]));
#else
        if (j < edge_n(q, g)) p[edge_o(q, g) + j] = ELEM_ST(ed[j]);
#endif
    }
}
"""
_ROW_IO_PIPE = r"""// A row's loads, not yet decoded (PIPE): its body vectors as raw ELEM_VBYTES words (4-byte data:
// E registers; 2-byte: E / 2) and, RAGGED, its edges -- the next row's registers while the current one is reduced.
struct ELEM_ROW { ELEM_VR v[NV]; ELEM e[NE1]; };
__device__ __forceinline__ void pipe_issue(const ELEM* __restrict__ p, const Geo& q, int g, ELEM_ROW& w)
{
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int v = k * G + g;
#if HINT == 1 || HINT == 3
        w.v[k] = ldh(v < q.nb, reinterpret_cast<const ELEM_VR*>(p + q.h + g * VEC) + k * G);   // pipe_decode pads
#else
        w.v[k] = v < q.nb ? *reinterpret_cast<const ELEM_VR*>(p + q.h + v * VEC) : ELEM_VR();
#endif
    }
#pragma unroll
    for (int j = 0; j < NE; ++j) {
#if HINT == 1 || HINT == 3
        w.e[j] = ldh(j < edge_n(q, g), p + (edge_o(q, g) + j));
#else
        w.e[j] = j < edge_n(q, g) ? p[edge_o(q, g) + j] : ELEM();
#endif
    }
}
// Slots past the body (and edges past the row's) get `pad`, as load_chunk / load_edges.
__device__ __forceinline__ void pipe_decode(const ELEM_ROW& w, const Geo& q, int g, A pad, A* a, A* ed)
{
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        ELEM_PACK u;
        u.raw = w.v[k];
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[k * VEC + j] = k * G + g < q.nb ? LD(u.v[j]) : pad;
    }
#pragma unroll
    for (int j = 0; j < NE; ++j) ed[j] = j < edge_n(q, g) ? LD(w.e[j]) : pad;
}
"""
_ROW_IO_NAMES = {"T": ("T", "Pack", "VR", "VBYTES", "ST", "RawRow"),
                 "X": ("X", "XPack", "XVR", "XVBYTES", "STX", "XRow")}


def row_io(elem):
    """(A, B, PIPE) texts of the row helpers (the _ROW_IO_ strings) on element type ``elem``: "T" or "X"."""
    t, pack, vr, vbytes, st, row = _ROW_IO_NAMES[elem]
    subs = (("ELEM_ROW", row), ("ELEM_PACK", pack), ("ELEM_VR", vr), ("ELEM_VBYTES", vbytes), ("ELEM_ST", st),
            ("ELEM", t))

    def one(text):
        for a, b in subs:
            text = re.sub(r"\b%s\b" % a, b, text)
        return text
    return one(_ROW_IO_A), one(_ROW_IO_B), one(_ROW_IO_PIPE)


_ROW_T = row_io("T")
ROW_HEADER = r"""
#ifndef RAGGED
#define RAGGED 0
#endif
#ifndef ONE
#define ONE 0
#endif
#ifndef MINB
#define MINB 1
#endif
#if VEC == 1
typedef T VR;
#elif VBYTES == 16
typedef uint4 VR;
#elif VBYTES == 8
typedef uint2 VR;
#else
typedef unsigned int VR;
#endif
union Pack { VR raw; T v[VEC]; };
// Cache hints of the row kernels' global loads (x, y, dy) and stores (y, dx): HINT_FWD / HINT_BWD, planned only for
// one-chunk rows (each element read once) of calls whose arrays exceed L2 -- there nothing this kernel touches is
// read again before it has left L2, and evict-first lines make room for the stream without pushing out others.
// 0: none (the code in the #else branches of `#if HINT`: the kernels before the hints; loads ld.global.nc);
// 1: streaming loads and stores (ld.global.cs / st.global.cs: evict-first in L1 and L2; forwards only);
// 2: streaming stores, the loads of 0 (dropout's HINT 2) as 0 compiles them (the backward's HINT_BWD 2);
// 3: 2 with the loads as asm ld.global.nc (the forward's HINT_FWD 2: the same LDG.E.128.CONSTANT as 0 -- compiled
//    as 2, the output pointer in an asm store cost nvcc its read-only proof of x, the loads lost .CONSTANT and the
//    40-register bfloat16 513-class WARP row spilled 24 bytes; the backward's two-array rows spill with asm loads).
// Loads with .L1::no_allocate or .lu were not kept: the qualifier needs the same asm as .cs (so the same
// registers), and ld.lu of global memory is ld.cs.
// ldh / sth: the 16-byte path's vector (and the edges') accesses as plain asm, the bound test a predicate INSIDE the
// asm (session 12 saw the same: an `if` around an asm store compiled to a branch a vector) and the address a base
// pointer plus a constant (k * G vectors).  With CUDA's __ldcs / __stcs (volatile asm, branches around it) nvcc
// recomputed each store's 64-bit address in its own registers early, and the 48-register WARP log-softmax forward
// spilled 48 bytes.  The misaligned fallback's element loads take __ldg under HINT 1 / 3 (HLD): once the row pointers
// reach an asm, nvcc no longer proves them read-only, and its plain loads lost .nc (and spilled).  The values are
// the same in every setting.
#ifndef HINT
#define HINT 0
#endif
#define HLD(p) __ldg(p)
#if HINT
#if HINT < 1 || HINT > 3
#error "HINT is 0, 1, 2 or 3"
#endif
#if HINT == 1
#define HINT_LD "ld.global.cs"
#else
#define HINT_LD "ld.global.nc"
#endif
// ldh(c, p): the load where c, else zeros (written first: a load that only predicates its registers would leave them
// live from before -- ptxas kept the whole row's registers of the log-softmax backward alive, 112 bytes spilled);
// ldh(p): an unconditional load (warp_load's FULLK vectors).  Operands: the outputs first, then c, then p.
#define HINT_Q(n) "{ .reg .pred q; setp.ne.b32 q, %" #n ", 0; "
__device__ __forceinline__ uint4 ldh(bool c, const uint4* p)
{
    uint4 r;
    asm(HINT_Q(4) "mov.b32 %0, 0; mov.b32 %1, 0; mov.b32 %2, 0; mov.b32 %3, 0; "
        "@q " HINT_LD ".v4.u32 {%0, %1, %2, %3}, [%5]; }"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"((int)c), "l"(p));
    return r;
}
__device__ __forceinline__ uint4 ldh(const uint4* p)
{
    uint4 r;
    asm(HINT_LD ".v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
__device__ __forceinline__ uint2 ldh(bool c, const uint2* p)
{
    uint2 r;
    asm(HINT_Q(2) "mov.b32 %0, 0; mov.b32 %1, 0; @q " HINT_LD ".v2.u32 {%0, %1}, [%3]; }"
        : "=r"(r.x), "=r"(r.y) : "r"((int)c), "l"(p));
    return r;
}
__device__ __forceinline__ uint2 ldh(const uint2* p)
{ uint2 r; asm(HINT_LD ".v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p)); return r; }
__device__ __forceinline__ unsigned int ldh(bool c, const unsigned int* p)
{
    unsigned int r;
    asm(HINT_Q(1) "mov.b32 %0, 0; @q " HINT_LD ".u32 %0, [%2]; }" : "=r"(r) : "r"((int)c), "l"(p));
    return r;
}
__device__ __forceinline__ unsigned int ldh(const unsigned int* p)
{ unsigned int r; asm(HINT_LD ".u32 %0, [%1];" : "=r"(r) : "l"(p)); return r; }
__device__ __forceinline__ unsigned short ldh(bool c, const unsigned short* p)
{
    unsigned short r;
    asm(HINT_Q(1) "mov.u16 %0, 0; @q " HINT_LD ".u16 %0, [%2]; }" : "=h"(r) : "r"((int)c), "l"(p));
    return r;
}
__device__ __forceinline__ unsigned short ldh(const unsigned short* p)
{ unsigned short r; asm(HINT_LD ".u16 %0, [%1];" : "=h"(r) : "l"(p)); return r; }
__device__ __forceinline__ float ldh(bool c, const float* p)
{
    float r;
    asm(HINT_Q(1) "mov.f32 %0, 0f00000000; @q " HINT_LD ".f32 %0, [%2]; }" : "=f"(r) : "r"((int)c), "l"(p));
    return r;
}
__device__ __forceinline__ float ldh(const float* p)
{ float r; asm(HINT_LD ".f32 %0, [%1];" : "=f"(r) : "l"(p)); return r; }
__device__ __forceinline__ double ldh(bool c, const double* p)
{
    double r;
    asm(HINT_Q(1) "mov.f64 %0, 0d0000000000000000; @q " HINT_LD ".f64 %0, [%2]; }" : "=d"(r) : "r"((int)c), "l"(p));
    return r;
}
__device__ __forceinline__ double ldh(const double* p)
{ double r; asm(HINT_LD ".f64 %0, [%1];" : "=d"(r) : "l"(p)); return r; }
// sth(c, p, v): the streaming store where c (operands c, p, then the value)
__device__ __forceinline__ void sth(bool c, uint4* p, uint4 v)
{
    asm(HINT_Q(0) "@q st.global.cs.v4.u32 [%1], {%2, %3, %4, %5}; }"
        : : "r"((int)c), "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ void sth(bool c, uint2* p, uint2 v)
{ asm(HINT_Q(0) "@q st.global.cs.v2.u32 [%1], {%2, %3}; }" : : "r"((int)c), "l"(p), "r"(v.x), "r"(v.y)); }
__device__ __forceinline__ void sth(bool c, unsigned int* p, unsigned int v)
{ asm(HINT_Q(0) "@q st.global.cs.u32 [%1], %2; }" : : "r"((int)c), "l"(p), "r"(v)); }
__device__ __forceinline__ void sth(bool c, unsigned short* p, unsigned short v)
{ asm(HINT_Q(0) "@q st.global.cs.u16 [%1], %2; }" : : "r"((int)c), "l"(p), "h"(v)); }
__device__ __forceinline__ void sth(bool c, float* p, float v)
{ asm(HINT_Q(0) "@q st.global.cs.f32 [%1], %2; }" : : "r"((int)c), "l"(p), "f"(v)); }
__device__ __forceinline__ void sth(bool c, double* p, double v)
{ asm(HINT_Q(0) "@q st.global.cs.f64 [%1], %2; }" : : "r"((int)c), "l"(p), "d"(v)); }
#endif
#define E (NV * VEC)                       // elements a thread holds per chunk
#define CV (G * NV)                        // body vectors a group covers per chunk
#define RPB (BLOCK / G)                    // rows per block (1 when G == BLOCK)
#define NE (RAGGED ? VEC - 1 : 0)          // edge slots a thread keeps: the head (thread 0), the tail (thread G - 1)
#define NE1 (NE > 0 ? NE : 1)
#define NEG_INF (-(A)__int_as_float(0x7f800000))
#define A_NAN ((A)__int_as_float(0x7fffffff))
#if RAGGED && G < 2
#error "RAGGED rows need two threads a row (head and tail)"
#endif

// The row kernels' max: one FMNMX (NaN-propagating compares cost three instructions an element).  A NaN element is
// skipped here, but its exp(NaN - M) makes the row's sum -- and so every output of the row -- NaN, as the reference.
__device__ __forceinline__ A vmax(A a, A b) { return fmax(a, b); }

// Sum / max over the G threads of a row (every one gets it): shuffles within the warp, then (G == BLOCK > 32) the
// warps' values through sm[BLOCK / 32] in warp order.  Fixed order: deterministic.
template <class V> __device__ __forceinline__ V g_sum(V v, V* sm)
{
#pragma unroll
    for (int o = (G < 32 ? G : 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
#if G > 32
    __syncthreads();                       // sm is free: the previous reduction's reads are done
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sm[0];
#pragma unroll
    for (int k = 1; k < G / 32; ++k) v += sm[k];
#endif
    return v;
}
template <class V> __device__ __forceinline__ V g_max(V v, V* sm)
{
#pragma unroll
    for (int o = (G < 32 ? G : 32) / 2; o > 0; o >>= 1) v = vmax(v, __shfl_xor_sync(0xffffffffu, v, o));
#if G > 32
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sm[0];
#pragma unroll
    for (int k = 1; k < G / 32; ++k) v = vmax(v, sm[k]);
#endif
    return v;
}

// A row of C elements at p: h head elements, nb body vectors of VEC, tl tail elements (tl < VEC).  h = 0 unless
// RAGGED with vector loads (then the row's own distance to the next VBYTES boundary: rows start at r * C).
struct Geo { int h, nb, tl; };
""" + _ROW_T[0] + r"""
// The row's edges (RAGGED): thread 0 holds the head [0, h), thread G - 1 the tail [h + nb * VEC, C), as scalars.
__device__ __forceinline__ int edge_n(const Geo& q, int g) { return g == 0 ? q.h : (g == G - 1 ? q.tl : 0); }
__device__ __forceinline__ int edge_o(const Geo& q, int g) { return g == 0 ? 0 : q.h + q.nb * VEC; }
""" + _ROW_T[1] + r"""
#ifndef PIPE
#define PIPE 0
#endif
#if PIPE
#if !ONE || G > 32
#error "PIPE needs one-chunk rows of a warp or less"
#endif
""" + _ROW_T[2] + r"""#endif

// Whether the vector loads may be used: every pointer on a VBYTES boundary (rows are too: C % VEC == 0), or, for
// RAGGED rows, every array at the same distance from one (each row then has the same head in all of them).
__device__ __forceinline__ bool aligned(const void* a, const void* b = 0, const void* c = 0)
{
    const unsigned long long x = (unsigned long long)a, y = b ? (unsigned long long)b : x,
                             z = c ? (unsigned long long)c : x;
#if RAGGED
    return VEC > 1 && (((x ^ y) | (x ^ z)) % VBYTES) == 0;
#else
    return VEC > 1 && ((x | y | z) % VBYTES) == 0;
#endif
}
"""

# FAST's overflow guard, shared by the rows (SOURCE) and the columns (SOURCE_COLS; REVIEW22C found the columns
# without it: a column of +88s gave 0 where 1/C is right).
FAST_SCALE = r"""
// FAST's S = sum exp(x) (no max) reaches [2^126, FLT_MAX] on rows of large values (a row of +80s); 1 / S is then
// below 2^-126, and CuPy builds every kernel with -ftz=true: e * (1 / S) was 0 for the whole row (session 12 run 5).
// Such a row takes (e sc) (1 / (S sc)) with sc = 2^-64 (exact scalings); every other row sc = 1 (ACCURATE's and
// LOG's S is in [1, C]: sc is 1 there and folds away).
__device__ __forceinline__ A fast_scale(A S)
{
#if ALGO == 0
    return S >= (A)__int_as_float(0x7e800000) ? (A)__int_as_float(0x1f800000) : (A)1;
#else
    return (A)1;
#endif
}
"""

SOURCE = STORAGE_HEADER + ROW_HEADER + r"""
#ifndef SCH
#define SCH 0
#endif
// ---- rows (inner = 1) --------------------------------------------------------------------------------------------
""" + FAST_SCALE + r"""
// SCH > 0 (rows of several chunks): the first SCH chunks are also kept in shared memory (stash, thread t's slot e of
// chunk ch at (ch * E + e) * BLOCK + t: conflict-free), the last stays in registers; only chunks in between (rows
// longer than (SCH + 1) chunks) are read again.
template <bool VA> __device__ __forceinline__ void fwd_rows(const T* __restrict__ x, T* __restrict__ y, int rows,
                                                            int C, A* sm, A* stash)
{
    const int g = threadIdx.x % G;
    for (int r0 = blockIdx.x * RPB; r0 < rows; r0 += gridDim.x * RPB) {      // uniform over the block
        const int r = r0 + (int)threadIdx.x / G;
        const bool live = r < rows;                                          // a dead group still reduces
        const T* xr = x + (size_t)(live ? r : 0) * C;
        T* yr = y + (size_t)(live ? r : 0) * C;
        const Geo q = row_geo(xr, live ? C : 0, VA);
        const int nch = ONE ? 1 : (q.nb + CV - 1) / CV;
        A a[E], ed[NE1];
        A m = ALGO == 0 ? (A)0 : NEG_INF, s = 0;
        load_edges(xr, q, g, NEG_INF, ed);
        for (int ch = 0; ch < nch; ++ch) {
            load_chunk<VA>(xr, ch, q, g, NEG_INF, a);
#if SCH > 0
            if (ch < SCH) {
#pragma unroll
                for (int e = 0; e < E; ++e) stash[(ch * E + e) * BLOCK + threadIdx.x] = a[e];
            }
#endif
#if ALGO != 0
            A cm = NEG_INF;
#pragma unroll
            for (int e = 0; e < E; ++e) cm = vmax(cm, a[e]);
            if (ch == 0) {
#pragma unroll
                for (int j = 0; j < NE; ++j) cm = vmax(cm, ed[j]);
            }
            const A nm = vmax(m, cm);
            // online: rescale the running sum.  While m is -inf the sum is 0 or NaN (chunks of only -inf or NaN:
            // vmax skips NaN): s * 0 keeps a NaN sum, where a plain 0 lost it (session 21, run 12)
            if (nm != m) s = m == NEG_INF ? s * (A)0 : s * exp(m - nm);
            m = nm;
#endif
            const A sh = m == NEG_INF ? (A)0 : m;
            if (ch == 0) {
#pragma unroll
                for (int j = 0; j < NE; ++j) s += exp(ed[j] - sh);
            }
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const A ex = exp(a[e] - sh);
                s += ex;
#if ALGO != 2
                a[e] = ex;                           // softmax keeps exp(v - m_t)
#endif
            }
        }
#if ALGO != 0
        A M = g_max(m, sm);
        if (M == NEG_INF) M = 0;           // an all -inf row: exp(-inf - 0) = 0, S = 0, y NaN as the reference
        const A f = m == NEG_INF ? (A)0 : exp(m - M);
#else
        const A M = 0, f = 1;
#endif
        const A S = g_sum(s * f, sm);
#if ALGO == 2
        const A ls = log(S);
#else
        const A sc = fast_scale(S), inv = (A)1 / (S * sc);
#endif
        if (!live || nch == 0) continue;
#if ALGO != 2
        const A finv = f * inv;                      // one multiply an element
#endif
#pragma unroll
        for (int e = 0; e < E; ++e) {                // the last chunk, still in registers (relative to m)
#if ALGO == 2
            a[e] = a[e] - M - ls;
#else
            a[e] = a[e] * sc * finv;
#endif
        }
        store_chunk<VA>(yr, nch - 1, q, g, a);
#if !ONE
        for (int ch = 0; ch < nch - 1; ++ch) {
#if SCH > 0
            if (ch < SCH) {
#pragma unroll
                for (int e = 0; e < E; ++e) a[e] = stash[(ch * E + e) * BLOCK + threadIdx.x];
            } else
#endif
            load_chunk<VA>(xr, ch, q, g, (A)0, a);
#pragma unroll
            for (int e = 0; e < E; ++e) {
#if ALGO == 2
                a[e] = a[e] - M - ls;
#else
                a[e] = exp(a[e] - M) * sc * inv;
#endif
            }
            store_chunk<VA>(yr, ch, q, g, a);
        }
#endif
#pragma unroll
        for (int j = 0; j < NE; ++j) {
#if ALGO == 2
            ed[j] = ed[j] - M - ls;
#else
            ed[j] = exp(ed[j] - M) * sc * inv;
#endif
        }
        store_edges(yr, q, g, ed);
    }
}

#if PIPE
// PIPE (one-chunk rows of a warp or less, vector loads; session 7): a persistent grid (the resident blocks), each
// group walking rows r, r + gridDim.x * RPB, ...; it issues the NEXT row's loads (raw vectors: pipe_issue) before it
// reduces and writes the current one, so every warp keeps a row of loads in flight while it computes (fwd_rows
// waits on each row's loads, then computes while its loads are idle: with all warps in step, DRAM idles too).
template <int UNUSED> __device__ __forceinline__ void fwd_rows_pipe(const T* __restrict__ x, T* __restrict__ y,
                                                                    int rows, int C, A* sm)
{
    const int g = threadIdx.x % G, stride = gridDim.x * RPB;
    int r0 = blockIdx.x * RPB;
    if (r0 >= rows) return;                                              // uniform over the block
    int r = r0 + (int)threadIdx.x / G;
    bool live = r < rows;
    Geo q = row_geo(x + (size_t)(live ? r : 0) * C, live ? C : 0, true);
    RawRow cur, nxt;
    pipe_issue(x + (size_t)(live ? r : 0) * C, q, g, cur);
    for (; r0 < rows; r0 += stride) {                                    // uniform over the block
        const int rn = r + stride;
        const bool liven = rn < rows;
        const Geo qn = row_geo(x + (size_t)(liven ? rn : 0) * C, liven ? C : 0, true);
        if (r0 + stride < rows) pipe_issue(x + (size_t)(liven ? rn : 0) * C, qn, g, nxt);
        A a[E], ed[NE1];
        pipe_decode(cur, q, g, NEG_INF, a, ed);
        A m = ALGO == 0 ? (A)0 : NEG_INF, s = 0;
#if ALGO != 0
#pragma unroll
        for (int e = 0; e < E; ++e) m = vmax(m, a[e]);
#pragma unroll
        for (int j = 0; j < NE; ++j) m = vmax(m, ed[j]);
#endif
        const A sh = m == NEG_INF ? (A)0 : m;
#pragma unroll
        for (int j = 0; j < NE; ++j) s += exp(ed[j] - sh);
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const A ex = exp(a[e] - sh);
            s += ex;
#if ALGO != 2
            a[e] = ex;
#endif
        }
#if ALGO != 0
        A M = g_max(m, sm);
        if (M == NEG_INF) M = 0;
        const A f = m == NEG_INF ? (A)0 : exp(m - M);
#else
        const A M = 0, f = 1;
#endif
        const A S = g_sum(s * f, sm);
        if (live) {
            T* yr = y + (size_t)r * C;
#if ALGO == 2
            const A ls = log(S);
#pragma unroll
            for (int e = 0; e < E; ++e) a[e] = a[e] - M - ls;
#pragma unroll
            for (int j = 0; j < NE; ++j) ed[j] = ed[j] - M - ls;
#else
            const A sc = fast_scale(S), inv = (A)1 / (S * sc), finv = f * inv;
#pragma unroll
            for (int e = 0; e < E; ++e) a[e] = a[e] * sc * finv;
#pragma unroll
            for (int j = 0; j < NE; ++j) ed[j] = exp(ed[j] - M) * sc * inv;
#endif
            store_chunk<true>(yr, 0, q, g, a);
            store_edges(yr, q, g, ed);
        }
        cur = nxt; q = qn; r = rn; live = liven;
    }
}
#endif

#ifndef WARP
#define WARP 0
#endif
#if WARP
#if !ONE || G != 32 || PIPE
#error "WARP needs one-chunk rows of a whole warp (and no PIPE)"
#endif
// WARP (session 13; FWD_WARP): a non-persistent grid of small blocks (BLOCK = 128: 4 warps), each warp owning WARP
// consecutive rows (the host plans 1; session 13's 2 never beat it), every load of those rows issued before any
// math, no prefetch: occupancy (MINB blocks an SM from a tight register bound) keeps the loads in flight instead,
// and blocks retire and refill warp-group by warp-group (no last-step tail of a persistent walk).  The row's
// arithmetic is fwd_rows_pipe's, in its order: thread max over the body then the edges, thread sum of the edges' exps
// then the body's, the warp's butterflies, the same output expressions -- so the result is bitwise the PIPE kernel's.
// The grid holds every row's warp (launch_spec: WARP_PER_SM never caps it); a warp past the end returns at once (no
// block barrier: G = 32).
// FULLK (planned from C: min(NV, the smallest body a row of C can have / 32)) of a lane's NV vectors lie inside every
// row's body: loaded and decoded without load_chunk's bound test and -inf pad (a row past the end -- with WARP 2, the
// last warp's second -- reads row 0's, at head 0: the kernel takes VA only with x on a 16-byte boundary, and is never
// stored); fewer live predicates, so a tighter register budget builds without spilling.  VA: 16-byte loads,
// else element by element (the misaligned fallback: the same registers, so it does not set the kernel's budget).
#ifndef FULLK
#define FULLK 0
#endif
// LSM (session 14; FWD_LSM, log-softmax forward only): PyTorch's epilogue.  The warp's max M first (the butterfly
// before any exp), then d = x - M in place of x (one FADD an element, reused: the exp's argument and the output's
// minuend), S = the warp's sum of exp(d) (no per-lane rescale exp(m_t - M)), y = d - log S: one FADD an element
// where LSM 0 computes x - sh for the exp and x - M - log S again at the output (three).  y has LSM 0's expression
// (x - M) - log S; only S is summed differently (LSM_PS partial sums a lane, slot j into j % LSM_PS, added pairwise:
// a shorter dependent chain than one running sum).  LSM (= 2, the one value since session 19: 1, expf and logf, lost
// to it on every row) takes exp(d) = ex2.approx.ftz(d log2e) -- FMUL + MUFU.EX2 for expf's ~9 instructions; 2 ulp
// relative (CUDA's exp2f bound) plus the product's rounding (|d| 2^-24 relative), results below 2^-126 flushed to 0
// (CuPy builds with -ftz=true): S within ~2^-21 relative of expf's S, so log S within ~5e-7 absolute; and lsm_log
// below (docs/step_kernels.md, "Session 14: log-softmax forward").
#ifndef LSM
#define LSM 0
#endif
#define LSM_PS 4
#if LSM
#if E < LSM_PS
#error "LSM needs at least LSM_PS slots a lane"
#endif
#if ALGO != 2
#error "LSM is the log-softmax forward's epilogue"
#endif
__device__ __forceinline__ A lsm_exp(A d)
{
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"((float)d * 1.4426950408889634f));
    return (A)r;
}
// log S, once a row (S >= 1 but for an all -inf row, 0, or NaN): lg2.approx.ftz (MUFU.LG2, 2^-22 absolute for
// S in [0.5, 2], ~2^-22 relative beyond) times ln 2 -- logf's ~17 dependent instructions sit between the warp's sum
// and the first store; the output d - lg2(S) ln 2 then compiles to one FFMA an element (no rounding of log S)
__device__ __forceinline__ A lsm_log(A s)
{
    float r;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"((float)s));
    return (A)(r * 0.6931471805599453f);
}
#endif
template <bool VA> __device__ __forceinline__ void warp_load(const T* __restrict__ p, const Geo& q, int g, A pad,
                                                             A* a)
{
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int v = k * 32 + g;
        const bool in = k < FULLK || v < q.nb;
        Pack u;
        if (VA) {
#if HINT == 1 || HINT == 3
            const VR* b = reinterpret_cast<const VR*>(p + q.h + g * VEC) + k * 32;
            u.raw = k < FULLK ? ldh(b) : ldh(in, b);
#else
            if (in) u.raw = *reinterpret_cast<const VR*>(p + q.h + v * VEC);
#endif
        } else {
#pragma unroll
#if HINT == 1 || HINT == 3
            for (int j = 0; j < VEC; ++j) if (in) u.v[j] = HLD(p + (q.h + v * VEC + j));
#else
            for (int j = 0; j < VEC; ++j) if (in) u.v[j] = p[q.h + v * VEC + j];
#endif
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[k * VEC + j] = in ? LD(u.v[j]) : pad;
    }
}
template <bool VA> __device__ __forceinline__ void fwd_rows_warp(const T* __restrict__ x, T* __restrict__ y,
                                                                 int rows, int C)
{
    const int g = threadIdx.x & 31;
    const int r0 = (blockIdx.x * (BLOCK / 32) + (int)(threadIdx.x >> 5)) * WARP;
    if (r0 >= rows) return;                              // a warp past the end (the last block)
    {
        A a[WARP][E], ed[WARP][NE1];
        Geo q[WARP];
#pragma unroll
        for (int i = 0; i < WARP; ++i) {                 // every load of the warp's rows first
            const bool live = r0 + i < rows;
            const T* xr = x + (size_t)(live ? r0 + i : 0) * C;
            q[i] = row_geo(xr, live ? C : 0, VA);
            warp_load<VA>(xr, q[i], g, NEG_INF, a[i]);
            load_edges(xr, q[i], g, NEG_INF, ed[i]);
        }
#pragma unroll
        for (int i = 0; i < WARP; ++i) {
#if LSM
            // LSM_PS chains of max and of sum (E >= 16 slots: the first LSM_PS start them; body, then edges):
            // fmax is exact and associative (NaN skipped in any order), the sum's order is this one
            A pm[LSM_PS], ps[LSM_PS];
#pragma unroll
            for (int e = 0; e < E; ++e) pm[e % LSM_PS] = e < LSM_PS ? a[i][e] : vmax(pm[e % LSM_PS], a[i][e]);
#pragma unroll
            for (int j = 0; j < NE; ++j) pm[j % LSM_PS] = vmax(pm[j % LSM_PS], ed[i][j]);
            A M = g_max(vmax(vmax(pm[0], pm[1]), vmax(pm[2], pm[3])), (A*)0);
            if (M == NEG_INF) M = 0;     // an all -inf row: d = -inf, S = 0, y = -inf - log 0 = NaN as the reference
#pragma unroll
            for (int e = 0; e < E; ++e) {
                a[i][e] = a[i][e] - M;
                const A ex = lsm_exp(a[i][e]);
                ps[e % LSM_PS] = e < LSM_PS ? ex : ps[e % LSM_PS] + ex;
            }
#pragma unroll
            for (int j = 0; j < NE; ++j) {
                ed[i][j] = ed[i][j] - M;
                ps[j % LSM_PS] += lsm_exp(ed[i][j]);
            }
            const A S = g_sum((ps[0] + ps[1]) + (ps[2] + ps[3]), (A*)0);
            if (r0 + i < rows) {
                T* yr = y + (size_t)(r0 + i) * C;
                const A ls = lsm_log(S);
#pragma unroll
                for (int e = 0; e < E; ++e) a[i][e] = a[i][e] - ls;
#pragma unroll
                for (int j = 0; j < NE; ++j) ed[i][j] = ed[i][j] - ls;
                store_chunk<VA>(yr, 0, q[i], g, a[i]);
                store_edges(yr, q[i], g, ed[i]);
            }
#else
            A m = ALGO == 0 ? (A)0 : NEG_INF, s = 0;
#if ALGO != 0
#pragma unroll
            for (int e = 0; e < E; ++e) m = vmax(m, a[i][e]);
#pragma unroll
            for (int j = 0; j < NE; ++j) m = vmax(m, ed[i][j]);
#endif
            const A sh = m == NEG_INF ? (A)0 : m;
#pragma unroll
            for (int j = 0; j < NE; ++j) s += exp(ed[i][j] - sh);
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const A ex = exp(a[i][e] - sh);
                s += ex;
#if ALGO != 2
                a[i][e] = ex;
#endif
            }
#if ALGO != 0
            A M = g_max(m, (A*)0);
            if (M == NEG_INF) M = 0;
            const A f = m == NEG_INF ? (A)0 : exp(m - M);
#else
            const A M = 0, f = 1;
#endif
            const A S = g_sum(s * f, (A*)0);
            if (r0 + i < rows) {
                T* yr = y + (size_t)(r0 + i) * C;
#if ALGO == 2
                const A ls = log(S);
#pragma unroll
                for (int e = 0; e < E; ++e) a[i][e] = a[i][e] - M - ls;
#pragma unroll
                for (int j = 0; j < NE; ++j) ed[i][j] = ed[i][j] - M - ls;
#else
                const A sc = fast_scale(S), inv = (A)1 / (S * sc), finv = f * inv;
#pragma unroll
                for (int e = 0; e < E; ++e) a[i][e] = a[i][e] * sc * finv;
#pragma unroll
                for (int j = 0; j < NE; ++j) ed[i][j] = exp(ed[i][j] - M) * sc * inv;
#endif
                store_chunk<VA>(yr, 0, q[i], g, a[i]);
                store_edges(yr, q[i], g, ed[i]);
            }
#endif
        }
    }
}
#endif

extern "C" __global__ void __launch_bounds__(BLOCK, MINB)
softmax_rows_fwd(const T* __restrict__ x, T* __restrict__ y, const int rows, const int C)
{
    __shared__ A sm[BLOCK / 32];
#if PIPE
    if (aligned(x, y)) { fwd_rows_pipe<0>(x, y, rows, C, sm); return; }
#endif
#if WARP
    // x itself on a 16-byte boundary too (RAGGED: aligned() asks only x = y mod 16): a row past the end (WARP 2)
    // reads row 0's FULLK vectors at head 0
    if (aligned(x, y) && (unsigned long long)x % VBYTES == 0) fwd_rows_warp<true>(x, y, rows, C);
    else fwd_rows_warp<false>(x, y, rows, C);
    return;
#endif
#if SCH > 0
    extern __shared__ __align__(16) unsigned char dyn_sm[];
    A* stash = reinterpret_cast<A*>(dyn_sm);
#else
    A* stash = 0;
#endif
    if (aligned(x, y)) fwd_rows<true>(x, y, rows, C, sm, stash);
    else fwd_rows<false>(x, y, rows, C, sm, stash);
}

// dx = y (dy - sum(dy y)) or dy - exp(y) sum(dy): y and dy of a chunk both loaded before the sum (ONE: every load of
// the row issued at once); a longer row keeps its last chunk in registers and reads the others again.
#ifndef BSCH
#define BSCH 0
#endif
// BSCH > 0 (session 17; several-chunk backward rows, BWD_STASH): the first BSCH chunks' values the second pass needs
// are also kept in shared memory as the first pass reads them -- dy and y for softmax; for log-softmax dy alone (BSY
// 0: its y is read once, in the second pass, a chunk's loads at a time) or, BSY 1, y too (loaded in the first pass
// with dy, twice the loads in flight, and the second pass reads nothing) -- so no chunk is read twice from L2 / DRAM
// (a 32000-class float32 row: 3 of 4 chunks, 96 / 192 KB a 512-thread block).  Thread t's slot e of chunk ch at
// (ch * BSE + e) * BLOCK + t (dy in e < E, y in E <= e < 2 E): each thread reads back only what it wrote, so no
// barrier; conflict-free.  The values and the order of every sum are those of BSCH 0: bitwise the same dx.
#ifndef BSY
#define BSY 0
#endif
#if BSCH
#if ONE
#error "BSCH is for rows of several chunks"
#endif
#define BSE (ALGO == 2 && !BSY ? E : 2 * E)
#endif
// One value's share of the backward, written once for every backward path below: its term of the row's sum
// (log-softmax: dy; softmax: dy y) and its dx from that sum s (log-softmax: dy - exp(y) s; softmax: y (dy - s)).
// Macros, not functions: inlined functions compiled the same sums with the FMA's factors swapped (another PTX).
#if ALGO == 2
#define BWD_TERM(y, g) (g)
#define BWD_DX(y, g, s) ((g) - exp(y) * (s))
#else
#define BWD_TERM(y, g) ((g) * (y))
#define BWD_DX(y, g, s) ((y) * ((g) - (s)))
#endif

// BSF (session 20; BWD_STASH 5 / 6): the chunks bwd_rows itself stashes (floats) -- BSCH unless the plan says: a plan
// whose BSA stash is counted in raw 16-bit bytes launches half the float stash's bytes, so its misaligned fallback
// (this function, element loads) keeps only the float chunks those bytes hold and reads the rest again.
#ifndef BSF
#define BSF BSCH
#endif
template <bool VA> __device__ __forceinline__ void bwd_rows(const T* __restrict__ y, const T* __restrict__ dy,
                                                            T* __restrict__ dx, int rows, int C, A* sm)
{
#if BSF
    extern __shared__ __align__(16) unsigned char dyn_sm[];
    A* const bst = reinterpret_cast<A*>(dyn_sm) + threadIdx.x;
#endif
    const int g = threadIdx.x % G;
    for (int r0 = blockIdx.x * RPB; r0 < rows; r0 += gridDim.x * RPB) {
        const int r = r0 + (int)threadIdx.x / G;
        const bool live = r < rows;
        const size_t base = (size_t)(live ? r : 0) * C;
        const Geo q = row_geo(y + base, live ? C : 0, VA);
        const int nch = ONE ? 1 : (q.nb + CV - 1) / CV;
        A a[E], b[E], ea[NE1], eb[NE1];
        load_edges(dy + base, q, g, (A)0, eb);
        load_edges(y + base, q, g, (A)0, ea);
        A s = 0;
        for (int ch = 0; ch < nch; ++ch) {
            load_chunk<VA>(dy + base, ch, q, g, (A)0, b);
#if ALGO == 2
#if BSF && BSY
            if (ch == nch - 1 || ch < BSF) load_chunk<VA>(y + base, ch, q, g, (A)0, a);
#else
            if (ONE || ch == nch - 1) load_chunk<VA>(y + base, ch, q, g, (A)0, a);
#endif
#pragma unroll
            for (int e = 0; e < E; ++e) s += b[e];
#else
            load_chunk<VA>(y + base, ch, q, g, (A)0, a);
#pragma unroll
            for (int e = 0; e < E; ++e) s += b[e] * a[e];
#endif
#if BSF
            if (ch < BSF && ch < nch - 1) {         // the last chunk stays in registers
#pragma unroll
                for (int e = 0; e < E; ++e) bst[(ch * BSE + e) * BLOCK] = b[e];
#if ALGO != 2 || BSY
#pragma unroll
                for (int e = 0; e < E; ++e) bst[(ch * BSE + E + e) * BLOCK] = a[e];
#endif
            }
#endif
        }
#pragma unroll
        for (int j = 0; j < NE; ++j) s += BWD_TERM(ea[j], eb[j]);
        s = g_sum(s, sm);
        if (!live || nch == 0) continue;
        for (int ch = nch - 1; ch >= 0; --ch) {      // the last chunk from registers first
            if (!ONE && ch < nch - 1) {
#if BSF
                if (ch < BSF) {
#pragma unroll
                    for (int e = 0; e < E; ++e) b[e] = bst[(ch * BSE + e) * BLOCK];
#if ALGO == 2 && !BSY
                    load_chunk<VA>(y + base, ch, q, g, (A)0, a);
#else
#pragma unroll
                    for (int e = 0; e < E; ++e) a[e] = bst[(ch * BSE + E + e) * BLOCK];
#endif
                } else {
#endif
                load_chunk<VA>(dy + base, ch, q, g, (A)0, b);
                load_chunk<VA>(y + base, ch, q, g, (A)0, a);
#if BSF
                }
#endif
            }
#pragma unroll
            for (int e = 0; e < E; ++e) a[e] = BWD_DX(a[e], b[e], s);
            store_chunk<VA>(dx + base, ch, q, g, a);
        }
#pragma unroll
        for (int j = 0; j < NE; ++j) ea[j] = BWD_DX(ea[j], eb[j], s);
        store_edges(dx + base, q, g, ea);
    }
}

#if PIPE && ALGO == 2
// Log-softmax backward, pipelined (session 9; one-chunk rows of a warp or less, vector loads): its sum needs dy
// alone, so a group walks rows r, r + gridDim.x * RPB, ... on a persistent grid holding the row's dy loads (raw)
// from the step before; it issues the row's y, decodes dy, issues the NEXT row's dy, then takes the sum and writes
// dx = dy - exp(y) s -- a row of dy loads in flight per warp through the exps and stores (bwd_rows waits on y and dy
// together, then computes while its loads are idle).  Registers: dy decoded (E), y raw, the next dy raw.
template <int UNUSED> __device__ __forceinline__ void bwd_rows_pipe(const T* __restrict__ y, const T* __restrict__ dy,
                                                                    T* __restrict__ dx, int rows, int C, A* sm)
{
    const int g = threadIdx.x % G, stride = gridDim.x * RPB;
    int r0 = blockIdx.x * RPB;
    if (r0 >= rows) return;                                              // uniform over the block
    int r = r0 + (int)threadIdx.x / G;
    bool live = r < rows;
    Geo q = row_geo(dy + (size_t)(live ? r : 0) * C, live ? C : 0, true);
    RawRow cur, nxt;
    pipe_issue(dy + (size_t)(live ? r : 0) * C, q, g, cur);
    for (; r0 < rows; r0 += stride) {                                    // uniform over the block
        const size_t base = (size_t)(live ? r : 0) * C;
        RawRow yw;
        pipe_issue(y + base, q, g, yw);                                  // this row's y: in flight during the sum
        A b[E], eb[NE1];
        pipe_decode(cur, q, g, (A)0, b, eb);
        const int rn = r + stride;
        const bool liven = rn < rows;
        const Geo qn = row_geo(dy + (size_t)(liven ? rn : 0) * C, liven ? C : 0, true);
        if (r0 + stride < rows) pipe_issue(dy + (size_t)(liven ? rn : 0) * C, qn, g, nxt);
        A s = 0;
#pragma unroll
        for (int e = 0; e < E; ++e) s += b[e];
#pragma unroll
        for (int j = 0; j < NE; ++j) s += eb[j];
        s = g_sum(s, sm);
        if (live) {
            A a[E], ea[NE1];
            pipe_decode(yw, q, g, (A)0, a, ea);
#pragma unroll
            for (int e = 0; e < E; ++e) a[e] = BWD_DX(a[e], b[e], s);
#pragma unroll
            for (int j = 0; j < NE; ++j) ea[j] = BWD_DX(ea[j], eb[j], s);
            store_chunk<true>(dx + base, 0, q, g, a);
            store_edges(dx + base, q, g, ea);
        }
        cur = nxt; q = qn; r = rn; live = liven;
    }
}
#endif

#ifndef BSA
#define BSA 0
#endif
#if BSA
// BSA (session 17; BWD_STASH 3): the stash of BSCH = every chunk but the last, filled by cp.async straight from
// global memory -- the row's loads all in flight at once (a 32000-class float32 row: 192 KB of dy and y an SM) where
// BSCH's register path waits on one chunk after another.  Raw VBYTES vectors (2-byte data: half the bytes of the
// float stash, within the same budget); thread t's vector k of array w (0 dy, 1 y) of chunk ch at
// ((ch * 2 + w) * NV + k) * BLOCK + t (a warp's 32 consecutive 16-byte words: conflict-free), written and read by t
// alone (cp.async.wait_all, no barrier).  Slots past the body zero-filled (src-size 0; the address the body's first
// vector's: cp.async wants it VBYTES-aligned, which a RAGGED row's start is not), decoded to load_chunk's (A)0 pad.
// The last chunk's loads go to registers, issued before the wait.  The sum takes chunk 0, 1, ... then the last and
// the edges, slot by slot as bwd_rows: bitwise the same dx.  Aligned calls (16-byte vectors) only; the misaligned
// fallback is bwd_rows<false> with the BSCH / BSY float stash.  Log-softmax without BSY (BSA_DY, session 19; off
// by default until the GPU A/B): only dy is stashed (BSW = 1 array a chunk), y read in the second pass a chunk at a
// time as bwd_rows does -- the same values, so the same dx; twice the chunks fit (50257 classes: 6 of 7).
// BSR (session 20; BWD_STASH 6, 16-bit log-softmax rows whose raw stash fits two blocks an SM): the same kernel at
// 64 registers (MINB 2: 32 warps an SM, a second block's loads in flight while one sums or stores).  nvcc 13 put it
// there without spilling only with (a) the last chunk held as raw VBYTES words through the wait (NV x 4 registers an
// array, not E floats; decoded after it to load_chunk's values) and (b) no misaligned fallback in the kernel:
// bwd_rows<false>'s element loads took 88-480 bytes of spill at 64 registers (as a __noinline__ callee its call
// still cost the entry 40-48), so a BSR kernel runs aligned calls only and the host sends the others to the BSR-less
// build of the same plan (launch_spec's bwd_fallback; _TwinPlan).  The same loads, values and sums: bitwise BSR 0.
#ifndef BSR
#define BSR 0
#endif
#if !BSCH || G != BLOCK || VEC == 1 || ONE
#error "BSA: a block a row, vector loads, several chunks"
#endif
#if ALGO == 2 && !BSY
#define BSW 1
#else
#define BSW 2
#endif
__device__ __forceinline__ void cp_async16(VR* sdst, const T* gsrc, bool in)
{
    unsigned sa;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(sa) : "l"(sdst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" : : "r"(sa), "l"(gsrc), "r"(in ? 16 : 0) : "memory");
}
template <int UNUSED> __device__ __forceinline__ void bwd_rows_async(const T* __restrict__ y,
                                                                     const T* __restrict__ dy, T* __restrict__ dx,
                                                                     int rows, int C, A* sm)
{
    extern __shared__ __align__(16) unsigned char dyn_sm[];
    VR* const rst = reinterpret_cast<VR*>(dyn_sm) + threadIdx.x;
    const int g = threadIdx.x;
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const size_t base = (size_t)r * C;
        const Geo q = row_geo(y + base, C, true);
        const int nch = (q.nb + CV - 1) / CV;        // <= BSCH + 1 (planned so)
        for (int ch = 0; ch < nch - 1; ++ch) {
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                const int v = ch * CV + k * G + g;
                const bool in = v < q.nb;
                const int c = q.h + (in ? v : 0) * VEC;   // out of the body: vector 0's (aligned) address
                cp_async16(rst + (ch * BSW * NV + k) * BLOCK, dy + base + c, in);
#if BSW == 2
                cp_async16(rst + ((ch * BSW + 1) * NV + k) * BLOCK, y + base + c, in);
#endif
            }
        }
        asm volatile("cp.async.commit_group;" : : : "memory");
        A a[E], b[E], ea[NE1], eb[NE1];
        load_edges(dy + base, q, g, (A)0, eb);
        load_edges(y + base, q, g, (A)0, ea);
#if BSR
        VR rb[NV], ra[NV];                           // the last chunk raw through the wait: decoded after it
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int v = (nch - 1) * CV + k * G + g;
            rb[k] = v < q.nb ? *reinterpret_cast<const VR*>(dy + base + q.h + v * VEC) : VR();
            ra[k] = v < q.nb ? *reinterpret_cast<const VR*>(y + base + q.h + v * VEC) : VR();
        }
#else
        load_chunk<true>(dy + base, nch - 1, q, g, (A)0, b);
        load_chunk<true>(y + base, nch - 1, q, g, (A)0, a);
#endif
        asm volatile("cp.async.wait_all;" : : : "memory");
        A s = 0;
        for (int ch = 0; ch < nch - 1; ++ch) {
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                const bool in = ch * CV + k * G + g < q.nb;
                Pack u;
                u.raw = rst[(ch * BSW * NV + k) * BLOCK];
#if ALGO != 2
                Pack w;
                w.raw = rst[((ch * BSW + 1) * NV + k) * BLOCK];
#endif
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
#if ALGO == 2
                    s += in ? LD(u.v[j]) : (A)0;
#else
                    s += (in ? LD(u.v[j]) : (A)0) * (in ? LD(w.v[j]) : (A)0);
#endif
                }
            }
        }
#if BSR
#pragma unroll
        for (int k = 0; k < NV; ++k) {               // load_chunk's values: the body's, (A)0 past it
            const bool in = (nch - 1) * CV + k * G + g < q.nb;
            Pack u, w;
            u.raw = rb[k];
            w.raw = ra[k];
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                b[k * VEC + j] = in ? LD(u.v[j]) : (A)0;
                a[k * VEC + j] = in ? LD(w.v[j]) : (A)0;
            }
        }
#endif
#pragma unroll
        for (int e = 0; e < E; ++e) s += BWD_TERM(a[e], b[e]);
#pragma unroll
        for (int j = 0; j < NE; ++j) s += BWD_TERM(ea[j], eb[j]);
        s = g_sum(s, sm);
        for (int ch = nch - 1; ch >= 0; --ch) {      // the last chunk from registers first
            if (ch < nch - 1) {
#if BSW == 1
                load_chunk<true>(y + base, ch, q, g, (A)0, a);
#endif
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    const bool in = ch * CV + k * G + g < q.nb;
#if BSW == 1
                    Pack u;
                    u.raw = rst[(ch * BSW * NV + k) * BLOCK];
#pragma unroll
                    for (int j = 0; j < VEC; ++j) b[k * VEC + j] = in ? LD(u.v[j]) : (A)0;
#else
                    Pack u, w;
                    u.raw = rst[(ch * BSW * NV + k) * BLOCK];
                    w.raw = rst[((ch * BSW + 1) * NV + k) * BLOCK];
#pragma unroll
                    for (int j = 0; j < VEC; ++j) {
                        b[k * VEC + j] = in ? LD(u.v[j]) : (A)0;
                        a[k * VEC + j] = in ? LD(w.v[j]) : (A)0;
                    }
#endif
                }
            }
#pragma unroll
            for (int e = 0; e < E; ++e) a[e] = BWD_DX(a[e], b[e], s);
            store_chunk<true>(dx + base, ch, q, g, a);
        }
#pragma unroll
        for (int j = 0; j < NE; ++j) ea[j] = BWD_DX(ea[j], eb[j], s);
        store_edges(dx + base, q, g, ea);
    }
}
#endif

#if WARP && ALGO == 2
// Log-softmax backward under WARP (session 13): the forward's grid (a warp a row, 128-thread blocks, every row's warp,
// no persistence); the row's dy and y (2 E values a lane) all loaded before the sum -- FULLK vectors without a bound
// test -- then bwd_rows_pipe's arithmetic in its order (sum of dy over the body then the edges, the butterflies,
// dx = dy - exp(y) s): bitwise the default.
template <bool VA> __device__ __forceinline__ void bwd_rows_warp(const T* __restrict__ y, const T* __restrict__ dy,
                                                                 T* __restrict__ dx, int rows, int C)
{
    const int g = threadIdx.x & 31;
    const int r = blockIdx.x * (BLOCK / 32) + (int)(threadIdx.x >> 5);
    if (r >= rows) return;                               // a warp past the end (the last block)
    const size_t base = (size_t)r * C;
    const Geo q = row_geo(dy + base, C, VA);
    A a[E], b[E], ea[NE1], eb[NE1];
    warp_load<VA>(dy + base, q, g, (A)0, b);
    load_edges(dy + base, q, g, (A)0, eb);
    warp_load<VA>(y + base, q, g, (A)0, a);
    load_edges(y + base, q, g, (A)0, ea);
    A s = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) s += b[e];
#pragma unroll
    for (int j = 0; j < NE; ++j) s += eb[j];
    s = g_sum(s, (A*)0);
#pragma unroll
    for (int e = 0; e < E; ++e) a[e] = BWD_DX(a[e], b[e], s);
#pragma unroll
    for (int j = 0; j < NE; ++j) ea[j] = BWD_DX(ea[j], eb[j], s);
    store_chunk<VA>(dx + base, 0, q, g, a);
    store_edges(dx + base, q, g, ea);
}
#endif

extern "C" __global__ void __launch_bounds__(BLOCK, MINB)
softmax_rows_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, const int rows, const int C)
{
    __shared__ A sm[BLOCK / 32];
#if PIPE && ALGO == 2
    if (aligned(y, dy, dx)) { bwd_rows_pipe<0>(y, dy, dx, rows, C, sm); return; }
#endif
#if WARP && ALGO == 2
    if (aligned(y, dy, dx)) bwd_rows_warp<true>(y, dy, dx, rows, C);
    else bwd_rows_warp<false>(y, dy, dx, rows, C);
    return;
#endif
#if BSA && BSR
    // BSR: aligned calls only (launch_spec's bwd_fallback: plan() sends the others to the BSR-less build); a
    // misaligned one here is a planner bug -- trap rather than write a wrong dx
    if (!aligned(y, dy, dx)) __trap();
    bwd_rows_async<0>(y, dy, dx, rows, C, sm);
#else
#if BSA
    if (aligned(y, dy, dx)) { bwd_rows_async<0>(y, dy, dx, rows, C, sm); return; }
#endif
    if (aligned(y, dy, dx)) bwd_rows<true>(y, dy, dx, rows, C, sm);
    else bwd_rows<false>(y, dy, dx, rows, C, sm);
#endif
}
"""

# ---- columns (inner > 1): their own source (no row tiling defines) -------------------------------------------------
# The grid-stride walk of the column kernels (SOURCE_COLS) and of loss_kernels' spatial cross-entropy: a position's
# (o, i) and its offset advanced by the stride without a division a step (session 22).
COL_WALK = r"""// The grid-stride walk over ``n`` columns (o, i) of an (outer, C, inner) array, k = o * inner + i (the
// column kernels' words of columns; the spatial cross-entropy's positions): ``off`` the offset of column k's class 0
// (o * ci + i, ci = C * inner), i kept to know when o moves on (one compare a step, no division).
struct ColWalk {
    unsigned int k, i, off;
    unsigned int istep, ostep_off;
    __device__ __forceinline__ ColWalk(unsigned int k0, unsigned int step, unsigned int inner, unsigned int ci)
    {
        const unsigned int o = k0 / inner, os = step / inner;
        k = k0; i = k0 - o * inner; off = o * ci + i;
        istep = step - os * inner; ostep_off = os * ci + istep;
    }
    // unsigned arithmetic: the step past the last column may wrap, harmlessly (the loop ends on k)
    __device__ __forceinline__ void next(unsigned int step, unsigned int inner, unsigned int ci)
    {
        k += step; i += istep; off += ostep_off;
        if (i >= inner) { i -= inner; off += ci - inner; }
    }
};
"""

SOURCE_COLS = STORAGE_HEADER + FAST_SCALE + r"""
#define NEG_INF (-(A)__int_as_float(0x7f800000))
__device__ __forceinline__ A vmax(A a, A b) { return (b > a || b != b) ? b : a; }      // NaN wins

// One thread per (o, i); element c at base + c * inner (consecutive threads on consecutive i: coalesced).
extern "C" __global__ void __launch_bounds__(256)
softmax_cols_fwd(const T* __restrict__ x, T* __restrict__ y, const int cols, const int C, const int inner)
{
    for (int col = blockIdx.x * 256 + threadIdx.x; col < cols; col += gridDim.x * 256) {
        const int o = col / inner, i = col - o * inner;
        const T* xc = x + (size_t)o * C * inner + i;
        T* yc = y + (size_t)o * C * inner + i;
#if CREG
        A a[CREG];
        A m = ALGO == 0 ? (A)0 : NEG_INF;
#pragma unroll
        for (int c = 0; c < CREG; ++c) {
            a[c] = c < C ? LD(xc[(size_t)c * inner]) : NEG_INF;
#if ALGO != 0
            m = vmax(m, a[c]);
#endif
        }
        if (m == NEG_INF) m = 0;
        A s = 0;
#pragma unroll
        for (int c = 0; c < CREG; ++c) {
            const A ex = exp(a[c] - m);
            s += ex;
#if ALGO != 2
            a[c] = ex;
#endif
        }
#if ALGO == 2
        const A ls = log(s);
#pragma unroll
        for (int c = 0; c < CREG; ++c) if (c < C) yc[(size_t)c * inner] = ST(a[c] - m - ls);
#else
        const A sc = fast_scale(s), inv = (A)1 / (s * sc);      // FAST_SCALE: sc 1 but for FAST's huge sums
#pragma unroll
        for (int c = 0; c < CREG; ++c) if (c < C) yc[(size_t)c * inner] = ST((a[c] * sc) * inv);
#endif
#else
        A m = 0;
#if ALGO != 0
        m = NEG_INF;
        for (int c = 0; c < C; ++c) m = vmax(m, LD(xc[(size_t)c * inner]));
        if (m == NEG_INF) m = 0;
#endif
        A s = 0;
        for (int c = 0; c < C; ++c) s += exp(LD(xc[(size_t)c * inner]) - m);
#if ALGO == 2
        const A ls = log(s);
        for (int c = 0; c < C; ++c) yc[(size_t)c * inner] = ST(LD(xc[(size_t)c * inner]) - m - ls);
#else
        const A sc = fast_scale(s), inv = (A)1 / (s * sc);
        for (int c = 0; c < C; ++c) yc[(size_t)c * inner] = ST((exp(LD(xc[(size_t)c * inner]) - m) * sc) * inv);
#endif
#endif
    }
}

extern "C" __global__ void __launch_bounds__(256)
softmax_cols_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, const int cols, const int C,
                 const int inner)
{
    for (int col = blockIdx.x * 256 + threadIdx.x; col < cols; col += gridDim.x * 256) {
        const int o = col / inner, i = col - o * inner;
        const size_t base = (size_t)o * C * inner + i;
#if CREG
        A a[CREG], b[CREG];
        A s = 0;
#pragma unroll
        for (int c = 0; c < CREG; ++c) {
            a[c] = c < C ? LD(y[base + (size_t)c * inner]) : (A)0;
            b[c] = c < C ? LD(dy[base + (size_t)c * inner]) : (A)0;
#if ALGO == 2
            s += b[c];
#else
            s += b[c] * a[c];
#endif
        }
#pragma unroll
        for (int c = 0; c < CREG; ++c) {
#if ALGO == 2
            if (c < C) dx[base + (size_t)c * inner] = ST(b[c] - exp(a[c]) * s);
#else
            if (c < C) dx[base + (size_t)c * inner] = ST(a[c] * (b[c] - s));
#endif
        }
#else
        A s = 0;
        for (int c = 0; c < C; ++c) {
            const size_t k = base + (size_t)c * inner;
#if ALGO == 2
            s += LD(dy[k]);
#else
            s += LD(dy[k]) * LD(y[k]);
#endif
        }
        for (int c = 0; c < C; ++c) {
            const size_t k = base + (size_t)c * inner;
#if ALGO == 2
            dx[k] = ST(LD(dy[k]) - exp(LD(y[k])) * s);
#else
            dx[k] = ST(LD(y[k]) * (LD(dy[k]) - s));
#endif
        }
#endif
    }
}

// ---- COLS_V2 (session 22): softmax_cols2_fwd / softmax_cols2_bwd ------------------------------------------------
// Shape legend as above: column (o, i) of x viewed (outer, C, inner), element c at (o * C + c) * inner + i.
// Tiling: 256-thread blocks, a thread a column (PAIR: two adjacent columns i, i + 1 through one 32-bit word of two
// 16-bit values -- inner even, every pointer on 4 bytes, asked at run time; a call off 4 bytes takes the one-column
// body), consecutive threads on consecutive words (coalesced at every class); the grid-stride loop advances the
// word offset without a division (x.size < 2^31: 32-bit offsets).  CC > 0: the class count at compile time -- every
// load of the column issued at once, no masks, no dead slots; the column kept in registers (forward: CC words, the
// backward y and dy: 2 CC).  CC = 0: the forward reads the column twice -- an online (max, sum) over chunks of U
// classes (the U loads of a chunk issued together, the sum rescaled once a chunk), then the write pass, U at a time;
// the backward sums dy (* y) in chunks of U, then writes dx in chunks of U.  SPLIT > 0 (columns past the registers'
// CC): a column's classes over SPLIT threads, below.  CFX: the 16-bit forwards' exps through ex2.approx, below.
// The max skips NaN (fmax: one instruction, where a NaN-propagating max took three): a NaN element still gives
// exp(NaN - m) = NaN, so s and every output of its column are NaN, as the reference; a +inf gives exp(inf - inf) =
// NaN the same way; an all -inf column keeps the shift 0 (its outputs 0 * inf = NaN, -inf - log 0 = NaN: as before).
#ifndef CC
#define CC 0
#endif
#ifndef U
#define U 8
#endif
#ifndef PAIR
#define PAIR 0
#endif
#ifndef SPLIT
#define SPLIT 0
#endif
#ifndef CMINB
#define CMINB 1
#endif
#ifndef CFX
#define CFX 0
#endif
#if (PAIR || CFX) && STORAGE == 0
#error "PAIR and CFX: 16-bit data only"
#endif

// The forward's exp(v - sh), sh the column's shift: CFX (COLS_FASTX, 16-bit data, float) as 2^((v - sh) log2e),
// one FADD, one FMUL and one MUFU.EX2 (ex2.approx.ftz: ~2 ulp of float, results below 2^-126 flushed to 0 -- far
// below a 16-bit value's rounding) where expf takes ~9 instructions: a 16-bit element moves 4 bytes, so the copy's
// rate leaves ~32 instructions an element, and the PAIR forward took ~21 with expf.  v - sh first, not one FFMA
// with a rounded sh log2e: the max's term is then exactly 1 (run 7: a 1-class log-softmax gave -3.6e-7, not 0).
#if CFX
__device__ __forceinline__ float cexp(float v, float sh)
{
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"((v - sh) * 1.4426950408889634f));
    return e;
}
#else
__device__ __forceinline__ A cexp(A v, A sh) { return exp(v - sh); }
#endif

// A word of NP columns: T itself (NP = 1) or two 16-bit values (NP = 2: the low half the even column).
template <int NP> struct Word { typedef T W; };
__device__ __forceinline__ A wval(T w, int) { return LD(w); }
__device__ __forceinline__ T wpack(const A (&v)[1]) { return ST(v[0]); }
#if STORAGE != 0
template <> struct Word<2> { typedef unsigned int W; };
// Decoded where used, through asm volatile (as storage.LDE_HEADER), so that fewer decodes are hoisted into two float
// registers a word: the PAIR backward (y and dy held) at CC = 16 spilled 68 bytes at 64 registers against 92 with
// plain shifts -- ptxas still merges some, so that backward stops at 12 classes (COLS_CC_MAX).
__device__ __forceinline__ A wval(unsigned int w, int p)
{
    float f;
#if STORAGE == 2
    if (p) asm volatile("and.b32 %0, %1, 0xffff0000;" : "=f"(f) : "r"(w));
    else asm volatile("shl.b32 %0, %1, 16;" : "=f"(f) : "r"(w));
#else
    if (p) asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi;}" : "=f"(f) : "r"(w));
    else asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo;}" : "=f"(f) : "r"(w));
#endif
    return f;
}
__device__ __forceinline__ unsigned int wpack(const A (&v)[2])
{ return (unsigned int)ST(v[0]) | ((unsigned int)ST(v[1]) << 16); }
#endif

""" + COL_WALK + r"""
template <int NP>
__device__ __forceinline__ void cols2_fwd(const typename Word<NP>::W* __restrict__ x,
                                          typename Word<NP>::W* __restrict__ y, const unsigned int n, const int C,
                                          const unsigned int inner)
{
    typedef typename Word<NP>::W W;
    const unsigned int step = gridDim.x * 256, ci = (CC ? CC : C) * inner;
    for (ColWalk w(blockIdx.x * 256 + threadIdx.x, step, inner, ci); w.k < n; w.next(step, inner, ci)) {
        const W* __restrict__ xc = x + w.off;
        W* __restrict__ yc = y + w.off;
#if CC
        A a[CC][NP];
#pragma unroll
        for (int c = 0; c < CC; ++c) {
            const W v = xc[c * inner];
#pragma unroll
            for (int p = 0; p < NP; ++p) a[c][p] = wval(v, p);
        }
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            A m = 0;
#if ALGO != 0
            m = a[0][p];
#pragma unroll
            for (int c = 1; c < CC; ++c) m = fmax(m, a[c][p]);
            if (m == NEG_INF) m = 0;
#endif
            A s = 0;
#pragma unroll
            for (int c = 0; c < CC; ++c) {
                const A ex = cexp(a[c][p], m);
                s += ex;
#if ALGO == 2
                a[c][p] -= m;
#else
                a[c][p] = ex;
#endif
            }
#if ALGO == 2
            const A ls = log(s);
#pragma unroll
            for (int c = 0; c < CC; ++c) a[c][p] -= ls;
#else
            const A sc = fast_scale(s), inv = (A)1 / (s * sc);  // FAST_SCALE: sc 1 but for FAST's huge sums
#pragma unroll
            for (int c = 0; c < CC; ++c) a[c][p] = (a[c][p] * sc) * inv;
#endif
        }
#pragma unroll
        for (int c = 0; c < CC; ++c) yc[c * inner] = wpack(a[c]);
#else
        A m[NP], r[NP], s[NP];
#pragma unroll
        for (int p = 0; p < NP; ++p) { m[p] = ALGO == 0 ? (A)0 : NEG_INF; r[p] = 0; s[p] = 0; }
        for (int c0 = 0; c0 < C; c0 += U) {
            A v[U][NP];
            const W* __restrict__ q = xc + c0 * inner;
            if (c0 + U <= C) {
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const W t = q[u * inner];
#pragma unroll
                    for (int p = 0; p < NP; ++p) v[u][p] = wval(t, p);
                }
            } else {                                // the last, partial chunk: masked loads
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    W t;
                    if (c0 + u < C) t = q[u * inner];
#pragma unroll
                    for (int p = 0; p < NP; ++p) v[u][p] = c0 + u < C ? wval(t, p) : NEG_INF;
                }
            }
#pragma unroll
            for (int p = 0; p < NP; ++p) {
#if ALGO != 0
                A bm = m[p];
#pragma unroll
                for (int u = 0; u < U; ++u) bm = fmax(bm, v[u][p]);
                const A sh = bm == NEG_INF ? (A)0 : bm;
                // the sum so far rescaled to the new max; while the max was -inf it was 0 or NaN: * exp(-inf) keeps it
                if (bm != m[p]) s[p] *= exp(m[p] - sh);
                m[p] = bm; r[p] = sh;
#endif
#pragma unroll
                for (int u = 0; u < U; ++u) s[p] += cexp(v[u][p], r[p]);
            }
        }
        A f[NP], sc[NP];
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            sc[p] = fast_scale(s[p]);                    // FAST_SCALE: 1 but for FAST's huge sums
            f[p] = ALGO == 2 ? log(s[p]) : (A)1 / (s[p] * sc[p]);
        }
        for (int c0 = 0; c0 < C; c0 += U) {
            const W* __restrict__ q = xc + c0 * inner;
            W* __restrict__ z = yc + c0 * inner;
            W t[U];
            const int nu = C - c0 < U ? C - c0 : U;
#pragma unroll
            for (int u = 0; u < U; ++u) if (u < nu) t[u] = q[u * inner];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (u < nu) {
                    A o[NP];
#pragma unroll
                    for (int p = 0; p < NP; ++p)
                        o[p] = ALGO == 2 ? wval(t[u], p) - r[p] - f[p]
                                         : (cexp(wval(t[u], p), r[p]) * sc[p]) * f[p];
                    z[u * inner] = wpack(o);
                }
            }
        }
#endif
    }
}

template <int NP>
__device__ __forceinline__ void cols2_bwd(const typename Word<NP>::W* __restrict__ y,
                                          const typename Word<NP>::W* __restrict__ dy,
                                          typename Word<NP>::W* __restrict__ dx, const unsigned int n, const int C,
                                          const unsigned int inner)
{
    typedef typename Word<NP>::W W;
    const unsigned int step = gridDim.x * 256, ci = (CC ? CC : C) * inner;
    for (ColWalk w(blockIdx.x * 256 + threadIdx.x, step, inner, ci); w.k < n; w.next(step, inner, ci)) {
#if CC
        W a[CC], b[CC];
#pragma unroll
        for (int c = 0; c < CC; ++c) { a[c] = y[w.off + c * inner]; b[c] = dy[w.off + c * inner]; }
        A s[NP];
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            s[p] = 0;
#pragma unroll
            for (int c = 0; c < CC; ++c) s[p] += ALGO == 2 ? wval(b[c], p) : wval(b[c], p) * wval(a[c], p);
        }
        W* __restrict__ z = dx + w.off;     // a running pointer: the loads' offsets are not kept for the stores
#pragma unroll
        for (int c = 0; c < CC; ++c) {
            A o[NP];
#pragma unroll
            for (int p = 0; p < NP; ++p)
                o[p] = ALGO == 2 ? wval(b[c], p) - exp(wval(a[c], p)) * s[p] : wval(a[c], p) * (wval(b[c], p) - s[p]);
            *z = wpack(o);
            z += inner;
        }
#else
        A s[NP];
#pragma unroll
        for (int p = 0; p < NP; ++p) s[p] = 0;
        for (int c0 = 0; c0 < C; c0 += U) {
            const int nu = C - c0 < U ? C - c0 : U;
            const unsigned int q = w.off + c0 * inner;
            W a[U], b[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (u < nu) { b[u] = dy[q + u * inner]; if (ALGO != 2) a[u] = y[q + u * inner]; }
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (u < nu) {
#pragma unroll
                    for (int p = 0; p < NP; ++p) s[p] += ALGO == 2 ? wval(b[u], p) : wval(b[u], p) * wval(a[u], p);
                }
        }
        for (int c0 = 0; c0 < C; c0 += U) {
            const int nu = C - c0 < U ? C - c0 : U;
            const unsigned int q = w.off + c0 * inner;
            W a[U], b[U];
#pragma unroll
            for (int u = 0; u < U; ++u) if (u < nu) { a[u] = y[q + u * inner]; b[u] = dy[q + u * inner]; }
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (u < nu) {
                    A o[NP];
#pragma unroll
                    for (int p = 0; p < NP; ++p)
                        o[p] = ALGO == 2 ? wval(b[u], p) - exp(wval(a[u], p)) * s[p]
                                         : wval(a[u], p) * (wval(b[u], p) - s[p]);
                    dx[q + u * inner] = wpack(o);
                }
        }
#endif
    }
}

#if SPLIT
// SPLIT (columns too few to fill the GPU, or too tall for one thread's registers): a column's classes in SPLIT slices
// of SK (compile time) held by SPLIT threads -- thread t: column tx = t % CB of the block's CB = 256 / SPLIT (a warp:
// 32 consecutive columns of one slice, coalesced), slice ty = t / CB, classes ty * SK .. ty * SK + SK - 1 (< C).  The
// slices' (max, sum) meet in shared memory, added in slice order by every thread of the column (the same M and S for
// all of them); the values stay in registers: one read, one write.  The grid strides by blocks (the barriers: every
// thread of a block runs the same iterations; threads past the last column load nothing).
#define CB (256 / SPLIT)
// Loads / stores of a thread's slice: the whole slice unmasked where it is (every slice but a column's last: a warp
// is one slice, so the branch is uniform but at the grid's last columns), else masked by class.
#define SLICE_LOOP(BODY)                                                                        \
    if (live && nk >= SK) {                                                                     \
        _Pragma("unroll") for (int k = 0; k < SK; ++k) { const bool in = true; BODY; }          \
    } else {                                                                                    \
        _Pragma("unroll") for (int k = 0; k < SK; ++k) { const bool in = live && k < nk; BODY; } \
    }

__device__ __forceinline__ void split_fwd(const T* __restrict__ x, T* __restrict__ y, const unsigned int n, const int C,
                                          const unsigned int inner)
{
    __shared__ A sm_m[SPLIT][CB], sm_s[SPLIT][CB];
    const unsigned int tx = threadIdx.x % CB, ty = threadIdx.x / CB, step = gridDim.x * CB, ci = C * inner;
    const int nk = C - (int)ty * SK;                    // the slice's classes (>= SK: a full slice; <= 0: none)
    const unsigned int so = ty * SK * inner;            // its first class's offset (not read where nk <= 0)
    for (ColWalk w(blockIdx.x * CB + tx, step, inner, ci); w.k - tx < n; w.next(step, inner, ci)) {
        const bool live = w.k < n;
        const T* __restrict__ p = x + (w.off + so);
        A v[SK];
        SLICE_LOOP(v[k] = in ? LD(p[k * inner]) : NEG_INF)
        A m = 0;
#if ALGO != 0
        m = v[0];
#pragma unroll
        for (int k = 1; k < SK; ++k) m = fmax(m, v[k]);
#endif
        const A sh = m == NEG_INF ? (A)0 : m;
        A s = 0;
#pragma unroll
        for (int k = 0; k < SK; ++k) s += cexp(v[k], sh);
        sm_m[ty][tx] = m;
        sm_s[ty][tx] = s;
        __syncthreads();
        A M = 0;
#if ALGO != 0
        M = sm_m[0][tx];
#pragma unroll
        for (int j = 1; j < SPLIT; ++j) M = fmax(M, sm_m[j][tx]);
        if (M == NEG_INF) M = 0;
#endif
        // each slice's sum rescaled to the column's shift, in slice order: exp(-inf) = 0 for a slice of -inf only
        // (its s 0, or NaN: kept); a slice's NaN makes its s, so S, NaN
        A S = 0;
#pragma unroll
        for (int j = 0; j < SPLIT; ++j) S += ALGO == 0 ? sm_s[j][tx] : sm_s[j][tx] * exp(sm_m[j][tx] - M);
        __syncthreads();                                // the slots are written again by the next iteration
#if ALGO == 2
        const A f = log(S);
#else
        const A sc = fast_scale(S), f = (A)1 / (S * sc);  // FAST_SCALE: sc 1 but for FAST's huge sums
#endif
        T* __restrict__ q = y + (w.off + so);
#if ALGO == 2
        SLICE_LOOP(if (in) q[k * inner] = ST(v[k] - M - f))
#else
        SLICE_LOOP(if (in) q[k * inner] = ST((cexp(v[k], M) * sc) * f))
#endif
    }
}

__device__ __forceinline__ void split_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                          const unsigned int n, const int C, const unsigned int inner)
{
    __shared__ A sm_s[SPLIT][CB];
    const unsigned int tx = threadIdx.x % CB, ty = threadIdx.x / CB, step = gridDim.x * CB, ci = C * inner;
    const int nk = C - (int)ty * SK;
    const unsigned int so = ty * SK * inner;
    for (ColWalk w(blockIdx.x * CB + tx, step, inner, ci); w.k - tx < n; w.next(step, inner, ci)) {
        const bool live = w.k < n;
        const unsigned int o = w.off + so;
        A a[SK], b[SK];
        SLICE_LOOP(a[k] = in ? LD(y[o + k * inner]) : (A)0; b[k] = in ? LD(dy[o + k * inner]) : (A)0)
        A s = 0;
#pragma unroll
        for (int k = 0; k < SK; ++k) s += ALGO == 2 ? b[k] : b[k] * a[k];
        sm_s[ty][tx] = s;
        __syncthreads();
        A S = 0;
#pragma unroll
        for (int j = 0; j < SPLIT; ++j) S += sm_s[j][tx];
        __syncthreads();
        SLICE_LOOP(if (in) dx[o + k * inner] = ST(ALGO == 2 ? b[k] - exp(a[k]) * S : a[k] * (b[k] - S)))
    }
}
#endif

__device__ __forceinline__ bool on4(const void* a, const void* b, const void* c = 0)
{
    return (((size_t)a | (size_t)b | (size_t)c) & 3) == 0;
}

// cols = outer * inner columns; PAIR (inner even, 16-bit data): cols / 2 words of two columns where on 4 bytes
extern "C" __global__ void __launch_bounds__(256, CMINB)
softmax_cols2_fwd(const T* __restrict__ x, T* __restrict__ y, const int cols, const int C, const int inner)
{
#if SPLIT
    split_fwd(x, y, (unsigned int)cols, C, (unsigned int)inner);
    return;
#endif
#if PAIR
    if (on4(x, y)) {
        cols2_fwd<2>((const unsigned int*)x, (unsigned int*)y, (unsigned int)cols >> 1, C, (unsigned int)inner >> 1);
        return;
    }
#endif
    cols2_fwd<1>(x, y, (unsigned int)cols, C, (unsigned int)inner);
}

extern "C" __global__ void __launch_bounds__(256, CMINB)
softmax_cols2_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, const int cols, const int C,
                  const int inner)
{
#if SPLIT
    split_bwd(y, dy, dx, (unsigned int)cols, C, (unsigned int)inner);
    return;
#endif
#if PAIR
    if (on4(y, dy, dx)) {
        cols2_bwd<2>((const unsigned int*)y, (const unsigned int*)dy, (unsigned int*)dx, (unsigned int)cols >> 1, C,
                     (unsigned int)inner >> 1);
        return;
    }
#endif
    cols2_bwd<1>(y, dy, dx, (unsigned int)cols, C, (unsigned int)inner);
}
"""

_SOURCES = {"V1": SOURCE_V1, "ROWS": SOURCE, "COLS": SOURCE_COLS}


# The backward's warp path: 32 + 32 elements a thread (one row a warp, no block barrier: a 1000-class row in one warp)
# or 16 + 16 (a 1000-class row: a 64-thread block).  Measured on an H100 at (16384, 1000): the warp tiling wins for
# log-softmax (float32 0.0813 ms against 0.0926; its dx needs exp(y), and the 64-thread block's barriers serialise
# it) and for 2-byte data (bfloat16 0.0367 / 0.0365 against 0.0391 / 0.0388), the 16 + 16 block for float32 softmax
# (0.0713 against 0.0778).  Rule (bwd_warp): the warp tiling for log-softmax or storage of <= 2 bytes.
# MINIDNN_SOFTMAX_BWD_WARP=1 / =0 force one tiling for every backward (a GPU A/B).
_BWD_WARP_ENV = os.environ.get("MINIDNN_SOFTMAX_BWD_WARP", "")


# Registers a warp-path backward thread holding 32 + 32 elements may use: 80 (three 256-thread blocks an SM) spilled
# 28-72 bytes (nvcc 13, sm_90); 96 gives two blocks (16 warps, 8 KB of loads in flight each) and no spill.
# MINIDNN_SOFTMAX_BWD_REGS=80 brings the spilling three-block version back for a GPU A/B.
BWD_PAIR_REGS = int(os.environ.get("MINIDNN_SOFTMAX_BWD_REGS", "96"))


def bwd_warp(algo_name, itemsize):
    """Whether the backward's warp path holds 32 + 32 elements a thread (else 16 + 16): see above."""
    if _BWD_WARP_ENV in ("0", "1"):
        return _BWD_WARP_ENV == "1"
    return algo_name == "LOG" or itemsize <= 2


# Session 17 (issue 10: the (4096, 32000) float32 log-softmax backward at 57% of copy, 0.82x PyTorch, softmax's at
# 63%; bfloat16 log-softmax 65%, 0.89x): BWD_STASH, the backward's shared-memory stash (BSCH of SOURCE's bwd_rows).
# Such a row is 4 chunks of a 512-thread block (16 + 16 elements a thread a chunk; one block an SM); the first pass
# reads every chunk's dy (and softmax's y) for the sum, the second read chunks 0..2 again -- from L2 when they are
# still there, else DRAM (132 blocks x 256 KB of rows in flight: most of a 50-60 MB L2 shared with the writes).  With
# the stash those chunks' dy (log-softmax: 32 KB a chunk, 96 KB a row) or dy and y (softmax: 64 KB, 192 KB) wait in
# shared memory: each element read once, as a one-chunk row.  The block already has an SM to itself (80 registers x
# 512 threads), so the stash costs no occupancy.  Up to BWD_STASH_BYTES a block (200 KB, within sm_90's 227 KB opt-in;
# plan() lowers it to what the device allows); chunks beyond it are read again as before.  MINIDNN_SOFTMAX_BWD_STASH=0
# (default until the GPU A/B) | 1 (log-softmax stashes dy; its second pass loads y a chunk at a time) | 2 (log-softmax
# stashes y as well, loaded with dy in the first pass: the BSY define; softmax's backward is the same under 1 and 2)
# | 3 (2, with the stash filled by cp.async -- the whole row's loads in flight at once, not a chunk at a time: the
# BSA define, bwd_rows_async; where every chunk but the last fits the budget, else 2's plan).  Bitwise the same dx.
# Module attribute read at planning time (tools/row_ab.py --bwd-stash flips it).
# Default 3 since session 17's run 4 (H200, graph replays, 0 / 3): float32 (4096, 32000) softmax backward 1.51x (62% ->
# 94% of copy), log-softmax 1.69x (56% -> 95%; 0.82x -> 1.38x PyTorch), bfloat16 1.09x / 1.23x; where the cp.async
# stash (BSA) does not fit (50257 classes) 3 kept the kernel without a stash until session 19.  Log-softmax's BSA is
# bitwise 0; softmax's is not (run 4: ~1 ulp in a tenth of the rows, against float64 as close as 0) -- the same inputs
# give the same bits on every call.  Where BSA does not fit (aligned rows whose chunks but the last exceed the budget:
# 50257 or 65536 classes), 3 takes 1's synchronous stash since session 19 (run 5, H200, graph replays, 1 against 3's
# former no-stash plan): softmax backward float32 (4096, 50257) 0.9236 / 1.1188 ms (1.21x, 53% -> 64% of copy),
# (2048, 65536) 1.17x, bfloat16 1.02x / 1.10x; log-softmax float32 1.04x / 1.07x, bfloat16 0.99x / 1.02x.
# 1 and 2 stay selectable for such A/Bs.  4 (session 19; the default since session 20's run 1): 3, and where
# log-softmax's both-array BSA does not fit, its dy alone filled by cp.async (BSA without BSY: bwd_rows_async's BSW 1)
# where dy's chunks but the last fit -- 50257 classes, whose synchronous stash Nsight Compute found at 63% of DRAM
# throughput against BSA's 85-89% (run 8: a chunk's loads at a time, 16 warps an SM).  Bitwise 0 as 3 is.  Session 20
# run 1 (H200, graph replays, 3 -> 4, log-softmax backward): float32 (4096, 50257) 1.0710 -> 0.7846 ms (1.37x; 55% ->
# 76% of copy; PyTorch 0.8851), (300, 50257) 1.34x, (2048, 49999) 1.34x; bfloat16 1.24x / 1.17x / 1.17x (0.4196 ms
# against PyTorch's 0.3906 at (4096, 50257)); float16 1.40x / 1.30x / 1.35x.
# 5 (session 20, helper LSM16): 4, with a 16-bit log-softmax BSA stash counted in the bytes it
# holds -- raw 16-bit vectors (bwd_raw_stash), where 3 / 4 count every stash in floats (the misaligned fallback's
# float stash, bwd_rows<false>, shares the launch's bytes).  Counted so, the both-array BSA (BSY) fits where 4 took dy
# alone (50257 classes: 6 chunks x 2 arrays x 16 KB = 192 KB, counted 384 before) and the other BSA rows reserve half
# (32000 classes: 96 KB, not 192); the fallback keeps the float chunks those bytes hold (BSF).  6: 5, and such a row
# whose raw stash fits two blocks an SM (BWD_TWIN_BYTES: both arrays, else dy alone) takes it at 64 registers,
# MINB 2 (BSR: the raw last chunk, aligned calls only; misaligned ones launch the same plan without BSR at MINB 1 --
# bwd_fallback, _TwinPlan).  Both bitwise 4 (the same values summed in the same order).  6 is the default since
# session 20's run 3 (H200, graph replays, 4 / 5 / 6, log-softmax backward): bfloat16 (4096, 50257) 0.4202 / 0.4083 /
# 0.3233 ms (71% -> 92% of copy; PyTorch 0.3916: 0.93x -> 1.21x), (2048, 49999) 1.34x, (2048, 65536) 1.38x,
# (8192, 16385) 1.39x, (4096, 32001) 1.38x, (4096, 32000) 1.22x (97% of copy), (300, 50257) 1.16x (still 0.89x
# PyTorch: 300 rows are 1.1 waves of 264 blocks); float16 1.32-1.72x over 4 (1.07-1.37x PyTorch) except (300, 50257)
# 1.15x where 5 gave 1.25x (0.80x / 0.87x PyTorch) -- and (4096, 50257) 5 = 6 within 0.5%.
BWD_STASH = int(os.environ.get("MINIDNN_SOFTMAX_BWD_STASH", "6"))
BWD_STASH_BYTES = 200 * 1024
BWD_STASH_MODES = (0, 1, 2, 3, 4, 5, 6)
# Two blocks an SM of 6's: 2 x (112 KB + 64 B static + 1 KB the driver reserves a block) within sm_90's 228 KB an SM
# (a GPU with less shared memory an SM runs one such block at a time: the same results).
BWD_TWIN_BYTES = 112 * 1024


def bwd_stash_chunks(cfg, c, algo_name, acc, budget, both=False):
    """(BSCH, shared-memory bytes) of a backward row plan (RowConfig ``cfg``, ``c`` classes, ``acc``-byte floats)
    with ``budget`` bytes a block: the chunks before the last whose dy (log-softmax; with ``both``, dy and y) or dy
    and y (softmax) fit; (0, 0) for one-chunk rows."""
    if cfg.one or budget <= 0:
        return 0, 0
    nch = -(-(c // cfg.vec) // (cfg.g * cfg.nv))
    per = cfg.nv * cfg.vec * cfg.block * acc * (1 if algo_name == "LOG" and not both else 2)
    n = max(0, min(nch - 1, budget // per))
    return n, n * per


def bwd_raw_stash(cfg, c, algo_name, item, budget, twin=False):
    """BWD_STASH 5 / 6's plan of a several-chunk backward row (RowConfig ``cfg``, ``c`` classes of ``item``-byte
    data) with ``budget`` bytes a block: (arrays stashed, raw bytes, two blocks an SM) -- the BSA stash of every chunk
    but the last counted in raw bytes; both arrays (BSY) where they fit, else dy alone; with ``twin`` first whichever
    fits BWD_TWIN_BYTES (two blocks an SM) -- or None: 4's plan (not 16-bit log-softmax, no vector loads, or not even
    dy's chunks fit)."""
    if item != 2 or algo_name != "LOG" or cfg.one or cfg.vec == 1 or cfg.g != cfg.block or budget <= 0:
        return None
    nch = -(-(c // cfg.vec) // (cfg.g * cfg.nv))
    raw = (nch - 1) * cfg.nv * cfg.vec * cfg.block * item          # one array's chunks but the last
    for cap, two in (((min(budget, BWD_TWIN_BYTES), True),) if twin else ()) + ((budget, False),):
        for arrays in (2, 1):
            if arrays * raw <= cap:
                return arrays, arrays * raw, two
    return None


def bwd_fallback(spec):
    """The launch a BSR plan's misaligned calls take (BSR kernels run aligned calls only): the same plan without BSR
    at MINB 1 -- the same grid and shared memory, bwd_rows<false> with its BSF float stash inside; None for a plan
    without BSR."""
    if "BSR=1" not in spec.defines:
        return None
    defines = tuple(d for d in spec.defines if d != "BSR=1")
    return spec._replace(defines=defines[:-1] + ("MINB=1",))


# One-array rows (softmax forward, cross-entropy forward), for a GPU sweep of the (16384, 1000) float32 forward
# (84% of copy, 0.92x PyTorch): MINIDNN_SOFTMAX_FWD_CAP = the elements a warp-path thread may hold (default 32: a
# 1000-class row one warp; 16: a 64-thread block of 16 each), MINIDNN_SOFTMAX_FWD_REGS = its register budget
# (default 64: four 256-thread blocks an SM; 48 / 40: five / six).

FWD_CAP = int(os.environ.get("MINIDNN_SOFTMAX_FWD_CAP", "0")) or None
FWD_REGS = int(os.environ.get("MINIDNN_SOFTMAX_FWD_REGS", "64"))

# Session 7: one-array rows of one chunk on a warp or less (softmax and cross-entropy forward, 4-byte accumulation)
# take the PIPE kernels -- a persistent grid of the resident blocks, each group issuing its next row's loads before it
# reduces the current one (docs/step_kernels.md, "Session 7").  MINIDNN_SOFTMAX_PIPE=0 gives the session-6 kernels
# back (grid of one row a group, no prefetch); MINIDNN_SOFTMAX_PIPE_REGS the registers a PIPE thread may use when it
# holds more than 16 elements (default 96: two 256-thread blocks an SM, 16 warps each keeping a row of loads in
# flight; nvcc 13 sm_90 at (N, 1000): float32 93-96 registers, bfloat16 113-117, no spills -- at 80, three blocks,
# float32 spilled 56 bytes and bfloat16 over 300).  Module attributes, read by launch_spec at planning time
# (tools/softmax_s7.py flips them).
FWD_PIPE = os.environ.get("MINIDNN_SOFTMAX_PIPE", "1") != "0"
PIPE_REGS = int(os.environ.get("MINIDNN_SOFTMAX_PIPE_REGS", "96"))

# Session 9: the log-softmax backward of one-chunk warp rows with vector loads (float accumulation) takes the
# pipelined walk too (bwd_rows_pipe: the next row's dy in flight while the current dx is computed; H200 run 13 of
# session 8: the old kernel 69% of copy at (16384, 1000) float32 against softmax backward's 92% for the same
# traffic).  MINIDNN_SOFTMAX_BWD_PIPE=0 gives the session-6 backward back; BWD_PIPE_REGS the registers a thread
# may use (128: two 256-thread blocks an SM, as the old kernel's 96).  Module attributes, read at planning time
# (tools/ktable_ab.py flips BWD_PIPE).
BWD_PIPE = os.environ.get("MINIDNN_SOFTMAX_BWD_PIPE", "1") != "0"
BWD_PIPE_REGS = int(os.environ.get("MINIDNN_SOFTMAX_BWD_PIPE_REGS", "128"))

# Session 12, round 2 (issue 10: float32 softmax / log-softmax forward (65536, 128) at 0.88x / 0.84x PyTorch, 77% of
# copy): NARROW, a deeper prefetch for short PIPE rows.  A 128-class float32 row is one 16-byte vector a lane of a
# warp, so each warp keeps 512 bytes of its next row in flight (32 warps an SM: 16 KB) where Little's law asks for
# ~24 KB an SM of reads (2.1 TB/s of the 4.2 x ~1.5 us loaded latency / 132 SMs).  MINIDNN_SOFTMAX_NARROW=0
# (row_config's tiling) | 16 (the default since round 4) | 32: a PIPE forward row whose threads would hold fewer than
# that many elements gets sub-warp groups of G threads holding NARROW each (NV = NARROW / VEC vectors, G = the power
# of two covering the row, at least 2): several rows a warp, NV loads a thread issued together, log2 G shuffle levels
# instead of 5.
# (65536, 128) float32 at 16: G = 8, NV = 4 -- four rows a warp, 2 KB in flight a warp, 64 KB an SM, at the same
# 64 registers (four 256-thread blocks an SM); at 32: G = 4, NV = 8, 96 registers (two blocks), 64 KB an SM.  Rows
# whose threads already hold NARROW (512 and 1000 classes float32) plan the default kernel.  Softmax forwards only
# (cross-entropy's row forward keeps its tiling).  Module attribute read at planning time (tools/row_ab.py flips it).
# GPU run 5 (H200): "16" 1.16x / 1.17x "0" at (65536, 128) float32 softmax / log-softmax, 1.04x (262144, 64), 1.00-1.02x
# (32768, 256), bfloat16 1.15-1.24x; accurate and log passed against float64 at 64-256 classes.  "32" stays selectable:
# in run 4 it beat "16" on bfloat16 (65536, 128) and (32768, 256) (0.0087-0.0088 ms against 0.0092-0.0093, 1.05-1.06x)
# but lost every float32 row (0.92-1.00x) and bfloat16 (262144, 64) (0.94-0.95x); a by-dtype-and-width rule is
# unbuilt.  The fast algorithm (no max) failed one row under "16" (the +80 row: docs/step_kernels.md, session 12 round
# 4), so FAST takes NARROW only with NARROW_FAST (MINIDNN_SOFTMAX_NARROW_FAST=1; default off: row_config's tiling, as
# before).
FWD_NARROW = os.environ.get("MINIDNN_SOFTMAX_NARROW", "16")
NARROW_FAST = os.environ.get("MINIDNN_SOFTMAX_NARROW_FAST", "0") == "1"

# Session 13 (issue 10: float32 softmax / log-softmax forward (16384, 1000) at 0.99x / 0.96x PyTorch, log-softmax
# backward 0.99x): WARP, PyTorch's launch shape with our loads -- a non-persistent grid of 128-thread blocks, a warp
# owning WARP rows (every 16-byte load of them issued before any math, no prefetch), the register bound as tight as
# nvcc allows without spilling so that many warps an SM keep their rows in flight (docs/step_kernels.md, "Session 13:
# warp-row softmax").  MINIDNN_SOFTMAX_WARP=auto (default, below) | 0 (PIPE) | 1 (a row a warp); "1@R": "1" with a
# forward register budget of R (an occupancy probe for the A/B; may spill).
# Rows of 513..1024+ classes whose PIPE plan is one chunk on a whole warp (G = 32) holding <= 32 elements a thread,
# float accumulation, vector loads; forwards of every algorithm and the log-softmax backward (bwd_rows_warp on the
# same grid: a row's dy and y a warp).  Misaligned views take the same code with element
# loads (fwd_rows_warp / bwd_rows_warp<false>).
# The same sums in the same order as PIPE / bwd_rows_pipe: bitwise the default.  Module attribute read at planning
# time (tools/row_ab.py flips it).
# The default "auto" (session 13, H200 run 5, tools/row_ab.py, graph replays): "1" where the call has at least
# WARP_MIN_ROWS rows, else PIPE.  "1" against PIPE, float32: (16384, 1000) softmax 1.037x, log-softmax 1.020x, its
# backward 1.026x; (32768, 1000) 1.057-1.068x; (16384, 1024) 1.043-1.089x; (16384, 513) 1.029-1.061x; bfloat16
# 1.03-1.65x -- but (8192, 1000) 0.955-0.988x: 8192 warps are 1.6 waves of its ~5000 resident ones (the last wave
# half full), where PIPE's persistent grid keeps every SM busy to the end.  "2" (two rows a warp, 80-128 registers:
# five or six blocks an SM) never beat "1" in run 5: float32 0.95-1.00x (its one lead, (32768, 1000) softmax, 0.0658
# against 0.0659 ms), bfloat16 0.79-0.96x; it went in session 19 with its register budgets ("2" now plans PIPE, as any
# other unknown value; the kernel's loops over a warp's WARP rows stay general).
FWD_WARP = os.environ.get("MINIDNN_SOFTMAX_WARP", "auto")
WARP_MIN_ROWS = int(os.environ.get("MINIDNN_SOFTMAX_WARP_MIN_ROWS", "12288"))

# Registers a WARP thread may use (128-thread blocks: 65536 / (128 r) blocks an SM), by (elements a thread E, bytes
# an element, RAGGED), LOG's own where it differs: the tightest budgets nvcc 13 (sm_90, -ftz=true) builds without
# spilling, the misaligned fallback included (warp_load<false>: the same registers).  fp32 (N, 1000): 56 (nine
# blocks, 36 warps an SM, 144 KB of loads in flight; 48 spilled 8-12 bytes), log-softmax 48 (ten blocks, 40 warps,
# 160 KB; 40 spilled 44-60).  RAGGED fp32 (1001) 64 / LOG 56; 2-byte 1000: 48; 2-byte RAGGED (1027) 64 (56 spilled
# 4-8); 513-515 classes (E = 16) 40 (twelve blocks, 48 warps).  The log-softmax backward
# (bwd_rows_warp: dy and y, 2 E values a lane), WARP_BWD_REGS by (E, bytes, RAGGED): fp32 1000 64 (eight blocks,
# 32 warps of 8 KB: 256 KB an SM; 48 spilled 40), 2-byte 1000 72 (64: float16 spilled 4), fp32 RAGGED 72 (64
# spilled 12), 2-byte RAGGED 96 (80 spilled 72-76), E = 16 64 (48 spilled 16-168).
WARP_REGS = {(32, 4, False): 56, (32, 4, True): 64, (32, 2, False): 48, (32, 2, True): 64,
             (16, 4, False): 40, (16, 4, True): 40, (16, 2, False): 40, (16, 2, True): 40}
WARP_REGS_LOG = {(32, 4, False): 48, (32, 4, True): 56}
WARP_BWD_REGS = {(32, 4, False): 64, (32, 4, True): 72, (32, 2, False): 72, (32, 2, True): 96,
                 (16, 4, False): 64, (16, 4, True): 64, (16, 2, False): 64, (16, 2, True): 64}


def warp_regs(e, item, ragged, log):
    """A WARP forward thread's register budget (WARP_REGS, WARP_REGS_LOG for log-softmax where listed; LSM's
    epilogue builds within LOG's)."""
    key = (e, item, ragged)
    return WARP_REGS_LOG.get(key, WARP_REGS[key]) if log else WARP_REGS[key]


WARP_BLOCK = 128

# Session 14 (issue 10: the WARP log-softmax forward at (16384, 1000) float32 0.0346 ms against softmax's 0.0343 and
# PyTorch's 0.0337): LSM, PyTorch's epilogue for the WARP log-softmax forward -- the warp's max first, d = x - M kept
# in place of x, S = sum exp(d), y = d - log S (fwd_rows_warp's LSM branch; docs/step_kernels.md, "Session 14:
# log-softmax forward").  MINIDNN_SOFTMAX_LSM=0 (the session-13 kernel, bitwise PIPE) | 2 (the default after H200 run 6:
# exp = ex2.approx.ftz(d log2e), log = lg2.approx.ftz(S) ln 2: SASS 548 -> 274 instructions a row and lane at fp32
# 1000; float32 (16384, 1000) 0.0346 -> 0.0338 ms, PyTorch 0.0337; bfloat16 0.0188 -> 0.0174, (16384, 513) bfloat16
# 0.0127 -> 0.0084).  (LSM 1, the same epilogue with expf and logf -- 498 instructions --, lost to 2 on every row of
# run 6: float32 1000 classes 0.0345 / 0.0659 ms against 0.0338 / 0.0656, bfloat16 0.0180 against 0.0174, 513
# classes 0.0116 against 0.0084; removed in session 19: "1" now plans as "0".)
# Only log-softmax forwards that plan WARP (FWD_WARP; "auto": >= WARP_MIN_ROWS rows) take it, within LOG's register
# budget (nvcc 13: no spill at WARP_REGS_LOG / WARP_REGS).  Not bitwise "0" (S is summed in another order, "2" with
# another exp): the cuda tests hold it to float64 at the existing tolerance.  Module attribute read at planning time
# (tools/row_ab.py flips it).
FWD_LSM = os.environ.get("MINIDNN_SOFTMAX_LSM", "2")


# Session 17 (issue 10: the float32 (16384, 1000) log-softmax / softmax forward at 1.00x / 1.03x PyTorch, 91-92% of
# copy; the backwards at 95-98%): HINT, cache hints of the row kernels' loads and stores (the HINT define of
# ROW_HEADER: 0 none, 1 streaming loads and stores (ld.global.cs + st.global.cs), 2 streaming stores;
# docs/step_kernels.md, "Session 17: cache hints of the row kernels").  MINIDNN_SOFTMAX_HINT="fwd,bwd" (module
# attributes HINT_FWD, HINT_BWD; default "2,0" since session 17's run 2 (H200, graph replays, hint 0 / hint 2: float32
# (16384, 1000) softmax / log-softmax forward 1.027 / 1.019, (32768, 1000) 1.013 / 1.008 -- log-softmax now 1.009x
# PyTorch --, bfloat16 1.04; hint 1 gained as much or more on bf16 but spread 3-6%; the backward's hint 2 0.998-1.001,
# so off)): the forward 0, 1 or 2, the backward 0 or 2 --
# the backward's streaming loads spilled at its two-array register budgets (nvcc 13, sm_90: the log-softmax WARP
# backward 8-204 bytes at 64-72 registers, the PIPE 513-class one 12; 1024 classes still 16 at 96), and a budget
# raised to fit them would change its occupancy as well as its caching.  Taken by one-chunk row plans (inner = 1,
# each element read once)
# only where the call's arrays (forward x and y, backward y, dy and dx) exceed the device's L2: an array that fits L2
# is read again soon by the next kernel, and evict-first would throw it out (dropout's HINT_BY_SIZE, session 13).
# MINIDNN_SOFTMAX_HINT_BY_SIZE=0 (HINT_BY_SIZE = False): the hints at every size (the cuda tests).  Read at planning
# time; the chosen hint is part of plan()'s key (tools/row_ab.py --hint flips HINT_FWD / HINT_BWD).  The values are
# bitwise the same in every setting.
def _hint_pair(text):
    vals = text.split(",")
    if len(vals) != 2 or vals[0] not in ("0", "1", "2") or vals[1] not in ("0", "2"):
        raise ValueError(f"MINIDNN_SOFTMAX_HINT={text!r} must be 'fwd,bwd' with fwd 0, 1 or 2 and bwd 0 or 2 "
                         "(e.g. '1,2')")
    return int(vals[0]), int(vals[1])


HINT_FWD, HINT_BWD = _hint_pair(os.environ.get("MINIDNN_SOFTMAX_HINT", "2,0"))
HINT_BY_SIZE = os.environ.get("MINIDNN_SOFTMAX_HINT_BY_SIZE", "1") != "0"


def call_hint(backward, nbytes, dev):
    """The HINT a call takes whose arrays (x and y; y, dy and dx) hold ``nbytes``: HINT_BWD / HINT_FWD where they exceed
    the L2 of GPU ``dev`` or the device does not say its L2 size, else 0; the setting at every size without
    HINT_BY_SIZE."""
    hint = HINT_BWD if backward else HINT_FWD
    if hint not in ((0, 2) if backward else (0, 1, 2)):
        raise ValueError(f"softmax_kernels.HINT_{'BWD' if backward else 'FWD'} = {hint!r}: the forward takes 0, 1 "
                         "or 2, the backward 0 or 2")
    if not hint or not HINT_BY_SIZE:
        return hint
    return hint if beyond_l2(nbytes, dev) else 0


def hint_fits(backward, cfg, storage, defines):
    """Whether a row plan (RowConfig ``cfg``, STORAGE ``storage``, its row defines) takes a call's hint: rows of one
    chunk (a longer row reads chunks again, from L2 or its stash), not float16 (its forward spilled 4-72 bytes under
    the asm loads, nvcc 13: its conversions are asm as well), not the pipelined backward holding <= 16 elements a
    thread (513 classes RAGGED spilled 16 bytes at its 80 registers)."""
    if not cfg.one or storage == 1:
        return False
    return not (backward and "PIPE=1" in defines and cfg.nv * cfg.vec <= 16)


def lsm_setting():
    """FWD_LSM as the LSM define (2; anything else 0: the session-13 kernel)."""
    return 2 if FWD_LSM == "2" else 0


def warp_setting():
    """FWD_WARP as (rows a warp, forward register budget or 0 for the table): "1" (and "auto"), or the A/B probe
    "1@R" (R: a forward budget of 32..255 registers in place of warp_regs' no-spill one -- it may spill; an occupancy
    sweep for tools/row_ab.py, never a default); anything else (0, 0)."""
    n, _, r = FWD_WARP.partition("@")
    if n == "auto" and not r:
        return 1, 0
    if n != "1" or (r and not (r.isdigit() and 32 <= int(r) <= 255)):
        return 0, 0
    return 1, int(r or 0)


def warp_rows(backward, algo_name, rows=None):
    """Rows a warp under FWD_WARP for a call of ``rows`` rows (0: the default plans; "auto": "1" from WARP_MIN_ROWS
    rows on), before the row test (uses_warp)."""
    wr = warp_setting()[0]
    if not wr or V1 or (FWD_WARP == "auto" and rows is not None and rows < WARP_MIN_ROWS):
        return 0
    if backward:
        return 1 if algo_name == "LOG" else 0
    return wr


def warp_fullk(cfg, c):
    """FULLK of a WARP row of ``c`` classes (RowConfig ``cfg``, G = 32): how many of a lane's NV vectors lie inside
    every row's body -- the body of the largest head a RAGGED row can have (VEC - 1 elements), or of the misaligned
    fallback (head 0), whichever is smaller."""
    nb = (c - (cfg.vec - 1 if cfg.ragged else 0)) // cfg.vec
    return min(cfg.nv, nb // 32)


# Session 17 (issue 10: the (65536, 512) float32 softmax / log-softmax forward at 0.95x / 0.93x PyTorch, the log-softmax
# backward 0.94x; 90-96% of copy): WARP_FROM, the fewest classes a row takes WARP's grid with (uses_warp). 513 (session
# 13's range) | 257 (the default since run 4, below): rows of 257..512 classes whose PIPE plan is already a whole warp
# holding 16 elements a lane (float32 260..512, 2-byte 264..512: 4 vectors of 4 / 2 of 8) take it too -- PyTorch's
# launch shape for them (its persistent warp softmax: 128-thread blocks, a row a warp, 16 elements a lane) with
# WARP_REGS' 16-element budgets (40 registers: twelve blocks, 48 warps an SM; the log-softmax backward 64: eight) where
# PIPE keeps four (backward three) 256-thread blocks.  Session 13 measured the same 16-element plan at (16384, 513):
# WARP 1.03-1.06x PIPE.  The same sums in the same order (bitwise PIPE) except the log-softmax forward, which takes LSM
# there as at 513+ (against float64 in the cuda tests).  MINIDNN_SOFTMAX_WARP_FROM; module attribute read at planning
# time (tools/row_ab.py --warp-from flips it; docs/step_kernels.md, "Session 17: softmax rows of 512 and of 32000
# classes").
# Default 257 since session 17's run 4 (H200, graph replays, 513 / 257): float32 (65536, 512) softmax / log-softmax
# forward 1.063x / 1.064x (91% -> 97% of copy; now 1.024x / 1.003x PyTorch), log-softmax backward 1.073x (1.007x
# PyTorch); (16384, 512) 0.985-1.028x; bfloat16 1.04-1.53x.
WARP_FROM = int(os.environ.get("MINIDNN_SOFTMAX_WARP_FROM", "257"))


def uses_warp(cfg, c, acc):
    """Whether rows of RowConfig ``cfg`` (``c`` classes, ``acc``-byte sums) take WARP's grid: one chunk on a whole
    warp holding 16..32 elements a thread with vector loads and float sums, WARP_FROM (513 or 257) classes or more."""
    if WARP_FROM not in (257, 513):
        raise ValueError(f"softmax_kernels.WARP_FROM = {WARP_FROM!r} (MINIDNN_SOFTMAX_WARP_FROM): 513 (session 13's "
                         "range) or 257")
    return cfg.one and cfg.g == 32 and cfg.vec > 1 and acc == 4 and c >= WARP_FROM and 16 <= cfg.nv * cfg.vec <= 32


def narrow_config(cfg, c, target):
    """RowConfig ``cfg`` of a PIPE forward row of ``c`` elements with NARROW = ``target`` elements a thread: the
    same VEC, NV = target / VEC vectors a thread (at most the row's), G the power of two that covers the row's body
    vectors; ``cfg`` itself where its threads already hold ``target`` or G would be 1."""
    if target <= 0 or cfg.nv * cfg.vec >= target or cfg.g > 32 or not cfg.one or target % cfg.vec:
        return cfg
    nvec = c // cfg.vec
    nv = min(target // cfg.vec, _pow2_at_least(nvec))
    g = _pow2_at_least(-(-nvec // nv))
    return cfg._replace(g=g, nv=nv) if 2 <= g <= 32 and nv > cfg.nv else cfg


def pipe_regs(cfg):
    """The register budget of a PIPE thread: FWD_REGS (64) while it holds < 16 elements (16 without RAGGED edges),
    else PIPE_REGS (a RAGGED 513-class row spilled 24-104 bytes at 64)."""
    e = cfg.nv * cfg.vec
    return FWD_REGS if e < 16 or (e == 16 and not cfg.ragged) else PIPE_REGS


def col_reg(c):
    """CREG of the session-7 column kernels (COLS_V2 "0"): the register array's length (8, 16, 32), 0 for the
    three-pass loop."""
    return next((k for k in (8, 16, 32) if c <= k), 0)


# COLS_V2 (session 22; MINIDNN_SOFTMAX_COLS_V2, "0": the kernels above, softmax_cols_fwd / _bwd, for a GPU A/B):
# softmax_cols2_fwd / _bwd (SOURCE_COLS' second half) -- the class count compiled in (CC) where a column fits the
# registers, else chunks of COLS_U classes; 32-bit offsets, a NaN-skipping max, two columns a thread for 16-bit data
# (PAIR, where inner is even; COLS_PAIR / MINIDNN_SOFTMAX_COLS_PAIR=0: one column a thread).  COLS_CC_MAX: the
# largest CC with no spills at four 256-thread blocks an SM (64 registers; float64 two, 128), nvcc 13.0 sm_90 --
# every C up to it builds without spills (tests/backend/test_softmax_cols_s22.py); one class more spilled: forward
# float32 / 16-bit 33 (untried: 32 is the old CREG's top), a PAIR forward 21 (softmax 96 bytes), float64 32 (8);
# backward float32 20 (32 bytes), 16-bit 24 (float16 log-softmax 8), a PAIR backward 16 (68), float64 24 (untried).
# A PAIR backward above 12 (two words a class: y and dy) takes one column a thread up to 21 instead.
# SPLIT (columns past COLS_CC_MAX up to 8 x COLS_SPLIT_K classes): a column's classes in S = 2, 4 or 8 slices of
# SK <= COLS_SPLIT_K, each held in a thread's registers, the slices meeting in shared memory -- one read (the chunked
# path reads a column twice), and S threads a column where columns are few ((8, 150, 64, 64): 32768 columns, 128
# blocks of one column a thread for 132 SMs).  S: the fewest slices that fit, then doubled (up to 8, no slice left
# empty) while the columns times S stay under COLS_FILL threads (132 SMs x 1024).  COLS_SPLIT_K: no spills at 64 /
# 128 registers for any SK up to it (forward 21 spilled 4 bytes in log-softmax, 24 16; backward as COLS_CC_MAX;
# float64 forward 11: 4 to 68, its backward 16: 8).  COLS_SPLIT / MINIDNN_SOFTMAX_COLS_SPLIT: "1" (the default) as
# said | "0" (the chunked path past COLS_CC_MAX) | "fill" (also columns within COLS_CC_MAX split where fewer than
# COLS_FILL / 2).
# COLS_FASTX (MINIDNN_SOFTMAX_COLS_FASTX, default "1"): 16-bit forwards take the exps as 2^((x - m) log2e)
# through ex2.approx (the CFX define; SOURCE_COLS' cexp) -- the PAIR forward's SASS at 19 classes from 816 to 544
# instructions with session 22's first one-FFMA form (21.5 to 14.3 an element; the copy's rate allows ~32; the
# (x - m) form, which keeps the max's term exactly 1, one more); "0": expf, the old kernels' values to the bit.
# The nvcc figures here are without -ftz=true; with it (as CuPy builds) the expf PAIR softmax forward at 19 classes
# spilled 8 bytes, so expf forwards pair up to 18 (cols_v2_defines; REVIEW22C).
# Blocks an SM (CMINB, the launch bounds): 4 (64 registers), float64 2 (128); one-column forwards of up to
# COLS_MINB5_CC classes 5 (48 registers: 1280 threads an SM; they build without spills there, as the session-7
# forward did at 48 with more loads in flight a thread; a PAIR forward or a backward at 48 spilled 40-96 bytes).
# COLS_MINB_SET (MINIDNN_SOFTMAX_COLS_MINB, "": the rule) overrides the blocks an SM for an occupancy A/B.
COLS_V2 = os.environ.get("MINIDNN_SOFTMAX_COLS_V2", "1") != "0"
COLS_PAIR = os.environ.get("MINIDNN_SOFTMAX_COLS_PAIR", "1") != "0"
COLS_SPLIT = os.environ.get("MINIDNN_SOFTMAX_COLS_SPLIT", "1")
COLS_FASTX = os.environ.get("MINIDNN_SOFTMAX_COLS_FASTX", "1") != "0"
COLS_MINB_SET = int(os.environ.get("MINIDNN_SOFTMAX_COLS_MINB", "0") or 0)
COLS_U = 8                  # a chunk's loads in flight (16 spilled 8-160 bytes in float32 at 64 registers)
COLS_CC_MAX = {(False, 4, False): 32, (False, 2, False): 32, (False, 2, True): 19, (False, 8, False): 16,
               (True, 4, False): 19, (True, 2, False): 21, (True, 2, True): 12, (True, 8, False): 16}
COLS_SPLIT_K = {(False, 4): 20, (False, 2): 20, (False, 8): 10, (True, 4): 19, (True, 2): 19, (True, 8): 12}
COLS_FILL = 132 * 1024
COLS_MINB5_CC = 24


def cols_split(backward, c, item, cols):
    """SPLIT's slices of a column (2, 4, 8) and classes a slice, or (0, 0) for no split (COLS_SPLIT's rule)."""
    if COLS_SPLIT not in ("0", "1", "fill"):
        raise ValueError(f"softmax_kernels.COLS_SPLIT = {COLS_SPLIT!r} (MINIDNN_SOFTMAX_COLS_SPLIT): 0, 1 or fill")
    kmax = COLS_SPLIT_K[backward, item]
    if COLS_SPLIT == "0" or c > 8 * kmax:
        return 0, 0
    if c <= COLS_CC_MAX[backward, item, False] and not (COLS_SPLIT == "fill" and 2 * cols < COLS_FILL and c > 1):
        return 0, 0
    s = next(k for k in (2, 4, 8) if -(-c // k) <= kmax)
    while s < 8 and cols * s < COLS_FILL and (2 * s - 1) * -(-c // (2 * s)) < c:     # no slice left empty
        s *= 2
    return s, -(-c // s)


def cols_v2_defines(backward, c, inner, dtype, cols):
    """The COLS_V2 kernels' compile-time choices for ``cols`` columns of ``c`` classes, ``inner`` apart, of ``dtype``:
    (CC=, U=, PAIR=, SPLIT=, SK=, CFX=, CMINB= defines, columns a 256-thread block holds at once)."""
    item = np.dtype(dtype).itemsize
    minb = COLS_MINB_SET or (2 if item == 8 else 4)
    cfx = f"CFX={int(COLS_FASTX and item == 2 and not backward)}"
    split, sk = cols_split(backward, c, item, cols)
    if split:
        return ("CC=0", f"U={COLS_U}", "PAIR=0", f"SPLIT={split}", f"SK={sk}", cfx, f"CMINB={minb}"), 256 // split
    pair = COLS_PAIR and item == 2 and inner % 2 == 0
    # the paired bound; the expf forward (CFX off) one class less: under CuPy's -ftz=true its 19-class softmax
    # spilled 8 bytes at 64 registers (REVIEW22C; nvcc 13), the ex2 form none
    pmax = COLS_CC_MAX[backward, 2, True] - (not backward and not COLS_FASTX)
    if pair and pmax < c <= COLS_CC_MAX[backward, 2, False]:
        pair = False                        # a compiled-in column of one a thread over a chunked PAIR
    cc = c if c <= (pmax if pair else COLS_CC_MAX[backward, item, False]) else 0
    if not (COLS_MINB_SET or backward or pair or item == 8) and 0 < cc <= COLS_MINB5_CC:
        minb = 5
    defines = (f"CC={cc}", f"U={COLS_U}", f"PAIR={int(pair)}", "SPLIT=0", "SK=0", cfx, f"CMINB={minb}")
    return defines, 512 if pair else 256


_ALGO = {"FAST": 0, "ACCURATE": 1, "LOG": 2}
_INT_MAX = 2 ** 31 - 1
V1 = os.environ.get("MINIDNN_SOFTMAX_V1", "0") == "1"


def collapse(shape, axes):
    """(outer, C, inner) for a softmax over ``axes`` of a C-contiguous array, or None when the axes are not one run
    of consecutive dims."""
    axes = sorted(axes)
    if not axes or axes != list(range(axes[0], axes[-1] + 1)):
        return None
    return (math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]), math.prod(shape[axes[-1] + 1:]))


def supports(x, axes, *others) -> bool:
    return (_dev.is_cuda_array(x) and type_info(x.dtype) is not None and 0 < x.size <= _INT_MAX
            and x.flags.c_contiguous and collapse(x.shape, axes) is not None
            and all(o is not None and o.flags.c_contiguous and o.dtype == x.dtype for o in others))


def _grid(groups, dev, per_sm=16):
    return (max(1, min(groups, _launch.sm_count(dev) * per_sm)),)


def uses_pipe(cfg, arrays, acc):
    """Whether rows of RowConfig ``cfg`` take the PIPE kernels (FWD_PIPE; one array, one chunk, a warp or less, vector
    loads, float accumulation)."""
    return FWD_PIPE and not V1 and arrays == 1 and acc == 4 and cfg.one and cfg.g <= 32 and cfg.vec > 1


def uses_bwd_pipe(cfg, acc):
    """Whether a log-softmax backward of RowConfig ``cfg`` takes bwd_rows_pipe (BWD_PIPE; one chunk, a warp or less,
    vector loads, float accumulation)."""
    return BWD_PIPE and not V1 and acc == 4 and cfg.one and cfg.g <= 32 and cfg.vec > 1


def row_defines(c, dtype, arrays=1, stash_bytes=0, regs=None, warp_pair=False, pipe=False, bwd_pipe=False,
                narrow=0, warp=0, log=False, lsm=0):
    """The row kernels' compile-time tiling for rows of ``c`` elements of ``dtype`` (see row_config), as
    NAME=VALUE strings (MINB last), and the RowConfig; ``regs``: the registers a thread may use (MINB blocks an SM);
    ``pipe``: the kernel has a PIPE path (softmax and cross-entropy forward), taken where uses_pipe says;
    ``bwd_pipe``: the log-softmax backward's pipelined path, taken where uses_bwd_pipe says; ``narrow``: NARROW's
    elements a thread for a PIPE row (narrow_config); ``warp``: WARP's rows a warp (uses_warp decides; then
    WARP_BLOCK threads a block, no PIPE, the warp_regs / WARP_BWD_REGS budget -- ``log``: log-softmax's -- and the
    WARP=n, FULLK=k defines before MINB; ``lsm``: a log-softmax forward WARP row's LSM define, before MINB)."""
    item = np.dtype(dtype).itemsize
    acc = 8 if item == 8 else 4
    cfg = row_config(c, item, acc, arrays, stash_bytes, warp_pair, FWD_CAP if arrays == 1 and acc == 4 else None)
    if warp and uses_warp(cfg, c, acc):
        cfg = cfg._replace(block=WARP_BLOCK)
        e = cfg.nv * cfg.vec
        regs = (WARP_BWD_REGS[e, item, cfg.ragged] if arrays == 2
                else warp_setting()[1] or warp_regs(e, item, cfg.ragged, log))
        lsm_d = (f"LSM={lsm}",) if lsm and log and arrays == 1 else ()
        return (f"G={cfg.g}", f"NV={cfg.nv}", f"VEC={cfg.vec}", f"VBYTES={cfg.vec * item}", f"BLOCK={cfg.block}",
                f"RAGGED={int(cfg.ragged)}", "ONE=1", "SCH=0", "PIPE=0", f"WARP={warp}",
                f"FULLK={warp_fullk(cfg, c)}", *lsm_d, f"MINB={65536 // (cfg.block * regs)}"), cfg
    if narrow and pipe and uses_pipe(cfg, arrays, acc):
        cfg = narrow_config(cfg, c, narrow)
    bwd_pipe = bwd_pipe and uses_bwd_pipe(cfg, acc)
    pipe = (pipe and uses_pipe(cfg, arrays, acc)) or bwd_pipe
    # registers: <= 64 a thread where the data fits (a 1000-class float32 forward took 88-113 without a cap: two
    # 256-thread blocks an SM; capped, four), <= 80 holding two arrays; float64 uncapped; PIPE: pipe_regs at least
    if bwd_pipe:
        regs = max(regs or 0, BWD_PIPE_REGS if cfg.nv * cfg.vec > 16 else 80)
    elif pipe:
        regs = max(regs or 0, pipe_regs(cfg))
    elif regs is None:
        regs = FWD_REGS if arrays == 1 else (BWD_PAIR_REGS if cfg.g <= 32 and cfg.nv * cfg.vec > 16 else 80)
    minb = 1 if acc == 8 else max(1, 65536 // (cfg.block * regs))
    return (f"G={cfg.g}", f"NV={cfg.nv}", f"VEC={cfg.vec}", f"VBYTES={cfg.vec * item}", f"BLOCK={cfg.block}",
            f"RAGGED={int(cfg.ragged)}", f"ONE={int(cfg.one)}", f"SCH={cfg.sch}", f"PIPE={int(pipe)}",
            f"MINB={minb}"), cfg


def _narrow(algo_name):
    """NARROW's elements a thread for a forward of ``algo_name`` (FWD_NARROW; 0: off, as is any value but 16 and 32,
    and FAST without NARROW_FAST)."""
    if algo_name == "FAST" and not NARROW_FAST:
        return 0
    return int(FWD_NARROW) if FWD_NARROW in ("16", "32") else 0


# WARP's grid cap in blocks an SM (_grid): above any call's blocks even on one SM (supports() keeps x.size < 2^31,
# so at most 2^31 / 513 / 4 ~ 1.05 M blocks): the grid holds every row's warp, which fwd_rows_warp relies on.
WARP_PER_SM = 1 << 24


class Spec(NamedTuple):
    """One launch as the planner settles it: SOURCE key, kernel name, NAME=VALUE defines (all of them), grid
    groups (blocks wanted before the per-SM cap), blocks per SM cap, threads a block, dynamic shared memory."""
    source: str
    name: str
    defines: tuple
    groups: int
    per_sm: int
    block: int
    smem: int


def launch_spec(backward, shape, axes, algo_name, dtype, hint=0, stash=None) -> Spec:
    """The kernel, compile-time defines and launch shape of softmax over ``axes`` of a C-contiguous ``shape``;
    ``hint``: the call's cache hint (call_hint), a HINT define after ALGO on one-chunk row plans (0: no define; the
    forward's 2 is the define 3: ROW_HEADER); ``stash``: the bytes a backward block of several-chunk rows may stash
    in (None: BWD_STASH_BYTES under BWD_STASH, else 0), a BSCH define (and, log-softmax under BWD_STASH 2 / 3, BSY=1;
    under 3, BSA=1 where every chunk but the last fits; under 5 / 6 a 16-bit log-softmax BSA counted raw:
    bwd_raw_stash, with BSF and, 6's two blocks an SM, BSR=1 and MINB=2) before MINB where a chunk fits."""
    outer, c, inner = collapse(shape, axes)
    rows = outer * inner
    if backward and algo_name == "FAST":
        algo_name = "ACCURATE"              # the same backward: one compilation
    scalar, accum, storage, _ = type_info(dtype)
    base = (f"SCALAR={scalar}", f"ACCUM={accum}", f"STORAGE={storage}", f"ALGO={_ALGO[algo_name]}")
    if V1:
        return Spec("V1", "softmax_bwd" if backward else "softmax_fwd", base, (rows + 7) // 8, 16, THREADS, 0)
    if inner == 1:
        defines, cfg = row_defines(c, dtype, 2 if backward else 1, 0 if backward else STASH_BYTES,
                                   warp_pair=backward and bwd_warp(algo_name, np.dtype(dtype).itemsize),
                                   pipe=not backward, bwd_pipe=backward and algo_name == "LOG",
                                   narrow=0 if backward else _narrow(algo_name),
                                   warp=warp_rows(backward, algo_name, rows), log=algo_name == "LOG",
                                   lsm=0 if backward else lsm_setting())
        acc = 8 if np.dtype(dtype).itemsize == 8 else 4
        if hint and hint_fits(backward, cfg, storage, defines):
            base += (f"HINT={3 if hint == 2 and not backward else hint}",)    # the forward's 2: asm .nc loads
        minb = int(defines[-1].split("=")[1])        # blocks an SM the registers allow: launch at least those
        wr = next((int(d[5:]) for d in defines if d.startswith("WARP=")), 0)
        if wr:                                       # WARP: every row's warp in the grid (not persistent)
            return Spec("ROWS", "softmax_rows_bwd" if backward else "softmax_rows_fwd", base + defines,
                        -(-rows // (cfg.block // 32 * wr)), WARP_PER_SM, cfg.block, 0)
        pipe = "PIPE=1" in defines                   # PIPE: exactly the resident blocks (a persistent grid)
        smem = cfg.sch * cfg.nv * cfg.vec * cfg.block * acc
        if backward:
            if stash is None:
                stash = BWD_STASH_BYTES if BWD_STASH else 0
            both = algo_name == "LOG" and BWD_STASH >= 2
            bsch, smem_s = bwd_stash_chunks(cfg, c, algo_name, acc, stash, both)
            raw = (bwd_raw_stash(cfg, c, algo_name, np.dtype(dtype).itemsize, stash, BWD_STASH == 6)
                   if BWD_STASH >= 5 else None)
            if raw:                                  # 5 / 6: the raw-counted BSA (BWD_STASH's comment)
                arrays, smem, two = raw
                nch = -(-(c // cfg.vec) // (cfg.g * cfg.nv))
                bsf = min(nch - 1, smem // (cfg.nv * cfg.vec * cfg.block * acc * arrays))   # the fallback's floats
                defines = (defines[:-1] + (f"BSCH={nch - 1}",) + (("BSY=1",) if arrays == 2 else ())
                           + ("BSA=1", f"BSF={bsf}") + (("BSR=1", "MINB=2") if two else defines[-1:]))
                minb = 2 if two else minb
            elif bsch:
                nch = -(-(c // cfg.vec) // (cfg.g * cfg.nv))
                asy = BWD_STASH >= 3 and bsch == nch - 1 and cfg.vec > 1     # BSA: the whole row but its last chunk
                if BWD_STASH >= 3 and not asy:
                    # 3 where BSA does not fit (rows past ~40000 classes): 1's synchronous stash (BWD_STASH's comment);
                    # 4: log-softmax's dy alone by cp.async where its chunks but the last fit (BSA without BSY)
                    both = False
                    bsch, smem_s = bwd_stash_chunks(cfg, c, algo_name, acc, stash, False)
                    asy = BWD_STASH >= 4 and algo_name == "LOG" and bsch == nch - 1 and cfg.vec > 1
                smem = smem_s
                defines = (defines[:-1] + (f"BSCH={bsch}",) + (("BSY=1",) if both else ())
                           + (("BSA=1",) if asy else ()) + defines[-1:])
        return Spec("ROWS", "softmax_rows_bwd" if backward else "softmax_rows_fwd", base + defines,
                    -(-rows // (cfg.block // cfg.g)), minb if pipe else max(16, minb), cfg.block, smem)
    if COLS_V2:
        defines, per_block = cols_v2_defines(backward, c, inner, dtype, rows)
        return Spec("COLS", "softmax_cols2_bwd" if backward else "softmax_cols2_fwd", base + defines,
                    -(-rows // per_block), 32, 256, 0)
    return Spec("COLS", "softmax_cols_bwd" if backward else "softmax_cols_fwd", base + (f"CREG={col_reg(c)}",),
                -(-rows // 256), 32, 256, 0)


_kernel_cache: dict = {}


def _kernel(source, name, defines):
    key = (source, name, defines)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _launch.get_kernel(_SOURCES[source], name,
                                                    tuple(f"-D{d}" for d in defines) + ("-std=c++14",))
    return k


# ---- plans: kernel, grid and packed scalars once per call signature; a call = one allocation + one launch --------
_plans: dict = {}


class _Plan:
    __slots__ = ("dev", "go")

    def __call__(self, a, b=None):
        with _launch.on_device(self.dev):
            out = _launch._cp.empty(a.shape, a.dtype)
            if b is None:
                self.go(a, out)
            else:
                self.go(a, b, out)
        return out


def call_stash(backward, dev):
    """The stash bytes a backward call's block may use (launch_spec's ``stash``): BWD_STASH_BYTES under BWD_STASH,
    within what one block of GPU ``dev`` may opt into (less 1 KB: the kernel's static shared memory); 0 otherwise."""
    if not backward or not BWD_STASH:
        return 0
    if BWD_STASH not in BWD_STASH_MODES:
        raise ValueError(f"softmax_kernels.BWD_STASH = {BWD_STASH!r} (MINIDNN_SOFTMAX_BWD_STASH): 0, 1, 2, 3, 4, 5 "
                         "or 6")
    if BWD_STASH >= 3 and not sm80(dev):        # 3-6's stash is filled by cp.async: sm_80+; else no stash
        return 0
    optin = smem_limits(dev)[1]
    return min(BWD_STASH_BYTES, optin - 1024) if optin else BWD_STASH_BYTES


class _AlignedPlan(_Plan):
    """A plan whose kernel takes its arrays on 16-byte boundaries: aligned calls (the output a fresh allocation)
    launch it, the others a fallback plan -- ``old``, given, or built from ``_args`` by _row_plan on the first such
    call (most callers never make one: no second compilation)."""
    __slots__ = ("old", "_args")

    def __call__(self, a, b=None):
        if (a.data.ptr | (0 if b is None else b.data.ptr)) % 16 == 0:
            return _Plan.__call__(self, a, b)
        if self.old is None:
            self.old = _row_plan(*self._args)
        return self.old(a, b)


class _TwinPlan(_AlignedPlan):
    """A BSR backward plan (BWD_STASH 6): the BSR kernel for aligned y and dy, its BSR-less twin (bwd_fallback,
    prepared with it) for the others -- the kernel's aligned() asked here."""
    __slots__ = ()


class _Like(NamedTuple):
    """An array's shape and dtype: what a plan is built from."""
    shape: tuple
    dtype: np.dtype


class _ClusterPlan(_AlignedPlan):
    """A softmax_cluster launch (CLUSTER); the row plan for calls off 16-byte boundaries, built when one comes."""
    __slots__ = ()


def _plan(backward, x, axes, algo_name, dev, hint=0, stash=0):
    outer, c, inner = collapse(x.shape, axes)
    if inner == 1 and not V1:
        algo = "ACCURATE" if backward and algo_name == "FAST" else algo_name      # the same backward
        cl = _smc.plan(outer, c, x.dtype, algo, backward, dev)
        if cl is not None:
            p = _ClusterPlan()
            # the fallback's plan needs x's shape and dtype only: the array itself would stay alive with the plan
            p.dev, p.old, p._args = dev, None, (backward, _Like(x.shape, x.dtype), axes, algo_name, dev, hint, stash)
            p.go = _smc.prepare(outer, c, x.dtype, algo, backward, cl)
            return p
    return _row_plan(backward, x, axes, algo_name, dev, hint, stash)


def _row_plan(backward, x, axes, algo_name, dev, hint=0, stash=0):
    outer, c, inner = collapse(x.shape, axes)
    rows = outer * inner
    s = launch_spec(backward, x.shape, axes, algo_name, x.dtype, hint, stash)
    arrays = [None] * (3 if backward else 2)
    tail = {"V1": [np.int64(rows), np.int32(c), np.int32(inner)], "ROWS": [np.int32(rows), np.int32(c)],
            "COLS": [np.int32(rows), np.int32(c), np.int32(inner)]}[s.source]
    def prepared(spec):
        q = _Plan()
        q.dev = dev
        q.go = _launch.prepare(_kernel(spec.source, spec.name, spec.defines), _grid(spec.groups, dev, spec.per_sm),
                               (spec.block,), arrays + tail, spec.smem)
        return q
    p = prepared(s)
    slow = bwd_fallback(s) if backward else None
    if slow:                                      # BSR: the twin for misaligned calls
        twin = _TwinPlan()
        twin.dev, twin.go, twin.old, twin._args = dev, p.go, prepared(slow), None
        return twin
    return p


def plan(x, axes, algo_name, backward=False):
    """The settled launch of softmax over ``axes`` of arrays shaped like x: ``plan(x)`` -> y, ``plan(y, dy)`` -> dx
    (``backward``)."""
    dev = x.data.device_id
    hint = call_hint(backward, x.nbytes * (3 if backward else 2), dev)
    stash = call_stash(backward, dev)
    return _launch.planned(_plans, (backward, x.shape, tuple(axes), algo_name, x.dtype, dev, hint, stash,
                                    BWD_STASH if stash else 0, _smc.CLUSTER), _plan,
                           backward, x, axes, algo_name, dev, hint, stash)


def forward(x, axes, algo_name):
    return plan(x, axes, algo_name)(x)


def backward(y, dy, axes, algo_name):
    return plan(y, axes, algo_name, True)(y, dy)


def _compile_spec(spec):
    """Compile ``spec``'s kernel with NVRTC into CuPy's on-disk cache (a worker of precompile; the options are
    _kernel's, so the later launch loads the cubin)."""
    cp = _launch.cupy()
    cp.RawModule(code=_SOURCES[spec.source], options=tuple(f"-D{d}" for d in spec.defines) + ("-std=c++14",)
                 ).get_function(spec.name)
    return spec


def precompile(specs, procs=None):
    """Compile the distinct kernels of ``specs`` (launch_spec results) into CuPy's on-disk cache (CUPY_CACHE_DIR) with
    a process each core (spawned, up to 16): a test or A/B that launches many hinted variants then loads cubins
    instead of running NVRTC one after another (as tools/precompile_conv.py for the convolutions)."""
    specs = list(specs)
    specs += [f for f in map(bwd_fallback, specs) if f]        # a BSR plan prepares its fallback too (_plan)
    return _launch.compile_in_parallel(_compile_spec, {(s.source, s.name, s.defines): s for s in specs}.values(),
                                       procs)


def write_spec(path, spec):
    """Write ``spec``'s source with its defines for nvcc (the compile check of every planned configuration)."""
    _launch.write_source(path, _SOURCES[spec.source], spec.defines)


def _compile_check(out_dir):
    """Write the planned configurations' sources for nvcc (python -m minidnn.backend.cuda.softmax_kernels DIR)."""
    import os.path
    files = []
    for dtype in ("float32", "float64", "bfloat16", "float16"):
        for shape, axes in (((8, 10), (1,)), ((8, 1000), (1,)), ((8, 4097), (1,)), ((8, 32768), (1,)),
                            ((8, 50257), (1,)), ((2, 21, 9, 7), (1,)), ((2, 1000, 2), (1,))):
            for backward in (False, True):
                for algo in ("FAST", "ACCURATE", "LOG"):
                    s = launch_spec(backward, shape, axes, algo, _dtype_of(dtype))
                    path = os.path.join(out_dir, f"{s.name}_{dtype}_{'x'.join(map(str, shape))}_{algo}.cu")
                    write_spec(path, s)
                    files.append(path)
    return files


if __name__ == "__main__":
    import sys
    print("\n".join(_compile_check(sys.argv[1])))
