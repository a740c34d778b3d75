"""Group norm of large 16-bit groups with the group row stashed in one block's shared memory (sm_80+, cp.async):
forward and backward in one launch each (+ col_sum for dscale / dbias), x (and dy) read from DRAM exactly once.

Shape legend: x, y, dy, dx (N, C, *S) C-contiguous, 16-bit (float16 / bfloat16), seen as rows = N * G group rows of
D = cpg * S values (cpg = C / G channels of S values); a row is nvec = D / 8 16-byte vectors, a channel plane
iv = S / 8 of them (S % 8 == 0: a vector lies in one channel).  scale, bias (C,) in x's dtype or float32; mean, rstd
(N, G) float; sums (N, 2C) float: e = sum(dy * xhat) at c, s = sum(dy) at C + c (norm_kernels' col_sum makes
dscale / dbias of them).

Why: a 16-bit group row beyond 16384 values (GroupNorm(32, 256) on 56 x 56: 25088 values, 49 KB) is past every
register path of norm_kernels.  The looped kernels read it twice forward (59% of copy on an H200) and x, dy twice
backward in three launches (38%); session 17's cluster kernels hold it in registers, but at two 16-byte vectors a
thread too few bytes were in flight and 16-bit lost 5-6% on the H200.  Shared memory holds the row instead: 49 KB
(forward) / 98 KB (backward, x and dy) a block, so four / two blocks an SM.

Bytes in flight (Little's law): ~3.5 TB/s at ~600-800 ns of DRAM latency is 2.1-2.8 MB over 132 SMs, 16-21 KB an
SM.  Every block issues its whole row as cp.async copies before it waits on any (49 KB forward, 98 KB backward: 2.5-6
times an SM's need from one block), so while one block of an SM reduces or stores, another still has its loads out.

Tiling: grid = rows blocks of NT = 512 threads (one group row a block; dynamic shared memory = the row).
  gn_fwds  thread t copies vectors t + k NT (commit group k); it adds vector k's values to its sum as soon as group
           k has landed (cp.async.wait_group), so the sum streams with the loads; block sum -> mean; the exact second
           moment about the mean from shared memory (a second block sum) -> rstd; y = (x - mean) rstd scale[c] +
           bias[c] from shared memory.  Each thread reads back only the vectors it copied: no barrier for the data.
  gn_bwds  channel by channel (commit group c = plane c of x and of dy; thread t copies vectors c iv + t + k NT):
           per channel, as it lands, sum d, sum dy, sum dy d (d = x - mean) -> warp sums -> wpart[warp][c]; the warps
           added in order -> chs[c]; the row's sums from the channels' (sum g = sum_c scale[c] sum dy, sum g d =
           sum_c scale[c] sum dy d), the re-centring offset off = sum d / D (norm_kernels' RECENTRE), e = rstd (sum
           dy d - off sum dy), s = sum dy per channel into sums, then dx = rstd (g - mean(g) - xhat mean(g xhat)),
           xhat = (d - off) rstd, from shared memory.
Every sum is in a fixed order: deterministic, bitwise repeatable; nothing read back to the host (graph-capturable).

Switch: GN_STASH16 (MINIDNN_GN_STASH16, read at import; norm_kernels reads the attribute at planning time, so set it
and clear norm_kernels._plans for an in-process A/B): "1" routes 16-bit group-norm rows no register path takes
(row_config2 None) to these kernels where `plan` fits them, on sm_80+ (the cluster kernels take float32 only);
"0" keeps the kernels before (the default is "1" since session 18's run 2: H200, (32, 256, 56, 56) G=32 bf16 forward
59% -> 72% of copy, backward 41% -> 63%); MINIDNN_GN_STASH16_DIRS ("fwd,bwd" | "fwd" | "bwd";
the attribute DIRECTIONS) limits it to one direction.  float32 keeps the cluster kernels.
The backward's variant 2 (BWD_VARIANT, MINIDNN_GN_STASH16_BWD; "2", the default since the H200's run 3; "1" keeps
gn_bwds for the A/B): gn_bwdp, the same algebra in a persistent grid of one 1024-thread block an SM walking rows
through two row buffers of x and dy, so the next row's loads are in flight while one row reduces and stores
(SOURCE_PIPE says why and how).  Run 3: level with gn_bwds on (32, 256, 56, 56) G=32 (bf16 0.0572 vs 0.0580 ms),
1.10x on the ragged (64, 96, 48, 48) G=8 bf16 row, and it takes planes of < BWD_MIN_IV vectors, which gn_bwds
refuses.  The forward's persistent twin (gn_fwdp, a ring of up to four row buffers) lost to gn_fwds on the same
GPU (0.0448 vs 0.0338 ms, 0.0266 vs 0.0213 ms) and was removed; the git history keeps it.
"""
from __future__ import annotations

