"""Reverse-mode automatic differentiation: graph nodes, the backward engine, grad modes, Function.

The graph: every Tensor produced by a differentiable op under grad mode points (``grad_fn``) to a
``Node``.  A node knows, for each of its inputs, the edge ``(node, output_nr)`` its gradient flows
into (``None`` for inputs that need no gradient).  Leaves that require grad get an
``AccumulateGrad`` node that adds incoming gradients into ``leaf.grad``.

Backward (``run_backward``) is iterative, never recursive (a chain of 100,000 ops works):
  1. walk the graph from the roots once, counting for every node how many edges point into it;
  2. start from the roots and process a node when all its consumers have sent their gradient
     (Kahn's algorithm): call ``type(node).backward(node, *grads)``, add the results into the buffers of the
     next nodes, release the node's saved tensors unless ``retain_graph``.
Gradients are Tensors, and every built-in backward is written with differentiable Tensor ops, so
with ``create_graph=True`` the backward pass itself records a graph (higher-order gradients).
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import traceback

import numpy as np

from . import _amp_state
from .backend import devices as _devices
from .backend.array_ops import copy_into as _copy_into
from .backend.array_ops import copy_like as _copy_like
from .backend.devices import array_module as _array_module
from .backend.devices import device_of as _device_of
from .backend.devices import is_floating as _is_floating
from .backend.tensor_ops import add_arrays

_new = object.__new__
_UNARY = object()        # Function.node's marker: one input

# The Tensor class: bound by minidnn/tensor.py once it is defined (that module imports this one, so
# importing it here would be circular); every function below runs after ``import minidnn``.
Tensor = None

__all__ = [
    "Function", "FunctionCtx", "Node", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled",
    "inference_mode", "grad", "backward",
    # bound by minidnn/__init__.py from the modules above the engine that define them:
    "detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",     # noqa: F822  (_anomaly_mode.py)
    "gradcheck", "gradgradcheck", "GradcheckError",                   # noqa: F822  (gradcheck.py)
]


# ----------------------------------------------------------------------------------------------
# Grad mode (per thread, as in PyTorch)
# ----------------------------------------------------------------------------------------------
class _State(threading.local):
    grad_enabled = True
    anomaly = False     # detect_anomaly (_anomaly_mode.py) sets it; new nodes then keep a trace, backward checks
    capture = None      # during autograd.grad: {node: output numbers} whose gradients are asked for
    buffers = None      # during a first-order backward into .grad: the engine's pending gradients (_grad_dest.py)


_state = _State()


def gradient_wanted(node) -> bool:
    """Whether the running backward must form the gradient of ``node``'s outputs itself: a hook or retain_grad sits
    on them, or autograd.grad asked for them (a fused node that bypasses ``node`` then takes the unfused path)."""
    return bool(node.pre_hooks) or (_state.capture is not None and node in _state.capture)


def is_grad_enabled() -> bool:
    """True unless gradient recording is off in this thread (torch.is_grad_enabled): no_grad, inference_mode and
    set_grad_enabled(False) turn it off."""
    return _state.grad_enabled


class _GradModeContext:
    """A context manager that is also a decorator (``@no_grad()`` and ``with no_grad():``)."""

    mode = True

    def __enter__(self):
        self._prev = _state.grad_enabled
        _state.grad_enabled = self.mode

    def __exit__(self, *exc):
        _state.grad_enabled = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_GradModeContext):
    """Disable graph recording inside the block (or the decorated function)."""
    mode = False


class enable_grad(_GradModeContext):
    """Enable graph recording inside the block, even within ``no_grad``."""
    mode = True


inference_mode = no_grad


class set_grad_enabled(_GradModeContext):
    """``set_grad_enabled(False)``: as a function call it sets the mode; as a context it restores it."""

    def __init__(self, mode: bool):
        self._prev = _state.grad_enabled
        self.mode = bool(mode)
        _state.grad_enabled = self.mode

    def __enter__(self):
        pass

    def __call__(self, fn):
        mode = self.mode
        _state.grad_enabled = self._prev

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)
        return wrapper


# ----------------------------------------------------------------------------------------------
# Nodes
# ----------------------------------------------------------------------------------------------
_FREED_MSG = ("Trying to backward through the graph a second time (or to read saved tensors after they were "
              "freed): {name} released its saved tensors after the first backward. Pass retain_graph=True to "
              "the first backward() or autograd.grad() if you need to backward through it again.")


class Node:
    """A recorded operation: the engine calls ``type(node).backward(node, *grads)`` for one gradient (a Tensor or
    None) per input edge.  Ops are ``Function``s (below); AccumulateGrad and FunctionCtx are the engine's own nodes.
    ``saved`` holds what backward needs, with the tensors' versions (an in-place change after the forward is
    caught); after a backward without ``retain_graph`` it becomes None."""

    __slots__ = ("next_edges", "saved", "versions", "pre_hooks", "trace", "__weakref__")
    num_outputs = 1

    def save_for_backward(self, *tensors):
        """Keep ``tensors`` (None or other objects allowed) for backward, with their versions."""
        self.saved = tensors
        self.versions = tuple([getattr(t, "_version", 0) for t in tensors])

    @property
    def saved_tensors(self):
        """What ``save_for_backward`` kept, checked: raises if it was released or changed in place since."""
        return self.saved_tensors_checked()

    def saved_tensors_checked(self):
        saved = self.saved
        if saved is None:
            raise RuntimeError(_FREED_MSG.format(name=self.name()))
        for t, v in zip(saved, self.versions):
            if getattr(t, "_version", v) != v:
                raise RuntimeError(
                    f"one of the tensors needed by {self.name()} for gradient computation was modified by an "
                    f"in-place operation: a tensor of shape {tuple(t.shape)} is at version {t._version}; "
                    f"expected version {v}. Use an out-of-place op, or clone() the tensor before changing it.")
        return saved

    def name(self) -> str:
        return type(self).__name__

    def backward(self, *grads):
        raise NotImplementedError(f"{self.name()} has no backward")

    def release(self):
        if self.saved:
            self.saved = None

    @property
    def next_functions(self):
        return tuple(e if e is not None else (None, 0) for e in self.next_edges)

    def __repr__(self):
        return f"<{self.name()}>"


# id(leaf) -> (weakref to it, [hook(leaf)]): PyTorch's post-accumulate-grad hooks, run after a backward has
# written the leaf's .grad (data-parallel all-reduce launches from them).  Kept outside Tensor's slots: rarely used.
# Tensor.register_post_accumulate_grad_hook (_tensor_hooks.py) fills it.
_post_accumulate_hooks: dict = {}
# Host round 31: a gradient only the engine holds, on the leaf's flat slot, becomes .grad itself (not wrapped anew)
SLOT_GRAD_AS_IS = [os.environ.get("MINIDNN_SLOT_GRAD_AS_IS", "1") != "0"]


class AccumulateGrad(Node):
    """The sink of a leaf that requires grad: adds the incoming gradient into ``variable.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable):
        self.variable = variable
        self.next_edges = ()
        self.saved = ()
        self.versions = ()
        self.pre_hooks = None
        self.trace = None

    def accumulate(self, g, create_graph: bool, fresh: bool, sole: bool = False):
        """``fresh``: the engine guarantees nobody else holds ``g``'s array, so it may be kept as is; ``sole``: nor
        ``g`` (SLOT_GRAD_AS_IS).  (One frame: every leaf of every backward comes here.)"""
        var = self.variable
        if var._hooks:
            fresh = sole = False        # a hook may keep a reference to g
            for hook in var._hooks:
                r = hook(g)
                if r is not None:
                    g = r
        if g.data.dtype != var.data.dtype:
            g = g.astype(var.dtype)
            fresh = True
        old = var.grad
        if create_graph:
            var.grad = g if old is None else old + g
        elif old is None:
            storage = var._grad_storage
            data = g.data
            if storage is not None:             # the optimizer's flat gradient buffer: land it there in place
                data is storage or _copy_into(storage, data)    # (or the producer wrote it there: _grad_dest)
                var.grad = g if (sole and data is storage and type(g) is Tensor and SLOT_GRAD_AS_IS[0]
                                 and type(var)._wrap_like is Tensor._wrap_like) else var._wrap_like(storage)
            elif (fresh and data.strides == var.data.strides and data.base is None
                  and getattr(data.flags, "writeable", True)):
                var.grad = var._wrap_like(data)
            else:
                var.grad = var._wrap_like(_copy_like(var.data, data))    # the leaf's layout (PyTorch's)
        elif old.requires_grad:
            var.grad = old.detach() + g.detach()
        else:
            try:
                old.data += g.data      # accumulate in place: keeps views into flat buffers valid
                old._version += 1
            except ValueError:           # read-only or broadcast-incompatible array: out of place
                var.grad = var._wrap_like(old.data + g.data)
        if _post_accumulate_hooks:
            entry = _post_accumulate_hooks.get(id(var))
            if entry is not None and entry[0]() is var:
                for hook in list(entry[1]):
                    hook(var)


