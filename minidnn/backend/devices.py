"""Devices and array modules: the only place that decides between NumPy and CuPy.

A device is ``"cpu"`` (NumPy arrays) or ``"cuda"`` / ``"cuda:N"`` (CuPy arrays on GPU N).  CuPy is
imported lazily, the first time a GPU is asked for, so a CPU-only install never touches it.
Everything above the backend asks this module which array module holds an array
(``array_module(x)``) and never imports CuPy itself.
"""
from __future__ import annotations

import contextlib
import os
import sys

import numpy as np

from .errors import ArgumentError

__all__ = ["is_floating",
    "Device", "device", "array_module", "device_of", "xp_for", "to_device", "device_guard",
    "cuda_is_available", "cuda_device_count", "current_cuda_index", "default_device", "set_default_device",
    "CudaUnavailableError", "DeviceMismatchError", "is_cuda_array",
]


class CudaUnavailableError(RuntimeError):
    """A GPU was asked for but CuPy, the driver or the GPU is missing."""


class DeviceMismatchError(RuntimeError):
    """Arrays of one operation live on different devices."""


_cupy = None          # the module once imported
_cupy_error = None    # why it could not be imported (an ImportError), once tried
_cupy_tried = False


def _try_cupy():
    global _cupy, _cupy_error, _cupy_tried
    if not _cupy_tried:
        _cupy_tried = True
        try:
            import cupy  # noqa: F401  (only this module imports CuPy outside backend/cuda)
            _cupy = cupy
        except Exception as exc:  # ImportError, or a broken CUDA install raising at import
            _cupy_error = exc
    return _cupy


def _loaded_cupy():
    """The CuPy module if the caller's program has imported it (an object that is not a NumPy array may then be a
    CuPy array handed straight to a backend primitive before minidnn itself asked for a GPU), else None.  Only the
    rare path pays: a non-NumPy object while minidnn has not loaded CuPy yet."""
    if _cupy is None and not _cupy_tried and "cupy" in sys.modules:
        _try_cupy()
    return _cupy


def require_cupy():
    """The CuPy module, or CudaUnavailableError saying which GPU extra to install."""
    cp = _try_cupy()
    if cp is None:
        raise CudaUnavailableError(
            "minidnn: a CUDA device was requested but CuPy is not installed or failed to import "
            f"({type(_cupy_error).__name__}: {_cupy_error}). Install the GPU extra that matches your CUDA "
            "driver: pip install 'minidnn[cuda12]' (CUDA 12.x) or 'minidnn[cuda13]' (CUDA 13.x).")
    return cp


def current_cuda_index() -> int:
    """The calling thread's current GPU ordinal (CuPy's current device; ``minidnn.cuda.current_device``)."""
    return int(require_cupy().cuda.runtime.getDevice())


def cuda_device_count() -> int:
    """Number of visible GPUs; 0 where CuPy, the driver or a GPU is missing."""
    cp = _try_cupy()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def cuda_is_available() -> bool:
    """True if CuPy is importable and sees at least one CUDA device (torch.cuda.is_available)."""
    return cuda_device_count() > 0


class Device:
    """A device: ``type`` is ``"cpu"`` or ``"cuda"``; ``index`` is the GPU ordinal (None for cpu)."""

    __slots__ = ("type", "index", "_hash")

    def __init__(self, type: str, index: int | None = None):
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "_hash", hash((type, index)))     # devices key the handle and plan caches

    def __setattr__(self, name, value):
        raise AttributeError("Device is immutable")

    def __reduce__(self):       # pickle / copy rebuild through __init__ (restoring slots would hit __setattr__)
        return (Device, (self.type, self.index))

    def __repr__(self):
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.index is not None else ")")

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other):
        if other is self:
            return True
        if isinstance(other, str):
            try:
                other = device(other)
            except ValueError:
                return False
        return isinstance(other, Device) and self.type == other.type and self.index == other.index

    def __hash__(self):
        return self._hash

    @property
    def xp(self):
        """The array module that holds this device's arrays (numpy or cupy)."""
        return np if self.type == "cpu" else require_cupy()


CPU = Device("cpu")
_device_cache: dict = {}


