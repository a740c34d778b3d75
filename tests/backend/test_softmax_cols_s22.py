"""Softmax / log-softmax over dim 1 of (outer, C, inner) -- the COLS_V2 column kernels (session 22:
softmax_kernels.softmax_cols2_fwd / _bwd).  CPU: the planner's defines (the class count compiled in up to
COLS_CC_MAX, chunks beyond, PAIR for 16-bit data with inner even) and an nvcc build of the planned configurations
with no spills.  cuda: forward and backward against float64 references and against the session-7 kernels
(COLS_V2 off), special values, the grid-stride walk, 16-bit views off 4-byte boundaries."""
import re
import shutil

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import softmax_kernels as _sk
from tests import _nvcc
from tests.backend.test_softmax_rows_cuda import _close, _dtype, _host, _mag_bwd, _ref_bwd, _ref_fwd, _reset_plans

NAMES = ("float32", "float64", "bfloat16", "float16")
CLASSES = (1, 2, 7, 12, 13, 16, 17, 19, 21, 22, 32, 33, 150, 1000)
ALGOS = ("FAST", "ACCURATE", "LOG")


def _defs(spec):
    return dict(d.split("=", 1) for d in spec.defines)


# ---- CPU: the planner ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_cols_v2_defines(monkeypatch, name):
    """CC = C exactly where C <= COLS_CC_MAX of (direction, item size, PAIR), else 0 (chunks of COLS_U); PAIR only for
    16-bit data with inner even (and a backward PAIR only up to its own bound or past the one-column bound); grid
    groups a word of columns a thread; COLS_V2 off gives the session-7 kernels, COLS_PAIR off one column a thread."""
    monkeypatch.setattr(_sk, "COLS_V2", True)
    monkeypatch.setattr(_sk, "COLS_PAIR", True)
    dt = _dtype(name)
    item = dt.itemsize
    for c in CLASSES:
        for inner in (35, 36, 2):
            for backward in (False, True):
                for algo in ALGOS:
                    s = _sk.launch_spec(backward, (3, c, inner), (1,), algo, dt)
                    d = _defs(s)
                    assert s.source == "COLS" and s.name == ("softmax_cols2_bwd" if backward else "softmax_cols2_fwd")
                    assert d["ALGO"] == str({"FAST": 0 if not backward else 1, "ACCURATE": 1, "LOG": 2}[algo])
                    pair = item == 2 and inner % 2 == 0 and not (
                        _sk.COLS_CC_MAX[backward, 2, True] < c <= _sk.COLS_CC_MAX[backward, 2, False])
                    assert d["PAIR"] == str(int(pair)), (c, inner, backward)
                    bound = _sk.COLS_CC_MAX[backward, item, pair]
                    assert d["CC"] == str(c if c <= bound else 0), (c, backward, pair)
                    assert d["U"] == str(_sk.COLS_U) and d["CMINB"] == ("2" if item == 8 else "4")
                    assert s.groups == -(-(3 * inner) // (512 if pair else 256)) and s.block == 256
    # the exact bounds at the headline shapes
    assert _defs(_sk.launch_spec(False, (16, 19, 65536), (1,), "LOG", _dtype("float32")))["CC"] == "19"
    assert _defs(_sk.launch_spec(True, (16, 19, 65536), (1,), "LOG", _dtype("float32")))["CC"] == "19"
    assert _defs(_sk.launch_spec(False, (8, 150, 4096), (1,), "ACCURATE", _dtype("float32")))["CC"] == "0"
    monkeypatch.setattr(_sk, "COLS_PAIR", False)
    assert _defs(_sk.launch_spec(False, (3, 7, 36), (1,), "LOG", dt))["PAIR"] == "0"
    monkeypatch.setattr(_sk, "COLS_V2", False)
    s = _sk.launch_spec(False, (3, 19, 36), (1,), "LOG", dt)
    assert s.name == "softmax_cols_fwd" and _defs(s)["CREG"] == "32"


def test_cols_v2_minb_override(monkeypatch):
    """COLS_MINB_SET (MINIDNN_SOFTMAX_COLS_MINB) replaces the blocks an SM of every COLS_V2 plan (an occupancy A/B)."""
    monkeypatch.setattr(_sk, "COLS_V2", True)
    monkeypatch.setattr(_sk, "COLS_MINB_SET", 5)
    assert _defs(_sk.launch_spec(False, (3, 19, 36), (1,), "LOG", _dtype("float32")))["CMINB"] == "5"


def _planned():
    """(kernel, defines) of every distinct COLS_V2 plan over NAMES x CLASSES x inner parity x direction x ALGOS."""
    out = {}
    saved = _sk.COLS_V2, _sk.COLS_PAIR, _sk.COLS_MINB_SET
    try:
        _sk.COLS_V2, _sk.COLS_PAIR, _sk.COLS_MINB_SET = True, True, 0
        for name in NAMES:
            for c in CLASSES:
                for inner in (35, 36):
                    for backward in (False, True):
                        for algo in ALGOS:
                            s = _sk.launch_spec(backward, (3, c, inner), (1,), algo, _dtype(name))
                            out[(s.name, s.defines)] = None
    finally:
        _sk.COLS_V2, _sk.COLS_PAIR, _sk.COLS_MINB_SET = saved
    return list(out)


def _at_bound(item):
    k, defines = item
    d = dict(x.split("=", 1) for x in defines)
    item_size = {"0": 8 if d["SCALAR"] == "double" else 4}.get(d["STORAGE"], 2)
    return int(d["CC"]) == _sk.COLS_CC_MAX[k.endswith("bwd"), item_size, d["PAIR"] == "1"] or d["CC"] == "0"


# the builds at each bound (the most registers) and chunked ones always; then a cover of every define value and pair
COLS_BUILDS = _nvcc.cover(_planned(), lambda b: _nvcc.define_features([b[0]], b[1]), _at_bound)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cols_v2_compile_without_spills():
    """nvcc sm_90: every planned COLS_V2 configuration builds with no spills within its launch bounds (64 registers at
    four 256-thread blocks an SM, 128 at two for float64)."""
    built = _nvcc.build([(_sk.SOURCE_COLS, d) for _, d in COLS_BUILDS], entries=[(k,) for k, _ in COLS_BUILDS])
    for (k, defines), r in zip(COLS_BUILDS, built):
        assert r.returncode == 0, r.stderr[:1500]
        m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores.*?Used (\d+) registers" % k,
                      r.stderr, re.S)
        assert m is not None, r.stderr[:1500]
        d = dict(x.split("=", 1) for x in defines)
        assert int(m.group(1)) == 0, (k, defines)
        assert int(m.group(2)) <= 65536 // (256 * int(d["CMINB"])), (k, defines, m.group(2))


