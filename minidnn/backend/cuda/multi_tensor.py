"""Multi-tensor optimizer kernels: one CUDA launch updates every parameter of a flat buffer set.

Shape legend (every array 1-D, on one GPU):
    p, g, m, v, vmax, buf: (n,)   flat param / grad / exp_avg / exp_avg_sq / max_exp_avg_sq / momentum_buffer,
                                  each parameter at an offset aligned to `SEGMENT_ALIGN_BYTES`, zero padding between
    hyper: (k,) float64           lr, betas, eps, weight_decay ... (read on the device: "capturable")
    steps: (n_params,) float32    per-parameter step counts, incremented by the kernel itself
    has_grad: (n_params,) uint8   masked variant only: 0 = no gradient this step, leave p and its state alone
    vec_param: (n / VEC,) int32   masked variant only: which parameter each vector of VEC elements belongs to

Works on raw CuPy arrays; knows nothing of Tensors or optimizers.  Kernels compile lazily, the first time a
variant is launched (never at import), one RawKernel per (kind, dtype, flags).

Launch count: exactly ONE launch per flat buffer set and step, in every variant.  The step counters advance
inside that launch: the last block to finish (threadfence + atomic ticket, CUDA's threadFenceReduction idiom)
bumps them after every block has read them, then resets its ticket for the next launch.  Nothing is read back
to the host, so a CUDA-graph capture of the step replays correctly.
"""
from __future__ import annotations

import numpy as np

from . import launch as _launch_mod

__all__ = ["supports", "adam_flat_step", "sgd_flat_step", "launch_count", "SEGMENT_ALIGN_BYTES", "vector_width",
           "kernel_source"]

SEGMENT_ALIGN_BYTES = 128        # each parameter starts on a 128-byte boundary: aligned vector loads, whole lines
THREADS = 256
BLOCKS_PER_SM = 8                # 8 x 256 = 2048 threads: one full wave on sm_80/sm_90; the grid-stride loop does
                                 # the rest
UNSCALE_BLOCKS_PER_SM = 4        # co-resident grid for the grid-wide barrier of the UNSCALE variant
_VECTOR = {np.dtype(np.float32): ("float", "float4", 4), np.dtype(np.float64): ("double", "double2", 2)}

_launches = 0
_kernels: dict = {}


def supports(dtype) -> bool:
    """True where a flat buffer of ``dtype`` has a fused kernel (others use the xp-generic flat update)."""
    return np.dtype(dtype) in _VECTOR


def vector_width(dtype) -> int:
    """Elements per vector load (16 bytes): 4 for float32, 2 for float64."""
    return _VECTOR[np.dtype(dtype)][2]


def launch_count() -> int:
    """How many optimizer kernels this process has launched (tests take differences)."""
    return _launches


