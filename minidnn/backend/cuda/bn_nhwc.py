"""Channels-last (NHWC) batch normalisation on the GPU: whole rows streamed with 16-byte vectors (issues 10, 12).

Shape legend: x, y, z (residual), dy, dx, dz are (R, C) contiguous in memory -- R = N*H*W (N*D*H*W, N*L; N for
2-D input) rows of C channels.  scale, bias, running_mean, running_var, dscale, dbias: (C,) in P (x's dtype;
float32 for float16/bfloat16 data); mean, inv_std (C,) and coef (C, 2) in A (double for float64 data, else float).

Vectors.  VEC channels of a row make one vector (VEC * itemsize <= 16 bytes: the widest power of two that divides
C and to which every pointer is aligned -- 4 floats, 8 halves, 2 doubles; C = 24 bf16 takes 8, C = 6 bf16 takes 2,
C = 3 takes 1, the scalar path).  A row holds CV = C / VEC vectors.
Tiling.  The row's vectors are split into `chunks` = ceil(CV / 256) column chunks (gridDim.y) of TX =
ceil(CV / chunks) vectors.  A 256-thread block is RB = 256 / TX rows of TX threads: thread (ty, tx) = (tid / TX,
tid % TX) owns vector column vcol = chunk * TX + tx -- the channels vcol * VEC ... + VEC - 1, the same at every row
it visits -- and threads ty * TX + tx cover RB * TX consecutive vectors of RB consecutive rows: one contiguous span
per block step, 16 bytes per thread.  Rows are taken in groups of RB: group g is rows g * RB ... g * RB + RB - 1
(NG = ceil(R / RB) groups); block b of a G-block grid walks groups b, b + G, b + 2G, ... (UNROLL = 4 groups in
flight per thread and array; UNROLL_F = 8 in the forward reduction, which reads one array).  `rev` walks the
mirrored order NG - 1 - g: the elementwise pass starts on the rows the reduction read last, which L2 still holds.
What a thread computes.  Reduction pass: per lane e of its vector (channel vcol * VEC + e), in registers over its
rows, forward the shifted sums sum(x - K), sum((x - K)^2) (K = the channel's row-0 value, the reference's shifted
one-pass moments) and backward sum(g), sum(g * xhat) (g = dy, masked by y > 0 after a fused ReLU).  The block adds
its RB rows of threads with a fixed-order shared-memory tree and row 0 writes the block's partial (G, C, 2).  The
last block of a chunk to arrive (threadfence + atomic ticket, no float atomics) adds the G partials of each channel
in double in a fixed order (thread (q, k): channel k, partials q, q + QN, ... in order, then a tree over q: the
same bits whichever block is last) and finalises: mean, inv_std, the running statistics and BatchNorm's counter
(forward); coef = (mean(g), mean(g * xhat)), dscale, dbias (backward).  Elementwise pass: each thread loads its
VEC channels' constants once, then y = act((x - mean) * inv_std * scale + bias [+ z]) or dx = scale * inv_std *
(g - coef0 - xhat * coef1), dz = g, over the same row walk (reversed), last-use loads and streaming stores.

Two routes (ROUTE, MINIDNN_BN_NHWC_ROUTE):
  "two"  bnc_stats + bnc_apply (forward), bnc_grad + bnc_dx (backward): two launches per direction;
  "one"  bnc_fwd1, bnc_bwd1: the same two passes in one launch; every block of the grid is resident (grid <= the
         driver's occupancy x SMs), the non-last blocks of a chunk wait for its flag after the meeting, the last
         one to leave resets the counters.
Inference is one bnc_apply with FROM_VAR (inv_std from the running variance).  ENABLED = False (MINIDNN_BN_NHWC=0)
hands channels-last calls back to bn_kernels' older kernels (A/B).  Nothing is read back to the host; the same
launches at every call (capturable in a CUDA graph); deterministic.
Traffic: forward reads x twice and writes y, backward reads x, dy (y) twice and writes dx (dz); the second read
starts on the rows the first read last, so the tail of the first pass (up to about an L2) comes from L2.
On-chip copy (ONCHIP, MINIDNN_BN_ONCHIP=1, the default; one-launch kernels): each thread also keeps the first `ks`
vectors of its walk (x forward; x and the masked g backward) in dynamic shared memory across the meeting -- as many
as the SM's shared memory holds for BPS blocks (an H100: 25 float4 slots forward, 12 backward, about 26 MB over the
grid) -- and the elementwise pass reads those from shared memory after re-reading the rest newest first (L2 first,
then DRAM).  The reduction's order and grid are unchanged, so the results are the same bits as without the copy.
Paper estimate, (128, 64, 56, 56) float32 on an H100 (2990 GB/s copy, 50 MB L2): forward DRAM = read x (102.8 MB) +
write y (102.8) + the uncached part L2 no longer holds (~77 MB uncached, ~25-30 MB of it still in L2) ~ 255 MB ->
~0.086 ms + the meeting ~ 0.09 ms (~75% of copy; was 0.124, PyTorch 0.114); backward 205.6 + 102.8 + ~155 MB
re-read ~ 465 MB -> ~0.16 ms (~63%; was 0.189, PyTorch 0.177): shared memory holds only an eighth of x and dy there.
L2 policies (KEEP, session 12; one-launch kernels with the copy): only where the call's data (its (R, C) arrays read
and written) exceeds the L2, the reduction's newest steps (0.40 of L2) are loaded evict-last and every other load
evict-first; smaller calls run the kernel without it (the KEEP comment below).
"""
from __future__ import annotations

import os

import numpy as np

from . import launch as _launch
from . import workspace as _ws
from .device_facts import l2_info, smem_limits
from .storage import STORAGE_HEADER, acc_dtype, param_dtype, type_info

__all__ = ["ENABLED", "ROUTE", "SOURCE", "takes", "rows_layout", "switch", "geometry", "training_call",
           "backward_call", "inference_call", "forward_training", "forward_inference", "backward"]

ENABLED = os.environ.get("MINIDNN_BN_NHWC", "1") != "0"
# The one-launch kernels keep part of the data in shared memory across the meeting and re-read the rest newest
# first (CACHE; the source's "on-chip copy").  MINIDNN_BN_ONCHIP=0 / ONCHIP = False: the kernels before it (A/B).
ONCHIP = os.environ.get("MINIDNN_BN_ONCHIP", "1") != "0"
# Session 7's block reduction and combine (V2: the source's block_partial / combine; docs/step_kernels.md, "Session 7:
# channels-last batch norm").  MINIDNN_BN_NHWC_V2=0 / V2 = False: session 6's kernels (the GPU A/B); callers clear
# the call caches after changing it (tools/bn_nhwc_s7.py does).
V2 = os.environ.get("MINIDNN_BN_NHWC_V2", "1") != "0"
# With V2: the one-launch kernels take the chunk's per-channel constants after the meeting through shared memory,
# each loaded from L2 once per block (the source's stage_pair), instead of every thread loading its own with __ldcg
# (every warp of the grid asking L2 for the same few lines at once).  MINIDNN_BN_NHWC_STAGE=0 / STAGE = False: the
# loads before it (the GPU A/B; callers clear the call caches after changing it).  The same values: the same bits.
STAGE = os.environ.get("MINIDNN_BN_NHWC_STAGE", "1") != "0"
# KEEP (session 12; docs/step_kernels.md, "Session 12: channels-last batch norm"): the directions ("fwd", "bwd") whose
# one-launch kernels with the on-chip copy give L2 eviction policies to their loads -- the reduction pass's last `kl`
# steps of each re-read array (the newest, which the elementwise pass reads first) with the tail policy, every other
# load of that pass and every load of the elementwise pass evict-first (a hit demotes a kept line) -- where the call's
# data does not fit in L2: the bytes of the (R, C) arrays it reads and writes (forward x, z, y; backward x, dy, y after
# a fused ReLU, dx, dz), once each, exceed the device's L2 size (KEEP_ABOVE: None; a byte count replaces it -- the
# tests' 0 takes KEEP at every size).  Every smaller call builds and launches the kernel without KEEP: the default
# before it, PTX for PTX.  MINIDNN_BN_NHWC_KEEP: unset or "1" both directions, "fwd" / "bwd" / "fwd,bwd" those, "0" or
# "" none (the A/B).  kl: KEEP_FRAC of the device's L2 (MINIDNN_BN_NHWC_KEEP_FRAC, default 0.40) over the bytes a step
# reads; the tail policy evict-last (KEEP_LAST = 1, MINIDNN_BN_NHWC_KEEP_LAST) or evict-normal (0).  Both are kernel
# arguments (no recompile).  Needs sm_80 (createpolicy, ld.global.L2::cache_hint): off below.  The same bits either
# way; callers clear the call caches after changing these (tools/bn_nhwc_ab.py does).
_KEEP_ENV = os.environ.get("MINIDNN_BN_NHWC_KEEP", "1").replace(" ", "")
KEEP = frozenset(("fwd", "bwd") if _KEEP_ENV == "1" else (d for d in _KEEP_ENV.split(",") if d in ("fwd", "bwd")))
KEEP_FRAC = max(0.0, float(os.environ.get("MINIDNN_BN_NHWC_KEEP_FRAC", "0.40")))
KEEP_LAST = int(os.environ.get("MINIDNN_BN_NHWC_KEEP_LAST", "1") != "0")
KEEP_ABOVE = None
# SPLIT (session 17; docs/step_kernels.md, "Session 17: channels-last batch norm at wide C"): the one-launch kernels'
# meeting with the combine spread over the grid (the source's meet_split: every block waits for all partials, combines
# a few channels, every block waits for all channels) instead of the last block combining every channel alone -- at
# C = 256 with 264 blocks that block made 17 dependent trips to L2 (combine_trips), ~11 us of every call.  The same sums
# in the same order: the same bits.  MINIDNN_BN_NHWC_SPLIT: "0" off; "1" (the default since session 17's run 2) where
# the single combiner's trips (combine_trips) reach SPLIT_TRIPS (MINIDNN_BN_NHWC_SPLIT_TRIPS, default 4: the models'
# shapes make 1-8, (128, 64, 56, 56) 5, C = 256 at 264 blocks 17); "all" at every size (the tests).  Run 2 (H200,
# graph replays, off / split): C = 256 fp32 fwd 1.069, bwd 1.038, add+relu bwd 1.044 (0.98x -> 1.04x PyTorch), bf16
# 1.08-1.13; (128, 128, 8, 8) (8 / 4 trips) 1.06-1.33; (128, 64, 56, 56) (5) 1.00-1.03; (256, 32, 56, 56) (3)
# 0.99-1.02; (128, 16, 32, 32) (1-2) 0.94-0.96 -- hence 4.  Never where the staging
# buffer cannot hold a channel's G partials (G > VEC * 256).  Callers clear the call caches after changing these.
_SPLIT_ENV = os.environ.get("MINIDNN_BN_NHWC_SPLIT", "1").strip()
SPLIT = 2 if _SPLIT_ENV == "all" else 1 if _SPLIT_ENV == "1" else 0
SPLIT_TRIPS = int(os.environ.get("MINIDNN_BN_NHWC_SPLIT_TRIPS", "4"))
# At most this many slots per thread (None: what shared memory holds): the tests set it to make the copy hold part
# of a small tensor's walk; callers clear the call caches (_calls here and in bn_kernels) after changing it.
SLOTS_CAP = None
# "one" (one launch per direction) or "two"; by default "two" where MINIDNN_BN_ONEPASS=0 asks bn_kernels for two
ROUTE = os.environ.get("MINIDNN_BN_NHWC_ROUTE", "two" if os.environ.get("MINIDNN_BN_ONEPASS", "1") == "0" else "one")
THREADS = 256
UNROLL = 4            # row groups in flight per thread and array
UNROLL_F = 8          # ... in the forward reduction, which reads one array (registers allow it: nvcc, the tests)
BPS = 2               # blocks per SM every kernel is built for (launch bounds: <= 128 registers; without the hint
                      # ptxas gave bnc_dx float32 63 registers and a spill)
