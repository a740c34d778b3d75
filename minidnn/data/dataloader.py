"""DataLoader: batches of Tensors on a device from any map-style dataset, PyTorch's arguments.

The path of one batch (each step on raw arrays; Tensors are made last):

    sampler -> batch_sampler -> indices -> fetch -> [pin] -> to device -> transform -> Tensors
    fetch: dataset.get_batch(indices)            (fast path: one fancy-indexing op for TensorDataset)
           or collate_fn([dataset[i] for i in indices])   (when a collate_fn is given, or no get_batch)

``num_workers > 0`` runs the fetch in worker processes (``_worker.py``), ``prefetch_factor`` batches ahead
each; the main process puts the batches back in sampler order, so the batches are the same as with
``num_workers=0``.  The device copy, ``transform`` and the Tensor wrapping stay in the main process.
``prefetch`` (minidnn's own) runs the whole path in a background thread instead.

Exact mid-epoch resume: ``loader.state_dict()`` (or the iterator's) records the sampler's state at the
start of the epoch, the number of batches handed out and the workers' base seed; after
``loader.load_state_dict(sd)`` the next ``iter(loader)`` yields exactly the remaining batches.
"""
from __future__ import annotations

import itertools
import multiprocessing
import numbers
import queue
import sys
import threading
import time
import warnings
import weakref

import numpy as np

from .. import random as _random
from ..backend import devices as _dev
from . import _worker
from ._utils import as_generator, map_arrays, to_tensors, unwrap
from .collate import collate_arrays
from .dataset import IterableDataset, fetch_batch
from .sampler import BatchSampler, RandomSampler, SequentialSampler, draw_seed

__all__ = ["DataLoader", "get_worker_info"]

get_worker_info = _worker.get_worker_info


class _Export:
    """In a worker: the large arrays of a batch into /dev/shm files (picklable, for 'spawn')."""

    def __call__(self, batch):
        return map_arrays(_worker.export_array, batch)


class _Fetch:
    """Indices -> collated batch of raw arrays (picklable: the 'spawn' workers receive it)."""

    def __init__(self, auto_collation, collate_fn):
        self.auto_collation, self.collate_fn = auto_collation, collate_fn

    def __call__(self, dataset, indices):
        if not self.auto_collation:
            sample = dataset[indices]
            batch = sample if self.collate_fn is None else self.collate_fn(sample)
        elif self.collate_fn is None:
            batch = fetch_batch(dataset, np.asarray(indices, dtype=np.int64))
        else:
            batch = self.collate_fn([dataset[int(i)] for i in indices])
        return map_arrays(lambda a: a, batch)            # Tensors -> their arrays (workers pickle arrays)


class _IterFetch:
    """One batch after another from a copy of an iterable-style dataset (each worker has its own); the
    ``epoch`` argument restarts the stream when a new epoch begins (persistent workers)."""

    def __init__(self, batch_size, drop_last, collate_fn):
        self.batch_size, self.drop_last, self.collate_fn = batch_size, drop_last, collate_fn
        self._epoch, self._it = None, None

    def __call__(self, dataset, epoch):
        if epoch != self._epoch:
            self._epoch, self._it = epoch, iter(dataset)
        if self.batch_size is None:
            try:
                sample = next(self._it)
            except StopIteration:
                raise _worker.Exhausted from None
            batch = sample if self.collate_fn is None else self.collate_fn(sample)
        else:
            samples = list(itertools.islice(self._it, self.batch_size))
            if not samples or (self.drop_last and len(samples) < self.batch_size):
                raise _worker.Exhausted
            batch = collate_arrays(samples) if self.collate_fn is None else self.collate_fn(samples)
        return map_arrays(lambda a: a, batch)


def _default_context():
    """'fork' on Linux: a worker starts in milliseconds and needs nothing pickled.  Our workers never touch
    the GPU (batches reach the device in the main process), which is what makes fork safe even after CUDA
    was initialised.  Elsewhere the platform default ('spawn' on macOS/Windows)."""
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


