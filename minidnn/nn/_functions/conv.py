"""Convolution and transposed convolution, 1-D to 3-D, as three mutually differentiable Functions.

# x: (N, C_in, *in)   weight (conv): (C_out, C_in/groups, *k)   y: (N, C_out, *out)
# weight (conv_transpose): (C_in, C_out/groups, *k), PyTorch's layout = the conv weight it transposes

The three backend primitives are bilinear maps, so each one's derivatives are the other two (the
Chainer way):

    ConvForward(x, w)          = y     d/dx -> ConvBackwardData(w, gy)     d/dw -> ConvBackwardFilter(x, gy)
    ConvBackwardData(w, dy)    = dx    d/dw -> ConvBackwardFilter(g, dy)   d/ddy -> ConvForward(g, w)
    ConvBackwardFilter(x, dy)  = dw    d/dx -> ConvBackwardData(g, dy)     d/ddy -> ConvForward(x, g)

Every backward is written with these Functions, so conv and conv_transpose have gradients of any
order for free, and conv_transpose *is* ConvBackwardData used forward.  A convolution's bias is an optional fourth
input of ConvForward (one node, as PyTorch's ConvolutionBackward0: db is convolution_backward_bias's sum, under
create_graph a Tensor sum; docs/host_overhead.md round 21); conv_transpose's is added by BiasAdd (bias.py).
"""
from __future__ import annotations

import math
import os

from ... import backend as B
from ..._amp_state import autocast_op, float32_grad_of, graph_weight, leaf_grad
from ..._grad_dest import destination
from ...autograd import Function, _state, is_grad_enabled
from ...backend._common import SeenCalls
from ...backend.convolution import convolution_filter_carry, settle_convolution, settled_state
from ...backend.errors import ArgumentError, DTypeError
from ...backend.threads import parallel_pair
from ...ops import pad as _pad
from ...tensor import Tensor
from ._util import (
    apply_seen,
    batched,
    check_tensor,
    check_vector,
    descriptor,
    exact,
    handle_for,
    ntuple,
    plain_setting,
    plain_settings,
    wrap,
)
from .bias import add_bias, bias_forward, bias_grad

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
           "ConvForward", "ConvBackwardData", "ConvBackwardFilter"]


# Channels-last activations (PyTorch's memory format: NCHW indexing, NHWC memory) go to the backend as the NHWC-indexed
# views they are, so kernels with native NHWC paths read them without a transpose, and outputs keep that layout.
def _channels_last(arr):
    return arr.ndim >= 3 and B.memory_format(arr) is B.TensorFormat.NHWC


def _last(arr):
    return arr.transpose(B.channels_last_perm(arr.ndim))


def _first(arr):
    return arr.transpose(B.channels_first_perm(arr.ndim))


def _last_shape(shape):
    return tuple(shape[i] for i in B.channels_last_perm(len(shape)))


# The three primitives on a Tensor's arrays (channels-last activations as their NHWC views); each Function's forward
# is one of these, and a first-order backward calls them directly (no Function recorded: no graph is being built).
def _forward(x, w, desc):
    if _channels_last(x.data):
        return wrap(_first(B.convolution_forward(handle_for(x), _last(x.data), w.data, desc, format="NHWC")))
    return wrap(B.convolution_forward(handle_for(x), x.data, w.data, desc))


def _backward_data(w, dy, desc, x_shape, h=None):
    h = handle_for(w) if h is None else h
    if _channels_last(dy.data):
        return wrap(_first(B.convolution_backward_data(h, w.data, _last(dy.data), desc, _last_shape(x_shape),
                                                       format="NHWC")))
    return wrap(B.convolution_backward_data(h, w.data, dy.data, desc, tuple(x_shape)))


def _backward_data_carried(w, dy, desc, x_shape, h, carry):
    """``_backward_data`` inside the forward's filter carry (ConvForward), where it holds one."""
    if carry is None:
        return _backward_data(w, dy, desc, x_shape, h)
    with carry:
        return _backward_data(w, dy, desc, x_shape, h)


def _backward_filter(x, dy, desc, w_shape, h=None, dw_dtype=None):
    """dw; ``dw_dtype`` float32 (first order, w autocast's cast of a float32 weight: ``float32_grad_of``): the
    kernels' float32 sums unrounded, which the cast node passes through, or which reach the parameter directly
    (autocast's direct weights, whose edge is the parameter's own; docs/amp.md)."""
    h = handle_for(x) if h is None else h
    extra = {} if dw_dtype is None else {"dw_dtype": dw_dtype}
    if _channels_last(x.data) and _channels_last(dy.data):
        return wrap(B.convolution_backward_filter(h, _last(x.data), _last(dy.data), desc, tuple(w_shape),
                                                  format="NHWC", **extra))
    return wrap(B.convolution_backward_filter(h, x.data, dy.data, desc, tuple(w_shape), **extra))


