"""2-D max and average pooling on the GPU, forward and backward (global average pooling is the window = input case).

Shape legend (channels-first indices, any strides: NCHW or channels-last memory, even broadcast inputs):
    x, dx: (N, C, H, W)      y, dy, argmax: (N, C, OH, OW)      window (KH, KW), padding (PH, PW), stride (SH, SW),
    dilation (DH, DW) (max modes);  argmax = the winning tap kh * KW + kw of each window (uint8, or uint16 > 256 taps)
Outputs (y, argmax, dx) are allocated in the memory order of the input that decides it (x forward, dy backward):
CL = 1 means channels-last, and the linear thread index then walks (n, h, w, c) so consecutive threads touch
consecutive channels; CL = 0 walks (n, c, h, w).  Either way the writes are coalesced.

Tiling: one thread per OUTPUT element in forward -- it visits the real taps of its window in row-major order
(padding is never read: it counts as -inf / is excluded), keeping the first maximum (a NaN wins, as the reference)
and its tap, or the sum divided by the window's count (INCLUDE: clipped to the padded input, EXCLUDE: to the real
input); one thread per INPUT element in backward -- it gathers, tap by tap, the outputs whose window holds it
(oh = (h + PH - kh*DH) / SH when divisible) and adds dy where argmax == tap (max) or dy / count (average): a fixed
order, no atomics, so MAX and MAX_DETERMINISTIC are the same bits.  A grid-stride loop covers any size.
Traffic: forward reads x once (overlapping windows through L1/L2) and writes y (+ 1 byte argmax); backward reads dy
and argmax about (K/S)^2 times through the cache and writes dx once.
"""
from __future__ import annotations

import math

import numpy as np

from .. import devices as _dev
from . import launch as _launch
from .bn_kernels import STORAGE_HEADER, _divider, type_info

__all__ = ["supports", "forward", "backward", "SOURCE"]

THREADS = 256

