"""Layer norm, group norm and bias add on the GPU: one-pass row kernels, a deterministic column sum, bias add.

Shape legend (all C-contiguous; float32/float64, or float16/bfloat16 computed in float32):
    layer norm  x, y, dy, dx (rows, D): rows = prod(leading dims), D = prod(normalized dims); scale, bias (D,)
                mean, rstd (rows,) in A (float, double for float64 data);  parameter index p(j) = j
    group norm  x (N, C, *S) seen as rows = N*G rows of D = (C/G)*S values (a group of one sample is contiguous);
                scale, bias (C,); mean, rstd (N, G) in A;  parameter index p(j) = (row % G) * C/G + j / S
    bias add    y (outer, C, inner): NCHW outer = N, inner = S;  channels-last / (N, C) linear outer = N*S, inner = 1
                b (C,);  db (C,) = sum of dy over outer and inner
A is the accumulation type; scale/bias are x's dtype or float32 (PSTORAGE); dscale is A, dbias x's dtype (as the
reference returns them).

Tiling of the row kernels: a TEAM of threads (32 = one warp, 8 teams per 256-thread block; 64..512 = the whole
block) owns a row at a time, grid-stride over the rows.  Thread t of the team handles the 16-byte vectors (VEC values:
4 float, 2 double, 8 half) t, t + TEAM, ... of the row.
  VPT > 0 ("cached"): the row's VPT vectors per thread stay in registers: the mean is one team sum, the variance
        a second team sum of (x - mean)^2 over the registers (an exact two-pass, one read of x), then y is written
        from the registers.  Traffic: read x, write y.  Backward reads x and dy once, writes dx.
  VPT = 0 ("looped", rows longer than TEAM * VPT * VEC <= 8192 floats): shifted one-pass sums sum(x - K),
        sum((x - K)^2), K = the row's first value (the reference's _common.moments), then a second sweep writes y
        (the row is re-read, mostly from L2).  Team sums: warp shuffles, then one shared-memory slot per warp added
        in warp order (deterministic).
  norm_fwd   y = (x - mean) * rstd * scale[p] + bias[p]; writes mean, rstd per row.
  RECENTRE   (cached backward paths) xhat = (x - mean - mean(x - mean)) * rstd: the saved mean is rounded to A, and
             its offset d (~1 ulp of the mean) makes sum(xhat) = -D * d * rstd, an error of ~d * rstd^2 * |dy| in dx
             that swamped short rows with a small variance (2-value groups: 0.05% off in float32); the row's own
             mean of the exact differences x - mean removes it (one extra team sum).
  ln_bwd     dxh = dy * scale[j], dx = rstd * (dxh - mean(dxh) - xhat * mean(dxh * xhat)); each thread also keeps
             the column partials sum(dy * xhat), sum(dy) of its columns over the rows its team visits and writes
             them to partial[team][2D] at the end (registers when cached; its own partial row in global memory
             when looped); col_sum adds them over the teams -> dscale, dbias.
  gn_bwd     (group rows held in registers, C/G <= 32) one team per group row: dx from two team sums as ln_bwd
             (scale[c] per value), and the per-channel sums e = sum(dy * xhat), s = sum(dy) of the group's channels
             (each warp walks the few channels its lanes' values fall in, shuffle sums, lane k keeps channel k; the
             team adds its warps in order) -> sums[n][2C]; col_sum turns them into dscale, dbias.  One read.
  row_sums   (longer group rows) one team per plane (n, c) of S values: GN: e = sum(dy * xhat), s = sum(dy) ->
             out[n][2C] (e at c, s at C + c); BIAS: s = sum(dy) -> out[plane].
  gn_dx      one team per group row: c1 = sum_{c in g} scale[c] * s[n, c] / D, c2 = sum scale[c] * e[n, c] / D (a
             team sum over the group's channels), then dx = rstd * (dy * scale[c] - c1 - xhat * c2) in one sweep.
  col_sum    out[col] = sum over R rows of m[row][col] for an (R, NC) matrix: block (32 columns x 8 rows), grid
             (column tiles, row splits); each block sums its split into ws; the LAST block of a column tile
             (threadfence + ticket, reset by that block) adds the splits in order, in double.  Deterministic.
             Columns < SPLIT_COL go to an A output, the rest to a T output (dscale and dbias in one launch).
  col_sum_v  (session 9; the bias gradient of a channel-last / (N, C) dy, C a multiple of the 16-byte vector, dy
             aligned; COLSUM_VEC, MINIDNN_COLSUM_VEC=0: col_sum) the same sums with one 16-byte load a thread and
             row, blocks of 8 vector columns (128 bytes a row) x 32 rows, four loads in flight a thread.
  bias_add   y = alpha * b[c] + beta * x, grid-stride, VEC values per thread per iteration (x may be y: in place).
Group norm backward: gn_bwd + col_sum (x and dy read once) where the group row fits in registers, else row_sums,
col_sum (dscale, dbias), gn_dx -- 3 launches, x and dy read twice;
layer norm backward: ln_bwd + col_sum.  Nothing is read back to the host: every launch can be captured in a CUDA graph.

Version 2 (the default; MINIDNN_NORM_V1=1 keeps the kernels and configurations above), for rows that fill 16-byte
vectors and fit registers (row_config2): norm_fwd2, gn_bwd2, ln_bwd2 -- the same algorithms, with
  - the row's vectors kept RAW in registers (16-bit data: 2 bytes a value, converted at each use) and up to 4
    vectors per thread (v1: 8 values), so 16-bit rows put 64 bytes per array and thread in flight, not 16;
  - launch bounds capping registers (v1's gn_bwd took 91: one 512-thread row per SM, whose load, block sums and
    store then ran one after another -- 54% of copy bandwidth in float32, 37% in bfloat16);
  - layer-norm parameters loaded as vectors, a group-norm vector's channel found once (F_PVEC, F_CHV);
  - ln_bwd2: teams of 32..128 threads share 256-thread blocks (named barriers), keep their columns' scale in
    registers and their column partials in shared memory (v1: registers), added in the block: one partial row per
    resident block for col_sum (v1: one per team, 8.6 MB for (16384, 1024)).
  bias_grad_planes: the NCHW bias gradient in one launch (v1: row_sums + col_sum), last block per channel adding.
  ln_fwd3 (16-bit layer norm forward, rows <= 4096 values): teams of 32..256 threads in 256-thread blocks keep
    their columns' scale and bias in registers across the rows they walk (a grid of the resident blocks), the next
    row's vectors loaded before the current row's sums.  LN3_SMEM=1 (route "v3s", the default): scale and bias in
    shared memory, one copy per block (fewer registers, more resident teams).
  gn_bwd2 with GN_CHV=1 (vectors in one channel): the scale / channel flags fixed at compile time.
  gn_bwd2 with GN_VCS=1 (session 9 round 2; GN_VSUMS, on): GN_CHV rows' per-channel sums from per-vector partials.
Which version a case takes: ROUTE / _version (MINIDNN_NORM_ROUTE), see there.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from . import norm_gn16 as _gn16
from . import norm_gncl as _gncl
from . import workspace as _ws
from .softmax_kernels import WARP_REDUCE
from .storage import LDE_HEADER, STORAGE_HEADER, param_dtype, type_info

__all__ = ["supports_layer_norm", "supports_group_norm", "supports_stats", "supports_bias",
           "supports_bias_grad", "layer_norm_forward",
           "layer_norm_backward", "group_norm_forward", "group_norm_backward", "bias_add", "bias_grad", "SOURCE"]

SOURCE = STORAGE_HEADER + WARP_REDUCE + r"""
#if PSTORAGE == 0
typedef PARAM PT;
__device__ __forceinline__ A LDP(PT v) { return (A)v; }
#else
typedef unsigned short PT;
#if PSTORAGE == 1
__device__ __forceinline__ A LDP(PT h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return (A)f; }
#else
__device__ __forceinline__ A LDP(PT h) { return (A)__uint_as_float(((unsigned int)h) << 16); }
#endif
#endif

#ifndef MINB
#define MINB 1
#endif
#ifndef GN_CHV
#define GN_CHV 0
#endif
#ifndef LN3_SMEM
#define LN3_SMEM 0
#endif
#ifndef GN_VCS
#define GN_VCS 0
#endif
#define TPB (BLOCK / TEAM)          // teams per block (TEAM > 32: one team = the block, so block barriers are safe)
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };

// n / d for 0 <= n < 2^31 with (mul, shr) from the host: (umulhi(n, mul) + n) >> shr.
__device__ __forceinline__ unsigned int divu(unsigned int n, unsigned int mul, unsigned int shr)
{
    return (__umulhi(n, mul) + n) >> shr;
}

// Sum of (a, b) over the team; every thread of the team gets it.  red: BLOCK / 32 pairs of shared memory.
__device__ __forceinline__ void team_sum2(A& a, A& b, A (*red)[2])
{
    a = warp_sum(a); b = warp_sum(b);
#if TEAM > 32
    __syncthreads();                               // the previous call's readers are done with red
    if ((threadIdx.x & 31) == 0) { red[threadIdx.x >> 5][0] = a; red[threadIdx.x >> 5][1] = b; }
    __syncthreads();
    a = 0; b = 0;
#pragma unroll
    for (int w = 0; w < TEAM / 32; ++w) { a += red[w][0]; b += red[w][1]; }
#endif
}

// Run-time flags (one compiled kernel serves both norms, with and without affine parameters; the branches are
// uniform across the grid): bit 0 scale, bit 1 bias, bit 2 grouped (group norm's parameter index).
#define F_SCALE 1
#define F_BIAS 2
#define F_GROUPED 4

// The parameter index of value j of row r (grouped: channel (r % G) * cpg + j / S, with g0 = (r % G) * cpg).
__device__ __forceinline__ int pidx(int j, int g0, unsigned int s_mul, unsigned int s_shr, int flags)
{
    return (flags & F_GROUPED) ? g0 + (int)divu((unsigned int)j, s_mul, s_shr) : j;
}

__device__ __forceinline__ A affine(A v, int p, const PT* __restrict__ scale, const PT* __restrict__ bias, int flags)
{
    if (flags & F_SCALE) v *= LDP(scale[p]);
    if (flags & F_BIAS) v += LDP(bias[p]);
    return v;
}

// The forward kernels' arguments (norm_fwd, norm_fwd2, ln_fwd3: the host launches any of them with the same list): x,
// the affine parameters, y, the saved statistics, the rows of D values, group norm's mapping (G groups of cpg
// channels, the channel of a value by s_mul / s_shr), eps and the F_ flags.
#define FWD_ARGS const T* __restrict__ x, const PT* __restrict__ scale, const PT* __restrict__ bias,             \
                 T* __restrict__ y, A* __restrict__ mean_out, A* __restrict__ rstd_out, const long long rows,         \
                 const int D, const int G, const int cpg, const unsigned int s_mul, const unsigned int s_shr,          \
                 const double eps, const int flags

extern "C" __global__ void __launch_bounds__(BLOCK)
norm_fwd(FWD_ARGS)
{
    __shared__ A red[BLOCK / 32][2];
    const int t = threadIdx.x % TEAM;
    const int nvec = D / VEC;
    const A inv_d = (A)1 / (A)D;
    for (long long r = (long long)blockIdx.x * TPB + threadIdx.x / TEAM; r < rows; r += (long long)gridDim.x * TPB) {
        const V* xr = reinterpret_cast<const V*>(x + r * D);
        V* yr = reinterpret_cast<V*>(y + r * D);
        const int g0 = (flags & F_GROUPED) ? (int)((unsigned int)r % (unsigned int)G) * cpg : 0;  // r < 2^31
        A mean, rstd;
#if VPT > 0
        A v[VPT][VEC];
        A s = 0, unused = 0;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (vi < nvec) {
                const V a = xr[vi];
#pragma unroll
                for (int e = 0; e < VEC; ++e) { v[k][e] = LD(a.v[e]); s += v[k][e]; }
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) v[k][e] = 0;
            }
        }
        team_sum2(s, unused, red);
        mean = s * inv_d;
        A q = 0;
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (k * TEAM + t < nvec) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) { const A d = v[k][e] - mean; q += d * d; }
            }
        unused = 0;
        team_sum2(q, unused, red);
        rstd = (A)1 / sqrt(q * inv_d + (A)eps);
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (vi < nvec) {
                V o;
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    o.v[e] = ST(affine((v[k][e] - mean) * rstd, pidx(vi * VEC + e, g0, s_mul, s_shr, flags), scale,
                                       bias, flags));
                yr[vi] = o;
            }
        }
#else
        const A K = LD(x[r * D]);
        A s1 = 0, s2 = 0;
#pragma unroll 4
        for (int vi = t; vi < nvec; vi += TEAM) {
            const V a = xr[vi];
#pragma unroll
            for (int e = 0; e < VEC; ++e) { const A d = LD(a.v[e]) - K; s1 += d; s2 += d * d; }
        }
        team_sum2(s1, s2, red);
        const A md = s1 * inv_d;
        const A var = s2 * inv_d - md * md;
        mean = K + md;
        rstd = (A)1 / sqrt((var > (A)0 ? var : (A)0) + (A)eps);
#pragma unroll 4
        for (int vi = t; vi < nvec; vi += TEAM) {
            const V a = xr[vi];
            V o;
#pragma unroll
            for (int e = 0; e < VEC; ++e)
                o.v[e] = ST(affine((LD(a.v[e]) - mean) * rstd, pidx(vi * VEC + e, g0, s_mul, s_shr, flags), scale, bias,
                                   flags));
            yr[vi] = o;
        }
#endif
        if (t == 0) { mean_out[r] = mean; rstd_out[r] = rstd; }
    }
}

