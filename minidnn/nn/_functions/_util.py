"""What every functional family shares: the handle, argument normalisation, wrapping arrays,
and the guard that makes a first-order-only backward fail loudly under ``create_graph``."""
from __future__ import annotations

import functools
import operator
import os

from ... import backend as B
from ...autograd import ExactGrads, FunctionCtx, _state, is_grad_enabled
from ...backend.devices import array_module
from ...backend.devices import is_floating as _is_floating
from ...backend.errors import ArgumentError, DTypeError
from ...ops._core import first_order_grads  # noqa: F401  (re-exported: the nn families' guard)
from ...tensor import Tensor

__all__ = ["handle_for", "wrap", "descriptor", "ntuple", "check_tensor", "check_vector", "first_order_grads", "batched",
           "creating_graph", "composite_grads", "exact", "EXACT_GRADS"]

# Host round 31: the settled first-order backwards (batch norm's remembered forms, the convolution's settled pair)
# return their gradients as autograd.ExactGrads, which FunctionCtx.backward hands the engine without its per-result
# check (is each a Tensor of its input's shape?, ~80 opcodes a node, 40 nodes a ResNet-20 step).  They know it by
# construction: each array comes from a call settled for the node's own signature (x's and the weight's shapes held
# in its key) or is the engine's pending gradient of that input (_grad_dest checked the shape), wrapped as a Tensor.
# Switch: EXACT_GRADS[0] = False (or MINIDNN_EXACT_GRADS=0 at import): plain tuples, checked.
EXACT_GRADS = [os.environ.get("MINIDNN_EXACT_GRADS", "1") != "0"]


def exact(grads: tuple) -> tuple:
    """``grads`` marked as fitting their node's inputs (see EXACT_GRADS), where the switch is on."""
    return ExactGrads(grads) if EXACT_GRADS[0] else grads


def handle_for(x: Tensor):
    """The calling thread's default backend handle for x's device, with the global flags applied
    (``minidnn.backends.cudnn``: benchmark / deterministic / math type, like torch.backends.cudnn)."""
    return B.handle.configured_default_handle(x.data)


def plain_setting(v):
    """``v`` where it is an int or a tuple of ints, else None: the only settings a seen-call key takes (True, 1.0 or
    a list hash like the ints they equal, but the full checks treat them differently)."""
    if type(v) is int:
        return v
    if type(v) is tuple:
        for e in v:
            if type(e) is not int:
                return None
        return v
    return None


_PLAIN_TUPLES: dict = {}       # id -> a tuple that plain_setting passed (held: its id is not reused while it lives)
_ABSENT = object()


def plain_settings(stride, padding, dilation) -> bool:
    """Whether plain_setting passes all three (host round 31): a tuple that passed once passes again (a tuple cannot
    change), so a layer's own settings -- the same tuple objects at every call -- are found by identity, without the
    element loop; anything else is tested as plain_setting tests it."""
    seen = _PLAIN_TUPLES
    for v in (stride, padding, dilation):
        if type(v) is int or seen.get(id(v), _ABSENT) is v:
            continue
        if type(v) is not tuple or plain_setting(v) is None:
            return False
        if len(seen) >= 4096:
            seen.clear()
        seen[id(v)] = v
    return True


def wrap(array) -> Tensor:
    return None if array is None else Tensor._from_array(array)


@functools.lru_cache(maxsize=4096, typed=True)
def descriptor(cls, *args):
    """``cls(*args)``, built once per distinct argument list.  The backend's descriptors are immutable and validated
    when built, so a layer called at every step reuses one instead of validating the same settings again (host cost,
    docs/host_overhead.md), and the primitives' signature caches meet the same object.  ``args`` must be hashable:
    the callers pass the tuples ntuple made."""
    return cls(*args)


def ntuple(value, n: int, op: str, name: str) -> tuple:
    """An int or a sequence of ``n`` ints -> an ``n``-tuple of ints (PyTorch's _pair/_triple), or a clear error."""
    if type(value) is tuple and len(value) == n:     # already one (a layer's own settings): no conversion, no raise
        for v in value:
            if type(v) is not int:
                break
        else:
            return value
    try:
        v = operator.index(value)
        return (v,) * n
    except TypeError:
        pass
    try:
        out = tuple(operator.index(v) for v in value)
    except TypeError:
        raise DTypeError(f"{op}: {name}={value!r} must be an int or a tuple of {n} ints") from None
    if len(out) == 1:
        return out * n
    if len(out) != n:
        raise ArgumentError(f"{op}: {name}={value!r} must be an int or a tuple of {n} ints, got {len(out)} values")
    return out


