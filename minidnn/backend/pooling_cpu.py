"""Fast CPU (NumPy) pooling, registered beside the reference in pooling.py.

# x, dx: (N, C, *S)  channels-first index order (any memory layout)   y, dy, argmax: (N, C, *O)
# idx: (N, C, *O)    flat index, in the padded dx, of the input element each window's gradient goes to

The reference walks the window taps with a ``where`` and a boolean ``|`` per tap, and its backward adds one
masked copy of dy per tap (a pass over the whole dx each).  Here:

forward, MAX          the maximum by ``np.maximum`` over the taps' strided slices (in place, no
                      temporaries), then the argmax as the count of leading taps that differ from the maximum
                      (a running AND added up), so the first tap holding the maximum wins (the reference's
                      rule; a NaN window points at its last NaN, as PyTorch's ``val > max || isnan(val)`` scan
                      does, fixed up only when there is one);
backward, MAX         no loop at all: the stored argmax becomes a flat index into the padded dx
                      (window origin + offset of the tap), and dy is written there in one fancy assignment
                      (windows that do not overlap) or summed there by one ``bincount`` (overlapping windows:
                      several windows may send to one element; bincount adds them in a fixed order);
backward, AVERAGE     for non-overlapping windows, dy / divisor written through a *writable* window view of
                      the padded dx in one assignment (overlapping ones keep the reference's tap loop).
forward, MAX 2x2/2    windows of 2x2, stride 2, no padding, even sizes, short output rows: the taps as whole
                      planes by 1-D copies (rows as void elements, then columns by stride 2), the argmax by
                      three comparisons and byte operations (``_pairs_forward``);
AVERAGE forward stays the reference's (a sum of tap slices is already one array operation per tap).
"""
from __future__ import annotations

import functools
import math
import threading

import numpy as np

from .threads import parallel_map, parallel_parts, parallel_spans, split_spans

__all__ = ["applies_forward", "applies_backward", "pool_forward", "pool_backward"]

_ENABLED = [True]


def applies_forward(geom, x) -> bool:
    return _ENABLED[0] and type(x) is np.ndarray and geom.mode.is_max


def applies_backward(geom, x) -> bool:
    return _ENABLED[0] and type(x) is np.ndarray and (geom.mode.is_max or _non_overlapping(geom))


def _non_overlapping(geom):
    return all(s >= k for s, k in zip(geom.stride, geom.window))


def _window_view(xpad, geom, writeable=False):
    """(N, C, *O, *window) view of the padded array: [n, c, o.., k..] = xpad[n, c, o*stride + k]."""
    lead, spatial = xpad.strides[:2], xpad.strides[2:]
    shape = (*xpad.shape[:2], *geom.out_sizes, *geom.window)
    strides = (*lead, *(st * s for st, s in zip(spatial, geom.stride)), *spatial)
    return np.lib.stride_tricks.as_strided(xpad, shape=shape, strides=strides, writeable=writeable)


