"""Session 9's vector column sum (norm_kernels col_sum_v: the bias gradient of a channel-last / (N, C) dy, inner = 1)
against float64 sums, and against the scalar col_sum (MINIDNN_COLSUM_VEC=0) on the same inputs.

CPU: the grid geometry and the kernel's walk emulated in NumPy (every element of the matrix summed exactly once, by
the block of its column tile and row split; every split non-empty; the final pass covers every column once); every
dtype's col_sum_v compiles with nvcc without spills.  GPU (marked cuda): one launch, values against float64 over
shapes with row tails, few rows, C = one vector, wide tiles with a column tail, the float32 (wide) output of 16-bit
dy, the fallback for a C that is no multiple of the vector or a misaligned dy, and a second call (tickets re-zeroed).
"""
import re
import shutil
import subprocess

import numpy as np
import pytest

from minidnn.backend import devices as _dev
from minidnn.backend.cuda import norm_kernels as NK
from tests.backend.test_norm_kernels import Counted, _close, _draw, _dtype, _h

# ---- CPU ---------------------------------------------------------------------------------------------------------

def _emulate(r, nc, itemsize, sms, cx=NK.COLSUM_CX, per_sm=NK.COLSUM_BLOCKS_PER_SM):
    """How many times col_sum_v's threads read each element of an (r, nc) matrix, and how many times its last
    blocks' final pass writes each column -- the kernel's loops transcribed (thread t: tx = t % CX, ty = t / CX),
    the CX threads of a thread row at once (they differ only in their columns)."""
    vec, tiles, splits, chunk = NK.col_sum_v_geometry(r, nc, itemsize, sms, cx, per_sm)
    ry, cols = 256 // cx, cx * vec
    parts = 256 // cols
    reads = np.zeros((r, nc), np.int64)
    written = np.zeros(nc, np.int64)
    for bx in range(tiles):
        for by in range(splits):
            r0 = by * chunk
            r1 = min(r0 + chunk, r)
            assert r0 < r1, "an empty split"
            # the cx threads of thread row ty (t = ty * cx + tx) walk the same rows, each its own vector of columns
            # vc = bx * cx + tx (none past the last vector): their reads together cover columns [c0, c1)
            live = [tx for tx in range(cx) if (bx * cx + tx) * vec < nc]
            if not live:
                continue
            assert live == list(range(len(live)))
            c0, c1 = bx * cx * vec, (bx * cx + len(live)) * vec
            for ty in range(256 // cx):
                rr = r0 + ty
                while rr + 3 * ry < r1:                 # the batches of four
                    for k in range(4):
                        reads[rr + k * ry, c0:c1] += 1
                    rr += 4 * ry
                while rr < r1:
                    reads[rr, c0:c1] += 1
                    rr += ry
        for t in range(256):                            # the last block's final pass: thread t < CS_COLS, column col
            col = bx * cols + t
            if t < cols and col < nc:
                written[col] += 1
        assert parts * cols == 256
    return reads, written, splits


@pytest.mark.parametrize("r, nc, itemsize, sms", [(16384, 1024, 4, 132), (16384, 1024, 2, 132), (1000, 64, 4, 132),
                                                  (37, 8, 2, 132), (7, 4, 4, 114), (4099, 40, 8, 16),
                                                  (300, 24, 4, 8)])
def test_col_sum_v_walk_covers_each_element_once(r, nc, itemsize, sms):
    reads, written, splits = _emulate(r, nc, itemsize, sms)
    assert (reads == 1).all()
    assert (written == 1).all()
    assert 1 <= splits <= 65535


def test_col_sum_v_geometry():
    """About COLSUM_BLOCKS_PER_SM blocks an SM over the tiles; splits of at least one block-row of rows each."""
    assert NK.col_sum_v_geometry(16384, 1024, 4, 132) == (4, 32, 17, 964)       # 544 blocks, 128 B a row a warp
    assert NK.col_sum_v_geometry(16384, 1024, 2, 132) == (8, 16, 33, 497)
    assert NK.col_sum_v_geometry(3, 8, 4, 132) == (4, 1, 1, 3)
    vec, tiles, splits, chunk = NK.col_sum_v_geometry(401408, 64, 4, 132)         # (128, 64, 56, 56) channels-last
    assert (vec, tiles) == (4, 2) and tiles * splits == 528 and chunk * splits >= 401408


def test_bias_grad_routes(monkeypatch):
    """inner = 1 goes to col_sum_v where dy is aligned and C a multiple of the vector (COLSUM_VEC on), else col_sum;
    the NCHW bias gradient (inner > 1) is untouched."""
    import types
    seen = []
    monkeypatch.setattr(NK, "_col_sum_v_plan", lambda *a: seen.append("vec") or ("go", 1, 1))
    monkeypatch.setattr(NK, "_col_sum_plan", lambda *a: seen.append("scalar") or ("go", 1, 1))
    dy = types.SimpleNamespace(shape=(64, 1024, 1), dtype=np.dtype(np.float32))
    for on, aligned, c, want in ((True, True, 1024, "vec"), (True, False, 1024, "scalar"), (True, True, 1022, "scalar"),
                                 (False, True, 1024, "scalar")):
        monkeypatch.setattr(NK, "COLSUM_VEC", on)
        dy.shape = (64, c, 1)
        NK._bias_grad_plan(dy, 1, aligned, 0)
        assert seen.pop() == want, (on, aligned, c)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16", "float64"])
def test_col_sum_v_compiles(tmp_path, name):
    dtype = _dtype(name)
    opts = NK.options(dtype, NK._PSTORAGE[_dev.dtype_name(dtype)], vec=16 // dtype.itemsize,
                      defs=(("CX", NK.COLSUM_CX),))
    src = tmp_path / "k.cu"
    src.write_text(NK.SOURCE)
    # ptxas builds only col_sum_v (--entry: its registers and spills are its own, as in the whole module)
    r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v,--entry=col_sum_v", "-o",
                        str(tmp_path / "k.cubin"), *opts, str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"Compiling entry function 'col_sum_v'.*?(\d+) bytes spill stores", r.stderr, re.S)
    assert m is not None and int(m.group(1)) == 0


