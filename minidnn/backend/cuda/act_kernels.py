"""Pointwise activations on the GPU: y = f(x) and dx = f'(x) * dy, one launch each (the reference's CuPy form
launches 2-5 kernels for most backward modes: comparison, cast, product, ...).

Shape legend: x, y, dy, dx any shape (float32/float64, or float16/bfloat16 computed in float), all of one shape and
memory order, walked as flat (n,) memory: C-contiguous,
or channels-last (N, *S, C) contiguous for a channels-first (N, C, *S) view -- the outputs keep that order.
Tiling: 16-byte vectors (4 floats, 8 halves, 2 doubles) when every pointer is 16-byte aligned: a block owns a tile
of 256 * UNROLL consecutive vectors, each thread UNROLL of them (a warp's access: 512 contiguous bytes), all loads
issued before the math and the stores; one block per tile (or a capped grid walking the tiles: CONFIG); the n % VW
elements past the last whole vector are block 0's.  A misaligned view takes a grid-stride loop of 4 independent
scalars per thread (loads first, then the math).
MODE (the ActivationMode, a macro) and COEF (the descriptor's coefficient, an argument) choose f; f' follows the
reference's conventions at the kinks (relu'(0) = 0, a NaN input passes the gradient on, ...).
MODE ADD (not an activation: ``add``) runs the backward kernel as out = x + dy, summed in float and rounded once --
the bits of CuPy's ``x + dy`` -- for the engine's same-shape adds (a residual block's forward add, the gradient sums
of a tensor used twice), which CuPy's elementwise kernel runs at ~1/3 of this kernel's rate on 16-bit data.
TWIN (MODE ADD only; ``add_twin_plan``): the add also stores relu(out) to a fourth array ``twin`` laid out as out,
computed from out as stored (bn_nhwc.TWIN_HEADER's relu_of_stored: act_fwd's RELU expression), so it holds the bits
the ReLU kernel would write from out -- nn's speculative residual add + ReLU (docs/fusion.md).  Without TWIN the
kernels' text after preprocessing is unchanged.
TWIN_NHWC (with TWIN, a C-contiguous (N, C, H, W) out; SH_C = C and SH_HW = H*W compiled in, H*W a multiple of the
vector; ``add_twin_plan(a, shadow=True)``): the twin's values also go to a fifth array ``shadow`` in channels-last
memory, element (n, c, hw) at (n * HW + hw) * C + c -- the twin's NHWC shadow a convolution's 16-byte loader reads
as it is (docs/fusion.md, "The twin's NHWC shadow").  A vector's VW values share a channel: VW plain scalar stores
SH_C apart (they merge into whole sectors in L2).  Without TWIN_NHWC the text is unchanged.
Traffic: forward reads x, writes y; backward reads x and dy, writes dx (TWIN: and the twin) -- the floor of each.
"""
from __future__ import annotations

import os

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from . import workspace as _ws
from .bn_cluster import SHADOW_HEADER
from .bn_kernels import STORAGE_HEADER, type_info
from .bn_nhwc import TWIN_HEADER, strided_spec

__all__ = ["supports", "forward", "backward", "add", "plan", "add_twin_plan", "options", "MODES", "SOURCE"]

THREADS = 256
MODES = ("IDENTITY", "RELU", "SIGMOID", "TANH", "CLIPPED_RELU", "ELU", "LEAKY_RELU", "GELU", "GELU_TANH", "SWISH",
         "SOFTPLUS", "HARDTANH", "RELU6")
_ALL_MODES = MODES + ("ADD",)      # ADD: out = x + dy through act_bwd (``add``), not an activation