def test_cols_v2_pair_refused_for_wide_data():
    """PAIR is a 16-bit layout: a build asking it for float32 fails to compile (an #error), never runs wrong."""
    assert "#error" in _sk.SOURCE_COLS and "PAIR && STORAGE == 0" in _sk.SOURCE_COLS


# ---- cuda ----------------------------------------------------------------------------------------------------------

def _cols_ref(x, algo, backward=False, dy=None):
    """float64 reference over axis 1 of (outer, C, inner) data, through the row helpers."""
    def rows(a):
        return np.moveaxis(a, 1, -1).reshape(-1, a.shape[1])

    def back(r, like):
        return np.moveaxis(r.reshape(np.moveaxis(like, 1, -1).shape), -1, 1)
    if not backward:
        return back(_ref_fwd(rows(x), algo), x)
    return back(_ref_bwd(rows(x), rows(dy), algo), x), back(_mag_bwd(rows(x), rows(dy), algo), x)


def _close_cols(got, ref, name, what, scale=1.0, mag=None):
    def rows(a):
        a = np.asarray(a)
        return np.moveaxis(a, 1, -1).reshape(-1, a.shape[1])
    _close(rows(_host(got)), rows(ref), name, what, scale, None if mag is None else rows(mag))


def _run(cp, monkeypatch, v2, x, algo, dy=None):
    """(y, dx or None) of the kernels under COLS_V2 ``v2`` (plans forgotten before, so the setting takes effect)."""
    monkeypatch.setattr(_sk, "COLS_V2", v2)
    _reset_plans()
    y = B.softmax_forward(None, algo, "channel", x)
    dx = None if dy is None else B.softmax_backward(None, algo if algo != "fast" else "accurate", "channel", y, dy)
    return y, dx


