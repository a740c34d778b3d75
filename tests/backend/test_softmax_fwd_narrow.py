"""Session 12, round 2: softmax_kernels.FWD_NARROW, sub-warp groups for short PIPE forward rows (docs/step_kernels.md,
"Session 12: cross-entropy and softmax forward").

CPU: the rule (only softmax / log-softmax forwards that take PIPE and whose threads hold fewer than NARROW elements
change: NV = NARROW / VEC, G the power of two covering the row, 2 <= G <= 32; everything else -- backwards,
cross-entropy, non-PIPE rows, "0" and unknown values -- plans the default), every element of a row held by exactly
one thread of its group (head / body / tail, at every row start a RAGGED row can have), the walk covering each row
once on the narrow grid, nvcc sm_90 builds of the narrow forwards without spills.
GPU (cuda-marked): "16" and "32" against the float64 reference and against "0" -- bitwise where the plan is the
default's, else within float32's rounding -- for odd widths (1, 7, 33, 100, 127, 129, 500, 513), the bench widths
(64, 128, 256, 512, 1000), bfloat16 rows; rows of -inf, a NaN, half -inf, +80, and (fast) only rows whose float32
exp sum cannot overflow; one launch a call.
"""
import re
import shutil
import subprocess

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import loss_kernels as _lk
from minidnn.backend.cuda import softmax_kernels as _sk
from tests.backend.test_softmax_rows_cuda import _close, _defs, _dtype, _host, _launches, _ref_fwd, _reset_plans

WIDTHS = [1, 2, 7, 10, 16, 32, 33, 64, 100, 127, 128, 129, 200, 256, 500, 512, 513, 1000, 1001, 4097]


def _spec(backward, c, name, algo="ACCURATE", rows=65536):
    return _sk.launch_spec(backward, (rows, c), (1,), algo, _dtype(name))


