"""Streams and CUDA graphs with PyTorch's names and semantics.

    s = minidnn.cuda.Stream(); s.wait_stream(minidnn.cuda.current_stream())
    with minidnn.cuda.stream(s):
        for _ in range(3): step()          # warm-up: kernels compiled, algorithms chosen, buffers allocated
    minidnn.cuda.current_stream().wait_stream(s)
    g = minidnn.cuda.CUDAGraph()
    with minidnn.cuda.graph(g): step()     # captured, not run
    g.replay()                             # runs the whole step with one host call

Allocations made while capturing come from a memory pool private to the graph (or shared through ``pool=``), kept
alive as long as the graph, so the addresses the graph has baked in stay valid; tensors created in the captured
step (the loss, say) are overwritten by every replay.  The CuPy side lives in minidnn/backend/cuda/graphs.py.
"""
from __future__ import annotations

import contextlib
import gc

from . import doctor as _doctor
from .doctor import Blocker  # noqa: F401  (minidnn.cuda.graphs.Blocker)

__all__ = ["Stream", "stream", "current_stream", "CUDAGraph", "graph", "graph_pool_handle",
           "make_graphed_callables", "is_current_stream_capturing", "check", "Blocker"]


def _g():
    from ..backend.cuda import graphs
    return graphs


class Stream:
    """A CUDA stream (PyTorch's torch.cuda.Stream): kernels launched inside ``minidnn.cuda.stream(s)`` go to it."""

    def __init__(self, device=None, priority=0, _wrapped=None):
        self._s = _wrapped if _wrapped is not None else _g().new_stream()

    def wait_stream(self, other: "Stream") -> None:
        """Work queued on this stream from now on waits for everything queued on ``other`` so far."""
        _g().wait_stream(self._s, other._s)

    def synchronize(self) -> None:
        _g().synchronize_stream(self._s)

    @property
    def cuda_stream(self) -> int:
        return int(self._s.ptr)

    def __eq__(self, other):
        return isinstance(other, Stream) and other.cuda_stream == self.cuda_stream

    def __hash__(self):
        return hash(self.cuda_stream)

    def __repr__(self):
        return f"<minidnn.cuda.Stream cuda_stream={self.cuda_stream:#x}>"


def current_stream(device=None) -> Stream:
    """The stream kernels are launched on now."""
    return Stream(_wrapped=_g().current_stream())


class stream(contextlib.ContextDecorator):
    """Context (PyTorch's torch.cuda.stream): launch on ``s`` inside; ``None`` changes nothing."""

    def __init__(self, s):
        self.s = s
        self._ctx = None

    def __enter__(self):
        if self.s is not None:
            self._ctx = _g().use_stream(self.s._s)
            self._ctx.__enter__()
        return self.s

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
            self._ctx = None
        return False


def is_current_stream_capturing() -> bool:
    from ..backend import devices as _dev
    return _dev.cuda_is_available() and _g().is_capturing()


class _PoolHandle:
    """An opaque memory-pool handle (graph_pool_handle / CUDAGraph.pool): pass it to share a pool between graphs."""

    def __init__(self, pool):
        self.pool = pool


def graph_pool_handle() -> _PoolHandle:
    return _PoolHandle(_g().new_pool())


class CUDAGraph:
    """A captured sequence of GPU work (PyTorch's torch.cuda.CUDAGraph): capture with ``minidnn.cuda.graph(g)``,
    run with ``replay()``; ``reset()`` frees the graph and its private memory."""

    def __init__(self):
        self._graph = None
        self._pool = None
        self._capture = None
        self._stream = None

    def capture_begin(self, pool=None, stream=None):
        if self._graph is not None or self._capture is not None:
            raise RuntimeError("CUDAGraph: this graph already holds a capture; call reset() before capturing again")
        self._pool = pool.pool if isinstance(pool, _PoolHandle) else _g().new_pool()
        self._stream = stream if stream is not None else Stream()
        self._result = {}
        self._capture = _g().capture(self._stream._s, self._pool, self._result)
        self._capture.__enter__()

    def capture_end(self):
        if self._capture is None:
            raise RuntimeError("CUDAGraph.capture_end: no capture in progress")
        capture, self._capture = self._capture, None
        capture.__exit__(None, None, None)
        self._graph = self._result["graph"]

    def _abort(self, exc):
        capture, self._capture = self._capture, None
        if capture is not None:
            try:
                capture.__exit__(type(exc), exc, exc.__traceback__)
            except Exception:       # the capture was already invalidated by the failure being reported
                pass
        self._graph = None

    def replay(self):
        """Run the captured work on the current stream."""
        if self._graph is None:
            raise RuntimeError("CUDAGraph.replay: nothing has been captured (use `with minidnn.cuda.graph(g):`)")
        _g().launch_graph(self._graph)

    def reset(self):
        self._graph = None
        self._pool = None
        self._stream = None

    def pool(self) -> _PoolHandle:
        if self._pool is None:
            raise RuntimeError("CUDAGraph.pool: the graph has no memory pool yet (capture first)")
        return _PoolHandle(self._pool)


class graph:
    """Context that captures into ``cuda_graph`` (PyTorch's torch.cuda.graph).  ``pool``: a graph_pool_handle()
    or another graph's pool() to share memory; ``stream``: the side stream to capture on (a new one by default)."""

    def __init__(self, cuda_graph: CUDAGraph, pool=None, stream=None, capture_error_mode="global"):
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.stream = stream

    def __enter__(self):
        _g().synchronize_device()
        gc.collect()        # free what earlier steps left behind, before the graph's memory is laid out
        self.cuda_graph.capture_begin(pool=self.pool, stream=self.stream)
        return self.cuda_graph

    def __exit__(self, exc_type, exc, tb):
        if exc is not None:
            self.cuda_graph._abort(exc)
            return False
        self.cuda_graph.capture_end()
        return False


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None):
    """PyTorch's make_graphed_callables for the forward pass: each callable (a Module or a function) is warmed up
    on ``sample_args``, captured, and returned as a callable that copies its arguments into the captured static
    inputs and replays.  Only the forward pass is captured (under no_grad): these graphed callables serve
    inference; a training step (forward, backward and optimizer) is captured whole with ``minidnn.cuda.graph`` or
    ``minidnn.compile``.  Not yet PyTorch's: graphed backward passes."""
    from ..autograd import no_grad
    single = not isinstance(callables, tuple)
    fns = (callables,) if single else callables
    args_list = (sample_args,) if single else sample_args
    out = []
    for fn, args in zip(fns, args_list):
        args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        static_in = [a.detach().clone() for a in args]
        side = Stream()
        side.wait_stream(current_stream())
        with stream(side), no_grad():
            for _ in range(num_warmup_iters):
                fn(*static_in)
        current_stream().wait_stream(side)
        g = CUDAGraph()
        with no_grad(), graph(g, pool=pool):
            static_out = fn(*static_in)

        def replayed(*new_args, _g=g, _in=static_in, _out=static_out):
            with no_grad():
                for dst, src in zip(_in, new_args):
                    dst.copy_(src)
            _g.replay()
            return _out
        out.append(replayed)
    return out[0] if single else tuple(out)


def check(fn, *args, **kwargs):
    """The capture doctor: run ``fn(*args, **kwargs)`` once in checking mode, then try to capture it in a
    CUDAGraph; return the list of Blockers (each with the user's file:line and a fix; empty: the step can be
    captured), printing a report (minidnn/cuda/doctor.py)."""
    def capture():
        with graph(CUDAGraph()):
            fn(*args, **kwargs)
    return _doctor.diagnose(fn, args, kwargs, capture)