def pool_forward(geom, xc, xp):
    """(maximum, argmax) for channels-first xc, as the reference computes them (MAX modes); the batch is
    shared out between minidnn's threads."""
    xpad = geom.pad(xp, xc, -np.inf)
    value = np.empty(geom.y_shape, dtype=xc.dtype)
    arg = np.empty(geom.y_shape, dtype=np.min_scalar_type(math.prod(geom.window) - 1))
    taps = [sl for _, sl in geom.taps()]
    # Short rows (the windows' last dim): each tap's strided slice has inner runs of O[-1] elements, and a NumPy pass
    # over it costs ~12 us at LeNet's 12k windows whatever the size; a contiguous copy of each tap first (~7 us) makes
    # the passes after it ~1.5 us.  The copies go to per-thread scratch planes kept between calls (fresh ones cost
    # page faults: the heap is trimmed and grown again every call).  Same passes in the same order on the same
    # values: bitwise the same maxima and argmax.
    short = len(taps) > 1 and geom.out_sizes[-1] <= _SHORT_RUN

    def body(nb):
        slices = [xpad[(nb, Ellipsis) + sl] for sl in taps]
        if short:
            planes = _scratch((len(slices),) + slices[0].shape, xc.dtype)
            for p, s in zip(planes, slices):
                np.copyto(p, s)
            slices = list(planes)
        v, a = value[nb], arg[nb]
        np.copyto(v, slices[0])
        for s in slices[1:]:
            np.maximum(v, s, out=v)
        # a = the first tap equal to the maximum = how many leading taps differ from it, counted over taps
        # 0..T-2 (none equal: T-1, the last): a running AND of "differs" added up, three passes a tap.  (A masked
        # store (putmask, copyto where=) branches per element and took 5x longer; the earlier reverse-order
        # form a -= hit * (a - t) took four passes a tap and a fill: 35 -> 30 us for LeNet's first pool.)
        if len(slices) == 1:
            a.fill(0)
        else:
            run, ne = np.empty(v.shape, dtype=bool), np.empty(v.shape, dtype=bool)
            np.not_equal(slices[0], v, out=run)
            np.copyto(a, run)
            for s in slices[1:-1]:
                np.not_equal(s, v, out=ne)
                np.logical_and(run, ne, out=run)
                np.add(a, run, out=a)
        nan = np.isnan(v)
        if nan.any():                                 # NaN equals nothing: point at each window's last NaN
            for t in range(len(slices)):
                np.putmask(a, nan & np.isnan(slices[t]), t)
    if _pairs_apply(geom, xc):
        def pairs(nb):
            _pairs_forward(xc[nb], value[nb], arg[nb])
        body = pairs                                  # the 2x2 / stride 2 form below
    spans = split_spans(xc.shape[0], xc.size, MIN_SPLIT_ELEMENTS)
    if len(spans) > 1:                                # the whole call per part: one hand-off (threads.parallel_spans)
        parallel_spans(body, spans)
    else:
        parallel_map(body, _batch_spans(xc.shape[0], value.size))    # each NumPy call: one tap over the batch
    return value, arg


# ---- 2x2 windows, stride 2, no padding, even height and width (LeNet's and most CNNs' pools) --------------------
#
# The general form above copies each of the 4 taps out of x as a 4-D strided slice: NumPy runs a copy loop per
# output row (runs of O[-1] elements, 2 elements apart), ~37 us a tap for LeNet's first pool at batch 64, and its
# argmax takes ~8 passes a window.  Here, per chunk of images (_PAIRS_CHUNK_BYTES of x, so the planes stay in the L2
# cache):
#     top, bot       the even and the odd image rows: each row one element of a void dtype of the row's bytes, so
#                    one 1-D strided copy of rows (~6 ns a row, not a loop per row)
#     t0 t1 / t2 t3  the even and odd columns of top / bot: 1-D stride-2 copies of whole planes (contiguous after)
#     m0 = max(t0, t1), m1 = max(t2, t3), value = max(m0, m1)
#     argmax         the first maximum in tap order (t = 2 * row + column): the bottom row only where it is
#                    strictly greater (vs = m1 > m0), in the chosen row the right column only where strictly
#                    greater (h0 = t1 > t0, h1 = t3 > t2):  a = (vs ? h1 : h0) + 2 vs, as bit operations on bytes
# Ties go to the earlier tap, as in the reference; a NaN window (its maximum NaN: np.maximum propagates it) points at
# its last NaN, fixed up only where there is one, as above.  Measured (docs/measurements/cpu_2026-11-26_2core.md,
# session 8; in-process A/B, min / median of 15 alternated rounds, 1 thread): LeNet's second pool (out_w 5) at batch
# 64 165/199 -> 137/167 us, at batch 256 508/529 -> 372/395; out_w 8 (the digits LeNet's first pool, 32x6x16x16)
# 75 -> 75, (32, 16, 8, 8) 74 -> 68; out_w 14 (LeNet's first pool) even (264 -> 255 at batch 64, 974 -> 1043 at
# 256): hence only rows of at most _PAIRS_MAX_OUT_W outputs.  Chunks of 128-512 KiB of x (to keep the planes in the
# L2 cache) were slower at every size: each chunk is ~20 NumPy calls.

_PAIRS_MAX_OUT_W = 8
_PAIRS_CHUNK_BYTES = 2048 * 1024