def device(spec=None) -> Device:
    """Parse ``"cpu"``, ``"cuda"``, ``"cuda:N"``, an int (GPU N) or a Device.  None means the default.

    Asking for a GPU checks that CuPy, the driver and that GPU exist, and raises
    CudaUnavailableError naming the cause and the fix otherwise.
    """
    if spec is None:
        return default_device()
    if isinstance(spec, Device):
        return spec
    cached = _device_cache.get(spec) if type(spec) in (int, str) else None     # (True == 1 and hash alike)
    if cached is not None:
        return cached
    if isinstance(spec, int) and not isinstance(spec, bool):
        dev_type, index = "cuda", spec
    elif isinstance(spec, str):
        s = spec.strip().lower()
        if s == "cpu":
            return CPU
        if s == "gpu":
            s = "cuda"
        dev_type, _, idx = s.partition(":")
        if dev_type != "cuda" or (idx and not idx.isdigit()):
            raise ArgumentError(f"Invalid device string: {spec!r}: expected 'cpu', 'cuda' or 'cuda:N'")
        index = int(idx) if idx else None
    else:
        # A torch.device or anything printing as one.
        try:
            return device(str(spec))
        except ValueError:
            raise ValueError(f"cannot interpret {spec!r} as a device") from None
    require_cupy()
    count = cuda_device_count()
    if count == 0:
        raise CudaUnavailableError(
            f"minidnn: device {spec!r} requested, CuPy is installed but no CUDA GPU is visible "
            "(no NVIDIA driver, no GPU, or CUDA_VISIBLE_DEVICES hides them). Use device='cpu', or run on a "
            "machine with an NVIDIA GPU and a driver matching the installed cupy-cuda12x/cupy-cuda13x extra.")
    if index is None:
        index = int(_cupy.cuda.runtime.getDevice())
    if not 0 <= index < count:
        raise CudaUnavailableError(f"minidnn: device 'cuda:{index}' requested but only {count} GPU(s) are visible")
    dev = Device("cuda", index)
    _device_cache[spec] = dev
    return dev


_default = None


def default_device() -> Device:
    """The device new tensors go to: ``MINIDNN_DEVICE`` from the environment, else ``cpu``."""
    global _default
    if _default is None:
        _default = device(os.environ.get("MINIDNN_DEVICE", "cpu") or "cpu")
    return _default


def set_default_device(spec) -> None:
    """Make ``spec`` ('cpu', 'cuda', 'cuda:1', a Device) the device that factories and the backend use when none is
    given (torch.set_default_device); an unknown or unavailable device raises."""
    global _default
    _default = device(spec)


def is_cuda_array(x) -> bool:
    """True if ``x`` is a CuPy ndarray (False for NumPy arrays, and always False without CuPy)."""
    cp = _cupy if _cupy is not None or type(x) is np.ndarray else _loaded_cupy()
    return cp is not None and isinstance(x, cp.ndarray)


def array_module(x):
    """numpy or cupy: the module that holds array ``x`` (a NumPy scalar counts as NumPy)."""
    if type(x) is np.ndarray or (_cupy is None and _loaded_cupy() is None):
        return np
    return _cupy if isinstance(x, _cupy.ndarray) else np


def device_of(x) -> Device:
    """The Device an array lives on: cpu for a NumPy array (or anything that is not a CuPy array), cuda:i for a CuPy
    array on GPU i."""
    if type(x) is np.ndarray or (_cupy is None and _loaded_cupy() is None) or not isinstance(x, _cupy.ndarray):
        return CPU
    index = x.data.device_id        # what x.device.id reads, without building a cupy Device per call
    dev = _device_cache.get(index)
    return dev if dev is not None else device(index)


def xp_for(dev) -> object:
    """The array module of ``dev`` (a Device or spec): numpy for the cpu, cupy for a cuda device."""
    return device(dev).xp


@contextlib.contextmanager
def device_guard(dev):
    """Make ``dev`` the current CUDA device inside the block (a no-op for cpu)."""
    dev = device(dev)
    if dev.type == "cpu":
        yield
    else:
        with _cupy.cuda.Device(dev.index):
            yield


def to_device(x, dev, dtype=None, copy=False):
    """Return array ``x`` on device ``dev`` (copying across devices; no copy when already there)."""
    dev = device(dev)
    if dev.type == "cpu":
        if is_cuda_array(x):
            x = x.get()
            copy = False
        out = np.array(x, dtype=dtype, copy=True) if copy else np.asarray(x, dtype=dtype)
        return out
    cp = _cupy
    with cp.cuda.Device(dev.index):
        if isinstance(x, cp.ndarray) and x.data.device_id == dev.index:
            if dtype is not None and x.dtype != dtype:
                return x.astype(dtype)
            return x.copy() if copy else x
        return cp.array(x, dtype=dtype, copy=True)


_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """``np.dtype(dtype).name``, cached per dtype (NumPy computes the name in Python, ~1 µs a call, and the kernel
    modules ask at every call)."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = np.dtype(dtype).name
    return name


def is_floating(dtype, complex_ok: bool = False) -> bool:
    """Whether ``dtype`` is a floating-point type: NumPy's float kinds and ml_dtypes' bfloat16 (which NumPy files
    under kind 'V'); ``complex_ok`` admits complex types too."""
    kinds = _FLOAT_KINDS.get(dtype) if isinstance(dtype, np.dtype) else None
    if kinds is None:
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        floating = dt.kind == "f" or (dt.kind == "V" and dt.name == "bfloat16")    # dt.name is slow Python in NumPy
        kinds = (floating, floating or dt.kind == "c")
        if dt is dtype:
            _FLOAT_KINDS[dt] = kinds
    return kinds[1] if complex_ok else kinds[0]


_FLOAT_KINDS: dict = {}      # np.dtype -> (floating, floating or complex): every op asks, the answer never changes