import os

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from .device_facts import sm80, smem_limits
from .norm_gncl import _PSTORAGE, GN_BLOCK_SUMS, GN_DATA_HEADER, _divider, geometry
from .softmax_kernels import WARP_REDUCE
from .storage import STORAGE_HEADER, type_info

__all__ = ["SOURCE", "SOURCE_PIPE", "GN_STASH16", "BWD_VARIANT", "plan", "plan_pipe", "pipe_teams",
           "prepare_forward", "prepare_backward", "usable", "options"]

GN_STASH16 = os.environ.get("MINIDNN_GN_STASH16", "1") == "1"
# the directions GN_STASH16 routes (MINIDNN_GN_STASH16_DIRS, read at import): "fwd,bwd", or one of them where the A/B
# adopts one direction only
DIRECTIONS = frozenset(d for d in os.environ.get("MINIDNN_GN_STASH16_DIRS", "fwd,bwd").split(",") if d)
if not DIRECTIONS <= {"fwd", "bwd"}:
    raise ValueError(f"MINIDNN_GN_STASH16_DIRS: fwd and / or bwd, comma-separated, not {sorted(DIRECTIONS)}")
# the backward kernel (MINIDNN_GN_STASH16_BWD, read at import; the attribute at planning time): 1 gn_bwds (a row a
# block, two blocks an SM), 2 gn_bwdp (a persistent block an SM, two row buffers: the next row loads while this one
# reduces and stores; rows whose two buffers do not fit one block keep gn_bwds).  2 by default since the H200's
# run 3 (equal on the big row, 1.10x on the ragged one, and planes of < BWD_MIN_IV vectors taken)
BWD_VARIANT = int(os.environ.get("MINIDNN_GN_STASH16_BWD", "2"))
if BWD_VARIANT not in (1, 2):
    raise ValueError(f"MINIDNN_GN_STASH16_BWD: 1 (gn_bwds) or 2 (gn_bwdp), not {BWD_VARIANT}")
NT = 512            # threads a block (the kernels' launch bounds)
NT_PIPE = 1024      # gn_bwdp's threads (launch bounds 1024 x 1: <= 64 registers; one block an SM)
MINB_FWD = 4        # launch bounds: <= 32 registers, four blocks an SM (a 49 KB row each: four fit 228 KB)
MINB_BWD = 2        # <= 64 registers, two an SM (98 KB each)
MIN_BLOCKS = 2      # the blocks an SM the stash must leave room for: one loading while another reduces / stores
BWD_MIN_IV = 128    # backward: vectors a plane at least (a channel's pass uses min(iv, NT) threads)
CPG_MAX = 64        # backward: channels a group at most (the warps' channel sums live in shared memory)
STATIC_SMEM = 256   # the kernels' static shared memory, an upper bound (block_sums' per-warp slots, the totals)

