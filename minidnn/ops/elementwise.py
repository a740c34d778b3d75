"""Elementwise ops with NumPy broadcasting.  Gradients are reduced back to each input's shape.

Every backward is written with differentiable Tensor ops (Mul's first order on the arrays), so ``create_graph=True``
gives higher-order gradients.  Unary ops are one table: forward on the array, backward as Tensor math.
"""
from __future__ import annotations

import operator

import numpy as np

from .._amp_state import autocast_op
from ..autograd import Function, _state
from ..backend.devices import is_floating as _is_floating
from ..backend.errors import ArgumentError, DTypeError
from ..backend.layout import in_memory_order
from ..backend.tensor_ops import device_binary
from ..tensor import Tensor, _wrap, get_default_dtype
from ._core import as_operand, broadcast_error, cast_array, check_pair, fit, fusion_rule, promoted_operands, to_tensor

__all__ = ["add", "sub", "mul", "div", "true_divide", "pow", "neg", "abs", "exp", "log", "sqrt", "sin", "cos",
           "maximum", "minimum", "clip", "clamp", "where", "sign", "square", "log1p",
           "expm1", "reciprocal", "rsub", "rdiv", "rpow", "eq", "ne", "lt", "le", "gt", "ge", "logical_not",
           "isfinite", "isnan", "floor", "ceil", "round", "floordiv", "remainder", "floor_divide", "bitwise_not",
           "fmod", "isclose", "allclose", "addcmul", "addcdiv", "lerp"]


# ------------------------------------------------------------------------------------------------
# Binary arithmetic: one Function per op, forward the Python operator on the two arrays (cast to PyTorch's result
# dtype; x + y works for NumPy and CuPy alike, and operator.* builtins are cheaper to call than a lambda on this hot
# path), backward summing each gradient back to its operand's shape and dtype.  A scalar operand is a constant:
# no edge, kept as is in ``scalar``.
# ------------------------------------------------------------------------------------------------
class Binary(Function):
    __slots__ = ("a_meta", "b_meta", "scalar")     # (shape, dtype) to fit each gradient to (None: the result's)
    op_name = None

    def operands(ctx):
        """The saved (a, b) for backward: b is the Python/NumPy scalar itself when it was one."""
        saved = ctx.saved_tensors_checked()
        return saved if len(saved) == 2 else (saved[0], ctx.scalar)


def _binary(cls, name=None, true_div=False):
    """The Tensor function of ``cls``: a (Tensor) op b (Tensor or scalar), both cast to PyTorch's result dtype
    (``true_div``: integers give the default float dtype), recorded by a ``cls`` node when a gradient is needed."""
    forward, new_node, output, gpu_forward = cls.forward, cls.node, Function.output, device_binary(cls.forward)
    name, speculate = name or cls.op_name, getattr(cls, "speculate", None)

    def op(a, b):
        if not isinstance(a, Tensor):      # scalar op tensor: handled by the reflected operators
            raise DTypeError(f"{name}: the first operand must be a Tensor")
        if isinstance(b, Tensor):
            ad, bd = a.data, b.data
            if type(ad) is not np.ndarray or type(bd) is not np.ndarray:       # (two NumPy arrays: both on the cpu)
                check_pair(name, a, b)
            promoted = ad.dtype != bd.dtype or true_div
            if promoted:
                ad, bd, _ = promoted_operands(a, b, true_div=true_div)
            twin = None if speculate is None or type(ad) is np.ndarray else speculate(a, b, ad, bd)
            try:       # (NumPy keeps its inputs' memory order by itself; CuPy arrays: tensor_ops.device_binary)
                out = forward(ad, bd) if type(ad) is np.ndarray else gpu_forward(ad, bd) if twin is None else twin[1]
            except ValueError:
                raise broadcast_error(name, a, b) from None
            if _state.grad_enabled and (a.requires_grad or b.requires_grad):
                ctx = new_node(a, b)
                if twin is not None:
                    ctx.twin = twin
                if promoted or ad.shape != bd.shape:
                    ctx.a_meta = (ad.shape, a.data.dtype)
                    ctx.b_meta = (bd.shape, b.data.dtype)
                else:       # same shape and dtype as the result: backward's gradients need no fitting
                    ctx.a_meta = ctx.b_meta = None
                return output(ctx, out)
            return _wrap(out)
        b = as_operand(b, a)
        if isinstance(b, Tensor):
            return op(a, b)
        ad, bs, dt = promoted_operands(a, b, true_div=true_div)
        out = cast_array(forward(ad, bs), dt)       # (NumPy widens bfloat16 by a Python float; PyTorch keeps it)
        if _state.grad_enabled and a.requires_grad:
            ctx = new_node(a, None)
            ctx.a_meta, ctx.b_meta = (a.data.shape, a.data.dtype), None
            ctx.scalar = b      # a scalar needs no Tensor wrapper (nor a version check): backward uses it directly
            return output(ctx, out)
        return _wrap(out)
    op.__name__ = name
    op.__doc__ = cls.__doc__
    return op


