"""Losses, one_hot and pad.

# cross_entropy / nll_loss:  input (N, C, d1, ...) or (N, C) or unbatched (C,)
#                            target: class indices (N, d1, ...) (int)  or  class probabilities shaped like input
# the other losses:          input and target of one shape; reduction 'none' keeps it

cross_entropy is ONE fused Function: forward = log-softmax primitive + a weighted sum; backward =
(softmax * sum_c(q) - q) * scale, where q (N, C, ...) holds each element's target weights:
    class indices:        q = (1 - eps) * w[t] * onehot(t) + eps / C * w     (0 where t == ignore_index)
    class probabilities:  q = w * ((1 - eps) * t + eps / C)
(without weights and smoothing that is the familiar softmax - onehot).  The 'mean' denominator is
PyTorch's: the sum of w[t] over non-ignored elements for class indices, the number of elements
(N * d1 * ...) for probabilities.  It is first order only.

The other losses have no backend primitive: they are compositions of differentiable Tensor ops
(so they have gradients of any order).  nll_loss is linear in its input: -(input * q).sum(1) with
the same q as cross_entropy's (eps = 0).
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from ... import _amp_state as _amp
from ... import backend as B
from ..._amp_state import autocast_op
from ...autograd import Function
from ...autograd import _state as _ag_state
from ...backend._common import SeenCalls
from ...backend.devices import is_floating as _is_floating
from ...backend.errors import ArgumentError, DimensionError, DTypeError
from ...ops import where
from ...ops.linalg import transfer
from ...tensor import Tensor
from ._util import apply_seen, check_tensor, check_vector, composite_grads, creating_graph, handle_for, wrap

__all__ = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "one_hot"]

_REDUCTIONS = ("none", "mean", "sum")


def _reduction(op, size_average, reduce, reduction):
    """PyTorch's legacy size_average / reduce flags, mapped onto ``reduction`` (with its warning)."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        reduction = "none" if not reduce else ("mean" if size_average else "sum")
        warnings.warn("size_average and reduce args will be deprecated, please use reduction='"
                      f"{reduction}' instead.", stacklevel=3)
    if reduction not in _REDUCTIONS:
        raise ArgumentError(f"{op}: reduction={reduction!r} is not a valid value; expected 'none', 'mean' or 'sum'")
    return reduction


def _reduce(loss, reduction):
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss


# ---- class-index targets: the weights q of every (element, class) ---------------------------------------

def _check_class_targets(op, x, target, ignore_index, valid=None):
    """PyTorch's errors for class-index targets: dtype, shape, and (host arrays only: on a GPU it is a device-side
    assert in PyTorch, and a host read here would be a synchronisation in every step) an index out of range."""
    n, c = x.shape[0], x.shape[1]
    if target.dtype.kind not in "iu":
        raise DTypeError(f"{op}: target has dtype {target.dtype}; class indices must be integers (or pass "
                        f"class probabilities of the input's shape {tuple(x.shape)})")
    if tuple(target.shape) != (n,) + tuple(x.shape[2:]):
        raise ArgumentError(f"{op}: input {tuple(x.shape)} expects a target of shape {(n,) + tuple(x.shape[2:])}, got "
                         f"{tuple(target.shape)}")
    t = target.data
    if type(t) is np.ndarray:
        bad = (t != ignore_index if valid is None else valid) & ((t < 0) | (t >= c))
        if bool(bad.any()):
            raise DimensionError(f"{op}: Target {int(t[bad].reshape(-1)[0])} is out of bounds for {c} classes "
                                 f"(valid: 0..{c - 1}, or ignore_index={ignore_index})")


