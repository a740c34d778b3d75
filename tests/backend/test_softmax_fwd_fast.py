"""Session 12: softmax_kernels.FWD_FAST, the float32 PIPE softmax / log-softmax forward with the SFX exp
(docs/step_kernels.md, "Session 12: cross-entropy and softmax forward").

CPU: the rule (SFX only for float32 forwards that take PIPE; "3" also 128-thread blocks at 96 registers, five an SM;
everything else as "0"), the walk with "3"'s grid (every row once, by the group holding its loads), nvcc sm_90 builds
of the planned forwards without spills.
GPU (cuda-marked): every setting against the float64 reference and close to "0" (softmax, log-softmax, fast; rows of
-inf, NaN, a half -inf row, a row shifted by +80 and one of large spread, ragged 1001 / 513, 10-wide rows of
sub-warp groups, row counts that leave the last step partly empty), one launch a call; float32 only changes.
"""
import re
import shutil
import subprocess

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import softmax_kernels as _sk
from tests.backend.test_softmax_rows_cuda import _close, _defs, _dtype, _host, _launches, _ref_fwd, _reset_plans

SHAPES = [(16384, 1000), (4096, 32000), (65536, 128), (128, 10), (3000, 1001), (5000, 513), (64, 33), (8, 4097)]


@pytest.mark.parametrize("setting", ["0", "1", "2", "3", "x"])
def test_softmax_fast_rule(monkeypatch, setting):
    """FWD_FAST adds SFX (1, or 2 for "2") to float32 forwards that take PIPE; "3" also plans 128-thread blocks at
    FAST3_REGS registers for whole-vector rows (MINB 5, the grid MINB an SM); backwards, other dtypes, non-PIPE
    rows and unknown values plan as "0"."""
    for name in ("float32", "bfloat16", "float16", "float64"):
        for shape in SHAPES:
            for algo in ("FAST", "ACCURATE", "LOG"):
                for backward in (False, True):
                    monkeypatch.setattr(_sk, "FWD_FAST", "0")
                    base = _sk.launch_spec(backward, shape, (1,), algo, _dtype(name))
                    monkeypatch.setattr(_sk, "FWD_FAST", setting)
                    spec = _sk.launch_spec(backward, shape, (1,), algo, _dtype(name))
                    d, d0 = _defs(spec.defines), _defs(base.defines)
                    take = (setting in ("1", "2", "3") and name == "float32" and not backward
                            and d0.get("PIPE") == 1)
                    if not take:
                        assert spec == base, (setting, name, shape, algo, backward)
                        continue
                    assert d["SFX"] == (2 if setting == "2" else 1)
                    other = {k: v for k, v in d.items() if k != "SFX"}
                    if setting == "3" and d0["BLOCK"] == 256 and d0["RAGGED"] == 0:
                        assert d["BLOCK"] == 128 and d["MINB"] == 65536 // (128 * _sk.FAST3_REGS) == 5
                        assert spec.block == 128 and spec.per_sm == d["MINB"]
                        assert spec.groups == -(-shape[0] // (128 // d["G"]))
                        assert {k: v for k, v in other.items() if k not in ("BLOCK", "MINB")} == \
                            {k: v for k, v in d0.items() if k not in ("BLOCK", "MINB")}
                    else:
                        assert other == d0 and spec[3:] == base[3:], (spec, base)


@pytest.mark.parametrize("rows, rpb, grid", [(16384, 4, 660), (6000, 4, 660), (37, 4, 5), (20000, 16, 660),
                                             (130, 16, 4), (1, 4, 1), (2113, 4, 660), (2641, 4, 660)])
def test_fast3_walk_covers_each_row_once(rows, rpb, grid):
    """fwd_rows_pipe's walk with "3"'s 128-thread blocks (RPB = 128 / G) on its grid of five blocks an SM: every row
    processed once, by the group that issued its loads (the emulation of test_pipe_walk_covers_each_row_once)."""
    from tests.backend.test_softmax_rows_cuda import test_pipe_walk_covers_each_row_once as walk
    walk(rows, rpb, grid)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_softmax_fast_compiles_without_spills(tmp_path, monkeypatch):
    """nvcc sm_90 builds softmax_rows_fwd under every FWD_FAST setting at the float32 row lengths that take PIPE,
    every algorithm: no spill in the forward."""
    from minidnn.backend.cuda import launch
    jobs = {}
    for setting in ("1", "2", "3"):
        monkeypatch.setattr(_sk, "FWD_FAST", setting)
        for c in (10, 33, 128, 513, 1000, 1001, 1024):
            for algo in ("FAST", "ACCURATE", "LOG"):
                s = _sk.launch_spec(False, (16384, c), (1,), algo, np.float32)
                if "SFX" in _defs(s.defines):
                    jobs[s.defines] = (setting, c, algo)
    assert len(jobs) >= 20
    for i, (defines, what) in enumerate(jobs.items()):
        src = tmp_path / f"sfx_{i}.cu"
        launch.write_source(str(src), _sk.SOURCE, defines)
        r = subprocess.run(["nvcc", "-std=c++14", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(src) + ".o",
                            str(src)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[:1500]
        m = re.search(r"Compiling entry function 'softmax_rows_fwd'.*?(\d+) bytes spill stores", r.stderr, re.S)
        assert m is not None and int(m.group(1)) == 0, (what, r.stderr[-800:])


# ---- GPU -------------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


FAST_ROWS = [("float32", 6000, 1000), ("float32", 16384, 1000), ("float32", 3000, 1001), ("float32", 5000, 513),
             ("float32", 20000, 10), ("float32", 2113, 1024), ("float32", 777, 128), ("bfloat16", 3000, 1000)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", FAST_ROWS, ids=[f"{n}-{r}x{c}" for n, r, c in FAST_ROWS])
def test_softmax_fast_rows(cp, monkeypatch, name, rows, c):
    """Each FWD_FAST setting against the float64 reference and close to "0" (bfloat16: bitwise "0", it is not
    changed); one launch a call."""
    dtype = _dtype(name)
    rng = np.random.default_rng(rows + 3 * c)
    x = (rng.standard_normal((rows, c)) * 3).astype(dtype)
    x[1, :] = -np.inf
    x[2, c // 3] = np.nan
    x[rows - 1, ::2] = -np.inf
    x[4, :] += dtype.type(80)                                # the exp's argument error grows with |x|
    x[5, :] *= dtype.type(20)                                # a wide spread: most exps underflow
    x64 = x.astype(np.float64)
    xd = cp.asarray(x)
    got = {}
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        for setting in ("0", "1", "2", "3"):
            monkeypatch.setattr(_sk, "FWD_FAST", setting)
            _reset_plans()
            for algo in ("accurate", "log", "fast"):
                n0 = _launches()
                y = B.softmax_forward(None, algo, None, xd, axis=-1)
                assert _launches() - n0 == 1
                ref = _ref_fwd(x64, algo)
                if algo == "fast":                          # float exp(x) overflows in rows 4 (+80) and 5 (x 20)
                    keep = ~(np.where(np.isfinite(x64), x64, 0).max(axis=1) > 60)   # (GPU run 3: float64's did not)
                    _close(_host(y)[keep], ref[keep], name, f"{algo} FWD_FAST={setting}")
                else:
                    _close(y, ref, name, f"{algo} FWD_FAST={setting}", scale=4 if algo == "log" else 1)
                got[setting, algo] = _host(y)
    for (setting, algo), a in got.items():
        b = got["0", algo]
        if setting == "0":
            continue
        if name != "float32":
            np.testing.assert_array_equal(a, b, err_msg=f"{setting} {algo}")
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7 if algo != "log" else 1e-5, equal_nan=True,
                                       err_msg=f"{setting} {algo}")