# The forward's filter copy, carried to the first-order backward data (docs/host_overhead.md round 12): on the GPU,
# where the forward copies an NCHW filter to KRSC for the kernels' 16-byte loader, ``convolution_filter_carry``
# keeps that copy on the ctx and backward data reads it (WKRSC=1) instead of making its own CRSK copy: one launch
# less per layer and step, the same bits, one filter copy of memory held from forward to backward.  It is the
# filter the forward multiplied by, and backward reads it only after ``saved_tensors`` passed autograd's version
# check of w (an in-place change of w raises there).  Switch: CARRY_FILTER[0] = False, or the environment's
# MINIDNN_CONV_CARRY_FILTER=0 at import (tests and the A/B bench compare both).
CARRY_FILTER = [os.environ.get("MINIDNN_CONV_CARRY_FILTER", "1") != "0"]
# The forward's NHWC staging copy of an NCHW x, carried the same way to the backward filter (session 8): where the
# GPU kernels stage x (large NCHW problems, docs/conv_kernels.md), the copy is kept on the ctx instead of a scratch
# buffer and the filter gradient reads it instead of staging x again -- one transposing launch less per layer and
# step (ResNet-20 fp32: 19), the same bits, one NHWC copy of x held from forward to backward (where autograd holds
# x itself anyway).  Switch: CARRY_X[0] = False, or MINIDNN_CONV_CARRY_X=0 at import.
CARRY_X = [os.environ.get("MINIDNN_CONV_CARRY_X", "1") != "0"]
# A channels-last weight's gradient slot (the fused optimizers keep a parameter's memory format, session 8) is offered
# to the implicit-GEMM filter gradient, whose NHWC loader writes dw in KRSC memory (DWKRSC): no copy into the slot.
# Switch: CL_DW_SLOT[0] = False, or MINIDNN_CONV_CL_DW_SLOT=0 at import (the engine then copies dw into the slot).
CL_DW_SLOT = [os.environ.get("MINIDNN_CONV_CL_DW_SLOT", "1") != "0"]
# The twin's NHWC shadow (docs/fusion.md; norm.TWIN_NHWC): an x made by a fused batch-norm (+ add) + ReLU node from
# a twin finds it on that node, ``x.grad_fn.sh`` = (the twin's array -- x's own, by identity --, its channels-last
# shadow or None, the entry that speculates it, the form: 0 batch norm's twin, 1 the add's).  The forward offers
# the shadow to the kernels (filter_carry.xshadow: taken where they would stage x, never while the stream captures)
# while x is at version 0, and tells the entry what happened, emptying the slot: taken (its unused count reset), or
# x staged (the entry then asks for the shadow).  SHADOWS[0]: set by norm once a node kept a twin so.
SHADOWS = [False]


def _keep_state(w):
    """What the backend's kept filter copies are stamped with (backend/cuda/conv_filter_keep.py): the weight
    Tensor's array and version."""
    return w.data, w._version


def _new_carry(need, w):
    """The filter_carry for a GPU forward of weight ``w`` whose gradients ``need`` asks for: it also asks the
    backend for the copy of w's filter kept across steps (one refresh launch a forward for all of them)."""
    return convolution_filter_carry(need[1] and CARRY_X[0], need[0] and CARRY_FILTER[0], (w, _keep_state))


def _offer_shadow(x, carry):
    """x's node, where x is a twin handed out with its slot still on the node (None: it is not), its shadow offered
    to the forward where x is at version 0."""
    node = x.grad_fn
    o = getattr(node, "sh", None)
    if o is None or o[0] is not x.data:
        return None
    if o[1] is not None and x._version == 0:
        xd = x.data
        carry.xshadow = (o[1], (xd.data.ptr, xd.shape, xd.strides, xd.dtype))
    return node


def _shadow_outcome(node, carry):
    o = node.sh
    if carry.xshadow is not None:               # offered, not taken (this convolution stages nothing, or the
        carry.xshadow = None                    # stream captures): the slot stays for another convolution of x
    elif o[1] is not None and carry.xs is o[1]:
        node.sh = None
        o[2].sh_misses[o[3]] = 0
    elif carry.xs is not None:                  # x staged (the forward's copy, kept for the filter gradient)
        node.sh = None
        o[2].sh_want[o[3]] = True


def _kept(carry):
    if carry is None:
        return None
    carry.keep = None       # (the weight is the backend's business only during the forward call)
    return carry if carry.krsc is not None or carry.xs is not None else None


