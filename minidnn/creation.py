"""Creation functions: ``tensor``, ``zeros``/``ones``/``full``/``empty`` (and their ``_like`` forms), ``arange``,
``linspace``, ``eye``, and the random ones (``rand``, ``randn``, ``randint``, ``manual_seed``), as in PyTorch.
Each device's default Generator lives in minidnn/random.py."""
from __future__ import annotations

import numbers

import numpy as np

from . import _dlpack
from .autograd import no_grad
from .backend import devices as _dev
from .backend.devices import is_floating as _is_floating
from .backend.errors import ArgumentError, DTypeError
from .tensor import Tensor, _infer_python_dtype, _to_dtype, _wrap, get_default_dtype

__all__ = [
    "tensor", "as_tensor", "from_numpy", "from_dlpack", "zeros", "ones", "full", "empty", "arange",
    "linspace", "eye", "rand", "randn", "randint", "zeros_like", "ones_like", "full_like", "empty_like", "rand_like",
    "randn_like", "manual_seed", "is_tensor",
]


def tensor(data, dtype=None, device=None, requires_grad=False) -> Tensor:
    """A new tensor (always a copy) from Python data, a NumPy/CuPy array or another tensor."""
    return Tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """``data`` as a tensor without a copy where possible (torch.as_tensor): a Tensor already of the requested dtype and
    device is returned as is (the same object, its graph kept); anything else is copied through ``tensor`` (Python data,
    arrays, or a tensor needing another dtype/device)."""
    if isinstance(data, Tensor) and (dtype is None or data.dtype == _to_dtype(dtype)) and \
            (device is None or data.device == _dev.device(device)):
        return data
    return tensor(data, dtype=dtype, device=device)


def is_tensor(obj) -> bool:
    """True if ``obj`` is a minidnn Tensor (torch.is_tensor); arrays and Python numbers are not."""
    return isinstance(obj, Tensor)


def from_numpy(array) -> Tensor:
    """A cpu tensor sharing memory with the NumPy array (no copy)."""
    if not isinstance(array, np.ndarray):
        raise DTypeError(f"from_numpy expects a numpy.ndarray, got {type(array).__name__}")
    return _wrap(array)


def from_dlpack(obj) -> Tensor:
    """Zero-copy import from any DLPack producer (NumPy, CuPy, PyTorch, ...)."""
    if isinstance(obj, Tensor):
        return _wrap(obj.data)
    dev_type, dev_id = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (1, 0)
    if int(dev_type) == 1:      # kDLCPU
        try:
            return _wrap(np.from_dlpack(obj))
        except (BufferError, RuntimeError, TypeError):
            capsule = obj.__dlpack__()
            if not _dlpack.capsule_is_bfloat16(capsule):
                raise
            return _wrap(_dlpack.from_capsule(capsule, np.dtype("bfloat16")))   # NumPy has no bfloat16 code
    cp = _dev.device(f"cuda:{int(dev_id)}").xp
    with cp.cuda.Device(int(dev_id)):
        return _wrap(cp.from_dlpack(obj))


