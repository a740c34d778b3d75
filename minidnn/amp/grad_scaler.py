"""``GradScaler``: dynamic loss scaling for float16 training, PyTorch's ``torch.amp.GradScaler``.

    scaler = minidnn.amp.GradScaler()
    with minidnn.autocast("cuda"):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()          # gradients of loss * scale: small float16 gradients stay representable
    scaler.step(optimizer)                 # unscale, and skip the step if any gradient is inf/NaN
    scaler.update()                        # back off after an overflow, grow after growth_interval clean steps

Where the optimizer's step can apply the scale itself (minidnn's fused SGD/Adam/AdamW,
``optimizer.step_supports_amp_scaling``), the inf/NaN check, the unscale and the decision to skip all happen on the
device inside the optimizer's launch, and ``update`` is one more launch: no host synchronisation, so the scaled step
can be captured in a CUDA graph.  Other optimizers get PyTorch's generic path (unscale the gradients, read the
overflow flag on the host, step or not).
"""
from __future__ import annotations

import enum
import numbers

import numpy as np

from ..backend import amp as _amp
from ..backend import devices as _dev
from ..tensor import Tensor

__all__ = ["GradScaler"]


class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


class GradScaler:
    """Dynamic loss scaler.  ``device``: where the scale lives ("cuda" or "cpu"); the other arguments and their
    defaults are PyTorch's.  ``enabled=False`` makes every method a pass-through."""

    def __init__(self, device="cuda", init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        dev = _dev.device(device)
        if enabled and dev.type == "cuda" and not _dev.cuda_is_available():
            raise RuntimeError(f"GradScaler: device {device!r} was asked for but no CUDA GPU with CuPy is available; "
                               "use GradScaler('cpu') or enabled=False")
        _check_factors(init_scale, growth_factor, backoff_factor, growth_interval)
        self._device = dev
        self._enabled = bool(enabled)
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._scale = None              # (1,) float32 on the device, created lazily (PyTorch does the same)
        self._growth_tracker = None     # (1,) int32
        self._found_inf = None          # (slots,) float32: one overflow flag per optimizer stepped this iteration
        self._per_optimizer: dict = {}  # id(optimizer) -> {"stage": _Stage, "slot": int}

    # -- lazily created device state ----------------------------------------------------------------------------
    def _lazy_init(self):
        if self._scale is None:
            xp = self._device.xp
            with _dev.device_guard(self._device):
                self._scale = xp.full((1,), self._init_scale, dtype=np.float32)
                self._growth_tracker = xp.zeros((1,), dtype=np.int32)
                self._found_inf = xp.zeros((4,), dtype=np.float32)

    def _slot(self, optimizer):
        state = self._per_optimizer.get(id(optimizer))
        if state is None:
            slot = len(self._per_optimizer)
            if slot >= self._found_inf.size:          # more optimizers than flags: grow (zeros, nothing pending)
                xp = self._device.xp
                with _dev.device_guard(self._device):
                    grown = xp.zeros((2 * self._found_inf.size,), dtype=np.float32)
                    grown[:self._found_inf.size] = self._found_inf
                self._found_inf = grown
            state = self._per_optimizer[id(optimizer)] = {"stage": _Stage.READY, "slot": slot}
        return state

    def _check_device(self, arr, what):
        dev = _dev.device_of(arr)
        if dev != self._device:
            raise RuntimeError(f"GradScaler: {what} is on {dev} but this scaler's scale lives on {self._device}; "
                               f"build it with GradScaler({str(dev)!r})")

    # -- the public API ------------------------------------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def scale(self, outputs):
        """``outputs`` (a Tensor, or nested lists/tuples of Tensors) multiplied by the current scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            self._lazy_init()
            self._check_device(outputs.data, "the tensor to scale")
            factor = self._scale if outputs.dtype == np.float32 else self._scale.astype(outputs.dtype)
            return outputs * Tensor._from_array(factor.reshape(()))
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"GradScaler.scale: outputs must be a Tensor or an iterable of Tensors, got "
                        f"{type(outputs).__name__}")

    def unscale_(self, optimizer):
        """Divide ``optimizer``'s gradients by the scale in place (e.g. before clipping them) and record whether
        any is inf/NaN.  At most once per optimizer between two ``update`` calls."""
        if not self._enabled:
            return
        self._require_scale("unscale_")
        state = self._slot(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        grads = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.dtype == np.float16 and p.dtype == np.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                self._check_device(p.grad.data, "a gradient")
                grads.append(p.grad.data)
        slot = state["slot"]
        _amp.unscale_and_check_(grads, self._found_inf[slot:slot + 1], self._scale)
        state["stage"] = _Stage.UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step(*args, **kwargs)`` unless a gradient overflowed (then the step is skipped).  Returns
        what ``optimizer.step`` returned, or None for a skipped step on the host path."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._require_scale("step")
        state = self._slot(optimizer)
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        slot = state["slot"]
        found_inf = self._found_inf[slot:slot + 1]
        if getattr(optimizer, "step_supports_amp_scaling", False):
            optimizer.grad_scale = self._scale if state["stage"] is _Stage.READY else None
            optimizer.found_inf = found_inf
            try:
                result = optimizer.step(*args, **kwargs)
            finally:
                del optimizer.grad_scale, optimizer.found_inf
        else:
            if state["stage"] is _Stage.READY:
                self.unscale_(optimizer)
            result = None if float(found_inf[0]) != 0.0 else optimizer.step(*args, **kwargs)
        state["stage"] = _Stage.STEPPED
        return result

    def update(self, new_scale=None):
        """Set the scale for the next iteration: ``new_scale`` if given, else PyTorch's dynamic rule over every
        optimizer stepped since the last update.  Runs on the device (one launch on a GPU)."""
        if not self._enabled:
            return
        self._require_scale("update")
        if new_scale is not None:
            value = new_scale.data if isinstance(new_scale, Tensor) else new_scale
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                self._scale.fill(float(value))
            elif getattr(value, "size", 0) == 1 and getattr(value, "dtype", None) == np.float32:
                self._scale[...] = _dev.to_device(value, self._device).reshape(1)
            else:
                raise TypeError("GradScaler.update: new_scale should be a Python float or a 1-element float32 "
                                f"tensor, got {new_scale!r}")
            self._found_inf.fill(0)
        else:
            if not self._per_optimizer:
                raise RuntimeError("GradScaler.update: no inf checks were recorded prior to update(); call step() "
                                   "(or unscale_()) first")
            _amp.update_scale_(self._scale, self._growth_tracker, self._found_inf, self._growth_factor,
                               self._backoff_factor, self._growth_interval)
        self._per_optimizer.clear()

    def _require_scale(self, method):
        if self._scale is None:
            raise RuntimeError(f"GradScaler.{method}: no scale has been created yet; call scale(loss) first")

    # -- hyperparameters and state ------------------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale as a Python float (reads the device: a host synchronisation)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale[0])

    def get_growth_factor(self):
        return self._growth_factor

    def set_growth_factor(self, new_factor):
        _check_factors(self._init_scale, new_factor, self._backoff_factor, self._growth_interval)
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self):
        return self._backoff_factor

    def set_backoff_factor(self, new_factor):
        _check_factors(self._init_scale, self._growth_factor, new_factor, self._growth_interval)
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self):
        return self._growth_interval

    def set_growth_interval(self, new_interval):
        _check_factors(self._init_scale, self._growth_factor, self._backoff_factor, new_interval)
        self._growth_interval = int(new_interval)

    def _get_growth_tracker(self) -> int:
        return 0 if self._growth_tracker is None else int(self._growth_tracker[0])

    def state_dict(self) -> dict:
        """PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker ({} if disabled)."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict):
        """Restore ``state_dict()``'s values; everything is validated before anything changes."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"GradScaler.load_state_dict: expected a dict, got {type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.")
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(state_dict)
        if missing:
            raise KeyError(f"GradScaler.load_state_dict: missing keys {sorted(missing)}")
        scale = float(state_dict["scale"])
        tracker = state_dict["_growth_tracker"]
        _check_factors(scale, state_dict["growth_factor"], state_dict["backoff_factor"],
                       state_dict["growth_interval"])
        if isinstance(tracker, bool) or not isinstance(tracker, numbers.Integral) or tracker < 0:
            raise ValueError(f"GradScaler.load_state_dict: _growth_tracker must be an int >= 0, got {tracker!r}")
        self._init_scale = scale
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._lazy_init()
        self._scale.fill(scale)
        self._growth_tracker.fill(int(tracker))


def _check_factors(init_scale, growth_factor, backoff_factor, growth_interval):
    for name, value in (("init_scale", init_scale), ("growth_factor", growth_factor),
                        ("backoff_factor", backoff_factor)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
            raise ValueError(f"GradScaler: {name} must be a finite number, got {value!r}")
    if init_scale <= 0:
        raise ValueError(f"GradScaler: init_scale must be > 0, got {init_scale!r}")
    if growth_factor <= 1.0:
        raise ValueError(f"GradScaler: the growth factor must be > 1.0, got {growth_factor!r}")
    if not 0.0 < backoff_factor < 1.0:
        raise ValueError(f"GradScaler: the backoff factor must be in (0, 1), got {backoff_factor!r}")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, numbers.Integral) or growth_interval <= 0:
        raise ValueError(f"GradScaler: growth_interval must be an int > 0, got {growth_interval!r}")