TWO_BLOCKS_PER_SM = 4  # the two-launch reduction's blocks per SM (need not be resident together)
APPLY_BLOCKS_PER_SM = 8
_INT_MAX = 2 ** 31 - 1

# TWIN (the training forward's speculative second output, docs/fusion.md "Batch norm writes relu(y) too"): the
# one-launch forward kernels of this family (bnc_fwd1 here, bn_fwd1, bn_cluster's bn_fwdc) also store relu(y) to an
# array `twin`, the last of their array arguments (TWIN_PARAM).  relu_of_stored takes the value as stored in y and
# computes relu exactly as act_kernels' act_fwd does from y (LD, the same select, ST), so the twin holds the bits the
# ReLU kernel would write from y, NaN included.  Absent (TWIN 0), the kernels' text after preprocessing is unchanged.
TWIN_HEADER = r"""
#ifndef TWIN
#define TWIN 0
#endif
#if TWIN
#if RELU
#error "TWIN: y is batch norm's own output (no fused ReLU)"
#endif
#define TWIN_PARAM , T* __restrict__ twin
__device__ __forceinline__ T relu_of_stored(T h)
{
    const A v = LD(h);
    return ST(v > (A)0 ? v : (v != v ? v : (A)0));
}
// relu of the VEC values of y's vector o, as stored, to the twin at `at` with the kernel's own vector store
#define STORE_TWIN(store, at, o) do { Pack r_; _Pragma("unroll") for (int e_ = 0; e_ < VEC; ++e_) \
    r_.v[e_] = relu_of_stored((o).v[e_]); store(at, r_); } while (0)
#else
#define TWIN_PARAM
#endif
"""

# The forward's arithmetic, written once for the channels-last kernels here and bn_kernels' channels-first ones (a fix
# in one copy and not the other was the risk of two texts): a channel's statistics from its shifted totals, and one
# value of the elementwise pass.  Macros, not functions: inlined device functions compiled the same arithmetic with
# the FMA's factors swapped and address arithmetic moved (another PTX); as macros, each kernel's text after
# preprocessing is the one it carried before, so its PTX is the same.  Each source includes them after its own
# T / A / P / LD / ST.
BN_FINALISE = r"""
// Channel c's statistics from its totals over M values shifted by its first value X0 (read after the totals):
// t1 = sum(x - X0), t2 = sum((x - X0)^2) -- mean and 1 / sqrt(var + eps) with the biased variance, and under
// has_running the running statistics moved by `factor` toward the mean and the unbiased variance, as PyTorch's.
// Statements (declaring m, md, var, mean) over the caller's t1, t2, mean_out, inv_std_out, running_mean, running_var,
// factor, eps and has_running.
#define BN_FINALISE(c, M, X0)                                                                                   \
    const double m = M;                                                                                        \
    const double md = t1 / m;                                                                                  \
    const double var = fmax(t2 / m - md * md, 0.0);                                                            \
    const double mean = (double)LD(X0) + md;                                                                   \
    mean_out[c] = (A)mean;                                                                                     \
    inv_std_out[c] = (A)(1.0 / sqrt(var + eps));                                                               \
    if (has_running) {                                                                                         \
        running_mean[c] = (P)((1.0 - factor) * (double)running_mean[c] + factor * mean);                       \
        running_var[c] = (P)((1.0 - factor) * (double)running_var[c] + factor * var * m / (m - 1.0));          \
    }
"""
BN_OUT = r"""
// OUT = act((X - MU) * KK + BB [+ Z]) of one value (KK = scale / std): BB only under HAS_BIAS, Z read only under
// HAS_Z, the ReLU keeping NaN as numpy's maximum.
#if RELU
#define BN_RELU(w) w = w > (A)0 ? w : (w != w ? w : (A)0);
#else
#define BN_RELU(w)
#endif
#define BN_OUT(OUT, X, Z, MU, KK, BB) {                                                                        \
    A w = (LD(X) - MU) * KK;                                                                                   \
    if (HAS_BIAS) w += BB;                                                                                     \
    if (HAS_Z) w += LD(Z);                                                                                     \
    BN_RELU(w)                                                                                                 \
    OUT = ST(w);                                                                                               \
}
"""

# Storage of the data: storage.STORAGE_HEADER (T the stored type, LD / ST convert to and from A; 16-bit data as raw
# bits converted with PTX), then P, the parameters' type, and VT: a vector of VBYTES bytes (VEC values).
HEADER = STORAGE_HEADER + r"""
typedef PARAM P;
#if VBYTES == 16
typedef uint4 VT;
#elif VBYTES == 8
typedef uint2 VT;
#elif VBYTES == 4
typedef unsigned int VT;
#else
typedef unsigned short VT;
#endif
""" + TWIN_HEADER

