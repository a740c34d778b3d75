"""Page-locked (pinned) host buffers and asynchronous host-to-GPU copies, for the DataLoader's ``pin_memory``.

# host: a NumPy array;  pinned: a NumPy array whose memory is page-locked (cudaHostAlloc via CuPy's pool)

A copy from pageable memory makes the driver stage it through its own pinned buffer and blocks the
host; from pinned memory the DMA engine reads the array directly and the copy is queued on a stream
and returns at once.  ``copy_to_device_async`` queues the copy on a per-device copy stream, makes the
current stream wait for it (so every kernel queued afterwards sees the data), and keeps the pinned
source alive until the copy has finished (the pool could otherwise hand the memory to the next batch
while the DMA still reads it).
"""
from __future__ import annotations

import collections

import numpy as np

from .devices import cuda_is_available, device, device_guard, require_cupy

__all__ = ["pin_array", "is_pinned", "copy_to_device_async", "pinning_available"]

_copy_streams: dict = {}
_in_flight = collections.deque()       # (event, pinned source) of copies that may still be running


def pinning_available() -> bool:
    return cuda_is_available()


def pin_array(a: np.ndarray) -> np.ndarray:
    """A page-locked copy of host array ``a`` (same shape and dtype, C-contiguous)."""
    cp = require_cupy()
    a = np.ascontiguousarray(a)
    mem = cp.cuda.alloc_pinned_memory(max(a.nbytes, 1))
    out = np.frombuffer(mem, dtype=a.dtype, count=a.size).reshape(a.shape)
    out[...] = a
    return out


def is_pinned(a) -> bool:
    """Whether host array ``a``'s memory is page-locked (registered with CUDA)."""
    if not isinstance(a, np.ndarray) or not cuda_is_available():
        return False
    cp = require_cupy()
    try:
        attrs = cp.cuda.runtime.pointerGetAttributes(a.ctypes.data)
    except Exception:  # noqa: BLE001  (an unregistered pointer raises on some CUDA versions)
        return False
    return int(getattr(attrs, "type", 0)) == 1          # cudaMemoryTypeHost


def copy_to_device_async(a: np.ndarray, dev):
    """A CuPy array on ``dev`` filled from host array ``a`` by a copy queued on a copy stream (``a`` is
    pinned first when it is not).  Work queued later on the current stream waits for the copy."""
    cp = require_cupy()
    dev = device(dev)
    src = a if is_pinned(a) else pin_array(a)
    with device_guard(dev):
        stream = _copy_streams.get(dev)
        if stream is None:
            stream = _copy_streams[dev] = cp.cuda.Stream(non_blocking=True)
        out = cp.empty(src.shape, dtype=src.dtype)
        out.set(src, stream=stream)
        done = stream.record()
        cp.cuda.get_current_stream().wait_event(done)
    _in_flight.append((done, src))
    while _in_flight and _in_flight[0][0].done:
        _in_flight.popleft()
    return out
