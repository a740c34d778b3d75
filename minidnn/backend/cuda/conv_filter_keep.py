"""Convolution filters' KRSC copies kept across calls and refreshed together, in one launch (session 16).

Where the implicit-GEMM forward reads an NCHW (K, C, R, S) filter with its 16-byte NHWC loader, it reads the filter
as (K, R, S, C): a transposing copy, one launch per convolution and call (conv_igemm ``_Call._filter``).  On an eager
step that is host-bound (~28 µs of Python a launch on the H200 host), ResNet-20 made 18 of them a forward, a tenth of
its launches.  A filter changes between forwards (the optimizer) but its copy does not have to be made by its own
convolution: this module keeps each filter's copy and, when one is asked for a second time, remakes ALL of them in
one launch (``krsc_many``).  In a training loop the forward's first convolution refreshes every kept copy and the
others find theirs ready: one launch a forward instead of one a convolution.

The rule that keeps a copy's values the filter's:
- A kept copy is handed out at most once per refresh.  Its convolution asking again (the next forward, or a second
  use in the same forward) refreshes the group.
- A refresh records each owner's (array, version) -- ``state_of(owner)``, given by the caller (nn: the weight
  Tensor's ``.data`` and ``_version``).  A copy is handed out without a refresh only while its owner still holds the
  same array at the same version; anything else (an optimizer step, an in-place op, the array replaced) refreshes.
- The owner is the Tensor whose array the convolution reads (a parameter, or autocast's kept low-precision weight,
  whose refill bumps its version).  Writes that bypass the Tensor (into the raw ``.data`` array) are not seen: the
  same known limit as autograd's saved-tensor check and the twins (docs/fusion.md).
- Never while the stream captures a CUDA graph (the replay would not repeat the refresh that made a copy outside
  the graph): the caller then copies as before.  Groups are per thread, device, stream and element size.
- A copy not handed out in ``IDLE_LIMIT`` refreshes in a row (a model no longer run) leaves its group; its owner's
  death drops it at the next call.  ``clear()`` (``minidnn.cuda.empty_cache``) drops them all.

The copies are the bits of conv_igemm's prepared transpose (the same elements moved); the backward data reads the
forward's copy as before (filter_carry).  Switch: ``KEEP[0] = False`` or MINIDNN_CONV_KEEP_FILTERS=0 at import.
The reference is the per-call copy (``conv_igemm._filter_copy``); tests/backend/test_conv_filter_keep.py checks
``krsc_many`` against it and the keeping rule on the fake CuPy, tests/nn/test_conv_filter_keep_cuda.py on a GPU.
"""
from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from . import launch as _launch

KEEP = [os.environ.get("MINIDNN_CONV_KEEP_FILTERS", "1") != "0"]
IDLE_LIMIT = 4

SOURCE = r"""
// krsc_many: for every segment s of the table, dst_s[k, rs, c] = src_s[k, c, rs] (a filter (K, C, R, S) as
// (K, R, S, C), RS = R * S); elements moved as WORD_T (the element's size: 2, 4 or 8 bytes).
// Shape legend: table  (nseg, 5) int64 rows (src address, dst address, K, C, RS); src_s, dst_s  K * C * RS
//               elements each, contiguous, disjoint.
// Tiling: blockIdx.y = the segment; blockIdx.x with 256 threads strides over that segment's dst elements in order
// (coalesced stores; the loads stride by RS, a filter is a few KB to a few hundred KB and sits in L2).
// Each thread moves every (gridDim.x * 256)-th element of its segment.
extern "C" __global__ void __launch_bounds__(256)
krsc_many(const long long* __restrict__ table)
{
    const long long* t = table + 5 * (long long)blockIdx.y;
    const WORD_T* src = reinterpret_cast<const WORD_T*>(t[0]);
    WORD_T* dst = reinterpret_cast<WORD_T*>(t[1]);
    // 32-bit index arithmetic: a kept filter has fewer than 2^31 elements (krsc() keeps no larger one)
    const unsigned C = (unsigned)t[3], RS = (unsigned)t[4], n = (unsigned)t[2] * C * RS;
    const unsigned step = gridDim.x * blockDim.x;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const unsigned c = i % C, q = i / C;            // q = k * RS + rs
        const unsigned rs = q % RS, k = q / RS;
        dst[i] = src[(k * C + c) * RS + rs];
    }
}
"""

