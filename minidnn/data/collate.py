"""Collation: a list of samples -> one batch, with PyTorch's ``default_collate`` rules.

Leaves are stacked along a new first axis: arrays and Tensors keep their dtype; Python ints become
int64, Python floats float32 (minidnn's default float dtype; PyTorch would give float64), bools bool.
Tuples, lists, namedtuples and dicts are collated element-/key-wise; strings and bytes stay a list.
"""
from __future__ import annotations

import collections.abc
import numbers

import numpy as np

from ..backend import devices as _dev
from ..tensor import Tensor, get_default_dtype
from ._utils import is_array, to_tensors, unwrap

__all__ = ["default_collate", "default_convert", "collate_arrays"]


def collate_arrays(samples):
    """Collate like ``default_collate`` but return raw arrays (the loader wraps them into Tensors last)."""
    if len(samples) == 0:
        raise ValueError("collate: got an empty list of samples")
    first = samples[0]
    if isinstance(first, Tensor) or is_array(first):
        arrays = [unwrap(s) for s in samples]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise ValueError(f"collate: samples have different shapes {sorted(shapes)}; pass a collate_fn "
                             "that pads them, or make the dataset return equal shapes")
        return _dev.array_module(arrays[0]).stack(arrays)
    if isinstance(first, (str, bytes)):
        return list(samples)
    if isinstance(first, np.generic):
        return np.array(samples, dtype=first.dtype)
    if isinstance(first, bool):
        return np.array(samples, dtype=np.bool_)
    if isinstance(first, numbers.Integral):
        return np.array(samples, dtype=np.int64)
    if isinstance(first, numbers.Real):
        return np.array(samples, dtype=get_default_dtype())
    if isinstance(first, collections.abc.Mapping):
        return {key: collate_arrays([s[key] for s in samples]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):      # namedtuple
        return type(first)(*(collate_arrays(list(field)) for field in zip(*samples)))
    if isinstance(first, collections.abc.Sequence):
        lengths = {len(s) for s in samples}
        if len(lengths) > 1:
            raise ValueError(f"collate: each sample must have the same number of elements, got lengths "
                             f"{sorted(lengths)}")
        columns = [collate_arrays(list(field)) for field in zip(*samples)]
        return tuple(columns) if isinstance(first, tuple) else columns
    raise TypeError(f"collate: don't know how to batch samples of type {type(first).__name__} "
                    "(expected arrays, Tensors, numbers, strings, or tuples/lists/dicts of them)")


def default_collate(samples):
    """Stack a list of samples into a batch of Tensors (nested tuples/lists/dicts are kept)."""
    return to_tensors(collate_arrays(samples))


def default_convert(data):
    """PyTorch's ``default_convert`` (the collate_fn when ``batch_size=None``): arrays become Tensors,
    nested tuples/lists/dicts are kept, everything else (numbers, strings) is returned as is."""
    return to_tensors(data)