SOURCE = STORAGE_HEADER + "".join(f"#define M_{m} {i}\n" for i, m in enumerate(_ALL_MODES)) + TWIN_HEADER + r"""
#if TWIN && MODE != M_ADD
#error "TWIN: only the add (MODE ADD) stores relu of its output"
#endif

__device__ __forceinline__ A sigm(A v) { return (A)0.5 * ((A)1 + tanh((A)0.5 * v)); }   // never overflows
__device__ __forceinline__ bool between(A v, A lo, A hi) { return !(v <= lo || v >= hi); }

__device__ __forceinline__ A act_f(A v, const A c)
{
#if MODE == M_IDENTITY
    return v;
#elif MODE == M_RELU
    return v > (A)0 ? v : (v != v ? v : (A)0);
#elif MODE == M_SIGMOID
    return sigm(v);
#elif MODE == M_TANH
    return tanh(v);
#elif MODE == M_CLIPPED_RELU
    return v != v ? v : fmin(fmax(v, (A)0), c);
#elif MODE == M_RELU6
    return v != v ? v : fmin(fmax(v, (A)0), (A)6);
#elif MODE == M_HARDTANH
    return v != v ? v : fmin(fmax(v, -c), c);
#elif MODE == M_ELU
    return v > (A)0 ? v : c * expm1(v);      // NaN stays NaN, as the reference
#elif MODE == M_LEAKY_RELU
    return v > (A)0 ? v : c * v;
#elif MODE == M_GELU
    return (A)0.5 * v * ((A)1 + erf(v * (A)0.70710678118654752440));
#elif MODE == M_GELU_TANH
    return (A)0.5 * v * ((A)1 + tanh((A)0.79788456080286535588 * (v + (A)0.044715 * v * v * v)));
#elif MODE == M_SWISH
    return v * sigm(c * v);
#elif MODE == M_SOFTPLUS
    const A u = c * v;     // logaddexp(0, u) / c
    return (fmax(u, (A)0) + log1p(exp(-fabs(u)))) / c;
#else
    return v;
#endif
}

__device__ __forceinline__ A act_df(A v, const A c)
{
#if MODE == M_IDENTITY
    return (A)1;
#elif MODE == M_RELU
    return v <= (A)0 ? (A)0 : (A)1;
#elif MODE == M_SIGMOID
    const A s = sigm(v); return s * ((A)1 - s);
#elif MODE == M_TANH
    const A t = tanh(v); return (A)1 - t * t;
#elif MODE == M_CLIPPED_RELU
    return between(v, (A)0, c) ? (A)1 : (A)0;
#elif MODE == M_RELU6
    return between(v, (A)0, (A)6) ? (A)1 : (A)0;
#elif MODE == M_HARDTANH
    return between(v, -c, c) ? (A)1 : (A)0;
#elif MODE == M_ELU
    return v <= (A)0 ? c * exp(v) : (A)1;
#elif MODE == M_LEAKY_RELU
    return v > (A)0 ? (A)1 : c;
#elif MODE == M_GELU
    return (A)0.5 * ((A)1 + erf(v * (A)0.70710678118654752440)) + v * exp((A)-0.5 * v * v) * (A)0.39894228040143267794;
#elif MODE == M_GELU_TANH
    const A k = (A)0.79788456080286535588, b = (A)0.044715;
    const A t = tanh(k * (v + b * v * v * v));
    return (A)0.5 * ((A)1 + t) + (A)0.5 * v * ((A)1 - t * t) * k * ((A)1 + (A)3 * b * v * v);
#elif MODE == M_SWISH
    const A s = sigm(c * v); return s + c * v * s * ((A)1 - s);
#elif MODE == M_SOFTPLUS
    return sigm(c * v);
#else
    return (A)1;
#endif
}

// act_bwd's element: f'(x) * dy, or (MODE ADD) x + dy
__device__ __forceinline__ A act_combine(A v, A g, const A c)
{
#if MODE == M_ADD
    return v + g;
#else
    return act_df(v, c) * g;
#endif
}

// 16-byte vectors: VW elements of T (4 floats, 2 doubles, 8 halves).  vec = 1 (the host checked that every pointer
// is 16-byte aligned): a block's tile is THREADS * UNROLL consecutive vectors, thread t taking vectors t, t + THREADS,
// ... (each warp access one coalesced 512-byte run); its UNROLL loads are all issued before the math and the stores
// (UNROLL * 16 bytes in flight per thread and array); tiles go round the grid (grid stride).  The n % VW elements
// past the last whole vector are block 0's last job.  vec = 0 (a misaligned view): 4 independent scalars per thread
// and iteration, loads first.
#define VW (16 / (int)sizeof(T))
#ifndef UNROLL
#define UNROLL 4
#endif
#ifndef HINT
#define HINT 0
#endif
#ifndef THREADS
#define THREADS 256
#endif
struct alignas(16) Vec { T v[VW]; };

// HINT bit 0: streaming ("evict first") loads of the inputs, read exactly once; bit 1: streaming stores of the output
// (HINT 1 stores plainly: the next layer reads the output soon, it may still be in L2).  Candidates for the GPU sweep.
__device__ __forceinline__ Vec ldv(const T* __restrict__ p, long long k)
{
#if HINT & 1
    union { uint4 r; Vec v; } u;
    u.r = __ldcs(reinterpret_cast<const uint4*>(p) + k);
    return u.v;
#else
    return reinterpret_cast<const Vec*>(p)[k];
#endif
}

__device__ __forceinline__ void stv(T* __restrict__ p, long long k, const Vec& b)
{
#if HINT & 2
    union { uint4 r; Vec v; } u;
    u.v = b;
    __stcs(reinterpret_cast<uint4*>(p) + k, u.r);
#else
    reinterpret_cast<Vec*>(p)[k] = b;
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS)
act_fwd(const T* __restrict__ x, T* __restrict__ y, const long long n, const double coef, const int vec)
{
    const A c = (A)coef;
    if (vec) {
        const long long nv = n / VW, step = (long long)gridDim.x * (THREADS * UNROLL);
        for (long long k0 = (long long)blockIdx.x * (THREADS * UNROLL) + threadIdx.x; k0 < nv; k0 += step) {
            Vec a[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) if (k0 + u * THREADS < nv) a[u] = ldv(x, k0 + u * THREADS);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (k0 + u * THREADS < nv) {
                    Vec b;
#pragma unroll
                    for (int e = 0; e < VW; ++e) b.v[e] = ST(act_f(LD(a[u].v[e]), c));
                    stv(y, k0 + u * THREADS, b);
                }
            }
        }
        const long long i = nv * VW + threadIdx.x;
        if (blockIdx.x == 0 && i < n) y[i] = ST(act_f(LD(x[i]), c));
        return;
    }
    const long long stride = (long long)gridDim.x * THREADS;
    for (long long i0 = (long long)blockIdx.x * THREADS + threadIdx.x; i0 < n; i0 += 4 * stride) {
        T v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) if (i0 + u * stride < n) v[u] = x[i0 + u * stride];
#pragma unroll
        for (int u = 0; u < 4; ++u) if (i0 + u * stride < n) y[i0 + u * stride] = ST(act_f(LD(v[u]), c));
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
act_bwd(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx TWIN_PARAM, const long long n,
        const double coef, const int vec)
{
    const A c = (A)coef;
    if (vec) {
        const long long nv = n / VW, step = (long long)gridDim.x * (THREADS * UNROLL);
        for (long long k0 = (long long)blockIdx.x * (THREADS * UNROLL) + threadIdx.x; k0 < nv; k0 += step) {
            Vec a[UNROLL], g[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (k0 + u * THREADS < nv) { a[u] = ldv(x, k0 + u * THREADS); g[u] = ldv(dy, k0 + u * THREADS); }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (k0 + u * THREADS < nv) {
                    Vec b;
#pragma unroll
                    for (int e = 0; e < VW; ++e) b.v[e] = ST(act_combine(LD(a[u].v[e]), LD(g[u].v[e]), c));
                    stv(dx, k0 + u * THREADS, b);
#if TWIN
#pragma unroll
                    for (int e = 0; e < VW; ++e) b.v[e] = relu_of_stored(b.v[e]);
                    stv(twin, k0 + u * THREADS, b);
#endif
                }
            }
        }
        const long long i = nv * VW + threadIdx.x;
        if (blockIdx.x == 0 && i < n) dx[i] = ST(act_combine(LD(x[i]), LD(dy[i]), c));
#if TWIN
        if (blockIdx.x == 0 && i < n) twin[i] = relu_of_stored(dx[i]);     // (this thread's own store, read back)
#endif
        return;
    }
    const long long stride = (long long)gridDim.x * THREADS;
    for (long long i0 = (long long)blockIdx.x * THREADS + threadIdx.x; i0 < n; i0 += 4 * stride) {
        T v[4], g[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) if (i0 + u * stride < n) { v[u] = x[i0 + u * stride]; g[u] = dy[i0 + u * stride]; }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (i0 + u * stride < n) dx[i0 + u * stride] = ST(act_combine(LD(v[u]), LD(g[u]), c));
#if TWIN
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (i0 + u * stride < n) twin[i0 + u * stride] = relu_of_stored(dx[i0 + u * stride]);
#endif
    }
}
"""

