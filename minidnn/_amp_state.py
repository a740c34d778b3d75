"""Autocast's state and per-op policy, at the engine's floor (``minidnn.amp.autocast`` is the public face).

An op consults the policy with ``cast_inputs(op_name, args)`` before it computes; the policy casts its floating
Tensor arguments (differentiably, so gradients come back in each input's own dtype):

    lower     to the region's low-precision dtype (float16 / bfloat16): convolutions, linear, matrix products
    fp32      float16/bfloat16 inputs to float32: reductions, softmax/log-softmax, losses, norms (per device, as
              PyTorch's lists say)
    promote   every floating input to the widest floating dtype among them (ops that mix inputs: cat, stack, ...)

The state is thread-local (a region in one thread does not affect another) and nests: an inner region overrides
the outer one for its device type and restores it on exit.  Casts of leaf tensors (weights) are cached for the
outermost region, as PyTorch does, so a weight used twice is cast once.
"""
from __future__ import annotations

import functools
import os
import threading
import weakref
from contextlib import contextmanager

import numpy as np

from .backend.devices import device_of as _device_of
from .backend.devices import is_floating as _is_floating

__all__ = ["cast_inputs", "autocast_op", "policy_of", "is_active", "enter", "exit_", "get_dtype", "suspended",
           "float32_grad_of", "graph_weight", "leaf_grad"]

_local = threading.local()
_active_regions = 0            # enabled regions in all threads: the cheap test every op makes first

_LOWER = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "linear",
          "matmul", "mm", "bmm", "addmm", "baddbmm", "prelu", "scaled_dot_product_attention"}
_LOSSES = {"nll_loss", "cross_entropy", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
           "binary_cross_entropy_with_logits", "kl_div", "binary_cross_entropy"}
_FP32 = {
    "cuda": _LOSSES | {"softmax", "log_softmax", "layer_norm", "group_norm", "logsumexp", "exp", "expm1", "log",
                       "log1p", "log2", "log10", "pow", "reciprocal", "rsqrt", "softplus", "sum", "prod", "cumsum",
                       "cumprod", "norm", "cdist", "dist", "acos", "asin", "cosh", "sinh", "tan", "erfinv"},
    "cpu": _LOSSES | {"prod", "cdist", "avg_pool3d"},
}
_PROMOTE = {"cat", "stack", "addcdiv", "addcmul", "atan2", "where", "index_put", "scatter_add", "tensordot"}
# The ops whose Functions hand back float32 gradients for a float32 parameter's float16/bfloat16 cast (the filter,
# linear and bias gradients: float32_grad_of) -- their weight and bias, by position and by keyword: these casts
# are direct weights (minidnn.amp: no cast node; docs/measurements/amp_host_2026-11-26.md, session 11).
_DIRECT = {op: ((1, 2), ("weight", "bias")) for op in ("conv1d", "conv2d", "conv3d", "linear")}
# Switch (tests and A/B runs): DIRECT_WEIGHTS[0] = False, or MINIDNN_AMP_DIRECT_WEIGHTS=0 at import: a cast node
# per weight, as before.
DIRECT_WEIGHTS = [os.environ.get("MINIDNN_AMP_DIRECT_WEIGHTS", "1") != "0"]
# A lowered call (x, weight, bias, settings) whose outcome is plain -- a CUDA x in the region's dtype or float32, a
# weight / bias in it or float32, no Tensor among the settings -- skips cast_inputs' generic scan: ``_lower_ready``
# (minidnn.amp installs it) makes the same casts, cache entries and results in one frame, each float32 weight / bias
# its kept direct weight by the parameter's record (host rounds 26b, 29; round 30 made it the only shortcut: round
# 26b's ``_lower_direct`` covered nothing it does not).  Switch: LOWER_READY[0] = False (cast_inputs for every
# call), or MINIDNN_AMP_LOWER_READY=0 (or round 26b's MINIDNN_AMP_LOWER_DIRECT_FAST=0) at import; LOWER_DIRECT_FAST
# is the same list under round 26b's name.
LOWER_READY = [os.environ.get("MINIDNN_AMP_LOWER_READY", "1") != "0"
               and os.environ.get("MINIDNN_AMP_LOWER_DIRECT_FAST", "1") != "0"]