// Layer norm backward: dx per row, and (flags & F_SCALE) this team's column partials -> partial[team][0..D) = sum(dy *
// xhat), partial[team][D..2D) = sum(dy), over the rows the team visited (zeros for a team that got none).
extern "C" __global__ void __launch_bounds__(BLOCK)
ln_bwd(const T* __restrict__ x, const T* __restrict__ dy, const A* __restrict__ mean, const A* __restrict__ rstd,
       const PT* __restrict__ scale, T* __restrict__ dx, A* __restrict__ partial, const long long rows, const int D,
       const int flags)
{
    const bool has_scale = flags & F_SCALE;
    __shared__ A red[BLOCK / 32][2];
    const int t = threadIdx.x % TEAM;
    const int nvec = D / VEC;
    const A inv_d = (A)1 / (A)D;
    const long long team = (long long)blockIdx.x * TPB + threadIdx.x / TEAM;
    A* pg = partial + team * 2 * D;        // this team's partial row (has_scale)
#if VPT > 0
    A acc_g[VPT][VEC], acc_b[VPT][VEC];
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
        for (int e = 0; e < VEC; ++e) { acc_g[k][e] = 0; acc_b[k][e] = 0; }
#endif
#if VPT == 0
    bool first = true;
#endif
    for (long long r = team; r < rows; r += (long long)gridDim.x * TPB) {
        const V* xr = reinterpret_cast<const V*>(x + r * D);
        const V* gr = reinterpret_cast<const V*>(dy + r * D);
        V* dr = reinterpret_cast<V*>(dx + r * D);
        const A mu = mean[r], is = rstd[r];
        A s1 = 0, s2 = 0;
#if VPT > 0
        // x - mean re-centred on the row's own mean of (x - mean): the saved mean is rounded to A, and that offset
        // (~1 ulp of the mean) times rstd^2 swamps dx of short rows with a small variance (RECENTRE, above)
        A xh[VPT][VEC], dh[VPT][VEC], gv[VPT][VEC];
        A cs = 0;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
#pragma unroll
            for (int e = 0; e < VEC; ++e) { xh[k][e] = 0; dh[k][e] = 0; gv[k][e] = 0; }
            if (vi < nvec) {
                const V a = xr[vi], b = gr[vi];
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    gv[k][e] = LD(b.v[e]);
                    xh[k][e] = LD(a.v[e]) - mu;
                    dh[k][e] = has_scale ? gv[k][e] * LDP(scale[vi * VEC + e]) : gv[k][e];
                    cs += xh[k][e]; s1 += dh[k][e];
                }
            }
        }
        team_sum2(cs, s1, red);
        const A off = cs * inv_d;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            if (k * TEAM + t < nvec) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    xh[k][e] = (xh[k][e] - off) * is;
                    if (has_scale) { acc_g[k][e] += gv[k][e] * xh[k][e]; acc_b[k][e] += gv[k][e]; }
                    s2 += dh[k][e] * xh[k][e];
                }
            }
        }
        A unused = 0;
        team_sum2(s2, unused, red);
        const A c1 = s1 * inv_d, c2 = s2 * inv_d;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (vi < nvec) {
                V o;
#pragma unroll
                for (int e = 0; e < VEC; ++e) o.v[e] = ST(is * (dh[k][e] - c1 - xh[k][e] * c2));
                dr[vi] = o;
            }
        }
#else
#pragma unroll 4
        for (int vi = t; vi < nvec; vi += TEAM) {
            const V a = xr[vi], b = gr[vi];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A xh = (LD(a.v[e]) - mu) * is;
                const A dh = has_scale ? LD(b.v[e]) * LDP(scale[vi * VEC + e]) : LD(b.v[e]);
                s1 += dh; s2 += dh * xh;
            }
        }
        team_sum2(s1, s2, red);
        const A c1 = s1 * inv_d, c2 = s2 * inv_d;
        for (int vi = t; vi < nvec; vi += TEAM) {
            const V a = xr[vi], b = gr[vi];
            V o;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const int j = vi * VEC + e;
                const A g = LD(b.v[e]);
                const A xh = (LD(a.v[e]) - mu) * is;
                A dh = g;
                if (has_scale) {
                    dh = g * LDP(scale[j]);
                    pg[j] = first ? g * xh : pg[j] + g * xh;      // this team's own row: no other writer
                    pg[D + j] = first ? g : pg[D + j] + g;
                }
                o.v[e] = ST(is * (dh - c1 - xh * c2));
            }
            dr[vi] = o;
        }
        first = false;
#endif
    }
    if (!has_scale) return;
#if VPT > 0
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = k * TEAM + t;
        if (vi < nvec) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) { pg[vi * VEC + e] = acc_g[k][e]; pg[D + vi * VEC + e] = acc_b[k][e]; }
        }
    }
#else
    if (first)       // a team that got no row still owns a partial row: zeros
        for (int j = t; j < 2 * D; j += TEAM) pg[j] = 0;
#endif
}

// Per plane q of L values (grouped: q = n * C + c, L = S; else bias: q = o * C + c, L = inner):
//   grouped: out[n * 2C + c] = sum dy * (x - mean[n, g]) * rstd[n, g],  out[n * 2C + C + c] = sum dy
//   bias:    out[q] = sum dy
extern "C" __global__ void __launch_bounds__(BLOCK)
row_sums(const T* __restrict__ dy, const T* __restrict__ x, const A* __restrict__ mean, const A* __restrict__ rstd,
         A* __restrict__ out, const long long planes, const int L, const int C, const int G, const int cpg,
         const int flags)
{
    __shared__ A red[BLOCK / 32][2];
    const int t = threadIdx.x % TEAM;
    const int nvec = L / VEC;
    for (long long q = (long long)blockIdx.x * TPB + threadIdx.x / TEAM; q < planes; q += (long long)gridDim.x * TPB) {
        const V* gr = reinterpret_cast<const V*>(dy + q * L);
        A s = 0, e1 = 0;
        if (flags & F_GROUPED) {
        const long long n = (unsigned int)q / (unsigned int)C;       // 32-bit: q < 2^31
        const int c = (int)(q - n * C);
        const long long row = n * G + c / cpg;
        const A mu = mean[row], is = rstd[row];
        const V* xr = reinterpret_cast<const V*>(x + q * L);
#pragma unroll 4
        for (int vi = t; vi < nvec; vi += TEAM) {
            const V a = xr[vi], b = gr[vi];
#pragma unroll
            for (int e = 0; e < VEC; ++e) { const A g = LD(b.v[e]); s += g; e1 += g * (LD(a.v[e]) - mu); }
        }
        team_sum2(e1, s, red);
        if (t == 0) { out[n * 2 * C + c] = e1 * is; out[n * 2 * C + C + c] = s; }
        } else {
#pragma unroll 4
        for (int vi = t; vi < nvec; vi += TEAM) {
            const V b = gr[vi];
#pragma unroll
            for (int e = 0; e < VEC; ++e) s += LD(b.v[e]);
        }
        team_sum2(s, e1, red);
        if (t == 0) out[q] = s;
        }
    }
}

// Group norm backward in one read (rows held in registers, C/G <= 32): one team per group row r = n * G + g.
// dx = rstd * (dy * scale[c] - mean(dy * scale) - xhat * mean(dy * scale * xhat)) from two team sums, and the
// per-channel sums e[n, c] = sum_s dy * xhat, s[n, c] = sum_s dy -> sums[n][2C] (e at c, s at C + c) for col_sum.
// Per channel: each lane's values lie in a few consecutive channels; the warp walks the channels its lanes touch
// (warp-uniform range), sums each by shuffles, and lane k keeps channel g0 + k; a team of several warps then adds
// its warps' results in warp order (shared memory).  Deterministic, no atomics.
extern "C" __global__ void __launch_bounds__(BLOCK)
gn_bwd(const T* __restrict__ x, const T* __restrict__ dy, const A* __restrict__ mean, const A* __restrict__ rstd,
       const PT* __restrict__ scale, A* __restrict__ sums, T* __restrict__ dx, const long long rows, const int D,
       const int C, const int G, const int cpg, const unsigned int s_mul, const unsigned int s_shr, const int flags)
{
#if VPT > 0
    const bool has_scale = flags & F_SCALE;
    __shared__ A red[BLOCK / 32][2];
#if TEAM > 32
    __shared__ A wsum[BLOCK / 32][32][2];
    const int warp = threadIdx.x >> 5;
#endif
    const int t = threadIdx.x % TEAM, lane = threadIdx.x & 31;
    const int nvec = D / VEC;
    const A inv_d = (A)1 / (A)D;
    for (long long r = (long long)blockIdx.x * TPB + threadIdx.x / TEAM; r < rows; r += (long long)gridDim.x * TPB) {
        const unsigned int n = (unsigned int)r / (unsigned int)G;          // r < 2^31
        const int g0 = (int)((unsigned int)r - n * (unsigned int)G) * cpg;
        const V* xr = reinterpret_cast<const V*>(x + r * D);
        const V* gr = reinterpret_cast<const V*>(dy + r * D);
        V* dr = reinterpret_cast<V*>(dx + r * D);
        const A mu = mean[r], is = rstd[r];
        A xh[VPT][VEC], gv[VPT][VEC];
        int lc[VPT][VEC];                    // the channel of each value within the group (0 .. cpg - 1)
        A s1 = 0, s2 = 0, cs = 0;
        int clo = 1 << 30, chi = -1;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (vi < nvec) {
                const V a = xr[vi], b = gr[vi];
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    lc[k][e] = (int)divu((unsigned int)(vi * VEC + e), s_mul, s_shr);
                    xh[k][e] = LD(a.v[e]) - mu;
                    gv[k][e] = LD(b.v[e]);
                    cs += xh[k][e];
                    s1 += has_scale ? gv[k][e] * LDP(scale[g0 + lc[k][e]]) : gv[k][e];
                }
                clo = min(clo, lc[k][0]); chi = max(chi, lc[k][VEC - 1]);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) { lc[k][e] = -1; xh[k][e] = 0; gv[k][e] = 0; }
            }
        }
        // re-centred as in ln_bwd: the rounded saved mean's offset, times rstd^2, swamped dx of 2-value groups
        team_sum2(cs, s1, red);
        const A off = cs * inv_d;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            if (k * TEAM + t < nvec) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    xh[k][e] = (xh[k][e] - off) * is;
                    s2 += (has_scale ? gv[k][e] * LDP(scale[g0 + lc[k][e]]) : gv[k][e]) * xh[k][e];
                }
            }
        }
        A unused = 0;
        team_sum2(s2, unused, red);
        const A c1 = s1 * inv_d, c2 = s2 * inv_d;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (vi < nvec) {
                V o;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A sc = has_scale ? LDP(scale[g0 + lc[k][e]]) : (A)1;
                    o.v[e] = ST(is * (gv[k][e] * sc - c1 - xh[k][e] * c2));
                }
                dr[vi] = o;
            }
        }
        // per-channel sums over the channels this warp touches
        const int wlo = -warp_max(-clo), whi = warp_max(chi);
        A me = 0, ms = 0;
        for (int k = wlo; k <= whi; ++k) {
            A pe = 0, ps = 0;
#pragma unroll
            for (int i = 0; i < VPT; ++i)
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    if (lc[i][e] == k) { pe += gv[i][e] * xh[i][e]; ps += gv[i][e]; }
            pe = warp_sum(pe); ps = warp_sum(ps);
            if (lane == k) { me = pe; ms = ps; }
        }
        A* out = sums + (long long)n * 2 * C + g0;
#if TEAM > 32
        if (lane < cpg) { wsum[warp][lane][0] = me; wsum[warp][lane][1] = ms; }
        __syncthreads();
        if (t < cpg) {
            A e1 = 0, e2 = 0;
            for (int w = 0; w < TEAM / 32; ++w) { e1 += wsum[w][t][0]; e2 += wsum[w][t][1]; }
            out[t] = e1; out[C + t] = e2;
        }
#else
        if (lane < cpg) { out[lane] = me; out[C + lane] = ms; }
#endif
    }
#endif
}

// Group norm dx, one team per group row r = n * G + g: sums = row_sums' (N, 2C) output.
extern "C" __global__ void __launch_bounds__(BLOCK)
gn_dx(const T* __restrict__ x, const T* __restrict__ dy, const A* __restrict__ mean, const A* __restrict__ rstd,
      const PT* __restrict__ scale, const A* __restrict__ sums, T* __restrict__ dx, const long long rows, const int D,
      const int C, const int G, const int cpg, const unsigned int s_mul, const unsigned int s_shr, const int flags)
{
    const bool has_scale = flags & F_SCALE;
    __shared__ A red[BLOCK / 32][2];
    const int t = threadIdx.x % TEAM;
    const int nvec = D / VEC;
    const A inv_d = (A)1 / (A)D;
    for (long long r = (long long)blockIdx.x * TPB + threadIdx.x / TEAM; r < rows; r += (long long)gridDim.x * TPB) {
        const long long n = (unsigned int)r / (unsigned int)G;
        const int g0 = (int)(r - n * G) * cpg;
        const A* e_n = sums + n * 2 * C;
        A c1 = 0, c2 = 0;
        for (int k = t; k < cpg; k += TEAM) {
            const A sc = has_scale ? LDP(scale[g0 + k]) : (A)1;
            c1 += sc * e_n[C + g0 + k]; c2 += sc * e_n[g0 + k];
        }
        team_sum2(c1, c2, red);
        c1 *= inv_d; c2 *= inv_d;
        const A mu = mean[r], is = rstd[r];
        const V* xr = reinterpret_cast<const V*>(x + r * D);
        const V* gr = reinterpret_cast<const V*>(dy + r * D);
        V* dr = reinterpret_cast<V*>(dx + r * D);
#pragma unroll 4
        for (int vi = t; vi < nvec; vi += TEAM) {
            const V a = xr[vi], b = gr[vi];
            V o;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A sc = has_scale ? LDP(scale[pidx(vi * VEC + e, g0, s_mul, s_shr, F_GROUPED)]) : (A)1;
                const A xh = (LD(a.v[e]) - mu) * is;
                o.v[e] = ST(is * (LD(b.v[e]) * sc - c1 - xh * c2));
            }
            dr[vi] = o;
        }
    }
}

// Column sums of an (R, NC) matrix m (IN_T: x's storage type, else A), see the legend.  Block: 256 threads =
// 32 columns (tx) x 8 rows (ty); grid (column tiles, splits).  ws: NC * splits partial sums; ticket: one per tile.
#if IN_T
typedef T MT;
__device__ __forceinline__ A LDM(MT v) { return LD(v); }
#else
typedef A MT;
__device__ __forceinline__ A LDM(MT v) { return v; }
#endif

extern "C" __global__ void __launch_bounds__(256)
col_sum(const MT* __restrict__ m, A* __restrict__ ws, unsigned int* ticket, A* __restrict__ out_a,
        T* __restrict__ out_t, const long long R, const int NC, const int split_col, const long long chunk)
{
    __shared__ double sd[8][32];
    __shared__ bool last;
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int col = blockIdx.x * 32 + tx;
    const long long r0 = (long long)blockIdx.y * chunk;
    const long long r1 = r0 + chunk < R ? r0 + chunk : R;
    A s = 0;
    if (col < NC) {
#pragma unroll 4
        for (long long r = r0 + ty; r < r1; r += 8) s += LDM(m[r * NC + col]);
    }
    sd[ty][tx] = (double)s;
    __syncthreads();
    if (ty == 0) {
        double a = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) a += sd[k][tx];
        if (col < NC) ws[(long long)col * gridDim.y + blockIdx.y] = (A)a;
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    double a = 0;
    if (col < NC)
        for (int b = ty; b < (int)gridDim.y; b += 8) a += (double)ws[(long long)col * gridDim.y + b];
    sd[ty][tx] = a;
    __syncthreads();
    if (ty == 0 && col < NC) {
        double tot = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) tot += sd[k][tx];
        if (col < split_col) out_a[col] = (A)tot; else out_t[col - split_col] = ST((A)tot);
    }
    if (threadIdx.x == 0) ticket[blockIdx.x] = 0u;
}

