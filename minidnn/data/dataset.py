"""Map-style datasets: ``Dataset``, ``TensorDataset``, ``Subset`` and ``random_split``.

A dataset is anything with ``__getitem__(i)`` and ``__len__()``.  A ``Dataset`` subclass may also
offer ``get_batch(indices)``: the whole batch for an int64 index array, already collated, as raw
arrays.  The DataLoader uses it instead of one ``__getitem__`` call per sample; ``TensorDataset``
implements it with one fancy-indexing op per array, which is what makes loading a batch cost a
memcpy instead of a Python loop.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..backend import devices as _dev
from ..tensor import Tensor
from ._utils import as_generator, unwrap, wrap
from .collate import collate_arrays

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "Subset", "ConcatDataset", "random_split", "fetch_batch"]


class Dataset:
    """Base class of map-style datasets: override ``__getitem__`` and ``__len__``."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __len__(self):
        raise NotImplementedError(f"{type(self).__name__} must implement __len__")

    def get_batch(self, indices):
        """The collated batch (raw arrays) for ``indices``; override with a vectorised fetch where possible."""
        return collate_arrays([self[int(i)] for i in indices])


class IterableDataset:
    """Base class of iterable-style datasets (streams): override ``__iter__``.  With ``num_workers > 0`` every
    worker iterates its own copy; split the stream with ``get_worker_info()`` (``id``, ``num_workers``) to avoid
    duplicates, as in PyTorch.  A DataLoader takes no sampler or shuffle for it."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


def fetch_batch(dataset, indices):
    """Collated batch of ``dataset`` at ``indices``: the dataset's ``get_batch`` if it has one, else per sample."""
    get_batch = getattr(dataset, "get_batch", None)
    if get_batch is not None:
        return get_batch(indices)
    return collate_arrays([dataset[int(i)] for i in indices])


class TensorDataset(Dataset):
    """Samples are rows of equally long arrays/Tensors: ``ds[i] == (a[i], b[i], ...)``.

    ``ds[index_array]`` returns the whole batch (fancy indexing on the first axis), and ``get_batch``
    returns the same as raw arrays for the DataLoader's fast path.  The arrays are kept as given
    (no copy, dtype unchanged): pass float32 inputs and int64 labels.
    """

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset: needs at least one array or Tensor")
        arrays = tuple(_as_array(t) for t in tensors)
        lengths = [a.shape[0] if a.ndim else None for a in arrays]
        if None in lengths or len(set(lengths)) > 1:
            raise ValueError("TensorDataset: every array needs the same first dimension, got shapes "
                             f"{[tuple(a.shape) for a in arrays]}")
        self.tensors = arrays

    def __len__(self):
        return self.tensors[0].shape[0]

    def get_batch(self, indices):
        return tuple(a[_index_on_device_of(a, indices)] for a in self.tensors)

    def __getitem__(self, index):
        if isinstance(index, Tensor):
            index = index.data
        return tuple(wrap(a) for a in self.get_batch(index))


def _index_on_device_of(array, index):
    """``index`` usable on ``array``: a NumPy index array is copied to the GPU for a CuPy array."""
    if isinstance(index, np.ndarray) and _dev.is_cuda_array(array):
        return _dev.to_device(index, _dev.device_of(array))
    return index


def _as_array(x):
    """The array of a Tensor, a NumPy/CuPy array as is, anything else (lists) through np.asarray."""
    x = unwrap(x)
    return x if hasattr(x, "shape") and hasattr(x, "dtype") else np.asarray(x)


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices`` (in that order)."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)
        if self.indices.ndim != 1:
            raise ValueError(f"Subset: indices must be one-dimensional, got shape {self.indices.shape}")

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, index):
        if isinstance(index, numbers.Integral):
            return self.dataset[int(self.indices[index])]
        return self.dataset[self.indices[index]]

    def get_batch(self, indices):
        return fetch_batch(self.dataset, self.indices[indices])


class ConcatDataset(Dataset):
    """The samples of several datasets one after the other: index ``cumulative_sizes[k-1] + j`` is sample j
    of ``datasets[k]``.  A batch that falls in one dataset is fetched through that dataset's own batched path."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets should not be an empty iterable")
        for d in self.datasets:
            if not hasattr(d, "__len__") or not hasattr(d, "__getitem__"):
                raise TypeError(f"ConcatDataset: every part must be a map-style dataset (__getitem__ and __len__), "
                                f"got {type(d).__name__}")
        self.cumulative_sizes = np.cumsum([len(d) for d in self.datasets]).tolist()

    def __len__(self):
        return self.cumulative_sizes[-1]

    def _locate(self, index):
        n = len(self)
        if index < 0:
            if -index > n:
                raise ValueError(f"ConcatDataset: absolute value of index {index} should not exceed dataset "
                                 f"length {n}")
            index += n
        if index >= n:
            raise IndexError(f"ConcatDataset: index {index} is out of range for a dataset of length {n}")
        k = int(np.searchsorted(self.cumulative_sizes, index, side="right"))
        return k, index - (self.cumulative_sizes[k - 1] if k else 0)

    def __getitem__(self, index):
        k, j = self._locate(int(index))
        return self.datasets[k][j]

    def get_batch(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        located = [self._locate(int(i)) for i in indices]
        parts = {k for k, _ in located}
        if len(parts) == 1:
            k = parts.pop()
            return fetch_batch(self.datasets[k], np.asarray([j for _, j in located], dtype=np.int64))
        return collate_arrays([self.datasets[k][j] for k, j in located])


def _split_lengths(n, lengths):
    """Integer lengths from ints summing to ``n`` or fractions summing to 1 (remainder dealt round-robin)."""
    lengths = list(lengths)
    if all(isinstance(x, numbers.Integral) for x in lengths):
        if sum(lengths) != n or min(lengths) < 0:
            raise ValueError(f"random_split: lengths {lengths} must be non-negative and sum to the dataset "
                             f"length {n}")
        return [int(x) for x in lengths]
    if not math.isclose(sum(lengths), 1.0, abs_tol=1e-6) or min(lengths) < 0:
        raise ValueError(f"random_split: fractions {lengths} must be non-negative and sum to 1")
    sizes = [int(math.floor(n * f)) for f in lengths]
    for i in range(n - sum(sizes)):          # as PyTorch: the leftover samples go one each, from the first split
        sizes[i % len(sizes)] += 1
    return sizes


def random_split(dataset, lengths, generator=None, seed=None):
    """Split ``dataset`` into disjoint random ``Subset``\\ s of the given lengths (ints or fractions).

    ``generator``: a ``minidnn.Generator`` or an int seed (``seed=`` is the same); the same seed gives the
    same split on every run.  Without either the permutation comes from minidnn's default cpu generator.
    """
    n = len(dataset)
    sizes = _split_lengths(n, lengths)
    if generator is None and seed is None:
        from .. import random as _random
        order = _random.engine_for(_dev.CPU).permutation(n)
    else:
        order = as_generator(generator, seed, owner="random_split")._engine().permutation(n)
    bounds = np.cumsum([0] + sizes)
    return [Subset(dataset, order[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