@pytest.mark.parametrize("setting", ["0", "16", "32", "x"])
def test_narrow_rule(monkeypatch, setting):
    """Which plans NARROW changes, and to what (module docstring)."""
    for name in ("float32", "bfloat16", "float16", "float64"):
        for c in WIDTHS:
            for algo in ("FAST", "ACCURATE", "LOG"):
                for backward in (False, True):
                    monkeypatch.setattr(_sk, "FWD_NARROW", "0")
                    base = _spec(backward, c, name, algo)
                    monkeypatch.setattr(_sk, "FWD_NARROW", setting)
                    spec = _spec(backward, c, name, algo)
                    d, d0 = _defs(spec.defines), _defs(base.defines)
                    target = int(setting) if setting in ("16", "32") else 0
                    nvec = c // d0["VEC"]
                    nv = min(target // d0["VEC"], 1 << max(0, nvec - 1).bit_length()) if target else 1
                    g = 1 << max(0, -(-nvec // nv) - 1).bit_length()
                    want = bool(target and not backward and d0.get("PIPE") == 1 and d0["NV"] * d0["VEC"] < target
                                and g >= 2)
                    if not want:
                        assert spec == base, (setting, name, c, algo, backward)
                        continue
                    assert d["NV"] * d["VEC"] == target or d["NV"] * d["VEC"] >= c, (c, d)
                    assert d["VEC"] == d0["VEC"] and d["RAGGED"] == d0["RAGGED"] and d["PIPE"] == 1
                    assert 2 <= d["G"] <= 32 and d["G"] & (d["G"] - 1) == 0 and d["G"] < d0["G"]
                    assert d["G"] * d["NV"] >= c // d["VEC"] > (d["G"] // 2) * d["NV"], (c, d)
                    assert spec.groups == -(-65536 // (spec.block // d["G"])) and spec.per_sm == d["MINB"]
                    assert spec.source == base.source and spec.name == base.name and spec.smem == 0


def test_narrow_leaves_cross_entropy_alone(monkeypatch):
    for c in (10, 64, 128, 256, 1000):
        for name in ("float32", "bfloat16"):
            monkeypatch.setattr(_sk, "FWD_NARROW", "0")
            base = [_lk.launch_spec(k, (4096, c), _dtype(name), np.int64, False, "mean") for k in ("ce_fwd", "ce_bwd")]
            monkeypatch.setattr(_sk, "FWD_NARROW", "16")
            assert [_lk.launch_spec(k, (4096, c), _dtype(name), np.int64, False, "mean")
                    for k in ("ce_fwd", "ce_bwd")] == base


@pytest.mark.parametrize("setting", ["16", "32"])
def test_narrow_groups_hold_each_element_once(monkeypatch, setting):
    """Emulates the PIPE group's slots (pipe_issue: thread g, body vector k * G + g < nb at element h + v * VEC;
    thread 0 the head [0, h), thread G - 1 the tail) for every head a row can have (RAGGED rows start at r * C)."""
    monkeypatch.setattr(_sk, "FWD_NARROW", setting)
    for name in ("float32", "bfloat16", "float16"):
        for c in WIDTHS:
            d = _defs(_spec(False, c, name).defines)
            if d.get("PIPE") != 1:
                continue
            g, nv, vec = d["G"], d["NV"], d["VEC"]
            heads = sorted({(-(r * c)) % vec for r in range(vec)}) if d["RAGGED"] else [0]
            for h in heads:
                h = min(h, c)
                nb = (c - h) // vec
                seen = np.zeros(c, np.int64)
                for t in range(g):
                    for k in range(nv):
                        v = k * g + t
                        if v < nb:
                            seen[h + v * vec: h + (v + 1) * vec] += 1
                    if d["RAGGED"]:
                        if t == 0:
                            seen[:h] += 1
                        if t == g - 1:
                            seen[h + nb * vec:] += 1
                assert (seen == 1).all(), (name, c, d, h)
                assert d["RAGGED"] or nb * vec == c


@pytest.mark.parametrize("rows, c", [(65536, 128), (262144, 64), (32768, 256), (37, 33), (100000, 100)])
def test_narrow_walk_covers_each_row_once(monkeypatch, rows, c):
    """fwd_rows_pipe's walk on the narrow grid (the resident blocks, MINB an SM on 132 SMs): group k of block b
    takes rows b * RPB + k + i * grid * RPB -- each row once."""
    monkeypatch.setattr(_sk, "FWD_NARROW", "16")
    s = _spec(False, c, "float32", rows=rows)
    grid = max(1, min(s.groups, 132 * s.per_sm))
    rpb = s.block // _defs(s.defines)["G"]
    seen = np.zeros(rows, np.int64)
    for b in range(grid):
        r = np.arange(b * rpb, rows, grid * rpb)
        for k in range(rpb):
            rr = r + k
            seen[rr[rr < rows]] += 1
    assert (seen == 1).all()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_narrow_compiles_without_spills(tmp_path, monkeypatch):
    from minidnn.backend.cuda import launch
    jobs = {}
    for setting in ("16", "32"):
        monkeypatch.setattr(_sk, "FWD_NARROW", setting)
        for name in ("float32", "bfloat16"):
            for c in (64, 128, 129, 256):
                for algo in ("ACCURATE", "LOG"):
                    s = _spec(False, c, name, algo)
                    monkeypatch.setattr(_sk, "FWD_NARROW", "0")
                    if s != _spec(False, c, name, algo):
                        jobs[s.defines] = (setting, name, c, algo)
                    monkeypatch.setattr(_sk, "FWD_NARROW", setting)
    assert len(jobs) >= 20
    for i, (defines, what) in enumerate(jobs.items()):
        src = tmp_path / f"narrow_{i}.cu"
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


# rows so that each group walks several steps and the last step is partly empty
NARROW_ROWS = [("float32", 5000, 1), ("float32", 9000, 7), ("float32", 20000, 33), ("float32", 30000, 64),
               ("float32", 9000, 100), ("float32", 4000, 127), ("float32", 17000, 128), ("float32", 6000, 129),
               ("float32", 9000, 256), ("float32", 3000, 500), ("float32", 2113, 512), ("float32", 3000, 513),
               ("float32", 3000, 1000), ("bfloat16", 30000, 64), ("bfloat16", 17000, 128), ("bfloat16", 9000, 256),
               ("bfloat16", 3000, 100)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", NARROW_ROWS, ids=[f"{n}-{r}x{c}" for n, r, c in NARROW_ROWS])
def test_softmax_narrow_rows(cp, monkeypatch, name, rows, c):
    dtype = _dtype(name)
    rng = np.random.default_rng(rows + 11 * c)
    x = (rng.standard_normal((rows, c)) * 3).astype(dtype)
    x[1, :] = -np.inf
    x[2, c // 2] = np.nan
    x[rows - 1, ::2] = -np.inf
    x[5, :] += dtype.type(80)                                  # exp overflows without the max shift
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        safe = np.isfinite(np.exp(x.astype(np.float32)).sum(axis=1, dtype=np.float32))   # "fast": no overflow
    xd = cp.asarray(x)
    got, plans = {}, {}
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for setting in ("0", "16", "32"):
            monkeypatch.setattr(_sk, "FWD_NARROW", setting)
            _reset_plans()
            for algo in ("accurate", "log", "fast"):
                plans[setting, algo] = _spec(False, c, name, {"accurate": "ACCURATE", "log": "LOG",
                                                              "fast": "FAST"}[algo], rows)
                n0 = _launches()
                y = B.softmax_forward(None, algo, None, xd, axis=-1)
                assert _launches() - n0 == 1
                y = _host(y)
                rows_ok = safe if algo == "fast" else np.ones(rows, bool)
                _close(y[rows_ok], _ref_fwd(x64[rows_ok], algo), name, f"{algo} NARROW={setting}",
                       scale=4 if algo == "log" else 1)
                got[setting, algo] = y
    for (setting, algo), y in got.items():
        if setting == "0":
            continue
        y0 = got["0", algo]
        if plans[setting, algo] == plans["0", algo]:
            np.testing.assert_array_equal(y, y0, err_msg=f"{setting} {algo}: the default's kernel")
        else:
            ok = np.isfinite(y0).all(axis=1) & (safe if algo == "fast" else True)
            tol = 1e-5 if name == "float32" else 2.0 ** -7
            np.testing.assert_allclose(y[ok], y0[ok], rtol=tol * (4 if algo == "log" else 1),
                                       atol=tol * 1e-2 * np.abs(y0[ok]).max(), err_msg=f"{setting} {algo}")
            nan_rows = ~ok & (safe if algo == "fast" else True)      # -inf / NaN rows: NaN where the default's
            np.testing.assert_array_equal(np.isnan(y[nan_rows]), np.isnan(y0[nan_rows]))
