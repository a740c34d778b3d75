"""``minidnn.compile(fn)``: torch.compile's name, its "reduce-overhead" idea — capture a whole step in a CUDA graph.

    step = minidnn.compile(train_step)      # train_step(x, y) does forward, loss, backward, optimizer.step
    for x, y in loader:
        loss = step(x, y)                   # warm-up calls run eagerly, then one capture, then replays

How it works: the first ``warmup`` calls for a new signature (shapes, dtypes, devices of the tensor arguments)
run eagerly on a side stream; the next call copies the arguments into static tensors and captures ``fn`` on them;
every later call with that signature copies its arguments into the static tensors and replays.  What ``fn``
returns is the captured step's output, overwritten by the next replay (read it before the next call, or copy it).
A bounded cache keeps one graph per signature (``max_graphs``; the oldest is dropped).

Arguments that come back in the same device buffers (a loop that refills fixed input tensors, or passes the same
batch again): when a signature's tensor arguments -- none requiring grad -- arrive at the same device addresses
on three calls in a row, ``fn`` is captured once more directly on them, and from then on a call whose arguments
sit at those addresses replays that graph with no copy (it reads them where they are, so what was written into
them in place is what it computes on).  A call at other addresses after that ends the in-place mode for the
signature: the copying graph is captured again (so that host state ``fn`` rebinds follows the graph that runs)
and used from then on.  The in-place graph has its own memory pool (activation memory of one more step).

Falls back to calling ``fn`` eagerly, with one warning that says why, when nothing can be captured: no GPU, no
CUDA tensor among the arguments, or a capture that failed (``minidnn.cuda.graphs.check(fn, *args)`` lists the
blockers with file and line).
"""
from __future__ import annotations

import collections
import functools
import warnings

from .backend.array_ops import copy_into as _copy_arrays
from .backend.array_ops import dense_copier as _dense_copier
from .backend.devices import device_of as _device_of
from .tensor import Tensor

__all__ = ["compile"]


def _one(a):
    if isinstance(a, Tensor):
        d = a.data
        return (d.shape, d.strides, d.dtype, _device_of(d), a.requires_grad)
    return ("V", repr(a))


def _signature(args, kwargs):
    """The graph cache's key: each tensor's shape, strides, dtype, device and requires_grad; other values by repr.
    (Built from the raw fields, not strings, by a module-level function mapped over the arguments: it is computed
    on every call, so it is host time on every replay.  The strides let a replay copy a dense argument without
    checking its layout again.)"""
    key = tuple(map(_one, args))
    return key + tuple((k, _one(v)) for k, v in sorted(kwargs.items())) if kwargs else key


class _Compiled:
    def __init__(self, fn, warmup, max_graphs, mode):
        self.fn = fn
        self.warmup = int(warmup)
        self.max_graphs = int(max_graphs)
        self.mode = mode
        self.graphs = collections.OrderedDict()     # signature -> _Entry
        self.calls = collections.Counter()
        self.eager_reason = None
        self._side = None
        functools.update_wrapper(self, fn)

    def _fallback(self, reason):
        if self.eager_reason is None:
            warnings.warn(f"minidnn.compile({getattr(self.fn, '__name__', 'fn')}): running eagerly: {reason}",
                          RuntimeWarning, stacklevel=3)
        self.eager_reason = reason

    def __call__(self, *args, **kwargs):
        if self.eager_reason is not None:
            return self.fn(*args, **kwargs)
        key = _signature(args, kwargs)
        entry = self.graphs.get(key)
        if entry is not None:       # the replay: host time on every step, so nothing else before it
            self.graphs.move_to_end(key)
            if entry.in_place:
                ptrs = _pointers(args, kwargs)
                direct = entry.direct
                if direct is not None:
                    if ptrs == direct[0]:
                        direct[1].replay()
                        return direct[2]
                    return self._recapture(entry, args, kwargs)     # other addresses: back to copying, for good
                if ptrs == entry.ptrs:
                    entry.repeats += 1
                    if entry.repeats >= 2:
                        return self._capture_in_place(entry, ptrs, args, kwargs)
                else:
                    entry.ptrs, entry.repeats = ptrs, 0
            _copy_args(entry.copies, args, kwargs)
            entry.graph.replay()
            return entry.out
        from . import cuda
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, Tensor)]
        if not cuda.is_available():
            self._fallback("no CUDA GPU (CUDA graphs need one); the function runs as written")
            return self.fn(*args, **kwargs)
        if not any(t.device.type == "cuda" for t in tensors):
            self._fallback("none of its tensor arguments is on a CUDA device")
            return self.fn(*args, **kwargs)
        self.calls[key] += 1
        if self.calls[key] <= self.warmup:
            if self._side is None:      # one side stream for every warm-up (scratch buffers are cached per stream)
                self._side = cuda.Stream()
            side = self._side
            side.wait_stream(cuda.current_stream())
            with cuda.stream(side):
                out = self.fn(*args, **kwargs)
            cuda.current_stream().wait_stream(side)
            return out
        s_args = [_static_copy(a) for a in args]
        s_kwargs = {k: _static_copy(v) for k, v in kwargs.items()}
        try:
            graph, out = self._capture(s_args, s_kwargs)
        except Exception as exc:          # a blocker inside fn: keep running eagerly, and say which
            return self._eager_after(exc, args, kwargs)
        self.graphs[key] = _Entry(graph, _copy_plan(args, s_args, kwargs, s_kwargs), out, args, kwargs, s_args,
                                  s_kwargs)
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        graph.replay()
        return out

    def _capture(self, args, kwargs):
        """(graph, output): ``fn`` captured on these arguments -- its Python runs once, nothing runs on the GPU
        until the graph is replayed."""
        from . import cuda
        graph = cuda.CUDAGraph()
        with cuda.graph(graph):
            out = self.fn(*args, **kwargs)
        return graph, out

    def _eager_after(self, exc, args, kwargs):
        self._fallback(f"capture failed ({type(exc).__name__}: {str(exc)[:300]}); run "
                       "minidnn.cuda.graphs.check(fn, *args) for the blockers with their file and line")
        return self.fn(*args, **kwargs)

    def _capture_in_place(self, entry, ptrs, args, kwargs):
        """Capture ``fn`` on the arguments themselves and run it (this call's step: one host run, one GPU run, as
        for the first capture).  If that capture fails, the copying graph is captured again (below)."""
        try:
            graph, out = self._capture(args, kwargs)
        except Exception:
            return self._recapture(entry, args, kwargs)
        entry.direct = (ptrs, graph, out)
        graph.replay()
        return out

    def _recapture(self, entry, args, kwargs):
        """End in-place mode for this signature: capture the copying graph again and run this call through it.
        Capturing ``fn`` re-runs its Python, which rebinds whatever host state it sets (a parameter's .grad after
        ``zero_grad()`` with ``set_to_none=True`` on an unfused optimizer, tensors it keeps on objects) to the
        memory of the graph being captured; after the in-place capture (or a failed one) that state points into
        the in-place graph, so replaying the old copying graph would leave it stale.  Recapturing rebinds it to
        the graph that will run from now on."""
        entry.in_place, entry.direct = False, None
        try:
            entry.graph, entry.out = self._capture(entry.s_args, entry.s_kwargs)
        except Exception as exc:
            return self._eager_after(exc, args, kwargs)
        _copy_args(entry.copies, args, kwargs)
        entry.graph.replay()
        return entry.out