class DataLoader:
    """Iterate over ``dataset`` in batches of Tensors.

    PyTorch's arguments and defaults: ``batch_size`` (None: no batching, one sample at a time), ``shuffle``,
    ``sampler``, ``batch_sampler``, ``num_workers``, ``collate_fn``, ``pin_memory``, ``drop_last``,
    ``timeout`` (seconds to wait for a worker's batch, 0 = forever), ``worker_init_fn``,
    ``multiprocessing_context`` (default 'fork' on Linux), ``generator`` (a ``minidnn.Generator``: the
    shuffle's and the worker seeds' randomness; an int seed is accepted too), ``prefetch_factor`` (batches
    each worker prepares ahead, default 2), ``persistent_workers`` (keep the workers between epochs),
    ``in_order`` (always True here).

    minidnn's own, keyword-only: ``seed`` (same as ``generator=int``), ``device`` (where the batches go:
    "cuda" copies them to the GPU, asynchronously from page-locked buffers with ``pin_memory``),
    ``prefetch`` (False, True or a number of batches a background thread prepares ahead, with
    ``num_workers=0``), ``transform`` (applied to the collated, device-placed inputs of each batch: the first
    element of a tuple/list batch, or the batch itself when it is a single array).
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True, seed=None, device=None, prefetch=False, transform=None):
        where = "DataLoader"
        iterable = isinstance(dataset, IterableDataset)
        if iterable:
            for name, value in (("shuffle", shuffle), ("sampler", sampler), ("batch_sampler", batch_sampler)):
                if value not in (None, False):
                    raise ValueError(f"{where}: DataLoader with IterableDataset: expected unspecified {name} "
                                     f"option, but got {name}={value!r}")
        elif not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(f"{where}: dataset must be map-style (__getitem__ and __len__) or an IterableDataset, "
                            f"got {type(dataset).__name__}")
        if sampler is not None and not hasattr(sampler, "__iter__"):
            raise TypeError(f"{where}: sampler must be iterable (a Sampler or a sequence of indices), got "
                            f"{type(sampler).__name__}")
        if batch_sampler is not None and not hasattr(batch_sampler, "__iter__"):
            raise TypeError(f"{where}: batch_sampler must be iterable (yielding lists of indices), got "
                            f"{type(batch_sampler).__name__}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral) or num_workers < 0:
            raise ValueError(f"{where}: num_workers option should be a non-negative int; use num_workers=0 to "
                             f"disable multiprocessing (got {num_workers!r})")
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout < 0:
            raise ValueError(f"{where}: timeout option should be non-negative, got {timeout!r}")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(f"{where}: prefetch_factor option could only be specified in multiprocessing; let "
                             "num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None")
        if prefetch_factor is None:
            prefetch_factor = 2 if num_workers > 0 else None
        elif isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, numbers.Integral) or \
                prefetch_factor < 1:
            raise ValueError(f"{where}: prefetch_factor should be a positive int, got {prefetch_factor!r}")
        if persistent_workers and num_workers == 0:
            raise ValueError(f"{where}: persistent_workers option needs num_workers > 0")
        if not in_order:
            raise ValueError(f"{where}: in_order=False is not supported (batches always come in sampler order)")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral)
                                       or batch_size < 1):
            raise ValueError(f"{where}: batch_size should be a positive integer value or None, got {batch_size!r}")
        if sampler is not None and shuffle:
            raise ValueError(f"{where}: sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            raise ValueError(f"{where}: batch_sampler option is mutually exclusive with batch_size, shuffle, "
                             "sampler, and drop_last")
        if batch_size is None and drop_last:
            raise ValueError(f"{where}: batch_size=None option disables auto-batching and is mutually exclusive "
                             "with drop_last")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"{where}: collate_fn must be callable, got {type(collate_fn).__name__}")
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(f"{where}: worker_init_fn must be callable, got {type(worker_init_fn).__name__}")
        if isinstance(prefetch, bool):
            prefetch = 2 if prefetch else 0
        if isinstance(prefetch, bool) or not isinstance(prefetch, numbers.Integral) or prefetch < 0:
            raise ValueError(f"{where}: prefetch must be False, True or a non-negative int, got {prefetch!r}")
        if prefetch and num_workers:
            raise ValueError(f"{where}: prefetch= (a background thread) and num_workers > 0 (processes, "
                             f"prefetch_factor ahead) are two ways of loading ahead; pick one")
        if isinstance(multiprocessing_context, str):
            multiprocessing_context = multiprocessing.get_context(multiprocessing_context)
        if num_workers > 0 and _holds_gpu_arrays(dataset):
            raise ValueError(f"{where}: the dataset holds GPU arrays, which worker processes cannot read; use "
                             "num_workers=0 (a GPU-resident dataset needs no workers) or keep it on the cpu")
        self.dataset = dataset
        self.num_workers = int(num_workers)
        self.prefetch_factor = prefetch_factor
        self.pin_memory = bool(pin_memory)
        self.pin_memory_device = pin_memory_device
        self.timeout = float(timeout)
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = bool(persistent_workers)
        self.in_order = True
        self.device = _dev.device(device) if device is not None else _dev.CPU
        self.prefetch = int(prefetch)
        self.transform = transform
        self.generator = None if generator is None and seed is None else as_generator(generator, seed,
                                                                                       owner=where)
        self._iterable = iterable
        if iterable:
            pass
        elif batch_sampler is None:
            if sampler is None:
                sampler = (RandomSampler(dataset, generator=self.generator) if shuffle
                           else SequentialSampler(dataset))
            if batch_size is not None:
                batch_sampler = BatchSampler(sampler, int(batch_size), bool(drop_last))
        else:
            batch_size, drop_last = None, False
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self.sampler = sampler if sampler is not None else getattr(batch_sampler, "sampler", None)
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn
        self._fetch = (_IterFetch(batch_size, bool(drop_last), collate_fn) if iterable
                       else _Fetch(batch_sampler is not None, collate_fn))
        self._pool = None             # persistent workers
        self._iterator = None         # a weak reference to the latest iterator (for state_dict)
        self._last_state = None       # the state the latest iterator left when it closed
        self._resume = None           # a state loaded by load_state_dict, used by the next iter()
        self._pin = self.pin_memory and _pin_possible()
        if self.pin_memory and not self._pin:
            warnings.warn("DataLoader: pin_memory=True but no CUDA GPU with CuPy is available, so page-locked "
                          "memory won't be used", stacklevel=2)

    @property
    def _index_sampler(self):
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def __len__(self):
        if self._iterable:
            n = len(self.dataset)            # a TypeError where the stream has no length, as in PyTorch
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self._index_sampler)

    def __iter__(self):
        resume, self._resume = self._resume, None
        if self._pool is not None and not self._pool.alive():       # a persistent worker died: start afresh
            self._pool.shutdown()
            self._pool = None
        it = _LoaderIter(self, resume)
        # weakly: a caller breaking out of its loop must free the iterator (and stop its thread or workers)
        self._iterator, self._last_state = weakref.ref(it), None
        return it

    def state_dict(self):
        """Where the latest epoch is: resume it with ``load_state_dict`` then ``iter()``."""
        it = self._iterator() if self._iterator is not None else None
        if it is not None:
            return it.state_dict()
        if self._last_state is not None:
            return dict(self._last_state)
        return {"sampler": None, "batches": 0, "base_seed": None, "finished": True, "transform": None}

    def load_state_dict(self, state_dict):
        """The next ``iter(loader)`` continues the saved epoch with exactly the batches it had left."""
        _check_loader_state(state_dict, self)
        self._resume = state_dict

    def _apply_transform(self, batch):
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):      # namedtuple
            return batch._replace(**{batch._fields[0]: unwrap(self.transform(batch[0]))})
        if isinstance(batch, (tuple, list)):
            return type(batch)([unwrap(self.transform(batch[0])), *batch[1:]])
        if isinstance(batch, dict):
            raise TypeError(f"DataLoader: transform= applies to the inputs of a tuple/list or single-array batch, "
                            f"got a {type(batch).__name__}; transform inside the dataset or collate_fn instead")
        return unwrap(self.transform(batch))

    def _finish(self, batch):
        """A fetched batch of raw arrays -> pinned / on the device -> transformed -> Tensors."""
        pin = self._pin
        with _dev.device_guard(self.device):         # CuPy's current device is per thread
            if self.device.type == "cuda":
                if pin:
                    from ..backend import pinned
                    batch = map_arrays(lambda a: pinned.copy_to_device_async(a, self.device)
                                       if isinstance(a, np.ndarray) else a, batch)
                else:
                    batch = map_arrays(lambda a: _dev.to_device(a, self.device), batch)
            elif pin:
                from ..backend import pinned
                batch = map_arrays(lambda a: pinned.pin_array(a) if isinstance(a, np.ndarray) else a, batch)
            if self.transform is not None:
                batch = self._apply_transform(batch)
            return to_tensors(batch)

    def __del__(self):
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.shutdown()

    def __repr__(self):
        return (f"DataLoader(len(dataset)={len(self.dataset)}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, drop_last={self.drop_last}, num_workers={self.num_workers}, "
                f"device='{self.device}', prefetch={self.prefetch})")


def _stateful(sampler):
    if isinstance(sampler, BatchSampler):
        return hasattr(sampler.sampler, "state_dict")
    return hasattr(sampler, "state_dict")


def _pin_possible():
    return _dev.cuda_is_available()


def _holds_gpu_arrays(dataset):
    return any(_dev.is_cuda_array(a) for a in getattr(dataset, "tensors", ()) or ())


_STATE_KEYS = {"sampler", "batches", "base_seed", "finished", "transform"}


def _transform_generators(transform):
    """The ``minidnn.Generator`` objects a transform draws from (its own ``generator``, and those of the
    transforms it composes), in a fixed order: their states go into the loader's state."""
    from .. import random as _random
    found, stack, seen = [], [transform], set()
    while stack:
        t = stack.pop(0)
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        g = getattr(t, "generator", None)
        if isinstance(g, _random.Generator):
            found.append(g)
        inner = getattr(t, "transforms", None)
        if isinstance(inner, (list, tuple)):
            stack = list(inner) + stack
    return found