class Add(Binary):
    """a + b elementwise with broadcasting; d/da = d/db = g."""
    __slots__ = ("twin",)       # speculate's (relu(a + b), a + b, ...) for the consumer fusion below
    forward, op_name = staticmethod(operator.add), "add"

    @staticmethod
    def speculate(a, b, ad, bd):
        """Before the GPU launch: (relu(a + b), a + b, ...) from one launch where the first operand whose producer
        offers ``add_relu_twin`` (training batch norm: its ReLU of the sum seen before) says so (docs/fusion.md)."""
        for t in (a, b):
            if (n := t.grad_fn) is not None and (rule := fusion_rule(n, "add_relu_twin")) is not None:
                return rule(n, t, ad, bd)
        return None

    @staticmethod
    def backward(ctx, g):
        return (fit(g, ctx.a_meta) if ctx.next_edges[0] else None,
                fit(g, ctx.b_meta) if ctx.next_edges[1] else None)

    @staticmethod
    def fuse_relu(ctx, out):
        """Consumer fusion (docs/fusion.md): relu(y + z) where the op that made y (an operand of the same shape and
        dtype as z: no broadcasting) offers a ``fuse_add_relu`` rule -- training batch norm -- recorded by that rule
        as one node; None runs the plain ReLU."""
        if ctx.a_meta is not None or ctx.pre_hooks:     # meta None: two tensors of the result's shape and dtype
            return None
        e0, e1 = ctx.next_edges
        for mine, other in ((e0, e1), (e1, e0)):
            if mine is not None and mine[1] == 0:
                rule = fusion_rule(mine[0], "fuse_add_relu")
                fused = rule(mine[0], out, other) if rule is not None else None
                if fused is not None:
                    return fused
        return None


class Sub(Binary):
    """a - b elementwise with broadcasting (torch.sub without ``alpha``).  ``a`` must be a Tensor; ``b`` a Tensor or a
    Python/NumPy scalar (a constant, no gradient).  The result has PyTorch's promoted dtype (a Python float keeps a
    float tensor's dtype: scalars are weak); gradients are summed back to each operand's shape."""
    __slots__ = ()
    forward, op_name = staticmethod(operator.sub), "sub"

    @staticmethod
    def backward(ctx, g):
        return (fit(g, ctx.a_meta) if ctx.next_edges[0] else None,
                fit(-g, ctx.b_meta) if ctx.next_edges[1] else None)


class Mul(Binary):
    """a * b elementwise with broadcasting (torch.mul).  ``a`` must be a Tensor; ``b`` a Tensor or a scalar (a
    constant).  PyTorch's promoted result dtype (scalars are weak); d/da = g * b, d/db = g * a, summed back to each
    operand's shape (differentiable again)."""
    __slots__ = ()
    forward, op_name, retain_inputs = staticmethod(operator.mul), "mul", True

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.operands()
        return (fit(_times(g, b), ctx.a_meta) if ctx.next_edges[0] else None,
                fit(_times(g, a), ctx.b_meta) if ctx.next_edges[1] else None)


def _times(g, x):   # g * x in a backward: first order, one dtype (or a weak Python float): the arrays' product
    gd, xd = g.data, (x.data if isinstance(x, Tensor) else x)
    if _state.grad_enabled or not (type(xd) is float or (type(xd) is type(gd) and xd.dtype == gd.dtype)):
        return g * x        # create_graph, mixed dtypes: the Tensor op (differentiable, PyTorch's promotion)
    return _wrap(gd * xd if type(gd) is np.ndarray else in_memory_order(operator.mul, gd, xd))


