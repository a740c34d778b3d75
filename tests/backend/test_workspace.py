"""The scratch buffers of backend/cuda/workspace.py (docs/host_overhead.md round 9), on the CPU with a small fake
CuPy: reuse on one stream and thread, none across streams, threads or devices, fresh (and not kept) while the
stream captures a graph, the grow-only flat buffers, the size limit, and ``pair``'s two separate arrays.  Under
tools/record_launches.py's fake CuPy (a subprocess): a convolution's backward in a shared-staging scope hands its
kernels distinct buffers for x and dy and the same dy copy to both calls, and a step's launches see buffers that
are big enough after the shapes change.  The bits on a GPU: test_workspace_cuda.py."""
import json
import pathlib
import subprocess
import sys
import textwrap
import threading
import types

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from minidnn.backend.cuda import workspace as W  # noqa: E402


class _FakeCp:
    """cupy.empty / get_current_stream / streamIsCapturing, with a settable stream and capture state."""

    def __init__(self):
        import record_launches as R
        self.fake = R._fake_cupy()
        self.ndarray = self.fake.ndarray
        self.stream, self.capturing, self.allocs = 0, set(), 0
        self.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=self.stream),
                                          runtime=types.SimpleNamespace(
                                              streamIsCapturing=lambda p: p in self.capturing),
                                          MemoryPointer=self.fake.cuda.MemoryPointer, alloc=self._alloc)

    def _alloc(self, nbytes):
        self.allocs += 1
        return self.fake.cuda.alloc(nbytes)

    def empty(self, shape, dtype=np.float32):
        self.allocs += 1
        return self.fake.empty(shape, dtype)


@pytest.fixture
def cp():
    W.clear()
    yield _FakeCp()
    W.clear()


def test_reused_on_one_stream_per_tag_shape_and_dtype(cp):
    a = W.scratch(cp, 0, "t", (4, 5), np.float32)
    assert W.scratch(cp, 0, "t", (4, 5), np.float32) is a and cp.allocs == 1
    others = [W.scratch(cp, 0, "u", (4, 5), np.float32), W.scratch(cp, 0, "t", (5, 4), np.float32),
              W.scratch(cp, 0, "t", (4, 5), np.float64), W.scratch(cp, 1, "t", (4, 5), np.float32)]
    assert all(o is not a for o in others) and len({id(o) for o in others}) == 4
    assert a.shape == (4, 5) and a.dtype == np.float32


def test_not_shared_across_streams(cp):
    a = W.scratch(cp, 0, "t", (8,), np.float32)
    cp.stream = 0x1234
    b = W.scratch(cp, 0, "t", (8,), np.float32)
    assert b is not a and W.scratch(cp, 0, "t", (8,), np.float32) is b
    cp.stream = 0
    assert W.scratch(cp, 0, "t", (8,), np.float32) is a


def test_fresh_and_not_kept_while_capturing(cp):
    cp.stream = 0x99
    eager = W.scratch(cp, 0, "t", (8,), np.float32)
    flat = W.scratch_flat(cp, 0, "f", 8, np.float32)
    cp.capturing.add(0x99)
    got = [W.scratch(cp, 0, "t", (8,), np.float32) for _ in range(2)] + \
          [W.scratch(cp, 0, "t2", (8,), np.float32)] + [W.scratch_flat(cp, 0, "f", 8, np.float32) for _ in range(2)]
    assert len({id(g) for g in got} | {id(eager), id(flat)}) == 7          # every capture-time call: a new array
    cp.capturing.clear()
    assert W.scratch(cp, 0, "t", (8,), np.float32) is eager                 # nothing from the capture was kept
    assert W.scratch_flat(cp, 0, "f", 8, np.float32) is flat
    assert all(id(v) not in {id(g) for g in got} for v in W._local.table.values())


def test_legacy_default_stream_skips_the_capture_query(cp):
    cp.cuda.runtime.streamIsCapturing = None         # would raise if called
    a = W.scratch(cp, 0, "t", (3,), np.float32)
    assert W.scratch(cp, 0, "t", (3,), np.float32) is a


def test_per_thread(cp):
    a = W.scratch(cp, 0, "t", (8,), np.float32)
    seen = []
    th = threading.Thread(target=lambda: seen.append(W.scratch(cp, 0, "t", (8,), np.float32)))
    th.start()
    th.join()
    assert seen[0] is not a


