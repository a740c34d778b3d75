"""What every op shares: operand coercion, device checks, type promotion, sum_to / broadcast_to."""
from __future__ import annotations

import numbers

import numpy as np

from ..autograd import Function, _state
from ..backend import devices as _dev
from ..backend.devices import is_floating as _is_floating
from ..backend.errors import ArgumentError, DimensionError, DTypeError
from ..tensor import Tensor, _wrap, get_default_dtype

__all__ = []

_SCALARS = (int, float, bool, np.number, np.bool_)


def needs_grad(*tensors) -> bool:
    if not _state.grad_enabled:
        return False
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


def device_mismatch(op, a, b):
    return RuntimeError(f"{op}: expected all tensors on the same device, but found one on '{a.device}' and one on "
                        f"'{b.device}' (move one explicitly with .to(device))")


def check_pair(op, a, b):
    """Raise unless a and b (Tensors) live on the same device.  Cheap: compares array types first."""
    ad, bd = a.data, b.data
    if type(ad) is not type(bd):
        raise device_mismatch(op, a, b)
    if type(ad) is not np.ndarray and ad.data.device_id != bd.data.device_id:    # (no CuPy Device objects)
        raise device_mismatch(op, a, b)


def as_operand(x, like: Tensor):
    """Coerce a non-Tensor operand: Python/NumPy scalars stay scalars; arrays and lists become tensors
    (on the cpu for NumPy data, so a cuda tensor mixed with NumPy data raises instead of copying)."""
    if isinstance(x, Tensor) or isinstance(x, _SCALARS):
        return x
    if isinstance(x, numbers.Number):
        return x
    if _dev.is_cuda_array(x):
        return _wrap(x)
    if isinstance(x, (str, bytes)) or (isinstance(x, (list, tuple)) and any(isinstance(v, (str, bytes)) for v in x)):
        raise DTypeError(f"unsupported operand type(s): 'Tensor' and {type(x).__name__} {x!r} (an operand must be a "
                         "number, a Tensor or array-like numeric data)")
    arr = np.asarray(x)
    if arr.ndim == 0 and arr.dtype.kind in "biuf":
        return arr[()]
    if arr.dtype == np.float64 and not isinstance(x, np.ndarray):
        arr = arr.astype(np.float32)
    return _wrap(arr)


def to_tensor(x, like: Tensor) -> Tensor:
    """Coerce to a Tensor on ``like``'s device (scalars become 0-d arrays of a fitting dtype)."""
    if isinstance(x, Tensor):
        return x
    x = as_operand(x, like)
    if isinstance(x, Tensor):
        return x
    xp = like._xp()
    # Python scalars are "weak": they take the tensor's dtype where that loses nothing (as in PyTorch);
    # a Python float meeting an integer/bool tensor becomes the default float dtype.
    dtype = None
    kind = like.dtype.kind
    if isinstance(x, float):
        dtype = like.dtype if _is_floating(like.dtype, complex_ok=True) else get_default_dtype()
    elif isinstance(x, int) and not isinstance(x, bool) and (kind in "iu" or _is_floating(like.dtype, True)):
        dtype = like.dtype
        if kind in "iu" and not np.iinfo(dtype).min <= x <= np.iinfo(dtype).max:
            dtype = None
    return _wrap(xp.asarray(x, dtype=dtype))


_F64 = np.dtype(np.float64)


def weak_scalar_result(out, a, b):
    """``out = a.data (op) b``, Python scalar ``b``: integer/bool arrays give the default float (PyTorch), not f64."""
    if out.dtype is _F64 and a.data.dtype.kind in "biu" and type(b) in (int, float):
        return out.astype(get_default_dtype())
    return out


def fit(g: Tensor, meta) -> Tensor:
    """Reduce a broadcast gradient back to an input's ``meta`` = (shape, dtype) and cast it (None: g as it is)."""
    if meta is None:
        return g
    shape, dtype = meta
    if g.data.shape != shape:
        g = sum_to(g, shape)
    if g.data.dtype != dtype:
        g = g.astype(dtype)
    return g


class SumTo(Function):
    __slots__ = ("shape",)

    @staticmethod
    def backward(ctx, g):
        return (broadcast_to(g, ctx.shape),)


class BroadcastTo(Function):
    __slots__ = ("shape",)

    @staticmethod
    def backward(ctx, g):
        return (sum_to(g, ctx.shape),)


def _sum_to_array(x, shape):
    lead = x.ndim - len(shape)
    if lead < 0 or any(s not in (1, d) for s, d in zip(shape, x.shape[lead:])):
        raise ArgumentError(f"sum_to: a tensor of shape {tuple(x.shape)} does not broadcast from {tuple(shape)}")
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and x.shape[i + lead] != 1)
    y = x.sum(axis=axes, keepdims=True) if axes else x
    if lead:
        y = y.reshape(shape)
    return y