# One vector of VEC elements per thread per iteration: LOAD/STORE move 16 bytes (float4 / double2).
_COMMON = r"""
typedef SCALAR T;
typedef VECTOR V;
#if VEC == 4
#define SQRT sqrtf
#define UNPACK(r, t) { r[0] = t.x; r[1] = t.y; r[2] = t.z; r[3] = t.w; }
#define PACK(t, r) { t.x = r[0]; t.y = r[1]; t.z = r[2]; t.w = r[3]; }
#else
#define SQRT sqrt
#define UNPACK(r, t) { r[0] = t.x; r[1] = t.y; }
#define PACK(t, r) { t.x = r[0]; t.y = r[1]; }
#endif
#define LOAD(r, a, i) { const V t_ = reinterpret_cast<const V*>(a)[i]; UNPACK(r, t_) }
#define STORE(a, i, r) { V t_; PACK(t_, r) reinterpret_cast<V*>(a)[i] = t_; }
// Master weights (MASTER): gradients and the model's parameters are float16 (LOWP_BF16 0) or bfloat16 (1) bits,
// the update runs in T = float on the master copy p; conversions by PTX / bit arithmetic (no headers needed).
#if MASTER
typedef unsigned short GT;
__device__ __forceinline__ float lowp_to_float(unsigned short h) {
#if LOWP_BF16
    return __uint_as_float(((unsigned int)h) << 16);
#else
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#endif
}
__device__ __forceinline__ unsigned short float_to_lowp(float f) {
#if LOWP_BF16
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0u;      // NaN stays a quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                         // round to nearest even
    return (unsigned short)(u >> 16);
#else
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
#endif
}
#define LOAD_G(r, a, i) { _Pragma("unroll") for (int k_ = 0; k_ < VEC; ++k_) r[k_] = lowp_to_float(a[(i) * VEC + k_]); }
#define STORE_LOWP(a, i, r) \
    { _Pragma("unroll") for (int k_ = 0; k_ < VEC; ++k_) a[(i) * VEC + k_] = float_to_lowp(r[k_]); }
#else
typedef T GT;
#define LOAD_G(r, a, i) LOAD(r, a, i)
#define STORE_LOWP(a, i, r)
#endif
// Grid-stride loop over the n_vec vectors.
#define FOR_EACH_VECTOR(i) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; \
         i += (long long)gridDim.x * blockDim.x)
// Masked variant: entering another parameter's segment, look up whether it has a gradient, then run `refresh`.
#define NEXT_PARAMETER(i, refresh) { \
    const int j = vec_param[i]; \
    if (j != current) { current = j; active = has_grad[j] != 0; refresh; } }

// The last block to finish advances the step counters: every block has read them by then.
__device__ __forceinline__ void advance_steps(float* steps, const unsigned char* __restrict__ has_grad,
                                              const int n_params, unsigned int* ticket)
{
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    for (int j = threadIdx.x; j < n_params; j += blockDim.x) {
#if MASKED
        if (!has_grad[j]) continue;
#endif
        steps[j] += 1.0f;
    }
    if (threadIdx.x == 0) *ticket = 0u;
}

// Loss scaling (GradScaler).  GUARDED: found_inf was decided before this launch; a non-zero value skips the whole
// step (parameters, state and step counters untouched).  UNSCALE: this launch decides it: every block scans its
// gradients for inf/NaN, a grid-wide barrier (the grid is sized to be co-resident: MIN_BLOCKS per SM) makes the
// verdict visible to all, then the update runs on g * float(1 / double(scale)).
#if UNSCALE
#define MIN_BLOCKS 4
#define GSCALE * inv_scale
#else
#define MIN_BLOCKS 1
#define GSCALE
#endif

#if UNSCALE
// Sense-reversing grid barrier on bar[0] (arrivals) and bar[1] (generation): the last block to arrive releases
// the others.  Safe because every block of the grid is resident at once (see MIN_BLOCKS).
__device__ __forceinline__ void grid_barrier(unsigned int* bar)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned int* generation = bar + 1;
        const unsigned int gen = *generation;
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            bar[0] = 0u;
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (*generation == gen) __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

// Phase 1 of an UNSCALE launch: does any gradient this launch will use hold inf or NaN?
__device__ __forceinline__ void check_gradients(const GT* __restrict__ g, const unsigned char* __restrict__ has_grad,
                                                const int* __restrict__ vec_param, float* found_inf,
                                                unsigned int* bar, const long long n_vec)
{
    bool bad = false;
#if MASKED
    int cur = -1;
    bool act = false;
#endif
    FOR_EACH_VECTOR(i) {
#if MASKED
        const int j = vec_param[i];
        if (j != cur) { cur = j; act = has_grad[j] != 0; }
        if (!act) continue;
#endif
        T r[VEC];
        LOAD_G(r, g, i)
#pragma unroll
        for (int k = 0; k < VEC; ++k) bad = bad || !isfinite(r[k]);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicExch(found_inf, 1.0f);
    grid_barrier(bar);
}
#define AMP_PROLOGUE \
    check_gradients(g, has_grad, vec_param, found_inf, ticket + 1, n_vec); \
    if (*(volatile float*)found_inf != 0.0f) return; \
    const T inv_scale = (T)(float)(1.0 / (double)(*scale));
#elif GUARDED
#define AMP_PROLOGUE if (*(volatile float*)found_inf != 0.0f) return;
#else
#define AMP_PROLOGUE
#endif
"""

