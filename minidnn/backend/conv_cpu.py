"""Fast CPU (NumPy) forms of the GEMM and DIRECT convolution algorithms, registered beside the references.

# x: (N, C, *in)  w: (K, C/G, *kernel)  y: (N, K, *out)       the arrays the algorithms receive (channels-first
#                                                              index order; the memory may be channels-last)
# x_cl: (N, *in + 2*pad, C)    channels-last, zero-padded: the one copy of x every direction starts from
# cols: (N*out, kernel*C)      im2col rows ordered (tap, channel): a strided window view of x_cl, reshaped
# w_mat: (K, kernel*C)         w with its taps before its channels, to match the columns of cols

The references (conv_gemm.py, and DIRECT in conv_algorithms.py) are written to be read: channels-first,
one formula for every device, group count and layout.  On NumPy that costs copies: ``to_rows`` and
``im2col`` transpose channels-first arrays element by element, col2im adds strided channels-first slices,
and a depthwise tap is a broadcast over arrays far larger than the cache.  These forms compute the same
cross-correlation (same problem, same result up to float rounding), choosing the layout for the CPU:

GEMM, groups == 1     Stride 1 on channels-first memory, where the padded width is at most 1.2x the output's: the
                      flat im2col (``_flat_dense_*``): per chunk of images, the zero-padded planes flattened, each
                      tap's cols rows a contiguous shifted copy of whole rows, one GEMM per chunk (details at the
                      section below); for 2-D forward and backward data with few output channels (R*K <= 96) only
                      the width taps are gathered and the kernel's rows stacked as one GEMM's output rows, then
                      added shifted by whole grid rows (``_flat_rows_*``), and the filter gradient with at most 16
                      output channels as one product per kernel row against those taps shifted (``_flat_rows_filter``).
                      Otherwise:
                      x is copied ONCE into a zero-padded channels-last array; ``as_strided`` turns it into
                      the (N, *out, *kernel, C) window view, whose reshape to cols is one contiguous-run
                      gather (runs of kernel_w*C elements).  Where channels-first runs are longer (few
                      channels: out_w > kernel_w*C), the gather is cols^T (C*kernel, N*out) from a
                      channels-first window view instead, and the products are w (K, C*kernel) @ cols^T and
                      dy^T @ cols (no transposition of w at all).  Then one BLAS call per direction:
                        forward          y_rows  = cols @ w_mat^T          (w_mat^T through BLAS's transpose flag)
                        backward filter  dw_mat^T = cols^T @ dy_rows       (cols^T likewise, no copy)
                        backward data    stride 1: a forward correlation of the padded dy with the flipped,
                                         channel-swapped w (one gather, one GEMM) where that gather is small
                                         (at most twice col2im's, or at most 4 MiB);
                                         else (more output than input channels, channels-first dy) col2im on
                                         the flat padded grid (``_flat_col2im``: one GEMM per chunk of images,
                                         one contiguous add per tap; in 2-D where fewer rows, dy's width
                                         taps gathered and one add per kernel row: ``_flat_width_col2im``);
                                         otherwise
                                         one (N*out, K) x (K, C) product per tap added into its strided
                                         slice of a channels-last dx (contiguous reads, unlike col2im's).
                      y_rows is (N*out, K) = an NHWC array, returned as a channels-first view (no copy).
                      (A row-shift form, ``_row_shift_*`` below: only the width windows gathered and the
                      kernel's R rows as R products of row ranges shifted by whole image rows, is kept but no
                      longer chosen: since im2col runs a chunk of images at a time, im2col is as fast or
                      faster at every size measured.)  Filter-gradient products with a long inner axis (the
                      positions) run in blocks of at most 4096 positions (``_filter_product``).
DIRECT, depthwise     G == C == K (one input and one output channel per group).  Stride 1 on channels-first
                      memory (most layers): the flat form below (``_flat_correlate``): per chunk of channels of
                      images, zero-padded into flat rows, one strided copy gathers every tap's shifted range and
                      one batched GEMV (a row of taps weights per channel) finishes the chunk; backward data is
                      the same correlation of the padded dy with the flipped kernel, backward filter one batched
                      BLAS dot per chunk and tap.  The chunks are handed out to minidnn's threads one at a time
                      (threads.parallel_for).  Otherwise one ``einsum`` over the strided
                      channels-last window view, y[n, o, c] = sum_k windows[n, o, k, c] w[k, c], per chunk of
                      the batch sized for the L2 cache (backward data with stride 1 the same correlation of the
                      padded dy, else a multiply-add per tap; backward filter the einsum dw[k, c] = sum
                      windows[n, o, k, c] dy[n, o, c], chunk partials added in batch order).

Threads: the flat and depthwise forms hand their chunks out to minidnn's threads one at a time (parallel_for).  The
other dense forms run, from threads.MIN_SPLIT_WORK multiply-adds on, on one part of the batch per thread at once
(``_over_batch`` / ``_summed_over_batch``: the form chosen on the whole batch, each part unsplit inside with BLAS at
one thread; the filter gradient's parts added in batch order; docs/threads.md).

``fast_paths_enabled(False)`` switches them off (the registry then runs the references), for debugging and
for the tests and benchmarks that compare the two.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import threading

import numpy as np

from . import conv_winograd_cpu, threads
from .blas import cpu_matmul
from .conv_problem import ConvProblem
from .threads import parallel_for, parallel_map, parallel_parts, parallel_spans, split_spans

__all__ = ["dense_forward", "dense_backward_data", "dense_backward_filter", "depthwise_forward",
           "depthwise_backward_data", "depthwise_backward_filter", "fast_paths_enabled", "register"]

_ENABLED = [True]
_CACHE_BYTES = 256 * 1024          # target size of one chunk's slice in the depthwise loops (L2-sized)


@contextlib.contextmanager
def fast_paths_enabled(enabled: bool):
    """Inside the block, the CPU fast paths are used (True) or the references run instead (False)."""
    previous = _ENABLED[0]
    _ENABLED[0] = bool(enabled)
    try:
        yield
    finally:
        _ENABLED[0] = previous


# ---- channels-last helpers ----------------------------------------------------------------------------

def _channels_last_padded(a, before, after=None):
    """(N, C, *S) (any strides) -> (N, *(S + before + after), C), C-contiguous, zeros in the border.
    One pass over a: the transpose and the padding happen in the same copy (free of a copy when a is a
    channels-first view of channels-last memory and there is no padding)."""
    after = before if after is None else after
    a_cl = np.moveaxis(a, 1, -1)
    if not any(before) and not any(after):
        return np.ascontiguousarray(a_cl)
    spatial = a.shape[2:]
    out = np.zeros((a.shape[0], *(s + b + e for s, b, e in zip(spatial, before, after)), a.shape[1]),
                   dtype=a.dtype)
    out[(slice(None), *(slice(b, b + s) for b, s in zip(before, spatial)), slice(None))] = a_cl
    return out


def _windows(x_cl, out_size, kernel, stride, dilation):
    """(N, *out, *kernel, C) view of the padded channels-last x: [n, o.., r.., c] = x_cl[n, o*s + r*d, c]."""
    sn, *ss, sc = x_cl.strides
    shape = (x_cl.shape[0], *out_size, *kernel, x_cl.shape[-1])
    strides = (sn, *(st * s for st, s in zip(ss, stride)), *(st * d for st, d in zip(ss, dilation)), sc)
    return np.lib.stride_tricks.as_strided(x_cl, shape=shape, strides=strides, writeable=False)


def _batch_spans(n, work):
    """[0, n) cut into one contiguous slice per minidnn thread (one slice for small work: threads.parallel_parts)."""
    parts = parallel_parts(n, work)
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _gather(view, batch_axis):
    """A C-contiguous copy of a strided window view, its batch axis shared out between minidnn's threads."""
    out = np.empty(view.shape, dtype=view.dtype)
    lead = (slice(None),) * batch_axis

    def body(nb):
        out[lead + (nb,)] = view[lead + (nb,)]
    parallel_map(body, _batch_spans(view.shape[batch_axis], view.size))
    return out


# The im2col matrix cols (N*out, kernel*C), columns ordered (tap, channel), is the window view reshaped; its products
# run without the whole cols: the window view (N, *out, *kernel, C) is gathered a chunk of images at
# a time into one buffer of about _IM2COL_CHUNK_BYTES (it stays in the L2 cache), and each chunk's product runs right
# after its gather, instead of gathering all of cols (1-4 MB: out to L3 or memory) and multiplying it afterwards.  The
# forward and backward data are row blocks of the one product (the same values, up to the kernel BLAS picks for a
# block); the filter gradient adds the chunks' products in batch order.  Measured, one thread, in-process A/B
# (medians): LeNet's conv2 at batch 64 forward 751 -> 691 us, filter gradient 1059 -> 878; the digits LeNet's conv2
# forward 235 -> 235, backward data 356 -> 343, filter gradient 292 -> 270.  It also holds no cols (3.8 MB at LeNet
# batch 64) beside its result.

_IM2COL_CHUNK_BYTES = 256 * 1024


def _im2col_chunks(windows, k):
    """(buffer, [image slices]) for gathering ``windows`` (N, *out, *kernel, C) a chunk of images at a time, for
    products with ``k`` columns: about _IM2COL_CHUNK_BYTES of cols a chunk, or where the BLAS has small-matrix kernels,
    as many images as one such product takes (the digits LeNet's backward data: 6 images of 102 KB, not 2)."""
    n = windows.shape[0]
    per_image = math.prod(windows.shape[1:])
    if threads.blas_small_kernels():
        images = threads.SMALL_GEMM_MACS // (per_image * k)
    else:
        images = _IM2COL_CHUNK_BYTES // (per_image * windows.itemsize)
    images = max(1, min(n, images))
    return (np.empty((images, *windows.shape[1:]), dtype=windows.dtype),
            [slice(n0, min(n, n0 + images)) for n0 in range(0, n, images)])


