"""Softmax cross-entropy with class-index targets on the GPU: log-softmax + NLL forward in one launch, backward in one.

Shape legend: x, dx (N, C, *d) viewed as (N, C, inner) with inner = prod(d), C-contiguous; target (N, *d) int32/int64;
weight (C,) (optional, x's dtype); lse (N, *d) in A (the row's log-sum-exp, saved for backward); loss () for
'mean'/'sum', (N, *d) for 'none'; denom () in A = sum of weight[target] over rows whose target != ignore_index
(the 'mean' denominator, kept on the device: no host read anywhere).  A = float for float32 data, double for float64;
float16/bfloat16 logits (and weights) are loaded into float (LD/ST of bn_kernels' STORAGE_HEADER), lse and denom float.
Per row (n, i): q_c = (1 - eps) * w[t] * [c == t] + eps / C * w_c (0 when t == ignore_index), and
    loss = -sum_c q_c * (x_c - lse) = -((1 - eps) * w[t] * (x_t - lse) + eps / C * (sum_c w_c x_c - lse * sum_c w_c))
    dx_c = (softmax_c * sum_c q_c - q_c) * g      (g = dloss, / denom for 'mean'; ignored rows get 0)
Tiling: one warp per row (8 rows per 256-thread block, grid-stride over the rows); lane l takes classes l, l + 32, ...;
shuffle reductions for the max, sum exp(x - max) and the smoothing sums.  'mean'/'sum': each warp keeps its rows'
loss and weight sums, the block adds its 8 warps in order and writes one partial; the LAST block (threadfence +
ticket, reset by that block) adds the partials in block order and writes loss and denom -- deterministic, one launch.
A target outside [0, C) that is not ignore_index makes that row's loss (and gradient) NaN: the device cannot raise,
and a host check would be a synchronisation in every step.
"""
from __future__ import annotations

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from . import workspace as _ws
from .bn_kernels import STORAGE_HEADER, type_info
from .softmax_kernels import WARP_REDUCE

__all__ = ["supports", "forward", "backward", "SOURCE"]

THREADS = 256
_REDUCTION = {"none": 0, "mean": 1, "sum": 2}

