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
import os
import weakref

import numpy as np

from ... import backend as B
from ..._amp_state import autocast_op
from ..._grad_dest import destination
from ...autograd import Function, FunctionCtx, _state, gradient_wanted, is_grad_enabled
from ...backend._common import SeenCalls
from ...backend.array_ops import copy_like
from ...backend.devices import array_module
from ...backend.errors import ArgumentError
from ...backend.normalization import settled_activation, settled_backward, settled_training
from ...backend.tensor_ops import settled_add_relu
from ...ops.activation import activation_grad
from ...tensor import Tensor
from . import conv as _conv
from ._util import check_tensor, check_vector, composite_grads, creating_graph, exact, handle_for, wrap

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
        ctx.stats, ctx.eps, ctx.seen = (mean, inv_std), eps, None
        ctx.save_for_backward(x, weight, bias)
        return wrap(_as_layout_of(y, x.data))

    @staticmethod
    def backward(ctx, gy):
        x, weight, bias = ctx.saved_tensors
        if creating_graph(gy, x, weight):       # the same normalisation in differentiable ops: second derivatives
            eps = ctx.eps
            return (*composite_grads(ctx.needs_input_grad, lambda a, w, b: _batch_norm_composite(a, w, b, eps),
                                     (x, weight, bias), gy), None, None, None, None, None)
        seen = ctx.seen
        if seen is not None and FAST[0]:
            out = seen.backward(0, x, weight, None, gy, ctx.stats, _param_destinations(ctx, x))
            if out is not None:
                return exact((wrap(out[0]), wrap(out[2]), wrap(out[3]), None, None, None, None, None))
        dx, dw, db = B.batch_normalization_backward(handle_for(x), _SPATIAL, x.data, _as_layout_of(gy.data, x.data),
                                                    _data(weight), *ctx.stats, ctx.eps)
        if seen is not None and FAST[0]:
            seen.settle_backward(0, x, weight, None, gy, ctx.stats)
        return wrap(_as_layout_of(dx, x.data)), wrap(dw), wrap(db), None, None, None, None, None


    @staticmethod
    def fuse_relu(bn, y):
        """The consumer-fusion rule ``relu`` asks a producer for (ops/activation.py): relu(y) of this batch norm's
        output ``y`` as one node whose backward is the fused batch-norm + ReLU backward (the ReLU mask applied inside
        the batch-norm gradient kernels: one launch and one full-size temporary fewer per pair), or None to run the
        plain ReLU.  The forward is the plain ReLU (y is already computed); see docs/fusion.md."""
        if y.output_nr != 0 or not _fusable(bn):
            return None
        seen = bn.seen
        if seen is not None and FAST[0]:
            fused = seen.relu_node(bn, y)
            if fused is not None:
                return fused
        fused = BatchNormReLU.apply(*bn.saved, y, (bn.stats, bn.eps, (bn,), seen))
        if seen is not None and FAST[0] and seen.relu is None:
            seen.relu = seen.settle_relu(y)
        return fused

    @staticmethod
    def fuse_add_relu(bn, a, z_edge):
        """The rule the add of a residual block asks for (ops/elementwise.py, Add.fuse_relu): relu(a), a = y + z with
        y this batch norm's output and ``z_edge`` where z's gradient goes (None: z needs none), as one node whose
        backward is the fused batch-norm + add + ReLU backward (dz and dx from one kernel pair); None: plain ReLU."""
        if not _fusable(bn):
            return None
        seen = bn.seen
        if seen is not None and FAST[0]:
            fused = seen.add_relu_node(bn, a, z_edge)
            if fused is not None:
                return fused
        fused = BatchNormAddReLU.apply(*bn.saved, _edge_stand_in(z_edge, a), a, (bn.stats, bn.eps, (a.grad_fn, bn),
                                                                                 seen))
        if seen is not None and FAST[0] and seen.add_relu is None:
            seen.add_relu = seen.settle_relu(a)
        return fused

    @staticmethod
    def add_relu_twin(bn, y, ad, bd):
        """The rule the add asks an operand's producer for before it launches (ops/elementwise.py, Add.speculate):
        (relu(a), a, entry) for a = ad + bd from one launch, where y is this batch norm's output and its remembered
        entry saw a fused ReLU take the sum (the residual add's twin, docs/fusion.md; ``ADD_TWIN``); else None, and
        the add launches as before."""
        seen = bn.seen
        return None if seen is None or y.output_nr != 0 else seen.add_twin(bn, ad, bd)