// Column sums, vector form (session 9; the bias gradient of a channel-last / (N, C) dy: x's storage type, NC % VEC
// == 0, 16-byte aligned; MINIDNN_COLSUM_VEC=0: col_sum).  Block: 256 threads = CX vector columns (tx; VEC columns,
// one 16-byte load a row) x CS_RY = 256 / CX rows (ty), so a warp reads 32 / CX rows of CX * 16 contiguous bytes
// (whole 128-byte lines at CX = 8); grid (column tiles of CS_COLS = CX * VEC columns, row splits of `chunk`).  Each
// thread sums rows r0 + ty, r0 + ty + CS_RY, ... of its VEC columns in A (four 16-byte loads in flight: col_sum had
// one 4-byte load a thread, 16 KB in flight an SM against Little's ~32 KB on an H200); the block adds its CS_RY
// row sums in order (double; CS_PARTS threads a column, then the parts in order) into ws[col * splits + split]; the
// LAST block of a tile (threadfence + ticket, reset by that block) adds the splits the same way.  Deterministic.
#ifndef CX
#define CX 8
#endif
#define CS_COLS (CX * VEC)
#define CS_RY (256 / CX)
#define CS_PARTS (256 / CS_COLS)
extern "C" __global__ void __launch_bounds__(256)
col_sum_v(const T* __restrict__ m, A* __restrict__ ws, unsigned int* ticket, A* __restrict__ out_a,
          T* __restrict__ out_t, const int R, const int NC, const int split_col, const int chunk)
{
    __shared__ double sd[CS_RY][CS_COLS];
    __shared__ double sp[CS_PARTS][CS_COLS];
    __shared__ bool last;
    const int tx = threadIdx.x % CX, ty = threadIdx.x / CX;
    const int vc = blockIdx.x * CX + tx;                 // this thread's vector column
    const int r0 = blockIdx.y * chunk;
    const int r1 = r0 + chunk < R ? r0 + chunk : R;
    A acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = 0;
    if (vc * VEC < NC) {
        const V* p = reinterpret_cast<const V*>(m) + vc;
        const size_t nvr = (size_t)(NC / VEC);
        int r = r0 + ty;
        for (; r + 3 * CS_RY < r1; r += 4 * CS_RY) {      // four loads issued, then added in row order
            V u[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) u[k] = p[(size_t)(r + k * CS_RY) * nvr];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) acc[e] += LD(u[k].v[e]);
            }
        }
        for (; r < r1; r += CS_RY) {
            const V u = p[(size_t)r * nvr];
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] += LD(u.v[e]);
        }
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) sd[ty][tx * VEC + e] = (double)acc[e];
    __syncthreads();
    const int c = threadIdx.x % CS_COLS, part = threadIdx.x / CS_COLS;
    double a = 0;
    for (int k = part; k < CS_RY; k += CS_PARTS) a += sd[k][c];
    sp[part][c] = a;
    __syncthreads();
    const int col = blockIdx.x * CS_COLS + (int)threadIdx.x;        // threads < CS_COLS: one column each
    if (threadIdx.x < CS_COLS) {
        double t = 0;
#pragma unroll
        for (int k = 0; k < CS_PARTS; ++k) t += sp[k][threadIdx.x];
        if (col < NC) ws[(size_t)col * gridDim.y + blockIdx.y] = (A)t;
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int cc = blockIdx.x * CS_COLS + c;
    double b = 0;
    if (cc < NC)
        for (int k = part; k < (int)gridDim.y; k += CS_PARTS) b += (double)ws[(size_t)cc * gridDim.y + k];
    sp[part][c] = b;                       // the reads of sp above ended at the barriers since
    __syncthreads();
    if (threadIdx.x < CS_COLS && col < NC) {
        double t = 0;
#pragma unroll
        for (int k = 0; k < CS_PARTS; ++k) t += sp[k][threadIdx.x];
        if (col < split_col) out_a[col] = (A)t; else out_t[col - split_col] = ST((A)t);
    }
    if (threadIdx.x == 0) ticket[blockIdx.x] = 0u;
}

// y = alpha * b[c] + beta * x (x is not read when beta == 0: a NaN there does not leak), c = (i / inner) % C.
extern "C" __global__ void __launch_bounds__(256)
bias_add(const T* x, const PT* __restrict__ b, T* y,      // x may be y: no __restrict__
         const long long n, const int C,
         const unsigned int c_mul, const unsigned int c_shr, const unsigned int in_mul, const unsigned int in_shr,
         const int inner1, const double alpha, const double beta)
{
    const long long nv = n / VEC;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const A al = (A)alpha, be = (A)beta;
    const bool read_x = beta != 0.0;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < nv; k += stride) {
        V a;
        if (read_x) a = reinterpret_cast<const V*>(x)[k];
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            unsigned int q = (unsigned int)(k * VEC + e);
            if (!inner1) q = divu(q, in_mul, in_shr);
            const int c = (int)(q - divu(q, c_mul, c_shr) * (unsigned int)C);
            A v = al * LDP(b[c]);
            if (read_x) v += be * LD(a.v[e]);
            o.v[e] = ST(v);
        }
        reinterpret_cast<V*>(y)[k] = o;
    }
}
// ==== Version 2 (issue 10: memory-bound kernels at >= 70% of copy bandwidth) ===================================
// norm_fwd2, gn_bwd2, ln_bwd2 hold a row's 16-byte vectors RAW in registers (V: 4 registers per vector whatever
// the dtype, so a 16-bit row costs half the registers of its floats; every pass converts again, a shift or a cvt)
// and are compiled with __launch_bounds__(BLOCK, MINB), MINB = 1024 / BLOCK for the forward and gn_bwd2 (<= 64
// registers: two 512-thread rows, or four 256-thread rows, in flight per SM -- the v1 gn_bwd took 91 registers,
// one 512-thread row per SM, whose load, two block sums and store then ran one after another).
// Affine parameters: F_PVEC (host: parameter pointers 16-byte aligned, VEC > 1): layer norm loads the VEC
// parameters of a vector in 16-byte pieces; F_CHV (host: S % VEC == 0): a group-norm vector lies in one channel,
// one parameter per vector (else one per value, as v1).
// Teams of TEAM >= 64 may share a block (ln_bwd2): their sums use named barriers (1 + team index, TEAM threads).
#define F_PVEC 8
#define F_CHV 16
struct alignas(VEC > 1 ? 16 : alignof(PT)) PV { PT v[VEC]; };

#define LDE_SCALAR (STORAGE == 0 || VEC == 1)
""" + LDE_HEADER + r"""__device__ __forceinline__ void team_bar()
{
#if TEAM > 32
#if TEAM == BLOCK
    __syncthreads();
#else
    asm volatile("bar.sync %0, %1;" :: "r"((int)(threadIdx.x / TEAM) + 1), "r"(TEAM) : "memory");
#endif
#endif
}

// team_sum2 for teams that may share a block: warp shuffles, then the team's own warps' slots added in order.
__device__ __forceinline__ void team_sum2b(A& a, A& b, A (*red)[2])
{
    a = warp_sum(a); b = warp_sum(b);
#if TEAM > 32
    const int w0 = (int)(threadIdx.x / TEAM) * (TEAM / 32);
    team_bar();                                    // the previous call's readers are done with red
    if ((threadIdx.x & 31) == 0) { red[threadIdx.x >> 5][0] = a; red[threadIdx.x >> 5][1] = b; }
    team_bar();
    a = 0; b = 0;
#pragma unroll
    for (int w = 0; w < TEAM / 32; ++w) { a += red[w0 + w][0]; b += red[w0 + w][1]; }
#endif
}

// o[e] (value vi * VEC + e of row r, normalized) times scale plus bias, see F_PVEC / F_CHV above.
__device__ __forceinline__ void affine_vec(A (&o)[VEC], int vi, int g0, unsigned int s_mul, unsigned int s_shr,
                                           const PT* __restrict__ scale, const PT* __restrict__ bias, int flags)
{
    if (!(flags & (F_SCALE | F_BIAS))) return;
    if ((flags & F_GROUPED) && (flags & F_CHV)) {
        const int p = g0 + (int)divu((unsigned int)(vi * VEC), s_mul, s_shr);
        const A sc = (flags & F_SCALE) ? LDP(scale[p]) : (A)1, bi = (flags & F_BIAS) ? LDP(bias[p]) : (A)0;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[e] = o[e] * sc + bi;
    } else if (flags & F_PVEC) {
        if (flags & F_SCALE) {
            const PV s = reinterpret_cast<const PV*>(scale)[vi];
#pragma unroll
            for (int e = 0; e < VEC; ++e) o[e] *= LDP(s.v[e]);
        }
        if (flags & F_BIAS) {
            const PV b = reinterpret_cast<const PV*>(bias)[vi];
#pragma unroll
            for (int e = 0; e < VEC; ++e) o[e] += LDP(b.v[e]);
        }
    } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            o[e] = affine(o[e], pidx(vi * VEC + e, g0, s_mul, s_shr, flags), scale, bias, flags);
    }
}

// Forward, row held in registers (VPT > 0): the v1 norm_fwd's cached path on raw vectors.
extern "C" __global__ void __launch_bounds__(BLOCK, MINB)
norm_fwd2(FWD_ARGS)
{
#if VPT > 0
    __shared__ A red[BLOCK / 32][2];
    const int t = threadIdx.x % TEAM;
    const int nvec = D / VEC;
    const A inv_d = (A)1 / (A)D;
    for (long long r = (long long)blockIdx.x * TPB + threadIdx.x / TEAM; r < rows; r += (long long)gridDim.x * TPB) {
        const V* xr = reinterpret_cast<const V*>(x + r * D);
        V* yr = reinterpret_cast<V*>(y + r * D);
        const int g0 = (flags & F_GROUPED) ? (int)((unsigned int)r % (unsigned int)G) * cpg : 0;  // r < 2^31
        V a[VPT];
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (k * TEAM + t < nvec) a[k] = xr[k * TEAM + t];
        A s = 0, q = 0, unused = 0;
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (k * TEAM + t < nvec) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) s += LDE(a[k], e);
            }
        team_sum2b(s, unused, red);
        const A mean = s * inv_d;
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (k * TEAM + t < nvec) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) { const A d = LDE(a[k], e) - mean; q += d * d; }
            }
        unused = 0;
        team_sum2b(q, unused, red);
        const A rstd = (A)1 / sqrt(q * inv_d + (A)eps);
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (vi < nvec) {
                A o[VEC];
#pragma unroll
                for (int e = 0; e < VEC; ++e) o[e] = (LDE(a[k], e) - mean) * rstd;
                affine_vec(o, vi, g0, s_mul, s_shr, scale, bias, flags);
                V w;
#pragma unroll
                for (int e = 0; e < VEC; ++e) w.v[e] = ST(o[e]);
                yr[vi] = w;
            }
        }
        if (t == 0) { mean_out[r] = mean; rstd_out[r] = rstd; }
    }
#endif
}

// Session 12 (route "v3k", the 16-bit default since round 2 for teams <= LN3K_MAX_TEAM): ln_fwd3 with LN3_KEEP=1 --
// the row's values converted ONCE into A registers (v3s converts each value three times through LDE's asm volatile:
// the sum, the variance, the output) -- and LN3_FULL=1 (host: D == TEAM * VPT * VEC: no per-vector tests, no divergent
// branches around the sums): 377 -> 289 instructions a row and thread at bf16 (16384, 1024) (SASS, sm_90).
#ifndef LN3_KEEP
#define LN3_KEEP 0
#endif
#ifndef LN3_FULL
#define LN3_FULL 0
#endif
#if LN3_FULL
#define LN3_IN(vi) true
#else
#define LN3_IN(vi) ((vi) < nvec)
#endif
#if LN3_KEEP
#define LN3_X(k, e) f[k][e]
#else
#define LN3_X(k, e) LDE(a[k], e)
#endif

// Layer norm forward for 16-bit rows (ln_fwd3): teams of TEAM threads (several per BLOCK, named barriers) keep
// their columns' scale and bias IN REGISTERS (A, loaded once per team: the column a thread owns is the same in
// every row), and a team walks rows r, r + teams, ... of a grid of the resident blocks with the NEXT row's
// VPT vectors loaded before the current row's sums (one row's loads in flight during the two team sums and the
// store).  Thread t holds vectors k * TEAM + t (k < VPT <= 2) of the row.  norm_fwd2 re-read 2 x 4 bytes of
// parameters per 2-byte value from L1/L2 and had one row per warp: per-row costs dominated a 2 KB row.
extern "C" __global__ void __launch_bounds__(BLOCK, MINB)
ln_fwd3(FWD_ARGS)
{
#if VPT > 0
    __shared__ A red[BLOCK / 32][2];
    const int t = threadIdx.x % TEAM;
    const int nvec = D / VEC;
    const A inv_d = (A)1 / (A)D;
#if LN3_SMEM
    // The block's teams share one copy of the row's scale and bias in shared memory, as planes of 4-float vectors:
    // plane h, vector vi = values vi * VEC + 4h .. + 3 (consecutive threads read consecutive 16 bytes: no bank
    // conflicts).  Loaded once per block (coalesced scalars), 1 / 0 where a parameter is absent.
    __shared__ float4 sps[VEC / 4][TEAM * VPT], spb[VEC / 4][TEAM * VPT];
    for (int j = threadIdx.x; j < D; j += BLOCK) {
        const int vi = j / VEC, e = j % VEC;
        reinterpret_cast<float*>(&sps[e / 4][vi])[e % 4] = (flags & F_SCALE) ? (float)LDP(scale[j]) : 1.f;
        reinterpret_cast<float*>(&spb[e / 4][vi])[e % 4] = (flags & F_BIAS) ? (float)LDP(bias[j]) : 0.f;
    }
    __syncthreads();
#else
    A ps[VPT][VEC], pb[VPT][VEC];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = k * TEAM + t;
#pragma unroll
        for (int e = 0; e < VEC; ++e) { ps[k][e] = 1; pb[k][e] = 0; }
        if (vi < nvec) {
            if (flags & F_PVEC) {
                if (flags & F_SCALE) {
                    const PV v = reinterpret_cast<const PV*>(scale)[vi];
#pragma unroll
                    for (int e = 0; e < VEC; ++e) ps[k][e] = LDP(v.v[e]);
                }
                if (flags & F_BIAS) {
                    const PV v = reinterpret_cast<const PV*>(bias)[vi];
#pragma unroll
                    for (int e = 0; e < VEC; ++e) pb[k][e] = LDP(v.v[e]);
                }
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    if (flags & F_SCALE) ps[k][e] = LDP(scale[vi * VEC + e]);
                    if (flags & F_BIAS) pb[k][e] = LDP(bias[vi * VEC + e]);
                }
            }
        }
    }
