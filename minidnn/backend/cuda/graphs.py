"""Streams and CUDA graphs on CuPy, for ``minidnn.cuda``'s PyTorch-style API (only backend code touches CuPy).

Capture records every kernel launched on the capturing stream into a graph; replay relaunches them all with one
host call.  What makes a captured step safe to replay:
  * every kernel is compiled and every persistent buffer allocated before capture (the warm-up runs do that);
  * allocations made during capture come from a private memory pool that only this graph uses, and the pool is
    kept alive with the graph, so the addresses baked into it are never handed to anyone else;
  * nothing in the step synchronises with the host (CUDA refuses that during capture, and CuPy raises).
"""
from __future__ import annotations

import contextlib

from . import launch as _launch

__all__ = ["new_stream", "current_stream", "wait_stream", "use_stream", "new_pool", "capture", "launch_graph",
           "is_capturing", "synchronize_stream", "synchronize_device"]


def new_stream():
    return _launch.cupy().cuda.Stream(non_blocking=True)


def current_stream():
    return _launch.cupy().cuda.get_current_stream()


def wait_stream(waiter, other):
    """``waiter`` waits for the work queued on ``other`` so far (an event, no host wait)."""
    waiter.wait_event(other.record())


def use_stream(stream):
    """Context in which CuPy (and so every minidnn kernel) launches on ``stream``."""
    return stream


def synchronize_stream(stream):
    stream.synchronize()


def synchronize_device():
    """Wait for all work queued on the current GPU (every stream)."""
    _launch.cupy().cuda.Device().synchronize()


def new_pool():
    return _launch.cupy().cuda.MemoryPool()


def is_capturing(stream=None) -> bool:
    cp = _launch.cupy()
    s = current_stream() if stream is None else stream
    return bool(cp.cuda.runtime.streamIsCapturing(s.ptr))


@contextlib.contextmanager
def capture(stream, pool, result):
    """Capture what runs in the block on ``stream``, allocating from ``pool``; ``result["graph"]`` is set after."""
    cp = _launch.cupy()
    with stream, cp.cuda.using_allocator(pool.malloc):
        stream.begin_capture(mode=cp.cuda.runtime.streamCaptureModeRelaxed)
        try:
            yield
        finally:
            graph = stream.end_capture()
        result["graph"] = graph


def launch_graph(graph, stream=None):
    graph.launch(stream=current_stream() if stream is None else stream)


@contextlib.contextmanager
def record_library_calls(report):
    """While the block runs, GPU library calls that refuse stream capture are reported (``report(description)``)
    and then run as usual: CuPy's matmul/dot (its cuBLAS calls) and cuRAND's host-API generators (RandomState)."""
    try:
        cp = _launch.cupy()
    except Exception:          # no GPU: nothing to record
        yield
        return
    patches = []

    def patch(owner, name, what):
        original = getattr(owner, name)

        def wrapper(*a, **k):
            report(what)
            return original(*a, **k)
        setattr(owner, name, wrapper)
        patches.append((owner, name, original))
    patch(cp, "matmul", "cupy.matmul (CuPy's cuBLAS calls refuse capture); minidnn's matmul is capturable")
    patch(cp, "dot", "cupy.dot (CuPy's cuBLAS calls refuse capture)")
    for name in ("random_sample", "standard_normal", "randint"):
        patch(cp.random.RandomState, name, f"cuRAND host generator (RandomState.{name}): a random draw on the GPU "
                                           "(dropout, minidnn.rand/randn) cannot be captured yet")
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)
