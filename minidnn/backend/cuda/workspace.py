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

Known limit: a stream destroyed while its kernels still run and a new stream created at the same address would
share buffers with them (CUDA may reuse the handle); minidnn's streams live as long as their users hold them.
"""
from __future__ import annotations

import os
import threading

import numpy as np

__all__ = ["scratch", "scratch_flat", "pair", "clear", "cached_bytes", "ENABLED", "LIMIT_BYTES"]

ENABLED = [os.environ.get("MINIDNN_SCRATCH", "1") != "0"]
LIMIT_BYTES = [int(float(os.environ.get("MINIDNN_SCRATCH_MB", "256")) * 2 ** 20)]


class _Tables(threading.local):
    def __init__(self):
        self.table = {}
        self.nbytes = 0


_local = _Tables()


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


def clear():
    """Drop this thread's cached buffers (they go back to the memory pool once their last kernels are queued)."""
    _local.table.clear()
    _local.nbytes = 0


def cached_bytes():
    return _local.nbytes


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