SOURCE = HEADER + r"""
// STOP (tools/bn_nhwc_s7.py's phase timing only; 0 otherwise): the one-launch kernels return after the block's
// partial (1: the reduction pass alone) or after the meeting (2: everything but the elementwise pass).
#ifndef STOP
#define STOP 0
#endif
// KEEP (session 12, MINIDNN_BN_NHWC_KEEP; the on-chip copy's one-launch kernels where the call's data exceeds L2):
// the loads' L2 eviction policies (ldp below).
#ifndef KEEP
#define KEEP 0
#endif
// SPLIT (session 17, MINIDNN_BN_NHWC_SPLIT; the one-launch kernels where split_call says): meet_split below.
#ifndef SPLIT
#define SPLIT 0
#endif
union Pack { VT raw; T v[VEC]; };
""" + BN_FINALISE + BN_OUT + r"""
// first reads: plain loads (they fill L2); last reads: streaming ("last use") loads; outputs: streaming stores
__device__ __forceinline__ Pack ld1(const T* p) { Pack r; r.raw = *reinterpret_cast<const VT*>(p); return r; }
__device__ __forceinline__ Pack ld2(const T* p) { Pack r; r.raw = __ldcs(reinterpret_cast<const VT*>(p)); return r; }
__device__ __forceinline__ void st2(T* p, const Pack& v) { __stcs(reinterpret_cast<VT*>(p), v.raw); }
#if KEEP
// KEEP: a load with an L2 eviction policy (createpolicy's 64-bit descriptor; sm_80+): evict-first, or for the tail of
// the reduction pass evict-last / evict-normal.  On a hit the policy replaces the line's priority (evict_unchanged is
// the policy that would not), so the elementwise pass's evict-first loads hand the kept lines back as they read them.
__device__ __forceinline__ unsigned long long policy(int which)   // 0 evict-first, 1 evict-normal, 2 evict-last
{
    unsigned long long p;
    if (which == 2) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    else if (which == 1) asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
    else asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ Pack ldp(const T* p, unsigned long long pol)
{
    Pack r;
#if VBYTES == 16
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.raw.x), "=r"(r.raw.y), "=r"(r.raw.z), "=r"(r.raw.w) : "l"(p), "l"(pol));
#elif VBYTES == 8
    asm volatile("ld.global.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
                 : "=r"(r.raw.x), "=r"(r.raw.y) : "l"(p), "l"(pol));
#elif VBYTES == 4
    asm volatile("ld.global.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(r.raw) : "l"(p), "l"(pol));
#else
    asm volatile("ld.global.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(r.raw) : "l"(p), "l"(pol));
#endif
    return r;
}
#endif

#if ACC_DOUBLE
typedef double2 A2;
#else
typedef float2 A2;
#endif

// The geometry every kernel takes (by value): rows, channels, vectors per row, threads per row of a block, rows of
// threads, row groups.
// (Passed as six ints: one kernel parameter per packed argument, as launch.py packs them.)
struct Geo { int R, C, CV, TX, RB, NG; };
#define GEO_PARAMS const int R, const int C, const int CV, const int TX, const int RB, const int NG

// This thread's place: vector column, first channel, and whether it owns a vector at all (ty < RB, vcol < CV).
struct Lane { int tx, ty, vcol, c0; bool on; };
__device__ __forceinline__ Lane lane_of(const Geo& g)
{
    Lane l;
    l.tx = threadIdx.x % g.TX; l.ty = threadIdx.x / g.TX;
    l.vcol = blockIdx.y * g.TX + l.tx;
    l.c0 = l.vcol * VEC;
    l.on = l.ty < g.RB && l.vcol < g.CV;
    return l;
}

// Walk this block's row groups (U in flight): f(off[u]) with the element offset of the thread's vector in
// each row, -1 where the row does not exist.  REV: groups in mirrored order (NG - 1 - g).
template <bool REV, int U, class F>
__device__ __forceinline__ void walk(const Geo& g, const Lane& l, F f)
{
    if (!l.on) return;
    const unsigned int G = gridDim.x, NG = (unsigned int)g.NG;
    for (unsigned int g0 = blockIdx.x; g0 < NG; g0 += U * G) {
        int off[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const unsigned int gg = g0 + u * G;
            const unsigned int grp = REV ? NG - 1u - gg : gg;
            const unsigned int r = grp * (unsigned int)g.RB + (unsigned int)l.ty;
            off[u] = gg < NG && r < (unsigned int)g.R ? (int)((r * (unsigned int)g.CV + l.vcol) * VEC) : -1;
        }
        f(off);
    }
}

#if V2
// Sum v over the block's RB rows of threads (V2, session 7): every thread stores its 2 * VEC sums value-major,
// red[i][tid] with i = 2 * e + s (a warp's store is 32 consecutive words: no bank conflict), one barrier, then
// output o = i * TX + tx (channel chunk + tx * VEC + e, sum s; O = 2 * VEC * TX outputs) is added by S adjacent
// lanes (S = the largest power of two <= 256 / O, at most 32; 1 where O > 256, each thread then taking outputs
// t, t + 256, ...): lane j adds rows j, j + S, ... in order, a butterfly over the S lanes adds those, and lane 0 of
// the S writes partial[blockIdx.x][c][s].  A fixed order: the same bits at every call.
// (V1's tree below stored each thread's sums at a 16 * VEC-byte stride -- a 16-way bank conflict on every access
// for 16-bit data -- through log2(RB) barriers: ~8K shared-memory cycles per block at C = 16 bfloat16.)
// (red: at file scope, so that stage_pair below reuses it after the meeting.)
__shared__ A bp_red[2 * VEC][256];
__device__ __forceinline__ void block_partial(const Geo& g, const Lane& l, A (&v)[VEC][2], A* __restrict__ partial)
{
    A (&red)[2 * VEC][256] = bp_red;
#pragma unroll
    for (int e = 0; e < VEC; ++e) { red[2 * e][threadIdx.x] = v[e][0]; red[2 * e + 1][threadIdx.x] = v[e][1]; }
    __syncthreads();
    const int O = 2 * VEC * g.TX;
    int S = 1;
    while (S < 32 && 2 * S * O <= 256) S <<= 1;
    const int j = threadIdx.x & (S - 1);
    for (int o0 = 0; o0 < O; o0 += 256 / S) {          // the same trip count in every thread (shuffles below)
        const int o = o0 + (int)threadIdx.x / S;
        const int i = o / g.TX, tx = o - i * g.TX;
        A t = 0;
        if (o < O)
            for (int r = j; r < g.RB; r += S) t += red[i][r * g.TX + tx];
        for (int m = S >> 1; m > 0; m >>= 1) t += __shfl_xor_sync(0xffffffffu, t, m);
        const int vcol = blockIdx.y * g.TX + tx;
        if (j == 0 && o < O && vcol < g.CV)
            partial[((long long)blockIdx.x * g.C + vcol * VEC + (i >> 1)) * 2 + (i & 1)] = t;
    }
}
#else
// Sum v over the block's RB rows of threads (a fixed-order tree; RB need not be a power of two); row 0 writes the
// block's partial sums of its channels to partial[blockIdx.x][c][2].
__device__ __forceinline__ void block_partial(const Geo& g, const Lane& l, A (&v)[VEC][2], A* __restrict__ partial)
{
    __shared__ A red[256][VEC][2];
#pragma unroll
    for (int e = 0; e < VEC; ++e) { red[threadIdx.x][e][0] = v[e][0]; red[threadIdx.x][e][1] = v[e][1]; }
    __syncthreads();
    int p = 1;
    while (p < g.RB) p <<= 1;
    for (int h = p >> 1; h > 0; h >>= 1) {
        if (l.ty < h && l.ty + h < g.RB) {
            const int o = threadIdx.x + h * g.TX;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                red[threadIdx.x][e][0] += red[o][e][0]; red[threadIdx.x][e][1] += red[o][e][1];
            }
        }
        __syncthreads();
    }
    if (l.ty == 0 && l.vcol < g.CV) {
        A2* q = reinterpret_cast<A2*>(partial) + (long long)blockIdx.x * g.C + l.c0;
#pragma unroll
        for (int e = 0; e < VEC; ++e) { A2 t; t.x = red[threadIdx.x][e][0]; t.y = red[threadIdx.x][e][1]; q[e] = t; }
    }
}

#endif

// Every thread fences its own partial stores, then the block takes its arrival ticket; true in the chunk's last block.
__device__ __forceinline__ bool arrive(unsigned int* ticket)
{
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// In the chunk's last block (all threads call it): per channel of the chunk, the totals in double of the G
// partials, in a fixed order -- thread (q, k) takes partials q, q + QN, ... of channel k (CB loads in flight: 8,
// 16 with V2 in float: MobileNet's C = 128 at 8 x 8 gives 64 partials a thread, 8 round trips to L2 at 8), then a tree
// over q -- and fin(c, t1, t2) once per channel.
#define CB (V2 && !ACC_DOUBLE ? 16 : 8)
template <int NB, class Fin>
__device__ __forceinline__ void combine_n(const Geo& g, const A* __restrict__ partial, Fin fin)
{
    __shared__ double sd[256][2];
    const int cbeg = blockIdx.y * g.TX * VEC, cend = min(g.C, cbeg + g.TX * VEC);
    int kw = 1;
    while (kw < cend - cbeg && kw < 256) kw <<= 1;
    const int qn = 256 / kw, k = threadIdx.x % kw, q = threadIdx.x / kw;
    const int G = gridDim.x;
    const A2* pp = reinterpret_cast<const A2*>(partial);
    for (int cb = cbeg; cb < cend; cb += kw) {
        const int c = cb + k;
        double a1 = 0, a2 = 0;
        if (c < cend) {
            for (int b = q; b < G; b += NB * qn) {
                A2 t[NB];
#pragma unroll
                for (int u = 0; u < NB; ++u) if (b + u * qn < G) t[u] = __ldcg(pp + (long long)(b + u * qn) * g.C + c);
#pragma unroll
                for (int u = 0; u < NB; ++u) if (b + u * qn < G) { a1 += (double)t[u].x; a2 += (double)t[u].y; }
            }
        }
        sd[threadIdx.x][0] = a1; sd[threadIdx.x][1] = a2;
        __syncthreads();
        for (int h = qn >> 1; h > 0; h >>= 1) {
            if (q < h) {
                sd[threadIdx.x][0] += sd[threadIdx.x + h * kw][0]; sd[threadIdx.x][1] += sd[threadIdx.x + h * kw][1];
            }
            __syncthreads();
        }
        if (q == 0 && c < cend) fin(c, sd[threadIdx.x][0], sd[threadIdx.x][1]);
        __syncthreads();
    }
}

template <class Fin>
__device__ __forceinline__ void combine(const Geo& g, const A* __restrict__ partial, Fin fin)
{
    combine_n<CB>(g, partial, fin);
}

#define STAGED (V2 && STAGE)
#if STAGED
// The chunk's per-channel pairs (a[c * stride], b[c * stride]) after the meeting (STAGE, the default with V2): each
// value loaded from L2 once per block -- consecutive threads taking consecutive channels -- into block_partial's
// buffer, finished with by then (arrive's barrier follows its last read), at bp_red[2 * e + k][tx] for channel
// chunk + tx * VEC + e (k = 0: a, 1: b); after a barrier every thread reads its VEC pairs (consecutive tx:
// consecutive words, no bank conflict).  All threads call it.  Before (STAGE = 0) every thread loaded its own VEC
// pairs with __ldcg: up to 2048 warps x 16-32 loads of the same few L2 lines at the same moment -- the suspected
// cause of the slow bfloat16 backward "elementwise" phase of session 7 run 6 (its STOP=2 build drops these loads,
// unused, so the phase split counted them there; STOP=3 below times them apart).
__device__ __forceinline__ void stage_pair(const Geo& g, const Lane& l, const A* a, const A* b, int stride,
                                           A (&x)[VEC], A (&y)[VEC])
{
    A* st = &bp_red[0][0];
    const int cbeg = blockIdx.y * g.TX * VEC, n = min(g.C, cbeg + g.TX * VEC) - cbeg;
    for (int j = threadIdx.x; j < n; j += 256) {
        const int o = 2 * (j % VEC) * g.TX + j / VEC;
        st[o] = __ldcg(a + (long long)(cbeg + j) * stride);
        st[o + g.TX] = __ldcg(b + (long long)(cbeg + j) * stride);
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        x[e] = l.on ? st[2 * e * g.TX + l.tx] : (A)0;
        y[e] = l.on ? st[(2 * e + 1) * g.TX + l.tx] : (A)0;
    }
}
#endif

// STOP == 3 (phase timing only): return after the constants, keeping their loads (a store no input makes true).
#define STOP_AFTER_CONSTANTS(out, ...) \
    if (STOP == 3) { \
        const A* vs_[] = {__VA_ARGS__}; \
        A s_ = 0; \
        for (int i_ = 0; i_ < (int)(sizeof(vs_) / sizeof(vs_[0])); ++i_) \
            for (int e_ = 0; e_ < VEC; ++e_) s_ += vs_[i_][e_]; \
        if (l.on && s_ == (A)-1.25e30) out[l.c0] = ST(s_); \
        return; \
    }

// ---- the passes ------------------------------------------------------------------------------------------------
// Forward reduction: this thread's shifted sums; k[e] = the channel's row-0 value.
__device__ __forceinline__ void fwd_sums(const Geo& g, const Lane& l, const T* __restrict__ x, A (&v)[VEC][2])
{
    A k[VEC];
    Pack k0;
    if (l.on) k0 = ld1(x + l.c0);
#pragma unroll
    for (int e = 0; e < VEC; ++e) { k[e] = l.on ? LD(k0.v[e]) : (A)0; v[e][0] = 0; v[e][1] = 0; }
    walk<false, UNROLL_F>(g, l, [&](const int (&off)[UNROLL_F]) {
        Pack p[UNROLL_F];
#pragma unroll
        for (int u = 0; u < UNROLL_F; ++u) if (off[u] >= 0) p[u] = ld1(x + off[u]);
#pragma unroll
        for (int u = 0; u < UNROLL_F; ++u) {
            if (off[u] < 0) continue;
#pragma unroll
            for (int e = 0; e < VEC; ++e) { const A d = LD(p[u].v[e]) - k[e]; v[e][0] += d; v[e][1] += d * d; }
        }
    });
}

// Forward finalisation of channel c from its totals.
__device__ __forceinline__ void fwd_fin(const Geo& g, const T* __restrict__ x, int c, double t1, double t2,
                                        A* __restrict__ mean_out, A* __restrict__ inv_std_out, P* running_mean,
                                        P* running_var, long long* counter, double factor, double eps,
                                        int has_running, int has_counter)
{
    BN_FINALISE(c, (double)g.R, x[c])
    if (has_counter && c == 0) counter[0] += 1;      // BatchNorm's num_batches_tracked, once per call
}

// y = act((x - mu) * kk + bb [+ z]) over the thread's rows (mirrored order).
__device__ __forceinline__ void fwd_apply(const Geo& g, const Lane& l, const T* __restrict__ x,
                                          const T* __restrict__ z, T* __restrict__ y, const A (&mu)[VEC],
                                          const A (&kk)[VEC], const A (&bb)[VEC])
{
    walk<true, UNROLL>(g, l, [&](const int (&off)[UNROLL]) {
        Pack p[UNROLL], q[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (off[u] >= 0) { p[u] = ld2(x + off[u]); if (HAS_Z) q[u] = ld2(z + off[u]); }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (off[u] < 0) continue;
            Pack o;
#pragma unroll
            for (int e = 0; e < VEC; ++e) BN_OUT(o.v[e], p[u].v[e], q[u].v[e], mu[e], kk[e], bb[e])
            st2(y + off[u], o);
        }
    });
}

// Backward reduction: sum(g), sum(g * xhat) per lane.
__device__ __forceinline__ void bwd_sums(const Geo& g, const Lane& l, const T* __restrict__ x,
                                         const T* __restrict__ dy, const T* __restrict__ y, const A (&mu)[VEC],
                                         const A (&is)[VEC], A (&v)[VEC][2])
{
#pragma unroll
    for (int e = 0; e < VEC; ++e) { v[e][0] = 0; v[e][1] = 0; }
    walk<false, UNROLL>(g, l, [&](const int (&off)[UNROLL]) {
        Pack p[UNROLL], d[UNROLL], r[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (off[u] < 0) continue;
            d[u] = ld1(dy + off[u]); p[u] = ld1(x + off[u]);
            if (RELU) r[u] = ld1(y + off[u]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (off[u] < 0) continue;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                A gv = LD(d[u].v[e]);
                if (RELU && LD(r[u].v[e]) <= (A)0) gv = 0;
                v[e][0] += gv;
                v[e][1] += gv * ((LD(p[u].v[e]) - mu[e]) * is[e]);
            }
        }
    });
}

__device__ __forceinline__ void bwd_fin(const Geo& g, int c, double t1, double t2, A* __restrict__ coef,
                                        P* __restrict__ dscale, P* __restrict__ dbias)
{
    const double m = (double)g.R;
    coef[2 * c] = (A)(t1 / m); coef[2 * c + 1] = (A)(t2 / m);
#if HAS_SCALE
    dbias[c] = (P)t1; dscale[c] = (P)t2;
#endif
}

// dx = kk * (g - c0 - xhat * c1), dz = g over the thread's rows (mirrored order).
__device__ __forceinline__ void bwd_dx(const Geo& g, const Lane& l, const T* __restrict__ x,
                                       const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                       T* __restrict__ dz, const A (&mu)[VEC], const A (&is)[VEC],
                                       const A (&c0)[VEC], const A (&c1)[VEC], const A (&kk)[VEC])
{
    walk<true, UNROLL>(g, l, [&](const int (&off)[UNROLL]) {
        Pack p[UNROLL], d[UNROLL], r[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (off[u] < 0) continue;
            d[u] = ld2(dy + off[u]); p[u] = ld2(x + off[u]);
            if (RELU) r[u] = ld2(y + off[u]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (off[u] < 0) continue;
            Pack o, oz;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                A gv = LD(d[u].v[e]);
                if (RELU && LD(r[u].v[e]) <= (A)0) gv = 0;
                const A xhat = (LD(p[u].v[e]) - mu[e]) * is[e];
                o.v[e] = ST(kk[e] * (gv - c0[e] - xhat * c1[e]));
                if (HAS_Z) oz.v[e] = ST(gv);
            }
            st2(dx + off[u], o);
            if (HAS_Z) st2(dz + off[u], oz);
        }
    });
}

// Per-lane constants of a channel vector (absent channels: 0).
template <class S>
__device__ __forceinline__ void lane_load(const Lane& l, const S* __restrict__ a, A (&out)[VEC], bool cg)
{
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = l.on ? (A)(cg ? __ldcg(a + l.c0 + e) : a[l.c0 + e]) : (A)0;
}

// ---- the on-chip copy (CACHE: the one-launch kernels of MINIDNN_BN_ONCHIP, the default) ----------------------
// A thread's reduction walk is a sequence: its k-th vector (k = 0 .. n - 1) is row (blockIdx.x + k * G) * RB + ty,
// the order walk<false> visits.  With CACHE the one-launch kernels keep the first `ks` vectors of that sequence of
// each cached array -- x forward; x and g (dy, masked by a fused ReLU's y) backward -- in dynamic shared memory
// across the meeting: slot (k, a) of thread tid at cache_sm[(k * NCACHE + a) * 256 + tid] (a warp's 32 slots are
// 512 consecutive bytes: no bank conflicts).  The elementwise pass visits the same vectors: the uncached ones in
// reverse order first (the last ones the reduction read, which L2 still holds), then the cached ones from shared
// memory.  DRAM re-reads only what neither shared memory nor L2 kept (docs/step_kernels.md, "on-chip copy").
#if CACHE
extern __shared__ VT cache_sm[];
#if KEEP
#define CACHE_PARAM , const int ks, const int kl, const int klast
#else
#define CACHE_PARAM , const int ks
#endif
#else
#define CACHE_PARAM
#endif

// KEEP (MINIDNN_BN_NHWC_KEEP): the reduction pass loads its vectors k >= kt = max(ks, n - kl) -- the newest kl
// uncached ones of its walk, which the elementwise pass reads first -- with the tail policy (the argument klast: 1
// evict-last, 0 evict-normal), every other vector evict-first (the copy's slots are never read from memory again,
// the middle comes from DRAM again anyway: neither should push the tail out of L2); the elementwise pass loads
// evict-first (a hit demotes the kept line: nothing stays evict-last after the kernel).  Without KEEP an empty Pol
// and the loads before it.
#if KEEP
struct Pol { int kt; unsigned long long tail, first; };
#define LD_P1(ptr, k) ldp((ptr), (k) >= pol.kt ? pol.tail : pol.first)
#define LD_P2(ptr) ldp((ptr), pol.first)
#else
struct Pol { };
#define LD_P1(ptr, k) ld1(ptr)
#define LD_P2(ptr) ld2(ptr)
#endif

__device__ __forceinline__ int seq_len(const Geo& g)
{
    return (int)blockIdx.x < g.NG ? (g.NG - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
}

// element offset of the thread's k-th vector (0 <= k < seq_len), -1 where its row does not exist (the last group)
__device__ __forceinline__ int seq_off(const Geo& g, const Lane& l, int k)
{
    const unsigned int r = (blockIdx.x + (unsigned int)k * gridDim.x) * (unsigned int)g.RB + (unsigned int)l.ty;
    return r < (unsigned int)g.R ? (int)((r * (unsigned int)g.CV + l.vcol) * VEC) : -1;
}

// Visit k = kb .. ke - 1 (REV: ke - 1 down to kb), U at a time: f(off[U], kk[U]); kk = -1 past the range.
template <int U, bool REV, class F>
__device__ __forceinline__ void seq_walk(const Geo& g, const Lane& l, int kb, int ke, F f)
{
    if (!l.on) return;
    for (int i = 0; i < ke - kb; i += U) {
        int off[U], kk[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const bool in = i + u < ke - kb;
            const int k = REV ? ke - 1 - (i + u) : kb + i + u;
            kk[u] = in ? k : -1;
            off[u] = in ? seq_off(g, l, k) : -1;
        }
        f(off, kk);
    }
}

#if CACHE
// Forward reduction (the order and sums of fwd_sums), keeping the first ks vectors of x.
__device__ __forceinline__ void fwd_sums_c(const Geo& g, const Lane& l, const T* __restrict__ x, A (&v)[VEC][2],
                                           int ks, const Pol& pol)
{
    A k[VEC];
    Pack k0;
    if (l.on) k0 = ld1(x + l.c0);
#pragma unroll
    for (int e = 0; e < VEC; ++e) { k[e] = l.on ? LD(k0.v[e]) : (A)0; v[e][0] = 0; v[e][1] = 0; }
    seq_walk<UNROLL_F, false>(g, l, 0, seq_len(g), [&](const int (&off)[UNROLL_F], const int (&kk)[UNROLL_F]) {
        Pack p[UNROLL_F];
#pragma unroll
        for (int u = 0; u < UNROLL_F; ++u) if (off[u] >= 0) p[u] = LD_P1(x + off[u], kk[u]);
#pragma unroll
        for (int u = 0; u < UNROLL_F; ++u) {
            if (off[u] < 0) continue;
            if (kk[u] < ks) cache_sm[kk[u] * 256 + threadIdx.x] = p[u].raw;
#pragma unroll
            for (int e = 0; e < VEC; ++e) { const A d = LD(p[u].v[e]) - k[e]; v[e][0] += d; v[e][1] += d * d; }
        }
    });
}

// y = act((x - mu) * kk + bb [+ z]) for U vectors of x already loaded.
__device__ __forceinline__ void fwd_out(const int (&off)[UNROLL], const Pack (&p)[UNROLL], const T* __restrict__ z,
                                        T* __restrict__ y, const A (&mu)[VEC], const A (&kk)[VEC], const A (&bb)[VEC]
                                        TWIN_PARAM)
{
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
        for (int e = 0; e < VEC; ++e) BN_OUT(o.v[e], p[u].v[e], q[u].v[e], mu[e], kk[e], bb[e])
        st2(y + off[u], o);
#if TWIN
        STORE_TWIN(st2, twin + off[u], o);
#endif
    }
}

#if TWIN
#define TWIN_ARG , twin
#else
#define TWIN_ARG
#endif

// The elementwise pass over the same vectors: uncached ones newest first (L2), then the cached ones.
__device__ __forceinline__ void fwd_apply_c(const Geo& g, const Lane& l, const T* __restrict__ x,
                                            const T* __restrict__ z, T* __restrict__ y, const A (&mu)[VEC],
                                            const A (&kk)[VEC], const A (&bb)[VEC], int ks, const Pol& pol
                                            TWIN_PARAM)
{
    const int n = seq_len(g), kc = min(ks, n);
    seq_walk<UNROLL, true>(g, l, kc, n, [&](const int (&off)[UNROLL], const int (&)[UNROLL]) {
        Pack p[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) if (off[u] >= 0) p[u] = LD_P2(x + off[u]);
        fwd_out(off, p, z, y, mu, kk, bb TWIN_ARG);
    });
    seq_walk<UNROLL, false>(g, l, 0, kc, [&](const int (&off)[UNROLL], const int (&k)[UNROLL]) {
        Pack p[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) if (off[u] >= 0) p[u].raw = cache_sm[k[u] * 256 + threadIdx.x];
        fwd_out(off, p, z, y, mu, kk, bb TWIN_ARG);
    });
}

// Backward reduction (the order and sums of bwd_sums), keeping x and g (dy masked by y > 0 after a fused ReLU: the
// mask is applied once, here) of the first ks vectors.
__device__ __forceinline__ void bwd_sums_c(const Geo& g, const Lane& l, const T* __restrict__ x,
                                           const T* __restrict__ dy, const T* __restrict__ y, const A (&mu)[VEC],
                                           const A (&is)[VEC], A (&v)[VEC][2], int ks, const Pol& pol)
{
#pragma unroll
    for (int e = 0; e < VEC; ++e) { v[e][0] = 0; v[e][1] = 0; }
    seq_walk<UNROLL, false>(g, l, 0, seq_len(g), [&](const int (&off)[UNROLL], const int (&kk)[UNROLL]) {
        Pack p[UNROLL], d[UNROLL], r[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (off[u] < 0) continue;
            d[u] = LD_P1(dy + off[u], kk[u]); p[u] = LD_P1(x + off[u], kk[u]);
            if (RELU) r[u] = LD_P1(y + off[u], kk[u]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (off[u] < 0) continue;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                A gv = LD(d[u].v[e]);
                if (RELU && LD(r[u].v[e]) <= (A)0) { gv = 0; d[u].v[e] = ST((A)0); }
                v[e][0] += gv;
                v[e][1] += gv * ((LD(p[u].v[e]) - mu[e]) * is[e]);
            }
            if (kk[u] < ks) {
                cache_sm[(2 * kk[u]) * 256 + threadIdx.x] = p[u].raw;
                cache_sm[(2 * kk[u] + 1) * 256 + threadIdx.x] = d[u].raw;
            }
        }
    });
}

// dx = kk * (g - c0 - xhat * c1), dz = g for U vectors of x, dy (y) already loaded; MASK: g = dy masked by y > 0
// here (from memory), else d holds g already (from the cache).
template <bool MASK>
__device__ __forceinline__ void bwd_out(const int (&off)[UNROLL], const Pack (&p)[UNROLL], const Pack (&d)[UNROLL],
                                        const Pack (&r)[UNROLL], T* __restrict__ dx, T* __restrict__ dz,
                                        const A (&mu)[VEC], const A (&is)[VEC], const A (&c0)[VEC],
                                        const A (&c1)[VEC], const A (&kk)[VEC])
{
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        if (off[u] < 0) continue;
        Pack o, oz;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            A gv = LD(d[u].v[e]);
            if (MASK && RELU && LD(r[u].v[e]) <= (A)0) gv = 0;
            const A xhat = (LD(p[u].v[e]) - mu[e]) * is[e];
            o.v[e] = ST(kk[e] * (gv - c0[e] - xhat * c1[e]));
            if (HAS_Z) oz.v[e] = ST(gv);
        }
        st2(dx + off[u], o);
        if (HAS_Z) st2(dz + off[u], oz);
    }
}

__device__ __forceinline__ void bwd_dx_c(const Geo& g, const Lane& l, const T* __restrict__ x,
                                         const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                         T* __restrict__ dz, const A (&mu)[VEC], const A (&is)[VEC],
                                         const A (&c0)[VEC], const A (&c1)[VEC], const A (&kk)[VEC], int ks,
                                         const Pol& pol)
{
    const int n = seq_len(g), kc = min(ks, n);
    seq_walk<UNROLL, true>(g, l, kc, n, [&](const int (&off)[UNROLL], const int (&)[UNROLL]) {
        Pack p[UNROLL], d[UNROLL], r[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (off[u] < 0) continue;
            d[u] = LD_P2(dy + off[u]); p[u] = LD_P2(x + off[u]);
            if (RELU) r[u] = LD_P2(y + off[u]);
        }
        bwd_out<true>(off, p, d, r, dx, dz, mu, is, c0, c1, kk);
    });
    seq_walk<UNROLL, false>(g, l, 0, kc, [&](const int (&off)[UNROLL], const int (&k)[UNROLL]) {
        Pack p[UNROLL], d[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (off[u] < 0) continue;
            p[u].raw = cache_sm[(2 * k[u]) * 256 + threadIdx.x];
            d[u].raw = cache_sm[(2 * k[u] + 1) * 256 + threadIdx.x];
        }
        bwd_out<false>(off, p, d, d, dx, dz, mu, is, c0, c1, kk);
    });
}
#endif

// ---- two-launch kernels --------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(256, BPS)
bnc_stats(const T* __restrict__ x, A* __restrict__ partial, unsigned int* ticket, A* __restrict__ mean_out,
          A* __restrict__ inv_std_out, P* running_mean, P* running_var, long long* counter, GEO_PARAMS,
          const double factor, const double eps, const int has_running, const int has_counter)
{
    const Geo g = {R, C, CV, TX, RB, NG};
    const Lane l = lane_of(g);
    A v[VEC][2];
    fwd_sums(g, l, x, v);
    block_partial(g, l, v, partial);
    if (!arrive(ticket + blockIdx.y)) return;
    combine(g, partial, [&](int c, double t1, double t2) {
        fwd_fin(g, x, c, t1, t2, mean_out, inv_std_out, running_mean, running_var, counter, factor, eps,
                has_running, has_counter); });
    if (threadIdx.x == 0) ticket[blockIdx.y] = 0u;
}

// y = act((x - mean) * inv * scale + bias [+ z]); FROM_VAR (inference): inv = 1 / sqrt(stat2 + eps), stat1/2 the
// running statistics (P); else stat1/2 = mean, inv_std (A).
extern "C" __global__ void __launch_bounds__(256, BPS)
bnc_apply(const T* __restrict__ x, const T* __restrict__ z, T* __restrict__ y, const void* stat1, const void* stat2,
          const P* __restrict__ scale, const P* __restrict__ bias, GEO_PARAMS, const double eps)
{
#if FROM_VAR
    typedef P S;
#else
    typedef A S;
#endif
    const Geo g = {R, C, CV, TX, RB, NG};
    const Lane l = lane_of(g);
    A mu[VEC], kk[VEC], bb[VEC];
    lane_load(l, (const S*)stat1, mu, false);
    lane_load(l, (const S*)stat2, kk, false);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
#if FROM_VAR
        kk[e] = (A)1 / sqrt(kk[e] + (A)eps);
#endif
        if (HAS_SCALE && l.on) kk[e] *= (A)scale[l.c0 + e];
        bb[e] = HAS_BIAS && l.on ? (A)bias[l.c0 + e] : (A)0;
    }
    fwd_apply(g, l, x, z, y, mu, kk, bb);
}

extern "C" __global__ void __launch_bounds__(256, BPS)
bnc_grad(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y, const A* __restrict__ mean,
         const A* __restrict__ inv_std, A* __restrict__ partial, unsigned int* ticket, A* __restrict__ coef,
         P* __restrict__ dscale, P* __restrict__ dbias, GEO_PARAMS)
{
    const Geo g = {R, C, CV, TX, RB, NG};
    const Lane l = lane_of(g);
    A mu[VEC], is[VEC], v[VEC][2];
    lane_load(l, mean, mu, false);
    lane_load(l, inv_std, is, false);
    bwd_sums(g, l, x, dy, y, mu, is, v);
    block_partial(g, l, v, partial);
    if (!arrive(ticket + blockIdx.y)) return;
    combine(g, partial, [&](int c, double t1, double t2) { bwd_fin(g, c, t1, t2, coef, dscale, dbias); });
    if (threadIdx.x == 0) ticket[blockIdx.y] = 0u;
}

extern "C" __global__ void __launch_bounds__(256, BPS)
bnc_dx(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y, const A* __restrict__ mean,
       const A* __restrict__ inv_std, const A* __restrict__ coef, const P* __restrict__ scale, T* __restrict__ dx,
       T* __restrict__ dz, GEO_PARAMS)
{
    const Geo g = {R, C, CV, TX, RB, NG};
    const Lane l = lane_of(g);
    A mu[VEC], is[VEC], c0[VEC], c1[VEC], kk[VEC];
    lane_load(l, mean, mu, false);
    lane_load(l, inv_std, is, false);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        c0[e] = l.on ? coef[2 * (l.c0 + e)] : (A)0;
        c1[e] = l.on ? coef[2 * (l.c0 + e) + 1] : (A)0;
        kk[e] = HAS_SCALE && l.on ? is[e] * (A)scale[l.c0 + e] : is[e];
    }
    bwd_dx(g, l, x, dy, y, dx, dz, mu, is, c0, c1, kk);
}

// ---- one-launch kernels ----------------------------------------------------------------------------------------
// After the partials: the chunk's last block combines and raises the flag (sync[3 * chunk + 1]); the others wait.
// sync[3 * chunk ...]: arrivals, flag, departures.  Every block of the grid is resident (the host sizes the grid by
// the driver's occupancy), so the wait ends.
template <int NB, class Fin>
__device__ __forceinline__ void meet(const Geo& g, const A* __restrict__ partial, unsigned int* sync, Fin fin)
{
    unsigned int* s = sync + 3 * blockIdx.y;
    if (arrive(s)) {
        combine_n<NB>(g, partial, fin);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) atomicExch(s + 1, 1u);
    } else {
        if (threadIdx.x == 0) {
            while (*(volatile unsigned int*)(s + 1) == 0u) __nanosleep(64);
            __threadfence();
        }
        __syncthreads();
    }
}

// After every thread has read the chunk's results: the last block to leave resets the counters.
__device__ __forceinline__ void depart(unsigned int* sync)
{
    unsigned int* s = sync + 3 * blockIdx.y;
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(s + 2, 1u) == gridDim.x - 1) { s[0] = 0u; s[1] = 0u; s[2] = 0u; }
}

#if SPLIT
#if !V2
#error "SPLIT: stages the partials in V2's block_partial buffer"
#endif
// SPLIT (session 17, MINIDNN_BN_NHWC_SPLIT; docs/step_kernels.md, "Session 17: channels-last batch norm at wide C"):
// the meeting with the combine spread over the chunk's G blocks instead of the last one to arrive.  meet's one
// combiner takes G / qn partials a thread in batches of CB loads: at C = 256 (kw = 256, qn = 1) and G = 264 that is
// 264 loads in 17 dependent round trips to L2 (~11 us, the whole gap to C = 32 in session 17's table).  Here:
//   barrier 1 (sync[3y]: arrivals; every block waits for all G -- the grid is resident, as meet already needs);
//   combine_split: block b takes channels base = b * P ... (P a block at once, rounds of G * P), stages their G
//     partials from L2 into bp_red (free again: block_partial is done) -- all 256 threads, a few loads each, one
//     round trip -- then group i of qn threads (channel base + i) adds them exactly as combine_n does: lane j the
//     partials j, j + qn, ... in order in double, then the same tree over j; lane 0 finalises the channel;
//   barrier 2 (sync[3y + 1]: blocks done combining; every block waits for all G), then the constants as before.
// The same sums in the same order as combine_n: the same bits.  depart (sync[3y + 2]) resets the three counters.
// Buffer: bp_red's 2 * VEC * 256 values hold VEC * 256 pairs, x values in the first half, y values in the second;
// the host plans SPLIT only where G <= VEC * 256 (split_call), so P >= 1.
template <class Fin>
__device__ __forceinline__ void combine_split(const Geo& g, const A* __restrict__ partial, Fin fin)
{
    __shared__ double sd[256][2];
    A* st1 = &bp_red[0][0];
    A* st2 = st1 + VEC * 256;
    const int cbeg = blockIdx.y * g.TX * VEC, nch = min(g.C, cbeg + g.TX * VEC) - cbeg;
    int kw = 1;
    while (kw < nch && kw < 256) kw <<= 1;
    const int qn = 256 / kw, G = gridDim.x;
    const int P = min(min(kw, VEC * 256 / G), (nch + G - 1) / G);
    if (P < 1) __trap();                                // (split_call's promise: G <= VEC * 256)
    const int i = threadIdx.x / qn, j = threadIdx.x - i * qn;
    const A2* pp = reinterpret_cast<const A2*>(partial);
    for (int base = blockIdx.x * P; base < nch; base += G * P) {
        const int np = min(P, nch - base), n = G * np;
        for (int t0 = 0; t0 < n; t0 += 4 * 256) {       // 4 loads in flight a thread: 1-2 trips at G * np <= 2048
            A2 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int t = t0 + u * 256 + (int)threadIdx.x, b = t / np;
                if (t < n) v[u] = __ldcg(pp + (long long)b * g.C + cbeg + base + (t - b * np));
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int t = t0 + u * 256 + (int)threadIdx.x, b = t / np, k = t - b * np;
                if (t < n) { st1[k * G + b] = v[u].x; st2[k * G + b] = v[u].y; }
            }
        }
        __syncthreads();
        // (8 shared loads ahead of the adds: the chain of double adds, in combine_n's order, is the critical path;
        // a load's latency would otherwise sit in every link)
        double a1 = 0, a2 = 0;
        if (i < np)
            for (int b0 = j; b0 < G; b0 += 8 * qn) {
                A v1[8], v2[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const int b = b0 + u * qn;
                    v1[u] = b < G ? st1[i * G + b] : (A)0; v2[u] = b < G ? st2[i * G + b] : (A)0;
                }
#pragma unroll
                for (int u = 0; u < 8; ++u) if (b0 + u * qn < G) { a1 += (double)v1[u]; a2 += (double)v2[u]; }
            }
        sd[threadIdx.x][0] = a1; sd[threadIdx.x][1] = a2;
        __syncthreads();
        for (int h = qn >> 1; h > 0; h >>= 1) {
            if (j < h) { sd[threadIdx.x][0] += sd[threadIdx.x + h][0]; sd[threadIdx.x][1] += sd[threadIdx.x + h][1]; }
            __syncthreads();
        }
        if (j == 0 && i < np) fin(cbeg + base + i, sd[threadIdx.x][0], sd[threadIdx.x][1]);
        __syncthreads();
    }
}

// Every block: its partial stores fenced, then wait at counter `at` for the chunk's G blocks.
__device__ __forceinline__ void grid_wait(unsigned int* at)
{
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(at, 1u);
        while (*(volatile unsigned int*)at < gridDim.x) __nanosleep(64);
        __threadfence();
    }
    __syncthreads();
}

template <class Fin>
__device__ __forceinline__ void meet_split(const Geo& g, const A* __restrict__ partial, unsigned int* sync, Fin fin)
{
    unsigned int* s = sync + 3 * blockIdx.y;
    grid_wait(s);
    combine_split(g, partial, fin);
    grid_wait(s + 1);
}
#define MEET(...) meet_split(__VA_ARGS__)
#else
#define MEET(...) meet<CB>(__VA_ARGS__)
#endif

extern "C" __global__ void __launch_bounds__(256, BPS)
bnc_fwd1(const T* __restrict__ x, const T* __restrict__ z, T* __restrict__ y, A* __restrict__ partial,
         unsigned int* sync, A* __restrict__ mean_out, A* __restrict__ inv_std_out, const P* __restrict__ scale,
         const P* __restrict__ bias, P* running_mean, P* running_var, long long* counter TWIN_PARAM, GEO_PARAMS,
         const double factor, const double eps, const int has_running, const int has_counter CACHE_PARAM)
{
#if TWIN && !CACHE
#error "TWIN: written by the on-chip copy's elementwise pass (fwd_apply_c)"
#endif
    const Geo g = {R, C, CV, TX, RB, NG};
    const Lane l = lane_of(g);
#if CACHE && KEEP
    // (the phase builds keep nothing: they return before the elementwise pass would hand the lines back, and the
    // next replay's reduction would hit them)
    const Pol pol = {STOP ? seq_len(g) : max(ks, seq_len(g) - kl), policy(klast ? 2 : 1), policy(0)};
#elif CACHE
    const Pol pol = {};
#endif
    {
        A v[VEC][2];
#if CACHE
        fwd_sums_c(g, l, x, v, ks, pol);
#else
        fwd_sums(g, l, x, v);
#endif
        block_partial(g, l, v, partial);
    }
    if (STOP == 1) return;
    MEET(g, partial, sync, [&](int c, double t1, double t2) {
        fwd_fin(g, x, c, t1, t2, mean_out, inv_std_out, running_mean, running_var, counter, factor, eps,
                has_running, has_counter); });
    A mu[VEC], kk[VEC], bb[VEC];
#if STAGED
    stage_pair(g, l, mean_out, inv_std_out, 1, mu, kk);
#else
    lane_load(l, mean_out, mu, true);
    lane_load(l, inv_std_out, kk, true);
#endif
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        if (HAS_SCALE && l.on) kk[e] *= (A)scale[l.c0 + e];
        bb[e] = HAS_BIAS && l.on ? (A)bias[l.c0 + e] : (A)0;
    }
    depart(sync);
    if (STOP == 2) return;
    STOP_AFTER_CONSTANTS(y, mu, kk, bb)
#if CACHE
    fwd_apply_c(g, l, x, z, y, mu, kk, bb, ks, pol TWIN_ARG);
#else
    fwd_apply(g, l, x, z, y, mu, kk, bb);
#endif
}

extern "C" __global__ void __launch_bounds__(256, BPS)
bnc_bwd1(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ y, const A* __restrict__ mean,
         const A* __restrict__ inv_std, A* __restrict__ partial, unsigned int* sync, A* __restrict__ coef,
         P* __restrict__ dscale, P* __restrict__ dbias, const P* __restrict__ scale, T* __restrict__ dx,
         T* __restrict__ dz, GEO_PARAMS CACHE_PARAM)
{
    const Geo g = {R, C, CV, TX, RB, NG};
    const Lane l = lane_of(g);
#if CACHE && KEEP
    // (the phase builds keep nothing: they return before the elementwise pass would hand the lines back, and the
    // next replay's reduction would hit them)
    const Pol pol = {STOP ? seq_len(g) : max(ks, seq_len(g) - kl), policy(klast ? 2 : 1), policy(0)};
#elif CACHE
    const Pol pol = {};
#endif
    A mu[VEC], is[VEC];
    lane_load(l, mean, mu, false);
    lane_load(l, inv_std, is, false);
    {
        A v[VEC][2];
#if CACHE
        bwd_sums_c(g, l, x, dy, y, mu, is, v, ks, pol);
#else
        bwd_sums(g, l, x, dy, y, mu, is, v);
#endif
        block_partial(g, l, v, partial);
    }
    if (STOP == 1) return;
    MEET(g, partial, sync, [&](int c, double t1, double t2) {
        bwd_fin(g, c, t1, t2, coef, dscale, dbias); });
    A c0[VEC], c1[VEC], kk[VEC];
#if STAGED
    // mean, inv_std: this launch's inputs (read-only: the non-coherent cached path, as at the start); coef through
    // shared memory
    lane_load(l, mean, mu, false);
    lane_load(l, inv_std, is, false);
    stage_pair(g, l, coef, coef + 1, 2, c0, c1);
#else
#if V2
    // loaded again (beside coef: no extra round trip), so that they are not live across the combine's 16 loads
    lane_load(l, mean, mu, true);
    lane_load(l, inv_std, is, true);
#endif
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        c0[e] = l.on ? __ldcg(coef + 2 * (l.c0 + e)) : (A)0;
        c1[e] = l.on ? __ldcg(coef + 2 * (l.c0 + e) + 1) : (A)0;
    }
#endif
#pragma unroll
    for (int e = 0; e < VEC; ++e) kk[e] = HAS_SCALE && l.on ? is[e] * (A)scale[l.c0 + e] : is[e];
    depart(sync);
    if (STOP == 2) return;
    STOP_AFTER_CONSTANTS(dx, mu, is, c0, c1, kk)
#if CACHE
    bwd_dx_c(g, l, x, dy, y, dx, dz, mu, is, c0, c1, kk, ks, pol);
#else
    bwd_dx(g, l, x, dy, y, dx, dz, mu, is, c0, c1, kk);
#endif
}
"""

