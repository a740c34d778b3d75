"""How the CUDA convolution kernels (conv_igemm.py) join the algorithm registries of conv_algorithms.py.

Forward              IMPLICIT_GEMM          implicit-GEMM kernel, tap decode by 32-bit division, no workspace
                     IMPLICIT_PRECOMP_GEMM  the same kernel reading a precomputed int4 tap table (workspace)
                     DIRECT                 + fast path: the direct kernel on CuPy arrays with <= 8 channels per group
                                              (grouped, depthwise, or dense with C <= 8: LeNet's conv1 and conv2)
Backward data        ALGO_0                 + fast paths: direct kernel (<= 8 channels per group), else implicit GEMM
                                              (tap table) -- ALGO_0 is the algorithm without an im2col matrix
Backward filter      ALGO_0                 + fast paths: direct kernel (<= 8 channels per group), else implicit GEMM
                                              (tap table), split-K partials added in split order: deterministic
                     ALGO_3                 the same implicit GEMM with the tap table, split-K by fp32 atomics into a
                                              kept-zeroed accumulator: NON-deterministic on CUDA (as cuDNN's ALGO_3,
                                              "ALGO_0 with precomputed indices", which sums with atomics too)
The IMPLICIT_* members and ALGO_3 run only on CUDA (``devices``), on float32 (FMA, or TF32 when the math type
allows it) and on float16/bfloat16 data natively (tensor cores, fp32 accumulation).  Every kernel but ALGO_3 is
deterministic: ALGO_0's filter gradient adds its split-K partial sums in split order (the last block of each output
tile, in the same launch).  ALGO_3 is reported non-deterministic on "cuda", so a handle with ``deterministic`` set
never selects it (the registry rejects it), and its heuristic cost sits ATOMIC_COST_FACTOR above ALGO_0's, so the
heuristic (get_*) keeps picking the deterministic kernel by default; find_* times both and benchmark mode takes the
atomic one where it wins.  Pure Python: importing this needs no GPU.
"""
from __future__ import annotations

import math

from . import conv_igemm as K

__all__ = ["register", "implicit_cost", "implicit_workspace", "precomp_workspace", "filter_workspace",
           "IGEMM_RULE", "ENABLED", "implicit_cost_no_table", "atomic_filter_workspace", "atomic_filter_cost",
           "ATOMIC_COST_FACTOR"]

ENABLED = [True]          # False: the fast paths step aside (the references run), for debugging and comparisons

IGEMM_RULE = ("1-D or 2-D float32/float16/bfloat16 convolutions with tensors under 2**31 elements",
              lambda p: K.igemm_supports(p) is None)


def _on_gpu(a) -> bool:
    return ENABLED[0] and type(a).__module__.split(".")[0] == "cupy"


def _bytes(p):
    return (math.prod(p.x_shape) + math.prod(p.y_shape)) * 4


def implicit_cost(p, device_type="cuda"):
    """Relative time of the implicit-GEMM kernels: multiply-adds at a high fraction of the FMA rate plus one
    pass over x and y; GEMM tiles are wasted on a few channels per group (depthwise: 16 of every 16x16)."""
    if device_type == "cpu":
        return float("inf")
    f = 0.4
    taps = math.prod(p.kernel)
    if p.Kg < 16:
        f *= 16 / p.Kg
    if p.Cg * taps < 16:
        f *= 16 / (p.Cg * taps)
    return (2 * p.macs + 2 * _bytes(p)) * f


def implicit_cost_no_table(p, device_type="cuda"):
    """IMPLICIT_GEMM: as IMPLICIT_PRECOMP_GEMM plus the tap decode's divisions (ranked just behind it)."""
    return 1.05 * implicit_cost(p, device_type)


# ALGO_3 (atomic split-K) against ALGO_0's deterministic kernel in the heuristic: ranked just behind it, so that
# get_* on a default handle (deterministic=False) still gives bitwise-repeatable filter gradients; find_* measures.
ATOMIC_COST_FACTOR = 1.02


def atomic_filter_cost(p, device_type="cuda"):
    return ATOMIC_COST_FACTOR * implicit_cost(p, device_type)


def _direct_cost(p):
    return 2 * p.macs * 0.3 + 2 * _bytes(p) * 0.5


def implicit_workspace(p):
    return 0


def precomp_workspace(p):               # one int4 per reduction index, in elements of the data type
    return 16 * max(p.Cg, p.Kg) * math.prod(p.kernel) // p.itemsize