LOWER_DIRECT_FAST = LOWER_READY
# A region's own bookkeeping in fewer Python steps (host round 29): the region end's count of the flat buffer's
# elements the casts used in one pass where they all come from one flat set, the kept copy's busy test over its
# armed weights and views only, the CUDA modules its stream test asks imported once; the same values.  Switch:
# REGION_LEAN[0] = False, or MINIDNN_AMP_REGION_LEAN=0 at import.
REGION_LEAN = [os.environ.get("MINIDNN_AMP_REGION_LEAN", "1") != "0"]


def policy_of(op_name: str, device_type: str):
    """'lower', 'fp32', 'promote' or None (the op runs in its inputs' dtypes; batch norm is such an op: the backend
    accumulates float16/bfloat16 statistics in float32 and keeps float32 parameters, as cuDNN does)."""
    if op_name in _LOWER:
        return "lower"
    if op_name in _FP32.get(device_type, ()):
        return "fp32"
    if op_name in _PROMOTE:
        return "promote"
    return None


def _policies(op_name: str) -> dict:
    """{device type: policy} for the devices where ``op_name`` has one (looked up once per op, not per call)."""
    return {d: p for d in ("cuda", "cpu") if (p := policy_of(op_name, d)) is not None}


def _state():
    s = getattr(_local, "state", None)
    if s is None:
        s = _local.state = {"dtype": {}, "depth": 0, "cache": {}, "suspended": 0, "cache_enabled": True,
                            "flat_used": {}, "flat_low": {}, "ready": None}
    return s


def _set_ready(s):
    """``s["ready"]``: the region's CUDA dtype where ``_lower_ready`` may serve calls (not suspended, the cache on),
    else None -- kept by enter / exit_ / suspended, so that a call reads one entry for the three."""
    s["ready"] = None if s["suspended"] or not s["cache_enabled"] else s["dtype"].get("cuda")


def is_active() -> bool:
    return _active_regions > 0


def get_dtype(device_type: str):
    """The low-precision dtype of this thread's enabled region for ``device_type``, or None."""
    return _state()["dtype"].get(device_type)


def enter(device_type: str, dtype, enabled: bool, cache_enabled: bool):
    """Open a region; returns the token ``exit_`` needs to restore the previous state."""
    global _active_regions
    s = _state()
    token = (device_type, s["dtype"].get(device_type), s["cache_enabled"], bool(enabled))
    s["dtype"][device_type] = np.dtype(dtype) if enabled else None
    s["cache_enabled"] = cache_enabled
    s["depth"] += 1
    if enabled:
        _active_regions += 1
    _set_ready(s)
    return token


def exit_(token):
    global _active_regions
    s = _state()
    device_type, previous, cache_enabled, enabled = token
    s["dtype"][device_type] = previous
    s["cache_enabled"] = cache_enabled
    s["depth"] -= 1
    if enabled:
        _active_regions -= 1
    _set_ready(s)
    if s["depth"] == 0:
        _end_of_outermost_region(s)


def _end_of_outermost_region(s):
    """Clear the cast cache (PyTorch's rule: a region's casts do not outlive it), remembering, per flat buffer, how
    many of its elements the region's casts used: the next region casts a well-used flat buffer in one launch."""
    cache = s["cache"]
    if cache and REGION_LEAN[0]:
        fs = next(iter(cache.values()))[3]
        n = 0
        if fs is not None:
            for entry in cache.values():        # every cast from one flat set (the step's): its count alone
                if entry[3] is not fs:
                    break
                n += entry[2].data.size
            else:
                s["flat_used"] = {id(fs): (weakref.ref(fs), n)}
                cache.clear()
                s["flat_low"].clear()
                return
    if cache:
        used = {}
        for entry in cache.values():
            if entry[3] is not None:        # (weak reference to the flat set, elements used): an id alone could
                ref, n = used.get(id(entry[3]), (None, 0))      # match a later flat set made where a freed one was
                used[id(entry[3])] = (ref or weakref.ref(entry[3]), n + entry[2].data.size)
        s["flat_used"] = used
        cache.clear()
    s["flat_low"].clear()


@contextmanager
def suspended():
    """No casting inside (the backward pass runs gradients in the dtypes the forward pass chose)."""
    s = _state()
    s["suspended"] += 1
    _set_ready(s)
    try:
        yield
    finally:
        s["suspended"] -= 1
        _set_ready(s)


# The weight cast of a whole flat buffer (minidnn.amp installs it: it builds autograd nodes, which this floor may
# not import): flat_caster(t, dtype, state, direct) -> t's cast, with the cache filled for the buffer's other
# parameters, or None where t is not in a flat buffer worth casting whole (the cast then goes one tensor at a time).
_flat_caster = None


