"""Group norm of large groups with each group held on chip by a thread-block cluster (Hopper, sm_90+): forward in
one launch and backward in one launch (+ col_sum for dscale / dbias), reading x (and dy) from DRAM exactly once.

Shape legend: x, y, dy, dx (N, C, *S) C-contiguous float32 (`plan` refuses 16-bit data: norm_gn16 takes it), seen
as rows = N * G group rows of D = cpg * S values (cpg = C / G channels of S values, contiguous); a row is
nvec = D / VEC 16-byte vectors (VEC = 4 floats), a channel plane iv = S / VEC of them (S % VEC == 0: a vector lies in
one channel).  scale, bias (C,) float32 (PSTORAGE 0); mean, rstd (N, G) in A = float; sums (N, 2C) in A:
e = sum(dy * xhat) at c, s = sum(dy) at C + c, which norm_kernels' col_sum turns into dscale and dbias.

Why: norm_kernels' paths hold a row in the registers of ONE team of <= 512 threads (<= 8192 floats, 16384 halves).
A longer group row (GroupNorm(32, 256) on 56 x 56: 25088 values, 100 KB in float32) took the looped kernels: the
forward reads x twice (sums, then y: 66% of copy on an H200 in float32, 59% in bfloat16, when counted against one
read), the backward is row_sums + col_sum + gn_dx reading x and dy twice (49% / 41%).  Here a cluster of CL blocks
shares one group row: block `rank` keeps vectors [nvec * rank / CL, nvec * (rank + 1) / CL) raw in registers
(VPT <= 4 16-byte vectors of each array a thread), so the compulsory bytes are the only DRAM traffic, and small
blocks (NT = 256 threads, <= 40 / 64 registers) keep several group rows in flight on every SM.

Tiling: grid rows * CL blocks of NT threads, cluster = CL consecutive blocks (__cluster_dims__), group row
blockIdx.x / CL; thread t of block `rank` holds vectors lo + t + k * NT, k < VPT (consecutive threads, consecutive
16-byte addresses), where < hi.
  gn_fwdc  the block's sum b and, about the block's own mean b / n_b, its exact second moment m2 (two block sums
           over the registers); lane j < CL of warp 0 stores the pair into slot `rank` of block j's part[CL][2]
           through distributed shared memory; cluster barrier; every block combines its own CL slots in rank order
           (lane r of warp 0 holds block r's pair; Chan's parallel variance: mean = sum b / D,
           M2 = sum m2 + n_b (b / n_b - mean)^2) -- the same bits in every block; rank 0 writes mean, rstd;
           y = (x - mean) * rstd * scale[c] + bias[c] from the registers.
  gn_bwdc  per value d = x - mean, g = dy * scale[c]: the block sums (sum d, sum g, sum g d) and, per channel the
           block touches (MAXCH at most, a plane split over two blocks is touched by both), sum dy d and sum dy --
           from per-vector partials; one exchange through distributed shared memory: the triple into slot `rank` of
           every block's tri[CL][4], the channel pairs into slot `rank` of rank 0's chp[CL][2 MAXCH] (rank 0 alone
           reads them; only with scale);
           off = sum d / D re-centres x - mean on the row's own mean of the differences (the saved mean is rounded to
           A, norm_kernels' RECENTRE), sum g xhat = rstd (sum g d - off sum g), and
           dx = rstd (g - mean(g) - xhat mean(g xhat)), xhat = (d - off) rstd, from the registers; rank 0 adds each
           channel's partials over the blocks in rank order: e = rstd (sum dy d - off sum dy), s = sum dy.
The exchange is by remote STORES before the cluster barrier (session 25, as softmax_cluster's: the remote loads
after it, which this replaced, faulted on the GPU in some softmax_cluster builds): a relaxed arrive at the start
(the block has started), waited on just before the stores; a release arrive after them and an acquire wait before
each block reads its own slots, in the same rank order as the loads did (the same bits).  Nothing touches another
block's shared memory after the barrier, so no closing arrive / wait.  Deterministic; nothing read back to the host
(capturable in a graph).

Switch: GN_CLUSTER (MINIDNN_GN_CLUSTER, read at import; norm_kernels reads the attribute at planning time, so set
it and clear norm_kernels._plans for an in-process A/B): "1" routes float32 group-norm rows that no register path of
norm_kernels takes (row_config2 None: D > 8192) to these kernels where `plan` fits them; "0" keeps the looped kernels;
"1" is the default since session 17's run 3.  Never planned for rows norm_kernels holds in registers:
(128, 64, 56, 56) G=32 and every smaller shape keep their kernels.  16-bit rows never come here (session 18 removed
the switches MINIDNN_GN_CLUSTER_FWD16 / _BWD16; `plan` says why).
"""
from __future__ import annotations

