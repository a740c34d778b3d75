"""Round 27's host-path changes (docs/host_overhead.md), switchable in one process for an A/B: ``NEW`` is a
one-element list like the project's switches; setting ``NEW[0] = False`` puts the session-15 forms back in place
(the prepared launch's list comprehension and ``with`` lock, ``workspace.fresh`` through _kept / _unheld / _on, a
leaf's accumulation in two frames, FunctionCtx.backward rebuilding its gradient tuple, ``Tensor._from_array``
calling ``_wrap``), ``True`` the current ones.  The same launches either way (only host Python differs), so the
step A/B is fair.  The engine loop's ``enumerate`` (measured neutral) is not switched.

    SW=tools.host27_paths:NEW PYTHONPATH=. python3 tools/step_sw_ab.py --models resnet20,mobilenet,lenet5
    MODE=sw_ab SW=tools.host27_paths:NEW python tools/fake_gpu_step.py . resnet20 2      # the same on the fake
    PYTHONPATH=. python3 tools/host27_paths.py      # per call on a GPU: a prepared launch and fresh, old vs new
"""
from __future__ import annotations

import importlib
import sys

import numpy as np

from minidnn import autograd as _ag
from minidnn.backend.cuda import launch as _L
from minidnn.backend.cuda import workspace as _W

_tensor = importlib.import_module("minidnn.tensor")     # (the module: minidnn.tensor is the constructor)

# -- the session-15 forms (commit 8e6ad26), kept only to be timed against ----------------------------------------


def _old_prepared_call(self, *arrays, stream=None):
    offsets = self.slots
    if len(arrays) != len(offsets):
        raise TypeError(f"prepared launch: {len(offsets)} arrays expected, got {len(arrays)}")
    dev = _L._cp.cuda.runtime.getDevice()
    last, fn = self.fn
    if last != dev:
        fn = _L._function(self.kernel, self.shared_mem, dev)
        self.fn = (dev, fn)
    ptrs = [0 if a is None else a.data.ptr for a in arrays]
    data = self.buf.data
    with self.buf.lock:
        if self.pack_ptrs is not None:
            self.pack_ptrs(data, 0, *ptrs)
        else:
            for off, p in zip(offsets, ptrs):
                _L._PTR.pack_into(data, off, p)
        _L._go(fn, self.dims, stream, self.buf.params_ptr)


def _old_on(cp, mem, offset, shape, dtype, spec):
    if spec is None:
        return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, offset))
    return cp.ndarray(spec[0], dtype, cp.cuda.MemoryPointer(mem, offset), spec[1])


def _old_fresh(cp, dev, tag, shape, dtype, spec=None):
    if not _W.RECYCLE[0]:
        return _W._new(cp, shape, dtype, spec)
    mem, place = _W._kept(cp, dev, tag, shape, dtype, spec)
    if mem is not None:
        return _old_on(cp, mem, 0, shape, dtype, spec)
    a = _W._new(cp, shape, dtype, spec)
    if place is not None:
        _W._keep(*place, a.data.mem)
    return a


def _old_ctx_backward(self, *grads):
    if self._materialize:
        for g in grads:
            if g is None:
                grads = tuple([g if g is not None else _ag._zeros_like_meta(meta)
                               for g, meta in zip(grads, self._out_meta)])
                break
    result = self._fn_cls.backward(self, *grads)
    if not isinstance(result, tuple):
        result = (result,)
    if len(result) != self._n_inputs:
        if len(result) > self._n_inputs and all(r is None for r in result[self._n_inputs:]):
            result = result[:self._n_inputs]
        else:
            raise RuntimeError(f"{self._fn_cls.__name__}.backward returned {len(result)} gradients but forward "
                               f"took {self._n_inputs} arguments: return one per argument (None for non-tensors)")
    out = []
    Tensor = _tensor.Tensor
    for i, (r, meta) in enumerate(zip(result, self._input_meta)):
        if r is None or meta is None:
            out.append(None)
            continue
        if not isinstance(r, Tensor):
            r = Tensor._from_array(np.asarray(r) if not hasattr(r, "shape") else r)
        if r.data.shape != meta[0]:
            try:
                r = r.sum_to(meta[0])
            except Exception:
                raise RuntimeError(f"{self._fn_cls.__name__}.backward returned a gradient of shape "
                                   f"{tuple(r.shape)} for argument {i}, whose shape is {meta[0]}") from None
        out.append(r)
    return tuple(out)


