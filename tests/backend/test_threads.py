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


# ---- parallel_pair: two independent computations, one per thread ----------------------------------------------

@pytest.fixture(autouse=True)
def pairs_never_rest(monkeypatch):
    """These tests' halves sleep (no CPU time): without this, the first pair would send the next ones to rest."""
    monkeypatch.setattr(threads_module, "PAIR_OVERLAP", 0.0)
    monkeypatch.setattr(threads_module, "_pair_rest", [0.0])


def test_a_pair_that_did_not_overlap_sends_the_next_ones_to_rest(restore_threads, monkeypatch):
    """On a busy machine (no second core: CPU time under PAIR_OVERLAP x wall) pairs run in turn for PAIR_BACKOFF_S."""
    monkeypatch.setattr(threads_module, "PAIR_OVERLAP", 1.25)
    minidnn.set_num_threads(2)
    where = []

    def idle(tag):
        return lambda: where.append(threading.get_ident()) or threading.Event().wait(0.01) or tag
    work = threads_module.MIN_PAIR_WORK
    assert threads_module.parallel_pair(idle("a"), idle("b"), work) == ("a", "b")
    assert threads_module._pair_rest[0] > 0                      # the halves slept: no overlap of CPU time
    where.clear()
    assert threads_module.parallel_pair(idle("a"), idle("b"), work) == ("a", "b")
    assert where == [threading.get_ident()] * 2                  # resting: both on the caller
    monkeypatch.setattr(threads_module, "_pair_rest", [0.0])          # rest over
    where.clear()
    threads_module.parallel_pair(idle("a"), idle("b"), work)
    assert len(set(where)) == 2 or where == [threading.get_ident()] * 2

def test_parallel_pair_runs_each_half_unsplit(restore_threads):
    """At >= 2 threads the second half goes to a pool thread; inside either half nothing is split further (minidnn's
    loops and BLAS stay on one thread) and the results come back in order."""
    minidnn.set_num_threads(2)
    seen = []

    def half(tag):
        def run():
            with threads_module.blas_threads_for(1 << 40):
                seen.append((tag, threading.get_ident(), threads_module._threads(),
                             threads_module.parallel_parts(8, 1 << 40), _blas_threads() if needs_blas else 1))
            return tag
        return run
    needs_blas = bool(threads_module._blas_setters)
    assert threads_module.parallel_pair(half("a"), half("b"), work=threads_module.MIN_PAIR_WORK) == ("a", "b")
    assert sorted(s[0] for s in seen) == ["a", "b"]
    assert all(s[2:] == (1, 1, 1) for s in seen)
    assert threads_module._threads() == 2                     # the caller's count is back afterwards
    # one thread, work below the grain, or halves whose products get BLAS's threads anyway: one after the other
    for n, work in ((1, threads_module.MIN_PAIR_WORK), (2, threads_module.MIN_PAIR_WORK - 1),
                    (2, threads_module.MAX_PAIR_WORK)):
        minidnn.set_num_threads(n)
        seen.clear()
        assert threads_module.parallel_pair(half("a"), half("b"), work) == ("a", "b")
        assert [s[:2] for s in seen] == [("a", threading.get_ident()), ("b", threading.get_ident())]


@pytest.mark.parametrize("failing", ["first", "second", "both"])
def test_parallel_pair_raises_once_neither_half_runs(restore_threads, failing):
    minidnn.set_num_threads(2)
    running = []

    def half(tag):
        def run():
            running.append(tag)
            threading.Event().wait(0.02)
            running.remove(tag)
            if failing in (tag, "both"):
                raise ValueError(tag)
            return tag
        return run
    with pytest.raises(ValueError, match="first" if failing != "second" else "second"):
        threads_module.parallel_pair(half("first"), half("second"), work=threads_module.MIN_PAIR_WORK)
    assert running == [] and threads_module._threads() == 2