# Adam / AdamW.  Grid-stride loop over vectors; each thread updates VEC consecutive elements per iteration.
# Scalars in double once per parameter (per thread in the uniform variant), element math in T without FMA
# contraction (--fmad=false) so results match the NumPy reference op for op.
_ADAM = _COMMON + r"""
__device__ __forceinline__ void adam_scalars(const double* __restrict__ hyper, const double step,
                                             T& neg_step_size, T& bc2_sqrt)
{
    const double bc1 = 1.0 - pow(hyper[1], step);
    const double bc2 = 1.0 - pow(hyper[2], step);
    neg_step_size = (T)(-(hyper[0] / bc1));
    bc2_sqrt = (T)sqrt(bc2);
}

extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS)
adam_flat(T* __restrict__ p, const GT* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
          T* __restrict__ vmax, const double* __restrict__ hyper, float* steps,
          const unsigned char* __restrict__ has_grad, const int* __restrict__ vec_param,
          const int n_params, unsigned int* ticket, const float* __restrict__ scale, float* found_inf,
          GT* __restrict__ p_lowp, const long long n_vec)
{
    AMP_PROLOGUE
    // hyper: lr, beta1, beta2, eps, weight_decay
    const T one_minus_beta1 = (T)(1.0 - hyper[1]);
    const T beta2 = (T)hyper[2];
    const T one_minus_beta2 = (T)(1.0 - hyper[2]);
    const T eps = (T)hyper[3];
#if DECOUPLED
    const T decay = (T)(1.0 - hyper[0] * hyper[4]);
#else
    const T weight_decay = (T)hyper[4];
#endif
    const bool has_decay = hyper[4] != 0.0;
    T neg_step_size, bc2_sqrt;
#if MASKED
    int current = -1;
    bool active = false;
#else
    adam_scalars(hyper, (double)steps[0] + 1.0, neg_step_size, bc2_sqrt);
#endif
    FOR_EACH_VECTOR(i) {
#if MASKED
        NEXT_PARAMETER(i, if (active) adam_scalars(hyper, (double)steps[j] + 1.0, neg_step_size, bc2_sqrt))
        if (!active) continue;
#endif
        T rp[VEC], rg[VEC], rm[VEC], rv[VEC];
        LOAD(rp, p, i) LOAD_G(rg, g, i) LOAD(rm, m, i) LOAD(rv, v, i)
#if AMSGRAD
        T rx[VEC];
        LOAD(rx, vmax, i)
#endif
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            T gk = rg[k] GSCALE;
#if MAXIMIZE
            gk = -gk;
#endif
            if (has_decay) {
#if DECOUPLED
                rp[k] = rp[k] * decay;
#else
                gk = gk + rp[k] * weight_decay;
#endif
            }
            rm[k] = rm[k] + (gk - rm[k]) * one_minus_beta1;
            rv[k] = rv[k] * beta2 + (gk * gk) * one_minus_beta2;
#if AMSGRAD
            rx[k] = rx[k] > rv[k] ? rx[k] : rv[k];
            const T denom = SQRT(rx[k]) / bc2_sqrt + eps;
#else
            const T denom = SQRT(rv[k]) / bc2_sqrt + eps;
#endif
            rp[k] = rp[k] + (rm[k] / denom) * neg_step_size;
        }
        STORE(p, i, rp) STORE(m, i, rm) STORE(v, i, rv) STORE_LOWP(p_lowp, i, rp)
#if AMSGRAD
        STORE(vmax, i, rx)
#endif
    }
    advance_steps(steps, has_grad, n_params, ticket);
}
"""

