"""DataLoader: batches of Tensors on a device, from any map-style dataset.

The path of one batch (each step on raw arrays; Tensors are made last):

    indices -> fetch -> to device -> transform -> Tensors
    fetch: dataset.get_batch(indices)            (fast path: one fancy-indexing op for TensorDataset)
           or collate_fn([dataset[i] for i in indices])   (when a collate_fn is given, or no get_batch)

The transform sees the collated batch, so one vectorised op augments all of it, on the GPU when
``device="cuda"``.  With ``prefetch`` a background thread runs that whole path for the next batches
while the caller trains on the current one.
"""
from __future__ import annotations

import queue
import threading

import numpy as np

from ..backend import devices as _dev
from ._utils import as_generator, map_arrays, to_tensors, unwrap
from .dataset import fetch_batch

__all__ = ["DataLoader"]


class DataLoader:
    """Iterate over ``dataset`` in batches of Tensors.

    Args (PyTorch's names and defaults where PyTorch has them):
        batch_size: samples per batch.
        shuffle: a new random order each epoch (each ``iter(loader)``).
        drop_last: drop the last batch when it is smaller than ``batch_size``.
        generator / seed: the shuffle's randomness: a ``numpy.random.Generator`` or an int seed.  The same
            seed gives the same sequence of epochs; without either the order follows ``minidnn.manual_seed``.
        collate_fn: list of samples -> batch.  Giving one turns off the batched fetch fast path.
        device: where the batches go (None: cpu; ``"cuda"``: copied to the GPU).
        prefetch: False, True (2 batches ahead) or the number of batches a background thread prepares ahead.
        transform: applied to the collated, device-placed inputs of each batch: the first element of a
            tuple/list batch, or the batch itself when it is a single array.  Use the vectorised transforms
            of ``minidnn.data.transforms``.
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, drop_last=False, generator=None, seed=None,
                 collate_fn=None, device=None, prefetch=False, transform=None):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive int, got {batch_size!r}")
        if isinstance(prefetch, bool):
            prefetch = 2 if prefetch else 0
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"DataLoader: prefetch must be False, True or a non-negative int, got {prefetch!r}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.device = _dev.device(device) if device is not None else _dev.CPU
        self.prefetch = prefetch
        self.transform = transform
        # Created once so that successive epochs draw successive permutations from one stream.
        self.generator = as_generator(generator, seed, owner="DataLoader") if shuffle else None

    def __len__(self):
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        # The order is drawn here, in the caller's thread, so prefetching never changes it.
        n = len(self.dataset)
        order = self.generator.permutation(n) if self.shuffle else np.arange(n, dtype=np.int64)
        batches = self._batches(order)
        return _PrefetchIterator(batches, self.prefetch) if self.prefetch else batches

    def _batches(self, order):
        stop = len(self) * self.batch_size
        for start in range(0, stop, self.batch_size):
            yield self._make_batch(order[start:start + self.batch_size])

    def _make_batch(self, indices):
        if self.collate_fn is None:
            batch = fetch_batch(self.dataset, indices)
        else:
            batch = self.collate_fn([self.dataset[int(i)] for i in indices])
        with _dev.device_guard(self.device):         # CuPy's current device is per thread
            batch = map_arrays(lambda a: _dev.to_device(a, self.device), batch)
            if self.transform is not None:
                batch = self._apply_transform(batch)
            return to_tensors(batch)

    def _apply_transform(self, batch):
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):      # namedtuple
            return batch._replace(**{batch._fields[0]: unwrap(self.transform(batch[0]))})
        if isinstance(batch, (tuple, list)):
            return type(batch)([unwrap(self.transform(batch[0])), *batch[1:]])
        if isinstance(batch, dict):
            raise TypeError(f"DataLoader: transform= applies to the inputs of a tuple/list or single-array batch, "
                            f"got a {type(batch).__name__}; transform inside the dataset or collate_fn instead")
        return unwrap(self.transform(batch))

    def __repr__(self):
        return (f"DataLoader(len(dataset)={len(self.dataset)}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, drop_last={self.drop_last}, device='{self.device}', "
                f"prefetch={self.prefetch})")


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
