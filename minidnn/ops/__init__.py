"""The differentiable ops on Tensors, grouped by family, and their binding as Tensor methods."""
from __future__ import annotations

from .. import _tensor_convert as _convert
from .. import _tensor_hooks as _hooks
from .. import creation as _creation
from ..tensor import Tensor
from . import activation as _act
from . import elementwise as _ew
from . import gather_scatter as _sc
from . import linalg as _la
from . import methods as _methods
from . import reduction as _red
from . import shape as _sh
from . import sorting as _so
from . import tensor_methods as _tm
from ._core import broadcast_to, sum_to, to_tensor
from .activation import log_softmax, relu, sigmoid, softmax, tanh  # noqa: F401  (one Function, every binding)
from .elementwise import *  # noqa: F401,F403
from .elementwise import _add
from .gather_scatter import *  # noqa: F401,F403
from .indexing import getitem, index_put, scatter_into  # noqa: F401
from .legacy import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .reduction import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .sorting import *  # noqa: F401,F403


def _bind():
    T = Tensor
    # Operators.  Python scalars on the left go through the reflected forms.
    T.__add__ = _add
    T.__radd__ = _add
    T.__sub__ = _ew.sub
    T.__rsub__ = _ew.rsub
    T.__mul__ = _ew.mul
    T.__rmul__ = _ew.mul
    T.__truediv__ = _ew.div
    T.__rtruediv__ = _ew.rdiv
    T.__pow__ = _ew.pow
    T.__rpow__ = _ew.rpow
    T.__neg__ = _ew.neg
    T.__abs__ = _ew.abs
    T.__matmul__ = _la.matmul
    T.__rmatmul__ = lambda a, b: _la.matmul(to_tensor(b, a), a)
    T.__floordiv__ = _ew.floordiv
    T.__mod__ = _ew.remainder
    T.__eq__ = _ew.eq
    T.__ne__ = _ew.ne
    T.__lt__ = _ew.lt
    T.__le__ = _ew.le
    T.__gt__ = _ew.gt
    T.__ge__ = _ew.ge
    T.__invert__ = _ew.bitwise_not
    T.__and__ = lambda a, b: T._from_array(a.data & (b.data if isinstance(b, T) else b))
    T.__or__ = lambda a, b: T._from_array(a.data | (b.data if isinstance(b, T) else b))
    T.__xor__ = lambda a, b: T._from_array(a.data ^ (b.data if isinstance(b, T) else b))
    T.__getitem__ = getitem
    T.__setitem__ = _tm.setitem
    T.relu, T.sigmoid, T.tanh = _act.relu, _act.sigmoid, _act.tanh
    # Conversions and in-place arithmetic (ops/methods.py): x.float(), x.add_(y), x += y, ...
    for name in _methods.__all__:
        setattr(T, name, getattr(_methods, name))
    T.clip_ = _methods.clamp_
    T.__iadd__, T.__isub__ = _methods.add_, _methods.sub_
    T.__imul__, T.__itruediv__ = _methods.mul_, _methods.div_
    # Leaving the graph (numpy(), item(), repr, DLPack...), layout and copy_; gradient hooks (minidnn/_tensor_*.py).
    for mod in (_convert, _hooks):
        for name in mod.__all__:
            setattr(T, name, getattr(mod, name))
    # Conversion, in-place fills and random fills (ops/tensor_methods.py, creation.py).
    T.to = _tm.to
    T.zero_ = _tm.zero_
    T.fill_ = _tm.fill_
    T.uniform_ = _creation.uniform_
    T.normal_ = _creation.normal_
    # Methods with the same name as the op.
    for mod in (_ew, _red, _sh, _la):
        for name in mod.__all__:
            if not hasattr(T, name) or name in ("abs", "max", "min", "sum", "all", "any", "round", "pow", "amax",
                                                "amin"):
                setattr(T, name, getattr(mod, name))
    T.add = _ew.add
    T.sub = T.subtract = _ew.sub
    T.mul = T.multiply = _ew.mul
    T.div = T.divide = T.true_divide = _ew.div
    T.view = _sh.reshape
    T.sum_to = sum_to
    T.broadcast_to = broadcast_to
    T.expand_as = lambda a, other: _sh.expand(a, other.shape)
    T.view_as = T.reshape_as = lambda a, other: _sh.reshape(a, other.shape)
    T.T = property(lambda a: _sh.permute(a, tuple(range(a.ndim))[::-1]))
    T.mT = property(lambda a: _sh.swapaxes(a, -1, -2))
    T.astype = _la.astype
    # PyTorch-named methods of the index/sort families and composites (issue 14)
    for name in ("sort", "argsort", "topk", "median", "mode", "kthvalue"):
        setattr(T, name, getattr(_so, name))
    for name in ("gather", "scatter", "scatter_add", "masked_fill", "tril", "triu", "diag", "cumsum", "cumprod",
                 "take_along_dim"):
        setattr(T, name, getattr(_sc, name))
    for name in ("isclose", "allclose", "addcmul", "addcdiv", "lerp", "bitwise_not", "remainder", "fmod",
                 "floor_divide"):
        setattr(T, name, getattr(_ew, name))
    T.t = _la.t
    T.mm = _la.mm
    T.bmm = _la.bmm
    T.logical_not = _ew.logical_not
    for name, fn in (("scatter_", _sc.scatter), ("scatter_add_", _sc.scatter_add), ("masked_fill_", _sc.masked_fill),
                     ("addcmul_", _ew.addcmul), ("addcdiv_", _ew.addcdiv), ("lerp_", _ew.lerp),
                     ("tril_", _sc.tril), ("triu_", _sc.triu), ("t_", _la.t)):
        setattr(T, name, _inplace_method(name, fn))
    T.softmax = lambda x, dim=-1, axis=None, dtype=None: _act.softmax(x, dim if axis is None else axis, dtype=dtype)
    T.log_softmax = lambda x, dim=-1, axis=None, dtype=None: _act.log_softmax(x, dim if axis is None else axis,
                                                                             dtype=dtype)


def _inplace_method(name, fn):
    """``x.name(...)``: ``fn(x, ...)`` written into x (PyTorch's in-place variant; dtype kept, history rebound
    when x or an operand is part of a graph)."""
    def method(self, *args, **kwargs):
        grad_operand = next((a for a in list(args) + list(kwargs.values())
                             if isinstance(a, Tensor) and a.requires_grad), None)
        if grad_operand is None:
            return self._inplace(name, lambda a: fn(a, *args, **kwargs))
        return self._inplace(name, lambda a, _o: fn(a, *args, **kwargs), grad_operand)
    method.__name__ = name
    return method


_bind()
