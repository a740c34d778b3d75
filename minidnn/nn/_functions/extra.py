"""The rest of ``torch.nn.functional`` that training scripts use: more activations, distances, losses, embedding,
pixel/channel shuffles, instance_norm, unfold/fold and alpha_dropout.

# activations:          x, y: any shape (elementwise); prelu's weight (C,) or (1,) runs along dim 1; glu halves ``dim``
# distances:            cosine_similarity / pairwise_distance: x1, x2 broadcast, reduced over ``dim`` / the last dim;
#                       pdist: x (N, M) -> (N (N - 1) / 2,)
# losses:               see each function; reduction 'none' keeps the per-element (or per-sample) shape
# embedding:            indices (*) int, weight (num_embeddings, D) -> (*, D)
# pixel_shuffle:        (*, C r^2, H, W) <-> (*, C, H r, W r)
# unfold / fold:        (N, C, H, W) <-> (N, C kh kw, L), L = number of sliding blocks
# instance_norm:        (N, C, *spatial), statistics per (sample, channel)

Ops PyTorch's autocast lists (prelu lowered; kl_div, huber_loss and the other losses in float32) carry their
``autocast_op`` name, so minidnn's policy table decides for them as for the older ops.

Nothing here has a backend primitive: every op is a composition of differentiable Tensor ops (so it has gradients of
any order and runs on whichever device holds its input).  Where PyTorch's gradient at a kink differs from what the
natural composition gives (hardswish at +-3, shrinks at +-lambd, threshold at the threshold) the composition picks
its branches with the same comparisons PyTorch's backward kernels use.  Index tables (unfold, pdist) are built on
the host from shapes only and applied by indexing.  Two tiny Functions carry PyTorch's "modified under no_grad"
idioms: ``_ClampKeepGrad`` (a value clamped in place without autograd: the gradient flows as if unclamped) and
``_ScaleGrad`` (identity forward, gradient times a constant: embedding's padding_idx and scale_grad_by_freq).
"""
from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from ..._amp_state import autocast_op
from ...autograd import Function, no_grad
from ...backend.errors import ArgumentError, DimensionError, DTypeError
from ...creation import rand as _rand
from ...creation import tensor as _tensor
from ...ops import where
from ...ops.activation import _softmax_dim, softmax
from ...tensor import Tensor
from ..functional_extra import _NormKeepdim
from ._util import check_tensor, ntuple, wrap
from .activation import elu, leaky_relu
from .loss import _reduce, _reduction, _softplus
from .norm import batch_norm

__all__ = [
    "prelu", "mish", "hardswish", "hardsigmoid", "selu", "celu", "glu", "softsign", "logsigmoid", "softmin",
    "tanhshrink", "softshrink", "hardshrink", "threshold", "rrelu", "alpha_dropout",
    "cosine_similarity", "pairwise_distance", "pdist",
    "kl_div", "huber_loss", "margin_ranking_loss", "hinge_embedding_loss", "cosine_embedding_loss",
    "triplet_margin_loss", "poisson_nll_loss", "gaussian_nll_loss", "multi_margin_loss", "soft_margin_loss",
    "multilabel_soft_margin_loss", "multilabel_margin_loss",
    "embedding", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "instance_norm", "unfold", "fold", "bilinear",
    "affine_grid", "grid_sample",
]


def _const(array, like):
    """A constant (no grad) on ``like``'s device and dtype."""
    return _tensor(np.asarray(array), dtype=like.dtype, device=like.device)


class _ClampKeepGrad(Function):
    """max(x, lo) whose gradient is the identity: PyTorch's ``with no_grad(): t.clamp_(min=lo)`` on a clone."""

    @staticmethod
    def forward(ctx, x, lo):
        return wrap(x._xp().maximum(x.data, x.dtype.type(lo)))

    @staticmethod
    def backward(ctx, g):
        return g, None


class _ScaleGrad(Function):
    """Identity forward; backward multiplies the gradient by a fixed array (a Tensor product, so the gradient can
    be differentiated again)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return wrap(x.data.copy())

    @staticmethod
    def backward(ctx, g):
        return g * Tensor._from_array(ctx.scale), None


# ------------------------------------------------------------------------------------------------------------
# activations
# ------------------------------------------------------------------------------------------------------------
@autocast_op("prelu")
def prelu(input, weight):
    """PyTorch's ``F.prelu``: x where x > 0, else weight * x, with ``weight`` of one element or one per channel
    (dim 1 of the input; a 0-D or 1-D input has one channel)."""
    op = "prelu"
    check_tensor(op, "input", input)
    check_tensor(op, "weight", weight)
    if weight.ndim > 1:
        raise ArgumentError(f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = {weight.ndim} "
                            f"(weight {tuple(weight.shape)})")
    channels = input.shape[1] if input.ndim >= 2 else 1
    if weight.numel() != 1 and weight.numel() != channels:
        raise ArgumentError(f"prelu: Mismatch of parameter numbers and input channel size. Found parameter numbers = "
                            f"{weight.numel()} and channel size = {channels} (input {tuple(input.shape)})")
    if weight.dtype != input.dtype:
        raise DTypeError(f"prelu: weight has dtype {weight.dtype} but input has dtype {input.dtype}; they must match")
    if weight.numel() != 1:
        w = weight.reshape((channels,) + (1,) * (input.ndim - 2))
    else:
        w = weight.reshape((1,) * input.ndim)
    return where(input > 0, input, w * input)


def mish(input, inplace=False):
    """x * tanh(softplus(x)) (PyTorch's ``F.mish``), with a softplus stable at both ends."""
    check_tensor("mish", "input", input)
    return input * _softplus(input).tanh()


def hardswish(input, inplace=False):
    """x * relu6(x + 3) / 6 (``F.hardswish``) with PyTorch's values and gradients at the edges: the gradient is 0 up
    to -3, x / 3 + 1/2 strictly between, 1 from 3 on (and at NaN); -inf gives NaN (-inf * 0) as PyTorch's."""
    check_tensor("hardswish", "input", input)
    low = input <= -3.0
    mid = (input > -3.0) & (input < 3.0)
    m = where(mid, input, 0.0)
    with np.errstate(invalid="ignore"):                   # -inf * 0 is PyTorch's NaN, silently
        floor = input.detach() * 0.0
    return where(low, floor, where(mid, m * (m + 3.0) / 6.0, input))


def hardsigmoid(input, inplace=False):
    """relu6(x + 3) / 6 (``F.hardsigmoid``); the gradient is 1/6 strictly inside (-3, 3) and 0 elsewhere (NaN
    included: it stays NaN with a 0 gradient, as in PyTorch)."""
    check_tensor("hardsigmoid", "input", input)
    inside = (input > -3.0) & (input < 3.0)
    edge = where(input <= -3.0, 0.0, where(input >= 3.0, 1.0, input.detach())).astype(input.dtype)
    return where(inside, input / 6.0 + 0.5, edge)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input, inplace=False):
    """scale * elu(x, alpha) with the self-normalising constants (``F.selu``)."""
    check_tensor("selu", "input", input)
    return elu(input, _SELU_ALPHA) * _SELU_SCALE