def _shape_arg(size, op="tensor creation"):
    """A size given as ints or as one tuple/list/torch.Size, checked: ints >= 0 (PyTorch's rule and wording)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    out = []
    for s in size:
        if isinstance(s, bool) or not isinstance(s, (numbers.Integral, np.integer)):
            if isinstance(s, Tensor) and s.ndim == 0 and not _is_floating(s.dtype):
                s = int(s)
            else:
                raise DTypeError(f"{op}: size must be a tuple of ints, but got {s!r} ({type(s).__name__}) in "
                                 f"{tuple(size)}")
        if s < 0:
            raise ArgumentError(f"{op}: Trying to create tensor with negative dimension {int(s)}: "
                                f"{[int(v) for v in size]}")
        out.append(int(s))
    return tuple(out)


def _factory(fill, size, dtype, device, requires_grad, default=None, op="tensor creation"):
    dt = _to_dtype(dtype) or default or get_default_dtype()
    shape = _shape_arg(size, op)
    xp = _dev.device(device).xp
    with _dev.device_guard(device if device is not None else _dev.default_device()):
        arr = fill(xp, shape, dt)
    t = _wrap(arr)
    if requires_grad:
        t.requires_grad_(True)
    return t


def zeros(*size, dtype=None, device=None, requires_grad=False):
    """A tensor of ``size`` (ints, or one tuple/list) filled with 0 (torch.zeros); dtype defaults to the default float
    dtype, device to the default device. Negative sizes raise ArgumentError; a 0 in size gives an empty tensor."""
    return _factory(lambda xp, s, d: xp.zeros(s, dtype=d), size, dtype, device, requires_grad, op="zeros")


def ones(*size, dtype=None, device=None, requires_grad=False):
    """A tensor of ``size`` (ints, or one tuple/list) filled with 1 (torch.ones); dtype defaults to the default float
    dtype, device to the default device."""
    return _factory(lambda xp, s, d: xp.ones(s, dtype=d), size, dtype, device, requires_grad, op="ones")


def empty(*size, dtype=None, device=None, requires_grad=False):
    """An uninitialized tensor of ``size`` (torch.empty): the values are whatever the allocator left there, so write
    every element before reading one; dtype defaults to the default float dtype."""
    return _factory(lambda xp, s, d: xp.empty(s, dtype=d), size, dtype, device, requires_grad, op="empty")


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    """A tensor of ``size`` (an int or a tuple) filled with ``fill_value`` (torch.full); without ``dtype`` the dtype
    follows the value as PyTorch infers it (bool -> bool, int -> int64, float -> the default float dtype)."""
    default = _infer_python_dtype(fill_value) if not isinstance(fill_value, Tensor) else fill_value.dtype
    size = (size,) if isinstance(size, int) else tuple(size)
    return _factory(lambda xp, s, d: xp.full(s, fill_value, dtype=d), (size,), dtype, device, requires_grad,
                    default=default, op="full")


def _like(t, dtype, device):
    return (dtype if dtype is not None else t.dtype), (device if device is not None else t.device)


def zeros_like(t, dtype=None, device=None, requires_grad=False):
    """Zeros of ``t``'s shape, with ``t``'s dtype and device unless ``dtype``/``device`` are given (torch.zeros_like);
    the result never shares ``t``'s graph."""
    d, dev = _like(t, dtype, device)
    return zeros(*t.shape, dtype=d, device=dev, requires_grad=requires_grad)


def ones_like(t, dtype=None, device=None, requires_grad=False):
    """Ones of ``t``'s shape, with ``t``'s dtype and device unless ``dtype``/``device`` are given (torch.ones_like)."""
    d, dev = _like(t, dtype, device)
    return ones(*t.shape, dtype=d, device=dev, requires_grad=requires_grad)


def empty_like(t, dtype=None, device=None, requires_grad=False):
    """An uninitialized tensor of ``t``'s shape, with ``t``'s dtype and device unless ``dtype``/``device`` are given
    (torch.empty_like)."""
    d, dev = _like(t, dtype, device)
    return empty(*t.shape, dtype=d, device=dev, requires_grad=requires_grad)


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False):
    """A tensor of ``t``'s shape filled with ``fill_value``, with ``t``'s dtype and device unless ``dtype``/``device``
    are given (torch.full_like; the value is cast to that dtype)."""
    d, dev = _like(t, dtype, device)
    return full(t.shape, fill_value, dtype=d, device=dev, requires_grad=requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    """Values from start to end (exclusive) by step; PyTorch's dtype rule (all ints: int64, else the default float)."""
    if end is None:
        start, end = 0, start
    for name, v in (("start", start), ("end", end), ("step", step)):
        if isinstance(v, Tensor):
            v = v.item()
        if not isinstance(v, numbers.Real) or not np.isfinite(v):
            raise ArgumentError(f"arange: {name} must be a finite number, got {v!r}")
    if step == 0:
        raise ArgumentError("arange: step must be nonzero")
    if (end - start) * step < 0:
        raise ArgumentError(f"arange: upper bound and larger bound inconsistent with step sign (start {start}, end "
                            f"{end}, step {step})")
    integral = all(isinstance(v, numbers.Integral) for v in (start, end, step))
    default = np.dtype(np.int64) if integral else get_default_dtype()
    return _factory(lambda xp, s, d: xp.arange(start, end, step).astype(d), (), dtype, device, requires_grad,
                    default=default, op="arange")


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    """``steps`` evenly spaced values from start to end inclusive (floating dtypes only, as in PyTorch)."""
    if isinstance(steps, bool) or not isinstance(steps, (numbers.Integral, np.integer)) or steps < 0:
        raise ArgumentError(f"linspace: number of steps must be a non-negative int, got {steps!r}")
    dt = _to_dtype(dtype)
    if dt is not None and dt.kind == "b":
        raise DTypeError("linspace: dtype bool is not supported (PyTorch: \"linspace_cpu\" not implemented for "
                         "'Bool')")
    return _factory(lambda xp, s, d: xp.linspace(start, end, int(steps)).astype(d), (), dtype, device, requires_grad,
                    op="linspace")


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    """The (n, m) identity (m defaults to n)."""
    for name, v in (("n", n), ("m", m)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (numbers.Integral, np.integer)) or v < 0):
            raise ArgumentError(f"eye: {name} must be greater or equal to 0, got {v}")
    return _factory(lambda xp, s, d: xp.eye(n, m, dtype=d), (), dtype, device, requires_grad, op="eye")