_WORD = {2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


def _key(a):
    return (a.data.ptr, a.shape, a.strides, a.dtype)


class _Kept:
    """One kept copy: ``dst``, made from the memory ``key`` names (the owner's array when the copy was made; not
    held here -- a held view would keep autocast's low-precision copy busy -- but alive while the owner holds it)."""
    __slots__ = ("owner", "state_of", "key", "dst", "version", "used", "idle", "row")

    def __init__(self, owner, state_of, key, src, dst, version, group):
        self.owner = weakref.ref(owner, group.dead)
        self.state_of, self.key, self.dst, self.version = state_of, key, dst, version
        self.used, self.idle = True, 0
        k, c = src.shape[:2]
        self.row = (src.data.ptr, dst.data.ptr, k, c, src.size // (k * c))

    def source_of(self, owner):
        """(owner's array, version) while that array is still the memory copied from, else (None, None)."""
        arr, version = self.state_of(owner)
        return (arr, version) if _key(arr) == self.key else (None, None)


class _Group:
    """The kept copies of one thread, device, stream and element size, refreshed by one launch."""
    __slots__ = ("entries", "table", "go", "stale_table", "died", "__weakref__")

    def __init__(self):
        self.entries = {}           # key (address, shape, strides, dtype) -> _Kept
        self.table = self.go = None
        self.stale_table = True
        self.died = False

    def dead(self, _ref):           # an owner died (weakref callback: any thread; only a flag is set)
        self.died = True

    def prune(self):
        self.died = False
        for key, e in list(self.entries.items()):
            o = e.owner()
            if o is None or e.source_of(o)[0] is None:
                del self.entries[key]
                self.stale_table = True

    def refresh(self, cp, dev, itemsize, asking):
        """Every kept copy remade from its owner's current array, in one launch; each stamped unused.  ``asking``
        (the copy whose request caused this) stays whatever its idle count."""
        for key, e in list(self.entries.items()):
            o = e.owner()
            arr, version = (None, None) if o is None else e.source_of(o)
            if arr is None or (e.idle >= IDLE_LIMIT and e is not asking):
                del self.entries[key]
                self.stale_table = True
                continue
            e.version, e.used = version, False
            e.idle += 1
        if not self.entries:
            return
        if self.stale_table:
            rows = [e.row for e in self.entries.values()]
            # (one host-to-device copy, only when the set of copies changed; never while capturing)
            self.table = cp.asarray(np.array(rows, dtype=np.int64))
            blocks = min(256, max(1, -(-max(k * c * rs for _, _, k, c, rs in rows) // 256)))
            with _launch.on_device(dev):
                kernel = _launch.get_kernel(SOURCE, "krsc_many", (f"-DWORD_T={_WORD[itemsize]}",))
            self.go = _launch.prepare(kernel, (blocks, len(rows)), (256,), [None])
            self.stale_table = False
        self.go(self.table)


class _Local(threading.local):
    def __init__(self):
        self.groups = {}            # (device, stream, itemsize) -> _Group


_local = _Local()


def krsc(cp, w, owner, state_of, run, shape):
    """The KRSC copy (``shape``, w's dtype) of the contiguous filter ``w``, kept for ``owner`` (whose array w is:
    ``state_of(owner)`` -> (array, version)); ``run(w, dst)``: the prepared transpose that makes one copy.  None where
    nothing is kept (switched off, capturing, w not owner's array): the caller copies as before."""
    stream = cp.cuda.get_current_stream().ptr
    if not KEEP[0] or (stream and cp.cuda.runtime.streamIsCapturing(stream)) or w.itemsize not in _WORD \
            or w.size >= 2 ** 31:
        return None
    arr, version = state_of(owner)
    if arr is not w:
        return None
    dev = w.data.device_id
    gkey = (dev, stream, w.itemsize)
    g = _local.groups.get(gkey)
    if g is None:
        g = _local.groups[gkey] = _Group()
    elif g.died:
        g.prune()
    key = _key(w)
    e = g.entries.get(key)
    if e is not None and e.owner() is owner:
        if e.used or e.version != version:
            g.refresh(cp, dev, w.itemsize, e)
        e.used, e.idle = True, 0
        return e.dst
    dst = cp.empty(shape, dtype=w.dtype)
    run(w, dst)
    g.entries[key] = _Kept(owner, state_of, key, w, dst, version, g)
    g.stale_table = True
    return dst


def kept_count() -> int:
    """Copies kept by this thread (all groups)."""
    return sum(len(g.entries) for g in _local.groups.values())


def clear() -> None:
    """Drop this thread's kept copies (their memory goes back to the pool)."""
    _local.groups.clear()
