"""Batch, layer and group normalisation and local response normalisation.

# batch_norm:  x (N, C) or (N, C, *S); weight, bias, running_mean, running_var: (C,)   stats over N and S
# layer_norm:  x (*B, *D) with D = normalized_shape; weight, bias: D                   stats over D
# group_norm:  x (N, C, *S); weight, bias: (C,); num_groups divides C                  stats over C/G and S
# local_response_norm: x (N, C, *S); window of ``size`` channels

Training-mode batch norm and layer/group norm save the primitive's mean and inverse std (what the
backward primitive needs) and are first order only.  Eval-mode batch norm is an affine map of x with
constant statistics; its backward is written in Tensor ops, so it has double backward.
"""
from __future__ import annotations

import math

from ... import backend as B
from ..._amp_state import autocast_op
from ...autograd import Function, gradient_wanted, is_grad_enabled
from ...backend._common import SeenCalls
from ...backend.array_ops import copy_like
from ...backend.errors import ArgumentError
from ...ops.activation import activation_grad
from ...tensor import Tensor
from ._util import check_tensor, check_vector, composite_grads, creating_graph, handle_for, wrap

__all__ = ["batch_norm", "layer_norm", "group_norm", "local_response_norm"]

_SPATIAL = B.BatchNormMode.SPATIAL
_BN_RELU = B.BatchNormOps.BN_ACTIVATION
_BN_ADD_RELU = B.BatchNormOps.BN_ADD_ACTIVATION
_RELU = B.ActivationDescriptor(B.ActivationMode.RELU)


def _data(t):
    return None if t is None else t.data


def _channels_last(a):
    return not a.flags.c_contiguous and B.memory_format(a) is B.TensorFormat.NHWC


def _as_layout_of(a, x):
    """``a`` (same shape as x) in x's channels-last memory order where x has it and ``a`` lost it (the reference
    path on CuPy allocates C-ordered results; a gradient may arrive C-ordered): the kernels and the next layer then
    see NHWC memory.  Anything else as it is."""
    if a is None or a.ndim < 3 or not _channels_last(x) or _channels_last(a):
        return a
    return copy_like(x, a)


def _scale_for(weight, bias):
    """The primitives return no bias gradient without a scale: a bias alone gets a constant scale of 1."""
    if weight is None and bias is not None:
        return Tensor._from_array(bias._xp().ones(bias.shape, dtype=bias.dtype))
    return weight


class BatchNormTraining(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps, counter=None):
        # The primitive updates the running statistics in place (PyTorch's momentum is cuDNN's
        # exponential_average_factor; the running variance is the unbiased one), and counts the batch in
        # ``counter`` (BatchNorm's num_batches_tracked array, or None) in the same launch.
        y, mean, inv_std = B.batch_normalization_forward_training(
            handle_for(x), _SPATIAL, x.data, _data(weight), _data(bias), momentum,
            _data(running_mean), _data(running_var), eps, counter=counter)
        for buf in (running_mean, running_var):
            if buf is not None:
                buf._version += 1
        ctx.stats, ctx.eps = (mean, inv_std), eps
        ctx.save_for_backward(x, weight, bias)
        return wrap(_as_layout_of(y, x.data))

    @staticmethod
    def backward(ctx, gy):
        x, weight, bias = ctx.saved_tensors
        if creating_graph(gy, x, weight):       # the same normalisation in differentiable ops: second derivatives
            eps = ctx.eps
            return (*composite_grads(ctx.needs_input_grad, lambda a, w, b: _batch_norm_composite(a, w, b, eps),
                                     (x, weight, bias), gy), None, None, None, None, None)
        dx, dw, db = B.batch_normalization_backward(handle_for(x), _SPATIAL, x.data, _as_layout_of(gy.data, x.data),
                                                    _data(weight), *ctx.stats, ctx.eps)
        return wrap(_as_layout_of(dx, x.data)), wrap(dw), wrap(db), None, None, None, None, None


    @staticmethod
    def fuse_relu(bn, y):
        """The consumer-fusion rule ``relu`` asks a producer for (ops/activation.py): relu(y) of this batch norm's
        output ``y`` as one node whose backward is the fused batch-norm + ReLU backward (the ReLU mask applied inside
        the batch-norm gradient kernels: one launch and one full-size temporary fewer per pair), or None to run the
        plain ReLU.  The forward is the plain ReLU (y is already computed); see docs/fusion.md."""
        if y.output_nr != 0 or not _fusable(bn):
            return None
        return BatchNormReLU.apply(*bn.saved, y, (bn.stats, bn.eps, (bn,)))

    @staticmethod
    def fuse_add_relu(bn, a, z_edge):
        """The rule the add of a residual block asks for (ops/elementwise.py, Add.fuse_relu): relu(a), a = y + z with
        y this batch norm's output and ``z_edge`` where z's gradient goes (None: z needs none), as one node whose
        backward is the fused batch-norm + add + ReLU backward (dz and dx from one kernel pair); None: plain ReLU."""
        if not _fusable(bn):
            return None
        return BatchNormAddReLU.apply(*bn.saved, _edge_stand_in(z_edge, a), a, (bn.stats, bn.eps, (a.grad_fn, bn)))