def test_parallel_pair_unstarted_second_half_runs_on_the_caller(restore_threads, monkeypatch):
    from concurrent.futures import Future

    class NeverStarts:
        def submit(self, fn, *args):
            return Future()
    monkeypatch.setattr(threads_module, "_executor", lambda: NeverStarts())
    minidnn.set_num_threads(2)
    where = []
    assert threads_module.parallel_pair(lambda: where.append(threading.get_ident()) or 1,
                                        lambda: where.append(threads_module._threads()) or 2,
                                        work=threads_module.MIN_PAIR_WORK) == (1, 2)
    assert where == [threading.get_ident(), 1]


_CONVS = [  # x shape, w shape, stride, padding, groups: LeNet's conv2 (b64, b256: BLAS grain), conv16 (chunked flat
    ((64, 6, 14, 14), (16, 6, 5, 5), 1, 0, 1),       # im2col), strided, grouped, depthwise
    ((256, 6, 14, 14), (16, 6, 5, 5), 1, 0, 1),
    ((32, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1),
    ((16, 8, 17, 17), (12, 8, 3, 3), 2, 1, 1),
    ((8, 8, 12, 12), (8, 2, 3, 3), 1, 1, 4),
    ((32, 64, 16, 16), (64, 1, 3, 3), 1, 1, 64),
]


@pytest.mark.parametrize("xs, ws, stride, padding, groups", _CONVS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_backward_pair_is_bitwise_the_sequential_one(restore_threads, monkeypatch, xs, ws, stride, padding,
                                                          groups, channels_last):
    """A convolution's data and filter gradients, one per thread, are bit for bit those computed one after the other,
    at 1 and at 2 threads (at batch 256 the halves stay sequential: their products get BLAS's threads, which give
    other bits than one thread does)."""
    import minidnn.nn.functional as F
    rng = np.random.default_rng(1)
    x_np, w_np = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)

    # a pair that did not overlap (a busy core) makes splits rest for PAIR_BACKOFF_S, and a split filter gradient sums
    # in another order than an unsplit one: no rest here, so both runs split alike whatever the machine's load
    monkeypatch.setattr(threads_module, "PAIR_BACKOFF_S", 0.0)

    def grads(n, pair):
        minidnn.set_num_threads(n)
        monkeypatch.setattr(threads_module, "MIN_PAIR_WORK", 0 if pair else 1 << 62)
        threads_module._pair_rest[0] = 0.0
        x = minidnn.tensor(x_np, requires_grad=True)
        if channels_last:
            x = x.detach().to(memory_format=minidnn.channels_last).requires_grad_()
        w = minidnn.tensor(w_np, requires_grad=True)
        y = F.conv2d(x, w, stride=stride, padding=padding, groups=groups)
        y.backward(minidnn.tensor(np.cos(np.arange(y.numel(), dtype=np.float32)).reshape(y.shape)))
        return x.grad.numpy(), w.grad.numpy()
    for n in (1, 2):
        for got, want in zip(grads(n, True), grads(n, False)):
            np.testing.assert_array_equal(got, want, strict=True)


def test_conv_backward_error_in_one_half_leaves_no_gradient(restore_threads, monkeypatch):
    """An exception in the filter half propagates from backward() once the data half is done, and no gradient is
    written."""
    import minidnn.nn.functional as F
    from minidnn import backend as B
    minidnn.set_num_threads(2)
    monkeypatch.setattr(threads_module, "MIN_PAIR_WORK", 0)
    running = []
    real = B.convolution_backward_data

    def slow_data(*args, **kwargs):
        running.append(1)
        threading.Event().wait(0.05)
        running.pop()
        return real(*args, **kwargs)

    def broken_filter(*args, **kwargs):
        raise RuntimeError("filter half failed")
    monkeypatch.setattr(B, "convolution_backward_data", slow_data)
    monkeypatch.setattr(B, "convolution_backward_filter", broken_filter)
    x = minidnn.randn(4, 3, 8, 8, requires_grad=True)
    w = minidnn.randn(5, 3, 3, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="filter half failed"):
        F.conv2d(x, w).sum().backward()
    assert running == [] and x.grad is None and w.grad is None
