"""Dropout (cuDNN's cudnnDropoutForward / cudnnDropoutBackward).

# x, y, dy, dx: any shape;  reserve: bool array of x's shape, True where an element is kept (the CPU, and the GPU
# under MINIDNN_DROPOUT_MASK=1), or a BitMaskReserve (the GPU's default: the mask at 1 bit an element), or a
# PhiloxReserve (MINIDNN_DROPOUT_MASK=0: which numbers decided, 16 bytes)

y = x * mask / (1 - p) with mask ~ Bernoulli(1 - p), drawn from the descriptor's seeded generator (one per
device, created on first use: NumPy's ``default_rng(seed)`` on the CPU, minidnn's counter engine on a GPU).  A
generator with a device-side Philox stream (minidnn's GPU engines) draws the mask in one kernel that also advances
that stream on the device (backend/cuda/dropout_philox.py, float16/bfloat16/float32/float64, any p), so a training
step with dropout can be replayed from a CUDA graph; the backward there is one kernel too.  The same seed gives the
same sequence of masks on the same device (the CPU and GPU streams differ, so CPU and GPU masks differ).  p = 0 is
the identity, p = 1 gives zeros (both still advance the stream).  The reserve space (cuDNN's name) is what
backward needs: on the CPU the boolean mask itself (1 byte per element); on a GPU by default a BitMaskReserve
(session 13): the keep mask at 1 bit an element (n / 8 bytes), so each direction moves its input and output and an
eighth of a byte an element (PyTorch moves a byte); bitwise the same results as a byte mask.  Like cuDNN's reserve
space it is opaque: pass it to ``dropout_backward``; ``reserve.mask()`` materialises the bool mask.
``dropout_backward`` still takes a bool mask of dy's shape too (the CPU's, or one of the caller's own).
``cuda.dropout_philox.RESERVE`` (MINIDNN_DROPOUT_MASK, settable at run time) picks the GPU reserve: "bits" (the
default), "record" / 0 (a PhiloxReserve: the forward records the key and counter it drew from, 16 bytes written on
the device, and the backward draws the same numbers again -- no mask at all, but the Philox math is then paid
twice, which lost in bfloat16 on the H200), "mask" / 1 (the byte mask, as before).
"""
from __future__ import annotations

import numpy as np

from ._common import begin, check_float, shape_str
from .cuda import dropout_philox  # the GPU kernel, imported once here, not per call (importing it needs no GPU)
from .devices import device, device_guard
from .errors import BadParamError
from .rng import new_engine

__all__ = ["DropoutDescriptor", "dropout_forward", "dropout_backward", "dropout_get_reserve_space_size",
           "PhiloxReserve", "BitMaskReserve"]

PhiloxReserve, BitMaskReserve = dropout_philox.PhiloxReserve, dropout_philox.BitMaskReserve
_OPAQUE = dropout_philox.OPAQUE


class DropoutDescriptor:
    """Drop probability ``p`` and the seed of its random state (cuDNN keeps the state in the descriptor too).

    ``p`` and ``seed`` are read-only; the generators advance with every ``dropout_forward``.
    ``reset()`` restarts every device's sequence from the seed.
    """

    __slots__ = ("_p", "_seed", "_generators")

    def __init__(self, p: float, seed: int = 0):
        p = float(p)
        if not 0.0 <= p <= 1.0:
            raise BadParamError(f"DropoutDescriptor: p={p} must be in [0, 1]")
        if not (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0):
            raise BadParamError(f"DropoutDescriptor: seed={seed!r} must be an int >= 0")
        self._p, self._seed, self._generators = p, int(seed), {}

    p = property(lambda self: self._p)
    seed = property(lambda self: self._seed)

    def __repr__(self):
        return f"DropoutDescriptor(p={self._p}, seed={self._seed})"

    @property
    def scale(self) -> float:
        """The factor kept elements are multiplied by: 1 / (1 - p), and 0 for p = 1 (nothing is kept)."""
        return 0.0 if self._p == 1.0 else 1.0 / (1.0 - self._p)

    def generator(self, dev_spec):
        """This descriptor's generator on a device ("cpu", "cuda:0", a Device), created from the seed on first use:
        NumPy's PCG64 on the CPU, a counter engine on a GPU (its device-side Philox stream feeds the kernel)."""
        dev = device(dev_spec)
        gen = self._generators.get(dev)
        if gen is None:
            gen = self._generators[dev] = new_engine(dev, self._seed)
        return gen

    def reset(self):
        self._generators.clear()


def dropout_get_reserve_space_size(x) -> int:
    """Bytes of reserve space ``dropout_forward`` returns for x: for a GPU array the kernels take, a PhiloxReserve's
    16 bytes of device memory (RESERVE "record"), a BitMaskReserve's 4 * ceil(n / 32) (the default) or the bool mask's
    n (RESERVE "mask", V1); on the CPU one bool per element (the mask)."""
    if type(x) is not np.ndarray and hasattr(x, "data") and hasattr(x.data, "device_id"):
        return dropout_philox.reserve_bytes(x)
    return int(np.prod(x.shape))


# The GPU calls of the kernels (backend/cuda/dropout_philox.py) are remembered by signature in its ``seen`` table
# (cleared with its plans): a call of the same handle, descriptor type and p, array types, shapes, strides, dtypes
# and devices as one that passed every check below goes straight to its settled runner -- a dict lookup, the
# generator's device state, the allocations and one launch.  The key holds everything the checks and the kernels'
# support tests read (a descriptor's scale is its class's function of p) and the forward's reserve choice
# (dropout_philox.RESERVE: setting it reaches the next call); the generator is asked every call.  A backward's
# key holds a PhiloxReserve's shape, p and device (what its checks read), a mask's shape, strides, dtype, device.