def _fusable(bn):
    """Whether batch norm's node ``bn`` may be bypassed by a fused node: fusion on, no hook on its output, its
    saved tensors still there and not modified in place since (else the plain ReLU is recorded)."""
    saved = bn.saved
    return (B.cudnn.fusion and saved is not None and not bn.pre_hooks
            and all(not isinstance(t, Tensor) or t._version == v for t, v in zip(saved, bn.versions)))


def _edge_stand_in(edge, like):
    """A Tensor whose gradient goes to ``edge`` (the add node keeps its operands' edges, not the operands): the
    residual's place among the fused node's inputs.  Its data is ``like``'s (same shape, dtype and device as the
    operand it stands for: the add had no broadcasting); None where the operand needs no gradient."""
    if edge is None:
        return None
    t = Tensor._from_array(like.data)
    t.grad_fn, t.output_nr = edge
    t.requires_grad = True
    return t


# The fused nodes keep one more edge: to the tensor they bypass (batch norm's output y, or the residual sum y + z).
# Normally it gets no gradient, so the bypassed nodes are reached with none and do not run.  Where that tensor's
# own gradient is wanted -- a hook or retain_grad on it (registered even after relu ran), autograd.grad asking for
# it -- or under create_graph, the fused node sends relu's gradient down that edge instead and the unfused nodes
# do the rest (docs/fusion.md).
class BatchNormReLU(Function):
    """r = relu(y) for y = batch_norm(x) in training, recorded as one node: edges to x, weight, bias (batch norm's
    own) and y; its gradient equals the unfused relu-then-batch-norm gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, y, src):
        ctx.stats, ctx.eps, ctx.bypassed = src
        ctx.save_for_backward(x, weight, y)
        return wrap(B.activation_forward(handle_for(y), _RELU, y.data))

    @staticmethod
    def backward(ctx, g):
        x, weight, y = ctx.saved_tensors
        if is_grad_enabled() or any(gradient_wanted(n) for n in ctx.bypassed):
            return None, None, None, activation_grad(g, y, _RELU), None
        dx, _, dw, db = B.batch_normalization_backward_ex(handle_for(x), _SPATIAL, _BN_RELU, x.data, y.data,
                                                          _as_layout_of(g.data, x.data), _data(weight), *ctx.stats,
                                                          ctx.eps)
        return wrap(_as_layout_of(dx, x.data)), wrap(dw), wrap(db), None, None


class BatchNormAddReLU(Function):
    """r = relu(y + z) for y = batch_norm(x) in training, recorded as one node: edges to x, weight, bias, z and the
    sum a = y + z; its gradient equals the unfused relu, add and batch-norm gradients (the ReLU mask and dz = the
    masked gradient come from the batch-norm backward kernels)."""

    @staticmethod
    def forward(ctx, x, weight, bias, z, a, src):
        ctx.stats, ctx.eps, ctx.bypassed = src
        ctx.save_for_backward(x, weight, a)
        return wrap(B.activation_forward(handle_for(a), _RELU, a.data))

    @staticmethod
    def backward(ctx, g):
        x, weight, a = ctx.saved_tensors
        if is_grad_enabled() or any(gradient_wanted(n) for n in ctx.bypassed):
            return None, None, None, None, activation_grad(g, a, _RELU), None
        dx, dz, dw, db = B.batch_normalization_backward_ex(handle_for(x), _SPATIAL, _BN_ADD_RELU, x.data, a.data,
                                                          _as_layout_of(g.data, x.data), _data(weight), *ctx.stats,
                                                          ctx.eps)
        dz = _as_layout_of(dz, x.data) if ctx.needs_input_grad[3] else None
        return wrap(_as_layout_of(dx, x.data)), wrap(dw), wrap(db), (None if dz is None else wrap(dz)), None, None


def _batch_norm_composite(x, w, b, eps):
    """Training-mode batch norm in Tensor ops (biased batch variance, per channel of (N, C, *))."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    d = x - x.mean(axes, keepdim=True)
    y = d * ((d * d).mean(axes, keepdim=True) + eps) ** -0.5
    y = y if w is None else y * w.reshape(shape)
    return y if b is None else y + b.reshape(shape)