SOURCE = STORAGE_HEADER + WARP_REDUCE + r"""
typedef INDEX I;
#define NEG_INF (-(A)__int_as_float(0x7f800000))

// The row's max, log-sum-exp and, for smoothing, sum_c w_c x_c and sum_c w_c (every lane gets them).
__device__ __forceinline__ void row_stats(const T* xr, const T* w, int C, int inner, int lane,
                                          A& lse, A& swx, A& sw, const bool smooth)
{
    A m = NEG_INF;
    for (int c = lane; c < C; c += 32) { const A v = LD(xr[(long long)c * inner]); m = (v > m || v != v) ? v : m; }
    m = warp_max(m);
    const A shift = m == NEG_INF ? (A)0 : m;
    A s = 0, a = 0, b = 0;
    for (int c = lane; c < C; c += 32) {
        const A v = LD(xr[(long long)c * inner]);
        s += exp(v - shift);
        if (smooth) { const A wc = HAS_W ? LD(w[c]) : (A)1; a += wc * v; b += wc; }
    }
    s = warp_sum(s);
    lse = shift + log(s);
    if (smooth) { swx = warp_sum(a); sw = warp_sum(b); } else { swx = 0; sw = 0; }
}

extern "C" __global__ void __launch_bounds__(256)
ce_fwd(const T* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, T* __restrict__ loss_rows,
       A* __restrict__ lse_out, A* __restrict__ partial, unsigned int* ticket, T* __restrict__ loss_out,
       A* __restrict__ denom_out, const long long rows, const int C, const int inner, const long long ignore_index,
       const double eps)
{
    __shared__ A warp_loss[8], warp_den[8];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool smooth = eps != 0.0;
    A acc_loss = 0, acc_den = 0;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((long long)gridDim.x * blockDim.x) >> 5) {
        const long long o = r / inner, i = r - o * inner;
        const T* xr = x + o * C * (long long)inner + i;
        A lse, swx, sw;
        row_stats(xr, w, C, inner, lane, lse, swx, sw, smooth);
        const long long t = (long long)target[r];
        const bool valid = t != ignore_index, in_range = t >= 0 && t < C;
        A per = 0, wt = 0;
        if (valid) {
            if (in_range) {
                wt = HAS_W ? LD(w[t]) : (A)1;
                per = -((A)(1.0 - eps) * wt * (LD(xr[t * inner]) - lse));
                if (smooth) per -= (A)(eps / C) * (swx - lse * sw);
            } else {
                per = wt = __int_as_float(0x7fffffff);      // NaN: a bad class index
            }
        }
        if (lane == 0) {
            lse_out[r] = lse;
            if (REDUCTION == 0) loss_rows[r] = ST(per);
        }
        acc_loss += per; acc_den += wt;
    }
    if (lane == 0) { warp_loss[warp] = acc_loss; warp_den[warp] = acc_den; }
    __syncthreads();
    if (threadIdx.x == 0) {
        A bl = 0, bd = 0;
        for (int k = 0; k < 8; ++k) { bl += warp_loss[k]; bd += warp_den[k]; }
        partial[2 * blockIdx.x] = bl; partial[2 * blockIdx.x + 1] = bd;
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        __threadfence();
        double tl = 0, td = 0;
        for (int b = 0; b < gridDim.x; ++b) { tl += (double)partial[2 * b]; td += (double)partial[2 * b + 1]; }
        denom_out[0] = (A)td;
        if (REDUCTION == 1) loss_out[0] = ST((A)(tl / td));
        if (REDUCTION == 2) loss_out[0] = ST((A)tl);
        *ticket = 0u;
    }
}

extern "C" __global__ void __launch_bounds__(256)
ce_bwd(const T* __restrict__ x, const I* __restrict__ target, const T* __restrict__ w, const A* __restrict__ lse_in,
       const T* __restrict__ g, const A* __restrict__ denom, T* __restrict__ dx, const long long rows, const int C,
       const int inner, const long long ignore_index, const double eps)
{
    const int lane = threadIdx.x & 31;
    const bool smooth = eps != 0.0;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
         r += ((long long)gridDim.x * blockDim.x) >> 5) {
        const long long o = r / inner, i = r - o * inner;
        const long long base = o * C * (long long)inner + i;
        const long long t = (long long)target[r];
        if (t == ignore_index) {
            for (int c = lane; c < C; c += 32) dx[base + (long long)c * inner] = ST((A)0);
            continue;
        }
        A gr = LD(g[REDUCTION == 0 ? r : 0]);
        if (REDUCTION == 1) gr /= denom[0];
        const bool in_range = t >= 0 && t < C;
        const A wt = in_range ? (HAS_W ? LD(w[t]) : (A)1) : (A)__int_as_float(0x7fffffff);
        A sw = (A)C;
        if (smooth && HAS_W) {
            A b = 0;
            for (int c = lane; c < C; c += 32) b += LD(w[c]);
            sw = warp_sum(b);
        }
        const A sumq = (A)(1.0 - eps) * wt + (smooth ? (A)(eps / C) * sw : (A)0);
        const A sumqg = sumq != (A)0 ? sumq * gr : (A)0;
        const A lse = lse_in[r];
        for (int c = lane; c < C; c += 32) {
            const long long a = base + (long long)c * inner;
            A q = (c == t) ? (A)(1.0 - eps) * wt : (A)0;
            if (smooth) q += (A)(eps / C) * (HAS_W ? LD(w[c]) : (A)1);
            const A qg = q != (A)0 ? q * gr : (A)0;
            dx[a] = ST(exp(LD(x[a]) - lse) * sumqg - qg);
        }
    }
}
"""

_INDEX = {np.dtype(np.int64): "long long", np.dtype(np.int32): "int"}
_INT_MAX = 2 ** 31 - 1
_tickets: dict = {}


def supports(x, target, weight) -> bool:
    """Class-index targets: float32/float64 C-contiguous CuPy logits (N, C, *d), int32/int64 contiguous targets,
    weight None or (C,) contiguous in x's dtype."""
    return (_dev.is_cuda_array(x) and type_info(x.dtype) is not None and x.ndim >= 2 and 0 < x.size <= _INT_MAX
            and x.flags.c_contiguous and _dev.is_cuda_array(target) and np.dtype(target.dtype) in _INDEX
            and target.flags.c_contiguous and target.size * x.shape[1] == x.size
            and (weight is None or (_dev.is_cuda_array(weight) and weight.dtype == x.dtype
                                    and weight.flags.c_contiguous and weight.size == x.shape[1])))