def test_flat_grows_and_serves_smaller_requests(cp):
    a = W.scratch_flat(cp, 0, "p", 100, np.float32)
    assert a.size >= 100 and W.scratch_flat(cp, 0, "p", 60, np.float32) is a
    b = W.scratch_flat(cp, 0, "p", 250, np.float32)
    assert b is not a and b.size >= 250 and W.scratch_flat(cp, 0, "p", 100, np.float32) is b
    assert W.cached_bytes() == b.nbytes


def test_limit_and_switch(cp, monkeypatch):
    monkeypatch.setattr(W, "LIMIT_BYTES", [64])
    a = W.scratch(cp, 0, "t", (8,), np.float32)                  # 32 bytes: kept
    b = W.scratch(cp, 0, "t", (16,), np.float32)                 # 64 more: over the limit, fresh every time
    assert W.scratch(cp, 0, "t", (8,), np.float32) is a and W.scratch(cp, 0, "t", (16,), np.float32) is not b
    monkeypatch.setattr(W, "ENABLED", [False])
    W.clear()
    assert W.scratch(cp, 0, "t", (8,), np.float32) is not W.scratch(cp, 0, "t", (8,), np.float32)


@pytest.mark.parametrize("n,dtype", [(16, np.float32), (100, np.float64), (1, np.float32), (0, np.float32)])
def test_pair_gives_two_disjoint_aligned_arrays(cp, n, dtype):
    a, b = W.pair(cp, (n,), dtype)
    assert a.shape == b.shape == (n,) and a.dtype == b.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and b.flags.c_contiguous
    if n:
        assert b.data.ptr - a.data.ptr >= a.nbytes and (b.data.ptr - a.data.ptr) % 256 == 0
        a[...] = 1
        b[...] = 2
        assert (np.asarray(a) == 1).all() and (np.asarray(b) == 2).all()


_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    recs = []
    prepared = L.Prepared.__call__
    def call(self, *arrays, stream=None):
        recs.append((self.kernel.kernel.ptr.split("(")[0],
                     [0 if a is None else (a.data.ptr, a.nbytes) for a in arrays]))
        return prepared(self, *arrays, stream=stream)
    L.Prepared.__call__ = call
    L._go = lambda *a: None
    import numpy as np
    import minidnn.backend as B
    from minidnn.nn import functional as F
    from minidnn.nn._functions import conv as C
    from minidnn.tensor import Tensor
    C.CARRY_X[0] = False        # x staged in the backward too (its carried copy: test_conv_filter_carry.py)
    out = {{}}
    desc = B.ConvolutionDescriptor((1, 1))
    for rep, (xs, ws) in enumerate([((128, 16, 32, 32), (16, 16, 3, 3)), ((64, 32, 16, 16), (32, 32, 3, 3)),
                                    ((128, 16, 32, 32), (16, 16, 3, 3))]):
        xa, wa, gya = fakecp.zeros(xs), fakecp.zeros(ws), fakecp.zeros(xs)
        x, w = Tensor._from_array(xa), Tensor._from_array(wa)
        x.requires_grad = w.requires_grad = True
        y = F.conv2d(x, w, padding=1)
        del recs[:]
        y.backward(Tensor._from_array(gya))
        out["bwd%d" % rep] = list(recs)
        del recs[:]
        B.convolution_backward_filter(None, xa, gya, desc, ws)
        out["apart%d" % rep] = list(recs)
    json.dump(out, sys.stdout)
""")


def test_staged_copies_in_a_scope_are_distinct_and_shared_by_the_two_calls():
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    for rep in range(3):
        for key in ("bwd%d" % rep, "apart%d" % rep):
            recs = out[key]
            mains = [arrs for name, arrs in recs if name != "nchw_to_nhwc"]
            copies = [arrs for name, arrs in recs if name == "nchw_to_nhwc"]      # staging and filter copies
            assert mains and copies, recs
            for arrs in mains:          # no two array arguments of a kernel share memory (nulls and tables apart)
                spans = sorted((p, p + n) for p, n in (a for a in arrs if a) if n)
                assert all(e1 <= s2 for (s1, e1), (s2, e2) in zip(spans, spans[1:])), arrs
            written = {arrs[1][0] for arrs in copies}                  # each staging copy's destination
            read = {a[0] for arrs in mains for a in arrs[:2] if a}
            assert written <= read, (written, read)                     # every copy is what a kernel reads
        staged = [arrs for name, arrs in out["bwd%d" % rep] if name == "nchw_to_nhwc" and arrs[0][1] > 2 ** 20]
        # one dy copy for both gradients, one x copy for the filter gradient, into two different buffers
        assert len(staged) == 2 and staged[0][1][0] != staged[1][1][0], staged