def _normalize_over(x, axes, eps):
    d = x - x.mean(axes, keepdim=True)
    return d * ((d * d).mean(axes, keepdim=True) + eps) ** -0.5


class BatchNormInference(Function):
    """y = x * a + c with a = weight / sqrt(running_var + eps), c = bias - running_mean * a (per channel)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps):
        y = B.batch_normalization_forward_inference(handle_for(x), _SPATIAL, x.data, _data(weight), _data(bias),
                                                    running_mean.data, running_var.data, eps)
        ctx.save_for_backward(x, weight, running_mean, running_var)
        ctx.eps = eps
        return wrap(y)

    @staticmethod
    def backward(ctx, gy):
        x, weight, mean, var = ctx.saved_tensors
        shape = (1, -1) + (1,) * (x.ndim - 2)
        axes = tuple(a for a in range(x.ndim) if a != 1)
        inv_std = ((var.detach() + ctx.eps) ** -0.5).reshape(shape)
        a = inv_std if weight is None else inv_std * weight.reshape(shape)
        need = ctx.needs_input_grad
        dx = gy * a if need[0] else None
        dw = (gy * (x - mean.detach().reshape(shape)) * inv_std).sum(axes) if need[1] else None
        db = gy.sum(axes) if need[2] else None
        return dx, dw, db, None, None, None


@autocast_op("batch_norm")
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5,
               *, _counter=None):
    """Normalise each channel of (N, C, *) with the batch's statistics (training, updating running_mean /
    running_var in place when given) or with running_mean / running_var (eval).  ``_counter`` (the BatchNorm
    layers' own use): the num_batches_tracked tensor, counted by the training forward's own launch."""
    op = "batch_norm"
    key = _seen_bn_key(input, running_mean, running_var, weight, bias, training)
    if key is not None and key in _SEEN_BN:     # validated before: the same checks would pass
        return _bn_apply(input, running_mean, running_var, weight, bias, training, momentum, eps, _counter)
    check_tensor(op, "input", input)
    if input.ndim < 2:
        raise ArgumentError(f"{op}: expected input of shape (N, C) or (N, C, *), got {tuple(input.shape)}")
    c = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        check_vector(op, name, t, c, input, same_dtype=False)
    if (running_mean is None) != (running_var is None):
        raise ArgumentError(f"{op}: give both running_mean and running_var, or neither")
    if not training and input.ndim >= 3 and _channels_last(input.data):
        # channels-last memory in eval: normalise the (N*H*W, C) view of it, so the output keeps that memory order
        # (training passes the NHWC-strided tensor itself: the kernels read channels-last natively, and relu finds
        # batch norm's node, so the fusion rules apply: docs/fusion.md)
        perm = B.channels_last_perm(input.ndim)
        rows = input.permute(perm).reshape(-1, c)
        y = batch_norm(rows, running_mean, running_var, weight, bias, training, momentum, eps, _counter=_counter)
        return y.reshape(tuple(input.shape[i] for i in perm)).permute(B.channels_first_perm(input.ndim))
    if training and input.numel() // c <= 1:
        raise ArgumentError(f"{op}: expected more than 1 value per channel when training, got input of shape "
                            f"{tuple(input.shape)}")
    if not training and running_mean is None:
        raise ArgumentError(f"{op}: running_mean and running_var are required when training=False")
    _SEEN_BN.remember(key, True)
    return _bn_apply(input, running_mean, running_var, weight, bias, training, momentum, eps, _counter)


# A batch_norm call whose arguments passed batch_norm's checks before skips them: they read only what the key
# holds -- input's shape, dtype and strides (the channels-last test), whether it is training, and each per-channel
# tensor's shape and dtype (or None).  Anything that is not a Tensor (or None) takes the full path.
_SEEN_BN = SeenCalls()


def _seen_bn_key(input, running_mean, running_var, weight, bias, training):
    if type(training) is not bool or not isinstance(input, Tensor):
        return None
    key = [training, input.data.shape, input.data.dtype, input.data.strides]
    for t in (running_mean, running_var, weight, bias):
        if t is None:
            key.append(None)
        elif isinstance(t, Tensor):
            key.append((t.data.shape, t.data.dtype))
        else:
            return None
    return tuple(key)


def _bn_apply(input, running_mean, running_var, weight, bias, training, momentum, eps, counter):
    """batch_norm after its checks: the training or the inference Function."""
    if training:
        momentum = 0.0 if momentum is None else float(momentum)
        out = BatchNormTraining.apply(input, _scale_for(weight, bias), bias, running_mean, running_var, momentum,
                                      float(eps), None if counter is None else counter.data)
        if counter is not None:
            counter._version += 1
        return out
    return BatchNormInference.apply(input, weight, bias, running_mean, running_var, float(eps))


class NormWithSavedStats(Function):
    """Layer and group norm: the forward primitive returns (y, mean, inv_std) and the backward primitive
    takes them back.  ``primitives`` is (forward, backward) bound to the op's settings (eps, dims, groups)."""

    @staticmethod
    def forward(ctx, x, weight, bias, op, primitives):
        forward, ctx.backward_primitive, ctx.composite = primitives
        y, mean, inv_std = forward(handle_for(x), x.data, _data(weight), _data(bias))
        ctx.op, ctx.stats = op, (mean, inv_std)
        ctx.save_for_backward(x, weight, bias)
        return wrap(y)

    @staticmethod
    def backward(ctx, gy):
        x, weight, bias = ctx.saved_tensors
        if creating_graph(gy, x, weight):       # the same normalisation in differentiable ops: second derivatives
            return (*composite_grads(ctx.needs_input_grad, ctx.composite, (x, weight, bias), gy), None, None)
        grads = ctx.backward_primitive(handle_for(x), x.data, gy.data, _data(weight), *ctx.stats)
        return (*(wrap(g) for g in grads), None, None)


@autocast_op("layer_norm")
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the trailing dims ``normalized_shape`` (per sample); weight and bias have that shape."""
    op = "layer_norm"
    check_tensor(op, "input", input)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or k > input.ndim or tuple(input.shape[input.ndim - k:]) != shape:
        raise ArgumentError(f"{op}: normalized_shape={shape} must be the trailing dims of input {tuple(input.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ArgumentError(f"{op}: {name} has shape {tuple(t.shape)} but normalized_shape is {shape}")
    eps = float(eps)
    def composite(x, w, b):
        y = _normalize_over(x, tuple(range(x.ndim - k, x.ndim)), eps)
        y = y if w is None else y * w
        return y if b is None else y + b
    primitives = (lambda h, x, w, b: B.layer_normalization_forward(h, x, w, b, k, eps),
                  lambda h, x, dy, w, mean, inv_std: B.layer_normalization_backward(h, x, dy, w, mean, inv_std, k),
                  composite)
    return NormWithSavedStats.apply(input, _scale_for(weight, bias), bias, op, primitives)


@autocast_op("group_norm")
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Normalise each sample over groups of C/num_groups channels (and all spatial positions)."""
    op = "group_norm"
    check_tensor(op, "input", input)
    if input.ndim < 2:
        raise ArgumentError(f"{op}: expected input of shape (N, C, *), got {tuple(input.shape)}")
    c = input.shape[1]
    if not (isinstance(num_groups, int) and num_groups >= 1 and c % num_groups == 0):
        raise ArgumentError(f"{op}: num_groups={num_groups!r} must be a positive divisor of the {c} channels of input "
                         f"{tuple(input.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        check_vector(op, name, t, c, input, same_dtype=False)
    eps = float(eps)
    def composite(x, w, b):
        n, shape = x.shape[0], (1, -1) + (1,) * (x.ndim - 2)
        y = _normalize_over(x.reshape(n, num_groups, -1), (2,), eps).reshape(x.shape)
        y = y if w is None else y * w.reshape(shape)
        return y if b is None else y + b.reshape(shape)
    primitives = (lambda h, x, w, b: B.group_normalization_forward(h, x, num_groups, w, b, eps),
                  lambda h, x, dy, w, mean, inv_std: B.group_normalization_backward(h, x, dy, num_groups, w, mean,
                                                                                    inv_std),
                  composite)
    return NormWithSavedStats.apply(input, _scale_for(weight, bias), bias, op, primitives)


class LocalResponseNorm(Function):
    @staticmethod
    def forward(ctx, x, desc):
        ctx.desc = desc
        ctx.save_for_backward(x)
        return wrap(B.lrn_cross_channel_forward(handle_for(x), desc, x.data))

    @staticmethod
    def backward(ctx, gy):
        x, = ctx.saved_tensors
        if creating_graph(gy, x):               # the same formula in differentiable ops: second derivatives
            desc = ctx.desc
            return composite_grads([True], lambda a: _lrn_composite(a, desc), (x,), gy)[0], None
        dx = B.lrn_cross_channel_backward(handle_for(x), ctx.desc, None, gy.data, x.data)
        return wrap(dx), None


def _lrn_composite(x, desc):
    """x / (k + alpha/n * sum of x^2 over channels c - n//2 .. c + (n-1)//2) ** beta, in Tensor ops."""
    from ...ops import cat
    sq = x * x
    lo, hi = desc.n // 2, (desc.n - 1) // 2
    parts = ([sq[:, :1].detach() * 0] * lo) + [sq] + ([sq[:, :1].detach() * 0] * hi)
    padded = cat(parts, 1) if lo or hi else sq
    c = x.shape[1]
    window = padded[:, 0:c]
    for i in range(1, desc.n):
        window = window + padded[:, i:i + c]
    return x * (window * (desc.alpha / desc.n) + desc.k) ** -desc.beta


def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    """x / (k + alpha/size * sum of x^2 over a window of ``size`` channels) ** beta (PyTorch's window placement)."""
    op = "local_response_norm"
    check_tensor(op, "input", input)
    if input.ndim < 3:
        raise ArgumentError(f"{op}: expected 3-D or higher input (N, C, *), got {tuple(input.shape)}")
    if not math.isfinite(alpha):
        raise ArgumentError(f"{op}: alpha={alpha} must be finite")
    return LocalResponseNorm.apply(input, B.LRNDescriptor(n=size, alpha=alpha, beta=beta, k=k))
