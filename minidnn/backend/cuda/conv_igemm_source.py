"""CUDA C++ source of the implicit-GEMM 2-D convolution kernels (one source; configurations are macros).

Kept apart from the Python launcher (conv_igemm.py) so that ``python -m minidnn.backend.cuda.conv_igemm_source out.cu``
writes a .cu file that nvcc compiles on a machine without a GPU (``nvcc -arch=sm_90 -cubin -Xptxas -v``).
"""
from __future__ import annotations

SOURCE = r"""
// ============================================================================================================
// Implicit-GEMM 2-D convolution: forward (DIR 0), backward data (DIR 1), backward filter (DIR 2).
//
// Shapes (channels-first index order; the memory may be NCHW or NHWC: every x/dy/y/dx access goes through
// element strides, so one kernel serves both layouts and any strided view):
//   x, dx: (N, C, H, W)   strides sxn, sxc, sxh, sxw        w, dw: (K, C/G, R, S) contiguous
//   y, dy: (N, K, P, Q)   strides syn, syc, syh, syw        G = groups, Cg = C/G, Kg = K/G, RS = R*S
//
// The GEMM each direction computes per group g (blockIdx.z = g * splits + split), never materialising im2col:
//   DIR 0  y[n,k,p,q]   M = N*P*Q (output pixels)  NG = Kg  KR = Cg*R*S   A = x gathered (k = c*RS + r*S + s)
//                                                                          B = w[g*Kg + n][k]
//   DIR 1  dx[n,c,h,w]  M = N*H*W (input pixels)   NG = Cg  KR = Kg*R*S   A = dy gathered at p = (h+pad-r*dil)/stride
//                                                                          (zero where not integral / outside)
//                                                                          B = w[g*Kg + k/RS][n][k%RS]
//   DIR 2  dw[k,c,r,s]  M = Cg*R*S (filter taps)   NG = Kg  KR = N*P*Q    A = x gathered, B = dy; the KR range
//                                                                          is cut into `splits` slices (below)
//   DIR 1 with splits = st_h*st_w > 1 (strided, undilated): ONE launch runs every residue class of dx, blockIdx.z =
//   g * splits + class, class (a, b) = dx pixels h = a + i*st_h, w = b + j*st_w: a stride-1 problem of its own
//   (rows ceil((H-a)/st_h), sub-kernel taps r = r0 + jr*st_h with r0 = (a+pad_h) mod st_h, padding
//   (a+pad_h-r0)/st_h; columns alike).  Each block rewrites its geometry to its class's sub-problem, reads the
//   ORIGINAL filter at tap r0*S + s0 + jr*st_h*S + js*st_w (no sub-kernel copies) and writes dx through strides
//   st_h*sxh, st_w*sxw from pixel (a, b); a class without a tap (kernel smaller than the stride) writes
//   alpha*0 + beta*dx.  blockIdx.x spans the largest class (class 0); blocks past their class's rows exit.
//   The per-k (DIR 0/1) or per-row (DIR 2) tap decode (c or k, r*dil_h, s*dil_w, offsets) is computed with
//   32-bit divisions (IMPLICIT_GEMM) or read from a small int4 table (IMPLICIT_PRECOMP_GEMM, `table` != 0).
// VEC 1 (DIR 0, DIR 1 stride 1 or residue classes; the host checks the conditions): the NHWC loader.  The reduction
//   index is reordered k = (r*S + s)*CH + c, c fastest (CH = Cg forward, Kg backward data), so that VECW =
//   16/sizeof(T) consecutive k are consecutive channels of one pixel: each thread copies 16 bytes (4 float32 or 8 half
//   channels) with ONE cp.async.cg of src-size 16 or 0 (0 zero-fills padding and tails).  Needs: x/dy NHWC-like
//   (channel stride 1, other strides and the base 16-byte multiples), CH % VECW == 0, and B given as a dense NG x KR
//   row-major matrix per group in the same k order: forward w in KRSC (w[k][r][s][c]: a channels-last filter as it
//   is), backward data w transposed to (G, Cg, R, S, Kg) -- or, WKRSC 1, a channels-last filter read as it is, B in a
//   [k][n] layout with vectors along c (Cg % VECW == 0).  Residue classes read either form of the whole filter at
//   their sub-kernel's taps (the walk's (r, s) mapped to r0 + r*st_h, s0 + s*st_w).  A row's pixel decode is done once
//   per thread; the tap (r, s) and channel c of the thread's k advance by BK per slice without division.  16-bit data
//   goes through cp.async too (the element loader stages it through registers).
//   DIR 2 under VEC 1 (x and dy NHWC-like, Cg and Kg multiples of VECW): filter rows reordered (r, s, c), c
//   fastest, so that a 16-byte vector is VECW channels of one tap of one pixel k (A) or VECW output channels of
//   one pixel of dy (B); both operands sit in [k][row] layouts.  A thread's row vector (tap, channels) is
//   decoded once, the pixels (n, p, q) of its k rows advance by BK per slice with a carry from q into p and n;
//   the epilogue writes row (r, s, c) to dw[k][c][r][s] -- or, DWKRSC 1, to dw[k][r][s][c] (a channels-last dw).
//
// Tiling: a thread block computes a BM x BN tile of the GEMM output over the reduction in BK slices; THREADS =
//   (BM/WM)*(BN/WN) warps of 32; each warp owns a WM x WN sub-tile made of (WM/16) x (WN/8) fragments of
//   16 x 8, and each thread 4 accumulators of each fragment -- the mma.sync m16n8 accumulator layout:
//   rows (lane/4) and (lane/4)+8, columns 2*(lane%4) and 2*(lane%4)+1.  MATH 1 issues mma.sync (tf32
//   m16n8k8 for float data, f16/bf16 m16n8k16 for half data, fp32 accumulation); MATH 0 computes the SAME
//   accumulators with fp32 FMAs in k order (strict fp32, cuDNN's DEFAULT math).
// Shared memory: STAGES stages of A (BK x BM) and B (BK x BN), filled while another stage is multiplied
//   (VEC 0: cp.async 4-byte copies with zero-fill for float data; register-staged loads for 16-bit data, which
//   cp.async cannot copy one element at a time.  VEC 1: 16-byte cp.async for every type).  Operand layouts:
//   KCONT 0: [k][row] (row stride ROWS+8 elements) filled by threads that each own one row (coalesced along
//            rows: pixels of NCHW);  KCONT 1: [row][k] (stride BK+KPAD: +4, or +VECW under VEC so that rows
//            stay 16-byte aligned) filled by threads that each own one k column (VEC: one 16-byte k vector).
//   Both layouts make the fragment reads conflict-free for 4-byte data; a 16-bit (k, k+1) pair is one 32-bit
//   shared load in the [row][k] layout.
// Epilogue: out = alpha * acc + beta * out (out read only when beta != 0).
// EPI 1 (DIR 0 only; convolution_bias_activation_forward): per output element, in registers,
//   v = alpha * acc + beta * out + alpha2 * z[n,k,p,q] (z != 0) + bias[k] (bias != 0), out = act(v): ACT picks the
//   activation (1 identity, 2 relu, 3 sigmoid, 4 tanh, 5 clipped relu, 6 elu, 7 leaky relu, 8 relu6, 9 hardtanh,
//   10 swish; act_coef its parameter), z read through its own strides (szn..szw).  One pass writing y.  A z that is
//   y itself comes as beta = alpha2 (the existing read of out).  EPI 0 (every other launch): the kernel's
//   parameters and code are those of the plain kernel.  Forward has no split-K, so the epilogue sees whole sums.
// PRO 1 (with EPI 1; scale_bias_activation_convolution_forward): the batch-norm-apply prologue.  The convolution
//   reads x' = pact(x * pscale[c] + pshift[c]) instead of x (PACT 1 identity, 2 relu; pscale/pshift float (C,)).
//   The loaders copy x into shared memory unchanged (cp.async, or the 16-bit element loader's register copy);
//   after a thread's wait for slice t (cp.async.wait_group: its own copies have landed and are visible to it)
//   and BEFORE the barrier that publishes the slice, each thread rewrites the elements IT copied, in place:
//   fma in float, the activation, rounded back to T.  It recomputes each element's channel and bounds from the
//   slice's k (the VEC walk: k -> (r, s, c) by two divisions per slice; the element loader: its decode_tap, whose
//   .w carries the channel under PRO), and skips the zero-filled ones (padding, tails): padding stays a zero of
//   the ACTIVATED tensor, never pact(shift).  No extra barrier, no extra shared memory; B is untouched.
// STATS 1 (with EPI 1): the batch-norm statistics of y AS STORED (rounded to T), per output channel k: ssum[k] =
//   sum over n, p, q of y, ssq[k] = sum of y^2, float, written by the same launch.  Deterministic (no float
//   atomics): each thread adds its valid (row, column) values over its rows in order; lanes with the same
//   column (lane % 4) combine by an xor butterfly over lane / 4 (4, 8, 16); the warp rows of the block combine
//   through shared memory in warp order; the block stores its (sum, sumsq) per column to `partial` at
//   ((grp * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * BN * 2, fences and draws the column tile's
//   ticket (`tickets[grp * gridDim.y + blockIdx.y]`, kept zeroed).  The block drawing the last ticket adds the
//   gridDim.x partials of the column tile in a fixed order (thread t: float4 slot t % (BN/2) -- two columns --
//   of m-tiles t / (BN/2), + 128 / (BN/2), ...; then the 128 / (BN/2) thread sums in thread order), writes
//   ssum / ssq, and resets the ticket.  Same bits whichever block comes last.
// Split-K (DIR 2, splits > 1), in the same launch: every block stores its raw accumulators to `partial` in
//   fragment order (float4 f = acc[i][j][0..3], f = i*NJ + j, of thread tid at ((tile*splits + split)*FRAGS + f)
//   * THREADS + tid: coalesced 16-byte stores and loads), fences, and takes a ticket of its output tile
//   (`tickets[tile]`, an int array kept zeroed).  The block that draws the last ticket re-reads the partials of
//   all splits of the tile IN SPLIT ORDER 0..splits-1 into its accumulators (the same sums whichever block came
//   last: bitwise deterministic, no float atomics), resets the ticket to 0 (reusable, graph-capturable) and
//   runs the ordinary epilogue; the other blocks exit.
// ATOMIC 1 (DIR 2, ALGO_3 for non-deterministic handles): `partial` is instead a float accumulator of one tile per
//   output tile, in the same fragment order ((tile*FRAGS + f) * THREADS + tid), which every launch leaves zeroed.
//   Every split's block adds its accumulators into it with 16-byte reductions (red.global.add.v4.f32, resolved in
//   L2), fences and draws the tile's ticket; the last block reads the sums (L2), writes the zeros back (so the next
//   launch needs no memset), resets the ticket and runs the ordinary epilogue (alpha/beta, conversion to T).
//   The order of the float additions is the order the reductions reach L2: not bitwise repeatable.
// SK2 1 (DIR 2, deterministic; the default since session 7, docs/conv_kernels.md "Session 7"): the split-K sum in
//   TWO levels, still one launch and still a fixed order.  The splits form nch = ceil(splits / SKG) chunks of SKG =
//   ceil(sqrt(splits)) consecutive splits.  Every block stores its partial as above and draws its CHUNK's ticket
//   (tickets[tiles + tile * nch + chunk], tiles = gridDim.x * gridDim.y * groups); the chunk's last block adds the
//   chunk's partials in split order and stores that chunk sum over the chunk's first split's partial (read by no
//   one else), fences and draws the TILE's ticket (tickets[tile]); the tile's last block adds the nch chunk sums in
//   chunk order and runs the epilogue.  Sum = sum_c (sum_{s in chunk c} partial_s): the same bits whichever blocks
//   come last.  The serial tail of one block falls from `splits` partial reads to SKG + nch (512 -> 23 + 23).
//   Only LIVE fragments are stored and read: fragment (i, j) of a warp covers rows m0+wm0+i*16 .. +15 and columns
//   n0+wn0+j*8 .. +7; one whose first row is >= M or first column >= NG holds padding only (a 3-channel 3x3 stem's
//   M = 27 on a 64-row tile: half the partial bytes; a 16-channel 1x1's M = 16: a quarter).
// WOUT32 1 (DIR 2, half data; autocast's weight gradients, docs/amp.md): `out` is float32 and the epilogue stores
//   alpha * acc + beta * out unrounded -- the same sums (plain or split-K, deterministic or atomic) that WOUT32 0
//   rounds to T.  Nothing else changes: the operands, tiles, partials and sum order are T's.
// Index math is 32-bit throughout (the host checks every tensor has < 2^31 elements).
// ============================================================================================================

#ifndef DIR
#define DIR 0
#endif
#ifndef ELEM
#define ELEM 0          // 0 float32, 1 float16, 2 bfloat16
#endif
#ifndef MATH
#define MATH 1          // 0 fp32 FMA, 1 tensor cores (tf32 for float32 data, f16/bf16 for half data)
#endif
#ifndef BM
#define BM 64
#define BN 64
#define BK 16
#define WM 32
#define WN 32
#endif
#ifndef VEC
#define VEC 0           // 1: the NHWC/KRSC 16-byte loader (DIR 0/1; conditions in the opening comment)
#endif
#if VEC && BK * 2 != 64 / (ELEM == 0 ? 2 : 1)
#error "VEC=1 expects BK = 16 for float32, 32 for 16-bit data (4 vectors of 16 bytes per row of a slice)"
#endif
#ifndef DWKRSC
#define DWKRSC 0        // VEC DIR 2: write dw channels-last (KRSC memory: a channels-last weight's gradient slot)
#endif
#if DWKRSC && !(VEC && DIR == 2)
#error "DWKRSC=1 is a VEC=1 backward-filter option"
#endif
#ifndef WKRSC
#define WKRSC 0         // VEC DIR 1: read B straight from a channels-last (KRSC) filter, vectors along c
#endif
#if WKRSC && !(VEC && DIR == 1)
#error "WKRSC=1 is a VEC=1 backward-data option"
#endif
#ifndef EPI
#define EPI 0           // 1: bias / residual / activation epilogue (DIR 0; see the opening comment)
#endif
#ifndef ATOMIC
#define ATOMIC 0        // 1: DIR 2's split-K by fp32 atomics into a kept-zeroed accumulator (non-deterministic)
#endif
#if ATOMIC && DIR != 2
#error "ATOMIC=1 is a backward-filter (DIR 2) option"
#endif
#ifndef WOUT32
#define WOUT32 0        // 1: DIR 2 with half data writes dw in float32 (autocast's weight gradients; see above)
#endif
#if WOUT32 && (DIR != 2 || ELEM == 0)
#error "WOUT32=1 is a half-data backward-filter (DIR 2, ELEM 1/2) option"
#endif
#ifndef SK2
#define SK2 0           // 1: DIR 2's deterministic split-K summed in two levels, live fragments only (see above)
#endif
#if SK2 && (DIR != 2 || ATOMIC)
#error "SK2=1 is a deterministic backward-filter (DIR 2, ATOMIC 0) option"
#endif
#ifndef ACT
#define ACT 1
#endif
#if EPI && DIR != 0
#error "EPI=1 is a forward (DIR 0) option"
#endif
#if EPI
#define EPI_PTRS const T* __restrict__ zsrc, const T* __restrict__ bias,
#define EPI_ARGS , int szn, int szc, int szh, int szw, float alpha2, float act_coef
#else
#define EPI_PTRS
#define EPI_ARGS
#endif
#ifndef PRO
#define PRO 0           // 1: the batch-norm-apply prologue on x (with EPI 1; see the opening comment)
#endif
#ifndef PACT
#define PACT 2          // the prologue's activation: 1 identity, 2 relu
#endif
#ifndef STATS
#define STATS 0         // 1: per-channel sum and sum of squares of y (with EPI 1; see the opening comment)
#endif
#if (PRO || STATS) && !EPI
#error "PRO=1 and STATS=1 are options of the fused forward (EPI=1)"
#endif
#if PRO
#define PRO_PTRS const float* __restrict__ pscale, const float* __restrict__ pshift,
#else
#define PRO_PTRS
#endif
#if STATS
#define STATS_PTRS float* __restrict__ ssum, float* __restrict__ ssq,
#else
#define STATS_PTRS
#endif
#ifndef STAGES
#define STAGES 3        // shared-memory pipeline depth (static shared memory stays under 48 KB for every tile)
#endif
#define WARPS_M (BM / WM)
#define WARPS_N (BN / WN)
#define THREADS (WARPS_M * WARPS_N * 32)
#define MI (WM / 16)
#define NJ (WN / 8)
#define FRAGS (MI * NJ)     // float4 accumulator groups per thread (split-K partial layout)

#if VEC && DIR == 2
#define A_KCONT 0       // VEC filter gradient: both operands [k][row], 16-byte vectors along the rows (channels)
#define B_KCONT 0
#elif WKRSC
#define A_KCONT 1       // A as under VEC; B [k][n]: vectors along the filter's innermost input channels
#define B_KCONT 0
#elif DIR == 2 || VEC
#define A_KCONT 1
#define B_KCONT 1
#else
#define A_KCONT 0
#define B_KCONT 1
#endif

#if ELEM == 0
typedef float T;
#else
typedef unsigned short T;
#endif
#if WOUT32
typedef float OutT;             // the output's element: float32 dw from half data (WOUT32), else T
#else
typedef T OutT;
#endif
#define VECW (16 / (int)sizeof(T))     // elements per 16-byte copy: 4 float32, 8 float16/bfloat16
#if VEC
#define KPAD VECW                      // row pad of the [row][k] layouts: rows stay 16-byte aligned
#else
#define KPAD 4
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

// ---- shared-memory operand layouts ------------------------------------------------------------------------
#if A_KCONT
#define A_LD (BK + KPAD)
#define A_STAGE (BM * A_LD)
#define AS(st, k, r) sA[(st) * A_STAGE + (r) * A_LD + (k)]
#else
#define A_LD (BM + 8)
#define A_STAGE (BK * A_LD)
#define AS(st, k, r) sA[(st) * A_STAGE + (k) * A_LD + (r)]
#endif
#if B_KCONT
#define B_LD (BK + KPAD)
#define B_STAGE (BN * B_LD)
#define BS(st, k, n) sB[(st) * B_STAGE + (n) * B_LD + (k)]
#else
#define B_LD (BN + 8)
#define B_STAGE (BK * B_LD)
#define BS(st, k, n) sB[(st) * B_STAGE + (k) * B_LD + (n)]
#endif

#define A_ELEMS (BM * BK / THREADS)
#define B_ELEMS (BN * BK / THREADS)
#if A_KCONT
#define A_STEP (THREADS / BK)      // rows between a thread's elements
#else
#define A_STEP (THREADS / BM)      // k between a thread's elements
#endif
#define B_STEP (THREADS / BK)
#if VEC && DIR == 2
#define AV (BM / VECW)                 // 16-byte vectors per k row of the A slice (along the filter rows)
#define A_KSTEP (THREADS / AV)         // k rows between a thread's A vectors
#define A_VECS (BK / A_KSTEP)
#elif VEC
#define KV (BK / VECW)                 // 16-byte vectors per row of a slice (4: BK = 16 float32 or 32 half)
#define V_STEP (THREADS / KV)          // rows between a thread's vectors
#define A_VECS (BM / V_STEP)
#endif
#if VEC && !B_KCONT
#define BV (BN / VECW)                 // 16-byte vectors per k row of the B slice (along its columns n)
#define B_KSTEP (THREADS / BV)         // k rows between a thread's B vectors
#define B_VECS ((BK + B_KSTEP - 1) / B_KSTEP)
#elif VEC
#define B_VECS ((BN + V_STEP - 1) / V_STEP)
#endif

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global -> shared (L2 only), src-size 0 writes zeros (padding, tails): the VEC loader's one copy.
#define PUT16(dst, src_ptr, ok) \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" \
                 :: "r"(smem_addr(&(dst))), "l"(src_ptr), "r"((ok) ? 16 : 0))
#if ELEM == 0 || VEC
// One element global -> shared without a register round trip; src-size 0 writes a zero (padding, tails).
#define PUT(dst, src_ptr, ok) \
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" \
                 :: "r"(smem_addr(&(dst))), "l"(src_ptr), "r"((ok) ? 4 : 0))
#define COMMIT() asm volatile("cp.async.commit_group;")
#define WAIT_PENDING() asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2))   // slice t has landed
#else
#define PUT(dst, src_ptr, ok) { (dst) = (ok) ? *(src_ptr) : (T)0; }
#define COMMIT()
#define WAIT_PENDING()
#endif

// The tap decode of DIR 0/1's reduction index (DIR 2's row index): .x = channel offset (x or dy strides),
// .y = r*dil_h, .z = s*dil_w, .w = w offset of the tap (DIR 1: kk*Cg*RS + r*S + s).
struct Geo {
    int N, C, H, W, K, P, Q, R, S, pad_h, pad_w, st_h, st_w, dil_h, dil_w, Cg, Kg;
    int sxn, sxc, sxh, sxw, syn, syc, syh, syw;
    int wrs, wt0, wjr, wjs;     // DIR 1: the filter's R*S, and its tap of (sub-)tap (r, s): wt0 + r*wjr + s*wjs
};

__device__ __forceinline__ int4 decode_tap(int k, const Geo& g, const int4* __restrict__ table) {
    if (table) return table[k];
    const int RS = g.R * g.S;
    const int ch = k / RS, rs = k - ch * RS, r = rs / g.S, s = rs - r * g.S;
    int4 t;
    t.y = r * g.dil_h; t.z = s * g.dil_w;
#if DIR == 1
    t.x = ch * g.syc; t.w = ch * g.Cg * g.wrs + g.wt0 + r * g.wjr + s * g.wjs;
#elif PRO
    t.x = ch * g.sxc + t.y * g.sxh + t.z * g.sxw; t.w = ch;      // the prologue reads the channel
#else
    t.x = ch * g.sxc + t.y * g.sxh + t.z * g.sxw; t.w = 0;
#endif
    return t;
}

__device__ __forceinline__ unsigned tf32_bits(float v) {
    unsigned u; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(v)); return u;
}
__device__ __forceinline__ unsigned pack2(unsigned short lo, unsigned short hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}
// The 16-bit pair (k, k+1) of a row as one mma operand register: one 32-bit load in the [row][k] layouts (k even,
// even row strides: 4-byte aligned), two loads in the [k][row] layout.
#if A_KCONT
#define A2(st, k, r) (*reinterpret_cast<const unsigned*>(&AS(st, k, r)))
#else
#define A2(st, k, r) pack2(AS(st, k, r), AS(st, (k) + 1, r))
#endif
#if B_KCONT
#define B2(st, k, n) (*reinterpret_cast<const unsigned*>(&BS(st, k, n)))
#else
#define B2(st, k, n) pack2(BS(st, k, n), BS(st, (k) + 1, n))
#endif

#if EPI
// The fused epilogue's activation (the formulas of act_kernels.py, in float; NaN passes through as there).
__device__ __forceinline__ float epi_sigm(float v) { return 0.5f * (1.f + tanhf(0.5f * v)); }
__device__ __forceinline__ float epi_act(float v, float c) {
#if ACT == 1
    (void)c; return v;
#elif ACT == 2
    (void)c; return v > 0.f ? v : (v != v ? v : 0.f);
#elif ACT == 3
    (void)c; return epi_sigm(v);
#elif ACT == 4
    (void)c; return tanhf(v);
#elif ACT == 5
    return v != v ? v : fminf(fmaxf(v, 0.f), c);
#elif ACT == 6
    return v > 0.f ? v : c * expm1f(v);
#elif ACT == 7
    return v > 0.f ? v : c * v;
#elif ACT == 8
    (void)c; return v != v ? v : fminf(fmaxf(v, 0.f), 6.f);
#elif ACT == 9
    return v != v ? v : fminf(fmaxf(v, -c), c);
#elif ACT == 10
    return v * epi_sigm(c * v);
#else
#error "unknown ACT"
#endif
}
#endif

#if PRO
// The prologue's activation (PACT): identity or relu (NaN passes through, as activation_forward).
__device__ __forceinline__ float pro_act(float v) {
#if PACT == 1
    return v;
#elif PACT == 2
    return v > 0.f ? v : (v != v ? v : 0.f);
#else
#error "unknown PACT"
#endif
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
conv_igemm(const T* __restrict__ a_src, const T* __restrict__ b_src, OutT* __restrict__ out,
           float* __restrict__ partial, const int4* __restrict__ table, unsigned int* __restrict__ tickets,
           EPI_PTRS PRO_PTRS STATS_PTRS
           int N, int C, int H, int W, int K, int P, int Q, int R, int S,
           int pad_h, int pad_w, int st_h, int st_w, int dil_h, int dil_w, int Cg, int Kg,
           int sxn, int sxc, int sxh, int sxw, int syn, int syc, int syh, int syw,
           int splits, int k_per_split, float alpha, float beta EPI_ARGS)
{
    const int grp = blockIdx.z / splits, split = blockIdx.z - grp * splits;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
#if DIR == 1
    // Residue classes (splits = st_h * st_w > 1: a strided, undilated backward data in ONE launch).  Class
    // split = a * st_w + b owns the dx pixels h = a + i*st_h, w = b + j*st_w.  Such a row h gathers dy row
    // (h + pad_h - r) / st_h only from the taps r = r0 + jr*st_h, r0 = (a + pad_h) mod st_h, and that row is
    // i + off_h - jr with off_h = (a + pad_h - r0) / st_h: a stride-1 problem with input rows i < ceil((H-a)/st_h),
    // ceil((R-r0)/st_h) taps and padding off_h (columns alike).  The block rewrites its geometry to that
    // sub-problem; its sub-tap (jr, js) reads the ORIGINAL filter at tap wt0 + jr*wjr + js*wjs (wt0 = r0*S + s0,
    // wjr = st_h*S, wjs = st_w), and it writes dx through strides st_h*sxh, st_w*sxw from pixel (a, b).  A class
    // without a tap (kernel smaller than the stride) has KR = 0: its pixels get alpha*0 + beta*dx.  Blocks past
    // their class's rows (classes differ by at most one row/column) exit at once.  The PRECOMP table holds each
    // class's taps at class * Kg * ceil(R/st_h) * ceil(S/st_w).
    const int wrs = R * S;
    int wt0 = 0, wjr = S, wjs = 1;
    bool has_taps = true;
    if (splits > 1) {
        const int a = split / st_w, b = split - a * st_w;
        const int r0 = (a + pad_h) % st_h, s0 = (b + pad_w) % st_w;
        const int tr = R > r0 ? (R - r0 + st_h - 1) / st_h : 0, ts = S > s0 ? (S - s0 + st_w - 1) / st_w : 0;
        if (table) table += split * Kg * (((R + st_h - 1) / st_h) * ((S + st_w - 1) / st_w));
        wt0 = r0 * S + s0; wjr = st_h * S; wjs = st_w;
        pad_h = (a + pad_h - r0) / st_h; pad_w = (b + pad_w - s0) / st_w;
        out += a * sxh + b * sxw;
        H = H > a ? (H - a + st_h - 1) / st_h : 0; W = W > b ? (W - b + st_w - 1) / st_w : 0;
        sxh *= st_h; sxw *= st_w;
        has_taps = tr > 0 && ts > 0;
        R = has_taps ? tr : 1; S = has_taps ? ts : 1;       // (1: the walks' divisors stay non-zero)
        st_h = st_w = 1;
    }
#endif
    const Geo g = {N, C, H, W, K, P, Q, R, S, pad_h, pad_w, st_h, st_w, dil_h, dil_w, Cg, Kg,
                   sxn, sxc, sxh, sxw, syn, syc, syh, syw,
#if DIR == 1
                   wrs, wt0, wjr, wjs};
#else
                   R * S, 0, S, 1};
#endif
    const int RS = R * S;
#if DIR == 0
    const int M = N * P * Q, NG = Kg, KR = Cg * RS;
#elif DIR == 1
    const int M = N * H * W, NG = Cg, KR = has_taps ? Kg * RS : 0;
    if (m0 >= M) return;
#else
    const int M = Cg * RS, NG = Kg, KR = N * P * Q;
#endif
#if DIR == 2
    const int k_begin = split * k_per_split;
    const int k_end = min(KR, k_begin + k_per_split);
#else
    const int k_begin = 0, k_end = KR;
    (void)k_per_split; (void)split;
#endif
    const int tid = threadIdx.x;

    __shared__ __align__(16) T sA[STAGES * A_STAGE];
    __shared__ __align__(16) T sB[STAGES * B_STAGE];

    // ---- per-thread state that does not change with the k slice -------------------------------------
#if !VEC
#if A_KCONT
    const int a_k = tid % BK, a_r0 = tid / BK;
#else
    const int a_r = tid % BM, a_k0 = tid / BM;
#endif
    const int b_k = tid % BK, b_n0 = tid / BK;
#else
    (void)g;
#endif

#if VEC && DIR == 2
    // NHWC x and dy.  Filter rows ordered m = (r*S + s)*Cg + c, c fastest (dw written back to (K, Cg, R, S) in the
    // epilogue); k = pixel (n, p, q), q fastest, over this split's range.  A vector = VECW consecutive rows (the
    // channels c..c+VECW-1 of one tap) of one k: x[n, p*st - pad + r*dil, q*st - pad + s*dil, g*Cg + c ...]; a B
    // vector = VECW output channels of one pixel of dy.  A thread's row vector (its tap and channels) is fixed and
    // decoded once; the pixels of its k rows advance by BK per slice, carried from q into p and n (no division).
    const int a_rv = tid % AV, a_kk0 = tid / AV, b_cv = tid % BV, b_kk0 = tid / BV;
    const int row0 = m0 + a_rv * VECW, col0 = n0 + b_cv * VECW;
    const bool a_row_ok = row0 < M, b_col_ok = col0 < NG;
    int a_dh, a_dw;
    const int a_ch = grp * Cg + (row0 % Cg), b_ch = grp * Kg + col0;
    {
        const int rs = row0 / Cg, r = rs / S;
        a_dh = r * dil_h - pad_h; a_dw = (rs - r * S) * dil_w - pad_w;
    }
    int a_n[A_VECS], a_p[A_VECS], a_q[A_VECS], b_n[B_VECS], b_p[B_VECS], b_q[B_VECS];
    {
        const int PQ = P * Q;
        #pragma unroll
        for (int i = 0; i < A_VECS; ++i) {
            const int k = k_begin + a_kk0 + i * A_KSTEP, n = k / PQ, pq = k - n * PQ;
            a_n[i] = n; a_p[i] = pq / Q; a_q[i] = pq - a_p[i] * Q;
        }
        #pragma unroll
        for (int i = 0; i < B_VECS; ++i) {
            const int k = k_begin + b_kk0 + i * B_KSTEP, n = k / PQ, pq = k - n * PQ;
            b_n[i] = n; b_p[i] = pq / Q; b_q[i] = pq - b_p[i] * Q;
        }
    }
#elif VEC
    // NHWC activations, KRSC-ordered B: reduction index k = (r*S + s)*CH + c, c fastest (CH = Cg for DIR 0, Kg for
    // DIR 1).  Thread tid copies the 16-byte vector kq = (tid % KV)*VECW of every slice, for rows (pixels of A;
    // columns n of B) tid/KV + i*V_STEP.  Per A row, decoded once: v_base = offset of the pixel's reference point
    // (+ the group's channels), v_h / v_w = its coordinate the tap moves (DIR 0: h0 = p*st - pad, tap adds
    // r*dil; DIR 1: h + pad, tap subtracts r*dil and the result indexes dy's rows, stride 1).  A row past M gets
    // v_h = -2^30 (every tap fails the bounds test).  The tap (r, s) and channel c of this thread's k advance by
    // BK per slice without division (load_tile runs once per slice, in order).
    const int v_kq = (tid % KV) * VECW, v_r0 = tid / KV;
    int v_base[A_VECS], v_h[A_VECS], v_w[A_VECS];
    #pragma unroll
    for (int i = 0; i < A_VECS; ++i) {
        const int am = m0 + v_r0 + i * V_STEP;
#if DIR == 0
        const int PQ = P * Q, n = am / PQ, pq = am - n * PQ, p = pq / Q, q = pq - p * Q;
        v_h[i] = p * st_h - pad_h; v_w[i] = q * st_w - pad_w;
        v_base[i] = n * sxn + grp * Cg + v_h[i] * sxh + v_w[i] * sxw;
#else
        const int HW = H * W, n = am / HW, hw = am - n * HW, h = hw / W, w = hw - h * W;
        v_h[i] = h + pad_h; v_w[i] = w + pad_w;
        v_base[i] = n * syn + grp * Kg + v_h[i] * syh + v_w[i] * syw;
#endif
        if (am >= M) { v_h[i] = -(1 << 30); v_base[i] = 0; }
    }
#if DIR == 0
    const int CH = Cg, LIM_H = H, LIM_W = W, T_SH = sxh, T_SW = sxw;
#else
    const int CH = Kg, LIM_H = P, LIM_W = Q, T_SH = -syh, T_SW = -syw;
#endif
    int t_c, t_r, t_s;                      // channel and tap of k = k0 + v_kq in the next slice load_tile fills
    {
        const int k = k_begin + v_kq, rs = k / CH;
        t_c = k - rs * CH; t_r = rs / S; t_s = rs - t_r * S;
    }
#if DIR == 1 && !WKRSC
    // B's place of that k in the whole filter's (Cg, R, S, Kg) row, carried beside (t_c, t_s, t_r): a residue
    // class's sub-tap steps move it by the filter's tap strides (0 extra for stride 1: t_w == k)
    int t_w = (wt0 + t_r * wjr + t_s * wjs) * Kg + t_c;
    const int t_ds = (wjs - 1) * Kg, t_dr = (wjr - S * wjs) * Kg;
#endif
#if WKRSC
    // B straight from the KRSC filter: element (k = rs*Kg + kc, n = c) at w[g*Kg + kc][rs][c]; a vector = VECW input
    // channels.  Each of the thread's B k rows keeps its (kc, rs), advanced by BK per slice with a carry.
    const int b_cv = tid % BV, b_kk0 = tid / BV, col0 = n0 + b_cv * VECW;
    const bool b_col_ok = col0 < NG;
    // b_rs = the ORIGINAL filter tap of the k row's sub-tap (jr, b_js): residue classes step it by wjs / wjr.
    const int w_row = wrs * Cg;                                // elements per output channel of the filter
    int b_kc[B_VECS], b_rs[B_VECS], b_js[B_VECS];
    #pragma unroll
    for (int i = 0; i < B_VECS; ++i) {
        const int k = k_begin + b_kk0 + i * B_KSTEP, rs = k / Kg, jr = rs / S;
        b_kc[i] = k - rs * Kg; b_js[i] = rs - jr * S; b_rs[i] = wt0 + jr * wjr + b_js[i] * wjs;
    }
#elif DIR == 1
    const T* b_grp = b_src + (long long)grp * NG * Kg * wrs; // B: (G, Cg, R, S, Kg) of the whole filter
#else
    const T* b_grp = b_src + (long long)grp * NG * KR;       // B: a dense NG x KR matrix per group
#endif
#elif DIR == 0
    // A row = output pixel (n, p, q): the top-left input position its window starts at.
    const int am = m0 + a_r;
    const bool a_row_ok = am < M;
    int a_base = 0, a_h0 = 0, a_w0 = 0;
    {
        const int PQ = P * Q, n = am / PQ, pq = am - n * PQ, p = pq / Q, q = pq - p * Q;
        a_h0 = p * st_h - pad_h; a_w0 = q * st_w - pad_w;
        a_base = n * sxn + grp * Cg * sxc + a_h0 * sxh + a_w0 * sxw;
    }
    const T* b_grp = b_src + (long long)grp * Kg * KR;
#elif DIR == 1
    // A row = input pixel (n, h, w) whose gradient this row accumulates.
    const int am = m0 + a_r;
    const bool a_row_ok = am < M;
    int a_base = 0, a_hp = 0, a_wp = 0;
    {
        const int HW = H * W, n = am / HW, hw = am - n * HW, h = hw / W, w = hw - h * W;
        a_hp = h + pad_h; a_wp = w + pad_w;
        a_base = n * syn + grp * Kg * syc;
    }
    const T* b_grp = b_src + (long long)grp * Kg * Cg * wrs;
#else
    const T* a_grp = a_src + grp * Cg * sxc;
    const T* b_grp = b_src + grp * Kg * syc;
#endif

    auto load_tile = [&](int stage, int k0) {
#if VEC && DIR == 2
        #pragma unroll
        for (int i = 0; i < A_VECS; ++i) {
            const int kk = a_kk0 + i * A_KSTEP;
            const int h = a_p[i] * st_h + a_dh, w = a_q[i] * st_w + a_dw;
            const bool ok = a_row_ok && k0 + kk < k_end && (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W;
            PUT16(AS(stage, kk, a_rv * VECW), a_src + (ok ? a_n[i] * sxn + h * sxh + w * sxw + a_ch : 0), ok);
            a_q[i] += BK;                   // this k row's pixel in the next slice
            while (a_q[i] >= Q) { a_q[i] -= Q; if (++a_p[i] == P) { a_p[i] = 0; ++a_n[i]; } }
        }
        #pragma unroll
        for (int i = 0; i < B_VECS; ++i) {
            const int kk = b_kk0 + i * B_KSTEP;
            if (B_KSTEP * B_VECS != BK && kk >= BK) break;        // narrow tiles: fewer vectors than threads
            const bool ok = b_col_ok && k0 + kk < k_end;
            PUT16(BS(stage, kk, b_cv * VECW),
                  b_src + (ok ? b_n[i] * syn + b_p[i] * syh + b_q[i] * syw + b_ch : 0), ok);
            b_q[i] += BK;
            while (b_q[i] >= Q) { b_q[i] -= Q; if (++b_p[i] == P) { b_p[i] = 0; ++b_n[i]; } }
        }
#elif VEC
        const int k = k0 + v_kq;
        const bool k_ok = k < k_end;
        const int rh = t_r * dil_h, sw = t_s * dil_w;
        const int t_off = rh * T_SH + sw * T_SW + t_c;
        #pragma unroll
        for (int i = 0; i < A_VECS; ++i) {
#if DIR == 0
            const int hh = v_h[i] + rh, ww = v_w[i] + sw;
#else
            const int hh = v_h[i] - rh, ww = v_w[i] - sw;
#endif
            const bool ok = k_ok && (unsigned)hh < (unsigned)LIM_H && (unsigned)ww < (unsigned)LIM_W;
            PUT16(AS(stage, v_kq, v_r0 + i * V_STEP), a_src + (ok ? v_base[i] + t_off : 0), ok);
        }
#if WKRSC
        #pragma unroll
        for (int i = 0; i < B_VECS; ++i) {
            const int kk = b_kk0 + i * B_KSTEP;
            if (B_KSTEP * B_VECS != BK && kk >= BK) break;        // narrow tiles: fewer vectors than threads
            const bool ok = b_col_ok && k0 + kk < k_end;
            PUT16(BS(stage, kk, b_cv * VECW), b_src + (ok ? (grp * Kg + b_kc[i]) * w_row + b_rs[i] * Cg + col0 : 0),
                  ok);
            b_kc[i] += BK;
            while (b_kc[i] >= Kg) {
                b_kc[i] -= Kg; b_rs[i] += wjs;
                if (++b_js[i] == S) { b_js[i] = 0; b_rs[i] += wjr - S * wjs; }
            }
        }
#else
#if DIR == 1
        const int wk = t_w, b_ld = Kg * wrs;    // k's place in the whole filter
#else
        const int wk = k, b_ld = KR;
#endif
        #pragma unroll
        for (int i = 0; i < B_VECS; ++i) {
            const int nn = v_r0 + i * V_STEP, col = n0 + nn;
            if (BN % V_STEP != 0 && nn >= BN) break;
            const bool ok = k_ok && col < NG;
            PUT16(BS(stage, v_kq, nn), b_grp + (ok ? col * b_ld + wk : 0), ok);
        }
#endif
        t_c += BK;                          // the next slice: k += BK, carried into (s, r)
#if DIR == 1 && !WKRSC
        t_w += BK;
        while (t_c >= CH) {
            t_c -= CH; t_w += t_ds;
            if (++t_s == S) { t_s = 0; ++t_r; t_w += t_dr; }
        }
#else
        while (t_c >= CH) { t_c -= CH; if (++t_s == S) { t_s = 0; ++t_r; } }
#endif
#elif DIR == 2
        // This thread's k column is one pixel (n, p, q) for both operands: decode it once.
        const int k = k0 + a_k;             // a_k == b_k
        const bool k_ok = k < k_end;
        int n = 0, p = 0, q = 0;
        if (k_ok) { const int PQ = P * Q; n = k / PQ; const int pq = k - n * PQ; p = pq / Q; q = pq - p * Q; }
        const int h0 = p * st_h - pad_h, w0 = q * st_w - pad_w;
        const int x_pix = n * sxn + h0 * sxh + w0 * sxw;
        const int dy_pix = n * syn + p * syh + q * syw;
        #pragma unroll
        for (int i = 0; i < A_ELEMS; ++i) {             // A: rows = filter taps (c, r, s)
            const int r = a_r0 + i * A_STEP, row = m0 + r;
            bool ok = k_ok && row < M;
            int off = 0;
            if (ok) {
                const int4 t = decode_tap(row, g, table);
                const int h = h0 + t.y, w = w0 + t.z;
                ok = (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W;
                off = x_pix + t.x;
            }
            PUT(AS(stage, a_k, r), a_grp + (ok ? off : 0), ok);
        }
        #pragma unroll
        for (int i = 0; i < B_ELEMS; ++i) {             // B: rows = output channels of the group
            const int nn = b_n0 + i * B_STEP, col = n0 + nn;
            const bool ok = k_ok && col < NG;
            PUT(BS(stage, b_k, nn), b_grp + (ok ? dy_pix + col * syc : 0), ok);
        }
#else
        #pragma unroll
        for (int i = 0; i < A_ELEMS; ++i) {             // A: this thread's row, k = a_k0 + i*A_STEP
            const int kk = a_k0 + i * A_STEP, k = k0 + kk;
            bool ok = a_row_ok && k < k_end;
            int off = 0;
            if (ok) {
                const int4 t = decode_tap(k, g, table);
#if DIR == 0
                const int h = a_h0 + t.y, w = a_w0 + t.z;
                ok = (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W;
                off = a_base + t.x;
#else
                int hp = a_hp - t.y, wp = a_wp - t.z;
                ok = hp >= 0 && wp >= 0;
                if (st_h > 1) { const int p_ = hp / st_h; ok = ok && p_ * st_h == hp; hp = p_; }
                if (st_w > 1) { const int q_ = wp / st_w; ok = ok && q_ * st_w == wp; wp = q_; }
                ok = ok && hp < P && wp < Q;
                off = a_base + t.x + hp * syh + wp * syw;
#endif
            }
            PUT(AS(stage, kk, a_r), a_src + (ok ? off : 0), ok);
        }
        {
            const int k = k0 + b_k;
            const bool k_ok = k < k_end;
#if DIR == 0
            const int wk = k;
#else
            const int wk = k_ok ? decode_tap(k, g, table).w : 0;
#endif
            #pragma unroll
            for (int i = 0; i < B_ELEMS; ++i) {
                const int nn = b_n0 + i * B_STEP, col = n0 + nn;
                const bool ok = k_ok && col < NG;
#if DIR == 0
                const int off = col * KR + wk;                 // w[g*Kg + col][k]
#else
                const int off = wk + col * wrs;                // w[g*Kg + kk][col][r][s]
#endif
                PUT(BS(stage, b_k, nn), b_grp + (ok ? off : 0), ok);
            }
        }
#endif
    };

#if PRO
    // The batch-norm-apply prologue (opening comment): after its wait for slice k0's copies and before the barrier,
    // each thread rewrites the A elements it copied into `stage` as pact(x * pscale[c] + pshift[c]), in place;
    // the zero-filled ones (padding, tails) stay zero.
    auto prologue = [&](int stage, int k0) {
#if VEC
        const int k = k0 + v_kq;
        if (k >= k_end) return;
        const int rs = k / CH, c = k - rs * CH, r = rs / S, s_ = rs - r * S;
        const int rh = r * dil_h, sw = s_ * dil_w, ch = grp * Cg + c;
        float sc[VECW], sh[VECW];
        #pragma unroll
        for (int e = 0; e < VECW; ++e) { sc[e] = __ldg(pscale + ch + e); sh[e] = __ldg(pshift + ch + e); }
        #pragma unroll
        for (int i = 0; i < A_VECS; ++i) {
            const int hh = v_h[i] + rh, ww = v_w[i] + sw;
            if ((unsigned)hh >= (unsigned)H || (unsigned)ww >= (unsigned)W) continue;
            union { uint4 u; T e[VECW]; } pk;
            uint4* cell = reinterpret_cast<uint4*>(&AS(stage, v_kq, v_r0 + i * V_STEP));
            pk.u = *cell;
            #pragma unroll
            for (int e = 0; e < VECW; ++e) from_f(&pk.e[e], pro_act(fmaf(to_f(pk.e[e]), sc[e], sh[e])));
            *cell = pk.u;
        }
#else
        #pragma unroll
        for (int i = 0; i < A_ELEMS; ++i) {             // the loader's elements: row a_r, k = a_k0 + i*A_STEP
            const int kk = a_k0 + i * A_STEP, k = k0 + kk;
            if (!a_row_ok || k >= k_end) continue;
            const int4 t = decode_tap(k, g, table);     // .w: the channel in the group
            const int h = a_h0 + t.y, w = a_w0 + t.z;
            if ((unsigned)h >= (unsigned)H || (unsigned)w >= (unsigned)W) continue;
            T* v = &AS(stage, kk, a_r);
            const int ch = grp * Cg + t.w;
            from_f(v, pro_act(fmaf(to_f(*v), __ldg(pscale + ch), __ldg(pshift + ch))));
        }
#endif
    };
#endif

    float acc[MI][NJ][4];
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NJ; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    const int warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
    const int wm0 = (warp % WARPS_M) * WM, wn0 = (warp / WARPS_M) * WN;

    // STAGES-deep pipeline: tiles t+1 .. t+STAGES-1 are in flight while tile t is multiplied.  The one barrier
    // per slice both publishes tile t and tells every thread that the stage read in slice t-1 may be refilled.
    const int tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) load_tile(s, k_begin + s * BK);
        COMMIT();
    }
    for (int t = 0; t < tiles; ++t) {
        const int st = t % STAGES;
        WAIT_PENDING();
#if PRO
        prologue(st, k_begin + t * BK);     // this thread's own copies of slice t, before the barrier publishes it
#endif
        __syncthreads();
        {
            const int nt = t + STAGES - 1;
            if (nt < tiles) load_tile(nt % STAGES, k_begin + nt * BK);
            COMMIT();
        }
#if MATH == 0
        #pragma unroll 4
        for (int kk = 0; kk < BK; ++kk) {
            float a_lo[MI], a_hi[MI], b0[NJ], b1[NJ];
            #pragma unroll
            for (int i = 0; i < MI; ++i) {
                a_lo[i] = to_f(AS(st, kk, wm0 + i * 16 + gq));
                a_hi[i] = to_f(AS(st, kk, wm0 + i * 16 + gq + 8));
            }
            #pragma unroll
            for (int j = 0; j < NJ; ++j) {
                b0[j] = to_f(BS(st, kk, wn0 + j * 8 + 2 * tq));
                b1[j] = to_f(BS(st, kk, wn0 + j * 8 + 2 * tq + 1));
            }
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NJ; ++j) {
                    acc[i][j][0] = fmaf(a_lo[i], b0[j], acc[i][j][0]);
                    acc[i][j][1] = fmaf(a_lo[i], b1[j], acc[i][j][1]);
                    acc[i][j][2] = fmaf(a_hi[i], b0[j], acc[i][j][2]);
                    acc[i][j][3] = fmaf(a_hi[i], b1[j], acc[i][j][3]);
                }
        }
#elif ELEM == 0
        #pragma unroll
        for (int ks = 0; ks < BK; ks += 8) {
            unsigned af[MI][4], bf[NJ][2];
            #pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int r = wm0 + i * 16 + gq;
                af[i][0] = tf32_bits(AS(st, ks + tq, r));
                af[i][1] = tf32_bits(AS(st, ks + tq, r + 8));
                af[i][2] = tf32_bits(AS(st, ks + tq + 4, r));
                af[i][3] = tf32_bits(AS(st, ks + tq + 4, r + 8));
            }
            #pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int n = wn0 + j * 8 + gq;
                bf[j][0] = tf32_bits(BS(st, ks + tq, n));
                bf[j][1] = tf32_bits(BS(st, ks + tq + 4, n));
            }
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NJ; ++j)
                    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                                 : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                                 : "r"(af[i][0]), "r"(af[i][1]), "r"(af[i][2]), "r"(af[i][3]),
                                   "r"(bf[j][0]), "r"(bf[j][1]));
        }
#else
        #pragma unroll
        for (int ks = 0; ks < BK; ks += 16) {
            unsigned af[MI][4], bf[NJ][2];
            const int k0 = ks + 2 * tq;
            #pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int r = wm0 + i * 16 + gq;
                af[i][0] = A2(st, k0, r);
                af[i][1] = A2(st, k0, r + 8);
                af[i][2] = A2(st, k0 + 8, r);
                af[i][3] = A2(st, k0 + 8, r + 8);
            }
            #pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int n = wn0 + j * 8 + gq;
                bf[j][0] = B2(st, k0, n);
                bf[j][1] = B2(st, k0 + 8, n);
            }
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NJ; ++j)
                    asm volatile(
#if ELEM == 2
                                 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
                                 "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
                                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                                 : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                                 : "r"(af[i][0]), "r"(af[i][1]), "r"(af[i][2]), "r"(af[i][3]),
                                   "r"(bf[j][0]), "r"(bf[j][1]));
        }
#endif
    }

#if DIR == 2
    // ---- split-K: the last block of an output tile adds every split's partials, in split order ---------
    if (splits > 1) {
        const int tile = (grp * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
#if SK2
        float4* tile_part = reinterpret_cast<float4*>(partial) + (long long)tile * splits * FRAGS * THREADS + tid;
        bool live[MI][NJ];                 // warp-uniform: the fragment holds at least one real (row, column)
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int j = 0; j < NJ; ++j) live[i][j] = m0 + wm0 + i * 16 < M && n0 + wn0 + j * 8 < NG;
        constexpr int sk_unroll = FRAGS >= 16 ? 1 : 16 / FRAGS;   // ~16 float4 loads in flight a thread
        int skg = 1;                       // chunk size ceil(sqrt(splits)) (the host's splitk2_chunks)
        while (skg * skg < splits) ++skg;
        const int nch = (splits + skg - 1) / skg, chunk = split / skg, c0 = chunk * skg;
        const int c1 = min(splits, c0 + skg);
        {
            float4* mine = tile_part + (long long)split * FRAGS * THREADS;
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NJ; ++j)
                    if (live[i][j])
                        mine[(i * NJ + j) * THREADS] = make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2],
                                                                   acc[i][j][3]);
        }
        __shared__ int s_last;
        const unsigned ntiles = gridDim.x * gridDim.y * (gridDim.z / splits);
        __threadfence();                   // each thread's partial stores are visible device-wide ...
        __syncthreads();                   // ... before thread 0 takes the chunk's ticket for the whole block
        if (tid == 0) s_last = atomicAdd(tickets + ntiles + tile * nch + chunk, 1u) == (unsigned)(c1 - c0 - 1);
        __syncthreads();
        if (!s_last) return;
        __threadfence();                   // the chunk's other stores, published before their tickets
        // level 1: this chunk's partials in split order (the last block of the chunk, whichever it is)
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int j = 0; j < NJ; ++j)
                #pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
        #pragma unroll sk_unroll
        for (int sp = c0; sp < c1; ++sp) {
            const float4* src = tile_part + (long long)sp * FRAGS * THREADS;
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NJ; ++j)
                    if (live[i][j]) {
                        const float4 v = __ldcg(src + (i * NJ + j) * THREADS);     // L2: never a stale L1 line
                        acc[i][j][0] += v.x; acc[i][j][1] += v.y; acc[i][j][2] += v.z; acc[i][j][3] += v.w;
                    }
        }
        if (tid == 0) tickets[ntiles + tile * nch + chunk] = 0u;    // the chunk's counter is free again
        if (nch > 1) {
            // level 2: the chunk sum over the chunk's first partial (only this block read that slot), then the
            // tile's last chunk adds the nch chunk sums in chunk order
            float4* csum = tile_part + (long long)c0 * FRAGS * THREADS;
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NJ; ++j)
                    if (live[i][j])
                        __stcg(csum + (i * NJ + j) * THREADS, make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2],
                                                                          acc[i][j][3]));
            __threadfence();
            __syncthreads();
            if (tid == 0) s_last = atomicAdd(tickets + tile, 1u) == (unsigned)(nch - 1);
            __syncthreads();
            if (!s_last) return;
            __threadfence();               // the other chunks' sums, published before their tickets
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NJ; ++j)
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
            #pragma unroll sk_unroll
            for (int c = 0; c < nch; ++c) {
                const float4* src = tile_part + (long long)c * skg * FRAGS * THREADS;
                #pragma unroll
                for (int i = 0; i < MI; ++i)
                    #pragma unroll
                    for (int j = 0; j < NJ; ++j)
                        if (live[i][j]) {
                            const float4 v = __ldcg(src + (i * NJ + j) * THREADS);
                            acc[i][j][0] += v.x; acc[i][j][1] += v.y; acc[i][j][2] += v.z; acc[i][j][3] += v.w;
                        }
            }
            if (tid == 0) tickets[tile] = 0u;
        }
#else
#if ATOMIC
        float4* tile_acc = reinterpret_cast<float4*>(partial) + (long long)tile * FRAGS * THREADS + tid;
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int j = 0; j < NJ; ++j)
                asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                             :: "l"(tile_acc + (i * NJ + j) * THREADS), "f"(acc[i][j][0]), "f"(acc[i][j][1]),
                                "f"(acc[i][j][2]), "f"(acc[i][j][3]) : "memory");
#else
        float4* tile_part = reinterpret_cast<float4*>(partial) + (long long)tile * splits * FRAGS * THREADS + tid;
        {
            float4* mine = tile_part + (long long)split * FRAGS * THREADS;
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NJ; ++j)
                    mine[(i * NJ + j) * THREADS] = make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2],
                                                               acc[i][j][3]);
        }
#endif
        __shared__ int s_last;
        __threadfence();                   // each thread's partial stores are visible device-wide ...
        __syncthreads();                   // ... before thread 0 takes the tile's ticket for the whole block
        if (tid == 0) s_last = atomicAdd(tickets + tile, 1u) == (unsigned)(splits - 1);
        __syncthreads();
        if (!s_last) return;
        __threadfence();                   // the other splits' stores, published before their tickets
#if ATOMIC
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int j = 0; j < NJ; ++j) {
                float4* cell = tile_acc + (i * NJ + j) * THREADS;
                const float4 v = __ldcg(cell);                  // every split's sum (reductions live in L2)
                acc[i][j][0] = v.x; acc[i][j][1] = v.y; acc[i][j][2] = v.z; acc[i][j][3] = v.w;
                __stcg(cell, make_float4(0.f, 0.f, 0.f, 0.f));  // zeroed again for the next launch
            }
#else
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int j = 0; j < NJ; ++j)
                #pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
        #pragma unroll 2
        for (int sp = 0; sp < splits; ++sp) {
            const float4* src = tile_part + (long long)sp * FRAGS * THREADS;
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NJ; ++j) {
                    const float4 v = __ldcg(src + (i * NJ + j) * THREADS);     // L2: never a stale L1 line
                    acc[i][j][0] += v.x; acc[i][j][1] += v.y; acc[i][j][2] += v.z; acc[i][j][3] += v.w;
                }
        }
#endif
        if (tid == 0) tickets[tile] = 0u;  // every split has drawn: the counter is free for the next launch
#endif
    }
#endif

    // ---- epilogue: each thread's accumulators to their output elements --------------------------------
#if EPI
    float bias_col[NJ][2];              // this thread's 2*NJ output channels' bias, read once
    #pragma unroll
    for (int j = 0; j < NJ; ++j)
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = n0 + wn0 + j * 8 + 2 * tq + e;
            bias_col[j][e] = bias != nullptr && col < NG ? to_f(bias[grp * Kg + col]) : 0.f;
        }
#endif
#if STATS
    float st_s[NJ][2], st_q[NJ][2];     // this thread's columns' sums of y and y^2 over its rows, in row order
    #pragma unroll
    for (int j = 0; j < NJ; ++j)
        #pragma unroll
        for (int e = 0; e < 2; ++e) st_s[j][e] = st_q[j][e] = 0.f;
#endif
    #pragma unroll
    for (int i = 0; i < MI; ++i) {
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = m0 + wm0 + i * 16 + gq + half * 8;
            if (row >= M) continue;
#if DIR == 0
            const int PQ = P * Q, n = row / PQ, pq = row - n * PQ, p = pq / Q, q = pq - p * Q;
            T* base = out + (n * syn + grp * Kg * syc + p * syh + q * syw);
            const int cstride = syc;
#if EPI
            const T* zrow = zsrc != nullptr ? zsrc + (n * szn + grp * Kg * szc + p * szh + q * szw) : nullptr;
#endif
#elif DIR == 1
            const int HW = H * W, n = row / HW, hw = row - n * HW, h = hw / W, w = hw - h * W;
            T* base = out + (n * sxn + grp * Cg * sxc + h * sxh + w * sxw);
            const int cstride = sxc;
#else
            const int CRS = Cg * RS;
#if VEC && DWKRSC
            OutT* base = out + (grp * Kg * CRS + row);     // row = (r*S + s)*Cg + c -> dw[k][r][s][c] (KRSC)
#elif VEC
            const int rs_ = row / Cg;                      // row = (r*S + s)*Cg + c -> dw[k][c][r][s]
            OutT* base = out + (grp * Kg * CRS + (row - rs_ * Cg) * RS + rs_);
#else
            OutT* base = out + (grp * Kg * CRS + row);
#endif
            const int cstride = CRS;
#endif
            #pragma unroll
            for (int j = 0; j < NJ; ++j) {
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = n0 + wn0 + j * 8 + 2 * tq + e;
                    if (col >= NG) continue;
                    const float v = acc[i][j][half * 2 + e];
                    OutT* dst = base + col * cstride;
                    const float old = beta != 0.f ? beta * to_f(*dst) : 0.f;
#if EPI
                    float u = alpha * v + old;
                    if (zrow != nullptr) u += alpha2 * to_f(zrow[col * szc]);
#if STATS
                    T stored;
                    from_f(&stored, epi_act(bias != nullptr ? u + bias_col[j][e] : u, act_coef));
                    *dst = stored;
                    const float yo = to_f(stored);          // the statistics of y as stored
                    st_s[j][e] += yo;
                    st_q[j][e] = fmaf(yo, yo, st_q[j][e]);
#else
                    from_f(dst, epi_act(bias != nullptr ? u + bias_col[j][e] : u, act_coef));
#endif
#else
                    from_f(dst, alpha * v + old);
#endif
                }
            }
        }
    }
#if STATS
    // ---- batch-norm statistics: block partials, then the column tile's last block adds them in order ------
    #pragma unroll
    for (int j = 0; j < NJ; ++j)
        #pragma unroll
        for (int e = 0; e < 2; ++e)
            #pragma unroll
            for (int off = 4; off < 32; off *= 2) {     // over lane / 4 (the rows): every lane gets the same sum
                st_s[j][e] += __shfl_xor_sync(0xffffffffu, st_s[j][e], off);
                st_q[j][e] += __shfl_xor_sync(0xffffffffu, st_q[j][e], off);
            }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();                                     // every warp is done reading sA: reuse it
    float2* wsum = reinterpret_cast<float2*>(sA);        // [WARPS_M][BN]: each warp row's column sums
    if (gq == 0) {
        #pragma unroll
        for (int j = 0; j < NJ; ++j)
            #pragma unroll
            for (int e = 0; e < 2; ++e)
                wsum[(warp % WARPS_M) * BN + wn0 + j * 8 + 2 * tq + e] = make_float2(st_s[j][e], st_q[j][e]);
    }
    __syncthreads();
    const int ctile = grp * gridDim.y + blockIdx.y;      // this block's column tile (group, n0)
    float2* part = reinterpret_cast<float2*>(partial) + (long long)ctile * gridDim.x * BN;
    if (tid < BN) {
        float2 v = wsum[tid];
        #pragma unroll
        for (int wm = 1; wm < WARPS_M; ++wm) { const float2 u = wsum[wm * BN + tid]; v.x += u.x; v.y += u.y; }
        part[blockIdx.x * BN + tid] = v;
    }
    __shared__ int s_stats_last;
    __threadfence();                   // the partial is visible device-wide ...
    __syncthreads();                   // ... before thread 0 draws the column tile's ticket
    if (tid == 0) s_stats_last = atomicAdd(tickets + ctile, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_stats_last) return;
    __threadfence();                   // the other blocks' partials, published before their tickets
    {
        constexpr int V = BN / 2, RSTEP = THREADS / V;   // float4 slots (2 columns) per m-tile; threads per slot
        const int slot = tid % V;
        const float4* src = reinterpret_cast<const float4*>(part) + slot;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        #pragma unroll 8
        for (int mt = tid / V; mt < (int)gridDim.x; mt += RSTEP) {
            const float4 v = __ldcg(src + mt * V);       // L2: never a stale L1 line
            a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
        }
        float4* tsum = reinterpret_cast<float4*>(sA);
        tsum[tid] = a;                                   // (wsum's last reads were before the barriers above)
        __syncthreads();
        if (tid < V) {
            float4 v = tsum[tid];
            for (int r = 1; r < RSTEP; ++r) {
                const float4 u = tsum[r * V + tid];
                v.x += u.x; v.y += u.y; v.z += u.z; v.w += u.w;
            }
            const int col = n0 + 2 * tid;
            if (col < NG) { ssum[grp * Kg + col] = v.x; ssq[grp * Kg + col] = v.y; }
            if (col + 1 < NG) { ssum[grp * Kg + col + 1] = v.z; ssq[grp * Kg + col + 1] = v.w; }
        }
        if (tid == 0) tickets[ctile] = 0u;               // every block has drawn: free for the next launch
    }
#endif
}
"""


if __name__ == "__main__":      # python -m minidnn.backend.cuda.conv_igemm_source OUT.cu NAME=VALUE ... (for nvcc)
    import sys

    from minidnn.backend.cuda.launch import write_source
    write_source(sys.argv[1], SOURCE, sys.argv[2:])