class Div(Binary):
    """True division a / b; integers give the default float dtype."""
    __slots__ = ()
    forward, op_name, retain_inputs = staticmethod(operator.truediv), "div", True

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.operands()
        # PyTorch's formulas (div_tensor_self/other_backward): g / b and -(g * (a / b / b)), staged so that
        # a / b**2 neither overflows nor underflows at half the exponent range, and rounded as PyTorch rounds
        return (fit(g / b, ctx.a_meta) if ctx.next_edges[0] else None,
                fit(-(g * (a / b / b)), ctx.b_meta) if ctx.next_edges[1] else None)


class Pow(Binary):
    """a ** b for a tensor exponent b."""
    __slots__ = ()
    forward, op_name, retain_inputs = staticmethod(operator.pow), "pow", True

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.operands()
        ga = gb = None
        bd = b.detach() if isinstance(b, Tensor) else b
        if ctx.next_edges[0]:
            # PyTorch: 0 where the exponent is 0 (so d(x**0)/dx = 0 at x = 0, not 0 * inf)
            ga = fit(where(bd == 0, 0.0, g * b * a ** (b - 1)), ctx.a_meta)
        if ctx.next_edges[1]:
            # d(a^b)/db = a^b log a; defined as 0 where a == 0 and b >= 0, as in PyTorch.
            ad = a.detach()
            zero = (ad == 0) & (bd >= 0)
            gb = fit(where(zero, 0.0, g * a ** b * log(where(zero, 1.0, a))), ctx.b_meta)
        return ga, gb


_add = _binary(Add)
sub = _binary(Sub)
mul = _binary(Mul)
_true_div = _binary(Div, true_div=True)
_pow = _binary(Pow)


def div(a, b, *, rounding_mode=None):
    """True division (integers give the default float dtype); rounding_mode 'floor' or 'trunc' as PyTorch."""
    if rounding_mode is None:
        return _true_div(a, b)
    if rounding_mode == "floor":
        return floordiv(a, b)
    if rounding_mode == "trunc":
        q = div(a, b)
        out = _wrap(q._xp().trunc(q.data))
        rt = result_of(a, b)
        return out.astype(rt) if out.dtype != rt else out
    raise ArgumentError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                        f"'{rounding_mode}'")


true_divide = div


def result_of(a, b):
    from ._core import result_type
    return result_type(a, b if isinstance(b, Tensor) else as_operand(b, a))


def add(a, b, alpha=1):  # (PyTorch's signature, alpha scales b)
    """a + alpha * b elementwise with broadcasting (torch.add's signature; alpha scales b). ``a`` must be a Tensor,
    ``b`` a Tensor or a scalar (a constant); PyTorch's promoted result dtype (scalars are weak); gradients are summed
    back to each operand's shape."""
    return _add(a, b if alpha == 1 else b * alpha)


@autocast_op("pow")
def pow(a, b):
    """a ** b elementwise (torch.pow). A Python-number exponent takes the scalar path: its gradient p * a**(p-1) is
    exactly 0 for p = 0 and 0.5 / sqrt(a) for p = 0.5 (PyTorch's special cases); an integer tensor to a negative integer
    power raises ArgumentError. A tensor exponent broadcasts and gets the gradient a**b * log(a). Under autocast it runs
    in autocast's pow policy dtype."""
    if not isinstance(b, Tensor) and not isinstance(b, (int, float)):
        b = as_operand(b, a)
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        return _scalar_pow(a, b)
    return _pow(a, b)


class ScalarPow(Function):
    """a ** p for a Python number p, with PyTorch's special cases of the gradient p * a**(p - 1)."""
    __slots__ = ("p",)
    retain_inputs = True

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        p = ctx.p
        if p == 2:
            return (g * a * 2.0,)
        if p == 0:                      # PyTorch: exactly 0 (not 0 * x**-1, NaN at 0)
            return (_wrap(a._xp().zeros(a.shape, dtype=g.dtype)),)
        if p == 0.5:                    # PyTorch's x**0.5 is sqrt: 0.5 * rsqrt(x) (-inf at -0, as there)
            return (g * (0.5 * reciprocal(sqrt(a))),)
        return (g * p * a ** (p - 1),)