def celu(input, alpha=1.0, inplace=False):
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1)) (``F.celu``), i.e. alpha * elu(x / alpha)."""
    check_tensor("celu", "input", input)
    if alpha == 0:
        raise ArgumentError("celu: ZeroDivisionError: alpha cannot be 0 for CELU (it divides x)")
    return elu(input / alpha, 1.0) * alpha


def glu(input, dim=-1):
    """a * sigmoid(b) where a, b are the two halves of ``input`` along ``dim`` (``F.glu``)."""
    check_tensor("glu", "input", input)
    if input.ndim == 0:
        raise ArgumentError("glu does not support scalars because halving size must be even")
    if not -input.ndim <= dim < input.ndim:
        raise DimensionError(f"glu: dim {dim} is out of range for an input of shape {tuple(input.shape)}")
    n = input.shape[dim]
    if n % 2:
        raise ArgumentError(f"glu: Halving dimension must be even, but dimension {dim % input.ndim} is size {n} "
                            f"(input {tuple(input.shape)})")
    a = input.narrow(dim, 0, n // 2)
    b = input.narrow(dim, n // 2, n // 2)
    return a * b.sigmoid()


def softsign(input):
    """x / (1 + |x|) (``F.softsign``)."""
    check_tensor("softsign", "input", input)
    return input / (input.abs() + 1.0)


def logsigmoid(input):
    """log(sigmoid(x)) = -softplus(-x), stable for large |x| (``F.logsigmoid``)."""
    check_tensor("logsigmoid", "input", input)
    return -_softplus(-input)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """softmax(-x) along ``dim`` (``F.softmin``; dim=None picks PyTorch's legacy implicit dim, with its warning)."""
    check_tensor("softmin", "input", input)
    dim = _softmax_dim("softmin", input, dim)
    return softmax(-input, dim, dtype=dtype)


def tanhshrink(input):
    """x - tanh(x) (``F.tanhshrink``)."""
    check_tensor("tanhshrink", "input", input)
    return input - input.tanh()


def _nan_or_zero(x):
    """NaN where x is NaN, else 0; a constant (what the shrinks give between their thresholds)."""
    x = x.detach()
    return where(x != x, x, 0.0).astype(x.dtype)


def softshrink(input, lambd=0.5):
    """x - lambd above lambd, x + lambd below -lambd, 0 between (``F.softshrink``); lambd must be >= 0.  As in
    PyTorch the gradient is 1 strictly outside [-lambd, lambd] and 0 elsewhere, NaN included (which stays NaN)."""
    check_tensor("softshrink", "input", input)
    if lambd < 0:
        raise ArgumentError(f"softshrink: lambda must be greater or equal to 0, but found to be {lambd}.")
    return where(input > lambd, input - lambd, where(input < -lambd, input + lambd, _nan_or_zero(input)))


def hardshrink(input, lambd=0.5):
    """x where |x| > lambd, else 0 (``F.hardshrink``); NaN stays NaN with a 0 gradient, as in PyTorch."""
    check_tensor("hardshrink", "input", input)
    return where((input > lambd) | (input < -lambd), input, _nan_or_zero(input))


def threshold(input, threshold, value, inplace=False):
    """x where x > threshold, else ``value`` (``F.threshold``; the gradient is 0 where x <= threshold)."""
    check_tensor("threshold", "input", input)
    return where(input <= threshold, value, input)


def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):
    """Randomised leaky ReLU (``F.rrelu``): in training each x <= 0 is multiplied by a slope drawn uniformly from
    [lower, upper] (minidnn's generator, so ``manual_seed`` repeats it); in eval the slope is (lower + upper) / 2."""
    check_tensor("rrelu", "input", input)
    if lower > upper:
        raise ArgumentError(f"rrelu: Lower bound should be less than or equal to the upper bound (lower={lower}, "
                            f"upper={upper})")
    if not training:
        return leaky_relu(input, (lower + upper) / 2)
    with no_grad():
        slope = _rand(*input.shape, dtype=input.dtype, device=input.device) * (upper - lower) + lower
        noise = where(input.detach() <= 0, slope, 1.0).astype(input.dtype)
    return input * noise


_ALPHA_DROPOUT = 1.7580993408473766     # -SELU's negative saturation value: selu(-inf) = -scale * alpha