_COMMON = STORAGE_HEADER + WARP_REDUCE + GN_DATA_HEADER + GN_BLOCK_SUMS + r"""
#if STORAGE == 0
#error "gn_fwds / gn_bwds: 16-bit data only"
#endif
// 16 bytes from global straight to shared memory (no registers, L1 bypassed)
__device__ __forceinline__ void cp16(V* sdst, const V* gsrc)
{
    unsigned int sa;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(sa) : "l"(sdst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(sa), "l"(gsrc) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" : : : "memory"); }
// Wait until at most n of this thread's commit groups are still in flight.  PTX wants n as an immediate, hence the
// switch; n beyond 15 waits as for 15 (earlier than needed, never later).
#define GN16_WAIT(k) case k: asm volatile("cp.async.wait_group " #k ";" : : : "memory"); break;
__device__ __forceinline__ void cp_wait(int n)
{
    switch (n < 15 ? n : 15) {
        GN16_WAIT(0) GN16_WAIT(1) GN16_WAIT(2) GN16_WAIT(3) GN16_WAIT(4) GN16_WAIT(5) GN16_WAIT(6) GN16_WAIT(7)
        GN16_WAIT(8) GN16_WAIT(9) GN16_WAIT(10) GN16_WAIT(11) GN16_WAIT(12) GN16_WAIT(13) GN16_WAIT(14)
        default: asm volatile("cp.async.wait_group 15;" : : : "memory");
    }
}
// gn_fwds' and gn_bwdp's forms (session 18's lean text, bitwise equal to the text before it: docs/step_kernels.md):
// fewer instructions a value.  cp16 converts its generic pointer to a shared address at every copy (ptxas rebuilds
// it from SR_CgaCtaId / SR_SWINHI: ~10 instructions a 16-byte copy; gn_bwds keeps it); with smem_addr the row's
// shared address is taken once and a copy (cp16s) is an add and an LDGSTS.
__device__ __forceinline__ unsigned int smem_addr(const void* p)
{
    unsigned int sa;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(sa) : "l"(p));
    return sa;
}
__device__ __forceinline__ void cp16s(unsigned int sa, const V* gsrc)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(sa), "l"(gsrc) : "memory");
}
// LDE without `volatile`: the vectors come from shared memory right before use (no register row to keep raw), so
// ptxas may schedule the unpacks with the arithmetic (still one SHF / LOP3 (bf16) or HADD2.F32 (fp16) a value).
__device__ __forceinline__ A LDL(const V& v, int e)
{
    const unsigned int w = reinterpret_cast<const unsigned int*>(v.v)[e >> 1];   // the vector's 32-bit word
#if STORAGE == 2
    return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
#else
    float f;
    if (e & 1) asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi;}" : "=f"(f) : "r"(w));
    else asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo;}" : "=f"(f) : "r"(w));
    return f;
#endif
}
// A channel plane's three backward sums, for gn_bwds and gn_bwdp alike: sum(d), sum(dy), sum(dy d) with d = x - mu
// over the thread's vectors vi = V0, V0 + STEP, ... < V1 of the plane's x and dy rows in shared memory (xs, gs),
// each value read with LOAD (gn_bwds: LDE; gn_bwdp: the lean LDL), then summed over the warp and written by lane 0 to
// SLOT[0..2].  Statements over the caller's xs, gs, mu and t (a macro, not a function: the kernels' PTX as before).
#define GN16_PLANE_SUMS(LOAD, V0, V1, STEP, SLOT)                                                              \
    A p0 = 0, p1 = 0, p2 = 0;                                                                                  \
    for (int vi = V0; vi < V1; vi += STEP) {                                                                   \
        const V a = xs[vi], b = gs[vi];                                                                        \
        _Pragma("unroll")                                                                                      \
        for (int e = 0; e < VEC; ++e) {                                                                        \
            const A d = LOAD(a, e) - mu, gy = LOAD(b, e);                                                      \
            p0 += d; p1 += gy; p2 += gy * d;                                                                   \
        }                                                                                                      \
    }                                                                                                          \
    p0 = warp_sum(p0); p1 = warp_sum(p1); p2 = warp_sum(p2);                                                   \
    if ((t & 31) == 0) {                                                                                       \
        A* o = SLOT;                                                                                           \
        o[0] = p0; o[1] = p1; o[2] = p2;                                                                       \
    }
// cp_wait for gn_bwdp's channel waits: 2 cpt - 1 - j groups is 1 (one channel a thread: the table's row) or a few
// (cpt <= CPG_MAX / P), tested first in a short chain before cp_wait's jump table (~12 instructions)
__device__ __forceinline__ void cp_wait_few(int n)
{
    if (n == 1) asm volatile("cp.async.wait_group 1;" : : : "memory");
    else if (n == 2) asm volatile("cp.async.wait_group 2;" : : : "memory");
    else if (n == 3) asm volatile("cp.async.wait_group 3;" : : : "memory");
    else cp_wait(n);
}

"""

