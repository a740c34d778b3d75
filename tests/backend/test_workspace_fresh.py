"""Outputs on reused pool memory (backend/cuda/workspace.py ``fresh`` / ``fresh_pair``, session 14), on the CPU with
test_workspace.py's fake CuPy (NumPy memory, so addresses and overlaps are real): memory comes back only when no
array or view on it is alive, per (device, stream, tag, shape, dtype, layout); never while a stream captures; the
switch and the size limit; ``clear`` and ``idle_bytes``.  Whole training steps: tests/nn/test_fresh_outputs.py
(fake CuPy) and tests/nn/test_fresh_outputs_cuda.py (the bits on a GPU)."""
import numpy as np
import pytest

from minidnn.backend.cuda import workspace as W

from .test_workspace import _FakeCp


@pytest.fixture
def cp(monkeypatch):
    monkeypatch.setattr(W, "RECYCLE", [True])
    W.clear()
    yield _FakeCp()
    W.clear()


def _span(a):
    lo = a.__array_interface__["data"][0]
    return lo, lo + a.nbytes


def _ptr(a):
    return a.__array_interface__["data"][0]


def test_memory_comes_back_once_nothing_holds_it(cp):
    a = W.fresh(cp, 0, "t", (4, 5), np.float32)
    pa = _ptr(a)
    b = W.fresh(cp, 0, "t", (4, 5), np.float32)           # a alive: other memory
    assert _ptr(b) != pa and cp.allocs == 2
    del a
    c = W.fresh(cp, 0, "t", (4, 5), np.float32)           # a's memory, a new array object
    assert _ptr(c) == pa and cp.allocs == 2 and c.shape == (4, 5) and c.dtype == np.float32 and c.base is None
    c[...] = 1
    assert np.all(np.asarray(c) == 1) and np.asarray(b).shape == (4, 5)


def test_a_view_keeps_the_memory(cp):
    a = W.fresh(cp, 0, "t", (6,), np.float32)
    pa = _ptr(a)
    v = a[2:].reshape(2, 2)
    del a
    b = W.fresh(cp, 0, "t", (6,), np.float32)
    assert _ptr(b) != pa
    pb = _ptr(b)
    del v, b                                                     # both free now: both come back
    x, y = W.fresh(cp, 0, "t", (6,), np.float32), W.fresh(cp, 0, "t", (6,), np.float32)
    assert {_ptr(x), _ptr(y)} == {pa, pb} and cp.allocs == 2


def test_keys_do_not_share(cp):
    a = W.fresh(cp, 0, "t", (8,), np.float32)
    pa = _ptr(a)
    del a
    others = [W.fresh(cp, 0, "u", (8,), np.float32), W.fresh(cp, 0, "t", (4, 2), np.float32),
              W.fresh(cp, 0, "t", (8,), np.float64), W.fresh(cp, 1, "t", (8,), np.float32)]
    cp.stream = 0x1234
    others.append(W.fresh(cp, 0, "t", (8,), np.float32))
    assert all(_ptr(o) != pa for o in others)
    cp.stream = 0
    assert _ptr(W.fresh(cp, 0, "t", (8,), np.float32)) == pa


def test_strided_layout_comes_back_with_its_shape_and_strides(cp):
    spec = ((2, 3, 4, 5), (3 * 4 * 5 * 4, 4, 5 * 3 * 4, 3 * 4), 2 * 3 * 4 * 5 * 4)     # NCHW indexed, NHWC memory
    a = W.fresh(cp, 0, "t", (2, 4, 5, 3), np.float32, spec)
    pa, first = _ptr(a), (a.shape, a.strides)
    assert first == spec[:2]
    del a
    b = W.fresh(cp, 0, "t", (2, 4, 5, 3), np.float32, spec)
    assert _ptr(b) == pa and (b.shape, b.strides) == first
    c = W.fresh(cp, 0, "t", (2, 3, 4, 5), np.float32)           # the C-ordered array of the same bytes: its own key
    assert _ptr(c) != pa and c.strides == (240, 80, 20, 4)