def alpha_dropout(input, p=0.5, training=False, inplace=False):
    """Dropout for SELU networks (``F.alpha_dropout``): dropped elements are set to SELU's negative saturation
    value, then an affine map keeps the mean and variance; identity when not training or p == 0."""
    check_tensor("alpha_dropout", "input", input)
    if not 0.0 <= p <= 1.0:
        raise ArgumentError(f"alpha_dropout: dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0
    a = 1.0 / math.sqrt((_ALPHA_DROPOUT ** 2 * p + 1) * (1 - p))
    with no_grad():
        keep = (_rand(*input.shape, dtype=input.dtype, device=input.device) < 1.0 - p).astype(input.dtype)
        shift = (keep - 1.0) * (_ALPHA_DROPOUT * a) + _ALPHA_DROPOUT * a * p
    return input * (keep * a) + shift


# ------------------------------------------------------------------------------------------------------------
# distances
# ------------------------------------------------------------------------------------------------------------
def _broadcast_pair(op, x1, x2):
    try:
        shape = np.broadcast_shapes(tuple(x1.shape), tuple(x2.shape))
    except ValueError:
        raise ArgumentError(f"{op}: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} do not broadcast") from None
    return x1.expand(*shape), x2.expand(*shape)


def _norm(x, p, dim, keepdim):
    """||x||_p over ``dim`` with a 0 gradient where the norm is 0 (PyTorch's subgradient); p = 0 counts nonzeros."""
    dim = dim % x.ndim
    if p == 0:
        n = (x * 0.0).sum(dim, keepdim=True) + (x.detach() != 0).astype(x.dtype).sum(dim, keepdim=True)
    else:
        n = _NormKeepdim.apply(x, float(p), dim)
    return n if keepdim else n.squeeze(dim)


@autocast_op("cosine_similarity")
def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum(x1 * x2) / (max(||x1||, eps) * max(||x2||, eps)) over ``dim`` after broadcasting (``F.cosine_similarity``);
    as in PyTorch each input is divided by its clamped norm first, and the clamp does not stop the gradient."""
    op = "cosine_similarity"
    check_tensor(op, "x1", x1)
    check_tensor(op, "x2", x2)
    if x1.dtype != x2.dtype:
        raise DTypeError(f"{op}: x1 has dtype {x1.dtype} but x2 has dtype {x2.dtype}; they must match")
    x1, x2 = _broadcast_pair(op, x1, x2)
    if not -max(x1.ndim, 1) <= dim < max(x1.ndim, 1):
        raise DimensionError(f"{op}: dim {dim} is out of range for inputs of shape {tuple(x1.shape)}")
    if x1.ndim == 0:
        x1, x2, dim = x1.reshape(1), x2.reshape(1), 0
    n1 = _ClampKeepGrad.apply(_norm(x1, 2, dim, True), eps)
    n2 = _ClampKeepGrad.apply(_norm(x2, 2, dim, True), eps)
    return ((x1 / n1) * (x2 / n2)).sum(dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """||x1 - x2 + eps||_p over the last dim (``F.pairwise_distance``; eps is added to the difference, as PyTorch
    does, so identical rows have a nonzero distance and a finite gradient)."""
    op = "pairwise_distance"
    check_tensor(op, "x1", x1)
    check_tensor(op, "x2", x2)
    if p < 0:
        raise ArgumentError(f"{op}: p={p} must be non-negative")
    d = x1 - x2 + eps
    if d.ndim == 0:
        d = d.reshape(1)
        return _norm(d, p, 0, True) if keepdim else _norm(d, p, 0, False)
    return _norm(d, p, -1, keepdim)


@autocast_op("pdist")
def pdist(input, p=2):
    """The p-norm distance between every pair of rows i < j of ``input`` (N, M), in row-major order of (i, j):
    shape (N (N - 1) / 2,) (``F.pdist``)."""
    op = "pdist"
    check_tensor(op, "input", input)
    if input.ndim != 2:
        raise ArgumentError(f"pdist only supports 2D tensors, got: {input.ndim}D (input {tuple(input.shape)})")
    if p < 0:
        raise ArgumentError(f"pdist only supports non-negative p values, got p={p}")
    i, j = np.triu_indices(input.shape[0], k=1)
    d = input[i] - input[j]
    if d.shape[0] == 0:
        return (d * 0.0).sum(1)
    return _norm(d, p, 1, False)


# ------------------------------------------------------------------------------------------------------------
# losses
# ------------------------------------------------------------------------------------------------------------
def _xlogy_self(t):
    """t * log(t) with 0 at t = 0 (and a 0 gradient there: PyTorch's xlogy rule)."""
    zero = t == 0
    safe = where(zero, 1.0, t)
    return where(zero, 0.0, t * safe.log())


@autocast_op("kl_div")
def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """KL divergence with ``input`` log-probabilities (``F.kl_div``): target * (log(target) - input) elementwise
    (exp(target) * (target - input) with ``log_target``); 'batchmean' divides the sum by the batch size, 'mean'
    (with PyTorch's warning) by the number of elements."""
    op = "kl_div"
    if size_average is not None or reduce is not None:
        reduction = _reduction(op, size_average, reduce, "mean")
    elif reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support size."
                      "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                      "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                      stacklevel=2)
    elif reduction != "batchmean":
        _reduction(op, None, None, reduction)
    check_tensor(op, "input", input)
    check_tensor(op, "target", target)
    try:
        np.broadcast_shapes(tuple(input.shape), tuple(target.shape))
    except ValueError:
        raise ArgumentError(f"{op}: input {tuple(input.shape)} and target {tuple(target.shape)} do not "
                            "broadcast") from None
    if log_target:
        loss = target.exp() * (target - input)
    else:
        loss = _xlogy_self(target) - target * input
    if reduction == "batchmean":
        total = loss.sum()
        return total / input.shape[0] if input.ndim else total
    return _reduce(loss, reduction)


@autocast_op("huber_loss")
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), for d = input - target (``F.huber_loss``);
    ``weight`` (input's shape) multiplies the elementwise loss before the reduction (a plain mean, as PyTorch)."""
    op = "huber_loss"
    reduction = _reduction(op, None, None, reduction)
    _broadcastable_pair(op, input, target)
    if delta <= 0:
        raise ArgumentError(f"{op}: huber_loss does not support non-positive values for delta (got delta={delta})")
    if weight is not None and tuple(weight.shape) != tuple(input.shape):
        raise ArgumentError(f"{op}: Weights and input must have the same size: weight {tuple(weight.shape)}, input "
                            f"{tuple(input.shape)}")
    d = input - target
    a = d.abs()
    quad = ~(a >= delta)     # NaN takes the quadratic branch, as PyTorch's gradient does
    dq = where(quad, d, 0.0)
    loss = where(quad, dq * dq * 0.5, (a - 0.5 * delta) * delta)
    return _reduce(loss if weight is None else loss * weight, reduction)


def _broadcastable_pair(op, input, target):
    """Floating input and target that broadcast (else an error, before any work); PyTorch's warning when their
    shapes differ."""
    check_tensor(op, "input", input)
    check_tensor(op, "target", target)
    _broadcastable(op, input=input, target=target)
    if tuple(input.shape) != tuple(target.shape):
        warnings.warn(f"{op}: target size {tuple(target.shape)} is different to the input size {tuple(input.shape)}. "
                      "This will likely lead to incorrect results due to broadcasting. Please ensure they have the "
                      "same size.", stacklevel=4)


def _broadcastable(op, **tensors):
    """The loss's tensors broadcast together, or an error naming each one's shape (before any work)."""
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    try:
        np.broadcast_shapes(*shapes.values())
    except ValueError:
        listed = ", ".join(f"{k} {s}" for k, s in shapes.items())
        raise ArgumentError(f"{op}: the shapes of {listed} do not broadcast together") from None


@autocast_op("margin_ranking_loss")
def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """max(0, -target * (input1 - input2) + margin) (``F.margin_ranking_loss``); target holds +1 / -1."""
    op = "margin_ranking_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    for name, t in (("input1", input1), ("input2", input2), ("target", target)):
        check_tensor(op, name, t)
    if not input1.ndim == input2.ndim == target.ndim:
        raise ArgumentError(f"{op}: All input tensors should have same dimension but got sizes: input1: "
                            f"{tuple(input1.shape)}, input2: {tuple(input2.shape)}, target: {tuple(target.shape)}")
    _broadcastable(op, input1=input1, input2=input2, target=target)
    return _reduce((-target * (input1 - input2) + margin).clamp(min=0.0), reduction)


@autocast_op("hinge_embedding_loss")
def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    """x where target == 1, max(0, margin - x) where target == -1 (``F.hinge_embedding_loss``; other target values
    get both terms, as PyTorch's formula gives)."""
    op = "hinge_embedding_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    check_tensor(op, "input", input)
    check_tensor(op, "target", target, float_only=False)
    _broadcastable(op, input=input, target=target)
    margin_term = where(target != 1, (margin - input).clamp(min=0.0), 0.0)
    self_term = where(target != -1, input, 0.0)
    return _reduce(margin_term + self_term, reduction)


@autocast_op("soft_margin_loss")
def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """log(1 + exp(-target * input)) (``F.soft_margin_loss``), computed stably."""
    op = "soft_margin_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    _broadcastable_pair(op, input, target)
    return _reduce(_softplus(-target * input), reduction)


@autocast_op("cosine_embedding_loss")
def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """1 - cos(x1, x2) where target == 1, max(0, cos(x1, x2) - margin) where target == -1, for rows of
    input1/input2 (N, D) with target (N,) or vectors (D,) with a 0-D target (``F.cosine_embedding_loss``; PyTorch's
    cosine: sum(x1 x2) / sqrt((|x1|^2 + 1e-12)(|x2|^2 + 1e-12)))."""
    op = "cosine_embedding_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    for name, t in (("input1", input1), ("input2", input2), ("target", target)):
        check_tensor(op, name, t, float_only=name != "target")
    if target.ndim > 1:
        raise ArgumentError(f"{op}: 0D or 1D target tensor expected, multi-target not supported (target "
                            f"{tuple(target.shape)})")
    if tuple(input1.shape) != tuple(input2.shape):
        raise ArgumentError(f"{op}: the shape of input1 {tuple(input1.shape)} does not match the shape of input2 "
                            f"{tuple(input2.shape)}")
    if target.ndim == 1 and (input1.ndim != 2 or input1.shape[0] != target.shape[0]):
        raise ArgumentError(f"{op}: 1D target tensor expects 2D input tensors with as many rows, but found inputs "
                            f"with sizes {tuple(input1.shape)} and {tuple(input2.shape)} and target "
                            f"{tuple(target.shape)}")
    if target.ndim == 0 and input1.ndim != 1:
        raise ArgumentError(f"{op}: 0D target tensor expects 1D input tensors, but found inputs with sizes "
                            f"{tuple(input1.shape)} and {tuple(input2.shape)}.")
    dim = input1.ndim - 1
    prod = (input1 * input2).sum(dim)
    mag1 = (input1 * input1).sum(dim) + 1e-12
    mag2 = (input2 * input2).sum(dim) + 1e-12
    cos = prod / (mag1 * mag2).sqrt()
    pos = where(target == 1, 1.0 - cos, 0.0)
    neg = where(target == -1, (cos - margin).clamp(min=0.0), 0.0)
    return _reduce(pos + neg, reduction)


@autocast_op("triplet_margin_loss")
def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                        reduce=None, reduction="mean"):
    """max(0, margin + d(a, p) - d(a, n)) with d = pairwise_distance (p-norm, eps) over the last dim; ``swap``
    uses min(d(a, n), d(p, n)) (``F.triplet_margin_loss``)."""
    op = "triplet_margin_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    if margin <= 0:
        raise ArgumentError(f"{op}: margin must be greater than 0, got {margin}")
    for name, t in (("anchor", anchor), ("positive", positive), ("negative", negative)):
        check_tensor(op, name, t)
    if not anchor.ndim == positive.ndim == negative.ndim:
        raise ArgumentError(f"{op}: The anchor, positive, and negative tensors are expected to have the same number "
                            f"of dimensions, but got: anchor {anchor.ndim}D, positive {positive.ndim}D, and negative "
                            f"{negative.ndim}D inputs")
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_swap = pairwise_distance(positive, negative, p, eps)
        d_neg = where(d_swap < d_neg, d_swap, d_neg)
    return _reduce((d_pos - d_neg + margin).clamp(min=0.0), reduction)