def _check_loader_state(sd, loader):
    if not isinstance(sd, dict) or set(sd) != _STATE_KEYS:
        raise ValueError(f"DataLoader.load_state_dict: expected a dict with keys {sorted(_STATE_KEYS)}, got "
                         f"{sd!r:.200}")
    batches = sd["batches"]
    if isinstance(batches, bool) or not isinstance(batches, numbers.Integral) or batches < 0:
        raise ValueError(f"DataLoader.load_state_dict: batches must be a non-negative int, got {batches!r}")
    if (not loader._iterable or hasattr(loader.dataset, "__len__")) and batches > len(loader):
        raise ValueError(f"DataLoader.load_state_dict: {batches} batches were handed out but an epoch of this "
                         f"loader has only {len(loader)}")
    states = sd["transform"]
    gens = _transform_generators(loader.transform)
    if states is not None and len(states) != len(gens):
        raise ValueError(f"DataLoader.load_state_dict: the state holds {len(states)} transform generator states, "
                         f"this loader's transform has {len(gens)} generators")
    if sd["sampler"] is not None and not hasattr(loader._index_sampler, "load_state_dict"):
        raise TypeError(f"DataLoader.load_state_dict: the state holds a sampler state but this loader's "
                        f"{type(loader._index_sampler).__name__} has no load_state_dict")