def _class_targets(op, x, target, weight, ignore_index):
    """For input (N, C, *d) and int target (N, *d): (q, valid, denominator) where q (N, C, *d) is
    w[t] * onehot(t) (zero where ignored) and denominator = sum of w[t] over valid elements."""
    c = x.shape[1]
    xp = x._xp()
    t = target.data
    valid = t != ignore_index
    _check_class_targets(op, x, target, ignore_index, valid)
    t = xp.where(valid, t, 0)
    classes = xp.arange(c).reshape((1, c) + (1,) * (x.ndim - 2))
    q = (xp.expand_dims(t, 1) == classes) & xp.expand_dims(valid, 1)
    q = q.astype(x.dtype)
    if weight is None:
        return q, valid, valid.sum().astype(x.dtype)
    w = weight.data
    q *= w.reshape(classes.shape)
    return q, valid, (w[t] * valid).sum()


def _check_weight(op, weight, c, x, widen=False):
    check_vector(op, "weight", weight, c, x, what="classes", of="the input", same_dtype=not widen)


def _unbatched(x, target, class_indices):
    """PyTorch accepts input (C,) with a 0-d target (or (C,) probabilities)."""
    if x.ndim == 1:
        return x.unsqueeze(0), (target.reshape(1) if class_indices else target.unsqueeze(0)), True
    return x, target, False


class CrossEntropy(Function):
    @staticmethod
    def forward(ctx, logits, target, weight, ignore_index, reduction, label_smoothing, widen=False):
        ctx.fused = None
        ctx.widen = widen       # 16-bit GPU logits in autocast: float32 math and loss, dlogits in their dtype
        if widen or _fused_cross_entropy(logits, target, weight):   # class indices: one kernel each way (GPU), or
            # the CPU fast path of the primitive (2-D logits without class weights)
            _check_class_targets("cross_entropy", logits, target, ignore_index)   # (no device array op on a GPU)
            w = None if weight is None else weight.data
            loss, lse, denom = B.softmax_cross_entropy_forward(handle_for(logits), logits.data, target.data, w,
                                                               ignore_index, label_smoothing, reduction, widen)
            ctx.fused = (target.data, w, ignore_index, lse, denom)
            ctx.args = (target, weight, ignore_index, reduction, label_smoothing)
            ctx.reduction, ctx.smoothing = reduction, label_smoothing
            ctx.save_for_backward(logits)
            return wrap(loss)
        loss = _cross_entropy_reference(ctx, logits, target, weight, ignore_index, reduction, label_smoothing)
        ctx.save_for_backward(logits)
        return wrap(loss)

    @staticmethod
    def backward(ctx, gy):
        logits, = ctx.saved_tensors
        if creating_graph(gy, logits):          # the same formula in differentiable ops: second derivatives
            if ctx.widen:                       # as autocast's path: the cast to float32, the cast of dx back
                x32 = transfer(logits, dtype=np.float32)
                _cross_entropy_reference(ctx, x32, *ctx.args)
                dx, dt = _cross_entropy_composite_grads(ctx, x32, gy)
                return None if dx is None else transfer(dx, dtype=logits.dtype), dt, None, None, None, None
            if ctx.fused is not None:           # the terms the composite reads, from the reference's forward
                _cross_entropy_reference(ctx, logits, *ctx.args)
            return (*_cross_entropy_composite_grads(ctx, logits, gy), None, None, None, None)
        if ctx.fused is not None:
            t, w, ignore_index, lse, denom = ctx.fused
            dx = B.softmax_cross_entropy_backward(handle_for(logits), logits.data, t, gy.data, lse, denom, w,
                                                  ignore_index, ctx.smoothing, ctx.reduction, ctx.widen)
            return wrap(dx), None, None, None, None, None
        return _cross_entropy_reference_backward(ctx, logits, gy)


def _fused_cross_entropy(logits, target, weight):
    """Class indices through the softmax-cross-entropy primitive: on a GPU its kernels; on the CPU where its fast
    path applies (2-D logits without class weights; it hands non-finite logits to its reference)."""
    if not B.cudnn.fusion or _is_floating(target.dtype):
        return False
    return type(logits.data) is not np.ndarray or (logits.ndim == 2 and weight is None)


