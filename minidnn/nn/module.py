"""``Module``: the base class of every layer, with PyTorch's registration, traversal and state-dict rules.

Registration order is the contract: parameters, buffers and children live in insertion-ordered dicts (never
sets), so ``parameters()`` and ``state_dict()`` come out in the same order on every run.  Optimizers' flat
buffers and checkpoints rely on that.

Adding a layer is: subclass, create ``Parameter``s / buffers / submodules in ``__init__`` (attribute
assignment registers them), write ``forward``, optionally ``extra_repr`` (for the printed tree),
``reset_parameters`` and ``_macs(input, output)`` (multiply-adds for ``minidnn.summary``; see summary.py).
A layer whose checkpoint format needs care overrides ``_load_from_state_dict`` (same arguments as here).
"""
from __future__ import annotations

import itertools
import operator
import os
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from .. import _memory_format as _mf
from .._tensor_convert import parse_to_args
from ..autograd import no_grad
from ..backend import devices as _dev
from ..backend.devices import is_floating as _is_floating
from ..tensor import Tensor, _to_dtype
from .parameter import Buffer, Parameter

__all__ = ["Module", "RemovableHandle"]


class _IncompatibleKeys(NamedTuple):
    missing_keys: list
    unexpected_keys: list


class RemovableHandle:
    """Returned by the ``register_*_hook`` methods: ``remove()`` unregisters the hook (idempotent)."""

    _next_id = itertools.count()

    def __init__(self, *hook_dicts):
        self.id = next(RemovableHandle._next_id)
        self._hook_dicts = hook_dicts

    def remove(self):
        for d in self._hook_dicts:
            d.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _addindent(s, num_spaces):
    """Indent every line of ``s`` but the first (how PyTorch nests child reprs)."""
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    return lines[0] + "\n" + "\n".join(" " * num_spaces + line for line in lines[1:])


def _check_name(module, kind, name):
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string, got {type(name).__name__}")
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
    if hasattr(module, name) and name not in module._parameters and name not in module._buffers \
            and name not in module._modules:
        raise KeyError(f"attribute '{name}' already exists")


