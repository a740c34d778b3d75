"""Containers: Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict (PyTorch's semantics and reprs)."""
from __future__ import annotations

import operator
from collections import OrderedDict

from ..tensor import Tensor
from .module import Module, _addindent
from .parameter import Parameter

__all__ = ["Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"]


def _index(idx, length, kind):
    idx = operator.index(idx)
    if not -length <= idx < length:
        raise IndexError(f"index {idx} is out of range for a {kind} of length {length}")
    return idx % length


class _IndexedModules(Module):
    """Shared by Sequential and ModuleList: children keyed "0", "1", ... and renumbered after a deletion."""

    def _renumber(self):
        self._modules = OrderedDict((str(i), m) for i, m in enumerate(self._modules.values()))

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self.__class__(list(self._modules.values())[idx]) if isinstance(self, ModuleList) \
                else self.__class__(OrderedDict(list(self._modules.items())[idx]))
        return list(self._modules.values())[_index(idx, len(self), self._get_name())]

    def __setitem__(self, idx, module):
        key = list(self._modules.keys())[_index(idx, len(self), self._get_name())]
        self.add_module(key, module)

    def __delitem__(self, idx):
        keys = list(self._modules.keys())
        for key in (keys[idx] if isinstance(idx, slice) else [keys[_index(idx, len(self), self._get_name())]]):
            del self._modules[key]
        self._renumber()

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._modules = OrderedDict()
        for i, m in enumerate(mods):
            self.add_module(str(i), m)

    def __iadd__(self, modules):
        return self.extend(modules)


class Sequential(_IndexedModules):
    """``Sequential(m1, m2, ...)`` or ``Sequential(OrderedDict(name=module))``: forward chains the children."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], (OrderedDict, dict)):
            for name, module in args[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(args):
                self.add_module(str(i), module)

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x


class ModuleList(_IndexedModules):
    """A list of modules, registered (so their parameters are the list owner's parameters)."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward: iterate over it in your module's forward")

    def __repr__(self):
        # PyTorch compresses runs of identical children: "(0-2): 3 x Linear(...)".
        reprs = [repr(m) for m in self]
        if not reprs:
            return self._get_name() + "()"
        runs = []                     # [start, end, repr]
        for i, r in enumerate(reprs):
            if runs and runs[-1][2] == r:
                runs[-1][1] = i
            else:
                runs.append([i, i, r])
        lines = []
        for start, end, r in runs:
            text = f"({start}): {r}" if start == end else f"({start}-{end}): {end - start + 1} x {r}"
            lines.append(_addindent(text, 2))
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"


class _MemberDict(Module):
    """Dict access to one registry (``_modules`` or ``_parameters``), in insertion order."""

    _registry = ""

    def __init__(self, members=None):
        super().__init__()
        if members is not None:
            self.update(members)

    def _members(self):
        return self.__dict__[self._registry]

    def __getitem__(self, key):
        return self._members()[key]

    def __delitem__(self, key):
        del self._members()[key]

    def __len__(self):
        return len(self._members())

    def __iter__(self):
        return iter(self._members())

    def __contains__(self, key):
        return key in self._members()

    def keys(self):
        return self._members().keys()

    def items(self):
        return self._members().items()

    def values(self):
        return self._members().values()

    def pop(self, key):
        return self._members().pop(key)

    def clear(self):
        self._members().clear()

    def update(self, members):
        for key, value in (members.items() if hasattr(members, "items") else members):
            self[key] = value


class ModuleDict(_MemberDict):
    """An ordered dict of modules, registered under their keys."""

    _registry = "_modules"

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict has no forward: index it in your module's forward")


def _param_line(key, p):
    size = "x".join(str(s) for s in p.shape)
    where = f" ({p.device})" if p.device.type != "cpu" else ""
    kind = "Parameter" if isinstance(p, Parameter) else "Tensor"
    return f"  ({key}): {kind} containing: [{p.dtype} of size {size}{where}]"


def _as_parameter(value):
    # PyTorch wraps plain tensors assigned into a ParameterList/Dict as Parameters.
    return Parameter(value) if isinstance(value, Tensor) and not isinstance(value, Parameter) else value


class ParameterList(Module):
    """A list of Parameters, registered under "0", "1", ..."""

    def __init__(self, values=None):
        super().__init__()
        for v in values or ():
            self.append(v)

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters.values())

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ParameterList(list(self._parameters.values())[idx])
        return self._parameters[str(_index(idx, len(self), "ParameterList"))]

    def __setitem__(self, idx, value):
        self.register_parameter(str(_index(idx, len(self), "ParameterList")), _as_parameter(value))

    def append(self, value):
        self.register_parameter(str(len(self)), _as_parameter(value))
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self

    def extra_repr(self):
        return "\n".join(_param_line(k, p) for k, p in self._parameters.items())


class ParameterDict(_MemberDict):
    """An ordered dict of Parameters, registered under their keys."""

    _registry = "_parameters"

    def __setitem__(self, key, value):
        self.register_parameter(key, _as_parameter(value))

    def extra_repr(self):
        return "\n".join(_param_line(k, p) for k, p in self._parameters.items())