def _scalar_pow(a, p):
    if isinstance(p, int) and p < 0 and a.dtype.kind in "iu":
        raise ArgumentError(f"pow: Integers to negative integer powers are not allowed (an {a.dtype} tensor to the "
                            f"power {p}; use a floating tensor)")
    ad, ps, dt = promoted_operands(a, p)
    out = cast_array(ad ** ps, dt)
    if _state.grad_enabled and a.requires_grad:
        ctx = ScalarPow.node(a)
        ctx.p = p
        return ctx.output(out)
    return _wrap(out)


def rsub(a, b):
    """b - a for a scalar or array b."""
    return neg(a) + b if not isinstance(b, Tensor) else sub(b, a)


def rdiv(a, b):
    """b / a."""
    if isinstance(b, Tensor):
        return div(b, a)
    if a.dtype.kind in "biu":       # 1 / int_array would be float64: keep the default float dtype
        a = a.astype(get_default_dtype())
    return reciprocal(a) * b


def rpow(a, b):
    """b ** a for a scalar b."""
    if isinstance(b, float) and a.dtype.kind in "biu":     # 2.5 ** int_tensor: the default float dtype
        a = a.astype(get_default_dtype())
    return pow(to_tensor(b, a), a)


# ------------------------------------------------------------------------------------------------
# Unary ops: one table of Functions, (forward on arrays, backward as Tensor math, what backward reads).
# backward(g, x, y) gets the input x (saved: "x") and the output y ("y": kept as an array, re-attached to
# this node under create_graph so the second derivative flows through it) as Tensors.
# ------------------------------------------------------------------------------------------------
class Unary(Function):
    __slots__ = ("out",)

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors_checked()
        x = saved[0] if saved else None
        y = None
        if ctx.out is not None:
            y = ctx.output(ctx.out) if _state.grad_enabled else _wrap(ctx.out)
        return (ctx.grad(g, x, y),)

    def release(self):
        if self.saved or self.out is not None:
            self.saved = None
            self.out = None


def _table(**rows):
    return {kind: type(kind.capitalize(), (Unary,), {
        "__slots__": (), "__module__": __name__, "forward": staticmethod(fwd), "grad": staticmethod(grad),
        "keeps_output": needs == "y", "retain_inputs": needs == "x"}) for kind, (fwd, grad, needs) in rows.items()}


UNARY = _table(
    neg=(lambda xp, x: -x, lambda g, x, y: -g, ""),
    exp=(lambda xp, x: xp.exp(x), lambda g, x, y: g * y, "y"),
    log=(lambda xp, x: xp.log(x), lambda g, x, y: g / x, "x"),
    sqrt=(lambda xp, x: xp.sqrt(x), lambda g, x, y: g / (y * 2.0), "y"),
    sin=(lambda xp, x: xp.sin(x), lambda g, x, y: g * cos(x), "x"),
    cos=(lambda xp, x: xp.cos(x), lambda g, x, y: -g * sin(x), "x"),
    relu=(lambda xp, x: xp.maximum(x, 0).astype(x.dtype, copy=False),
          lambda g, x, y: g * _wrap(~(y.data <= 0)).astype(g.dtype), "y"),      # NaN passes, as in PyTorch
    abs=(lambda xp, x: xp.abs(x), lambda g, x, y: g * sign(x), "x"),
    square=(lambda xp, x: x * x, lambda g, x, y: g * x * 2.0, "x"),
    log1p=(lambda xp, x: xp.log1p(x), lambda g, x, y: g / (x + 1.0), "x"),
    expm1=(lambda xp, x: xp.expm1(x), lambda g, x, y: g * (y + 1.0), "y"),
    reciprocal=(lambda xp, x: 1 / x, lambda g, x, y: -g * y * y, "y"),
)


def _unary(kind, doc):
    cls = UNARY[kind]
    forward, keeps_output, new_node, output = cls.forward, cls.keeps_output, cls.node, Function.output

    def op(x):
        if not isinstance(x, Tensor):
            raise DTypeError(f"{kind}: expected a Tensor, got {type(x).__name__}")
        xd = x.data
        if type(xd) is np.ndarray:
            out = forward(np, xd)
        else:
            xp = x._xp()
            out = in_memory_order(lambda v: forward(xp, v), xd)
        if _state.grad_enabled and x.requires_grad:
            ctx = new_node(x)
            ctx.out = out if keeps_output else None
            return output(ctx, out)
        return _wrap(out)
    op.__name__ = kind
    op.__doc__ = doc + (" Differentiable; its backward is written in Tensor ops, so it can be differentiated "
                        "again." if kind != "relu" else "")
    return op