class Module:
    """Base class of all layers.  Subclasses call ``super().__init__()`` first, then assign attributes."""

    training: bool

    def __init__(self):
        # object.__setattr__: our own __setattr__ needs these dicts to exist already.
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers_set", set())   # names only; order comes from _buffers
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        object.__setattr__(self, "_hooks_with_kwargs", set())
        object.__setattr__(self, "_backward_hooks", OrderedDict())
        object.__setattr__(self, "_backward_pre_hooks", OrderedDict())

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    # ------------------------------------------------------------------------------------------
    # Registration
    # ------------------------------------------------------------------------------------------
    def _require_init(self, what):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {what} before Module.__init__() call")

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self._require_init("parameter")
        _check_name(self, "parameter", name)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(minidnn.nn.Parameter or None required)")
        if param is not None and param.grad_fn is not None:
            raise ValueError(f"cannot assign non-leaf Tensor to parameter '{name}': model parameters must be created "
                             "explicitly (wrap the computed value in Parameter(value.detach()))")
        self._buffers.pop(name, None)
        self._modules.pop(name, None)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """A tensor that is module state but not learnable (running statistics).  Persistent buffers
        go into ``state_dict``; non-persistent ones only move with ``to()``."""
        self._require_init("buffer")
        _check_name(self, "buffer", name)
        if name in self._parameters:
            raise KeyError(f"attribute '{name}' already exists (as a parameter)")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(minidnn Tensor or None required)")
        self._modules.pop(name, None)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name: str, module: "Module | None") -> None:
        self._require_init("child module")
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        _check_name(self, "module", name)
        self._parameters.pop(name, None)
        self._buffers.pop(name, None)
        self._modules[name] = module

    register_module = add_module

    def __setattr__(self, name, value):
        params = self.__dict__.get("_parameters")
        if isinstance(value, Parameter):
            self._require_init("parameters")
            self.__dict__.pop(name, None)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(minidnn.nn.Parameter or None expected)")
            params[name] = None
        elif isinstance(value, Module):
            self._require_init("module")
            self.__dict__.pop(name, None)
            self.add_module(name, value)
        elif params is not None and name in self._modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                "(minidnn.nn.Module or None expected)")
            self._modules[name] = None
        elif isinstance(value, Buffer) or (params is not None and name in self._buffers):
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(minidnn Tensor or None expected)")
            persistent = value.persistent if isinstance(value, Buffer) \
                else name not in self._non_persistent_buffers_set
            self.__dict__.pop(name, None)
            self.register_buffer(name, value, persistent)
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # Only called when normal lookup fails: look in the registries (written out: every layer call reads its
        # parameters and submodules through here).
        d = self.__dict__
        reg = d.get("_parameters")
        if reg is not None and name in reg:
            return reg[name]
        reg = d.get("_buffers")
        if reg is not None and name in reg:
            return reg[name]
        reg = d.get("_modules")
        if reg is not None and name in reg:
            return reg[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for registry in (self._parameters, self._buffers, self._modules):
            if name in registry:
                del registry[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    # ------------------------------------------------------------------------------------------
    # Traversal (all in registration order; ``remove_duplicate`` yields shared objects once)
    # ------------------------------------------------------------------------------------------
    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from module.named_modules(memo, sub, remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, get_members, prefix="", recurse=True, remove_duplicate=True):
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse \
            else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in get_members(module):
                if value is None:
                    continue
                if remove_duplicate:
                    if id(value) in seen:
                        continue
                    seen.add(id(value))
                yield module_prefix + ("." if module_prefix else "") + name, value

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self._named_members(lambda m: m._parameters.items(), prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self._named_members(lambda m: m._buffers.items(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of scalar parameters, shared ones counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def get_submodule(self, target: str) -> "Module":
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if item not in mod._modules:
                raise AttributeError(f"{mod._get_name()} has no attribute `{item}` (looking up '{target}')")
            mod = mod._modules[item]
            if not isinstance(mod, Module):
                raise AttributeError(f"`{item}` is not a Module (looking up '{target}')")
        return mod

    def _get_member(self, target, registry, kind):
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        reg = getattr(mod, registry)
        if reg.get(name) is None:       # a slot registered as None (Linear(bias=False).bias) holds nothing
            raise AttributeError(f"{mod._get_name()} has no {kind} `{name}` (looking up '{target}')")
        return reg[name]

    def get_parameter(self, target: str) -> Parameter:
        return self._get_member(target, "_parameters", "parameter")

    def get_buffer(self, target: str) -> Tensor:
        return self._get_member(target, "_buffers", "buffer")

    # ------------------------------------------------------------------------------------------
    # Modes, gradients
    # ------------------------------------------------------------------------------------------
    def train(self, mode: bool = True):
        if not isinstance(mode, bool):
            raise ValueError(f"training mode is expected to be boolean, got {mode!r}")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (``set_to_none``: the next backward allocates or lands in the optimizer's
        flat buffer) or zero them in place (keeps views into flat gradient buffers valid)."""
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                with no_grad():
                    p.grad.zero_()

    def apply(self, fn):
        """Call ``fn(module)`` on every submodule (children first) and on self, e.g. for custom init."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------------------------------
    # Devices and dtypes: in place, so references held elsewhere (an optimizer) stay valid
    # ------------------------------------------------------------------------------------------
    def _apply_to_tensors(self, convert):
        """Rebind ``.data`` (and ``.grad.data``) of every parameter and buffer to ``convert(array)``.

        The Tensor objects themselves are kept: an optimizer built before ``model.to(...)`` still holds the
        very parameters that the model uses.  A tensor whose array changes loses its optimizer-owned flat
        gradient slot (``_grad_storage``): that slot lived in the old device/dtype."""
        seen = set()
        for m in self.modules():
            for t in itertools.chain(m._parameters.values(), m._buffers.values()):
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                new = convert(t.data)
                if new is t.data:
                    continue
                t.data = new
                t._version += 1
                t._grad_storage = None
                if t.grad is not None:
                    g = convert(t.grad.data)
                    if g is not t.grad.data:
                        t.grad.data = g
        return self

    def to(self, *args, **kwargs):
        """``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(tensor)``, ``memory_format=``; dtype casts only
        floating tensors (integer buffers such as counters keep their dtype), as in PyTorch; memory_format relays
        the 4-D (channels_last) or 5-D (channels_last_3d) parameters and buffers."""
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        fmt = kwargs.pop("memory_format", None)
        if kwargs:
            raise TypeError(f"Module.to() got unexpected keyword arguments {sorted(kwargs)}")
        device, dtype = parse_to_args(args, device, dtype)
        dtype = _to_dtype(dtype)
        if dtype is not None and not _is_floating(dtype, complex_ok=True):
            raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, "
                            f"but got desired dtype={dtype}")
        dev = _dev.device(device) if device is not None else None

        def convert(arr):
            dt = dtype if dtype is not None and _is_floating(arr.dtype, complex_ok=True) else None
            if dt is not None and _is_floating(dt) and arr.dtype.kind == "c":
                dt = None      # never silently drop imaginary parts
            target = dev if dev is not None else _dev.device_of(arr)
            if not (target == _dev.device_of(arr) and (dt is None or dt == arr.dtype)):
                arr = _dev.to_device(arr, target, dtype=dt)
            if fmt is not None and arr.ndim == {_mf.channels_last: 4, _mf.channels_last_3d: 5}.get(fmt, arr.ndim):
                arr = _mf.relayout(arr, fmt, "Module.to")      # PyTorch: only 4-D (5-D) tensors change layout
            return arr

        return self._apply_to_tensors(convert)

    def cuda(self, device=None):
        return self.to("cuda" if device is None else (f"cuda:{device}" if isinstance(device, int) else device))

    def cpu(self):
        return self.to("cpu")

    def float(self):
        return self.to(np.float32)

    def double(self):
        return self.to(np.float64)

    def half(self):
        return self.to(np.float16)

    # ------------------------------------------------------------------------------------------
    # Calling, hooks
    # ------------------------------------------------------------------------------------------
    def register_forward_pre_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False):
        """``hook(module, args) -> None or new args`` (``with_kwargs``: ``hook(module, args, kwargs) -> None or
        (args, kwargs)``) runs before ``forward``."""
        return self._add_hook(self._forward_pre_hooks, hook, prepend, with_kwargs)

    def register_forward_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False):
        """``hook(module, args, output) -> None or new output`` (``with_kwargs``: ``hook(module, args, kwargs,
        output)``) runs after ``forward``."""
        return self._add_hook(self._forward_hooks, hook, prepend, with_kwargs)

    def register_full_backward_hook(self, hook, prepend: bool = False):
        """``hook(module, grad_input, grad_output) -> None or new grad_input``, run when the gradients with respect
        to the module's tensor arguments are computed (grad_input all None when none requires grad).  Tuples hold
        one entry per tensor argument / output, None where there is no gradient."""
        return self._add_hook(self.__dict__.setdefault("_backward_hooks", OrderedDict()), hook, prepend, False)

    def register_full_backward_pre_hook(self, hook, prepend: bool = False):
        """``hook(module, grad_output) -> None or new grad_output``, run when the gradients of the module's
        outputs are computed, before grad_input."""
        return self._add_hook(self.__dict__.setdefault("_backward_pre_hooks", OrderedDict()), hook, prepend, False)

    def _add_hook(self, hooks, hook, prepend, with_kwargs):
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        if prepend:
            hooks.move_to_end(handle.id, last=False)
        if with_kwargs:
            self._hooks_with_kwargs.add(handle.id)
        return handle

    def __call__(self, *args, **kwargs):
        d = self.__dict__       # no hook of any kind (the common case): straight to forward, one frame
        if not (d.get("_forward_pre_hooks", 1) or d.get("_forward_hooks", 1) or d.get("_backward_hooks")
                or d.get("_backward_pre_hooks")):
            return self.forward(*args, **kwargs)
        if d.get("_backward_hooks") or d.get("_backward_pre_hooks"):
            from ._backward_hooks import call_with_backward_hooks
            return call_with_backward_hooks(self, args, kwargs, self._call_forward)
        return self._call_forward(*args, **kwargs)

    def _call_forward(self, *args, **kwargs):
        if not (self._forward_pre_hooks or self._forward_hooks):
            return self.forward(*args, **kwargs)
        kw_hooks = self._hooks_with_kwargs
        for hid, hook in list(self._forward_pre_hooks.items()):
            if hid in kw_hooks:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError(f"forward pre-hook with kwargs must return None or (args, kwargs), "
                                           f"got {type(result).__name__}")
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        output = self.forward(*args, **kwargs)
        for hid, hook in list(self._forward_hooks.items()):
            result = hook(self, args, kwargs, output) if hid in kw_hooks else hook(self, args, output)
            if result is not None:
                output = result
        return output

    # ------------------------------------------------------------------------------------------
    # State dict
    # ------------------------------------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()

    def state_dict(self, *, destination=None, prefix: str = "", keep_vars: bool = False):
        """An OrderedDict ``"features.0.weight" -> tensor`` of parameters and persistent buffers.  The tensors
        are detached but share memory with the module (save or clone them to keep a snapshot)."""
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        return destination

    def _load_from_state_dict(self, state_dict, prefix, strict, missing_keys, unexpected_keys, error_msgs, copies):
        """Check this module's own entries of ``state_dict`` (keys under ``prefix``) and queue the copies.

        Appends to ``missing_keys``/``unexpected_keys``/``error_msgs``; appends ``(target, value)`` to ``copies``.
        Nothing is written here: ``load_state_dict`` copies only when no module reported an error."""
        local = [(n, p) for n, p in self._parameters.items() if p is not None]
        local += [(n, b) for n, b in self._buffers.items()
                  if b is not None and n not in self._non_persistent_buffers_set]
        local_names = set()
        for name, target in local:
            key = prefix + name
            local_names.add(name)
            if key not in state_dict:
                missing_keys.append(key)
                continue
            value = state_dict[key]
            if not isinstance(value, (Tensor, np.ndarray)):
                error_msgs.append(f'While copying the parameter named "{key}", expected a Tensor or numpy array from '
                                  f"checkpoint but received {type(value).__name__}")
                continue
            if tuple(value.shape) != tuple(target.shape):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(value.shape)} from "
                                  f"checkpoint, the shape in current model is {tuple(target.shape)}.")
                continue
            copies.append((target, value))
        if strict:
            for key in state_dict:
                if key.startswith(prefix):
                    head = key[len(prefix):].split(".", 1)[0]
                    if head not in self._modules and head not in local_names:
                        unexpected_keys.append(key)

    def load_state_dict(self, state_dict, strict: bool = True):
        """Copy ``state_dict``'s values into this module's parameters and buffers, in place, under no_grad.

        Shape mismatches are always errors; with ``strict`` missing and unexpected keys are too.  The check
        runs before any copy, so a failed load leaves the module untouched (PyTorch copies what it can).
        Returns ``(missing_keys, unexpected_keys)``."""
        if not hasattr(state_dict, "keys"):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict).__name__}.")
        missing, unexpected, errors, copies = [], [], [], []

        def visit(module, prefix):
            module._load_from_state_dict(state_dict, prefix, True, missing, unexpected, errors, copies)
            for name, child in module._modules.items():
                if child is not None:
                    visit(child, prefix + name + ".")

        visit(self, "")
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ")
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {self._get_name()}:\n\t" + "\n\t".join(errors))
        with no_grad():
            for target, value in copies:
                target.copy_(value)
        return _IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------------------------------
    # Printing
    # ------------------------------------------------------------------------------------------
    def _get_name(self):
        return type(self).__name__

    def extra_repr(self) -> str:
        """The text inside ``Name(...)`` (override it to show a layer's configuration)."""
        return ""

    def __repr__(self):
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({key}): " + _addindent(repr(module), 2) for key, module in self._modules.items()]
        lines = extra_lines + child_lines
        main = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main += extra_lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


