"""Learning-rate schedulers: PyTorch's classes, formulas (its recursive forms included) and defaults.

Each scheduler writes ``group["lr"]`` of its optimizer's groups on ``step()``; ``get_last_lr()`` returns what it
last wrote; ``state_dict()`` holds everything but the optimizer.
"""
from __future__ import annotations

import math
import types
from bisect import bisect_right
from collections import Counter

from .optimizer import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
           "ExponentialLR", "PolynomialLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "SequentialLR",
           "ChainedScheduler", "OneCycleLR", "ReduceLROnPlateau"]


def _per_group(name, optimizer, value):
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"expected {len(optimizer.param_groups)} values for {name}, got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


def _push_to_device(optimizer):
    """A fused optimizer reads its hyperparameters from device memory: write the new learning rates there now, so
    a step replayed from a CUDA graph (where optimizer.step's Python does not run) uses them too."""
    push = getattr(optimizer, "refresh_device_hyperparameters", None)
    if push is not None:
        push()


def _check_optimizer(scheduler, optimizer):
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{type(scheduler).__name__}: {type(optimizer).__name__} is not an Optimizer")


class LRScheduler:
    """Base: ``get_lr()`` computes the next lrs from ``last_epoch`` (already advanced) and the groups' lrs."""

    def __init__(self, optimizer, last_epoch=-1):
        _check_optimizer(self, optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when resuming an "
                                   "optimizer")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._is_initial = False
        self._initial_step()

    def _initial_step(self):
        """The step the constructor takes (``_is_initial`` lets get_lr keep the lrs when resuming)."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self):
        raise NotImplementedError

    def get_last_lr(self):
        return self._last_lr

    def step(self, epoch=None):
        """Advance one step; ``step(epoch)`` (deprecated in PyTorch) jumps to ``epoch`` through the closed form
        where the scheduler has one."""
        self._step_count += 1
        self._update_lr(epoch)

    def _update_lr(self, epoch=None):
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            values = self._get_closed_form_lr() if hasattr(self, "_get_closed_form_lr") else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        _push_to_device(self.optimizer)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)

    def _group_lrs(self):
        return [group["lr"] for group in self.optimizer.param_groups]


class StepLR(LRScheduler):
    """lr *= gamma every ``step_size`` steps."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._group_lrs()
        return [lr * self.gamma for lr in self._group_lrs()]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr *= gamma at each milestone (a repeated milestone multiplies again)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return self._group_lrs()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._group_lrs()]

    def _get_closed_form_lr(self):
        milestones = sorted(self.milestones.elements())
        return [base * self.gamma ** bisect_right(milestones, self.last_epoch) for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """lr *= gamma every step."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:            # resuming: the constructor's step keeps the lrs
            return self._group_lrs()
        return [lr * self.gamma for lr in self._group_lrs()]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base - eta_min)(1 + cos(pi t / T_max)) / 2, in PyTorch's recursive form."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t, T, lo = self.last_epoch, self.T_max, self.eta_min
        lrs = self._group_lrs()
        if self._is_initial:
            return lrs
        if self._step_count == 1 and t > 0:
            return [lo + (base - lo) * (1 + math.cos(t * math.pi / T)) / 2 for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [lr + (base - lo) * (1 - math.cos(math.pi / T)) / 2 for base, lr in zip(self.base_lrs, lrs)]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T)) * (lr - lo) + lo
                for lr in lrs]

    def _get_closed_form_lr(self):
        lo = self.eta_min
        return [lo + (base - lo) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """lr factor going linearly from ``start_factor`` to ``end_factor`` over ``total_iters`` steps."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError(f"Starting multiplicative factor expected to be greater than 0 and less or equal to 1, "
                             f"got {start_factor}")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError(f"Ending multiplicative factor expected to be between 0 and 1, got {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        lrs = self._group_lrs()
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in lrs]
        if self._is_initial or self.last_epoch > self.total_iters:
            return lrs
        a, b, n = self.start_factor, self.end_factor, self.total_iters
        return [lr * (1.0 + (b - a) / (n * a + (self.last_epoch - 1) * (b - a))) for lr in lrs]

    def _get_closed_form_lr(self):
        a, b, n = self.start_factor, self.end_factor, self.total_iters
        return [base * (a + (b - a) * min(n, self.last_epoch) / n) for base in self.base_lrs]