neg = _unary("neg", "-x elementwise (torch.neg); integer tensors stay integer.")
exp = _unary("exp", "e**x elementwise (torch.exp); overflows to inf (float32 beyond x ~ 88.7); gradient g * exp(x).")
log = _unary("log", "Natural logarithm elementwise (torch.log): log(0) = -inf, NaN for negative x; gradient g / x.")
sqrt = _unary("sqrt", "Square root elementwise (torch.sqrt): NaN for negative x; gradient g / (2 sqrt(x)), inf at 0.")
sin = _unary("sin", "Sine elementwise, x in radians (torch.sin); gradient g * cos(x).")
cos = _unary("cos", "Cosine elementwise, x in radians (torch.cos); gradient -g * sin(x).")
relu = _unary("relu", "max(x, 0) on the array, the form used for integer tensors (integers stay integers, no gradient "
              "is recorded for them); the differentiable op is ops/activation.py's relu, which minidnn.relu, "
              "Tensor.relu and F.relu call.")
abs = _unary("abs", "|x| elementwise (torch.abs); gradient g * sign(x), so 0 at x = 0 as in PyTorch.")
square = _unary("square", "x * x elementwise (torch.square); gradient 2 g x.")
log1p = _unary("log1p", "log(1 + x) elementwise, accurate for small |x| (torch.log1p); -inf at x = -1, NaN below.")
expm1 = _unary("expm1", "exp(x) - 1 elementwise, accurate for small |x| (torch.expm1); gradient g * (expm1(x) + 1).")
reciprocal = _unary("reciprocal", "1 / x elementwise (torch.reciprocal): +-inf at +-0; gradient -g / x**2.")


# ------------------------------------------------------------------------------------------------
# Selection ops: gradient routed by a mask (maximum/minimum split ties evenly, as PyTorch does).
# ------------------------------------------------------------------------------------------------
class Where(Function):
    __slots__ = ("cond", "a_meta", "b_meta")

    @staticmethod
    def backward(ctx, g):
        zero = g * 0.0 if _state.grad_enabled else None
        c = ctx.cond
        ga = fit(where(c, g, 0.0 if zero is None else zero), ctx.a_meta) if ctx.next_edges[0] else None
        gb = fit(where(c, 0.0 if zero is None else zero, g), ctx.b_meta) if ctx.next_edges[1] else None
        return ga, gb


def where(condition, a, b):
    """Elements of ``a`` where ``condition`` holds, else of ``b`` (a, b tensors or scalars)."""
    like = next((t for t in (condition, a, b) if isinstance(t, Tensor)), None)
    cond = condition.data if isinstance(condition, Tensor) else np.asarray(condition)
    xp = like._xp() if like is not None else np
    ta = a if isinstance(a, Tensor) else None
    tb = b if isinstance(b, Tensor) else None
    for t in (ta, tb):
        if t is not None and isinstance(condition, Tensor):
            check_pair("where", condition, t)
    if ta is not None and tb is not None:
        check_pair("where", ta, tb)
    av = ta.data if ta is not None else a
    bv = tb.data if tb is not None else b
    if ta is None and tb is not None and isinstance(a, float) and _is_floating(tb.dtype):
        av = xp.asarray(a, dtype=tb.dtype)
    if tb is None and ta is not None and isinstance(b, float) and _is_floating(ta.dtype):
        bv = xp.asarray(b, dtype=ta.dtype)
    try:
        out = xp.where(cond, av, bv)
    except ValueError:
        raise broadcast_error("where", a, b) from None
    ra = ta is not None and ta.requires_grad
    rb = tb is not None and tb.requires_grad
    if _state.grad_enabled and (ra or rb):
        n = Where.node(ta, tb)
        n.cond = _wrap(cond if hasattr(cond, "dtype") and cond.dtype == bool else cond.astype(bool))
        n.a_meta = (ta.data.shape, ta.data.dtype) if ta is not None else None
        n.b_meta = (tb.data.shape, tb.data.dtype) if tb is not None else None
        return n.output(out)
    return _wrap(out)


