"""The Tensor: an n-dimensional array (NumPy on cpu, CuPy on cuda) that records the ops made on it.

PyTorch's names and semantics: ``minidnn.tensor(data, dtype=None, device=None, requires_grad=False)``;
Python floats become float32 (the default float dtype); otherwise NumPy's promotion rules apply.
Python scalars are weak: ``float16_tensor * 2.5`` stays float16, ``int32_tensor + 1`` stays int32, and an
integer tensor meeting a Python float (or ``/``) gives the default float dtype, as in PyTorch.
Tensors never move between devices silently: an op mixing devices raises naming both.
This file is the engine's half of the Tensor: its data, its place in the graph (``grad_fn``, ``_edge``), the
in-place mechanism, and ``_wrap`` (an array as a Tensor without history; a recorded op's output comes from its
node, ``Function.output``).  The differentiable ops live in ``minidnn/ops/``; conversions and printing in
``_tensor_convert.py``; gradient hooks in ``_tensor_hooks.py``.  ops/__init__.py binds them as methods.
"""
from __future__ import annotations

import weakref

import numpy as np

from . import _dtypes
from . import autograd as _ag
from ._dtypes import (  # noqa: F401  (the dtype helpers, re-exported: the layers above import them from here)
    _infer_python_dtype,
    _to_dtype,
    get_default_dtype,
    set_default_dtype,
)
from .autograd import AccumulateGrad, _state
from .backend import devices as _dev
from .backend.devices import is_floating as _is_floating
from .backend.errors import ArgumentError, DTypeError

__all__ = ["Tensor", "get_default_dtype", "set_default_dtype"]

