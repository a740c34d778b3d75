"""How many threads the CPU libraries under minidnn use: ``set_num_threads`` / ``get_num_threads``.

minidnn's CPU time is spent in NumPy's BLAS (OpenBLAS or MKL) and, where present, OpenMP.  Their own
default is one thread per logical CPU, busy-waiting between calls.  That is right for one big product on
an idle machine and very wrong for what minidnn runs: many small products, often on a laptop or a
2-core CI box that something else is also using.  Measured on a 2-core machine with one other busy
process (docs/threads.md): a LeNet epoch went from 0.40 s to 1.9-3.9 s with two BLAS threads, and
stayed at 0.3-0.5 s with one.

The default, applied when minidnn is imported (docs/threads.md has the measurements behind it):

* if the user already chose (``MINIDNN_NUM_THREADS``, or any of ``OMP_NUM_THREADS``,
  ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``), that choice stands: minidnn changes nothing, except
  that ``MINIDNN_NUM_THREADS`` is applied through threadpoolctl;
* otherwise half the CPUs this process may run on (``os.sched_getaffinity``), at least 1, at most 8:
  1 on a 2-core machine, 4 on an 8-core laptop.  The other half stays free for the data loader, the
  notebook kernel, or whatever else runs beside, so a busy machine slows minidnn down gracefully instead
  of by 5x.

The limit is set through threadpoolctl (a maintained library that finds every BLAS/OpenMP runtime loaded
in the process and calls its own API), not through environment variables, which only work before the
library is loaded.  ``set_num_threads`` re-scans, so libraries loaded later (CuPy, PyTorch's OpenMP) are
covered from the next call on.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from concurrent.futures import wait

__all__ = ["set_num_threads", "get_num_threads", "default_num_threads", "parallel_map", "parallel_parts",
           "parallel_for", "parallel_pair", "blas_threads_for", "MIN_PARALLEL_WORK", "MIN_PARALLEL_BLAS_WORK",
           "MIN_PAIR_WORK", "MAX_PAIR_WORK", "split_spans", "parallel_spans", "MIN_SPLIT_WORK",
           "blas_small_kernels"]

_USER_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_MAX_DEFAULT = 8


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):         # not Linux
        return os.cpu_count() or 1


def default_num_threads() -> int:
    """Half the CPUs available to this process, between 1 and 8 (see the module docstring)."""
    return max(1, min(_MAX_DEFAULT, _available_cpus() // 2))


def _controller():
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController()


def set_num_threads(n: int) -> None:
    """Use at most ``n`` threads in every BLAS and OpenMP runtime loaded in this process, and in minidnn's own
    loops (PyTorch's ``torch.set_num_threads``).  ``n`` must be a positive int.

    Like PyTorch's ``parallel_for`` grain size, small work stays on one thread: minidnn's loops share out only work
    above MIN_PARALLEL_WORK, and BLAS is left at one thread between products, the backend's products of at least
    MIN_PARALLEL_BLAS_WORK multiply-adds getting all ``n`` (``blas_threads_for``; docs/threads.md)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: n must be a positive int, got {n!r}")
    controller = _controller()
    controller.limit(limits=int(n))
    _current[0] = int(n)
    _pair_rest[0] = 0.0                      # a new count: pairs and splits try the cores again at once
    _blas_setters[:] = [f for f in (_thread_setter(lib) for lib in controller.lib_controllers
                                    if lib.user_api == "blas") if f is not None]
    for setter in _blas_setters:
        setter(1 if n > 1 else n)


def get_num_threads() -> int:
    """The thread count minidnn works with: the last ``set_num_threads`` (or the default applied at import).  Where
    the user chose through ``OMP_NUM_THREADS`` and friends instead, the largest limit among the loaded BLAS
    runtimes (1 if none)."""
    if _current[0] is not None:
        return _current[0]
    infos = [lib.num_threads for lib in _controller().lib_controllers if lib.user_api == "blas"]
    return max(infos) if infos else 1


# ---- the BLAS grain ----------------------------------------------------------------------------------------
#
# OpenBLAS runs any product above ~262k multiply-adds on all its threads, and its worker threads then busy-wait
# for the next product for about 0.1 s.  A training step of small products thus keeps a second core spinning all
# the time: on a 2-core machine that another process also uses, the spinning worker and the thread it waits for
# take turns on one core (the digits epoch went from 0.19 s on one thread to 0.8-1.2 s on two, docs/threads.md).
# So BLAS rests at one thread, and only the backend's products of at least MIN_PARALLEL_BLAS_WORK multiply-adds
# (conv64's GEMMs, ~1 ms and up on one thread) get all of minidnn's threads, by the library's own setter (about
# 1 us a call through ctypes; threadpoolctl's limit() re-scans the process and takes milliseconds).

MIN_PARALLEL_BLAS_WORK = 1 << 24

_blas_setters = []         # per loaded BLAS runtime: a cheap set-thread-count function (ctypes)

_SETTERS = {               # threadpoolctl's internal_api -> the library's own thread-count setter
    "openblas": [f"{pre}openblas_set_num_threads{suf}" for pre in ("", "scipy_") for suf in ("", "64_", "_64")],
    "mkl": ["MKL_Set_Num_Threads"],
    "blis": ["bli_thread_set_num_threads"],
}


def _thread_setter(lib):
    """The ctypes function that sets ``lib``'s thread count, or None (an unknown BLAS: then no grain for it)."""
    for name in _SETTERS.get(lib.internal_api, ()):
        func = getattr(lib.dynlib, name, None)
        if func is not None:
            func.argtypes, func.restype = [ctypes.c_int], None
            return func
    return None


@contextlib.contextmanager
def blas_threads_for(work: int):
    """Inside the block, BLAS may use all of minidnn's threads if ``work`` (the product's multiply-adds, M*N*K)
    is at least MIN_PARALLEL_BLAS_WORK; below it, BLAS stays at one thread.  For products run by the calling
    thread (not inside ``parallel_map`` / ``parallel_for`` bodies, which are threads already)."""
    n = _threads()
    if n <= 1 or work < MIN_PARALLEL_BLAS_WORK or not _blas_setters or time.perf_counter() < _pair_rest[0]:
        yield                                 # (resting: a split found no second core free just now)
        return
    for setter in _blas_setters:
        setter(n)
    try:
        yield
    finally:
        for setter in _blas_setters:
            setter(1)


# OpenBLAS builds for AVX-512 x86 (its SkylakeX, Cooperlake and SapphireRapids kernels: what it picks on AVX-512
# Intel and AMD Zen 4 CPUs) run float32/float64 products of at most 10^6 multiply-adds through "small-matrix" kernels
# that read the operands in place (no packing).  For the skinny products of small convolutions they run 1.3-2.5x
# faster than the packed path a larger product takes (measured on the 2-core Zen 4 machine, one thread: (416, 150) x
# (150, 16) 44 ns a row, (417, 150) x (150, 16) 59; (6, 25) x (25, 6666) 20 us against 45 for 6667 columns), except
# with a C-ordered left and an F-ordered right operand, which they do not take.  The CPU convolution forms cut their
# products into such blocks where this holds (conv_cpu._gemm); another BLAS gets the products whole.
SMALL_GEMM_MACS = 1_000_000
_SMALL_KERNEL_ARCHS = ("skylakex", "cooperlake", "sapphirerapids")
_small_kernels = [None]    # whether the loaded BLAS has them (None: not looked yet)


def blas_small_kernels() -> bool:
    """Whether NumPy's BLAS is an OpenBLAS with AVX-512 small-matrix kernels (looked up once, through threadpoolctl;
    False where threadpoolctl is missing).  ``MINIDNN_SMALL_GEMM=0`` in the environment turns the blocking off."""
    if _small_kernels[0] is None:
        try:
            libs = _controller().lib_controllers
        except ImportError:
            libs = []
        _small_kernels[0] = os.environ.get("MINIDNN_SMALL_GEMM", "1") != "0" and any(
            lib.internal_api == "openblas" and str(getattr(lib, "architecture", "")).lower() in _SMALL_KERNEL_ARCHS
            for lib in libs if lib.user_api == "blas")
    return _small_kernels[0]


_current = [None]          # the last count set through minidnn (None: never set; parallel_map then runs serially)
_local = threading.local()  # .single: True on a thread running one half of parallel_pair (no splitting inside)


def _threads() -> int:
    """The threads the calling thread may share its work out to: 1 inside a half of ``parallel_pair``."""
    return 1 if getattr(_local, "single", False) else (_current[0] or 1)
_pool = [None, 0, 0]       # a ThreadPoolExecutor, its size and the pid that made it (made on first use)


# Below this much work, a batch is not shared out.  ``work`` is the elements ONE NumPy call of the operation touches
# over the whole batch (a gather's copy, one tap's add): split in two, each call of a part is half that.  Handing a
# part to a pool thread costs tens of microseconds (a futex wake, a core to find), and every NumPy call of the part
# hands the GIL back and forth, so parts of short calls cost more than they save.  Measured on the 2-core machine,
# 2 threads: the digits LeNet's epoch (batch 32; its largest call the first layer's 205k-element gather) 0.205 s
# with parts of 12k-element adds, 0.178 s at 128k per call, 0.170 s at 256k (one thread: 0.169 s); the LeNet-5 step
# at batch 64 (gathers of 0.27M-1.25M elements) no faster split than not even with the machine idle (8.0-8.9 ms
# either way, one thread 8.0-8.5), and at batch 256 the same split or not.  The chunked forms (flat depthwise,
# flat dense: tens of millions of elements, long calls) gain 1.65x.
MIN_PARALLEL_WORK = 1 << 21


def parallel_parts(n: int, work: int) -> int:
    """How many parts to cut ``n`` items into for ``parallel_map``: minidnn's thread count (at most n), or 1 where
    ``work`` is below MIN_PARALLEL_WORK."""
    if work < MIN_PARALLEL_WORK:
        return 1
    return max(1, min(_threads(), n))


def _executor():
    """minidnn's thread pool, (re)made for the current thread count and process (a forked child has no threads)."""
    if _pool[1] != _current[0] or _pool[2] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor
        if _pool[0] is not None and _pool[2] == os.getpid():
            _pool[0].shutdown(wait=False)
        _pool[:] = ThreadPoolExecutor(max_workers=_current[0], thread_name_prefix="minidnn"), _current[0], os.getpid()
    return _pool[0]


def parallel_map(fn, items):
    """``[fn(item) for item in items]``, spread over minidnn's thread count (``set_num_threads``).

    For the backend's NumPy loops that BLAS does not thread (gathers, elementwise taps, pooling): NumPy releases
    the GIL inside its array loops, so chunks of a batch run truly in parallel.  The calling thread runs the first
    item, then every item no pool thread has started yet (``_reclaim``).  Serial with one thread."""
    items = list(items)
    n = min(_threads(), len(items))
    if n <= 1:
        return [fn(item) for item in items]
    futures = [_executor().submit(fn, item) for item in items[1:]]
    results = [None] * len(items)
    try:
        results[0] = fn(items[0])
        for i in _reclaim(futures):
            results[i + 1] = fn(items[i + 1])
    finally:
        _reclaim(futures)                     # after an error: parts not started yet never start
        _wait_started(futures)                # no part still writing once this returns or raises
    for i, f in enumerate(futures):
        if not f.cancelled():
            results[i + 1] = f.result()
    return results


def _reclaim(futures):
    """Indices of the futures no pool thread has started, cancelled (last submitted first): the caller, done with
    its own share, runs those itself rather than wait for a thread that has no core yet.  On a shared machine a
    woken pool thread may wait milliseconds for a core; then the op costs one thread's time, not that wait."""
    return [i for i in reversed(range(len(futures))) if futures[i].cancel()]


def _wait_started(futures):
    """Wait for the futures that were not cancelled (a cancelled one is only marked done once a pool thread has
    dequeued it: waiting for that would be waiting for the very thread that has no core)."""
    wait([f for f in futures if not f.cancelled()])


def parallel_for(chunks, body, work, setup=None):
    """``body(state, chunk)`` for every chunk, the chunks handed out one at a time to the calling thread and up to
    ``parallel_parts(len(chunks), work) - 1`` pool threads, each with its own ``state = setup()`` (buffers).

    Handing out one chunk at a time instead of a fixed share per thread is for shared machines: a thread whose core
    is taken by another process simply takes fewer chunks (none, if it has not started when the caller runs out:
    ``_reclaim``).  The order in which chunks run is not fixed, so each body must write only its own chunk's results
    (results then do not depend on the thread count)."""
    chunks = list(chunks)
    parts = parallel_parts(len(chunks), work)
    pending = iter(chunks)                    # shared: next() on a list iterator is atomic under the GIL

    def worker():
        state = setup() if setup is not None else None
        for chunk in pending:
            body(state, chunk)
    if parts <= 1:
        worker()
        return
    futures = [_executor().submit(worker) for _ in range(parts - 1)]
    try:
        worker()
    finally:
        _reclaim(futures)                     # no chunk left for them (or an error): unstarted workers never start
        _wait_started(futures)
    for f in futures:
        if not f.cancelled():
            f.result()                        # a pool thread's exception, raised here


# ---- two independent computations at once (inter-op) ----------------------------------------------------------
#
# A training step of small layers is ~30 ops of 0.1-1 ms, each below the grains above: on two threads it runs as on
# one.  Some ops' backward is two independent computations of that size from the same inputs (a convolution's data
# and filter gradients): those two run one per thread, each on one thread inside (its loops unsplit, BLAS at its
# resting one thread: two cores, used once each).  Below MIN_PAIR_WORK multiply-adds a half is too short to pay for
# the hand-off to a pool thread (tens of us on a shared VM).  From MAX_PAIR_WORK (the BLAS grain) on, the halves stay
# one after the other: their products get BLAS's threads there already, and BLAS split over two threads gives other
# bits than on one (OpenBLAS: LeNet conv2's filter gradient at batch 256), so a pair there would change the results.
MIN_PAIR_WORK = 1 << 22
MAX_PAIR_WORK = MIN_PARALLEL_BLAS_WORK
# A shared machine: when another process holds the second core, a pool thread that has started shares the caller's
# core and the pair costs more than the two halves in turn.  A pair whose process CPU time was under PAIR_OVERLAP x its
# wall time did not overlap; pairs then rest for PAIR_BACKOFF_S (the halves run in turn; the same bits either way).
PAIR_OVERLAP, PAIR_BACKOFF_S = 1.25, 0.5
_pair_rest = [0.0]         # perf_counter() until which pairs run in turn


def parallel_pair(first, second, work):
    """``(first(), second())``.  With minidnn's thread count >= 2 and ``work`` (the larger half's multiply-adds) in
    [MIN_PAIR_WORK, MAX_PAIR_WORK), ``second`` runs on a pool thread while the caller runs ``first``, each
    with nothing split inside (``_threads()`` is 1 there): the same computations as one after the other, so the same
    bits.  The caller runs ``second`` itself if no pool thread has started it by then; after a pair that did not
    overlap, pairs rest for PAIR_BACKOFF_S (a busy second core).  Either half's exception is
    raised once neither is running any more (the other's result dropped); if both raise, ``first``'s."""
    if _threads() <= 1 or not MIN_PAIR_WORK <= work < MAX_PAIR_WORK or time.perf_counter() < _pair_rest[0]:
        return first(), second()
    wall, cpu = time.perf_counter(), time.process_time()
    # The caller starts its half at once, without waiting for the pool thread to take its own (parallel_spans waits):
    # the pool thread gets the GIL at the caller's first long NumPy call.  Measured, LeNet's conv2 pair at batch 64
    # (the data half 8 NumPy calls a chunk, docs/measurements/cpu_2026-11-26_2core.md, session 7 helper): waiting
    # started the caller's half 140-270 us in and ended the pair no sooner; the step without the wait, 5 in-process
    # A/Bs on the quiet 2-core machine: q25 0.09-0.19 ms and median 0.01-0.16 ms faster in every run.
    future = _executor().submit(_single, second)
    try:
        a = _single(first)
    finally:
        if future.cancel():                   # not started: the caller's
            future = None
        else:
            wait([future])                    # nothing of ``second`` still running once this returns or raises
            _rest_if_alone(wall, cpu)         # the two did not run at once: no second core free
    return a, (_single(second) if future is None else future.result())


def _rest_if_alone(wall, cpu, overlap=None):
    """After a pair or a split that began at (wall, cpu): if the process's CPU time over it was under PAIR_OVERLAP x
    its wall time, its halves did not run at once (no second core free, or the pool thread never started), and
    pairs and splits rest for PAIR_BACKOFF_S: the work runs in turn, unsplit (the same results either way, but for
    the filter gradients' sum order)."""
    now = time.perf_counter()
    if time.process_time() - cpu < (PAIR_OVERLAP if overlap is None else overlap) * (now - wall):
        _pair_rest[0] = now + PAIR_BACKOFF_S


def _single(fn, *args):
    """``fn(*args)`` with nothing split inside (``_threads()`` is 1 on this thread meanwhile)."""
    before = getattr(_local, "single", False)
    _local.single = True
    try:
        return fn(*args)
    finally:
        _local.single = before


# ---- one primitive cut over its batch (intra-op) --------------------------------------------------------------
#
# Cut once per primitive: the whole of a convolution direction (its gathers, GEMMs and scatters) or a pooling call
# on each part of the batch, one part per thread, each part a sub-problem run with nothing split inside (its loops
# on one thread, BLAS at its resting one thread: the cores are never oversubscribed).  One hand-off per primitive.
# The grain is the BLAS grain: from there on the primitive's products would get all of BLAS's threads, and OpenBLAS's
# own split gained little or lost on the 2-core machine (LeNet conv2 at batch 256: forward 5.7 ms on two BLAS threads,
# 4.0 split, 3.3-6.8 on one; filter gradient 3.1-4.0 ms on two BLAS threads when quiet, 39 when shared, 4.0-5.2
# split; the batch-256 step 12-15% faster split, with 0.67x the CPU time: no spinning BLAS workers).  Below
# it the parts lost in the training step though they won alone: LeNet conv2 at batch 64 (15.4M multiply-adds) ran
# 0.52 ms split against 0.71 in a loop, but 0.95-1.07 split inside the step (each part at half speed: the other core
# idle between ops, the GIL passed back and forth), and the step was no faster (docs/threads.md).
MIN_SPLIT_WORK = MIN_PARALLEL_BLAS_WORK
# A split's parts overlap less than a pair's halves (the filter gradient at batch 256: CPU 1.15x wall, yet 20% faster
# than unsplit), so splits rest only under 1.1x (at 1.25x the batch-256 step lost its gain: 30.5 against 23.9 ms)
SPLIT_OVERLAP = 1.1


def split_spans(n: int, work: int, minimum: int = None) -> list:
    """[0, n) cut into one contiguous slice per minidnn thread (at most n), or [slice(0, n)] where ``work`` is
    below ``minimum`` (default MIN_SPLIT_WORK), with one thread, or inside a part already."""
    minimum = MIN_SPLIT_WORK if minimum is None else minimum
    parts = 1 if work < minimum or time.perf_counter() < _pair_rest[0] else max(1, min(_threads(), n))
    bounds = [i * n // parts for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


# How long the caller waits, without the GIL, for the pool threads to take their parts before starting its own.  A
# woken pool thread needs the GIL to start; while the caller runs its part's Python between NumPy calls it can lose
# that race again and again: measured, the pool thread often started only after the caller had finished its own part
# (LeNet conv2 forward at batch 64, both halves then ran in turn).  Waiting for the start (20-50 us on an idle core)
# lets it take the GIL at once.  A pool thread with no core by the deadline is not waited for: the caller starts its
# own part, then runs the unstarted parts itself (_reclaim).
START_WAIT_S = 0.0002


def _wait_for_starts(started, count):
    deadline = time.perf_counter() + START_WAIT_S
    for _ in range(count):
        left = deadline - time.perf_counter()
        if left <= 0 or not started.acquire(timeout=left):
            return


def parallel_spans(fn, spans):
    """``[fn(span) for span in spans]``, the first span on the calling thread and the others on the pool, each with
    nothing split inside (``_single``).  The caller then runs every span no pool thread has started (``_reclaim``),
    and waits for the started ones; a part's exception is raised once no part is running.  One span: just
    ``[fn(span)]`` on the caller, splits inside allowed."""
    if len(spans) <= 1:
        return [fn(s) for s in spans]
    started = threading.Semaphore(0)

    def pool_part(span):
        started.release()
        return _single(fn, span)
    wall, cpu = time.perf_counter(), time.process_time()
    futures = [_executor().submit(pool_part, s) for s in spans[1:]]
    _wait_for_starts(started, len(futures))
    results = [None] * len(spans)
    try:
        results[0] = _single(fn, spans[0])
        for i in _reclaim(futures):
            results[i + 1] = _single(fn, spans[i + 1])
    finally:
        _reclaim(futures)
        _wait_started(futures)
        _rest_if_alone(wall, cpu, SPLIT_OVERLAP)
    for i, f in enumerate(futures):
        if not f.cancelled():
            results[i + 1] = f.result()
    return results


def _apply_default() -> None:
    """Called once when minidnn is imported."""
    explicit = os.environ.get("MINIDNN_NUM_THREADS")
    if explicit:
        try:
            n = int(explicit)
        except ValueError:
            raise ValueError(f"MINIDNN_NUM_THREADS={explicit!r} must be a positive integer") from None
        set_num_threads(n)
        return
    if any(os.environ.get(name) for name in _USER_ENV):
        return                                # the user chose through the libraries' own variables
    try:
        set_num_threads(default_num_threads())
    except ImportError:                       # threadpoolctl missing (an install without dependencies)
        pass