class Select(Function):
    """maximum/minimum: the gradient goes to the winner, half to each on a tie, and to both where either is NaN
    (PyTorch's masks: an operand gets 0 only where it strictly loses, so an infinite operand never meets a 0 weight)."""
    __slots__ = ("wa", "wb", "a_meta", "b_meta")

    @staticmethod
    def backward(ctx, g):
        ga = fit(g * ctx.wa, ctx.a_meta) if ctx.next_edges[0] else None
        gb = fit(g * ctx.wb, ctx.b_meta) if ctx.next_edges[1] else None
        return ga, gb


def _select(a, b, wins, name):
    if not isinstance(a, Tensor):
        raise DTypeError(f"{name}: expected a Tensor as the first operand, got {type(a).__name__}")
    b_t = to_tensor(b, a) if not isinstance(b, Tensor) else b
    check_pair(name, a, b_t)
    ad, bd, dt = promoted_operands(a, b_t)
    xp = a._xp()
    try:
        out = xp.maximum(ad, bd) if name == "maximum" else xp.minimum(ad, bd)
    except ValueError:
        raise broadcast_error(name, a, b_t) from None
    if not (_state.grad_enabled and (a.requires_grad or b_t.requires_grad)):
        return _wrap(out)
    # Weight 1/2 on ties, else 1, and 0 only where the operand strictly loses (NaN compares false: both get g).
    half = xp.where(ad == bd, dt.type(0.5), dt.type(1))
    wa = half * ~wins(bd, ad)
    wb = half * ~wins(ad, bd)
    n = Select.node(a, b_t)
    n.wa = _wrap(xp.broadcast_to(wa, out.shape) if wa.shape != out.shape else wa)
    n.wb = _wrap(xp.broadcast_to(wb, out.shape) if wb.shape != out.shape else wb)
    n.a_meta = (a.data.shape, a.data.dtype)
    n.b_meta = (b_t.data.shape, b_t.data.dtype)
    return n.output(out)


def maximum(a, b):
    """The elementwise maximum of a and b with broadcasting (torch.maximum; b may be a scalar); NaN propagates. The
    gradient goes to the larger operand, split half-half on ties (PyTorch's rule)."""
    return _select(a, b, lambda x, y: x > y, "maximum")


def minimum(a, b):
    """The elementwise minimum of a and b with broadcasting (torch.minimum; b may be a scalar); NaN propagates. The
    gradient goes to the smaller operand, split half-half on ties (PyTorch's rule)."""
    return _select(a, b, lambda x, y: x < y, "minimum")


class Clip(Function):
    """PyTorch's clamp gradients.  x: where min <= x <= max (NaN gets 0).  Tensor bounds (both given): min gets
    it where x < min < max, max where x > max or max < min (max wins a crossed pair); one bound alone gets it
    where x is beyond it."""
    __slots__ = ("mask", "lo_mask", "hi_mask", "x_meta", "lo_meta", "hi_meta")

    @staticmethod
    def backward(ctx, g):
        gx = fit(g * ctx.mask, ctx.x_meta) if ctx.next_edges[0] else None
        glo = fit(g * ctx.lo_mask, ctx.lo_meta) if ctx.next_edges[1] else None
        ghi = fit(g * ctx.hi_mask, ctx.hi_meta) if ctx.next_edges[2] else None
        return gx, glo, ghi


