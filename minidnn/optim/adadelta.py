"""``Adadelta``: PyTorch's update, order and defaults (rho, eps, maximize, L2 weight decay).  Per-tensor only."""
from __future__ import annotations

from ..backend import devices as _dev
from .optimizer import Optimizer
from .rmsprop import _check_common, _new_state

__all__ = ["Adadelta"]


def _adadelta_update_(p, g, square_avg, acc_delta, *, lr, rho, eps, weight_decay, maximize):
    """PyTorch's single-tensor Adadelta on arrays, in place."""
    xp = _dev.array_module(p)
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    square_avg *= rho
    square_avg += (1 - rho) * (g * g)
    std = xp.sqrt(square_avg + eps)
    delta = xp.sqrt(acc_delta + eps) / std * g
    acc_delta *= rho
    acc_delta += (1 - rho) * (delta * delta)
    p -= lr * delta


class Adadelta(Optimizer):
    """v = rho v + (1 - rho) g^2; d = sqrt(u + eps) / sqrt(v + eps) g; u = rho u + (1 - rho) d^2; p -= lr d."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *, capturable=False,
                 maximize=False, differentiable=False):
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, foreach=foreach, capturable=capturable,
                        maximize=maximize, differentiable=differentiable)
        super().__init__(params, defaults)

    def _validate(self, group):
        _check_common(group, rho=(0.0, 1.0))

    def _single_update(self, group):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state.update(_new_state(p, ["square_avg", "acc_delta"]))
            state["step"] += 1
            _adadelta_update_(p.data, p.grad.data, state["square_avg"], state["acc_delta"], lr=group["lr"],
                              rho=group["rho"], eps=group["eps"], weight_decay=group["weight_decay"],
                              maximize=group["maximize"])