def _fusable(bn):
    """Whether batch norm's node ``bn`` may be bypassed by a fused node: fusion on, no hook on its output, its
    saved tensors still there and not modified in place since (else the plain ReLU is recorded)."""
    saved = bn.saved
    if not (B.cudnn.fusion and saved is not None and not bn.pre_hooks):
        return False
    for t, v in zip(saved, bn.versions):     # x, weight, bias: Tensors or None
        if t is not None and t._version != v:
            return False
    return True


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
        ctx.stats, ctx.eps, ctx.bypassed, ctx.seen = src
        ctx.save_for_backward(x, weight, y)
        return wrap(B.activation_forward(handle_for(y), _RELU, y.data))

    @staticmethod
    def backward(ctx, g):
        x, weight, y = ctx.saved_tensors
        if is_grad_enabled() or _bypassed_wanted(ctx.bypassed):
            return None, None, None, activation_grad(g, y, _RELU), None
        seen = ctx.seen
        if seen is not None and FAST[0]:
            out = seen.backward(1, x, weight, y, g, ctx.stats, _param_destinations(ctx, x))
            if out is not None:
                return exact((wrap(out[0]), wrap(out[2]), wrap(out[3]), None, None))
        dx, _, dw, db = B.batch_normalization_backward_ex(handle_for(x), _SPATIAL, _BN_RELU, x.data, y.data,
                                                          _as_layout_of(g.data, x.data), _data(weight), *ctx.stats,
                                                          ctx.eps)
        if seen is not None and FAST[0]:
            seen.settle_backward(1, x, weight, y, g, ctx.stats)
        return wrap(_as_layout_of(dx, x.data)), wrap(dw), wrap(db), None, None


class BatchNormAddReLU(Function):
    """r = relu(y + z) for y = batch_norm(x) in training, recorded as one node: edges to x, weight, bias, z and the
    sum a = y + z; its gradient equals the unfused relu, add and batch-norm gradients (the ReLU mask and dz = the
    masked gradient come from the batch-norm backward kernels)."""

    @staticmethod
    def forward(ctx, x, weight, bias, z, a, src):
        ctx.stats, ctx.eps, ctx.bypassed, ctx.seen = src
        ctx.save_for_backward(x, weight, a)
        return wrap(B.activation_forward(handle_for(a), _RELU, a.data))

    @staticmethod
    def backward(ctx, g):
        x, weight, a = ctx.saved_tensors
        if is_grad_enabled() or _bypassed_wanted(ctx.bypassed):
            return None, None, None, None, activation_grad(g, a, _RELU), None
        seen = ctx.seen
        if seen is not None and FAST[0]:
            out = seen.backward(2, x, weight, a, g, ctx.stats, _param_destinations(ctx, x))
            if out is not None:
                dz = out[1] if ctx.needs_input_grad[3] else None
                return exact((wrap(out[0]), wrap(out[2]), wrap(out[3]), (None if dz is None else wrap(dz)), None, None))
        dx, dz, dw, db = B.batch_normalization_backward_ex(handle_for(x), _SPATIAL, _BN_ADD_RELU, x.data, a.data,
                                                          _as_layout_of(g.data, x.data), _data(weight), *ctx.stats,
                                                          ctx.eps)
        if seen is not None and FAST[0]:
            seen.settle_backward(2, x, weight, a, g, ctx.stats)
        dz = _as_layout_of(dz, x.data) if ctx.needs_input_grad[3] else None
        return wrap(_as_layout_of(dx, x.data)), wrap(dw), wrap(db), (None if dz is None else wrap(dz)), None, None


def _param_destinations(ctx, x):
    """(dscale, dbias): the weight's and the bias's empty flat-buffer slots where the kernels may write their
    gradients (gradient destinations, beta 0: minidnn/_grad_dest.py -- no copy into the optimizer's buffer
    afterwards), each (C,), C-contiguous, of the dtype the kernels write (float32 for 16-bit data); else ()."""
    need = ctx.needs_input_grad
    if not (need[1] and need[2]):
        return ()
    c = (x.shape[1],)
    dt = np.dtype(np.float32) if x.data.dtype.itemsize == 2 else x.data.dtype
    a, b = destination(ctx, 1, c, dt), destination(ctx, 2, c, dt)
    return () if a is None or b is None or a[1] or b[1] else (a[0], b[0])


