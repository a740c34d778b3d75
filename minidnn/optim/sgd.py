"""``SGD``: PyTorch's stochastic gradient descent (momentum, dampening, nesterov, weight decay, maximize)."""
from __future__ import annotations

from ._functional import _fused_sgd, _single_tensor_sgd
from .optimizer import Optimizer

__all__ = ["SGD"]


class SGD(Optimizer):
    """d = g (+ weight_decay p); buf = d on the first step, then momentum buf + (1 - dampening) d;
    d = d + momentum buf (nesterov) or buf; p -= lr d.  ``fused`` (default where parameters are floating):
    one update over flat buffers per (device, dtype), one CUDA launch on the GPU."""

    fused_amp_scaling = True        # the fused step takes GradScaler's scale/found_inf (see Optimizer.step)

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *, maximize=False,
                 fused=None, master_weights=False):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize, fused=fused, master_weights=master_weights)
        super().__init__(params, defaults)

    def _validate(self, group):
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if wd < 0.0:
            raise ValueError(f"Invalid weight_decay value: {wd}")
        if group["nesterov"] and (momentum <= 0 or group["dampening"] != 0):
            raise ValueError(f"Nesterov momentum requires a momentum and zero dampening (got momentum={momentum}, "
                             f"dampening={group['dampening']})")

    @staticmethod
    def _hyper(group):
        return {k: group[k] for k in ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize")}

    def _fused_hyper(self, group):
        return (group["lr"], group["momentum"], group["dampening"], group["weight_decay"])

    def _flat_state_names(self, group):
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _flat_state_views(self, group, fs, j):
        if group["momentum"] == 0:
            return None
        return {"momentum_buffer": fs.view(fs.state_buffer("momentum_buffer"), j)}

    def _flat_step_of(self, state):
        return 1 if state.get("momentum_buffer") is not None else 0

    def _fused_update(self, group, flat_sets, **amp):
        return _fused_sgd(flat_sets, **self._hyper(group), **amp)

    def _single_update(self, group):
        params, grads, buffers = [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            params.append(p.data)
            grads.append(p.grad.data)
            buffers.append(self.state.get(p, {}).get("momentum_buffer"))
        _single_tensor_sgd(params, grads, buffers, **self._hyper(group))
        if group["momentum"] != 0:
            with_grad = [p for p in group["params"] if p.grad is not None]
            for p, buf in zip(with_grad, buffers):
                self.state.setdefault(p, {})["momentum_buffer"] = buf
