"""CUDA C++ source of the direct (depthwise / few-channels-per-group) 2-D convolution kernels.

``python -m minidnn.backend.cuda.conv_direct_source out.cu [NAME=VALUE ...]`` writes it out for nvcc.
"""
from __future__ import annotations

SOURCE = r"""
// ============================================================================================================
// Direct 2-D convolution for few channels per group (depthwise: Cg == 1; grouped: Cg <= 8).
//
// Shapes (channels-first index order, any strides: NCHW and NHWC alike):
//   x, dx: (N, C, H, W)  strides sxn, sxc, sxh, sxw      w, dw: (K, Cg, R, S) contiguous, Cg = C/G, Kg = K/G
//   y, dy: (N, K, P, Q)  strides syn, syc, syh, syw
// Each output element needs only Cg*R*S (forward) or Kg*R*S (backward data) products: far too few to feed a
// GEMM tile, so one thread computes one output element with a plain loop, fp32 accumulation.
//   direct_forward    one thread per y[n,k,p,q]:  sum over c < Cg, r, s of x[n, g*Cg+c, p*st-pad+r*dil, ...] w[k,c,r,s]
//   direct_backward_data  one thread per dx[n,c,h,w]: sum over kk < Kg, r, s where (h+pad-r*dil)/st is an
//                     integral in-range p (and likewise q) of dy[n, g*Kg+kk, p, q] w[g*Kg+kk, c%Cg, r, s]
//   The flat thread index runs fastest along the axis with unit stride (CL = 1: channels, NHWC; CL = 0: width,
//   NCHW) so a warp's loads and stores are coalesced; neighbouring threads re-read the same x through L1.
//   direct_backward_filter  one block per (k, c) filter row and pixel slice (blockIdx.y of `splits`): each
//                     thread accumulates the R*S taps (<= MAXRS, registers) over its pixels, the block reduces
//                     them (warp shuffles, then one shared-memory row per warp) and writes its partial
//                     partial[split][k*Cg + c][r*S + s]; a second kernel adds the splits in order (deterministic,
//                     no atomics).
// ============================================================================================================
#ifndef ELEM
#define ELEM 0
#endif
#ifndef CL
#define CL 0
#endif
#ifndef MAXRS
#define MAXRS 9
#endif
#if ELEM == 0
typedef float T;
#else
typedef unsigned short T;
#endif
#ifndef DWF32
#define DWF32 0         // 1: the filter gradients' final stores (direct_splits_reduce, dw_tile_backward_filter) of
#endif                  //    half data write dw in float32, the sums unrounded (autocast's weight gradients)
#if DWF32
typedef float DwT;
#else
typedef T DwT;
#endif
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(unsigned short h) {
#if ELEM == 2
    return __uint_as_float(((unsigned int)h) << 16);
#else
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#endif
}
__device__ __forceinline__ void from_f(float* dst, float v) { *dst = v; }
__device__ __forceinline__ void from_f(unsigned short* dst, float v) {
    unsigned short h;
#if ELEM == 2
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
#endif
    *dst = h;
}

// (n, c, i, j) of flat index `idx` over (N, Cn, I, J), channels fastest when CL.
__device__ __forceinline__ void unflatten(int idx, int Cn, int I, int J, int& n, int& c, int& i, int& j) {
#if CL
    c = idx % Cn; idx /= Cn; j = idx % J; idx /= J; i = idx % I; n = idx / I;
#else
    j = idx % J; idx /= J; i = idx % I; idx /= I; c = idx % Cn; n = idx / Cn;
#endif
}

extern "C" __global__ void __launch_bounds__(256)
direct_forward(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
               int N, int C, int H, int W, int K, int P, int Q, int R, int S,
               int pad_h, int pad_w, int st_h, int st_w, int dil_h, int dil_w, int Cg, int Kg,
               int sxn, int sxc, int sxh, int sxw, int syn, int syc, int syh, int syw, float alpha, float beta)
{
    const int total = N * K * P * Q;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
        int n, k, p, q;
        unflatten(idx, K, P, Q, n, k, p, q);
        const int c0 = (k / Kg) * Cg, h0 = p * st_h - pad_h, w0 = q * st_w - pad_w;
        const T* xn = x + n * sxn;
        const T* wk = w + k * Cg * R * S;
        float acc = 0.f;
        for (int c = 0; c < Cg; ++c) {
            const T* xc = xn + (c0 + c) * sxc;
            for (int r = 0; r < R; ++r) {
                const int h = h0 + r * dil_h;
                if ((unsigned)h >= (unsigned)H) continue;
                for (int s = 0; s < S; ++s) {
                    const int ww = w0 + s * dil_w;
                    if ((unsigned)ww >= (unsigned)W) continue;
                    acc = fmaf(to_f(xc[h * sxh + ww * sxw]), to_f(__ldg(wk + (c * R + r) * S + s)), acc);
                }
            }
        }
        T* dst = y + n * syn + k * syc + p * syh + q * syw;
        const float old = beta != 0.f ? beta * to_f(*dst) : 0.f;
        from_f(dst, alpha * acc + old);
    }
}

extern "C" __global__ void __launch_bounds__(256)
direct_backward_data(const T* __restrict__ w, const T* __restrict__ dy, T* __restrict__ dx,
                     int N, int C, int H, int W, int K, int P, int Q, int R, int S,
                     int pad_h, int pad_w, int st_h, int st_w, int dil_h, int dil_w, int Cg, int Kg,
                     int sxn, int sxc, int sxh, int sxw, int syn, int syc, int syh, int syw, float alpha, float beta)
{
    const int total = N * C * H * W;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += gridDim.x * blockDim.x) {
        int n, c, h, ww;
        unflatten(idx, C, H, W, n, c, h, ww);
        const int grp = c / Cg, cl = c - grp * Cg;
        const T* dyn = dy + n * syn;
        float acc = 0.f;
        for (int r = 0; r < R; ++r) {
            int hp = h + pad_h - r * dil_h;
            if (hp < 0) continue;
            if (st_h > 1) { const int p_ = hp / st_h; if (p_ * st_h != hp) continue; hp = p_; }
            if (hp >= P) continue;
            for (int s = 0; s < S; ++s) {
                int wp = ww + pad_w - s * dil_w;
                if (wp < 0) continue;
                if (st_w > 1) { const int q_ = wp / st_w; if (q_ * st_w != wp) continue; wp = q_; }
                if (wp >= Q) continue;
                const T* d = dyn + hp * syh + wp * syw;
                for (int kk = 0; kk < Kg; ++kk) {
                    const int k = grp * Kg + kk;
                    acc = fmaf(to_f(d[k * syc]), to_f(__ldg(w + ((k * Cg + cl) * R + r) * S + s)), acc);
                }
            }
        }
        T* dst = dx + n * sxn + c * sxc + h * sxh + ww * sxw;
        const float old = beta != 0.f ? beta * to_f(*dst) : 0.f;
        from_f(dst, alpha * acc + old);
    }
}

extern "C" __global__ void __launch_bounds__(256)
direct_backward_filter(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ partial,
                       int N, int C, int H, int W, int K, int P, int Q, int R, int S,
                       int pad_h, int pad_w, int st_h, int st_w, int dil_h, int dil_w, int Cg, int Kg,
                       int sxn, int sxc, int sxh, int sxw, int syn, int syc, int syh, int syw, int per_split)
{
    const int kc = blockIdx.x, k = kc / Cg, cl = kc - k * Cg, c = (k / Kg) * Cg + cl;
    const int RS = R * S, PQ = P * Q, NPQ = N * PQ;
    const int begin = blockIdx.y * per_split, end = min(NPQ, begin + per_split);
    float acc[MAXRS];
    #pragma unroll
    for (int t = 0; t < MAXRS; ++t) acc[t] = 0.f;
    const T* xc = x + c * sxc;
    const T* dyk = dy + k * syc;
    for (int j = begin + threadIdx.x; j < end; j += blockDim.x) {
        const int n = j / PQ, pq = j - n * PQ, p = pq / Q, q = pq - p * Q;
        const float d = to_f(dyk[n * syn + p * syh + q * syw]);
        const int h0 = p * st_h - pad_h, w0 = q * st_w - pad_w;
        const T* xn = xc + n * sxn;
        #pragma unroll
        for (int t = 0; t < MAXRS; ++t) {
            if (t >= RS) break;
            const int r = t / S, s = t - r * S, h = h0 + r * dil_h, ww = w0 + s * dil_w;
            if ((unsigned)h < (unsigned)H && (unsigned)ww < (unsigned)W)
                acc[t] = fmaf(d, to_f(xn[h * sxh + ww * sxw]), acc[t]);
        }
    }
    __shared__ float red[8][MAXRS];            // one row per warp (blockDim.x == 256)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    #pragma unroll
    for (int t = 0; t < MAXRS; ++t) {
        if (t >= RS) break;
        float v = acc[t];
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[warp][t] = v;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < RS; t += blockDim.x) {
        float v = 0.f;
        #pragma unroll
        for (int i = 0; i < 8; ++i) v += red[i][t];
        partial[((long long)blockIdx.y * K * Cg + kc) * RS + t] = v;
    }
}

// out[i] = alpha * sum_s partial[s][i] + beta * out[i], splits added in order.
extern "C" __global__ void __launch_bounds__(256)
direct_splits_reduce(const float* __restrict__ partial, DwT* __restrict__ out, int splits, int n, float alpha,
                     float beta)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int k = 0; k < splits; ++k) s += partial[(long long)k * n + i];
        const float old = beta != 0.f ? beta * to_f(out[i]) : 0.f;
        from_f(out + i, alpha * s + old);
    }
}
// ---- few channels per group (Cg <= 8), NCHW rows (unit stride along width); taps, stride, dilation compile-time ----
// dw_plane_forward: grid (tiles of the P x Q plane, K, N), block TW x (256/TW): one thread per output y[n,k,p,q]
//   of a (256/TW) x TW tile, summing its group's Cg input planes; the weights are block-uniform (broadcast
//   loads); no division in the loop; a warp reads TW consecutive inputs per tap (coalesced; neighbouring taps hit
//   L1).  Backward data with stride 1 is this kernel run on dy with the kernel flipped, its channel roles
//   swapped within each group, and padding dil*(R-1) - pad.
// dw_plane_backward_filter: grid (K*Cg filter rows, splits of the batch), 256 threads as (256/TW) rows x TW
//   columns sweeping each plane of the split; KR*KS accumulators per thread, block-reduced as
//   direct_backward_filter does; partials reduced in split order by direct_splits_reduce.
//   (dw_tile_backward_filter, below, replaces it where it applies; this one keeps what that declines.)
#ifndef KR
#define KR 3
#define KS 3
#define ST 1
#define DL 1
#endif
#ifndef TW
#define TW 32
#endif
#define TH (256 / TW)

extern "C" __global__ void __launch_bounds__(256)
dw_plane_forward(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                 int H, int W, int P, int Q, int pad_h, int pad_w, int Cg, int Kg,
                 int sxn, int sxc, int sxh, int syn, int syc, int syh, int tiles_q, float alpha, float beta)
{
    const int k = blockIdx.y, n = blockIdx.z, c0 = (k / Kg) * Cg;
    const int tp = blockIdx.x / tiles_q, tq = blockIdx.x - tp * tiles_q;
    const int q = tq * TW + threadIdx.x, p = tp * TH + threadIdx.y;
    if (p >= P || q >= Q) return;
    const int h0 = p * ST - pad_h, w0 = q * ST - pad_w;
    float acc = 0.f;
    for (int cc = 0; cc < Cg; ++cc) {
        const T* xp = x + n * sxn + (c0 + cc) * sxc;
        const T* wk = w + (k * Cg + cc) * (KR * KS);
        #pragma unroll
        for (int r = 0; r < KR; ++r) {
            const int h = h0 + r * DL;
            if ((unsigned)h >= (unsigned)H) continue;
            const T* row = xp + h * sxh;
            #pragma unroll
            for (int s = 0; s < KS; ++s) {
                const int ww = w0 + s * DL;
                if ((unsigned)ww < (unsigned)W) acc = fmaf(to_f(row[ww]), to_f(__ldg(wk + r * KS + s)), acc);
            }
        }
    }
    T* dst = y + n * syn + k * syc + p * syh + q;
    const float old = beta != 0.f ? beta * to_f(*dst) : 0.f;
    from_f(dst, alpha * acc + old);
}

extern "C" __global__ void __launch_bounds__(256)
dw_plane_backward_filter(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ partial,
                         int N, int K, int H, int W, int P, int Q, int pad_h, int pad_w, int Cg, int Kg,
                         int sxn, int sxc, int sxh, int syn, int syc, int syh, int n_per_split)
{
    const int kc = blockIdx.x, k = kc / Cg, c = (k / Kg) * Cg + (kc - k * Cg), split = blockIdx.y;
    const int n0 = split * n_per_split, n1 = min(N, n0 + n_per_split);
    const int tx = threadIdx.x % TW, ty = threadIdx.x / TW;
    float acc[KR * KS];
    #pragma unroll
    for (int t = 0; t < KR * KS; ++t) acc[t] = 0.f;
    for (int n = n0; n < n1; ++n) {
        const T* xp = x + n * sxn + c * sxc;
        const T* dp = dy + n * syn + k * syc;
        for (int p = ty; p < P; p += TH) {
            const int h0 = p * ST - pad_h;
            for (int q = tx; q < Q; q += TW) {
                const float d = to_f(dp[p * syh + q]);
                const int w0 = q * ST - pad_w;
                #pragma unroll
                for (int r = 0; r < KR; ++r) {
                    const int h = h0 + r * DL;
                    if ((unsigned)h >= (unsigned)H) continue;
                    const T* row = xp + h * sxh;
                    #pragma unroll
                    for (int s = 0; s < KS; ++s) {
                        const int ww = w0 + s * DL;
                        if ((unsigned)ww < (unsigned)W) acc[r * KS + s] = fmaf(d, to_f(row[ww]), acc[r * KS + s]);
                    }
                }
            }
        }
    }
    __shared__ float red[8][KR * KS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    #pragma unroll
    for (int t = 0; t < KR * KS; ++t) {
        float v = acc[t];
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[warp][t] = v;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < KR * KS; t += blockDim.x) {
        float v = 0.f;
        #pragma unroll
        for (int i = 0; i < 8; ++i) v += red[i][t];
        partial[((long long)split * K * Cg + kc) * (KR * KS) + t] = v;
    }
}

// ---- register-tiled depthwise/grouped forward, NCHW rows (unit stride along width) --------------------------
// dw_tile_forward: block (TX, TY, TZ) threads (blockDim, <= 256), grid (plane groups, tiles of P, tiles of Q).
//   threadIdx.z picks one of the block's TZ output planes z = n*Kout + k (blockIdx.x*TZ + threadIdx.z, planes past
//   N*Kout idle but keep the barriers); each plane's TX*TY threads cover a tile of (TY*VH) x (TX*VW) outputs
//   starting at (p0, q0) = (blockIdx.y*TY*VH, blockIdx.z*TX*VW); thread (tx, ty) computes the VH x VW outputs
//   y[n, k, p0 + ty*VH + i, q0 + tx*VW + j] (i < VH, j < VW), fp32 accumulators in registers.
//   Per input channel of the group (c0 + cc, cc < Cg): the plane's threads stage the input tile with its halo,
//   IH = (TY*VH-1)*ST + (KR-1)*DL + 1 rows x `pitch` columns from (h, w) = (p0*ST - pad_h, q0*ST - pad_w), into
//   shared memory as float (zero outside the image), in 16-byte chunks aligned in global memory (one 16-byte
//   load where the chunk lies inside the row and the plane's rows are 16-byte aligned; element loads else),
//   then each thread reads, per input row of its window (IRH rows), the WIN = (VW-1)*ST + (KS-1)*DL + 1 columns
//   it needs as float4s (its window starts at column tx*VW*ST, a multiple of 4; `pitch` is a multiple of 4 and
//   covers the last thread's WIN4 float4s) and applies every tap (r, s) that row holds to all its outputs.
//   Taps, stride, dilation, VW and VH are compile-time; the weights of (k, cc) sit in registers.
//   Epilogue: alpha*acc + beta*y (y read only when beta != 0), VW outputs per store where aligned and whole.
//   Backward data with stride 1 runs this kernel on dy with FLIP=1: the convolution's own filter read flipped
//   and with its channel roles swapped within each group (no flipped copy of the filter, no extra launch).
#ifndef VW
#define VW 4
#endif
#ifndef VH
#define VH 2
#endif
#define WIN ((VW - 1) * ST + (KS - 1) * DL + 1)
#define WIN4 ((WIN + 3) / 4)
#define IRH ((VH - 1) * ST + (KR - 1) * DL + 1)
#define LV (16 / (int)sizeof(T))
#if ELEM == 0
typedef float4 OutVec;            // VW == 4 outputs of 4 bytes
#else
typedef uint2 OutVec;             // VW == 4 outputs of 2 bytes
#endif
#ifndef FLIP
#define FLIP 0
#endif
union ChunkU { uint4 v; T e[LV]; };
union OutU { OutVec v; T e[VW]; };

// A thread's row of N outputs at dst, the first `valid` of them inside the tensor: dst = o + beta * dst (dst read
// only when beta != 0), one 4-wide store where N == VW == 4, the row is whole and dst is aligned; element by element
// otherwise.  dw_tile_forward's and dw_tile_backward_data's epilogue.
template <int N>
__device__ __forceinline__ void store_outputs(T* dst, float* o, int valid, float beta) {
#if VW == 4
    if (N == 4 && valid >= 4 && (reinterpret_cast<unsigned long long>(dst) & (sizeof(OutVec) - 1)) == 0) {
        OutU u;
        if (beta != 0.f) {
            u.v = *reinterpret_cast<const OutVec*>(dst);
            #pragma unroll
            for (int j = 0; j < 4; ++j) o[j] += beta * to_f(u.e[j]);
        }
        #pragma unroll
        for (int j = 0; j < 4; ++j) from_f(&u.e[j], o[j]);
        *reinterpret_cast<OutVec*>(dst) = u.v;
        return;
    }
#endif
    #pragma unroll
    for (int j = 0; j < N; ++j) {
        if (j >= valid) break;
        const float old = beta != 0.f ? beta * to_f(dst[j]) : 0.f;
        from_f(dst + j, o[j] + old);
    }
}

// The IH x pitch input tile of plane xp whose corner is (h_base, w_base), as float into `tile` (row pitch `pitch`),
// zero outside the H x W image; threads tid < nthr share it in 16-byte chunks aligned in global memory (the
// first chunk starts at w_base rounded down to a chunk): one 16-byte load where the chunk lies inside the row and
// the plane's rows are 16-byte aligned, element loads else.  No barrier (the caller's).
__device__ __forceinline__ void stage_tile(const T* __restrict__ xp, float* tile, int H, int W, int sxh, int IH,
                                           int pitch, int h_base, int w_base, int tid, int nthr)
{
    const int ws = w_base & ~(LV - 1);                     // w_base rounded down to a 16-byte chunk
    const int nv = (w_base - ws + pitch + LV - 1) / LV;    // chunks per staged row
    const bool vec_ok = (reinterpret_cast<unsigned long long>(xp) & 15) == 0 && (sxh & (LV - 1)) == 0;
    for (int i = tid; i < IH * nv; i += nthr) {
        const int row = i / nv, v = i - row * nv;
        const int h = h_base + row, gw = ws + v * LV, col = gw - w_base;
        ChunkU u;
        float vals[LV];
        if ((unsigned)h >= (unsigned)H) {
            #pragma unroll
            for (int e = 0; e < LV; ++e) vals[e] = 0.f;
        } else if (vec_ok && gw >= 0 && gw + LV <= W) {
            u.v = __ldg(reinterpret_cast<const uint4*>(xp + h * sxh + gw));
            #pragma unroll
            for (int e = 0; e < LV; ++e) vals[e] = to_f(u.e[e]);
        } else {
            const T* src = xp + h * sxh;
            #pragma unroll
            for (int e = 0; e < LV; ++e) vals[e] = (unsigned)(gw + e) < (unsigned)W ? to_f(src[gw + e]) : 0.f;
        }
        float* dst = tile + row * pitch;
        #pragma unroll
        for (int e = 0; e < LV; ++e)
            if ((unsigned)(col + e) < (unsigned)pitch) dst[col + e] = vals[e];
    }
}

// The epilogue of a thread's NH x NW tile acc, for dw_tile_forward (y) and dw_tile_backward_data (dx) alike: its row i
// at row ROW0 + i of the plane PLANE (row stride SH) from column COL, rows past LIMH and a column start past LIMW
// skipped, alpha * acc blended with beta * the old value by store_outputs.  Over the caller's acc, alpha and beta.
#define STORE_TILE(PLANE, SH, ROW0, LIMH, COL, LIMW, NH, NW)                                                    \
    _Pragma("unroll")                                                                                          \
    for (int i = 0; i < NH; ++i) {                                                                             \
        const int row = ROW0 + i;                                                                              \
        if (row >= LIMH || COL >= LIMW) continue;                                                              \
        T* dst = PLANE + row * SH + COL;                                                                       \
        float o[NW];                                                                                           \
        _Pragma("unroll")                                                                                      \
        for (int j = 0; j < NW; ++j) o[j] = alpha * acc[i][j];                                                 \
        store_outputs<NW>(dst, o, LIMW - COL, beta);                                                           \
    }

// The taps a thread's window meets, for dw_tile_forward and dw_tile_backward_filter alike: each of its IRH input rows
// (from `base`, its window's first column in the staged tile) read once as WIN4 float4s into xs[], then the caller's
// statements (the macro's last arguments) for every output row i < VH that input row ir reaches through filter row r
// (ir = i * ST + r * DL; i and r compile-time after unrolling).  A macro, not a function taking a lambda: a lambda in
// the kernel changed its PTX (the kernel's static shared arrays took its full mangled name); the macro compiles to
// the PTX the two copies did (nvcc sm_90, 30 configurations compared).
#define TILE_TAPS(base, pitch, ...)                                                                              \
    _Pragma("unroll")                                                                                          \
    for (int ir = 0; ir < IRH; ++ir) {                                                                         \
        float xs[WIN4 * 4];                                                                                    \
        _Pragma("unroll")                                                                                      \
        for (int j = 0; j < WIN4; ++j) {                                                                       \
            const float4 f = reinterpret_cast<const float4*>((base) + ir * (pitch))[j];                         \
            xs[4 * j] = f.x; xs[4 * j + 1] = f.y; xs[4 * j + 2] = f.z; xs[4 * j + 3] = f.w;                    \
        }                                                                                                      \
        _Pragma("unroll")                                                                                      \
        for (int i = 0; i < VH; ++i) {                                                                         \
            const int tap_d = ir - i * ST;                                                                     \
            if (tap_d < 0 || tap_d % DL != 0 || tap_d / DL >= KR) continue;                                    \
            const int r = tap_d / DL;                                                                          \
            __VA_ARGS__                                                                                        \
        }                                                                                                      \
    }

extern "C" __global__ void __launch_bounds__(256)
dw_tile_forward(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                int H, int W, int P, int Q, int pad_h, int pad_w, int Cg, int Kg, int Kout, int planes,
                int sxn, int sxc, int sxh, int syn, int syc, int syh, int pitch, float alpha, float beta)
{
    static_assert(VW == 4, "the float4 window reads and the vector stores assume VW == 4");
    extern __shared__ float4 smem4[];
    const int TX = blockDim.x, TY = blockDim.y;
    const int IH = (TY * VH - 1) * ST + (KR - 1) * DL + 1;
    float* tile = reinterpret_cast<float*>(smem4) + threadIdx.z * IH * pitch;
    const int z = blockIdx.x * blockDim.z + threadIdx.z;
    const bool live = z < planes;
    const int n = live ? z / Kout : 0, k = live ? z - n * Kout : 0;
    const int c0 = (k / Kg) * Cg;
    const int p0 = blockIdx.y * TY * VH, q0 = blockIdx.z * TX * VW;
    const int h_base = p0 * ST - pad_h, w_base = q0 * ST - pad_w;
    const int tid = threadIdx.y * TX + threadIdx.x, nthr = TX * TY;
    float acc[VH][VW];
    #pragma unroll
    for (int i = 0; i < VH; ++i)
        #pragma unroll
        for (int j = 0; j < VW; ++j) acc[i][j] = 0.f;
    for (int cc = 0; cc < Cg; ++cc) {
        if (live) stage_tile(x + n * sxn + (c0 + cc) * sxc, tile, H, W, sxh, IH, pitch, h_base, w_base, tid, nthr);
        __syncthreads();
        if (live) {
            float wr[KR * KS];
#if FLIP
            // backward data: w is the convolution's own filter (Kc, Cg', R, S); this launch's output channel k is
            // its input channel and the summed channel c0 + cc its output channel, so the weight of tap (r, s) is
            // w[c0 + cc][k % Kg][R-1-r][S-1-s] (Kg here = the convolution's channels per group)
            const T* wk = w + ((c0 + cc) * Kg + (k - (k / Kg) * Kg)) * (KR * KS);
            #pragma unroll
            for (int t = 0; t < KR * KS; ++t) wr[t] = to_f(__ldg(wk + (KR * KS - 1 - t)));
#else
            const T* wk = w + (k * Cg + cc) * (KR * KS);
            #pragma unroll
            for (int t = 0; t < KR * KS; ++t) wr[t] = to_f(__ldg(wk + t));
#endif
            const float* base = tile + threadIdx.y * (VH * ST) * pitch + threadIdx.x * (VW * ST);
            TILE_TAPS(base, pitch,
                _Pragma("unroll")
                for (int s = 0; s < KS; ++s)
                    _Pragma("unroll")
                    for (int j = 0; j < VW; ++j) acc[i][j] = fmaf(xs[j * ST + s * DL], wr[r * KS + s], acc[i][j]);
            )
        }
        __syncthreads();
    }
    if (!live) return;
    T* yp = y + n * syn + k * syc;
    const int q = q0 + threadIdx.x * VW;
    STORE_TILE(yp, syh, p0 + threadIdx.y * VH, P, q, Q, VH, VW)
}

// ---- register-tiled depthwise/grouped backward filter, NCHW rows (unit stride along width) ------------------
// dw_tile_backward_filter:  dw[k, cl, r, s] = sum over n, p, q of dy[n, k, p, q] * x[n, c, p*ST + r*DL - pad_h,
//   q*ST + s*DL - pad_w]   (c = (k/Kg)*Cg + cl; one "filter row" kc = k*Cg + cl pairs dy's channel k with x's c).
//   grid (K*Cg filter rows, splits), block NT threads, 1-D: NT = TX*TY*TZ rounded up to whole warps (threads past
//   TX*TY*TZ stage and compute nothing but join the warp reductions, so every shuffle is over a full warp).
//   A row's work items are (n, dy tile) pairs, item = n*tiles + tp*tiles_q + tq, the tiles (TY*VH) x (TX*VW) of
//   dy as dw_tile_forward tiles its output; split blockIdx.y takes items [split*per_split, +per_split), TZ at a
//   time: slice z = tid / (TX*TY) takes item it0 + z, its thread (tx, ty) the VH x VW dy values
//   dy[n, k, p0 + ty*VH + i, q0 + tx*VW + j].  Per item: the slice stages the x tile of its dy tile with the
//   halo (stage_tile, as the forward: IH rows x pitch columns from (p0*ST - pad_h, q0*ST - pad_w)), each thread
//   loads its dy values (VW-wide loads where aligned and whole, zero past P or Q) and, per input row of its
//   window (IRH rows), reads the float4 run of WIN x values it needs and adds dy[i][j] * x[..] into acc[r*KS+s]
//   for every tap (r, s) that row holds: KR*KS fp32 accumulators in registers, the product order fixed.
//   End: the block sums each tap over its threads (xor-shuffle butterfly per warp, one shared row per warp,
//   warps added in order); with one split that is dw's row; else the block stores its KR*KS partial sums at
//   partial[kc][split][:], fences, and draws the row's ticket; the block drawing the last one re-reads every
//   split's partials IN SPLIT ORDER (bitwise the same sums whichever block came last), writes
//   dw[kc][:] = alpha*sum + beta*dw and resets the ticket to 0 (the implicit-GEMM split-K idiom; one launch).
//   Traffic: x and dy read once (plus the halo rows of each tile), KR*KS*splits floats of partials per row.
extern "C" __global__ void __launch_bounds__(256)
dw_tile_backward_filter(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ partial,
                        unsigned int* __restrict__ tickets, DwT* __restrict__ dw,
                        int H, int W, int P, int Q, int pad_h, int pad_w, int Cg, int Kg,
                        int sxn, int sxc, int sxh, int syn, int syc, int syh,
                        int TX, int TY, int TZ, int tiles_q, int tiles, int items, int per_split, int pitch,
                        float alpha, float beta)
{
    static_assert(VW == 4, "the float4 window reads and the dy vector loads assume VW == 4");
    constexpr int RS = KR * KS;
    extern __shared__ float4 smem4[];
    const int IH = (TY * VH - 1) * ST + (KR - 1) * DL + 1;
    const int tid = threadIdx.x, plane_thr = TX * TY;
    const int z = tid / plane_thr, pt = tid - z * plane_thr;       // slice, thread within the slice
    const int ty = pt / TX, tx = pt - ty * TX;
    const bool worker = z < TZ;
    float* tile = reinterpret_cast<float*>(smem4) + (worker ? z : 0) * IH * pitch;
    const int kc = blockIdx.x, k = kc / Cg, c = (k / Kg) * Cg + (kc - k * Cg);
    const int begin = blockIdx.y * per_split, end = min(items, begin + per_split);
    const T* xc = x + c * sxc;
    const T* dyk = dy + k * syc;
    float acc[RS];
    #pragma unroll
    for (int t = 0; t < RS; ++t) acc[t] = 0.f;
    for (int it0 = begin; it0 < end; it0 += TZ) {                  // block-uniform trip count (barriers inside)
        const int it = it0 + z;
        const bool live = worker && it < end;
        int n = 0, p0 = 0, q0 = 0;
        if (live) {
            n = it / tiles;
            const int t = it - n * tiles, tp = t / tiles_q;
            p0 = tp * TY * VH;
            q0 = (t - tp * tiles_q) * TX * VW;
        }
        float d[VH][VW];                 // this thread's dy values, loaded before the staging: both in flight
        #pragma unroll
        for (int i = 0; i < VH; ++i)
            #pragma unroll
            for (int j = 0; j < VW; ++j) d[i][j] = 0.f;
        if (live) {
            const int q = q0 + tx * VW;
            #pragma unroll
            for (int i = 0; i < VH; ++i) {
                const int p = p0 + ty * VH + i;
                if (p >= P || q >= Q) continue;
                const T* src = dyk + n * syn + p * syh + q;
                if (q + VW <= Q && (reinterpret_cast<unsigned long long>(src) & (sizeof(OutVec) - 1)) == 0) {
                    OutU u;
                    u.v = __ldg(reinterpret_cast<const OutVec*>(src));
                    #pragma unroll
                    for (int j = 0; j < VW; ++j) d[i][j] = to_f(u.e[j]);
                } else {
                    #pragma unroll
                    for (int j = 0; j < VW; ++j) d[i][j] = q + j < Q ? to_f(src[j]) : 0.f;
                }
            }
            stage_tile(xc + n * sxn, tile, H, W, sxh, IH, pitch, p0 * ST - pad_h, q0 * ST - pad_w, pt, plane_thr);
        }
        __syncthreads();
        if (live) {
            const float* base = tile + ty * (VH * ST) * pitch + tx * (VW * ST);
            TILE_TAPS(base, pitch,
                _Pragma("unroll")
                for (int s = 0; s < KS; ++s)
                    _Pragma("unroll")
                    for (int j = 0; j < VW; ++j) acc[r * KS + s] = fmaf(d[i][j], xs[j * ST + s * DL], acc[r * KS + s]);
            )
        }
        __syncthreads();
    }
    __shared__ float red[8][RS];           // one row per warp (NT <= 256)
    __shared__ int s_last;
    const int warp = tid >> 5, lane = tid & 31, nwarps = blockDim.x >> 5;
    #pragma unroll
    for (int t = 0; t < RS; ++t) {
        float v = acc[t];
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[warp][t] = v;
    }
    __syncthreads();
    DwT* dwr = dw + (long long)kc * RS;
    if (gridDim.y == 1) {
        for (int t = tid; t < RS; t += blockDim.x) {
            float v = 0.f;
            for (int i = 0; i < nwarps; ++i) v += red[i][t];
            const float old = beta != 0.f ? beta * to_f(dwr[t]) : 0.f;
            from_f(dwr + t, alpha * v + old);
        }
        return;
    }
    float* row_part = partial + (long long)kc * gridDim.y * RS;
    for (int t = tid; t < RS; t += blockDim.x) {
        float v = 0.f;
        for (int i = 0; i < nwarps; ++i) v += red[i][t];
        row_part[blockIdx.y * RS + t] = v;
    }
    __threadfence();                       // this block's partials visible device-wide ...
    __syncthreads();                       // ... before thread 0 draws the row's ticket for the block
    if (tid == 0) s_last = atomicAdd(tickets + kc, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();                       // the other splits' partials, published before their tickets
    for (int t = tid; t < RS; t += blockDim.x) {
        float v = 0.f;
        for (int sp = 0; sp < (int)gridDim.y; ++sp) v += __ldcg(row_part + sp * RS + t);   // L2, split order
        const float old = beta != 0.f ? beta * to_f(dwr[t]) : 0.f;
        from_f(dwr + t, alpha * v + old);
    }
    if (tid == 0) tickets[kc] = 0u;        // every split has drawn: the counter is free for the next launch
}

// ---- register-tiled depthwise/grouped backward data of any stride, NCHW rows (unit stride along width) -------
// dw_tile_backward_data (gather form, 2026-11-26):  dx[n, c, h, w] = sum over kk < Kg, r, s of
//   dy[n, k, p, q] * w[k, c % Cg, r, s]   (k = (c / Cg)*Kg + kk) where p = (h + pad_h - r*DL) / ST and
//   q = (w + pad_w - s*DL) / ST are exact and in range.  Residue classes: the block's dx tile starts at a multiple
//   of ST on both axes and each thread owns DVH x DVW outputs with DVH, DVW multiples of ST, so its output row
//   h = h_t + i (h_t a multiple of ST) has h + pad_h = ST*U + (PHM + i), U = h_t/ST + pad_h/ST, PHM = pad_h % ST
//   (compile-time, the launcher compiles per pad residue): tap r reaches row i iff (PHM + i - r*DL) % ST == 0,
//   and then p = U + (PHM + i - r*DL)/ST -- a compile-time offset from U.  So the taps of each output are fixed
//   at compile time (no division, no branch, only the taps that land: (KR/ST)*(KS/ST) on average).
//   block (TX, TY, TZ) threads, grid (plane groups, tiles of H, tiles of W), plane z = n*C + c.  Per summed
//   channel kk the plane's threads stage the dy tile it needs (stage_tile: zero outside P x Q, 16-byte loads
//   where aligned): IH = (TY-1)*(DVH/ST) + DG_IRH rows x pitch >= (TX-1)*(DVW/ST) + DG_IRW columns from
//   (h0/ST + pad_h/ST + DG_EMIN, w0/ST + pad_w/ST + DG_FMIN); thread (tx, ty) reads its DG_IRH x DG_IRW window at
//   (ty*DVH/ST, tx*DVW/ST) into registers and applies every landing tap.  fp32 accumulation; the epilogue is
//   dw_tile_forward's (alpha/beta, 4-wide stores where DVW == 4, aligned and whole).  Deterministic (no atomics:
//   every dx element is written by exactly one thread).  The launcher picks DVH = ST (2 for ST = 1), DVW = 4 for
//   ST in {1, 2, 4}, DVW = ST else.
#ifndef DVH                     // defaults as the launcher picks them (the module also compiles for the other
#define DVH (ST == 1 ? 2 : ST)   // kernels, at any ST: the static_assert below must hold there too)
#endif
#ifndef DVW
#define DVW (4 % ST == 0 ? 4 : ST)
#endif
#ifndef PHM
#define PHM 0
#endif
#ifndef PWM
#define PWM 0
#endif
#define DG_FLOORDIV(a, b) ((a) >= 0 ? (a) / (b) : -((-(a) + (b) - 1) / (b)))
#define DG_EMIN DG_FLOORDIV(PHM - (KR - 1) * DL, ST)        // window rows relative to U: DG_EMIN .. DG_EMAX
#define DG_EMAX ((PHM + DVH - 1) / ST)
#define DG_FMIN DG_FLOORDIV(PWM - (KS - 1) * DL, ST)
#define DG_FMAX ((PWM + DVW - 1) / ST)
#define DG_IRH (DG_EMAX - DG_EMIN + 1)
#define DG_IRW (DG_FMAX - DG_FMIN + 1)

extern "C" __global__ void __launch_bounds__(256)
dw_tile_backward_data(const T* __restrict__ w, const T* __restrict__ dy, T* __restrict__ dx,
                      int H, int W, int P, int Q, int pad_h, int pad_w, int Cg, int Kg, int C, int planes,
                      int sxn, int sxc, int sxh, int syn, int syc, int syh, int pitch, float alpha, float beta)
{
    static_assert(DVH % ST == 0 && DVW % ST == 0, "a thread's outputs start at a multiple of ST");
    static_assert(PHM < ST && PWM < ST, "PHM, PWM: the padding's residues modulo ST");
    extern __shared__ float4 smem4[];
    const int TX = blockDim.x, TY = blockDim.y;
    const int IH = (TY - 1) * (DVH / ST) + DG_IRH;
    float* tile = reinterpret_cast<float*>(smem4) + threadIdx.z * IH * pitch;
    const int z = blockIdx.x * blockDim.z + threadIdx.z;
    const bool live = z < planes;
    const int n = live ? z / C : 0, c = live ? z - n * C : 0;
    const int grp = c / Cg, cl = c - grp * Cg;
    const int h0 = blockIdx.y * TY * DVH, w0 = blockIdx.z * TX * DVW;
    const int p_base = h0 / ST + pad_h / ST + DG_EMIN, q_base = w0 / ST + pad_w / ST + DG_FMIN;
    const int tid = threadIdx.y * TX + threadIdx.x, nthr = TX * TY;
    float acc[DVH][DVW];
    #pragma unroll
    for (int i = 0; i < DVH; ++i)
        #pragma unroll
        for (int j = 0; j < DVW; ++j) acc[i][j] = 0.f;
    for (int kk = 0; kk < Kg; ++kk) {
        const int k = grp * Kg + kk;
        if (live) stage_tile(dy + n * syn + k * syc, tile, P, Q, syh, IH, pitch, p_base, q_base, tid, nthr);
        __syncthreads();
        if (live) {
            float wr[KR * KS];
            const T* wk = w + (k * Cg + cl) * (KR * KS);
            #pragma unroll
            for (int t = 0; t < KR * KS; ++t) wr[t] = to_f(__ldg(wk + t));
            const float* base = tile + threadIdx.y * (DVH / ST) * pitch + threadIdx.x * (DVW / ST);
            float win[DG_IRH][DG_IRW];     // elements no tap reads are dead loads the compiler drops
            #pragma unroll
            for (int e = 0; e < DG_IRH; ++e)
                #pragma unroll
                for (int f = 0; f < DG_IRW; ++f) win[e][f] = base[e * pitch + f];
            #pragma unroll
            for (int i = 0; i < DVH; ++i)
                #pragma unroll
                for (int r = 0; r < KR; ++r) {
                    const int a = PHM + i - r * DL;                  // compile-time after unrolling
                    if (a % ST != 0) continue;
                    const int e = a / ST - DG_EMIN;                  // exact division: a is a multiple of ST
                    #pragma unroll
                    for (int j = 0; j < DVW; ++j)
                        #pragma unroll
                        for (int s = 0; s < KS; ++s) {
                            const int b = PWM + j - s * DL;
                            if (b % ST != 0) continue;
                            acc[i][j] = fmaf(win[e][b / ST - DG_FMIN], wr[r * KS + s], acc[i][j]);
                        }
                }
        }
        __syncthreads();
    }
    if (!live) return;
    T* xp = dx + n * sxn + c * sxc;
    const int wq = w0 + threadIdx.x * DVW;
    STORE_TILE(xp, sxh, h0 + threadIdx.y * DVH, H, wq, W, DVH, DVW)
}
"""


if __name__ == "__main__":      # python -m minidnn.backend.cuda.conv_direct_source OUT.cu NAME=VALUE ... (for nvcc)
    import sys

    from minidnn.backend.cuda.launch import write_source
    write_source(sys.argv[1], SOURCE, sys.argv[2:])