#endif
    const long long stride = (long long)gridDim.x * TPB;
    long long r = (long long)blockIdx.x * TPB + threadIdx.x / TEAM;
    V nx[VPT];
    if (r < rows) {
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (LN3_IN(k * TEAM + t)) nx[k] = reinterpret_cast<const V*>(x + r * D)[k * TEAM + t];
    }
    for (; r < rows; r += stride) {
        V a[VPT];
#pragma unroll
        for (int k = 0; k < VPT; ++k) a[k] = nx[k];
        if (r + stride < rows) {
            const V* xn = reinterpret_cast<const V*>(x + (r + stride) * D);
#pragma unroll
            for (int k = 0; k < VPT; ++k)
                if (LN3_IN(k * TEAM + t)) nx[k] = xn[k * TEAM + t];
        }
        A s = 0, q = 0, unused = 0;
#if LN3_KEEP
        A f[VPT][VEC];
#pragma unroll
        for (int k = 0; k < VPT; ++k)
#pragma unroll
            for (int e = 0; e < VEC; ++e) f[k][e] = LN3_IN(k * TEAM + t) ? LDE(a[k], e) : (A)0;
#endif
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (LN3_IN(k * TEAM + t)) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) s += LN3_X(k, e);
            }
        team_sum2b(s, unused, red);
        const A mean = s * inv_d;
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (LN3_IN(k * TEAM + t)) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) { const A d = LN3_X(k, e) - mean; q += d * d; }
            }
        unused = 0;
        team_sum2b(q, unused, red);
        const A rstd = (A)1 / sqrt(q * inv_d + (A)eps);
        V* yr = reinterpret_cast<V*>(y + r * D);
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (LN3_IN(vi)) {
                V w;
#if LN3_SMEM
                float sc[VEC], bi[VEC];
#pragma unroll
                for (int h = 0; h < VEC / 4; ++h) {
                    const float4 s4 = sps[h][vi], b4 = spb[h][vi];
                    sc[4 * h] = s4.x; sc[4 * h + 1] = s4.y; sc[4 * h + 2] = s4.z; sc[4 * h + 3] = s4.w;
                    bi[4 * h] = b4.x; bi[4 * h + 1] = b4.y; bi[4 * h + 2] = b4.z; bi[4 * h + 3] = b4.w;
                }
#pragma unroll
                for (int e = 0; e < VEC; ++e) w.v[e] = ST((LN3_X(k, e) - mean) * rstd * (A)sc[e] + (A)bi[e]);
#else
#pragma unroll
                for (int e = 0; e < VEC; ++e) w.v[e] = ST((LN3_X(k, e) - mean) * rstd * ps[k][e] + pb[k][e]);
#endif
                yr[vi] = w;
            }
        }
        if (t == 0) { mean_out[r] = mean; rstd_out[r] = rstd; }
    }
#endif
}

// Group norm backward in one read, the v1 gn_bwd on raw vectors: x and dy of the group row in registers, the
// channel of a value recomputed where needed (F_CHV: once per vector) instead of a register per value.
// F_CHV rows (S % VEC == 0: every vector in one channel, the common case) take the flags as template arguments
// (FIXED, SC): as run-time tests they put a uniform branch around every value's scale load, so no load could be
// hoisted and each value waited on one (16-bit rows, 32 values a thread, ran at 37% of copy bandwidth against
// float32's 86%); the vector's scale is loaded with the row (scv).  Compiled with GN_CHV=1 for F_CHV rows (two
// instances, with and without scale); other rows, GN_CHV=0, keep the run-time flags (one instance: instances of
// their per-value channels spilled).
template <bool FIXED, bool SC>
__device__ __forceinline__ void gn_bwd2_rows(const T* __restrict__ x, const T* __restrict__ dy,
        const A* __restrict__ mean, const A* __restrict__ rstd, const PT* __restrict__ scale, A* __restrict__ sums,
        T* __restrict__ dx, const long long rows, const int D, const int C, const int G, const int cpg,
        const unsigned int s_mul, const unsigned int s_shr, const int flags, A (*red)[2], A (*wsum)[32][2])
{
#if VPT > 0
    const bool has_scale = FIXED ? SC : (flags & F_SCALE) != 0;
    const bool chv = FIXED || (flags & F_CHV);
#if TEAM > 32
    const int warp = threadIdx.x >> 5;
#endif
    const int t = threadIdx.x % TEAM, lane = threadIdx.x & 31;
    const int nvec = D / VEC;
    const A inv_d = (A)1 / (A)D;
    const long long stride = (long long)gridDim.x * TPB;
    long long r = (long long)blockIdx.x * TPB + threadIdx.x / TEAM;
    for (; r < rows; r += stride) {
        const unsigned int n = (unsigned int)r / (unsigned int)G;          // r < 2^31
        const int g0 = (int)((unsigned int)r - n * (unsigned int)G) * cpg;
        V* dr = reinterpret_cast<V*>(dx + r * D);
        V a[VPT], b[VPT];
        const V* xr = reinterpret_cast<const V*>(x + r * D);
        const V* gr = reinterpret_cast<const V*>(dy + r * D);
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (k * TEAM + t < nvec) { a[k] = xr[k * TEAM + t]; b[k] = gr[k * TEAM + t]; }
        const A mu = mean[r], is = rstd[r];
// the channel (within the group) of value e of vector k
#define GN_CH(k, e) (chv ? (int)divu((unsigned int)(((k) * TEAM + t) * VEC), s_mul, s_shr) \
                         : (int)divu((unsigned int)(((k) * TEAM + t) * VEC + (e)), s_mul, s_shr))
        A scv[VPT];     // FIXED: the scale of vector k's one channel, loaded with the row
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            scv[k] = (FIXED && has_scale && k * TEAM + t < nvec) ? LDP(scale[g0 + GN_CH(k, 0)]) : (A)1;
#define GN_SC(k, e) (FIXED ? scv[k] : has_scale ? LDP(scale[g0 + GN_CH(k, e)]) : (A)1)
        A cs = 0, s1 = 0;
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (k * TEAM + t < nvec) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) { cs += LDE(a[k], e) - mu; s1 += LDE(b[k], e) * GN_SC(k, e); }
            }
        // re-centred as in ln_bwd (RECENTRE)
        team_sum2b(cs, s1, red);
        const A off = cs * inv_d;
        A s2 = 0;
#if GN_VCS
        // GN_VCS (session 9, round 2; FIXED rows, every vector in one channel): the vector's channel partials
        // sum(dy * xhat), sum(dy) taken here, once per value, for the channel sums below
        A pek[VPT], psk[VPT];
#endif
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
#if GN_VCS
            pek[k] = 0; psk[k] = 0;
#endif
            if (k * TEAM + t < nvec) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    s2 += LDE(b[k], e) * GN_SC(k, e) * ((LDE(a[k], e) - mu - off) * is);
#if GN_VCS
                    if (FIXED) {
                        const A g = LDE(b[k], e);
                        pek[k] += g * ((LDE(a[k], e) - mu - off) * is); psk[k] += g;
                    }
#endif
                }
            }
        }
        A unused = 0;
        team_sum2b(s2, unused, red);
        const A c1 = s1 * inv_d, c2 = s2 * inv_d;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (vi < nvec) {
                V o;
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    o.v[e] = ST(is * (LDE(b[k], e) * GN_SC(k, e) - c1 - (LDE(a[k], e) - mu - off) * is * c2));
                dr[vi] = o;
            }
        }
        // per-channel sums over the channels from this warp's first value to its last (warp-uniform bounds: the
        // first vector of lane 0, the last value of the last vector any lane holds); lane k keeps channel g0 + k
        const int t0 = t & ~31;
        const int wlo = (int)divu((unsigned int)(t0 * VEC), s_mul, s_shr);
        const int vlast = min(nvec - 1, (VPT - 1) * TEAM + t0 + 31);
        const int whi = t0 < nvec ? (int)divu((unsigned int)(vlast * VEC + VEC - 1), s_mul, s_shr) : -1;
        A me = 0, ms = 0;
#if GN_VCS
        // the per-vector partials added per channel: VPT selects a channel instead of VEC * VPT compares and
        // branches (each value's own if, 55% of the 16-bit row's instructions at two channels a warp)
        if (FIXED) {
            int chk[VPT];
#pragma unroll
            for (int k = 0; k < VPT; ++k) chk[k] = k * TEAM + t < nvec ? GN_CH(k, 0) : -1;
            for (int kc = wlo; kc <= whi; ++kc) {
                A pe = 0, ps = 0;
#pragma unroll
                for (int k = 0; k < VPT; ++k)
                    if (chk[k] == kc) { pe += pek[k]; ps += psk[k]; }
                pe = warp_sum(pe); ps = warp_sum(ps);
                if (lane == kc) { me = pe; ms = ps; }
            }
        } else
#endif
        for (int kc = wlo; kc <= whi; ++kc) {
            A pe = 0, ps = 0;
#pragma unroll
            for (int k = 0; k < VPT; ++k)
                if (k * TEAM + t < nvec) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e)
                        if (GN_CH(k, e) == kc) {
                            const A g = LDE(b[k], e);
                            pe += g * ((LDE(a[k], e) - mu - off) * is); ps += g;
                        }
                }
            pe = warp_sum(pe); ps = warp_sum(ps);
            if (lane == kc) { me = pe; ms = ps; }
        }
#undef GN_SC
#undef GN_CH
        A* out = sums + (long long)n * 2 * C + g0;
#if TEAM > 32
        if (lane < cpg) { wsum[warp][lane][0] = me; wsum[warp][lane][1] = ms; }
        __syncthreads();
        if (t < cpg) {
            A e1 = 0, e2 = 0;
            for (int w = 0; w < TEAM / 32; ++w) { e1 += wsum[w][t][0]; e2 += wsum[w][t][1]; }
            out[t] = e1; out[C + t] = e2;
        }
        __syncthreads();                           // wsum is rewritten by the next row
#else
        if (lane < cpg) { out[lane] = me; out[C + lane] = ms; }
#endif
    }
#endif
}

extern "C" __global__ void __launch_bounds__(BLOCK, MINB)
gn_bwd2(const T* __restrict__ x, const T* __restrict__ dy, const A* __restrict__ mean, const A* __restrict__ rstd,
        const PT* __restrict__ scale, A* __restrict__ sums, T* __restrict__ dx, const long long rows, const int D,
        const int C, const int G, const int cpg, const unsigned int s_mul, const unsigned int s_shr, const int flags)
{
    __shared__ A red[BLOCK / 32][2];
#if TEAM > 32
    __shared__ A wsum[BLOCK / 32][32][2];
#else
    A (*wsum)[32][2] = nullptr;
#endif
#define GN_ROWS(FIXED, SC) gn_bwd2_rows<FIXED, SC>(x, dy, mean, rstd, scale, sums, dx, rows, D, C, G, cpg, s_mul, \
                                                    s_shr, flags, red, wsum)
#if GN_CHV
    if (flags & F_SCALE) GN_ROWS(true, true); else GN_ROWS(true, false);
#else
    GN_ROWS(false, false);
#endif
#undef GN_ROWS
}


// Layer norm backward, row in registers (VPT > 0), the v1 ln_bwd on raw vectors with the scale of the thread's
// columns held in registers across rows; several teams per block (TPB).  The column partials sum(dy * xhat),
// sum(dy) of the rows a team visits live in SHARED memory (F_SCALE; dynamic, TPB x 2D values of A: the team's row
// acc[team][0..D) = sum(dy * xhat), [D..2D) = sum(dy); each thread reads and writes only its own columns, no
// barrier), not in registers as v1's (which took ~2 x 8 registers a value and so the occupancy); at the end the block
// adds its teams' rows in team order and writes ONE partial row per block -- a grid of the resident blocks only,
// so col_sum adds (blocks x 2D) values instead of v1's (teams x 2D).
struct alignas(16) AV { A v[VEC]; };       // VEC values of A: 16 or 32 bytes when VEC > 1

// The scale of the thread's vector vi in registers SC[VEC] (ln_bwd2, and ln_bwd3 where it keeps the scale in
// registers): one PV load where the parameters are vector-aligned (F_PVEC), else value by value; 1 without a scale or
// past the row.  Over the caller's scale, nvec, has_scale and flags.  A macro, so each kernel's text after
// preprocessing is the one it carried before (the same PTX; an inlined function may order the same code otherwise).
#define LN_SCALE_REGS(SC, vi)                                                                                  \
    if (has_scale && vi < nvec && (flags & F_PVEC)) {                                                          \
        const PV s = reinterpret_cast<const PV*>(scale)[vi];                                                   \
        _Pragma("unroll")                                                                                      \
        for (int e = 0; e < VEC; ++e) SC[e] = LDP(s.v[e]);                                                     \
    } else {                                                                                                   \
        _Pragma("unroll")                                                                                      \
        for (int e = 0; e < VEC; ++e) SC[e] = (has_scale && vi < nvec) ? LDP(scale[vi * VEC + e]) : (A)1;     \
    }

extern "C" __global__ void __launch_bounds__(BLOCK, MINB)
ln_bwd2(const T* __restrict__ x, const T* __restrict__ dy, const A* __restrict__ mean, const A* __restrict__ rstd,
        const PT* __restrict__ scale, T* __restrict__ dx, A* __restrict__ partial, const long long rows, const int D,
        const int flags)
{
#if VPT > 0
    extern __shared__ __align__(16) unsigned char ln_smem[];
    const bool has_scale = flags & F_SCALE;
    __shared__ A red[BLOCK / 32][2];
    const int t = threadIdx.x % TEAM, tib = threadIdx.x / TEAM;
    const int nvec = D / VEC;
    const A inv_d = (A)1 / (A)D;
    AV* acc_g = reinterpret_cast<AV*>(ln_smem) + (long long)tib * 2 * nvec;    // (has_scale) this team's row
    AV* acc_b = acc_g + nvec;
    A sc[VPT][VEC];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = k * TEAM + t;
        LN_SCALE_REGS(sc[k], vi)
        if (has_scale && vi < nvec) {
            AV z;
#pragma unroll
            for (int e = 0; e < VEC; ++e) z.v[e] = 0;
            acc_g[vi] = z; acc_b[vi] = z;
        }
    }
    for (long long r = (long long)blockIdx.x * TPB + tib; r < rows; r += (long long)gridDim.x * TPB) {
        const V* xr = reinterpret_cast<const V*>(x + r * D);
        const V* gr = reinterpret_cast<const V*>(dy + r * D);
        V* dr = reinterpret_cast<V*>(dx + r * D);
        V a[VPT], b[VPT];
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (k * TEAM + t < nvec) { a[k] = xr[k * TEAM + t]; b[k] = gr[k * TEAM + t]; }
        const A mu = mean[r], is = rstd[r];
        A cs = 0, s1 = 0;
#pragma unroll
        for (int k = 0; k < VPT; ++k)
            if (k * TEAM + t < nvec) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) { cs += LDE(a[k], e) - mu; s1 += LDE(b[k], e) * sc[k][e]; }
            }
        team_sum2b(cs, s1, red);       // re-centred (RECENTRE)
        const A off = cs * inv_d;
        A s2 = 0;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (vi < nvec) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) s2 += LDE(b[k], e) * sc[k][e] * ((LDE(a[k], e) - mu - off) * is);
                if (has_scale) {
                    AV ag = acc_g[vi], ab = acc_b[vi];
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        const A g = LDE(b[k], e);
                        ag.v[e] += g * ((LDE(a[k], e) - mu - off) * is); ab.v[e] += g;
                    }
                    acc_g[vi] = ag; acc_b[vi] = ab;
                }
            }
        }
        A unused = 0;
        team_sum2b(s2, unused, red);
        const A c1 = s1 * inv_d, c2 = s2 * inv_d;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (vi < nvec) {
                V o;
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    o.v[e] = ST(is * (LDE(b[k], e) * sc[k][e] - c1 - (LDE(a[k], e) - mu - off) * is * c2));
                dr[vi] = o;
            }
        }
    }
    if (!has_scale) return;
    __syncthreads();
    const A* acc = reinterpret_cast<const A*>(ln_smem);
    A* pg = partial + (long long)blockIdx.x * 2 * D;
    for (int j = threadIdx.x; j < 2 * D; j += BLOCK) {
        A v = acc[j];
#pragma unroll
        for (int m = 1; m < TPB; ++m) v += acc[(long long)m * 2 * D + j];
        pg[j] = v;
    }
#endif
}