def set_flat_caster(fn):
    global _flat_caster
    _flat_caster = fn


# Every other cast a region makes: caster(t, dtype, direct=False, data=None) -> t in dtype, differentiably
# (minidnn.amp installs its marked cast node, whose float32 source tells consumers they may hand back float32
# gradients: ``float32_grad_of``; or, ``direct``, a direct weight; ``data``: the cast already made).
_caster = None


def set_caster(fn):
    global _caster
    _caster = fn


def float32_grad_of(t):
    """float32 where ``t`` is an autocast cast of a float32 tensor to float16/bfloat16 (its cast node's backward would
    convert t's gradient to float32 anyway, and passes a float32 one through without a launch) or a direct weight
    (t's grad_fn is its float32 parameter's accumulator, which must receive float32), else None.  A consumer whose
    backward computes t's gradient with float32 sums (the filter-gradient kernels) may then return it in float32,
    unrounded; only first-order backward does (create_graph keeps t's dtype: ``leaf_grad`` widens a direct
    weight's)."""
    n = t.grad_fn
    if n is None or t.data.dtype.itemsize != 2:
        return None
    if type(n) is _accumulator_type:
        d = n.variable.data.dtype
        return d if d == _FLOAT32 else None     # (against a dtype: against the np.float32 type converts it first)
    if getattr(n, "float32_grad_ok", False) and n.src_dtype == np.float32:
        return n.src_dtype
    return None


# Direct weights under create_graph (minidnn.amp installs them with the engine's AccumulateGrad class, which this
# floor may not import): graph_weight(w) -> the weight a create_graph backward computes with (a direct weight as
# its cast node's output), leaf_grad(ctx, i, g) -> the gradient it returns for input i (a direct weight's widened
# to its float32 parameter by the cast node's differentiable transfer).  Identities until installed.
_accumulator_type = None


def graph_weight(w):
    return _graph_weight(w) if _accumulator_type is not None else w


def leaf_grad(ctx, i, g):
    return _leaf_grad(ctx, i, g) if _accumulator_type is not None else g


def set_direct_graph(graph_weight_fn, leaf_grad_fn, accumulator_type):
    global _graph_weight, _leaf_grad, _accumulator_type
    _graph_weight, _leaf_grad, _accumulator_type = graph_weight_fn, leaf_grad_fn, accumulator_type


def _cast(t, dtype, s, direct=False):
    """``t`` in ``dtype``.  Leaf tensors that require grad (weights) are cast once per outermost region: the cache
    entry is (t, t's version when cast, the cast, id of t's flat buffer or None) and a later in-place update
    of t (a new version) casts it again.  ``direct``: t is a conv's or a linear layer's weight or bias, which may get
    a direct weight (``_DIRECT``); a cached direct weight met by any other use becomes the cast node's output for
    the same data, and the entry keeps that from then on."""
    if t.data.dtype == dtype:
        return t
    cacheable = s["cache_enabled"] and t.grad_fn is None and t.requires_grad
    if cacheable:
        cache = s["cache"]
        hit = cache.get(id(t))
        if hit is not None and hit[0] is t and hit[1] == t._version and hit[2].data.dtype == dtype:
            out = hit[2]
            if not direct and type(out.grad_fn) is _accumulator_type:
                out = _caster(t, dtype, False, out.data)
                cache[id(t)] = (t, hit[1], out, hit[3])
            return out
        if _flat_caster is not None:
            out = _flat_caster(t, dtype, s, direct)
            if out is not None:
                return out
    out = t.to(dtype=dtype) if _caster is None else _caster(t, dtype, direct)
    if cacheable:
        s["cache"][id(t)] = (t, t._version, out, None)
    return out


# minidnn's Tensor class (minidnn.amp installs it: this floor may not import it).  Without it a Tensor is anything
# with a ``_version``, a slower test (getattr's miss on every int/tuple argument of an op raises inside).
_tensor_type = None


def set_tensor_type(cls):
    global _tensor_type
    _tensor_type = cls


def _is_float_tensor(a):
    T = _tensor_type
    if T is not None:
        return isinstance(a, T) and _is_floating(a.data.dtype)
    return getattr(a, "_version", None) is not None and _is_floating(a.dtype)


_FLOATING: dict = {}     # dtype -> is_floating(dtype), for the argument scan


_CUDA_ARRAY_TYPES: set = set()     # array types seen to be on a "cuda" device (a CuPy ndarray type stays one)


