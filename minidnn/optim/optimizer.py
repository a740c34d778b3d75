"""``Optimizer``: param groups, state, state_dict, zero_grad; subclasses supply the update.

A group is fused (``group["fused"]``, the default) or not.  A fused group's parameters are moved into flat
buffers (``_flat.FlatParams``, one per (device, dtype)) when the group is added; ``self.state[p]`` then holds
VIEWS into those buffers, so state_dict/load_state_dict and user code see PyTorch's per-parameter layout
whichever path runs.  ``step`` gathers, per group, either the flat sets or per-parameter lists and calls the
subclass's ``_fused_update`` / ``_single_update``.
"""
from __future__ import annotations

import copy
import os
from collections import defaultdict

import numpy as np

from .. import autograd as _ag
from ..backend import amp as _amp
from ..backend import devices as _dev
from ..backend.devices import is_floating as _is_floating
from ..tensor import Tensor
from ._flat import FlatParams

__all__ = ["Optimizer"]

# Host round 31: an optimizer keeps its parameters' AccumulateGrad nodes alive (``_held``, made at its first step).
# A leaf refers to its node weakly (Tensor._edge: a strong reference both ways would be a cycle, so a dropped model's
# memory would wait for the cyclic collector) and the graph is the node's only owner, so every step's forward made
# every parameter's node anew (65 a ResNet-20 step: a Python __init__, a weak reference and the object).  The
# optimizer already holds the parameters and outlives the steps; the node holds only its parameter (no saved
# tensors, no hooks: a leaf's hooks live on the tensor, ``_hooks``), so a node kept from one step to the next is
# the node the next step would have made, without the cycle.  Switch: HOLD_ACCUMULATORS[0] = False (or
# MINIDNN_OPTIM_HOLD_ACCUMULATORS=0 at import): the next step drops the list.
HOLD_ACCUMULATORS = [os.environ.get("MINIDNN_OPTIM_HOLD_ACCUMULATORS", "1") != "0"]


def _cuda_kernels_support(dtype):
    from ..backend.cuda import multi_tensor
    return multi_tensor.supports(dtype)


class _RequiredParameter:
    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