class _LoaderIter:
    """One epoch of a DataLoader (or the rest of one, after ``load_state_dict``)."""

    def __init__(self, loader, resume=None):
        self._loader = loader
        self._delivered = 0
        self._finished = self._stopped = False
        self._prefetcher = None
        self._pool = None
        self._owns_pool = False
        index_sampler = loader._index_sampler if not loader._iterable else None
        self._generators = _transform_generators(loader.transform)
        self._transform_state = None
        skip = 0
        if resume is not None and not resume["finished"]:
            if resume["transform"] is not None:
                # (a checkpoint loaded with map_location="cuda" may hold the states as GPU arrays or Tensors)
                states = [_random._state_array(st, "DataLoader.load_state_dict") for st in resume["transform"]]
                for g, st in zip(self._generators, states):
                    g.set_state(st)
                self._transform_state = [st.copy() for st in states]
            if resume["sampler"] is not None:
                index_sampler.load_state_dict(resume["sampler"])
            skip = int(resume["batches"])
            self._base_seed = resume["base_seed"]
        else:
            self._base_seed = None
        if self._base_seed is None:
            # drawn whether or not there are workers, so num_workers never changes the random streams
            self._base_seed = draw_seed(loader.generator)
        if loader._iterable:
            self._indices, self._sampler_state = None, None
        else:
            self._indices = iter(index_sampler)
            # the epoch's start: resume loads it and skips the batches handed out (None: a sampler without state)
            self._sampler_state = index_sampler.state_dict() if _stateful(index_sampler) else None
            for _ in range(skip):
                next(self._indices)
        self._delivered = skip
        if self._transform_state is None and self._generators:       # before any batch is transformed
            self._transform_state = [g.get_state().numpy().copy() for g in self._generators]
        if loader._iterable:
            # a stream has no index to skip to: its first `skip` batches are fetched again and dropped
            raw = self._from_workers(raw=True) if loader.num_workers > 0 else _stream_batches(loader)
            batches = (loader._finish(b) for b in itertools.islice(raw, skip, None))
        elif loader.num_workers > 0:
            batches = self._from_workers()
        else:
            batches = (loader._finish(loader._fetch(loader.dataset, idx)) for idx in self._indices)
        # each batch travels with the transform generators' states right after it was transformed, so the
        # state handed out matches the batches delivered even when a thread transforms ahead
        self._batches = _with_states(batches, self._generators)
        if loader.prefetch:
            self._prefetcher = _PrefetchIterator(self._batches, loader.prefetch)

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._loader)

    def __next__(self):
        if self._finished or self._stopped:
            raise StopIteration
        try:
            batch, self._transform_state = next(self._prefetcher if self._prefetcher is not None
                                                else self._batches)
        except StopIteration:
            self._finished = True
            self._close()
            raise
        except BaseException:
            self._close()
            raise
        self._delivered += 1
        return batch

    def state_dict(self):
        """The epoch's sampler state at its start, the batches handed out so far, the workers' base seed."""
        if self._finished:
            return {"sampler": None, "batches": 0, "base_seed": None, "finished": True, "transform": None}
        # persistent workers keep the seed they were started with, so that is the one a resumed run needs
        base_seed = self._pool.base_seed if self._pool is not None else self._base_seed
        return {"sampler": self._sampler_state, "batches": self._delivered, "base_seed": base_seed,
                "finished": False, "transform": self._transform_state}

    # -- workers -----------------------------------------------------------------------------------------
    def _from_workers(self, raw=False):
        loader = self._loader
        if loader.persistent_workers:
            if loader._pool is None:
                loader._pool = _WorkerPool(loader, self._base_seed)
            self._pool = loader._pool
        else:
            self._pool = _WorkerPool(loader, self._base_seed)
            self._owns_pool = True
        if raw:
            return _stream_worker_batches(loader, self._pool)
        return _worker_batches(loader, self._indices, self._pool)

    def close(self):
        """Stop the prefetch thread or the (non-persistent) workers now; the state stays where it is."""
        self._close()
        self._stopped = True

    def _close(self):
        if self._prefetcher is not None:
            self._prefetcher.close()
        if self._owns_pool and self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._loader._last_state = self.state_dict()

    def __del__(self):
        try:
            self._close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass


def _with_states(batches, generators):
    for batch in batches:
        yield batch, ([g.get_state().numpy().copy() for g in generators] if generators else None)


def _worker_batches(loader, indices_iter, pool):
    """The epoch's batches from the workers, in sampler order (a function, not a method: holding the
    iterator here would make a reference cycle and delay its cleanup until the garbage collector runs)."""
    epoch = pool.new_epoch()
    ahead = loader.prefetch_factor * pool.num_workers
    sent = received = 0
    buffer = {}
    exhausted = False
    try:
        while True:
            while not exhausted and sent - received < ahead:
                try:
                    indices = next(indices_iter)
                except StopIteration:
                    exhausted = True
                    break
                pool.send(sent, (epoch, sent, indices))
                sent += 1
            if received == sent:
                return
            while received not in buffer:
                if pool.epoch != epoch:
                    raise RuntimeError("DataLoader: this iterator was superseded by a newer iter(loader) on the same "
                                       "persistent workers; iterate one epoch at a time")
                ep, task, data = pool.receive(loader.timeout)
                if ep == epoch:
                    buffer[task] = data
                else:                                  # a result of an abandoned epoch
                    _discard(data)
            data = buffer.pop(received)
            received += 1
            if isinstance(data, _worker.WorkerError):
                data.reraise()
            yield loader._finish(map_arrays_any(_worker.import_array, data))
    finally:
        for data in buffer.values():                   # received but never handed out
            _discard(data)