def _bypassed_wanted(nodes):
    for n in nodes:
        if gradient_wanted(n):
            return True
    return False


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
        if dx is not None and dx.dtype != x.dtype:   # a 16-bit x (autocast) with float32 statistics: x's dtype back
            dx = dx.to(x.dtype)
        pg = gy if gy.dtype == mean.dtype else gy.to(mean.dtype)    # the parameters' gradients in their dtype
        dw = (pg * (x - mean.detach().reshape(shape)) * inv_std).sum(axes) if need[1] else None
        db = pg.sum(axes) if need[2] else None
        return dx, dw, db, None, None, None


@autocast_op("batch_norm")
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5,
               *, _counter=None):
    """Normalise each channel of (N, C, *) with the batch's statistics (training, updating running_mean /
    running_var in place when given) or with running_mean / running_var (eval).  ``_counter`` (the BatchNorm
    layers' own use): the num_batches_tracked tensor, counted by the training forward's own launch."""
    if training is True and FAST[0] and isinstance(input, Tensor) and type(momentum) is float \
            and type(eps) is float:     # a remembered call (below): straight to the kernels
        xd = input.data
        seen = _REMEMBERED.get((xd.shape, xd.strides, xd.dtype, momentum, eps, id(weight), id(bias),
                                id(running_mean), id(running_var), id(_counter)))
        if seen is not None:
            out = seen.forward(input, weight, bias, running_mean, running_var, _counter)
            if out is not None:
                return out
    op = "batch_norm"
    key = _seen_bn_key(input, running_mean, running_var, weight, bias, training)
    if key is not None and key in _SEEN_BN:     # validated before: the same checks would pass
        out = _bn_apply(input, running_mean, running_var, weight, bias, training, momentum, eps, _counter)
        if training is True and FAST[0]:
            _remember(input, running_mean, running_var, weight, bias, momentum, eps, _counter)
        return out
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
    out = _bn_apply(input, running_mean, running_var, weight, bias, training, momentum, eps, _counter)
    if training is True and FAST[0]:
        _remember(input, running_mean, running_var, weight, bias, momentum, eps, _counter)
    return out


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