class _LambdaBase(LRScheduler):
    """One callable per group (or one for all); state_dict keeps callable objects' __dict__, never functions."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        _check_optimizer(self, optimizer)
        self.optimizer = optimizer
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != len(optimizer.param_groups):
                raise ValueError(f"Expected {len(optimizer.param_groups)} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * len(optimizer.param_groups)
        for fn in self.lr_lambdas:
            if not callable(fn):
                raise TypeError(f"lr_lambda should be a function, but got {type(fn).__name__}")
        super().__init__(optimizer, last_epoch)

    def state_dict(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else fn.__dict__.copy()
                               for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        lr_lambdas = state.pop("lr_lambdas")
        self.__dict__.update(state)
        for fn, saved in zip(self.lr_lambdas, lr_lambdas):
            if saved is not None:
                fn.__dict__.update(saved)


class LambdaLR(_LambdaBase):
    """lr = initial_lr * lr_lambda(epoch)."""

    def get_lr(self):
        return [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs)]


class MultiplicativeLR(_LambdaBase):
    """lr *= lr_lambda(epoch) on every step after the first."""

    def get_lr(self):
        if self._is_initial:
            return self._group_lrs()
        return [lr * fn(self.last_epoch) for fn, lr in zip(self.lr_lambdas, self._group_lrs())]


class ConstantLR(LRScheduler):
    """lr * factor until ``total_iters`` steps have passed, then lr."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if factor > 1.0 or factor < 0:
            raise ValueError(f"Constant multiplicative factor expected to be between 0 and 1, got {factor}")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        lrs = self._group_lrs()
        if self.last_epoch == 0:
            return [lr * self.factor for lr in lrs]
        if self.last_epoch != self.total_iters:
            return lrs
        return [lr * (1.0 / self.factor) for lr in lrs]

    def _get_closed_form_lr(self):
        f = self.factor
        return [base * (f + (self.last_epoch >= self.total_iters) * (1 - f)) for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """lr = base * (1 - t / total_iters) ** power, in PyTorch's recursive form; constant after total_iters."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters, self.power = total_iters, power
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        lrs = self._group_lrs()
        if self._is_initial or self.last_epoch > self.total_iters:
            return lrs
        t, n = self.last_epoch, self.total_iters
        decay = ((1.0 - t / n) / (1.0 - (t - 1) / n)) ** self.power
        return [lr * decay for lr in lrs]

    def _get_closed_form_lr(self):
        return [base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
                for base in self.base_lrs]


class SequentialLR(LRScheduler):
    """Runs ``schedulers[i]`` between ``milestones[i-1]`` and ``milestones[i]``; at a milestone the next scheduler
    restarts from its epoch 0 (closed form).  The schedulers' own construction steps are undone, as PyTorch does."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler, but got no scheduler.")
        for i, sched in enumerate(schedulers):
            if not hasattr(sched, "optimizer"):
                raise TypeError(f"{type(self).__name__} at index {i} should have `optimizer` as its attribute.")
            if isinstance(sched, ReduceLROnPlateau):
                raise ValueError(f"{type(self).__name__} does not support `ReduceLROnPlateau` scheduler as it "
                                 "requires additional kwargs to be specified when calling `step`, but got one at "
                                 f"index {i} in the given schedulers sequence.")
            if optimizer is not sched.optimizer:
                raise ValueError(f"{type(self).__name__} expects all schedulers to belong to the same optimizer, "
                                 f"but got scheduler {type(sched).__name__} at index {i} with another optimizer")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError("Sequential Schedulers expects number of schedulers provided to be one more than the "
                             f"number of milestone points, but got number of schedulers {len(schedulers)} and the "
                             f"number of milestones to be equal to {len(milestones)}")
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self.recursive_undo()
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = self._schedulers[idx].get_last_lr()

    def recursive_undo(self, sched=None):
        """Take back the construction step of every (nested) scheduler."""
        sched = self if sched is None else sched
        if hasattr(sched, "_schedulers"):
            for s in sched._schedulers:
                self.recursive_undo(s)
        elif hasattr(sched, "last_epoch"):
            sched.last_epoch -= 1

    def step(self):
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        sched = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            sched._update_lr(0)
        else:
            sched.step()
        self._last_lr = sched.get_last_lr()

    def state_dict(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        saved = state.pop("_schedulers")
        self.__dict__.update(state)
        for sched, s in zip(self._schedulers, saved):
            sched.load_state_dict(s)


class ChainedScheduler(LRScheduler):
    """Steps every scheduler in turn on each step (their factors compose)."""

    def __init__(self, schedulers, optimizer=None):
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler to be chained, but got no "
                             "scheduler.")
        optimizer = optimizer or schedulers[0].optimizer
        for i, sched in enumerate(schedulers):
            if not hasattr(sched, "optimizer"):
                raise TypeError(f"{type(self).__name__} at index {i} should have `optimizer` as its attribute.")
            if isinstance(sched, ReduceLROnPlateau):
                raise ValueError(f"{type(self).__name__} does not support `ReduceLROnPlateau` scheduler as it "
                                 "requires additional kwargs to be specified when calling `step`, but got one at "
                                 f"index {i} in the given schedulers sequence.")
            if optimizer is not sched.optimizer:
                raise ValueError(f"{type(self).__name__} expects all schedulers to belong to the same optimizer, "
                                 f"but got scheduler {type(sched).__name__} at index {i} with another optimizer")
        self._schedulers = list(schedulers)
        self.optimizer = optimizer
        self._last_lr = [g["lr"] for g in self._schedulers[-1].optimizer.param_groups]

    def step(self):
        for sched in self._schedulers:
            sched.step()
        self._last_lr = [g["lr"] for g in self._schedulers[-1].optimizer.param_groups]

    state_dict = SequentialLR.state_dict
    load_state_dict = SequentialLR.load_state_dict


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from the base lr to eta_min over T_i steps, restarting with T_i *= T_mult."""

    def __init__(self, optimizer, T_0, T_mult=1, eta_min=0.0, last_epoch=-1):
        if not isinstance(T_0, int) or T_0 <= 0:
            raise ValueError(f"Expected positive integer T_0, but got {T_0}")
        if not isinstance(T_mult, int) or T_mult < 1:
            raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"Expected float or int eta_min, but got {eta_min} of type {type(eta_min)}")
        self.T_0, self.T_i, self.T_mult, self.eta_min, self.T_cur = T_0, T_0, T_mult, eta_min, last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        lo = self.eta_min
        return [lo + (base - lo) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2 for base in self.base_lrs]

    def step(self, epoch=None):
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            if epoch < 0:
                raise ValueError(f"Expected non-negative epoch, but got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    n = int(math.log((epoch / self.T_0 * (self.T_mult - 1) + 1), self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult ** n
            else:
                self.T_i = self.T_0
                self.T_cur = epoch
        self.last_epoch = math.floor(epoch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        _push_to_device(self.optimizer)
        self._last_lr = self._group_lrs()


class OneCycleLR(LRScheduler):
    """The 1cycle policy: warm up from max_lr/div_factor to max_lr over pct_start of the steps, anneal to
    initial_lr/final_div_factor; momentum (or beta1) cycles the other way."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95, div_factor=25.0,
                 final_div_factor=1e4, three_phase=False, last_epoch=-1):
        if total_steps is not None:
            if total_steps <= 0 or not isinstance(total_steps, int):
                raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            if epochs <= 0 or steps_per_epoch <= 0:
                raise ValueError(f"Expected positive epochs and steps_per_epoch, got {epochs}, {steps_per_epoch}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        n = self.total_steps
        if three_phase:
            self._schedule_phases = [
                dict(end_step=float(pct_start * n) - 1, start_lr="initial_lr", end_lr="max_lr",
                     start_momentum="max_momentum", end_momentum="base_momentum"),
                dict(end_step=float(2 * pct_start * n) - 2, start_lr="max_lr", end_lr="initial_lr",
                     start_momentum="base_momentum", end_momentum="max_momentum"),
                dict(end_step=n - 1, start_lr="initial_lr", end_lr="min_lr",
                     start_momentum="max_momentum", end_momentum="max_momentum")]
        else:
            self._schedule_phases = [
                dict(end_step=float(pct_start * n) - 1, start_lr="initial_lr", end_lr="max_lr",
                     start_momentum="max_momentum", end_momentum="base_momentum"),
                dict(end_step=n - 1, start_lr="max_lr", end_lr="min_lr",
                     start_momentum="base_momentum", end_momentum="max_momentum")]
        self.anneal_strategy = anneal_strategy
        if last_epoch == -1:
            for group, m in zip(optimizer.param_groups, _per_group("max_lr", optimizer, max_lr)):
                group["initial_lr"] = m / div_factor
                group["max_lr"] = m
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            if last_epoch == -1:
                for group, hi, lo in zip(optimizer.param_groups, _per_group("max_momentum", optimizer, max_momentum),
                                         _per_group("base_momentum", optimizer, base_momentum)):
                    if self.use_beta1:
                        group["betas"] = (hi, *group["betas"][1:])
                    else:
                        group["momentum"] = hi
                    group["max_momentum"], group["base_momentum"] = hi, lo
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"Tried to step {step} times. The specified number of total steps is {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == len(self._schedule_phases) - 1:
                    pct = (step - start) / (end - start)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        momentum = self._anneal(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
                    break
                start = phase["end_step"]
            lrs.append(lr)
            if self.cycle_momentum:
                if self.use_beta1:
                    group["betas"] = (momentum, *group["betas"][1:])
                else:
                    group["momentum"] = momentum
        return lrs


class ReduceLROnPlateau(LRScheduler):
    """lr = max(lr * factor, min_lr) after ``patience`` steps without improvement of the metric passed to
    ``step(metric)`` (then ``cooldown`` steps of rest)."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                 cooldown=0, min_lr=0, eps=1e-8):
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        _check_optimizer(self, optimizer)
        self.factor = factor
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(optimizer.param_groups):
                raise ValueError(f"expected {len(optimizer.param_groups)} min_lrs, got {len(min_lr)}")
            self.default_min_lr, self.min_lrs = None, list(min_lr)
        else:
            self.default_min_lr, self.min_lrs = min_lr, [min_lr] * len(optimizer.param_groups)
        self.patience, self.cooldown, self.eps = patience, cooldown, eps
        self.last_epoch = 0
        self._last_lr = self._group_lrs()
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _reset(self):
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def _init_is_better(self, mode, threshold, threshold_mode):
        if mode not in ("min", "max"):
            raise ValueError(f"mode {mode} is unknown!")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"threshold mode {threshold_mode} is unknown!")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode

    @property
    def in_cooldown(self):
        return self.cooldown_counter > 0

    def is_better(self, a, best):
        if self.mode == "min":
            return a < best * (1.0 - self.threshold) if self.threshold_mode == "rel" else a < best - self.threshold
        return a > best * (self.threshold + 1.0) if self.threshold_mode == "rel" else a > best + self.threshold

    _is_better = is_better

    def step(self, metrics, epoch=None):
        current = float(metrics)            # a 0-d Tensor works too
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = self._group_lrs()

    def _reduce_lr(self):
        if len(self.optimizer.param_groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(f"The number of param groups in the `optimizer` ({len(self.optimizer.param_groups)})"
                                   f" differs from when `ReduceLROnPlateau` was initialized ({len(self.min_lrs)}); "
                                   "set `min_lrs` to match")
            self.min_lrs = [self.default_min_lr] * len(self.optimizer.param_groups)
        for group, min_lr in zip(self.optimizer.param_groups, self.min_lrs):
            old = float(group["lr"])
            new = max(old * self.factor, min_lr)
            if old - new > self.eps:
                group["lr"] = new
        _push_to_device(self.optimizer)

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)