def _cross_entropy_reference(ctx, logits, target, weight, ignore_index, reduction, label_smoothing):
    """The loss from log_softmax and the targets' weights (every device; the CPU path), leaving on ctx what its
    backward and the composite second-order path read."""
    x = logits
    xp = x._xp()
    c = x.shape[1]
    eps = label_smoothing
    logp = B.softmax_forward(handle_for(x), B.SoftmaxAlgorithm.LOG, None, x.data, axis=1)
    wshape = (1, c) + (1,) * (x.ndim - 2)
    w = None if weight is None else weight.data.reshape(wshape)
    if _is_floating(target.dtype):            # class probabilities
        t = target.data
        if eps:
            t = t * (1 - eps) + eps / c
        q = t if w is None else t * w
        denom = logp.size // c if logp.size else float("nan")
        terms = q * logp                    # PyTorch: -sum(t * logp), so t = 0 at logp = -inf gives NaN
        present = None
    else:                                   # class indices
        q, valid, denom = _class_targets("cross_entropy", x, target, weight, ignore_index)
        # PyTorch picks logp at the target (nll) and, with smoothing, sums logp over the classes of valid rows:
        # the other terms are absent, not 0 * logp (a masked class's logit -inf must not make NaN)
        picked = xp.expand_dims(xp.where(valid, target.data, 0), 1) == \
            xp.arange(c).reshape((1, c) + (1,) * (x.ndim - 2))
        terms = q * xp.where(picked & xp.expand_dims(valid, 1), logp, 0)
        present = picked
        if eps:
            smooth = xp.expand_dims(valid, 1).astype(x.dtype) * (eps / c)
            smooth = smooth if w is None else smooth * w
            q = q * (1 - eps) + smooth
            present = picked | True
            # the nll and smoothing parts stay separate sums, each over the mean's denominator, as in PyTorch
            # (all target weights 0: nll 0/0 = NaN even where the smoothing part alone would be inf)
            terms = terms * (1 - eps)
            smooth_terms = smooth * xp.where(xp.expand_dims(valid, 1), logp, 0)
        present = present & xp.expand_dims(valid, 1)
    per_element = -terms.sum(axis=1)
    smooth_part = -smooth_terms.sum(axis=1) if eps and not _is_floating(target.dtype) else None
    if reduction == "none":
        loss = per_element if smooth_part is None else per_element + smooth_part
    else:
        loss = per_element.sum()
        if reduction == "mean":
            loss = loss / denom
        if smooth_part is not None:
            loss = loss + (smooth_part.sum() / denom if reduction == "mean" else smooth_part.sum())
    ctx.logp, ctx.q, ctx.denom, ctx.w, ctx.reduction, ctx.smoothing = logp, q, denom, w, reduction, eps
    ctx.present = present
    ctx.index_targets = not _is_floating(target.dtype)
    ctx.target = None if ctx.index_targets else target     # a probability target: part of the formula
    return xp.asarray(loss, dtype=x.dtype)


def _cross_entropy_reference_backward(ctx, logits, gy):
    xp = logits._xp()
    g = gy.data
    if ctx.reduction == "none":
        g = xp.expand_dims(g, 1)
    elif ctx.reduction == "mean":
        g = g / ctx.denom
    q = ctx.q
    dx = None
    if ctx.needs_input_grad[0]:
        qg = q * g
        if ctx.present is not None:     # ignored elements get 0 even when every target is ignored (g = inf);
            # a valid target of weight 0 keeps w * g (NaN when every weight is 0: 0 / 0, as PyTorch's)
            qg = xp.where(ctx.present, qg, 0).astype(q.dtype, copy=False)
        dx = xp.exp(ctx.logp) * qg.sum(axis=1, keepdims=True) - qg
    dt = None
    if ctx.needs_input_grad[1]:     # probabilities that require grad: d/dt of -sum(w * t' * logp)
        dt = -(1 - ctx.smoothing) * ctx.logp * g
        dt = dt if ctx.w is None else dt * ctx.w
    return wrap(dx), wrap(dt), None, None, None, None


