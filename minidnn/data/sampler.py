"""Samplers: which dataset indices an epoch visits, and in which order (PyTorch's ``torch.utils.data.sampler``).

``SequentialSampler``, ``RandomSampler``, ``SubsetRandomSampler``, ``WeightedRandomSampler`` yield indices;
``BatchSampler`` groups another sampler's indices into lists.  Randomness comes from a ``minidnn.Generator``
(``generator=``); without one, each epoch draws a fresh seed from minidnn's default cpu generator, so
``minidnn.manual_seed`` makes the epochs reproducible, as in PyTorch.

Exact mid-epoch resume: every sampler here has ``state_dict()`` / ``load_state_dict()``.  The state is
what fixes the epoch's order (the seed it drew, or its generator's state at the start of the epoch) plus
how many indices were handed out; after ``load_state_dict`` the next ``iter()`` rebuilds the same order
and yields only the rest.  The epoch's randomness is drawn when ``iter()`` is called (not at the first
``next()``), so a state taken right after ``iter()`` already pins the epoch down.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import random as _random
from ..backend import devices as _dev

__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler",
           "BatchSampler"]


class Sampler:
    """Base class: subclasses implement ``__iter__`` (indices) and usually ``__len__``."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


def _check_generator(generator, owner):
    if generator is not None and not isinstance(generator, _random.Generator):
        raise TypeError(f"{owner}: generator must be a minidnn.Generator or None, got {type(generator).__name__}")
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"{owner}: samplers draw on the cpu; got a generator on {generator.device}")
    return generator


def _check_bool(value, name, owner, error=TypeError):
    if not isinstance(value, bool):
        raise error(f"{owner}: {name} should be a boolean value, but got {name}={value!r}")


def _check_positive_int(value, name, owner):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{owner}: {name} should be a positive integer value, but got {name}={value!r}")


def draw_seed(generator=None) -> int:
    """A 63-bit seed drawn from ``generator`` (default: minidnn's default cpu generator)."""
    return int(_random.engine_for(_dev.CPU, generator).integers(0, 1 << 63))


class _ResumableSampler(Sampler):
    """Common machinery: ``_order(epoch)`` builds the epoch's whole index array from the epoch record
    (what ``_new_epoch`` drew); iteration yields from it and counts; state = (epoch record, count)."""

    _epoch = None          # the record of the epoch in progress (None before the first iter())
    _yielded = 0
    _pending = None        # (record, yielded) loaded by load_state_dict, used by the next iter()

    def _new_epoch(self):
        """Draw what fixes this epoch's order; returns a picklable record of it."""
        generator = getattr(self, "generator", None)
        if generator is None:
            return {"seed": draw_seed()}
        return {"generator_state": generator.get_state().numpy().copy()}

    def _epoch_generator(self, record):
        """The generator positioned at the start of the epoch ``record`` describes."""
        if "seed" in record:
            return _random.Generator().manual_seed(record["seed"])
        self.generator.set_state(record["generator_state"])
        return self.generator

    def _order(self, record):
        raise NotImplementedError

    def __iter__(self):
        if self._pending is not None:
            record, skip = self._pending
            self._pending = None
        else:
            record, skip = None, 0
        if record is None:
            record = self._new_epoch()
        order = self._order(record)
        self._epoch, self._yielded = record, skip
        return self._yield_from(order, skip)

    def _yield_from(self, order, skip):
        for i in order[skip:].tolist():
            self._yielded += 1
            yield i

    def state_dict(self):
        """The epoch in progress and how many of its indices were handed out."""
        return {"epoch": None if self._epoch is None else dict(self._epoch), "yielded": int(self._yielded)}

    def load_state_dict(self, state_dict):
        """The next ``iter()`` continues the saved epoch after its ``yielded`` indices."""
        owner = type(self).__name__
        if not isinstance(state_dict, dict) or set(state_dict) != {"epoch", "yielded"}:
            raise ValueError(f"{owner}.load_state_dict: expected a dict with keys 'epoch' and 'yielded', got "
                             f"{state_dict!r:.200}")
        record, yielded = state_dict["epoch"], state_dict["yielded"]
        if isinstance(yielded, bool) or not isinstance(yielded, numbers.Integral) or yielded < 0:
            raise ValueError(f"{owner}.load_state_dict: yielded must be a non-negative int, got {yielded!r}")
        if record is None:
            if yielded:
                raise ValueError(f"{owner}.load_state_dict: yielded={yielded} but no epoch was recorded")
        elif not isinstance(record, dict) or not ({"seed"} == set(record) or {"generator_state"} == set(record)):
            raise ValueError(f"{owner}.load_state_dict: epoch must hold 'seed' or 'generator_state', got "
                             f"{record!r:.200}")
        elif "generator_state" in record:
            if getattr(self, "generator", None) is None:
                raise ValueError(f"{owner}.load_state_dict: the state was saved with a generator= but this "
                                 "sampler has none")
            record = {"generator_state": _random._state_array(record["generator_state"],
                                                              f"{owner}.load_state_dict")}
            _random._rng.decode_state(record["generator_state"], f"{owner}.load_state_dict")
        if record is not None and yielded > len(self):
            raise ValueError(f"{owner}.load_state_dict: yielded={yielded} is more than the {len(self)} indices "
                             "of an epoch")
        self._pending = (record, int(yielded))