_kernel_cache: dict = {}


def _kernel(name, x, target, weight, reduction):
    key = (name, x.dtype, target.dtype, weight is None, reduction)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _kernel_compiled(name, x, target, weight, reduction)
    return k


def _kernel_compiled(name, x, target, weight, reduction):
    scalar, accum, storage, _ = type_info(x.dtype)
    return _launch.get_kernel(SOURCE, name, (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}",
                                             f"-DINDEX={_INDEX[np.dtype(target.dtype)]}",
                                             f"-DHAS_W={int(weight is not None)}",
                                             f"-DREDUCTION={_REDUCTION[reduction]}", "-std=c++14"))


def _grid(rows, dev):
    return max(1, min((rows + 7) // 8, _launch.sm_count(dev) * 8))


def _ticket(cp, dev):
    return _ws.kept_zeroed(_tickets, cp, 1, dev, 1)


# ---- plans: kernel, grid, packed scalars and output shapes once per call signature -------------------------------
_plans: dict = {}


class _Plan:
    __slots__ = ("dev", "go", "tshape", "acc", "dtype", "grid", "none", "xshape")


def _plan(name, x, target, weight, ignore_index, eps, reduction, dev):
    n, c = x.shape[:2]
    inner = x.size // (n * c)
    rows = n * inner
    p = _Plan()
    p.dev, p.tshape, p.xshape, p.dtype, p.none = dev, target.shape, x.shape, x.dtype, reduction == "none"
    p.acc = np.dtype(np.float64 if x.dtype == np.float64 else np.float32)
    p.grid = _grid(rows, dev)
    k = _kernel(name, x, target, weight, reduction)
    tail = [np.int64(rows), np.int32(c), np.int32(inner), np.int64(ignore_index), np.float64(eps)]
    p.go = _launch.prepare(k, (p.grid,), (THREADS,), [None] * (9 if name == "ce_fwd" else 7) + tail)
    return p


def _key(name, x, target, weight, ignore_index, eps, reduction):
    return (name, x.shape, x.dtype, target.shape, target.dtype, weight is None, ignore_index, eps, reduction,
            x.data.device_id)


def forward(x, target, weight, ignore_index, eps, reduction):
    """-> (loss, lse, denom) as described in the legend."""
    p = _launch.planned(_plans, _key("ce_fwd", x, target, weight, ignore_index, eps, reduction), _plan,
                        "ce_fwd", x, target, weight, ignore_index, eps, reduction, x.data.device_id)
    cp = _launch._cp
    with _launch.on_device(p.dev):
        lse = cp.empty(p.tshape, dtype=p.acc)
        loss_rows = cp.empty(p.tshape, dtype=p.dtype) if p.none else None
        loss = cp.empty((), dtype=p.dtype)
        denom = cp.empty((), dtype=p.acc)
        partial = cp.empty((2 * p.grid,), dtype=p.acc)
        p.go(x, target, x if weight is None else weight, loss if loss_rows is None else loss_rows, lse, partial,
             _ticket(cp, p.dev), loss, denom)
    return (loss if loss_rows is None else loss_rows), lse, denom


def backward(x, target, weight, lse, denom, g, ignore_index, eps, reduction):
    """dx for the incoming gradient ``g`` (shape () for 'mean'/'sum', target's shape for 'none')."""
    p = _launch.planned(_plans, _key("ce_bwd", x, target, weight, ignore_index, eps, reduction), _plan,
                        "ce_bwd", x, target, weight, ignore_index, eps, reduction, x.data.device_id)
    cp = _launch._cp
    with _launch.on_device(p.dev):
        dx = cp.empty(p.xshape, dtype=p.dtype)
        if g.dtype != p.dtype or not g.flags.c_contiguous:
            g = cp.ascontiguousarray(g, dtype=p.dtype)
        p.go(x, target, x if weight is None else weight, lse, g, denom, dx)
    return dx