import os

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from .bn_cluster import CLUSTER_HEADER, DSMEM_F32_HEADER
from .softmax_kernels import WARP_REDUCE
from .storage import LDE_HEADER, STORAGE_HEADER, type_info

__all__ = ["SOURCE", "GN_CLUSTER", "plan", "prepare_forward", "prepare_backward", "usable", "options"]

GN_CLUSTER = os.environ.get("MINIDNN_GN_CLUSTER", "1") == "1"
# Session 17's run 3 (H100, graph replays, looped kernels / clusters): float32 (32, 256, 56, 56) G=32 forward 1.37x
# (67% -> 91% of copy), backward 1.60x (53% -> 85%), (64, 96, 48, 48) G=8 1.46x / 1.63x, (16, 512, 28, 28) 1.04x /
# 1.49x; 16-bit backward 1.05-1.09x, but the 16-bit forward 0.94-0.95x (two vectors a thread: the blocks alternate
# loads and stores with too little in flight).  The H200 (session 17's last A/B): float32 forward 1.18-1.30x, backward
# 1.45-1.58x (70-77% of copy), but the 16-bit backward 0.94x at (32, 256, 56, 56) (1.04x at (64, 96, 48, 48)).  So
# on by default, for float32 only (16-bit: `plan`).
# threads a block (MINIDNN_GN_CLUSTER_NT, read at import; tools/norm_s17_ab.py's "new512" sets the attribute): 256,
# or 512 -- half the blocks a cluster (CL 4 for the table's float32 rows) and a cheaper meeting, half the blocks an
# SM; the register budgets are the same (the launch bounds' blocks an SM scale with 256 / NT).  Kept as a switch: 512
# won the backward (session 17: H100 run 3 1.07x on (32, 256, 56, 56), 1.04x on (64, 96, 48, 48); H200 run 6 1.09x)
# but lost the forward (0.95-0.96x) and sent (16, 512, 28, 28)'s backward back to the looped kernels (0.67x); one NT
# serves both directions, so 256 stays the default until a per-direction choice is built and measured.
NT = int(os.environ.get("MINIDNN_GN_CLUSTER_NT", "256"))
if NT not in (256, 512):
    raise ValueError(f"MINIDNN_GN_CLUSTER_NT: 256 or 512 threads a block, not {NT}")
# 16-byte vectors of one array a thread holds, by itemsize: 16 floats (float32 only: `plan`)
VPT_MAX = {4: 4}
CL_MAX = 8          # portable cluster sizes only
MAXCH_MAX = 4       # channels one block's vectors may touch (the backward's per-channel partials, registers)
MINB_FWD = 6        # launch bounds at 256 threads: <= 40 registers, six blocks an SM
MINB_BWD = 4        # <= 64 registers (two arrays held), four an SM


def minb(backward):
    """The launch bounds' blocks an SM at NT threads (the same registers a thread as at 256)."""
    return (MINB_BWD if backward else MINB_FWD) * 256 // NT

_PSTORAGE = {"float32": ("float", 0), "float16": ("float", 1), "bfloat16": ("float", 2)}

