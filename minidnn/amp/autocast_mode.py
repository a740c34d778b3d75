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

Direct weights (session 11, docs/measurements/amp_host_2026-11-26.md): the float32 parameters that a convolution or a
linear layer takes as its weight or bias get no cast node.  Their cast is a Tensor of the low-precision data whose
``grad_fn`` is the parameter's own ``AccumulateGrad`` (``_direct``): the layer's node records its edge to the
parameter itself, and its backward hands back a float32 gradient -- the kernels' float32 sums at first order
(``_amp_state.float32_grad_of``), and under create_graph the differentiable cast to float32 the cast node's backward
made (``graph_weight`` / ``leaf_grad``) -- so the gradient reaching the parameter is the one the cast node passed
through.  Another op meeting a direct cast in the cache gets the cast node made for the same data (``_cast``).
Switch: ``_amp_state.DIRECT_WEIGHTS[0]``, or MINIDNN_AMP_DIRECT_WEIGHTS=0 in the environment at import.
"""
from __future__ import annotations

import functools
import operator
import os
import sys
import weakref

import numpy as np

from .. import _amp_state
from ..autograd import AccumulateGrad
from ..autograd import _state as _grad_state
from ..backend.devices import device_guard as _device_guard
from ..backend.devices import is_cuda_array as _is_cuda_array
from ..backend.devices import to_device
from ..backend.ownership import _owners, owner_of
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


def _direct_ok(t, dtype):
    """Whether ``t``'s cast to ``dtype`` may be a direct weight: a float32 leaf cast to float16/bfloat16, while a
    graph is recorded (the caller checked that t requires grad)."""
    return DIRECT[0] and t.grad_fn is None and t.data.dtype == np.float32 and dtype.itemsize == 2


def _direct(t, data):
    """``data`` (t's float16/bfloat16 cast) as a direct weight: a Tensor whose gradient edge is t's own accumulator
    (``Tensor._edge`` reads grad_fn), with no node of its own."""
    w = Tensor._wrap_like(data)
    w.grad_fn = t._edge()[0]
    w.requires_grad = True
    return w


def _node_cast(t, data, device):
    """``data`` (t cast to another dtype) recorded as autocast's cast of ``t`` (on ``device``): the marked node."""
    n = AutocastCast.node(t)
    n.src_device, n.src_dtype = device, t.data.dtype
    return n.output(data)


def _cast(t, dtype, direct=False, data=None):
    """autocast's cast of ``t`` to ``dtype``: ``t.to(dtype=dtype)``, with the marked node (its output: ``data``, t
    cast to another dtype) where one is recorded, so the gradient comes back to t in t's dtype; ``direct`` (a conv's
    or a linear layer's weight or bias): a direct weight instead of the node, where ``_direct_ok``.  ``data``: the
    cast already made (a direct weight's, met by another op: the node is made for it)."""
    device = t.device
    if data is None:
        data = to_device(t.data, device, dtype=dtype)
    if not (_grad_state.grad_enabled and t.requires_grad):
        return Tensor._from_array(data)         # t.to(dtype=dtype): no node
    if direct and _direct_ok(t, dtype):
        return _direct(t, data)
    return _node_cast(t, data, device)


class _LowCopy:
    """A flat set's float16/bfloat16 copy kept across regions (session 11): ``buf`` (the whole flat buffer), each
    parameter's ``views`` of it, made once, and each parameter's direct weight (``weights``, made at its first use
    and re-armed per region with the parameter's current accumulator).  Each region that casts the flat buffer whole
    writes ``buf`` in place -- the same one cast launch the fresh copy took, with the same values -- so the per-weight
    views and Tensors are not made again every region.  Before a refill, ``busy`` tells whether anything from an
    earlier region still holds the copy (a graph not yet run backward, or already run with retain_graph: its saved
    weights; a view someone kept): then a new copy is made instead of writing over one in use."""
    __slots__ = ("buf", "views", "weights", "buf_refs", "stream", "ready_keys", "armed", "perms", "__weakref__")

    def __init__(self, fs, dtype):
        with _device_guard(fs.device):
            self.buf = fs.xp.empty(fs.param.shape, dtype=dtype)
        self.views = [fs.view(self.buf, j) for j in range(len(fs.params))]
        self.perms = list(fs.perms)     # the memory orders the views were made for (a relayout makes a new copy)
        self.weights = [None] * len(self.views)
        self.buf_refs = _getrefcount(self.buf)      # the copy, held by this object and its views alone
        self.ready_keys = set()     # the parameters whose records (_READY) name this copy
        self.armed = []             # the indices whose direct weights are made, in order (REGION_LEAN's busy)

    def busy(self):
        if _getrefcount(self.buf) > self.buf_refs:      # a view made elsewhere (a cast node's output) is alive
            return True
        if _amp_state.REGION_LEAN[0]:
            # the views never armed are held by ``views`` alone (a kept view is handed out only in its direct
            # weight; other casts view the buffer afresh, which buf's count shows): only the armed are counted
            views, weights = self.views, self.weights
            for j in self.armed:
                if _getrefcount(weights[j]) > _ITEM_REFS or _getrefcount(views[j]) > _ITEM_REFS + 1:
                    return True
            return False
        for v, w in zip(self.views, self.weights):      # each held here (a view also by its weight) and by this
            if w is None:                               # loop alone, when no graph saved it
                if _getrefcount(v) > _SOLE_REFS:
                    return True
            elif _getrefcount(w) > _SOLE_REFS or _getrefcount(v) > _SOLE_REFS + 1:
                return True
        return False

    def weight(self, j, t):
        """Parameter ``t``'s (index j's) direct weight: the one kept, its gradient edge re-armed to t's accumulator
        (a new one each backward), or a new one."""
        w = self.weights[j]
        if w is None:
            w = self.weights[j] = _direct(t, self.views[j])
            self.armed.append(j)
        else:
            w.grad_fn = t._edge()[0]
        return w


def _sole_refs():
    """The refcount ``_LowCopy.busy`` sees for a kept view or weight nothing else holds (measured, as the engine
    does: held by its list and by the loop's variable)."""
    for v, w in zip([object()], [object()]):
        return _getrefcount(w)


def _item_refs():
    """The refcount REGION_LEAN's ``busy`` sees for a kept weight nothing else holds, read as ``a[j]`` from its list
    (measured, as ``_sole_refs``)."""
    a = [object()]
    for j in (0,):
        return _getrefcount(a[j])


_getrefcount = sys.getrefcount
_SOLE_REFS = _sole_refs()
_ITEM_REFS = _item_refs()
# id(flat set) -> (weak reference to it, its _LowCopy); switch: KEEP_LOW_COPY[0] = False, or
# MINIDNN_AMP_KEEP_LOW_COPY=0 at import (a fresh cast of the flat buffer each region, as before).
_LOW_COPIES: dict = {}
KEEP_LOW_COPY = [os.environ.get("MINIDNN_AMP_KEEP_LOW_COPY", "1") != "0"]


def _current_stream(arr):
    """The current stream's pointer for a GPU array (0 on the CPU), or None while it captures a CUDA graph (the
    workspace's test; the legacy default stream, pointer 0, cannot capture)."""
    if not _is_cuda_array(arr):
        return 0
    if _CUDA_MODULES and _amp_state.REGION_LEAN[0]:
        return _CUDA_MODULES[1].eager_stream(_CUDA_MODULES[0].cupy())
    from ..backend.cuda import launch as _launch  # (GPU arrays only)
    from ..backend.cuda import workspace as _ws
    _CUDA_MODULES[:] = (_launch, _ws)
    return _ws.eager_stream(_launch.cupy())


_CUDA_MODULES: list = []      # (backend.cuda.launch, backend.cuda.workspace), imported at the first GPU array


def _low_copy(fs, dtype):
    """fs's kept copy refilled with the current parameters (one launch), or None (a fresh cast: switched off, or
    capturing: a region captured into a CUDA graph casts afresh, from the graph's pool, as before).  A copy last
    filled on another stream is not written over (its readers there may not have run yet): a new one is made."""
    if not KEEP_LOW_COPY[0]:
        return None
    stream = _current_stream(fs.param)
    if stream is None:
        return None
    key = id(fs)
    entry = _LOW_COPIES.get(key)
    low = entry[1] if entry is not None and entry[0]() is fs else None
    # (perms: model.to(memory_format=...) after the optimizer was built re-lays a parameter's flat slot out; the
    # copy's views of the old order would hand out the weight's values permuted -- review of session 17)
    if low is None or low.stream != stream or low.buf.dtype != dtype or low.buf.shape != fs.param.shape \
            or low.perms != fs.perms or low.busy():
        if entry is not None:
            _drop_ready(entry[1])
        low = _LowCopy(fs, dtype)
        low.stream = stream
        _LOW_COPIES[key] = (weakref.ref(fs, lambda _, key=key: _forget_low_copy(key)), low)
    _refill(low, fs)
    return low


def _forget_low_copy(key):
    """A flat set is gone: its kept copy and the records naming it go too."""
    entry = _LOW_COPIES.pop(key, None)
    if entry is not None:
        _drop_ready(entry[1])


def _refill(low, fs):
    """The cast of the whole flat buffer into the kept copy: one elementwise copy launch, astype's conversion.  The
    kept weights' values change in place, so their versions move (what the backend's kept filter copies check)."""
    with _device_guard(fs.device):
        low.buf[...] = fs.param
    for w in low.weights:
        if w is not None:
            w._version += 1


_VERSION = operator.attrgetter("_version")     # (the refill's versions list in one C-level pass: 65 a ResNet-20 region)


def _cast_flat_buffer(t, dtype, s, direct=False):
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
                         and fs.param.dtype == t.data.dtype and 2 * _used(s, key, fs) >= fs.param.size):
        low = _low_copy(fs, dtype)
        flat = s["flat_low"][key] = (fs, fs.param.astype(dtype) if low is None else low.buf,
                                     list(map(_VERSION, fs.params)), low)
    if (recording and flat is not None and flat[0] is fs and flat[1].dtype == dtype and t._version == flat[2][j]
            and t.data is fs.param_views[j]):
        low = flat[3]
        if direct and _direct_ok(t, dtype):
            out = _direct(t, fs.view(flat[1], j)) if low is None else low.weight(j, t)
        else:
            n = AutocastCast.node(t)        # t is on the flat set's device
            n.src_device, n.src_dtype = fs.device, t.data.dtype
            out = n.output(fs.view(flat[1], j))     # (a view of its own: the kept copy's refcount shows it)
    else:
        out = _cast(t, dtype, direct)
    s["cache"][id(t)] = (t, t._version, out, fs)
    return out