# ---- the fast path of a seen GPU convolution (docs/host_overhead.md round 13) -----------------------------------
# A conv call whose signature was seen runs the backend's settled calls (backend.convolution.settle_convolution)
# for its forward and its first-order backward pair, instead of the primitives' checks, plan lookup, algorithm
# choice and the kernel module's own lookup: the same kernels, launches and bits with ~6 frames less per call.
# One remembered _SeenConv per signature; its key (``_fast_key``) holds what any layer's checks or choices read:
# conv's settings and both operands' shapes and dtypes (the seen-call key), the arrays' type, strides and 16-byte
# alignment, the handle (per thread and device) with its settings after the ``cudnn`` flags (handle_for applies
# them: benchmark, deterministic, math type / allow_tf32, workspace limit, stream) and the backend's
# ``settled_state()`` (its algorithm caches' generation, the kernel modules' switches).  Autocast casts before
# _conv (the key sees the cast dtypes); the needs_input_grad pattern, the filter carry and autocast's float32
# filter gradient key the backward pair (``_SeenConv.pair``).  The settled calls serve only the default case (a
# CUDA array, a handle without benchmark mode or a stream, a non-empty batch): anything else settles to None and
# keeps the full path, as does a call made on another current device.  Switch: FAST_PATH[0] = False, or the
# environment's MINIDNN_CONV_FAST=0 at import.
FAST_PATH = [os.environ.get("MINIDNN_CONV_FAST", "1") != "0"]
_FAST_CONV = SeenCalls()
# Host round 31: the fast key's three settings tested together, a layer's own tuples by identity (_util's
# plain_settings: the key holds the same values).  Switch: LEAN_CONV[0] = False (or MINIDNN_CONV_LEAN=0 at import):
# plain_setting thrice.  (The round also wrote a bias-free convolution's node out beside apply_seen; the final review
# took that copy of the shared mechanism out again.)
LEAN_CONV = [os.environ.get("MINIDNN_CONV_LEAN", "1") != "0"]


def _fast_key(op, x, weight, bias, stride, padding, dilation, groups):
    """The fast path's key of a conv call: what ``_seen_conv_key`` holds and the rest above (None: the full path)."""
    if not (isinstance(x, Tensor) and isinstance(weight, Tensor) and B.is_cuda_array(x.data)):
        return None             # (CPU calls: out at once)
    if LEAN_CONV[0]:
        if not plain_settings(stride, padding, dilation):
            return None
    else:
        stride, padding, dilation = plain_setting(stride), plain_setting(padding), plain_setting(dilation)
        if stride is None or padding is None or dilation is None:
            return None
    xd, wd = x.data, weight.data
    if type(groups) is not int or type(xd) is not type(wd):
        return None
    if bias is None:
        b = None
    elif isinstance(bias, Tensor):
        b = (bias.data.shape, bias.data.dtype)
    else:
        return None
    h = handle_for(x)
    return (op, xd.shape, xd.dtype, xd.strides, xd.data.ptr & 15, wd.shape, wd.dtype, wd.strides, wd.data.ptr & 15,
            b, groups, stride, padding, dilation, h, h.benchmark, h.math_type, h.deterministic, h.workspace_limit,
            h.stream, settled_state())


class _SeenConv:
    """A seen conv signature: its descriptor, the settled forward (None: the full path), whether x is channels-last
    (the primitives see its NHWC view), and the settled backward pairs by ``_pair_key``."""
    __slots__ = ("desc", "forward", "nhwc", "pairs")

    def __init__(self, desc, x, w):
        self.desc, self.nhwc, self.pairs = desc, _channels_last(x.data), {}
        xa = _last(x.data) if self.nhwc else x.data
        self.forward = settle_convolution(0, handle_for(x), xa, w.data, desc, None, "NHWC" if self.nhwc else None)

    def pair(self, x, w, gy, need, carry, dw_dtype, x_shape, w_shape):
        """(settled backward data or None, settled backward filter or None, dy's NHWC view wanted) of a first-order
        backward; None where a wanted one is not settled (the full path)."""
        gd = gy.data
        t = w if x is None else x
        if type(gd) is not type(t.data):
            return None
        h = handle_for(t)
        key = (gd.shape, gd.strides, gd.dtype, gd.data.ptr & 15, need, carry is not None, dw_dtype, h, h.benchmark,
               h.math_type, h.deterministic, h.workspace_limit, h.stream, settled_state())
        pair = self.pairs.get(key, 0)
        if pair == 0:
            if len(self.pairs) >= 64:
                self.pairs.clear()
            pair = self.pairs[key] = self._settle_pair(x, w, gy, need, h, dw_dtype, x_shape, w_shape)
        return pair

    def _settle_pair(self, x, w, gy, need, h, dw_dtype, x_shape, w_shape):
        # an NHWC call only where x is channels-last too: an NCHW layer's channels-last dy (batch norm's DX_NHWC,
        # written so for the 16-byte loader) runs NCHW calls on dy's channels-first view, dx channels-first as x
        dy_last = _channels_last(gy.data) and self.nhwc
        data = filt = None
        if need[0]:
            dya, shape = (_last(gy.data), _last_shape(x_shape)) if dy_last else (gy.data, tuple(x_shape))
            data = settle_convolution(1, h, w.data, dya, self.desc, shape, "NHWC" if dy_last else None)
            if data is None:
                return None
        if need[1]:
            filt = settle_convolution(2, h, _last(x.data) if dy_last else x.data,
                                      _last(gy.data) if dy_last else gy.data, self.desc, tuple(w_shape),
                                      "NHWC" if dy_last else None, dw_dtype)
            if filt is None:
                return None
        return data, filt, dy_last


