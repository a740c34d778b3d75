"""``Adagrad``: PyTorch's update, order and defaults (lr_decay, initial_accumulator_value, maximize, L2 decay).

Per-tensor only; the state is created when the optimizer is built, as PyTorch does.
"""
from __future__ import annotations

from ..backend import devices as _dev
from .optimizer import Optimizer
from .rmsprop import _check_common, _new_state

__all__ = ["Adagrad"]


def _adagrad_update_(p, g, state_sum, step, *, lr, lr_decay, weight_decay, eps, maximize):
    """PyTorch's single-tensor Adagrad on arrays, in place; ``step`` already advanced."""
    xp = _dev.array_module(p)
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    clr = lr / (1 + (step - 1) * lr_decay)
    state_sum += g * g
    std = xp.sqrt(state_sum)
    std += eps
    p -= clr * (g / std)


class Adagrad(Optimizer):
    """s += g^2; p -= lr / (1 + (t - 1) lr_decay) * g / (sqrt(s) + eps)."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 foreach=None, *, maximize=False, differentiable=False, fused=None):
        if fused:
            raise RuntimeError("Adagrad: fused=True is not supported (the update is per tensor)")
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach, maximize=maximize,
                        differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p].update(_new_state(p, ["sum"], group["initial_accumulator_value"]))

    def _validate(self, group):
        _check_common(group)
        if not 0.0 <= group["lr_decay"]:
            raise ValueError(f"Invalid lr_decay value: {group['lr_decay']}")
        if not 0.0 <= group["initial_accumulator_value"]:
            raise ValueError(f"Invalid initial_accumulator_value value: {group['initial_accumulator_value']}")

    def _single_update(self, group):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:                  # state dropped by load_state_dict
                state.update(_new_state(p, ["sum"], group["initial_accumulator_value"]))
            state["step"] += 1
            _adagrad_update_(p.data, p.grad.data, state["sum"], float(state["step"]), lr=group["lr"],
                             lr_decay=group["lr_decay"], weight_decay=group["weight_decay"], eps=group["eps"],
                             maximize=group["maximize"])