def _flat_direct(t, dtype, s):
    """The hot case of ``_amp_state._cast`` -> ``_cast_flat_buffer`` for a conv's or linear layer's float32 weight or
    bias, written out (host round 26b: most of a bf16 step's autocast time): once this region's first flat cast has
    refilled the kept copy, t's kept direct weight re-armed, and its cache entry.  None, with nothing done, wherever
    any other branch of theirs would be taken (the caller then runs ``_cast``)."""
    cache = s["cache"]
    if not (s["cache_enabled"] and t.grad_fn is None and t.requires_grad and DIRECT[0]) or id(t) in cache:
        return None
    owner = owner_of(t)
    if owner is None:
        return None
    fs, j = owner
    flat = s["flat_low"].get(id(fs))
    if flat is None or flat[0] is not fs or flat[3] is None or not _grad_state.grad_enabled:
        return None
    w = flat[3].weights[j]
    data = t.data
    if (w is None or flat[1].dtype != dtype or t._version != flat[2][j] or data is not fs.param_views[j]
            or data.dtype != _FLOAT32 or dtype.itemsize != 2):
        return None
    acc = t._accumulator        # t._edge()'s accumulator: the live one, else made
    node = None if acc is None else acc()
    w.grad_fn = t._edge()[0] if node is None else node
    cache[id(t)] = (t, t._version, w, fs)
    return w


