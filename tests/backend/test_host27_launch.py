"""The prepared launch's per-call path (backend/cuda/launch.py ``Prepared.__call__``, round 27), on the CPU with a
stand-in CuPy: the pointer writer generated per array count packs exactly what ``struct`` packs (null pointers for
None, the scalars packed once left as they were) for 0 to 14 arrays and for a layout whose arrays do not lead; a wrong
count or a bad argument launches nothing and leaves the lock free; two threads launching one prepared kernel each
see their own pointers in the buffer for the whole launch; the CUfunction follows the current device.  The real
packing against CuPy's own launch: test_launch.py (GPU)."""
import struct
import sys
import threading
import time
import types

import numpy as np
import pytest

from minidnn.backend.cuda import launch as L


class _Mem:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class _Array:
    __slots__ = ("data",)

    def __init__(self, ptr):
        self.data = _Mem(ptr)


class _Kernel:
    """A RawKernel stand-in whose function handle depends on the current device (CuPy loads it per device)."""
    max_dynamic_shared_size_bytes = 0

    def __init__(self, device):
        self._device = device

    @property
    def kernel(self):
        return types.SimpleNamespace(ptr=1000 + self._device[0])


@pytest.fixture
def fake(monkeypatch):
    device = [0]
    launched = []
    cp = types.SimpleNamespace(ndarray=_Array, cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: device[0])))
    monkeypatch.setattr(L, "_cp", cp)
    monkeypatch.setattr(L, "_go", lambda fn, dims, stream, params_ptr: launched.append(fn))
    return types.SimpleNamespace(cp=cp, device=device, launched=launched, kernel=_Kernel(device))


def _bytes(prep):
    return prep.buf.data.raw[:prep.buf.struct.size]


@pytest.mark.parametrize("n", list(range(15)))
def test_leading_arrays_packed_as_struct_packs_them(fake, n):
    rng = np.random.default_rng(n)
    scalars = [np.int32(rng.integers(-2 ** 31, 2 ** 31 - 1)), np.float16(rng.normal()), np.float64(rng.normal())]
    prep = L.prepare(fake.kernel, (3, 2), (64,), [None] * n + scalars)
    assert prep.write is not None
    layout = struct.Struct("@" + "Q" * n + "ied")
    for _ in range(3):
        arrays = [None if rng.random() < 0.3 else _Array(int(rng.integers(1, 2 ** 48)) * 256) for _ in range(n)]
        prep(*arrays)
        ptrs = [0 if a is None else a.data.ptr for a in arrays]
        assert _bytes(prep) == layout.pack(*ptrs, *scalars)
    assert fake.launched == [1000] * 3


def test_arrays_among_scalars_packed_in_their_slots(fake):
    scalars = (np.int8(-5), np.float64(2.5), np.uint16(7))
    prep = L.prepare(fake.kernel, (1,), (32,), [scalars[0], None, scalars[1], None, scalars[2], None])
    assert prep.write is None           # the arrays do not lead: one pack per slot
    layout = struct.Struct("@bQdQHQ")
    arrays = (_Array(4096), None, _Array(8192))
    prep(*arrays)
    assert _bytes(prep) == layout.pack(scalars[0], 4096, scalars[1], 0, scalars[2], 8192)


def test_a_wrong_count_or_a_bad_argument_launches_nothing_and_frees_the_lock(fake):
    prep = L.prepare(fake.kernel, (1,), (32,), [None, None, np.int32(3)])
    before = _bytes(prep)
    for arrays in ((), (_Array(256),), (_Array(256),) * 3):
        with pytest.raises(TypeError, match="2 arrays expected, got %d" % len(arrays)):
            prep(*arrays)
    with pytest.raises(AttributeError):
        prep(_Array(256), 7)            # not an array: nothing to read a pointer from
    assert fake.launched == [] and not prep.buf.lock.locked() and _bytes(prep)[16:] == before[16:]
    prep(_Array(512), None)
    assert fake.launched == [1000] and not prep.buf.lock.locked()


def test_two_threads_each_see_their_own_pointers_for_the_whole_launch(fake, monkeypatch):
    prep = L.prepare(fake.kernel, (1,), (32,), [None, None, None, np.float32(1.5)])
    layout = struct.Struct("@QQQf")
    wrong = []
    mine = threading.local()

    def go(fn, dims, stream, params_ptr):
        # the driver reads the parameters during the call (and CuPy lets go of the GIL there): another thread
        # writing its pointers now would launch this thread's kernel on them
        for _ in range(3):
            if _bytes(prep) != mine.expected:
                wrong.append(_bytes(prep))
            time.sleep(0)          # (lets another thread run here)
    monkeypatch.setattr(L, "_go", go)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work(t):
        for i in range(1500):
            arrays = (_Array((t * 10 + 1) << 20), None if i % 2 else _Array(((t * 10 + 2) << 20) + i * 256),
                      _Array(((t * 10 + 3) << 20) + i * 512))
            mine.expected = layout.pack(*[0 if a is None else a.data.ptr for a in arrays], np.float32(1.5))
            prep(*arrays)
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert wrong == [] and not prep.buf.lock.locked()


def test_the_function_follows_the_current_device(fake):
    prep = L.prepare(fake.kernel, (1,), (32,), [None, np.int32(1)])
    for dev in (0, 1, 1, 0, 2, 0):
        fake.device[0] = dev
        prep(_Array(256))
    assert fake.launched == [1000, 1001, 1001, 1000, 1002, 1000]