SOURCE = STORAGE_HEADER + r"""
typedef ARGT ARG;

// The geometry travels as 14 int arguments (no struct: plain scalars are what every CuPy passes reliably).
#define GEO_ARGS const int N, const int C, const int H, const int W, const int OH, const int OW, const int KH, \
                 const int KW, const int PH, const int PW, const int SH, const int SW, const int DH, const int DW
struct Geo { int N, C, H, W, OH, OW, KH, KW, PH, PW, SH, SW, DH, DW; };
#define MAKE_GEO const Geo g = {N, C, H, W, OH, OW, KH, KW, PH, PW, SH, SW, DH, DW};

// n / d for 0 <= n < 2^31 by multiply-high and shift ((mul, shift) from the host: bn_kernels._divider)
__device__ __forceinline__ unsigned int fast_div(unsigned int n, unsigned int mul, unsigned int shr)
{
    return (__umulhi(n, mul) + n) >> shr;
}

// (n, c, h, w) of linear index i of an (N, C, H, W) array laid out NCHW (CL 0) or NHWC (CL 1); the three divisors
// (the inner three dims in memory order) come as fast dividers: no hardware division in the index math.
#define DIV_ARGS const unsigned int d0m, const unsigned int d0s, const unsigned int d1m, const unsigned int d1s, \
                 const unsigned int d2m, const unsigned int d2s
__device__ __forceinline__ void unravel(unsigned int i, int C, int H, int W, int& n, int& c, int& h, int& w,
                                        unsigned int d0m, unsigned int d0s, unsigned int d1m, unsigned int d1s,
                                        unsigned int d2m, unsigned int d2s)
{
    unsigned int q;
#if CL
    q = fast_div(i, d0m, d0s); c = (int)(i - q * C); i = q;
    q = fast_div(i, d1m, d1s); w = (int)(i - q * W); i = q;
    q = fast_div(i, d2m, d2s); h = (int)(i - q * H); n = (int)q;
#else
    q = fast_div(i, d0m, d0s); w = (int)(i - q * W); i = q;
    q = fast_div(i, d1m, d1s); h = (int)(i - q * H); i = q;
    q = fast_div(i, d2m, d2s); c = (int)(i - q * C); n = (int)q;
#endif
}

__device__ __forceinline__ long long lin(int n, int c, int h, int w, int C, int H, int W)
{
#if CL
    return (((long long)n * H + h) * W + w) * C + c;
#else
    return (((long long)n * C + c) * H + h) * W + w;
#endif
}

// Elements of the window starting at s0 (size K) counted: INCLUDE -> clipped to [-P, L + P), else to [0, L).
__device__ __forceinline__ int window_count(int s0, int K, int L, int P)
{
#if INCLUDE_PAD
    return min(s0 + K, L + P) - s0;
#else
    return min(s0 + K, L) - max(s0, 0);
#endif
}

extern "C" __global__ void __launch_bounds__(256)
pool_fwd(const T* __restrict__ x, T* __restrict__ y, ARG* __restrict__ argmax, GEO_ARGS,
         const long long xsn, const long long xsc, const long long xsh, const long long xsw, DIV_ARGS)
{
    MAKE_GEO
    const unsigned int total = (unsigned int)g.N * g.C * g.OH * g.OW;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int n, c, oh, ow;
        unravel(i, g.C, g.OH, g.OW, n, c, oh, ow, d0m, d0s, d1m, d1s, d2m, d2s);
        const int h0 = oh * g.SH - g.PH, w0 = ow * g.SW - g.PW;
        const T* xb = x + n * xsn + c * xsc;
#if IS_MAX
        A best = 0; int arg = -1;
        for (int kh = 0; kh < g.KH; ++kh) {
            const int h = h0 + kh * g.DH;
            if (h < 0 || h >= g.H) continue;
            for (int kw = 0; kw < g.KW; ++kw) {
                const int w = w0 + kw * g.DW;
                if (w < 0 || w >= g.W) continue;
                const A v = LD(xb[h * xsh + w * xsw]);
                if (arg < 0 || v > best || (v != v && best == best)) { best = v; arg = kh * g.KW + kw; }
            }
        }
        y[i] = ST(best);
        argmax[i] = (ARG)arg;
#else
        A s = 0;
        for (int kh = 0; kh < g.KH; ++kh) {
            const int h = h0 + kh;
            if (h < 0 || h >= g.H) continue;
            for (int kw = 0; kw < g.KW; ++kw) {
                const int w = w0 + kw;
                if (w < 0 || w >= g.W) continue;
                s += LD(xb[h * xsh + w * xsw]);
            }
        }
        const A count = (A)(window_count(h0, g.KH, g.H, g.PH) * window_count(w0, g.KW, g.W, g.PW));
        y[i] = ST(s / count);
#endif
    }
}

extern "C" __global__ void __launch_bounds__(256)
pool_bwd(const T* __restrict__ dy, const ARG* __restrict__ argmax, T* __restrict__ dx, GEO_ARGS,
         const long long dsn, const long long dsc, const long long dsh, const long long dsw,
         const long long asn, const long long asc, const long long ash, const long long asw, DIV_ARGS)
{
    MAKE_GEO
    const unsigned int total = (unsigned int)g.N * g.C * g.H * g.W;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int n, c, h, w;
        unravel(i, g.C, g.H, g.W, n, c, h, w, d0m, d0s, d1m, d1s, d2m, d2s);
        const T* db = dy + n * dsn + c * dsc;
        A s = 0;
        for (int kh = 0; kh < g.KH; ++kh) {
            const int th = h + g.PH - kh * g.DH;
            if (th < 0 || th % g.SH) continue;
            const int oh = th / g.SH;
            if (oh >= g.OH) continue;
            for (int kw = 0; kw < g.KW; ++kw) {
                const int tw = w + g.PW - kw * g.DW;
                if (tw < 0 || tw % g.SW) continue;
                const int ow = tw / g.SW;
                if (ow >= g.OW) continue;
#if IS_MAX
                if ((int)argmax[n * asn + c * asc + oh * ash + ow * asw] == kh * g.KW + kw)
                    s += LD(db[oh * dsh + ow * dsw]);
#else
                const int count = window_count(oh * g.SH - g.PH, g.KH, g.H, g.PH)
                                * window_count(ow * g.SW - g.PW, g.KW, g.W, g.PW);
                s += LD(db[oh * dsh + ow * dsw]) / (A)count;
#endif
            }
        }
        dx[i] = ST(s);
    }
}
"""

