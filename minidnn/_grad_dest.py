"""Gradient destinations: where a Function's first-order backward may write an input's gradient in place.

Two copies of a training step that the engine would otherwise make (docs/host_overhead.md, round 15):
- a tensor used twice (a residual block's input: its convolution and the shortcut) gets two gradients, and the
  engine adds them (``_add_grads``: one more kernel and a fresh array);
- a weight's gradient lands in the fused optimizer's flat buffer (``Tensor._grad_storage``) by a copy
  (``AccumulateGrad``).

A Function whose kernels can blend (cuDNN's ``beta``) asks, in its backward, ``destination(ctx, i)`` for input i:

    None                      compute the gradient as usual;
    (array, 1.0, pending)     a gradient of input i is already pending in the engine and only the engine holds it:
                              write ``array + new`` into ``array`` (beta = 1) and return ``pending`` itself -- the
                              engine sees its own buffer come back and adds nothing;
    (array, 0.0, None)        input i is a leaf with no ``.grad`` yet whose gradient lives in the optimizer's flat
                              buffer: write the gradient into ``array`` (beta = 0) and return it wrapped --
                              ``AccumulateGrad`` keeps it where it is.  (Not with hooks on the leaf or its node.)
                              Also through autocast's cast of a float32 leaf, for a float32 gradient (the filter
                              gradients' ``dw_dtype``): the cast node passes it through untouched.

Offered only while the engine runs a first-order backward into ``.grad`` (not ``autograd.grad``, not
``create_graph``); a pending gradient only where nothing but the engine's buffer refers to it or its array
(PyTorch's use_count rule, as the engine's own steal of a leaf's gradient) -- a view only of an array that nothing
else refers to --; a leaf only without tensor hooks.  ``destination(ctx, i, shape, dtype)`` offers only a
C-contiguous array of the shape and dtype the caller's kernels write; otherwise compute as usual.  The sum is the
same two values added once: bit for bit the engine's add for float32; for 16-bit data the kernel adds in float32
and rounds once, where the engine rounds each operand first.
"""
from __future__ import annotations

import os

import numpy as np

from . import _memory_format as _mf
from . import autograd as _ag

__all__ = ["destination"]

# Switch (tests and A/B runs): ENABLED[0] = False, or MINIDNN_GRAD_DEST=0 in the environment at import.
ENABLED = [os.environ.get("MINIDNN_GRAD_DEST", "1") != "0"]


def _sole_base_refs():
    """The refcount of a view's base that nothing but the view refers to, seen as ``destination`` sees it."""
    base = np.empty(2)
    view = base[:1]
    del base
    base = view.base
    return _ag._getrefcount(base)


_SOLE_BASE_REFS = _sole_base_refs()


def destination(ctx, i, shape=None, dtype=None, channels_last=False):
    """(array, beta, tensor to return) for input ``i`` of the node ``ctx`` whose backward is running, or None;
    with ``shape`` and ``dtype`` (what the caller's kernels write), only a C-contiguous array of them -- or, with
    ``channels_last``, a 4-D one in channels-last memory too (a channels-last weight's gradient slot)."""
    d = _destination(ctx, i)
    if d is None or shape is None:
        return d
    a = d[0]
    if a.shape != shape or a.dtype != dtype:
        return None
    if a.flags.c_contiguous or (channels_last and a.ndim == 4 and _mf.is_in(a, _mf.channels_last)):
        return d
    return None


def _destination(ctx, i):
    buffers = _ag._state.buffers
    if buffers is None or not ENABLED[0]:
        return None
    edge = ctx.next_edges[i]
    if edge is None:
        return None
    child, nr = edge
    buf = buffers.get(child)
    if buf is not None and buf[nr] is not None:
        g = buf[nr]     # held by the buffer, this local and the call's argument: the engine's sole-holder counts
        if _ag._getrefcount(g) > _ag._SOLE_TENSOR_REFS or _ag._getrefcount(g.data) > _ag._SOLE_ARRAY_REFS:
            return None
        data = g.data
        if g.requires_grad or not getattr(data.flags, "writeable", True):
            return None
        base = getattr(data, "base", None)      # a view: only of an array nothing else refers to (no other view)
        if base is not None and (_ag._getrefcount(base) > _SOLE_BASE_REFS or getattr(base, "base", None) is not None):
            return None
        return data, 1.0, g
    if getattr(child, "float32_grad_ok", False):
        # autocast's cast of a float32 leaf (amp.AutocastCast): its backward passes a float32 gradient through
        # untouched, so the leaf's slot is offered through it (for a float32 gradient: the caller checks the dtype)
        if child.pre_hooks or child.src_dtype != np.float32 or child.next_edges[0] is None:
            return None
        child, nr = child.next_edges[0]
        buf = buffers.get(child)
        if buf is not None and buf[nr] is not None:
            return None
    if type(child) is _ag.AccumulateGrad:
        var = child.variable
        storage = var._grad_storage
        if storage is not None and var.grad is None and not var._hooks and not child.pre_hooks:
            return storage, 0.0, None
    return None