def _landed(result, dest):
    """The gradient Tensor of a settled call that was offered ``dest``: the engine's pending Tensor (blended into),
    the leaf slot wrapped (written), or the fresh result where the call could not use it."""
    if dest is None or result is not dest[0]:
        return wrap(result)
    return dest[2] if dest[2] is not None else wrap(result)


def _fast_backward(ctx, seen, x, w, gy, need, carry):
    """ConvForward's first-order backward by the settled calls; None where the full path must run (nothing ran).
    Each gradient goes where the engine would add or copy it, where it offers that (a gradient destination: the
    residual block input's other gradient, the optimizer's flat-buffer slot of the weight)."""
    x_shape, w_shape = ctx.shapes
    pair = seen.pair(x, w, gy, need, carry, ctx.dw_dtype, x_shape, w_shape)
    if pair is None:
        return None
    data, filt, dy_last = pair
    gd = gy.data        # the settled calls take the channels-first views (SettledConvolution.first), any memory order
    dw = destination(ctx, 1, tuple(w_shape), ctx.dw_dtype or gd.dtype, filt.igemm is not None and CL_DW_SLOT[0]) \
        if filt is not None else None
    if dw is not None and dw[1]:        # the filter gradient into a slot only (beta 0): a weight used twice keeps
        dw = None                       # the engine's add (its split-K / atomic variants' blending is not relied on)
    if data is None:                                # the filter gradient alone
        with B.convolution_shared_staging(carry):   # x's NHWC copy, where the forward kept one
            gw = filt.first(x.data, gd, None, *(dw[:2] if dw else ()))
        return None if gw is None else (None, _landed(gw, dw), None)
    # dx into the pending gradient (beta 1), channels-last too: backward data blends into one laid out as its
    # fresh result (SettledConvolution.first checks; another layout gets a fresh dx and the engine's add)
    dx = destination(ctx, 0, tuple(x_shape), gd.dtype, dy_last)
    if filt is None:                                # the data gradient alone
        gx = data.first(w.data, gd, carry, *(dx[:2] if dx else ()))
        return None if gx is None else (_landed(gx, dx), None, None)
    with B.convolution_shared_staging(carry):       # both read dy: its NHWC copy is made once (x's: kept)
        gx = data.first(w.data, gd, carry, *(dx[:2] if dx else ()))
        if gx is None:
            return None
        gw = filt.first(x.data, gd, None, *(dw[:2] if dw else ()))
    return _landed(gx, dx), _landed(gw, dw), None


def _bias_grad(ctx, gy):
    """db (bias.py's bias_grad); first order on the GPU into the bias's gradient slot where the engine offers one (a
    leaf's destination, beta 0: a bias used twice keeps the engine's add)."""
    gd = gy.data
    dest = None
    if not is_grad_enabled() and B.is_cuda_array(gd):
        wide = ctx.db_dtype
        dest = destination(ctx, 3, (gd.shape[1],), gd.dtype if wide is None else wide)
        if dest is not None and dest[1]:
            dest = None
    return bias_grad(ctx, gy, None if dest is None else dest[0])