@autocast_op("poisson_nll_loss")
def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    """exp(input) - target * input (``log_input``) or input - target * log(input + eps); ``full`` adds Stirling's
    term target log(target) - target + 0.5 log(2 pi target) where target > 1 (``F.poisson_nll_loss``)."""
    op = "poisson_nll_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    _broadcastable_pair(op, input, target)
    loss = input.exp() - target * input if log_input else input - target * (input + eps).log()
    if full:
        big = target > 1
        t = where(big, target, 2.0)
        stirling = t * t.log() - t + 0.5 * (t * (2 * math.pi)).log()
        loss = loss + where(big, stirling, 0.0)
    return _reduce(loss, reduction)


@autocast_op("gaussian_nll_loss")
def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """0.5 (log(var) + (input - target)^2 / var) (+ 0.5 log(2 pi) with ``full``) (``F.gaussian_nll_loss``); ``var``
    has input's shape, or one dim fewer / one dim of size 1 (homoscedastic), or is a float; it is clamped at eps
    without stopping its gradient, as PyTorch does."""
    op = "gaussian_nll_loss"
    check_tensor(op, "input", input)
    check_tensor(op, "target", target)
    _broadcastable(op, input=input, target=target)
    if isinstance(var, numbers.Real) and not isinstance(var, Tensor):
        if var < 0:
            raise ArgumentError(f"{op}: var has negative entry/entries (var={var})")
        var = input.detach() * 0.0 + float(var)
    else:
        check_tensor(op, "var", var)
        if bool((var.detach() < 0).any().item()):
            raise ArgumentError(f"{op}: var has negative entry/entries")
    vs, xs = tuple(var.shape), tuple(input.shape)
    if vs != xs:
        if xs[:-1] == vs:
            var = var.unsqueeze(-1)
        elif not (len(vs) == len(xs) and sum(v for x, v in zip(xs, vs) if x != v) == 1):
            raise ArgumentError(f"{op}: var is of incorrect size: var {vs} for input {xs} (expected the input's "
                                "shape, its shape without the last dim, or a 1 in one dim)")
    if reduction not in ("none", "mean", "sum"):
        raise ArgumentError(f"{op}: {reduction} is not valid (expected 'none', 'mean' or 'sum')")
    var = _ClampKeepGrad.apply(var, eps)
    d = input - target
    loss = (var.log() + d * d / var) * 0.5
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