class FunctionCtx(Node):
    """The ``ctx`` of a user ``Function``: it is the graph node its outputs point to.  What most ctxs keep as it is
    is a class default (a ctx that sets one holds its own in ``__dict__``), so apply writes only what it must."""

    __slots__ = ("_fn_cls", "needs_input_grad", "_out_meta", "num_outputs", "_n_inputs", "_input_meta", "__dict__")
    next_edges = saved = versions = _non_differentiable = _dirty = ()
    pre_hooks = trace = None
    _materialize = True

    def name(self):
        return self._fn_cls.__name__ + "Backward" if getattr(self, "_fn_cls", None) else "FunctionCtx"

    def mark_non_differentiable(self, *tensors):
        self._non_differentiable = tuple(id(t) for t in tensors)

    def mark_dirty(self, *tensors):
        self._dirty = tuple(tensors)

    def set_materialize_grads(self, value: bool):
        self._materialize = bool(value)

    def backward(self, *grads):
        if self._materialize:
            for g in grads:
                if g is None:       # zeros only where a gradient is missing (not on the common path)
                    grads = tuple([g if g is not None else _zeros_like_meta(meta)
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
        if type(result) is ExactGrads:      # (its length checked above)
            return result
        for r, meta in zip(result, self._input_meta):   # the common case, checked in one pass: result as it is
            if r is not None and (meta is None or type(r) is not Tensor or r.data.shape != meta[0]):
                break
        else:
            return result
        out = []
        for i, (r, meta) in enumerate(zip(result, self._input_meta)):
            if r is None or meta is None:
                out.append(None)
                continue
            if not isinstance(r, Tensor):
                r = Tensor._from_array(np.asarray(r) if not hasattr(r, "shape") else r)
            if r.data.shape != meta[0]:      # meta[0]: the input's data.shape, a tuple
                try:
                    r = r.sum_to(meta[0])
                except Exception:
                    raise RuntimeError(f"{self._fn_cls.__name__}.backward returned a gradient of shape "
                                       f"{tuple(r.shape)} for argument {i}, whose shape is {meta[0]}") from None
            out.append(r)
        return tuple(out)


class ExactGrads(tuple):    # a backward's results known to fit its inputs (each None, or a Tensor of its input's
    __slots__ = ()          # shape where it has an edge): FunctionCtx.backward returns them unchecked (host round 31)


def _zeros_like_meta(meta):
    shape, dtype, xp = meta
    return Tensor._from_array(xp.zeros(shape, dtype=dtype))


class Function(Node):
    """A differentiable op, the one way to write one: ``forward`` computes, ``backward`` receives one gradient
    per output and returns one per input (None where there is none), written in Tensor ops so that it is itself
    differentiable (``create_graph=True``).  As in PyTorch::

        class Exp(Function):
            @staticmethod
            def forward(ctx, x):
                y = x.exp()
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, gy):
                y, = ctx.saved_tensors
                return gy * y

        y = Exp.apply(x)

    Two ways to run one, one graph: ``Op.apply(*args)``, PyTorch's contract (nn and user ops: any arguments and
    outputs; its ctx, a FunctionCtx, checks backward's results), and the lean path of the built-in Tensor ops
    (minidnn/ops/): the op computes its array, ``ctx = Op.node(a, b)`` makes the graph node, an instance of ``Op``
    (backward reads what the op kept in its slots), and ``ctx.output(array)`` returns the recorded result.
    """

    __slots__ = ()
    retain_inputs = False       # the lean path: node() saves the inputs for backward (Chainer's retain_inputs)

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        # The hot path of every nn op: one pass over the arguments (needs, edges, metadata), one over the outputs.
        ctx = _new(FunctionCtx)         # the class defaults stand for what most ctxs never change
        ctx._fn_cls = cls
        tensor_args = []
        needs_input_grad = []
        edges = []
        input_meta = []
        record = _state.grad_enabled
        for a in args:
            if isinstance(a, Tensor):
                tensor_args.append(a)
                if a.requires_grad:
                    needs_input_grad.append(True)
                    edges.append(a._edge() if record else None)
                    input_meta.append((a.data.shape, a.data.dtype))
                    continue
                edges.append(a._edge() if record and a.grad_fn is not None else None)
            else:
                edges.append(None)
            needs_input_grad.append(False)
            input_meta.append(None)
        if len(tensor_args) > 1:
            _check_same_device(cls.__name__, tensor_args)
        ctx.needs_input_grad = needs_input_grad = tuple(needs_input_grad)
        _state.grad_enabled = False
        try:
            outputs = cls.forward(ctx, *args, **kwargs)
        finally:
            _state.grad_enabled = record
        if not (record and True in needs_input_grad):
            return outputs
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        ctx.next_edges = tuple(edges)
        ctx._input_meta = tuple(input_meta)
        ctx._n_inputs = len(args)
        if _state.anomaly:
            ctx.trace = "".join(traceback.format_stack()[:-1])
        arg_ids = [id(a) for a in tensor_args]
        dirty, non_differentiable = ctx._dirty, ctx._non_differentiable
        wired = []
        meta = []       # per output (shape, dtype, xp); a non-Tensor output gets a float32 scalar's
        for i, o in enumerate(outs):
            if not isinstance(o, Tensor):
                wired.append(o)
                meta.append(_SCALAR_META)
                continue
            if id(o) in arg_ids and not (dirty and any([o is d for d in dirty])):
                o = o._view_of_data()     # an input returned as-is becomes a new tensor of this node
            data = o.data
            meta.append((data.shape, data.dtype, _array_module(data)))
            if non_differentiable and id(o) in non_differentiable:
                o.requires_grad = False
            else:
                o.output_nr = i
                o.requires_grad = floating = _is_floating(data.dtype, True)
                o.grad_fn = ctx if floating else None
            wired.append(o)
        ctx._out_meta = tuple(meta)
        ctx.num_outputs = len(meta)
        return wired[0] if single else tuple(wired)

    @classmethod
    def node(cls, a, b=_UNARY):
        """A new graph node of this op (the ctx backward receives) with an edge to each of its one or two inputs
        that requires grad (an input may be None: a constant); ``retain_inputs`` saves the inputs that are not None.
        Written out, not looped: this is every built-in op's recording (node_of: any number of inputs)."""
        ctx = _new(cls)
        if b is _UNARY:
            ctx.next_edges = (a._edge() if a.requires_grad else None,)
            ctx.saved, ctx.versions = ((a,), (a._version,)) if cls.retain_inputs else ((), ())
        else:
            ctx.next_edges = (a._edge() if a is not None and a.requires_grad else None,
                              b._edge() if b is not None and b.requires_grad else None)
            if not cls.retain_inputs:
                ctx.saved = ctx.versions = ()
            elif b is None:
                ctx.saved, ctx.versions = (a,), (a._version,)
            else:
                ctx.saved, ctx.versions = (a, b), (a._version, b._version)
        ctx.pre_hooks = ctx.trace = None
        return ctx

    @classmethod
    def node_of(cls, *inputs):
        ctx = _new(cls)
        ctx.next_edges = tuple([t._edge() if t is not None and t.requires_grad else None for t in inputs])
        ctx.saved = ctx.versions = ctx.pre_hooks = ctx.trace = None
        ctx.save_for_backward(*[t for t in inputs if t is not None] if cls.retain_inputs else ())
        return ctx

    def output(self, data):
        """``data`` (an array) as a Tensor made by this node (written out rather than calling the Tensor's
        constructor: one call less on every recorded op)."""
        t = _new(Tensor)
        if isinstance(data, np.generic):
            data = np.asarray(data)
        t.data = data
        t.grad = None
        t.grad_fn = self
        t.requires_grad = True
        t.output_nr = 0
        t._version = 0
        t._hooks = None
        t._accumulator = None
        t._grad_storage = None
        t.name = None
        if _state.anomaly:
            self.trace = "".join(traceback.format_stack()[:-1])
        return t

    @property
    def needs_input_grad(self):
        return tuple([e is not None for e in self.next_edges])

    def name(self):
        return type(self).__name__ + "Backward"


_SCALAR_META = ((), np.float32, np)


def _check_same_device(where, tensors):
    kind = type(tensors[0].data)
    for t in tensors:
        if type(t.data) is not kind:
            break
    else:       # one array type (the common case): NumPy's are on the cpu, CuPy's compared by GPU number
        cp = _devices._cupy
        if kind is np.ndarray or (cp is not None and kind is cp.ndarray
                                  and len({t.data.data.device_id for t in tensors}) == 1):
            return
    d0 = _device_of(tensors[0].data)
    for t in tensors[1:]:
        d = _device_of(t.data)
        if d is not d0 and d != d0:
            raise RuntimeError(f"{where}: expected all tensors on one device, but found tensors on '{d0}' "
                               f"and '{d}'")


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------
def _add_grads(a, b, create_graph):
    if a is None:
        return b
    if create_graph:
        return a + b
    if type(a.data) is np.ndarray:
        return a._wrap_like(a.data + b.data)
    return a._wrap_like(add_arrays(a.data, b.data))      # CuPy: one launch, a channels-last layout kept


def run_backward(roots, root_grads, retain_graph=False, create_graph=False, targets=None, allow_unused=False):
    """Backpropagate ``root_grads`` from ``roots`` (tensors).  Without ``targets``: accumulate into
    leaves' ``.grad``.  With ``targets`` (tensors): return their gradients, touching no ``.grad``."""
    if _amp_state.is_active():      # gradients keep the dtypes the forward pass chose, even inside autocast
        with _amp_state.suspended():
            return _run_backward(roots, root_grads, retain_graph, create_graph, targets, allow_unused)
    return _run_backward(roots, root_grads, retain_graph, create_graph, targets, allow_unused)


def _run_backward(roots, root_grads, retain_graph, create_graph, targets, allow_unused):

    # 1. Root edges and the initial gradient buffers.
    buffers = {}                   # node -> list of gradients, one per output
    root_nodes = []
    for t, g in zip(roots, root_grads):
        edge = t._edge()
        if edge is None:
            raise RuntimeError(f"element of shape {tuple(t.shape)} does not require grad and has no grad_fn: nothing "
                               "to differentiate (did you forget requires_grad=True, or call it under no_grad?)")
        node, nr = edge
        buf = buffers.get(node)
        if buf is None:
            buf = buffers[node] = [None] * node.num_outputs
            root_nodes.append(node)
        buf[nr] = _add_grads(buf[nr], g, create_graph)

    # 2. Discover the graph, count incoming edges (dependencies) per node.
    deps = dict.fromkeys(root_nodes, 0)        # also the nodes seen (a root may be another node's child too)
    stack = list(root_nodes)
    while stack:
        node = stack.pop()
        for edge in node.next_edges:
            if edge is None:
                continue
            child = edge[0]
            if child in deps:
                deps[child] += 1
            else:
                deps[child] = 1
                stack.append(child)

    capture = None
    execute = None
    if targets is not None:
        # Capture gradients flowing into the targets' edges; execute only nodes that lead to a target.
        capture = {}
        target_edges = []
        for t in targets:
            edge = t._edge()
            target_edges.append(edge)
            if edge is not None:
                capture.setdefault(edge[0], set()).add(edge[1])
        # A node must execute if any of its edges reaches a captured node: fixpoint over the graph.
        reach = set(capture)
        order = _reverse_topological(root_nodes, deps)
        for node in order:      # children before parents
            if any(e is not None and e[0] in reach for e in node.next_edges):
                reach.add(node)
        execute = {n for n in reach if any(e is not None and e[0] in reach for e in n.next_edges)}

    # 3. Process nodes whose consumers are all done.
    ready = [n for n in root_nodes if deps.get(n, 0) == 0]
    prev = _state.grad_enabled, _state.capture, _state.buffers
    _state.grad_enabled, _state.capture = create_graph, capture
    _state.buffers = buffers if targets is None and not create_graph else None
    anomaly = _state.anomaly
    captured = {}
    try:
        while ready:
            node = ready.pop()
            grads = buffers.pop(node, None) or [None] * node.num_outputs
            if capture is not None and node in capture:
                for nr in capture[node]:
                    captured[(node, nr)] = grads[nr]
            if node.pre_hooks:
                for nr, hooks in node.pre_hooks.items():
                    for hook in hooks:
                        if grads[nr] is not None:
                            r = hook(grads[nr])
                            if r is not None:
                                grads[nr] = r
            run = execute is None or node in execute
            if type(node) is AccumulateGrad:
                g = grads[0]
                if run and g is not None and targets is None:
                    # Keep g's array as .grad without a copy only where nothing else holds g or its
                    # array (PyTorch's use_count rule): not a user's gradient, not a tensor passed
                    # through to several leaves, not one a hook or retain_grad kept.
                    sole = _getrefcount(g) <= _SOLE_TENSOR_REFS
                    node.accumulate(g, create_graph, sole and _getrefcount(g.data) <= _SOLE_ARRAY_REFS, sole)
                g = None
                continue
            # (a single-output node, the common case, skips the generator of any())
            if run and (grads[0] is not None if len(grads) == 1 else any(g is not None for g in grads)):
                if node.saved is None:
                    raise RuntimeError(_FREED_MSG.format(name=node.name()))
                outs = type(node).backward(node, *grads)
                if anomaly:
                    _check_anomaly(node, outs)
                if not retain_graph:
                    node.release()
            else:
                outs = None
                if run and not retain_graph and node.saved:     # reached with no gradient: freed like a run node
                    node.release()
            for i, edge in enumerate(node.next_edges):
                if edge is None:
                    continue
                child, nr = edge
                g = outs[i] if outs is not None else None
                if g is not None and execute is not None and child not in execute and child not in capture:
                    g = None
                if g is not None:
                    buf = buffers.get(child)
                    if buf is None:
                        buffers[child] = [g] if nr == 0 and child.num_outputs == 1 else \
                            [g if k == nr else None for k in range(child.num_outputs)]
                    elif buf[nr] is None:
                        buf[nr] = g
                    elif buf[nr] is not g:      # (it is: the Function added its gradient into it, _grad_dest.py)
                        buf[nr] = _add_grads(buf[nr], g, create_graph)
                left = deps[child] - 1
                if left:
                    deps[child] = left
                else:
                    ready.append(child)
            outs = g = None      # drop our references to the gradients (see the refcount tests)
    finally:
        _state.grad_enabled, _state.capture, _state.buffers = prev

    if targets is None:
        return None
    results = []
    for t, edge in zip(targets, target_edges):
        g = captured.get(edge) if edge is not None else None
        if g is None and not allow_unused:
            raise RuntimeError(f"one of the differentiated tensors (shape {tuple(t.shape)}) appears to not have been "
                               "used in the graph. Set allow_unused=True if this is the desired behavior.")
        if g is not None and not create_graph:
            g = g.detach()
        results.append(g)
    return tuple(results)


_getrefcount = sys.getrefcount


def _sole_refcounts():
    """The refcounts of a gradient and of its array when only the engine holds it: an element of the engine's
    ``grads`` list bound to a local, its array in one slot (measured: it follows the interpreter's counting)."""
    class _Probe:
        __slots__ = ("data",)
    p = _Probe()
    p.data = object()
    grads = [p]
    del p
    g = grads[0]
    return _getrefcount(g), _getrefcount(g.data)


_SOLE_TENSOR_REFS, _SOLE_ARRAY_REFS = _sole_refcounts()


def _reverse_topological(root_nodes, deps):
    """Nodes ordered so that every node comes after all nodes it points to (children first)."""
    deps = dict(deps)
    order = []
    ready = [n for n in root_nodes if deps.get(n, 0) == 0]
    while ready:
        node = ready.pop()
        order.append(node)
        for edge in node.next_edges:
            if edge is None:
                continue
            c = edge[0]
            deps[c] -= 1
            if deps[c] == 0:
                ready.append(c)
    order.reverse()
    return order


def _check_anomaly(node, outs):
    for i, g in enumerate(outs):
        if g is None:
            continue
        xp = g._xp()
        if not bool(xp.isfinite(g.data).all()):
            where = node.trace or "(the forward ran outside detect_anomaly: no trace recorded)\n"
            raise RuntimeError(f"Function '{node.name()}' returned nan or inf values in its {i}th output.\n"
                               f"The forward call that created it:\n{where}")


def _normalize_grads(tensors, grads, what):
    out = []
    for i, (t, g) in enumerate(zip(tensors, grads)):
        if g is None:
            if t.numel() != 1:
                raise RuntimeError(f"grad can be implicitly created only for scalar outputs, but {what} {i} has "
                                   f"shape {tuple(t.shape)}: pass gradient= (a tensor of that shape)")
            g = Tensor._from_array(t._xp().ones(t.shape, dtype=t.dtype))
        elif not isinstance(g, Tensor):
            g = Tensor._from_array(t._xp().asarray(g, dtype=t.dtype))
        else:
            if tuple(g.shape) != tuple(t.shape):
                raise RuntimeError(f"mismatch in shape: the gradient has shape {tuple(g.shape)} but {what} {i} has "
                                   f"shape {tuple(t.shape)}")
            if g.device != t.device:
                raise RuntimeError(f"the gradient is on device '{g.device}' but {what} {i} is on '{t.device}'")
        out.append(g)
    return out


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False):
    """Accumulate d(tensors)/d(leaves) into every leaf's ``.grad``."""
    if isinstance(tensors, Tensor):
        tensors = (tensors,)
    tensors = tuple(tensors)
    if grad_tensors is None or isinstance(grad_tensors, Tensor):
        grad_tensors = (grad_tensors,) * len(tensors) if grad_tensors is None else (grad_tensors,)
    grads = _normalize_grads(tensors, grad_tensors, "output")
    if retain_graph is None:
        retain_graph = create_graph
    run_backward(tensors, grads, retain_graph=retain_graph, create_graph=create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    """The gradients of ``outputs`` with respect to ``inputs``, returned as a tuple (``.grad`` untouched)."""
    single_out = isinstance(outputs, Tensor)
    outputs = (outputs,) if single_out else tuple(outputs)
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    if grad_outputs is None or isinstance(grad_outputs, Tensor):
        grad_outputs = (grad_outputs,) * len(outputs) if grad_outputs is None else (grad_outputs,)
    for i, t in enumerate(inputs):
        if not t.requires_grad:
            raise RuntimeError(f"autograd.grad: input {i} (shape {tuple(t.shape)}) does not require grad")
    grads = _normalize_grads(outputs, grad_outputs, "output")
    if retain_graph is None:
        retain_graph = create_graph
    return run_backward(outputs, grads, retain_graph=retain_graph, create_graph=create_graph,
                        targets=inputs, allow_unused=allow_unused)