def _stream_batches(loader):
    """The raw batches of an iterable-style dataset, in this process."""
    fetch = _IterFetch(loader.batch_size, loader.drop_last, loader.collate_fn)
    while True:
        try:
            yield fetch(loader.dataset, 0)
        except _worker.Exhausted:
            return


def _stream_worker_batches(loader, pool):
    """Raw batches of an iterable-style dataset from the workers, each iterating its own copy: worker 0's first
    batch, worker 1's first, worker 0's second, ...; a worker whose copy is exhausted drops out (PyTorch's order).
    Requests are sent and exhaustion is noticed only at hand-out points, so the order never depends on timing."""
    epoch = pool.new_epoch()
    active = set(range(pool.num_workers))
    ahead = loader.prefetch_factor * pool.num_workers
    pending = []                # (task, worker) in hand-out order
    buffer = {}
    task = next_worker = 0
    try:
        while True:
            while active and len(pending) < ahead:
                worker = next(w % pool.num_workers for w in range(next_worker, next_worker + pool.num_workers)
                              if w % pool.num_workers in active)
                next_worker = worker + 1
                pool.send_to(worker, (epoch, task, epoch))
                pending.append((task, worker))
                task += 1
            if not pending:
                return
            want, worker = pending.pop(0)
            while want not in buffer:
                if pool.epoch != epoch:
                    raise RuntimeError("DataLoader: this iterator was superseded by a newer iter(loader) on the "
                                       "same persistent workers; iterate one epoch at a time")
                ep, got, data = pool.receive(loader.timeout)
                if ep == epoch:
                    buffer[got] = data
                else:
                    _discard(data)
            data = buffer.pop(want)
            if isinstance(data, str) and data == _worker.EXHAUSTED:
                active.discard(worker)       # requests already queued to it answer EXHAUSTED too
                continue
            if isinstance(data, _worker.WorkerError):
                data.reraise()
            yield map_arrays_any(_worker.import_array, data)
    finally:
        for data in buffer.values():
            _discard(data)


def _discard(data):
    if not isinstance(data, (_worker.WorkerError, str)):
        map_arrays_any(_worker.discard_array, data)