def _class_index_target(op, input, target):
    """input (N, C) or (C,), target (N,) or 0-D integer class indices -> (x (N, C), t int array (N,), unbatched)."""
    check_tensor(op, "input", input)
    check_tensor(op, "target", target, float_only=False)
    if target.dtype.kind not in "iu":
        raise DTypeError(f"{op}: target has dtype {target.dtype}; class indices must be integers")
    if input.ndim not in (1, 2):
        raise ArgumentError(f"{op}: Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
                            f"{tuple(input.shape)}")
    x = input.unsqueeze(0) if input.ndim == 1 else input
    t = target.reshape(-1)
    if t.shape[0] != x.shape[0] or target.ndim > 1:
        raise ArgumentError(f"{op}: inconsistent target size: {tuple(target.shape)} for input of size: "
                            f"{tuple(input.shape)}")
    c = x.shape[1]
    if t.device.type == "cpu" and t.numel():
        lo, hi = int(t.data.min()), int(t.data.max())
        if lo < 0 or hi >= c:
            raise DimensionError(f"{op}: target out of range: found class {lo if lo < 0 else hi} for {c} classes "
                                 f"(valid: 0..{c - 1})")
    return x, t, input.ndim == 1


@autocast_op("multi_margin_loss")
def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None,
                      reduction="mean"):
    """Multi-class hinge loss (``F.multi_margin_loss``): per sample, sum over classes j != y of
    max(0, margin - x[y] + x[j])^p (times weight[y]), divided by C; p is 1 or 2."""
    op = "multi_margin_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    if p not in (1, 2):
        raise ArgumentError(f"{op}: only p == 1 and p == 2 supported, got p={p}")
    x, t, unbatched = _class_index_target(op, input, target)
    n, c = x.shape
    if weight is not None:
        check_tensor(op, "weight", weight)
        if weight.ndim != 1 or weight.shape[0] != c:
            raise ArgumentError(f"{op}: weight has shape {tuple(weight.shape)} but input {tuple(input.shape)} has {c} "
                                f"classes (expected ({c},))")
    picked = x.gather(1, t.unsqueeze(1))
    z = x - picked + margin
    other = Tensor._from_array(t.data[:, None] != x._xp().arange(c)[None, :])
    h = where(other & (z > 0), z, 0.0)       # PyTorch's kernel counts a class only where z > 0 (gradient 0 at 0)
    if p == 2:
        h = h * h
    if weight is not None:
        h = h * weight[t.data].unsqueeze(1)
    per = h.sum(1) / c
    if unbatched:
        per = per.squeeze(0)
    return _reduce(per, reduction)