_FLOAT32 = np.dtype(np.float32)


# Host round 29: per float32 parameter whose kept direct weight ``_flat_direct`` has handed out, what that took to
# find -- id(param) -> (param, id(its flat set), its index j there, the kept copy, the float32 view it is bound to,
# the kept copy's dtype) -- so that ``_lower_ready`` asks each later region only what can change between calls.  A
# record holds the parameter and the kept copy (whose direct weight holds the parameter already), not the flat set;
# it goes when its kept copy is replaced or its flat set dies.
_READY: dict = {}


def _ready_weight(t, s, low):
    """``_flat_direct(t, low, s)`` by t's record, for a region whose cache, direct weights and grad mode are on: t's
    kept direct weight re-armed, its cache entry made; None (nothing done) wherever the record cannot tell -- no
    record, or any test of _flat_direct's that could fail now fails (the caller then runs _flat_direct / _cast).
    Test by test: the region's flat record for t's flat set holds the recorded kept copy (so it is that flat set's
    -- a kept copy is made for one flat set and handed out only for it -- made this region and refilled, and its
    j-th direct weight is set: kept weights are never unset) and the kept copy's dtype is the region's; t is still
    bound to the recorded float32 view (an array's dtype does not change) -- which keeps owner_of(t) (fs, j) and
    the view fs's j-th: a flat set re-lays out or takes over a parameter only by binding it to a view of its own
    (FlatParams._bind); t's version is the one refilled; t is a leaf that requires grad, not cast yet this region."""
    key = id(t)
    r = _READY.get(key)
    if r is None:           # (a record holds its parameter: the id is t's)
        return None
    _, fskey, j, kept, view, dtype = r
    flat = s["flat_low"].get(fskey)
    cache = s["cache"]
    if (flat is None or flat[3] is not kept or t._version != flat[2][j] or t.data is not view
            or (low is not dtype and low != dtype) or key in cache or t.grad_fn is not None or not t.requires_grad):
        return None
    w = kept.weights[j]
    acc = t._accumulator        # t._edge()'s accumulator: the live one (the kept weight holds it), else made
    node = None if acc is None else acc()
    w.grad_fn = t._edge()[0] if node is None else node
    cache[key] = (t, t._version, w, flat[0])
    return w