def _cross_entropy_composite_grads(ctx, logits, gy):
    """cross_entropy's gradients under create_graph: -sum(q * log_softmax(x)) reduced, written in differentiable
    ops (log_softmax's own backward is differentiable) with q built from a probability target as a Tensor, so
    both gradients can be differentiated again.  Class-index targets keep forward's mask of present terms (a
    masked class's -inf logit contributes nothing, not 0 * -inf)."""
    from ...ops.activation import log_softmax
    denom = float(ctx.denom) if isinstance(ctx.denom, (int, float)) else wrap(ctx.denom)
    c, eps = logits.shape[1], ctx.smoothing

    def composite(x, t):
        if t is None:
            q = wrap(ctx.q)
        else:
            q = t * (1 - eps) + eps / c if eps else t
            q = q if ctx.w is None else q * wrap(ctx.w)
        logp = log_softmax(x, 1)
        if ctx.present is not None:     # class indices: only the target's (and the smoothing) terms, as forward
            logp = where(wrap(ctx.present), logp, 0)     # (a masked -inf never meets its 0 weight)
        terms = q * logp
        per = -terms.sum(1)
        if ctx.reduction == "none":
            return per
        return per.sum() / denom if ctx.reduction == "mean" else per.sum()
    dx, dt = composite_grads(ctx.needs_input_grad[:2], composite, (logits, ctx.target), gy)
    return dx, dt


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """Softmax cross entropy of logits (N, C, *d) against class indices (N, *d) or probabilities (N, C, *d).
    In an autocast region (PyTorch's policy: float32 math, a float32 loss, the logits' gradient in their dtype):
    16-bit GPU logits with class indices go to the kernels as they are, read as float32 (``_widens``); any other
    call takes autocast's casts."""
    if _amp._active_regions:
        if _widens(input, target, weight):
            return _cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction,
                                  label_smoothing, True)
        return _autocast_cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction,
                                       label_smoothing)
    return _cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)


_CE_FP32 = _amp.policy_of("cross_entropy", "cuda") == "fp32"
WIDEN_ON = [os.environ.get("MINIDNN_CE_WIDEN", "1") != "0"]     # off: autocast's casts, as before session 11 (A/B)


def _widens(x, target, weight):
    """Whether autocast would cast these logits to float32 (this thread's region for CUDA, not suspended, the fp32
    policy, 16-bit logits) and nothing else of the call (class-index target, weight None or float32), and the
    primitive's kernels would take them (a GPU array, fusion on): then CrossEntropy takes the 16-bit logits itself
    -- the same values and dtypes, bitwise, without the cast, its node and the cast of dlogits back (session 11)."""
    if not (_CE_FP32 and WIDEN_ON[0] and isinstance(x, Tensor) and isinstance(target, Tensor)):
        return False
    d = x.data
    if type(d) is np.ndarray or d.dtype.itemsize != 2 or not _is_floating(d.dtype) \
            or target.data.dtype.kind not in "iu" or not B.cudnn.fusion:
        return False
    if weight is not None and not (isinstance(weight, Tensor) and weight.data.dtype == np.float32):
        return False
    return _amp.get_dtype("cuda") is not None and not _amp._state()["suspended"]


# F.cross_entropy of GPU tensors on a seen signature (docs/host_overhead.md round 24).  After a full-path call that
# passed the checks and CrossEntropy.apply, the signature -- the input's, target's and weight's array types, shapes,
# dtypes and devices, reduction, ignore_index, label_smoothing (with their types), the widening flag -- is remembered;
# the same signature again skips the checks (they read only what the key holds) and runs CrossEntropy.forward with
# the node Function.apply records (the same fields), without apply's passes.  The legacy size_average / reduce flags
# (a warning a call), unbatched input and anomaly mode take the full path.  Switch: CE_FAST[0] = False, or
# MINIDNN_CE_NN_FAST=0 at import (not MINIDNN_CE_FAST: the loss kernels' exp setting, backend/cuda/loss_kernels.py).
CE_FAST = [os.environ.get("MINIDNN_CE_NN_FAST", "1") != "0"]
_CE_SEEN = SeenCalls()


def _ce_sig(t):
    d = t.data
    return type(d), d.shape, d.dtype, d.data.device_id