@autocast_op("multilabel_soft_margin_loss")
def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-(t log sigmoid(x) + (1 - t) log sigmoid(-x)), optionally weighted, averaged over the classes (last dim)
    (``F.multilabel_soft_margin_loss``); reduction then acts on the per-sample values."""
    op = "multilabel_soft_margin_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    check_tensor(op, "input", input)
    check_tensor(op, "target", target, float_only=False)
    if input.ndim == 0:
        raise ArgumentError(f"{op}: expected an input with a class dim, got a 0-D input")
    _broadcastable(op, input=input, target=target, **({} if weight is None else {"weight": weight}))
    loss = -(target * logsigmoid(input) + (1 - target) * logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    c = input.shape[-1]
    return _reduce(loss.sum(input.ndim - 1) / c, reduction)


# ------------------------------------------------------------------------------------------------------------
# embedding, shuffles, instance_norm, unfold / fold, bilinear
# ------------------------------------------------------------------------------------------------------------
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    """Rows of ``weight`` (num_embeddings, D) picked by integer ``input`` (``F.embedding``).  ``padding_idx``: that
    row gets no gradient; ``max_norm``: referenced rows whose ``norm_type`` norm exceeds it are rescaled in place
    (as PyTorch does, outside autograd); ``scale_grad_by_freq``: each row's gradient is divided by how often it
    occurs in ``input``.  ``sparse=True`` (sparse gradients) is not supported."""
    op = "embedding"
    if not isinstance(input, Tensor):
        raise DTypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    if input.dtype.kind not in "iu":
        raise DTypeError(f"{op}: Expected tensor for argument #1 'indices' to have an integer dtype, but got "
                         f"{input.dtype}")
    check_tensor(op, "weight", weight)
    if weight.ndim != 2:
        raise ArgumentError(f"{op}: 'weight' must be 2-D, got shape {tuple(weight.shape)}")
    if sparse:
        raise NotImplementedError(f"{op}: sparse=True (sparse gradients) is not supported; use sparse=False")
    rows = weight.shape[0]
    if padding_idx is not None:
        if not -rows <= padding_idx < rows:
            raise ArgumentError(f"{op}: Padding_idx must be within num_embeddings (padding_idx={padding_idx}, "
                                f"num_embeddings={rows})")
        padding_idx %= rows
    if input.device.type == "cpu" and input.numel():
        lo, hi = int(input.data.min()), int(input.data.max())
        if lo < 0 or hi >= rows:
            raise DimensionError(f"{op}: index out of range in self: index {lo if lo < 0 else hi} for "
                                 f"num_embeddings={rows} (valid: 0 to {rows - 1})")
    xp = input._xp()
    idx = input.data
    if max_norm is not None and input.numel():
        with no_grad():
            used = xp.unique(idx.reshape(-1))
            w = weight.data
            norms = xp.linalg.norm(w[used].astype(np.float64), ord=norm_type, axis=1)
            scale = xp.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0).astype(w.dtype)
            w[used] = w[used] * scale[:, None]
    out = weight[idx]
    if (padding_idx is not None or scale_grad_by_freq) and out.requires_grad:
        scale = xp.ones(idx.shape, dtype=weight.dtype)
        if scale_grad_by_freq and idx.size:
            _, inverse, counts = xp.unique(idx.reshape(-1), return_inverse=True, return_counts=True)
            scale = (1.0 / counts[inverse.reshape(-1)]).reshape(idx.shape).astype(weight.dtype)
        if padding_idx is not None:
            scale = xp.where(idx == padding_idx, 0, scale).astype(weight.dtype)
        out = _ScaleGrad.apply(out, scale[..., None])
    return out


def _check_factor(op, name, r):
    if not isinstance(r, numbers.Integral) or isinstance(r, bool):
        raise DTypeError(f"{op}: {name} must be an int, got {r!r}")
    if r <= 0:
        raise ArgumentError(f"{op}: {name} must be greater than 0, but got {r}")


def pixel_shuffle(input, upscale_factor):
    """(*, C r^2, H, W) -> (*, C, H r, W r), moving channel blocks into space (``F.pixel_shuffle``)."""
    op = "pixel_shuffle"
    check_tensor(op, "input", input, float_only=False)
    _check_factor(op, "upscale_factor", upscale_factor)
    r = upscale_factor
    if input.ndim < 3:
        raise ArgumentError(f"{op} expects input to have at least 3 dimensions, but got input with {input.ndim} "
                            f"dimension(s) (shape {tuple(input.shape)})")
    *lead, c, h, w = input.shape
    if c % (r * r):
        raise ArgumentError(f"{op} expects its input's 'channel' dimension to be divisible by the square of "
                            f"upscale_factor, but input.size(-3)={c} is not divisible by {r * r}")
    k = len(lead)
    x = input.reshape(*lead, c // (r * r), r, r, h, w)
    x = x.permute(*range(k), k, k + 3, k + 1, k + 4, k + 2)
    return x.reshape(*lead, c // (r * r), h * r, w * r)


def pixel_unshuffle(input, downscale_factor):
    """(*, C, H r, W r) -> (*, C r^2, H, W), the inverse of pixel_shuffle (``F.pixel_unshuffle``)."""
    op = "pixel_unshuffle"
    check_tensor(op, "input", input, float_only=False)
    _check_factor(op, "downscale_factor", downscale_factor)
    r = downscale_factor
    if input.ndim < 3:
        raise ArgumentError(f"{op} expects input to have at least 3 dimensions, but got input with {input.ndim} "
                            f"dimension(s) (shape {tuple(input.shape)})")
    *lead, c, h, w = input.shape
    if h % r:
        raise ArgumentError(f"{op} expects height to be divisible by downscale_factor, but input.size(-2)={h} is "
                            f"not divisible by {r}")
    if w % r:
        raise ArgumentError(f"{op} expects width to be divisible by downscale_factor, but input.size(-1)={w} is "
                            f"not divisible by {r}")
    k = len(lead)
    x = input.reshape(*lead, c, h // r, r, w // r, r)
    x = x.permute(*range(k), k, k + 2, k + 4, k + 1, k + 3)
    return x.reshape(*lead, c * r * r, h // r, w // r)


def channel_shuffle(input, groups):
    """(N, C, *) with C = g * k: channel g_i * k + k_i moves to k_i * g + g_i (``F.channel_shuffle``, ShuffleNet)."""
    op = "channel_shuffle"
    check_tensor(op, "input", input, float_only=False)
    _check_factor(op, "groups", groups)
    if input.ndim < 3:
        raise ArgumentError(f"{op} expects input to have at least 3 dimensions, but got input with {input.ndim} "
                            f"dimension(s) (shape {tuple(input.shape)})")
    n, c, *rest = input.shape
    if c % groups:
        raise ArgumentError(f"{op}: Number of channels must be divisible by groups. Got {c} channels and {groups} "
                            "groups.")
    return input.reshape(n, groups, c // groups, *rest).transpose(1, 2).reshape(n, c, *rest)


@autocast_op("instance_norm")
def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """Normalise each (sample, channel) of (N, C, *spatial) over its spatial elements (``F.instance_norm``): batch
    norm of the (1, N C, *spatial) view, as PyTorch computes it; with running stats, each channel's update is the
    average of its N per-sample updates."""
    op = "instance_norm"
    check_tensor(op, "input", input)
    if input.ndim < 3:
        raise ArgumentError(f"{op}: expected an input of shape (N, C, *spatial) with at least one spatial dim, got "
                            f"{tuple(input.shape)}")
    n, c = input.shape[0], input.shape[1]
    if use_input_stats:
        spatial = int(np.prod(input.shape[2:]))
        if spatial <= 1:
            raise ArgumentError(f"{op}: Expected more than 1 spatial element when training, got input size "
                                f"{tuple(input.shape)}")
    elif running_mean is None or running_var is None:
        raise ArgumentError(f"{op}: use_input_stats=False needs running_mean and running_var")
    for name, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        if t is not None and tuple(t.shape) != (c,):
            raise ArgumentError(f"{op}: {name} has shape {tuple(t.shape)} but input {tuple(input.shape)} has {c} "
                                f"channels (expected ({c},))")

    def tiled(t):
        return None if t is None else t.reshape(1, c).expand(n, c).reshape(n * c)
    rm = None if running_mean is None else tiled(running_mean.detach()).clone()
    rv = None if running_var is None else tiled(running_var.detach()).clone()
    x = input.reshape(1, n * c, *input.shape[2:])
    y = batch_norm(x, rm, rv, tiled(weight), tiled(bias), training=use_input_stats, momentum=momentum, eps=eps)
    if use_input_stats and n:
        with no_grad():
            if running_mean is not None:
                running_mean.copy_(rm.reshape(n, c).mean(0))
            if running_var is not None:
                running_var.copy_(rv.reshape(n, c).mean(0))
    return y.reshape(*input.shape)


def _blocks(op, spatial, kernel, dilation, padding, stride):
    """The number of sliding blocks per spatial dim, or PyTorch's error when one is not positive."""
    counts = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                   for s, k, d, p, st in zip(spatial, kernel, dilation, padding, stride))
    if any(b < 1 for b in counts):
        raise ArgumentError(f"{op}: Given input with spatial size {tuple(spatial)}, kernel_size={kernel}, "
                            f"dilation={dilation}, padding={padding}, calculated shape of the array of sliding blocks "
                            f"as {counts}, but its components must be at least one.")
    return counts


def _fold_args(op, kernel_size, dilation, padding, stride):
    k = ntuple(kernel_size, 2, op, "kernel_size")
    d = ntuple(dilation, 2, op, "dilation")
    p = ntuple(padding, 2, op, "padding")
    s = ntuple(stride, 2, op, "stride")
    if min(k) <= 0 or min(d) <= 0 or min(s) <= 0 or min(p) < 0:
        raise ArgumentError(f"{op}: kernel_size {k}, dilation {d} and stride {s} must be positive and padding {p} "
                            "non-negative")
    return k, d, p, s