def clip(x, min=None, max=None):
    """Clamp to [min, max] (numbers or tensors); the gradient passes where min <= x <= max (PyTorch's rule),
    and tensor bounds get theirs where they are the answer (see Clip)."""
    if min is None and max is None:
        raise ArgumentError("clip: at least one of min and max must be given")
    lo_t = min if isinstance(min, Tensor) else None
    hi_t = max if isinstance(max, Tensor) else None
    for t in (lo_t, hi_t):
        if t is not None:
            check_pair("clamp", x, t)
    lo = min.data if lo_t is not None else min
    hi = max.data if hi_t is not None else max
    xd = x.data
    xp = x._xp()
    out = xd
    try:
        if lo is not None:
            out = xp.maximum(out, lo)
        if hi is not None:
            out = xp.minimum(out, hi)
    except ValueError:
        raise broadcast_error("clamp", x, lo_t if lo_t is not None else hi_t) from None
    out = out.astype(xd.dtype, copy=False)
    need_lo = lo_t is not None and lo_t.requires_grad
    need_hi = hi_t is not None and hi_t.requires_grad
    if _state.grad_enabled and (x.requires_grad or need_lo or need_hi):
        shape = out.shape
        mask = xp.ones(shape, dtype=bool)
        if lo is not None:
            mask &= xd >= lo
        if hi is not None:
            mask &= xd <= hi
        n = Clip.node_of(x, lo_t, hi_t)
        n.mask = _wrap(mask.astype(xd.dtype))
        n.x_meta = (xd.shape, xd.dtype)
        n.lo_mask = n.hi_mask = n.lo_meta = n.hi_meta = None
        if need_lo:
            m = (xd < lo) & (lo < hi) if hi is not None else (xd < lo)
            n.lo_mask = _wrap(xp.broadcast_to(m, shape).astype(xd.dtype))
            n.lo_meta = (lo_t.data.shape, lo_t.data.dtype)
        if need_hi:
            m = (xd > hi) | (hi < lo) if lo is not None else (xd > hi)
            n.hi_mask = _wrap(xp.broadcast_to(m, shape).astype(xd.dtype))
            n.hi_meta = (hi_t.data.shape, hi_t.data.dtype)
        return n.output(out)
    return _wrap(out)


clamp = clip


# ------------------------------------------------------------------------------------------------
# Non-differentiable ops: comparisons and rounding return tensors without history.
# ------------------------------------------------------------------------------------------------
def _nondiff(name, fn, doc):
    def op(a, b=None):
        if b is None:
            return _wrap(fn(a.data))
        if isinstance(b, Tensor):
            check_pair(name, a, b)
        else:
            b = as_operand(b, a)
        ad, bd, dt = promoted_operands(a, b)      # compared/divided in PyTorch's result dtype (bool: compared)
        try:
            return _wrap(out if (out := fn(ad, bd)).dtype == bool else cast_array(out, dt))
        except ValueError:
            raise broadcast_error(name, a, b) from None
    op.__name__ = name
    op.__doc__ = doc + " Not differentiable: the result carries no graph."
    return op


_CMP = (" elementwise with broadcasting, compared in PyTorch's promoted dtype of a and b (a Tensor, b a Tensor or "
        "scalar); a bool tensor (torch.{}); ")
eq = _nondiff("eq", lambda x, y: x == y, "a == b" + _CMP.format("eq") + "NaN equals nothing.")
ne = _nondiff("ne", lambda x, y: x != y, "a != b" + _CMP.format("ne") + "NaN differs from everything.")
lt = _nondiff("lt", lambda x, y: x < y, "a < b" + _CMP.format("lt") + "False wherever a NaN is involved.")
le = _nondiff("le", lambda x, y: x <= y, "a <= b" + _CMP.format("le") + "False wherever a NaN is involved.")
gt = _nondiff("gt", lambda x, y: x > y, "a > b" + _CMP.format("gt") + "False wherever a NaN is involved.")
ge = _nondiff("ge", lambda x, y: x >= y, "a >= b" + _CMP.format("ge") + "False wherever a NaN is involved.")
floordiv = floor_divide = _nondiff("floordiv", lambda x, y: x // y,
                                   "floor(a / b) elementwise with broadcasting (torch.floor_divide, Python's //), in "
                                   "PyTorch's promoted dtype; integer division by zero follows NumPy (0, with a "
                                   "warning) where PyTorch raises.")
_remainder = _nondiff("remainder", lambda x, y: x % y, 'a % b, the array form behind remainder().')
_fmod = _nondiff("fmod", lambda x, y: np.fmod(x, y), "C's fmod(a, b), the array form behind fmod().")


class Remainder(Function):
    __slots__ = ("q", "a_meta", "b_meta")

    @staticmethod
    def backward(ctx, g):
        ga = fit(g, ctx.a_meta) if ctx.next_edges[0] else None
        gb = fit(-g * ctx.q, ctx.b_meta) if ctx.next_edges[1] else None
        return ga, gb


def remainder(a, b):
    """Python's modulo (the sign of the divisor), in PyTorch's result dtype (int % float is the default float);
    differentiable as in PyTorch: d/da = 1, d/db = -floor(a / b)."""
    out = _remainder(a, b)
    bt = b if isinstance(b, Tensor) else None
    if _state.grad_enabled and (a.requires_grad or (bt is not None and bt.requires_grad)):
        n = Remainder.node(a, bt)
        n.q = _wrap(floordiv(a, b).data)
        n.a_meta = (a.data.shape, a.data.dtype)
        n.b_meta = (bt.data.shape, bt.data.dtype) if bt is not None else None
        return n.output(out.data)
    return out