class ConvForward(Function):
    """y = conv(x, w) (+ b, the layer's bias, along the channels: one node, as PyTorch's ConvolutionBackward0 owns
    the bias; called without b by the other two Functions' backwards)."""

    @staticmethod
    def forward(ctx, x, w, desc, b=None):
        if b is not None:
            return bias_forward(ctx, ConvForward.forward(ctx, x, w, desc), b, fresh=True)
        seen = None
        if type(desc) is _SeenConv:     # from _conv: a seen signature (the fast path's remembered object)
            seen, desc = desc, desc.desc
        ctx.desc = desc
        # gx needs w, gw needs x: keep only what the requested gradients use.
        need = ctx.needs_input_grad
        ctx.save_for_backward(x if need[1] else None, w if need[0] else None)
        ctx.shapes = (tuple(x.shape), tuple(w.shape))
        ctx.dw_dtype = float32_grad_of(w) if need[1] else None
        ctx.seen = seen
        if seen is not None and seen.forward is not None:
            carry = _new_carry(need, w)
            found = _offer_shadow(x, carry) if SHADOWS[0] and x.grad_fn is not None else None
            y = seen.forward.first(x.data, w.data, carry)      # channels-last x as it is (no NHWC view)
            if y is not None:
                if found is not None:
                    _shadow_outcome(found, carry)
                ctx.carry = _kept(carry)
                return wrap(y)
        carry = _new_carry(need, w) if B.is_cuda_array(w.data) else None
        if carry is None:
            ctx.carry = None
            return _forward(x, w, desc)
        with carry:
            y = _forward(x, w, desc)
        ctx.carry = _kept(carry)
        return y

    @staticmethod
    def backward(ctx, gy):
        if len(ctx.needs_input_grad) == 4:     # with the bias: db first (the launch order of the separate node)
            gb = _bias_grad(ctx, gy) if ctx.needs_input_grad[3] else None
            if gb is not None and is_grad_enabled():
                gb = leaf_grad(ctx, 3, gb)      # autocast's direct bias: its float32 gradient (create_graph)
            return (*ConvForward._backward(ctx, gy), gb)
        return ConvForward._backward(ctx, gy)

    @staticmethod
    def _backward(ctx, gy):
        x, w = ctx.saved_tensors
        x_shape, w_shape = ctx.shapes
        need = ctx.needs_input_grad
        carry, ctx.carry = ctx.carry, None      # read once: a retained graph's second backward makes its own copy
        if not (need[0] or need[1]):            # the bias's gradient alone (frozen weight, input without grad)
            return None, None, None
        if not is_grad_enabled():       # first order: the primitives directly
            if ctx.seen is not None and FAST_PATH[0]:
                grads = _fast_backward(ctx, ctx.seen, x, w, gy, need, carry)
                if grads is not None:
                    return exact(grads)
            if need[0] and need[1]:     # both read gy: the GPU kernels' NHWC copy of it is made once
                # independent: on the CPU at >= 2 threads, one per thread (threads.parallel_pair, docs/threads.md)
                work = 0 if B.is_cuda_array(gy.data) else gy.data.size * math.prod(w_shape[1:])    # each half's
                h = handle_for(x)       # resolved here: the default handle is per thread, and the pair's second
                #                         half may run on a pool thread (its own handle, algorithm cache, settings)
                with B.convolution_shared_staging(carry):
                    return (*parallel_pair(lambda: _backward_data_carried(w, gy, ctx.desc, x_shape, h, carry),
                                           lambda: _backward_filter(x, gy, ctx.desc, w_shape, h, ctx.dw_dtype),
                                           work), None)
            with B.convolution_shared_staging(carry):
                return (_backward_data_carried(w, gy, ctx.desc, x_shape, None, carry) if need[0] else None,
                        _backward_filter(x, gy, ctx.desc, w_shape, None, ctx.dw_dtype) if need[1] else None, None)
        # create_graph: autocast's direct weight computes as its cast node's output and gets its gradient widened
        # to the float32 parameter as that node did (the old graph: _amp_state.graph_weight / leaf_grad)
        gx = ConvBackwardData.apply(graph_weight(w), gy, ctx.desc, x_shape) if need[0] else None
        gw = leaf_grad(ctx, 1, ConvBackwardFilter.apply(x, gy, ctx.desc, w_shape)) if need[1] else None
        return gx, gw, None


class ConvBackwardData(Function):
    """dx = (d conv / d x)^T dy for an x of ``x_shape``; used forward, this is conv_transpose."""

    @staticmethod
    def forward(ctx, w, dy, desc, x_shape):
        ctx.desc = desc
        ctx.save_for_backward(w if ctx.needs_input_grad[1] else None, dy if ctx.needs_input_grad[0] else None)
        ctx.w_shape = tuple(w.shape)
        ctx.dw_dtype = float32_grad_of(w) if ctx.needs_input_grad[0] else None
        return _backward_data(w, dy, desc, x_shape)

    @staticmethod
    def backward(ctx, g):
        w, dy = ctx.saved_tensors
        need = ctx.needs_input_grad
        if not is_grad_enabled():
            if need[0] and need[1]:     # both read g (as x): its NHWC copy is made once
                with B.convolution_shared_staging():
                    return (_backward_filter(g, dy, ctx.desc, ctx.w_shape, None, ctx.dw_dtype),
                            _forward(g, w, ctx.desc), None, None)
            return (_backward_filter(g, dy, ctx.desc, ctx.w_shape, None, ctx.dw_dtype) if need[0] else None,
                    _forward(g, w, ctx.desc) if need[1] else None, None, None)
        gw = leaf_grad(ctx, 0, ConvBackwardFilter.apply(g, dy, ctx.desc, ctx.w_shape)) if need[0] else None
        gdy = ConvForward.apply(g, graph_weight(w), ctx.desc) if need[1] else None
        return gw, gdy, None, None