def _block_index(kernel, dilation, stride, counts, padded_w):
    """(kh kw, L): the flat index in the padded (Hp Wp) image of each kernel tap of each block."""
    ki = np.arange(kernel[0])[:, None] * dilation[0]
    kj = np.arange(kernel[1])[None, :] * dilation[1]
    bi = np.arange(counts[0])[:, None] * stride[0]
    bj = np.arange(counts[1])[None, :] * stride[1]
    rows = (ki.reshape(-1, 1, 1, 1) + bi.reshape(1, 1, -1, 1))            # (kh, 1, bh, 1)
    cols = (kj.reshape(1, -1, 1, 1) + bj.reshape(1, 1, 1, -1))            # (1, kw, 1, bw)
    return (rows * padded_w + cols).reshape(kernel[0] * kernel[1], counts[0] * counts[1])


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """Sliding local blocks (im2col, ``F.unfold``): (N, C, H, W) -> (N, C kh kw, L), channel-major, one column
    per block in row-major block order; an unbatched (C, H, W) input gives (C kh kw, L)."""
    op = "unfold"
    check_tensor(op, "input", input)
    if input.ndim not in (3, 4):
        raise ArgumentError(f"{op}: Input Error: Only 3D or 4D input Tensors are supported (got {input.ndim}D, shape "
                            f"{tuple(input.shape)})")
    k, d, p, s = _fold_args(op, kernel_size, dilation, padding, stride)
    x = input.unsqueeze(0) if input.ndim == 3 else input
    n, c, h, w = x.shape
    counts = _blocks(op, (h, w), k, d, p, s)
    if p[0] or p[1]:
        x = x.pad((p[1], p[1], p[0], p[0]))
    hp, wp = h + 2 * p[0], w + 2 * p[1]
    index = _block_index(k, d, s, counts, wp)
    cols = x.reshape(n, c, hp * wp)[:, :, index]                         # (N, C, kh kw, L)
    out = cols.reshape(n, c * k[0] * k[1], counts[0] * counts[1])
    return out.squeeze(0) if input.ndim == 3 else out


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """The adjoint of unfold (col2im, ``F.fold``): (N, C kh kw, L) -> (N, C, H, W) = output_size, summing the
    overlapping values of the blocks; an unbatched (C kh kw, L) input gives (C, H, W)."""
    op = "fold"
    check_tensor(op, "input", input)
    if input.ndim not in (2, 3):
        raise ArgumentError(f"{op}: Input Error: Only unbatched (2D) or batched (3D) input Tensors are supported (got "
                            f"{input.ndim}D, shape {tuple(input.shape)})")
    out_hw = ntuple(output_size, 2, op, "output_size")
    k, d, p, s = _fold_args(op, kernel_size, dilation, padding, stride)
    x = input.unsqueeze(0) if input.ndim == 2 else input
    n, ckk, length = x.shape
    if ckk % (k[0] * k[1]):
        raise ArgumentError(f"{op}: Expected size of input's dimension 1 to be divisible by the product of "
                            f"kernel_size, but got input.size(1)={ckk} and kernel_size={k}")
    counts = _blocks(op, out_hw, k, d, p, s)
    if counts[0] * counts[1] != length:
        raise ArgumentError(f"{op}: Given output_size={out_hw}, kernel_size={k}, dilation={d}, padding={p}, "
                            f"stride={s}, expected size of input's dimension 2 to match the calculated number of "
                            f"sliding blocks {counts[0]} * {counts[1]} = {counts[0] * counts[1]}, but got "
                            f"input.size(2)={length}.")
    c = ckk // (k[0] * k[1])
    hp, wp = out_hw[0] + 2 * p[0], out_hw[1] + 2 * p[1]
    index = _block_index(k, d, s, counts, wp).reshape(-1)
    xp = x._xp()
    index = xp.asarray(np.broadcast_to(index, (n, c, index.size)))
    src = x.reshape(n, c, k[0] * k[1] * length)
    zeros = Tensor._from_array(xp.zeros((n, c, hp * wp), dtype=x.dtype))
    y = zeros.scatter_add(2, Tensor._from_array(index), src).reshape(n, c, hp, wp)
    y = y[:, :, p[0]:p[0] + out_hw[0], p[1]:p[1] + out_hw[1]]
    return y.squeeze(0) if input.ndim == 2 else y


def bilinear(input1, input2, weight, bias=None):
    """y[..., o] = sum_ij x1[..., i] weight[o, i, j] x2[..., j] + bias[o] (``F.bilinear``): input1 (*, in1),
    input2 (*, in2), weight (out, in1, in2), bias (out,)."""
    op = "bilinear"
    for name, t in (("input1", input1), ("input2", input2), ("weight", weight)):
        check_tensor(op, name, t)
    if weight.ndim != 3:
        raise ArgumentError(f"{op}: weight must be 3-D (out, in1, in2), got shape {tuple(weight.shape)}")
    if input1.ndim < 1 or tuple(input1.shape[:-1]) != tuple(input2.shape[:-1]):
        raise ArgumentError(f"{op}: input1 {tuple(input1.shape)} and input2 {tuple(input2.shape)} must have the same "
                            "leading dims")
    o, i, j = weight.shape
    if input1.shape[-1] != i or input2.shape[-1] != j:
        raise ArgumentError(f"{op}: input1 {tuple(input1.shape)} and input2 {tuple(input2.shape)} do not match weight "
                            f"{tuple(weight.shape)} (expected last dims {i} and {j})")
    if bias is not None and tuple(bias.shape) != (o,):
        raise ArgumentError(f"{op}: bias has shape {tuple(bias.shape)} but weight {tuple(weight.shape)} has {o} "
                            f"outputs (expected ({o},))")
    lead = tuple(input1.shape[:-1])
    x1 = input1.reshape(-1, i)
    x2 = input2.reshape(-1, j)
    t = (x1 @ weight.permute(1, 0, 2).reshape(i, o * j)).reshape(-1, o, j)
    y = (t * x2.unsqueeze(1)).sum(2)
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, o)


