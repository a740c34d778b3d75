"""Gradient hooks on tensors, PyTorch's API: ``x.register_hook(fn)``, ``x.retain_grad()`` and
``leaf.register_post_accumulate_grad_hook(fn)``.

The engine runs hooks and knows nothing of how they were registered: a non-leaf's hooks are pre-hooks of its
``grad_fn`` (``Node.pre_hooks``, keyed by output number); a leaf's live in its ``_hooks`` list, which its
``AccumulateGrad`` runs before accumulating; post-accumulate hooks sit in ``autograd._post_accumulate_hooks``.
This module is the registering side.  ops/__init__.py binds these functions as Tensor methods.
"""
from __future__ import annotations

import weakref

from .autograd import _post_accumulate_hooks

__all__ = ["retain_grad", "register_hook", "register_post_accumulate_grad_hook"]


class _RemovableHandle:
    def __init__(self, hooks: list, fn):
        self._hooks, self._fn = hooks, fn

    def remove(self):
        try:
            self._hooks.remove(self._fn)
        except ValueError:
            pass


def _register_prehook(node, output_nr, fn):
    """``fn(grad)`` runs on the gradient of ``node``'s output ``output_nr`` before the node's backward."""
    if node.pre_hooks is None:
        node.pre_hooks = {}
    hooks = node.pre_hooks.setdefault(output_nr, [])
    if hooks and getattr(hooks[-1], "retains_grad", False):
        hooks.insert(len(hooks) - 1, fn)    # retain_grad sees the gradient after every hook (PyTorch)
    else:
        hooks.append(fn)
    return _RemovableHandle(hooks, fn)


def retain_grad(self):
    """Keep ``.grad`` for this non-leaf tensor after backward."""
    if self.is_leaf:
        return self
    hooks = (self.grad_fn.pre_hooks or {}).get(self.output_nr, ())
    if any(getattr(h, "retains_grad", False) for h in hooks):
        return self
    ref = weakref.ref(self)

    def _retain(g):
        t = ref()
        if t is not None:
            t.grad = g.detach() if t.grad is None else t.grad.detach() + g.detach()
    _retain.retains_grad = True     # _register_prehook keeps it after the user's hooks
    _register_prehook(self.grad_fn, self.output_nr, _retain)
    return self


def register_hook(self, hook):
    """``hook(grad) -> Tensor or None`` runs when this tensor's gradient is computed; a returned
    tensor replaces the gradient.  Returns a handle whose ``remove()`` unregisters it."""
    if not self.requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that does not require grad")
    if self.grad_fn is not None:
        return _register_prehook(self.grad_fn, self.output_nr, hook)
    if self._hooks is None:
        self._hooks = []
    self._hooks.append(hook)
    return _RemovableHandle(self._hooks, hook)


def register_post_accumulate_grad_hook(self, hook):
    """``hook(tensor)`` runs after each backward has accumulated into this leaf's ``.grad`` (PyTorch's API; the
    data-parallel all-reduce launches from it).  Returns a handle whose ``remove()`` unregisters it."""
    if not self.is_leaf:
        raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
    if not self.requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that does not require grad")
    key = id(self)
    entry = _post_accumulate_hooks.get(key)
    if entry is None or entry[0]() is not self:
        # the entry leaves the registry with its tensor (a weakref callback), so a reused id() starts afresh
        entry = _post_accumulate_hooks[key] = (
            weakref.ref(self, lambda _, key=key: _post_accumulate_hooks.pop(key, None)), [])
    entry[1].append(hook)
    return _RemovableHandle(entry[1], hook)