# The data conventions of the group-norm kernels here and in norm_gn16 (parameters PT / LDP, the raw 16-byte
# vector V and its value e, the divider), written once.
GN_DATA_HEADER = r"""
#if PSTORAGE == 0
typedef PARAM PT;
__device__ __forceinline__ A LDP(PT v) { return (A)v; }
#else
typedef unsigned short PT;
#if PSTORAGE == 1
__device__ __forceinline__ A LDP(PT h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
#else
__device__ __forceinline__ A LDP(PT h) { return __uint_as_float(((unsigned int)h) << 16); }
#endif
#endif
#define VEC (16 / (int)sizeof(T))
#define NW (NT / 32)
#define F_SCALE 1
#define F_BIAS 2
struct alignas(16) V { T v[VEC]; };
#define LDE_SCALAR (STORAGE == 0)
""" + LDE_HEADER + r"""__device__ __forceinline__ unsigned int divu(unsigned int n, unsigned int mul, unsigned int shr)
{
    return (__umulhi(n, mul) + n) >> shr;
}
"""

# K block sums in warp order (deterministic), shared with norm_gn16.
GN_BLOCK_SUMS = r"""
// K sums over the block: warp butterflies, then the warps added in order by thread j < K into out[j]; every thread
// may read out[] after it returns.  (wred is reused by the next call only after this call's last barrier.)
template <int K> __device__ __forceinline__ void block_sums(A (&v)[K], A* out)
{
    __shared__ A wred[NW][K];
#pragma unroll
    for (int j = 0; j < K; ++j) v[j] = warp_sum(v[j]);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int j = 0; j < K; ++j) wred[threadIdx.x >> 5][j] = v[j];
    }
    __syncthreads();
    if (threadIdx.x < K) {
        A t = 0;
#pragma unroll
        for (int w = 0; w < NW; ++w) t += wred[w][threadIdx.x];
        out[threadIdx.x] = t;
    }
    __syncthreads();
}
"""