def _old_from_array(data, requires_grad=False):
    t = _tensor._wrap(data)
    t.requires_grad = requires_grad
    return t


_NEW_FORMS = {"call": _L.Prepared.__call__, "fresh": _W.fresh, "acc": _ag.AccumulateGrad.accumulate,
              "ctx": _ag.FunctionCtx.backward, "from": _tensor.Tensor.__dict__["_from_array"]}


def _old_accumulate(self, g, create_graph, fresh):      # the old second frame around the same body
    return _NEW_FORMS["acc"](self, g, create_graph, fresh)


def _use(new: bool):
    _L.Prepared.__call__ = _NEW_FORMS["call"] if new else _old_prepared_call
    _W.fresh = _NEW_FORMS["fresh"] if new else _old_fresh
    _ag.AccumulateGrad.accumulate = _NEW_FORMS["acc"] if new else _old_accumulate
    _ag.FunctionCtx.backward = _NEW_FORMS["ctx"] if new else _old_ctx_backward
    _tensor.Tensor._from_array = _NEW_FORMS["from"] if new else staticmethod(_old_from_array)


class _Switch(list):
    """A one-element list whose item assignment swaps the forms (tools/step_sw_ab.py sets ``s[0] = on``)."""

    def __setitem__(self, i, on):
        super().__setitem__(i, bool(on))
        _use(bool(on))


NEW = _Switch([True])


def _per_call():
    """µs a call on this GPU host, old vs new, alternated rounds (min): a prepared launch of a 1-block kernel with 2,
    6 and 13 array slots (None in some, as the steps pass), and ``fresh`` handing back kept memory."""
    import time
    cp = _L.cupy()
    src = ("extern \"C\" __global__ void k13(float* a0, float* a1, float* a2, float* a3, float* a4, float* a5, "
           "float* a6, float* a7, float* a8, float* a9, float* a10, float* a11, float* a12, const int n) "
           "{ if (threadIdx.x == 0 && a0) a0[0] = (float)n; }")
    kern = _L.get_kernel(src, "k13")
    x = cp.zeros(16, np.float32)
    cases = {n: (_L.prepare(kern, (1,), (32,), [None] * 13 + [np.int32(n)]),
                 [x if i % 3 != 2 else None for i in range(n)] + [None] * (13 - n)) for n in (2, 6, 13)}
    best: dict = {}
    for _ in range(9):
        for new in (False, True):
            NEW[0] = new
            for n, (prep, arrays) in cases.items():
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                for _ in range(500):
                    prep(*arrays)
                cp.cuda.Device().synchronize()
                key = (f"prepared launch, {n} arrays", new)
                best[key] = min(best.get(key, 1e9), (time.perf_counter() - t0) / 500 * 1e6)
            dev = cp.cuda.runtime.getDevice()
            t0 = time.perf_counter()
            for _ in range(5000):
                _W.fresh(cp, dev, "host27", (128, 16, 32, 32), np.float32)
            key = ("fresh (kept memory back)", new)
            best[key] = min(best.get(key, 1e9), (time.perf_counter() - t0) / 5000 * 1e6)
    NEW[0] = True
    for name in dict.fromkeys(k for k, _ in best):
        old, new = best[(name, False)], best[(name, True)]
        print(f"{name:34s} old {old:6.2f} us  new {new:6.2f} us  new - old {new - old:+.2f} us")


if __name__ == "__main__":
    sys.exit(_per_call())
