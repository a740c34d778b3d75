"""Session 13: softmax_kernels.FWD_WARP (MINIDNN_SOFTMAX_WARP=auto|0|1), PyTorch's launch shape with 16-byte loads
for float32 / 16-bit rows of 513-1024 classes (docs/step_kernels.md, "Session 13: warp-row softmax"; "2", two rows a
warp, never beat "1" and went in session 19: it plans PIPE as any unknown value).

CPU: the rule (which calls change, to what; "0" and unknown values plan the default), the environment variable in a
fresh interpreter, the non-persistent walk of fwd_rows_warp emulated over grids (capped too) and row counts (every
row by one warp once), each element of a row held by one lane at every head a RAGGED row can have, the planned
launches under tools/record_launches.py's fake CuPy (grid = every row's warp, 128 threads), nvcc sm_90 builds of
every WARP plan without spills and within the register budget.
GPU (cuda-marked): "1" against float64 and BITWISE against the default (the same sums in the same order:
PIPE forward, bwd_rows_pipe backward) over 513-1024-class rows with tails (row counts not multiples of a block's
rows), -inf rows, NaN, half -inf rows, +80 / huge / tiny values (CuPy compiles with -ftz=true), a misaligned view
(the fallback, against float64), and replayed in a CUDA graph.
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import softmax_kernels as _sk
from tests import _nvcc
from tests.backend._row_kernels import _row_kernels_only  # noqa: F401  (autouse: the row kernels, not clusters)
from tests.backend.test_softmax_rows_cuda import (
    _close,
    _defs,
    _dtype,
    _host,
    _launches,
    _mag_bwd,
    _ref_bwd,
    _ref_fwd,
    _reset_plans,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WIDTHS = [10, 128, 256, 257, 500, 512, 513, 514, 515, 516, 600, 999, 1000, 1001, 1023, 1024, 1025, 1027, 1028,
          2000, 4097]
NAMES = ("float32", "bfloat16", "float16", "float64")


def _spec(backward, c, name, algo, rows=16384):
    return _sk.launch_spec(backward, (rows, c), (1,), algo, _dtype(name))


@pytest.mark.parametrize("setting", ["0", "1", "2", "x", "1@40", "1@128", "2@128", "1@8", "3@64"])
def test_warp_rule(monkeypatch, setting):
    """WARP changes exactly the one-chunk whole-warp rows (G = 32) of >= 513 classes holding 16..32 elements a thread
    with vector loads and float sums: forwards of every algorithm, the log-softmax backward; then 128-thread blocks,
    PIPE off, WARP=1, MINB from the WARP_REGS budget, a grid of every row's warp ("2" and "2@R", removed, plan as
    "0").  (Under
    the session-13 log-softmax epilogue, LSM "0": LSM's own rule is test_lsm_warp.py's; WARP_FROM 513, session 13's
    range: 257's is test_softmax_s17_rows.py's.)"""
    monkeypatch.setattr(_sk, "FWD_LSM", "0")
    monkeypatch.setattr(_sk, "WARP_FROM", 513)
    for name in NAMES:
        for c in WIDTHS:
            for algo in ("FAST", "ACCURATE", "LOG"):
                for backward in (False, True):
                    monkeypatch.setattr(_sk, "FWD_WARP", "0")
                    base = _spec(backward, c, name, algo)
                    monkeypatch.setattr(_sk, "FWD_WARP", setting)
                    spec = _spec(backward, c, name, algo)
                    d0, d = _defs(base.defines), _defs(spec.defines)
                    item = np.dtype(_dtype(name)).itemsize
                    # the default's row test: a PIPE (or bwd PIPE) plan of a whole warp holding 16..32 elements
                    eligible = (item <= 4 and d0["G"] == 32 and d0["ONE"] == 1 and d0["VEC"] > 1 and c >= 513
                                and 16 <= d0["NV"] * d0["VEC"] <= 32 and (not backward or algo == "LOG"))
                    probe = setting in ("1@40", "1@128")            # "1@R": R registers for the forwards
                    want = (setting == "1" or probe) and eligible
                    if not want:
                        assert spec == base, (setting, name, c, algo, backward)
                        continue
                    assert d0["PIPE"] == 1, (name, c, algo, backward)          # every such row is PIPE's today
                    wr = 1
                    e = d["NV"] * d["VEC"]
                    regs = (_sk.WARP_BWD_REGS[e, item, bool(d["RAGGED"])] if backward
                            else int(setting[2:]) if probe
                            else _sk.warp_regs(e, item, bool(d["RAGGED"]), algo == "LOG"))
                    assert d["WARP"] == wr and d["PIPE"] == 0 and d["BLOCK"] == spec.block == 128
                    assert d["MINB"] == 65536 // (128 * regs) and spec.defines[-1].startswith("MINB=")
                    assert {k: v for k, v in d.items() if k not in ("WARP", "PIPE", "BLOCK", "MINB", "FULLK")} == \
                        {k: v for k, v in d0.items() if k not in ("PIPE", "BLOCK", "MINB")}
                    nb_min = (c - (d["VEC"] - 1 if d["RAGGED"] else 0)) // d["VEC"]
                    assert d["FULLK"] == min(d["NV"], nb_min // 32), (c, d)
                    assert spec.groups == -(-16384 // (4 * wr)) and spec.per_sm == _sk.WARP_PER_SM
                    assert spec.smem == 0 and spec.name == base.name and spec.source == base.source


def test_warp_headline_plans():
    """(16384, 1000) float32 under "1": 4096 blocks of 4 warps, 56 registers (nine blocks, 36 warps an SM), log-softmax
    48 (ten); the log-softmax backward 4096 blocks at 64 (eight); "0" (and the removed "2"): PIPE as before.  (LSM
    "0": the session-13 log-softmax epilogue.)"""
    old, old_lsm = _sk.FWD_WARP, _sk.FWD_LSM
    _sk.FWD_LSM = "0"
    try:
        got = {}
        for s in ("0", "1", "2"):
            _sk.FWD_WARP = s
            got[s] = [(_defs(x.defines).get("WARP", 0), x.groups, _defs(x.defines)["MINB"], x.block)
                      for x in (_spec(False, 1000, "float32", "ACCURATE"), _spec(False, 1000, "float32", "LOG"),
                                _spec(True, 1000, "float32", "LOG"))]
    finally:
        _sk.FWD_WARP, _sk.FWD_LSM = old, old_lsm
    assert got["0"] == [(0, 2048, 2, 256)] * 3
    assert got["1"] == [(1, 4096, 9, 128), (1, 4096, 10, 128), (1, 4096, 8, 128)]
    assert got["2"] == got["0"]


def test_warp_env(env_runs):
    """MINIDNN_SOFTMAX_WARP sets the module default at import (one interpreter: the first setting a fresh import,
    the others the module re-executed, tests/conftest.py env_runs): unset ("auto") plans PIPE for 64 rows and WARP
    "1" from WARP_MIN_ROWS (12288) rows on, "0" (and the removed "2") PIPE for both, "1" WARP for both."""
    code = ("import numpy as np; from minidnn.backend.cuda import softmax_kernels as s; "
            "w = lambda r: dict(x.split('=') for x in s.launch_spec(False, (r, 1000), (1,), 'LOG', "
            "np.dtype('float32')).defines).get('WARP', '-'); print(s.FWD_WARP, w(64), w(12287), w(12288))")
    cases = ((None, "auto - - 1"), ("2", "2 - - -"), ("auto", "auto - - 1"), ("0", "0 - - -"), ("1", "1 1 1 1"),
             (None, "auto - - 1"))
    got = env_runs("minidnn.backend.cuda.softmax_kernels", code,
                   [{} if val is None else {"MINIDNN_SOFTMAX_WARP": val} for val, _ in cases],
                   drop=("MINIDNN_SOFTMAX_WARP",))
    for (val, want), (rc, out, err) in zip(cases, got):
        assert rc == 0, err[-800:]
        assert out.strip() == want, (val, out)


def _warp_walk(rows, wr, grid, block=128):
    """fwd_rows_warp's indexing: warp w = blockIdx * (BLOCK / 32) + warp index owns rows w * WARP .. w * WARP + WARP
    - 1 and returns at once when the first is past the end; a second row past the end is loaded as a 0-class row
    and not stored.  Returns the count of stores each row got."""
    seen = np.zeros(rows, np.int64)
    for w in range(grid * (block // 32)):
        r0 = w * wr
        if r0 >= rows:
            continue
        for i in range(wr):
            if r0 + i < rows:
                seen[r0 + i] += 1
    return seen


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 7, 8, 9, 37, 1000, 6001, 16384])
@pytest.mark.parametrize("wr", [1, 2])
def test_warp_walk_covers_each_row_once(rows, wr):
    """Every row stored once by one warp on the planned grid (ceil(rows / (4 WARP)) blocks: the kernel has no loop,
    so the plan must never cap it -- checked for the largest call supports() admits on a one-SM device).  The host
    plans WARP 1; the kernel's loops over a warp's WARP rows stay general, so 2 is emulated too."""
    grid = -(-rows // (4 * wr))
    assert (_warp_walk(rows, wr, grid) == 1).all(), (rows, wr, grid)
    assert (_warp_walk(rows, wr, grid - 1) == 1).sum() < rows                    # one block short: rows missed
    biggest = -(-(2 ** 31 - 1) // 513 // 4)
    assert min(biggest, 1 * _sk.WARP_PER_SM) == biggest


@pytest.mark.parametrize("item", [4, 2])
def test_warp_rows_hold_each_element_once(item):
    """The element map the WARP kernel loads (warp_load / load_edges on G = 32 rows, the default's tiling) covers
    every element of a row once, at every head a RAGGED row can have; the FULLK slots loaded without a bound test
    lie inside the body at every head (and at head 0, the misaligned fallback's)."""
    for c in range(513, 1029 if item == 4 else 2049, 1 if item == 4 else 7):
        cfg = _sk.row_config(c, item, 4)
        if not _sk.uses_warp(cfg, c, 4):
            continue
        g, nv, vec = cfg.g, cfg.nv, cfg.vec
        fullk = _sk.warp_fullk(cfg, c)
        for h in (range(vec) if cfg.ragged else [0]):
            h = min(h, c)
            nb = (c - h) // vec
            assert nb <= g * nv and fullk * g <= nb, (c, h, fullk)          # FULLK's slots: in every body
            assert fullk * g <= c // vec                                        # and the misaligned fallback's
            seen = np.zeros(c, np.int64)
            k, t, j = np.meshgrid(np.arange(nv), np.arange(g), np.arange(vec), indexing="ij")
            v = k * g + t
            np.add.at(seen, (h + v * vec + j)[v < nb], 1)
            seen[:h] += 1
            seen[h + nb * vec:] += 1
            assert (seen == 1).all() and (c - h - nb * vec) < vec, (c, h)


def test_warp_launches_under_the_fake_cupy():
    """Under tools/record_launches.py's fake CuPy: one softmax_rows_fwd launch a call, (16384, 1000) float32 on a grid
    of 4096 blocks of 128 threads ("1"), 2048 x 256 under "0" and the removed "2" (PIPE: 2 blocks an SM of the fake's
    SMs would cap it; the fake's SM count decides), and the log-softmax backward 4096 x 128 under "1"."""
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
recs = []
R.record_to(L, recs)
import minidnn.backend as B
from minidnn.backend.cuda import softmax_kernels as S
x = fakecp.asarray(np.zeros((16384, 1000), np.float32))
out = {{}}
for s in ("0", "1", "2"):
    S.FWD_WARP = s
    S._plans.clear()
    from minidnn.backend import softmax as smx
    for k, v in vars(smx).items():
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()
    n0 = len(recs)
    y = B.softmax_forward(None, "log", None, x, axis=-1)
    B.softmax_backward(None, "log", None, y, x, axis=-1)
    out[s] = [(r[0].split("(")[0], r[1]) for r in recs[n0:]]
print(repr(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    out = eval(r.stdout.strip().splitlines()[-1])
    assert len(out["1"]) == len(out["2"]) == len(out["0"]) == 2, out
    assert out["1"][0][1][:4] == out["1"][1][1][:4] == [4096, 1, 1, 128] and out["2"] == out["0"], out
    assert out["0"][0][1][3] == 256 and out["0"][1][1][3] == 256, out


def _warp_plans():
    """Every WARP plan of the widths above: (defines, kernel) per distinct compilation."""
    old = _sk.FWD_WARP
    out = {}
    try:
        for s in ("1",):
            _sk.FWD_WARP = s
            for name in ("float32", "bfloat16", "float16"):
                for c in (513, 516, 1000, 1001, 1024, 1027):
                    for algo in ("FAST", "ACCURATE", "LOG"):
                        for backward in (False, True):
                            spec = _spec(backward, c, name, algo)
                            if "WARP=1" in spec.defines:
                                out[spec.defines] = spec.name
    finally:
        _sk.FWD_WARP = old
    return out


# Collected at import so that xdist spreads the compiles (~70 s in one test before); the planner is host code.
WARP_PLANS = sorted(_warp_plans().items())


def test_warp_plans_are_many():
    """The widths above still give the spread of WARP plans that the compile check below is meant to cover."""
    assert len(WARP_PLANS) >= 30


# Built by default (tests/_nvcc.cover; all under MINIDNN_NVCC_ALL=1): every WARP "1" plan (what "auto", the default,
# runs from WARP_MIN_ROWS rows on); eight a test and an nvcc run (tests/_nvcc.build)
WARP_BUILT = _nvcc.cover(WARP_PLANS, lambda p: _nvcc.define_features([p[1]], p[0]), lambda p: "WARP=1" in p[0])
WARP_BATCHES = [WARP_BUILT[i:i + 8] for i in range(0, len(WARP_BUILT), 8)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("batch", WARP_BATCHES,
                         ids=[f"{8 * i:02d}-{8 * i + len(b) - 1:02d}" for i, b in enumerate(WARP_BATCHES)])
def test_warp_compiles_without_spills(batch):
    """nvcc 13 sm_90 with CuPy's -ftz=true: every WARP plan builds, no spill in the kernel it launches (misaligned
    fallback included: the same kernel), registers within the budget MINB was computed from.  ptxas builds only that
    kernel (--entry: registers and spills are per entry, as in the whole module's build; a missing entry fails)."""
    built = _nvcc.build([(_sk.SOURCE, defines) for defines, _ in batch], ("-std=c++14", "-ftz=true"),
                        entries=[(kname,) for _, kname in batch])
    for (defines, kname), r in zip(batch, built):
        m = re.search(r"entry function '%s'.*?(\d+) bytes spill stores.*?Used (\d+) registers" % kname, r.stderr,
                      re.S)
        assert r.returncode == 0 and m, (defines, r.stderr[-1500:])
        d = _defs(defines)
        spill, regs = int(m.group(1)), int(m.group(2))
        assert spill == 0, (kname, defines, spill)
        assert regs * 128 * d["MINB"] <= 65536, (kname, defines, regs)


# ---- GPU ------------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


# Row counts that leave the last block part-filled; ~6-8 NVRTC compiles a case
WARP_ROWS = [("float32", 6001, 1000), ("float32", 2113, 1024), ("float32", 3003, 1001), ("float32", 5001, 513),
             ("bfloat16", 3001, 1000), ("float16", 1501, 1027)]


def _inputs(name, rows, c, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, c)) * 3
    x[1, :] = -np.inf                                # all -inf: NaN as the reference
    x[2, c // 3] = np.nan                            # a NaN: the row NaN
    x[3, ::2] = -np.inf                              # half -inf
    x[4, :] = 80.0 + rng.standard_normal(c)          # large values (fast: S near 2^126)
    x[5, :] *= 1e-30                                 # tiny differences (flush-to-zero territory in products)
    x[6, :] = rng.standard_normal(c) * 30            # a wide spread: exps that underflow to 0
    x[rows - 1, 1::3] = -np.inf
    return x.astype(_dtype(name))


def _same_bits(a, b, what):
    a, b = _host(a), _host(b)
    bad = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} differ from the default, rows "
                           f"{sorted(set(np.nonzero(bad)[0].tolist()))[:10]}")


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", WARP_ROWS, ids=[f"{n}-{r}x{c}" for n, r, c in WARP_ROWS])
def test_warp_rows(cp, monkeypatch, name, rows, c):
    """"1" against float64 and bitwise against "0" (PIPE / bwd_rows_pipe), forward (softmax, log-softmax,
    fast: float32 only) and log-softmax backward; one launch a call; a misaligned view (the kernel's fallback)
    against float64."""
    dtype = _dtype(name)
    monkeypatch.setattr(_sk, "FWD_LSM", "0")      # WARP's own log-softmax epilogue, bitwise PIPE's (LSM: test_lsm_warp)
    x = _inputs(name, rows, c, rows + c)
    safe = np.ones(rows, bool)
    safe[6] = False                                   # fast takes no max: exp(90) overflows float (its contract)
    dy = np.random.default_rng(c).standard_normal((rows, c)).astype(dtype)
    dy[7, c // 2] = np.nan
    xd, dyd = cp.asarray(x), cp.asarray(dy)
    flat = cp.zeros(rows * c + 1, dtype)              # the same rows one element off a 16-byte boundary
    flat[1:] = xd.ravel()
    xm = flat[1:].reshape(rows, c)
    x64 = x.astype(np.float64)
    got = {}
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for setting in ("0", "1"):
            monkeypatch.setattr(_sk, "FWD_WARP", setting)
            _reset_plans()
            for algo in ("accurate", "log") + (("fast",) if name == "float32" and c != 1024 else ()):
                spec = _sk.launch_spec(False, (rows, c), (1,), algo.upper(), dtype)
                assert _defs(spec.defines).get("WARP", 0) == (0 if setting == "0" else int(setting))
                n0 = _launches()
                y = B.softmax_forward(None, algo, None, xd, axis=-1)
                assert _launches() - n0 == 1
                ref = _ref_fwd(x64, algo)
                sel = safe if algo == "fast" else np.ones(rows, bool)
                _close(_host(y)[sel], ref[sel], name, f"{algo} WARP={setting}", scale=4 if algo == "log" else 1)
                got[setting, algo] = y
                ym = B.softmax_forward(None, algo, None, xm, axis=-1)          # the fallback, same grid
                _close(_host(ym)[sel], ref[sel], name, f"{algo} WARP={setting} misaligned",
                       scale=4 if algo == "log" else 1)
            yl = got[setting, "log"]
            n0 = _launches()
            dx = B.softmax_backward(None, "log", None, yl, dyd, axis=-1)
            assert _launches() - n0 == 1
            yh, dyh = _host(yl), dy.astype(np.float64)
            _close(dx, _ref_bwd(yh, dyh, "log"), name, f"log-softmax backward WARP={setting}", scale=8,
                   mag=_mag_bwd(yh, dyh, "log"))
            got[setting, "bwd"] = dx
    for key in [k for k in got if k[0] == "0"]:
        _same_bits(got["1", key[1]], got[key], f"{key[1]} WARP=1 vs 0")


@pytest.mark.cuda
@pytest.mark.parametrize("setting", ["1"])
def test_warp_rows_in_a_graph(cp, monkeypatch, setting):
    """A captured forward + backward under WARP replays to the eager bits (two replays, inputs changed in place
    between them: the graph reads the arrays, not a copy)."""
    monkeypatch.setattr(_sk, "FWD_WARP", setting)
    _reset_plans()
    rows, c = 4097, 1000
    x = cp.asarray(_inputs("float32", rows, c, 11))
    dy = cp.asarray(np.random.default_rng(3).standard_normal((rows, c)).astype(np.float32))
    for algo in ("accurate", "log"):
        y = B.softmax_forward(None, algo, None, x, axis=-1)               # plans and compiles outside the capture
        B.softmax_backward(None, "log", None, y, dy, axis=-1)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        ya = B.softmax_forward(None, "accurate", None, x, axis=-1)
        yl = B.softmax_forward(None, "log", None, x, axis=-1)
        dx = B.softmax_backward(None, "log", None, yl, dy, axis=-1)
        graph = s.end_capture()
    for scale in (1.0, 0.5):
        x *= scale
        cp.cuda.Device().synchronize()      # the scaling runs on the current stream; s does not wait for it
        graph.launch(s)
        s.synchronize()
        _same_bits(ya, B.softmax_forward(None, "accurate", None, x, axis=-1), f"graph softmax x{scale}")
        yl_e = B.softmax_forward(None, "log", None, x, axis=-1)
        _same_bits(yl, yl_e, f"graph log-softmax x{scale}")
        _same_bits(dx, B.softmax_backward(None, "log", None, yl_e, dy, axis=-1), f"graph backward x{scale}")
