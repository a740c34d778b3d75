"""Convolution algorithms beside the GEMM reference (conv_gemm.py), and their registration.

# x: (N, C, H, W)  w: (K, C/G, R, S)  y: (N, K, P, Q)        (channels-first; 1-D/3-D alike where supported)

DIRECT            a loop over the R*S (*T) kernel taps; each tap is one strided slice of x times one
                  (C/G, K/G) block of w per group, accumulated into y.  No im2col matrix, no padded copy:
                  the slices skip the padding.  Backward data adds into strided slices of dx, backward
                  filter computes one w tap per iteration.
FFT               cross-correlation is a pointwise product in frequency space: rfftn of padded x and of
                  the (zero-dilated) kernel, a complex matrix product over channels at every frequency,
                  irfftn, crop.  Stride 1 only.  Backward data = full convolution (no conjugate),
                  backward filter = correlation of x with dy.
WINOGRAD_NONFUSED Lavin & Gray's F(2x2, 3x3): 4x4 input tiles (stride 2) transformed by B^T d B, filters by
                  G g G^T, 16 independent channel GEMMs (one per transformed position), output tiles by
                  A^T m A: 16 multiplies per 2x2 outputs instead of 36.  "Non-fused": each stage is its own
                  array operation with its own buffers, as in cuDNN's WINOGRAD_NONFUSED.
Every algorithm computes cross-correlation on channels-first arrays; convolution.py handles the mode
(flipping w) and the layout before and after.  None uses atomics: all are deterministic on CPU and GPU.
"""
from __future__ import annotations

import math

import numpy as np

from ._common import pad_axes
from .algorithm_selection import AlgorithmRegistry
from .blas import grouped_gram, grouped_matmul, matmul
from .conv_gemm import data_weights, forward_weights, gemm_backward_data, gemm_backward_filter, gemm_forward, to_rows
from .conv_problem import ConvProblem
from .devices import array_module
from .errors import IdentityEnum

__all__ = ["ConvolutionFwdAlgo", "ConvolutionBwdDataAlgo", "ConvolutionBwdFilterAlgo", "ConvAlgorithm",
           "FORWARD_ALGORITHMS", "BACKWARD_DATA_ALGORITHMS", "BACKWARD_FILTER_ALGORITHMS"]


class ConvolutionFwdAlgo(IdentityEnum):
    """cuDNN's cudnnConvolutionFwdAlgo_t (same values).  See docs/backend_convolution.md for what each maps to."""
    IMPLICIT_GEMM = 0
    IMPLICIT_PRECOMP_GEMM = 1
    GEMM = 2
    DIRECT = 3
    FFT = 4
    FFT_TILING = 5
    WINOGRAD = 6
    WINOGRAD_NONFUSED = 7


class ConvolutionBwdDataAlgo(IdentityEnum):
    """cuDNN's cudnnConvolutionBwdDataAlgo_t: ALGO_0 = tap loop (DIRECT), ALGO_1 = GEMM + col2im."""
    ALGO_0 = 0
    ALGO_1 = 1
    FFT = 2
    FFT_TILING = 3
    WINOGRAD = 4
    WINOGRAD_NONFUSED = 5


class ConvolutionBwdFilterAlgo(IdentityEnum):
    """cuDNN's cudnnConvolutionBwdFilterAlgo_t: ALGO_0 = tap loop (DIRECT), ALGO_1 = im2col GEMM."""
    ALGO_0 = 0
    ALGO_1 = 1
    FFT = 2
    ALGO_3 = 3
    WINOGRAD_NONFUSED = 5
    FFT_TILING = 6


# ---- DIRECT: the tap loop ---------------------------------------------------------------------------------

def _channels_last(a):
    """(N, C, *S) -> (N, *S, C) contiguous (free when a is an NHWC array)."""
    return to_rows(a).reshape(a.shape[0], *a.shape[2:], a.shape[1])


