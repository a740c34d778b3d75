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
    """CC = C exactly where C <= COLS_CC_MAX of (direction, item size, PAIR); past it SPLIT slices (2, 4, 8) of SK <=
    COLS_SPLIT_K classes covering the column, none empty, up to 8 x COLS_SPLIT_K classes, else the
    chunks (CC = 0); PAIR only for 16-bit data with inner even and no SPLIT (a backward PAIR only up to its own bound
    or past the one-column bound); grid groups cover the columns; COLS_V2 off gives the session-7 kernels, COLS_PAIR
    off one column a thread, COLS_SPLIT "0" the chunks."""
    monkeypatch.setattr(_sk, "COLS_V2", True)
    monkeypatch.setattr(_sk, "COLS_PAIR", True)
    monkeypatch.setattr(_sk, "COLS_SPLIT", "1")
    monkeypatch.setattr(_sk, "COLS_FASTX", True)
    dt = _dtype(name)
    item = dt.itemsize
    for c in CLASSES:
        for inner in (35, 36, 2, 100000):
            for backward in (False, True):
                for algo in ALGOS:
                    s = _sk.launch_spec(backward, (3, c, inner), (1,), algo, dt)
                    d = {k: (int(v) if v.isdigit() else v) for k, v in _defs(s).items()}
                    assert s.source == "COLS" and s.name == ("softmax_cols2_bwd" if backward else "softmax_cols2_fwd")
                    assert d["ALGO"] == {"FAST": 0 if not backward else 1, "ACCURATE": 1, "LOG": 2}[algo]
                    assert d["U"] == _sk.COLS_U and s.block == 256
                    five = not backward and item != 8 and d["PAIR"] == 0 and 0 < d["CC"] <= _sk.COLS_MINB5_CC
                    assert d["CMINB"] == (2 if item == 8 else 5 if five else 4), (c, inner, backward)
                    assert d["CFX"] == int(item == 2 and not backward)
                    cols, kmax = 3 * inner, _sk.COLS_SPLIT_K[backward, item]
                    if c > _sk.COLS_CC_MAX[backward, item, False] and c <= 8 * kmax:
                        sp, sk = d["SPLIT"], d["SK"]
                        assert sp in (2, 4, 8) and sk <= kmax and sp * sk >= c and d["CC"] == 0 and d["PAIR"] == 0
                        assert sp == 2 or -(-c // (sp // 2)) > kmax or cols * sp // 2 < _sk.COLS_FILL, (c, sp)
                        assert c - (sp - 1) * sk > 0, (c, sp, sk)            # no slice empty
                        assert s.groups == -(-cols // (256 // sp))
                        continue
                    assert d["SPLIT"] == 0 and d["SK"] == 0
                    pair = item == 2 and inner % 2 == 0 and not (
                        _sk.COLS_CC_MAX[backward, 2, True] < c <= _sk.COLS_CC_MAX[backward, 2, False])
                    assert d["PAIR"] == int(pair), (c, inner, backward)
                    bound = _sk.COLS_CC_MAX[backward, item, pair]
                    assert d["CC"] == (c if c <= bound else 0), (c, backward, pair)
                    assert s.groups == -(-cols // (512 if pair else 256))
    # the headline shapes
    f32 = _dtype("float32")
    assert _defs(_sk.launch_spec(False, (16, 19, 65536), (1,), "LOG", f32))["CC"] == "19"
    assert _defs(_sk.launch_spec(True, (16, 19, 65536), (1,), "LOG", f32))["CC"] == "19"
    for backward in (False, True):
        d = _defs(_sk.launch_spec(backward, (8, 150, 4096), (1,), "ACCURATE", f32))
        assert (d["SPLIT"], d["SK"]) == ("8", "19")
    d = _defs(_sk.launch_spec(True, (32, 21, 16384), (1,), "LOG", f32))
    assert (d["SPLIT"], d["SK"]) == ("2", "11")
    monkeypatch.setattr(_sk, "COLS_SPLIT", "0")
    d = _defs(_sk.launch_spec(False, (8, 150, 4096), (1,), "ACCURATE", f32))
    assert (d["SPLIT"], d["CC"]) == ("0", "0")
    monkeypatch.setattr(_sk, "COLS_SPLIT", "fill")
    d = _defs(_sk.launch_spec(False, (8, 19, 4096), (1,), "ACCURATE", f32))
    assert (d["SPLIT"], d["SK"]) == ("4", "5")        # 8 slices of 3 would leave one empty
    monkeypatch.setattr(_sk, "COLS_SPLIT", "2")
    with pytest.raises(ValueError, match="COLS_SPLIT"):
        _sk.launch_spec(False, (8, 150, 4096), (1,), "ACCURATE", f32)
    monkeypatch.setattr(_sk, "COLS_SPLIT", "1")
    monkeypatch.setattr(_sk, "COLS_PAIR", False)
    assert _defs(_sk.launch_spec(False, (3, 7, 36), (1,), "LOG", dt))["PAIR"] == "0"
    monkeypatch.setattr(_sk, "COLS_FASTX", False)
    assert _defs(_sk.launch_spec(False, (3, 7, 36), (1,), "LOG", dt))["CFX"] == "0"
    monkeypatch.setattr(_sk, "COLS_V2", False)
    s = _sk.launch_spec(False, (3, 19, 36), (1,), "LOG", dt)
    assert s.name == "softmax_cols_fwd" and _defs(s)["CREG"] == "32"


def test_cols_v2_minb_override(monkeypatch):
    """COLS_MINB_SET (MINIDNN_SOFTMAX_COLS_MINB) replaces the blocks an SM of every COLS_V2 plan (an occupancy A/B),
    the five-block rule of the one-column forwards included."""
    monkeypatch.setattr(_sk, "COLS_V2", True)
    f32 = _dtype("float32")
    assert _defs(_sk.launch_spec(False, (3, 19, 36), (1,), "LOG", f32))["CMINB"] == "5"
    monkeypatch.setattr(_sk, "COLS_MINB_SET", 4)
    assert _defs(_sk.launch_spec(False, (3, 19, 36), (1,), "LOG", f32))["CMINB"] == "4"
    monkeypatch.setattr(_sk, "COLS_MINB_SET", 6)
    assert _defs(_sk.launch_spec(True, (3, 19, 36), (1,), "LOG", f32))["CMINB"] == "6"


def _planned():
    """(kernel, defines) of every distinct COLS_V2 plan over NAMES x CLASSES x inner parity x direction x ALGOS."""
    out = {}
    saved = _sk.COLS_V2, _sk.COLS_PAIR, _sk.COLS_MINB_SET, _sk.COLS_SPLIT, _sk.COLS_FASTX
    classes = sorted(set(CLASSES) | set(range(20, 161, 7)) | ({*range(1, 161)} if _nvcc.FULL else set()))
    try:
        _sk.COLS_V2, _sk.COLS_PAIR, _sk.COLS_MINB_SET, _sk.COLS_SPLIT = True, True, 0, "1"
        for fastx in (True, False):                     # 16-bit forwards: ex2.approx (the default) or expf
            _sk.COLS_FASTX = fastx
            for name in NAMES:
                for c in classes:
                    for inner in (35, 36, 100000):      # 300000 columns: the fewest slices
                        for backward in (False, True):
                            for algo in ALGOS:
                                s = _sk.launch_spec(backward, (3, c, inner), (1,), algo, _dtype(name))
                                out[(s.name, s.defines)] = None
    finally:
        _sk.COLS_V2, _sk.COLS_PAIR, _sk.COLS_MINB_SET, _sk.COLS_SPLIT, _sk.COLS_FASTX = saved
    return list(out)


def _at_bound(item):
    k, defines = item
    d = dict(x.split("=", 1) for x in defines)
    item_size = {"0": 8 if d["SCALAR"] == "double" else 4}.get(d["STORAGE"], 2)
    if d["SPLIT"] != "0":
        return int(d["SK"]) == _sk.COLS_SPLIT_K[k.endswith("bwd"), item_size]
    if d["CMINB"] == "5":                               # 48 registers: its largest CC
        return int(d["CC"]) == _sk.COLS_MINB5_CC
    return int(d["CC"]) == _sk.COLS_CC_MAX[k.endswith("bwd"), item_size, d["PAIR"] == "1"] or d["CC"] == "0"


def _features(b):
    """Every value each define takes, and each (ALGO, STORAGE, PAIR, split or not) combination, per kernel."""
    k, defines = b
    d = dict(x.split("=", 1) for x in defines)
    return ({(k, *x.split("=", 1)) for x in defines}
            | {(k, d["ALGO"], d["SCALAR"], d["STORAGE"], d["PAIR"], d["CFX"], d["SPLIT"] != "0")})


# the builds at each bound (the most registers) and the chunked ones always; then a cover of _features (all 794
# planned builds under MINIDNN_NVCC_ALL=1)
COLS_BUILDS = _nvcc.cover(_planned(), _features, _at_bound)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cols_v2_compile_without_spills():
    """nvcc sm_90: every planned COLS_V2 configuration builds with no spills within its launch bounds (64 registers at
    four 256-thread blocks an SM, 128 at two for float64)."""
    built = _nvcc.build([(_sk.SOURCE_COLS, d) for _, d in COLS_BUILDS], entries=[(k,) for k, _ in COLS_BUILDS],
                        options=("-std=c++14", "-ftz=true"))       # as CuPy builds (REVIEW22C: two spilled only so)
    for (k, defines), r in zip(COLS_BUILDS, built):
        assert r.returncode == 0, r.stderr[:1500]
        m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores.*?Used (\d+) registers" % k,
                      r.stderr, re.S)
        assert m is not None, r.stderr[:1500]
        d = dict(x.split("=", 1) for x in defines)
        assert int(m.group(1)) == 0, (k, defines)
        assert int(m.group(2)) <= 65536 // (256 * int(d["CMINB"])), (k, defines, m.group(2))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cols_v2_pair_refused_for_wide_data():
    """PAIR (a 16-bit layout) and CFX (float exps) asked for float32 / float64 data fail to build (an #error), never
    run wrong; the same defines with 16-bit storage build."""
    base = ("ALGO=1", "CC=7", "U=8", "SPLIT=0", "SK=0", "CMINB=4")
    units = [(_sk.SOURCE_COLS, (f"SCALAR={sc}", f"ACCUM={sc}", f"STORAGE={st}") + base + extra)
             for sc, st in (("float", 0), ("double", 0), ("float", 2))
             for extra in (("PAIR=1", "CFX=0"), ("PAIR=0", "CFX=1"))]
    built = _nvcc.build(units, entries=[("softmax_cols2_fwd",)] * len(units), batch=1)
    for (_, defines), r in zip(units, built):
        if "STORAGE=2" in defines:
            assert r.returncode == 0, r.stderr[:1500]
        else:
            assert r.returncode != 0 and "16-bit data only" in r.stderr, defines


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


def _specs_of(settings, name, shapes, algos, backward=(False, True)):
    """launch_spec of each shape / algo / direction under each {attribute: value} of ``settings``."""
    out = []
    saved = {k: getattr(_sk, k) for st in settings for k in st}
    try:
        for st in settings:
            for k, v in st.items():
                setattr(_sk, k, v)
            for shape in shapes:
                for algo in algos:
                    for bwd in backward:
                        if not (bwd and algo == "FAST"):
                            out.append(_sk.launch_spec(bwd, shape, (1,), algo, _dtype(name)))
    finally:
        for k, v in saved.items():
            setattr(_sk, k, v)
    return out


def _cuda_specs():
    """Every kernel the cuda tests below launch (settings as each test sets them)."""
    new, old = {"COLS_V2": True, "COLS_SPLIT": "1", "COLS_FASTX": True}, {"COLS_V2": False}
    specs = []
    for name, c, inner in CUDA_CASES:
        specs += _specs_of([new, old, dict(new, COLS_FASTX=False)], name, [(3, c, inner)], ALGOS)
    for name, c, fill in SPLIT_CASES:
        specs += _specs_of([dict(new, COLS_FILL=fill or _sk.COLS_FILL), dict(new, COLS_SPLIT="0")], name,
                           [(3, c, 37)], ALGOS)
    for name in NAMES:
        for c in (2, 19, 33, 150):
            specs += _specs_of([new, old], name, [(3, c, 36)], ("ACCURATE", "LOG"), (False,))
    for name in ("float32", "bfloat16"):
        for c in (3, 19, 40):
            specs += _specs_of([new], name, [(5, c, 999), (4, c, 1000), (7, c, 3)] + [(2, 3, 1300000)] * (c == 3),
                               ("ACCURATE", "LOG"))
    for name in ("bfloat16", "float16"):
        for c in (7, 19, 40):
            specs += _specs_of([new], name, [(3, c, 36)], ("ACCURATE", "LOG"))
    return specs


_WARM = []


@pytest.fixture
def warm(cp):
    """The kernels of the cuda tests compiled first, a process a core (CuPy's disk cache): ~600 NVRTC builds one
    after another would take minutes."""
    if not _WARM:
        _WARM.append(True)
        try:
            _sk.precompile(_cuda_specs())
        except Exception as exc:        # noqa: BLE001 -- only a cache: each compiles when first launched
            print(f"precompile failed ({type(exc).__name__}: {exc}); compiling one by one")
    return cp


CUDA_CASES = [(n, c, inner) for n in NAMES for c in (1, 2, 7, 19, 21, 32, 33, 150, 1000) for inner in (35, 36)
              if n in ("float32", "bfloat16") or c in (7, 19, 33, 150)] \
    + [(n, c, 36) for n in ("bfloat16", "float16") for c in (163, 1001)]   # paired chunks, the last partial (REVIEW22C)


@pytest.mark.cuda
@pytest.mark.parametrize("name, c, inner", CUDA_CASES, ids=[f"{n}-{c}-{i}" for n, c, i in CUDA_CASES])
def test_cols_v2_against_float64_and_old(cp, warm, monkeypatch, name, c, inner):
    """Forward (fast / accurate / log) and backward against the float64 reference, and against the session-7 kernels
    within rounding (the compiled-in columns add the same terms in the same order: equal to the bit with expf, i.e.
    COLS_FASTX off for 16-bit data)."""
    dt = _dtype(name)
    rng = np.random.default_rng(c * 100 + inner)
    shape = (3, c, inner)
    x = (rng.standard_normal(shape) * 3).astype(dt)
    dy = rng.standard_normal(shape).astype(dt)
    xd, dyd = cp.asarray(x), cp.asarray(dy)
    for algo in ("accurate", "log") + (("fast",) if name in ("float32", "bfloat16") else ()):
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
        # expf (COLS_FASTX off for 16-bit data): compiled-in columns are the old kernels' sums, to the bit
        monkeypatch.setattr(_sk, "COLS_FASTX", False)
        monkeypatch.setattr(_sk, "COLS_V2", True)
        if _defs(_sk.launch_spec(False, shape, (1,), algo.upper(), dt))["CC"] != "0":
            yx, _ = _run(cp, monkeypatch, True, xd, algo)
            assert np.array_equal(_host(yx), _host(y0), equal_nan=True), f"{algo}: compiled-in columns not bitwise"
        monkeypatch.setattr(_sk, "COLS_FASTX", True)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("c", [2, 19, 150, 1000])
def test_cols_fast_huge_sums(cp, warm, monkeypatch, name, c):
    """FAST (no max) on columns whose sum of exps reaches [2^126, FLT_MAX] (values near 88 - ln C): 1 / S is below
    2^-126, and CuPy builds with -ftz=true -- without FAST_SCALE every output was 0 (REVIEW22C; the rows' session-12
    guard); with it, the float64 reference within rounding.  Old kernels too (COLS_V2 off)."""
    dt = _dtype(name)
    rng = np.random.default_rng(c)
    x = (88.0 - np.log(c) + 0.01 * rng.standard_normal((2, c, 36))).astype(np.float32)
    assert np.exp(x.astype(np.float64)).sum(axis=1).min() > 2.0 ** 126
    x = x.astype(dt)
    ref = _cols_ref(x.astype(np.float64), "accurate")
    for v2 in (True, False):
        y, _ = _run(cp, monkeypatch, v2, cp.asarray(x), "fast")
        assert np.isfinite(_host(y)).all() and (_host(y) > 0).all(), v2
        _close_cols(y, ref, name, f"fast, COLS_V2 {v2}")
    _reset_plans()


SPLIT_CASES = [(n, c, fill) for n in ("float32", "bfloat16", "float64") for c in (20, 21, 33, 40, 97, 150, 160)
               for fill in (1, 300, None)]      # 300: past 2 x 111 columns, so a slice count doubles (REVIEW22C)


@pytest.mark.cuda
@pytest.mark.parametrize("name, c, fill", SPLIT_CASES, ids=[f"{n}-{c}-{f}" for n, c, f in SPLIT_CASES])
def test_cols_v2_split_slices(cp, warm, monkeypatch, name, c, fill):
    """SPLIT at 2, 4 and 8 slices (COLS_FILL lowered: the fewest slices; 200: some doubling; the default: 8 for these
    few columns), forward and backward, against the float64 reference and the chunked path (COLS_SPLIT "0")."""
    dt = _dtype(name)
    if fill is not None:
        monkeypatch.setattr(_sk, "COLS_FILL", fill)
    rng = np.random.default_rng(c)
    shape = (3, c, 37)
    x = (rng.standard_normal(shape) * 3).astype(dt)
    dy = rng.standard_normal(shape).astype(dt)
    xd, dyd = cp.asarray(x), cp.asarray(dy)
    for algo in ("accurate", "log") + (("fast",) if name in ("float32", "bfloat16") else ()):
        monkeypatch.setattr(_sk, "COLS_SPLIT", "1")
        y, dx = _run(cp, monkeypatch, True, xd, algo, dyd)
        _close_cols(y, _cols_ref(x.astype(np.float64), algo), name, f"{algo} forward", scale=4)
        dref, mag = _cols_ref(_host(y), "accurate" if algo == "fast" else algo, True, dy.astype(np.float64))
        _close_cols(dx, dref, name, f"{algo} backward", scale=8, mag=mag)
        monkeypatch.setattr(_sk, "COLS_SPLIT", "0")
        y0, _ = _run(cp, monkeypatch, True, xd, algo)
        _close_cols(y, _host(y0), name, f"{algo} forward against the chunks", scale=4)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("c", [2, 19, 33, 150])
def test_cols_v2_special_values(cp, warm, monkeypatch, name, c):
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
def test_cols_v2_grid_stride(cp, warm, monkeypatch, name, c):
    """More columns than the grid: a grid of 3 blocks (monkeypatched) walks every column, inner not a multiple of
    the stride (o advances with i's wrap), odd and even inner; and one natural launch past 1.1 M columns."""
    dt = _dtype(name)
    rng = np.random.default_rng(c)
    real_grid = _sk._grid
    monkeypatch.setattr(_sk, "_grid", lambda groups, dev, per_sm=16: (min(groups, 3),))
    for shape in ((5, c, 999), (4, c, 1000), (7, c, 3)):
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
@pytest.mark.parametrize("c", [7, 12, 19])  # paired forwards up to 19 classes, paired backwards up to 12 (REVIEW22C:
                                            # at 19 the backward half compares the one-column kernel with itself)
def test_cols_v2_pair_off_4_bytes(cp, warm, monkeypatch, name, c):
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


# ---- CPU: the kernels themselves, run on the host ----------------------------------------------------------------
# SOURCE_COLS compiled as C++ by g++ (each (defines) unit in its own namespace, as tests/_nvcc.combine builds them for
# nvcc) with the CUDA names shimmed: a block's 256 threads as std::threads meeting at a std::barrier (__syncthreads),
# __shared__ as function statics (blocks run one after another), the PTX conversions as C (bfloat16 round-to-nearest-
# even, float16 through _Float16), ex2.approx as exp2f.  exp / log are the host's, so values match the GPU only within
# rounding -- but every index, mask, slice, walk and special-value path of the kernels runs here, against float64
# and the old kernels (run the same way), without a GPU.

_HOST_PRE = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
using std::exp; using std::log; using std::fmax; using std::fmaf; using std::exp2f;
struct D3 { unsigned x; };
static thread_local D3 threadIdx, blockIdx;
static D3 gridDim;
static std::barrier<>* g_bar;
#define __syncthreads() g_bar->arrive_and_wait()
#define __shared__ static
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned short bf16_rn(float f)
{
    unsigned u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static inline float h2f(unsigned short h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
static inline unsigned short f2h(float f) { _Float16 v = (_Float16)f; unsigned short h; memcpy(&h, &v, 2); return h; }
template <class K> static void host_grid(unsigned nb, K k)
{
    gridDim.x = nb;
    for (unsigned b = 0; b < nb; ++b) {
        std::barrier<> bar(256);
        g_bar = &bar;
        std::vector<std::thread> th;
        for (unsigned t = 0; t < 256; ++t) th.emplace_back([&, b, t] { blockIdx.x = b; threadIdx.x = t; k(); });
        for (auto& t : th) t.join();
    }
}
"""

_HOST_RUN = r"""
extern "C" __global__ void host_run(int backward, unsigned nb, char* a, char* b, char* o, long oa, long ob, long oo,
                                    int cols, int C, int inner)
{
    const T* x = (const T*)a + oa; const T* d = (const T*)b + ob; T* z = (T*)o + oo;
#if OLD
    if (backward) host_grid(nb, [&] { softmax_cols_bwd(x, d, z, cols, C, inner); });
    else host_grid(nb, [&] { softmax_cols_fwd(x, z, cols, C, inner); });
#else
    if (backward) host_grid(nb, [&] { softmax_cols2_bwd(x, d, z, cols, C, inner); });
    else host_grid(nb, [&] { softmax_cols2_fwd(x, z, cols, C, inner); });
#endif
}
"""

_PTX_TO_C = [
    ('{ unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }', "{ return bf16_rn(f); }"),
    ('{ float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }', "{ return h2f(h); }"),
    ('{ unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }', "{ return f2h(f); }"),
    ('asm volatile("and.b32 %0, %1, 0xffff0000;" : "=f"(f) : "r"(w));', "f = __uint_as_float(w & 0xffff0000u);"),
    ('asm volatile("shl.b32 %0, %1, 16;" : "=f"(f) : "r"(w));', "f = __uint_as_float(w << 16);"),
    ('asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi;}" : "=f"(f) : "r"(w));',
     "f = h2f((unsigned short)(w >> 16));"),
    ('asm volatile("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo;}" : "=f"(f) : "r"(w));',
     "f = h2f((unsigned short)(w & 0xffffu));"),
    ('asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"((v - sh) * 1.4426950408889634f));',
     "e = exp2f((v - sh) * 1.4426950408889634f);"),
]


def _host_source(units):
    """One C++ text of every (defines) unit of SOURCE_COLS plus its host_run, and a main() that runs unit i's kernel
    on the bytes it reads from stdin (see _host_call)."""
    text = _sk.SOURCE_COLS
    for ptx, c in _PTX_TO_C:
        assert ptx in text, ptx                    # the kernel's PTX changed: this emulation must follow it
        text = text.replace(ptx, c)
    body = _nvcc.combine([(text + _HOST_RUN, d) for d in units])
    table = ", ".join(f"nvccu{i}::nvccu{i}_host_run" for i in range(len(units)))
    main = r"""
typedef void (*Run)(int, unsigned, char*, char*, char*, long, long, long, int, int, int);
static Run runs[] = {%s};
int main(int argc, char** argv)
{
    // unit backward nblocks cols C inner oa ob oo n_a_bytes n_b_bytes n_o_bytes
    long v[12];
    for (int i = 0; i < 12; ++i) v[i] = atol(argv[i + 1]);
    std::vector<char> a(v[9]), b(v[10]), o(v[11], 0);
    if (fread(a.data(), 1, a.size(), stdin) != a.size() || fread(b.data(), 1, b.size(), stdin) != b.size()) return 2;
    runs[v[0]]((int)v[1], (unsigned)v[2], a.data(), b.data(), o.data(), v[6], v[7], v[8], (int)v[3], (int)v[4],
               (int)v[5]);
    fwrite(o.data(), 1, o.size(), stdout);
    return 0;
}
""" % table
    return _HOST_PRE + body + main


def _host_cases():
    """(dtype name, (outer, C, inner), algo, backward, element offsets of x / dy, special values?, COLS_FILL)."""
    cases = []
    for c in (1, 7, 19, 33, 150, 200):
        for algo, backward in (("FAST", False), ("ACCURATE", False), ("LOG", False), ("ACCURATE", True),
                               ("LOG", True)):
            cases.append(("float32", (3, c, 37), algo, backward, (0, 0), c in (19, 150), None))
    for c in (21, 40, 97):                          # SPLIT at 2 / 4 slices: COLS_FILL lowered
        for backward in (False, True):
            cases.append(("float32", (2, c, 37), "LOG", backward, (0, 0), False, 1))
    for name in ("bfloat16", "float16"):
        for c in (7, 19, 40):
            for algo, backward in (("ACCURATE", False), ("LOG", False), ("ACCURATE", True), ("LOG", True)):
                cases.append((name, (3, c, 38), algo, backward, (0, 0), c == 19, None))      # PAIR
                cases.append((name, (3, c, 38), algo, backward, (1, 1), False, None))        # off 4 bytes
                cases.append((name, (3, c, 37), algo, backward, (0, 0), False, None))        # inner odd
    for c in (7, 19, 40):
        for algo, backward in (("ACCURATE", False), ("LOG", False), ("LOG", True)):
            cases.append(("float64", (2, c, 37), algo, backward, (0, 0), c == 19, None))
    return cases


def _host_units(cases):
    """{case: (new unit index, old unit index, new spec)} and the distinct units' defines."""
    units, where, out = [], {}, {}
    saved = _sk.COLS_V2, _sk.COLS_FILL

    def unit(defines):
        if defines not in where:
            where[defines] = len(units)
            units.append(defines)
        return where[defines]
    try:
        for case in cases:
            name, shape, algo, backward, _, _, fill = case
            _sk.COLS_FILL = fill or saved[1]
            _sk.COLS_V2 = True
            s = _sk.launch_spec(backward, shape, (1,), algo, _dtype(name))
            _sk.COLS_V2 = False
            s0 = _sk.launch_spec(backward, shape, (1,), algo, _dtype(name))
            out[case] = (unit(s.defines + ("OLD=0",)), unit(s0.defines + ("OLD=1",)), s)
    finally:
        _sk.COLS_V2, _sk.COLS_FILL = saved
    return out, units


def _host_call(exe, unit, backward, nblocks, shape, x, dy, offs):
    """The unit's kernel on x (and dy) placed ``offs`` elements into their buffers; the output as x's dtype."""
    import subprocess
    outer, c, inner = shape
    raw = (lambda a: a.view(np.uint16)) if x.dtype.itemsize == 2 else (lambda a: a)
    bufs = []
    for a, off in ((x, offs[0]), (dy if dy is not None else x, offs[1])):
        buf = np.zeros(a.size + 1, raw(a).dtype)
        buf[off:off + a.size] = raw(a).ravel()
        bufs.append(buf)
    n = x.size * x.dtype.itemsize
    args = [unit, int(backward), nblocks, outer * inner, c, inner, offs[0], offs[1], 0, bufs[0].nbytes,
            bufs[1].nbytes, n]
    r = subprocess.run([exe, *map(str, args)], input=bufs[0].tobytes() + bufs[1].tobytes(), capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[:2000]
    return np.frombuffer(r.stdout, dtype=raw(x).dtype).view(x.dtype).reshape(shape)


def host_build(tmp_path, name, text):
    """Compile a host unit (_HOST_PRE's shims + kernels) with g++ into tmp_path; the executable's path."""
    import subprocess
    src = tmp_path / f"{name}.cpp"
    src.write_text(text)
    exe = str(tmp_path / name)
    r = subprocess.run(["g++", "-O1", "-std=c++20", "-pthread", "-w", "-o", exe, str(src)], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[:4000]
    return exe


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_cols_v2_kernels_on_the_host(tmp_path):
    """The COLS_V2 kernels and the old ones, run on the host (above): float32 over every path (compiled-in columns,
    SPLIT at 2 / 4 / 8 slices, chunks; FAST, ACCURATE, LOG; backward), 16-bit PAIR / one column a thread / off 4
    bytes, float64; special values (NaN, +inf, all -inf columns) -- against float64 (NaN where it is NaN) and the old
    kernels (NaN in the same places; the compiled-in float32 forward to the bit); grids of 1-3 blocks, so the
    grid-stride walk wraps over inner."""
    cases = _host_cases()
    plan, units = _host_units(cases)
    exe = host_build(tmp_path, "cols_host", _host_source(units))
    tol = {"float32": 4e-6, "float64": 1e-12, "bfloat16": 2e-2, "float16": 4e-3}
    for case in cases:
        name, shape, algo, backward, offs, special, _ = case
        new_unit, old_unit, spec = plan[case]
        dt = _dtype(name)
        rng = np.random.default_rng(shape[1] * 7 + shape[2])
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        if special:
            x[0, shape[1] // 2, 0] = np.nan
            x[0, :, 1] = -np.inf
            x[1, shape[1] - 1, 2] = np.inf
            x[1, ::2, 3] = -np.inf
            x[2 % shape[0], :, 4] = np.nan
        x = x.astype(dt)
        dy = rng.standard_normal(shape).astype(dt) if backward else None
        a = algo.lower()
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if backward:
                x = _cols_ref(x.astype(np.float64), a).astype(dt)          # y: a softmax / log-softmax output
                ref, mag = _cols_ref(x.astype(np.float64), a, True, dy.astype(np.float64))
            else:
                ref, mag = _cols_ref(x.astype(np.float64), a), None
        nb = 1 + (shape[0] * shape[2]) % 3
        got = _host_call(exe, new_unit, backward, nb, shape, x, dy, offs)
        old = _host_call(exe, old_unit, backward, 2, shape, x, dy, (0, 0))
        what = f"{case} {spec.defines[4:]}"
        g, o = got.astype(np.float64), old.astype(np.float64)
        assert np.array_equal(np.isnan(g), np.isnan(ref)), what
        assert np.array_equal(np.isnan(g), np.isnan(o)), what
        fin = np.isfinite(ref)
        scale = np.abs(np.where(fin, ref, 0)).max() + 1
        if mag is not None:
            scale += np.abs(mag[np.isfinite(mag)]).max(initial=0)
        assert np.abs(g[fin] - ref[fin]).max(initial=0) <= tol[name] * scale, what
        assert np.array_equal(g[~fin & ~np.isnan(ref)], ref[~fin & ~np.isnan(ref)]), what
        if name == "float32" and not backward and _defs(spec)["CC"] != "0":
            assert np.array_equal(g, o, equal_nan=True), what