# ---- remembered training calls on the GPU (docs/host_overhead.md round 14) --------------------------------------
# A training batch_norm call the full path above served with the GPU kernels is remembered, keyed by x's shape,
# strides and dtype, momentum and eps (Python floats only: other types take the full path, which converts or
# rejects them), and the identity of weight, bias, running_mean, running_var and the counter (held by the entry, so
# an id cannot be reused while it lives).  The entry (``_Remembered``) holds what the full path settled -- the
# kernels' settled call (bn_kernels.training_call), the node's input and output metadata -- and runs a repeated call
# in a few frames: the same launches, the same version bumps, a node with the same fields as Function.apply makes.
# Each call still checks what the key cannot hold: x's device, each per-channel tensor's array (``.data`` may be
# replaced), the running statistics requiring no gradient, anomaly mode, and in the kernels' call the one-pass switch
# and the 16-byte alignment; anything else takes the full path.  The entry also settles, on first use through the
# full path, the fused ReLU nodes' forward (the activation kernels' plan) and the three backward forms (plain, BN +
# ReLU, BN + add + ReLU) that its nodes reach.  No handle, cudnn flag or autocast state is read by these calls (the
# kernels take no handle setting; batch_norm has no autocast policy; the fusion switch is read by the rules at every
# call).  FAST[0] = False (or MINIDNN_BN_FAST=0 at import) switches all of it off: every call takes the full path.
FAST = [os.environ.get("MINIDNN_BN_FAST", "1") != "0"]
# The twin (docs/fusion.md, "Batch norm's forward writes relu(y) too"): a remembered call whose output a fused ReLU
# took before (the entry's ``relu`` plan) launches the kernels' twin call, which also writes relu(y), and leaves
# (relu(y), y) on the node; relu_node hands relu(y) out instead of launching the ReLU where y is unchanged (the same
# array, version 0).  An entry that launched TWIN_MISSES twins in a row that no ReLU took stops speculating.
# On by default since session 15's GPU A/B (H200, in-process, 10 rounds: ResNet-20 eager step -1.7%, MobileNet-small
# even); TWIN[0] = False (or MINIDNN_BN_TWIN=0 at import): no twin is written and the ReLU kernel runs, the launches
# of the full path (tests/nn/test_bn_fast_path.py compares those).
TWIN = [os.environ.get("MINIDNN_BN_TWIN", "1") != "0"]
TWIN_MISSES = 3
# The residual add's twin (docs/fusion.md, "The residual add writes relu(a) too"): an add of y (a remembered training
# batch norm's output) and a shortcut of y's layout, whose sum a fused ReLU took before (the entry's ``add_relu``
# plan), launches act_kernels' ADD with TWIN -- a and relu(a) from one launch -- and leaves (relu(a), a, entry) on the
# add's node; add_relu_node hands relu(a) out instead of launching the ReLU where a is unchanged (the same array,
# version 0).  TWIN_MISSES unused twins in a row stop the entry speculating.  ADD_TWIN[0] = False (or
# MINIDNN_ADD_TWIN=0 at import): no twin, the ReLU kernel runs (the launches of the full path).
ADD_TWIN = [os.environ.get("MINIDNN_ADD_TWIN", "1") != "0"]
# dx in channels-last memory (docs/fusion.md, "Batch norm's dx in channels-last memory"): a remembered backward whose
# dx goes to an NCHW convolution's backward that would stage it (an NHWC copy for its 16-byte loader, a launch a
# layer) has the kernels write dx in that memory order instead (bn_kernels.dx_nhwc_call: the same values), where
# they can (bn_bwd1 in one round) and nobody else sees dx: x has no hook, no retain_grad, autograd.grad does not
# capture it.  Decided per entry and convolution signature once (_stages_dy).  The convolution runs its NCHW
# backward calls on that dy's channels-first view (nn/_functions/conv.py _settle_pair), its dx NCHW as x.  Switch:
# DX_NHWC[0] = False, or MINIDNN_BN_DX_NHWC=0 at import.
DX_NHWC = [os.environ.get("MINIDNN_BN_DX_NHWC", "1") != "0"]
# The twin's NHWC shadow (docs/fusion.md, "The twin's NHWC shadow"): where a twin's ReLU output went into a
# convolution that staged it (an NHWC copy for its 16-byte loader; conv.py tells the entry, sh_want), the twin's
# kernel also writes relu's values in channels-last memory (bn_kernels.twin_nhwc_call, act_kernels' add_twin_plan
# shadow).  The fused node that hands a twin out keeps it (``sh``: the twin's array, its shadow or None, the entry
# that speculates it, the form) for the convolution that takes x to find (conv.py _offer_shadow, which empties the
# slot; it goes with the graph): it reads the shadow instead of staging x while x still holds that array at
# version 0 and the stream does not capture.  TWIN_MISSES unused shadows in a row stop it; none is written while
# the stream captures a CUDA graph.  TWIN_NHWC[0] = False, or MINIDNN_TWIN_NHWC=0 at import (session 16 run 6,
# H200: ResNet-20's eager step fp32 0.986-0.994x, bf16 0.952x of the switch-off step; bitwise on / off).
TWIN_NHWC = [os.environ.get("MINIDNN_TWIN_NHWC", "1") != "0"]
_REMEMBERED = SeenCalls()
_new = object.__new__


def _sig(a):
    return a.shape, a.strides, a.dtype, a.data.device_id