class ConvBackwardFilter(Function):
    """dw = (d conv / d w)^T dy for a weight of ``w_shape``."""

    @staticmethod
    def forward(ctx, x, dy, desc, w_shape):
        ctx.desc = desc
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, dy if ctx.needs_input_grad[0] else None)
        ctx.x_shape = tuple(x.shape)
        return _backward_filter(x, dy, desc, w_shape)

    @staticmethod
    def backward(ctx, g):
        x, dy = ctx.saved_tensors
        need = ctx.needs_input_grad
        if not is_grad_enabled():
            return (_backward_data(g, dy, ctx.desc, ctx.x_shape) if need[0] else None,
                    _forward(x, g, ctx.desc) if need[1] else None, None, None)
        gx = ConvBackwardData.apply(g, dy, ctx.desc, ctx.x_shape) if need[0] else None
        gdy = ConvForward.apply(x, g, ctx.desc) if need[1] else None
        return gx, gdy, None, None


# ---- argument checks shared by conv and conv_transpose -------------------------------------------------

def _check_operands(op, x, weight, bias, nd, groups, transposed):
    check_tensor(op, "weight", weight)      # (the input was checked by the caller, before batched() reads it)
    if weight.ndim != nd + 2:
        raise ArgumentError(f"{op}: weight must be {nd + 2}-D, got shape {tuple(weight.shape)}")
    if x.dtype != weight.dtype:
        raise DTypeError(f"{op}: input has dtype {x.dtype} but weight has dtype {weight.dtype}; they must match")
    if not (isinstance(groups, int) and groups >= 1):
        raise ArgumentError(f"{op}: groups={groups!r} must be a positive int")
    c_in = x.shape[1]
    if transposed:      # weight (C_in, C_out/groups, *k)
        if weight.shape[0] != c_in:
            raise ArgumentError(f"{op}: input has {c_in} channels but weight {tuple(weight.shape)} expects "
                             f"{weight.shape[0]} (weight[0] = in_channels for a transposed convolution)")
        if c_in % groups:
            raise ArgumentError(f"{op}: in_channels {c_in} is not divisible by groups={groups}")
        c_out = weight.shape[1] * groups
    else:               # weight (C_out, C_in/groups, *k)
        if weight.shape[1] * groups != c_in:
            raise ArgumentError(f"{op}: input has {c_in} channels but weight {tuple(weight.shape)} "
                                f"with groups={groups} expects {weight.shape[1] * groups}")
        if weight.shape[0] % groups:
            raise ArgumentError(f"{op}: weight {tuple(weight.shape)} has {weight.shape[0]} output channels, not "
                             f"divisible by groups={groups}")
        c_out = weight.shape[0]
    check_vector(op, "bias", bias, c_out, x, of="the output")


def _add_bias(y, bias, nd):
    return add_bias(y, bias, fresh=True)        # y: ConvForward's new output, held by nothing else


# The bias of a convolution as ConvForward's fourth input (one node; docs/host_overhead.md round 21) instead of a
# BiasAdd node after it.  Switch: BIAS_NODE[0] = False, or MINIDNN_CONV_BIAS_NODE=0 at import (the A/B and tests).
BIAS_NODE = [os.environ.get("MINIDNN_CONV_BIAS_NODE", "1") != "0"]


def _conv_node(x, weight, desc, bias):
    if type(desc) is _SeenConv and SEEN_APPLY[0] and not _state.anomaly and (bias is None or BIAS_NODE[0]):
        y = _apply_seen(x, weight, desc, bias)
        if y is not None:
            return y
    if bias is None:
        return ConvForward.apply(x, weight, desc)
    if BIAS_NODE[0]:
        return ConvForward.apply(x, weight, desc, bias)
    return add_bias(ConvForward.apply(x, weight, desc), bias, fresh=True)


# ConvForward.apply on a settled signature (docs/host_overhead.md round 24): the fast path's key holds x's array
# type, shapes, dtypes and device (its handle), the weight's array type and the bias's presence, so apply's passes
# reduce to the weight's and the bias's devices (checked here: another device, or a bias of another array type, takes
# apply, which raises) and the node's fields, written out as apply writes them.  Anomaly mode takes apply (it records
# a trace).  Switch: SEEN_APPLY[0] = False, or MINIDNN_CONV_SEEN_APPLY=0 at import.
SEEN_APPLY = [os.environ.get("MINIDNN_CONV_SEEN_APPLY", "1") != "0"]


def _apply_seen(x, w, seen, b):
    """ConvForward.apply(x, w, seen[, b]) as apply computes and records it, or None (nothing was done)."""
    dev = x.data.data.device_id
    if w.data.data.device_id != dev:
        return None
    if b is None:
        return apply_seen(ConvForward, x, w, seen)
    bd = b.data
    if type(bd) is not type(x.data) or bd.data.device_id != dev:
        return None
    return apply_seen(ConvForward, x, w, seen, b)