SOURCE = _COMMON + r"""extern "C" __global__ void __launch_bounds__(NT, MINB)
gn_fwds(const T* __restrict__ x, const PT* __restrict__ scale, const PT* __restrict__ bias, T* __restrict__ y,
        A* __restrict__ mean_out, A* __restrict__ rstd_out, const int D, const int G, const int cpg,
        const unsigned int iv_mul, const unsigned int iv_shr, const double eps, const int flags)
{
    extern __shared__ __align__(16) unsigned char dyn_sm[];
    V* const row = reinterpret_cast<V*>(dyn_sm);
    __shared__ A tot[2];
    const long long r = blockIdx.x;
    const int t = threadIdx.x, nvec = D / VEC, nst = (nvec + NT - 1) / NT;
    const V* xr = reinterpret_cast<const V*>(x + r * D);
    {
        unsigned int sa = smem_addr(row + t);
        const V* g = xr + t;
        for (int vi = t; vi < t + nst * NT; vi += NT, sa += 16u * NT, g += NT) {
            if (vi < nvec) cp16s(sa, g);    // the whole row in flight: group k = every thread's k-th vector
            cp_commit();
        }
    }
    A s[1] = {0};
    {
        // The sum as the groups land, group k waited for with an immediate: groups beyond the last 16 wait as for
        // 15 (as cp_wait does), then a jump into a fall-through run of 16 waits (15 .. 0) replaces cp_wait's
        // switch (~12 instructions a group) by one DEPBAR a group.
        int k = 0;
        auto add = [&](int kk) {
            const int vi = t + kk * NT;
            if (vi < nvec) {
                const V v = row[vi];
#pragma unroll
                for (int e = 0; e < VEC; ++e) s[0] += LDL(v, e);
            }
        };
        for (; k < nst - 16; ++k) { asm volatile("cp.async.wait_group 15;" : : : "memory"); add(k); }
#define GN16_STEP(m, j) case m: asm volatile("cp.async.wait_group " #j ";" : : : "memory"); add(k++);
        switch (nst - k) {
            GN16_STEP(16, 15) GN16_STEP(15, 14) GN16_STEP(14, 13) GN16_STEP(13, 12) GN16_STEP(12, 11)
            GN16_STEP(11, 10) GN16_STEP(10, 9) GN16_STEP(9, 8) GN16_STEP(8, 7) GN16_STEP(7, 6) GN16_STEP(6, 5)
            GN16_STEP(5, 4) GN16_STEP(4, 3) GN16_STEP(3, 2) GN16_STEP(2, 1) GN16_STEP(1, 0)
            default: break;
        }
#undef GN16_STEP
    }
    block_sums<1>(s, tot);
    const A mean = tot[0] / (A)D;
    A q[1] = {0};
    for (int vi = t; vi < nvec; vi += NT) {
        const V v = row[vi];
#pragma unroll
        for (int e = 0; e < VEC; ++e) { const A d = LDL(v, e) - mean; q[0] += d * d; }
    }
    block_sums<1>(q, tot + 1);
    const A rstd = (A)1 / sqrt(tot[1] / (A)D + (A)eps);
    if (t == 0) { mean_out[r] = mean; rstd_out[r] = rstd; }
    const int g0 = (int)((unsigned long long)r % (unsigned int)G) * cpg;
    V* yr = reinterpret_cast<V*>(y + r * D);
#pragma unroll 1
    for (int vi = t; vi < nvec; vi += NT) {         // (unrolled twice, ptxas spills at 32 registers)
        A sc = rstd, bi = 0;
        if (flags & (F_SCALE | F_BIAS)) {
            const int p = g0 + (int)divu((unsigned int)vi, iv_mul, iv_shr);
            if (flags & F_SCALE) sc *= LDP(scale[p]);
            if (flags & F_BIAS) bi = LDP(bias[p]);
        }
        const V v = row[vi];
        V w;
#pragma unroll
        for (int e = 0; e < VEC; ++e) w.v[e] = ST((LDL(v, e) - mean) * sc + bi);
        yr[vi] = w;
    }
}

// Backward.  Dynamic shared memory: x's row, dy's row (nvec vectors each), wpart [NW][cpg][3], chs [cpg][3].
extern "C" __global__ void __launch_bounds__(NT, MINB)
gn_bwds(const T* __restrict__ x, const T* __restrict__ dy, const A* __restrict__ mean, const A* __restrict__ rstd,
        const PT* __restrict__ scale, A* __restrict__ sums, T* __restrict__ dx, const int D, const int C, const int G,
        const int cpg, const int iv, const int flags)
{
    extern __shared__ __align__(16) unsigned char dyn_sm[];
    const int t = threadIdx.x, nvec = D / VEC;
    V* const xs = reinterpret_cast<V*>(dyn_sm);
    V* const gs = xs + nvec;
    A* const wpart = reinterpret_cast<A*>(gs + nvec);
    A* const chs = wpart + NW * cpg * 3;
    __shared__ A tot[3];
    const long long r = blockIdx.x;
    const unsigned int n_ = (unsigned int)((unsigned long long)r / (unsigned int)G);
    const int g0 = (int)((unsigned int)r - n_ * (unsigned int)G) * cpg;
    const V* xr = reinterpret_cast<const V*>(x + r * D);
    const V* gr = reinterpret_cast<const V*>(dy + r * D);
    for (int c = 0; c < cpg; ++c) {         // the whole row in flight: group c = plane c of x and dy
        for (int vi = c * iv + t; vi < (c + 1) * iv; vi += NT) { cp16(xs + vi, xr + vi); cp16(gs + vi, gr + vi); }
        cp_commit();
    }
    const A mu = mean[r], is = rstd[r];
    for (int c = 0; c < cpg; ++c) {         // each channel's sums as its plane lands
        cp_wait(cpg - 1 - c);
        GN16_PLANE_SUMS(LDE, c * iv + t, (c + 1) * iv, NT, wpart + ((t >> 5) * cpg + c) * 3)
    }
    __syncthreads();
    for (int q = t; q < 3 * cpg; q += NT) {     // channel sums: the warps in order
        A v = 0;
#pragma unroll
        for (int w = 0; w < NW; ++w) v += wpart[w * cpg * 3 + q];
        chs[q] = v;
    }
    __syncthreads();
    if (t < 32) {                               // the row's sums from the channels' (lane order, then butterflies)
        A s0 = 0, s1 = 0, s2 = 0;
        for (int c = t; c < cpg; c += 32) {
            const A sc = (flags & F_SCALE) ? LDP(scale[g0 + c]) : (A)1;
            s0 += chs[3 * c]; s1 += sc * chs[3 * c + 1]; s2 += sc * chs[3 * c + 2];
        }
        s0 = warp_sum(s0); s1 = warp_sum(s1); s2 = warp_sum(s2);
        if (t == 0) { tot[0] = s0; tot[1] = s1; tot[2] = s2; }
    }
    __syncthreads();
    const A inv_d = (A)1 / (A)D;
    const A off = tot[0] * inv_d;
    const A c1 = tot[1] * inv_d, c2 = is * (tot[2] - off * tot[1]) * inv_d;
    if (flags & F_SCALE) {
        for (int c = t; c < cpg; c += NT) {
            A* out = sums + (long long)n_ * 2 * C + g0 + c;
            out[0] = is * (chs[3 * c + 2] - off * chs[3 * c + 1]);
            out[C] = chs[3 * c + 1];
        }
    }
    const A ioff = off * is;
    V* dr = reinterpret_cast<V*>(dx + r * D);
    for (int c = 0; c < cpg; ++c) {
        const A sc = (flags & F_SCALE) ? LDP(scale[g0 + c]) : (A)1;
        for (int vi = c * iv + t; vi < (c + 1) * iv; vi += NT) {
            const V a = xs[vi], b = gs[vi];
            V w;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A xhat = (LDE(a, e) - mu) * is - ioff;
                w.v[e] = ST(is * (LDE(b, e) * sc - c1 - xhat * c2));
            }
            dr[vi] = w;
        }
    }
}
"""