def _remember(input, running_mean, running_var, weight, bias, momentum, eps, counter):
    """After a full-path training call: remember it when the kernels ran it and it can be replayed (see above)."""
    xd = input.data
    if type(xd) is np.ndarray or type(momentum) is not float or type(eps) is not float \
            or (weight is None and bias is not None):
        return
    key = (xd.shape, xd.strides, xd.dtype, momentum, eps, id(weight), id(bias), id(running_mean), id(running_var),
           id(counter))
    tensors = (weight, bias, running_mean, running_var, counter)
    old = _REMEMBERED.get(key)
    if old is not None and old.dev == xd.data.device_id \
            and all(_data(t) is a for t, a in zip(tensors, (old.wd, old.bd, old.rmd, old.rvd, old.cd))):
        return      # known: the remembered call declined for a passing reason (anomaly mode, alignment, the switch)
    for t in (running_mean, running_var):
        if t is not None and (t.requires_grad or t.grad_fn is not None):
            return
    call = settled_training(xd, _data(weight), _data(bias), momentum, _data(running_mean), _data(running_var), eps,
                            _data(counter))
    if call is None:
        return
    r = _Remembered()
    r.call, r.sig, r.eps, r.factor = call, _sig(xd), eps, momentum
    r.twin_call, r.misses, r.add_twin_plan, r.add_misses = None, 0, None, 0
    r.shadow_call, r.add_shadow_plan, r.sh_want, r.sh_misses = None, None, [False, False], [0, 0]
    r.dev = r.sig[3]
    r.wd, r.bd, r.rmd, r.rvd, r.cd = (_data(t) for t in tensors)
    r.xmeta = (xd.shape, xd.dtype)
    r.wmeta = None if weight is None else (r.wd.shape, r.wd.dtype)
    r.bmeta = None if bias is None else (r.bd.shape, r.bd.dtype)
    r.out_meta = ((xd.shape, xd.dtype, array_module(xd)),)
    r.relu = r.add_relu = None
    r.backward_calls = [None, None, None]
    # (no channels-last dx for channels-last or 2-D x: nothing to look up at their backwards)
    r.dx_calls = [None, None, None] if xd.ndim >= 3 and xd.flags.c_contiguous else [False, False, False]
    r.dx_conv = (None, False)
    _REMEMBERED.remember(key, r)
    # The key holds the tensors' ids, the entry only their arrays: it goes when the first of them goes (a model
    # dropped in a notebook or a sweep takes its entries, and the arrays they hold, with it), so an id is never
    # met again by a stale entry.
    for t in tensors:
        if t is not None:
            weakref.finalize(t, _REMEMBERED.pop, key, None)


def _edge(t):
    """Function.apply's edge of an input while recording: a tensor that requires grad or has a node."""
    return t._edge() if t.requires_grad or t.grad_fn is not None else None


def _twin_of(twin, arr, t):
    """The relu a speculative launch wrote, ``twin`` = (relu, the array the launch read (batch norm's y) or wrote
    (the add's sum), ...), where tensor ``t`` still holds that array unchanged -- the same array at version 0 -- so
    relu is the ReLU kernel's bits from t; else None (the ReLU then launches)."""
    return twin[0] if twin is not None and twin[1] is arr and t._version == 0 else None