// Layer norm backward v3 (session 12; route "v3", the default for 16-bit and float32 rows since round 2: H200
// 1.10-1.26x ln_bwd2 on 768..4096-value rows; MINIDNN_NORM_ROUTE=ln_bwd16=v2,ln_bwd=v2 for the A/B).  Why: ln_bwd2's
// row loop issued ~33 instructions a value (SASS, bfloat16 (16384, 1024): 529 a row and thread of 16 values; every
// use of a value converted it again, two team sums a row): the same count per VALUE as float32's, so at 2 bytes a
// value the SMs' issue time was ~70% of the DRAM time (59% of copy bandwidth, float32 85%).  ln_bwd3 does the same
// algebra in fewer instructions:
//   - ONE team sum a row, of the triple cs = sum(d), s1 = sum(g), sgd = sum(g * d) with d = x - mean,
//     g = dy * scale: off = cs / D (RECENTRE), s2 = sum(g * xhat) = rstd * (sgd - off * s1) (xhat = (d - off) *
//     rstd), so c1 = s1 / D and c2 = s2 / D come from one sum (ln_bwd2: two, the second after a pass); NumPy
//     float32 emulation of rows ~0.01 apart (rstd ~100): the same error as ln_bwd2's in units of
//     eps * rstd * max|g| (max 3.7 / 4.8, rms 0.64 / 0.62; tests/backend/test_ln_bwd3.py);
//   - dx = rstd * g - rstd * c1 - xhat * (rstd * c2): two FMAs a value; xhat = d * rstd - off * rstd: one;
//   - LNB_KEEP=1: d and g kept in A registers from the first pass (x converted once, dy twice); LNB_KEEP=0: both
//     recomputed from the raw vectors in the source (ptxas still merges the conversions where its register
//     bound allows: at 32 values a thread and 128 registers it holds x and dy as floats, 2 conversions a value);
//   - LNB_FULL=1 (host: D == TEAM * VPT * VEC): every vector exists, no per-vector predicates;
//   - VPT * VEC > 16: the scale in shared memory (LNB_SSC, one copy per block), else in registers;
//   - the column partials in the team's shared row as float4 PLANES (plane h of vector vi = values vi * VEC + 4h ..
//     + 3: consecutive threads touch consecutive 16 bytes; ln_bwd2's 32-byte rows of 8 floats conflicted 2-way);
// As ln_bwd2: TPB x 2D values of A in dynamic shared memory (+ D for the scale), the block adds its teams' rows in
// team order -> ONE partial row per block for col_sum.  Thread t of team tib holds vectors k * TEAM + t (k < VPT).
// Teams of TEAM >= 64 share a block through named barriers 1 + tib (TPB <= 15).  VEC is 4 or 8 (A float).
#ifndef LNB_KEEP
#define LNB_KEEP 1
#endif
#ifndef LNB_FULL
#define LNB_FULL 0
#endif
#if LNB_FULL
#define LNB_IN(vi) true
#else
#define LNB_IN(vi) ((vi) < nvec)
#endif
#define LNB_SSC (VPT * VEC > 16)
#define LNB_NP (VEC / 4)                 // float4 planes a vector
#if LNB_SSC                              // scv[e]: the scale of value e of the thread's vector k
#define LNB_SCV(k) A scv[VEC]; \
    _Pragma("unroll") for (int h = 0; h < LNB_NP; ++h) { const float4 s4 = ssc[h * nvec + (k) * TEAM + t]; \
        scv[4 * h] = s4.x; scv[4 * h + 1] = s4.y; scv[4 * h + 2] = s4.z; scv[4 * h + 3] = s4.w; }
#else
#define LNB_SCV(k) const A* scv = sc[k]
#endif

// team_sum2b for three values.
__device__ __forceinline__ void team_sum3b(A& a, A& b, A& c, A (*red)[3])
{
    a = warp_sum(a); b = warp_sum(b); c = warp_sum(c);
#if TEAM > 32
    const int w0 = (int)(threadIdx.x / TEAM) * (TEAM / 32), w = threadIdx.x >> 5;
    team_bar();                                    // the previous row's readers are done with red
    if ((threadIdx.x & 31) == 0) { red[w][0] = a; red[w][1] = b; red[w][2] = c; }
    team_bar();
    a = 0; b = 0; c = 0;
#pragma unroll
    for (int i = 0; i < TEAM / 32; ++i) { a += red[w0 + i][0]; b += red[w0 + i][1]; c += red[w0 + i][2]; }
#endif
}

extern "C" __global__ void __launch_bounds__(BLOCK, MINB)
ln_bwd3(const T* __restrict__ x, const T* __restrict__ dy, const A* __restrict__ mean, const A* __restrict__ rstd,
        const PT* __restrict__ scale, T* __restrict__ dx, A* __restrict__ partial, const long long rows, const int D,
        const int flags)
{
#if VPT > 0 && (VEC == 4 || VEC == 8)
    extern __shared__ __align__(16) unsigned char ln_smem[];
    const bool has_scale = flags & F_SCALE;
    __shared__ A red3[BLOCK / 32][3];
    const int t = threadIdx.x % TEAM, tib = threadIdx.x / TEAM;
    const int nvec = D / VEC;
    const A inv_d = (A)1 / (A)D;
    // this team's partial row: planes [0, NP) sum(dy * xhat), [NP, 2 NP) sum(dy), nvec float4 each
    float4* acc = reinterpret_cast<float4*>(ln_smem) + (long long)tib * 2 * D / 4;
#if LNB_SSC
    float4* ssc = reinterpret_cast<float4*>(ln_smem) + (long long)TPB * 2 * D / 4;   // LNB_NP planes of the scale
    for (int j = threadIdx.x; j < D; j += BLOCK)
        reinterpret_cast<float*>(ssc)[(j % VEC / 4) * nvec * 4 + j / VEC * 4 + j % 4] =
            has_scale ? (float)LDP(scale[j]) : 1.f;
#else
    A sc[VPT][VEC];
#endif
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int vi = k * TEAM + t;
#if !LNB_SSC
        LN_SCALE_REGS(sc[k], vi)
#endif
        if (has_scale && vi < nvec) {
#pragma unroll
            for (int h = 0; h < 2 * LNB_NP; ++h) acc[h * nvec + vi] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
#if LNB_SSC
    __syncthreads();
#endif
    const long long stride = (long long)gridDim.x * TPB;
    long long r = (long long)blockIdx.x * TPB + tib;
    for (; r < rows; r += stride) {
        V a[VPT], b[VPT];
        {
            const V* xr = reinterpret_cast<const V*>(x + r * D);
            const V* gr = reinterpret_cast<const V*>(dy + r * D);
#pragma unroll
            for (int k = 0; k < VPT; ++k)
                if (LNB_IN(k * TEAM + t)) { a[k] = xr[k * TEAM + t]; b[k] = gr[k * TEAM + t]; }
        }
        const A mu = mean[r], is = rstd[r];
#if LNB_KEEP
        A d[VPT][VEC], g[VPT][VEC];
#endif
        A cs = 0, s1 = 0, sgd = 0;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const bool in = LNB_IN(k * TEAM + t);
            LNB_SCV(k);
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A dv = in ? LDE(a[k], e) - mu : (A)0;
                const A gv = in ? LDE(b[k], e) * scv[e] : (A)0;
                cs += dv; s1 += gv; sgd += gv * dv;
#if LNB_KEEP
                d[k][e] = dv; g[k][e] = gv;
#endif
            }
        }
        team_sum3b(cs, s1, sgd, red3);
        const A off = cs * inv_d;
        const A c1 = s1 * inv_d, c2 = is * (sgd - off * s1) * inv_d;
        const A k1 = is * c1, k2 = is * c2, offis = off * is;
        V* dr = reinterpret_cast<V*>(dx + r * D);
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int vi = k * TEAM + t;
            if (LNB_IN(vi)) {
                V o;
#if !LNB_KEEP
                LNB_SCV(k);
#endif
                float4 pg[LNB_NP], pb[LNB_NP];
                if (has_scale) {
#pragma unroll
                    for (int h = 0; h < LNB_NP; ++h) {
                        pg[h] = acc[h * nvec + vi]; pb[h] = acc[(LNB_NP + h) * nvec + vi];
                    }
                }
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A gv = LDE(b[k], e);        // once: LDE is an asm volatile, never merged
#if LNB_KEEP
                    const A dv = d[k][e], gs = g[k][e];
#else
                    const A dv = LDE(a[k], e) - mu, gs = gv * scv[e];
#endif
                    const A xh = dv * is - offis;
                    o.v[e] = ST(is * gs - k1 - xh * k2);
                    float* fg = reinterpret_cast<float*>(&pg[e / 4]) + e % 4;
                    float* fb = reinterpret_cast<float*>(&pb[e / 4]) + e % 4;
                    *fg += gv * xh; *fb += gv;
                }
                if (has_scale) {
#pragma unroll
                    for (int h = 0; h < LNB_NP; ++h) {
                        acc[h * nvec + vi] = pg[h]; acc[(LNB_NP + h) * nvec + vi] = pb[h];
                    }
                }
                dr[vi] = o;
            }
        }
    }
    if (!has_scale) return;
    __syncthreads();
    // column j = vi * VEC + 4h + c sits at plane h (or NP + h for sum(dy)), float (vi * 4 + c) of the plane
    const float* accf = reinterpret_cast<const float*>(ln_smem);
    A* pgr = partial + (long long)blockIdx.x * 2 * D;
    for (int j = threadIdx.x; j < 2 * D; j += BLOCK) {
        const int half = j >= D, jj = j - half * D;
        const long long at = (long long)((half * LNB_NP + jj % VEC / 4) * nvec) * 4 + jj / VEC * 4 + jj % 4;
        A v = accf[at];
#pragma unroll
        for (int m = 1; m < TPB; ++m) v += accf[(long long)m * 2 * D + at];
        pgr[j] = v;
    }
#endif
}

// Bias gradient of an (outer, C, inner) dy with inner > 1, in ONE launch (v1: row_sums, then col_sum): grid
// (C, splits); block (c, s) sums the planes o in [s * chunk, min(R, (s + 1) * chunk)) of channel c -- its
// (planes x inner/VEC) vectors walked as one flat range, 256 threads, 4 vectors in flight each -- into ws[c][s];
// the last block of channel c (threadfence + ticket, reset by that block) adds the splits in order, in double ->
// out_a[c] (A, c < split_col) or out_t[c] (dy's dtype).  Deterministic.
extern "C" __global__ void __launch_bounds__(256)
bias_grad_planes(const T* __restrict__ dy, A* __restrict__ ws, unsigned int* ticket, A* __restrict__ out_a,
                 T* __restrict__ out_t, const int R, const int C, const int inner, const int chunk,
                 const unsigned int v_mul, const unsigned int v_shr, const int split_col)
{
    __shared__ double sd[8];
    __shared__ bool last;
    const int c = blockIdx.x;
    const int o0 = blockIdx.y * chunk, o1 = min(R, o0 + chunk);
    const int nv = inner / VEC;                       // vectors per plane
    const unsigned int total = (unsigned int)(o1 - o0) * (unsigned int)nv;   // < 2^31: dy has < 2^31 values
    A s = 0;
    unsigned int i = threadIdx.x;
    for (; i + 768 < total; i += 1024) {          // 4 independent loads in flight per thread
        V v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const unsigned int k = i + 256 * u, p = divu(k, v_mul, v_shr);
            v[u] = reinterpret_cast<const V*>(dy + ((long long)(o0 + p) * C + c) * inner)[k - p * nv];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int e = 0; e < VEC; ++e) s += LD(v[u].v[e]);
    }
    for (; i < total; i += 256) {
        const unsigned int p = divu(i, v_mul, v_shr);
        const V v = reinterpret_cast<const V*>(dy + ((long long)(o0 + p) * C + c) * inner)[i - p * nv];
#pragma unroll
        for (int e = 0; e < VEC; ++e) s += LD(v.v[e]);
    }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) sd[threadIdx.x >> 5] = (double)s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double a = 0;
#pragma unroll
        for (int w = 0; w < 8; ++w) a += sd[w];
        ws[(long long)c * gridDim.y + blockIdx.y] = (A)a;
        __threadfence();
        last = atomicAdd(ticket + c, 1u) == gridDim.y - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    double a = 0;
    for (int b = threadIdx.x; b < (int)gridDim.y; b += 256) a += (double)ws[(long long)c * gridDim.y + b];
    // splits added in a fixed order: per thread (b = tid, tid + 256, ...), then warps, then the 8 warp sums
    for (int o = 16; o > 0; o >>= 1) a += __shfl_down_sync(0xffffffffu, a, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sd[threadIdx.x >> 5] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
        double tot = 0;
#pragma unroll
        for (int w = 0; w < 8; ++w) tot += sd[w];
        if (c < split_col) out_a[c] = (A)tot; else out_t[c - split_col] = ST((A)tot);
        ticket[c] = 0u;
    }
}