def test_pairs_come_back_when_both_are_free(cp):
    a, b = W.fresh_pair(cp, 0, "p", (10,), np.float32)
    pa, pb = _ptr(a), _ptr(b)
    assert pb - pa >= 40 and (pb - pa) % 256 == 0
    del a
    c, d = W.fresh_pair(cp, 0, "p", (10,), np.float32)          # b alive: another block
    assert _ptr(c) not in (pa, pb)
    del b
    e, f = W.fresh_pair(cp, 0, "p", (10,), np.float32)
    assert (_ptr(e), _ptr(f)) == (pa, pb) and e.shape == f.shape == (10,)
    lo, hi = _span(e)
    assert hi <= _ptr(f)


def test_nothing_kept_while_capturing_or_switched_off(cp, monkeypatch):
    cp.stream = 0x77
    cp.capturing.add(0x77)
    a = W.fresh(cp, 0, "t", (8,), np.float32)
    pa = _ptr(a)
    del a
    assert W._local.kept == {}
    cp.capturing.clear()
    monkeypatch.setattr(W, "RECYCLE", [False])
    b = W.fresh(cp, 0, "t", (8,), np.float32)
    del b
    assert W._local.kept == {} and cp.allocs == 2 and pa


def test_limit_clear_and_idle_bytes(cp, monkeypatch):
    probe = cp.empty((16,), np.float32)
    block = probe.data.mem.size                                 # the pool block of a 64-byte array
    monkeypatch.setattr(W, "RECYCLE_LIMIT_BYTES", [block + block // 2])
    a = W.fresh(cp, 0, "t", (16,), np.float32)                 # kept
    b = W.fresh(cp, 0, "t", (16,), np.float32)                 # over the limit: not kept
    assert W._local.kept_nbytes == block and W.idle_bytes() == 0
    pa = _ptr(a)
    del a, b
    assert W.idle_bytes() == block and W.idle_bytes(1) == 0
    c = W.fresh(cp, 0, "t", (16,), np.float32)
    assert _ptr(c) == pa and W.idle_bytes() == 0
    del c
    W.clear()
    assert W._local.kept == {} and W.idle_bytes() == 0 and W._local.kept_nbytes == 0
    d = W.fresh(cp, 0, "t", (16,), np.float32)                 # nothing kept: the pool again
    assert cp.allocs == 4 and d.shape == (16,)


class OutOfMemoryError(Exception):        # (named as CuPy's: fresh matches the name)
    pass


def test_out_of_memory_drops_the_idle_memory_and_tries_again(cp, monkeypatch):
    held = W.fresh(cp, 0, "t", (8,), np.float32)
    idle = W.fresh(cp, 0, "t", (8,), np.float32)
    other = W.fresh(cp, 0, "u", (4,), np.float64)
    before = W._local.kept_nbytes
    del idle, other
    real, calls = cp.empty, []

    def tight(shape, dtype=np.float32):         # out of memory until the idle memory went back
        calls.append(W.idle_bytes())
        if W.idle_bytes():
            raise OutOfMemoryError("out of memory to allocate")
        return real(shape, dtype)
    cp.empty = tight
    big = W.fresh(cp, 0, "v", (32,), np.float32)
    assert big.shape == (32,) and len(calls) == 2 and calls[1] == 0
    assert W._local.kept_nbytes < before and W.idle_bytes() == 0
    assert W._unheld(W._local.kept[(0, 0, "t", (8,), np.float32, None)], W._FREE) is None    # held's stays
    cp.empty = lambda shape, dtype=np.float32: (_ for _ in ()).throw(OutOfMemoryError("still"))
    with pytest.raises(OutOfMemoryError):
        W.fresh(cp, 0, "w", (64,), np.float32)           # nothing idle: the error stands
    cp.empty = lambda shape, dtype=np.float32: (_ for _ in ()).throw(ValueError("other"))
    with pytest.raises(ValueError):
        W.fresh(cp, 0, "w", (64,), np.float32)           # other errors are not retried
    assert held.shape == (8,)