# TWIN_NHWC's source: SOURCE with the shadow's parameter, index map and stores spliced in at fixed places (SOURCE
# itself, the plain and TWIN kernels' text, stays as it is: their PTX cannot change).
def _spliced(source, edits):
    for at, text in edits:
        assert source.count(at) == 1, at
        source = source.replace(at, at + text)
    return source


SHADOW_SOURCE = _spliced(SOURCE, [
    ('#error "TWIN: only the add (MODE ADD) stores relu of its output"\n#endif\n', SHADOW_HEADER + r"""
#if TWIN_NHWC
// the channels-last offset of NCHW element i (32-bit: n < 2^31; SH_C, SH_HW compile-time, so the divisions multiply)
__device__ __forceinline__ long long shadow_of(long long i)
{
    const unsigned int q = (unsigned int)i / SH_HW, hw = (unsigned int)i - q * SH_HW;
    const unsigned int b = q / SH_C, c = q - b * SH_C;
    return ((long long)b * SH_HW + hw) * SH_C + c;
}
#endif
"""),
    ("T* __restrict__ dx TWIN_PARAM", " SHADOW_PARAM"),
    ("                    stv(twin, k0 + u * THREADS, b);\n", r"""#if TWIN_NHWC
                    const long long d = shadow_of((k0 + u * THREADS) * VW);
#pragma unroll
                    for (int e = 0; e < VW; ++e) shadow[d + (long long)e * SH_C] = b.v[e];
#endif
"""),
    ("        if (blockIdx.x == 0 && i < n) twin[i] = relu_of_stored(dx[i]);"
     "     // (this thread's own store, read back)\n", r"""#if TWIN_NHWC
        if (blockIdx.x == 0 && i < n) shadow[shadow_of(i)] = twin[i];
#endif
"""),
    ("            if (i0 + u * stride < n) twin[i0 + u * stride] = relu_of_stored(dx[i0 + u * stride]);\n",
     r"""#if TWIN_NHWC
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (i0 + u * stride < n) shadow[shadow_of(i0 + u * stride)] = twin[i0 + u * stride];
#endif
""")])