def dropout_forward(handle, dropout_desc: DropoutDescriptor, x):
    """-> (y, reserve): y = x * mask / (1 - p); reserve = the boolean keep mask, or on a GPU by default a
    PhiloxReserve (see the module docstring)."""
    if type(x) is not np.ndarray:
        try:
            key = (handle, type(dropout_desc), dropout_desc._p, type(x), x.shape, x.strides, x.dtype,
                   x.data.device_id, dropout_philox.RESERVE)
            seen = _SEEN.get(key)
        except (AttributeError, TypeError):
            key = seen = None
        if seen is not None:
            state = getattr(dropout_desc.generator(seen[0]), "device_philox_state", None)
            if state is not None:
                return seen[1](x, *state())
    else:
        key = None
    where = "dropout_forward"
    handle, xp = begin(handle, where, x=x)
    if not isinstance(dropout_desc, DropoutDescriptor):
        raise BadParamError(f"{where}: dropout_desc must be a DropoutDescriptor, got {type(dropout_desc).__name__}")
    check_float(where, x=x)
    with device_guard(handle.device):
        gen = dropout_desc.generator(handle.device)
        if hasattr(gen, "device_philox_state") and dropout_philox.supports(x, dropout_desc.p):
            # one kernel, its random state on the device: capturable
            run = dropout_philox.forward_runner(x, dropout_desc.p, dropout_desc.scale)
            if key is not None and not dropout_philox.V1:
                _SEEN.remember(key, (handle.device, run))
            return run(x, *gen.device_philox_state())
        # float32 draws are plenty to compare against p and are the cheaper draw on both libraries
        keep = gen.random(x.shape, dtype=np.float32) >= dropout_desc.p
    return _masked(x, keep, dropout_desc.scale), keep


_SEEN = dropout_philox.seen


def _masked(a, keep, scale):
    """a * (keep ? scale : 0) computed in a's dtype, or in float32 for 16-bit data (then rounded once, as the GPU
    kernels do; bfloat16 times a Python float would otherwise come out float32)."""
    acc = np.dtype(np.float32) if a.dtype.itemsize < 4 else a.dtype
    return (a * (keep.astype(acc) * acc.type(scale))).astype(a.dtype, copy=False)


def dropout_backward(handle, dropout_desc: DropoutDescriptor, dy, reserve):
    """dx = dy * mask / (1 - p) with the reserve ``dropout_forward`` returned (a bool mask of dy's shape, or the
    GPU's PhiloxReserve / BitMaskReserve of dy's shape and the descriptor's p)."""
    if type(dy) is not np.ndarray:
        try:
            if type(reserve) in _OPAQUE:
                key = (handle, type(dropout_desc), dropout_desc._p, type(dy), dy.shape, dy.strides, dy.dtype,
                       dy.data.device_id, type(reserve), reserve.shape, reserve.p, reserve.device)
            else:
                key = (handle, type(dropout_desc), dropout_desc._p, type(dy), dy.shape, dy.strides, dy.dtype,
                       dy.data.device_id, type(reserve), reserve.shape, reserve.strides, reserve.dtype,
                       reserve.data.device_id)
            run = _SEEN.get(key)
        except (AttributeError, TypeError):
            key = run = None
        if run is not None:
            return run(dy, reserve)
    else:
        key = None
    where = "dropout_backward"
    opaque = type(reserve) in _OPAQUE
    handle, xp = begin(handle, where, dy=dy, reserve=(reserve.record if type(reserve) is PhiloxReserve else
                                                      reserve.bits) if opaque else reserve)
    if not isinstance(dropout_desc, DropoutDescriptor):
        raise BadParamError(f"{where}: dropout_desc must be a DropoutDescriptor, got {type(dropout_desc).__name__}")
    check_float(where, dy=dy)
    if opaque:
        if reserve.shape != tuple(dy.shape) or reserve.p != dropout_desc.p:
            raise BadParamError(f"{where}: reserve {reserve!r} does not match dy of shape {shape_str(dy)} with "
                                f"p={dropout_desc.p}: pass the reserve dropout_forward returned for this dy's "
                                f"input, with the same descriptor")
        if not dropout_philox.supports_backward(dy, reserve):
            raise BadParamError(f"{where}: reserve {reserve!r} is read by the GPU kernels only; dy is "
                                f"{type(dy).__name__} {shape_str(dy)} of dtype {dy.dtype}")
        run = dropout_philox.backward_runner(dy, reserve, dropout_desc.scale)
        if key is not None:
            _SEEN.remember(key, run)
        return run(dy, reserve)
    if reserve is None or tuple(reserve.shape) != tuple(dy.shape) or reserve.dtype != np.bool_:
        got = None if reserve is None else (shape_str(reserve), str(reserve.dtype))
        raise BadParamError(f"{where}: reserve must be the bool mask of dy's shape {shape_str(dy)} returned by "
                            f"dropout_forward, got {got}")
    if dropout_philox.supports_backward(dy, reserve):
        run = dropout_philox.backward_runner(dy, reserve, dropout_desc.scale)
        if key is not None:
            _SEEN.remember(key, run)
        return run(dy, reserve)
    return _masked(dy, reserve, dropout_desc.scale)