# -- random numbers: each device's default Generator lives in minidnn/random.py ------------------------------
def manual_seed(seed: int):
    """Seed every generator (cpu and each GPU) for reproducible rand/randn/randint/dropout/init."""
    from . import random as _rnd
    return _rnd.manual_seed(seed)


def _generator(dev, generator=None):
    """The engine that draws on ``dev``: ``generator``'s (a minidnn.Generator) or the device default's."""
    from . import random as _rnd
    return _rnd.engine_for(dev, generator)


def default_generator(device=None):
    """The random engine that draws on ``device`` (the default device if None): the array-level generator behind that
    device's default minidnn.Generator."""
    return _generator(_dev.device(device))


def _random(kind, size, dtype, device, requires_grad, generator=None, **kw):
    dt = _to_dtype(dtype) or get_default_dtype()
    dev = _dev.device(device)
    g = _generator(dev, generator)
    shape = _shape_arg(size, kind)
    if kind == "randint" and kw["high"] <= kw["low"]:
        raise ArgumentError(f"randint: random_ expects 'from' to be less than 'to', but got from={kw['low']} >= "
                            f"to={kw['high']}")
    with _dev.device_guard(dev):
        if kind == "rand":
            arr = g.random(shape, dtype=np.float64 if dt == np.float64 else np.float32)
        elif kind == "randn":
            arr = g.standard_normal(shape, dtype=np.float64 if dt == np.float64 else np.float32)
        else:
            arr = g.integers(kw["low"], kw["high"], size=shape)
        arr = arr.astype(dt, copy=False)
    t = _wrap(arr)
    if requires_grad:
        t.requires_grad_(True)
    return t


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False):
    """Uniform samples on [0, 1) of ``size`` (torch.rand), drawn from ``generator`` or the device's default generator
    (minidnn.manual_seed makes them reproducible). Draws are made in float64 for a float64 dtype and in float32
    otherwise (then rounded to float16/bfloat16); NumPy and CuPy streams differ, so CPU and GPU values differ for one
    seed."""
    return _random("rand", size, dtype, device, requires_grad, generator)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False):
    """Standard normal samples N(0, 1) of ``size`` (torch.randn), drawn from ``generator`` or the device's default
    generator; drawn in float64 for a float64 dtype and in float32 otherwise."""
    return _random("randn", size, dtype, device, requires_grad, generator)


def randint(low, high=None, size=None, dtype=None, device=None, generator=None):
    """``randint(high, size)`` or ``randint(low, high, size)``: integers in [low, high)."""
    if size is None:
        low, high, size = 0, low, high
    if high is None:
        raise DTypeError("randint needs high and size")
    return _random("randint", (tuple(size),), dtype or np.int64, device, False, generator, low=low, high=high)


def rand_like(t, dtype=None, device=None, requires_grad=False):
    """Uniform samples on [0, 1) of ``t``'s shape, with ``t``'s dtype and device unless given (torch.rand_like); uses
    the device's default generator."""
    d, dev = _like(t, dtype, device)
    return rand(*t.shape, dtype=d, device=dev, requires_grad=requires_grad)


def randn_like(t, dtype=None, device=None, requires_grad=False):
    """Standard normal samples of ``t``'s shape, with ``t``'s dtype and device unless given (torch.randn_like); uses the
    device's default generator."""
    d, dev = _like(t, dtype, device)
    return randn(*t.shape, dtype=d, device=dev, requires_grad=requires_grad)


# -- in-place random fills (bound as Tensor methods in ops/__init__.py) -----------------------------------------------
def uniform_(t, a=0.0, b=1.0):
    """Fill ``t`` in place with U(a, b) draws from its device's default generator (Tensor.uniform_)."""
    with no_grad():
        t.copy_(rand(*t.shape, dtype=t.dtype, device=t.device) * (b - a) + a)
    return t


def normal_(t, mean=0.0, std=1.0):
    """Fill ``t`` in place with N(mean, std^2) draws from its device's default generator (Tensor.normal_)."""
    with no_grad():
        t.copy_(randn(*t.shape, dtype=t.dtype, device=t.device) * std + mean)
    return t
