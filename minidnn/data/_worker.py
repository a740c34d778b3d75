"""DataLoader worker processes: the loop each worker runs, its seeding, and ``get_worker_info``.

A worker receives ``(epoch, task, indices)`` on its own index queue, fetches and collates that batch from
its copy of the dataset, and puts ``(epoch, task, batch)`` on the shared result queue, the batch as raw
NumPy arrays (Tensors are not pickled; the main process wraps them).  ``None`` on the index queue means
"exit".  The main process puts the batches back in task order, so the order never depends on which
worker finishes first.

Seeding (as PyTorch): worker ``i`` of an iterator whose base seed is ``b`` seeds minidnn's default
generators and Python's ``random`` with ``b + i``, and NumPy's global generator from
``SeedSequence([i, b])``; ``b`` is drawn from the loader's ``generator`` (or minidnn's default cpu
generator) when the epoch starts, so ``minidnn.manual_seed`` makes every worker's randomness reproducible.
"""
from __future__ import annotations

import glob
import itertools
import os
import queue
import random
import sys
import traceback
from dataclasses import dataclass

import numpy as np

__all__ = ["WorkerInfo", "get_worker_info"]

_worker_info = None
_POLL_S = 1.0          # how often an idle worker checks that its parent is still alive

# Large arrays travel through files in /dev/shm (RAM) instead of the result pipe: one write in the worker and
# one read in the main process, instead of pickling, pushing through a pipe in chunks and unpickling (about
# 3x faster for CIFAR-sized batches on 2 cores).  The main process deletes each file as it reads it; files of
# results it never reads (an abandoned epoch, a shutdown) are found by the worker's pid and deleted when the
# workers are shut down.
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
_SHM_MIN_BYTES = 1 << 16
_shm_counter = itertools.count()


@dataclass(frozen=True)
class ShmArray:
    """An array left in a /dev/shm file by a worker (what is sent instead of the array)."""
    path: str
    shape: tuple
    dtype: str


def export_array(a):
    """In a worker: a large plain array -> ShmArray (its bytes written to /dev/shm); anything else as is."""
    if (_SHM_DIR is None or type(a) is not np.ndarray or a.nbytes < _SHM_MIN_BYTES or a.dtype.hasobject):
        return a
    path = os.path.join(_SHM_DIR, f"minidnn-data-{os.getpid()}-{next(_shm_counter)}")
    with open(path, "wb") as f:
        f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
    return ShmArray(path, tuple(a.shape), a.dtype.str)


def import_array(x):
    """In the main process: a ShmArray -> the array (the file is read once and deleted); anything else as is."""
    if not isinstance(x, ShmArray):
        return x
    out = np.empty(x.shape, dtype=np.dtype(x.dtype))
    try:
        with open(x.path, "rb") as f:
            f.readinto(memoryview(out).cast("B"))
    finally:
        os.unlink(x.path)
    return out


def discard_array(x):
    if isinstance(x, ShmArray):
        try:
            os.unlink(x.path)
        except FileNotFoundError:
            pass
    return x


def remove_leftovers(pid):
    """Delete every /dev/shm file worker ``pid`` wrote that no one read (after the worker has stopped)."""
    if _SHM_DIR is not None and pid is not None:
        for path in glob.glob(os.path.join(_SHM_DIR, f"minidnn-data-{int(pid)}-*")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


@dataclass(frozen=True)
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker: its id, the number of workers, its seed and its
    copy of the dataset (use these to split an iterable source or seed per-worker randomness)."""
    id: int
    num_workers: int
    seed: int
    dataset: object


def get_worker_info():
    """This process's ``WorkerInfo`` inside a DataLoader worker; None in the main process."""
    return _worker_info


def worker_seed(base_seed, worker_id):
    return (int(base_seed) + int(worker_id)) % (1 << 64)


def seed_worker(base_seed, worker_id):
    """Seed everything a dataset may draw from in worker ``worker_id``; returns the worker's seed."""
    seed = worker_seed(base_seed, worker_id)
    import minidnn
    minidnn.manual_seed(seed)
    random.seed(seed)
    np.random.seed(np.random.SeedSequence([int(worker_id), int(base_seed)]).generate_state(4))
    return seed


class Exhausted(Exception):
    """Raised by an iterable-style fetch when this worker's copy of the dataset has no batch left."""


EXHAUSTED = "minidnn-data-worker-exhausted"      # what a worker sends back then


class WorkerError:
    """An exception raised in a worker, carried to the main process and re-raised there."""

    def __init__(self, exc, worker_id):
        self.type = type(exc)
        self.message = (f"Caught {type(exc).__name__} in DataLoader worker process {worker_id}.\n"
                        f"Original {''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))}")

    def reraise(self):
        try:
            error = self.type(self.message)
        except Exception:  # noqa: BLE001  (an exception type whose constructor wants other arguments)
            error = RuntimeError(self.message)
        raise error


def worker_loop(dataset, fetch, index_queue, result_queue, worker_id, num_workers, base_seed, init_fn,
                parent_pid, export=None):
    """Body of worker process ``worker_id`` (module level, so the 'spawn' start method can import it)."""
    global _worker_info
    try:
        seed = seed_worker(base_seed, worker_id)
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
        init_error = None
        if init_fn is not None:
            try:
                init_fn(worker_id)
            except Exception as exc:  # noqa: BLE001  (reported with the first task)
                init_error = WorkerError(exc, worker_id)
        while True:
            try:
                task = index_queue.get(timeout=_POLL_S)
            except queue.Empty:
                if os.getppid() != parent_pid:        # the main process died: don't linger as an orphan
                    return
                continue
            if task is None:
                return
            epoch, task_id, indices = task
            if init_error is not None:
                result_queue.put((epoch, task_id, init_error))
                continue
            try:
                data = fetch(dataset, indices)
                if export is not None:
                    data = export(data)
            except Exhausted:
                data = EXHAUSTED
            except Exception as exc:  # noqa: BLE001  (everything goes back to the main process)
                data = WorkerError(exc, worker_id)
            result_queue.put((epoch, task_id, data))
    except KeyboardInterrupt:
        pass
    finally:
        sys.stdout.flush()