def _same_padding(op, x, weight, stride, dilation, nd):
    """padding='same': total d*(k-1) per dim; an odd total puts the extra element on the right, done by
    padding the input first (PyTorch's rule), leaving a symmetric padding for the primitive."""
    if any(s != 1 for s in stride):
        raise ArgumentError(f"{op}: padding='same' is not supported for strided convolutions (stride={stride})")
    totals = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
    extra = [t % 2 for t in totals]
    if any(extra):
        flat = []
        for e in reversed(extra):       # F.pad lists (left, right) pairs from the last dim backwards
            flat += [0, e]
        x = _pad(x, flat)
    return x, tuple(t // 2 for t in totals)


# A conv call whose operands and settings passed every check of _conv before reuses that call's descriptor: the
# checks read only what the key holds -- the operands' shapes and dtypes (Tensors all: bias None or its shape and
# dtype) and the settings as plain ints or tuples of ints (anything else, 'same'/'valid' included, takes the full
# path, which raises what it always raised).  Devices are checked by Function.apply at every call, as before.
_SEEN_CONV = SeenCalls()


def _seen_conv_key(op, x, weight, bias, stride, padding, dilation, groups):
    settings = (plain_setting(stride), plain_setting(padding), plain_setting(dilation))
    if (None in settings or type(groups) is not int or not isinstance(x, Tensor) or not isinstance(weight, Tensor)
            or not (bias is None or isinstance(bias, Tensor))):
        return None
    xd, wd = x.data, weight.data
    b = None if bias is None else (bias.data.shape, bias.data.dtype)
    return (op, xd.shape, xd.dtype, wd.shape, wd.dtype, b, groups) + settings


def _conv(op, nd, x, weight, bias, stride, padding, dilation, groups):
    fkey = None
    if FAST_PATH[0] and (fkey := _fast_key(op, x, weight, bias, stride, padding, dilation, groups)) is not None:
        seen = _FAST_CONV.get(fkey)
        if seen is None:
            desc = _SEEN_CONV.get(_seen_conv_key(op, x, weight, bias, stride, padding, dilation, groups))
            if desc is not None:        # validated before: settle this signature's calls
                seen = _SeenConv(desc, x, weight)
                _FAST_CONV.remember(fkey, seen)
        if seen is not None:
            return _conv_node(x, weight, seen, bias)
    key = _seen_conv_key(op, x, weight, bias, stride, padding, dilation, groups)
    desc = _SEEN_CONV.get(key)
    if desc is not None:        # validated before (x batched: an unbatched x's shape keys differently)
        return _conv_node(x, weight, desc, bias)
    check_tensor(op, "input", x)
    x, unbatched = batched(op, x, nd)
    _check_operands(op, x, weight, bias, nd, groups, transposed=False)
    stride = ntuple(stride, nd, op, "stride")
    dilation = ntuple(dilation, nd, op, "dilation")
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0,) * nd
        elif padding == "same":
            x, padding = _same_padding(op, x, weight, stride, dilation, nd)
        else:
            raise ArgumentError(f"{op}: padding={padding!r} must be 'valid', 'same', an int or a tuple of {nd} ints")
    else:
        padding = ntuple(padding, nd, op, "padding")
    desc = descriptor(B.ConvolutionDescriptor, padding, stride, dilation, groups)
    effective = [d * (k - 1) + 1 for d, k in zip(dilation, weight.shape[2:])]
    padded = [n + 2 * p for n, p in zip(x.shape[2:], padding)]
    if any([e > n for e, n in zip(effective, padded)]):
        effective, padded = tuple(effective), tuple(padded)
        raise ArgumentError(f"{op}: the (dilated) kernel {effective} is larger than the padded input {padded} "
                         f"(input {tuple(x.shape)}, weight {tuple(weight.shape)}, padding {padding}, "
                         f"dilation {dilation})")
    if not unbatched:
        _SEEN_CONV.remember(key, desc)
        if fkey is not None and key is not None:    # settled from the first call on: its backward then takes the
            seen = _SeenConv(desc, x, weight)       # same gradient destinations as later calls (a 16-bit dx blended
            _FAST_CONV.remember(fkey, seen)         # into a residual gradient rounds once, the engine's add twice)
            return _conv_node(x, weight, seen, bias)
    y = _conv_node(x, weight, desc, bias)
    return y.squeeze(0) if unbatched else y