def _direct_recorded(t, low, s):
    """``_flat_direct(t, low, s)``, and where it hands out t's kept direct weight, t's record made (``_READY``)."""
    w = _flat_direct(t, low, s)
    if w is not None:
        entry = _owners[id(t)]
        fs = entry[1]()
        kept = s["flat_low"][id(fs)][3]
        cur = _LOW_COPIES.get(id(fs))
        if cur is not None and cur[1] is kept:
            # (only a copy still kept: another thread's region may have replaced this one, whose records were
            # dropped then -- a record made now would keep the replaced copy alive; session 17's review)
            _READY[id(t)] = (t, id(fs), entry[2], kept, t.data, kept.buf.dtype)
            kept.ready_keys.add(id(t))
    return w


def _drop_ready(kept):
    """Forget the records of kept copy ``kept`` (replaced or dropped: the records must not keep it alive)."""
    for key in kept.ready_keys:
        r = _READY.get(key)
        if r is not None and r[3] is kept:
            del _READY[key]
    kept.ready_keys.clear()


def _lower_ready(args):
    """``cast_inputs`` of a lowered op with direct weights (conv, linear) where its outcome is plain, in one frame
    and by the parameters' records (host rounds 26b, 29, 30; switch ``_amp_state.LOWER_READY``), for a call (x,
    weight[, bias or None, settings...]) with no Tensor among the settings, in a region not suspended whose cache is
    on (a cache-off region's casts are cast_inputs' own: no kept weight to hand out there): a CUDA x in the
    region's dtype or in float32 (cast by ``_amp_state._cast``, as cast_inputs casts it: the stem's call) and a
    weight / bias in that dtype or in float32 (each its kept direct weight where its record tells, else where
    ``_flat_direct`` hands it out, else ``_amp_state._cast``'s cast): the args cast_inputs returns, cast in its
    order.  None, with nothing done, for anything else (the caller's other paths give the same result)."""
    try:
        s = _amp_local.state
        x, w, b = args[0], args[1], args[2]
    except (AttributeError, IndexError):
        if len(args) != 2:
            return None
        r = _lower_ready(args + (None,))       # (x, weight): as (x, weight, None), cast_inputs' two args back
        return None if r is None else r[:2]
    low = s["ready"]
    if low is None or type(x) is not Tensor:
        return None
    xd = x.data
    if type(xd) not in _CUDA_ARRAY_TYPES:
        return None
    rest = args[3:]
    for a in rest:
        if isinstance(a, Tensor):
            return None
    xt = xd.dtype
    if xt is not low and xt != low:
        if xt != _FLOAT32:
            return None
        xt = None                   # (cast below, once the others are known plain)
    if not isinstance(w, Tensor):
        return None
    wd = w.data.dtype
    if wd is not low and wd != low and wd != _FLOAT32:
        return None
    bd = None                       # the bias's dtype where it is to be cast
    if b is not None:
        if not isinstance(b, Tensor):
            return None
        bd = b.data.dtype
        if bd is low or bd == low:
            bd = None
        elif bd != _FLOAT32:
            return None
    if xt is None:
        x = _amp_state._cast(x, low, s, False)
    hot = DIRECT[0] and _grad_state.grad_enabled
    if wd is not low and wd != low:
        out = _ready_weight(w, s, low) if hot else None
        if out is None:
            out = _direct_recorded(w, low, s)
        w = _amp_state._cast(w, low, s, True) if out is None else out
    if bd is not None:
        out = _ready_weight(b, s, low) if hot else None
        if out is None:
            out = _direct_recorded(b, low, s)
        b = _amp_state._cast(b, low, s, True) if out is None else out
    return (x, w, b) + rest