def _ce_key(input, target, weight, size_average, reduce, reduction, ignore_index, label_smoothing, widen):
    """The seen-call key of a cross_entropy call on GPU tensors, or None (the full path, not remembered)."""
    if (size_average is not None or reduce is not None or type(ignore_index) is not int
            or type(reduction) is not str or type(label_smoothing) not in (float, int) or not CE_FAST[0]
            or not isinstance(input, Tensor) or not isinstance(target, Tensor)
            or not (weight is None or isinstance(weight, Tensor)) or type(input.data) is np.ndarray):
        return None
    try:
        return (_ce_sig(input), _ce_sig(target), None if weight is None else _ce_sig(weight), reduction,
                ignore_index, type(label_smoothing), label_smoothing, bool(widen))
    except AttributeError:
        return None


def _ce_seen(input, target, weight, ignore_index, reduction, label_smoothing, widen, key):
    """CrossEntropy.apply(...) as apply computes and records it on a remembered key; None: not remembered."""
    if key not in _CE_SEEN or _ag_state.anomaly:
        return None
    return apply_seen(CrossEntropy, input, target, weight, ignore_index, reduction, float(label_smoothing),
                      widen=widen)


def _cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing,
                   widen=False):
    key = _ce_key(input, target, weight, size_average, reduce, reduction, ignore_index, label_smoothing, widen)
    if key is not None:
        loss = _ce_seen(input, target, weight, ignore_index, reduction, label_smoothing, widen, key)
        if loss is not None:
            return loss
    op = "cross_entropy"
    reduction = _reduction(op, size_average, reduce, reduction)
    check_tensor(op, "input", input)
    check_tensor(op, "target", target, float_only=False)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ArgumentError(f"{op}: label_smoothing={label_smoothing} must be in [0, 1]")
    probabilities = _is_floating(target.dtype)
    x, target, unbatched = _unbatched(input, target, not probabilities)
    if x.ndim < 2:
        raise ArgumentError(f"{op}: expected input of shape (N, C, *) or (C,), got {tuple(input.shape)}")
    _check_weight(op, weight, x.shape[1], x, widen)     # widen: a float32 weight (_widens checked it)
    if probabilities:
        if tuple(target.shape) != tuple(x.shape):
            raise ArgumentError(f"{op}: class-probability target has shape {tuple(target.shape)} but input has shape "
                             f"{tuple(x.shape)}; they must match (or pass integer class indices)")
        if target.dtype != x.dtype:
            raise DTypeError(f"{op}: target has dtype {target.dtype} but input has dtype {x.dtype}")
    loss = CrossEntropy.apply(x, target, weight, ignore_index, reduction, float(label_smoothing), widen=widen)
    if key is not None and not unbatched:       # the checks and apply (its device check too) passed
        _CE_SEEN.remember(key, True)
    return loss.squeeze(0) if unbatched and reduction == "none" else loss


_autocast_cross_entropy = autocast_op("cross_entropy")(_cross_entropy)


@autocast_op("nll_loss")
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """Negative log likelihood of log-probabilities input (N, C, *d) at class indices target (N, *d)."""
    op = "nll_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    check_tensor(op, "input", input)
    check_tensor(op, "target", target, float_only=False)
    x, target, unbatched = _unbatched(input, target, True)
    if x.ndim < 2:
        raise ArgumentError(f"{op}: expected input of shape (N, C, *) or (C,), got {tuple(input.shape)}")
    _check_weight(op, weight, x.shape[1], x)
    _, valid, denom = _class_targets(op, x, target, weight, ignore_index)
    # PyTorch's rule: -w[t] * x[t] for each valid element, 0 for an ignored one; gathered, not -(x * onehot).sum(1)
    # (a masked class's -inf times 0 is NaN, and so would be its gradient when every target is ignored)
    xp = x._xp()
    t = xp.where(valid, target.data, 0).astype(np.int64, copy=False)
    picked = x.gather(1, Tensor._from_array(xp.expand_dims(t, 1))).squeeze(1)
    loss = -picked if weight is None else picked * Tensor._from_array(-weight.data[t])
    per_element = where(Tensor._from_array(valid), loss, 0.0)
    if reduction == "none":
        return per_element.squeeze(0) if unbatched else per_element
    total = per_element.sum()
    return total / Tensor._from_array(denom) if reduction == "mean" else total


