"""Flat buffers: every parameter of one (param group, device, dtype) lives in ONE contiguous array.

    param  = [ p0 ...pad | p1 ......pad | p2 .pad ]      each parameter's .data is REBOUND to its slice
    grad   = [ g0 ...pad | g1 ......pad | g2 .pad ]      each parameter's _grad_storage is its slice: backward
                                                         (AccumulateGrad) writes the first gradient into it
    state  = {"exp_avg": [...], "exp_avg_sq": [...]}    optimizer state, same layout
    steps  = [s0, s1, s2]  (float32, on the device)     per-parameter step counts (the kernels advance them)

Offsets are aligned to 128 bytes, so every slice starts on a vector boundary and the fused update is one
elementwise pass over whole arrays.  Padding stays zero forever (a zero gradient leaves a zero parameter and
zero state unchanged under SGD and Adam).

What invalidates a binding, and what ``check_bindings`` does about it (once per step, an identity test per
parameter):
  * ``p.data = new_array`` of the same shape, dtype and device: the values are copied into the buffer and
    ``p.data`` is rebound to its slice again (re-gather; the optimizer state is kept).  A new memory format
    (``model.to(memory_format=channels_last)`` after the optimizer was built) lays the slices out again in it.
  * a different device, dtype or shape (``model.to(...)`` after the optimizer was built): RuntimeError.
  * another fused optimizer built later over the same parameter took it over: RuntimeError.
"""
from __future__ import annotations

import numpy as np

from .. import _memory_format as _mf
from ..backend import devices as _dev
from ..backend.ownership import owner_of, register_owner

__all__ = ["FlatParams", "owner_of"]

_ALIGN_BYTES = 128
def _describe(arr):
    return f"{_dev.device_of(arr)}/{arr.dtype}/{tuple(arr.shape)}"


def _memory_order(arr):
    """The channels-last axis order of a 4-D / 5-D ``arr`` in that memory format (and not also row-major), else None."""
    fmt = {4: _mf.channels_last, 5: _mf.channels_last_3d}.get(arr.ndim)
    if fmt is None or arr.flags.c_contiguous or not _mf.is_in(arr, fmt):
        return None
    return _mf._last_perm(arr.ndim)


