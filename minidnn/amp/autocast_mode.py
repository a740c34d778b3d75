"""``autocast``: run each op in the precision its kind calls for, PyTorch's ``torch.autocast``.

    with minidnn.autocast("cuda", dtype=minidnn.bfloat16):
        loss = F.cross_entropy(model(x), y)   # convolutions/linear in bfloat16, the loss in float32
    loss.backward()                           # outside the region; gradients come back in each parameter's dtype

The per-op policy (which ops run in the low-precision dtype, which in float32, which promote) is in
``minidnn/_amp_state.py`` and follows PyTorch's lists per device type.  On the CPU only bfloat16 is supported.

Weight casts are cached per outermost region (PyTorch's ``cache_enabled``).  Parameters that a fused optimizer keeps
in one flat buffer are cast together: when the previous region's casts used at least half of a flat buffer's
elements, the first of its parameters the region casts casts the whole buffer in one launch (``_cast_flat_buffer``),
and every parameter's cast is a view of that copy with its own differentiable cast node, made at its first use --
the same values, nodes and gradients as one cast per parameter, in one launch instead of one per weight.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import _amp_state
from ..autograd import _state as _grad_state
from ..backend.devices import to_device
from ..backend.ownership import owner_of
from ..ops.linalg import Transfer, transfer
from ..tensor import Tensor, _to_dtype

__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype", "is_autocast_available"]

_DEFAULTS = {"cuda": np.dtype(np.float16), "cpu": None}     # the CPU default (bfloat16) needs ml_dtypes


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError as exc:          # pragma: no cover - ml_dtypes is a dependency
        raise RuntimeError("autocast: bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from exc
    return np.dtype(ml_dtypes.bfloat16)


def is_autocast_available(device_type: str) -> bool:
    return device_type in ("cuda", "cpu")


class autocast:
    """Context manager and decorator.  ``device_type``: "cuda" or "cpu"; ``dtype``: float16 or bfloat16 (defaults:
    float16 on cuda, bfloat16 on cpu); ``enabled=False`` turns autocast off inside the region (nesting restores
    the outer state on exit); ``cache_enabled``: cast each weight once per outermost region."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if not isinstance(device_type, str):
            raise ValueError(f"autocast: expected device_type of type str, got {type(device_type).__name__}")
        device_type = device_type.split(":")[0]
        if not is_autocast_available(device_type):
            raise RuntimeError(f"autocast: device_type {device_type!r} is not supported (use 'cuda' or 'cpu')")
        if dtype is None:
            dtype = _DEFAULTS[device_type] or _bfloat16()
        dt = _to_dtype(dtype)
        allowed = (np.dtype(np.float16), _bfloat16()) if device_type == "cuda" else (_bfloat16(),)
        if enabled and dt not in allowed:
            names = " and ".join(str(a) for a in allowed)
            raise ValueError(f"autocast: {device_type} autocast supports {names}, got {dt}"
                             + ("; float16 autocast needs a GPU (use dtype=minidnn.bfloat16 on the CPU)"
                                if device_type == "cpu" and dt == np.float16 else ""))
        self.device = device_type
        self.fast_dtype = dt
        self._enabled = bool(enabled)
        self._cache_enabled = True if cache_enabled is None else bool(cache_enabled)
        self._tokens = []

    def __enter__(self):
        self._tokens.append(_amp_state.enter(self.device, self.fast_dtype, self._enabled, self._cache_enabled))
        return self

    def __exit__(self, *exc):
        _amp_state.exit_(self._tokens.pop())
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.device, self.fast_dtype, self._enabled, self._cache_enabled):
                return fn(*args, **kwargs)
        return wrapper


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """Whether ops on ``device_type`` tensors are being autocast in this thread."""
    return _amp_state.get_dtype(device_type) is not None


def get_autocast_dtype(device_type: str):
    """The low-precision dtype of ``device_type``'s current region (its default when none is active)."""
    dt = _amp_state.get_dtype(device_type)
    return dt if dt is not None else (_DEFAULTS.get(device_type) or _bfloat16())


class AutocastCast(Transfer):
    """The node of a cast autocast makes (``t.to(dtype)``'s Transfer, marked).  Its backward converts the gradient
    back to t's dtype, and passes one already in it through untouched (no launch).  So where t is float32, a
    consumer of the float16/bfloat16 cast whose backward sums t's gradient in float32 anyway -- the convolution
    and linear weight gradients (``_amp_state.float32_grad_of``) -- hands that gradient back in float32: the bf16
    rounding of dw that PyTorch makes (and its cast launch) is skipped, so the gradient is slightly more accurate
    than PyTorch's (docs/amp.md)."""
    __slots__ = ()
    float32_grad_ok = True

    @staticmethod
    def backward(ctx, g):
        # Transfer's backward, with its pass-through taken first: an autocast cast never changes the device, so a
        # gradient already in t's dtype (the float32 weight gradients) goes back as it is, with no device lookups.
        if g.data.dtype == ctx.src_dtype:
            return (g,)
        return (transfer(g, device=ctx.src_device, dtype=ctx.src_dtype),)


def _cast(t, dtype):
    """autocast's cast of ``t`` to ``dtype``: ``t.to(dtype=dtype)``, with the marked node (its output: ``data``, t
    cast to another dtype) where one is recorded, so the gradient comes back to t in t's dtype."""
    device = t.device
    data = to_device(t.data, device, dtype=dtype)
    if not (_grad_state.grad_enabled and t.requires_grad):
        return Tensor._from_array(data)         # t.to(dtype=dtype): no node
    n = AutocastCast.node(t)
    n.src_device, n.src_dtype = device, t.data.dtype
    return n.output(data)


def _cast_flat_buffer(t, dtype, s):
    """The autocast cast of parameter ``t`` when a fused optimizer's flat buffer holds it (None otherwise: the
    caller casts it alone).  The first such cast of a region whose previous outermost region's casts used at
    least half of the buffer's elements (batch-norm parameters, which autocast does not cast, are small beside the
    weights) casts the whole flat buffer in one launch and keeps it, with every parameter's version, for the
    region; each parameter's cast is then a view of it with its own cast node, made when the region first uses
    the parameter (if its version is still the one cast and it is still bound to the buffer).  Otherwise ``t`` is
    cast alone, its buffer noted so the region's end counts it."""
    owner = owner_of(t)
    if owner is None:
        return None
    fs, j = owner
    key = id(fs)
    recording = _grad_state.grad_enabled
    flat = s["flat_low"].get(key)
    if flat is None and (recording and not getattr(fs, "master", False)
                         and fs.param.dtype == t.data.dtype and 2 * s["flat_used"].get(key, 0) >= fs.param.size):
        flat = s["flat_low"][key] = (fs, fs.param.astype(dtype), [p._version for p in fs.params])
    if (recording and flat is not None and flat[0] is fs and flat[1].dtype == dtype and t._version == flat[2][j]
            and t.data is fs.param_views[j]):
        n = AutocastCast.node(t)        # t is on the flat set's device
        n.src_device, n.src_dtype = fs.device, t.data.dtype
        out = n.output(fs.view(flat[1], j))
    else:
        out = _cast(t, dtype)
    s["cache"][id(t)] = (t, t._version, out, key)
    return out


_amp_state.set_flat_caster(_cast_flat_buffer)
_amp_state.set_caster(_cast)
_amp_state.set_tensor_type(Tensor)
