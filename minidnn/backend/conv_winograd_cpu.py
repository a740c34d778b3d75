"""The CPU (NumPy) fast form of WINOGRAD_NONFUSED: F(2x2, 3x3) for 2-D 3x3 stride-1 dilation-1 convolutions,
groups 1, forward and backward data (a forward correlation of dy with the flipped, channel-swapped filter).

The reference (conv_algorithms.py) transforms every 4x4 tile with small matrix products (``_sandwich``) on
channels-first arrays: correct and readable, and the slowest CPU algorithm.  This form computes the same
y = A^T [ (G g G^T) * (B^T d B) ] A with the transforms written as adds on whole arrays, channels-last so that
every add runs over long contiguous rows, per chunk of images (about ``_CHUNK_BYTES`` of transformed tiles):

    buf (n, H', 2, T1+1, C)   the chunk zero-padded, channels-last, its columns split into even and odd ones
                              (column 2t+j of tile t is buf[.., j % 2, t + j // 2, :]: tile slices are contiguous
                              runs of T1*C, where a stride-2 column slice ran at ~1 ns an element in NumPy)
    rows (4, n, T0, 2, T1+1, C)  B^T along the height: d0-d2, d1+d2, d2-d1, d1-d3 of rows 2t..2t+3
    V (16, n*T0*T1, C)        B^T d B: the same four combinations along the width
    M (16, n*T0*T1, K)        16 GEMMs V[f] @ U[f], U = G g G^T (16, C, K): 16/36 of direct's multiply-adds
    y_cl (N, 2*T0, 2*T1, K)   A^T M A: rows m0+m1+m2, m1-m2-m3, then the same along the width

The result is the channels-first view of the channels-last y_cl (no copy; cropped where the output is odd).
Chunks go to minidnn's threads one at a time (threads.parallel_for), each with its own buffers and its GEMMs on
one BLAS thread; results do not depend on the thread count.

Measured on the 2-core machine (docs/measurements/cpu_2026-11-26_2core.md, "Winograd F(2x2, 3x3)"), forward,
1 thread: N32 C=K=16 32x32 6.2 ms against 5.5 for the flat im2col GEMM (16 channels: the transforms' ~190 adds per
output position cost more than the multiply-adds they save), C=K=32 9.3 against 9.2, C=K=64 23-24 against 30;
the C=K=64 training step 90-92 -> 83-85 ms.  The heuristic takes it only at 1 thread, from 64 channels, 8 a side
and 8192 output positions (``_large_enough``, ``winograd_cost``).  float32 error: at most ~15 u relative to
|x| corr |w| measured (u = 2^-24), against a first-order bound (Cin + 5) u A^T (sum |U| |V|) A
(tests/backend/test_conv_winograd_cpu.py derives it and holds it).
"""
from __future__ import annotations

import math

import numpy as np

from .blas import cpu_matmul
from .conv_problem import ConvProblem
from .threads import get_num_threads, parallel_for, parallel_parts

__all__ = ["winograd_forward", "winograd_backward_data", "winograd_applies", "winograd_cost"]

_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
_GG = np.kron(_G, _G)           # (16, 9)
_CHUNK_BYTES = 2 << 20          # V and M of one chunk (measured C=K=64 forward, 1 / 2 threads: 1 MiB
                                # 24.2 / 14.1 ms, 2 MiB 24.0 / 13.8, 4 MiB 24.0 / 14.5, 8 MiB 27.2 / 16.9)
_MIN_CHANNELS = 64              # C and K from which it beats the flat im2col GEMM (forward, 1 thread:
                                # 16 channels 6.2 vs 5.5 ms, 32 9.3 vs 9.2, 64 23 vs 30; 2 threads:
                                # 16 4.0 vs 3.4, 32 5.9 vs 4.9, 64 13.8-14.7 vs 15.5-15.7)
_MIN_POSITIONS = 8192           # output positions over the batch (_large_enough)
_TRANSPOSE_BLOCK = 8            # channels per copy when x is channels-first (the whole transpose: 5.9 ms of
                                # conv64's input, blocks of 8 channels 1.4 ms)