class Optimizer:
    """Base class.  ``params``: an iterable of Tensors, or of dicts (param groups) with per-group options."""

    _held = None        # the parameters' AccumulateGrad nodes, kept alive between steps (HOLD_ACCUMULATORS)

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        # parameter -> {name: array} (Tensor hashes by identity); a defaultdict as in PyTorch, so a custom
        # optimizer's step can write ``self.state[p]["buf"] = ...`` without creating the entry first
        self.state: defaultdict = defaultdict(dict)
        self.param_groups: list = []
        self._flat_sets: list = []         # per group: [FlatParams, ...] (empty for an unfused group)
        self._flat_index: dict = {}        # id(p) -> (FlatParams, index)
        self._launches_per_step = 0        # kernel launches (GPU) / vectorised passes (CPU) of the last step
        self._grad_copies_per_step = 0     # gradients that were not already in the flat buffer
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {type(params).__name__}")
        if isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering "
                            "of a set changes between runs; use a list")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def __repr__(self):
        lines = [self.__class__.__name__ + " ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {group[k]}" for k in sorted(group) if k != "params"]
        return "\n".join(lines) + "\n)"

    # -- groups ------------------------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict):
        """Add a group (a dict with "params" and optional per-group hyperparameters; the rest from defaults)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters need to be organized in ordered collections; use a list")
        unique, seen = [], set()
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
            if id(p) not in seen:          # a parameter shared between modules is updated once
                seen.add(id(p))
                unique.append(p)
        group["params"] = unique
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            group.setdefault(name, default)
        already = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in already for p in unique):
            raise ValueError("some parameters appear in more than one parameter group")
        self._validate(group)
        group["fused"] = self._resolve_fused(group) and self._has_fused_update()
        self.param_groups.append(group)
        self._flat_sets.append(self._build_flat(group) if group["fused"] else [])
        self._held = None       # (the next step holds the new group's nodes too)

    def _validate(self, group):
        """Subclasses raise ValueError naming the offending hyperparameter."""

    def _has_fused_update(self):
        """A subclass without a flat-buffer update (custom optimizers that override ``step``, per-tensor ones)
        keeps its parameters where they are."""
        return type(self)._fused_update is not Optimizer._fused_update

    @staticmethod
    def _resolve_fused(group):
        fused = group.get("fused")
        if group.get("master_weights") and fused is False:
            raise ValueError("master_weights=True keeps the float32 master copy in the fused flat buffers; it needs "
                             "fused=True (or the default)")
        floating = all(_is_floating(p.dtype) for p in group["params"])
        if fused is None:
            return floating
        if fused and not floating:
            bad = sorted({str(p.dtype) for p in group["params"] if not _is_floating(p.dtype)})
            raise ValueError(f"fused=True requires floating point parameters, got {', '.join(bad)}")
        return bool(fused)

    def _build_flat(self, group):
        buckets: dict = {}
        for p in group["params"]:
            buckets.setdefault((_dev.device_of(p.data), p.dtype), []).append(p)
        sets = [FlatParams(ps, self._flat_state_names(group), master_weights=group.get("master_weights", False))
                for ps in buckets.values()]
        for fs in sets:
            for j, p in enumerate(fs.params):
                self._flat_index[id(p)] = (fs, j)
                self.state.pop(p, None)
        return sets

    # -- subclass hooks ----------------------------------------------------------------------------------------------
    def _flat_state_names(self, group):
        """Names of the per-element state buffers a fused group allocates up front."""
        return ()

    def _flat_state_views(self, group, fs, j):
        """``self.state[p]`` of flat-set parameter ``j``: views into ``fs`` (None: this optimizer keeps none)."""
        return None

    def _fused_update(self, group, flat_sets):
        raise NotImplementedError

    def _single_update(self, group):
        raise NotImplementedError

    # -- step ----------------------------------------------------------------------------------------------------------
    fused_amp_scaling = False        # subclasses whose fused update honours grad_scale/found_inf set this

    @property
    def step_supports_amp_scaling(self) -> bool:
        """True when ``step`` itself unscales gradients and skips an overflowing step on the device: GradScaler
        then sets ``grad_scale`` ((1,) float32 scale, or None once unscale_ ran) and ``found_inf`` ((1,) float32)
        on the optimizer for the duration of ``step`` (PyTorch's protocol for its fused optimizers)."""
        return self.fused_amp_scaling and all(g["fused"] for g in self.param_groups)

    def step(self, closure=None):
        """One update of every parameter that has a gradient.  ``closure`` re-evaluates the model and returns
        the loss (it runs with grad enabled)."""
        found_inf = getattr(self, "found_inf", None)
        amp = {} if found_inf is None else {"scale": getattr(self, "grad_scale", None), "found_inf": found_inf}
        if amp and not self.step_supports_amp_scaling:
            raise RuntimeError(f"{type(self).__name__}.step: found_inf/grad_scale are set but this optimizer's step "
                               "cannot apply them (every group must be fused); let GradScaler unscale instead")
        loss = None
        if closure is not None:
            with _ag.enable_grad():
                loss = closure()
        launches = copies = 0
        with _ag.no_grad():
            for flat_sets in self._flat_sets:
                for fs in flat_sets:
                    fs.check_bindings()
                    copies += fs.collect_grads()
            if amp.get("scale") is not None:
                amp["scale"] = self._unscale_before_update(amp["scale"], amp["found_inf"])
            for group, flat_sets in zip(self.param_groups, self._flat_sets):
                if not flat_sets:
                    self._check_grads(group)
                    self._single_update(group)
                    continue
                launches += self._fused_update(group, flat_sets, **amp)
                for fs in flat_sets:
                    if not fs.has_state.all():
                        self._publish_flat_state(group, fs, np.flatnonzero(fs.has_grad & ~fs.has_state))
            # Each updated parameter was written in place (a fused kernel writes it through its flat buffer): bump
            # its version as PyTorch's in-place updates do, so a graph that saved it for backward refuses to run (the
            # conv filter carried from forward to backward data relies on that check).  A step that GradScaler's
            # found_inf skips on the device is bumped too: the host cannot know, and an extra bump costs nothing.
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p._version += 1
        if not HOLD_ACCUMULATORS[0]:
            self._held = None
        elif self._held is None:
            self._held = [e[0] for g in self.param_groups for p in g["params"]
                          if p.requires_grad and (e := p._edge()) is not None]
        self._launches_per_step = launches
        self._grad_copies_per_step = copies
        return loss

    def _check_grads(self, group):
        """A gradient must match its parameter's shape and device (NumPy would broadcast a wrong one silently)."""
        for i, p in enumerate(group["params"]):
            g = p.grad
            if g is not None and (tuple(g.shape) != tuple(p.shape) or g.device != p.device):
                raise RuntimeError(f"{type(self).__name__}.step: parameter {i} has shape {tuple(p.shape)} on "
                                   f"{p.device} but its gradient has shape {tuple(g.shape)} on {g.device}")

    def _fused_hyper(self, group):
        """The scalar hyperparameters a fused update reads from device memory, in its kernel's order (None: this
        optimizer's fused update reads none)."""
        return None

    def refresh_device_hyperparameters(self):
        """Upload every fused group's hyperparameters (lr, ...) to the device arrays its kernels read.  step() does
        this itself; LR schedulers call it so that a step replayed from a CUDA graph sees a new learning rate."""
        for group, flat_sets in zip(self.param_groups, self._flat_sets):
            values = self._fused_hyper(group)
            if values is None:
                continue
            for fs in flat_sets:
                if fs.device.type == "cuda":          # the CPU update reads the group's values directly
                    fs.device_hyper(values)

    def _unscale_before_update(self, scale, found_inf):
        """Loss scaling: a single flat set updated by a CUDA kernel checks and unscales its gradients inside its
        own launch (the scale is passed on).  Otherwise every gradient is unscaled and checked here first, so an
        overflow anywhere skips every set's update; returns None (nothing left to unscale)."""
        sets = [fs for flat_sets in self._flat_sets for fs in flat_sets]
        if len(sets) == 1 and sets[0].device.type == "cuda" and _cuda_kernels_support(sets[0].dtype):
            return scale
        grads = []
        for fs in sets:
            grads += [fs.grad] if fs.has_grad.all() else [fs.grad_views[j] for j in np.flatnonzero(fs.has_grad)]
        _amp.unscale_and_check_(grads, found_inf, scale)
        return None

    def _state_views(self, group, fs, j):
        """``self.state[p]`` of a flat-set parameter: the subclass's views, plus (master weights) the float32
        master copy, so that state_dict and checkpoints hold it."""
        views = self._flat_state_views(group, fs, j)
        if fs.master:
            views = dict(views or {})
            views["master_param"] = fs.master_views[j]
        return views

    def _publish_flat_state(self, group, fs, indices):
        for j in indices:
            views = self._state_views(group, fs, int(j))
            fs.has_state[j] = True
            if views is not None:
                self.state[fs.params[j]] = views

    def zero_grad(self, set_to_none: bool = True):
        """Clear every parameter's gradient: ``p.grad = None`` (default) or zero it in place.  A fused group keeps
        its flat gradient buffer either way (backward writes the next gradient into it)."""
        for group, flat_sets in zip(self.param_groups, self._flat_sets):
            done = set()
            if not set_to_none:
                for fs in flat_sets:      # every gradient lives in the flat buffer: one fill for all of them
                    if all(p.grad is not None and p.grad.data is fs.grad_views[j] for j, p in enumerate(fs.params)):
                        fs.grad.fill(0)
                        for p in fs.params:
                            p.grad._version += 1
                            done.add(id(p))
            for p in group["params"]:
                g = p.grad
                if g is None or id(p) in done:
                    continue
                if set_to_none:
                    p.grad = None
                    continue
                if g.grad_fn is not None or g.requires_grad:
                    g = p.grad = g.detach()
                g.data.fill(0)
                g._version += 1

    # -- state_dict --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """PyTorch's layout: {"state": {index: {name: array}}, "param_groups": [{..., "params": [index]}]}.
        Arrays are references (deep-copy them to keep a snapshot), as in PyTorch."""
        index: dict = {}
        groups = []
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in g["params"]]
            groups.append(packed)
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict):
        """Copy a state_dict's values INTO this optimizer's state (flat buffers are never rebound) and take its
        groups' hyperparameters.  State of parameters absent from ``state_dict`` is reset, as PyTorch drops it."""
        saved_groups, saved_state = self._check_state_dict(state_dict)
        # Everything is validated above; from here on nothing can fail half-way.
        for g in self.param_groups:
            for p in g["params"]:
                if id(p) not in saved_state:
                    self._reset_state(p)
        for g, s in zip(self.param_groups, saved_groups):
            g.update({k: v for k, v in s.items() if k not in ("params", "fused")})
        for g in self.param_groups:
            for p in g["params"]:
                values = saved_state.get(id(p))
                if values is not None:
                    self._load_param_state(g, p, values)

    def _check_state_dict(self, state_dict):
        """Validate a state_dict completely before anything is changed: its structure, group sizes, every
        hyperparameter (through the subclass's _validate on a copy) and every state entry's shape.  Returns
        (saved groups, {id(param): state})."""
        name = type(self).__name__
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
            raise ValueError(f"{name}.load_state_dict: expected a dict with 'state' and 'param_groups' (what "
                             f"state_dict() returns), got {type(state_dict).__name__}"
                             + (f" with keys {sorted(map(str, state_dict))}" if isinstance(state_dict, dict) else ""))
        saved_groups, saved_states = state_dict["param_groups"], state_dict["state"]
        if not isinstance(saved_groups, (list, tuple)) or not all(isinstance(g, dict) and "params" in g
                                                                  for g in saved_groups):
            raise ValueError(f"{name}.load_state_dict: 'param_groups' must be a list of dicts with 'params'")
        if not isinstance(saved_states, dict):
            raise ValueError(f"{name}.load_state_dict: 'state' must be a dict, got {type(saved_states).__name__}")
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved_groups)} parameter groups, the optimizer "
                             f"{len(self.param_groups)}")
        id_map = {}
        for i, (g, s) in enumerate(zip(self.param_groups, saved_groups)):
            if len(g["params"]) != len(s["params"]):
                raise ValueError(f"loaded state dict's parameter group {i} has {len(s['params'])} parameters, the "
                                 f"optimizer's {len(g['params'])}")
            trial = dict(g)
            trial.update({k: v for k, v in s.items() if k not in ("params", "fused")})
            try:
                self._validate(trial)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{name}.load_state_dict: parameter group {i}: {exc}") from None
            id_map.update(zip(s["params"], g["params"]))
        saved_state = {}
        for k, values in saved_states.items():
            try:
                p = id_map.get(int(k))
            except (TypeError, ValueError):
                raise ValueError(f"{name}.load_state_dict: state key {k!r} is not a parameter index") from None
            if p is None:
                continue
            if not isinstance(values, dict):
                raise ValueError(f"{name}.load_state_dict: state of parameter {k} must be a dict, got "
                                 f"{type(values).__name__}")
            for entry, value in values.items():
                shape = tuple(getattr(value, "shape", ()))
                if entry != "step" and shape not in ((), tuple(p.shape)):
                    raise ValueError(f"{name}.load_state_dict: state '{entry}' of parameter {k} has shape {shape} "
                                     f"but the parameter has shape {tuple(p.shape)}")
            saved_state[id(p)] = values
        return saved_groups, saved_state

    def _reset_state(self, p):
        entry = self._flat_index.get(id(p))
        self.state.pop(p, None)
        if entry is not None:
            fs, j = entry
            fs.set_step(j, 0)
            fs.has_state[j] = False
            for buf in fs.state.values():
                fs.view(buf, j)[...] = 0

    def _load_param_state(self, group, p, values):
        entry = self._flat_index.get(id(p))
        if entry is not None:
            fs, j = entry
            dst = self._state_views(group, fs, j)
            fs.has_state[j] = True
            if dst is None:
                return
            self.state[p] = dst
        else:
            dst = self.state.setdefault(p, {})
            if type(self)._single_update is Optimizer._single_update:
                self._load_custom_state(p, dst, values)
                return
        for name, value in values.items():
            if value is None:
                dst[name] = None
                continue
            value = value.data if isinstance(value, Tensor) else value
            floating = _is_floating(np.dtype(getattr(value, "dtype", float)))
            dtype = np.float32 if name == "step" else (
                (dst[name].dtype if dst.get(name) is not None else p.dtype) if floating else None)
            arr = _dev.to_device(value, p.device, dtype=dtype)
            if dst.get(name) is not None:
                if tuple(dst[name].shape) != tuple(arr.shape):
                    raise ValueError(f"load_state_dict: state '{name}' has shape {tuple(arr.shape)} but the "
                                     f"optimizer's is {tuple(dst[name].shape)}")
                dst[name][...] = arr
            else:
                dst[name] = _dev.to_device(arr, p.device, copy=True)
        if entry is not None:
            fs.set_step(j, self._flat_step_of(dst))
            if fs.master and "master_param" in values:       # the model's copy follows the loaded master copy
                fs.param_views[j][...] = fs.master_views[j].astype(fs.lowp_dtype)
                fs.params[j]._version += 1

    @staticmethod
    def _load_custom_state(p, dst, values):
        """A custom optimizer (its own ``step``) gets its state back as it wrote it, PyTorch's policy: Tensors
        stay Tensors on the parameter's device (floating ones in its dtype, except "step"), arrays stay arrays,
        anything else is deep-copied."""
        for name, value in values.items():
            if isinstance(value, Tensor):
                dtype = p.dtype if name != "step" and _is_floating(value.dtype) else value.dtype
                dst[name] = Tensor._from_array(_dev.to_device(value.data, p.device, dtype=dtype, copy=True))
            elif hasattr(value, "shape") and hasattr(value, "dtype"):
                dst[name] = _dev.to_device(value, p.device, copy=True)
            else:
                dst[name] = copy.deepcopy(value)

    def _flat_step_of(self, state):
        """The step count a loaded flat-set state means (Adam: its "step"; SGD: 1 if it has a buffer)."""
        return int(float(state["step"])) if "step" in state else 0