class SequentialSampler(_ResumableSampler):
    """``0, 1, ..., len(data_source) - 1``."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __len__(self):
        return len(self.data_source)

    def _new_epoch(self):
        return {"seed": 0}           # nothing random: any record will do

    def _order(self, record):
        return np.arange(len(self.data_source), dtype=np.int64)


class RandomSampler(_ResumableSampler):
    """A random order of the dataset each epoch; with ``replacement`` ``num_samples`` independent draws."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        _check_bool(replacement, "replacement", "RandomSampler")
        if num_samples is not None:
            _check_positive_int(num_samples, "num_samples", "RandomSampler")
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = _check_generator(generator, "RandomSampler")

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __len__(self):
        return self.num_samples

    def _order(self, record):
        n, k = len(self.data_source), self.num_samples
        if n == 0:
            if k and self._num_samples is not None:
                raise ValueError(f"RandomSampler: cannot draw num_samples={k} from an empty dataset")
            return np.zeros(0, dtype=np.int64)
        eng = self._epoch_generator(record)._engine()
        if self.replacement:
            return eng.integers(0, n, size=k, dtype=np.int64)
        parts = [eng.permutation(n) for _ in range(k // n)]
        if k % n:
            parts.append(eng.permutation(n)[:k % n])
        return np.concatenate(parts).astype(np.int64, copy=False)


class SubsetRandomSampler(_ResumableSampler):
    """The given ``indices`` in a random order each epoch."""

    def __init__(self, indices, generator=None):
        self.indices = indices
        self.generator = _check_generator(generator, "SubsetRandomSampler")

    def __len__(self):
        return len(self.indices)

    def _order(self, record):
        perm = self._epoch_generator(record)._engine().permutation(len(self.indices))
        return np.asarray([self.indices[i] for i in perm.tolist()], dtype=np.int64)


class WeightedRandomSampler(_ResumableSampler):
    """``num_samples`` indices drawn with probabilities proportional to ``weights`` (need not sum to 1)."""

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        _check_positive_int(num_samples, "num_samples", "WeightedRandomSampler")
        _check_bool(replacement, "replacement", "WeightedRandomSampler", ValueError)     # PyTorch's type
        from ..tensor import Tensor
        w = weights.data if isinstance(weights, Tensor) else weights
        w = np.asarray(_dev.to_device(w, _dev.CPU) if _dev.is_cuda_array(w) else w, dtype=np.float64)
        if w.ndim != 1:
            raise ValueError(f"WeightedRandomSampler: weights should be a 1d sequence but given weights have "
                             f"shape {tuple(w.shape)}")
        self.weights = w
        self.num_samples = int(num_samples)
        self.replacement = replacement
        self.generator = _check_generator(generator, "WeightedRandomSampler")
        # the distribution is checked now, not at the first epoch
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0 or (not replacement and
                                                                            num_samples > len(w)):
            raise ValueError(f"WeightedRandomSampler: weights must be finite, non-negative with a positive sum"
                             f"{'' if replacement else ', and at least num_samples of them'}; got "
                             f"{len(w)} weights (min {w.min() if len(w) else None}, sum {w.sum()}) for "
                             f"num_samples={num_samples}, replacement={replacement}")

    def __len__(self):
        return self.num_samples

    def _order(self, record):
        eng = self._epoch_generator(record)._engine()
        return _random.multinomial_indices(self.weights, self.num_samples, self.replacement, eng,
                                           where="WeightedRandomSampler")


class BatchSampler(Sampler):
    """Lists of ``batch_size`` indices from ``sampler``; the last shorter one is dropped with ``drop_last``."""

    def __init__(self, sampler, batch_size, drop_last):
        _check_positive_int(batch_size, "batch_size", "BatchSampler")
        _check_bool(drop_last, "drop_last", "BatchSampler", ValueError)      # PyTorch's types, both

        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.drop_last = drop_last

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        indices = iter(self.sampler)     # now: the epoch's randomness is drawn at iter(), not at next()
        return self._batches(indices)

    def _batches(self, indices):
        batch = []
        for i in indices:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def state_dict(self):
        """The inner sampler's state: it has handed out exactly the indices of the batches yielded."""
        return {"sampler": _sampler_state(self.sampler, "BatchSampler")}

    def load_state_dict(self, state_dict):
        if not isinstance(state_dict, dict) or set(state_dict) != {"sampler"}:
            raise ValueError(f"BatchSampler.load_state_dict: expected a dict with key 'sampler', got "
                             f"{state_dict!r:.200}")
        load = getattr(self.sampler, "load_state_dict", None)
        if load is None:
            raise TypeError(f"BatchSampler.load_state_dict: its sampler {type(self.sampler).__name__} has no "
                            "load_state_dict")
        load(state_dict["sampler"])


def _sampler_state(sampler, owner):
    get = getattr(sampler, "state_dict", None)
    if get is None:
        raise TypeError(f"{owner}.state_dict: its sampler {type(sampler).__name__} has no state_dict, so a "
                        "mid-epoch position cannot be saved")
    return get()