# Backward variant 2 (BWD_VARIANT, MINIDNN_GN_STASH16_BWD=2): gn_bwds' algebra in a persistent grid of one block of
# NT_PIPE threads an SM, each block walking rows blockIdx.x, + gridDim.x, ... through two row buffers (x and dy each).
SOURCE_PIPE = _COMMON + r"""
// Why: gn_bwds keeps one row a block, two blocks an SM.  Blocks that start together (every wave's first) load
// together, then both reduce and store with none of the SM's loads in flight; the H200 measured 63% of copy.  Here
// row i + 1 is issued (cp.async into the other buffer) before row i is reduced, so an SM always has a row of loads
// out (98 KB on the (32, 256, 56, 56) G=32 row: ~5x Little's law's 16-21 KB an SM) while it reduces and stores.
// Teams: warps [p WPT, (p + 1) WPT) are team p < P; team p copies, sums and writes channels c = p, p + P, ... of
// every row, its thread tt the vectors c iv + tt + k TT (TT = 32 WPT): every thread reads back only what it copied
// (no barrier for the data, and a buffer is refilled by the threads that read it).  The host picks P, WPT so that
// few threads idle on planes of iv < NT vectors (norm_gn16.pipe_teams); warps beyond P WPT only join the barriers.
// Per row: each channel's sums as its plane lands (commit group = one channel of one row; the next row's groups are
// committed after this row's, so this row's channel j waits for <= 2 cpt - 1 - j groups outstanding) -> warp sums ->
// wpart[c][warp of team][3]; barrier; warp 0 adds each channel's warps in order (chs) and the row's sums of the
// channels' in lane order + butterflies (tot); barrier; e, s per channel into sums; dx from the buffer.
extern "C" __global__ void __launch_bounds__(NT, 1)
gn_bwdp(const T* __restrict__ x, const T* __restrict__ dy, const A* __restrict__ mean, const A* __restrict__ rstd,
        const PT* __restrict__ scale, A* __restrict__ sums, T* __restrict__ dx, const int rows, const int D,
        const int C, const int G, const int cpg, const int iv, const int P, const int WPT, const int flags)
{
    extern __shared__ __align__(16) unsigned char dyn_sm[];
    const int t = threadIdx.x, nvec = D / VEC;
    V* const buf = reinterpret_cast<V*>(dyn_sm);                 // [2 buffers][x row, dy row]
    A* const wpart = reinterpret_cast<A*>(buf + 4 * nvec);       // [cpg][WPT][3]
    A* const chs = wpart + cpg * WPT * 3;                       // [cpg][3]
    __shared__ A tot[3];
    const int w = t >> 5, p = w / WPT, wi = w - p * WPT, TT = WPT * 32, tt = t - p * TT;
    const int cpt = p < P ? (cpg - 1 - p) / P + 1 : 0;          // this thread's channels a row
    const int stride = gridDim.x;
    // Shared addresses as 32-bit offsets taken once (cp16s), each copy one add from the last; the row's
    // (n, g) stepped by the grid's stride instead of a division by G a row; 1 / D once.
    const unsigned int sbuf = smem_addr(buf), xbytes = 16u * (unsigned int)nvec;
    auto issue = [&](int r, int b) {                            // row r (none past the end) -> buffer b
        if (r < rows) {
            const V* xr = reinterpret_cast<const V*>(x + (long long)r * D);
            const V* gr = reinterpret_cast<const V*>(dy + (long long)r * D);
            const unsigned int sb = sbuf + 2u * (unsigned int)b * xbytes;
            for (int j = 0; j < cpt; ++j) {
                const int c = p + j * P, v0 = c * iv + tt, v1 = (c + 1) * iv;
                unsigned int sa = sb + 16u * (unsigned int)v0;
                for (int vi = v0; vi < v1; vi += TT, sa += 16u * TT) {
                    cp16s(sa, xr + vi);
                    cp16s(sa + xbytes, gr + vi);
                }
                cp_commit();
            }
        } else {
            for (int j = 0; j < cpt; ++j) cp_commit();          // (empty past the end: the counts stay uniform)
        }
    };
    const unsigned int gstep_n = (unsigned int)stride / (unsigned int)G;
    const unsigned int gstep_g = (unsigned int)stride - gstep_n * (unsigned int)G;
    unsigned int n_ = (unsigned int)blockIdx.x / (unsigned int)G;
    unsigned int gq = (unsigned int)blockIdx.x - n_ * (unsigned int)G;
    const A inv_d = (A)1 / (A)D;
    int r = blockIdx.x, b = 0;
    issue(r, 0);
    A mu = 0, is = 0;
    if (r < rows) { mu = mean[r]; is = rstd[r]; }
    for (; r < rows; r += stride, b ^= 1) {
        issue(r + stride, b ^ 1);       // the buffer this thread read last row: its reads were issued before
        A mu_n = 0, is_n = 0;
        if (r + stride < rows) { mu_n = mean[r + stride]; is_n = rstd[r + stride]; }
        const V* const xs = buf + 2 * b * nvec;
        const V* const gs = xs + nvec;
        // The scales the row's serial steps read, loaded now (their latency under the channel sums): warp 0's lane
        // channel (its channel sums, between the two barriers) and this thread's first channel (dx).
        const int g0 = (int)gq * cpg;
        A sc_lane = 1, sc_own = 1;
        if (flags & F_SCALE) {
            if (t < cpg && t < 32) sc_lane = LDP(scale[g0 + t]);
            if (p < P) sc_own = LDP(scale[g0 + p]);
        }
        for (int j = 0; j < cpt; ++j) {             // each channel's sums as its plane lands
            const int c = p + j * P;
            cp_wait_few(2 * cpt - 1 - j);
            GN16_PLANE_SUMS(LDL, c * iv + tt, (c + 1) * iv, TT, wpart + (c * WPT + wi) * 3)
        }
        __syncthreads();
        if (t < 32) {                               // channel sums (the team's warps in order), then the row's
            A s0 = 0, s1 = 0, s2 = 0;
            for (int c = t; c < cpg; c += 32) {
                const A* q = wpart + c * WPT * 3;
                A v0 = 0, v1 = 0, v2 = 0;
                for (int k = 0; k < WPT; ++k) { v0 += q[3 * k]; v1 += q[3 * k + 1]; v2 += q[3 * k + 2]; }
                chs[3 * c] = v0; chs[3 * c + 1] = v1; chs[3 * c + 2] = v2;
                const A sc = (flags & F_SCALE) ? (c == t ? sc_lane : LDP(scale[g0 + c])) : (A)1;
                s0 += v0; s1 += sc * v1; s2 += sc * v2;
            }
            s0 = warp_sum(s0); s1 = warp_sum(s1); s2 = warp_sum(s2);
            if (t == 0) { tot[0] = s0; tot[1] = s1; tot[2] = s2; }
        }
        __syncthreads();
        const A off = tot[0] * inv_d;
        const A c1 = tot[1] * inv_d, c2 = is * (tot[2] - off * tot[1]) * inv_d;
        if ((flags & F_SCALE) && t < cpg) {
            A* out = sums + (long long)n_ * 2 * C + g0 + t;
            out[0] = is * (chs[3 * t + 2] - off * chs[3 * t + 1]);
            out[C] = chs[3 * t + 1];
        }
        // dx = is (g sc - c1 - xhat c2), xhat = (x - mu) is - off is, as ag g + (bx (x - mu) + k0), ag = is sc a
        // channel: a subtraction and two FMAs a value instead of gn_bwds' six operations (SASS 72 -> ~58 instructions
        // a vector).  x - mu stays explicit: folding mu into k0 would cancel it in float32 (10x the error at
        // |mean| / sigma = 100; tests/backend/test_norm_s18_gn16b.py's float32 check).
        const A bx = -is * is * c2, k0 = is * (c2 * off * is - c1);
        V* dr = reinterpret_cast<V*>(dx + (long long)r * D);
        for (int j = 0; j < cpt; ++j) {
            const int c = p + j * P;
            const A ag = is * ((flags & F_SCALE) ? (j == 0 ? sc_own : LDP(scale[g0 + c])) : (A)1);
            for (int vi = c * iv + tt; vi < (c + 1) * iv; vi += TT) {
                const V a = xs[vi], g = gs[vi];
                V o;
#pragma unroll
                for (int e = 0; e < VEC; ++e) o.v[e] = ST(fmaf(ag, LDL(g, e), fmaf(bx, LDL(a, e) - mu, k0)));
                dr[vi] = o;
            }
        }
        mu = mu_n; is = is_n;
        n_ += gstep_n; gq += gstep_g;
        if (gq >= (unsigned int)G) { gq -= (unsigned int)G; ++n_; }
    }
}
"""