@autocast_op("multilabel_margin_loss")
def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """Multi-label hinge loss (``F.multilabel_margin_loss``): ``target`` (N, C) or (C,) int holds each sample's
    class indices, ended by the first -1; per sample, sum over its targets j and non-target classes i of
    max(0, 1 - (x[j] - x[i])), divided by C (a class listed twice counts twice, as in PyTorch's kernel)."""
    op = "multilabel_margin_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    check_tensor(op, "input", input)
    check_tensor(op, "target", target, float_only=False)
    if target.dtype.kind not in "iu":
        raise DTypeError(f"{op}: target has dtype {target.dtype}; class indices must be integers")
    if input.ndim not in (0, 1, 2) or tuple(target.shape) != tuple(input.shape):
        raise ArgumentError(f"{op}: inconsistent target size: {tuple(target.shape)} for input of size: "
                            f"{tuple(input.shape)} (expected (C,) or (N, C) for both)")
    x = input.reshape(1, -1) if input.ndim < 2 else input
    t = target.data.reshape(x.shape)
    xp = x._xp()
    n, c = x.shape
    listed = xp.cumprod(t != -1, axis=1).astype(bool)             # entries before the first -1
    if t.size and type(t) is np.ndarray and bool(((t < -1) | (t >= c)).any()):
        bad = int(t[(t < -1) | (t >= c)][0])
        raise DimensionError(f"{op}: target value {bad} is out of range for {c} classes (valid: 0..{c - 1}, -1 ends "
                             "the list)")
    safe = xp.where(listed, t, 0)
    is_target = ((safe[:, :, None] == xp.arange(c)[None, None, :]) & listed[:, :, None]).any(axis=1)   # (N, C)
    picked = x.gather(1, Tensor._from_array(safe.astype(np.int64)))                                    # (N, K)
    z = 1.0 - picked.unsqueeze(2) + x.unsqueeze(1)                                                      # (N, K, C)
    pairs = Tensor._from_array(listed[:, :, None] & ~is_target[:, None, :])
    per = where(pairs & (z > 0), z, 0.0).sum(2).sum(1) / c
    if input.ndim < 2:
        per = per.reshape(())
    return _reduce(per, reduction)


# ------------------------------------------------------------------------------------------------------------
# affine_grid / grid_sample (2-D, bilinear, zeros padding)
# ------------------------------------------------------------------------------------------------------------
_ALIGN_WARNING = ("Default grid_sample and affine_grid behavior has changed to align_corners=False since 1.3.0. "
                  "Please specify align_corners=True if the old behavior is desired. See the documentation of "
                  "grid_sample for details.")


def _base_coords(n, align_corners):
    """PyTorch's linspace_from_neg_one: n points in [-1, 1] (pixel centres unless align_corners); 0 for n = 1."""
    if n <= 1:
        return np.zeros(n)
    v = np.linspace(-1.0, 1.0, n)
    return v if align_corners else v * (n - 1) / n


def affine_grid(theta, size, align_corners=None):
    """Sampling grid (N, H, W, 2) of (x, y) in [-1, 1] for a batch of 2-D affine matrices theta (N, 2, 3) and an
    output size (N, C, H, W) (``F.affine_grid``; 2-D only)."""
    op = "affine_grid"
    check_tensor(op, "theta", theta)
    if align_corners is None:
        warnings.warn(_ALIGN_WARNING, stacklevel=2)
        align_corners = False
    size = tuple(int(s) for s in size)
    if len(size) != 4:
        raise NotImplementedError(f"{op}: only 2-D sizes (N, C, H, W) are supported, got size {list(size)}")
    if theta.ndim != 3 or tuple(theta.shape[1:]) != (2, 3) or theta.shape[0] != size[0]:
        raise ArgumentError(f"{op}: Expected a batch of 2D affine matrices of shape Nx2x3 for size {list(size)}. Got "
                            f"{list(theta.shape)}.")
    if min(size[2:]) <= 0:
        raise ArgumentError(f"{op}: Expected non-zero, positive output size. Got {list(size)}")
    n, _, h, w = size
    xs, ys = _base_coords(w, align_corners), _base_coords(h, align_corners)
    base = np.stack([np.broadcast_to(xs[None, :], (h, w)), np.broadcast_to(ys[:, None], (h, w)),
                     np.ones((h, w))], axis=-1).reshape(1, h * w, 3)
    grid = _const(base, theta) @ theta.transpose(1, 2)                   # (N, H W, 2)
    return grid.reshape(n, h, w, 2)


def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """Sample input (N, C, H, W) at the (x, y) locations of grid (N, Ho, Wo, 2), x and y in [-1, 1]
    (``F.grid_sample``): bilinear interpolation of the 4 neighbours, zero outside the image; differentiable in
    both the input and the grid.  Only mode='bilinear' and padding_mode='zeros' on 4-D inputs."""
    op = "grid_sample"
    check_tensor(op, "input", input)
    check_tensor(op, "grid", grid)
    if mode != "bilinear" or padding_mode != "zeros":
        raise NotImplementedError(f"{op}: only mode='bilinear' with padding_mode='zeros' is supported (got "
                                  f"mode={mode!r}, padding_mode={padding_mode!r})")
    if align_corners is None:
        warnings.warn(_ALIGN_WARNING, stacklevel=2)
        align_corners = False
    if input.ndim != 4:
        raise NotImplementedError(f"{op}: only 4-D input (N, C, H, W) is supported, got shape {tuple(input.shape)}")
    if grid.ndim != 4 or grid.shape[-1] != 2 or grid.shape[0] != input.shape[0]:
        raise ArgumentError(f"{op}: grid must be (N, H_out, W_out, 2) with the input's batch size; got grid "
                            f"{tuple(grid.shape)} for input {tuple(input.shape)}")
    if input.dtype != grid.dtype:
        raise DTypeError(f"{op}: expected input and grid to have the same dtype, but input has {input.dtype} and "
                         f"grid has {grid.dtype}")
    n, c, h, w = input.shape
    ho, wo = grid.shape[1], grid.shape[2]

    def unnormalise(v, size):
        return (v + 1.0) * ((size - 1) / 2.0) if align_corners else ((v + 1.0) * size - 1.0) / 2.0
    ix = unnormalise(grid[..., 0], w)                                     # (N, Ho, Wo)
    iy = unnormalise(grid[..., 1], h)
    x0, y0 = ix.detach().floor(), iy.detach().floor()
    wx1, wy1 = ix - x0, iy - y0                                           # the weights carry the grid's gradient
    flat = input.reshape(n, c, h * w)
    out = None
    for dy, wy in ((0, 1.0 - wy1), (1, wy1)):
        for dx, wx in ((0, 1.0 - wx1), (1, wx1)):
            xi, yi = x0 + dx, y0 + dy
            inside = (xi >= 0) & (xi <= w - 1) & (yi >= 0) & (yi <= h - 1)
            index = (where(inside, yi, 0.0) * w + where(inside, xi, 0.0)).astype(np.int64)   # (N, Ho, Wo)
            index = index.reshape(n, 1, ho * wo).expand(n, c, ho * wo)
            values = flat.gather(2, index).reshape(n, c, ho, wo)
            term = values * where(inside, wx * wy, 0.0).unsqueeze(1)
            out = term if out is None else out + term
    return out