# SGD with optional momentum / nesterov.  Same tiling as adam_flat.  steps[j] == 0 marks a parameter whose
# momentum buffer starts as its first gradient (PyTorch: buf = clone(grad), no dampening).
_SGD = _COMMON + r"""
extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS)
sgd_flat(T* __restrict__ p, const GT* __restrict__ g, T* __restrict__ buf, const double* __restrict__ hyper,
         float* steps, const unsigned char* __restrict__ has_grad, const int* __restrict__ vec_param,
         const int n_params, unsigned int* ticket, const float* __restrict__ scale, float* found_inf,
         GT* __restrict__ p_lowp, const long long n_vec)
{
    AMP_PROLOGUE
    // hyper: lr, momentum, dampening, weight_decay
    const T neg_lr = (T)(-hyper[0]);
    const T weight_decay = (T)hyper[3];
    const bool has_decay = hyper[3] != 0.0;
#if MOMENTUM
    const T momentum = (T)hyper[1];
    const T one_minus_dampening = (T)(1.0 - hyper[2]);
#define REFRESH_FIRST first = steps[j] == 0.0f
#else
#define REFRESH_FIRST (void)0
#endif
#if MASKED
    int current = -1;
    bool active = false;
#if MOMENTUM
    bool first = false;
#endif
#elif MOMENTUM
    const bool first = steps[0] == 0.0f;
#endif
    FOR_EACH_VECTOR(i) {
#if MASKED
        NEXT_PARAMETER(i, REFRESH_FIRST)
        if (!active) continue;
#endif
        T rp[VEC], rg[VEC];
        LOAD(rp, p, i) LOAD_G(rg, g, i)
#if MOMENTUM
        T rb[VEC];
        if (!first) LOAD(rb, buf, i)
#endif
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            T d = rg[k] GSCALE;
#if MAXIMIZE
            d = -d;
#endif
            if (has_decay) d = d + rp[k] * weight_decay;
#if MOMENTUM
            rb[k] = first ? d : rb[k] * momentum + d * one_minus_dampening;
#if NESTEROV
            d = d + rb[k] * momentum;
#else
            d = rb[k];
#endif
#endif
            rp[k] = rp[k] + d * neg_lr;
        }
        STORE(p, i, rp) STORE_LOWP(p_lowp, i, rp)
#if MOMENTUM
        STORE(buf, i, rb)
#endif
    }
    advance_steps(steps, has_grad, n_params, ticket);
}
"""


def kernel_source(kind: str, dtype, **flags) -> tuple[str, tuple]:
    """(source, nvrtc options) of one variant: kind 'adam' or 'sgd'; flags become 0/1 macros."""
    scalar, vector, vec = _VECTOR[np.dtype(dtype)]
    names = ("AMSGRAD", "MAXIMIZE", "DECOUPLED", "MASKED") if kind == "adam" else \
        ("MOMENTUM", "NESTEROV", "MAXIMIZE", "MASKED")
    names += ("GUARDED", "UNSCALE", "MASTER", "LOWP_BF16")
    defines = [f"-DSCALAR={scalar}", f"-DVECTOR={vector}", f"-DVEC={vec}"]
    defines += [f"-D{n}={int(bool(flags.get(n.lower(), False)))}" for n in names]
    return (_ADAM if kind == "adam" else _SGD), tuple(defines) + ("--fmad=false", "-std=c++14")


def _kernel(kind, dtype, **flags):
    key = (kind, np.dtype(dtype), tuple(sorted(flags.items())))
    k = _kernels.get(key)
    if k is None:
        source, options = kernel_source(kind, dtype, **flags)
        k = _kernels[key] = _launch_mod.get_kernel(source, f"{kind}_flat", options)
    return k


