"""dtypes below the Tensor: the default float dtype, reading dtype spellings (NumPy's and torch's), and turning
Python data (numbers, nested lists, arrays, DLPack objects) into the array a new tensor holds, with PyTorch's rules."""
from __future__ import annotations

import numbers

import numpy as np

from .backend import devices as _dev
from .backend.devices import is_floating as _is_floating
from .backend.errors import ArgumentError, DTypeError

__all__ = ["get_default_dtype", "set_default_dtype", "make_array"]

_DEFAULT_FLOAT = np.dtype(np.float32)


def get_default_dtype():
    """The dtype Python floats become (float32 unless set_default_dtype changed it)."""
    return _DEFAULT_FLOAT


def set_default_dtype(dtype):
    """Set the dtype Python floats and float creation functions default to (a floating dtype)."""
    global _DEFAULT_FLOAT
    dt = _to_dtype(dtype)
    if not _is_floating(dt):
        raise DTypeError(f"set_default_dtype: only floating dtypes are allowed, got {dt}")
    _DEFAULT_FLOAT = dt


def _to_dtype(dtype):
    """A NumPy dtype for ``dtype`` (a NumPy dtype or type, its name, or a torch.dtype / "torch.float32" spelling)."""
    if dtype is None:
        return None
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.startswith("torch."):
        dtype = dtype[6:]
    s = str(dtype)
    if s.startswith("torch."):      # a torch.dtype object
        dtype = s[6:]
    try:
        return np.dtype(dtype)
    except TypeError:
        raise DTypeError(f"cannot interpret {dtype!r} as a dtype") from None


def _looks_like_dtype(a):
    if isinstance(a, (np.dtype, type)) and not isinstance(a, _dev.Device):
        return True
    if isinstance(a, str):
        s = a[6:] if a.startswith("torch.") else a
        if s.startswith("cuda") or s in ("cpu", "gpu"):
            return False
        try:
            np.dtype(s)
            return True
        except TypeError:
            return False
    return str(a).startswith("torch.") and not str(a).startswith("torch.device")


def _infer_python_dtype(data):
    """PyTorch's rule for Python data: floats -> default float dtype, ints -> int64, bools -> bool."""
    if isinstance(data, bool):
        return np.dtype(np.bool_)
    if isinstance(data, numbers.Integral):
        return np.dtype(np.int64)
    if isinstance(data, numbers.Real):
        return _DEFAULT_FLOAT
    if isinstance(data, numbers.Complex):
        return np.dtype(np.complex64)
    return None


def _check_nested(op, data, depth=0):
    """Nested lists must be rectangular and hold numbers (or tensors/arrays): PyTorch's errors, before NumPy's."""
    if depth > 64:
        raise ArgumentError(f"{op}: nested sequences deeper than 64 levels")
    lengths = set()
    for item in data:
        if isinstance(item, (str, bytes)):
            raise ArgumentError(f"{op}: too many dimensions 'str': the data holds the string {item!r}")
        if isinstance(item, (list, tuple)):
            lengths.add(len(item))
            _check_nested(op, item, depth + 1)
        else:
            lengths.add(None)
    if len(lengths) > 1:
        sizes = sorted(("scalar" if n is None else str(n)) for n in lengths)
        raise ArgumentError(f"{op}: expected sequences of equal length at dim {depth + 1}, got lengths "
                            f"{', '.join(sizes)} (ragged nested lists cannot form a tensor)")


def make_array(data, dtype=None, device=None):
    """The array ``minidnn.tensor(data, dtype, device)`` holds: arrays keep their dtype (copied), Python data takes
    PyTorch's rules (floats -> the default float dtype, ints -> int64), nested lists must be rectangular."""
    dtype = _to_dtype(dtype)
    if device is None:
        dev = _dev.device_of(data) if hasattr(data, "__cuda_array_interface__") else _dev.default_device()
    else:
        dev = _dev.device(device)
    if hasattr(data, "__array_namespace__") or isinstance(data, np.ndarray) or \
            hasattr(data, "__cuda_array_interface__"):
        # An array keeps its dtype (float64 NumPy arrays stay float64, as torch.tensor(np_array) does).
        return _dev.to_device(data, dev, dtype=dtype, copy=True)
    if hasattr(data, "__dlpack__") and not isinstance(data, (list, tuple)):
        return _dev.to_device(np.from_dlpack(data) if dev.type == "cpu" else dev.xp.from_dlpack(data), dev,
                              dtype=dtype, copy=True)
    if isinstance(data, (str, bytes)):
        raise ArgumentError(f"tensor: too many dimensions 'str': cannot build a tensor from the string {data!r}")
    try:
        arr = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
    except (ValueError, TypeError):
        if isinstance(data, (list, tuple)):
            _check_nested("tensor", data)      # names the ragged dim or the string; else NumPy's reason below
        raise
    if arr.dtype.kind in "USO" and isinstance(data, (list, tuple)):
        _check_nested("tensor", data)
        raise DTypeError(f"cannot build a tensor from {type(data).__name__} data of mixed/unsupported types "
                         f"(NumPy reads it as {arr.dtype})")
    if dtype is None:
        if arr.dtype == np.float64:
            arr = arr.astype(_DEFAULT_FLOAT)
        elif arr.dtype == np.complex128:
            arr = arr.astype(np.complex64)
    return _dev.to_device(arr, dev)