def _channels_first(a_cl):
    return array_module(a_cl).moveaxis(a_cl, -1, 1)


def _tap_rows(a_cl, slices):
    """The pixels one tap touches, as rows: a_cl[:, *slices, :] -> (M, C) and the (N, *s, C) shape."""
    part = a_cl[(slice(None), *slices)]
    return part.reshape(-1, part.shape[-1]), part.shape


def _w_tap(w, tap):
    return w[(slice(None), slice(None), *tap)]          # (K, C/G)


def _tap_accumulate(src, out_spatial, out_channels, block, reads_x_side, p: ConvProblem, tf32):
    """The DIRECT loop of forward and backward data: for every tap, the pixels ``src`` contributes
    through that tap, times the tap's weight block, added into the matching strided slice of the output.

    Forward reads x at the tap's x-slices and writes y at its y-slices; backward data reads dy at the
    y-slices and writes dx at the x-slices (``reads_x_side`` False).  Each ``+=`` is one array operation
    over all images and pixels; slices of one tap never overlap, so no atomics are needed.
    """
    src_cl = _channels_last(src)
    out_cl = array_module(src).zeros((p.N, *out_spatial, out_channels), dtype=src.dtype)
    for tap, xs, ys in p.taps():
        read, write = (xs, ys) if reads_x_side else (ys, xs)
        rows, shape = _tap_rows(src_cl, read)
        out_cl[(slice(None), *write)] += grouped_matmul(rows, block(tap), tf32).reshape(*shape[:-1], out_channels)
    return _channels_first(out_cl)


def direct_forward(p: ConvProblem, x, w, tf32=False):
    return _tap_accumulate(x, p.out_size, p.K, lambda tap: forward_weights(_w_tap(w, tap), p.groups), True, p, tf32)


def direct_backward_data(p: ConvProblem, w, dy, tf32=False):
    return _tap_accumulate(dy, p.in_size, p.C, lambda tap: data_weights(_w_tap(w, tap), p.groups), False, p, tf32)


def direct_backward_filter(p: ConvProblem, x, dy, tf32=False):
    xp = array_module(x)
    x_cl, dy_cl = _channels_last(x), _channels_last(dy)
    dw = xp.zeros(p.w_shape, dtype=x.dtype)
    for tap, xs, ys in p.taps():
        dy_rows, _ = _tap_rows(dy_cl, ys)
        x_rows, _ = _tap_rows(x_cl, xs)
        dw[(slice(None), slice(None), *tap)] = grouped_gram(dy_rows, x_rows, p.groups, tf32).reshape(p.K, p.Cg)
    return dw


# ---- FFT ----------------------------------------------------------------------------------------------

def _fast_length(n: int) -> int:
    """The smallest 5-smooth integer >= n: FFT libraries are fastest on products of 2, 3 and 5."""
    best = 1 << (n - 1).bit_length()              # a power of two >= n
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def _fft_lengths(p: ConvProblem):
    # Linear (not circular) correlation needs length >= padded input; nothing wraps around then.
    return tuple(_fast_length(n) for n in p.padded_size)


def _dilated_kernel(w, p: ConvProblem):
    """w with (dilation - 1) zeros inserted between taps: dilation becomes an ordinary kernel."""
    if all(d == 1 for d in p.dilation):
        return w
    wd = array_module(w).zeros((p.K, p.Cg, *p.dilated_kernel), dtype=w.dtype)
    wd[(slice(None), slice(None), *(slice(None, None, d) for d in p.dilation))] = w
    return wd


def _spectrum(a, lengths):
    nd = len(lengths)
    return array_module(a).fft.rfftn(a, s=lengths, axes=tuple(range(2, 2 + nd)))


def _signal(spec, lengths):
    nd = len(lengths)
    return array_module(spec).fft.irfftn(spec, s=lengths, axes=tuple(range(2, 2 + nd)))


