"""Helpers shared by the data package: random generators and array <-> Tensor conversion.

The data pipeline works on raw arrays (NumPy, or CuPy once a batch is on a GPU) and wraps them into
Tensors only at its edges, so that fancy indexing, collation and transforms never pay for autograd
bookkeeping.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..backend import devices as _dev
from ..tensor import Tensor


def as_generator(generator=None, seed=None, owner="data"):
    """A ``numpy.random.Generator`` from ``generator`` (a Generator or an int seed) or ``seed``.

    With neither, draw a fresh seed from minidnn's cpu generator, so ``minidnn.manual_seed(s)``
    makes loaders and transforms reproducible as it does ``rand``/dropout.
    """
    if generator is not None and seed is not None:
        raise ValueError(f"{owner}: pass generator= or seed=, not both (got generator={generator!r}, seed={seed!r})")
    if isinstance(generator, np.random.Generator):
        return generator
    if generator is None and seed is None:
        from ..tensor import default_generator
        return np.random.default_rng(int(default_generator("cpu").integers(2 ** 63)))
    value = generator if generator is not None else seed
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: generator must be a numpy.random.Generator or an int seed, got {value!r}")
    return np.random.default_rng(int(value))


def unwrap(x):
    """The array behind a Tensor (anything else is returned as is)."""
    return x.data if isinstance(x, Tensor) else x


def is_array(x):
    return isinstance(x, np.ndarray) or _dev.is_cuda_array(x)


def map_arrays(fn, batch):
    """Apply ``fn`` to every array/Tensor leaf of a nested tuple/list/dict batch."""
    if isinstance(batch, Tensor) or is_array(batch):
        return fn(unwrap(batch))
    if isinstance(batch, dict):
        return {k: map_arrays(fn, v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):      # namedtuple keeps its type
        return type(batch)(*(map_arrays(fn, v) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_arrays(fn, v) for v in batch)
    return batch


def wrap(x):
    """A Tensor around array ``x`` without copying (a batch is freshly built, so no one else holds it)."""
    return Tensor._from_array(x)


def to_tensors(batch):
    """Every array leaf of ``batch`` as a Tensor (no copy)."""
    return map_arrays(wrap, batch)