def _memory_order(a):
    """'C' for C-contiguous, 'CL' for a channels-first view of channels-last memory, else None.  The channels-last
    test reads the strides in that order, innermost first (C, W, H, (D), N), by the arrays' own contiguity rule
    (extent-1 axes skipped) -- what its channels-last view's ``flags.c_contiguous`` says, without making the view
    (a transpose per call: docs/host_overhead.md round 22)."""
    if a.flags.c_contiguous:
        return "C"
    nd = a.ndim
    if nd < 3:
        return None
    shape, strides = a.shape, a.strides
    want = a.itemsize
    for i in (1, *range(nd - 1, 1, -1), 0):
        n = shape[i]
        if n != 1:
            if strides[i] != want:
                return None
            want *= n
    return "CL"


def supports(mode_name, x, *others) -> bool:
    if not (_dev.is_cuda_array(x) and type_info(x.dtype) is not None and x.size > 0 and mode_name in _ALL_MODES):
        return False
    order = _memory_order(x)
    return order is not None and all(
        o is not None and tuple(o.shape) == tuple(x.shape) and o.dtype == x.dtype
        and tuple(o.strides) == tuple(x.strides)
        for o in others)


_kernel_cache: dict = {}

# The launch shape: UNROLL vectors per thread and tile (all loads in flight before the math), BLOCKS_PER_SM caps the
# grid (0: one block per tile, no cap -- blocks come and go as the hardware schedules them), HINT the streaming-load
# variant.  MINIDNN_ACT_V1=1 keeps the previous kernel's launch for a GPU A/B: one vector per thread and iteration,
# the grid capped at 8 blocks per SM, vectors only where n fills them.  MINIDNN_ACT_LAUNCH="unroll,blocks_per_sm,hint"
# sets the three for a run (read once); tools/act_pool_sweep.py times the choices.
# 16-bit data (float16 / bfloat16) has a launch of its own, CONFIG16 (MINIDNN_ACT_LAUNCH16 likewise): the rule is
# ONE 16-byte vector per thread and tile for 16-bit (8 elements, as many as UNROLL 2 of float32) -- on the H100 sweep
# (session 6 round 3, (128, 64, 56, 56) bf16) u1 b0 h0 was the fastest row (relu fwd 0.0374 ms, bwd 0.0540; the
# float32 default u4 gave 0.0377 / 0.0543) -- and for 4- and 8-byte data 128-thread blocks of UNROLL 2 (below).
V1 = os.environ.get("MINIDNN_ACT_V1", "0") == "1"
# "threads" (session 9, round 2; an optional 4th field of the variables): the block size -- PyTorch's vectorized
# elementwise kernel runs 128-thread blocks of 2 float4 a thread (8 elements) where ours run 256 x 4; its ReLU
# forward was 2-4% faster on the H200 (tools/ktable_ab.py rows relu128 / relu2 time the candidates).  Adopted for
# 4- and 8-byte data (session 9 run 9, H200, graph replays of (128, 64, 56, 56) float32: ReLU forward 0.0514 ->
# 0.0503 ms, 96% -> 98% of copy, level with PyTorch's 0.0503; backward 0.0726 -> 0.0724); 16-bit data measured even.
CONFIG = {"unroll": 1 if V1 else 2, "blocks_per_sm": 8 if V1 else 0, "hint": 0, "threads": THREADS if V1 else 128}
CONFIG16 = {"unroll": 1, "blocks_per_sm": 8 if V1 else 0, "hint": 0, "threads": THREADS}
for _env, _cfg in (("MINIDNN_ACT_LAUNCH", CONFIG), ("MINIDNN_ACT_LAUNCH16", CONFIG16)):
    if os.environ.get(_env) and not V1:
        _cfg.update(zip(("unroll", "blocks_per_sm", "hint", "threads"), map(int, os.environ[_env].split(","))))