def _pairs_apply(geom, xc):
    return (geom.window == (2, 2) and geom.stride == (2, 2) and not any(geom.padding) and not any(geom.pad_after)
            and geom.out_sizes[-1] <= _PAIRS_MAX_OUT_W and xc.ndim == 4 and xc.shape[2] % 2 == 0
            and xc.shape[3] % 2 == 0 and xc.size > 0 and xc.flags.c_contiguous and _PAIRS_ENABLED[0])


_PAIRS_ENABLED = [True]


def _row_elements(a, width):
    """(rows, width) C-contiguous -> (rows,) view, each row one element of a void dtype."""
    return a.reshape(-1, width).view(np.dtype((np.void, width * a.itemsize))).reshape(-1)


def _pairs_planes(images, C, H, W, dtype):
    """This thread's planes for a chunk of ``images`` (kept between calls; contents undefined)."""
    key = (images, C, H, W, dtype)
    held = getattr(_SCRATCH, "pairs", None)
    if held is None:
        held = _SCRATCH.pairs = {}
    if key not in held:
        if len(held) >= 4:                            # a model's few pools (the digits LeNet's two both come here)
            held.clear()
        rows, q = images * C * H // 2, W // 2
        held[key] = (np.empty((2, rows, W), dtype=dtype), np.empty((6, rows * q), dtype=dtype),
                     np.empty((3, rows * q), dtype=bool))
    return held[key]