# ---- elementwise regression and binary losses (Tensor ops) ----------------------------------------------

def _pair(op, input, target, strict):
    check_tensor(op, "input", input)
    check_tensor(op, "target", target)
    if tuple(input.shape) != tuple(target.shape):
        msg = (f"{op}: target size {tuple(target.shape)} is different to the input size {tuple(input.shape)}")
        if strict:
            raise ArgumentError(msg + "; they must match")
        warnings.warn(msg + ". This will likely lead to incorrect results due to broadcasting. Please ensure they "
                      "have the same size.", stacklevel=3)


def _weighted_reduce(op, loss, weight, reduction):
    """PyTorch 2.13's elementwise ``weight`` (input's shape): the weighted mean divides by sum(weight)."""
    if weight is None:
        return _reduce(loss, reduction)
    if tuple(weight.shape) != tuple(loss.shape):
        raise ArgumentError(f"{op}: weight has shape {tuple(weight.shape)} but input has shape {tuple(loss.shape)}; "
                         "weights and input must have the same size")
    loss = loss * weight
    return loss.sum() / weight.sum() if reduction == "mean" else _reduce(loss, reduction)


@autocast_op("mse_loss")
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """The squared error (input - target)^2 elementwise, averaged (``reduction='mean'``), summed ('sum') or kept
    ('none') (F.mse_loss); a target of another shape broadcasts, with PyTorch's warning. ``weight`` (input's shape,
    PyTorch 2.13's elementwise weight) makes the mean a weighted mean, divided by sum(weight). The legacy
    ``size_average``/``reduce`` flags map to ``reduction`` as in PyTorch."""
    reduction = _reduction("mse_loss", size_average, reduce, reduction)
    _pair("mse_loss", input, target, strict=False)
    d = input - target
    return _weighted_reduce("mse_loss", d * d, weight, reduction)


@autocast_op("l1_loss")
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """The absolute error |input - target| elementwise, averaged (``reduction='mean'``), summed ('sum') or kept ('none')
    (F.l1_loss); a target of another shape broadcasts, with PyTorch's warning; the gradient at input == target is 0.
    ``weight`` (input's shape) makes the mean a weighted mean divided by sum(weight)."""
    reduction = _reduction("l1_loss", size_average, reduce, reduction)
    _pair("l1_loss", input, target, strict=False)
    return _weighted_reduce("l1_loss", (input - target).abs(), weight, reduction)