class _Remembered:
    """One remembered training signature (see above)."""
    __slots__ = ("call", "sig", "eps", "factor", "dev", "wd", "bd", "rmd", "rvd", "cd", "xmeta", "wmeta", "bmeta",
                 "out_meta", "relu", "add_relu", "backward_calls", "twin_call", "misses", "add_twin_plan",
                 "add_misses", "dx_calls", "dx_conv", "shadow_call", "add_shadow_plan", "sh_want", "sh_misses")

    def forward(self, x, weight, bias, running_mean, running_var, counter):
        """batch_norm(x, ...) as the full path computes and records it, or None (then nothing was done)."""
        xd = x.data
        if xd.data.device_id != self.dev or _state.anomaly:
            return None
        wd = bd = rmd = rvd = cd = None
        if weight is not None and (wd := weight.data) is not self.wd:
            return None
        if bias is not None and (bd := bias.data) is not self.bd:
            return None
        if running_mean is not None and ((rmd := running_mean.data) is not self.rmd or running_mean.requires_grad
                                         or running_mean.grad_fn is not None):
            return None
        if running_var is not None and ((rvd := running_var.data) is not self.rvd or running_var.requires_grad
                                        or running_var.grad_fn is not None):
            return None
        if counter is not None and (cd := counter.data) is not self.cd:
            return None
        xr = x.requires_grad
        wr = weight is not None and weight.requires_grad
        br = bias is not None and bias.requires_grad
        record = _state.grad_enabled and (xr or wr or br)
        out = twin = None
        if record and self.relu and TWIN[0] and self.misses < TWIN_MISSES and B.cudnn.fusion:
            out = self._twin(xd, wd, bd, rmd, rvd, cd)
        if out is None:
            out = self.call(xd, None, wd, bd, rmd, rvd, cd)
            if out is None:     # the one-pass switch or x's alignment changed: nothing launched
                return None
            y, mean, inv_std = out
        else:
            y, mean, inv_std, twin = out[:4]
        if running_mean is not None:
            running_mean._version += 1
        if running_var is not None:
            running_var._version += 1
        if counter is not None:
            counter._version += 1
        if not record:
            return wrap(y)
        ctx = _new(FunctionCtx)
        ctx._fn_cls = BatchNormTraining
        ctx.needs_input_grad = (xr, wr, br, False, False, False, False, False)
        ctx.next_edges = (_edge(x), None if weight is None else _edge(weight), None if bias is None else _edge(bias),
                          None, None, None, None, None)
        ctx._input_meta = (self.xmeta if xr else None, self.wmeta if wr else None, self.bmeta if br else None,
                           None, None, None, None, None)
        ctx._n_inputs = 8
        ctx.stats, ctx.eps, ctx.seen = (mean, inv_std), self.eps, self
        ctx.saved = (x, weight, bias)
        ctx.versions = (x._version, 0 if weight is None else weight._version, 0 if bias is None else bias._version)
        ctx._out_meta = self.out_meta
        ctx.num_outputs = 1
        if twin is not None:
            ctx.twin = (twin, y) if len(out) == 4 else (twin, y, out[4])
        return Function.output(ctx, y)

    def _twin(self, xd, wd, bd, rmd, rvd, cd):
        """(y, mean, inv_std, relu(y)) from the kernels' twin call, or None: no twin for this signature, or the call
        declined (nothing launched; the plain call then runs).  The call is settled at its first use, with this
        passing call's x (False where the kernels have none)."""
        call = self.twin_call
        if call is None:
            call = self.twin_call = settled_training(xd, wd, bd, self.factor, rmd, rvd, self.eps, cd, twin=True) \
                or False
        if not call:
            return None
        if self.sh_want[0] and TWIN_NHWC[0] and self.sh_misses[0] < TWIN_MISSES:
            sh = self.shadow_call
            if sh is None:
                from ...backend.cuda import bn_kernels
                sh = self.shadow_call = bn_kernels.twin_nhwc_call(xd, wd, bd, self.factor, rmd, rvd, self.eps, cd) \
                    or False
            out = sh(xd, None, wd, bd, rmd, rvd, cd) if sh else None     # (None while capturing: the twin alone)
            if out is not None:
                self.misses += 1
                self.sh_misses[0] += 1      # until a convolution takes it (conv.py)
                return out
        out = call(xd, None, wd, bd, rmd, rvd, cd)
        if out is not None:
            self.misses += 1        # until a ReLU takes it (relu_node)
        return out

    def add_twin(self, bn, ad, bd):
        """(relu(a), a, self) for a = ad + bd from act_kernels' ADD with TWIN (a: add_arrays' bits; relu(a): the ReLU
        kernel's from a), where this entry's sum went to a fused ReLU before and may again: ADD_TWIN on, fewer than
        TWIN_MISSES unused twins in a row, a graph recorded, fusion on, no anomaly mode, batch norm's node ``bn``
        fusable, ad and bd laid out as this signature (so a is, as add_relu_node wants); else None."""
        if not (self.add_relu and ADD_TWIN[0] and self.add_misses < TWIN_MISSES and _state.grad_enabled
                and B.cudnn.fusion) or _state.anomaly or not FAST[0]:
            return None
        sig = self.sig
        if _sig(ad) != sig or _sig(bd) != sig or not _fusable(bn):
            return None
        plan = self.add_twin_plan
        if plan is None:
            plan = self.add_twin_plan = settled_add_relu(ad, bd) or False
        if not plan:
            return None
        if self.sh_want[1] and TWIN_NHWC[0] and self.sh_misses[1] < TWIN_MISSES:
            sh = self.add_shadow_plan
            if sh is None:
                from ...backend.cuda import act_kernels
                sh = self.add_shadow_plan = act_kernels.add_twin_plan(ad, shadow=True) or False
            r = sh(ad, bd) if sh else None      # (None while capturing: the twin alone)
            if r is not None:
                self.add_misses += 1
                self.sh_misses[1] += 1      # until a convolution takes it (conv.py)
                return r[1], r[0], self, r[2]
        out, twin = plan(ad, bd)
        self.add_misses += 1        # until a ReLU takes it (add_relu_node)
        return twin, out, self

    def settle_relu(self, a):
        """The activation kernels' plan for relu(a), where ``a`` (this signature's y, or y + z) is laid out as x; else
        False (the fused nodes then keep the full path)."""
        ad = a.data
        if _sig(ad) != self.sig:
            return False
        return settled_activation(_RELU, ad) or False

    def relu_node(self, bn, y):
        """BatchNormReLU.apply(*bn.saved, y, src) as Function.apply records it, or None."""
        plan = self.relu
        if not plan or _state.anomaly:
            return None
        yd = y.data
        if _sig(yd) != self.sig:
            return None
        x, weight, bias = bn.saved
        twin = vars(bn).pop("twin", None)       # taken at most once: two ReLUs of y get two arrays
        r = _twin_of(twin, yd, y)
        if r is None:
            r = plan(yd)
        else:
            self.misses = 0
            if TWIN_NHWC[0] and r.ndim == 4 and r.flags.c_contiguous:
                return self._fused(BatchNormReLU, r, bn, (bn,), x, weight, bias, None, y,
                                   (r, twin[2] if len(twin) > 2 else None, self, 0))
        return self._fused(BatchNormReLU, r, bn, (bn,), x, weight, bias, None, y)

    def add_relu_node(self, bn, a, z_edge):
        """BatchNormAddReLU.apply(*bn.saved, stand-in of z, a, src) as Function.apply records it, or None."""
        plan = self.add_relu
        if not plan or _state.anomaly:
            return None
        ad = a.data
        if _sig(ad) != self.sig:
            return None
        x, weight, bias = bn.saved
        add = a.grad_fn
        twin = getattr(add, "twin", None)       # the add's speculated (relu(a), a, entry): add_twin
        add.twin = None                         # taken at most once: a second ReLU of a gets its own array
        r = _twin_of(twin, ad, a)
        if r is None:
            r = plan(ad)
        else:
            twin[2].add_misses = 0
            if TWIN_NHWC[0] and r.ndim == 4 and r.flags.c_contiguous:
                return self._fused(BatchNormAddReLU, r, bn, (add, bn), x, weight, bias, z_edge, a,
                                   (r, twin[3] if len(twin) > 3 else None, twin[2], 1))
        return self._fused(BatchNormAddReLU, r, bn, (add, bn), x, weight, bias, z_edge, a)

    def _fused(self, cls, r, bn, bypassed, x, weight, bias, z_edge, y, sh=None):
        """The fused node over y (or the sum a) and its output r.  Inputs as apply sees them: x, weight, bias, (the
        stand-in of z,) y, src; the stand-in requires grad exactly when z_edge is not None, with z_edge as its edge
        and a's shape and dtype.  r has y's shape and dtype (checked by the caller: y is laid out as x).  ``sh``: a
        twin handed out, (r, its NHWC shadow or None, the entry that speculates it, form), kept on the node for
        the convolution that takes r (conv.py _offer_shadow): it goes with the graph."""
        xr = x.requires_grad
        xd = x.data
        xe = x._edge() if xr or x.grad_fn is not None else None
        xm = (xd.shape, xd.dtype) if xr else None
        wr = br = False
        we = be = wm = bm = None
        if weight is not None:
            wr = weight.requires_grad
            if wr or weight.grad_fn is not None:
                we = weight._edge()
            if wr:
                wm = (weight.data.shape, weight.data.dtype)
        if bias is not None:
            br = bias.requires_grad
            if br or bias.grad_fn is not None:
                be = bias._edge()
            if br:
                bm = (bias.data.shape, bias.data.dtype)
        yr = y.requires_grad
        ye = y._edge() if yr or y.grad_fn is not None else None
        ym = self.xmeta if yr else None
        ctx = _new(FunctionCtx)
        ctx._fn_cls = cls
        if cls is BatchNormReLU:
            ctx.needs_input_grad = (xr, wr, br, yr, False)
            ctx.next_edges = (xe, we, be, ye, None)
            ctx._input_meta = (xm, wm, bm, ym, None)
            ctx._n_inputs = 5
        else:
            zr = z_edge is not None
            ctx.needs_input_grad = (xr, wr, br, zr, yr, False)
            ctx.next_edges = (xe, we, be, z_edge, ye, None)
            ctx._input_meta = (xm, wm, bm, self.xmeta if zr else None, ym, None)
            ctx._n_inputs = 6
        ctx.stats, ctx.eps, ctx.bypassed, ctx.seen = bn.stats, bn.eps, bypassed, self
        ctx.saved = (x, weight, y)
        ctx.versions = (x._version, 0 if weight is None else weight._version, y._version)
        ctx._out_meta = self.out_meta
        ctx.num_outputs = 1
        if sh is not None:
            ctx.sh = sh
            _conv.SHADOWS[0] = True
        return Function.output(ctx, r)

    def backward(self, form, x, weight, y, g, stats, dests=()):
        """(dx, dz, dscale, dbias) of backward form ``form`` (0 plain, 1 BN + ReLU, 2 BN + add + ReLU) from the
        settled kernels' call, or None (the caller takes the full path); ``dests``: (dscale, dbias) arrays to write
        the parameter gradients into (``_param_destinations``)."""
        call = self.backward_calls[form]
        if not call:
            return None
        sig, xd, gd = self.sig, x.data, g.data
        if _sig(xd) != sig or _sig(gd) != sig:
            return None
        yd = None
        if y is not None and _sig(yd := y.data) != sig:
            return None
        wd = None
        if weight is not None and (wd := weight.data) is not self.wd:
            return None
        cl, node = self.dx_calls[form], x.grad_fn
        if cl is not False and node is not None and DX_NHWC[0] and self._dx_to_conv(node):
            if cl is None:
                cl = self.dx_calls[form] = settled_backward(xd, gd, wd, stats[0], stats[1], yd, form == 2, True) \
                    or False
            out = cl(xd, gd, wd, stats[0], stats[1], yd, *dests) if cl else None
            if out is not None:
                return out
        return call(xd, gd, wd, stats[0], stats[1], yd, *dests)

    def _dx_to_conv(self, node):
        """Whether dx (the gradient of x, output of ``node``) goes, unseen, to a convolution backward that would
        stage it: DX_NHWC's rule (above), its convolution part decided once per convolution signature."""
        if node._fn_cls is not _conv.ConvForward or gradient_wanted(node):
            return False
        key = (node.seen, node.needs_input_grad)
        if self.dx_conv[0] != key:
            self.dx_conv = (key, _stages_dy(node.seen, node.needs_input_grad))
        return self.dx_conv[1]

    def settle_backward(self, form, x, weight, y, g, stats):
        """After a full-path backward of form ``form`` through these arrays: remember the kernels' call (False where
        the primitive ran anything else).  Only for x, dy (and y) laid out as this signature, the weight's array."""
        if self.backward_calls[form] is not None:
            return
        xd, gd = x.data, g.data
        if _sig(xd) != self.sig or _sig(gd) != self.sig or (y is not None and _sig(y.data) != self.sig) \
                or (weight is not None and weight.data is not self.wd):
            return
        self.backward_calls[form] = settled_backward(xd, gd, _data(weight), stats[0], stats[1],
                                                     None if y is None else y.data, form == 2) or False


def _stages_dy(seen, need):
    """Whether the remembered NCHW convolution ``seen`` (conv.py's _SeenConv: its fast path, the implicit-GEMM
    kernels) stages an NCHW dy for its 16-byte NHWC loader in the backward directions ``need`` asks for (backward
    data, backward filter): conv_igemm's own staging rule on the problem.  Not the 1x1 convolutions the GEMM route
    takes (conv_pointwise: NCHW operands as they are, nothing staged; a channels-last dy would send them to the
    implicit-GEMM kernels instead)."""
    fwd = None if seen is None or seen.nhwc or not _conv.FAST_PATH[0] else seen.forward
    if fwd is None or fwd.igemm is None or fwd.p.nd != 2:
        return False
    from ...backend.cuda import conv_igemm, conv_pointwise
    p = fwd.p
    if conv_pointwise.ENABLED[0] and conv_pointwise.supports(p) is None:
        return False
    return bool((need[0] and conv_igemm._stageable(1, p)) or (need[1] and conv_igemm._stageable(2, p)))


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