SOURCE = STORAGE_HEADER + WARP_REDUCE + GN_DATA_HEADER + CLUSTER_HEADER + DSMEM_F32_HEADER + r"""
static_assert(sizeof(A) == 4, "float partials: bn_cluster's DSMEM_F32_HEADER");
static_assert(CL <= 32 && NT >= 32 + MAXCH, "the exchange's storers: warp 0 (CL lanes), warp 1 (MAXCH lanes)");
""" + GN_BLOCK_SUMS + r"""
// The partials' exchange (session 25, softmax_cluster's): each block stores its partials into slot `rank` of the
// blocks that read them (remote_st4 / remote_st2) before the cluster barrier, and every block reads
// only its own shared memory after it.  One meeting a launch, two barrier phases:
//   phase 1: cluster_arrive_relaxed() at the start (this block has started: its shared memory exists), waited on
//            just before the first remote store -- no store lands in a block that has not started;
//   phase 2: cluster_arrive() (release) after the stores, cluster_wait() (acquire) before the reads -- every block's
//            stores precede its arrive, so a block past the wait sees all CL slots.
// Each slot is written once a launch, by one block, and read only after phase 2, so no block ever overwrites a slot
// that is being read; no block touches another's shared memory after its phase-2 arrive, so nothing needs a closing
// arrive / wait to keep a block's shared memory alive (the remote LOADS after the barrier that this replaced, with
// such a closing wait, faulted on the GPU in some softmax_cluster builds: session 25).
// This block's vector range [lo, hi) of its group row.
__device__ __forceinline__ void block_range(int nvec, unsigned int rank, int& lo, int& hi)
{
    lo = (int)((long long)nvec * rank / CL);
    hi = (int)((long long)nvec * (rank + 1) / CL);
}

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, MINB)
gn_fwdc(const T* __restrict__ x, const PT* __restrict__ scale, const PT* __restrict__ bias, T* __restrict__ y,
        A* __restrict__ mean_out, A* __restrict__ rstd_out, const int D, const int G, const int cpg,
        const unsigned int iv_mul, const unsigned int iv_shr, const double eps, const int flags)
{
    // block j's (sum, second moment about its own mean) in part[j], stored there by block j (every block gets all)
    __shared__ __align__(8) A part[CL][2];
    __shared__ A tot[2];
    __shared__ A stat[2];
    cluster_arrive_relaxed();       // started (waited on before the stores)
    const unsigned int rank = cluster_rank();
    const long long r = blockIdx.x / CL;
    const int nvec = D / VEC;
    int lo, hi;
    block_range(nvec, rank, lo, hi);
    const V* xr = reinterpret_cast<const V*>(x + r * D);
    V a[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = lo + k * NT + (int)threadIdx.x;
        if (vi < hi) a[k] = xr[vi];
    }
    A s[1] = {0};
#pragma unroll
    for (int k = 0; k < VPT; ++k)
        if (lo + k * NT + (int)threadIdx.x < hi) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) s[0] += LDE(a[k], e);
        }
    block_sums<1>(s, tot);
    const A nb = (A)((hi - lo) * VEC);
    const A bmean = tot[0] / nb;
    A q[1] = {0};
#pragma unroll
    for (int k = 0; k < VPT; ++k)
        if (lo + k * NT + (int)threadIdx.x < hi) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) { const A d = LDE(a[k], e) - bmean; q[0] += d * d; }
        }
    block_sums<1>(q, tot + 1);
    cluster_wait();                 // every block of the cluster has started
    if (threadIdx.x < CL) remote_st2(part[rank], threadIdx.x, tot[0], tot[1]);
    cluster_arrive();
    cluster_wait();
    // Chan's combination in rank order, by warp 0 (lane j holds block j's pair): the same bits in every block
    if (threadIdx.x < 32) {
        A b = 0, m2 = 0, n = 0;
        if (threadIdx.x < CL) {
            int l, h;
            block_range(nvec, threadIdx.x, l, h);
            n = (A)((h - l) * VEC);
            b = part[threadIdx.x][0];
            m2 = part[threadIdx.x][1];
        }
        A sum = 0;
#pragma unroll
        for (int j = 0; j < CL; ++j) sum += __shfl_sync(0xffffffffu, b, j);
        const A mean = sum / (A)D;
        const A dm = n > (A)0 ? b / n - mean : (A)0;
        const A c = m2 + n * dm * dm;
        A M2 = 0;
#pragma unroll
        for (int j = 0; j < CL; ++j) M2 += __shfl_sync(0xffffffffu, c, j);
        if (threadIdx.x == 0) { stat[0] = mean; stat[1] = (A)1 / sqrt(M2 / (A)D + (A)eps); }
    }
    __syncthreads();
    const A mean = stat[0], rstd = stat[1];
    if (threadIdx.x == 0 && rank == 0) { mean_out[r] = mean; rstd_out[r] = rstd; }
    const int g0 = (int)((unsigned long long)r % (unsigned int)G) * cpg;
    V* yr = reinterpret_cast<V*>(y + r * D);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = lo + k * NT + (int)threadIdx.x;
        if (vi < hi) {
            A sc = rstd, bi = 0;
            if (flags & (F_SCALE | F_BIAS)) {
                const int p = g0 + (int)divu((unsigned int)vi, iv_mul, iv_shr);
                if (flags & F_SCALE) sc *= LDP(scale[p]);
                if (flags & F_BIAS) bi = LDP(bias[p]);
            }
            V w;
#pragma unroll
            for (int e = 0; e < VEC; ++e) w.v[e] = ST((LDE(a[k], e) - mean) * sc + bi);
            yr[vi] = w;
        }
    }
}

// Backward.  sums: (N, 2C); MAXCH: the most channels one block's range touches (host: plan).
extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, MINB)
gn_bwdc(const T* __restrict__ x, const T* __restrict__ dy, const A* __restrict__ mean, const A* __restrict__ rstd,
        const PT* __restrict__ scale, A* __restrict__ sums, T* __restrict__ dx, const int D, const int C, const int G,
        const int cpg, const int iv, const unsigned int iv_mul, const unsigned int iv_shr, const int flags)
{
    // own: this block's sums -- sum d, sum g, sum g d, then per touched channel j (block-local, from this block's
    // first channel): sum dy d at 3 + 2j, sum dy at 4 + 2j.  Block j stores its triple (and a pad) into tri[j] of
    // every block of the cluster, and its channel pairs into chp[j] of rank 0 (the only reader; F_SCALE only).
    __shared__ A own[3 + 2 * MAXCH];
    __shared__ __align__(16) A tri[CL][4];
    __shared__ __align__(8) A chp[CL][2 * MAXCH];
    __shared__ A tot[3];
    cluster_arrive_relaxed();       // started (waited on before the stores)
    const unsigned int rank = cluster_rank();
    const long long r = blockIdx.x / CL;
    const unsigned int n_ = (unsigned int)((unsigned long long)r / (unsigned int)G);
    const int g0 = (int)((unsigned int)r - n_ * (unsigned int)G) * cpg;
    const int nvec = D / VEC;
    int lo, hi;
    block_range(nvec, rank, lo, hi);
    const int clo = (int)divu((unsigned int)lo, iv_mul, iv_shr);
    const V* xr = reinterpret_cast<const V*>(x + r * D);
    const V* gr = reinterpret_cast<const V*>(dy + r * D);
    V a[VPT], b[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = lo + k * NT + (int)threadIdx.x;
        if (vi < hi) { a[k] = xr[vi]; b[k] = gr[vi]; }
    }
    const A mu = mean[r], is = rstd[r];
    A v[3 + 2 * MAXCH];
#pragma unroll
    for (int j = 0; j < 3 + 2 * MAXCH; ++j) v[j] = 0;
    A sc[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = lo + k * NT + (int)threadIdx.x;
        sc[k] = 1;
        if (vi < hi) {
            const int c = (int)divu((unsigned int)vi, iv_mul, iv_shr);
            if (flags & F_SCALE) sc[k] = LDP(scale[g0 + c]);
            A pe = 0, ps = 0;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A d = LDE(a[k], e) - mu, gy = LDE(b[k], e), g = gy * sc[k];
                v[0] += d; v[1] += g; v[2] += g * d;
                pe += gy * d; ps += gy;
            }
            const int lc = c - clo;
#pragma unroll
            for (int j = 0; j < MAXCH; ++j)
                if (lc == j) { v[3 + 2 * j] += pe; v[4 + 2 * j] += ps; }
        }
    }
    block_sums<3 + 2 * MAXCH>(v, own);
    cluster_wait();                 // every block of the cluster has started
    if (threadIdx.x < CL) {
        remote_st4(tri[rank], threadIdx.x, own[0], own[1], own[2], (A)0);
    } else if ((flags & F_SCALE) && threadIdx.x >= 32 && threadIdx.x < 32 + MAXCH) {    // warp 1: pairs to rank 0
        const int j = (int)threadIdx.x - 32;
        remote_st2(chp[rank] + 2 * j, 0, own[3 + 2 * j], own[4 + 2 * j]);
    }
    cluster_arrive();
    cluster_wait();
    if (threadIdx.x < 32) {         // the triple over the cluster, rank order (the same bits in every block)
        A t0 = 0, t1 = 0, t2 = 0;
        if (threadIdx.x < CL) {
            t0 = tri[threadIdx.x][0];
            t1 = tri[threadIdx.x][1];
            t2 = tri[threadIdx.x][2];
        }
        A s0 = 0, s1 = 0, s2 = 0;
#pragma unroll
        for (int j = 0; j < CL; ++j) {
            s0 += __shfl_sync(0xffffffffu, t0, j);
            s1 += __shfl_sync(0xffffffffu, t1, j);
            s2 += __shfl_sync(0xffffffffu, t2, j);
        }
        if (threadIdx.x == 0) { tot[0] = s0; tot[1] = s1; tot[2] = s2; }
    }
    __syncthreads();
    const A inv_d = (A)1 / (A)D;
    const A off = tot[0] * inv_d;
    const A c1 = tot[1] * inv_d, c2 = is * (tot[2] - off * tot[1]) * inv_d;
    if (rank == 0 && (flags & F_SCALE) && (int)threadIdx.x < cpg) {
        // channel t of the group: every block whose range touches it, in rank order
        const int c = threadIdx.x;
        A se = 0, ss = 0;
#pragma unroll
        for (int j = 0; j < CL; ++j) {
            int l, h;
            block_range(nvec, j, l, h);
            if (h <= l) continue;
            const int cl0 = (int)divu((unsigned int)l, iv_mul, iv_shr);
            const int cl1 = (int)divu((unsigned int)(h - 1), iv_mul, iv_shr);
            if (c < cl0 || c > cl1) continue;
            se += chp[j][2 * (c - cl0)];
            ss += chp[j][2 * (c - cl0) + 1];
        }
        A* out = sums + (long long)n_ * 2 * C + g0 + c;
        out[0] = is * (se - off * ss);
        out[C] = ss;
    }
    V* dr = reinterpret_cast<V*>(dx + r * D);
    const A ioff = off * is;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = lo + k * NT + (int)threadIdx.x;
        if (vi < hi) {
            V w;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A xhat = (LDE(a[k], e) - mu) * is - ioff;
                w.v[e] = ST(is * (LDE(b[k], e) * sc[k] - c1 - xhat * c2));
            }
            dr[vi] = w;
        }
    }
}
"""