class FlatParams:
    """The flat buffers of one (group, device, dtype).  ``state_names``: the optimizer's per-element state;
    ``master_weights``: float16/bfloat16 parameters are updated through a float32 master copy (see __init__)."""

    def __init__(self, params, state_names=(), master_weights=False):
        first = params[0].data
        self.params = list(params)
        self.xp = _dev.array_module(first)
        self.device = _dev.device_of(first)
        # master_weights (apex O2): the model keeps float16/bfloat16 parameters and gradients (param_lowp, grad),
        # the update runs on a float32 master copy (param) and float32 state, and writes the rounded result back.
        self.master = bool(master_weights) and first.dtype.itemsize == 2
        self.lowp_dtype = first.dtype if self.master else None
        self.dtype = np.dtype(np.float32) if self.master else first.dtype
        align = max(1, _ALIGN_BYTES // self.dtype.itemsize)
        self.shapes = [tuple(p.shape) for p in params]
        # a channels-last parameter keeps its memory format (as PyTorch's): its slices in every flat buffer are laid
        # out in its memory order, so the views have its strides and the update stays one pass over whole arrays
        self.perms = [_memory_order(p.data) for p in params]
        self.numels = [int(p.data.size) for p in params]
        self.offsets = []
        total = 0
        for n in self.numels:
            self.offsets.append(total)
            total += -(-n // align) * align if n else 0
        self.total = max(total, align)
        xp = self.xp
        with _dev.device_guard(self.device):
            self.param = xp.zeros(self.total, dtype=self.dtype)
            self.param_lowp = xp.zeros(self.total, dtype=self.lowp_dtype) if self.master else None
            self.grad = xp.zeros(self.total, dtype=first.dtype)
            self.steps = xp.zeros(len(params), dtype=np.float32)
            self.state = {name: xp.zeros(self.total, dtype=self.dtype) for name in state_names}
        self.steps_host = np.zeros(len(params), dtype=np.int64)   # mirror of steps, kept without a device sync
        model_flat = self.param_lowp if self.master else self.param
        self.param_views = [self.view(model_flat, j) for j in range(len(params))]     # what p.data is bound to
        self.master_views = [self.view(self.param, j) for j in range(len(params))] if self.master else None
        self.grad_views = [self.view(self.grad, j) for j in range(len(params))]
        self.has_grad = np.zeros(len(params), dtype=bool)
        self.all_grads = False          # has_grad.all() of the last collect_grads, as a Python bool
        self.steps_same = True          # every steps_host value equal (kept by advance_steps / set_step)
        self.has_state = np.zeros(len(params), dtype=bool)    # the optimizer published state[p] views for it
        self._device_mask = None       # (pattern bytes, uint8 device array) of the last masked step
        self._vec_param = None
        self._scratch = None
        self._hyper = None             # (values tuple, float64 device array)
        self.ticket = None
        for j, p in enumerate(params):
            self._bind(j, p)

    def sync_lowp(self, start=0, stop=None):
        """master_weights: round the float32 master copy into the model's low-precision parameters."""
        if self.master:
            self.param_lowp[start:stop] = self.param[start:stop].astype(self.lowp_dtype)

    # -- layout ------------------------------------------------------------------------------------------------
    def view(self, flat, j):
        o = self.offsets[j]
        perm, shape = self.perms[j], self.shapes[j]
        if perm is None:
            return flat[o:o + self.numels[j]].reshape(shape)
        return flat[o:o + self.numels[j]].reshape([shape[a] for a in perm]).transpose(_mf._first_perm(len(shape)))

    def state_buffer(self, name):
        """The flat array of state ``name``, allocated (zeros) on first use."""
        buf = self.state.get(name)
        if buf is None:
            with _dev.device_guard(self.device):
                buf = self.state[name] = self.xp.zeros(self.total, dtype=self.dtype)
        return buf

    def _bind(self, j, p):
        pv, gv = self.param_views[j], self.grad_views[j]
        pv[...] = p.data
        if self.master:
            self.master_views[j][...] = p.data.astype(self.dtype)
        p.data = pv
        g = p.grad
        if g is not None:
            if g.grad_fn is None and not g.requires_grad:
                gv[...] = _dev.to_device(g.data, self.device)
                p.grad = p._wrap_like(gv)
        p._grad_storage = gv
        register_owner(p, self, j)

    def check_bindings(self):
        """Re-gather parameters whose ``.data`` was replaced by an array of the same kind; raise otherwise."""
        for j, p in enumerate(self.params):
            if p.data is self.param_views[j] and p._grad_storage is self.grad_views[j]:
                continue
            owner = owner_of(p)
            if owner is None or owner[0] is not self:
                raise RuntimeError(
                    f"optimizer: parameter {j} (shape {self.shapes[j]}) now belongs to another fused optimizer's flat "
                    "buffer; two fused optimizers cannot share parameters (use fused=False for one of them)")
            new, pv = p.data, self.param_views[j]
            if (new.shape != pv.shape or new.dtype != pv.dtype or _dev.device_of(new) != self.device):
                raise RuntimeError(
                    f"optimizer: parameter {j} is now {_describe(new)} but the optimizer's flat buffer holds it as "
                    f"{_describe(pv)}: the model was moved or cast after the optimizer was built. Build the optimizer "
                    "after model.to(...), or use fused=False")
            perm = _memory_order(new)
            if perm != self.perms[j]:
                self._relayout(j, perm, p)      # model.to(memory_format=...) after the optimizer was built
            self._bind(j, p)

    def _relayout(self, j, perm, p):
        """Lay parameter ``j``'s (``p``'s) slices out in another memory order (``perm``, None for row-major), values
        kept, in every flat buffer; its views are made again (its published state views at the next step), and a
        gradient still held in the old gradient view is handed the new one (the same values)."""
        bufs = [self.param, self.grad, *self.state.values()] + ([self.param_lowp] if self.master else [])
        values = [self.view(b, j).copy() for b in bufs]
        old_grad_view = self.grad_views[j]
        self.perms[j] = perm
        for b, v in zip(bufs, values):
            self.view(b, j)[...] = v
        self.param_views[j] = self.view(self.param_lowp if self.master else self.param, j)
        if self.master:
            self.master_views[j] = self.view(self.param, j)
        self.grad_views[j] = self.view(self.grad, j)
        if p.grad is not None and p.grad.data is old_grad_view:
            p.grad = p._wrap_like(self.grad_views[j])
        self.has_state[j] = False

    # -- per-step gradient bookkeeping ----------------------------------------------------------------------------
    def collect_grads(self):
        """Fill ``has_grad``; copy gradients that do not live in the flat buffer into it.  Returns the number of
        such copies (0 when backward wrote every gradient in place)."""
        copies = 0
        has = self.has_grad
        missing = 0
        for j, p in enumerate(self.params):
            g = p.grad
            if g is None:
                has[j] = False
                missing += 1
                continue
            has[j] = True
            gv = self.grad_views[j]
            if g.data is not gv:
                if g.data.shape != gv.shape:
                    raise RuntimeError(f"optimizer: parameter {j} has shape {gv.shape} but its gradient "
                                       f"{tuple(g.data.shape)}")
                gv[...] = _dev.to_device(g.data, self.device)
                copies += 1
        self.all_grads = not missing
        return copies

    def uniform(self):
        """Every parameter has a gradient and all step counts agree: the unmasked update applies."""
        return self.all_grads and self.steps_same      # (two NumPy reductions a step before: ~2.5 us)

    def runs(self):
        """Maximal [start, stop) element ranges of consecutive parameters with a gradient and one step count,
        as (start, stop, first_index, last_index + 1): the pieces of an xp-generic masked update."""
        out, j, n = [], 0, len(self.params)
        has, steps = self.has_grad, self.steps_host
        while j < n:
            if not has[j]:
                j += 1
                continue
            k = j + 1
            while k < n and has[k] and steps[k] == steps[j]:
                k += 1
            stop = self.offsets[k] if k < n else self.total
            out.append((self.offsets[j], stop, j, k))
            j = k
        return out

    def advance_steps(self, on_device):
        """Count this step for every parameter that had a gradient: in the host mirror, and on the device too
        unless the CUDA kernel already did (``on_device`` False)."""
        if self.all_grads:
            self.steps_host += 1        # (no boolean index: every parameter had one, the counts stay as equal)
        else:
            self.steps_host[self.has_grad] += 1
            self._steps_changed()
        if on_device:
            self.steps[self.xp.asarray(self.has_grad)] += 1

    def set_step(self, j, value):
        """Used by load_state_dict: one parameter's step, on the device and in the host mirror."""
        self.steps_host[j] = int(value)
        self.steps[j] = value
        self._steps_changed()

    def _steps_changed(self):
        s = self.steps_host
        self.steps_same = bool((s == s[0]).all())

    # -- device-side inputs of the fused kernels --------------------------------------------------------------------
    def device_hyper(self, values):
        """The float64 device array of scalar hyperparameters; uploaded only when the values change."""
        values = tuple([float(v) for v in values])
        if self._hyper is None or self._hyper[0] != values:
            with _dev.device_guard(self.device):
                if self._hyper is None or self._hyper[1].size != len(values):
                    arr = self.xp.asarray(np.asarray(values, dtype=np.float64))
                else:
                    arr = self._hyper[1]
                    arr.set(np.asarray(values, dtype=np.float64))
            self._hyper = (values, arr)
        return self._hyper[1]

    def device_mask(self, vector_width):
        """(has_grad uint8, vec_param int32) device arrays for the masked kernel variant."""
        xp = self.xp
        with _dev.device_guard(self.device):
            if self._vec_param is None:
                seg = [(self.offsets[j + 1] if j + 1 < len(self.params) else self.total) - self.offsets[j]
                       for j in range(len(self.params))]
                owners = np.repeat(np.arange(len(self.params), dtype=np.int32),
                                   np.asarray(seg, dtype=np.int64) // vector_width)
                self._vec_param = xp.asarray(owners)
            pattern = self.has_grad.tobytes()
            if self._device_mask is None or self._device_mask[0] != pattern:
                self._device_mask = (pattern, xp.asarray(self.has_grad.astype(np.uint8)))
        return self._device_mask[1], self._vec_param

    def device_ticket(self):
        """uint32 words the fused kernels coordinate their blocks with: [0] the last-block ticket, [1:3] the
        grid barrier of a loss-scaled launch (arrivals, generation).  Each launch leaves them ready for the next."""
        if self.ticket is None:
            with _dev.device_guard(self.device):
                self.ticket = self.xp.zeros(4, dtype=np.uint32)
        return self.ticket

    def scratch(self, count, length):
        """``count`` scratch arrays of ``length`` elements for the xp-generic update (allocated once)."""
        if self._scratch is None or len(self._scratch) < count or self._scratch[0].size < length:
            with _dev.device_guard(self.device):
                self._scratch = [self.xp.empty(length, dtype=self.dtype) for _ in range(count)]
        return self._scratch