def map_arrays_any(fn, batch):
    """``fn`` on every leaf of a nested tuple/list/dict batch that is an array or a ShmArray."""
    if isinstance(batch, _worker.ShmArray):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_arrays_any(fn, v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(map_arrays_any(fn, v) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_arrays_any(fn, v) for v in batch)
    return batch


class _WorkerPool:
    """``num_workers`` processes, one index queue each and one shared result queue."""

    def __init__(self, loader, base_seed):
        ctx = loader.multiprocessing_context or _default_context()
        self.num_workers = loader.num_workers
        self.base_seed = base_seed
        self._epoch = 0
        self._results = ctx.Queue()
        self._index_queues, self._workers = [], []
        import os
        for wid in range(self.num_workers):
            iq = ctx.Queue()
            w = ctx.Process(target=_worker.worker_loop, name=f"minidnn-data-worker-{wid}",
                            args=(loader.dataset, loader._fetch, iq, self._results, wid, self.num_workers,
                                  base_seed, loader.worker_init_fn, os.getpid(), _Export()), daemon=True)
            w.start()
            self._index_queues.append(iq)
            self._workers.append(w)
        self._shut = False

    def alive(self):
        return not self._shut and all(w.is_alive() for w in self._workers)

    def new_epoch(self):
        self._epoch += 1             # results of an abandoned earlier epoch are recognised and dropped
        return self._epoch

    @property
    def epoch(self):
        return self._epoch

    def send(self, task, item):
        self._index_queues[task % self.num_workers].put(item)

    def send_to(self, worker, item):
        self._index_queues[worker].put(item)

    def receive(self, timeout):
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while True:
            wait = _POLL_S if deadline is None else min(_POLL_S, max(deadline - time.monotonic(), 0.0))
            try:
                return self._results.get(timeout=wait)
            except queue.Empty:
                dead = [w for w in self._workers if not w.is_alive()]
                if dead:
                    self.shutdown()
                    raise RuntimeError("DataLoader worker (pid(s) " + ", ".join(str(w.pid) for w in dead) +
                                       ") exited unexpectedly (exit codes " +
                                       ", ".join(str(w.exitcode) for w in dead) + ")") from None
                if deadline is not None and time.monotonic() >= deadline:
                    self.shutdown()
                    raise RuntimeError(f"DataLoader timed out after {timeout} seconds") from None

    def shutdown(self):
        if self._shut:
            return
        self._shut = True
        for iq in self._index_queues:
            try:
                iq.put(None)
            except Exception:  # noqa: BLE001
                pass
        for w in self._workers:
            w.join(timeout=1.0)          # an idle worker exits at once; a busy one is not waited for
            if w.is_alive():
                w.terminate()
                w.join(timeout=1)
        while True:                               # results never read: delete their /dev/shm files
            try:
                _discard(self._results.get_nowait()[2])
            except (queue.Empty, OSError, ValueError, EOFError):
                break
        for w in self._workers:
            _worker.remove_leftovers(w.pid)
        for q in (*self._index_queues, self._results):
            q.cancel_join_thread()
            q.close()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001
            pass


_BATCH, _END, _ERROR = "batch", "end", "error"


class _PrefetchIterator:
    """Runs a batch generator in a daemon thread, ``depth`` batches ahead, through a bounded queue.

    Shutdown: ``close()`` (called on exhaustion, on error, when the caller breaks out of its loop and the
    iterator is garbage-collected, or explicitly) sets a stop flag; the worker checks it between batches
    and while waiting for room in the queue, so it exits within one batch.  A worker exception is sent
    through the queue and re-raised in the caller's thread with its original traceback.
    """

    def __init__(self, batches, depth):
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        # The worker gets the queue and the flag, never ``self``: holding the iterator would keep it alive,
        # and then a caller that breaks out of its loop would never trigger ``__del__`` -> ``close()``.
        self._thread = threading.Thread(target=_produce, args=(batches, self._queue, self._stop),
                                        name="minidnn-data-prefetch", daemon=True)
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        while True:
            try:
                kind, payload = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self.close()
                    raise RuntimeError("DataLoader: the prefetch thread stopped without finishing its epoch")
        if kind == _BATCH:
            return payload
        self.close()
        if kind == _ERROR:
            raise payload
        raise StopIteration

    def close(self):
        """Stop the worker thread and wait for it (at most the time of one batch)."""
        self._done = True
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown: threading may already be gone)
            pass


_POLL_S = 0.05      # how often a waiting thread checks whether the other side has gone


def _produce(batches, out, stop):
    """Worker body: put each batch, then an end (or error) marker, into ``out`` until ``stop`` is set."""

    def put(item):
        while not stop.is_set():
            try:
                out.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False

    try:
        for batch in batches:
            if not put((_BATCH, batch)):
                return
        put((_END, None))
    except BaseException as exc:  # noqa: BLE001  (everything goes back to the caller's thread)
        put((_ERROR, exc))
    finally:
        batches.close()
