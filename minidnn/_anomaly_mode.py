"""Anomaly detection, the switch (PyTorch's torch/autograd/anomaly_mode.py): ``detect_anomaly``,
``set_detect_anomaly``, ``is_anomaly_enabled``.

The engine keeps only the per-thread flag (``autograd._state.anomaly``) and what it does while the flag is on:
every new node records the stack that created it (``node.trace``), and backward checks each gradient it computes
for NaN or inf, naming the op and that place (``autograd._check_anomaly``).  This module turns the flag on and off;
minidnn/__init__.py binds its names into ``minidnn.autograd``, where PyTorch users look for them.
"""
from __future__ import annotations

import functools

from .autograd import _state

__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled"]


def is_anomaly_enabled() -> bool:
    return _state.anomaly


class detect_anomaly:
    """Inside this block every node remembers where it was created, and a backward that produces
    NaN or inf raises an error naming the op and that place."""

    def __init__(self, check_nan: bool = True):
        self.check_nan = check_nan

    def __enter__(self):
        self._prev = _state.anomaly
        _state.anomaly = self.check_nan

    def __exit__(self, *exc):
        _state.anomaly = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with detect_anomaly(self.check_nan):
                return fn(*args, **kwargs)
        return wrapper


def set_detect_anomaly(mode: bool) -> None:
    _state.anomaly = bool(mode)
