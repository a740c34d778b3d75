"""Session 20 (issue 10): the NCHW global average pooling forward with four 16-byte vectors in flight a thread
(pool_kernels.GAP_UNROLL, MINIDNN_GAP_UNROLL=2) -- the same two accumulator chains adding the same values in the
same order as the two-vector loop, so the same bits.

CPU: the define only when on (off: the kernels' options as before); a bad environment value fails at import; nvcc:
the unrolled kernel compiles without spills and issues four vector loads before its adds.  GPU (marked cuda): the
forward bitwise equal on and off -- vec 8 / 4 / 1 planes, tails of one to three vectors, teams of 32 and more
threads -- and close to the float64 mean.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import pool_kernels as P
from tests import _nvcc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_define_only_when_on():
    off = P.options(np.dtype(np.float32), np.dtype(np.uint8), False, False, False, team=64, vec=4)
    on = P.options(np.dtype(np.float32), np.dtype(np.uint8), False, False, False, team=64, vec=4, gu=2)
    assert not any("GU" in o for o in off) and on == off[:-1] + ("-DGU=2",) + off[-1:]


@pytest.mark.parametrize("value", ["3", "0"])
def test_a_bad_environment_value_fails_at_import(value):
    r = subprocess.run([sys.executable, "-c", "import minidnn.backend.cuda.pool_kernels"], cwd=ROOT,
                       env={**os.environ, "MINIDNN_GAP_UNROLL": value, "PYTHONPATH": ROOT}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "MINIDNN_GAP_UNROLL=" in r.stderr, r.stderr[-2000:]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_unrolled_kernel_compiles_without_spills():
    units = []
    for dt, vec in ((np.float32, 4), (np.float16, 8)):
        for team in (32, 128):
            opts = P.options(np.dtype(dt), np.dtype(np.uint8), False, False, False, team=team, vec=vec, gu=2)
            units.append((P.SOURCE, [o[2:] for o in opts if o.startswith("-D")]))
    for r in _nvcc.build(units, ("-std=c++14",)):
        assert r.returncode == 0, r.stderr[-2000:]
        spills = [line for line in r.stderr.splitlines() if "spill stores" in line]
        assert spills and all(" 0 bytes spill stores" in line for line in spills), r.stderr
    for r in _nvcc.build(units[:1], ("-std=c++14",), ptx=True):
        body = r.ptx["gap_fwd"]
        loop = body[body.index("ld.global.nc.v4"):]        # the first loop's loads: four before any add
        first_add = loop.index("add.f32")
        assert loop[:first_add].count("ld.global.nc.v4") >= 4, loop[:first_add]


@pytest.fixture
def cp(monkeypatch):
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    yield _dev.require_cupy()


CASES = [("bfloat16", (32, 256, 56, 56)), ("float32", (8, 64, 28, 28)), ("float16", (4, 32, 17, 24)),
         ("float32", (2, 3, 64, 64)), ("float32", (5, 7, 13, 11)), ("bfloat16", (3, 5, 9, 40))]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape", CASES, ids=str)
def test_unrolled_forward_is_bitwise_the_two_vector_one(cp, monkeypatch, name, shape):
    dt = np.dtype(pytest.importorskip("ml_dtypes").bfloat16) if name == "bfloat16" else np.dtype(name)
    xh = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dt)
    x = cp.asarray(xh)
    desc = B.PoolingDescriptor("average_count_include_padding", shape[2:], 0, shape[2:])
    got = []
    for gu in (1, 2):
        monkeypatch.setattr(P, "GAP_UNROLL", gu)
        got.append(cp.asnumpy(B.pooling_forward(None, desc, x)))
    assert np.array_equal(got[0].view(np.uint8), got[1].view(np.uint8))
    ref = xh.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[name]
    np.testing.assert_allclose(got[1].astype(np.float64), ref, rtol=tol, atol=tol)
