"""Convolution filters' KRSC copies kept across calls and refreshed together, in one launch (session 16).

Where the implicit-GEMM forward reads an NCHW (K, C, R, S) filter with its 16-byte NHWC loader, it reads the filter
as (K, R, S, C): a transposing copy, one launch per convolution and call (conv_igemm ``_Call._filter``).  On an eager
step that is host-bound (~28 µs of Python a launch on the H200 host), ResNet-20 made 18 of them a forward, a tenth of
its launches.  A filter changes between forwards (the optimizer) but its copy does not have to be made by its own
convolution: this module keeps each filter's copy and, when one is asked for a second time, remakes ALL of them in
one launch (``krsc_many``).  In a training loop the forward's first convolution refreshes every kept copy and the
others find theirs ready: one launch a forward instead of one a convolution.

The rule that keeps a copy's values the filter's.  A copy is handed out without a refresh only on a token, one
token a refresh; the token says "remade in this pass, not yet handed out":
- A refresh is made by the copy asked for (its convolution; it takes its own copy at once).  It gives tokens to the
  copies handed out AFTER the asker's previous hand-out: in a training loop the forward's first convolution asks
  again, and the others of the previous forward get theirs.  Copies handed out before it, or not at all, get none:
  a pass that re-uses a convolution, or ends early, leaves no token behind for a later pass (a write into a raw
  array between passes, which bumps no version, is then met by a refresh).
- A token is used only while its owner still holds the same array at the same version (``state_of(owner)`` -> (array,
  version), given by the caller: nn passes the weight Tensor's ``.data`` and ``_version``); a copy whose version moved
  refreshes the group, the other token holders keeping theirs.
- A convolution asking again with nothing handed out since its own last copy (a layer re-used back to back, a
  recurrent convolution) gets None -- its own per-call copy, as before -- and nothing is refreshed.
- An owner is kept from its second call on (a weight made afresh every forward never gets a copy kept); it is the
  Tensor whose array the convolution reads (a parameter, or autocast's kept low-precision weight, whose refill bumps
  its version).
- Known limit: a write that bypasses the Tensor (into the raw ``.data`` array, through ``detach()`` or a view -- their
  versions are their own -- or by a CUDA-graph replay) is not seen by a token already given: between two
  convolutions of one forward, or for a layer that got a token in one pass and runs before any refresh in the next
  (one skipped in the rest of its pass).  Autograd's saved-tensor check and the twins share it (docs/fusion.md).
- Never while the stream captures a CUDA graph (the replay would not repeat the refresh that made a copy outside
  the graph): the caller then copies as before.  Groups are per thread, device, stream and element size; a new
  group sweeps the thread's others (dead owners, replaced arrays, empty groups).
- A copy not handed out in ``IDLE_LIMIT`` refreshes in a row (a model no longer run) leaves its group; its owner's
  death drops it at the group's next call.  ``clear()`` (``minidnn.cuda.empty_cache``) drops them all.

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
from . import workspace as _ws

KEEP = [os.environ.get("MINIDNN_CONV_KEEP_FILTERS", "1") != "0"]
IDLE_LIMIT = 4
MAX_GROUPS = 8          # per thread

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
    __slots__ = ("owner", "state_of", "key", "dst", "version", "token", "seq", "idle", "row")

    def __init__(self, owner, state_of, key, src, dst, version, died):
        self.owner = weakref.ref(owner, died)
        self.state_of, self.key, self.dst, self.version = state_of, key, dst, version
        self.token, self.seq, self.idle = False, 0, 0
        k, c = src.shape[:2]
        self.row = (src.data.ptr, dst.data.ptr, k, c, src.size // (k * c))

    def source_of(self, owner):
        """(owner's array, version) while that array is still the memory copied from, else (None, None)."""
        arr, version = self.state_of(owner)
        return (arr, version) if _key(arr) == self.key else (None, None)


class _Group:
    """The kept copies of one thread, device, stream and element size, refreshed by one launch."""
    __slots__ = ("entries", "seen", "table", "go", "stale_table", "died", "seq")

    def __init__(self):
        self.entries = {}           # key (address, shape, strides, dtype) -> _Kept
        self.seen = {}              # key -> weak reference to the owner met once (kept from its second call)
        self.table = self.go = None
        self.stale_table = True
        self.seq = 0                # hand-outs so far (each copy's ``seq``: its last)
        # an owner died: set by the weak references' callback (any thread; a list, so that the callback holds no
        # reference to the group and a cleared group is freed at once)
        self.died = [False]

    def hand(self, e):
        self.seq += 1
        e.token, e.seq, e.idle = False, self.seq, 0
        return e.dst

    def prune(self):
        self.died[0] = False
        self.seen = {k: r for k, r in self.seen.items() if r() is not None}
        for key, e in list(self.entries.items()):
            o = e.owner()
            if o is None or e.source_of(o)[0] is None:
                del self.entries[key]
                self.stale_table = True

    def refresh(self, cp, dev, itemsize, asking):
        """Every kept copy remade from its owner's current array, in one launch, and the tokens given (the module's
        rule); ``asking``, the copy asked for, then handed out."""
        version_moved = asking.token        # (else: handed out already, asked again)
        for key, e in list(self.entries.items()):
            o = e.owner()
            arr, version = (None, None) if o is None else e.source_of(o)
            if arr is None or (e.idle >= IDLE_LIMIT and e is not asking):
                del self.entries[key]
                self.stale_table = True
                continue
            e.version = version
            if not version_moved:
                e.token = e.seq > asking.seq
            e.idle += 1
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
        return self.hand(asking)


class _Local(threading.local):
    def __init__(self):
        self.groups = {}            # (device, stream, itemsize) -> _Group


_local = _Local()


def krsc(cp, w, owner, state_of, run, shape):
    """The KRSC copy (``shape``, w's dtype) of the contiguous filter ``w``, kept for ``owner`` (whose array w is:
    ``state_of(owner)`` -> (array, version)); ``run(w, dst)``: the prepared transpose that makes one copy.  None where
    nothing is kept (switched off, capturing, w not owner's array, an owner met for the first time, a re-use back
    to back): the caller copies as before."""
    if not KEEP[0] or w.itemsize not in _WORD or w.size >= 2 ** 31:
        return None
    stream = _ws.eager_stream(cp)
    if stream is None:
        return None
    arr, version = state_of(owner)
    if arr is not w:
        return None
    dev = w.data.device_id
    gkey = (dev, stream, w.itemsize)
    groups = _local.groups
    g = groups.get(gkey)
    if g is None:
        _sweep(groups)
        if len(groups) >= MAX_GROUPS:           # (the oldest made goes: a stream per iteration, say)
            del groups[next(iter(groups))]
        g = groups[gkey] = _Group()
    elif g.died[0]:
        g.prune()
    key = _key(w)
    e = g.entries.get(key)
    if e is not None and e.owner() is owner:
        if e.token and e.version == version:
            return g.hand(e)
        if not e.token and e.seq == g.seq:      # nothing handed out since its own last copy: a re-use
            return None
        return g.refresh(cp, dev, w.itemsize, e)
    seen = g.seen.get(key)
    if seen is None or seen() is not owner:     # met once: kept from its next call on
        g.seen[key] = weakref.ref(owner, _flagger(g.died))
        return None
    del g.seen[key]
    dst = cp.empty(shape, dtype=w.dtype)
    run(w, dst)
    e = g.entries[key] = _Kept(owner, state_of, key, w, dst, version, _flagger(g.died))
    g.stale_table = True
    return g.hand(e)


def _flagger(flag):
    return lambda _ref: flag.__setitem__(0, True)


def _sweep(groups):
    """The thread's groups pruned, the empty ones dropped (a stream no longer used, a model converted)."""
    for k, g in list(groups.items()):
        g.prune()
        if not g.entries and not g.seen:
            del groups[k]


def kept_count() -> int:
    """Copies kept by this thread (all groups)."""
    return sum(len(g.entries) for g in _local.groups.values())


def clear() -> None:
    """Drop this thread's kept copies (their memory goes back to the pool at once: nothing else refers to them)."""
    for g in _local.groups.values():
        g.entries.clear()
        g.seen.clear()
    _local.groups.clear()