def sum_to(x: Tensor, shape) -> Tensor:
    """Sum ``x`` down to ``shape`` (the reverse of broadcasting)."""
    shape = tuple(shape)
    if x.data.shape == shape:
        return x
    out = _sum_to_array(x.data, shape)
    if needs_grad(x):
        n = SumTo.node(x)
        n.shape = x.data.shape
        return n.output(out)
    return _wrap(out)


def broadcast_to(x: Tensor, shape) -> Tensor:
    """A broadcast (read-only) view of ``x`` with ``shape``."""
    shape = tuple(shape)
    if x.data.shape == shape:
        return x
    xp = x._xp()
    try:
        out = xp.broadcast_to(x.data, shape)
    except ValueError:
        raise ArgumentError(f"broadcast_to: cannot broadcast a tensor of shape {tuple(x.shape)} to {shape}") from None
    if needs_grad(x):
        n = BroadcastTo.node(x)
        n.shape = x.data.shape
        return n.output(out)
    return _wrap(out)


def broadcast_error(op, a, b):
    sa = tuple(a.shape) if hasattr(a, "shape") else ()
    sb = tuple(b.shape) if hasattr(b, "shape") else ()
    return ArgumentError(f"{op}: shapes {sa} and {sb} cannot be broadcast together (trailing dimensions must be "
                         "equal or 1)")


def canonical_dim(op, dim, ndim, *, extra=0):
    """``dim`` in [0, ndim + extra) from PyTorch's range [-(ndim + extra), ndim + extra) (a 0-d tensor takes
    dims 0 and -1, as in PyTorch), or DimensionError naming the op, the range and the dim."""
    n = max(ndim + extra, 1)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise DimensionError(f"{op}: dim must be an int, got {dim!r} ({type(dim).__name__})")
    if not -n <= dim < n:
        raise DimensionError(f"{op}: Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got "
                             f"{dim})")
    return int(dim) % n


def canonical_dims(op, dims, ndim):
    """A tuple of distinct canonical dims, or DimensionError / ArgumentError (duplicates)."""
    out = tuple(canonical_dim(op, d, ndim) for d in dims)
    if len(set(out)) != len(out):
        raise ArgumentError(f"{op}: dims {tuple(dims)} has duplicates (dim {next(d for d in out if out.count(d) > 1)} "
                            "appears more than once)")
    return out


# ------------------------------------------------------------------------------------------------
# Type promotion, PyTorch's rule (docs/semantics.md has the table).  Operands fall into three groups:
# tensors with dims, 0-d tensors, and wrapped numbers (Python/NumPy scalars).  A lower group only
# decides the dtype when its category (bool < integer < floating < complex) is higher than every
# higher group's; wrapped floats count as the default float dtype, wrapped ints as int64.
# ------------------------------------------------------------------------------------------------
_BOOL = np.dtype(np.bool_)
_I64 = np.dtype(np.int64)
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)


def category(dt) -> int:
    """0 bool, 1 integer, 2 floating (bfloat16 included), 3 complex."""
    k = dt.kind
    if k == "b":
        return 0
    if k in "iu":
        return 1
    if k == "c":
        return 3
    return 2