def _filter(w, dtype):
    """U = G g G^T of every (k, c) 3x3 filter: (16, C, K), computed in float64."""
    # U[k, c, 4i+j] = sum_rs G[i, r] G[j, s] w[k, c, r, s]: one (K*C, 9) x (9, 16) product with kron(G, G)
    # (batched 4x3 @ 3x3 @ 3x4 products took 1.0 ms at C=K=64, this one 0.05)
    U = w.reshape(-1, 9).astype(np.float64) @ _GG.T
    return np.ascontiguousarray(U.reshape(*w.shape[:2], 16).transpose(2, 1, 0), dtype=dtype)


def _placement(size, pad, span):
    """(source slice, destination start) of an axis of ``size`` placed at offset ``pad`` (negative: cropped) in a
    padded axis of ``span``."""
    lo, hi = max(0, -pad), min(size, span - pad)
    return slice(lo, max(lo, hi)), lo + pad


def _correlate(a, U, padding):
    """3x3 stride-1 cross-correlation of a (N, C, H, W), any strides, padded by ``padding`` (negative: cropped),
    with U (16, C, K): the channels-first (N, K, P, Q) view of a channels-last result."""
    N, C, H, W = a.shape
    K = U.shape[-1]
    P, Q = H + 2 * padding[0] - 2, W + 2 * padding[1] - 2
    T0, T1 = -(-P // 2), -(-Q // 2)
    rows_in = 2 * T0 + 2
    tiles = T0 * T1
    images = max(1, min(N, _CHUNK_BYTES // (16 * (C + K) * tiles * a.itemsize)))
    chunks = [slice(n0, min(N, n0 + images)) for n0 in range(0, N, images)]
    y_cl = np.empty((N, 2 * T0, 2 * T1, K), dtype=a.dtype)
    src_h, dst_h = _placement(H, padding[0], rows_in)
    src_w, dst_w = _placement(W, padding[1], 2 * T1 + 2)
    a_cl = np.moveaxis(a, 1, -1)                                       # (N, H, W, C) view
    blocks = ([slice(None)] if a_cl.strides[-1] <= a_cl.strides[-2] else
              [slice(c, c + _TRANSPOSE_BLOCK) for c in range(0, C, _TRANSPOSE_BLOCK)])
    # padded column q = w + padding lands in parity q % 2, slot q // 2: per parity, the source columns w of that
    # parity (a stride-2 slice) and the first slot
    parities = []
    for par in range(2):
        first = src_w.start + ((par - dst_w) % 2)
        if first < src_w.stop:
            parities.append((par, slice(first, src_w.stop, 2), (first + padding[1]) // 2,
                             len(range(first, src_w.stop, 2))))

    work = N * tiles * 16 * (C + K)                                   # transformed elements
    # shared chunks: each GEMM on its thread's one BLAS thread; one thread: cpu_matmul's BLAS grain decides
    product = np.matmul if parallel_parts(len(chunks), work) > 1 else cpu_matmul

    def setup():
        buf = np.zeros((images, rows_in, 2, T1 + 1, C), dtype=a.dtype)
        rows = np.empty((4, images, T0, 2, T1 + 1, C), dtype=a.dtype)
        V = np.empty((16, images * tiles, C), dtype=a.dtype)
        M = np.empty((16, images * tiles, K), dtype=a.dtype)
        S = np.empty((2, 4, images, T0, T1, K), dtype=a.dtype)
        return buf, rows, V, M, S

    def body(bufs, nb):
        buf, rows, V, M, S = bufs
        n = nb.stop - nb.start
        b, r, L = buf[:n], rows[:, :n], n * tiles
        h = slice(dst_h, dst_h + src_h.stop - src_h.start)
        for par, cols, slot, count in parities:
            for cb in blocks:
                b[:, h, par, slot:slot + count, cb] = a_cl[nb, src_h, cols, cb]
        d = [b[:, i:i + 2 * T0:2] for i in range(4)]                   # (n, T0, 2, T1+1, C)
        np.subtract(d[0], d[2], out=r[0])
        np.add(d[1], d[2], out=r[1])
        np.subtract(d[2], d[1], out=r[2])
        np.subtract(d[1], d[3], out=r[3])
        v = V[:, :L].reshape(4, 4, n, T0, T1, C)
        for i in range(4):
            c0, c1, c2, c3 = (r[i][:, :, j % 2, j // 2:j // 2 + T1] for j in range(4))
            np.subtract(c0, c2, out=v[i, 0])
            np.add(c1, c2, out=v[i, 1])
            np.subtract(c2, c1, out=v[i, 2])
            np.subtract(c1, c3, out=v[i, 3])
        m = product(V[:, :L], U, out=M[:, :L]).reshape(4, 4, n, T0, T1, K)
        s = S[:, :, :n]
        for j in range(4):
            np.add(m[0, j], m[1, j], out=s[0, j])
            np.add(s[0, j], m[2, j], out=s[0, j])
            np.subtract(m[1, j], m[2, j], out=s[1, j])
            np.subtract(s[1, j], m[3, j], out=s[1, j])
        y = y_cl[nb].reshape(n, T0, 2, T1, 2, K)
        for i in range(2):
            np.add(s[i, 0], s[i, 1], out=y[:, :, i, :, 0])
            np.add(y[:, :, i, :, 0], s[i, 2], out=y[:, :, i, :, 0])
            np.subtract(s[i, 1], s[i, 2], out=y[:, :, i, :, 1])
            np.subtract(y[:, :, i, :, 1], s[i, 3], out=y[:, :, i, :, 1])
    parallel_for(chunks, body, work, setup)
    return np.moveaxis(y_cl[:, :P, :Q], -1, 1)


def winograd_forward(p: ConvProblem, x, w, tf32=False):
    return _correlate(x, _filter(w, x.dtype), p.padding)


def winograd_backward_data(p: ConvProblem, w, dy, tf32=False):
    # dx is the correlation of dy, padded by 2 - padding, with w flipped and its channel axes swapped
    flipped = np.swapaxes(w[:, :, ::-1, ::-1], 0, 1)                  # (C, K, 3, 3)
    return _correlate(dy, _filter(flipped, dy.dtype), tuple(2 - q for q in p.padding))


def winograd_applies(p: ConvProblem, a, b):
    """NumPy float32/float64 arrays, groups 1, at least _MIN_CHANNELS input and output channels (the algorithm's
    own rules already hold: 2-D, 3x3, stride 1, dilation 1)."""
    return (type(a) is np.ndarray and p.groups == 1 and a.dtype in (np.float32, np.float64)
            and _large_enough(p))


def _large_enough(p: ConvProblem):
    # Shapes only (the heuristic's cost and ``applies`` must agree: where the heuristic picks WINOGRAD_NONFUSED and
    # the fast form did not apply, the slow reference would run).  Measured forward, this form against the GEMM
    # forms (> 1: faster), 1 / 2 threads: N32 C=K=64 32x32 1.27 / 1.15x, 16x16 1.26 / 1.05x, 8x8 1.25 / 0.87x;
    # N16 C=K=256 8x8 1.16x, N1 C=K=64 32x32 1.03x, N1 64 8x8 0.36x, N32 64 4x4 0.81x, N4 64->128 15x15 0.94x
    # (1 thread).  So: 64 channels or more, 8 or more a side, 8192 output positions or more over the batch.
    return (min(p.C, p.K) >= _MIN_CHANNELS and min(p.out_size) >= 8
            and p.N * math.prod(p.out_size) >= _MIN_POSITIONS)


def winograd_cost(p: ConvProblem, device_type, gemm_cost):
    """The heuristic's estimate where the fast form applies and wins: 0.6x ``gemm_cost`` (GEMM's), else None (the
    reference's cost, far above GEMM's, keeps it unpicked).  Only at 1 thread (minidnn's default on a 2-core
    machine): there the N32 C=K=64 32x32 training step ran 92 -> 82-85 ms; at 2 threads each direction ran 1.15x
    faster alone but the step no faster (min 46.6-47.2 -> 46.0-46.7 ms, median 47.5-48.1 -> 49.4-49.8: the
    transforms' memory traffic shares the two cores worse than the GEMM form's chunks).  ``applies`` does not
    look at the thread count, so an algorithm chosen at 1 thread still runs this form at 2 (correct, no faster)."""
    if (device_type != "cpu" or p.groups != 1 or p.nd != 2 or not _large_enough(p) or get_num_threads() > 1
            or p.dtype not in ("float32", "float64")):
        return None
    return 0.6 * gemm_cost