def config(dtype):
    """The launch settings of ``dtype``: CONFIG16 for 2-byte data, else CONFIG."""
    return CONFIG16 if np.dtype(dtype).itemsize == 2 else CONFIG


def _kernel(name, dtype, mode_name, twin=False):
    """``twin``: False, True (TWIN) or (C, H*W): TWIN with TWIN_NHWC's shadow of a (N, C, H, W) output."""
    cfg = config(dtype)
    key = (name, dtype, mode_name, cfg["unroll"], cfg["hint"], cfg.get("threads", THREADS), twin)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _kernel_compiled(name, dtype, mode_name, *key[3:])
    return k


def options(dtype, mode_name, unroll=4, hint=0, threads=THREADS, twin=False):
    """NVRTC options of one configuration (nvcc takes the same -D options: the tests compile each kernel)."""
    scalar, accum, storage, _ = type_info(dtype)
    return (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DMODE=M_{mode_name}",
            f"-DUNROLL={int(unroll)}", f"-DHINT={int(hint)}", "-std=c++14") + \
        ((f"-DTHREADS={int(threads)}",) if threads != THREADS else ()) + (("-DTWIN=1",) if twin else ()) + \
        (("-DTWIN_NHWC=1", f"-DSH_C={int(twin[0])}", f"-DSH_HW={int(twin[1])}") if type(twin) is tuple else ())