# ---- GPU ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


def _forget_plans():
    NK._plans.clear()


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", [(16384, 1024), (2049, 8), (5, 256), (1, 16), (7001, 264), (40000, 24)])
@pytest.mark.parametrize("wide", [False, True])
def test_col_sum_v_bias_grad(cp, monkeypatch, name, shape, wide):
    if wide and name in ("float32", "float64"):
        pytest.skip("the float32 output is for 16-bit dy")
    dtype = _dtype(name)
    rng = np.random.default_rng(hash((shape, name, wide)) % 2 ** 32)
    dy = _draw(rng, shape, dtype)
    want = dy.astype(np.float64).sum(axis=0)
    out = {}
    for on in (True, False):
        monkeypatch.setattr(NK, "COLSUM_VEC", on)
        _forget_plans()
        g = cp.asarray(dy).reshape(shape + (1,))         # (N, C, 1): a linear layer's bias gradient
        with Counted() as cnt:
            db = NK.bias_grad(g, 1, np.float32 if wide else None)
        assert cnt.n == 1
        assert db.dtype == (np.float32 if wide else dtype) and db.shape == (shape[1],)
        _close(db, want, "float32" if wide else name, shape[0], what="stat" if wide else "data-sum")
        again = NK.bias_grad(g, 1, np.float32 if wide else None)        # tickets left zeroed: the same sums
        np.testing.assert_array_equal(_h(again), _h(db))
        out[on] = _h(db)
    rtol = 1e-5 if wide else {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}[name]
    np.testing.assert_allclose(out[True], out[False], rtol=rtol,     # 16-bit db: each rounded once, maybe apart
                               atol=1e-5 * np.abs(dy.astype(np.float64)).sum(axis=0).max() / shape[0] ** 0.5)


@pytest.mark.cuda
def test_col_sum_v_falls_back(cp, monkeypatch):
    """C not a multiple of the vector, or dy off 16 bytes: the scalar col_sum, same values."""
    monkeypatch.setattr(NK, "COLSUM_VEC", True)
    _forget_plans()
    rng = np.random.default_rng(3)
    dy = rng.standard_normal((3001, 1030)).astype(np.float32)
    want = dy.astype(np.float64).sum(axis=0)
    db = NK.bias_grad(cp.asarray(dy).reshape(3001, 1030, 1), 1)
    _close(db, want, "float32", 3001, what="data-sum")
    flat = cp.asarray(np.concatenate([[0.0], dy[:, :1024].ravel()]).astype(np.float32))
    mis = flat[1:].reshape(3001, 1024, 1)                  # 4 bytes off a 16-byte boundary
    assert mis.data.ptr % 16 == 4
    db = NK.bias_grad(mis, 1)
    _close(db, want[:1024], "float32", 3001, what="data-sum")
    assert ("bias_grad", (3001, 1024, 1), np.dtype(np.float32), 1, False, mis.data.device_id) in NK._plans