def _freq_major(spec, groups):
    """(B, G*J, *F) -> (F, G, B, J): a stack of per-frequency, per-group matrices for one batched matmul."""
    B, GJ = spec.shape[:2]
    return spec.reshape(B, groups, GJ // groups, -1).transpose(3, 1, 0, 2)


def _filter_freq_major(spec, groups):
    """(K, C/G, *F) -> (F, G, K/G, C/G): the kernel spectra as per-frequency, per-group matrices."""
    K, Cg = spec.shape[:2]
    return spec.reshape(groups, K // groups, Cg, -1).transpose(3, 0, 1, 2)


def _from_freq_major(m, fshape):
    """(F, G, B, J) -> (B, G*J, *F)."""
    F, G, B, J = m.shape
    return m.transpose(2, 1, 3, 0).reshape(B, G * J, *fshape)


def _crop(a, starts, sizes, steps=None):
    steps = steps or (1,) * len(sizes)
    return a[(slice(None), slice(None),
              *(slice(s, s + (n - 1) * st + 1, st) for s, n, st in zip(starts, sizes, steps)))]


def fft_forward(p: ConvProblem, x, w, tf32=False):
    L = _fft_lengths(p)
    X = _spectrum(pad_axes(array_module(x), x, range(2, 2 + p.nd), p.padding, p.padding), L)
    W = _filter_freq_major(_spectrum(_dilated_kernel(w, p), L), p.groups)             # (F, G, K/G, C/G)
    Y = matmul(_freq_major(X, p.groups), W.conj().swapaxes(-1, -2))            # sum over c of X conj(W)
    return _crop(_signal(_from_freq_major(Y, _spectrum_shape(L)), L), (0,) * p.nd, p.out_size)


def fft_backward_data(p: ConvProblem, w, dy, tf32=False):
    L = _fft_lengths(p)
    DY = _spectrum(dy, L)
    W = _filter_freq_major(_spectrum(_dilated_kernel(w, p), L), p.groups)             # (F, G, K/G, C/G)
    DX = matmul(_freq_major(DY, p.groups), W)                                  # full convolution: no conj
    return _crop(_signal(_from_freq_major(DX, _spectrum_shape(L)), L), p.padding, p.in_size)


def fft_backward_filter(p: ConvProblem, x, dy, tf32=False):
    L = _fft_lengths(p)
    X = _freq_major(_spectrum(pad_axes(array_module(x), x, range(2, 2 + p.nd), p.padding, p.padding), L),
                    p.groups)                                                  # (F, G, N, C/G)
    DY = _freq_major(_spectrum(dy, L), p.groups)                               # (F, G, N, K/G)
    DW = matmul(DY.conj().swapaxes(-1, -2), X)                                 # sum over n: (F, G, K/G, C/G)
    dwd = _signal(DW.transpose(1, 2, 3, 0).reshape(p.K, p.Cg, *_spectrum_shape(L)), L)
    return _crop(dwd, (0,) * p.nd, p.kernel, p.dilation)


def _spectrum_shape(L):
    return (*L[:-1], L[-1] // 2 + 1)


# ---- Winograd F(2x2, 3x3) ---------------------------------------------------------------------------------

# y = A^T [ (G g G^T) * (B^T d B) ] A  for a 4x4 input tile d, a 3x3 filter g, a 2x2 output tile y.
_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)


def _const(xp, m, dtype):
    return xp.asarray(m, dtype=dtype)


def _sandwich(m, t):
    """m @ t @ m^T over the last two axes of t: the 2-D transform of every tile at once."""
    return m @ t @ m.T


def _tiles_count(out_size):
    return tuple(-(-o // 2) for o in out_size)


def _winograd_input(x, padding, groups):
    """V = B^T d B for every 4x4 input tile (stride 2): (16, G, N*T, C/G), and the tile counts T."""
    xp = array_module(x)
    N, C, H, W = x.shape
    out = (H + 2 * padding[0] - 2, W + 2 * padding[1] - 2)
    T = _tiles_count(out)
    # pad (or crop, for negative padding) so the tiles exactly cover 2*T + 2 rows and columns
    before, after = padding, tuple(2 * t + 2 - i - q for t, i, q in zip(T, (H, W), padding))
    x = x[(slice(None), slice(None), *(slice(max(0, -b), n - max(0, -a)) for b, a, n in zip(before, after, (H, W))))]
    xpad = pad_axes(xp, x, (2, 3), [max(0, b) for b in before], [max(0, a) for a in after])
    sN, sC, sH, sW = xpad.strides
    tiles = xp.lib.stride_tricks.as_strided(xpad, shape=(N, C, *T, 4, 4),
                                            strides=(sN, sC, 2 * sH, 2 * sW, sH, sW))
    V = _sandwich(_const(xp, _BT, x.dtype), tiles)                              # (N, C, T0, T1, 4, 4)
    V = V.reshape(N, groups, C // groups, T[0] * T[1], 16).transpose(4, 1, 0, 3, 2)
    return V.reshape(16, groups, N * T[0] * T[1], C // groups), out, T


def _winograd_filter(w, groups):
    """U = G g G^T for every 3x3 filter: (16, G, C/G, K/G)."""
    xp = array_module(w)
    K, Cg = w.shape[:2]
    U = _sandwich(_const(xp, _G, w.dtype), w)                                  # (K, C/G, 4, 4)
    return U.reshape(groups, K // groups, Cg, 16).transpose(3, 0, 2, 1)


def _winograd_correlate(x, w, groups, padding, tf32):
    """3x3, stride-1 cross-correlation of x (N, C, H, W) with w (K, C/G, 3, 3); padding may be negative."""
    xp = array_module(x)
    N, K = x.shape[0], w.shape[0]
    V, out, T = _winograd_input(x, padding, groups)
    M = matmul(V, _winograd_filter(w, groups), tf32)                           # (16, G, N*T, K/G)
    M = M.reshape(4, 4, groups, N, T[0], T[1], K // groups).transpose(3, 2, 6, 4, 5, 0, 1)
    Y = _sandwich(_const(xp, _AT, x.dtype), M.reshape(N, K, T[0], T[1], 4, 4))  # (N, K, T0, T1, 2, 2)
    Y = Y.transpose(0, 1, 2, 4, 3, 5).reshape(N, K, 2 * T[0], 2 * T[1])
    return Y[:, :, :out[0], :out[1]]


def winograd_forward(p: ConvProblem, x, w, tf32=False):
    return _winograd_correlate(x, w, p.groups, p.padding, tf32)


def winograd_backward_data(p: ConvProblem, w, dy, tf32=False):
    # Stride 1: dx is the correlation of dy, padded by 2 - padding, with w flipped and its
    # channel roles swapped within each group: (K, C/G, 3, 3) -> (C, K/G, 3, 3).
    w_t = w.reshape(p.groups, p.Kg, p.Cg, 3, 3).transpose(0, 2, 1, 3, 4).reshape(p.C, p.Kg, 3, 3)
    return _winograd_correlate(dy, w_t[..., ::-1, ::-1], p.groups, tuple(2 - q for q in p.padding), tf32)


def winograd_backward_filter(p: ConvProblem, x, dy, tf32=False):
    # y = A^T (U * V) A, so dU = sum over tiles and images of (A dY A^T) * V, and dw = G^T dU G.
    xp = array_module(x)
    V, out, T = _winograd_input(x, p.padding, p.groups)                        # (16, G, N*T, C/G)
    dy = pad_axes(xp, dy, (2, 3), (0, 0), tuple(2 * t - o for t, o in zip(T, out)))
    tiles = dy.reshape(p.N, p.K, T[0], 2, T[1], 2).transpose(0, 1, 2, 4, 3, 5)
    dM = _sandwich(_const(xp, _AT.T, dy.dtype), tiles)                         # (N, K, T0, T1, 4, 4)
    dM = dM.reshape(p.N, p.groups, p.Kg, T[0] * T[1], 16).transpose(4, 1, 2, 0, 3)
    dU = matmul(dM.reshape(16, p.groups, p.Kg, -1), V, tf32)                   # (16, G, K/G, C/G)
    dU = dU.transpose(1, 2, 3, 0).reshape(p.K, p.Cg, 4, 4)
    return _sandwich(_const(xp, _G.T, x.dtype), dU)


# ---- registration ----------------------------------------------------------------------------------------

class ConvAlgorithm:
    """One registered algorithm: the run function, the rules of ``supports``, workspace and cost models.

    ``run`` None registers an enum member that minidnn does not implement (``note`` says why), so that
    asking for it raises NotSupportedError instead of silently running something else.
    """

    def __init__(self, algo, run=None, rules=(), workspace=None, cost=None, nondeterministic_on=(), note=""):
        self.algo, self._run, self.rules, self.note = algo, run, tuple(rules), note
        self._workspace, self._cost = workspace, cost
        self.nondeterministic_on = tuple(nondeterministic_on)
        self.fast_paths = []        # (description, applies(p, a, b), run): device-specific forms, tried first
        self.fast_costs = []        # cost(p, device_type) -> float, or None where that fast form does not apply
        self.native_half_runs = set()   # the fast forms that take float16/bfloat16 arrays as they are
        self.native_half = False    # the algorithm itself has half math (a CUDA kernel's run function)
        self.wide_out_runs = set()  # run functions taking ``out_dtype=float32`` for half data (see ``run``)
        self.devices = None         # device types it runs on (None: every one); e.g. ("cuda",) for a CUDA kernel

    def add_fast_path(self, description, applies, run, cost=None, native_half=False, wide_out=False):
        """Register a faster form of this same algorithm (e.g. conv_cpu.py's NumPy forms): ``run`` computes
        what the reference computes, and is used whenever ``applies(p, a, b)`` holds for the arrays given.
        ``cost(p, device_type)``, if given, is the heuristic's estimate where the fast form applies (else None).
        ``native_half``: ``run`` takes float16/bfloat16 arrays itself (a kernel with half math); otherwise half data
        reaches it as float32 (see ``runs_half_natively``).  ``wide_out``: ``run`` also takes ``out_dtype=float32``
        for float16/bfloat16 data and writes its float32 sums unrounded (the filter gradient's option)."""
        self.fast_paths.append((description, applies, run))
        if cost is not None:
            self.fast_costs.append(cost)
        if native_half:
            self.native_half_runs.add(run)
        if wide_out:
            self.wide_out_runs.add(run)

    def runs_half_natively(self, p: ConvProblem, a, b) -> bool:
        """Whether float16/bfloat16 ``a``, ``b`` go to this algorithm as they are: it has half math of its own
        (``native_half``), or the fast form that applies to them does.  Else they are computed in float32 and
        rounded once (cuDNN's float compute type for half data)."""
        if self.native_half:
            return True
        for _, applies, fast in self.fast_paths:
            if applies(p, a, b):
                return fast in self.native_half_runs
        return False

    def device_reason(self, device_type: str):
        """None if the algorithm runs on ``device_type``, else why not (a CUDA kernel on the CPU)."""
        if self.devices is None or device_type in self.devices:
            return None
        return f"not implemented in minidnn on {device_type} (a {'/'.join(self.devices)} kernel)"

    def __repr__(self):
        return f"ConvAlgorithm({self.algo})"

    def unsupported_reason(self, p: ConvProblem):
        if self._run is None:
            return f"not implemented in minidnn ({self.note})"
        for text, ok in self.rules:
            if not ok(p):
                return f"supports only {text}"
        return None

    def supports(self, p: ConvProblem, device_type: str | None = None) -> bool:
        """Whether it runs ``p`` (on ``device_type``; a device-restricted algorithm needs the device named)."""
        if self.devices is not None and device_type not in self.devices:
            return False
        return self.unsupported_reason(p) is None

    def workspace_size(self, p: ConvProblem) -> int:
        return int(self._workspace(p)) * p.itemsize

    def deterministic(self, device_type: str) -> bool:
        return device_type not in self.nondeterministic_on

    def estimated_cost(self, p: ConvProblem, device_type: str) -> float:
        for cost in self.fast_costs:
            c = cost(p, device_type)
            if c is not None:
                return float(c)
        return float(self._cost(p, device_type))

    def resolve(self, p: ConvProblem, a, b):
        """The run function ``run`` calls for these arrays: the first fast form that applies, else the algorithm's
        own (settled calls keep it: backend.convolution's nn fast path)."""
        for _, applies, fast in self.fast_paths:
            if applies(p, a, b):
                return fast
        return self._run

    def run(self, p: ConvProblem, a, b, tf32=False, out_dtype=None):
        """The result of ``p`` on ``a``, ``b`` in their dtype, or in ``out_dtype`` (float32 for float16/bfloat16
        data: autocast's filter gradients): a run function registered ``wide_out`` writes it directly, any other
        result is cast (one pass)."""
        for _, applies, fast in self.fast_paths:
            if applies(p, a, b):
                return self._call(fast, p, a, b, tf32, out_dtype)
        return self._call(self._run, p, a, b, tf32, out_dtype)

    def _call(self, fn, p, a, b, tf32, out_dtype):
        if out_dtype is None or out_dtype == a.dtype:
            return fn(p, a, b, tf32)
        if fn in self.wide_out_runs:
            return fn(p, a, b, tf32, out_dtype=out_dtype)
        return fn(p, a, b, tf32).astype(out_dtype)


# Workspace models, in elements of the data type (scratch memory beyond inputs and outputs) ...
def _ws_gemm(p):            # the im2col matrix (or dcols), plus the padded input copy
    return p.N * math.prod(p.out_size) * p.C * math.prod(p.kernel) + p.N * p.C * math.prod(p.padded_size)


def _ws_direct(p):          # one tap's rows of x and its product (at most one output in size), + layout copies
    return p.N * math.prod(p.out_size) * (p.C + p.K) + p.N * p.C * math.prod(p.in_size)


def _ws_fft(p):             # complex spectra of x, w and y (2 reals each), the padded input, the dilated kernel
    F = math.prod(_spectrum_shape(_fft_lengths(p)))
    return 2 * F * (p.N * p.C + p.K * p.Cg + p.N * p.K) + p.N * p.C * math.prod(p.padded_size) \
        + p.K * p.Cg * math.prod(p.dilated_kernel)


def _ws_winograd(p):        # transformed tiles V (16 per tile and channel), filters U, products M
    T = math.prod(_tiles_count(p.out_size))
    return 16 * (p.N * T * (p.C + p.K) + p.K * p.Cg) + p.N * p.C * math.prod(p.padded_size)


# ... and cost models: multiply-adds plus elements moved, a rough relative time for the heuristic,
# scaled by a per-device factor.  The factors are fitted to the find tables measured on an H200 and
# on a 2-core CPU (docs/measurements/): the raw model cannot see that NumPy's DIRECT tap loop is the
# fastest on the CPU, that the staged Winograd is the slowest everywhere, or that on the GPU a
# depthwise GEMM/DIRECT is a batch of tiny products (many launches) while FFT stays one big product.
_DEVICE_FACTOR = {
    "cpu": {"gemm": 3.0, "direct": 1.0, "fft": 8.0, "winograd": 20.0},
    "cuda": {"gemm": 1.0, "direct": 1.25, "fft": 2.2, "winograd": 40.0},
}
_CUDA_DEPTHWISE_PENALTY = 10.0      # GEMM/DIRECT on GPU when each group has one input channel


_CPU_NARROW_DIRECT_PENALTY = 4.0   # DIRECT on the CPU when each group has few (but > 1 or ungrouped) channels
_CPU_FAST_GEMM_FACTOR = 0.25       # GEMM on the CPU for groups == 1, where conv_cpu.py's fast form runs


def _factor(technique, p, device_type):
    f = _DEVICE_FACTOR.get(device_type, _DEVICE_FACTOR["cuda"])[technique]
    depthwise = p.Cg == 1 and p.groups > 1
    if device_type != "cpu" and depthwise and technique in ("gemm", "direct"):
        f *= _CUDA_DEPTHWISE_PENALTY
    if device_type == "cpu" and technique == "gemm" and p.groups == 1:
        # conv_cpu.py's fast GEMM form (channels-last windows, one BLAS call per direction) runs ungrouped
        # problems: measured on the 2-core CPU at 1 thread it beats the DIRECT tap loop at every width
        # (N32 32x32 3x3: 16 channels 25.5 vs 29.6 ms, 64 channels 184 vs 243 ms, fwd+bwd-data+bwd-filter).
        f *= _CPU_FAST_GEMM_FACTOR
    if device_type == "cpu" and technique == "direct" and p.Cg < 16 and not depthwise:
        # Each tap is a product with inner dimension Cg: below ~16 BLAS runs far under its rate and
        # one im2col GEMM wins (measured: LeNet's C=1 5x5 conv, 2.6 ms GEMM vs 28 ms DIRECT); a
        # depthwise tap is a plain broadcast multiply instead, where DIRECT stays the fastest.
        f *= _CPU_NARROW_DIRECT_PENALTY
    return f


def _cost_gemm(p, device_type="cpu"):
    return (2 * p.macs + 2 * _ws_gemm(p)) * _factor("gemm", p, device_type)


def _cost_direct(p, device_type="cpu"):
    taps = math.prod(p.kernel)
    return (2 * p.macs + taps * (p.N * math.prod(p.out_size) * (p.C + 2 * p.K) + 20000)) * \
        _factor("direct", p, device_type)


def _cost_fft(p, device_type="cpu"):
    L = math.prod(_fft_lengths(p))
    F = math.prod(_spectrum_shape(_fft_lengths(p)))
    raw = 5 * L * math.log2(max(L, 2)) * (p.N * p.C + p.K * p.Cg + p.N * p.K) + 8 * p.N * p.K * p.Cg * F
    return raw * _factor("fft", p, device_type)


def _cost_winograd(p, device_type="cpu"):
    return (2 * p.macs * 16 / 36 + 4 * _ws_winograd(p)) * _factor("winograd", p, device_type)


_FLOAT32_64 = ("float32 or float64 data", lambda p: p.dtype in ("float32", "float64"))
_STRIDE_1 = ("stride 1", lambda p: all(s == 1 for s in p.stride))
_WINOGRAD_RULES = (("2-D convolutions", lambda p: p.nd == 2),
                   ("3x3 kernels (F(2x2, 3x3))", lambda p: p.kernel == (3, 3)),
                   _STRIDE_1,
                   ("dilation 1", lambda p: all(d == 1 for d in p.dilation)),
                   _FLOAT32_64)


def _registry(name, enum_type, implemented, missing):
    """A registry holding every member of ``enum_type``: the implemented ones (a dict of algo -> run,
    rules, workspace, cost), then those that are not, each with the reason."""
    registry = AlgorithmRegistry(name, enum_type)
    for algo, (run, rules, workspace, cost) in implemented.items():
        registry.register(ConvAlgorithm(algo, run, rules, workspace, cost))
    for algo, note in missing.items():
        registry.register(ConvAlgorithm(algo, note=note))
    assert {a.algo for a in registry} == set(enum_type), name
    return registry


_FUSED = "a fused single-kernel version needs a CUDA kernel; WINOGRAD_NONFUSED is the same transform in stages"
_TILING = "FFT over tiles (overlap-add) is not implemented; FFT transforms the whole padded image"

from .cuda import conv_register as _cuda_conv  # noqa: E402  (the CUDA kernels: implicit GEMM, direct)

FORWARD_ALGORITHMS = _registry("convolution_forward", ConvolutionFwdAlgo, {
    ConvolutionFwdAlgo.IMPLICIT_GEMM: (_cuda_conv.forward_implicit, (_cuda_conv.IGEMM_RULE,),
                                       _cuda_conv.implicit_workspace, _cuda_conv.implicit_cost_no_table),
    ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM: (_cuda_conv.forward_implicit_precomp, (_cuda_conv.IGEMM_RULE,),
                                               _cuda_conv.precomp_workspace, _cuda_conv.implicit_cost),
    ConvolutionFwdAlgo.GEMM: (gemm_forward, (), _ws_gemm, _cost_gemm),
    ConvolutionFwdAlgo.DIRECT: (direct_forward, (), _ws_direct, _cost_direct),
    ConvolutionFwdAlgo.FFT: (fft_forward, (_STRIDE_1, _FLOAT32_64), _ws_fft, _cost_fft),
    ConvolutionFwdAlgo.WINOGRAD_NONFUSED: (winograd_forward, _WINOGRAD_RULES, _ws_winograd, _cost_winograd),
}, {
    ConvolutionFwdAlgo.FFT_TILING: _TILING,
    ConvolutionFwdAlgo.WINOGRAD: _FUSED,
})

BACKWARD_DATA_ALGORITHMS = _registry("convolution_backward_data", ConvolutionBwdDataAlgo, {
    ConvolutionBwdDataAlgo.ALGO_1: (gemm_backward_data, (), _ws_gemm, _cost_gemm),
    ConvolutionBwdDataAlgo.ALGO_0: (direct_backward_data, (), _ws_direct, _cost_direct),
    ConvolutionBwdDataAlgo.FFT: (fft_backward_data, (_STRIDE_1, _FLOAT32_64), _ws_fft, _cost_fft),
    ConvolutionBwdDataAlgo.WINOGRAD_NONFUSED: (winograd_backward_data, _WINOGRAD_RULES, _ws_winograd,
                                               _cost_winograd),
}, {
    ConvolutionBwdDataAlgo.FFT_TILING: _TILING,
    ConvolutionBwdDataAlgo.WINOGRAD: _FUSED,
})

BACKWARD_FILTER_ALGORITHMS = _registry("convolution_backward_filter", ConvolutionBwdFilterAlgo, {
    ConvolutionBwdFilterAlgo.ALGO_1: (gemm_backward_filter, (), _ws_gemm, _cost_gemm),
    ConvolutionBwdFilterAlgo.ALGO_3: (_cuda_conv.backward_filter_atomic, (_cuda_conv.IGEMM_RULE,),
                                      _cuda_conv.atomic_filter_workspace, _cuda_conv.atomic_filter_cost),
    ConvolutionBwdFilterAlgo.ALGO_0: (direct_backward_filter, (), _ws_direct, _cost_direct),
    ConvolutionBwdFilterAlgo.FFT: (fft_backward_filter, (_STRIDE_1, _FLOAT32_64), _ws_fft, _cost_fft),
    ConvolutionBwdFilterAlgo.WINOGRAD_NONFUSED: (winograd_backward_filter, _WINOGRAD_RULES, _ws_winograd,
                                                 _cost_winograd),
}, {
    ConvolutionBwdFilterAlgo.FFT_TILING: _TILING,
})

from . import conv_cpu as _conv_cpu  # noqa: E402  (the NumPy fast forms of GEMM and DIRECT, beside the references)

_conv_cpu.register(FORWARD_ALGORITHMS, BACKWARD_DATA_ALGORITHMS, BACKWARD_FILTER_ALGORITHMS)
_cuda_conv.register(FORWARD_ALGORITHMS, BACKWARD_DATA_ALGORITHMS, BACKWARD_FILTER_ALGORITHMS)
