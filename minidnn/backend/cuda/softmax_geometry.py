"""The row kernels' tiling of softmax / log-softmax rows (row_config), shared by softmax_kernels (which plans and
launches them) and softmax_cluster (whose rule asks where they hold a row on chip): apart so that neither module
imports the other.  Shape legend as softmax_kernels': a row of C elements over the last axis, held by G threads in
vectors of VEC elements, chunk by chunk past one chunk."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["RowConfig", "row_config", "STASH_BYTES", "dtype_of"]


def _pow2_at_least(n):
    return 1 << max(0, int(n) - 1).bit_length()


class RowConfig(NamedTuple):
    g: int          # threads a row (a power of two <= 32 in 256-thread blocks, or the whole block)
    nv: int         # vectors a thread holds per chunk
    vec: int        # elements a vector
    block: int      # threads a block
    ragged: bool    # C % vec != 0: each row's head and tail as scalars, the body as vectors
    one: bool       # the row is one chunk
    sch: int        # chunks also kept in shared memory (several-chunk rows)


STASH_BYTES = 64 * 1024        # shared memory a forward block may keep a long row's chunks in (two 512-thread blocks
                               # an SM: 128 of 228 KB)


def row_config(c, itemsize, acc_itemsize, arrays=1, stash_bytes=0, warp_pair=False, warp_cap=None):
    """The row kernels' tiling (RowConfig) for rows of ``c`` elements of ``itemsize`` bytes computed in
    ``acc_itemsize``-byte floats, ``arrays`` rows held at once (2: softmax backward's y and dy).  VEC: the widest
    vector (<= 16 bytes) that divides the row; a row of at least 32 such vectors that no wide vector divides is
    RAGGED (wide vectors for its body, scalars for each row's head and tail).  A warp-or-less group while a thread
    holds <= 32 (float64: 16) elements, else a block of up to 512 threads holding <= 32 (16) elements; both halved
    for two arrays unless ``warp_pair`` (the warp path keeps 32 + 32: bwd_warp); a longer row
    runs in chunks of G * NV vectors, up to ``stash_bytes`` of them kept in shared memory.  NV is a power of two
    (fewer distinct compilations)."""
    maxvec = max(1, 16 // itemsize)
    vec = maxvec
    while c % vec:
        vec //= 2
    ragged = vec < maxvec and c >= 32 * maxvec
    if ragged:
        vec = maxvec
    nvec = c // vec                                  # body vectors at most (ragged: fewer when the head is not 0)
    cap = warp_cap or (32 if acc_itemsize <= 4 else 16) // (arrays if arrays > 1 and not warp_pair else 1)
    g = min(32, _pow2_at_least(nvec))
    nv = _pow2_at_least(-(-nvec // g))
    block = 256
    if nv * vec > cap:
        cap = (32 if acc_itemsize <= 4 else 16) // arrays    # a block-path thread (512 threads: <= 64 registers)
        block = g = min(512, max(64, _pow2_at_least(-(-c // cap))))
        nv = max(1, min(_pow2_at_least(-(-nvec // block)), cap // vec))
    nch = -(-nvec // (g * nv))
    sch = 0 if nch <= 1 else min(nch - 1, stash_bytes // (nv * vec * block * acc_itemsize))
    return RowConfig(g, nv, vec, block, ragged, nch <= 1, sch)


def dtype_of(name):
    """np.dtype of a dtype name, bfloat16 through ml_dtypes."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