def promote_types(a, b):
    """PyTorch's promote_types: a float beats any integer (float16 + int64 is float16); bfloat16 and float16 meet
    at float32; otherwise NumPy's lattice (uint8 + int8 = int16), which agrees with PyTorch's there."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    ca, cb = category(a), category(b)
    if ca != cb:
        hi, lo = (a, b) if ca > cb else (b, a)
        if category(hi) == 2:
            return hi
        if category(hi) == 3 and category(lo) == 2 and lo.itemsize > hi.itemsize // 2:
            return np.dtype(np.complex128)
        return hi if category(lo) < 1 or category(hi) == 3 else np.promote_types(a, b)
    if ca == 2 and (a.kind == "V" or b.kind == "V"):    # bfloat16 with another float
        other = b if a.kind == "V" else a
        return _F32 if other == _F16 else other
    return np.promote_types(a, b)


def scalar_dtype(v):
    """The dtype a wrapped number counts as: bool, int64, the default float dtype, complex64."""
    if isinstance(v, (bool, np.bool_)):
        return _BOOL
    if isinstance(v, (int, np.integer)):
        return _I64
    if isinstance(v, (float, np.floating)):
        return get_default_dtype()
    return np.dtype(np.complex64) if get_default_dtype() != _F64 else np.dtype(np.complex128)


def _combine(higher, lower):
    if higher is None:
        return lower
    if lower is None:
        return higher
    ch, cl = category(higher), category(lower)
    if ch == 3:
        return higher
    if cl == 3:
        return promote_types(higher, lower) if ch == 2 else lower
    if ch == 2:
        return higher
    if ch == 0 or cl == 2:
        return promote_types(higher, lower)
    return higher


def result_type(*operands):
    """The dtype PyTorch gives an op on ``operands`` (Tensors, Python/NumPy scalars)."""
    dim = zero = wrapped = None
    for o in operands:
        if isinstance(o, Tensor):
            if o.data.ndim:
                dim = promote_types(dim, o.data.dtype)
            else:
                zero = promote_types(zero, o.data.dtype)
        elif o is not None:
            wrapped = promote_types(wrapped, scalar_dtype(o))
    return _combine(dim, _combine(zero, wrapped))


def wide_reduce(fn, a, dtype=None, **kw):
    """fn(a, dtype=dtype, **kw); 16-bit floats summed in float32, rounded once (PyTorch; NumPy and CuPy did not)."""
    wide = a.dtype.itemsize == 2 and a.size > 1 and dtype in (None, a.dtype) and _is_floating(a.dtype)
    return fn(a, dtype=np.float32, **kw).astype(a.dtype) if wide else fn(a, dtype=dtype, **kw)


def cast_array(arr, dtype):
    return arr if arr.dtype == dtype else arr.astype(dtype)


def scalar_as(v, dtype, xp=np):
    """A wrapped number as an operand of ``dtype`` arithmetic: a Python scalar when NumPy keeps it weak and in
    range, else a 0-d array of ``dtype`` (integers wrap around, as PyTorch's cast does)."""
    if isinstance(v, np.generic):
        v = v.item()
    k = dtype.kind
    if k in "iu":
        if isinstance(v, bool) or not isinstance(v, int):
            return np.asarray(v).astype(dtype)[()]
        info = np.iinfo(dtype)
        if info.min <= v <= info.max:
            return v
        return np.asarray(v % (1 << (8 * dtype.itemsize))).astype(np.uint64).astype(dtype)[()] if v >= 0 or k == "u" \
            else np.asarray(v).astype(np.int64).astype(dtype)[()]
    if k == "b":
        return bool(v)
    if isinstance(v, complex) and k != "c":
        return v
    return v if isinstance(v, (bool, int, float)) else np.asarray(v, dtype=dtype)[()]


def promoted_operands(a, b, *, true_div=False):
    """(a_array, b_operand, dtype), both cast to PyTorch's result dtype (``true_div``: integers give default floats)."""
    bt = isinstance(b, Tensor)
    if bt and a.data.dtype == b.data.dtype:
        dt = a.data.dtype
        if true_div and category(dt) < 2:
            dt = get_default_dtype()
            return a.data.astype(dt), b.data.astype(dt), dt
        return a.data, b.data, dt
    dt = result_type(a, b)
    if true_div and category(dt) < 2:
        dt = get_default_dtype()
    ad = cast_array(a.data, dt)
    if bt:
        return ad, cast_array(b.data, dt), dt
    return ad, scalar_as(b, dt), dt


# ---- the guard of a backward computed on raw arrays (first order only) ------------------------------------
class _DoubleBackwardUnsupported(Function):
    """Stands for a backward computed on raw arrays: its outputs carry a graph node (so the failure
    is found) whose own backward raises, instead of silently returning a zero second derivative."""

    @staticmethod
    def forward(ctx, op, arrays, *depends):
        ctx.op = op
        return tuple(None if a is None else _wrap(a) for a in arrays)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"{ctx.op}: double backward (differentiating its gradient again, create_graph=True) is "
                           "not implemented (the minidnn.nn.functional docstring lists the first-order ops)")


def first_order_grads(op: str, arrays, *depends):
    """Tensors for the gradients ``arrays`` (raw arrays or None) a backward computed from ``depends``
    (the incoming gradients and saved tensors).  Under ``create_graph`` with any of ``depends``
    requiring grad, they are wired to a node that raises if differentiated again."""
    if _state.grad_enabled and any(isinstance(t, Tensor) and t.requires_grad for t in depends):
        out = _DoubleBackwardUnsupported.apply(op, tuple(arrays), *depends)
        return out if isinstance(out, tuple) else (out,)
    return tuple(None if a is None else _wrap(a) for a in arrays)


def fusion_rule(node, name):
    """The consumer-fusion rule ``name`` the op that recorded ``node`` offers, or None (docs/fusion.md): an
    ``apply``-made node names its Function in ``_fn_cls``; a built-in op's node is an instance of it."""
    return getattr(getattr(node, "_fn_cls", None) or type(node), name, None)