def _kernel_compiled(name, dtype, mode_name, unroll, hint, threads=THREADS, twin=False):
    return _launch.get_kernel(SHADOW_SOURCE if type(twin) is tuple else SOURCE, name,
                              options(dtype, mode_name, unroll, hint, threads, twin))


def _grid(n, dev, threads=THREADS):
    """Scalar path: 4 elements per thread and iteration, at most 8 blocks per SM (grid stride)."""
    return (max(1, min((n + threads * 4 - 1) // (threads * 4), _launch.sm_count(dev) * 8)),)


def _vec_grid(nv, dev, cfg=CONFIG):
    """Vector path: one block per tile of threads * unroll vectors, capped at blocks_per_sm per SM where set."""
    tiles = max(1, -(-nv // (cfg.get("threads", THREADS) * cfg["unroll"])))
    cap = cfg["blocks_per_sm"]
    return (min(tiles, _launch.sm_count(dev) * cap) if cap else tiles,)


# ---- plans: everything but the arrays, once per call signature ------------------------------------------------

class _Plan:
    """A settled activation call: ``plan(x)`` -> y, ``plan(x, dy)`` -> dx.  The output is allocated in x's memory
    order (channels-last: in one step, ``workspace.empty_strided`` of ``spec``; ``workspace.fresh``); the prepared
    launch takes the arrays' pointers directly (no flat views); ``vec`` is the same launch with 16-byte vectors, taken
    when every input pointer is 16-byte aligned (a fresh output always is; n filling whole vectors is part of the
    signature)."""
    __slots__ = ("dev", "mem", "back", "spec", "dtype", "go", "vec")

    def __call__(self, x, dy=None):
        with _launch.on_device(self.dev):
            spec = self.spec
            out = _ws.fresh(_launch._cp, self.dev, "act", self.mem, self.dtype, spec)
            vec = self.vec
            if dy is None:
                (vec if vec is not None and not x.data.ptr & 15 else self.go)(x, out)
            else:
                (vec if vec is not None and not (x.data.ptr | dy.data.ptr) & 15 else self.go)(x, dy, out)
        return out


class _TwinPlan(_Plan):
    """``add_twin_plan``'s: ``plan(a, b)`` -> (a + b, relu(a + b)), both fresh arrays laid out as a (one launch)."""
    __slots__ = ()

    def __call__(self, x, dy):
        with _launch.on_device(self.dev):
            spec, cp = self.spec, _launch._cp
            out = _ws.fresh(cp, self.dev, "act", self.mem, self.dtype, spec)
            twin = _ws.fresh(cp, self.dev, "act.twin", self.mem, self.dtype, spec)
            vec = self.vec
            (vec if vec is not None and not (x.data.ptr | dy.data.ptr) & 15 else self.go)(x, dy, out, twin)
        return out, twin


class _ShadowPlan(_Plan):
    """``add_twin_plan(a, shadow=True)``'s: ``plan(a, b)`` -> (a + b, relu(a + b), relu(a + b)'s channels-last
    shadow as its channels-first view), one launch; None (nothing launched) while the stream captures a CUDA graph:
    the scattered stores cost device time (the caller then runs the plain twin plan)."""
    __slots__ = ("sh",)

    def __call__(self, x, dy):
        cp = _launch._cp
        if _ws.eager_stream(cp) is None:
            return None
        with _launch.on_device(self.dev):
            out = _ws.fresh(cp, self.dev, "act", self.mem, self.dtype, self.spec)
            twin = _ws.fresh(cp, self.dev, "act.twin", self.mem, self.dtype, self.spec)
            shadow = _ws.fresh(cp, self.dev, "act.shadow", self.sh, self.dtype)
            vec = self.vec
            (vec if vec is not None and not (x.data.ptr | dy.data.ptr) & 15 else self.go)(x, dy, out, twin, shadow)
        return out, twin, shadow.transpose(0, 3, 1, 2)


_plans: dict = {}


def plan(mode_name, coef, x, backward=False):
    """The plan of ``forward(mode_name, coef, x)`` (or of ``backward``: call it with x, dy), built once per
    signature."""
    dev = x.data.device_id
    return _launch.planned(_plans, (backward, mode_name, coef, x.shape, x.strides, x.dtype, dev), _plan,
                           mode_name, coef, x, backward, dev)


def add_twin_plan(a, shadow=False):
    """The plan of ``add(a, b)`` that also returns relu(a + b) (the TWIN kernel: ``plan(a, b)`` -> (sum, twin)), for
    a and b of a's signature (``supports("ADD", a, b)``), built once per signature; the sum has ``add``'s bits.
    ``shadow``: the TWIN_NHWC kernel (``plan(a, b)`` -> (sum, twin, the twin's channels-last shadow), the same grid
    and scalars), for a C-contiguous (N, C, H, W) ``a`` with H*W a multiple of the vector and fewer than 2^31
    elements; else False."""
    dev = a.data.device_id
    if not shadow:
        return _launch.planned(_plans, ("twin", a.shape, a.strides, a.dtype, dev), _plan, "ADD", 0.0, a, True, dev,
                               True)
    if a.ndim != 4 or not a.flags.c_contiguous or a.size >= 2 ** 31 or (a.shape[2] * a.shape[3]) % (16 // a.itemsize):
        return False
    return _launch.planned(_plans, ("twin_nhwc", a.shape, a.strides, a.dtype, dev), _plan, "ADD", 0.0, a, True,
                           dev, (a.shape[1], a.shape[2] * a.shape[3]))


def _plan(mode_name, coef, x, backward, dev, twin=False):
    p = (_ShadowPlan() if type(twin) is tuple else _TwinPlan()) if twin else _Plan()
    p.dev, p.dtype = dev, x.dtype
    if x.flags.c_contiguous:
        p.mem, p.back = x.shape, None
    else:                                   # channels-last memory of a channels-first view (supports)
        perm = (0, *range(2, x.ndim), 1)
        p.mem, p.back = tuple(x.shape[i] for i in perm), (0, x.ndim - 1, *range(1, x.ndim - 1))
    p.spec = strided_spec(p.mem, p.back, x.dtype)
    n = x.size
    k = _kernel("act_bwd" if backward else "act_fwd", x.dtype, mode_name, twin)
    head = [None] * ((3 + bool(twin) + (type(twin) is tuple)) if backward else 2) + [np.int64(n), np.float64(coef)]
    threads = config(x.dtype).get("threads", THREADS)
    p.go = _launch.prepare(k, _grid(n, dev, threads), (threads,), head + [np.int32(0)])
    vw = 16 // x.itemsize           # the vector path takes any n (the tail is block 0's); V1 only whole vectors
    p.vec = _launch.prepare(k, _vec_grid(n // vw, dev, config(x.dtype)), (threads,), head + [np.int32(1)]) \
        if not (V1 and n % vw) else None
    if type(twin) is tuple:
        n_, c_, h_, w_ = x.shape
        p.sh = (n_, h_, w_, c_)
    return p


def forward(mode_name, coef, x):
    return plan(mode_name, coef, x)(x)


def backward(mode_name, coef, x, dy):
    return plan(mode_name, coef, x, True)(x, dy)


def add(a, b):
    """a + b of two CuPy arrays of one shape, dtype and memory order (``supports("ADD", a, b)``), in that order."""
    return plan("ADD", 0.0, a, True)(a, b)