def _used(s, key, fs):
    """Elements of flat set ``fs`` (id ``key``) the previous outermost region's casts used (0 if none, or if the entry
    was another flat set's, freed since)."""
    u = s["flat_used"].get(key)
    return u[1] if u is not None and u[0]() is fs else 0


def graph_weight(w):
    """Under create_graph, the weight a layer's backward computes with: a direct weight becomes the cast node's
    output for the same data (the old path's graph, so gradients of these ops reach the parameter widened to float32
    by the node, as before); any other ``w`` as it is."""
    n = w.grad_fn
    if type(n) is AccumulateGrad and n.variable.data.dtype != w.data.dtype:
        return _node_cast(n.variable, w.data, n.variable.device)
    return w


def leaf_grad(ctx, i, g):
    """Under create_graph, the gradient ``g`` a layer's backward returns for its input ``i``: for a direct weight (an
    edge to a float32 parameter's accumulator) cast to float32 by the differentiable transfer the cast node's
    backward ran; else ``g``."""
    edge = ctx.next_edges[i]
    if g is None or edge is None or type(edge[0]) is not AccumulateGrad:
        return g
    v = edge[0].variable
    if g.data.dtype == v.data.dtype:
        return g
    return transfer(g, device=v.device, dtype=v.data.dtype)


DIRECT = _amp_state.DIRECT_WEIGHTS
_amp_state.set_flat_caster(_cast_flat_buffer)
_amp_state.set_lower_ready(_lower_ready)
_amp_local = _amp_state._local
_CUDA_ARRAY_TYPES = _amp_state._CUDA_ARRAY_TYPES
_amp_state.set_direct_graph(graph_weight, leaf_grad, AccumulateGrad)
_amp_state.set_caster(_cast)
_amp_state.set_tensor_type(Tensor)