_ARG = {np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short"}
_INT_MAX = 2 ** 31 - 1


_kernel_cache: dict = {}


def _kernel(name, dtype, arg_dtype, cl, is_max, include_pad):
    key = (name, dtype, arg_dtype, cl, is_max, include_pad)
    k = _kernel_cache.get(key)
    if k is None:
        k = _kernel_cache[key] = _kernel_compiled(name, dtype, arg_dtype, cl, is_max, include_pad)
    return k


def _kernel_compiled(name, dtype, arg_dtype, cl, is_max, include_pad):
    scalar, accum, storage, _ = type_info(dtype)
    opts = (f"-DSCALAR={scalar}", f"-DACCUM={accum}", f"-DSTORAGE={storage}", f"-DARGT={_ARG[np.dtype(arg_dtype)]}",
            f"-DCL={int(cl)}",
            f"-DIS_MAX={int(is_max)}", f"-DINCLUDE_PAD={int(include_pad)}", "-std=c++14")
    return _launch.get_kernel(SOURCE, name, opts)


def is_channels_last(a) -> bool:
    """Channels-last memory (N, H, W, C contiguous) of a 4-D channels-first view (C > 1, H*W > 1)."""
    return (not a.flags.c_contiguous) and a.transpose(0, 2, 3, 1).flags.c_contiguous


def supports(geom, xc, *others) -> bool:
    """2-D pooling of float32/float64/float16/bfloat16 CuPy arrays under 2**31 elements, fewer than 65536 taps."""
    return (_dev.is_cuda_array(xc) and xc.ndim == 4 and type_info(xc.dtype) is not None and xc.size > 0
            and 0 < xc.size <= _INT_MAX and math.prod(geom.y_shape) <= _INT_MAX
            and math.prod(geom.window) <= 65536
            and all(o is None or (_dev.is_cuda_array(o) and o.dtype.itemsize and all(
                s % o.itemsize == 0 for s in o.strides)) for o in others)
            and all(s % xc.itemsize == 0 for s in xc.strides))


def arg_dtype(geom):
    return np.min_scalar_type(math.prod(geom.window) - 1) if math.prod(geom.window) > 1 else np.dtype(np.uint8)


def _geo(geom, n, c):
    (h, w), (oh, ow) = geom.spatial, geom.out_sizes
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = geom.window, geom.padding, geom.stride, geom.dilation
    return tuple(np.int32(v) for v in (n, c, h, w, oh, ow, kh, kw, ph, pw, sh, sw, dh, dw))


def _dividers(c, h, w, cl):
    order = (c, w, h) if cl else (w, h, c)
    return tuple(v for d in order for v in _divider(d))


def _strides(a):
    return tuple(np.int64(s // a.itemsize) for s in a.strides)


def _empty(cp, shape, dtype, cl):
    if not cl:
        return cp.empty(shape, dtype=dtype)
    n, c, h, w = shape
    return cp.empty((n, h, w, c), dtype=dtype).transpose(0, 3, 1, 2)


def _grid(total, dev):
    return (max(1, min((total + THREADS - 1) // THREADS, _launch.sm_count(dev) * 16)),)


def forward(geom, xc):
    """(y, argmax or None) as channels-first views in x's memory order (channels-last stays channels-last)."""
    cp = _launch.cupy()
    cl = is_channels_last(xc)
    is_max = geom.mode.is_max
    adt = arg_dtype(geom)
    n, c = xc.shape[:2]
    dev = xc.data.device_id
    with cp.cuda.Device(dev):
        y = _empty(cp, geom.y_shape, xc.dtype, cl)
        argmax = _empty(cp, geom.y_shape, adt, cl) if is_max else None
        k = _kernel("pool_fwd", xc.dtype, adt, cl, is_max, geom.mode.name == "AVERAGE_COUNT_INCLUDE_PADDING")
        _launch.launch(k, _grid(y.size, dev), (THREADS,),
                       (xc, y, y if argmax is None else argmax, *_geo(geom, n, c), *_strides(xc),
                        *_dividers(c, *geom.out_sizes, cl)))
    return y, argmax


def backward(geom, dyc, argmax_c, x_shape, dtype, x_channels_last=False):
    """dx (channels-first view, in dy's memory order; in x's when dy's spatial size is 1 and its order ambiguous)
    from dy and, for max modes, the forward's argmax."""
    cp = _launch.cupy()
    cl = is_channels_last(dyc) if dyc.shape[2] * dyc.shape[3] > 1 else bool(x_channels_last)
    is_max = geom.mode.is_max
    n, c = x_shape[:2]
    dev = dyc.data.device_id
    adt = argmax_c.dtype if is_max else np.dtype(np.uint8)
    with cp.cuda.Device(dev):
        dx = _empty(cp, tuple(x_shape), dtype, cl)
        k = _kernel("pool_bwd", dtype, adt, cl, is_max, geom.mode.name == "AVERAGE_COUNT_INCLUDE_PADDING")
        arg = argmax_c if is_max else dyc
        _launch.launch(k, _grid(dx.size, dev), (THREADS,),
                       (dyc, arg, dx, *_geo(geom, n, c), *_strides(dyc), *_strides(arg),
                        *_dividers(c, *x_shape[2:], cl)))
    return dx
