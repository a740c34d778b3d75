"""Which flat buffer holds a parameter: the registry shared by the optimizers (who build flat buffers) and the
layers above them that read gradients (gradient clipping, data-parallel all-reduce).

A fused optimizer packs its parameters into one flat buffer per (device, dtype) and registers each parameter
here as ``(its flat set, its index)``.  Everything below nn and optim may ask ``owner_of(p)``; the entry goes
away with the parameter.  Keyed by ``id``, not a WeakKeyDictionary: Tensor's ``==`` is elementwise, so weak
references to Tensors must never be compared.
"""
from __future__ import annotations

import weakref

__all__ = ["owner_of", "register_owner"]

_owners: dict = {}      # id(parameter) -> (weakref to it, weakref to its flat set, index)


def owner_of(p):
    """(flat set, index) of the flat buffer that holds ``p`` now, or None."""
    entry = _owners.get(id(p))
    if entry is None or entry[0]() is not p:
        return None
    fs = entry[1]()
    return None if fs is None else (fs, entry[2])


def register_owner(p, flat_set, index):
    """Record that ``flat_set`` holds ``p`` at ``index`` (replacing an earlier owner)."""
    key = id(p)
    _owners[key] = (weakref.ref(p, lambda _, key=key: _owners.pop(key, None)), weakref.ref(flat_set), index)