CUDA_CASES = [(n, c, inner) for n in NAMES for c in (1, 2, 7, 19, 21, 32, 33, 150, 1000) for inner in (35, 36)
              if n in ("float32", "bfloat16") or c in (7, 19, 33, 150)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, c, inner", CUDA_CASES, ids=[f"{n}-{c}-{i}" for n, c, i in CUDA_CASES])
def test_cols_v2_against_float64_and_old(cp, monkeypatch, name, c, inner):
    """Forward (fast / accurate / log) and backward against the float64 reference, and against the session-7 kernels
    within rounding (the compiled-in columns add the same terms in the same order: equal to the bit)."""
    dt = _dtype(name)
    rng = np.random.default_rng(c * 100 + inner)
    shape = (3, c, inner)
    x = (rng.standard_normal(shape) * 3).astype(dt)
    dy = rng.standard_normal(shape).astype(dt)
    xd, dyd = cp.asarray(x), cp.asarray(dy)
    for algo in ("accurate", "log") + (("fast",) if name == "float32" else ()):
        y, dx = _run(cp, monkeypatch, True, xd, algo, dyd)
        y0, dx0 = _run(cp, monkeypatch, False, xd, algo, dyd)
        _close_cols(y, _cols_ref(x.astype(np.float64), algo), name, f"{algo} forward",
                    scale=4 if algo == "log" else 1)
        yh = _host(y)
        dref, mag = _cols_ref(yh, "accurate" if algo == "fast" else algo, True, dy.astype(np.float64))
        _close_cols(dx, dref, name, f"{algo} backward", scale=8, mag=mag)
        _close_cols(y, _host(y0), name, f"{algo} forward against COLS_V2=0", scale=4 if algo == "log" else 1)
        # the backward of the old kernel on the same y: the same formula
        monkeypatch.setattr(_sk, "COLS_V2", False)
        _reset_plans()
        dx0 = B.softmax_backward(None, "accurate" if algo == "fast" else algo, "channel", y, dyd)
        _close_cols(dx, _host(dx0), name, f"{algo} backward against COLS_V2=0", scale=8, mag=mag)
        monkeypatch.setattr(_sk, "COLS_V2", True)
        if _defs(_sk.launch_spec(False, shape, (1,), algo.upper(), dt))["CC"] != "0":
            assert np.array_equal(_host(y), _host(y0), equal_nan=True), f"{algo}: compiled-in columns not bitwise"


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("c", [2, 19, 33, 150])
def test_cols_v2_special_values(cp, monkeypatch, name, c):
    """A NaN anywhere in a column: the whole column NaN; all -inf: NaN (0 / 0, -inf + inf); a +inf: NaN; -inf in part
    of a column: exp 0 there -- as the float64 reference and the session-7 kernels (NaN in the same places)."""
    dt = _dtype(name)
    rng = np.random.default_rng(c)
    x = (rng.standard_normal((3, c, 36)) * 3).astype(np.float32)
    x[0, c // 2, 0] = np.nan
    x[0, :, 1] = -np.inf
    x[1, c - 1, 2] = np.inf
    x[1, ::2, 3] = -np.inf
    x[2, 0, 4] = np.nan
    x[2, :, 5] = np.nan
    x[2, c - 1, 6] = np.nan                        # in the last chunk of a chunked column
    x = x.astype(dt)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for algo in ("accurate", "log"):
            y, _ = _run(cp, monkeypatch, True, cp.asarray(x), algo)
            y0, _ = _run(cp, monkeypatch, False, cp.asarray(x), algo)
            _close_cols(y, _cols_ref(x.astype(np.float64), algo), name, algo, scale=4)
            assert np.array_equal(np.isnan(_host(y)), np.isnan(_host(y0))), algo


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("c", [3, 19, 40])
def test_cols_v2_grid_stride(cp, monkeypatch, name, c):
    """More columns than the grid: a grid of 3 blocks (monkeypatched) walks every column, inner not a multiple of
    the stride (o advances with i's wrap), odd and even inner; and one natural launch past 1.1 M columns."""
    dt = _dtype(name)
    rng = np.random.default_rng(c)
    real_grid = _sk._grid
    monkeypatch.setattr(_sk, "_grid", lambda groups, dev, per_sm=16: (min(groups, 3),))
    for shape in ((5, c, 999), (4, c, 1000), (2, c, 1)):
        x = (rng.standard_normal(shape) * 3).astype(dt)
        dy = rng.standard_normal(shape).astype(dt)
        for algo in ("accurate", "log"):
            y, dx = _run(cp, monkeypatch, True, cp.asarray(x), algo, cp.asarray(dy))
            _close_cols(y, _cols_ref(x.astype(np.float64), algo), name, f"{algo} {shape}", scale=4)
            dref, mag = _cols_ref(_host(y), algo, True, dy.astype(np.float64))
            _close_cols(dx, dref, name, f"{algo} backward {shape}", scale=8, mag=mag)
    monkeypatch.setattr(_sk, "_grid", real_grid)
    if c == 3:
        shape = (2, 3, 1300, 1000)                  # 2.6 M columns: past the 132 x 32 x 256 grid, words or not
        x = (rng.standard_normal(shape) * 3).astype(dt)
        y, _ = _run(cp, monkeypatch, True, cp.asarray(x), "log")
        ref = _cols_ref(x.astype(np.float64).reshape(2, 3, -1), "log")
        _close_cols(_host(y).reshape(2, 3, -1), ref, name, "log, 2.6 M columns", scale=4)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("c", [7, 19, 40])
def test_cols_v2_pair_off_4_bytes(cp, monkeypatch, name, c):
    """16-bit views 2 bytes past a 4-byte boundary (x; y or dy) take the one-column body: the same values, to the
    bit, as the aligned call (PAIR's two lanes do each column's arithmetic as one column a thread does)."""
    dt = _dtype(name)
    rng = np.random.default_rng(c)
    shape = (3, c, 36)
    x = (rng.standard_normal(shape) * 3).astype(dt)
    dy = rng.standard_normal(shape).astype(dt)
    monkeypatch.setattr(_sk, "COLS_V2", True)
    monkeypatch.setattr(_sk, "COLS_PAIR", True)
    assert _defs(_sk.launch_spec(False, shape, (1,), "LOG", dt))["PAIR"] == "1"

    def off(a):
        flat = cp.zeros(a.size + 1, a.dtype)
        flat[1:] = cp.asarray(a).ravel()
        return flat[1:].reshape(a.shape)
    for algo in ("accurate", "log"):
        y, dx = _run(cp, monkeypatch, True, cp.asarray(x), algo, cp.asarray(dy))
        yo = B.softmax_forward(None, algo, "channel", off(x))
        assert np.array_equal(_host(yo), _host(y), equal_nan=True), algo
        for yy, dd in ((off(_host(y).astype(dt)), cp.asarray(dy)), (y, off(dy))):
            dxo = B.softmax_backward(None, algo, "channel", yy, dd)
            assert np.array_equal(_host(dxo), _host(dx), equal_nan=True), algo
        _close_cols(y, _cols_ref(x.astype(np.float64), algo), name, algo, scale=4)