"""

_PSTORAGE = {"float32": ("float", 0), "float64": ("double", 0), "float16": ("float", 1), "bfloat16": ("float", 2)}
_INT_MAX = 2 ** 31 - 1
MAX_TEAM = 512


def _max_cached_values(dtype):
    """Values of one array a thread keeps in registers (64 bytes of A: 16 floats, 8 doubles)."""
    return 8 if _dev.dtype_name(dtype) == "float64" else 16


def row_config(d, dtype, aligned=True):
    """(TEAM, VPT, VEC) for rows of ``d`` values of ``dtype``: 16-byte vectors where d fills them (and the base
    pointer is aligned), a team just large enough to hold the row in ~8 values per thread (32..512 threads), VPT
    vectors per thread in registers, or VPT = 0 (looped) when the row needs more than 16 floats (8 doubles) per
    thread of a 512-thread team."""
    item = np.dtype(dtype).itemsize
    vec = 16 // item
    if not aligned or d % vec:
        vec = 1
    nvec = d // vec
    target = max(1, 8 // vec)
    team = 32
    while team < MAX_TEAM and team * target < nvec:
        team *= 2
    vpt = 1
    while team * vpt < nvec:
        vpt *= 2
    if vpt * vec > _max_cached_values(dtype):
        vpt = 0
    return team, vpt, vec


def _block(team):
    return 256 if team == 32 else team


# Version 2 of the row kernels (norm_fwd2, gn_bwd2, ln_bwd2) and of the NCHW bias gradient (bias_grad_planes);
# MINIDNN_NORM_V1=1 (read at import) keeps the version-1 kernels and configurations for a GPU A/B.
V1 = os.environ.get("MINIDNN_NORM_V1", "") == "1"
_PER_THREAD = {"fwd": 4, "gn_bwd": 4}    # the most 16-byte vectors of one array a v2 thread holds

# Per-case routing (resolved when a plan is built: no per-call work).  "ln_fwd16": 16-bit layer norm forward,
# "v3" = ln_fwd3 where ln_config3 takes the row (<= 4096 values), else v2; "gn_bwd16": 16-bit group norm
# backward.  Every other case takes v2: on the H100 (bench/kernels_gpu.py, back-to-back calls, v2 against the
# session's v1 baseline) v2 was faster or level everywhere but the 16-bit layer norm forward (v2 0.0537 ms, v1
# 0.0487 at (16384, 1024) bf16; a warp per 2 KB row, parameters re-read per row: ln_fwd3's case) and level on the
# 16-bit group norm backward (0.1404 / 0.1386 ms: gn_bwd2's per-value scale branch, fixed by GN_CHV).
# MINIDNN_NORM_ROUTE="ln_fwd16=v1,gn_bwd16=v1" (read at import; or set ROUTE in-process and clear _plans) picks
# another version per case for a GPU A/B ("<case>16": 16-bit data, "<case>": other dtypes; gn_bwd "v2rt": gn_bwd2
# with its run-time flags, as before GN_CHV); MINIDNN_NORM_V1=1 still sends everything to v1.
# "v3k" (session 12; the default for ln_fwd16 since round 2): "v3s" with LN3_KEEP and LN3_FULL (see ln_fwd3's
# comment): the 16-bit forward's loop 377 -> 289 instructions a row and thread at (16384, 1024); H200 run 3 against
# v3s: (16384, 1024) bf16 1.070x (75% of copy), fp16 1.091x, (4096, 768) 1.00x, (8, 768) 1.02x, but (2048, 4096)
# bf16 0.950x -- a 256-thread team a row (one team a block); so "v3k" keeps v3s for teams above LN3K_MAX_TEAM.
# "v3s": ln_fwd3 with the parameters in shared memory (LN3_SMEM), one copy per block
# instead of 32 registers a thread -- 48 registers, five 256-thread blocks an SM instead of three, so 1280 threads'
# rows in flight (the current and the prefetched one) where v3 had 768; "v3" keeps them in registers (A/B).
# "v2m4" (the default for gn_bwd16): gn_bwd2 as v2, but 16-bit GN_CHV rows of a 256-thread team (e.g. G=32 of
# (128, 64, 56, 56): 784 vectors, 4 a thread) launch-bounded to four blocks an SM (64 registers, no spills) instead
# of three (80 registers): a third more group rows in flight (v2: 67% of copy bandwidth there, float32 88%).
# (Session 9 round 2's "v2w" for ln_bwd16 -- ln_bwd2 with warp teams of 4 vectors and the scale in shared memory --
# measured slower on both GPUs -- H200 bf16 0.78x, fp32 0.97x; H100 bf16 0.0546 against 0.0448 ms -- and was
# removed in session 11.)
ROUTE = {"ln_fwd16": "v3kw", "ln_bwd16": "v3", "ln_bwd": "v3", "gn_bwd16": "v2m4", "gn_bwd": "v2"}
# (Session 9's GN_PREF -- gn_bwd2's next group row loaded before this row's sums, on a persistent grid of half the
# resident blocks -- measured slower on the H200 (session 9 run 6, (128, 64, 56, 56) G=32: bfloat16 0.0636 -> 0.0854
# ms, float32 0.0891 -> 0.1255: halving the resident blocks cost more than the prefetch hid) and was removed in
# session 19 with its switch MINIDNN_GN_PREFETCH, now ignored.)


# Session 9, round 2: gn_bwd2's GN_CHV rows take their per-channel sums from per-vector partials (GN_VCS) instead of
# a compare and branch per value and channel (SASS, bf16 G=32 of (128, 64, 56, 56): ~1820 instructions a row and
# thread -> ~1350; 64 registers, no spills).  dx keeps its bits; dscale / dbias are the same sums grouped by vector.
# MINIDNN_GN_VSUMS=0 gives the per-value loop back.  Read at planning time (clear _plans; tools/ktable_ab.py gnvcs).
GN_VSUMS = os.environ.get("MINIDNN_GN_VSUMS", "1") != "0"

ROUTE.update(kv.split("=", 1) for kv in os.environ.get("MINIDNN_NORM_ROUTE", "").replace(" ", "").split(",")
             if "=" in kv)


# Route "v3k" takes LN3_KEEP / LN3_FULL for rows of teams up to this size (2048 values: 4 warps a row), v3s above:
# the one measured 256-thread team, (2048, 4096) bf16, lost 5% to v3s (H200 run 3) though its loop issues fewer
# instructions (SASS 399 -> 306 a row and thread): not issue-bound there (3.1 rows a resident team).
LN3K_MAX_TEAM = 128


def _version(case, dtype):
    """"v1", "v2", "v3" (or "v2rt") for ``case`` ("ln_fwd", "ln_bwd", "gn_fwd", "gn_bwd") on ``dtype``."""
    if V1:
        return "v1"
    return ROUTE.get(case + "16" if np.dtype(dtype).itemsize == 2 else case, "v2")


def ln_config3(d, dtype, aligned):
    """(TEAM, VPT, VEC) of ln_fwd3 (16-bit layer norm rows, parameters held in registers), or None: the smallest
    power-of-two team of 32..256 whose threads hold the row in at most 2 vectors (16 bytes each), so <= 4096
    values; the thread's 2 x VPT x 8 float32 parameters then fit beside the current and next row's vectors."""
    if np.dtype(dtype).itemsize != 2 or not aligned or d % 8:
        return None
    nvec = d // 8
    team = 32
    while team < 256 and team * 2 < nvec:
        team *= 2
    vpt = -(-nvec // team)
    return (team, vpt, 8) if vpt <= 2 else None


# Session 17 (route "v3kw", the default since session 17's run 3 -- H100, graph replays, v3k / v3kw: bf16 (32768,
# 768) 1.060x (79% -> 84% of copy), (16384, 1536) 1.067x, (16384, 1024) 0.999x (the same plan), fp16 (32768, 768)
# 1.059x; MINIDNN_NORM_ROUTE=ln_fwd16=v3k goes back): "v3k" with a FULL team of 3 vectors a
# thread where ln_config3's team would leave slots empty -- (32768, 768) bf16 (67% of copy on the H200) takes a team of
# 64 with 2 vectors a thread for 96 vectors: warp 1 holds one vector a row, warp 0 two, per-vector tests and 4 named
# barriers a row; "v3kw" gives the row ONE warp of 3 vectors (FULL, shuffle sums only).  Launch bounds from nvcc
# (sm_90, KEEP + FULL + SMEM, no spills): a warp team of 3 vectors 80 registers (three blocks an SM; at 64 it
# spilled 4 bytes), teams of 64 / 128 at 64 registers (four; at 48 they spilled 84 bytes).
LN3W_VPT = 3


def ln_config3w(d, dtype, aligned):
    """ln_config3's (TEAM, VPT, VEC), or (TEAM, 3, 8) where that covers the row exactly with a team of 32..128
    threads and ln_config3's does not (d = 768, 1536, 3072 values)."""
    cfg = ln_config3(d, dtype, aligned)
    if cfg is None or d == cfg[0] * cfg[1] * cfg[2]:
        return cfg
    nvec = d // 8
    team = nvec // LN3W_VPT
    return (team, LN3W_VPT, 8) if nvec % LN3W_VPT == 0 and team in (32, 64, 128) else cfg


