"""``RMSprop``: PyTorch's update, order and defaults (centered, momentum, maximize, L2 weight decay).

Per-tensor only: each parameter's update runs ``_rmsprop_update_`` on its arrays (xp-generic, CPU and GPU).
"""
from __future__ import annotations

import numpy as np

from ..backend import devices as _dev
from .optimizer import Optimizer

__all__ = ["RMSprop"]


def _new_state(p, names, fill=0.0):
    """{"step": 0-d float32, name: array like p.data filled with ``fill``} on p's device."""
    xp = _dev.array_module(p.data)
    with _dev.device_guard(p.device):
        state = {"step": xp.zeros((), dtype=np.float32)}
        for name in names:
            state[name] = xp.full(p.data.shape, fill, dtype=p.data.dtype)
    return state


def _check_common(group, **ranges):
    """ValueError naming the offending hyperparameter, PyTorch's wording."""
    if group.get("differentiable"):
        raise NotImplementedError("differentiable=True (an update recorded by autograd) is not supported; "
                                  "the update runs on raw arrays")
    if not 0.0 <= group["lr"]:
        raise ValueError(f"Invalid learning rate: {group['lr']}")
    if not 0.0 <= group["eps"]:
        raise ValueError(f"Invalid epsilon value: {group['eps']}")
    if not 0.0 <= group["weight_decay"]:
        raise ValueError(f"Invalid weight_decay value: {group['weight_decay']}")
    for name, (lo, hi) in ranges.items():
        if not lo <= group[name] <= hi:
            raise ValueError(f"Invalid {name} value: {group[name]}")


def _rmsprop_update_(p, g, square_avg, grad_avg, buf, *, lr, alpha, eps, weight_decay, momentum, maximize):
    """PyTorch's single-tensor RMSprop on arrays, in place (``grad_avg`` None: not centered)."""
    xp = _dev.array_module(p)
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    square_avg *= alpha
    square_avg += (1 - alpha) * (g * g)
    if grad_avg is not None:
        grad_avg += (1 - alpha) * (g - grad_avg)                  # lerp_(g, 1 - alpha)
        avg = xp.sqrt(square_avg - grad_avg * grad_avg)
    else:
        avg = xp.sqrt(square_avg)
    avg += eps
    if momentum > 0:
        buf *= momentum
        buf += g / avg
        p -= lr * buf
    else:
        p -= lr * (g / avg)


class RMSprop(Optimizer):
    """v = alpha v + (1 - alpha) g^2; (centered) m = lerp(m, g, 1 - alpha), v~ = v - m^2;
    p -= lr g / (sqrt(v~) + eps), through a momentum buffer when momentum > 0."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
                 capturable=False, foreach=None, maximize=False, differentiable=False):
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                        centered=centered, capturable=capturable, foreach=foreach, maximize=maximize,
                        differentiable=differentiable)
        super().__init__(params, defaults)

    def _validate(self, group):
        _check_common(group)
        if not 0.0 <= group["momentum"]:
            raise ValueError(f"Invalid momentum value: {group['momentum']}")
        if not 0.0 <= group["alpha"]:
            raise ValueError(f"Invalid alpha value: {group['alpha']}")

    def _single_update(self, group):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                names = ["square_avg"] + (["momentum_buffer"] if group["momentum"] > 0 else []) + (
                    ["grad_avg"] if group["centered"] else [])
                state.update(_new_state(p, names))
            state["step"] += 1
            _rmsprop_update_(p.data, p.grad.data, state["square_avg"], state.get("grad_avg"),
                             state.get("momentum_buffer"), lr=group["lr"], alpha=group["alpha"], eps=group["eps"],
                             weight_decay=group["weight_decay"], momentum=group["momentum"],
                             maximize=group["maximize"])
