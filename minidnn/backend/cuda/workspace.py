"""Scratch buffers kept between calls, and two outputs from one allocation (docs/host_overhead.md round 9).

    t = scratch(cp, dev, ("bn.partial",), (n,), np.float32)   # a buffer no one reads after this call's launches
    p = scratch_flat(cp, dev, "bn.partial", n, np.float32)     # at least n elements, for a kernel's pointer only
    a, b = pair(cp, (c,), np.float32)                         # two separate outputs, one pool allocation

Each ``cupy.empty`` costs ~2-3 µs of host time on the GPU machine (the memory pool's lookup and lock, the array
object); an eager ResNet-20 step made 399 of them, 174 for buffers that only the call's own kernels read (batch
norm's partial sums and coefficients, the split-K partials, the staging and filter copies of the implicit GEMM).

Why reuse is safe: a scratch buffer is written and read only by the kernels of the call that took it, all launched
on the current stream; the next call that takes the same buffer launches on the same stream after them, so the
stream runs its kernels after every earlier reader of the buffer has finished.  Hence the key: (device, stream
pointer, the caller's tag, shape, dtype), in a table per thread (two threads sharing a stream could otherwise
interleave one call's copy and its reader with another call's copy into the same buffer).  Rules kept by the
callers: a scratch buffer is never returned to anyone who keeps it; its contents at the start of a call are
undefined (only buffers the kernels fully write before reading them, or reset themselves, are taken this way).

While the stream is capturing a CUDA graph a fresh array is returned (from the graph's pool, whose memory the graph
keeps with its baked-in addresses), and nothing is cached.  The legacy default stream (pointer 0) cannot capture,
so its calls skip the query.  A table holds at most MINIDNN_SCRATCH_MB (default 256) MiB per thread; past that,
new keys get fresh arrays.  MINIDNN_SCRATCH=0 turns the cache off (every call allocates: for comparison).

Outputs kept for reuse (``fresh``, session 14).  An output -- a layer's y, a gradient dx, a batch norm's mean --
is handed to the caller, who keeps it; it cannot be a scratch buffer.  But in a training loop the same call site
asks for the same shape every step, and by then the array it gave out a step ago is usually dead: the step's
graph was freed after backward.  ``fresh`` keeps the arrays it made per (device, stream, tag, shape, dtype,
strides) -- their pool memory objects, not the arrays -- and where nothing but the table refers to one any more
(its reference count, measured against an object only a list holds: every array and view on it holds it, so no
tensor, graph node or DLPack capsule uses it), builds the new array object on that memory instead of asking the
pool (``cupy.empty``: ~4-6 µs of host time on the H200 host, 175 a ResNet-20 step).  The arrays handed out are
new objects, so reference-count rules about arrays (autograd's leaf-gradient steal, gradient destinations,
autocast's busy copies) see no extra holder.  Same stream-ordered safety as the
pool's own reuse: the array is reused on the stream its last user queued on, after that work.  While a stream
captures, a fresh pool array is returned and nothing is kept.  The table holds at most MINIDNN_RECYCLE_MB
(default 1024) MiB of arrays per thread (in use or idle; past it, new arrays are not kept) and at most
``RECYCLE_SLOTS`` per key; ``minidnn.cuda.empty_cache()`` drops them (``idle_bytes``: what the idle ones hold).
MINIDNN_RECYCLE=0 turns it off (every output from the pool, as before).

Known limit: a stream destroyed while its kernels still run and a new stream created at the same address would
share buffers with them (CUDA may reuse the handle); minidnn's streams live as long as their users hold them.
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

__all__ = ["scratch", "scratch_flat", "pair", "fresh", "fresh_pair", "empty_strided", "clear", "cached_bytes",
           "idle_bytes", "ENABLED", "LIMIT_BYTES", "RECYCLE", "RECYCLE_LIMIT_BYTES"]

ENABLED = [os.environ.get("MINIDNN_SCRATCH", "1") != "0"]
LIMIT_BYTES = [int(float(os.environ.get("MINIDNN_SCRATCH_MB", "256")) * 2 ** 20)]


RECYCLE = [os.environ.get("MINIDNN_RECYCLE", "1") != "0"]
RECYCLE_LIMIT_BYTES = [int(float(os.environ.get("MINIDNN_RECYCLE_MB", "1024")) * 2 ** 20)]
RECYCLE_SLOTS = 64      # arrays kept per key: a model's layers of one shape, all alive until backward


class _Tables(threading.local):
    def __init__(self):
        self.table = {}
        self.nbytes = 0
        self.kept = {}          # fresh's: key -> [array or (array, array), ...]
        self.kept_nbytes = 0


_local = _Tables()


def eager_stream(cp):
    """The current stream's pointer, or None while it captures a CUDA graph (the legacy default stream, pointer 0,
    cannot): the test of every eager-only path (the kept filter copies, the channels-last dx, the twins' shadows)."""
    stream = cp.cuda.get_current_stream().ptr
    return None if stream and cp.cuda.runtime.streamIsCapturing(stream) else stream


def scratch(cp, dev, tag, shape, dtype):
    """An uninitialised array of ``shape`` / ``dtype`` for the kernels of one call on the current stream of GPU
    ``dev`` (the caller's current device): the one the previous call with the same ``tag`` got on this stream and
    thread, or a fresh one (the first time, while capturing, with the cache full or off)."""
    stream = cp.cuda.get_current_stream().ptr
    if stream and cp.cuda.runtime.streamIsCapturing(stream):
        return cp.empty(shape, dtype=dtype)
    key = (dev, stream, tag, shape, dtype)
    loc = _local
    a = loc.table.get(key)
    if a is None:
        a = cp.empty(shape, dtype=dtype)
        if ENABLED[0] and loc.nbytes + a.nbytes <= LIMIT_BYTES[0]:
            loc.table[key] = a
            loc.nbytes += a.nbytes
    return a


def scratch_flat(cp, dev, tag, n, dtype):
    """As ``scratch``, a 1-D buffer of AT LEAST ``n`` elements, for kernels that take only its address (partial sums,
    split-K partials): one buffer per tag, grown to the largest size asked (an outgrown one goes back to the pool:
    the stream orders its next user after its last reader), so the layers of a model share it."""
    stream = cp.cuda.get_current_stream().ptr
    if stream and cp.cuda.runtime.streamIsCapturing(stream):
        return cp.empty((n,), dtype=dtype)
    key = (dev, stream, tag, dtype)
    loc = _local
    a = loc.table.get(key)
    if a is None or a.size < n:
        if a is not None:
            del loc.table[key]
            loc.nbytes -= a.nbytes
        a = cp.empty((n,), dtype=dtype)
        if ENABLED[0] and loc.nbytes + a.nbytes <= LIMIT_BYTES[0]:
            loc.table[key] = a
            loc.nbytes += a.nbytes
    return a


_ALIGN = 256


def _pair_offset(shape, dtype):
    n = 1
    for s in shape:
        n *= s
    return -(-n * np.dtype(dtype).itemsize // _ALIGN) * _ALIGN


def pair(cp, shape, dtype):
    """Two uninitialised C-contiguous arrays of ``shape`` / ``dtype`` carved out of ONE allocation: each is built on
    its own memory pointer (``cupy.ndarray(..., memptr=)``), not as a view, so each behaves as a separate array --
    ``base`` None, owns its data as far as anyone can tell, no overlap (the second starts 256 bytes aligned) -- and
    the pool block goes back when both are gone.  One pool allocation instead of two (~2-3 µs of host time)."""
    dtype = np.dtype(dtype)
    n = 1
    for s in shape:
        n *= s
    nb = n * dtype.itemsize
    off = -(-nb // _ALIGN) * _ALIGN
    if not off:
        return cp.empty(shape, dtype=dtype), cp.empty(shape, dtype=dtype)
    block = cp.empty((off + nb,), dtype=np.uint8)
    mem = block.data
    return cp.ndarray(shape, dtype, memptr=mem), cp.ndarray(shape, dtype, memptr=mem + off)


_refs = sys.getrefcount


def _unheld(slot, free):
    """The first entry of ``slot`` nothing outside the table refers to (reference count ``free``), or None."""
    for a in slot:
        if _refs(a) == free:
            return a
    return None


def _count_in_loop(slot):
    for a in slot:
        return _refs(a)


# The count an entry shows inside _unheld's loop when only its list holds it (the list, the loop variable, the
# call's argument -- however this interpreter counts them): measured, not assumed.
_FREE = _count_in_loop([object()])


def _keep(loc, key, slot, mem):
    if slot is None:
        slot = loc.kept[key] = []
    nbytes = mem.size
    if len(slot) < RECYCLE_SLOTS and loc.kept_nbytes + nbytes <= RECYCLE_LIMIT_BYTES[0]:
        slot.append(mem)
        loc.kept_nbytes += nbytes


def empty_strided(cp, spec, dtype):
    """A fresh array of ``bn_nhwc.strided_spec``'s (shape, strides, bytes), made in one step (round 22b): one CuPy
    object on a pool block, where ``cp.empty(mem).transpose(back)`` made two (its base) and a transpose.  Same
    memory order, alignment (a pool block) and allocator (the current one, as ``cp.empty``'s, CUDA graph capture
    included)."""
    shape, strides, nbytes = spec
    return cp.ndarray(shape, dtype, cp.cuda.alloc(nbytes), strides)


def _new(cp, shape, dtype, spec):
    try:
        return cp.empty(shape, dtype=dtype) if spec is None else empty_strided(cp, spec, dtype)
    except Exception as e:      # the pool is out of memory: what fresh keeps idle goes back to it, and once more
        if type(e).__name__ != "OutOfMemoryError" or not drop_idle():
            raise
    return cp.empty(shape, dtype=dtype) if spec is None else empty_strided(cp, spec, dtype)


def _kept(cp, dev, tag, shape, dtype, spec):
    """fresh_pair's lookup, fresh's written out: (this site's kept memory that nothing holds, or None; where new
    memory is kept: (thread's tables, key, list or None), or None while the stream captures)."""
    stream = cp.cuda.get_current_stream().ptr
    if stream and cp.cuda.runtime.streamIsCapturing(stream):
        return None, None
    loc = _local
    key = (dev, stream, tag, shape, dtype, spec)
    slot = loc.kept.get(key)
    return (None if slot is None else _unheld(slot, _FREE)), (loc, key, slot)


def fresh(cp, dev, tag, shape, dtype, spec=None):
    """An uninitialised C-contiguous array of ``shape`` / ``dtype`` (or, with ``spec``, a ``bn_nhwc.strided_spec``
    (shape, strides, bytes): as ``empty_strided``) on GPU ``dev`` (the current device) that the caller may
    hand out and keep: a new array object on the pool memory this call site had before where nothing refers to
    that memory any more, else a new pool array (see the module docstring).  One frame: the lookup, the
    reference-count test (the same loop form as ``_count_in_loop``'s, so ``_FREE`` holds) and the new array are
    written out here (~150 calls a ResNet-20 step; round 27)."""
    if RECYCLE[0]:
        cuda = cp.cuda
        stream = cuda.get_current_stream().ptr
        if not stream or not cuda.runtime.streamIsCapturing(stream):
            loc = _local
            key = (dev, stream, tag, shape, dtype, spec)
            slot = loc.kept.get(key)
            if slot is not None:
                for mem in slot:
                    if _refs(mem) == _FREE:
                        if spec is None:
                            return cp.ndarray(shape, dtype, cuda.MemoryPointer(mem, 0))
                        return cp.ndarray(spec[0], dtype, cuda.MemoryPointer(mem, 0), spec[1])
            a = _new(cp, shape, dtype, spec)
            _keep(loc, key, slot, a.data.mem)
            return a
    return _new(cp, shape, dtype, spec)


def fresh_pair(cp, dev, tag, shape, dtype):
    """As ``pair``, two arrays the caller may keep, on the memory of a pair this call site had before where
    nothing refers to it any more (``fresh``)."""
    if not RECYCLE[0]:
        return pair(cp, shape, dtype)
    mem, place = _kept(cp, dev, tag, shape, dtype, "pair")
    if mem is not None:
        ptr = cp.cuda.MemoryPointer
        return (cp.ndarray(shape, dtype, ptr(mem, 0)),
                cp.ndarray(shape, dtype, ptr(mem, _pair_offset(shape, dtype))))
    a, b = pair(cp, shape, dtype)
    if place is not None and a.nbytes:      # (an empty pair is two allocations: not kept)
        _keep(*place, a.data.mem)
    return a, b


def clear():
    """Drop this thread's cached buffers and kept outputs' memory (back to the memory pool once their last kernels
    are queued and, for an output, once its last holder lets go)."""
    _local.table.clear()
    _local.nbytes = 0
    _local.kept.clear()
    _local.kept_nbytes = 0


def cached_bytes():
    return _local.nbytes


def drop_idle():
    """Let go of this thread's kept memory that nothing holds (the pool then frees it); the bytes dropped."""
    loc, n = _local, 0
    for slot in loc.kept.values():
        while (mem := _unheld(slot, _FREE)) is not None:
            slot[:] = [m for m in slot if m is not mem]       # (by identity: memory objects, not values)
            n += mem.size
    loc.kept_nbytes -= n
    return n


def idle_bytes(dev=None):
    """Bytes of this thread's kept pool memory (on GPU ``dev``, or all) that nothing outside the table holds: the
    pool counts it as used."""
    n = 0
    for key, slot in _local.kept.items():
        if dev is None or key[0] == dev:
            for mem in slot:
                if _refs(mem) == _FREE:         # (the same form as _unheld's loop: the same count)
                    n += mem.size
    return n

ticket_arrays: dict = {}       # device id -> the split-K ticket counters (uint32, kept zeroed by the kernels)
_retired: list = []            # outgrown kept-zeroed arrays, kept alive: a captured graph may still point at one


def kept_zeroed(table, cp, n, dev, minimum, dtype=np.uint32):
    """At least ``n`` elements of ``table``'s zeroed array on GPU ``dev`` (made once, at least ``minimum`` long).
    The idiom of the kernels' ticket counters and the atomic filter gradient's accumulator: one array per device
    and table, reused by every plan, which every launch leaves zeroed again, so it is zeroed only when made;
    launches on one stream take it in turn, and two such launches on two streams of one device must not overlap.
    An outgrown array is kept alive (a plan or a captured graph may still point at it)."""
    t = table.get(dev)
    if t is None or t.size < n:
        if t is not None:
            _retired.append(t)
        t = table[dev] = cp.zeros(max(n, minimum), dtype=dtype)
    return t


def split_tickets(cp, n, dev):
    """At least ``n`` zeroed split-K ticket counters on GPU ``dev``, shared by the implicit-GEMM and the NHWC
    depthwise filter gradients (``kept_zeroed``)."""
    return kept_zeroed(ticket_arrays, cp, n, dev, 4096)