def _device_type(x):
    """"cpu" or "cuda": the device type of array ``x`` (a plain NumPy array is told without a device lookup)."""
    if type(x) is np.ndarray:
        return "cpu"
    t = _device_of(x).type
    if t == "cuda":
        _CUDA_ARRAY_TYPES.add(type(x))
    return t


def cast_inputs(op_name: str, args, kwargs=None, policies=None, direct=None):
    """(args, kwargs): the floating Tensors among ``args``/``kwargs`` cast as ``op_name``'s policy says for this
    thread's region.  ``policies``: ``_policies(op_name)``, when the caller has it at hand; ``direct``: the
    positions and keywords of ``_DIRECT[op_name]`` (looked up when None).  One pass finds the
    floating Tensors' positions (every op call in a region pays it: kept lean), the policy decides on their dtypes,
    and only those positions are cast."""
    kwargs = {} if kwargs is None else kwargs
    s = _state()
    if s["suspended"]:
        return args, kwargs
    T = _tensor_type
    pos, dtypes = [], []
    if T is not None:       # the test of _is_float_tensor, written out (every argument of every op in a region)
        floating = _FLOATING
        for i, a in enumerate(args):
            if isinstance(a, T):
                d = a.data.dtype
                f = floating.get(d)
                if f is None:
                    f = floating[d] = _is_floating(d)
                if f:
                    pos.append(i)
                    dtypes.append(d)
    else:
        pos = [i for i, a in enumerate(args) if _is_float_tensor(a)]
        dtypes = [args[i].data.dtype for i in pos]
    keys = [k for k, v in kwargs.items() if _is_float_tensor(v)] if kwargs else ()
    if keys:
        dtypes += [kwargs[k].data.dtype for k in keys]
    elif not pos:
        return args, kwargs
    device_type = _device_type((args[pos[0]] if pos else kwargs[keys[0]]).data)
    low = s["dtype"].get(device_type)
    if low is None:
        return args, kwargs
    policy = (_policies(op_name) if policies is None else policies).get(device_type)
    if policy is None:
        return args, kwargs
    if policy == "lower":
        target = low
        for d in dtypes:
            if d != low:
                break
        else:
            return args, kwargs
    elif policy == "promote":
        target = dtypes[0]
        for d in dtypes[1:]:
            target = np.promote_types(target, d)
    else:
        for d in dtypes:
            if d.itemsize < 4:
                break
        else:
            return args, kwargs
        target = np.dtype(np.float32)
    if direct is None:
        direct = _DIRECT.get(op_name, ((), ()))
    if pos:
        args = list(args)
        at = direct[0]
        for i in pos:
            if args[i].data.dtype != target:
                args[i] = _cast(args[i], target, s, i in at)
        args = tuple(args)
    if keys:
        kwargs = dict(kwargs)
        for k in keys:
            kwargs[k] = _cast(kwargs[k], target, s, k in direct[1])
    return args, kwargs


_FLOAT32 = np.dtype(np.float32)
# ``ready(args)``: minidnn.amp's ``_lower_ready`` (set_lower_ready installs it; a test may install a counting
# wrapper): a lowered call's cast args, or None with nothing done (cast_inputs then casts them).
_ready = None


def set_lower_ready(fn):
    global _ready
    _ready = fn


def autocast_op(op_name: str):
    """Decorator for an op's public function: inside an autocast region its inputs are cast by ``op_name``'s
    policy (outside one it costs a single global test).  An op with no policy on any device (batch norm) is
    returned as it is: nothing to look up at its calls."""
    policies = _policies(op_name)
    direct = _DIRECT.get(op_name, ((), ()))

    def decorate(fn):
        if not policies:
            return fn
        if op_name in _DIRECT and policies.get("cuda") == "lower":
            @functools.wraps(fn)
            def lowered(*args, **kwargs):
                if _active_regions:
                    ready = _ready
                    if ready is not None and not kwargs and LOWER_READY[0]:
                        fast = ready(args)
                        if fast is not None:
                            return fn(*fast)
                    args, kwargs = cast_inputs(op_name, args, kwargs, policies, direct)
                return fn(*args, **kwargs)
            return lowered

        @functools.wraps(fn)
        def op(*args, **kwargs):
            if _active_regions:
                args, kwargs = cast_inputs(op_name, args, kwargs, policies, direct)
            return fn(*args, **kwargs)
        return op
    return decorate