def _pairs_forward(x, value, arg):
    """value, arg (n, C, H/2, W/2) of x (n, C, H, W), all C-contiguous."""
    n, C, H, W = x.shape
    per = max(1, _PAIRS_CHUNK_BYTES // max(1, C * H * W * x.itemsize))
    halves, planes, flags = _pairs_planes(min(n, per), C, H, W, x.dtype)
    for n0 in range(0, n, per):
        m = min(n, n0 + per) - n0
        rows, size = m * C * H // 2, m * C * H * W // 4
        top, bot = halves[0, :rows], halves[1, :rows]
        xr = _row_elements(x[n0:n0 + m], W)
        np.copyto(_row_elements(top, W), xr[0::2])
        np.copyto(_row_elements(bot, W), xr[1::2])
        t0, t1, t2, t3, m0, m1 = (pl[:size] for pl in planes)
        tf, bf = top.reshape(-1), bot.reshape(-1)
        np.copyto(t0, tf[0::2])
        np.copyto(t1, tf[1::2])
        np.copyto(t2, bf[0::2])
        np.copyto(t3, bf[1::2])
        v, a = value[n0:n0 + m].reshape(-1), arg[n0:n0 + m].reshape(-1)
        np.maximum(t0, t1, out=m0)
        np.maximum(t2, t3, out=m1)
        np.maximum(m0, m1, out=v)
        h0, h1, vs = (f[:size].view(np.uint8) for f in flags)
        np.greater(t1, t0, out=h0.view(bool))
        np.greater(t3, t2, out=h1.view(bool))
        np.greater(m1, m0, out=vs.view(bool))
        np.bitwise_xor(h0, h1, out=h1)                # (vs ? h1 : h0) = h0 ^ ((h0 ^ h1) & vs)
        np.bitwise_and(h1, vs, out=h1)
        np.bitwise_xor(h1, h0, out=a)
        np.add(a, vs, out=a)
        np.add(a, vs, out=a)
        if np.isnan(v.max()):                         # NaN equals nothing: point at each window's last NaN
            nan = np.isnan(v)
            for t, plane in enumerate((t0, t1, t2, t3)):
                np.putmask(a, nan & np.isnan(plane), t)


# From this many input elements a pooling call is cut over its batch, one part per thread, the whole call per part
# (threads.split_spans; each part writes its own images' results: bit for bit the unsplit call's).  Measured on the
# 2-core machine (docs/measurements/cpu_2026-11-26_2core.md, tenth session), min of 40 alternated calls: LeNet's
# first pool at batch 64 (301k elements) forward 255-275 us unsplit, 323-361 split (backward 188 -> 221-248), its
# second pool at batch 256 (410k) 518-539 -> 554-610; the first pool at batch 256 (1.2M) 997 -> 768 us and
# backward 900 -> 649 in a quiet moment, about even in others.  Each part is many short passes (a tap each): their
# GIL hand-offs cost what the second core saves below about a million elements.
MIN_SPLIT_ELEMENTS = 1 << 20


_SHORT_RUN = 32
_SCRATCH = threading.local()


def _scratch(shape, dtype):
    """A per-thread array of this shape and dtype, reused by the next call that asks for the same (contents
    undefined)."""
    key = (shape, dtype)
    held = getattr(_SCRATCH, "planes", None)
    if held is None or held[0] != key:
        held = _SCRATCH.planes = (key, np.empty(shape, dtype=dtype))
    return held[1]


def _batch_spans(n, work):
    parts = parallel_parts(n, work)
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _flat_index(geom, shape_nc, arg):
    """idx (N, C, *O): flat position in the C-contiguous padded dx of the element tap ``arg`` of each window
    reads: the window's origin plus the tap's offset."""
    origins, offsets = _index_tables(tuple(shape_nc), geom.padded_spatial, geom.out_sizes, geom.stride, geom.window)
    idx = np.take(offsets, arg)                       # a gather from the small table: 22 -> 14 us for LeNet's
    idx += origins                                    # first pool's 12k windows, against origins + offsets[arg]
    return idx


@functools.lru_cache(maxsize=8)
def _index_tables(shape_nc, padded, out_sizes, stride, window):
    """(window origins (N, C, *O), tap offsets (taps,)): what _flat_index needs apart from the argmax, the same
    for every batch of one shape (cached; read-only)."""
    elem_strides = [math.prod(padded[d + 1:]) for d in range(len(padded))]
    nd = len(padded)
    index = (np.arange(shape_nc[0] * shape_nc[1], dtype=np.int64) * math.prod(padded)).reshape(
        shape_nc + (1,) * nd)
    for d, (o, s, st) in enumerate(zip(out_sizes, stride, elem_strides)):
        shape = [1] * nd
        shape[d] = o
        index = index + (np.arange(o, dtype=np.int64) * (s * st)).reshape(shape)
    offsets = np.zeros(window, dtype=np.int64)
    for d, (k, st) in enumerate(zip(window, elem_strides)):
        shape = [1] * nd
        shape[d] = k
        offsets = offsets + (np.arange(k, dtype=np.int64) * st).reshape(shape)
    index.flags.writeable = False
    offsets = offsets.reshape(-1)
    offsets.flags.writeable = False
    return index, offsets


def pool_backward(geom, dyc, arg, dtype, xp):
    """Padded dx (C-contiguous, channels-first); the caller crops and blends."""
    shape = dyc.shape[:2] + geom.padded_spatial
    if geom.mode.is_max:
        if _non_overlapping(geom):                    # every element receives from at most one window
            dxpad = np.zeros(math.prod(shape), dtype=dtype)
            spans = split_spans(shape[0], dxpad.size, MIN_SPLIT_ELEMENTS)
            if len(spans) == 1:
                dxpad[_flat_index(geom, dyc.shape[:2], arg).ravel()] = dyc.ravel()
            else:                                     # each part writes its own images' elements
                origins, offsets = _index_tables(tuple(dyc.shape[:2]), geom.padded_spatial, geom.out_sizes,
                                                 geom.stride, geom.window)

                def part(nb):
                    idx = np.take(offsets, arg[nb])
                    idx += origins[nb]
                    dxpad[idx.ravel()] = dyc[nb].ravel()
                parallel_spans(part, spans)
            return dxpad.reshape(shape)
        idx = _flat_index(geom, dyc.shape[:2], arg).ravel()
        summed = np.bincount(idx, weights=dyc.ravel(), minlength=math.prod(shape))
        return summed.astype(dtype, copy=False).reshape(shape)
    dxpad = np.zeros(shape, dtype=dtype)
    taps = math.prod(geom.window)
    spread = np.broadcast_to((dyc / geom.divisor(xp, dtype))[..., None], (*dyc.shape, taps))
    _window_view(dxpad, geom, writeable=True)[...] = spread.reshape(*dyc.shape, *geom.window)
    return dxpad