class Tensor:
    """An array plus what autograd needs.  Build one with ``minidnn.tensor(...)``."""

    __slots__ = ("data", "grad", "grad_fn", "requires_grad", "output_nr", "_version", "_hooks", "_accumulator",
                 "_grad_storage", "name", "__weakref__")

    __array_priority__ = 1000    # NumPy defers `ndarray * Tensor` to Tensor.__rmul__

    def __init__(self, data, dtype=None, device=None, requires_grad=False):
        self._adopt(_make_array(data, dtype, device), requires_grad)

    def _adopt(self, arr, requires_grad=False):
        """Initialise a fresh leaf around ``arr`` itself (no copy): for constructors, such as
        Parameter's, that already hold the array they want."""
        self.data = arr
        self.grad = None
        self.grad_fn = None
        self.output_nr = 0
        self._version = 0
        self._hooks = None
        self._accumulator = None
        self._grad_storage = None
        self.name = None
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    def _xp(self):
        return _dev.array_module(self.data)

    def _edge(self):
        """Where a gradient for this tensor goes: (grad_fn, output_nr), the leaf's accumulator, or None."""
        fn = self.grad_fn
        if fn is not None:
            return (fn, self.output_nr)
        if self.requires_grad:
            acc = self._accumulator
            node = acc() if acc is not None else None
            if node is None:
                node = AccumulateGrad(self)
                self._accumulator = weakref.ref(node)
            return (node, 0)
        return None

    def _view_of_data(self):
        return _wrap(self.data)

    # -- attributes ------------------------------------------------------------------------
    @property
    def shape(self):
        return self.data.shape

    @property
    def ndim(self):
        return self.data.ndim

    def dim(self):
        return self.data.ndim

    def size(self, dim=None):
        return self.data.shape if dim is None else self.data.shape[dim]

    def numel(self):
        return int(self.data.size)

    def __len__(self):
        if self.data.ndim == 0:
            raise DTypeError("len() of a 0-d tensor")
        return self.data.shape[0]

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self):
        return _dev.device_of(self.data)

    @property
    def is_cuda(self):
        return _dev.is_cuda_array(self.data)

    @property
    def is_leaf(self):
        return self.grad_fn is None

    @property
    def itemsize(self):
        return self.data.itemsize

    def element_size(self):
        return self.data.itemsize

    @property
    def nbytes(self):
        return self.data.nbytes

    def is_floating_point(self):
        return _is_floating(self.data.dtype)

    def requires_grad_(self, requires_grad=True):
        if not self.is_leaf:
            if not requires_grad:
                raise RuntimeError("requires_grad_(False) on a non-leaf tensor: use detach() instead")
            return self
        if requires_grad and not _is_floating(self.data.dtype, complex_ok=True):
            raise RuntimeError(f"only tensors of floating point dtype can require gradients, got {self.data.dtype}")
        self.requires_grad = bool(requires_grad)
        return self

    def backward(self, gradient=None, retain_graph=None, create_graph=False):
        """Accumulate the gradient of this tensor into every leaf's ``.grad`` (``gradient`` is needed
        unless this tensor has one element)."""
        _ag.backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph)

    def detach(self):
        """A tensor sharing this one's data, cut from the graph."""
        return _wrap(self.data)

    def detach_(self):
        self.grad_fn = None
        self.requires_grad = False
        return self

    # -- in-place ops ------------------------------------------------------------------------
    def _check_inplace(self, op):
        if self.requires_grad and _state.grad_enabled:
            if self.grad_fn is None:
                raise RuntimeError(f"{op}: a leaf tensor that requires grad (shape {tuple(self.shape)}) is being used "
                                   "in an in-place operation; wrap the update in `with minidnn.no_grad():` or use an "
                                   "out-of-place op")
            return True     # part of a graph: rebind to the out-of-place result
        return False

    def _alias(self):
        """A new Tensor object for this one's current value and history (what an in-place op reads)."""
        t = _wrap(self.data)
        t.grad_fn, t.output_nr, t.requires_grad, t._version = self.grad_fn, self.output_nr, self.requires_grad, \
            self._version
        return t

    def _inplace(self, op, fn, other=None):
        """Apply ``fn`` in place.  On a graph tensor (or with an operand that requires grad) the result
        of the out-of-place op on an alias of the old value is rebound to self, so the history stays
        correct; graph nodes that saved self see the version bump."""
        if self._check_inplace(op) or (isinstance(other, Tensor) and other.requires_grad and _state.grad_enabled):
            old = self._alias()
            res = fn(old) if other is None else fn(old, old if other is self else other)
            if tuple(res.shape) != tuple(self.shape):
                raise RuntimeError(f"{op}: the result of shape {tuple(res.shape)} cannot be written into a tensor of "
                                   f"shape {tuple(self.shape)} in place")
            if res.dtype != self.dtype:
                _check_inplace_cast(op, res.dtype, self.dtype)
                res = res.astype(self.dtype)
            self.data, self.grad_fn, self.output_nr = res.data, res.grad_fn, res.output_nr
            self.requires_grad = res.requires_grad
        else:
            if isinstance(other, Tensor) and other.device != self.device:
                raise RuntimeError(f"{op}: tensors on different devices: '{self.device}' and '{other.device}'")
            res = fn(_wrap(self.data), other) if other is not None else fn(_wrap(self.data))
            if tuple(res.shape) != tuple(self.shape):
                raise RuntimeError(f"{op}: the result of shape {tuple(res.shape)} cannot be written into a tensor of "
                                   f"shape {tuple(self.shape)} in place")
            _check_inplace_cast(op, res.dtype, self.dtype)
            self.data[...] = res.data
        self._version += 1
        return self

    def __hash__(self):         # by identity, as in PyTorch: == is the elementwise op (bound in ops/)
        return id(self)



_ag.Tensor = Tensor        # autograd needs the class; it cannot import this module (circular)
_new = object.__new__


def _wrap(data, requires_grad=False):
    """A tensor without history around an array (the hot path of every op)."""
    t = _new(Tensor)
    if isinstance(data, np.generic):
        data = np.asarray(data)
    t.data = data
    t.grad = None
    t.grad_fn = None
    t.requires_grad = requires_grad
    t.output_nr = 0
    t._version = 0
    t._hooks = None
    t._accumulator = None
    t._grad_storage = None
    t.name = None
    return t


Tensor._wrap_like = staticmethod(_wrap)     # x._wrap_like(array): a plain Tensor around array (one call)
Tensor._from_array = staticmethod(_wrap)    # Tensor._from_array(array, requires_grad=False): the same, one frame


def _check_inplace_cast(op, result, target):
    """PyTorch's in-place rule: the result's dtype must cast to self's by the same-kind rule (a float result
    cannot be written into an integer tensor; bool only takes bool)."""
    if result == target:
        return
    r_float, t_float = _is_floating(result, complex_ok=True), _is_floating(target, complex_ok=True)
    if (r_float and not t_float) or (result.kind == "c" and target.kind != "c") or \
            (target.kind == "b" and result.kind != "b"):
        raise ArgumentError(f"{op}: result type {result} can't be cast to the desired output type {target} (an "
                            "in-place op keeps its tensor's dtype)")


def _make_array(data, dtype=None, device=None):
    return _dtypes.make_array(data.data if isinstance(data, Tensor) else data, dtype, device)