def _grid(device_id, n_vec, blocks_per_sm):
    return max(1, min((n_vec + THREADS - 1) // THREADS, _launch_mod.sm_count(device_id) * blocks_per_sm))


def _launch(kernel, p, args, unscale):
    global _launches
    n_vec = p.size // vector_width(p.dtype)
    # An UNSCALE launch waits at a grid-wide barrier: its grid must fit on the GPU at once (4 blocks per SM,
    # guaranteed by __launch_bounds__(256, 4)).
    blocks_per_sm = UNSCALE_BLOCKS_PER_SM if unscale else BLOCKS_PER_SM
    with _launch_mod.on_device(p.data.device_id):
        _launch_mod.launch(kernel, (_grid(p.data.device_id, n_vec, blocks_per_sm),), (THREADS,),
                           args + (np.int64(n_vec),))
    _launches += 1


def _master_flags(p, g, p_lowp):
    if p_lowp is None:
        if g.dtype != p.dtype:
            raise ValueError(f"multi_tensor: gradient dtype {g.dtype} differs from parameter dtype {p.dtype}")
        return {}
    if p.dtype != np.float32 or g.dtype != p_lowp.dtype or p_lowp.dtype.itemsize != 2:
        raise ValueError(f"multi_tensor: master weights need float32 p and float16/bfloat16 g and p_lowp, got "
                         f"{p.dtype}, {g.dtype}, {p_lowp.dtype}")
    return {"master": True, "lowp_bf16": p_lowp.dtype.name == "bfloat16"}


def _amp_args(ticket, scale, found_inf):
    """(flags, kernel args) of the loss-scaling inputs: ``found_inf`` alone guards the step (GUARDED); with
    ``scale`` the launch also checks and unscales the gradients itself (UNSCALE)."""
    if found_inf is None:
        if scale is not None:
            raise ValueError("multi_tensor: a loss scale needs a found_inf flag to record overflows in")
        return dict(guarded=False, unscale=False), (ticket, ticket)
    if ticket.size < 3:
        raise ValueError("multi_tensor: the ticket array needs 3 words (ticket, barrier count, barrier generation)")
    return dict(guarded=True, unscale=scale is not None), (found_inf if scale is None else scale, found_inf)


def adam_flat_step(p, g, m, v, vmax, hyper, steps, ticket, has_grad=None, vec_param=None, *,
                   amsgrad, maximize, decoupled, scale=None, found_inf=None, p_lowp=None):
    """One Adam/AdamW step over flat buffers (one launch).  ``has_grad``/``vec_param`` given: the masked
    variant (parameters without a gradient are skipped, each parameter uses its own step count);
    otherwise every parameter has a gradient and all step counts are equal (steps[0] is read).
    ``found_inf`` ((1,) float32): skip the step on the device when it is non-zero; with ``scale`` ((1,) float32)
    the launch first sets it from its own inf/NaN check and updates with g / scale (GradScaler).
    ``p_lowp`` (master weights): g and p_lowp are float16/bfloat16, p and the state float32; the launch writes
    the updated p, rounded, into p_lowp."""
    masked = has_grad is not None
    amp_flags, amp = _amp_args(ticket, scale, found_inf)
    k = _kernel("adam", p.dtype, amsgrad=amsgrad, maximize=maximize, decoupled=decoupled, masked=masked,
                **amp_flags, **_master_flags(p, g, p_lowp))
    _launch(k, p, (p, g, m, v, vmax if amsgrad else m, hyper, steps, has_grad if masked else ticket,
                   vec_param if masked else ticket, np.int32(steps.size), ticket) + amp
            + (p_lowp if p_lowp is not None else ticket,), amp_flags["unscale"])


def sgd_flat_step(p, g, buf, hyper, steps, ticket, has_grad=None, vec_param=None, *, nesterov, maximize,
                  scale=None, found_inf=None, p_lowp=None):
    """One SGD step over flat buffers (one launch); ``buf`` None means momentum == 0.  ``scale``/``found_inf``
    as in adam_flat_step."""
    masked = has_grad is not None
    momentum = buf is not None
    amp_flags, amp = _amp_args(ticket, scale, found_inf)
    k = _kernel("sgd", p.dtype, momentum=momentum, nesterov=nesterov and momentum, maximize=maximize,
                masked=masked, **amp_flags, **_master_flags(p, g, p_lowp))
    _launch(k, p, (p, g, buf if momentum else p, hyper, steps, has_grad if masked else ticket,
                   vec_param if masked else ticket, np.int32(steps.size), ticket) + amp
            + (p_lowp if p_lowp is not None else ticket,), amp_flags["unscale"])