# ---- registered attributes read without the __getattr__ round trip (docs/host_overhead.md round 25) -------------
# ``module.weight`` on a layer is a failed normal lookup (the type's MRO, the instance __dict__, an AttributeError
# raised and caught) and then Module.__getattr__: ~0.65 µs a name on this CPU.  A layer's forward that reads several
# per call (batch norm five) asks ``registered`` first: the same values, from the registries in __getattr__'s order,
# where the normal lookup is known to fail -- no class of the module's type defines the name, the type keeps
# Module's __getattr__ and object's __getattribute__ (decided once per type and names), the instance __dict__ does
# not hold the name (checked per call) -- and every name is a parameter or a buffer (None values included).
# Anything else returns None and the layer reads its attributes as before (the same values and errors, in its order).
# Switch: REGISTERED_READS[0] = False (or MINIDNN_MODULE_REGISTERED_READS=0 at import): always None.
# Host round 30: convolution / linear layers read their weight and bias so too (~0.6 µs a name on this CPU through
# __getattr__, a failed normal lookup first).  Each type's read learns where its names were (all parameters, or batch
# norm's parameters then buffers) and reads them next time with one itemgetter call a registry, checking only what
# keeps that exact (the loop otherwise).  Switch: REGISTERED_LAYERS[0] = False (or MINIDNN_MODULE_REGISTERED_LAYERS=0
# at import): those call sites read their attributes one by one and registered reads name by name, as before.
# (Round 30 also found submodules, for the model zoo's blocks; round 31 removed that: the zoo's forwards went back to
# the PyTorch way, so no caller was left, and a general one for users' blocks would have to stay exact under
# ``_modules`` surgery and copies of a module's __dict__.)
REGISTERED_READS = [os.environ.get("MINIDNN_MODULE_REGISTERED_READS", "1") != "0"]
REGISTERED_LAYERS = [os.environ.get("MINIDNN_MODULE_REGISTERED_LAYERS", "1") != "0"]
_PLAIN_TYPES: dict = {}
_MISSING = object()


