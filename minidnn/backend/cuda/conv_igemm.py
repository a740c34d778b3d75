"""Launchers of the implicit-GEMM and direct convolution kernels (sources: conv_igemm_source.py,
conv_direct_source.py), on raw CuPy arrays described by a ConvProblem.

# x, dx: (N, C, *in)   w, dw: (K, C/G, *kernel)   y, dy: (N, K, *out)    channels-first index order, any strides
#                                                                         (NCHW or NHWC memory); 1-D runs as 2-D
#                                                                         with height 1

    implicit_forward(p, x, w, tf32, precomp)          -> y          IMPLICIT_GEMM / IMPLICIT_PRECOMP_GEMM
    implicit_backward_data(p, w, dy, tf32, precomp)   -> dx
    implicit_backward_filter(p, x, dy, tf32, precomp) -> dw         one launch: split-K partials added in
                                                                     split order by each tile's last block
    direct_forward / direct_backward_data / direct_backward_filter   depthwise, Cg <= 8 groups, dense C <= 8
Each takes ``alpha``, ``beta`` and ``out`` (cuDNN's blending, done in the kernel's epilogue); without ``out`` a new
array is returned, channels-last in memory when the input is.  Kernels compile once per configuration (direction,
dtype, math mode, tile) through launch.get_kernel; nothing here synchronises, so a call can be graph-captured once
its kernels are compiled (the PRECOMP table is uploaded on first use of a problem).
"""
from __future__ import annotations

import functools
import math
import os
import threading

import numpy as np

from .. import devices as _dev
from . import conv_dw_nhwc as _dw_nhwc  # NHWC depthwise kernels (issue 9 item 2 / 12): hooks in direct_*
from . import conv_filter_keep as _keep  # filters' KRSC copies kept and refreshed in one launch (session 16)
from . import conv_pointwise as _pointwise  # 1x1 NHWC convolutions as cublasLt products (session 7): settled_call
from . import launch as _launch
from . import workspace as _ws
from .conv_direct_source import SOURCE as DIRECT_SOURCE
from .conv_igemm_source import SOURCE as IGEMM_SOURCE

__all__ = ["TILES", "igemm_supports", "direct_supports", "vec_supports", "vec_eligible", "VEC_ENABLED",
           "implicit_forward", "implicit_backward_data",
           "implicit_backward_filter", "direct_forward", "direct_backward_data", "direct_backward_filter",
           "choose_tile", "filter_splits", "DIRECT_MAX_CG", "DIRECT_DENSE_MAX_MACS", "TILE_ENABLED", "tile_config",
           "wgrad_config", "EPI_ACTS", "PRO_ACTS", "Epilogue", "implicit_forward_epilogue"]

# name: (BM, BN, BK for 4-byte data, WM, WN); every tile runs 4 warps (128 threads)
TILES = {
    "64x16": (64, 16, 16, 16, 16),
    "64x32": (64, 32, 16, 32, 16),
    "64x64": (64, 64, 16, 32, 32),
    "128x64": (128, 64, 16, 64, 32),
}
DIRECT_MAX_CG = 8          # the direct kernels loop over Cg (forward) / Kg (backward data) per output element
# Dense convolutions (groups == 1) of 2..DIRECT_MAX_CG input channels run on the direct kernels up to this many
# multiply-adds per image (K * P * Q * C * R * S).  The cost model ranks direct ahead of the implicit GEMM for every
# such problem (direct 0.6 vs implicit 0.8 per multiply-add), and the H200 agrees for LeNet's conv2 (240e3 per
# image): so no cap.  The 3-channel 32x32 stems (ResNet-20, MobileNet-small: 16 outputs, 442e3 per image) are
# unmeasured (tools/lenet_conv_ab.py --stems): 2 ** 18 sends them back to the implicit GEMM while LeNet's conv2 stays
# direct; 0 restores 0678a49's rule (one input channel only).  direct_supports caches: call its cache_clear().
DIRECT_DENSE_MAX_MACS = float("inf")
_INT32 = 2 ** 31 - 1
_ELEM = {"float32": 0, "float16": 1, "bfloat16": 2}


# ---- which problems the kernels take (pure Python: the registry asks without a GPU) ----------------------

def _sizes_ok(p) -> bool:
    return max(math.prod(p.x_shape), math.prod(p.y_shape), math.prod(p.w_shape)) < _INT32


@functools.lru_cache(maxsize=4096)
def igemm_supports(p) -> str | None:
    """None if the implicit-GEMM kernels run ``p``, else the rule it breaks (cached per problem: the fast-path
    predicates ask at every call)."""
    if p.nd not in (1, 2):
        return "1-D and 2-D convolutions (3-D keeps the array algorithms)"
    if p.dtype not in _ELEM:
        return "float32, float16 or bfloat16 data"
    if not _sizes_ok(p):
        return "tensors of fewer than 2**31 elements (32-bit index math)"
    return None


@functools.lru_cache(maxsize=4096)
def direct_supports(p) -> str | None:
    """None if the direct kernels run ``p`` (few channels per group), else the rule it breaks (cached per problem).

    A dense convolution (groups == 1) of C <= DIRECT_MAX_CG input channels is one group of Cg = C, Kg = K: the
    kernels' index math (c0 = (k / Kg) * Cg = 0, filter rows k * Cg + cl, under FLIP the sum over the K output
    channels) takes groups == 1 as it is, within the grouped case's limits (K <= 4 * DIRECT_MAX_CG, <= 49 taps).
    C == 1 (LeNet's conv1, 0678a49) is a depthwise problem of channel multiplier K; C 2..8 (LeNet's conv2: H200
    direct 14.6 / 30.6 / 15.5 us vs implicit GEMM 23.2 / 71.3 / 22.1) sweeps the C input planes per output plane.
    DIRECT_DENSE_MAX_MACS caps the multi-channel case by multiply-adds per image (docs/conv_kernels.md)."""
    if p.nd not in (1, 2):
        return "1-D and 2-D convolutions"
    if p.Cg > DIRECT_MAX_CG or p.Kg > 4 * DIRECT_MAX_CG:
        return (f"at most {DIRECT_MAX_CG} input channels per group and {4 * DIRECT_MAX_CG} output channels per "
                f"group (dense convolutions: groups == 1)")
    if p.groups == 1 and p.C > 1 and p.macs > DIRECT_DENSE_MAX_MACS * p.N:
        return (f"dense convolutions of 2..{DIRECT_MAX_CG} input channels with at most {DIRECT_DENSE_MAX_MACS} "
                f"multiply-adds per image (DIRECT_DENSE_MAX_MACS)")
    if p.dtype not in _ELEM:
        return "float32, float16 or bfloat16 data"
    if math.prod(p.kernel) > 49:
        return "kernels of at most 49 taps"
    if not _sizes_ok(p):
        return "tensors of fewer than 2**31 elements (32-bit index math)"
    return None


VEC_ENABLED = [True]       # False: the NHWC 16-byte loader steps aside (old path), for comparisons and debugging


@functools.lru_cache(maxsize=4096)
def vec_supports(direction, p) -> str | None:
    """None if the NHWC 16-byte loader (the kernel's VEC=1 variant) can run direction ``direction`` (0 forward,
    1 backward data, 2 backward filter) of ``p`` given suitable memory (``vec_eligible`` checks that), else the rule
    it breaks."""
    if p.nd not in (1, 2) or p.dtype not in _ELEM or not _sizes_ok(p):
        return "1-D and 2-D float32/float16/bfloat16 problems the implicit-GEMM kernel runs"
    width = 16 // p.itemsize
    vectors = {0: [(p.Cg, "input")], 1: [(p.Kg, "output")], 2: [(p.Cg, "input"), (p.Kg, "output")]}[direction]
    for ch, name in vectors:
        if ch % width:
            return f"{name} channels per group a multiple of {width} ({ch} given): whole 16-byte vectors of channels"
    if direction == 1 and max(p.stride) != 1 and not _split_by_residue(p):
        return "stride 1 or undilated backward data (a strided one runs as its stride-1 residue classes)"
    return None