@autocast_op("smooth_l1_loss")
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta = 0: l1_loss)."""
    reduction = _reduction("smooth_l1_loss", size_average, reduce, reduction)
    _pair("smooth_l1_loss", input, target, strict=False)
    if beta < 0:
        raise ArgumentError(f"smooth_l1_loss: beta={beta} must be >= 0")
    d = input - target
    a = d.abs()
    if beta == 0:
        return _reduce(a, reduction)
    # PyTorch's gradient: d / beta inside, sign(d) outside (so +-1 at an infinite d), NaN at a NaN d.  The square
    # sees d only where it is chosen (an infinite d would make its unused zero gradient 0 * inf = NaN).
    quad = ~(a >= beta)     # NaN takes the quadratic branch: its gradient d / beta is NaN, as PyTorch's
    dq = where(quad, d, 0.0)
    return _reduce(where(quad, dq * dq * (0.5 / beta), a - 0.5 * beta), reduction)


_BCE_EPS = float(np.float32(1e-12))     # PyTorch's clamp is the float constant 1e-12 (9.9999999600e-13)


class BinaryCrossEntropy(Function):
    """Elementwise -(t log x + (1 - t) log(1 - x)) with each log clamped at -100, and PyTorch's gradient
    (x - t) / max(x (1 - x), 1e-12): finite at x = 0 and 1 (0 where t equals x there), written in Tensor ops so it
    can be differentiated again."""

    @staticmethod
    def forward(ctx, x, t):
        ctx.save_for_backward(x, t)
        xp = x._xp()
        xd, td = x.data, t.data
        with np.errstate(divide="ignore", invalid="ignore"):
            log_x = xp.maximum(xp.log(xd), -100)
            log_1mx = xp.maximum(xp.log1p(-xd), -100)
        return wrap((-(td * log_x + (1 - td) * log_1mx)).astype(xd.dtype, copy=False))

    @staticmethod
    def backward(ctx, g):
        x, t = ctx.saved_tensors
        gx = g * (x - t) / (x * (1 - x)).clamp(min=_BCE_EPS) if ctx.needs_input_grad[0] else None
        gt = None
        if ctx.needs_input_grad[1]:      # d/dt = log(1 - x) - log(x), each clamped at -100
            gt = g * ((1 - x).log().clamp(min=-100) - x.log().clamp(min=-100))
        return gx, gt


@autocast_op("binary_cross_entropy")
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-(t log x + (1 - t) log(1 - x)), each log clamped at -100 (PyTorch's rule: finite at x = 0 or 1)."""
    op = "binary_cross_entropy"
    reduction = _reduction(op, size_average, reduce, reduction)
    _pair(op, input, target, strict=True)
    if input.device.type == "cpu" and bool(((input.data < 0) | (input.data > 1)).any()):
        # PyTorch checks on the CPU (a device-side assert on a GPU, where a check would cost a host sync)
        bad = input.data[(input.data < 0) | (input.data > 1)].ravel()[0]
        raise ArgumentError(f"{op}: all elements of input should be between 0 and 1 (found {bad})")
    loss = BinaryCrossEntropy.apply(input, target)
    return _reduce(loss if weight is None else loss * weight, reduction)


def _softplus(z):
    """log(1 + exp(z)), stable and differentiable to any order: log1p(exp(z)) for z <= 0, z + log1p(exp(-z))
    above, each branch fed only its own half (so z = +-inf gives inf / 0 with gradient 1 / 0, never inf * 0 = NaN,
    and the gradient at 0 is sigmoid(0) = 1/2); NaN stays NaN."""
    low = ~(z > 0)
    zl = where(low, z, 0.0)
    zh = where(low, 0.0, z)
    return where(low, zl.exp().log1p(), zh + (-zh).exp().log1p())


@autocast_op("binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    """binary_cross_entropy(sigmoid(x), t), computed stably: (1 - t) x + (1 + (pos_weight - 1) t) softplus(-x)."""
    op = "binary_cross_entropy_with_logits"
    reduction = _reduction(op, size_average, reduce, reduction)
    _pair(op, input, target, strict=True)
    log_weight = 1 if pos_weight is None else 1 + (pos_weight - 1) * target
    loss = (1 - target) * input + log_weight * _softplus(-input)
    return _reduce(loss if weight is None else loss * weight, reduction)


# ---- one_hot and pad ---------------------------------------------------------------------------------------

def one_hot(tensor, num_classes=-1):
    """int64 (*, num_classes) with a 1 at each index; num_classes=-1 means max(tensor) + 1."""
    check_tensor("one_hot", "tensor", tensor, float_only=False)
    if tensor.dtype.kind not in "iu":
        raise DTypeError(f"one_hot: expected an integer tensor of class indices, got dtype {tensor.dtype}")
    xp = tensor._xp()
    t = tensor.data
    if num_classes == -1:
        if t.size == 0:
            raise RuntimeError("one_hot: cannot infer the number of classes from an empty tensor")
        num_classes = int(t.max()) + 1
    if t.size and (int(t.min()) < 0 or int(t.max()) >= num_classes):
        raise RuntimeError(f"one_hot: class values must be in [0, {num_classes}), got min {int(t.min())} and "
                           f"max {int(t.max())}")
    return wrap((xp.expand_dims(t, -1) == xp.arange(num_classes)).astype(xp.int64))