def row_config2(d, dtype, aligned, kind):
    """(TEAM, VPT, VEC) of a v2 row kernel (``kind`` "fwd", "gn_bwd" or "ln_bwd"), or None where it does not apply
    (rows that do not fill 16-byte vectors or are too long for registers: the v1 kernels).  The team is the
    smallest power of two (32..512) whose threads hold the row in at most P vectors each, VPT = the vectors a thread
    needs (not rounded up to a power of two).  P = 4 (64 bytes of raw data per array and thread) for the forward and
    group-norm backward; P = 2 for layer-norm backward, which also keeps the scale of its columns in registers."""
    vec = 16 // np.dtype(dtype).itemsize
    if not aligned or d % vec:
        return None
    nvec = d // vec
    per = _PER_THREAD.get(kind, 2)
    team = 32
    while team < MAX_TEAM and team * per < nvec:
        team *= 2
    vpt = -(-nvec // team)
    return (team, vpt, vec) if vpt <= per else None


def _v2_launch_shape(kind, team, itemsize=4):
    """(threads per block, the launch bounds' minimum blocks per SM) of a v2 row kernel: the forward <= 64
    registers (1024 threads an SM); gn_bwd2 two 512-thread or three 256-thread blocks (a 64-register cap spilled its
    256-thread float32 rows; at 512 threads float32 spills ~32 bytes of per-row scalars, float64 is left uncapped);
    ln_bwd2 blocks of 256 threads (teams of 32..128 sharing one; float32 <= 64 registers, four an SM; 16/64-bit
    <= 85, three: a 64 cap spilled them) or one 512-thread team (float32 two an SM)."""
    block = _block(team)
    if kind == "fwd":
        return block, max(1, 1024 // block)
    if kind == "gn_bwd":
        return block, (1 if itemsize == 8 else 2) if block == 512 else max(1, 768 // block)
    block = max(256, team)
    if block == 256:
        return block, 4 if itemsize == 4 else 3
    return block, 2 if itemsize == 4 else 1


def _resident_per_sm(kernel, block, shared_mem, fallback):
    """Blocks of ``kernel`` one SM holds at once (the driver's occupancy), ``fallback`` (the launch bounds' promise)
    where the query is unavailable."""
    try:
        occ = _launch.cupy().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block,
                                                                                   int(shared_mem))
        return max(1, int(occ))
    except Exception:       # noqa: BLE001 -- an old CuPy or a fake one
        return fallback


def _p_info(x_dtype, p):
    """(PARAM, PSTORAGE) of parameter array p (None: any, it is never read), or None where p's dtype is neither x's
    nor float32."""
    if p is None:
        return _PSTORAGE[_dev.dtype_name(x_dtype)]
    name = _dev.dtype_name(p.dtype)
    if p.dtype != x_dtype and name != "float32":
        return None
    return _PSTORAGE.get(name)


_kernel_cache: dict = {}


def _kernel(name, dtype, pinfo, team=32, vpt=0, vec=1, in_t=False, block=None, minb=1, defs=()):
    key = (name, dtype, pinfo, team, vpt, vec, in_t, block, minb, defs)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _launch.get_kernel(SOURCE, name, options(*key[1:]))
    return k


def options(dtype, pinfo, team=32, vpt=0, vec=1, in_t=False, block=None, minb=1, defs=()):
    """NVRTC options of one configuration (affine parameters and the group mapping are run-time flags: one
    compilation serves layer and group norm with or without parameters).  ``block``: threads per block where
    several teams of 64+ share one (ln_bwd2; default: one team, or 8 warp teams); ``minb``: the launch bounds'
    minimum blocks per SM (v2 kernels); ``defs``: further (NAME, value) defines (gn_bwd2's GN_CHV)."""
    scalar, accum, storage, _ = type_info(dtype)
    param, pstorage = pinfo
    return (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DPARAM={param}",
            f"-DPSTORAGE={pstorage}", f"-DTEAM={team}", f"-DBLOCK={block or _block(team)}", f"-DVPT={vpt}",
            f"-DVEC={vec}", f"-DIN_T={int(in_t)}", "-std=c++17") + ((f"-DMINB={minb}",) if minb != 1 else ()) + tuple(
                f"-D{k}={v}" for k, v in defs)


_dividers: dict = {}


def divider(d):
    """(mul, shr) with n // d == (umulhi(n, mul) + n) >> shr for 0 <= n < 2**31 (d >= 1), cached."""
    r = _dividers.get(d)
    if r is None:
        shr = max(0, (int(d) - 1).bit_length())
        mul = ((1 << 32) * ((1 << shr) - int(d))) // int(d) + 1
        r = _dividers[d] = (np.uint32(mul & 0xFFFFFFFF), np.uint32(shr))
    return r


def _acc(dtype):
    return param_dtype(dtype)      # (float32 for 16-bit data, float64 for float64: the accumulation dtype)


def _flags(scale, bias, grouped, pvec=False, chv=False):
    return np.int32((scale is not None) | (bias is not None) << 1 | bool(grouped) << 2 | bool(pvec) << 3
                    | bool(chv) << 4)


def _palign(*params):
    """Every given parameter array starts on 16 bytes (v2: vector loads of layer norm's parameters)."""
    return all(p is None or not p.data.ptr & 15 for p in params)


def _aligned(*arrays):
    return all(a is None or a.data.ptr % 16 == 0 for a in arrays)


# ---- selection predicates (plain sentences: what the kernels take) -------------------------------------------

def _data_ok(x):
    return (_dev.is_cuda_array(x) and type_info(x.dtype) is not None and 0 < x.size <= _INT_MAX
            and x.flags.c_contiguous)


def _params_ok(x, c, *params):
    pinfo = [_p_info(x.dtype, p) for p in params if p is not None]
    if any(p is None for p in pinfo) or len(set(pinfo)) > 1:
        return False
    return all(p is None or (_dev.is_cuda_array(p) and p.size == c and p.flags.c_contiguous) for p in params)


def supports_layer_norm(x, normalized_ndim, scale=None, bias=None, *others) -> bool:
    """C-contiguous CuPy x of float32/float64/float16/bfloat16 with fewer than 2**31 values; scale and bias (when
    given) contiguous, of x's dtype or float32, both the same; ``others`` (dy) like x."""
    if not _data_ok(x) or not 1 <= normalized_ndim <= x.ndim:
        return False
    d = math.prod(x.shape[x.ndim - normalized_ndim:])
    return d > 0 and _params_ok(x, d, scale, bias) and all(
        o is not None and _data_ok(o) and o.shape == x.shape and o.dtype == x.dtype for o in others)


def supports_group_norm(x, num_groups, scale=None, bias=None, *others) -> bool:
    """As layer norm, for (N, C, *S) channels-first contiguous x (a channels-last x goes to the reference)."""
    if not _data_ok(x) or x.ndim < 2 or x.shape[1] % num_groups:
        return False
    return _params_ok(x, x.shape[1], scale, bias) and all(
        o is not None and _data_ok(o) and o.shape == x.shape and o.dtype == x.dtype for o in others)


def supports_stats(x, *stats) -> bool:
    """The saved statistics are the kernels' own: contiguous CuPy arrays in x's accumulation type."""
    acc = _acc(x.dtype)
    return all(_dev.is_cuda_array(s) and s.dtype == acc and s.flags.c_contiguous for s in stats)


def supports_bias(y, b, channel_axis) -> bool:
    """y C-contiguous (float32/float64/float16/bfloat16) with the channel on ``channel_axis``, b (C,) contiguous of
    y's dtype or float32."""
    return (_data_ok(y) and 0 <= channel_axis < y.ndim and _dev.is_cuda_array(b) and b.size == y.shape[channel_axis]
            and b.flags.c_contiguous and _p_info(y.dtype, b) is not None)


def supports_bias_grad(dy, channel_axis) -> bool:
    """dy C-contiguous (float32/float64/float16/bfloat16), fewer than 2**31 values, the channel on ``channel_axis``."""
    return _data_ok(dy) and 0 <= channel_axis < dy.ndim


# ---- launches ------------------------------------------------------------------------------------------------

def _grid(rows, team, dev, threads_per_sm=4096):
    """Blocks for ``rows`` rows: one team per row, at most ``threads_per_sm`` threads per SM (the rest is the
    grid-stride loop)."""
    block = _block(team)
    tpb = block // team
    return max(1, min((rows + tpb - 1) // tpb, _launch.sm_count(dev) * max(1, threads_per_sm // block)))


# ---- plans: kernels, grids, packed scalars and buffer sizes once per call signature (shape, dtypes, which
# parameters, settings, 16-byte alignment of the inputs, device); a repeated call = one dict lookup, the allocations
# and the prepared launches taking the arrays' pointers.  The results are those of the launches as built before.
_plans: dict = {}


def _pdt(p):
    return None if p is None else p.dtype


def _row_forward(x, rows, d, scale, bias, eps, grouped, g, cpg, s, stat_shape):
    dev = x.data.device_id
    aligned = not x.data.ptr & 15
    palign = _palign(scale, bias)
    go, acc = _launch.planned(_plans, ("fwd", x.shape, x.dtype, _pdt(scale), _pdt(bias), eps, grouped, g,
                                       stat_shape, aligned, palign, dev),
                              _row_forward_plan, x, rows, d, scale, bias, eps, grouped, g, cpg, s, aligned, palign,
                              dev)
    cp = _launch._cp
    with _launch.on_device(dev):
        y = cp.empty(x.shape, dtype=x.dtype)
        mean = cp.empty(stat_shape, dtype=acc)
        rstd = cp.empty(stat_shape, dtype=acc)
        go(x, x if scale is None else scale, x if bias is None else bias, y, mean, rstd)
    return y, mean, rstd


def _ln_forward_plan3(x, rows, d, scale, bias, eps, cfg, palign, dev, smem=False, keep=False):
    """ln_fwd3: blocks of 256 threads (teams of 32..256 sharing one); a grid of the resident blocks only, each team
    walking its rows.  Registers ("v3": parameters in registers, <= 80 registers, three blocks an SM) or shared
    memory ("v3s", LN3_SMEM: one copy per block, <= 48 registers, five blocks an SM -- eight at one vector a
    thread -- so 1280..2048 threads' rows in flight, not 768); no spills.  ``keep`` (route "v3k", session 12): "v3s"
    with LN3_KEEP (values converted once, held as A) and LN3_FULL where the team covers the row exactly (48
    registers at five blocks, 32 at eight: no spills)."""
    team, vpt, vec = cfg
    block = 256
    minb = (8 if vpt == 1 else 5) if smem else 3
    if vpt == LN3W_VPT and smem:        # route "v3kw"'s teams (ln_config3w)
        minb = 3 if team == 32 else 4
    defs = (("LN3_SMEM", 1),) if smem else ()
    if keep:
        defs += (("LN3_KEEP", 1), ("LN3_FULL", int(d == team * vpt * vec)))
    k = _kernel("ln_fwd3", x.dtype, _p_info(x.dtype, scale if scale is not None else bias), team, vpt, vec,
                block=block, minb=minb, defs=defs)
    grid = max(1, min(-(-rows // (block // team)), _launch.sm_count(dev) * _resident_per_sm(k, block, 0, minb)))
    return _launch.prepare(k, (grid,), (block,),
                           [None] * 6 + [np.int64(rows), np.int32(d), np.int32(1), np.int32(1), *divider(1),
                                         np.float64(eps), _flags(scale, bias, False, pvec=palign)]), _acc(x.dtype)


def _row_forward_plan(x, rows, d, scale, bias, eps, grouped, g, cpg, s, aligned, palign, dev):
    pinfo = _p_info(x.dtype, scale if scale is not None else bias)
    version = _version("gn_fwd" if grouped else "ln_fwd", x.dtype)
    if version in ("v3", "v3s", "v3k", "v3kw"):
        cfg3 = (ln_config3w if version == "v3kw" else ln_config3)(d, x.dtype, aligned)
        if cfg3 is not None:
            return _ln_forward_plan3(x, rows, d, scale, bias, eps, cfg3, palign, dev, smem=version != "v3",
                                     keep=version in ("v3k", "v3kw") and cfg3[0] <= LN3K_MAX_TEAM)
    cfg = None if version == "v1" else row_config2(d, x.dtype, aligned, "fwd")
    if cfg is None and grouped and version != "v1" and aligned and x.dtype.itemsize == 2 and _gn16.usable(dev):
        # session 18: a 16-bit group row no team holds in registers, stashed in one block's shared memory (norm_gn16)
        go = _gn16.prepare_forward(x, g, scale, bias, eps, (scale is not None) | (bias is not None) << 1, dev)
        if go is not None:
            return go, _acc(x.dtype)
    if cfg is None and grouped and version != "v1" and aligned and x.dtype.itemsize == 4 and _gncl.usable(dev):
        # session 17: a group row no team holds in registers, held by a thread-block cluster (norm_gncl)
        go = _gncl.prepare_forward(x, g, scale, bias, eps, (scale is not None) | (bias is not None) << 1)
        if go is not None:
            return go, _acc(x.dtype)
    if cfg is None:
        team, vpt, vec = row_config(d, x.dtype, aligned)
        k, block, flags = _kernel("norm_fwd", x.dtype, pinfo, team, vpt, vec), _block(team), _flags(scale, bias,
                                                                                                      grouped)
    else:
        team, vpt, vec = cfg
        block, minb = _v2_launch_shape("fwd", team)
        k = _kernel("norm_fwd2", x.dtype, pinfo, team, vpt, vec, minb=minb)
        flags = _flags(scale, bias, grouped, pvec=palign and not grouped, chv=grouped and s % vec == 0)
    return _launch.prepare(k, (_grid(rows, team, dev),), (block,),
                           [None] * 6 + [np.int64(rows), np.int32(d), np.int32(g), np.int32(cpg), *divider(s),
                                         np.float64(eps), flags]), _acc(x.dtype)


def layer_norm_forward(x, normalized_ndim, scale, bias, eps):
    """-> (y, mean, rstd), mean and rstd of shape x.shape[:-normalized_ndim] in A."""
    lead = x.shape[:x.ndim - normalized_ndim]
    rows = math.prod(lead)
    return _row_forward(x, rows, x.size // rows, scale, bias, eps, False, 1, 1, 1, lead)


def group_norm_forward(x, num_groups, scale, bias, eps):
    """-> (y, mean, rstd), mean and rstd (N, G) in A."""
    n, c = x.shape[:2]
    s = x.size // (n * c)
    return _row_forward(x, n * num_groups, c // num_groups * s, scale, bias, eps, True, num_groups,
                        c // num_groups, s, (n, num_groups))


_tickets: dict = {}


def _ticket(cp, n, dev):
    return _ws.kept_zeroed(_tickets, cp, n, dev, 1024)


def _col_sum_plan(r, nc, split_col, dtype, in_t, dev):
    """(prepared col_sum launch, workspace size, column tiles) for out_a[:split_col], out_t[:nc - split_col] =
    column sums of an (r, nc) matrix m; called as go(m, ws, ticket, out_a or ws, out_t or m)."""
    tiles = (nc + 31) // 32
    want = max(1, (_launch.sm_count(dev) * 4 + tiles - 1) // tiles)
    splits = max(1, min(want, (r + 63) // 64, 65535))
    chunk = (r + splits - 1) // splits
    splits = (r + chunk - 1) // chunk
    k = _kernel("col_sum", dtype, _PSTORAGE[_dev.dtype_name(dtype)], in_t=in_t)
    go = _launch.prepare(k, (tiles, splits), (256,), [None] * 5 + [np.int64(r), np.int32(nc), np.int32(split_col),
                                                                   np.int64(chunk)])
    return go, nc * splits, tiles


def _ln_backward_plan2(x, rows, d, scale, cfg, palign, dev):
    """ln_bwd2 (column partials in shared memory, TPB x 2D values of A) with one partial row per resident block,
    then col_sum."""
    team, vpt, vec = cfg
    block, minb = _v2_launch_shape("ln_bwd", team, x.dtype.itemsize)
    tpb = block // team
    has_scale = scale is not None
    smem = tpb * 2 * d * _acc(x.dtype).itemsize if has_scale else 0
    k = _kernel("ln_bwd2", x.dtype, _p_info(x.dtype, scale), team, vpt, vec, block=block, minb=minb)
    grid = max(1, min(-(-rows // tpb), _launch.sm_count(dev) * _resident_per_sm(k, block, smem, minb)))
    go = _launch.prepare(k, (grid,), (block,), [None] * 7 + [np.int64(rows), np.int32(d),
                                                              _flags(scale, None, False, pvec=palign)],
                         shared_mem=smem)
    col = _col_sum_plan(grid, 2 * d, d, x.dtype, False, dev) if has_scale else None
    return go, (grid * 2 * d if has_scale else 1), col, _acc(x.dtype)


# Session 12: ln_bwd3 (route "v3", the default for 16-bit and float32 rows since round 2; float64 keeps ln_bwd2):
# layer-norm backward with one team sum a row and the per-value work cut (~33 -> ~19 instructions a value at 16 bits,
# SASS), see the kernel's comment.  H200 run 3 (graph replays, against ln_bwd2): (16384, 1024) bf16 1.228x (73% of
# copy), fp16 1.221x, fp32 1.010x; (4096, 768) bf16 1.264x, fp32 1.205x; (2048, 4096) bf16 1.226x, fp32 1.103x --
# all at P = 4.  LN_BWD3_P: the most 16-byte vectors of x (and of dy) a thread holds (MINIDNN_LN_BWD3_P, read at
# import; tools/ln_ab.py sets it and clears _plans): 4 = a warp per 1024-value bf16 row, 32 values a thread; 2 =
# ln_bwd2's teams; 0 (the default) = the rule of ln_bwd3_p.  (Round 1's LNB_ASYNC -- the next row staged by cp.async
# -- measured slower everywhere, 0.97-0.99x of P = 4, and was removed.)
LN_BWD3_P = int(os.environ.get("MINIDNN_LN_BWD3_P", "0"))
LN_BWD3_SMEM_MAX = 160 * 1024       # a block's partial rows (+ the scale) in dynamic shared memory, at most


def ln_bwd3_config(d, itemsize, aligned, p=4):
    """(TEAM, VPT, VEC, BLOCK, MINB, KEEP, FULL, SMEM) of ln_bwd3 for rows of ``d`` values of ``itemsize`` bytes
    (2 or 4), or None (ln_bwd2 / v1 then): 16-byte vectors (aligned, d a multiple of VEC), the smallest power-of-two
    team (32..512) whose threads hold the row in at most ``p`` vectors; blocks of max(256, TEAM); launch bounds from
    the registers the values a thread holds need (ptxas, sm_90, no spills): up to 8 values of an array 3 blocks of
    256 an SM at 16 bits, 4 at 32 where FULL (else 3); more, 2 (512 threads: 1); KEEP (d and g kept as A) up to 8
    values; FULL when the team covers the row exactly; SMEM = TPB x 2D floats of partials, + D floats for the scale
    when it lives in shared memory (VPT * VEC > 16)."""
    if itemsize not in (2, 4) or not aligned:
        return None
    vec = 16 // itemsize
    if d % vec:
        return None
    nvec = d // vec
    team = 32
    while team < MAX_TEAM and team * p < nvec:
        team *= 2
    vpt = -(-nvec // team)
    if vpt > p:
        return None
    block = max(256, team)
    values = vpt * vec
    full = nvec == team * vpt
    if block > 256:
        minb = 1
    elif values <= 8:
        minb = 4 if itemsize == 4 and full else 3      # float32 rows not filling the team spilled 24 bytes at 4
    else:
        minb = 2
    smem = (block // team) * 2 * d * 4 + (d * 4 if values > 16 else 0)
    if smem > LN_BWD3_SMEM_MAX:
        return None
    return team, vpt, vec, block, minb, int(values <= 8), int(full), smem


def ln_bwd3_wave(cfg, sms):
    """Rows one wave of ``cfg``'s teams holds: SMs x its launch bounds' blocks an SM x teams a block."""
    team, _, _, block, minb = cfg[:5]
    return sms * minb * (block // team)


def ln_bwd3_p(rows, d, itemsize, aligned, sms):
    """The P of ln_bwd3 for ``rows`` rows of ``d`` values (LN_BWD3_P where set): 2 when every row fits one wave of
    P = 2's teams (each team one row: the time is a row's latency, and P = 2 spreads a row over twice the threads
    -- H200 (8, 768): P = 2 1.042x ln_bwd2 bf16, 1.036x fp32, P = 4 0.925x / 0.986x), else 4 (more rows than P = 2
    holds at once: throughput, where P = 4's fewer instructions a value win -- (4096, 768) bf16 1.264x against P = 2's
    1.145x, (2048, 4096) fp32 1.103x against 0.852x); the other P where the chosen one has no configuration."""
    if LN_BWD3_P:
        return LN_BWD3_P
    cfg2 = ln_bwd3_config(d, itemsize, aligned, 2)
    if cfg2 is None:
        return 4
    return 2 if rows <= ln_bwd3_wave(cfg2, sms) else 4


def _ln_backward_plan3(x, rows, d, scale, cfg, palign, dev):
    """ln_bwd3 on a grid of the resident blocks (each block one partial row), then col_sum."""
    team, vpt, vec, block, minb, keep, full, smem = cfg
    has_scale = scale is not None
    if not has_scale and vpt * vec <= 16:
        smem = 0            # no partial rows, the scale (ones) in registers
    k = _kernel("ln_bwd3", x.dtype, _p_info(x.dtype, scale), team, vpt, vec, block=block, minb=minb,
                defs=(("LNB_KEEP", keep), ("LNB_FULL", full)))
    if smem >= 48 * 1024:
        try:
            _launch._opt_in(k, smem)      # before the occupancy query, which counts the opted-in size
        except Exception:       # noqa: BLE001 -- a fake CuPy
            pass
    grid = max(1, min(-(-rows // (block // team)), _launch.sm_count(dev) * _resident_per_sm(k, block, smem, minb)))
    go = _launch.prepare(k, (grid,), (block,), [None] * 7 + [np.int64(rows), np.int32(d),
                                                              _flags(scale, None, False, pvec=palign)],
                         shared_mem=smem)
    col = _col_sum_plan(grid, 2 * d, d, x.dtype, False, dev) if has_scale else None
    return go, (grid * 2 * d if has_scale else 1), col, _acc(x.dtype)


def ln_bwd3_plan_config(rows, d, itemsize, aligned, sms):
    """The ln_bwd3 configuration route "v3" takes (ln_bwd3_p's P, else the other P), or None (ln_bwd2)."""
    p = ln_bwd3_p(rows, d, itemsize, aligned, sms)
    return ln_bwd3_config(d, itemsize, aligned, p) or ln_bwd3_config(d, itemsize, aligned, 6 - p)


def _ln_backward_plan(x, rows, d, scale, aligned, palign, dev):
    ver = _version("ln_bwd", x.dtype)
    cfg3 = ln_bwd3_plan_config(rows, d, x.dtype.itemsize, aligned, _launch.sm_count(dev)) if ver == "v3" else None
    if cfg3 is not None:
        return _ln_backward_plan3(x, rows, d, scale, cfg3, palign, dev)
    cfg = None if ver == "v1" else row_config2(d, x.dtype, aligned, "ln_bwd")
    if cfg is not None:
        return _ln_backward_plan2(x, rows, d, scale, cfg, palign, dev)
    pinfo = _p_info(x.dtype, scale)
    team, vpt, vec = row_config(d, x.dtype, aligned)
    k = _kernel("ln_bwd", x.dtype, pinfo, team, vpt, vec)
    # fewer teams than the forward: each writes a column-partial row of 2D values that col_sum adds up
    grid = _grid(rows, team, dev, threads_per_sm=1024)
    tpb = _block(team) // team
    grid = min(grid, max(_launch.sm_count(dev), -(-rows // (4 * tpb))))
    teams = grid * (_block(team) // team)
    has_scale = scale is not None
    go = _launch.prepare(k, (grid,), (_block(team),), [None] * 7 + [np.int64(rows), np.int32(d),
                                                                     _flags(scale, None, False)])
    col = _col_sum_plan(teams, 2 * d, d, x.dtype, False, dev) if has_scale else None
    return go, (teams * 2 * d if has_scale else 1), col, _acc(x.dtype)


def layer_norm_backward(x, dy, normalized_ndim, scale, mean, rstd):
    """-> (dx, dscale (A) or None, dbias (x's dtype) or None); dscale/dbias shaped like scale."""
    cp = _launch._cp or _launch.cupy()
    rows = mean.size
    d = x.size // rows
    dev = x.data.device_id
    aligned = not (x.data.ptr | dy.data.ptr) & 15
    palign = _palign(scale)
    go, n_partial, col, acc = _launch.planned(_plans, ("ln_bwd", x.shape, x.dtype, rows, _pdt(scale), aligned,
                                                       palign, dev),
                                              _ln_backward_plan, x, rows, d, scale, aligned, palign, dev)
    with _launch.on_device(dev):
        dx = cp.empty(x.shape, dtype=x.dtype)
        # the column partials and col_sum's workspace live within this call (stream-ordered): kept buffers
        partial = _ws.scratch_flat(cp, dev, "norm.partial", n_partial, acc)
        go(x, dy, mean, rstd, x if scale is None else scale, dx, partial)
        if col is None:
            return dx, None, None
        dscale = cp.empty(scale.shape, dtype=acc)
        dbias = cp.empty(scale.shape, dtype=x.dtype)
        col_go, n_ws, tiles = col
        col_go(partial, _ws.scratch_flat(cp, dev, "norm.col_ws", n_ws, acc), _ticket(cp, tiles, dev), dscale,
               dbias)
    return dx, dscale, dbias


def _gn_backward_plan(x, num_groups, scale, aligned, dev):
    n, c = x.shape[:2]
    s = x.size // (n * c)
    cpg = c // num_groups
    d = cpg * s
    rows = n * num_groups
    pinfo = _p_info(x.dtype, scale)
    has_scale = scale is not None
    col = _col_sum_plan(n, 2 * c, c, x.dtype, False, dev) if has_scale else None
    version = _version("gn_bwd", x.dtype)
    cfg = None if version == "v1" or cpg > 32 else row_config2(d, x.dtype, aligned, "gn_bwd")
    if cfg is not None:         # gn_bwd2 (one read of x and dy) + col_sum
        team, vpt, vec = cfg
        block, minb = _v2_launch_shape("gn_bwd", team, x.dtype.itemsize)
        # GN_CHV: vectors in one channel, flags fixed at compile time (float64 keeps the run-time flags: spills)
        defs = (("GN_CHV", 1),) if s % vec == 0 and x.dtype.itemsize <= 4 and version != "v2rt" else ()
        if version == "v2m4" and defs and block == 256 and x.dtype.itemsize == 2:
            minb = 4        # 16-bit GN_CHV rows of 256 threads fit 64 registers unspilled: four blocks an SM, not 3
        if defs and GN_VSUMS:
            defs += (("GN_VCS", 1),)
        kernel = _kernel("gn_bwd2", x.dtype, pinfo, team, vpt, vec, minb=minb, defs=defs)
        one = _launch.prepare(kernel, (_grid(rows, team, dev),), (block,),
                              [None] * 7 + [np.int64(rows), np.int32(d), np.int32(c), np.int32(num_groups),
                                            np.int32(cpg), *divider(s), _flags(scale, None, True, chv=s % vec == 0)])
        return one, None, col, c
    if version != "v1" and aligned and x.dtype.itemsize == 2 and _gn16.usable(dev, True):
        # session 18: x and dy of a long 16-bit group row stashed in one block's shared memory (norm_gn16)
        one = _gn16.prepare_backward(x, num_groups, scale, dev)
        if one is not None:
            return one, None, col, c
    if version != "v1" and aligned and x.dtype.itemsize == 4 and _gncl.usable(dev):
        # session 17: x and dy of a long group row held by a thread-block cluster, one launch + col_sum (norm_gncl)
        one = _gncl.prepare_backward(x, num_groups, scale)
        if one is not None:
            return one, None, col, c
    team, vpt, vec = row_config(d, x.dtype, aligned)
    if vpt and cpg <= 32:        # the group row fits in registers: gn_bwd (one read of x and dy) + col_sum
        one = _launch.prepare(_kernel("gn_bwd", x.dtype, pinfo, team, vpt, vec), (_grid(rows, team, dev),),
                              (_block(team),), [None] * 7 + [np.int64(rows), np.int32(d), np.int32(c),
                                                             np.int32(num_groups), np.int32(cpg), *divider(s),
                                                             _flags(scale, None, True)])
        return one, None, col, c
    team, _, vec = row_config(s, x.dtype, aligned)
    sums = _launch.prepare(_kernel("row_sums", x.dtype, pinfo, team, 0, vec), (_grid(n * c, team, dev),),
                           (_block(team),), [None] * 5 + [np.int64(n * c), np.int32(s), np.int32(c),
                                                          np.int32(num_groups), np.int32(cpg),
                                                          _flags(None, None, True)])
    team, _, vec = row_config(d, x.dtype, aligned)
    dx = _launch.prepare(_kernel("gn_dx", x.dtype, pinfo, team, 0, vec), (_grid(rows, team, dev),),
                         (_block(team),), [None] * 7 + [np.int64(rows), np.int32(d), np.int32(c),
                                                        np.int32(num_groups), np.int32(cpg), *divider(s),
                                                        _flags(scale, None, True)])
    return sums, dx, col, c


def group_norm_backward(x, dy, num_groups, scale, mean, rstd):
    """-> (dx, dscale (A) or None, dbias (x's dtype) or None)."""
    cp = _launch._cp or _launch.cupy()
    dev = x.data.device_id
    aligned = not (x.data.ptr | dy.data.ptr) & 15
    first, second, col, c = _launch.planned(_plans, ("gn_bwd", x.shape, x.dtype, num_groups, _pdt(scale), aligned,
                                                     dev), _gn_backward_plan, x, num_groups, scale, aligned, dev)
    acc = _acc(x.dtype)
    s = x if scale is None else scale
    with _launch.on_device(dev):
        sums = _ws.scratch_flat(cp, dev, "norm.partial", x.shape[0] * 2 * c, acc)     # within this call: kept
        dx = cp.empty(x.shape, dtype=x.dtype)
        if second is None:
            first(x, dy, mean, rstd, s, sums, dx)
        else:
            first(dy, x, mean, rstd, sums)
        dscale = dbias = None
        if col is not None:
            dscale = cp.empty((c,), dtype=acc)
            dbias = cp.empty((c,), dtype=x.dtype)
            col_go, n_ws, tiles = col
            col_go(sums, _ws.scratch_flat(cp, dev, "norm.col_ws", n_ws, acc), _ticket(cp, tiles, dev), dscale, dbias)
        if second is not None:
            second(x, dy, mean, rstd, s, sums, dx)
    return dx, dscale, dbias


def _geometry(shape, channel_axis):
    outer = math.prod(shape[:channel_axis])
    return outer, shape[channel_axis], math.prod(shape[channel_axis + 1:])


def _bias_add_plan(x, b, channel_axis, alpha, beta, aligned, dev):
    _, c, inner = _geometry(x.shape, channel_axis)
    n = x.size
    vec = 16 // x.dtype.itemsize
    if n % vec or not aligned:        # c is found per value: a vector may span channels
        vec = 1
    grid = max(1, min((n // vec + 255) // 256, _launch.sm_count(dev) * 16))
    k = _kernel("bias_add", x.dtype, _p_info(x.dtype, b), vec=vec)
    return _launch.prepare(k, (grid,), (256,), [None] * 3 + [np.int64(n), np.int32(c), *divider(c),
                                                             *divider(inner), np.int32(inner == 1),
                                                             np.float64(alpha), np.float64(beta)])


def bias_add(x, b, channel_axis, alpha=1.0, beta=1.0, out=None):
    """out = alpha * b (broadcast on ``channel_axis``) + beta * x; ``out`` may be x (in place), None: a new array.
    One launch."""
    cp = _launch._cp or _launch.cupy()
    dev = x.data.device_id
    with _launch.on_device(dev):
        y = cp.empty(x.shape, dtype=x.dtype) if out is None else out
        aligned = not (x.data.ptr | y.data.ptr) & 15
        go = _launch.planned(_plans, ("bias", x.shape, x.dtype, b.dtype, channel_axis, alpha, beta, aligned, dev),
                             _bias_add_plan, x, b, channel_axis, alpha, beta, aligned, dev)
        go(x, b, y)
    return y


# Session 9: the channel-last / linear bias gradient (inner = 1) through col_sum_v (16-byte loads, 8 vector columns
# a block) where dy is 16-byte aligned and C a multiple of 16 / itemsize; MINIDNN_COLSUM_VEC=0: col_sum (one 4-byte
# load a thread: 67% of copy at (16384, 1024) float32 on the H200).  Read at planning time (tools/ktable_ab.py
# flips it and forgets the plans).
COLSUM_VEC = os.environ.get("MINIDNN_COLSUM_VEC", "1") != "0"
COLSUM_CX = 8               # vector columns a col_sum_v block: 128 contiguous bytes a row
COLSUM_BLOCKS_PER_SM = 4    # col_sum_v's grid: about this many 256-thread blocks an SM (4 x 256 x 64 B in flight)


def col_sum_v_geometry(r, nc, itemsize, sms, cx=COLSUM_CX, per_sm=COLSUM_BLOCKS_PER_SM):
    """(vec, tiles, splits, chunk) of col_sum_v over an (r, nc) matrix of ``itemsize``-byte values: tiles of cx * vec
    columns, splits of ``chunk`` rows (every split non-empty), about ``per_sm`` blocks an SM."""
    vec = 16 // itemsize
    tiles = -(-nc // (cx * vec))
    want = max(1, -(-sms * per_sm // tiles))
    splits = max(1, min(want, -(-r // (256 // cx)), 65535))
    chunk = -(-r // splits)
    return vec, tiles, -(-r // chunk), chunk


def _col_sum_v_plan(r, nc, split_col, dtype, dev):
    vec, tiles, splits, chunk = col_sum_v_geometry(r, nc, dtype.itemsize, _launch.sm_count(dev))
    k = _kernel("col_sum_v", dtype, _PSTORAGE[_dev.dtype_name(dtype)], vec=vec, defs=(("CX", COLSUM_CX),))
    go = _launch.prepare(k, (tiles, splits), (256,), [None] * 5 + [np.int32(r), np.int32(nc), np.int32(split_col),
                                                                   np.int32(chunk)])
    return go, nc * splits, tiles


def _bias_grad_plan(dy, channel_axis, aligned, dev, wide=False):
    """``wide``: db in the accumulation type (float32 for half dy): col_sum writes every column to out_a."""
    outer, c, inner = _geometry(dy.shape, channel_axis)
    split = c if wide else 0
    if inner == 1:
        if COLSUM_VEC and aligned and c % (16 // dy.dtype.itemsize) == 0:
            return None, _col_sum_v_plan(outer, c, split, dy.dtype, dev), c, outer
        return None, _col_sum_plan(outer, c, split, dy.dtype, True, dev), c, outer
    if not V1:      # bias_grad_planes: one launch, about 8 blocks of 256 threads an SM
        vec = 16 // dy.dtype.itemsize
        if not aligned or inner % vec:
            vec = 1
        splits = max(1, min(-(-_launch.sm_count(dev) * 8 // c), outer, 65535))
        chunk = -(-outer // splits)
        splits = -(-outer // chunk)
        k = _kernel("bias_grad_planes", dy.dtype, _PSTORAGE[_dev.dtype_name(dy.dtype)], vec=vec)
        go = _launch.prepare(k, (c, splits), (256,), [None] * 5 + [np.int32(outer), np.int32(c), np.int32(inner),
                                                                   np.int32(chunk), *divider(inner // vec),
                                                                   np.int32(split)])
        return "planes", (go, c * splits, c), c, outer
    team, _, vec = row_config(inner, dy.dtype, aligned)
    sums = _launch.prepare(_kernel("row_sums", dy.dtype, _PSTORAGE[_dev.dtype_name(dy.dtype)], team, 0, vec),
                           (_grid(outer * c, team, dev),), (_block(team),),
                           [None] * 5 + [np.int64(outer * c), np.int32(inner), np.int32(c), np.int32(1), np.int32(1),
                                         _flags(None, None, False)])
    return sums, _col_sum_plan(outer, c, split, dy.dtype, False, dev), c, outer


def bias_grad(dy, channel_axis, out_dtype=None, out=None):
    """db (C,) in dy's dtype = sum of dy over every axis but ``channel_axis`` (float32/float64 accumulation):
    channel last (inner = 1): one column-sum launch; else one bias_grad_planes launch (v1: per-(outer, C) plane
    sums, then a column sum).
    ``out_dtype`` float32 for float16/bfloat16 dy: db is the float32 sums unrounded (col_sum's A-typed output;
    autocast's bias gradients).  ``out``: a contiguous (C,) array of db's dtype on dy's device (the caller checked)
    that the kernels write instead of a new one (a gradient slot: minidnn/_grad_dest.py); every element written."""
    cp = _launch._cp or _launch.cupy()
    dev = dy.data.device_id
    aligned = not dy.data.ptr & 15
    acc = _acc(dy.dtype)
    wide = out_dtype is not None and np.dtype(out_dtype) != dy.dtype
    if wide and np.dtype(out_dtype) != acc:
        raise ValueError(f"bias_grad: db in {np.dtype(out_dtype)} from {dy.dtype} dy (only {dy.dtype} or {acc})")
    key = ("bias_grad", dy.shape, dy.dtype, channel_axis, aligned, dev) + (("wide",) if wide else ())
    sums, (col_go, n_ws, tiles), c, outer = _launch.planned(_plans, key, _bias_grad_plan, dy, channel_axis, aligned,
                                                            dev, wide)
    with _launch.on_device(dev):
        db = cp.empty((c,), dtype=acc if wide else dy.dtype) if out is None else out
        m = dy
        if sums == "planes":        # one launch; the unused output pointer: ws (out_a) or dy (out_t)
            ws = cp.empty((n_ws,), dtype=acc)
            col_go(dy, ws, _ticket(cp, tiles, dev), db if wide else ws, dy if wide else db)
            return db
        if sums is not None:
            m = cp.empty((outer * c,), dtype=acc)
            sums(dy, dy, m, m, m)
        ws = cp.empty((n_ws,), dtype=acc)
        if wide:        # every column to out_a (float32); out_t unused: m stands in
            col_go(m, ws, _ticket(cp, tiles, dev), db, m)
        else:           # no A columns: ws stands in for them
            col_go(m, ws, _ticket(cp, tiles, dev), ws, db)
    return db


if __name__ == "__main__":       # python -m minidnn.backend.cuda.norm_kernels out.cu NAME=VALUE ...: source for nvcc
    import sys
    defs = dict(a.split("=", 1) for a in sys.argv[2:])
    with open(sys.argv[1], "w") as f:
        f.write("".join(f"#define {k} {v}\n" for k, v in defs.items()) + SOURCE)
