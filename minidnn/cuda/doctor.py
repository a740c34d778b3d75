"""The capture doctor: ``minidnn.cuda.graphs.check(fn, *args)`` lists what stops ``fn`` from being captured in a
CUDA graph, each with the user's file:line and a fix.

It runs ``fn`` once, eagerly, in a checking mode that records instead of failing:
    host synchronisation   .item(), .numpy(), .tolist(), bool()/float()/int() of a tensor, printing a tensor
    Python randomness      random.* and numpy.random.* calls (not replayed: a graph repeats the first draw)
    data-dependent shapes  boolean-mask indexing (its output size is only known on the host)
    CPU tensors            tensors created on the CPU while the step's inputs are on a GPU
    library calls          GPU calls that refuse capture (the backend reports them: CuPy's own cuBLAS/cuRAND)
then tries a real capture (the step is run a second time only if the first found nothing).  Each blocker is
reported once per call site.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import random as _pyrandom
import sys

import numpy as np

__all__ = ["Blocker", "diagnose"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FIXES = {
    "host synchronisation": "keep values on the device inside the step (return the tensor and read it after "
                            "replay), or move the read out of the captured function",
    "Python randomness": "draw random numbers with minidnn (minidnn.rand/randn or a minidnn.Generator on the GPU), "
                         "or draw outside the step and pass the result in",
    "data-dependent shape": "use a fixed-shape form: minidnn.where(mask, x, 0) or multiply by the mask instead of "
                            "indexing with it",
    "CPU tensor": "create the tensor on the step's device (device=x.device) or once, outside the step",
    "library call": "use minidnn's own op (its GPU path is capturable) instead of calling the library directly",
    "capture failed": "see the message; the blockers above are the usual causes",
}


@dataclasses.dataclass(frozen=True)
class Blocker:
    kind: str
    where: str            # "file.py:123" of the user's code
    detail: str
    fix: str

    def __str__(self):
        return f"{self.where}: {self.kind}: {self.detail}\n    fix: {self.fix}"


def _user_site():
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE + os.sep) and "/numpy/" not in path and "/random.py" not in path \
                and not path.endswith("contextlib.py"):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


class _Recorder:
    def __init__(self):
        self.found = []
        self.seen = set()

    def add(self, kind, detail):
        site = _user_site()
        if (kind, site) in self.seen:
            return
        self.seen.add((kind, site))
        self.found.append(Blocker(kind, site, detail, _FIXES[kind]))


@contextlib.contextmanager
def _patched(obj, name, make):
    original = getattr(obj, name)
    setattr(obj, name, make(original))
    try:
        yield
    finally:
        setattr(obj, name, original)


def _instrument(stack, rec, cuda_inputs):
    from ..tensor import Tensor

    def sync(method):
        def make(original):
            def wrapper(self, *a, **k):
                if self.device.type == "cuda":
                    rec.add("host synchronisation", f"Tensor.{method}() reads a GPU value on the host")
                return original(self, *a, **k)
            return wrapper
        return make
    for method in ("item", "numpy", "tolist", "__bool__", "__float__", "__int__", "__index__", "__repr__"):
        stack.enter_context(_patched(Tensor, method, sync(method)))

    def getitem(original):
        def wrapper(self, key):
            keys = key if isinstance(key, tuple) else (key,)
            if self.device.type == "cuda" and any(isinstance(k, Tensor) and k.dtype == np.bool_ for k in keys):
                rec.add("data-dependent shape", "indexing with a boolean mask: the result's size depends on the data")
            return original(self, key)
        return wrapper
    stack.enter_context(_patched(Tensor, "__getitem__", getitem))

    if cuda_inputs:
        from .. import creation  # zeros/ones/full/arange/... and rand/randn/...

        def created(original):
            def wrapper(*a, **k):
                out = original(*a, **k)
                t = out if isinstance(out, Tensor) else a[0]
                if isinstance(t, Tensor) and t.device.type == "cpu":
                    rec.add("CPU tensor", f"a {tuple(t.shape)} tensor was created on the CPU inside the step")
                return out
            return wrapper
        stack.enter_context(_patched(creation, "_factory", created))
        stack.enter_context(_patched(creation, "_random", created))
        stack.enter_context(_patched(Tensor, "__init__", created))

    def rand(name):
        def make(original):
            def wrapper(*a, **k):
                rec.add("Python randomness", f"{name}() draws on the host")
                return original(*a, **k)
            return wrapper
        return make
    for name in ("random", "randint", "uniform", "choice", "shuffle", "gauss"):
        stack.enter_context(_patched(_pyrandom, name, rand(f"random.{name}")))
    for name in ("rand", "randn", "randint", "random", "choice", "shuffle", "permutation", "normal", "uniform"):
        stack.enter_context(_patched(np.random, name, rand(f"numpy.random.{name}")))


def diagnose(fn, args, kwargs, capture):
    """Run ``fn(*args, **kwargs)`` once in checking mode, then ``capture()`` (fn inside a CUDA-graph capture, given
    by minidnn.cuda.graphs.check); return the list of Blockers (empty: the step can be captured), printing a report."""
    from ..backend.cuda import graphs as backend_graphs
    from ..tensor import Tensor
    rec = _Recorder()
    cuda_inputs = any(isinstance(a, Tensor) and a.device.type == "cuda"
                      for a in list(args) + list(kwargs.values()))
    with contextlib.ExitStack() as stack:
        _instrument(stack, rec, cuda_inputs)
        stack.enter_context(backend_graphs.record_library_calls(lambda what: rec.add("library call", what)))
        fn(*args, **kwargs)
    if not rec.found and cuda_inputs:
        try:
            capture()
        except Exception as exc:
            rec.found.append(Blocker("capture failed", "<capture>", f"{type(exc).__name__}: {str(exc)[:300]}",
                                     _FIXES["capture failed"]))
    if rec.found:
        print(f"minidnn.cuda.graphs.check: {len(rec.found)} blocker(s) for capturing "
              f"{getattr(fn, '__name__', 'fn')}:\n" + "\n".join(str(b) for b in rec.found))
    else:
        print(f"minidnn.cuda.graphs.check: {getattr(fn, '__name__', 'fn')} can be captured")
    return rec.found