def check_tensor(op: str, name: str, t, float_only=True):
    if not isinstance(t, Tensor):
        raise DTypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    if float_only and not _is_floating(t.data.dtype):
        raise DTypeError(f"{op}: {name} has dtype {t.dtype}, but a floating-point tensor is required")


def check_vector(op: str, name: str, t, n: int, x: Tensor, what: str = "channels", of: str = None,
                 same_dtype: bool = True):
    """An optional per-channel (or per-class) parameter: None, or a tensor of shape (n,) — and, with
    ``same_dtype``, of x's dtype.  ``of`` names what has the n channels (default: the input and its shape)."""
    if t is None:
        return
    check_tensor(op, name, t)
    if tuple(t.data.shape) != (n,):
        of = of or f"input {tuple(x.shape)}"
        raise ArgumentError(f"{op}: {name} has shape {tuple(t.shape)} but {of} has {n} {what} (expected ({n},))")
    if same_dtype and t.dtype != x.dtype:
        raise DTypeError(f"{op}: {name} has dtype {t.dtype} but input has dtype {x.dtype}; they must match")


def batched(op: str, x: Tensor, nd: int):
    """PyTorch accepts unbatched input, (C, *spatial); the primitives want (N, C, *spatial).
    Returns (x with a batch dim, whether to drop it from the result)."""
    if x.ndim == nd + 2:
        return x, False
    if x.ndim == nd + 1:
        return x.unsqueeze(0), True
    raise ArgumentError(f"{op}: expected a {nd + 1}-D (unbatched) or {nd + 2}-D (batched) input, got shape "
                     f"{tuple(x.shape)}")


def creating_graph(*depends) -> bool:
    """True inside a backward run with ``create_graph`` whose result depends on a tensor that requires grad:
    the gradient must then be written in differentiable ops."""
    return is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in depends)


def composite_grads(needs, composite, inputs, gy):
    """A backward under ``create_graph``: the gradients of ``composite(*inputs)`` -- the op's own formula written
    in differentiable Tensor ops -- wrt each input with ``needs[i]``, as graphs that can be differentiated again
    (the fast primitives stay the first-order path; this is the second-order one, from the same formula)."""
    from ...autograd import enable_grad, grad
    wanted = [i for i, t in enumerate(inputs) if t is not None and needs[i]]
    if not wanted:
        return [None] * len(inputs)
    with enable_grad():
        out = composite(*inputs)
        gs = grad(out, [inputs[i] for i in wanted], gy, create_graph=True, allow_unused=True)
    res = [None] * len(inputs)
    for i, g in zip(wanted, gs):
        res[i] = g
    return res


_new = object.__new__


def apply_seen(cls, *args, **kwargs):
    """``cls.apply(*args, **kwargs)`` of a Function with one Tensor output, for the nn seen-signature paths
    (docs/host_overhead.md round 24): the same forward and the same node fields, without apply's generic passes --
    the caller's seen key already proved what apply would check (the tensors' devices; not anomaly mode, which records
    a trace).  As apply: a Tensor argument that requires grad gets its edge and (shape, dtype), one that does not its
    grad_fn's edge, anything else None; keyword arguments reach forward only."""
    record = _state.grad_enabled
    needs, edges, meta = [], [], []         # one pass, as apply's
    for a in args:
        if isinstance(a, Tensor):
            if a.requires_grad:
                needs.append(True)
                edges.append(a._edge())
                meta.append((a.data.shape, a.data.dtype))
                continue
            edges.append(a._edge() if a.grad_fn is not None else None)
        else:
            edges.append(None)
        needs.append(False)
        meta.append(None)
    ctx = _new(FunctionCtx)
    ctx._fn_cls = cls
    ctx.needs_input_grad = needs = tuple(needs)
    _state.grad_enabled = False
    try:
        y = cls.forward(ctx, *args, **kwargs)
    finally:
        _state.grad_enabled = record
    if not (record and True in needs):
        return y
    ctx.next_edges = tuple(edges)
    ctx._input_meta = tuple(meta)
    ctx._n_inputs = len(args)
    data = y.data
    ctx._out_meta = ((data.shape, data.dtype, array_module(data)),)
    ctx.num_outputs = 1
    floating = _is_floating(data.dtype, True)
    y.output_nr = 0
    y.requires_grad = floating
    y.grad_fn = ctx if floating else None
    return y