def _conv_transpose(op, nd, x, weight, bias, stride, padding, output_padding, groups, dilation):
    check_tensor(op, "input", x)
    x, unbatched = batched(op, x, nd)
    _check_operands(op, x, weight, bias, nd, groups, transposed=True)
    stride = ntuple(stride, nd, op, "stride")
    padding = ntuple(padding, nd, op, "padding")
    dilation = ntuple(dilation, nd, op, "dilation")
    output_padding = ntuple(output_padding, nd, op, "output_padding")
    for op_, s, d in zip(output_padding, stride, dilation):
        if not 0 <= op_ < max(s, d):       # PyTorch's rule
            raise ArgumentError(f"{op}: output_padding={output_padding} must be smaller than stride={stride} or "
                                f"dilation={dilation} in every dim, and >= 0 (output padding must be smaller than "
                                "either stride or dilation)")
    k = weight.shape[2:]
    out = tuple((n - 1) * s - 2 * p + d * (kk - 1) + o + 1
                for n, s, p, d, kk, o in zip(x.shape[2:], stride, padding, dilation, k, output_padding))
    if any(o < 1 for o in out):     # PyTorch's shape check (slow_conv_transpose*_shape_check)
        raise ArgumentError(f"{op}: Given input size per channel: {tuple(x.shape[2:])}. Calculated output size per "
                            f"channel: {out}. Output size is too small (input {tuple(x.shape)}, weight "
                            f"{tuple(weight.shape)}, stride {stride}, padding {padding}, dilation {dilation}, "
                            f"output_padding {output_padding})")
    # The backward-data primitive needs the convolution of the output to give back exactly x's size, which holds
    # for output_padding < stride.  A larger one (allowed up to dilation - 1) is q = op // stride more zero rows
    # of x at the end: they add nothing to the output, and the same output size comes with op - q * stride.
    extra = [o // s for o, s in zip(output_padding, stride)]
    if any(extra):
        flat = []
        for q in reversed(extra):       # F.pad lists (left, right) pairs from the last dim backwards
            flat += [0, q]
        x = _pad(x, flat)
    out_shape = (x.shape[0], weight.shape[1] * groups) + out
    desc = descriptor(B.ConvolutionDescriptor, padding, stride, dilation, groups)
    y = _add_bias(ConvBackwardData.apply(weight, x, desc, out_shape), bias, nd)
    return y.squeeze(0) if unbatched else y


@autocast_op("conv1d")
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D cross-correlation (F.conv1d): input (N, C_in, L), weight (C_out, C_in/groups, k) -> (N, C_out, L_out);
    ``bias`` (C_out,). ``stride``, ``padding``, ``dilation`` are ints or 1-tuples, ``padding`` may also be 'valid' or
    'same' (stride 1 only); ``groups`` splits the channels (C_in and C_out divisible by it). An unbatched input (without
    N) is accepted; mismatched channels raise ArgumentError naming the shapes."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


@autocast_op("conv2d")
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D cross-correlation: input (N, C_in, H, W), weight (C_out, C_in/groups, kH, kW) -> (N, C_out, H', W').
    ``padding`` may be an int, a pair, 'valid' or 'same' (stride 1 only; odd totals pad one more on the right)."""
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


@autocast_op("conv3d")
def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3-D cross-correlation (F.conv3d): input (N, C_in, D, H, W), weight (C_out, C_in/groups, kD, kH, kW) -> (N, C_out,
    D_out, H_out, W_out); ``bias`` (C_out,). ``stride``, ``padding``, ``dilation`` are ints or 3-tuples, ``padding`` may
    also be 'valid' or 'same' (stride 1 only); ``groups`` splits the channels (C_in and C_out divisible by it). An
    unbatched input (without N) is accepted; mismatched channels raise ArgumentError naming the shapes."""
    return _conv("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


@autocast_op("conv_transpose1d")
def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The adjoint of conv1d, its gradient with respect to the input (F.conv_transpose1d): input (N, C_in, L), weight
    (C_in, C_out/groups, k) -> (N, C_out, L_out) with each output size (in - 1) * stride - 2 * padding + dilation * (k -
    1) + output_padding + 1; ``output_padding`` (< stride or dilation) picks among the sizes that stride makes
    ambiguous."""
    return _conv_transpose("conv_transpose1d", 1, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


@autocast_op("conv_transpose2d")
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The adjoint of conv2d (its gradient wrt the input): weight (C_in, C_out/groups, kH, kW);
    H_out = (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1."""
    return _conv_transpose("conv_transpose2d", 2, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


@autocast_op("conv_transpose3d")
def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The adjoint of conv3d, its gradient with respect to the input (F.conv_transpose3d): input (N, C_in, D, H, W),
    weight (C_in, C_out/groups, kD, kH, kW) -> (N, C_out, D_out, H_out, W_out) with each output size (in - 1) * stride -
    2 * padding + dilation * (k - 1) + output_padding + 1; ``output_padding`` (< stride or dilation) picks among the
    sizes that stride makes ambiguous."""
    return _conv_transpose("conv_transpose3d", 3, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)
