"""The grain rules of backend/threads.py: small work stays on one thread, in minidnn's own loops (parallel_for,
parallel_map) and in BLAS (blas_threads_for, blas.cpu_matmul); results never depend on the thread count."""
import threading

import numpy as np
import pytest

import minidnn
from minidnn.backend import blas
from minidnn.backend import threads as threads_module


@pytest.fixture
def restore_threads():
    before = minidnn.get_num_threads()
    yield
    minidnn.set_num_threads(before)


def _blas_threads():
    from threadpoolctl import threadpool_info
    return max(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas")


needs_setter = pytest.mark.skipif(
    not any(threads_module._thread_setter(lib) for lib in threads_module._controller().lib_controllers
            if lib.user_api == "blas"),
    reason="NumPy's BLAS has no thread-count setter minidnn knows (OpenBLAS, MKL, BLIS): no BLAS grain")


@needs_setter
def test_blas_rests_at_one_thread_and_large_products_get_all(restore_threads):
    minidnn.set_num_threads(2)
    assert minidnn.get_num_threads() == 2                     # the count minidnn works with, not BLAS's resting one
    assert _blas_threads() == 1
    with threads_module.blas_threads_for(threads_module.MIN_PARALLEL_BLAS_WORK - 1):
        assert _blas_threads() == 1
    with threads_module.blas_threads_for(threads_module.MIN_PARALLEL_BLAS_WORK):
        assert _blas_threads() == 2
    assert _blas_threads() == 1
    with pytest.raises(RuntimeError):
        with threads_module.blas_threads_for(1 << 40):
            raise RuntimeError("the product failed")
    assert _blas_threads() == 1                               # restored on the way out of an error too
    minidnn.set_num_threads(1)
    with threads_module.blas_threads_for(1 << 40):
        assert _blas_threads() == 1


@needs_setter
def test_cpu_matmul_counts_multiply_adds_and_matches_numpy(restore_threads, monkeypatch):
    minidnn.set_num_threads(2)
    seen = []
    real = threads_module.blas_threads_for

    def spy(work):
        seen.append(work)
        return real(work)
    monkeypatch.setattr(threads_module, "blas_threads_for", spy)
    monkeypatch.setattr(threads_module, "MIN_PARALLEL_BLAS_WORK", 100)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4, 5)), rng.standard_normal((5, 6))
    np.testing.assert_array_equal(blas.cpu_matmul(a, b), np.matmul(a, b))
    assert seen == [3 * 4 * 5 * 6]
    a2, b2 = rng.standard_normal((2, 3)), rng.standard_normal((3, 2))
    out = np.empty((2, 2))
    assert blas.cpu_matmul(a2, b2, out=out) is out                 # 12 multiply-adds: below the grain
    assert seen == [3 * 4 * 5 * 6]
    np.testing.assert_array_equal(out, a2 @ b2)


def test_parallel_for_runs_every_chunk_once_with_one_state_per_thread(restore_threads, monkeypatch):
    monkeypatch.setattr(threads_module, "MIN_PARALLEL_WORK", 0)
    for n in (1, 2):
        minidnn.set_num_threads(n)
        done, states = [], []

        def setup():
            state = {"thread": threading.get_ident()}
            states.append(state)
            return state

        def body(state, chunk):
            assert state["thread"] == threading.get_ident()          # each thread keeps its own buffers
            done.append(chunk)
        threads_module.parallel_for(range(40), body, work=1 << 30, setup=setup)
        assert sorted(done) == list(range(40))
        assert 1 <= len(states) <= n


def test_parallel_for_stays_on_the_caller_below_the_grain(restore_threads):
    minidnn.set_num_threads(2)
    where = set()
    threads_module.parallel_for(range(8), lambda s, c: where.add(threading.get_ident()),
                                work=threads_module.MIN_PARALLEL_WORK - 1)
    assert where == {threading.get_ident()}


def test_parallel_for_and_map_raise_a_threads_exception(restore_threads, monkeypatch):
    monkeypatch.setattr(threads_module, "MIN_PARALLEL_WORK", 0)
    minidnn.set_num_threads(2)

    def body(state, chunk):
        if chunk == 5:
            raise ValueError("chunk 5")
    with pytest.raises(ValueError, match="chunk 5"):
        threads_module.parallel_for(range(10), body, work=1 << 30)
    with pytest.raises(ValueError, match="item 3"):
        threads_module.parallel_map(lambda i: i if i != 3 else (_ for _ in ()).throw(ValueError("item 3")), range(6))


def test_work_no_pool_thread_has_started_runs_on_the_caller(restore_threads, monkeypatch):
    """On a shared machine a woken pool thread may wait for a core: the caller, done with its share, runs what no
    pool thread has started instead of waiting (here: pool threads that never start)."""
    from concurrent.futures import Future

    class NeverStarts:
        def submit(self, fn, *args):
            return Future()                   # pending for ever unless cancelled
    monkeypatch.setattr(threads_module, "_executor", lambda: NeverStarts())
    monkeypatch.setattr(threads_module, "MIN_PARALLEL_WORK", 0)
    minidnn.set_num_threads(2)
    caller = threading.get_ident()
    where = set()
    assert threads_module.parallel_map(lambda i: where.add(threading.get_ident()) or i * i, range(5)) == [
        0, 1, 4, 9, 16]
    done = []
    threads_module.parallel_for(range(7), lambda s, c: where.add(threading.get_ident()) or done.append(c),
                                work=1 << 30)
    assert sorted(done) == list(range(7)) and where == {caller}


def test_after_the_callers_error_no_further_part_starts(restore_threads, monkeypatch):
    """If the caller's own share raises, the parts no pool thread has started are cancelled, not run."""
    from concurrent.futures import Future

    class NeverStarts:
        def __init__(self):
            self.futures = []

        def submit(self, fn, *args):
            self.futures.append(Future())
            return self.futures[-1]
    pool = NeverStarts()
    monkeypatch.setattr(threads_module, "_executor", lambda: pool)
    monkeypatch.setattr(threads_module, "MIN_PARALLEL_WORK", 0)
    minidnn.set_num_threads(2)

    def fail(item):
        raise KeyError(item)
    with pytest.raises(KeyError):
        threads_module.parallel_map(fail, range(4))
    with pytest.raises(KeyError):
        threads_module.parallel_for(range(4), lambda s, c: fail(c), work=1 << 30)
    assert pool.futures and all(f.cancelled() for f in pool.futures)
