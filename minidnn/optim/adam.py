"""``Adam`` and ``AdamW``: PyTorch's update, order and defaults (amsgrad, maximize, L2 or decoupled decay)."""
from __future__ import annotations

import numpy as np

from ..backend import devices as _dev
from ._functional import _fused_adam, _single_tensor_adam
from .optimizer import Optimizer

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    """m = lerp(m, g, 1 - beta1); v = beta2 v + (1 - beta2) g^2; p -= lr / (1 - beta1^t) * m /
    (sqrt(v) / sqrt(1 - beta2^t) + eps), with g += weight_decay p first (L2; AdamW decays p instead).
    ``fused`` (default where parameters are floating): one update over flat buffers per (device, dtype), one
    CUDA launch on the GPU reading lr, betas and the step count from device memory."""

    _decoupled = False
    fused_amp_scaling = True        # the fused step takes GradScaler's scale/found_inf (see Optimizer.step)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 maximize=False, fused=None, master_weights=False):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, fused=fused, master_weights=master_weights)
        super().__init__(params, defaults)

    def _validate(self, group):
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= beta1 < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {beta1} (must be in [0, 1))")
        if not 0.0 <= beta2 < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {beta2} (must be in [0, 1))")
        if not 0.0 <= wd:
            raise ValueError(f"Invalid weight_decay value: {wd}")

    def _hyper(self, group):
        beta1, beta2 = group["betas"]
        return dict(amsgrad=group["amsgrad"], lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                    weight_decay=group["weight_decay"], maximize=group["maximize"],
                    decoupled_weight_decay=self._decoupled)

    def _fused_hyper(self, group):
        beta1, beta2 = group["betas"]
        return (group["lr"], beta1, beta2, group["eps"], group["weight_decay"])

    def _flat_state_names(self, group):
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    def _flat_state_views(self, group, fs, j):
        state = {"step": fs.steps[j:j + 1].reshape(()),
                 "exp_avg": fs.view(fs.state_buffer("exp_avg"), j),
                 "exp_avg_sq": fs.view(fs.state_buffer("exp_avg_sq"), j)}
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = fs.view(fs.state_buffer("max_exp_avg_sq"), j)
        return state

    def _fused_update(self, group, flat_sets, **amp):
        return _fused_adam(flat_sets, **self._hyper(group), **amp)

    def _single_update(self, group):
        lists = params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = [], [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state.get(p)
            if state is None:
                xp = _dev.array_module(p.data)
                with _dev.device_guard(p.device):
                    state = self.state[p] = {"step": xp.zeros((), dtype=np.float32),
                                             "exp_avg": xp.zeros_like(p.data), "exp_avg_sq": xp.zeros_like(p.data)}
            if group["amsgrad"] and state.get("max_exp_avg_sq") is None:
                state["max_exp_avg_sq"] = _dev.array_module(p.data).zeros_like(p.data)
            for lst, value in zip(lists, (p.data, p.grad.data, state["exp_avg"], state["exp_avg_sq"],
                                          state.get("max_exp_avg_sq"), state["step"])):
                lst.append(value)
        _single_tensor_adam(*lists, **self._hyper(group))


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr * weight_decay before the Adam update (default 1e-2)."""

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, fused=None, master_weights=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, fused=fused, master_weights=master_weights)