def smem_bytes(d, backward, cpg=1):
    """Dynamic shared memory of one block: the row (x; backward x and dy) and the backward's channel sums."""
    nvec = d // 8
    if backward:
        return 2 * nvec * 16 + (NT // 32 + 1) * cpg * 3 * 4
    return nvec * 16


def plan(d, s, itemsize, backward, cpg, smem):
    """(dynamic shared memory bytes, blocks an SM) of a launch for group rows of ``d`` 16-bit values in planes of
    ``s``, or None where the kernels do not take them: 16-bit data whose planes fill 16-byte vectors, a stash that
    leaves MIN_BLOCKS blocks an SM and fits one block's opt-in limit; the backward also planes of >= BWD_MIN_IV
    vectors and <= CPG_MAX channels.  ``smem``: (shared memory an SM, a block's opt-in limit), as
    device_facts.smem_limits gives."""
    if itemsize != 2 or d < 8 or s % 8 or d % s:
        return None
    per_sm, optin = smem
    if backward and (s // 8 < BWD_MIN_IV or cpg > CPG_MAX):
        return None
    nbytes = smem_bytes(d, backward, cpg)
    if nbytes + STATIC_SMEM > optin:
        return None
    bps = min(per_sm // (nbytes + STATIC_SMEM + 1024), 2048 // NT, MINB_BWD if backward else MINB_FWD)
    return (nbytes, bps) if bps >= MIN_BLOCKS else None


def pipe_teams(cpg, iv, nt=NT_PIPE):
    """(P, WPT) of gn_bwdp: P teams of WPT warps, team p taking channels p, p + P, ... of a row.  The fewest
    vector steps a thread (channels a thread x passes over a plane), a channel's warp sums counted as half a step;
    ties to more teams (fewer warp sums a row).  (32, 256, 56, 56) G=32 (8 planes of 392): 8 teams of 4 warps."""
    nw = nt // 32
    best = None
    for p in range(1, min(cpg, nw) + 1):
        wpt = nw // p
        cost = -(-cpg // p) * (-(-iv // (32 * wpt)) + 0.5)
        if best is None or cost <= best[0]:
            best = (cost, p, wpt)
    return best[1], best[2]


def plan_pipe(d, s, itemsize, cpg, smem):
    """(dynamic shared memory bytes, P, WPT) of a gn_bwdp launch for group rows of ``d`` 16-bit values in planes of
    ``s`` (``cpg`` of them), or None: 16-bit data whose planes fill 16-byte vectors, <= CPG_MAX channels, and two
    rows of x and dy plus the channel partials within one block's opt-in limit (``smem``: device_facts.smem_limits)."""
    if itemsize != 2 or d < 8 or s % 8 or d % s or cpg > CPG_MAX or d != cpg * s:
        return None
    teams, wpt = pipe_teams(cpg, s // 8)
    nbytes = 4 * (d // 8) * 16 + (cpg * wpt + cpg) * 3 * 4
    return (nbytes, teams, wpt) if nbytes + STATIC_SMEM <= smem[1] else None


def usable(dev, backward=False) -> bool:
    """Switched on (GN_STASH16, for this direction: DIRECTIONS) and the GPU takes cp.async (sm_80+)."""
    return GN_STASH16 and ("bwd" if backward else "fwd") in DIRECTIONS and sm80(dev)


def options(dtype, pinfo, backward, pipe=False):
    """NVRTC options of one configuration (scale / bias presence and the row's size are run-time arguments);
    ``pipe``: gn_bwdp's (NT_PIPE threads, one block an SM)."""
    scalar, accum, storage, _ = type_info(dtype)
    param, pstorage = pinfo
    nt, minb = (NT_PIPE, 1) if pipe else (NT, MINB_BWD if backward else MINB_FWD)
    return (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DPARAM={param}",
            f"-DPSTORAGE={pstorage}", f"-DNT={nt}", f"-DMINB={minb}", "-std=c++17")


_kernels: dict = {}


def _kernel(name, dtype, pinfo):
    pipe = name == "gn_bwdp"
    key = (name, _dev.dtype_name(dtype), pinfo, NT_PIPE if pipe else NT)
    k = _kernels.get(key)
    if k is None:
        src = SOURCE_PIPE if pipe else SOURCE
        k = _kernels[key] = _launch.get_kernel(src, name, options(dtype, pinfo, name == "gn_bwds", pipe))
    return k


def _pinfo(p):
    """(PARAM, PSTORAGE) of parameter array ``p`` (None: float32's, never read), None for a dtype not taken."""
    return _PSTORAGE.get("float32" if p is None else _dev.dtype_name(p.dtype))


def prepare_forward(x, num_groups, scale, bias, eps, flags, dev):
    """A Prepared gn_fwds launch called as go(x, scale, bias, y, mean, rstd) (norm_kernels' forward arrays), or None
    where `plan` does not take the rows.  ``flags``: bit 0 scale, bit 1 bias."""
    n, _, s, cpg, d = geometry(x, num_groups)
    pinfo = _pinfo(scale if scale is not None else bias)
    rows = n * num_groups
    if pinfo is None or rows >= 2 ** 31 - 4096:
        return None
    p = plan(d, s, x.dtype.itemsize, False, cpg, smem_limits(dev))
    if p is None:
        return None
    k = _kernel("gn_fwds", x.dtype, pinfo)
    return _launch.prepare(k, (n * num_groups,), (NT,),
                           [None] * 6 + [np.int32(d), np.int32(num_groups), np.int32(cpg), *_divider(s // 8),
                                         np.float64(eps), np.int32(flags & 3)], shared_mem=p[0])


def _pipe_grid(rows, dev):
    """gn_bwdp's grid: one block an SM (their shared memory allows no second), each walking rows b,
    b + grid, ... (the tests cut it to make a few blocks walk many rows)."""
    return min(rows, _launch.sm_count(dev))


def prepare_backward(x, num_groups, scale, dev):
    """A Prepared gn_bwds launch called as go(x, dy, mean, rstd, scale, sums, dx) (norm_kernels' gn_bwd2 arrays),
    or None where `plan` does not take the rows."""
    n, c, s, cpg, d = geometry(x, num_groups)
    pinfo = _pinfo(scale)
    rows = n * num_groups
    if pinfo is None or rows >= 2 ** 31 - 4096:
        return None
    if BWD_VARIANT == 2:
        q = plan_pipe(d, s, x.dtype.itemsize, cpg, smem_limits(dev))
        if q is not None:
            k = _kernel("gn_bwdp", x.dtype, pinfo)
            return _launch.prepare(k, (_pipe_grid(rows, dev),), (NT_PIPE,),
                                   [None] * 7 + [np.int32(rows), np.int32(d), np.int32(c), np.int32(num_groups),
                                                 np.int32(cpg), np.int32(s // 8), np.int32(q[1]), np.int32(q[2]),
                                                 np.int32(scale is not None)], shared_mem=q[0])
    p = plan(d, s, x.dtype.itemsize, True, cpg, smem_limits(dev))
    if p is None:
        return None
    k = _kernel("gn_bwds", x.dtype, pinfo)
    return _launch.prepare(k, (n * num_groups,), (NT,),
                           [None] * 7 + [np.int32(d), np.int32(c), np.int32(num_groups), np.int32(cpg),
                                         np.int32(s // 8), np.int32(scale is not None)], shared_mem=p[0])


if __name__ == "__main__":      # write the source with one configuration's defines, for an nvcc check
    import sys

    import ml_dtypes
    opts = options(np.dtype(ml_dtypes.bfloat16), ("float", 0), True)[:-1]
    _launch.write_source(sys.argv[1] if len(sys.argv) > 1 else "/tmp/norm_gn16.cu", SOURCE, [o[2:] for o in opts])