class _Entry:
    """One signature's graphs: the copying one (static buffers) and, once the arguments have come back at the same
    addresses, the in-place one (``direct``: (addresses, graph, output))."""
    __slots__ = ("graph", "copies", "out", "in_place", "ptrs", "repeats", "direct", "s_args", "s_kwargs")

    def __init__(self, graph, copies, out, args, kwargs, s_args, s_kwargs):
        self.graph, self.copies, self.out, self.s_args, self.s_kwargs = graph, copies, out, s_args, s_kwargs
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, Tensor)]
        self.in_place = all(t.is_cuda and not t.requires_grad for t in tensors)
        self.ptrs = _pointers(args, kwargs) if self.in_place else None
        self.repeats, self.direct = 0, None


def _pointers(args, kwargs):
    """The device addresses of the tensor arguments (positional, then keyword in the key's order)."""
    ptrs = [a.data.data.ptr for a in args if isinstance(a, Tensor)]
    if kwargs:
        ptrs += [v.data.data.ptr for _, v in sorted(kwargs.items()) if isinstance(v, Tensor)]
    return tuple(ptrs)


def _static_copy(a):
    if isinstance(a, Tensor):
        t = a.detach().clone()
        if a.requires_grad:
            t.requires_grad_(True)
        return t
    return a


def _copy_plan(args, s_args, kwargs, s_kwargs):
    """What a replay copies: a tuple of (entries, copy) where entries are (position, keyword or None, static tensor)
    and ``copy(*src arrays)`` fills those statics.  The graph's key fixes each argument's shape, strides, dtype and
    device, so the dense CUDA ones are copied together with no per-call checks (``dense_copier``: one launch for
    up to four); anything else one by one through ``copy_into``.  No autograd: the static buffers are leaves of the
    captured step."""
    pairs = [(i, None, a, s) for i, (a, s) in enumerate(zip(args, s_args))]
    pairs += [(None, k, kwargs[k], s) for k, s in s_kwargs.items()]
    pairs = [(i, name, a, s) for i, name, a, s in pairs if isinstance(s, Tensor)]
    dense = [(i, name, s) for i, name, a, s in pairs if a.is_cuda and a.data.flags.c_contiguous]
    copy = _dense_copier([s.data for _, _, s in dense]) if dense else None
    plan = [(tuple(dense), copy)] if copy is not None else []
    grouped = {id(s) for _, _, s in dense} if copy is not None else set()
    plan += [(((i, name, s),), functools.partial(_copy_arrays, s.data)) for i, name, a, s in pairs
             if id(s) not in grouped]
    return tuple(plan)


def _copy_args(copies, args, kwargs):
    """Fill the static buffers from this call's arguments, as ``_copy_plan`` planned (a buffer passed back as its
    own argument is copied onto itself, a no-op, and keeps its version)."""
    for entries, copy in copies:
        srcs = []
        for i, name, static in entries:
            src = args[i] if name is None else kwargs[name]
            srcs.append(src.data)
            if src is not static:
                static._version += 1
        copy(*srcs)


def compile(fn=None, *, mode="reduce-overhead", warmup=3, max_graphs=8, fullgraph=False, dynamic=None,
            backend=None):
    """Wrap ``fn`` so that, on a GPU, it runs as a replayed CUDA graph (see the module docstring).  Usable as
    ``minidnn.compile(fn)`` or as a decorator ``@minidnn.compile`` / ``@minidnn.compile(warmup=2)``.  ``mode``,
    ``fullgraph``, ``dynamic`` and ``backend`` are accepted for torch.compile compatibility; only the
    reduce-overhead behaviour exists."""
    if fn is None:
        return lambda f: _Compiled(f, warmup, max_graphs, mode)
    if not callable(fn):
        raise TypeError(f"minidnn.compile: expected a callable, got {type(fn).__name__}")
    return _Compiled(fn, warmup, max_graphs, mode)