def fmod(a, b):
    """C's fmod (the sign of the dividend)."""
    return _fmod(a, b)


def bitwise_not(x):
    """``~x``: bitwise not of an integer tensor, logical not of a bool tensor (PyTorch's rule)."""
    if x.dtype.kind in "biu":
        return _wrap(~x.data)
    raise DTypeError(f"bitwise_not: only integer and bool tensors are supported, got {x.dtype}")
sign = _nondiff("sign", lambda x: (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype),
                "-1, 0 or +1 by the sign of x, in x's dtype (torch.sign); 0 at +-0 and at NaN, as in PyTorch.")
logical_not = _nondiff("logical_not", lambda x: ~x.astype(bool),
                       'Elementwise not of x taken as bool (nonzero is True), a bool tensor (torch.logical_not).')
# NumPy ufuncs dispatch to CuPy for CuPy arrays (__array_ufunc__), so one spelling serves both.
isfinite = _nondiff("isfinite", np.isfinite,
                    'True where x is neither inf, -inf nor NaN (torch.isfinite); a bool tensor.')
isnan = _nondiff("isnan", np.isnan, 'True where x is NaN (torch.isnan); a bool tensor.')
floor = _nondiff("floor", np.floor, "The largest integer <= x elementwise, in x's dtype (torch.floor).")
ceil = _nondiff("ceil", np.ceil, "The smallest integer >= x elementwise, in x's dtype (torch.ceil).")
round = _nondiff("round", np.round,
                 "x rounded to the nearest integer elementwise, halves to even as in PyTorch (round(0.5) = 0, "
                 "round(1.5) = 2), in x's dtype (torch.round without ``decimals``).")


# ------------------------------------------------------------------------------------------------
# Composite ops with PyTorch's signatures.
# ------------------------------------------------------------------------------------------------
def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """|input - other| <= atol + rtol * |other| elementwise (equal infinities are close; NaN only with
    ``equal_nan``); compared in the promoted dtype."""
    if not isinstance(other, Tensor):
        other = to_tensor(other, input)
    check_pair("isclose", input, other)
    if input.dtype != other.dtype:
        raise DTypeError(f"isclose: {input.dtype} did not match {other.dtype} (PyTorch compares tensors of one "
                         "dtype)")
    ad, bd, dt = promoted_operands(input, other)
    xp = input._xp()
    try:
        if dt.kind in "biu":
            ad, bd = ad.astype(np.float64), bd.astype(np.float64)
        return _wrap(xp.isclose(ad, bd, rtol=rtol, atol=atol, equal_nan=equal_nan))
    except ValueError:
        raise broadcast_error("isclose", input, other) from None


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    """True if every element of ``isclose(input, other, rtol, atol, equal_nan)`` holds, i.e. |input - other| <= atol +
    rtol * |other| everywhere (torch.allclose); a Python bool."""
    return bool(isclose(input, other, rtol, atol, equal_nan).data.all())


def addcmul(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 * tensor2."""
    prod = mul(tensor1, tensor2)
    return add(input, prod if value == 1 else prod * value)


def addcdiv(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 / tensor2 (integer tensor1 / tensor2 is refused, as in PyTorch)."""
    if tensor1.dtype.kind in "biu" and tensor2.dtype.kind in "biu":
        raise DTypeError("addcdiv: integer division with addcdiv is no longer supported (tensor1 and tensor2 are "
                         f"{tensor1.dtype} and {tensor2.dtype})")
    q = div(tensor1, tensor2)
    return add(input, q if value == 1 else q * value)


def lerp(input, end, weight):
    """input + weight * (end - input) (weight a number or a tensor)."""
    if not isinstance(end, Tensor):
        raise DTypeError(f"lerp: end must be a Tensor, got {type(end).__name__}")
    if end.dtype != input.dtype:
        raise DTypeError(f"lerp: expected dtype {input.dtype} for `end` but got dtype {end.dtype}")
    return add(input, mul(sub(end, input), weight) if isinstance(weight, Tensor) else sub(end, input) * weight)
