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
    """A cpu ``minidnn.Generator`` from ``generator`` (a minidnn.Generator, an int seed, or -- kept for old
    scripts -- a ``numpy.random.Generator``, whose stream it then draws from) or ``seed``.

    With neither, a Generator seeded from minidnn's default cpu generator, so ``minidnn.manual_seed(s)``
    makes loaders and transforms reproducible as it does ``rand``/dropout.
    """
    from .. import random as _random
    if generator is not None and seed is not None:
        raise ValueError(f"{owner}: pass generator= or seed=, not both (got generator={generator!r}, seed={seed!r})")
    if isinstance(generator, _random.Generator):
        if generator.device.type != "cpu":
            raise ValueError(f"{owner}: expected a cpu generator, got one on {generator.device}")
        return generator
    if isinstance(generator, np.random.Generator):
        g = _random.Generator()
        g._eng = generator
        return g
    if generator is None and seed is None:
        return _random.Generator().manual_seed(int(_random.engine_for(_dev.CPU).integers(0, 2 ** 63)))
    value = generator if generator is not None else seed
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: generator must be a minidnn.Generator or an int seed, got {value!r}")
    return _random.Generator().manual_seed(int(value))


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