def filter_workspace(p, sms=132):       # the tap table, the split-K float partials of every block, the tickets
    crs = p.Cg * math.prod(p.kernel)
    tile = K.choose_tile(crs, p.Kg, p.groups, sms)
    BM, BN, BK = K.TILES[tile][:3]
    tiles = -(-crs // BM) * -(-p.Kg // BN) * p.groups
    splits = K.filter_splits(p.N * math.prod(p.out_size), tiles, p.groups, 32 if p.itemsize == 2 else BK, sms)[0]
    split_bytes = (4 * splits * tiles * BM * BN + 4 * tiles) if splits > 1 else 0
    return (16 * crs + split_bytes) // p.itemsize


def atomic_filter_workspace(p, sms=132):    # the tap table; the accumulator is one per device (kept zeroed)
    return 16 * p.Cg * math.prod(p.kernel) // p.itemsize


def _dense_channels_last(p, a, b):
    """A dense (groups == 1) problem on channels-last activations: the direct kernels' NHWC forms are generic
    (H200, ResNet-20's 3-channel stem N128 3->16 32^2, fp32 µs fwd / dgrad / wgrad: direct 80.7 / 52.5 / 104.2
    against the implicit GEMM's 18.2 / 38.6 / 94.3), so these go to the implicit GEMM; NCHW stays direct (19.3 /
    29.2 / 24.9 against 18.0 / 50.5 / 94.0)."""
    return p.groups == 1 and p.Cg > 1 and (K._channels_last(a) or K._channels_last(b))


def _small_groups(p, a, b):
    return _on_gpu(a) and K.direct_supports(p) is None and not _dense_channels_last(p, a, b)


def _dense_gpu(p, a, b):
    return _on_gpu(a) and K.igemm_supports(p) is None and (K.direct_supports(p) is not None
                                                           or _dense_channels_last(p, a, b))


def _direct_cost_if(p, device_type):
    if device_type != "cpu" and K.direct_supports(p) is None:
        return _direct_cost(p)
    return None


def _implicit_cost_if(p, device_type):
    if device_type != "cpu" and K.igemm_supports(p) is None and K.direct_supports(p) is not None \
            and p.dtype != "float64":
        return implicit_cost(p, device_type)
    return None


def register(FW, BD, BF):
    """Mark the CUDA-only members and attach the kernels as fast paths of DIRECT / ALGO_0 in the three registries
    (forward, backward data, backward filter; called once by conv_algorithms.py, which passes them in)."""
    A, DA, FA = FW.enum_type, BD.enum_type, BF.enum_type
    for alg in (FW.get(A.IMPLICIT_GEMM), FW.get(A.IMPLICIT_PRECOMP_GEMM), BF.get(FA.ALGO_3)):
        alg.devices = ("cuda",)
        alg.native_half = True
    BF.get(FA.ALGO_3).nondeterministic_on = ("cuda",)     # fp32 atomics: the sums' order is the L2's
    BF.get(FA.ALGO_3).wide_out_runs.add(backward_filter_atomic)    # float32 dw from half data (autocast)
    # every kernel here takes float16/bfloat16 data as it is (native_half): no float32 round trip of its inputs
    # "<= 8 channels per group" includes dense convolutions of C <= 8 (K.direct_supports): their direct cost
    # (0.6 per multiply-add) undercuts the implicit GEMM's (0.8, more where its tiles waste N: C == 1's 16/K) and
    # the cuBLAS GEMM's (im2col + product + reduce + copy), so get_*_v7 ranks DIRECT / ALGO_0 first for them (H200,
    # LeNet conv2: direct 1.5-2.3x the implicit GEMM); K.DIRECT_DENSE_MAX_MACS sends the larger ones back
    FW.get(A.DIRECT).add_fast_path("direct CUDA kernel (<= 8 channels per group)", _small_groups,
                                   K.direct_forward, cost=_direct_cost_if, native_half=True)
    FW.get(A.DIRECT).add_fast_path("implicit-GEMM CUDA kernel (dense few-channel problems on channels-last "
                                   "activations, where it beats the direct kernels' NHWC forms)",
                                   lambda p, x, w: _dense_channels_last(p, x, w) and _dense_gpu(p, x, w),
                                   forward_implicit, native_half=True)
    BD.get(DA.ALGO_0).add_fast_path("direct CUDA kernel (<= 8 channels per group)", _small_groups,
                                    K.direct_backward_data, cost=_direct_cost_if, native_half=True)
    BD.get(DA.ALGO_0).add_fast_path("implicit-GEMM CUDA kernel (tap table)", _dense_gpu, backward_data_precomp,
                                    cost=_implicit_cost_if, native_half=True)
    # (the filter gradients also write float32 dw from half data: wide_out, autocast's weight gradients)
    BF.get(FA.ALGO_0).add_fast_path("direct CUDA kernel, block reduction (<= 8 channels per group)", _small_groups,
                                    K.direct_backward_filter, cost=_direct_cost_if, native_half=True,
                                    wide_out=True)
    # (with the tap table: the launch a default or deterministic handle's heuristic choice made when ALGO_3 was
    # this deterministic kernel -- ALGO_3 ranked first then, at equal cost; now ALGO_0 is first and runs it)
    BF.get(FA.ALGO_0).add_fast_path("implicit-GEMM CUDA kernel (tap table), split-K in order", _dense_gpu,
                                    backward_filter_precomp, cost=_implicit_cost_if, native_half=True,
                                    wide_out=True)


# The implicit-GEMM run functions (conv_algorithms.py registers the CUDA-only members' ones, ``register`` the fast
# paths').  Each says in ``igemm`` = (direction, precomp, atomic) which settled kernel call it makes with its default
# arguments (conv_igemm.settled_call): backend.convolution's settled calls (nn's fast path) replay that call directly.
def forward_implicit(p, x, w, tf32=False):
    return K.implicit_forward(p, x, w, tf32, precomp=False)


def forward_implicit_precomp(p, x, w, tf32=False):
    return K.implicit_forward(p, x, w, tf32, precomp=True)


def backward_data_precomp(p, w, dy, tf32=False):
    return K.implicit_backward_data(p, w, dy, tf32, True)


def backward_filter_precomp(p, x, dy, tf32=False, out_dtype=None):
    return K.implicit_backward_filter(p, x, dy, tf32, precomp=True, out_dtype=out_dtype)


def backward_filter_atomic(p, x, dy, tf32=False, out_dtype=None):
    """ALGO_3: the implicit-GEMM filter gradient with split-K by fp32 atomics (non-deterministic)."""
    return K.implicit_backward_filter(p, x, dy, tf32, precomp=True, atomic=True, out_dtype=out_dtype)


forward_implicit.igemm = (0, False, False)
forward_implicit_precomp.igemm = (0, True, False)
backward_data_precomp.igemm = (1, True, False)
backward_filter_precomp.igemm = (2, True, False)
backward_filter_atomic.igemm = (2, True, True)