def vec_eligible(direction, p, *acts) -> str | None:
    """None if the VEC=1 loader runs this call: ``vec_supports`` and every activation it gathers (x forward, dy
    backward data, x and dy backward filter; channels-first views, 4-D) is NHWC-like -- channel stride 1, the other
    strides whole 16-byte vectors, a 16-byte aligned base.  Else the reason the element loader runs."""
    if not VEC_ENABLED[0]:
        return "switched off (conv_igemm.VEC_ENABLED)"
    why = vec_supports(direction, p)
    if why is not None:
        return why
    for act in acts:
        item = act.itemsize
        width = 16 // item
        if act.data.ptr % 16:
            return "16-byte aligned activations"
        for axis, (size, stride) in enumerate(zip(act.shape, act.strides)):
            if size == 1:
                continue                      # never stepped: its stride is never used
            if axis == 1:
                if stride != item:
                    return "channels-last (NHWC) activations: channel stride 1"
            elif (stride // item) % width or stride % item:
                return f"NHWC strides that are whole 16-byte vectors ({tuple(s // item for s in act.strides)} given)"
    return None


# NCHW staging (cuDNN's nchwToNhwc): where the VEC loader could run but an activation is plain NCHW (the default
# memory format), one copy of it in NHWC memory lets it run -- on an H200 the VEC loader took ResNet-20's 3x3 layers
# 2.3-2.8x faster than the element loader (docs/measurements/conv_kernels_nhwc_*), while the copy moves the
# activation once (~5 us for 8 MB).  Outputs stay where they were asked for (the epilogue writes through strides).
# The copy is one more launch per staged operand, so it is made by our own prepared transpose kernel (a few us of
# host time, where CuPy's strided copy cost ~15-20: an eager ResNet-20 step stages ~85 operands) and only for
# problems of at least STAGE_MIN_MACS multiply-adds.  The rule depends on the problem alone, so an eager step and
# its CUDA-graph capture compute the same bits.
STAGE_ENABLED = [os.environ.get("MINIDNN_CONV_STAGE", "1") != "0"]      # MINIDNN_CONV_STAGE=0: off
STAGE_MIN_MACS = 1 << 25

TRANSPOSE_SOURCE = r"""
// NCHW -> NHWC copy for the staging above.  x: (N, C, HW) contiguous; y: (N, HW, C) contiguous.
// Tiling: one block per 32 x 32 tile of (c, hw) of one image (blockIdx.x: hw tiles, blockIdx.y: c tiles, blockIdx.z:
// n), 32 x 8 threads; each thread loads 4 elements along hw (coalesced reads) into a padded shared tile (33
// columns: no bank conflicts), then stores 4 along c (coalesced writes).  Elements move as their bits (WORD_T:
// 32-bit for float32, 16-bit for float16/bfloat16).
extern "C" __global__ void __launch_bounds__(256)
nchw_to_nhwc(const WORD_T* __restrict__ x, WORD_T* __restrict__ y, const int C, const int HW)
{
    __shared__ WORD_T tile[32][33];
    const long long base = (long long)blockIdx.z * C * HW;
    const int hw0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int c = c0 + i, hw = hw0 + threadIdx.x;
        if (c < C && hw < HW) tile[i][threadIdx.x] = x[base + (long long)c * HW + hw];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int hw = hw0 + i, c = c0 + threadIdx.x;
        if (c < C && hw < HW) y[base + (long long)hw * C + c] = tile[threadIdx.x][i];
    }
}
"""

TRANSPOSE_V2_SOURCE = r"""
// NCHW -> NHWC copy, V2 (session 8): the same copy moved in 4-byte words on both sides, for any channel count.
//   Tile: `ct` <= CT channels x `ht` <= HWT positions of one image (blockIdx.x: hw tiles, blockIdx.y: c tiles,
//   blockIdx.z: n) in dynamic shared memory, rows of HWT / VW words + 1 (VW = 4 / sizeof(element): 2 for 16-bit
//   data, whose words hold two elements).  256 threads walk the tile twice: first its words in NCHW order (a word =
//   VW consecutive positions of one channel, consecutive threads on consecutive words: 128-byte warp loads), then
//   in NHWC order (a word = VW consecutive channels of one position, assembled from two rows of the tile for 16-bit
//   data).  When the tile holds every channel (C <= CT, the small-C layers of ResNet-20 and MobileNet) its output is
//   one contiguous span of y, written by consecutive threads; otherwise each position's CT channels are a
//   contiguous run.  16-bit data needs C and HW even and 4-byte aligned arrays (the host checks; V1 otherwise).
extern "C" __global__ void __launch_bounds__(256)
nchw_to_nhwc(const WORD_T* __restrict__ x, WORD_T* __restrict__ y, const int C, const int HW, const int CT,
             const int HWT)
{
    extern __shared__ unsigned int tile_w[];
    constexpr int VW = 4 / sizeof(WORD_T);
    const int RW = HWT / VW + 1;                              // row stride of the tile in words
    const long long base = (long long)blockIdx.z * C * HW;
    const int hw0 = blockIdx.x * HWT, c0 = blockIdx.y * CT;
    const int ct = min(CT, C - c0), ht = min(HWT, HW - hw0);
    const int hwords = ht / VW;                               // ht is a multiple of VW (HW and HWT are)
    const unsigned int* xw = reinterpret_cast<const unsigned int*>(x + base + (long long)c0 * HW + hw0);
    const int hw_words = HW / VW;
    for (int i = threadIdx.x; i < ct * hwords; i += 256) {
        const int c = i / hwords, w = i - c * hwords;
        tile_w[c * RW + w] = __ldg(xw + (long long)c * hw_words + w);
    }
    __syncthreads();
    const int cwords = ct / VW;                               // ct is a multiple of VW (C and CT are)
    unsigned int* yw = reinterpret_cast<unsigned int*>(y + base + (long long)hw0 * C + c0);
    const int c_words = C / VW;
    for (int i = threadIdx.x; i < ht * cwords; i += 256) {
        const int h = i / cwords, cw = i - h * cwords;
        unsigned int v;
        if (VW == 2) {
            const unsigned short* t16 = reinterpret_cast<const unsigned short*>(tile_w);
            const unsigned int lo = t16[(2 * cw) * (2 * RW) + h], hi = t16[(2 * cw + 1) * (2 * RW) + h];
            v = lo | (hi << 16);
        } else {
            v = tile_w[cw * RW + h];
        }
        yw[(long long)h * c_words + cw] = v;
    }
}
"""

# V2 transpose (session 8; MINIDNN_TRANSPOSE_V2=0: the 32 x 32 kernel above for everything).  On the H200 (run 14 of
# session 8) the 32 x 32 kernel moved 16-bit activations no faster than float32 ones (2-byte accesses: half-width
# warp transactions) and wasted half of each warp on 16-channel layers.
TRANSPOSE_V2 = [os.environ.get("MINIDNN_TRANSPOSE_V2", "1") != "0"]
TRANSPOSE_TILE_ELEMS = 4096          # elements a V2 tile holds (CT channels x HWT positions)


def _stageable(direction, p) -> bool:
    if not (STAGE_ENABLED[0] and VEC_ENABLED[0] and vec_supports(direction, p) is None):
        return False
    return p.N * math.prod(p.out_size) * p.Kg * p.Cg * math.prod(p.kernel) * p.groups >= STAGE_MIN_MACS


def transpose_v2_tile(c, hw, itemsize, n=1, sms=132):
    """(CT, HWT) of the V2 transpose for n images of C channels and HW positions on ``sms`` SMs, or None where V1
    runs: V2 switched off; 16-bit data with an odd C or HW; 8-byte data; and where V1 measured faster (session 8,
    runs 14-15, H200, tools/transpose_ab.py): V2 runs 16-bit data of <= 16 channels or >= 1024 positions (0.53-0.89x
    V1's time; 32-64 channels at 64-256 positions: 1.09-1.21x) and float32 of <= 16 channels at >= 1024 positions
    (0.84x; V1's 32 x 32 tiles are full from 32 channels, and 16 channels at 256 positions took 1.13x).  HWT halves
    (down to 16) until the grid has 4 blocks an SM: one 4096-element tile an image left (128, 64, 8, 8) with 128
    blocks, 2.2x slower than V1."""
    vw = 4 // itemsize if itemsize in (2, 4) else 0
    if not TRANSPOSE_V2[0] or not vw or c % vw or hw % vw:
        return None
    if not (c <= 16 or hw >= 1024) if itemsize == 2 else not (c <= 16 and hw >= 1024):
        return None
    ct = min(c, 64)
    ct += -ct % vw
    hwt = max(32, min(1024, TRANSPOSE_TILE_ELEMS // ct // 32 * 32))
    while hwt > 16 and n * -(-hw // hwt) * -(-c // ct) < 4 * sms:
        hwt //= 2
    return ct, hwt


def _transpose_plan(shape, itemsize, dev, aligned=True):
    n, c, h, w = shape
    word = f"-DWORD_T={'unsigned int' if itemsize == 4 else 'unsigned short'}"
    tile = transpose_v2_tile(c, h * w, itemsize, n, _launch.sm_count()) if aligned else None
    if tile is not None:
        ct, hwt = tile
        kernel = _launch.get_kernel(TRANSPOSE_V2_SOURCE, "nchw_to_nhwc", (word,))
        grid = (-(-(h * w) // hwt), -(-c // ct), n)
        return _launch.prepare(kernel, grid, (256,), [None, None, np.int32(c), np.int32(h * w), np.int32(ct),
                                                      np.int32(hwt)], shared_mem=ct * (hwt * itemsize // 4 + 1) * 4)
    kernel = _launch.get_kernel(TRANSPOSE_SOURCE, "nchw_to_nhwc", (word,))
    grid = (-(-(h * w) // 32), -(-c // 32), n)
    return _launch.prepare(kernel, grid, (32, 8), [None, None, np.int32(c), np.int32(h * w)])


_transposes: dict = {}


def _transposer(a):
    """The prepared launch of ``nchw_to_nhwc`` for the C-contiguous (N, C, H, W) array ``a``, or None where the
    launch grid cannot hold it (CuPy's strided copy then)."""
    n, c = a.shape[:2]
    if not (a.flags.c_contiguous and n <= 65535 and -(-c // 32) <= 65535 and a.itemsize in (2, 4)):
        return None     # (the kernels move 2- and 4-byte words)
    key = (a.shape, a.itemsize, a.data.device_id, a.data.ptr % 4 == 0, TRANSPOSE_V2[0])
    run = _transposes.get(key)
    return run if run is not None else _launch.planned(_transposes, key, _transpose_plan, a.shape, a.itemsize,
                                                       key[2], key[3])


# Operands staged once per scope (``shared_staging``): a convolution's backward stages dy for backward data and
# finds that copy again in backward filter (one transpose per step and layer less).  Keyed on what the copy reads
# (address, shape, strides, dtype): inside the scope the caller keeps the arrays alive and unchanged, so an address
# cannot be reused by another array; the copies are dropped when the scope closes.
class _Scope(threading.local):
    memo = None
    carry = None            # the active filter_carry (below)


_scope = _Scope()


class shared_staging:
    """``with shared_staging():`` an activation the calls inside stage (NCHW -> NHWC) is copied once and the copy
    reused by the later calls that stage the same array; the caller must not write the arrays inside the block.
    Nested blocks share the outer one's copies.  The results are those of the calls made outside any block
    (the same kernels read the same NHWC data); only the repeated copies are skipped."""
    __slots__ = ("outer", "carry")

    def __init__(self, carry=None):
        self.carry = carry      # a filter_carry whose forward's NHWC copy of x (``xs``) the calls inside may reuse

    def __enter__(self):
        self.outer = _scope.memo
        if self.outer is None:
            _scope.memo = {}
        carry = self.carry
        if carry is not None and carry.xs is not None:
            _scope.memo[carry.xkey] = carry.xs
        return self

    def __exit__(self, *exc):
        _scope.memo = self.outer
        return False


class filter_carry:
    """One convolution's filter in the forward's KRSC form, carried from its forward to its backward data (a private
    route of nn's ConvForward, docs/host_overhead.md round 12; ``backend.convolution.convolution_filter_carry``).

    ``with carry:`` around the forward call: where that call copies the filter to (K, *kernel, Cg) for the VEC
    loader, the copy goes into fresh memory kept here (``krsc``, with ``key`` = the filter's address, shape,
    strides, dtype, device) instead of a scratch buffer.  ``with carry:`` around a backward-data call of the SAME
    filter array (the key matches): where that call runs the VEC loader and would copy the filter to
    (G, Cg, *kernel, Kg) (its CRSK form), it reads the kept copy through WKRSC=1 instead -- one transposing launch
    less, the same bits (both B loaders fill the same (k, n) elements of the same slice, k = (r*S + s)*Kg + kk in
    both, and the multiply reads B only through BS(stage, k, n): docs).  The caller vouches that the filter's values
    did not change between the two calls (nn: autograd's saved-tensor version check); the kept copy *is* the
    filter the forward multiplied by.  Outside a block, or with a key that does not match, both calls run as
    without it.  Costs one filter copy of memory from forward to backward.

    ``want_x`` (session 8): the forward's NHWC staging copy of an NCHW x (made where the problem is staged) goes
    into fresh memory kept here (``xs``, keyed ``xkey`` on what the copy read: address, shape, strides, dtype) rather
    than a scratch buffer, and ``shared_staging(carry)`` around the backward hands it to the filter gradient, which
    stages that same x: one transposing launch less per layer and step, the same bits (the same NHWC data), one
    activation copy of memory held from forward to backward (nn: ``CARRY_X``).  ``want_filter`` False: the filter
    copy stays in scratch memory (no backward data will read it).

    ``keep`` (session 16): (owner, state_of) -- the forward's KRSC copy is the one conv_filter_keep keeps for
    ``owner`` (refreshed with the other kept copies in one launch) where that module keeps one.

    ``xshadow`` (session 16): (an NHWC-memory array holding x's values as its channels-first view, x's key) -- a
    batch-norm or add twin's channels-last shadow (docs/fusion.md, "The twin's NHWC shadow"), set by the caller,
    who vouches that it holds x's values.  A forward that would stage an x of that key takes it as its NHWC copy
    instead (nothing staged), keeps it as ``xs`` like its own copy, and sets ``xshadow`` back to None (taken) --
    except while the stream captures a CUDA graph: a shadow written outside the capture would be read by every
    replay as it is (and its memory reused once released)."""
    __slots__ = ("krsc", "key", "outer", "xs", "xkey", "want_x", "want_filter", "keep", "xshadow")

    def __init__(self, want_x=False, want_filter=True, keep=None):
        self.krsc = self.key = self.outer = self.xs = self.xkey = self.xshadow = None
        self.want_x, self.want_filter, self.keep = want_x, want_filter, keep

    def __enter__(self):
        self.outer = _scope.carry
        _scope.carry = self
        return self

    def __exit__(self, *exc):
        _scope.carry, self.outer = self.outer, None
        return False


def _filter_key(w):
    return (w.data.ptr, w.shape, w.strides, w.dtype, w.data.device_id)


def _carried(w, carry=None):
    """``carry`` (default: the active filter_carry) when it holds a 16-byte-aligned KRSC copy of ``w`` itself, else
    None."""
    if carry is None:
        carry = _scope.carry
    if carry is None or carry.krsc is None or carry.krsc.data.ptr % 16 or carry.key != _filter_key(w):
        return None
    return carry


def _stage(cp, a, run, slot=None):
    """``a``'s NHWC copy as its channels-first view: by the prepared transpose ``run`` (None: CuPy's strided copy),
    or the copy already made for ``a`` inside a ``shared_staging`` block.  ``slot`` (the call's operand, 0 or 1):
    the copy goes into a scratch buffer (workspace.scratch) that only this call's kernel reads -- inside a block,
    one per copy the block holds (its n-th copy: the block's copies stay distinct until it closes) --; None: a
    fresh array."""
    memo = _scope.memo
    if memo is not None:
        key = (a.data.ptr, a.shape, a.strides, a.dtype)
        t = memo.get(key)
        if t is None:
            t = memo[key] = _copy_nhwc(cp, a, run, None if slot is None else ("stage.scope", len(memo)))
        return t
    return _copy_nhwc(cp, a, run, None if slot is None else ("stage", slot))


def _copy_nhwc(cp, a, run, tag=None):
    n, c, h, w = a.shape
    t = _ws.fresh(cp, a.data.device_id, "conv.stage", (n, h, w, c), a.dtype) if tag is None else \
        _ws.scratch(cp, a.data.device_id, tag, (n, h, w, c), a.dtype)
    if run is not None:
        run(a, t)
    else:
        t[...] = a.transpose(0, 2, 3, 1)
        _launch.count_launches(1)        # CuPy's copy kernel: a launch of this call all the same
    return t.transpose(0, 3, 1, 2)


def _nhwc_copy(cp, a):
    """An NHWC-memory copy of the 4-D channels-first array ``a``, as its channels-first view (one launch; none where
    ``a`` already is channels-last, has one channel, or was staged already in a ``shared_staging`` block)."""
    if _channels_last(a) or a.shape[1] == 1:
        return a
    return _stage(cp, a, _transposer(a))


def _filter_copy(cp, p, w, form):
    """The filter in the form the VEC loader reads, one copy: "krsc" -- w (K, Cg, *kernel) as (K, *kernel, Cg), the
    channel innermost (forward); "crsk" -- as (G, Cg, *kernel, Kg), for each input channel a row over k = (r, s, kk),
    kk fastest (backward data).  Both are per-block transposes of a contiguous filter, (K, Cg, RS) -> (K, RS, Cg)
    and (G, Kg, Cg*RS) -> (G, Cg*RS, Kg), made by the staging's prepared transpose kernel (a few us of host time
    where CuPy's strided copy of the permuted view cost ~15-20); a strided filter, or one the grid cannot hold, gets
    CuPy's copy.  One launch either way (the weights change between calls), the bits those of the copy."""
    nd = w.ndim - 2
    n, c = (p.K, p.Cg) if form == "krsc" else (p.groups, p.Kg)
    run = _transposer(w.reshape(n, c, 1, w.size // (n * c))) if w.flags.c_contiguous else None
    if run is None:
        _launch.count_launches(1)        # CuPy's copy kernel: a launch of this call all the same
        if form == "krsc":
            return cp.ascontiguousarray(cp.moveaxis(w, 1, -1))
        wg = w.reshape(p.groups, p.Kg, p.Cg, *w.shape[2:])
        return cp.ascontiguousarray(wg.transpose(0, 2, *range(3, 3 + nd), 1))
    shape = (p.K, *w.shape[2:], p.Cg) if form == "krsc" else (p.groups, p.Cg, *w.shape[2:], p.Kg)
    t = _ws.fresh(cp, w.data.device_id, "conv.filter", shape, w.dtype)
    run(w, t)
    return t


# ---- geometry -------------------------------------------------------------------------------------------

def _as_2d(a, nd):
    """A channels-first array of a 1-D problem as (N, C, 1, L) (a view); 2-D arrays unchanged."""
    return a[:, :, None, :] if nd == 1 else a


def _geometry(p):
    """(H, W, P, Q, R, S, pad_h, pad_w, st_h, st_w, dil_h, dil_w) of the problem seen as 2-D."""
    if p.nd == 1:
        return (1, p.in_size[0], 1, p.out_size[0], 1, p.kernel[0], 0, p.padding[0], 1, p.stride[0], 1,
                p.dilation[0])
    (H, W), (P, Q), (R, S) = p.in_size, p.out_size, p.kernel
    return (H, W, P, Q, R, S, *p.padding, *p.stride, *p.dilation)


def _strides(a):
    return tuple(int(s) // a.itemsize for s in a.strides)


def _channels_last(a):
    return a.ndim == 4 and a.shape[1] > 1 and a.strides[1] == a.itemsize


def _new_like_layout(cp, shape, dtype, channels_last, dev):
    """A fresh (N, C, H, W)-indexed array on GPU ``dev``, NHWC in memory when ``channels_last`` (made in one step:
    one CuPy array with channels-last strides on a pool block, not an NHWC array and its transpose;
    workspace.empty_strided), reused where nothing holds it (workspace.fresh)."""
    if channels_last:
        n, c, h, w = shape
        e = dtype.itemsize
        return _ws.fresh(cp, dev, "conv.out", shape, dtype,
                         (shape, (h * w * c * e, e, w * c * e, c * e), n * h * w * c * e))
    return _ws.fresh(cp, dev, "conv.out", shape, dtype)


def _args(p, g, sx, sy):
    H, W, P, Q, R, S, ph, pw, sh, sw, dh, dw = g
    return [np.int32(v) for v in (p.N, p.C, H, W, p.K, P, Q, R, S, ph, pw, sh, sw, dh, dw, p.Cg, p.Kg,
                                  *sx, *sy)]


def _dtype_name(a):
    return _dev.dtype_name(a.dtype)


def _check_out(out, shape, dtype):
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"out has shape {tuple(out.shape)} and dtype {out.dtype}, expected {tuple(shape)} {dtype}")


# ---- implicit GEMM ------------------------------------------------------------------------------------------

def choose_tile(M, NG, groups, sms=132):
    """The tile for a GEMM of M rows and NG columns per group: the narrowest BN that covers NG (up to 64), then
    the taller BM when it still gives two waves of blocks."""
    if NG <= 16:
        return "64x16"
    if NG <= 32:
        return "64x32"
    if -(-M // 128) * -(-NG // 64) * groups >= 2 * sms:
        return "128x64"
    return "64x64"


def igemm_options(direction, dtype_name, tf32, tile, vec=False, act=0, atomic=False, pro=0, stats=False,
                  wide=False, sk2=False, dwk=False):
    """(NVRTC options, BM, BN, BK) of one implicit-GEMM configuration (tools/precompile_conv.py compiles them
    all ahead of a test run through the same options); ``act`` > 0: the fused bias/residual/activation epilogue
    (EPI=1, ACT=act: ``EPI_ACTS``), forward only; ``atomic``: the filter gradient's split-K by fp32 atomics into a
    kept-zeroed accumulator (ATOMIC=1, backward filter only; non-deterministic); with the epilogue, ``pro`` > 0:
    the batch-norm-apply prologue on x (PRO=1, PACT=pro: ``PRO_ACTS``) and ``stats``: the per-channel sum and sum
    of squares of y (STATS=1); ``wide`` (backward filter, half data): dw written in float32 (WOUT32=1); ``sk2``
    (backward filter, deterministic): the split-K sum in two levels over live fragments (SK2=1, ``SPLITK2``);
    ``dwk`` (backward filter, VEC): dw written channels-last, KRSC memory (DWKRSC=1)."""
    elem = _ELEM[dtype_name]
    BM, BN, BK, WM, WN = TILES[tile]
    if elem:
        BK = 32                                      # m16n8k16: two k16 steps per slice
    math_mode = 1 if (elem or tf32) else 0
    opts = (f"-DDIR={direction}", f"-DELEM={elem}", f"-DMATH={math_mode}", f"-DBM={BM}", f"-DBN={BN}",
            f"-DBK={BK}", f"-DWM={WM}", f"-DWN={WN}") + (("-DVEC=1",) if vec else ())
    if vec == "krsc":
        opts += ("-DWKRSC=1",)
    if act:
        opts += ("-DEPI=1", f"-DACT={act}")
    if atomic:
        opts += ("-DATOMIC=1",)
    if pro:
        opts += ("-DPRO=1", f"-DPACT={pro}")
    if stats:
        opts += ("-DSTATS=1",)
    if wide:
        opts += ("-DWOUT32=1",)
    if sk2:
        opts += ("-DSK2=1",)
    if dwk:
        opts += ("-DDWKRSC=1",)
    return opts, BM, BN, BK


# The activations the fused epilogue computes (the kernel's ACT codes); other modes run as the composition.
EPI_ACTS = {"IDENTITY": 1, "RELU": 2, "SIGMOID": 3, "TANH": 4, "CLIPPED_RELU": 5, "ELU": 6, "LEAKY_RELU": 7,
            "RELU6": 8, "HARDTANH": 9, "SWISH": 10}


# The prologue's activations (the kernel's PACT codes): cuDNN frontend's scale-bias-relu and the plain scale-bias.
PRO_ACTS = {"IDENTITY": 1, "RELU": 2}


class Epilogue:
    """The fused epilogue of one forward call: out = act(alpha * acc + beta * out + alpha2 * z + bias) (z, bias
    None where absent); optionally the prologue x -> pro_act(x * scale[c] + shift[c]) (``pro`` a PRO_ACTS code,
    scale/shift contiguous float32 (C,)) and the statistics (``stats``: (sum, sumsq), contiguous float32 (K,)
    arrays the launch writes).  ``key`` is what the call's decisions and plan depend on: the activation, its
    coefficient, alpha2, z's strides, the prologue's activation, whether statistics are written (the arrays
    themselves change from call to call)."""
    __slots__ = ("act", "coef", "alpha2", "z", "bias", "key", "pro", "scale", "shift", "stats")

    def __init__(self, act, coef, alpha2, z, bias, pro=0, scale=None, shift=None, stats=None):
        self.act, self.coef, self.alpha2, self.z, self.bias = act, float(coef), float(alpha2), z, bias
        self.pro, self.scale, self.shift, self.stats = pro, scale, shift, stats
        self.key = (act, self.coef, self.alpha2, None if z is None else _strides(z), bias is None, pro,
                    stats is not None)

    def arrays(self):
        """The kernel's arrays after the six plain ones: z, bias, then (PRO) scale, shift, then (STATS) the sums."""
        return (self.z, self.bias) + ((self.scale, self.shift) if self.pro else ()) + \
            (tuple(self.stats) if self.stats is not None else ())


def _igemm_kernel(direction, dtype_name, tf32, tile, vec=False, act=0, atomic=False, pro=0, stats=False,
                  wide=False, sk2=False, dwk=False):
    opts, BM, BN, BK = igemm_options(direction, dtype_name, tf32, tile, vec, act, atomic, pro, stats, wide, sk2,
                                     dwk)
    return _launch.get_kernel(IGEMM_SOURCE, "conv_igemm", opts), BM, BN, BK


_tables: dict = {}


def _residue_tap_table(p, g, sy):
    """Backward data's tap table when its residue classes run in one launch (``_split_by_residue``): class
    (a, b) = (cls // st_w, cls % st_w) holds its Kg * taps entries at cls * Kg * ceil(R/st_h) * ceil(S/st_w); entry
    k = kk * taps + jr * ts + js of the class's sub-kernel (jr < tr, js < ts) is (kk * dy's channel stride, jr, js,
    the weight offset of filter tap (r0 + jr*st_h, s0 + js*st_w) of output channel kk)."""
    H, W, P, Q, R, S, ph, pw, sh, sw = g[:10]
    per = p.Kg * -(-R // sh) * -(-S // sw)
    tab = np.zeros((sh * sw * per, 4), dtype=np.int32)
    for a in range(sh):
        r0 = (a + ph) % sh
        for b in range(sw):
            s0 = (b + pw) % sw
            jr, js = np.arange(r0, R, sh), np.arange(s0, S, sw)
            taps = len(jr) * len(js)
            if taps == 0:
                continue
            kk = np.repeat(np.arange(p.Kg, dtype=np.int64), taps)
            sub = np.tile(np.arange(taps, dtype=np.int64), p.Kg)
            j_r, j_s = sub // len(js), sub % len(js)
            base = (a * sw + b) * per
            rows = tab[base:base + p.Kg * taps]
            rows[:, 0] = kk * sy[1]
            rows[:, 1], rows[:, 2] = j_r, j_s
            rows[:, 3] = kk * p.Cg * R * S + jr[j_r] * S + js[j_s]
    return tab


def _tap_table(cp, direction, p, g, sx, sy):
    """IMPLICIT_PRECOMP_GEMM's workspace: one int4 per reduction index (DIR 0/1) or filter row (DIR 2):
    (channel offset, r*dil_h, s*dil_w, weight offset), uploaded once per problem and layout; a strided backward
    data's residue classes each get their sub-kernel's table (``_residue_tap_table``)."""
    key = (direction, p, sx, sy, cp.cuda.runtime.getDevice())
    t = _tables.get(key)
    if t is None and direction == 1 and _split_by_residue(p):
        t = _tables[key] = cp.asarray(_residue_tap_table(p, g, sy))
    if t is None:
        H, W, P, Q, R, S, ph, pw, sh, sw, dh, dw = g
        RS = R * S
        count = p.Kg * RS if direction == 1 else p.Cg * RS
        k = np.arange(count, dtype=np.int64)
        ch, rs = k // RS, k % RS
        r, s = rs // S, rs % S
        tab = np.zeros((count, 4), dtype=np.int32)
        if direction == 1:
            tab[:, 0] = ch * sy[1]
            tab[:, 3] = ch * p.Cg * RS + rs
        else:
            tab[:, 0] = ch * sx[1] + r * dh * sx[2] + s * dw * sx[3]
            tab[:, 3] = ch                          # the channel: read by the forward's prologue (PRO=1) only
        tab[:, 1], tab[:, 2] = r * dh, s * dw
        t = _tables[key] = cp.asarray(tab)
    return t


_plans: dict = {}          # the launches of a settled call (below), through launch.planned
_calls: dict = {}          # a call's settled decisions (_Call), per layout and alignment of its arrays


class _Meta:
    """What the decisions and a plan read of an array (shape, strides, dtype, address alignment), without the
    array: a staged copy before it is made, or an array a kept plan must not hold alive."""
    __slots__ = ("shape", "strides", "dtype", "itemsize", "ndim", "data")

    def __init__(self, shape, strides, dtype, ptr=0):
        self.shape, self.strides, self.dtype = tuple(shape), tuple(strides), np.dtype(dtype)
        self.itemsize, self.ndim = self.dtype.itemsize, len(self.shape)
        self.data = _Ptr(ptr)


class _Ptr:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


def _meta(a):
    return _Meta(a.shape, a.strides, a.dtype, a.data.ptr % 16)


def _staged_meta(a):
    """The array ``_nhwc_copy(a)`` returns, described: ``a`` itself where it copies nothing, else a fresh NHWC copy
    (the memory pool's blocks are 512-byte aligned)."""
    if _channels_last(a) or a.shape[1] == 1:
        return a
    n, c, h, w = a.shape
    e = a.itemsize
    return _Meta(a.shape, (h * w * c * e, e, w * c * e, c * e), a.dtype)


class _Call:
    """The settled decisions of an implicit-GEMM call, for every later call whose arrays have the same layout and
    alignment: which activation operands are staged (``stage``: per operand False, or (the prepared transpose, None
    for CuPy's copy)), how the filter is read (``wmode``: "as-is", "contiguous" (CuPy's ascontiguousarray), "krsc" /
    "crsk" (a transposing copy; ``wcopy``: (prepared transpose, copy's shape) for a contiguous filter)), and the key
    and arguments of the kernel plan (looked up again in ``_plans`` at each call, so clearing that table is seen)."""
    __slots__ = ("direction", "p", "stage", "wmode", "wcopy", "plan_key", "plan_args", "dwk")

    def __call__(self, cp, a, b, out, extra=(), carry=None):
        direction, nd = self.direction, self.p.nd
        if direction == 0:
            x, w = a, b
            if nd == 1:
                x = x[:, :, None, :]
            st = self.stage[0]
            if st:
                sh = None if carry is None else carry.xshadow
                if sh is not None and sh[1] == (x.data.ptr, x.shape, x.strides, x.dtype) \
                        and _ws.eager_stream(cp) is not None:
                    x = carry.xs = sh[0]        # the twin's shadow: x's values in NHWC memory already
                    carry.xkey, carry.xshadow = sh[1], None
                elif carry is not None and carry.want_x and _scope.memo is None:
                    xkey = (x.data.ptr, x.shape, x.strides, x.dtype)
                    x = carry.xs = _stage(cp, x, st[0], None)       # fresh memory, kept for the filter gradient
                    carry.xkey = xkey
                else:
                    x = _stage(cp, x, st[0], 0)
            src = (x, self._filter(cp, w, carry))
        elif direction == 1:
            dy = b if nd == 2 else b[:, :, None, :]
            st = self.stage[1]
            if st:
                dy = _stage(cp, dy, st[0], 0)
            src = (dy, carry.krsc if self.wmode == "carried" else self._filter(cp, a))
        else:
            x, dy = (a, b) if nd == 2 else (a[:, :, None, :], b[:, :, None, :])
            sx, sy = self.stage
            if sx:
                x = _stage(cp, x, sx[0], 0)
            if sy:
                dy = _stage(cp, dy, sy[0], 1)
            src = (x, dy)
        plan = _plans.get(self.plan_key)
        if plan is None:
            plan = _launch.planned(_plans, self.plan_key, _igemm_plan, cp, *self.plan_args)
        main, partial_size, table, tickets, accumulator = plan
        # the split-K partials: every split's block writes its whole fragment of its tile before the tile's last
        # block reads them (conv_igemm_source.py), so a scratch buffer's old contents are never read.  The atomic
        # filter gradient adds into its kept-zeroed accumulator instead (held by the plan).
        partial = _ws.scratch_flat(cp, out.data.device_id, "conv.splitk", partial_size, np.float32) \
            if partial_size else accumulator
        main(src[0], src[1], out, partial, table, tickets, *extra)

    def _filter(self, cp, w, carry=None):
        """The filter as the kernel reads it; ``carry`` (forward): a filter_carry that keeps the KRSC copy."""
        mode = self.wmode
        if mode == "as-is":
            return w
        if mode == "contiguous":
            return cp.ascontiguousarray(w)
        if carry is not None and carry.keep is not None and mode == "krsc" and self.wcopy is not None:
            t = _keep.krsc(cp, w, *carry.keep, *self.wcopy)      # the copy kept for this filter's owner
            if t is not None:
                if carry.want_filter:
                    carry.krsc, carry.key = t, _filter_key(w)
                return t
        if carry is not None and not carry.want_filter:
            carry = None
        if self.wcopy is None:
            t = _filter_copy(cp, self.p, w, mode)                   # fresh memory
        else:
            run, shape = self.wcopy
            # scratch: read by this call's kernel only; kept for backward data: fresh memory
            t = _ws.scratch(cp, w.data.device_id, "conv.filter", shape, w.dtype) if carry is None else \
                _ws.fresh(cp, w.data.device_id, "conv.filter", shape, w.dtype)
            run(w, t)
        if carry is not None and mode == "krsc":
            carry.krsc, carry.key = t, _filter_key(w)
        return t


def _settle(cp, direction, p, a, b, out, tf32, precomp, alpha, beta, tile, epi=None, atomic=False, carried=False):
    """The decisions of ``_run_igemm`` for these arrays' layouts and alignment (nothing launched, nothing copied):
    the VEC loader where the activations are NHWC-like, else the NCHW staging where the problem is large enough, and
    the filter's form for the loader that runs (``carried``, backward data: the forward's KRSC copy is at hand, a
    filter_carry's, read through WKRSC=1 where the CRSK copy would be made)."""
    call = _Call()
    call.direction, call.p = direction, p
    call.stage = (False, False)
    call.wcopy = None
    stage = _stageable(direction, p)
    if direction == 0:
        x, w = _as_2d(a, p.nd), b
        vec = vec_eligible(0, p, x) is None
        if not vec and stage:
            xs = _staged_meta(x)
            if xs is not x:
                call.stage = ((_transposer(x),), False)
                if vec_eligible(0, p, xs) is None:
                    x, vec = xs, True
        wk = cp.moveaxis(w, 1, -1)
        if vec and not (wk.flags.c_contiguous and w.data.ptr % 16 == 0):
            call.wmode = "krsc"                     # the filter as KRSC: k = (r, s, c), the channel innermost
        else:
            call.wmode = "as-is" if vec or w.flags.c_contiguous else "contiguous"
        s1, s2 = x, out
    elif direction == 1:
        # (strided and undilated: every residue class of dx in this one launch, reading the whole filter)
        dy, w = _as_2d(b, p.nd), a
        vec = vec_eligible(1, p, dy) is None
        if not vec and stage:
            dys = _staged_meta(dy)
            if dys is not dy:
                call.stage = (False, (_transposer(dy),))
                if vec_eligible(1, p, dys) is None:
                    dy, vec = dys, True
        reads_krsc = (p.Cg % (16 // p.itemsize) == 0 and cp.moveaxis(w, 1, -1).flags.c_contiguous
                      and w.data.ptr % 16 == 0)
        if vec and reads_krsc:
            vec, call.wmode = "krsc", "as-is"        # a channels-last filter, read as it is (WKRSC=1)
        elif vec and carried and p.Cg % (16 // p.itemsize) == 0:
            vec, call.wmode = "krsc", "carried"      # the forward's KRSC copy (filter_carry), read by WKRSC=1
        elif vec:
            call.wmode = "crsk"                     # the filter as (G, Cg, *kernel, Kg)
        else:
            call.wmode = "as-is" if w.flags.c_contiguous else "contiguous"
        s1, s2 = out, dy
    else:
        x, dy = _as_2d(a, p.nd), _as_2d(b, p.nd)
        vec = vec_eligible(2, p, x, dy) is None
        if not vec and stage:
            xs, dys = _staged_meta(x), _staged_meta(dy)
            call.stage = (xs is not x and (_transposer(x),), dys is not dy and (_transposer(dy),))
            if vec_eligible(2, p, xs, dys) is None:
                x, dy, vec = xs, dys, True
        call.wmode = None
        s1, s2 = x, dy
    if call.wmode in ("krsc", "crsk") and w.flags.c_contiguous:
        n, c = (p.K, p.Cg) if call.wmode == "krsc" else (p.groups, p.Kg)
        run = _transposer(w.reshape(n, c, 1, w.size // (n * c)))
        if run is not None:
            call.wcopy = (run, (p.K, *w.shape[2:], p.Cg) if call.wmode == "krsc" else
                          (p.groups, p.Cg, *w.shape[2:], p.Kg))
    dev = cp.cuda.runtime.getDevice()
    wide = direction == 2 and out.dtype != s1.dtype     # float32 dw from half data (WOUT32)
    sk2 = direction == 2 and not atomic and SPLITK2[0]  # the two-level split-K where the plan has enough splits
    # a channels-last dw (KRSC memory): written so by the VEC loader's row order (DWKRSC); other loaders cannot
    call.dwk = direction == 2 and out.ndim == 4 and not out.flags.c_contiguous and \
        out.transpose(0, 2, 3, 1).flags.c_contiguous
    if call.dwk and not vec:
        raise ValueError("a channels-last (KRSC) dw is written by the NHWC 16-byte loader only; this call runs the "
                         "element loader")
    call.plan_key = (direction, p, s1.strides, s2.strides, s1.dtype, tf32, precomp, alpha, beta, tile, vec, dev)
    call.plan_args = (direction, p, _as_meta(s1), _as_meta(s2), tf32, precomp, alpha, beta, tile, vec,
                      None if epi is None else epi.key, atomic, wide, sk2, call.dwk)
    if epi is not None:
        call.plan_key += (epi.key,)
    if atomic:
        call.plan_key += ("atomic",)
    if wide:
        call.plan_key += ("float32 dw",)
    if sk2:
        call.plan_key += ("splitk2",)
    if call.dwk:
        call.plan_key += ("krsc dw",)
    return call


def _as_meta(a):
    return a if type(a) is _Meta else _meta(a)


def _call_key(direction, p, a, b, out, tf32, precomp, alpha, beta, tile):
    """What ``_settle`` reads of a call (its ``_calls`` key): the problem, both inputs' layouts and 16-byte
    alignment, the output's strides, the math, blending and tile, the staging and loader switches, the device."""
    key = (direction, p, a.shape, a.strides, a.dtype, a.data.ptr & 15, b.shape, b.strides, b.data.ptr & 15,
           out.strides, tf32, precomp, alpha, beta, tile, STAGE_ENABLED[0], VEC_ENABLED[0], STAGE_MIN_MACS,
           a.data.device_id, SPLITK2[0], _pointwise.ENABLED[0], _pointwise.NCHW[0], TRANSPOSE_V2[0])
    if out.dtype != b.dtype:        # (backward filter only: float32 dw from half data)
        key += (out.dtype,)
    return key


def settled_call(cp, direction, p, a, b, out, tf32, precomp, alpha=1.0, beta=0.0, tile=None, atomic=False,
                 carried=False):
    """The settled call (``_Call``, without an epilogue) of ``_run_igemm`` for these arrays: ``atomic`` the
    filter gradient's atomic split-K, ``carried`` backward data reading a filter_carry's KRSC copy.  Also what
    backend.convolution's settled calls (nn's fast path) keep and replay."""
    key = _call_key(direction, p, a, b, out, tf32, precomp, alpha, beta, tile)
    if atomic:
        key += ("atomic",)
    elif carried:
        key += ("carried",)
    call = _calls.get(key)
    if call is None:
        call = _launch.planned(_calls, key, _settle_call, cp, direction, p, a, b, out, tf32, precomp, alpha, beta,
                               tile, atomic, carried)
    return call


def _settle_call(cp, direction, p, a, b, out, tf32, precomp, alpha, beta, tile, atomic, carried):
    """``_settle``'s kernel call, or where the call is a 1x1, stride-1, unpadded, ungrouped convolution on NHWC
    activations (and no tile or atomic form was asked for) the cublasLt product of conv_pointwise, which keeps the
    kernel's call for pointers it cannot take."""
    call = _settle(cp, direction, p, a, b, out, tf32, precomp, alpha, beta, tile, None, atomic, carried)
    if atomic or tile is not None:
        return call
    return _pointwise.settle(direction, p, a, b, out, tf32, alpha, beta, call) or call


def _run_igemm(direction, p, a, b, out, tf32, precomp, alpha, beta, tile=None, epi=None, atomic=False,
               carry=None):
    """out = alpha * (direction's product of a and b) + beta * out, through ONE launch of the implicit-GEMM kernel
    (the filter gradient's split-K partials are added by the last block of each output tile, in split order), after
    the staging copies and filter transpose its loader needs.  The decisions (loader, staging, filter form) are
    settled once per layout and alignment of the arrays (``_calls``), the kernel's launch -- geometry, strides,
    tile, split, the packed scalar arguments -- once per (direction, problem, strides, dtype, math, blend, tile,
    device) (``_plans``): a repeated call costs two dict lookups, its copies, the allocation of the split-K buffer
    and one prepared launch (host cost: docs/host_overhead.md).  ``epi`` (forward): the fused epilogue (Epilogue).
    ``atomic`` (backward filter): the split-K sums by fp32 atomics (ATOMIC=1; non-deterministic, no partials).
    ``carry`` (a filter_carry; plain forward and backward data): forward keeps its KRSC filter copy in it, backward
    data reads that copy (the caller checked it is of ``a``: ``_carried``)."""
    cp = _launch.cupy()
    if epi is None:
        call = settled_call(cp, direction, p, a, b, out, tf32, precomp, alpha, beta, tile, atomic,
                            carry is not None and direction == 1 and not atomic)
        call(cp, a, b, out, (), None if atomic else carry)
        return
    key = _call_key(direction, p, a, b, out, tf32, precomp, alpha, beta, tile) + (epi.key,)
    call = _calls.get(key)
    if call is None:
        call = _launch.planned(_calls, key, _settle, cp, direction, p, a, b, out, tf32, precomp, alpha, beta, tile,
                               epi)
    call(cp, a, b, out, epi.arrays())


def _igemm_plan(cp, direction, p, s1, s2, tf32, precomp, alpha, beta, tile, vec=False, epi_key=None,
                atomic=False, wide=False, sk2=False, dwk=False):
    """(prepared launch, split-K buffer size in floats (0: no split), PRECOMP table or None, split-K tickets or
    None, the atomic variant's accumulator or None) of a call whose x-side strides come from ``s1`` (x or dx) and
    y-side strides from ``s2`` (y or dy); ``atomic``: the ATOMIC=1 filter gradient where it has several splits;
    ``vec``: the NHWC 16-byte loader (no tap table: its tap walk needs none); "krsc": and backward data reads a
    channels-last filter directly; ``wide``: the filter gradient of half data written in float32 (WOUT32=1);
    ``sk2``: the deterministic split-K summed in two levels (SK2=1) where the plan has >= SPLITK2_MIN_SPLITS splits.
    ``epi_key`` (Epilogue.key, forward): the fused epilogue's kernel, whose launch takes z and bias after the six
    plain arrays and z's strides, alpha2 and the activation's coefficient last."""
    g = _geometry(p)
    H, W, P, Q, R, S = g[:6]
    RS = R * S
    dt = _dtype_name(s1)
    sx, sy = _strides(s1), _strides(s2)
    if direction == 0:
        M, NG, KR = p.N * P * Q, p.Kg, p.Cg * RS
    elif direction == 1:
        M, NG, KR = p.N * H * W, p.Cg, p.Kg * RS
    else:
        M, NG, KR = p.Cg * RS, p.Kg, p.N * P * Q
    sms = _launch.sm_count()
    tile = tile or choose_tile(M, NG, p.groups, sms)
    act, pro, stats = (0, 0, False) if epi_key is None else (epi_key[0], epi_key[5], epi_key[6])
    BM, BN, BK = igemm_options(direction, dt, tf32, tile, vec, act)[1:]
    tiles = -(-M // BM) * -(-NG // BN) * p.groups
    splits, per_split = filter_splits(KR, tiles, p.groups, BK, sms) if direction == 2 else (1, KR)
    atomic = atomic and splits > 1 and direction == 2     # one split: the plain kernel (no sums to add)
    sk2 = sk2 and direction == 2 and not atomic and splits >= SPLITK2_MIN_SPLITS
    kernel = _igemm_kernel(direction, dt, tf32, tile, vec, act, atomic, pro, stats, wide, sk2, dwk)[0]
    partial_size = tiles * splits * BM * BN if splits > 1 and direction == 2 and not atomic else 0
    # SK2: one ticket per tile, then one per chunk of each tile (tickets[tiles + tile * chunks + chunk])
    n_tickets = tiles * (1 + splitk2_chunks(splits)[1]) if sk2 else tiles
    tickets = _tickets(cp, n_tickets, cp.cuda.runtime.getDevice()) if partial_size or atomic else None
    if stats:
        # the statistics' block partials ((sum, sumsq) per column of every block) and one ticket per column tile
        partial_size = tiles * BN * 2
        tickets = _tickets(cp, -(-NG // BN) * p.groups, cp.cuda.runtime.getDevice())
    accumulator = _accumulator(cp, tiles * BM * BN, cp.cuda.runtime.getDevice()) if atomic else None
    grid_m = M
    if direction == 1 and _split_by_residue(p):
        # the residue classes on blockIdx.z (the kernel's `splits` argument = their count), blockIdx.x over the
        # largest class's rows (class (0, 0): the others have at most as many)
        sh, sw = g[8], g[9]
        splits, grid_m = sh * sw, p.N * -(-H // sh) * -(-W // sw)
    table = _tap_table(cp, direction, p, g, sx, sy) if precomp and not vec else None
    args = [None] * 6 + _args(p, g, sx, sy) + [np.int32(splits), np.int32(per_split), np.float32(alpha),
                                               np.float32(beta)]
    if act:
        _, coef, alpha2, sz, _, _, _ = epi_key
        args = [None] * (2 + 2 * bool(pro) + 2 * stats) + args + [np.int32(v) for v in (sz or (0, 0, 0, 0))] + \
            [np.float32(alpha2), np.float32(coef)]
    main = _launch.prepare(kernel, (-(-grid_m // BM), -(-NG // BN), p.groups * splits), (128, 1, 1), args)
    return main, partial_size, table, tickets, accumulator


# The deterministic filter gradient's split-K sum in two levels (SK2=1, docs/conv_kernels.md "Session 7"):
# MINIDNN_WGRAD_SPLITK2=0 (or SPLITK2[0] = False) keeps session 6's one-level sum (the tile's last block adds every
# split's whole padded tile) for the GPU A/B.  Plans of fewer than SPLITK2_MIN_SPLITS splits keep it too: their
# serial tail is short, and SK2's extra registers (the chunk walk, ~16 partials in flight a thread: 64x16 47 -> 74,
# 128x64 166 -> 178) would cost the many-tile layers' occupancy for nothing.
SPLITK2 = [os.environ.get("MINIDNN_WGRAD_SPLITK2", "1") != "0"]
SPLITK2_MIN_SPLITS = 16


def splitk2_chunks(splits):
    """(chunk size, chunks) of SK2's two-level sum over ``splits`` partials: chunks of ceil(sqrt(splits))
    consecutive splits (the kernel computes the same), so one block's serial chain is ~2 sqrt(splits) reads."""
    g = max(1, math.isqrt(splits - 1) + 1) if splits > 1 else 1
    return g, -(-splits // g)


def filter_splits(KR, tiles, groups, BK, sms):
    """(splits, reduction rows per split) of the filter gradient's split-K over a reduction of KR rows and
    ``tiles`` output tiles: about 4 blocks per SM, at least 8 k slices per split, whole BK slices per split."""
    splits = max(1, min(-(-4 * sms // tiles), -(-KR // (8 * BK)), 65535 // groups))
    per_split = -(-(-(-KR // splits)) // BK) * BK
    return -(-KR // per_split), per_split


# the split-K ticket counters live in workspace.py (conv_dw_nhwc's filter gradient draws them too)
_ticket_arrays = _ws.ticket_arrays
_tickets = _ws.split_tickets


_accumulators: dict = {}       # device id -> the atomic filter gradient's fp32 tile accumulator (kept zeroed)


def _accumulator(cp, n, dev):
    """At least ``n`` zeroed floats on GPU ``dev`` for the atomic filter gradient (ATOMIC=1): every launch adds
    into its tiles and the last block of each tile writes the zeros back, so one array per device serves every
    plan (zeroed once, here) -- the tickets' idiom and caveat: two such launches on two streams of one device must
    not overlap (``workspace.kept_zeroed``)."""
    return _ws.kept_zeroed(_accumulators, cp, n, dev, 1 << 16, np.float32)


def implicit_forward(p, x, w, tf32=False, precomp=False, alpha=1.0, beta=0.0, out=None, tile=None):
    """y = alpha * conv(x, w) + beta * out (the kernel's epilogue); a new array when ``out`` is None."""
    cp = _launch.cupy()
    y = out if out is not None else _new_like_layout(cp, p.y_shape, x.dtype, _channels_last(x), x.data.device_id)
    if out is not None:
        _check_out(out, p.y_shape, x.dtype)
    elif beta != 0:
        raise ValueError("beta != 0 needs out")
    _run_igemm(0, p, x, w, _as_2d(y, p.nd), tf32, precomp, alpha, beta, tile, carry=_scope.carry)
    return y


def implicit_forward_epilogue(p, x, w, epi, tf32=False, precomp=False, alpha=1.0, beta=0.0, out=None, tile=None):
    """out = act(alpha * conv(x, w) + beta * out + alpha2 * z + bias) in ONE launch (``epi``: an Epilogue; its z
    channels-first, 4-D or the 1-D problem's 3-D, bias a contiguous (K,) array, neither overlapping ``out``): the
    implicit-GEMM forward with EPI=1.  ``out`` is required (the caller allocates y in its format)."""
    _check_out(out, p.y_shape, x.dtype)
    if epi.z is not None and p.nd == 1:
        epi = Epilogue(epi.act, epi.coef, epi.alpha2, epi.z[:, :, None, :], epi.bias, epi.pro, epi.scale,
                       epi.shift, epi.stats)
    _run_igemm(0, p, x, w, _as_2d(out, p.nd), tf32, precomp, alpha, beta, tile, epi)
    return out


def implicit_backward_data(p, w, dy, tf32=False, precomp=False, alpha=1.0, beta=0.0, out=None, tile=None):
    """dx = alpha * (d conv / d x)^T dy + beta * out; inside a ``filter_carry`` block holding the forward's KRSC
    copy of this ``w``, the VEC loader reads that copy (WKRSC=1) instead of making its CRSK one."""
    cp = _launch.cupy()
    dx = out if out is not None else _new_like_layout(cp, p.x_shape, dy.dtype, _channels_last(dy), dy.data.device_id)
    if out is not None:
        _check_out(out, p.x_shape, dy.dtype)
    elif beta != 0:
        raise ValueError("beta != 0 needs out")
    _run_igemm(1, p, w, dy, _as_2d(dx, p.nd), tf32, precomp, alpha, beta, tile,
               carry=None if _scope.carry is None else _carried(w))
    return dx


def _split_by_residue(p):
    """A strided, undilated 2-D (or 1-D) backward data runs as its stride-1 residue classes, all in ONE launch.

    With stride s, dx[h] gathers dy[(h + pad - r) / s] over the taps r that make the division exact: for the rows
    h = s*i + a those are r = r0, r0 + s, ... with r0 = (a + pad) mod s, and then dy's row is i + off - j (j the
    tap's index in that sub-kernel, off = (a + pad - r0) / s).  So the rows of class a form a stride-1 backward-data
    problem of their own -- input rows i, sub-kernel w[:, :, r0::s], padding off, dy unchanged -- written into
    dx[:, :, a::s].  The kernel (DIR 1 with ``splits`` = s_h * s_w classes on blockIdx.z) decodes its class and
    sub-problem per block, reads the ORIGINAL filter at tap r0 + j*s (no sub-kernel copies) and writes dx through
    its strides; a class without a tap (a kernel smaller than the stride, 1x1 stride 2) has an empty reduction and
    writes alpha*0 + beta*dx.  The single strided launch (still used with dilation) visited every tap of every dx
    pixel and discarded the inexact ones: (s_h*s_w - 1) / (s_h*s_w) of its gather work.  The classes must fit
    gridDim.z (groups * s_h * s_w <= 65535)."""
    if p.nd not in (1, 2) or max(p.stride) == 1 or max(p.dilation) != 1:
        return False
    return p.groups * math.prod(p.stride) <= 65535


def implicit_backward_filter(p, x, dy, tf32=False, precomp=False, alpha=1.0, beta=0.0, out=None, tile=None,
                             atomic=False, out_dtype=None):
    """dw = alpha * (filter gradient) + beta * out in one launch; split-K partials added in split order by each
    tile's last block (deterministic), or with ``atomic`` by fp32 atomics into a kept-zeroed accumulator that the
    last block reads, re-zeroes and blends (non-deterministic: ALGO_3 on a handle without ``deterministic``).
    ``out_dtype`` float32 with half data: dw in float32, the sums unrounded (WOUT32=1; autocast's weights)."""
    cp = _launch.cupy()
    dt = _out_dtype(x, out_dtype)
    if out is not None:
        _check_out(out, p.w_shape, dt)
        if not out.flags.c_contiguous:
            res = implicit_backward_filter(p, x, dy, tf32, precomp, tile=tile, atomic=atomic, out_dtype=out_dtype)
            out[...] = (alpha * res.astype(np.float32) + beta * out.astype(np.float32)).astype(out.dtype)
            return out
    elif beta != 0:
        raise ValueError("beta != 0 needs out")
    dw = out if out is not None else cp.empty(p.w_shape, dtype=dt)
    _run_igemm(2, p, x, dy, dw, tf32, precomp, alpha, beta, tile, atomic=atomic)
    return dw


def _out_dtype(x, out_dtype):
    """The filter gradient's dtype: x's, or float32 where ``out_dtype`` asks it for half data (WOUT32 / DWF32)."""
    if out_dtype is None or np.dtype(out_dtype) == x.dtype:
        return x.dtype
    if np.dtype(out_dtype) != np.float32 or x.dtype.itemsize != 2:
        raise ValueError(f"a filter gradient in {np.dtype(out_dtype)} from {x.dtype} data: only float32 from "
                         "float16/bfloat16")
    return np.dtype(np.float32)


# ---- direct (depthwise / small groups) -------------------------------------------------------------------

def _direct_kernel(name, dtype_name, channels_last, maxrs=9, wide=False):
    opts = (f"-DELEM={_ELEM[dtype_name]}", f"-DCL={int(bool(channels_last))}", f"-DMAXRS={maxrs}")
    return _launch.get_kernel(DIRECT_SOURCE, name, opts + (("-DDWF32=1",) if wide else ()))


def _grid_1d(total, sms):
    return (max(1, min(-(-total // 256), 32 * sms)), 1, 1)


def _plane_ok(p, *arrays, max_taps=49):
    """The plane kernels apply: 2-D, equal stride and dilation on both axes, rows of unit stride (NCHW-like
    memory) in every array (the channels-per-group limit is direct_supports')."""
    return (p.nd == 2 and p.stride[0] == p.stride[1] and p.dilation[0] == p.dilation[1]
            and max(p.kernel) <= 7 and math.prod(p.kernel) <= max_taps
            and all(a.strides[3] == a.itemsize for a in arrays))


def _plane_opts(dtype_name, R, S, stride, dil, tw):
    return (f"-DELEM={_ELEM[dtype_name]}", f"-DKR={R}", f"-DKS={S}", f"-DST={stride}", f"-DDL={dil}", f"-DTW={tw}")


def _plane_forward(x, w, y, in_hw, out_hw, pad, stride, dil, Kg, alpha, beta):
    """dw_plane_forward over (N, K) planes: y (N, K, P, Q) from x (N, C, H, W) and a contiguous w (K, Cg, R, S)."""
    (H, W), (P, Q) = in_hw, out_hw
    R, S = w.shape[2:]
    tw = 16 if Q <= 16 else 32
    th = 256 // tw
    k = _launch.get_kernel(DIRECT_SOURCE, "dw_plane_forward", _plane_opts(_dtype_name(x), R, S, stride, dil, tw))
    tiles_q = -(-Q // tw)
    sx, sy = _strides(x), _strides(y)
    _launch.launch(k, (tiles_q * -(-P // th), y.shape[1], y.shape[0]), (tw, th, 1),
                   [x, w, y, *(np.int32(v) for v in (H, W, P, Q, pad[0], pad[1], w.shape[1], Kg,
                                                                       sx[0], sx[1], sx[2], sy[0], sy[1], sy[2],
                                                                       tiles_q)),
                    np.float32(alpha), np.float32(beta)])


TILE_ENABLED = [os.environ.get("MINIDNN_DW_TILE", "1") != "0"]   # MINIDNN_DW_TILE=0: the plane kernel instead
TILE_VW = 4                # outputs per thread along a row (dw_tile_forward's VW)
_TILE_SMEM = 40 * 1024     # dynamic shared memory per block the tile chooser allows
_tile_plans: dict = {}


def _tile_window(R, S, stride, dil, vh):
    """(WIN4 float4s a thread reads per input row, IRH input rows per thread) of dw_tile_forward."""
    win = (TILE_VW - 1) * stride + (S - 1) * dil + 1
    return -(-win // 4), (vh - 1) * stride + (R - 1) * dil + 1


def tile_config(P, Q, planes, R, S, stride, dil, sms=132):
    """(TX, TY, TZ, VH, pitch) of dw_tile_forward for planes of P x Q outputs, or None where the kernel does not
    take the geometry (window over 24 columns, no tile fitting the shared memory, or over 65535 tile rows or
    columns: the grid's y / z limit).  TX threads of VW outputs
    along a row (the whole row when it has <= 32*VW outputs, else the TX in 16..32 wasting fewest columns), TY
    rows of threads of VH output rows each (as many as 256 threads allow, fewest wasted rows), TZ planes per
    block filling 256 threads while keeping >= 2 blocks per SM."""
    vw = TILE_VW
    if (vw - 1) * stride + (S - 1) * dil + 1 > 24 or stride > 4:
        return None
    vh = 1 if P == 1 else 2
    nq = -(-Q // vw)
    tx = nq if nq <= 32 else min(range(16, 33), key=lambda t: (-(-nq // t) * t, -t))
    np_ = -(-P // vh)
    ty_max = max(1, 256 // tx)
    ty = np_ if np_ <= ty_max else min(range(max(1, ty_max // 2), ty_max + 1), key=lambda t: (-(-np_ // t) * t, -t))
    win4, _ = _tile_window(R, S, stride, dil, vh)
    pitch = -(-((tx - 1) * vw * stride + 4 * win4) // 4) * 4
    while True:
        ih = (ty * vh - 1) * stride + (R - 1) * dil + 1
        if ih * pitch * 4 <= _TILE_SMEM or ty == 1:
            break
        ty = max(1, ty // 2)
    if ih * pitch * 4 > _TILE_SMEM:
        return None
    if -(-P // (ty * vh)) > 65535 or -(-Q // (tx * vw)) > 65535:
        return None         # the launch grid's y / z (tile rows, tile columns) hold at most 65535: the plane kernel
    tiles = -(-P // (ty * vh)) * -(-Q // (tx * vw))
    tz = max(1, min(256 // (tx * ty), 64, _TILE_SMEM // (ih * pitch * 4), planes))      # blockDim.z <= 64
    while tz > 1 and -(-planes // tz) * tiles < 2 * sms:
        tz //= 2
    return tx, ty, tz, vh, pitch


def _tile_plan(x, w, y, in_hw, out_hw, pad, stride, dil, Kg, alpha, beta, flip, sms):
    (H, W), (P, Q) = in_hw, out_hw
    R, S = w.shape[2:]
    planes = y.shape[0] * y.shape[1]
    cfg = tile_config(P, Q, planes, R, S, stride, dil, sms)
    if cfg is None:
        return None
    tx, ty, tz, vh, pitch = cfg
    ih = (ty * vh - 1) * stride + (R - 1) * dil + 1
    k = _launch.get_kernel(DIRECT_SOURCE, "dw_tile_forward",
                           _plane_opts(_dtype_name(x), R, S, stride, dil, 32) + (f"-DVW={TILE_VW}", f"-DVH={vh}")
                           + (("-DFLIP=1",) if flip else ()))
    # channels summed per output: w's second axis; under FLIP w is the convolution's (Kc, Cg', R, S) filter and
    # the sum runs over its Kc / groups output channels per group (Kg here is Cg')
    cg = w.shape[0] * Kg // y.shape[1] if flip else w.shape[1]
    sx, sy = _strides(x), _strides(y)
    grid = (-(-planes // tz), -(-P // (ty * vh)), -(-Q // (tx * TILE_VW)))
    args = [None, None, None, *(np.int32(v) for v in (H, W, P, Q, pad[0], pad[1], cg, Kg, y.shape[1],
                                                      planes, sx[0], sx[1], sx[2], sy[0], sy[1], sy[2], pitch)),
            np.float32(alpha), np.float32(beta)]
    return _launch.prepare(k, grid, (tx, ty, tz), args, shared_mem=tz * ih * pitch * 4)


def _tile_forward(x, w, y, in_hw, out_hw, pad, stride, dil, Kg, alpha, beta, flip=False) -> bool:
    """dw_tile_forward (the register-tiled plane kernel) over (N, K) planes, as _plane_forward; False (nothing
    launched) where it does not take the problem.  ``flip``: stride-1 backward data, ``w`` the convolution's own
    contiguous filter, read flipped and channel-swapped by the kernel (FLIP=1) instead of a flipped copy."""
    run = _tile_forward_run(x, w, y, in_hw, out_hw, pad, stride, dil, Kg, alpha, beta, flip)
    if run is None:
        return False
    run(x, w, y)
    return True


def _tile_forward_run(x, w, y, in_hw, out_hw, pad, stride, dil, Kg, alpha, beta, flip=False):
    """_tile_forward's prepared launch for these arrays' signature, or None where it does not take them."""
    if not TILE_ENABLED[0] or y.shape[0] * y.shape[1] >= 2 ** 31:
        return None
    key = (tuple(x.shape), tuple(x.strides), tuple(w.shape), tuple(y.shape), tuple(y.strides), x.dtype, in_hw,
           out_hw, tuple(pad), stride, dil, Kg, float(alpha), float(beta), flip, x.data.device_id)
    return _launch.planned(_tile_plans, key, _tile_plan, x, w, y, in_hw, out_hw, pad, stride, dil, Kg, alpha, beta,
                           flip, _launch.sm_count())


def direct_forward(p, x, w, tf32=False, alpha=1.0, beta=0.0, out=None, nhwc=True):
    """y of the direct kernels; ``nhwc`` False: conv_dw_nhwc's route not tried (the settled channels-last route's
    rest, after its own try declined)."""
    cp = _launch.cupy()
    cl = _channels_last(x) if p.nd == 2 else False
    y = out if out is not None else _new_like_layout(cp, p.y_shape, x.dtype, cl, x.data.device_id)
    if out is not None:
        _check_out(out, p.y_shape, x.dtype)
    x2, y2, w = _as_2d(x, p.nd), _as_2d(y, p.nd), cp.ascontiguousarray(w)
    if TILE_ENABLED[0] and nhwc and _dw_nhwc.forward(p, x2, w, y2, alpha, beta):    # NHWC depthwise
        return y
    if _plane_ok(p, x2, y2):
        if not _tile_forward(x2, w, y2, p.in_size, p.out_size, p.padding, p.stride[0], p.dilation[0], p.Kg, alpha,
                             beta):
            _plane_forward(x2, w, y2, p.in_size, p.out_size, p.padding, p.stride[0], p.dilation[0], p.Kg, alpha,
                           beta)
        return y
    g = _geometry(p)
    k = _direct_kernel("direct_forward", _dtype_name(x), _channels_last(y2))
    total = p.N * p.K * g[2] * g[3]
    _launch.launch(k, _grid_1d(total, _launch.sm_count()), (256, 1, 1),
                   [x2, w, y2, *_args(p, g, _strides(x2), _strides(y2)),
                    np.float32(alpha), np.float32(beta)])
    return y


def direct_backward_data(p, w, dy, tf32=False, alpha=1.0, beta=0.0, out=None, nhwc=True):
    cp = _launch.cupy()
    cl = _channels_last(dy) if p.nd == 2 else False
    dx = out if out is not None else _new_like_layout(cp, p.x_shape, dy.dtype, cl, dy.data.device_id)
    if out is not None:
        _check_out(out, p.x_shape, dy.dtype)
    dy2, dx2 = _as_2d(dy, p.nd), _as_2d(dx, p.nd)
    if TILE_ENABLED[0] and nhwc and _dw_nhwc.backward_data(p, w, dy2, dx2, alpha, beta):   # NHWC depthwise
        return dx
    flipped_pad = tuple(d * (r - 1) - q for d, r, q in zip(p.dilation, p.kernel, p.padding))
    if _plane_ok(p, dy2, dx2) and p.stride[0] == 1 and min(flipped_pad) >= 0:
        # stride 1: dx is the correlation of dy with the flipped kernel whose channel roles are swapped within each
        # group, (K, Cg, R, S) -> (C, Kg, R, S); the tile kernel reads w so (FLIP=1): one launch, no copy of w (the
        # copy was a second launch and ~15-20 us of host time per call, which the 14^2 layer's dgrad showed)
        if _tile_forward(dy2, cp.ascontiguousarray(w), dx2, p.out_size, p.in_size, flipped_pad, 1, p.dilation[0],
                         p.Cg, alpha, beta, flip=True):
            return dx
        R, S = p.kernel
        w_t = w.reshape(p.groups, p.Kg, p.Cg, R, S).transpose(0, 2, 1, 3, 4).reshape(p.C, p.Kg, R, S)
        w_f = cp.ascontiguousarray(w_t[:, :, ::-1, ::-1])
        _plane_forward(dy2, w_f, dx2, p.out_size, p.in_size, flipped_pad, 1, p.dilation[0], p.Cg, alpha, beta)
        return dx
    w = cp.ascontiguousarray(w)
    if _plane_ok(p, dy2, dx2) and _tile_backward_data(p, w, dy2, dx2, alpha, beta):
        return dx           # strided (or stride 1 with pad > dil * (R - 1)): the gather-form tile kernel
    g = _geometry(p)
    k = _direct_kernel("direct_backward_data", _dtype_name(dy), _channels_last(dx2))
    total = p.N * p.C * g[0] * g[1]
    _launch.launch(k, _grid_1d(total, _launch.sm_count()), (256, 1, 1),
                   [w, dy2, dx2, *_args(p, g, _strides(dx2), _strides(dy2)),
                    np.float32(alpha), np.float32(beta)])
    return dx


_dgrad_plans: dict = {}


def dgrad_vec(stride):
    """(DVH, DVW) outputs per thread of dw_tile_backward_data: multiples of the stride (a thread's outputs start at
    a multiple of it, so the residue class of each is compile-time), DVW = 4 where it can (4-wide stores)."""
    return (2 if stride == 1 else stride), (4 if 4 % stride == 0 else stride)


def dgrad_window(R, S, stride, dil, pad, vh, vw):
    """(IRH, IRW): the dy rows x columns one thread of dw_tile_backward_data reads (DG_IRH, DG_IRW): rows
    floor((pad_h % st - (R-1)*dil) / st) .. (pad_h % st + DVH - 1) // st relative to its base row, columns alike."""
    ph, pw = pad[0] % stride, pad[1] % stride
    return ((ph + vh - 1) // stride - (ph - (R - 1) * dil) // stride + 1,
            (pw + vw - 1) // stride - (pw - (S - 1) * dil) // stride + 1)


def dgrad_config(H, W, planes, R, S, stride, dil, pad, sms=132):
    """(TX, TY, TZ, DVH, DVW, pitch) of dw_tile_backward_data for dx planes of H x W, or None where it declines
    (stride over 4, over 49 taps, no tile within the shared memory, a grid over 65535 tile rows / columns).
    Shaped as tile_config: TX threads of DVW outputs along a row (the whole row up to 32 threads, else the TX in
    16..32 wasting fewest columns), TY rows of threads of DVH rows (up to 256 threads, fewest wasted rows), TZ
    planes per block filling 256 threads while keeping >= 2 blocks per SM.  A block stages
    IH = (TY-1)*DVH/st + IRH dy rows x pitch = (TX-1)*DVW/st + IRW columns per plane (rounded up to odd)."""
    if stride > 4 or R * S > 49:
        return None
    vh, vw = dgrad_vec(stride)
    irh, irw = dgrad_window(R, S, stride, dil, pad, vh, vw)
    nq = -(-W // vw)
    tx = nq if nq <= 32 else min(range(16, 33), key=lambda t: (-(-nq // t) * t, -t))
    nh = -(-H // vh)
    ty_max = max(1, 256 // tx)
    ty = nh if nh <= ty_max else min(range(max(1, ty_max // 2), ty_max + 1), key=lambda t: (-(-nh // t) * t, -t))
    pitch = ((tx - 1) * (vw // stride) + irw) | 1     # odd: threads tx*DVW/st apart in rows ty*DVH/st apart
    #                                                  spread over the banks (scalar shared reads)
    while True:
        ih = (ty - 1) * (vh // stride) + irh
        if ih * pitch * 4 <= _TILE_SMEM or ty == 1:
            break
        ty = max(1, ty // 2)
    if ih * pitch * 4 > _TILE_SMEM:
        return None
    if -(-H // (ty * vh)) > 65535 or -(-W // (tx * vw)) > 65535:
        return None
    tiles = -(-H // (ty * vh)) * -(-W // (tx * vw))
    tz = max(1, min(256 // (tx * ty), 64, _TILE_SMEM // (ih * pitch * 4), planes))
    while tz > 1 and -(-planes // tz) * tiles < 2 * sms:
        tz //= 2
    return tx, ty, tz, vh, vw, pitch


def _tile_dgrad_plan(p, w, dy, dx, alpha, beta, sms):
    (H, W), (P, Q) = p.in_size, p.out_size
    R, S = p.kernel
    st, dil = p.stride[0], p.dilation[0]
    planes = dx.shape[0] * dx.shape[1]
    cfg = dgrad_config(H, W, planes, R, S, st, dil, p.padding, sms)
    if cfg is None:
        return None
    tx, ty, tz, vh, vw, pitch = cfg
    irh, _ = dgrad_window(R, S, st, dil, p.padding, vh, vw)
    ih = (ty - 1) * (vh // st) + irh
    k = _launch.get_kernel(DIRECT_SOURCE, "dw_tile_backward_data",
                           _plane_opts(_dtype_name(dy), R, S, st, dil, 32)
                           + (f"-DDVH={vh}", f"-DDVW={vw}", f"-DPHM={p.padding[0] % st}",
                              f"-DPWM={p.padding[1] % st}"))
    sx, sy = _strides(dx), _strides(dy)
    grid = (-(-planes // tz), -(-H // (ty * vh)), -(-W // (tx * vw)))
    args = [None, None, None, *(np.int32(v) for v in (H, W, P, Q, p.padding[0], p.padding[1], p.Cg, p.Kg,
                                                      dx.shape[1], planes, sx[0], sx[1], sx[2], sy[0], sy[1],
                                                      sy[2], pitch)),
            np.float32(alpha), np.float32(beta)]
    return _launch.prepare(k, grid, (tx, ty, tz), args, shared_mem=tz * ih * pitch * 4)


def _tile_backward_data(p, w, dy2, dx2, alpha, beta) -> bool:
    """dw_tile_backward_data (gather form by residue class, any stride <= 4) for NCHW rows, one launch; False
    (nothing launched) where it declines (TILE_ENABLED off / MINIDNN_DW_TILE=0, dgrad_config's limits).  ``w`` is
    the convolution's contiguous (K, Cg, R, S) filter."""
    run = _tile_dgrad_run(p, w, dy2, dx2, alpha, beta)
    if run is None:
        return False
    run(w, dy2, dx2)
    return True


def _tile_dgrad_run(p, w, dy2, dx2, alpha, beta):
    """_tile_backward_data's prepared launch for these arrays' signature, or None where it declines them."""
    if not TILE_ENABLED[0] or dx2.shape[0] * dx2.shape[1] >= 2 ** 31:
        return None
    key = (p, tuple(dy2.strides), tuple(dx2.strides), dy2.dtype, float(alpha), float(beta), dy2.data.device_id)
    return _launch.planned(_dgrad_plans, key, _tile_dgrad_plan, p, w, dy2, dx2, alpha, beta, _launch.sm_count())


WGRAD_TARGET_BLOCKS_PER_SM = 16     # dw_tile_backward_filter: blocks per SM the splits aim at (~4 resident: waves)
_wgrad_plans: dict = {}


def wgrad_config(N, rows, P, Q, R, S, stride, dil, sms=132):
    """(TX, TY, TZ, VH, pitch, threads, splits, per_split) of dw_tile_backward_filter over ``rows`` filter rows,
    each a sum over N planes of P x Q dy values, or None where it does not take the geometry (what tile_config
    declines for dw_tile_forward, over 49 taps).  The dy tile is the forward's (tile_config for one plane); TZ
    tiles per step fill <= 256 threads with the fewest idle slots; a block takes at least 2 steps where a row has
    them, and each row's splits aim at WGRAD_TARGET_BLOCKS_PER_SM blocks per SM over all rows (several waves of
    the ~4 blocks an SM holds: a short tail), at most 65535 (grid y).  Per row the work items are N * tiles
    (n, dy tile) pairs; split i takes items [i * per_split, (i + 1) * per_split)."""
    if R * S > 49:
        return None
    cfg = tile_config(P, Q, 1, R, S, stride, dil, sms)
    if cfg is None:
        return None
    tx, ty, _, vh, pitch = cfg
    ih = (ty * vh - 1) * stride + (R - 1) * dil + 1
    items = N * -(-P // (ty * vh)) * -(-Q // (tx * TILE_VW))
    if items >= 2 ** 31:
        return None
    tz_max = max(1, min(256 // (tx * ty), _TILE_SMEM // (ih * pitch * 4), items))
    tz = min(range(max(1, tz_max // 2), tz_max + 1), key=lambda t: (-(-items // t) * t, -t))
    steps = -(-items // tz)
    want = -(-WGRAD_TARGET_BLOCKS_PER_SM * sms // rows)
    iters = max(min(2, steps), -(-steps // want), -(-steps // 65535))
    per_split = iters * tz
    return tx, ty, tz, vh, pitch, -(-(tx * ty * tz) // 32) * 32, -(-items // per_split), per_split


def _tile_wgrad_plan(p, x, dy, g, alpha, beta, sms, wide=False):
    """(prepared launch of dw_tile_backward_filter, partial floats (0: one split), tickets or None), or None."""
    H, W, P, Q, R, S, ph, pw, st, _, dil, _ = g
    rows = p.K * p.Cg
    cfg = wgrad_config(p.N, rows, P, Q, R, S, st, dil, sms)
    if cfg is None:
        return None
    tx, ty, tz, vh, pitch, threads, splits, per_split = cfg
    ih = (ty * vh - 1) * st + (R - 1) * dil + 1
    k = _launch.get_kernel(DIRECT_SOURCE, "dw_tile_backward_filter",
                           _plane_opts(_dtype_name(x), R, S, st, dil, 32) + (f"-DVW={TILE_VW}", f"-DVH={vh}")
                           + (("-DDWF32=1",) if wide else ()))
    tiles_q = -(-Q // (tx * TILE_VW))
    tiles = -(-P // (ty * vh)) * tiles_q
    sx, sy = _strides(x), _strides(dy)
    args = [None] * 5 + [np.int32(v) for v in (H, W, P, Q, ph, pw, p.Cg, p.Kg, sx[0], sx[1], sx[2], sy[0], sy[1],
                                               sy[2], tx, ty, tz, tiles_q, tiles, p.N * tiles, per_split, pitch)]
    args += [np.float32(alpha), np.float32(beta)]
    run = _launch.prepare(k, (rows, splits, 1), (threads, 1, 1), args, shared_mem=tz * ih * pitch * 4)
    if splits == 1:
        return run, 0, None
    return run, rows * splits * R * S, _tickets(_launch.cupy(), rows, x.data.device_id)


def _tile_backward_filter(p, x2, dy2, dw, g, alpha, beta) -> bool:
    """dw_tile_backward_filter into the contiguous ``dw`` (one launch); False (nothing launched) where it does
    not take the problem (switched off with the forward's TILE_ENABLED / MINIDNN_DW_TILE=0)."""
    plan = _tile_wgrad(p, x2, dy2, dw.dtype, g, alpha, beta)
    if plan is None:
        return False
    run, partial_size, tickets = plan
    # the split sums: written by each split's block before its ticket and read by the last one, within this launch
    # (a scratch buffer, as the implicit GEMM's split-K partials: workspace.py)
    partial = _ws.scratch_flat(_launch.cupy(), x2.data.device_id, "conv.splitk", partial_size, np.float32) \
        if partial_size else None
    run(x2, dy2, partial, tickets, dw)
    return True


def _tile_wgrad(p, x2, dy2, dw_dtype, g, alpha, beta):
    """_tile_backward_filter's plan (prepared launch, partial floats, tickets) for these arrays' signature and a dw
    of ``dw_dtype``, or None where it does not take them."""
    if not TILE_ENABLED[0] or not _plane_ok(p, x2, dy2, max_taps=49):
        return None
    key = (p, x2.strides, dy2.strides, x2.dtype, float(alpha), float(beta), x2.data.device_id)
    wide = dw_dtype != x2.dtype         # float32 dw from half data (DWF32)
    if wide:
        key += (dw_dtype,)
    return _launch.planned(_wgrad_plans, key, _tile_wgrad_plan, p, x2, dy2, g, alpha, beta, _launch.sm_count(),
                           wide)


def direct_backward_filter(p, x, dy, tf32=False, alpha=1.0, beta=0.0, out=None, out_dtype=None, nhwc=True):
    """dw of the direct kernels (NHWC depthwise, register-tiled planes, planes, generic), split sums added in order;
    ``out_dtype`` float32 with half data: dw in float32, the sums unrounded (DWF32=1; autocast's weights)."""
    cp = _launch.cupy()
    dt = _out_dtype(x, out_dtype)
    if out is not None:
        _check_out(out, p.w_shape, dt)
    dw = out if out is not None and out.flags.c_contiguous else cp.empty(p.w_shape, dtype=dt)
    wide = dt != x.dtype
    x2, dy2 = _as_2d(x, p.nd), _as_2d(dy, p.nd)
    g = _geometry(p)
    same = dw is out or out is None
    if TILE_ENABLED[0] and nhwc and _dw_nhwc.backward_filter(p, x2, dy2, dw, alpha if same else 1.0,  # NHWC dw
                                                             beta if same else 0.0) \
            or _tile_backward_filter(p, x2, dy2, dw, g, alpha if same else 1.0, beta if same else 0.0):
        if not same:        # a non-contiguous out: blend afterwards
            return _blend_into(out, dw, alpha, beta)
        return dw
    RS = g[4] * g[5]
    maxrs = 9 if RS <= 9 else (25 if RS <= 25 else 49)
    sms = _launch.sm_count()
    rows = p.K * p.Cg
    npq = p.N * g[2] * g[3]
    splits = max(1, min(-(-4 * sms // rows), -(-npq // 1024), 65535))
    per_split = -(-npq // splits)
    splits = -(-npq // per_split)
    if _plane_ok(p, x2, dy2, max_taps=25):
        # one block per channel and slice of the batch; no index division in the sweep
        splits = max(1, min(-(-4 * sms // rows), p.N))
        n_per = -(-p.N // splits)
        splits = -(-p.N // n_per)
        partial = cp.empty(splits * rows * RS, dtype=np.float32)
        tw = 16 if g[3] <= 16 else 32
        k = _launch.get_kernel(DIRECT_SOURCE, "dw_plane_backward_filter",
                               _plane_opts(_dtype_name(x), g[4], g[5], p.stride[0], p.dilation[0], tw))
        sx, sy = _strides(x2), _strides(dy2)
        _launch.launch(k, (rows, splits, 1), (256, 1, 1),
                       [x2, dy2, partial,
                        *(np.int32(v) for v in (p.N, p.K, g[0], g[1], g[2], g[3], g[6], g[7], p.Cg, p.Kg, sx[0],
                                                sx[1], sx[2], sy[0], sy[1], sy[2], n_per))])
    else:
        partial = cp.empty(splits * rows * RS, dtype=np.float32)
        k = _direct_kernel("direct_backward_filter", _dtype_name(x), False, maxrs)
        _launch.launch(k, (rows, splits, 1), (256, 1, 1),
                       [x2, dy2, partial, *_args(p, g, _strides(x2), _strides(dy2)),
                        np.int32(per_split)])
    red = _direct_kernel("direct_splits_reduce", _dtype_name(x), False, wide=wide)
    n = rows * RS
    _launch.launch(red, (min(-(-n // 256), 4 * sms), 1, 1), (256, 1, 1),
                   [partial, dw, np.int32(splits), np.int32(n), np.float32(alpha if same else 1.0),
                    np.float32(beta if same else 0.0)])
    if not same:            # a non-contiguous out: blend afterwards
        return _blend_into(out, dw, alpha, beta)
    return dw


# The direct kernels' settled route for depthwise problems and strided backward data (session 13, host round 25):
# off (DW_SETTLE[0] = False, or MINIDNN_CONV_DW_SETTLE=0 at import), they keep the full direct_* functions per call.
DW_SETTLE = [os.environ.get("MINIDNN_CONV_DW_SETTLE", "1") != "0"]


def settle_direct(direction, p, a, b, out_dtype=None):
    """A settled form of ``direct_forward(p, a, b)`` (direction 0), ``direct_backward_data(p, a, b)`` (1) or
    ``direct_backward_filter(p, a, b, out_dtype=out_dtype)`` (2) for arrays of the signature of ``a`` and ``b`` --
    shapes, strides, dtype, device -- with alpha 1 and beta 0: a function ``(a, b, out=None)`` that makes the same
    launches as the full function for such arrays and returns its result (``out``: direction 2's contiguous dw to
    write, beta 0), skipping its route choice; or None where the full function takes another route than the
    register-tiled plane kernels (nothing is settled then: depthwise problems that conv_dw_nhwc's NHWC route may
    take -- it reads pointer alignment --, channels-last results, the plane and generic kernels).  Depthwise
    problems whose activations' layout that route declines whatever their addresses (NCHW activations:
    ``conv_dw_nhwc.declines_layout``) settle as the dense ones (session 13: MobileNet's depthwise layers).  Launches
    nothing.  The caller keeps TILE_ENABLED[0] in its key (backend.convolution.settled_state) and vouches for the
    signature."""
    if not TILE_ENABLED[0] or p.nd != 2:
        return None
    depthwise = p.groups == p.C and p.K == p.C
    if depthwise and not DW_SETTLE[0]:
        return None
    cp = _launch.cupy()
    if direction == 0:
        x, w = a, b
        if _channels_last(x) or not w.flags.c_contiguous:
            return None
        y = cp.empty(p.y_shape, dtype=x.dtype)         # a stand-in of the result's signature: no launch reads it
        if depthwise and not _dw_nhwc.declines_layout(p, x, y):
            return None
        if not _plane_ok(p, x, y):
            return None
        run = _tile_forward_run(x, w, y, p.in_size, p.out_size, p.padding, p.stride[0], p.dilation[0], p.Kg, 1.0,
                                0.0)
        if run is None:
            return None
        shape, dtype = p.y_shape, x.dtype

        def forward(x, w, out=None):
            y = cp.empty(shape, dtype=dtype)
            run(x, w, y)
            return y
        return forward
    if direction == 1:
        w, dy = a, b
        flipped_pad = tuple(d * (r - 1) - q for d, r, q in zip(p.dilation, p.kernel, p.padding))
        if _channels_last(dy) or not w.flags.c_contiguous:
            return None
        dx = cp.empty(p.x_shape, dtype=dy.dtype)
        if (depthwise and not _dw_nhwc.declines_layout(p, dy, dx)) or not _plane_ok(p, dy, dx):
            return None
        shape, dtype = p.x_shape, dy.dtype
        if p.stride[0] != 1 or min(flipped_pad) < 0:
            # direct_backward_data's gather-form tile kernel (strided; stride 1 with pad > dil * (R - 1))
            gather = _tile_dgrad_run(p, w, dy, dx, 1.0, 0.0) if DW_SETTLE[0] else None
            if gather is None:
                return None

            def backward_data_gather(w, dy, out=None):
                dx = cp.empty(shape, dtype=dtype)
                gather(w, dy, dx)
                return dx
            return backward_data_gather
        run = _tile_forward_run(dy, w, dx, p.out_size, p.in_size, flipped_pad, 1, p.dilation[0], p.Cg, 1.0, 0.0,
                                flip=True)
        if run is None:
            return None

        def backward_data(w, dy, out=None):
            dx = cp.empty(shape, dtype=dtype)
            run(dy, w, dx)
            return dx
        return backward_data
    x, dy = a, b
    if depthwise and not _dw_nhwc.declines_layout(p, x, dy):
        return None
    dt = _out_dtype(x, out_dtype)
    plan = _tile_wgrad(p, x, dy, dt, _geometry(p), 1.0, 0.0)
    if plan is None:
        return None
    run, partial_size, tickets = plan
    shape, dev = p.w_shape, x.data.device_id

    def backward_filter(x, dy, out=None):
        dw = cp.empty(shape, dtype=dt) if out is None else out
        run(x, dy, _ws.scratch_flat(cp, dev, "conv.splitk", partial_size, np.float32) if partial_size else None,
            tickets, dw)
        return dw
    return backward_filter


# conv_dw_nhwc's channels-last depthwise route settled too (host round 26b: MobileNet-small's channels-last step ran
# the full direct_* functions and conv_dw_nhwc's eligibility tests on every depthwise call): off (DW_CL_SETTLE[0] =
# False, or MINIDNN_CONV_DW_CL_SETTLE=0 at import), they keep the full functions per call.
DW_CL_SETTLE = [os.environ.get("MINIDNN_CONV_DW_CL_SETTLE", "1") != "0"]


class _DenseCL:
    """What conv_dw_nhwc's layout test reads of a result _new_like_layout would make ((N, C, H, W)-indexed, dense
    channels-last): a stand-in that allocates nothing (a settle may come inside a counted or captured step)."""
    __slots__ = ("ndim", "shape", "strides", "itemsize", "size")

    def __init__(self, shape, dtype):
        n, c, h, w = shape
        e = dtype.itemsize
        self.ndim, self.shape, self.itemsize, self.size = 4, tuple(shape), e, n * c * h * w
        self.strides = (h * w * c * e, e, w * c * e, c * e)


def settle_direct_cl(direction, p, a, b, out_dtype=None):
    """The settled form of ``direct_forward(p, a, b)`` (direction 0), ``direct_backward_data(p, a, b)`` (1) or
    ``direct_backward_filter(p, a, b, out_dtype=out_dtype)`` (2), alpha 1 and beta 0, for a depthwise problem whose
    channels-last activations (channels-first views; the results' dense channels-last or contiguous layouts)
    conv_dw_nhwc takes by layout -- or None.  What its eligibility reads besides the signature is read per call:
    its switches (ENABLED, V2), the activations' base alignment to its vector and the filter's (the V2 kernels'
    vector taps); a call it then declines, or whose plan it declines, runs the full function's rest on the arrays
    already made (the launches the full function makes).  Same interface as ``settle_direct``'s functions."""
    if not (DW_CL_SETTLE[0] and TILE_ENABLED[0] and DW_SETTLE[0]) or p.nd != 2 \
            or not (p.groups == p.C and p.K == p.C):
        return None
    cp = _launch.cupy()
    R, S = p.kernel
    dvec = _dw_nhwc
    if direction == 0:
        x = a
        if not _channels_last(x):
            return None
        stand = _DenseCL(p.y_shape, x.dtype)
        acts = (x, stand)
    elif direction == 1:
        dy = b
        if not _channels_last(dy):
            return None
        stand = _DenseCL(p.x_shape, dy.dtype)
        acts = (dy, stand)
    else:
        x, dy = a, b
        if not (_channels_last(x) and _channels_last(dy)):
            return None
        acts = (x, dy)
    if dvec._why_not(p, acts, False) is not None:
        return None
    item = acts[0].itemsize
    cv = dvec.vector(item, R * S)
    align = cv * item
    dev = acts[0].data.device_id
    s0, s1 = acts[0].strides, acts[1].strides
    sms = _launch.sm_count()
    if direction == 0:
        shape, dtype = p.y_shape, a.dtype

        def forward(x, w, out=None):
            y = _new_like_layout(cp, shape, dtype, True, dev)
            w = cp.ascontiguousarray(w)         # (direct_forward's, before conv_dw_nhwc's try)
            if not dvec.ENABLED[0] or x.data.ptr % align or y.data.ptr % align:
                return direct_forward(p, x, w, out=y, nhwc=False)
            v2 = dvec.V2[0]
            wvec = v2 and dvec._w_vec_ok(w, cv)
            run = _launch.planned(dvec._fwd_plans, (p, s0, s1, 1.0, 0.0, dev, v2, wvec), dvec._gather_plan,
                                  "dwn_forward", p, x, y, p.in_size, p.out_size, p.padding, p.stride[0], False, 1.0,
                                  0.0, v2, wvec, sms)
            if run is None:
                return direct_forward(p, x, w, out=y, nhwc=False)
            run(x, w, y)
            return y
        return forward
    if direction == 1:
        shape, dtype = p.x_shape, b.dtype

        def backward_data(w, dy, out=None):
            dx = _new_like_layout(cp, shape, dtype, True, dev)
            if not dvec.ENABLED[0] or dy.data.ptr % align or dx.data.ptr % align:
                return direct_backward_data(p, w, dy, out=dx, nhwc=False)
            wc = cp.ascontiguousarray(w)        # (conv_dw_nhwc.backward_data's, after its eligibility)
            v2 = dvec.V2[0]
            wvec = v2 and dvec._w_vec_ok(wc, cv)
            run = _launch.planned(dvec._dgrad_plans, (p, s0, s1, 1.0, 0.0, dev, v2, wvec), dvec._dgrad_plan, p, dy,
                                  dx, 1.0, 0.0, v2, wvec, sms)
            if run is None:
                return direct_backward_data(p, w, dy, out=dx, nhwc=False)
            if run.gather:
                run(wc, dy, dx)
            else:
                run(dy, wc, dx)
            return dx
        return backward_data
    dt = _out_dtype(a, out_dtype)
    wide = dt != a.dtype
    shape = p.w_shape

    def backward_filter(x, dy, out=None):
        dw = cp.empty(shape, dtype=dt) if out is None else out
        if not dvec.ENABLED[0] or x.data.ptr % align or dy.data.ptr % align:
            return direct_backward_filter(p, x, dy, out=dw, out_dtype=out_dtype, nhwc=False)
        v2 = dvec.V2[0]
        key = (p, s0, s1, 1.0, 0.0, dev, v2) + ((dt,) if wide else ())
        plan = _launch.planned(dvec._wgrad_plans, key, dvec._wgrad_plan, p, x, dy, 1.0, 0.0, sms, wide, v2)
        if plan is None:
            return direct_backward_filter(p, x, dy, out=dw, out_dtype=out_dtype, nhwc=False)
        run, partial_size, tickets = plan
        run(x, dy, _ws.scratch_flat(cp, dev, "conv.splitk", partial_size, np.float32) if partial_size else None,
            tickets, dw)
        return dw
    return backward_filter


def _blend_into(out, dw, alpha, beta):
    """out = alpha * dw + beta * out, in float32; ``out`` is not read when beta == 0 (cuDNN's rule: a NaN left in
    it must not leak into the result)."""
    v = alpha * dw.astype(np.float32)
    out[...] = (v if beta == 0 else v + beta * out.astype(np.float32)).astype(out.dtype)
    return out