def _divider(d):
    """(mul, shr) with n // d == (umulhi(n, mul) + n) >> shr for 0 <= n < 2**31 (norm_kernels.divider's form)."""
    shr = max(0, (int(d) - 1).bit_length())
    mul = ((1 << 32) * ((1 << shr) - int(d))) // int(d) + 1
    return np.uint32(mul & 0xFFFFFFFF), np.uint32(shr)


def ranges(nvec, cl):
    """[(lo, hi)] of the cluster's blocks (the kernels' block_range)."""
    return [(nvec * k // cl, nvec * (k + 1) // cl) for k in range(cl)]


def max_channels(nvec, cl, iv):
    """The most channel planes (of iv vectors) one block's range touches."""
    return max(((h - 1) // iv - lo // iv + 1) if h > lo else 0 for lo, h in ranges(nvec, cl))


def plan(d, s, itemsize, backward, cpg=1, force_cl=None):
    """(CL, VPT, MAXCH) of a cluster launch for group rows of ``d`` values in planes of ``s``, or None where the
    kernels do not take them: float32 data (16-byte vectors) with s a multiple of the vector, the smallest cluster
    (<= CL_MAX blocks) whose blocks hold their share in at most VPT_MAX[itemsize] vectors a thread; the backward
    also needs every block to touch at most MAXCH_MAX channels.  ``force_cl``: that size where it fits (A/B,
    tests)."""
    # 16-bit data is refused.  At the launch bounds' registers a thread holds two vectors of it (four spilled 44 /
    # 236 bytes forward / backward), too few bytes in flight: the clusters lost to the looped kernels on the H200
    # (session 17 run 6: 0.94x; session 18 run 2: forward 0.78-0.89x, backward 0.93-0.95x on (32, 256, 56, 56)
    # G=32 -- 1.03-1.07x only on (64, 96, 48, 48) G=8, where the stash ran 1.37x faster still), and norm_gn16's
    # shared-memory stash beat both (big row: forward 59% -> 72% of copy, backward 41% -> 63%).  The kernels' source
    # stays generic over T (its 16-bit loads are norm_gn16's too); git history has the 16-bit plans and switches.
    if itemsize != 4:
        return None
    vec = 16 // itemsize
    if s % vec or d % s or d < vec:
        return None
    nvec, iv = d // vec, s // vec
    sizes = [force_cl] if force_cl else range(1, CL_MAX + 1)
    for cl in sizes:
        if not 1 <= cl <= CL_MAX:
            return None
        vpt = -(-(-(-nvec // cl)) // NT)
        if vpt <= VPT_MAX[itemsize]:
            maxch = max(1, max_channels(nvec, cl, iv))
            if backward and (maxch > MAXCH_MAX or cpg > NT):
                return None
            return cl, vpt, maxch if backward else 1
    return None


def _cc(dev):
    try:
        return int(_launch.cupy().cuda.Device(dev).compute_capability)
    except Exception:       # noqa: BLE001 -- a fake CuPy: assume a Hopper
        return 90


def usable(dev) -> bool:
    """Switched on (GN_CLUSTER) and the GPU has clusters (compute capability 9.0 or newer)."""
    return GN_CLUSTER and _cc(dev) >= 90


def options(dtype, pinfo, cl, vpt, backward, maxch=1):
    """NVRTC options of one configuration (scale / bias presence is a run-time flag)."""
    scalar, accum, storage, _ = type_info(dtype)
    param, pstorage = pinfo
    return (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DPARAM={param}",
            f"-DPSTORAGE={pstorage}", f"-DCL={cl}", f"-DNT={NT}", f"-DVPT={vpt}",
            f"-DMINB={minb(backward)}", f"-DMAXCH={maxch}", "-std=c++17")


_kernels: dict = {}


def _kernel(name, dtype, pinfo, cl, vpt, maxch):
    key = (name, _dev.dtype_name(dtype), pinfo, cl, vpt, maxch, NT)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = _launch.get_kernel(SOURCE, name, options(dtype, pinfo, cl, vpt, name == "gn_bwdc",
                                                                     maxch))
    return k


def pinfo_of(x_dtype, p):
    """(PARAM, PSTORAGE) for parameter array ``p`` (None: float32's, never read -- the build of float32 parameters
    serves calls without them, one compilation fewer)."""
    return _PSTORAGE["float32" if p is None else _dev.dtype_name(p.dtype)]


def geometry(x, num_groups):
    """(n, c, plane size s, channels a group cpg, group row length d) of an (N, C, *) input in ``num_groups`` groups
    (norm_gn16's launches too)."""
    n, c = x.shape[:2]
    s = x.size // (n * c)
    cpg = c // num_groups
    return n, c, s, cpg, cpg * s


def prepare_forward(x, num_groups, scale, bias, eps, flags, force_cl=None):
    """A Prepared gn_fwdc launch called as go(x, scale, bias, y, mean, rstd) (norm_kernels' forward arrays), or None
    where `plan` does not take the rows.  ``flags``: bit 0 scale, bit 1 bias."""
    n, c, s, cpg, d = geometry(x, num_groups)
    p = plan(d, s, x.dtype.itemsize, False, cpg, force_cl)
    if p is None or n * num_groups * p[0] >= 2 ** 31:
        return None
    cl, vpt, _ = p
    k = _kernel("gn_fwdc", x.dtype, pinfo_of(x.dtype, scale if scale is not None else bias), cl, vpt, 1)
    iv = s // (16 // x.dtype.itemsize)
    return _launch.prepare(k, (n * num_groups * cl,), (NT,),
                           [None] * 6 + [np.int32(d), np.int32(num_groups), np.int32(cpg), *_divider(iv),
                                         np.float64(eps), np.int32(flags & 3)])


def prepare_backward(x, num_groups, scale, force_cl=None):
    """A Prepared gn_bwdc launch called as go(x, dy, mean, rstd, scale, sums, dx) (norm_kernels' gn_bwd2 arrays),
    or None where `plan` does not take the rows."""
    n, c, s, cpg, d = geometry(x, num_groups)
    p = plan(d, s, x.dtype.itemsize, True, cpg, force_cl)
    if p is None or n * num_groups * p[0] >= 2 ** 31:
        return None
    cl, vpt, maxch = p
    k = _kernel("gn_bwdc", x.dtype, pinfo_of(x.dtype, scale), cl, vpt, maxch)
    iv = s // (16 // x.dtype.itemsize)
    return _launch.prepare(k, (n * num_groups * cl,), (NT,),
                           [None] * 7 + [np.int32(d), np.int32(c), np.int32(num_groups), np.int32(cpg),
                                         np.int32(iv), *_divider(iv), np.int32(scale is not None)])


if __name__ == "__main__":      # write the source with one configuration's defines, for an nvcc check
    import sys
    opts = options(np.float32, ("float", 0), 7, 4, True, 2)[:-1]
    _launch.write_source(sys.argv[1] if len(sys.argv) > 1 else "/tmp/norm_gncl.cu", SOURCE, [o[2:] for o in opts])