def _im2col_product(windows, right):
    """cols @ right, (N*out, K), for the im2col matrix cols of ``windows`` and right (kernel*C, K)."""
    buf, chunks = _im2col_chunks(windows, right.shape[1])
    rows = math.prod(windows.shape[1:1 + (windows.ndim - 2) // 2])          # output positions per image
    width = math.prod(windows.shape[1 + (windows.ndim - 2) // 2:])          # kernel*C
    right = np.ascontiguousarray(right)          # a weight matrix: C order once (the small kernels' orientation)
    out = np.empty((windows.shape[0] * rows, right.shape[1]), dtype=np.result_type(windows, right))
    images = buf.shape[0]
    if (_STACKED_PARTS[0] and getattr(_IN_PART, "split", False) and len(chunks) > 1 and windows.dtype == right.dtype
            and images * rows * width * right.shape[1] <= threads.SMALL_GEMM_MACS):
        return _im2col_product_stacked(windows, right, images, rows, width, out)
    for nb in chunks:
        m = nb.stop - nb.start
        np.copyto(buf[:m], windows[nb])
        _chunk_gemm(buf[:m].reshape(m * rows, width), right, out[nb.start * rows:nb.stop * rows])
    return out


# A part of a batch split between threads (``_over_batch``) makes its forward im2col product in FEW, LONG NumPy calls:
# per group of about _PART_GATHER_BYTES of cols, one gather of the group's windows (into a buffer kept per thread: a
# fresh one page-faults every call) and one stacked np.matmul over its chunks -- the same chunk products as the loop
# above, so the same bits -- instead of a gather and a product per chunk of ~4 images (64 calls a part of LeNet's
# conv2 at batch 256).  On the 2-core VM a thread whose short call ends while the other holds the GIL waits 50-120 us
# to run again (docs/measurements/cpu_2026-11-26_2core.md, session 9); long calls let both threads run at once.  On
# one thread (no split) the loop stays: the whole part's cols leave the L2 cache (measured there: 2488 -> 2785 us).
# Measured (round 2), LeNet conv2's forward at batch 256 on 2 threads, min / median of 40 alternated calls: 1681/2360
# -> 1572/2005 and 1523/1739 -> 1368/1519 us (one loaded run even); groups of 2 MiB against 4 MiB, 1 MiB, 512 KiB
# and the whole part (7.7 MB): 2 MiB the fastest (the others 4-8% slower in median, the whole part 20%).
_STACKED_PARTS = [True]
_PART_GATHER_BYTES = 2 << 20
_IN_PART = threading.local()         # .split: True while this thread runs a part of a split batch (_over_batch)
_PART_BUFFERS = threading.local()


def _part_buffer(shape, dtype):
    held = getattr(_PART_BUFFERS, "held", None)
    if held is None or held.shape != shape or held.dtype != dtype:
        held = _PART_BUFFERS.held = np.empty(shape, dtype=dtype)
    return held


def _im2col_product_stacked(windows, right, images, rows, width, out):
    """_im2col_product's loop in groups of whole chunks: one gather and one stacked product a group."""
    n, K = windows.shape[0], right.shape[1]
    per_image = math.prod(windows.shape[1:]) * windows.itemsize
    group = max(1, _PART_GATHER_BYTES // (per_image * images)) * images        # whole chunks a group
    group = min(group, -(-n // images) * images)
    buf = _part_buffer((group, *windows.shape[1:]), windows.dtype)
    for n0 in range(0, n, group):
        m = min(group, n - n0)
        np.copyto(buf[:m], windows[n0:n0 + m])
        full = m // images * images
        dest = out[n0 * rows:(n0 + full) * rows]
        np.matmul(buf[:full].reshape(-1, images * rows, width), right, out=dest.reshape(-1, images * rows, K))
        if full < m:
            np.matmul(buf[full:m].reshape(-1, width), right, out=out[(n0 + full) * rows:(n0 + m) * rows])
    return out


def _im2col_gram(windows, dy_rows):
    """cols^T @ dy_rows, (kernel*C, K): the filter gradient's product, summed chunk by chunk in batch order."""
    buf, chunks = _im2col_chunks(windows, dy_rows.shape[1])
    rows = math.prod(windows.shape[1:1 + (windows.ndim - 2) // 2])
    width = math.prod(windows.shape[1 + (windows.ndim - 2) // 2:])
    acc = (np.empty if chunks else np.zeros)((width, dy_rows.shape[1]), dtype=np.result_type(windows, dy_rows))
    part = np.empty_like(acc)
    for i, nb in enumerate(chunks):
        m = nb.stop - nb.start
        np.copyto(buf[:m], windows[nb])
        _chunk_gemm(buf[:m].reshape(m * rows, width).T, dy_rows[nb.start * rows:nb.stop * rows],
                    acc if i == 0 else part)
        if i:
            acc += part
    return acc


def _chunk_gemm(a, b, out):
    """One chunk's product into ``out``: np.matmul straight where it is a small-kernel product already (the operands
    are in their orientation: the chunk a view of the buffer, b C-ordered), else _gemm's blocks."""
    if a.dtype == b.dtype and a.shape[0] * a.shape[1] * b.shape[1] <= threads.SMALL_GEMM_MACS:
        return np.matmul(a, b, out=out)
    return _gemm(a, b, out=out)


def _rows(a):
    """(N, C, *S) -> (N*S, C) channels-last rows (a copy unless a is channels-last in memory)."""
    return np.ascontiguousarray(np.moveaxis(a, 1, -1)).reshape(-1, a.shape[1])


# ---- the products: blocks that OpenBLAS's small-matrix kernels take (threads.blas_small_kernels) ---------------
#
# A convolution's products are skinny: a few output channels (6 and 16 in LeNet) against thousands of positions.
# Where the BLAS has small-matrix kernels (threads.py: OpenBLAS on AVX-512 x86), a product above SMALL_GEMM_MACS is cut
# into even blocks of at most that many multiply-adds along its longest axis (rows, columns, or the inner axis, whose
# blocks' products are added in order), and an F-ordered right operand beside a C-ordered left one (the one
# orientation those kernels refuse) has the smaller of the two copied first, where that copy is small beside the
# product (``_small_ready``).  Measured on the 2-core Zen 4
# machine, one thread, whole product against blocks: LeNet conv2 forward at batch 64 (6400, 150) x (150, 16) 389 ->
# 290 us, its filter gradient (150, 6400) x (6400, 16) 391 -> 300, conv1's flat forward chunk (6, 25) x (25, 25984)
# 164 -> 84, conv16's chunk (16, 144) x (144, 4352) 260 -> 205, the digits conv2's backward data (2048, 400) x
# (400, 6) 267 -> 107.  The blocks depend only on the shapes (results do not depend on the thread count); the small
# kernels sum in another order than the packed ones, so the last bits differ from an unblocked product.  Products of
# at least MIN_PARALLEL_BLAS_WORK that get all of BLAS's threads (threads.blas_threads_for) stay whole, as do products
# with more than _SKINNY output rows and columns (the packed kernels do well there) and blocks shorter than _MIN_BLOCK
# along the cut axis.

_MIN_BLOCK = 128
_matmul = np.matmul                # the blocks' product (a name of this module's, so tests can watch the calls)
_SKINNY = 16                       # blocks only for products with at most this many rows or columns of output: wider
                                   # ones ran as fast or faster whole ((64, 400) x (400, 120) 83 -> 88 us blocked,
                                   # (48, 48) x (48, 4624) 226 -> 236, (4352, 72) x (72, 32) 219 -> 214), and so did
                                   # a short inner axis with a wide output ((128, 16) x (16, 32768) 3.8 -> 5.7 ms)


def _gemm(a, b, out=None, product=cpu_matmul):
    """a (M, K) @ b (K, N) (into ``out``) by ``product`` (cpu_matmul, or np.matmul on a thread's own chunks), in
    small-kernel blocks where that applies (above)."""
    if (a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype or a.dtype.char not in "fd"
            or not threads.blas_small_kernels()):
        return product(a, b, out=out)
    (M, K), N = a.shape, b.shape[1]
    macs = M * K * N
    if macs > threads.SMALL_GEMM_MACS and (min(M, N) > _SKINNY or (
            product is cpu_matmul and macs >= threads.MIN_PARALLEL_BLAS_WORK and threads._threads() > 1)):
        return product(a, b, out=out)            # (the latter: all of BLAS's threads, blas_threads_for)
    ready = _small_ready(a, b, macs)
    axis = max(range(3), key=lambda i: (M, N, K)[i])
    length = (M, N, K)[axis]
    step = -(-length // -(-macs // threads.SMALL_GEMM_MACS))      # even blocks of at most SMALL_GEMM_MACS
    if ready is None or (step < _MIN_BLOCK and macs > threads.SMALL_GEMM_MACS):
        return product(a, b, out=out)
    product = _matmul                            # each product below is under the BLAS grain (one BLAS thread)
    if macs <= threads.SMALL_GEMM_MACS:
        return product(*ready, out=out)
    a, b = ready
    if out is None:
        out = np.empty((M, N), dtype=a.dtype)
    if _STACKED_GEMM[0] and length // step > 1:
        return _stacked_gemm_blocks(a, b, axis, step, out)
    if axis == 0:
        for i in range(0, M, step):
            product(a[i:i + step], b, out=out[i:i + step])
    elif axis == 1:
        for j in range(0, N, step):
            product(a, b[:, j:j + step], out=out[:, j:j + step])
    else:
        product(a[:, :step], b[:step], out=out)
        for i in range(step, K, step):
            out += product(a[:, i:i + step], b[i:i + step])
    return out


# _gemm's blocks as ONE stacked np.matmul (strided views of the operands and of ``out``: NumPy runs the same BLAS
# product per block, the whole stack without the GIL) instead of a call per block: rows or columns of the result are
# written where the loop writes them, and inner-axis blocks are summed by one np.sum over the stack in the loop's order
# (as _stacked_blocks), so the bits are the loop's (tested).  Fewer, longer NumPy calls per chunk: on the 2-core VM,
# two threads doing many short calls take turns on the GIL (docs/measurements/cpu_2026-11-26_2core.md, session 9).
# Measured there (round 2): 1 thread even ((48, 4556) x (4556, 16) 72.5 -> 72.0 us, (6, 25) x (25, 25984) 92 -> 88);
# 2 threads, alternated calls, median on/off: LeNet conv1's forward at batch 256 (4 column blocks a chunk) 0.87-0.99,
# conv16's filter gradient (4 inner blocks a product) 0.88-0.97.  False: the loop.
_STACKED_GEMM = [True]


def _stacked_gemm_blocks(a, b, axis, step, out):
    """_gemm's blocks of ``step`` along ``axis`` (0: rows of a, 1: columns of b, 2: the inner axis) of a @ b into
    ``out``: the whole blocks as one stacked product, then the last, shorter block (if any) as the loop runs it.
    The stacks are reshapes of one axis into two (always views: as_strided cost ~5 us a call)."""
    (M, K), N = a.shape, b.shape[1]
    if axis == 2:
        return _stacked_blocks(a, b, step, out)
    if axis == 0:
        cut = M // step * step
        np.matmul(a[:cut].reshape(-1, step, K), b, out=_split_view(out[:cut], 0, step))
        if cut < M:
            np.matmul(a[cut:], b, out=out[cut:])
        return out
    cut = N // step * step
    np.matmul(a, _split_view(b[:, :cut], 1, step), out=_split_view(out[:, :cut], 1, step))
    if cut < N:
        np.matmul(a, b[:, cut:], out=out[:, cut:])
    return out


def _split_view(m, axis, step):
    """The 2-D ``m`` with ``axis`` cut into blocks of ``step``, the blocks first: (blocks, step, n) for axis 0,
    (blocks, rows, step) for axis 1 -- a view (writes go to ``m``)."""
    if axis == 0:                   # (cutting one axis in two is always a view, whatever the strides)
        return m.reshape(m.shape[0] // step, step, m.shape[1])
    return m.reshape(m.shape[0], m.shape[1] // step, step).transpose(1, 0, 2)


def _small_ready(a, b, macs):
    """(a, b) in an orientation the small kernels take, or None.  A row-major a (unit stride along its rows) with a b
    that is not is the orientation they refuse: the smaller operand is copied (b to C order, or a to F order) where
    that copy is small beside the product (at most macs / 64 elements: a weight matrix, as LeNet conv2's (150, 16)),
    else None (a filter gradient's (25, 3712) x (3712, 6) block: its copy of dy cost as much as the product)."""
    if a.strides[1] == a.itemsize and b.strides[1] != b.itemsize and b.shape[1] > 1:
        if 64 * min(a.size, b.size) > macs:
            return None
        if b.size <= a.size:
            return a, np.ascontiguousarray(b)
        return np.asfortranarray(a), b
    return a, b


_INNER_BLOCK = 4096                # longest inner axis of one filter-gradient GEMM (see _filter_product)


def _filter_product(a, b, out=None, product=cpu_matmul):
    """a (M, L) @ b (L, N) for the filter gradients' products: a long inner axis (positions) and a small result
    (kernel*C x K).  OpenBLAS runs these 2-2.5x slower once L passes ~4-8k ((25, 26k) x (26k, 6), LeNet's first
    layer at batch 64: 24 against 73 GF/s at L = 4096), so L is cut into even blocks of at most _INNER_BLOCK and the
    blocks' products added in order (the same blocks whatever the thread count); each block goes through ``_gemm``
    (smaller blocks still where the small-matrix kernels apply).  Where every block is one small product already,
    the blocks run as one stacked product (``_stacked_blocks``)."""
    length = a.shape[-1]
    blocks = -(-length // _INNER_BLOCK)
    if blocks < 2:
        return _gemm(a, b, out=out, product=product)
    step = -(-length // blocks)
    if (_STACKED_BLOCKS[0] and a.ndim == b.ndim == 2 and a.dtype == b.dtype and a.dtype.char in "fd"
            and a.shape[0] * step * b.shape[1] <= threads.SMALL_GEMM_MACS):
        return _stacked_blocks(a, b, step, out)
    acc = _gemm(a[:, :step], b[:step], out=out, product=product)
    for i in range(step, length, step):
        acc += _gemm(a[:, i:i + step], b[i:i + step], product=product)
    return acc


# The blocks of a filter-gradient product above, where each is one small product (LeNet's first layer: (25, 3584) x
# (3584, 6) at batch 256, 7 blocks a chunk of 28 images; the digits LeNet's first layer, 2 blocks a call), as ONE
# np.matmul over a stack of the blocks (strided views of a and b: NumPy runs the same BLAS product per block, without
# the GIL for the whole stack) and one np.sum over the stack -- the blocks' products added in the same order: the loop's
# bits wherever its blocks are plain products of the same operands, as in LeNet's layers (tested) -- instead of a
# product and an add per block.  On the 2-core VM, two threads doing many short
# NumPy calls mostly take turns: a thread waiting for the GIL (asleep on a halted virtual CPU) wakes too late to take
# it back between the other's short calls, so their chunks ran one thread at a time (docs/measurements/
# cpu_2026-11-26_2core.md, session 9).  Measured there, LeNet's first layer's filter gradient, min / median of 20
# alternated calls: batch 256, 2 threads 2986/3148 -> 1947/2561 us, 1 thread 2640/2738 -> 2436/2624; batch 64, 1
# thread 654/699 -> 607/642.  _STACKED_BLOCKS[0] = False: the loop.
_STACKED_BLOCKS = [True]


def _stacked_blocks(a, b, step, out):
    """a (M, L) @ b (L, N) by blocks of ``step`` along L: the whole blocks as one stacked product, summed in order,
    then the last, shorter block (if any) added."""
    cut = a.shape[1] // step * step
    acc = np.sum(np.matmul(_split_view(a[:, :cut], 1, step), _split_view(b[:cut], 0, step)), axis=0, out=out)
    if cut < a.shape[1]:
        acc += np.matmul(a[:, cut:], b[cut:])
    return acc


def _w_mat(w):
    """(K, C, *kernel) -> (K, kernel*C), taps before channels (a small copy)."""
    return np.ascontiguousarray(np.moveaxis(w, 1, -1)).reshape(w.shape[0], -1)


def _from_rows(rows, n, spatial):
    """(N*S, C) -> channels-first (N, C, *S) view of the channels-last rows."""
    return np.moveaxis(rows.reshape(n, *spatial, rows.shape[-1]), -1, 1)


def _tap_window(tap, p: ConvProblem):
    """The padded-input slices tap ``tap`` reads for every output position (one stride per axis)."""
    return tuple(slice(r * d, r * d + s * (o - 1) + 1, s)
                 for r, d, s, o in zip(tap, p.dilation, p.stride, p.out_size))


def _taps(p: ConvProblem):
    return itertools.product(*(range(r) for r in p.kernel))


def _crop_channels_first(a_cl, p: ConvProblem):
    """Padded channels-last dx -> the channels-first (N, C, *in) view of its interior."""
    inner = a_cl[(slice(None), *(slice(q, q + i) for q, i in zip(p.padding, p.in_size)), slice(None))]
    return np.moveaxis(inner, -1, 1)


# ---- one primitive over parts of its batch, one part per thread (threads.parallel_spans) ------------------------

def _over_batch(p: ConvProblem, part, work=None):
    """``part(q, nb)`` (the result for images ``nb``, q the problem of that part) over the whole batch: one call
    below the split grain or on one thread, else one part per thread (threads.split_spans), the parts written into
    one array laid out as the first finished part (channels-first or channels-last memory).  Each image's result is
    computed by the same form as unsplit, so the values are the same (tests/backend/test_cpu_split.py)."""
    spans = split_spans(p.N, p.macs if work is None else work)
    if len(spans) == 1:
        return part(p, slice(None))
    out, lock = [None], threading.Lock()

    def run(nb):
        _IN_PART.split = True
        try:
            r = part(dataclasses.replace(p, N=nb.stop - nb.start), nb)
        finally:
            _IN_PART.split = False
        with lock:
            if out[0] is None:
                out[0] = _empty_like_layout(r, (p.N, *r.shape[1:]))
        out[0][nb] = r
    parallel_spans(run, spans)
    return out[0]


def _empty_like_layout(r, shape):
    """An empty array of ``shape``, channels-last in memory where ``r`` is (its channel axis the most contiguous)."""
    if r.ndim > 2 and r.strides[1] < r.strides[-1]:
        return np.moveaxis(np.empty((shape[0], *shape[2:], shape[1]), dtype=r.dtype), -1, 1)
    return np.empty(shape, dtype=r.dtype)


def _summed_over_batch(p: ConvProblem, part, work=None):
    """``part(q, nb)`` summed over the batch (a filter gradient): one call below the split grain or on one thread,
    else one part per thread and the parts' results added in batch order, in float32 (float64 for float64 data).
    The split changes the order of the sum over the images, hence the last bits (tested against float64)."""
    spans = split_spans(p.N, p.macs if work is None else work)
    if len(spans) == 1:
        return part(p, slice(None))
    parts = parallel_spans(lambda nb: part(dataclasses.replace(p, N=nb.stop - nb.start), nb), spans)
    total = np.array(parts[0], dtype=np.result_type(parts[0].dtype, np.float32), copy=True)
    for r in parts[1:]:
        total += r
    return total.astype(parts[0].dtype, copy=False)


# ---- dense (groups == 1): one BLAS call per direction --------------------------------------------------

def _gather_channels_first(p: ConvProblem) -> bool:
    """Which layout gathers cols in longer contiguous runs: channels-last copies runs of kernel_w*C elements,
    channels-first runs of out_w (stride 1).  LeNet's first layer (C=1, 5x5 on 28 columns): 5 against 28."""
    inner_cl = p.kernel[-1] * p.C if p.dilation[-1] == 1 else p.C
    inner_cf = p.out_size[-1] if p.stride[-1] == 1 else 1
    return inner_cf > inner_cl


def _cols_t(x, p: ConvProblem):
    """cols^T (C*kernel, N*out), rows ordered (channel, tap) like w's own (K, C, *kernel) layout: the
    channels-first gather, from a (C, *kernel, N, *out) window view of the padded x."""
    if any(p.padding):
        xpad = np.zeros((p.N, p.C, *p.padded_size), dtype=x.dtype)
        xpad[(slice(None), slice(None), *(slice(q, q + i) for q, i in zip(p.padding, p.in_size)))] = x
    else:
        xpad = x                    # the window view reads x in place, whatever its strides
    sn, sc, *ss = xpad.strides
    shape = (p.C, *p.kernel, p.N, *p.out_size)
    strides = (sc, *(st * d for st, d in zip(ss, p.dilation)), sn, *(st * s for st, s in zip(ss, p.stride)))
    view = np.lib.stride_tricks.as_strided(xpad, shape=shape, strides=strides, writeable=False)
    return _gather(view, 1 + p.nd).reshape(p.C * math.prod(p.kernel), p.N * math.prod(p.out_size))


# ---- 2-D, stride 1 along the height: gather along the width only, shift rows for the kernel's height ------
#
# With x_cl flattened to rows (n, h, q) of the width windows A[(n, h, q), (s, c)] = x_cl[n, h, q*sw + s*dw, c],
# output row (n, p, q) needs input rows h = p + r*dh: row index + r*dh*Q.  So y = sum over r of A shifted by
# r*dh*Q rows, times w's slice r: R products of contiguous row ranges (no copy), and a gather R times smaller
# than im2col's.  Rows whose p falls past the output are computed and dropped (or, in backward filter,
# multiplied by zeros).

_SMALL_COLS_BYTES = 4 << 20    # im2col this small stays in the caches: the whole cols and one GEMM win (measured)
# The row shift's rule: above this much cols (the whole im2col matrix).  It was 4 MiB (_SMALL_COLS_BYTES), measured
# against an im2col that gathered the whole cols before its one GEMM: 1 thread, LeNet's conv2 forward at batch 64
# (3.8 MB of cols) 0.82 -> 0.68 ms with im2col, backward filter 0.97 -> 0.78; the digits LeNet's conv2 0.30 -> 0.24
# and 0.48 -> 0.36; at batch 256 (15 MB) the row shift faster (3.4 vs 4.0 ms forward).  Since then im2col gathers
# and multiplies a chunk of images at a time (_im2col_product / _im2col_gram: the cols never leave the L2 cache),
# and it wins above 4 MiB too -- measured in session 8 (in-process A/B, min of 12 alternated rounds;
# docs/measurements/cpu_2026-11-26_2core.md): LeNet's conv2 forward at batch 128 / 256 / 512 3.2 / 6.2 / 10.8 ms
# with the row shift against 1.3 / 2.7 / 5.2 with im2col (1 thread; 2 threads: 3.0 / 7.2 / 12.0 against 1.3 / 2.5
# / 5.2), its filter gradient even on 1 thread and 3.9 -> 2.8 ms at batch 256 on 2; channels-last, N128 C=K=16 32x32
# 3x3: forward 12.8 -> 11.3 ms, filter gradient 11.9 -> 11.4, data gradient 12.8 -> 11.3; N32 C=K=64: filter
# gradient 39.7 -> 28.9, the others even; only channels-last N32 C=K=16 on 1 thread ran ~10% faster row-shifted
# (2.48 against 2.72 ms forward; on 2 threads 2.99 against 2.77).  So the row shift is no longer chosen (it stays
# for the tests, which lower this, and for a re-measurement).
_ROW_SHIFT_MIN_COLS_BYTES = math.inf


def _row_shift_applies(p: ConvProblem):
    return (p.nd == 2 and p.stride[0] == 1 and p.kernel[0] > 1 and not _gather_channels_first(p)
            and p.N * math.prod(p.out_size) * math.prod(p.kernel) * p.C * p.itemsize
            > _ROW_SHIFT_MIN_COLS_BYTES)


def _width_rows(x_cl, q_out, p: ConvProblem):
    """A (N*H*Q, S*C): width windows of every row of the padded channels-last x (one gather)."""
    n, h, _, c = x_cl.shape
    sn, sh, sw, sc = x_cl.strides
    view = np.lib.stride_tricks.as_strided(x_cl, shape=(n, h, q_out, p.kernel[1], c),
                                           strides=(sn, sh, sw * p.stride[1], sw * p.dilation[1], sc),
                                           writeable=False)
    return _gather(view, 0).reshape(n * h * q_out, p.kernel[1] * c)


def _row_shift_products(a, w_rows, shift, rows_out):
    """out[:L] = sum_r a[r*shift : r*shift + L] @ w_rows[r], L = rows_out - (R-1)*shift; rows past L stay 0."""
    R = w_rows.shape[0]
    length = rows_out - (R - 1) * shift
    out = np.zeros((rows_out, w_rows.shape[-1]), dtype=a.dtype)
    _gemm(a[:length], w_rows[0], out=out[:length])
    for r in range(1, R):
        out[:length] += _gemm(a[r * shift:r * shift + length], w_rows[r])
    return out


def _row_shift_correlate(x_cl, w_rows, p: ConvProblem, out_hw):
    """Cross-correlation of the padded channels-last x_cl (N, H, W, C) with w_rows (R, S*C, K), stride 1 along H:
    the channels-first (N, K, *out_hw) view of a channels-last result."""
    n, h = x_cl.shape[:2]
    a = _width_rows(x_cl, out_hw[1], p)
    y = _row_shift_products(a, w_rows, p.dilation[0] * out_hw[1], a.shape[0])
    return np.moveaxis(y.reshape(n, h, out_hw[1], -1)[:, :out_hw[0]], -1, 1)


def _rows_of_w(w):
    """(K, C, R, S) -> (R, S*C, K): kernel row r's weights as the right-hand matrix of its product."""
    K, C, R, S = w.shape
    return np.ascontiguousarray(w.transpose(2, 3, 1, 0)).reshape(R, S * C, K)


# ---- stride 1, channels-first memory: flat im2col per chunk of images, one GEMM per chunk -------------------
#
# Each image's C planes are zero-padded into a flat buffer (C, row_len) of rows of the padded grid.  Output
# position l of that grid reads the input at l + offset(tap) (offset(tap) = sum_d tap_d * dilation_d *
# grid_stride_d), so the im2col rows of tap t are the buffer's rows shifted by offset(t): contiguous copies of
# whole rows (out_h * grid_w elements), not of kernel_w*C runs, and no NCHW -> NHWC transpose (numpy's transposes
# ran at ~3 ns per element: 6.5 ms of conv64's 50 ms forward).  One GEMM per chunk of images:
#     forward          y_grid (K, m*L)  = w_mat (K, taps*C) @ cols (taps*C, m*L)
#     backward filter  dw_mat (K, taps*C) += dy_grid (K, m*L) @ cols^T           (dy on the grid, 0 elsewhere)
#     backward data    stride 1: the forward form on dy padded by d*(r-1) - padding, flipped and swapped w
# The grid's padding columns are computed and dropped (grid_w / out_w more work: 34/32 on CIFAR-sized 3x3 layers).
# Chunks hold about _FLAT_COLS_BYTES of cols, so they stay in the L2/L3 caches between the copy and the GEMM; the
# chunking depends only on the shapes, so results do not depend on the thread count.  Where there are chunks
# enough, they go to minidnn's threads one at a time, each thread copying and multiplying its own chunks (its
# GEMMs on one BLAS thread): a thread whose core another process holds takes fewer chunks, where BLAS's own split
# of one GEMM waits for its slowest thread (conv64 on the shared 2-core machine: 0.6-1.5 s with two BLAS threads).

_FLAT_COLS_BYTES = 2560 * 1024
_COL2IM_BYTES = 4096 * 1024        # dcols of one chunk in _flat_col2im (measured: 1 MiB 1.7x slower, fewer
                                   # and larger calls win)


def _flat_dense_plan(p: ConvProblem, in_size, padding, out_size, channels, itemsize):
    """(grid, tap offsets, length, row_len, images) of a flat im2col: the same for every call of one problem, so
    computed once (the tap offsets' Python was ~10 us a call)."""
    return _flat_dense_plan_of(p, tuple(in_size), tuple(padding), tuple(out_size), channels, itemsize,
                               _FLAT_COLS_BYTES)


@functools.lru_cache(maxsize=256)
def _flat_dense_plan_of(p: ConvProblem, in_size, padding, out_size, channels, itemsize, chunk_bytes):
    grid = tuple(i + 2 * q for i, q in zip(in_size, padding))
    grid_strides = [math.prod(grid[d + 1:]) for d in range(p.nd)]
    offsets = tuple(sum(t * d * s for t, d, s in zip(tap, p.dilation, grid_strides)) for tap in _taps(p))
    length = out_size[0] * grid_strides[0]
    row_len = max(math.prod(grid), offsets[-1] + length)
    images = max(1, min(p.N, chunk_bytes // (len(offsets) * channels * length * itemsize)))
    return grid, offsets, length, row_len, images


def _flat_dense_chunks(a, p: ConvProblem, padding, in_size, out_size):
    """(chunks, setup, fill) for the flat im2col of channels-first a: the image slices (about _FLAT_COLS_BYTES of
    cols each), ``setup()`` making one thread's buffers, and ``fill(buffers, nb)`` writing chunk nb's cols and
    returning its (taps*C, m*L) view (rows BLAS-addressable)."""
    N, C = a.shape[:2]
    grid, offsets, length, row_len, images = _flat_dense_plan(p, in_size, padding, out_size, C, a.itemsize)
    interior = (slice(None), slice(None), *(slice(q, q + i) for q, i in zip(padding, in_size)))
    chunks = [slice(n0, min(N, n0 + images)) for n0 in range(0, N, images)]

    tap_steps = [d * math.prod(grid[k + 1:]) for k, d in enumerate(p.dilation)]

    def setup():
        buf = np.zeros((images, C, row_len), dtype=a.dtype)
        cols = np.empty((len(offsets), C, images * length), dtype=a.dtype)
        # source[tap.., c, n, l] = buf[n, c, offset(tap) + l], dest[tap.., c, n, l] = cols[tap, c, n*L + l]: the
        # gather of every tap is one strided copy (a copy per tap made 9 calls per chunk for a 3x3 kernel)
        item = buf.itemsize
        source = np.lib.stride_tricks.as_strided(
            buf, shape=(*p.kernel, C, images, length),
            strides=(*(s * item for s in tap_steps), buf.strides[1], buf.strides[0], item), writeable=False)
        dest = np.lib.stride_tricks.as_strided(
            cols, shape=(*p.kernel, C, images, length),
            strides=(*(cols.strides[0] * math.prod(p.kernel[k + 1:]) for k in range(p.nd)), cols.strides[1],
                     length * item, item))
        return buf, cols, source, dest

    def fill(buffers, nb):
        buf, cols, source, dest = buffers
        m = nb.stop - nb.start
        buf[:m, :, :math.prod(grid)].reshape(m, C, *grid)[interior] = a[nb]
        dest[..., :m, :] = source[..., :m, :]
        used = cols[:, :, :m * length]
        return used.reshape(len(offsets) * C, m * length) if m == images else _rows_view(used)
    return chunks, setup, fill


def _chunk_product(chunks, work):
    """The matrix product for per-chunk GEMMs: where the chunks are shared between minidnn's threads, each GEMM runs
    on its thread's one BLAS thread (np.matmul: threads that wait on each other's cores are avoided, and OpenBLAS's
    workers never spin); where they are not, cpu_matmul's BLAS grain decides."""
    return np.matmul if parallel_parts(len(chunks), work) > 1 else cpu_matmul


def _rows_view(used):
    """(taps, C, m*L) with a row stride longer than m*L -> a (taps*C, m*L) view (rows stay BLAS-addressable)."""
    taps, C, width = used.shape
    return np.lib.stride_tricks.as_strided(used, shape=(taps * C, width), strides=(used.strides[1], used.strides[2]),
                                           writeable=False)


def _flat_dense_correlate(a, w_mat, p: ConvProblem, padding, in_size, out_size):
    """z (N, K, *out_size), C-contiguous: the stride-1 correlation of channels-first a (N, C, *in_size), padded by
    ``padding``, with w_mat (K, taps*C) (taps before channels)."""
    K = w_mat.shape[0]
    grid = tuple(i + 2 * q for i, q in zip(in_size, padding))
    z = np.empty((a.shape[0], K, *out_size), dtype=a.dtype)
    keep = (slice(None), slice(None), slice(None), *(slice(0, o) for o in out_size[1:]))
    chunks, setup, fill = _flat_dense_chunks(a, p, padding, in_size, out_size)
    work = a.shape[0] * w_mat.shape[1] * math.prod(out_size)             # cols elements
    product = _chunk_product(chunks, work)

    def body(buffers, nb):
        y_grid = _gemm(w_mat, fill(buffers, nb), product=product).reshape(K, nb.stop - nb.start, out_size[0],
                                                                           *grid[1:])
        z[nb] = y_grid[keep].swapaxes(0, 1)
    parallel_for(chunks, body, work, setup)
    return z


# ---- stride 1, 2-D, channels-first, few output channels: the width taps only, the kernel's rows in one GEMM ------
#
# Forward and backward data (the same correlation).  Like the flat im2col above, but only the S width taps are
# gathered, over each image's whole padded grid (G = grid_h * grid_w positions): B (S*C, m*G),
# B[(s, c), n*G + j] = buf[n, c, j + s*dw].  The R kernel rows become R blocks of output rows of one GEMM, then
# R-1 adds of ranges shifted by whole grid rows:
#     Y (R*K, m*G) = w_rows (R*K, S*C) @ B          w_rows[(r, k), (s, c)] = w[k, c, r, s]
#     y[k, j]      = sum_r Y[r*K + k, j + r*dh*grid_w]
# The same multiply-adds as im2col's (K, R*S*C) @ (R*S*C, m*L), over G instead of L = out_h*grid_w positions
# (34/32 at CIFAR's 3x3 layers), with a gather R times smaller and R*K rows instead of K, a shape OpenBLAS runs
# faster: (48, 48) x (48, 4624) in 226 us against (16, 144) x (144, 4352) in 267 (1 thread).  Measured per
# direction, N32 32x32 3x3, 1 thread: C=K=8 1.37 -> 0.92 ms, 16 3.1 -> 2.6, 32 9.3 -> 8.5; C=K=64 (192 rows)
# 30.4 -> 31.5, slower, hence _FLAT_ROWS_MAX_ROWS.  (Tried: R products of K rows against B shifted by whole rows, in
# small-matrix blocks, for K <= 16: C=K=16 forward + backward data 5.28 -> 5.19 ms on 1 thread but 3.21 -> 3.80 on 2,
# the chunks' 14 calls instead of 3 passing the GIL between the threads.)  The filter gradient's stacked form (B @ D^T
# with dy placed once per kernel row) ran 3.3 -> 3.5 ms at C=K=16; its R products against B shifted are
# _flat_rows_filter below.  The chunks are the flat im2col's (the same parallel grain); the sums differ from it, so
# the bits do too.

_FLAT_ROWS_MAX_ROWS = 96           # R*K: (48, 48) and (96, 96) products won, (192, 192) lost
_FLAT_ROWS_MIN_INNER = 12          # S*C: a shorter inner axis lost -- LeNet's first layer (5x5, C=1: 5) 0.69 -> 1.58 ms
                                   # at batch 64, 3x3 over C=3 (9) 0.57 -> 0.67; C=4 (12) 1.47 -> 1.01, C=3 5x5 (15)
                                   # 1.20 -> 0.96


def _flat_rows_applies(p: ConvProblem, outputs, inputs):
    """For a correlation of ``inputs`` channels into ``outputs`` (the forward's C -> K; backward data's K -> C)."""
    return (p.nd == 2 and p.kernel[0] > 1 and outputs * p.kernel[0] <= _FLAT_ROWS_MAX_ROWS
            and inputs * p.kernel[1] >= _FLAT_ROWS_MIN_INNER)


def _flat_rows_correlate(a, w, p: ConvProblem, padding, in_size, out_size):
    """z (N, K, *out_size), C-contiguous: the stride-1 2-D correlation of channels-first a (N, C, *in_size), padded
    by ``padding``, with w (K, C, R, S)."""
    N = a.shape[0]
    K, C, R, S = w.shape
    grid, _, length, row_len, images = _flat_dense_plan(p, in_size, padding, out_size, C, a.itemsize)
    size = grid[0] * grid[1]
    shift = p.dilation[0] * grid[1]
    w_rows = np.ascontiguousarray(w.transpose(2, 0, 3, 1)).reshape(R * K, S * C)
    interior = (slice(None), slice(None), *(slice(q, q + i) for q, i in zip(padding, in_size)))
    chunks = [slice(n0, min(N, n0 + images)) for n0 in range(0, N, images)]
    z = np.empty((N, K, *out_size), dtype=np.result_type(a, w))
    work = N * R * S * C * math.prod(out_size)
    product = _chunk_product(chunks, work)

    def setup():
        buf = np.zeros((images, C, row_len), dtype=a.dtype)            # padded planes, zeros in the border
        cols = np.empty((S, C, images, size), dtype=a.dtype)
        item = buf.itemsize
        source = np.lib.stride_tricks.as_strided(buf, shape=(S, C, images, size),
                                                 strides=(p.dilation[1] * item, buf.strides[1], buf.strides[0], item),
                                                 writeable=False)
        return buf, cols, source, np.empty((K, images * size), dtype=z.dtype)

    def body(buffers, nb):
        buf, cols, source, y = buffers
        m = nb.stop - nb.start
        buf[:m, :, :size].reshape(m, C, *grid)[interior] = a[nb]
        cols[:, :, :m] = source[:, :, :m]                               # every width tap: one strided copy
        b = cols.reshape(S * C, -1) if m == images else _rows_view(cols[:, :, :m].reshape(S, C, m * size))
        rows = _gemm(w_rows, b, product=product)                        # (R*K, m*G)
        span = m * size - (R - 1) * shift
        out = y[:, :span]
        np.add(rows[:K, :span], rows[K:2 * K, shift:shift + span], out=out)
        for r in range(2, R):
            np.add(out, rows[r * K:(r + 1) * K, r * shift:r * shift + span], out=out)
        y_grid = y[:, :m * size].reshape(K, m, size)[:, :, :length].reshape(K, m, out_size[0], grid[1])
        z[nb] = y_grid[..., :out_size[1]].swapaxes(0, 1)
    parallel_for(chunks, body, work, setup)
    return z


def _flat_dense_applies(p: ConvProblem, *arrays):
    # stride 1 and channels-first memory (channels-last inputs keep the channels-last forms below), where the
    # grid's padding columns add at most a fifth to the work: measured, LeNet's 5x5 over 14 columns (14/10) ran
    # no faster this way and the digits LeNet's 8 -> 12 columns slower; 32/28 and 34/32 ran 1.2-1.6x faster
    return (all(s == 1 for s in p.stride) and all(a.strides[1] >= a.strides[-1] for a in arrays)
            and p.padded_size[-1] <= 1.2 * p.out_size[-1])


def _dense_forward_form(p: ConvProblem, x):
    """The forward form for the whole problem: ``form(q, x, w)`` on it or on a part of its batch (q: that part's
    problem).  Chosen once on the whole batch, so the parts run what the unsplit call runs."""
    if _flat_dense_applies(p, x):
        if _flat_rows_applies(p, p.K, p.C):
            return lambda q, x, w: _flat_rows_correlate(x, w, q, q.padding, q.in_size, q.out_size)
        return lambda q, x, w: _flat_dense_correlate(x, _w_mat(w), q, q.padding, q.in_size, q.out_size)
    if _gather_channels_first(p):
        def channels_first(q, x, w):
            y_t = _gemm(w.reshape(q.K, -1), _cols_t(x, q))              # (K, N*out)
            return np.moveaxis(y_t.reshape(q.K, q.N, *q.out_size), 0, 1)
        return channels_first
    if _row_shift_applies(p):
        return lambda q, x, w: _row_shift_correlate(_channels_last_padded(x, q.padding), _rows_of_w(w), q,
                                                    q.out_size)

    def im2col(q, x, w):
        windows = _windows(_channels_last_padded(x, q.padding), q.out_size, q.kernel, q.stride, q.dilation)
        y_rows = _im2col_product(windows, _w_mat(w).T)                    # (N*out, K)
        return _from_rows(y_rows, q.N, q.out_size)
    return im2col


def dense_forward(p: ConvProblem, x, w, tf32=False):
    form = _dense_forward_form(p, x)
    if _flat_dense_applies(p, x):             # shares its chunks out itself (parallel_for)
        return form(p, x, w)
    return _over_batch(p, lambda q, nb: form(q, x[nb], w))


def _dense_backward_filter_form(p: ConvProblem, x, dy):
    """``form(q, x, dy)``, as _dense_forward_form."""
    if _flat_dense_applies(p, x, dy):
        return _flat_rows_filter if _flat_rows_filter_applies(p) else _flat_dense_filter
    if _gather_channels_first(p):
        def channels_first(q, x, dy):
            dy_t = np.ascontiguousarray(np.moveaxis(dy, 1, 0)).reshape(q.K, -1)      # (K, N*out)
            # cols^T @ dy_t^T, not dy_t @ cols: with both operands' long axis contiguous, OpenBLAS runs this
            # (C*kernel, N*out) x (N*out, K) shape 1.3-1.5x faster than its transpose (LeNet's first layer)
            return np.ascontiguousarray(_filter_product(_cols_t(x, q), dy_t.T).T).reshape(q.w_shape)
        return channels_first
    if _row_shift_applies(p):
        def row_shift(q, x, dy):
            x_cl = _channels_last_padded(x, q.padding)
            n, h = x_cl.shape[:2]
            P, Q = q.out_size
            a = _width_rows(x_cl, Q, q)                                     # (N*H*Q, S*C)
            dy_grid = np.zeros((n, h, Q, q.K), dtype=dy.dtype)              # dy on the input's row grid, 0 elsewhere
            dy_grid[:, :P] = np.moveaxis(dy, 1, -1)
            d = dy_grid.reshape(-1, q.K)
            shift = q.dilation[0] * Q
            length = d.shape[0] - (q.kernel[0] - 1) * shift
            dw_rows = np.stack([_gemm(a[r * shift:r * shift + length].T, d[:length])
                                for r in range(q.kernel[0])])
            return dw_rows.reshape(q.kernel[0], q.kernel[1], q.C, q.K).transpose(3, 2, 0, 1)   # (K, C, R, S)
        return row_shift

    def im2col(q, x, dy):
        windows = _windows(_channels_last_padded(x, q.padding), q.out_size, q.kernel, q.stride, q.dilation)
        dw_mat_t = _im2col_gram(windows, _rows(dy))                         # (kernel*C, K)
        return np.moveaxis(dw_mat_t.T.reshape(q.K, *q.kernel, q.C), -1, 1)
    return im2col


def dense_backward_filter(p: ConvProblem, x, dy, tf32=False):
    form = _dense_backward_filter_form(p, x, dy)
    if _flat_dense_applies(p, x, dy):         # shares its chunks out itself (parallel_for)
        return form(p, x, dy)
    return _summed_over_batch(p, lambda q, nb: form(q, x[nb], dy[nb]))


def _flat_dense_filter(p: ConvProblem, x, dy):
    """dw (K, C, *kernel) = sum over chunks of (cols @ dy_grid^T)^T, dy_grid (K, m*L) dy on the padded grid; the
    chunks' partial sums added in image order (the same result whatever the thread count)."""
    grid = p.padded_size
    length = p.out_size[0] * math.prod(grid[1:])
    chunks, setup, fill = _flat_dense_chunks(x, p, p.padding, p.in_size, p.out_size)
    images = chunks[0].stop - chunks[0].start
    partial = np.empty((len(chunks), math.prod(p.kernel) * p.C, p.K), dtype=np.result_type(x, dy))
    work = p.N * math.prod(p.kernel) * p.C * math.prod(p.out_size)
    product = _chunk_product(chunks, work)
    on_grid = (slice(None),) * 3 + tuple(slice(0, o) for o in p.out_size[1:])

    def setup_filter():
        return setup(), np.zeros((p.K, images * length), dtype=dy.dtype)    # zeros off the output positions

    def body(buffers, nb):
        (cols_buffers, d_grid), m = buffers, nb.stop - nb.start
        cols = fill(cols_buffers, nb)
        d = d_grid[:, :m * length]
        d.reshape(p.K, m, p.out_size[0], *grid[1:])[on_grid] = dy[nb].swapaxes(0, 1)
        # this orientation (long axes contiguous in both operands) runs faster in BLAS
        _filter_product(cols, d.T, out=partial[nb.start // images], product=product)
    parallel_for(chunks, body, work, setup_filter)
    dw_mat_t = partial.sum(axis=0)
    return np.moveaxis(dw_mat_t.T.reshape(p.K, *p.kernel, p.C), -1, 1)


# The filter gradient of the width-tap form above: per chunk of images B (S*C, m*G) as in _flat_rows_correlate, dy
# laid on the same grids (D (K, m*G), zeros off the output positions), and kernel row r's gradient is D against B
# shifted by r*dh grid rows -- a view, so R products and no gather of the R rows:
#     dw[:, :, r, :] (S*C, K) = B[:, r*shift : r*shift + span] @ D[:, :span]^T       span = m*G - (R-1)*shift
# (an output position's row p + r stays inside its own image's grid, since p < out_h = grid_h - (R-1)*dh).  Each
# product has K <= 16 columns, so it runs in OpenBLAS's small-matrix blocks (_gemm), which the stacked (R*K, S*C)
# form above does not reach.  Measured, 1 thread, process CPU time, N32 32x32 3x3: C=K=16 2.9-3.1 -> 2.6-2.7 ms,
# C=K=8 1.37-1.42 -> 1.23-1.31, C=3 -> K=16 1.15-1.33 -> 1.07-1.19 (inner axis 9: below the rule's 12); C=K=32 even
# (10.3-10.5 both ways: not skinny, the rule's K <= 16); LeNet's first layer (inner axis 5) 0.66 -> 1.14, slower.

def _flat_rows_filter_applies(p: ConvProblem):
    return (p.nd == 2 and p.kernel[0] > 1 and p.K <= _SKINNY and p.C * p.kernel[1] >= _FLAT_ROWS_MIN_INNER
            and threads.blas_small_kernels())


def _flat_rows_filter(p: ConvProblem, x, dy):
    """dw (K, C, R, S) for stride 1 through width-tap chunks; the chunks' partial sums added in image order (the
    same result whatever the thread count)."""
    N, K, C, (R, S) = p.N, p.K, p.C, p.kernel
    grid, _, _, row_len, images = _flat_dense_plan(p, p.in_size, p.padding, p.out_size, C, x.itemsize)
    size, shift = grid[0] * grid[1], p.dilation[0] * grid[1]
    interior = (slice(None), slice(None), *(slice(q, q + i) for q, i in zip(p.padding, p.in_size)))
    chunks = [slice(n0, min(N, n0 + images)) for n0 in range(0, N, images)]
    dtype = np.result_type(x, dy)
    partial = np.empty((len(chunks), R, S * C, K), dtype=dtype)
    work = N * R * S * C * math.prod(p.out_size)
    product = _chunk_product(chunks, work)

    def setup():
        buf = np.zeros((images, C, row_len), dtype=x.dtype)            # padded planes, zeros in the border
        cols = np.empty((S, C, images, size), dtype=x.dtype)
        source = np.lib.stride_tricks.as_strided(buf, shape=(S, C, images, size), writeable=False, strides=(
            p.dilation[1] * buf.itemsize, buf.strides[1], buf.strides[0], buf.itemsize))
        return buf, cols, source, np.zeros((K, images, *grid), dtype=dtype)   # dy's grids: zeros off the outputs

    def body(buffers, nb):
        buf, cols, source, d_grid = buffers
        m = nb.stop - nb.start
        buf[:m, :, :size].reshape(m, C, *grid)[interior] = x[nb]
        cols[:, :, :m] = source[:, :, :m]                               # every width tap: one strided copy
        b = cols.reshape(S * C, -1) if m == images else _rows_view(cols[:, :, :m].reshape(S, C, m * size))
        d_grid[:, :m, :p.out_size[0], :p.out_size[1]] = dy[nb].swapaxes(0, 1)
        span = m * size - (R - 1) * shift
        d_t = np.ascontiguousarray(d_grid.reshape(K, -1)[:, :span].T)  # (span, K): the small kernels' orientation
        for r in range(R):
            _gemm(b[:, r * shift:r * shift + span], d_t, out=partial[nb.start // images, r], product=product)
    parallel_for(chunks, body, work, setup)
    return partial.sum(axis=0).reshape(R, S, C, K).transpose(3, 2, 0, 1)


# Backward data, stride 1, where the full correlation's gather would be large (more output than input channels,
# LeNet's 6 -> 16 layer): col2im on the flat padded grid.  dy is laid on the padded input's grid (out_h rows of
# grid_w, zeros on the padding columns), images one padded grid apart, so each tap's dcols rows are added to the
# flat dx at ONE offset: per chunk of images, one GEMM dcols (C*taps, m*G) = w^T @ dy_grid, then per tap one add of
# contiguous runs of m*G elements per channel (channels-last col2im added runs of C: 6 floats in LeNet, and its
# per-tap products were skinny GEMMs).  An image's real outputs (the first out_w columns of its first out_h rows)
# reach at most its own grid's last element; the zero columns may spill into the next image's grid and add 0.

def _flat_col2im_applies(p: ConvProblem, dy):
    # the GEMM runs over the whole padded grid: measured no faster than the per-tap form where the grid is more than
    # twice the output (the digits LeNet's conv2: 12x12 for 8x8, 0.55 ms both ways), 1.3-1.4x faster at 14x14 for
    # 10x10 (LeNet's conv2 at batch 64 and 256)
    return (all(s == 1 for s in p.stride) and dy.strides[1] >= dy.strides[-1]
            and math.prod(p.padded_size) <= 2 * math.prod(p.out_size))


def _flat_col2im(p: ConvProblem, w, dy):
    """dx (N, C, *in) for stride 1: col2im on the flat padded grid (a view of a channel-major padded result).  dy
    fills only the first out_h rows of each image's grid (``length`` positions; the rows below would hold zeros and
    add nothing), so the GEMM runs over out_h * grid_w positions an image, not the whole grid: LeNet's conv2 140 of
    196.  The width taps are first folded together along the flat rows (``_fold_width_taps``: contiguous adds); then
    one add per tap of the leading axes goes into dx image by image (runs of ``length`` into grids ``size`` apart).
    Measured, 1 thread, LeNet's conv2 at batch 64: 1.58 ms on the whole grid with 25 contiguous adds, 1.40 over the
    rows with 25 strided adds, 1.07 with the width folded; batch 256 6.3 -> 5.4 -> 4.2 ms."""
    grid = p.padded_size
    size = math.prod(grid)
    row = math.prod(grid[1:])
    length = p.out_size[0] * row if _COL2IM_ROWS[0] else size
    offsets = _flat_dense_plan(p, p.in_size, p.padding, p.in_size, p.C, 1)[1]       # the taps' offsets on the grid
    taps = len(offsets)
    images = max(1, min(p.N, _COL2IM_BYTES // (taps * p.C * length * dy.itemsize)))
    dtype = np.result_type(w, dy)
    w_t = w.reshape(p.K, p.C * taps).T.astype(dtype, copy=False)       # (C*taps, K): rows (channel, tap), no copy
    d_grid = np.zeros((p.K, images * length), dtype=dtype)
    d_view = d_grid.reshape(p.K, images, length // row, *grid[1:])
    dcols = np.empty((p.C * taps, images * length), dtype=dtype)
    dx_flat = np.zeros((p.C, p.N * size + offsets[-1]), dtype=dtype)
    out_window = tuple(slice(0, o) for o in p.out_size)
    for n0 in range(0, p.N, images):
        m = min(p.N - n0, images)
        d_view[(slice(None), slice(0, m), *out_window)] = dy[n0:n0 + m].swapaxes(0, 1)
        cols = dcols[:, :m * length]
        _gemm(w_t, d_grid[:, :m * length], out=cols)
        per_tap = cols.reshape(p.C, taps, m * length)
        if _COL2IM_ROWS[0] and p.nd > 1:
            _fold_width_taps(per_tap, p.kernel[-1], p.dilation[-1])
            adds = range(0, taps, p.kernel[-1])          # one add per tap of the leading axes, the width folded in
        else:
            adds = range(taps)
        for t in adds:
            off = offsets[t]
            target = dx_flat[:, n0 * size + off:(n0 + m) * size + off].reshape(p.C, m, size)[:, :, :length]
            np.add(target, per_tap[:, t].reshape(p.C, m, length), out=target)
    padded = dx_flat[:, :p.N * size].reshape(p.C, p.N, *grid)
    return padded[(slice(None), slice(None), *(slice(q, q + i) for q, i in zip(p.padding, p.in_size)))].swapaxes(0, 1)


_COL2IM_ROWS = [True]


# The same col2im with the width taps gathered from dy instead of folded out of dcols (2-D, where the S*K rows of the
# gather and the R*C rows of the product are fewer than col2im's C*R*S dcols rows: LeNet's 6 -> 16 layer, 80 + 30
# against 150).  On each image's out_h rows of the padded grid (images ``length`` apart, zeros on the padding
# columns), D_s (K, m*length) is dy moved s*dw positions on (a view of one zero-led buffer: one strided copy for all
# S), and
#     T (R*C, m*length) = W2 @ [D_0; ..; D_{S-1}]      W2[(r, c), (s, k)] = w[k, c, r, s]
# holds, for each kernel row r, everything that row adds to dx -- added at r*dh grid rows on, one add per r.  A value
# moved along a row stays in it: an output column ow + s*dw <= grid_w - 1.  Per chunk: dy onto the grid, one
# gather, one GEMM (inner axis S*K instead of K), R adds -- 8 NumPy calls for LeNet's conv2 instead of 27 (the GEMM
# writes 30 rows, not 150, and nothing is folded afterwards).  Measured, 1 thread, LeNet's conv2 at batch 64
# (docs/measurements/cpu_2026-11-26_2core.md, session 7): 0.94 -> 0.80 ms.

def _width_col2im_applies(p: ConvProblem):
    S, R = p.kernel[-1], p.kernel[0]
    return p.nd == 2 and _COL2IM_WIDTH[0] and S * p.K + R * p.C < p.C * R * S


_COL2IM_WIDTH = [True]


_WIDTH_BUFFERS = threading.local()


def _width_col2im_buffers(K, lead, positions, S, rows, dtype):
    """(d_buf (K, lead + positions), zeros wherever dy is not written; taps (S, K, positions); t (rows, positions)),
    kept per thread for the next call of the same shapes: fresh ones are page faults on every call (the heap is
    trimmed and grown again), which cost ~0.1 ms of LeNet's step.  d_buf's zeros stay: each call writes dy only
    where the last did (the same shapes)."""
    key = (K, lead, positions, S, rows, np.dtype(dtype))
    held = getattr(_WIDTH_BUFFERS, "held", None)
    if held is None or held[0] != key:
        held = _WIDTH_BUFFERS.held = (key, (np.zeros((K, lead + positions), dtype=dtype),
                                            np.empty((S, K, positions), dtype=dtype),
                                            np.empty((rows, positions), dtype=dtype)))
    return held[1]


def _flat_width_col2im(p: ConvProblem, w, dy):
    """dx (N, C, *in) for stride 1, 2-D, as _flat_col2im computes it: dy's width taps gathered and each kernel
    row's contribution one row of blocks of a single GEMM (see above)."""
    R, S = p.kernel
    dh, dw = p.dilation
    P, Q = p.out_size
    grid = p.padded_size
    row = grid[1]
    size = grid[0] * row
    length = P * row
    lead = (S - 1) * dw
    dtype = np.result_type(w, dy)
    w2 = np.ascontiguousarray(w[:, :, :, ::-1].transpose(2, 1, 3, 0), dtype=dtype).reshape(R * p.C, S * p.K)
    images = max(1, min(p.N, _COL2IM_BYTES // (S * p.K * length * dtype.itemsize)))
    d_buf, taps, t = _width_col2im_buffers(p.K, lead, images * length, S, R * p.C, dtype)
    d_view = d_buf[:, lead:].reshape(p.K, images, P, row)
    item = d_buf.itemsize
    # source[s', k, j] = d_buf[k, s'*dw + j]: dy moved (S-1-s')*dw on, so s' pairs with kernel column S-1-s'
    # (w2's columns are in that reversed order)
    source = np.lib.stride_tricks.as_strided(d_buf, shape=(S, p.K, images * length),
                                             strides=(dw * item, d_buf.strides[0], item), writeable=False)
    dx_flat = np.zeros((p.C, p.N, size), dtype=dtype)
    for n0 in range(0, p.N, images):
        m = min(p.N - n0, images)
        span = m * length
        d_view[:, :m, :, :Q] = dy[n0:n0 + m].swapaxes(0, 1)
        np.copyto(taps[:, :, :span], source[:, :, :span])
        if m == images:
            rows = _gemm(w2, taps.reshape(S * p.K, -1), out=t.reshape(R * p.C, -1))
        else:                                       # the last, shorter chunk: a fresh (R*C, span) product
            rows = _gemm(w2, _rows_view(taps[:, :, :span]))
        for r in range(R):
            target = dx_flat[:, n0:n0 + m, r * dh * row:r * dh * row + length]
            np.add(target, rows[r * p.C:(r + 1) * p.C].reshape(p.C, m, length), out=target)
    padded = dx_flat.reshape(p.C, p.N, *grid)
    return padded[(slice(None), slice(None), *(slice(q, q + i) for q, i in zip(p.padding, p.in_size)))].swapaxes(0, 1)


def _fold_width_taps(per_tap, S, dw):
    """Add each group of S width taps into its first, shifted along the flat positions: per_tap[:, g*S] += sum over
    s of per_tap[:, g*S + s] moved s*dw positions on.  The rows of the grid end in at least (S-1)*dw columns where dy
    was 0 (the padding columns), so a shift never carries a value into another row or image.  Adds of contiguous
    rows: the col2im then adds one tap per kernel row into the strided dx (LeNet's conv2: 5 of those, not 25; a
    strided add ran 4x slower than a contiguous one of the same size)."""
    for g in range(0, per_tap.shape[1], S):
        acc = per_tap[:, g]
        for s in range(1, S):
            shift = s * dw
            np.add(acc[:, shift:], per_tap[:, g + s, :-shift], out=acc[:, shift:])


def _full_correlation_applies(p: ConvProblem):
    # Only where its gather (in * K per tap) is not much larger than col2im's dcols (out * C per tap): LeNet's
    # 6 -> 16 channel layer is 5x larger that way, and col2im wins there -- unless the whole gather is small enough
    # to stay in the caches (the digits LeNet's conv2, 3.3 MB: 0.55 -> 0.44 ms on one thread, one GEMM instead of
    # 25 products and strided adds)
    return (all(s == 1 for s in p.stride) and all(q <= d * (r - 1) for q, d, r in zip(p.padding, p.dilation, p.kernel))
            and (math.prod(p.in_size) * p.K <= 2 * math.prod(p.out_size) * p.C
                 or p.N * math.prod(p.in_size) * math.prod(p.kernel) * p.K * p.itemsize <= _SMALL_COLS_BYTES))


def dense_backward_data(p: ConvProblem, w, dy, tf32=False):
    if _full_correlation_applies(p) and _flat_dense_applies(p, dy):     # shares its chunks out itself
        return _backward_data_part(p, w, dy, p)
    return _over_batch(p, lambda q, nb: _backward_data_part(q, w, dy[nb], p))


def _backward_data_part(p: ConvProblem, w, dy, whole: ConvProblem):
    """dx of problem ``p``, a part of the batch of ``whole`` (or all of it): the forms that depend on the batch size
    are chosen on ``whole``, so the parts run what the unsplit call runs."""
    if _full_correlation_applies(whole):
        # Stride 1: dx is a forward correlation of dy, padded by d*(r-1) - padding, with w flipped and its
        # channel axes swapped -- one gather of dy and one GEMM, no col2im scatter.
        pad = tuple(d * (r - 1) - q for q, d, r in zip(p.padding, p.dilation, p.kernel))
        flipped = w[(slice(None), slice(None), *(slice(None, None, -1),) * p.nd)]        # (K, C, *kernel)
        if _flat_dense_applies(p, dy):
            if _flat_rows_applies(p, p.C, p.K):
                return _flat_rows_correlate(dy, np.swapaxes(flipped, 0, 1), p, pad, p.out_size, p.in_size)
            return _flat_dense_correlate(dy, _w_mat(np.swapaxes(flipped, 0, 1)), p, pad, p.out_size, p.in_size)
        dy_cl = _channels_last_padded(dy, pad)
        if _row_shift_applies(whole):
            return _row_shift_correlate(dy_cl, _rows_of_w(np.swapaxes(flipped, 0, 1)), p, p.in_size)
        w_t = np.ascontiguousarray(np.moveaxis(flipped, 0, -1)).reshape(p.C, -1)       # (C, kernel*K)
        windows = _windows(dy_cl, p.in_size, p.kernel, p.stride, p.dilation)
        return _from_rows(_im2col_product(windows, w_t.T), p.N, p.in_size)
    if _flat_col2im_applies(p, dy):
        if _width_col2im_applies(p):
            return _flat_width_col2im(p, w, dy)
        return _flat_col2im(p, w, dy)
    if _gather_channels_first(p):
        # Few channels: dcols^T = w_mat^T @ dy^T (C*kernel, N*out), then col2im channels-first, whose adds run
        # along contiguous output rows (out_w long) in both operands.
        dy_t = np.ascontiguousarray(np.moveaxis(dy, 1, 0)).reshape(p.K, -1)
        dcols_t = _gemm(w.reshape(p.K, -1).T, dy_t).reshape(p.C, *p.kernel, p.N, *p.out_size)
        dxpad = np.zeros((p.N, p.C, *p.padded_size), dtype=dcols_t.dtype)

        def col2im(nb):
            for tap in _taps(p):
                dxpad[(nb, slice(None), *_tap_window(tap, p))] += np.moveaxis(dcols_t[(slice(None), *tap, nb)], 1, 0)
        parallel_map(col2im, _batch_spans(p.N, dcols_t.size // math.prod(p.kernel)))    # one add: a tap's
        return dxpad[(slice(None), slice(None), *(slice(q, q + i) for q, i in zip(p.padding, p.in_size)))]
    # Otherwise a product per tap, added into its strided slice of dx (channels-last, contiguous products):
    # unlike col2im, which reads each tap's columns at a stride of kernel*C, every add reads contiguous rows.
    dy_rows = _rows(dy).reshape(p.N, -1, p.K)                           # (N, out, K)
    dx_cl = np.zeros((p.N, *p.padded_size, p.C), dtype=dy_rows.dtype)
    w_taps = np.ascontiguousarray(np.moveaxis(w, 1, -1))                # (K, *kernel, C)

    def per_tap(nb):
        rows = dy_rows[nb].reshape(-1, p.K)
        n = rows.shape[0] // math.prod(p.out_size)
        for tap in _taps(p):
            part = rows @ w_taps[(slice(None), *tap)]                   # (n*out, C)
            dx_cl[(nb, *_tap_window(tap, p), slice(None))] += part.reshape(n, *p.out_size, p.C)
    parallel_map(per_tap, _batch_spans(p.N, p.N * math.prod(p.out_size) * p.C))           # one tap's add
    return _crop_channels_first(dx_cl, p)


# ---- depthwise (G == C == K): cache-sized multiply-adds per tap ----------------------------------------

def _chunks(p: ConvProblem, itemsize):
    per_image = max(1, math.prod(p.out_size) * p.C * itemsize)
    step = max(1, _CACHE_BYTES // per_image)
    return [slice(n, min(n + step, p.N)) for n in range(0, p.N, step)]


def _over_chunks(p: ConvProblem, itemsize, body):
    """body(slice of images) over cache-sized chunks of the batch, the chunks shared out between minidnn's
    threads (parallel_map: NumPy's loops release the GIL); returns the bodies' results in batch order."""
    chunks = _chunks(p, itemsize)
    work = p.N * math.prod(p.out_size) * p.C * math.prod(p.kernel)
    return [r for part in parallel_map(lambda span: [body(nb) for nb in span], _spans(chunks, work)) for r in part]


def _spans(chunks, work):
    """The chunks in as many contiguous runs as there are threads (at most one run per chunk; one run for small
    work: threads.parallel_parts)."""
    parts = parallel_parts(len(chunks), work)
    bounds = [round(i * len(chunks) / parts) for i in range(parts + 1)]
    return [chunks[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _tap_weights(w, p):
    """(K, 1, *kernel) -> (taps, C): row t holds every channel's weight of tap t."""
    return np.ascontiguousarray(w.reshape(p.C, -1).T)


def _letters(p: ConvProblem):
    """einsum subscripts of the depthwise loops: out axes, kernel axes ('pq', 'rs' in 2-D)."""
    return "pqo"[:p.nd], "rst"[:p.nd]


def _depthwise_correlate(x_cl, wt, p: ConvProblem, out_size, stride, dilation, itemsize):
    """y_cl[n, o.., c] = sum over taps of x_cl[n, o*stride + tap*dilation, c] * wt[tap.., c]: one einsum over the
    strided window view per cache-sized chunk of the batch (its sum-of-products loop runs along the contiguous
    channels, no temporaries)."""
    windows = _windows(x_cl, out_size, p.kernel, stride, dilation)            # (N, *out, *kernel, C)
    y_cl = np.empty((p.N, *out_size, p.C), dtype=x_cl.dtype)
    o, k = _letters(p)
    spec = f"n{o}{k}c,{k}c->n{o}c"
    _over_chunks(p, itemsize, lambda nb: np.einsum(spec, windows[nb], wt, out=y_cl[nb]))
    return y_cl


def _kernel_weights(w, p):
    """(K, 1, *kernel) -> (*kernel, C): each tap's weights of every channel, channels contiguous."""
    return np.ascontiguousarray(np.moveaxis(w[:, 0], 0, -1))


# Stride 1 (most depthwise layers): a flat, channels-first form.  A chunk is a block of channels of a block of
# images; each plane is zero-padded into a flat buffer row (the padded grid, plus a tail: ``row_len``), the chunk's
# images one after another.  Output position l of that flat row reads the input at l + offset(tap), offset(tap) =
# sum_d tap_d * dilation_d * grid_stride_d, so ONE strided copy gathers every tap's shifted range of every channel
# of the chunk into ``taps`` (Cc, taps, m), and ONE batched BLAS product (a GEMV per channel) finishes it:
#     forward, backward data   z (Cc, 1, m)     = w (Cc, 1, taps) @ taps
#     backward filter          dw (Cc, taps, 1) = taps @ dy_grid (Cc, m, 1)      (dy on the grid, 0 elsewhere)
# Four long NumPy calls per chunk (pad, gather, product, crop), each running without the GIL, are what lets
# minidnn's threads share the chunks out: the per-tap form before it (17 calls of ~4 us per channel: a scalar
# multiply and an add per tap) ran no faster on two threads than on one, the threads queuing for the GIL between
# the calls.  Positions on the grid's padding columns (and between images) are computed and dropped.  x and y stay
# channels-first; each thread's buffers are zeroed once, and their borders are never written.

_FLAT_TAPS_BYTES = 4096 * 1024     # one chunk's taps array (measured below, N32 C64 32x32 3x3)


def _flat_plan(p: ConvProblem, in_size, padding, out_size, itemsize):
    """(grid, row_len, length, tap offsets, chunks): the flat rows' geometry, and the (channel slice, image slice)
    chunks, each with a taps array of at most about _FLAT_TAPS_BYTES: channels first (an image's channels are
    contiguous in x and z), then images.  The chunking depends only on the shapes, so results do not depend on the
    thread count."""
    grid = tuple(i + 2 * q for i, q in zip(in_size, padding))
    grid_strides = [math.prod(grid[d + 1:]) for d in range(p.nd)]
    offsets = [sum(t * d * s for t, d, s in zip(tap, p.dilation, grid_strides)) for tap in _taps(p)]
    length = out_size[0] * grid_strides[0]
    row_len = max(math.prod(grid), offsets[-1] + length)
    planes = max(1, _FLAT_TAPS_BYTES // (len(offsets) * row_len * itemsize))
    channels = _even_blocks(p.C, planes)
    images = _even_blocks(p.N, planes // channels)
    chunks = [(slice(c, min(c + channels, p.C)), slice(n, min(n + images, p.N)))
              for n in range(0, p.N, images) for c in range(0, p.C, channels)]
    return grid, row_len, length, offsets, chunks


def _even_blocks(n, most):
    """The block size that cuts n items into as few blocks of at most ``most`` items as possible, evened out."""
    blocks = -(-n // max(1, most))
    return -(-n // blocks)


class _FlatBuffers:
    """One thread's buffers for the flat depthwise chunks, sized for the largest chunk: ``rows`` (channels,
    images * row_len), zero-padded planes (their borders and tails stay 0); ``second`` (the same shape: the
    correlation's results, or dy on the grid for the filter); ``taps`` (channels, taps, m).  The strided views
    are made once here: per chunk they are only sliced (building them cost ~10 us a chunk, as much as a copy)."""

    def __init__(self, chunks, p: ConvProblem, grid, row_len, length, in_size, padding, out_size, dtype, zeroed):
        channels = max(cs.stop - cs.start for cs, _ in chunks)
        images = max(nb.stop - nb.start for _, nb in chunks)
        self.row_len, self.length, taps = row_len, length, math.prod(p.kernel)
        m = (images - 1) * row_len + length
        self.rows = np.zeros((channels, images * row_len), dtype=dtype)
        self.second = (np.zeros if zeroed else np.empty)((channels, images * row_len), dtype=dtype)
        self.taps = np.empty((channels, taps, m), dtype=dtype)
        self.taps_by_axis = self.taps.reshape(channels, *p.kernel, m)
        itemsize = self.rows.itemsize
        tap_strides = tuple(d * math.prod(grid[k + 1:]) * itemsize for k, d in enumerate(p.dilation))
        # source[c, tap.., l] = rows[c, l + offset(tap)]: the last read, (channels-1) rows on, is offset(last tap)
        # + m - 1 <= images * row_len - 1, since row_len >= offset(last tap) + length
        self.source = np.lib.stride_tricks.as_strided(self.rows, shape=(channels, *p.kernel, m),
                                                      strides=(self.rows.strides[0], *tap_strides, itemsize),
                                                      writeable=False)
        grids = self.rows.reshape(channels, images, row_len)[:, :, :math.prod(grid)].reshape(channels, images, *grid)
        self.interior = grids[(slice(None), slice(None), *(slice(q, q + i) for q, i in zip(padding, in_size)))]
        on_grid = self.second.reshape(channels, images, row_len)[:, :, :length].reshape(
            channels, images, out_size[0], *grid[1:])
        self.outputs = on_grid[(slice(None),) * 3 + tuple(slice(0, o) for o in out_size[1:])]

    def gather(self, cc, n):
        """taps[c, tap, l] = rows[c, l + offset(tap)] over the chunk's m = (n-1)*row_len + length positions: one
        strided copy."""
        m = (n - 1) * self.row_len + self.length
        self.taps_by_axis[:cc, ..., :m] = self.source[:cc, ..., :m]
        return self.taps[:cc, :, :m]


def _flat_correlate(a, w_taps, p: ConvProblem, padding, in_size, out_size):
    """z[n, c, o..] = sum_tap a_pad[n, c, o + tap*dilation] * w_taps[c, tap] (stride 1) for channels-first a
    (N, C, *in_size) padded by ``padding``: a C-contiguous (N, C, *out_size) array."""
    grid, row_len, length, offsets, chunks = _flat_plan(p, in_size, padding, out_size, a.itemsize)
    z = np.empty((p.N, p.C, *out_size), dtype=a.dtype)
    w_rows = np.ascontiguousarray(w_taps, dtype=a.dtype)[:, None, :]           # (C, 1, taps)

    def setup():
        return _FlatBuffers(chunks, p, grid, row_len, length, in_size, padding, out_size, a.dtype, zeroed=False)

    def body(bufs, chunk):
        cs, nb = chunk
        cc, n = cs.stop - cs.start, nb.stop - nb.start
        bufs.interior[:cc, :n] = a[nb, cs].swapaxes(0, 1)
        taps = bufs.gather(cc, n)
        np.matmul(w_rows[cs], taps, out=bufs.second[:cc, None, :taps.shape[-1]])
        z[nb, cs] = bufs.outputs[:cc, :n].swapaxes(0, 1)
    parallel_for(chunks, body, p.N * p.C * length * len(offsets), setup)
    return z


def _flat_applies(p: ConvProblem, a):
    # stride 1, and a channels-first in memory (channels-last inputs keep the einsum form, which reads them in place)
    return all(s == 1 for s in p.stride) and a.strides[1] >= a.strides[-1]


def depthwise_forward(p: ConvProblem, x, w, tf32=False):
    if _flat_applies(p, x):
        return _flat_correlate(x, w.reshape(p.C, -1), p, p.padding, p.in_size, p.out_size)
    x_cl = _channels_last_padded(x, p.padding)
    y_cl = _depthwise_correlate(x_cl, _kernel_weights(w, p), p, p.out_size, p.stride, p.dilation, x.itemsize)
    return np.moveaxis(y_cl, -1, 1)


def depthwise_backward_data(p: ConvProblem, w, dy, tf32=False):
    if _full_correlation_applies(p):
        # stride 1: dx is the correlation of dy, padded by d*(r-1) - padding, with the flipped kernel
        pad = tuple(d * (r - 1) - q for q, d, r in zip(p.padding, p.dilation, p.kernel))
        if _flat_applies(p, dy):
            return _flat_correlate(dy, w.reshape(p.C, -1)[:, ::-1], p, pad, p.out_size, p.in_size)
        dy_cl = _channels_last_padded(dy, pad)
        flipped = _kernel_weights(w, p)[tuple(slice(None, None, -1) for _ in range(p.nd))]
        dx_cl = _depthwise_correlate(dy_cl, np.ascontiguousarray(flipped), p, p.in_size, p.stride, p.dilation,
                                     dy.itemsize)
        return np.moveaxis(dx_cl, -1, 1)
    dy_cl = np.ascontiguousarray(np.moveaxis(dy, 1, -1))
    wt = _tap_weights(w, p)
    dx_cl = np.zeros((p.N, *p.padded_size, p.C), dtype=dy.dtype)
    windows = [(slice(None), *_tap_window(tap, p), slice(None)) for tap in _taps(p)]

    def body(nb):
        dys, dxs = dy_cl[nb], dx_cl[nb]
        tmp = np.empty_like(dys)
        for t, win in enumerate(windows):
            np.multiply(dys, wt[t], out=tmp)
            dxs[win] += tmp
    _over_chunks(p, dy.itemsize, body)
    return _crop_channels_first(dx_cl, p)


def _flat_filter(p: ConvProblem, x, dy):
    """dw[c, tap] = sum over images and grid positions of x_pad[n, c, l + offset(tap)] * dy_grid[n, c, l], where
    dy_grid is dy on the padded grid (zeros on the padding columns): per chunk, the gather of every tap and one
    GEMV per channel, as in the forward form.  A batched BLAS dot per tap instead (reading each shifted range once)
    ran 4.0 against 4.7 ms on one thread (N32 C64 32x32), but NumPy runs a batched dot holding the GIL: on two
    threads no faster than on one, where the GEMVs ran 1.65x faster."""
    grid, row_len, length, offsets, chunks = _flat_plan(p, p.in_size, p.padding, p.out_size, x.itemsize)
    acc_dtype = np.float64 if x.dtype == np.float64 else np.float32
    block_of = {start: i for i, start in enumerate(sorted({nb.start for _, nb in chunks}))}
    partial = np.empty((len(block_of), p.C, len(offsets), 1), dtype=acc_dtype)

    def setup():
        return _FlatBuffers(chunks, p, grid, row_len, length, p.in_size, p.padding, p.out_size, x.dtype, zeroed=True)

    def body(bufs, chunk):
        cs, nb = chunk
        cc, n = cs.stop - cs.start, nb.stop - nb.start
        bufs.interior[:cc, :n] = x[nb, cs].swapaxes(0, 1)
        bufs.outputs[:cc, :n] = dy[nb, cs].swapaxes(0, 1)            # dy on the grid; zeros where no output lies
        m = (n - 1) * row_len + length
        d, out = bufs.second[:cc, :m, None], partial[block_of[nb.start], cs]
        np.matmul(bufs.gather(cc, n), d, out=out)
    parallel_for(chunks, body, p.N * p.C * length * len(offsets), setup)
    # the image blocks' partials summed in image order: the same result whatever the thread count
    per_channel = partial[..., 0].sum(axis=0)
    return per_channel.astype(x.dtype, copy=False).reshape(p.C, 1, *p.kernel)


def depthwise_backward_filter(p: ConvProblem, x, dy, tf32=False):
    if _flat_applies(p, x) and _flat_applies(p, dy):
        return _flat_filter(p, x, dy)
    x_cl = _channels_last_padded(x, p.padding)
    dy_cl = np.ascontiguousarray(np.moveaxis(dy, 1, -1))
    windows = _windows(x_cl, p.out_size, p.kernel, p.stride, p.dilation)    # (N, *out, *kernel, C)
    o, k = _letters(p)
    spec = f"n{o}{k}c,n{o}c->{k}c"
    # each chunk's partial (*kernel, C) sum, then the partials added in batch order: the same result whatever
    # the thread count
    parts = _over_chunks(p, x.itemsize, lambda nb: np.einsum(spec, windows[nb], dy_cl[nb]))
    dw = np.sum(parts, axis=0, dtype=np.float64 if x.dtype == np.float64 else np.float32)
    return np.moveaxis(dw, -1, 0)[:, None].astype(x.dtype, copy=False)


# ---- registration ---------------------------------------------------------------------------------------

def _on_cpu(a):
    return _ENABLED[0] and type(a) is np.ndarray


def _dense(p: ConvProblem, a, b):
    return _on_cpu(a) and p.groups == 1


def _depthwise(p: ConvProblem, a, b):
    return _on_cpu(a) and p.groups > 1 and p.Cg == 1 and p.K == p.C


def register(FW, BD, BF):
    """Attach the fast forms to the GEMM and DIRECT algorithms of the three registries (forward, backward data,
    backward filter; called once by conv_algorithms.py, which passes them in).  The registry, the heuristic and
    ``find`` see the same algorithms as before; on NumPy arrays of a supported shape the algorithm runs its fast
    form, elsewhere its reference."""
    A, DA, FA = FW.enum_type, BD.enum_type, BF.enum_type
    FW.get(A.GEMM).add_fast_path("channels-last im2col + one GEMM (CPU, groups 1)", _dense, dense_forward)
    BD.get(DA.ALGO_1).add_fast_path("one GEMM + channels-last col2im (CPU, groups 1)", _dense, dense_backward_data)
    BF.get(FA.ALGO_1).add_fast_path("channels-last im2col + one GEMM (CPU, groups 1)", _dense,
                                    dense_backward_filter)
    FW.get(A.DIRECT).add_fast_path("cache-blocked channels-last taps (CPU, depthwise)", _depthwise,
                                   depthwise_forward)
    BD.get(DA.ALGO_0).add_fast_path("cache-blocked channels-last taps (CPU, depthwise)", _depthwise,
                                    depthwise_backward_data)
    BF.get(FA.ALGO_0).add_fast_path("cache-blocked channels-last taps (CPU, depthwise)", _depthwise,
                                    depthwise_backward_filter)
    # F(2x2, 3x3) with the transforms as channels-last adds (conv_winograd_cpu.py); only where it beats the GEMM
    # form above (its cost, below GEMM's there, lets the heuristic pick it; else None and the reference's cost)
    wg = conv_winograd_cpu
    for registry, algo, gemm, run in ((FW, A.WINOGRAD_NONFUSED, A.GEMM, wg.winograd_forward),
                                      (BD, DA.WINOGRAD_NONFUSED, DA.ALGO_1, wg.winograd_backward_data)):
        registry.get(algo).add_fast_path(
            "F(2x2, 3x3), channels-last transforms (CPU, groups 1, C, K >= 64)",
            lambda p, a, b: _ENABLED[0] and wg.winograd_applies(p, a, b), run,
            cost=lambda p, device, _g=registry.get(gemm): wg.winograd_cost(p, device, _g.estimated_cost(p, device)))