def _plan(cls, names):
    """False where the normal lookup of some name of ``names`` need not fail for type ``cls`` (see above), else the
    type's read plan: [how the last full read found the names (1 all parameters, k + 3 the first k parameters and
    the rest buffers -- batch norm's weight, bias and statistics --, 0 otherwise),
    ``operator.itemgetter(*names)``, {k: (itemgetter of the first k, of the rest, the rest)}] -- the guess only
    picks which one-call read to try first: each is exact on its own, and a failed one falls to the loop."""
    key = (cls, names)
    plan = _PLAIN_TYPES.get(key)
    if plan is None:
        plan = _PLAIN_TYPES[key] = (cls.__getattr__ is Module.__getattr__
                                    and cls.__getattribute__ is object.__getattribute__
                                    and not any(n in vars(k) for k in cls.__mro__ for n in names)
                                    and [0, operator.itemgetter(*names) if len(names) > 1 else None, {}])
    return plan


def registered(module, names: tuple):
    """``[getattr(module, n) for n in names]`` where each ``n`` is a parameter or buffer reached through
    Module.__getattr__ (its order: parameters, then buffers), else None (see above)."""
    d = module.__dict__
    if not (REGISTERED_READS[0] and (plan := _plan(type(module), names)) and d.keys().isdisjoint(names)):
        return None
    params, buffers = d.get("_parameters"), d.get("_buffers")
    if params is None or buffers is None:
        return None
    if not REGISTERED_LAYERS[0]:      # round 25's reads, name by name
        out = []
        for n in names:
            v = params.get(n, _MISSING)
            if v is _MISSING:
                v = buffers.get(n, _MISSING)
                if v is _MISSING:
                    return None
            out.append(v)
        return out
    kind = plan[0]
    if kind == 1:           # every name a parameter (a layer's weight and bias): the first registry's values
        try:
            return list(plan[1](params))
        except KeyError:
            pass
    elif kind:              # parameters, then buffers none of which is a parameter
        head, tail, rest = plan[2][kind - 3]
        if params.keys().isdisjoint(rest):
            try:
                out = list(head(params))
                out += tail(buffers)
                return out
            except KeyError:
                pass
    out = []
    where = []              # per name: 1 a parameter, 3 a buffer
    for n in names:
        v = params.get(n, _MISSING)
        if v is not _MISSING:
            where.append(1)
        else:
            v = buffers.get(n, _MISSING)
            if v is _MISSING:
                return None
            where.append(3)
        out.append(v)
    if plan[1] is not None:
        plan[0] = _learn(plan, names, where)
    return out


def _learn(plan, names, where):
    """The plan kind of a full read that found ``names`` in registries ``where`` (see _plan)."""
    if where.count(where[0]) == len(where) and where[0] != 3:
        return where[0]
    k = where.count(1)
    if 2 <= k <= len(names) - 2 and where == [1] * k + [3] * (len(names) - k):
        if k not in plan[2]:
            plan[2][k] = (operator.itemgetter(*names[:k]), operator.itemgetter(*names[k:]), names[k:])
        return k + 3
    return 0