def takes(dtype) -> bool:
    """Whether kernels exist for data of ``dtype`` (the caller, bn_kernels, has validated everything else)."""
    return type_info(dtype) is not None


def vec_width(c, itemsize, ptrs=()):
    """Values per vector: the widest power of two v with v * itemsize <= 16 that divides ``c`` and to whose
    v * itemsize bytes every pointer in ``ptrs`` is aligned (1: the scalar path)."""
    v = 16 // itemsize
    while v > 1 and (c % v or any(p % (v * itemsize) for p in ptrs)):
        v //= 2
    return v


def geometry(rows, c, vec):
    """(CV, chunks, TX, RB, NG): vectors per row, column chunks (gridDim.y), threads per row of a block, rows of
    threads per block, row groups (see the source's legend)."""
    cv = c // vec
    chunks = -(-cv // THREADS)
    tx = -(-cv // chunks)
    rb = THREADS // tx
    return cv, chunks, tx, rb, -(-rows // rb)


def reduce_grid(ng, chunks, blocks):
    """Blocks per chunk of a reduction: at most ``blocks`` over all chunks, and at least UNROLL row groups each
    (fewer blocks for small tensors: the last block's sum over the partials is shorter)."""
    return max(1, min(blocks // chunks, -(-ng // UNROLL)))


def _options(dtype, vec, **flags):
    scalar, accum, storage, pdt = type_info(dtype)
    item = np.dtype(dtype).itemsize
    opts = [f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}",
            f"-DPARAM={'double' if pdt == np.float64 else 'float'}", f"-DACC_DOUBLE={int(accum == 'double')}",
            f"-DVEC={vec}", f"-DVBYTES={vec * item}", f"-DUNROLL={UNROLL}", f"-DUNROLL_F={UNROLL_F}", f"-DBPS={BPS}",
            f"-DV2={int(bool(flags.get('v2', V2)))}", f"-DSTAGE={int(bool(flags.get('stage', STAGE)))}",
            "-std=c++17"]
    for name in ("RELU", "HAS_Z", "HAS_SCALE", "HAS_BIAS", "FROM_VAR", "CACHE"):
        opts.append(f"-D{name}={int(bool(flags.get(name.lower(), False)))}")
    if flags.get("keep"):                   # session 12's KEEP: absent (the source's 0) unless the call takes it
        opts.append("-DKEEP=1")
    if flags.get("split"):                  # session 17's SPLIT: absent (the source's 0) unless the call takes it
        opts.append("-DSPLIT=1")
    if flags.get("twin"):                   # TWIN_HEADER: absent unless the call asks for relu(y) too
        opts.append("-DTWIN=1")
    if flags.get("stop"):
        opts.append(f"-DSTOP={int(flags['stop'])}")
    return tuple(opts)


_kernels: dict = {}


def _kernel(name, dtype, vec, **flags):
    flags.setdefault("v2", V2)
    flags.setdefault("stage", STAGE)
    key = (name, np.dtype(dtype), vec, tuple(sorted(flags.items())))
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = _launch.get_kernel(SOURCE, name, _options(dtype, vec, **flags))
    return k


_acc, _param = acc_dtype, param_dtype


_tickets: dict = {}


def _ticket(cp, n, dev):
    return _ws.kept_zeroed(_tickets, cp, n, dev, 1024)


def _resident_per_sm(kernel, shared_mem=0):
    """Blocks of ``kernel`` one SM holds at once with ``shared_mem`` bytes of dynamic shared memory each (the
    driver's occupancy), capped at BPS; BPS where the query is unavailable (the launch bounds promise it)."""
    try:
        if shared_mem:
            _launch._opt_in(kernel, shared_mem)
        occ = _launch.cupy().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, THREADS,
                                                                                   int(shared_mem))
        return max(0, min(BPS, int(occ)))
    except Exception:       # noqa: BLE001 -- an old CuPy or a fake one: the launch bounds' promise
        return BPS


def static_smem(kernel, estimate):
    """The kernel's static shared memory (the driver's attribute), ``estimate`` where it cannot be read."""
    try:
        return int(kernel.attributes["shared_size_bytes"])
    except Exception:       # noqa: BLE001 -- a fake CuPy
        return int(estimate)


def cache_slots(per_sm, per_block, static, bps, slot_bytes):
    """Slots of ``slot_bytes`` one block can keep in dynamic shared memory: the SM's shared memory split over
    ``bps`` blocks (the driver reserves 1 KiB of it per block) less the kernel's static shared memory, within the
    per-block limit."""
    if per_sm <= 0:
        return 0
    return max(0, (min(per_block, per_sm // bps - 1024) - static) // slot_bytes)


def _geo_args(rows, c, vec):
    cv, chunks, tx, rb, ng = geometry(rows, c, vec)
    return [np.int32(rows), np.int32(c), np.int32(cv), np.int32(tx), np.int32(rb), np.int32(ng)], chunks, ng


def keep_steps(l2_bytes, frac, step_bytes, n, ks):
    """KEEP's kl: the reduction's newest steps of the re-read arrays (``step_bytes`` a step over the grid) that fill
    ``frac`` of L2, at most the n - ks a thread does not keep in shared memory."""
    if step_bytes <= 0:
        return 0
    return max(0, min(n - ks, int(frac * l2_bytes) // step_bytes))


def footprint(fwd, dtype, rows, c, flags):
    """Bytes of the (R, C) arrays a one-launch call reads and writes, once each: forward x, z, y; backward x, dy, y
    (after a fused ReLU), dx, dz."""
    if fwd:
        n = 2 + bool(flags.get("has_z"))
    else:
        n = 3 + bool(flags.get("relu")) + bool(flags.get("has_z"))
    return n * rows * c * np.dtype(dtype).itemsize


def keep_call(fwd, dtype, rows, c, flags, dev):
    """Whether a one-launch call takes KEEP: its direction asked (KEEP), the on-chip copy on, the device sm_80+ with a
    known L2, and the call's data (``footprint``) larger than the L2 (KEEP_ABOVE bytes where set)."""
    l2, hints = l2_info(dev)
    if not (ONCHIP and hints and ("fwd" if fwd else "bwd") in KEEP):
        return False
    return footprint(fwd, dtype, rows, c, flags) > (l2 if KEEP_ABOVE is None else KEEP_ABOVE)


def combine_trips(c, vec, g, acc_double):
    """Dependent L2 trips of a thread of meet's single combiner (combine_n) in the chunk with the most channels: a
    thread takes partials q, q + qn, ... (qn = 256 / kw, kw the channels a pass takes) of one channel, CB loads at a
    time, over ceil(channels / kw) passes."""
    cv, chunks, tx, rb, ng = geometry(1, c, vec)
    nch = min(c, tx * vec)
    kw = 1
    while kw < nch and kw < THREADS:
        kw *= 2
    qn = THREADS // kw
    cb = 8 if acc_double or not V2 else 16
    per_thread = -(-g // qn)
    return -(-nch // kw) * -(-per_thread // cb)


def split_call(c, vec, g, dtype):
    """Whether a one-launch call with ``g`` blocks a chunk takes SPLIT (meet_split): the switch on (SPLIT 2: every
    call; 1: where the single combiner makes SPLIT_TRIPS or more trips), V2's buffer, which holds VEC * 256 partial
    pairs, at least one channel's g."""
    if not SPLIT or not V2 or g > vec * THREADS:
        return False
    return SPLIT == 2 or combine_trips(c, vec, g, _acc(dtype) == np.float64) >= SPLIT_TRIPS


def _one_launch(name, dtype, vec, rows, c, flags, n_arrays, tail, dev, split=None):
    """(prepared launch, partial elements, sync counters) of a one-launch kernel, or None where its grid cannot be
    resident at once (the two-launch kernels then run).  With ONCHIP: the on-chip copy's slots per thread (`ks`,
    the last argument) and dynamic shared memory, as many as the SM's shared memory holds for BPS blocks and the
    walk needs; none where the driver would then not keep BPS blocks per SM.  KEEP where ``keep_call`` says (two
    more arguments then, kl and klast, after ks); otherwise the kernel and arguments without it.  SPLIT where
    ``split_call`` says at the grid the SMs hold (the same arguments; the compile flag only), checked again at the
    grid the occupancy gives."""
    fwd = name == "bnc_fwd1"
    keep = keep_call(fwd, dtype, rows, c, flags, dev)
    if keep:
        flags = dict(flags, keep=True)
    geo, chunks, ng = _geo_args(rows, c, vec)
    if split is None:
        split = split_call(c, vec, reduce_grid(ng, chunks, _launch.sm_count(dev) * BPS), dtype)
    if split:
        flags = dict(flags, split=True)
    k = _kernel(name, dtype, vec, cache=ONCHIP, **flags)
    ks = dyn = 0
    if ONCHIP:
        item = np.dtype(dtype).itemsize
        slot = THREADS * vec * item * (1 if name == "bnc_fwd1" else 2)
        acc = 8 if _acc(dtype) == np.float64 else 4
        ks_max = cache_slots(*smem_limits(dev), static_smem(k, THREADS * (vec * 2 * acc + 16) + 64), BPS, slot)
        ks_max = ks_max if SLOTS_CAP is None else min(ks_max, SLOTS_CAP)
        g = reduce_grid(ng, chunks, _launch.sm_count(dev) * BPS)
        ks = min(ks_max, -(-ng // g))
        dyn = ks * slot
        if dyn and _resident_per_sm(k, dyn) < BPS:
            ks = dyn = 0
    bps = _resident_per_sm(k, dyn)
    resident = _launch.sm_count(dev) * bps
    if resident < chunks:
        return None
    g = reduce_grid(ng, chunks, resident)
    if split and not split_call(c, vec, g, dtype):     # fewer blocks resident than the SMs promised
        return _one_launch(name, dtype, vec, rows, c, {k_: v for k_, v in flags.items() if k_ not in ("keep", "split")},
                           n_arrays, tail, dev, split=False)
    args = [None] * n_arrays + geo + list(tail) + ([np.int32(ks)] if ONCHIP else [])
    if keep:
        # the arrays the reduction reads and the elementwise pass reads again: x (forward); x, dy (and y, fused)
        arrays = 1 if fwd else 3 if flags.get("relu") else 2
        cv, _, tx, rb, _ = geometry(rows, c, vec)
        step = g * rb * c * np.dtype(dtype).itemsize * arrays
        kl = keep_steps(l2_info(dev)[0], KEEP_FRAC, step, -(-ng // g), ks)
        args += [np.int32(kl), np.int32(KEEP_LAST)]
    return _launch.prepare(k, (g, chunks), (THREADS,), args, shared_mem=dyn), g * c * 2, 3 * chunks


def same_launch(a, b):
    """Whether two prepared launches differ only in their array arguments (the twin's one more): the same grid,
    block, shared memory and packed scalars -- so a TWIN kernel's partial sums meet in the order of the plain one's
    and its y has the plain one's bits."""
    na, nb = len(a.slots), len(b.slots)
    return a.dims == b.dims and a.shared_mem == b.shared_mem and a.buf.data.raw[8 * na:] == b.buf.data.raw[8 * nb:]


def _apply_grid(ng, chunks, dev):
    return max(1, min(_launch.sm_count(dev) * APPLY_BLOCKS_PER_SM // chunks, -(-ng // UNROLL)))


def _fwd_plan(dtype, rows, c, vec, route, factor, eps, has_running, has_counter, flags, dev):
    tail = (np.float64(factor), np.float64(eps), np.int32(has_running), np.int32(has_counter))
    if flags.get("twin"):       # relu(y) too: only as the plain call's own launch with one more store, else False
        plain = _fwd_plan(dtype, rows, c, vec, route, factor, eps, has_running, has_counter,
                          dict(flags, twin=False), dev)
        if plain[0] != "one" or not ONCHIP:
            return False
        one = _one_launch("bnc_fwd1", dtype, vec, rows, c, flags, 13, tail, dev)
        return ("one", *one) if one is not None and same_launch(plain[1], one[0]) and plain[2:] == one[1:] else False
    if route == "one":
        one = _one_launch("bnc_fwd1", dtype, vec, rows, c, flags, 12, tail, dev)
        if one is not None:
            return ("one", *one)
    geo, chunks, ng = _geo_args(rows, c, vec)
    g = reduce_grid(ng, chunks, _launch.sm_count(dev) * TWO_BLOCKS_PER_SM)
    stats = _launch.prepare(_kernel("bnc_stats", dtype, vec), (g, chunks), (THREADS,), [None] * 8 + geo + list(tail))
    apply = _launch.prepare(_kernel("bnc_apply", dtype, vec, **flags), (_apply_grid(ng, chunks, dev), chunks),
                            (THREADS,), [None] * 7 + geo + [np.float64(eps)])
    return ("two", stats, apply, g * c * 2, chunks)


def _bwd_plan(dtype, rows, c, vec, route, flags, dev):
    if route == "one":
        one = _one_launch("bnc_bwd1", dtype, vec, rows, c, flags, 13, (), dev)
        if one is not None:
            return ("one", *one)
    geo, chunks, ng = _geo_args(rows, c, vec)
    g = reduce_grid(ng, chunks, _launch.sm_count(dev) * TWO_BLOCKS_PER_SM)
    grad = _launch.prepare(_kernel("bnc_grad", dtype, vec, relu=flags["relu"], has_scale=flags["has_scale"]),
                           (g, chunks), (THREADS,), [None] * 10 + geo)
    dx = _launch.prepare(_kernel("bnc_dx", dtype, vec, **flags), (_apply_grid(ng, chunks, dev), chunks),
                         (THREADS,), [None] * 9 + geo)
    return ("two", grad, dx, g * c * 2, chunks)


def _inf_plan(dtype, rows, c, vec, eps, flags, dev):
    geo, chunks, ng = _geo_args(rows, c, vec)
    return _launch.prepare(_kernel("bnc_apply", dtype, vec, from_var=True, **flags),
                           (_apply_grid(ng, chunks, dev), chunks), (THREADS,), [None] * 7 + geo + [np.float64(eps)])


# ---- settled calls ---------------------------------------------------------------------------------------------
# As bn_kernels' settled calls: everything but the arrays is worked out once per call signature (``_calls``,
# bounded) into an object that a repeated call runs directly.  The launches take the channels-first views (a view
# and its memory-order transpose share one pointer; a prepared launch reads only ``a.data.ptr``).  The vector width
# depends on the pointers' alignment, so each object checks it per call and keeps one plan per width it has met.
# Called, an object returns None where the module's switch (ENABLED, ROUTE) is no longer what it was settled under
# (bn_kernels' settled-call protocol: the caller then takes the full path, whose cache keys on ``switch()``);
# ``run`` runs it regardless (this module's own functions).
_calls: dict = {}


def switch():
    """What a caller's cache of these calls must key on: (ENABLED, ROUTE, ONCHIP, V2, STAGE, session 12's
    (KEEP, KEEP_FRAC, KEEP_LAST, KEEP_ABOVE) and session 17's (SPLIT, SPLIT_TRIPS))."""
    return ENABLED, ROUTE, ONCHIP, V2, STAGE, _cand()


def _cand():
    return KEEP, KEEP_FRAC, KEEP_LAST, KEEP_ABOVE, SPLIT, SPLIT_TRIPS


def strided_spec(mem, back, dtype):
    """(shape, strides, nbytes) of the view through ``back`` of a fresh C-ordered ``mem``-shaped array (a
    channels-first view of channels-last memory), for ``workspace.empty_strided``; None where ``back`` is None."""
    if back is None:
        return None
    item = np.dtype(dtype).itemsize
    c_strides, step = [], item
    for n in reversed(mem):
        c_strides.insert(0, step)
        step *= n
    return tuple(mem[i] for i in back), tuple(c_strides[i] for i in back), step


def _memory_order(xc):
    """(shape of the memory, the transpose back to channels-first or None) of an array laid out like ``xc``."""
    if xc.flags.c_contiguous or xc.ndim < 3:
        return xc.shape, None
    perm = (0, *range(2, xc.ndim), 1)
    return tuple(xc.shape[i] for i in perm), (0, xc.ndim - 1, *range(1, xc.ndim - 1))


class _Call:
    __slots__ = ("dev", "c", "rows", "dtype", "item", "vmax", "mem", "back", "spec", "acc", "route", "args", "plans",
                 "onchip", "v2", "stage", "cand")

    def _settle(self, xc, dev, route, args):
        self.dev, self.c, self.dtype, self.route, self.args = dev, xc.shape[1], xc.dtype, route, args
        self.onchip, self.v2, self.stage, self.cand = ONCHIP, V2, STAGE, _cand()
        self.rows = xc.size // self.c
        self.item = xc.dtype.itemsize
        self.vmax = vec_width(self.c, self.item)
        self.mem, self.back = _memory_order(xc)
        self.spec = strided_spec(self.mem, self.back, xc.dtype)
        self.acc = _acc(xc.dtype)
        self.plans = {}

    def _plan(self, *arrays):
        """The plan of the widest vector every array's pointer is aligned to."""
        v = self.vmax
        if v > 1:
            p = 0
            for a in arrays:
                if a is not None:
                    p |= a.data.ptr
            while p % (v * self.item):
                v //= 2
        plan = self.plans.get(v)
        if plan is None:
            plan = self.plans[v] = self._build(v)
        return plan

    def _empty(self, cp):
        """A fresh array laid out like xc, channels-first indexed (channels-last memory: made in one step), reused
        where nothing holds it (workspace.fresh)."""
        return _ws.fresh(cp, self.dev, "bn.y", self.mem, self.dtype, self.spec)


class TrainingCall(_Call):
    """``call(xc, z, scale, bias, running_mean, running_var, counter)`` -> (y, mean, inv_std), y in xc's layout;
    settled with ``twin``: (y, mean, inv_std, relu(y)), or None (nothing launched) where the plan of x's alignment
    cannot write the twin."""
    __slots__ = ()

    def _build(self, vec):
        factor, eps, has_running, has_counter, flags = self.args
        return _fwd_plan(self.dtype, self.rows, self.c, vec, self.route, factor, eps, has_running, has_counter,
                         flags, self.dev)

    def __call__(self, xc, z, scale, bias, running_mean, running_var, counter):
        if not ENABLED or ROUTE != self.route or ONCHIP != self.onchip or V2 != self.v2 or STAGE != self.stage \
                or _cand() != self.cand:
            return None
        return self.run(xc, z, scale, bias, running_mean, running_var, counter)

    def run(self, xc, z, scale, bias, running_mean, running_var, counter):
        plan = self._plan(xc, z)
        if not plan:            # (twin only: this alignment's plan cannot write it)
            return None
        cp, dev, acc = _launch.cupy(), self.dev, self.acc
        with _launch.on_device(dev):
            mean, inv_std = _ws.fresh_pair(cp, dev, "bn.stats", (self.c,), acc)
            partial = _ws.scratch_flat(cp, dev, "bn.partial", plan[-2], acc)
            y = self._empty(cp)
            twin = (_ws.fresh(cp, dev, "bn.twin", self.mem, self.dtype, self.spec),) if self.args[-1].get("twin") \
                else ()     # (a twin plan is always "one": _fwd_plan)
            if plan[0] == "one":
                plan[1](xc, z, y, partial, _ticket(cp, plan[-1], dev), mean, inv_std, scale, bias, running_mean,
                        running_var, counter, *twin)
                if twin:
                    return y, mean, inv_std, twin[0]
            else:
                plan[1](xc, partial, _ticket(cp, plan[-1], dev), mean, inv_std, running_mean, running_var, counter)
                plan[2](xc, z, y, mean, inv_std, scale, bias)
        return y, mean, inv_std


class BackwardCall(_Call):
    """``call(xc, dyc, scale, mean, inv_std, y)`` -> (dx, dz or None, dscale or None, dbias or None) in xc's layout."""
    __slots__ = ()

    def _build(self, vec):
        return _bwd_plan(self.dtype, self.rows, self.c, vec, self.route, self.args, self.dev)

    def __call__(self, xc, dyc, scale, mean, inv_std, y, dscale=None, dbias=None):
        if not ENABLED or ROUTE != self.route or ONCHIP != self.onchip or V2 != self.v2 or STAGE != self.stage \
                or _cand() != self.cand:
            return None
        return self.run(xc, dyc, scale, mean, inv_std, y, dscale, dbias)

    def run(self, xc, dyc, scale, mean, inv_std, y, dscale=None, dbias=None):
        """``dscale``, ``dbias`` (with a scale): (C,) C-contiguous arrays of the parameter dtype to write the parameter
        gradients into (gradient destinations, minidnn/_grad_dest.py), instead of new ones."""
        plan = self._plan(xc, dyc, y)
        cp, dev, acc, c, flags = _launch.cupy(), self.dev, mean.dtype, self.c, self.args
        with _launch.on_device(dev):
            partial = _ws.scratch_flat(cp, dev, "bn.partial", plan[-2], acc)
            coef = _ws.scratch_flat(cp, dev, "bn.coef", c * 2, acc)
            if not flags["has_scale"]:
                dscale = dbias = None
            elif dscale is None or dbias is None:
                dscale, dbias = _ws.fresh_pair(cp, dev, "bn.dparams", (c,), _param(self.dtype))
            dx = self._empty(cp)
            dz = self._empty(cp) if flags["has_z"] else None
            if plan[0] == "one":
                plan[1](xc, dyc, y, mean, inv_std, partial, _ticket(cp, plan[-1], dev), coef, dscale, dbias, scale,
                        dx, dz)
            else:
                plan[1](xc, dyc, y, mean, inv_std, partial, _ticket(cp, plan[-1], dev), coef, dscale, dbias)
                plan[2](xc, dyc, y, mean, inv_std, coef, scale, dx, dz)
        return dx, dz, dscale, dbias


class InferenceCall(_Call):
    """``call(xc, z, scale, bias, est_mean, est_var)`` -> y in xc's layout (one launch)."""
    __slots__ = ()

    def _build(self, vec):
        eps, flags = self.args
        return _inf_plan(self.dtype, self.rows, self.c, vec, eps, flags, self.dev)

    def __call__(self, xc, z, scale, bias, est_mean, est_var):
        if not ENABLED:
            return None
        return self.run(xc, z, scale, bias, est_mean, est_var)

    def run(self, xc, z, scale, bias, est_mean, est_var):
        apply = self._plan(xc, z)
        cp = _launch.cupy()
        with _launch.on_device(self.dev):
            y = self._empty(cp)
            apply(xc, z, y, est_mean, est_var, scale, bias)
        return y


def _settled(cls, xc, key, args):
    dev = xc.data.device_id
    key = (cls.__name__, ROUTE, ONCHIP, V2, STAGE, _cand(), xc.shape, xc.strides, xc.dtype, dev) + key
    call = _calls.get(key)
    if call is None:
        def build():
            t = cls()
            t._settle(xc, dev, ROUTE, args)
            return t
        call = _launch.planned(_calls, key, build)
    return call


def training_call(xc, factor, eps, has_running, has_counter, relu, has_z, has_scale, has_bias, twin=False):
    """The settled forward of a channels-last (or (N, C), or (N, C, 1, ...)) x: see TrainingCall.  ``twin`` (not
    with ``relu``): the call that also writes relu(y) (TWIN_HEADER)."""
    flags = dict(relu=bool(relu), has_z=bool(has_z), has_scale=bool(has_scale), has_bias=bool(has_bias))
    if twin:
        flags["twin"] = True
    return _settled(TrainingCall, xc, (factor, eps, has_running, has_counter, *flags.values()),
                    (factor, eps, has_running, has_counter, flags))


def backward_call(xc, relu, has_scale, want_dz):
    """The settled backward of a channels-last x: see BackwardCall."""
    flags = dict(relu=bool(relu), has_z=bool(want_dz), has_scale=bool(has_scale))
    return _settled(BackwardCall, xc, tuple(flags.values()), flags)


def inference_call(xc, eps, relu, has_z, has_scale, has_bias):
    flags = dict(relu=bool(relu), has_z=bool(has_z), has_scale=bool(has_scale), has_bias=bool(has_bias))
    return _settled(InferenceCall, xc, (eps, *flags.values()), (eps, flags))


def forward_training(xc, scale, bias, factor, running_mean, running_var, eps, z=None, relu=False, counter=None):
    """bn_kernels.forward_training for x laid out as (R, C) rows (channels-last, or 2-D): (y in x's layout, saved
    mean (C,), saved inv_std (C,)); the running statistics and ``counter`` updated in place by the same launch(es)."""
    return training_call(xc, factor, eps, running_mean is not None, counter is not None, relu, z is not None,
                         scale is not None, bias is not None).run(xc, z, scale, bias, running_mean, running_var,
                                                                  counter)


def forward_inference(xc, scale, bias, est_mean, est_var, eps, z=None, relu=False):
    """y = act((x - est_mean) / sqrt(est_var + eps) * scale + bias [+ z]) in x's layout, one launch."""
    return inference_call(xc, eps, relu, z is not None, scale is not None, bias is not None).run(
        xc, z, scale, bias, est_mean, est_var)


def backward(xc, dyc, scale, mean, inv_std, y=None, want_dz=False):
    """bn_kernels.backward for x laid out as (R, C) rows: (dx, dz or None, dscale or None, dbias or None) in x's
    layout; ``y`` (the fused forward's output) masks dy by y > 0; ``want_dz`` also returns g."""
    return backward_call(xc, y is not None, scale is not None, want_dz).run(xc, dyc, scale, mean, inv_std, y)


def rows_layout(xc) -> bool:
    """Whether ``xc`` (a channels-first view) is laid out as (R, C) contiguous rows: channels-last, (N, C), or
    channels-first with one value per plane.  The arrays these kernels take."""
    if xc.ndim < 2:
        return False
    if xc.flags.c_contiguous:
        return xc.ndim == 2 or xc.size == xc.shape[0] * xc.shape[1]
    if xc.ndim < 3:
        return False
    return xc.transpose((0, *range(2, xc.ndim), 1)).flags.c_contiguous


def source_for_nvcc(dtype, vec, **flags):
    """The source with one configuration's defines prepended (for nvcc: the tests' compile check)."""
    return "".join("#define {} {}\n".format(*o[2:].split("=", 1)) for o in _options(dtype, vec, **flags)
                   if o.startswith("-D")) + SOURCE
