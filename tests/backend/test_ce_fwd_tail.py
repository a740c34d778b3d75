"""Session 12: loss_kernels.CE_TAIL, the cross-entropy row forward's fixed costs (docs/step_kernels.md, "Session 12:
cross-entropy and softmax forward").

CPU: the rule (which defines each setting adds, and nothing else: grid, MINB and tiling as "0", so the blocks' partial
sums group the same rows), FULLK's claim (slots k < FULLK hold a body vector for every thread of every live row),
the last block's load order (TAIL_LD at once, then the loop: the same b sequence a thread as the default loop, so
the same sums in the same order), and nvcc sm_90 builds of every setting without spills.
GPU (cuda-marked): "1" bitwise "0" (loss rows, lse, 'mean' / 'sum' and the denominator), "2" against the float64
reference and close to "0"; ignored and out-of-range targets, class weights, label smoothing, rows of -inf / NaN, a
shifted row, odd widths, row counts that leave the last step of the walk partly empty, a grid past TAIL_LD * BLOCK.
Since GPU run 3, "2" is the default (P16 takes TAIL=2, every other row forward TAIL=1, bitwise "0"); the float32
forward at the default against float64 within a bound derived from its order of operations (test_ce_f32_bound).
The widened path's bitwise equality with the cast path: tests/backend/test_ce_lowp_logits_cuda.py (both plan TAIL=1).
"""
import math
import re
import shutil

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import loss_kernels as _lk
from tests import _nvcc
from tests._nvcc import pick
from tests.backend.test_softmax_rows_cuda import _close, _defs, _dtype, _host, _launches, _reset_plans

SHAPES = [(16384, 1000), (16384, 1024), (4096, 32000), (65536, 128), (128, 10), (20000, 1001), (70000, 2)]


@pytest.mark.parametrize("setting", ["0", "1", "2", "x"])
def test_ce_tail_rule(monkeypatch, setting):
    """CE_TAIL adds TAIL=1 ("1"; "2" where P16 is not taken) or TAIL=2 with FULLK ("2" with P16) to the row forward
    only; the tiling, MINB, the grid and the backward are "0"'s; an unknown value plans "0"."""
    for name in ("bfloat16", "float16", "float32", "float64"):
        for shape in SHAPES:
            for w, red, eps in ((False, "mean", 0.0), (True, "none", 0.0), (True, "sum", 0.1)):
                monkeypatch.setattr(_lk, "CE_TAIL", "0")
                base = _lk.launch_spec("ce_fwd", shape, _dtype(name), np.int64, w, red, eps)
                bbase = _lk.launch_spec("ce_bwd", shape, _dtype(name), np.int64, w, red, eps)
                monkeypatch.setattr(_lk, "CE_TAIL", setting)
                spec = _lk.launch_spec("ce_fwd", shape, _dtype(name), np.int64, w, red, eps)
                assert _lk.launch_spec("ce_bwd", shape, _dtype(name), np.int64, w, red, eps) == bbase
                assert spec[:2] == base[:2] and spec[3:] == base[3:], (spec, base)
                d, d0 = _defs(spec[2]), _defs(base[2])
                extra = {k: v for k, v in d.items() if k not in d0}
                assert {k: v for k, v in d.items() if k in d0} == d0
                if base[0] != "ROWS" or setting not in ("1", "2"):
                    assert extra == {}, (setting, name, shape, extra)
                elif setting == "2" and d0.get("P16") == 1:
                    full = min(d0["NV"], (shape[1] // d0["VEC"]) // d0["G"])
                    assert extra == {"TAIL": 2, "FULLK": full}, (name, shape, extra)
                else:
                    assert extra == {"TAIL": 1}, (setting, name, shape, extra)


def test_ce_tail_default_is_2_and_the_widened_plan_is_float32s(monkeypatch):
    """The module default is "2" (MINIDNN_CE_TAIL unset); under it the widened forward (16-bit logits as float32)
    plans float32's kernel plus XSTORAGE only -- TAIL=1, no P16, no TAIL=2 math -- while native 16-bit P16 rows take
    TAIL=2."""
    import os
    assert _lk.CE_TAIL == os.environ.get("MINIDNN_CE_TAIL", "2")
    monkeypatch.setattr(_lk, "CE_TAIL", "2")
    for c in (10, 33, 128, 1000, 1001, 4097):
        for w, red, eps in ((False, "mean", 0.0), (True, "none", 0.0), (True, "sum", 0.1)):
            f32 = _lk.launch_spec("ce_fwd", (4096, c), np.dtype(np.float32), np.int64, w, red, eps)
            for name in ("bfloat16", "float16"):
                wid = _lk.launch_spec("ce_fwd", (4096, c), _dtype(name), np.int64, w, red, eps, True)
                assert wid[:2] == f32[:2] and wid[3:] == f32[3:]
                assert [d for d in wid[2] if d not in f32[2]] == [f"XSTORAGE={1 if name == 'float16' else 2}"]
                assert "TAIL=1" in f32[2] and "TAIL=2" not in wid[2] and "P16=1" not in wid[2]
                nat = _defs(_lk.launch_spec("ce_fwd", (4096, c), _dtype(name), np.int64, w, red, eps)[2])
                assert nat["TAIL"] == (2 if nat.get("P16") == 1 else 1), (name, c, nat)


@pytest.mark.parametrize("c", [2, 8, 10, 128, 250, 256, 1000, 1016, 1024, 1032, 2048])
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_fullk_slots_are_whole(monkeypatch, c, name):
    """P16 slot k of thread g is body vector k * G + g; with FULLK the slots k < FULLK are loaded without the bound
    check: every one of them must be a body vector (< C / VEC) for every g, and FULLK is the largest such count."""
    monkeypatch.setattr(_lk, "CE_TAIL", "2")
    d = _defs(_lk.launch_spec("ce_fwd", (4096, c), _dtype(name), np.int64, False, "mean")[2])
    if d.get("P16") != 1:
        assert "FULLK" not in d
        return
    g, nv, nb = d["G"], d["NV"], c // d["VEC"]
    full = d["FULLK"]
    k, t = np.meshgrid(np.arange(nv), np.arange(g), indexing="ij")
    whole = ((k * g + t) < nb).all(axis=1)                       # slot k holds a body vector in every thread
    assert whole[:full].all() and (full == nv or not whole[full]), (c, g, nv, nb, full)


@pytest.mark.parametrize("grid", [1, 2, 255, 256, 257, 264, 528, 1023, 1024, 1025, 2112, 4100])
def test_tail_last_block_sums_in_the_default_order(grid):
    """The last block's sums: thread t adds partial b for b = t, t + BLOCK, ... in that order in both kernels (TAIL:
    the first TAIL_LD loaded at once, then the loop from t + TAIL_LD * BLOCK) -- so the double sums, their warp and
    block sums and the stored loss are bitwise the default's."""
    block, ld = 256, 4
    for t in range(block):
        default = list(range(t, grid, block))
        first = [t + k * block for k in range(ld) if t + k * block < grid]
        rest = list(range(t + ld * block, grid, block))
        assert first + rest == default, (grid, t)


def _nvcc_spills(jobs):
    """{(kernel, defines): spill stores}: one nvcc run for all (tests/_nvcc.build); ptxas builds only the entry read
    (--entry: its spills are its own, as in the whole module; the backward kernel beside it was 40% of the time)."""
    built = _nvcc.build([(_lk.SOURCE_ROWS, defines) for _, defines in jobs], entries=[(k,) for k, _ in jobs])
    out = {}
    for (k, defines), r in zip(jobs, built):
        assert r.returncode == 0, r.stderr[:1500]
        m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores" % k, r.stderr, re.S)
        assert m is not None, r.stderr[-800:]
        out[(k, defines)] = int(m.group(1))
    return out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_ce_tail_compiles_without_spills(monkeypatch):
    """nvcc sm_90 builds the row forward under every CE_TAIL setting (16-bit P16 and float32 / float64 rows,
    weights, every reduction, smoothing, widened 16-bit logits): no spill where "0" has none."""
    cases = []
    for name, widen in (("bfloat16", False), ("float16", False), ("float32", False), ("float64", False),
                        ("bfloat16", True)):
        for c, w, red, eps in ((1000, False, "mean", 0.0), (1024, True, "none", 0.0), (10, False, "sum", 0.0),
                               (1001, True, "mean", 0.0), (1000, True, "mean", 0.1)):
            cases.append((name, widen, c, w, red, eps))
    cases = pick(cases, 7)      # a spread of them, each under the three settings (tests/_nvcc.py)
    jobs = {}
    for setting in ("0", "1", "2"):
        monkeypatch.setattr(_lk, "CE_TAIL", setting)
        for name, widen, c, w, red, eps in cases:
            _, k, defines, *_ = _lk.launch_spec("ce_fwd", (16384, c), _dtype(name), np.int64, w, red, eps, widen)
            jobs.setdefault((k, defines), []).append((setting, name, widen, c, w, red, eps))
    spills = _nvcc_spills(list(jobs))
    base = {}
    for key, users in jobs.items():
        for setting, *case in users:
            base.setdefault(tuple(case), {})[setting] = spills[key]
    for case, by in base.items():
        assert by["1"] <= by["0"] and by["2"] <= by["0"], (case, by)


# ---- GPU -------------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


# rows so that each group walks several steps and the last step is partly empty; 1001: RAGGED (no P16); float64
# (70000, 10): MINB 1, a grid of up to 16 blocks an SM (past TAIL_LD * BLOCK = 1024: the last block's loop runs)
TAIL_ROWS = [("bfloat16", 20000, 1000), ("float16", 13001, 1024), ("bfloat16", 70000, 10), ("float32", 6000, 1000),
             ("float32", 3000, 1001), ("bfloat16", 2113, 1001), ("float16", 9000, 2), ("float64", 70000, 10),
             ("bfloat16", 777, 128)]


def _problem(name, rows, c, cp):
    dtype = _dtype(name)
    rng = np.random.default_rng(rows + 7 * c)
    x = (rng.standard_normal((rows, c)) * 3).astype(dtype)
    x[1, :] = -np.inf
    x[2, c // 2] = np.nan
    x[rows - 1, ::2] = -np.inf
    x[5, :] += dtype.type(40)
    t = rng.integers(0, c, rows)
    t[rng.random(rows) < 0.1] = -100
    t[3:5] = [0, c - 1]
    t[6] = c                                                   # out of range: a NaN row
    w = (rng.random(c) + 0.1).astype(dtype)
    return x, t, w


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", TAIL_ROWS, ids=[f"{n}-{r}x{c}" for n, r, c in TAIL_ROWS])
def test_ce_tail_rows(cp, monkeypatch, name, rows, c):
    """CE_TAIL "1" is bitwise "0" (the same sums in the same order); "2" against float64 and close to "0"; every
    setting one launch a call, against the float64 reference."""
    dtype = _dtype(name)
    x, t, w = _problem(name, rows, c, cp)
    x64 = x.astype(np.float64)
    fin = np.isfinite(x64).all(axis=1) & (t < c)
    xd, td, wd = cp.asarray(x), cp.asarray(t), cp.asarray(w)
    xf, tf = cp.asarray(x[fin]), cp.asarray(t[fin])
    got = {}
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for setting in ("0", "1", "2"):
            monkeypatch.setattr(_lk, "CE_TAIL", setting)
            _reset_plans()
            for weighted, eps in ((False, 0.0), (True, 0.0), (True, 0.1)):
                wa, w64 = (wd, w.astype(np.float64)) if weighted else (None, None)
                what = f"CE_TAIL={setting} weighted={weighted} eps={eps}"
                n0 = _launches()
                loss, lse, _ = B.softmax_cross_entropy_forward(None, xd, td, wa, -100, eps, "none")
                assert _launches() - n0 == 1
                loss_ref, lse_ref, _ = B.softmax_cross_entropy_forward(None, x64, np.where(t < c, t, 0), w64, -100,
                                                                        eps, "none")
                lse_ref, loss_ref = np.asarray(lse_ref, np.float64), np.asarray(loss_ref, np.float64).copy()
                loss_ref[6] = np.nan
                acc = "float64" if name == "float64" else "float32"
                _close(lse, lse_ref, acc, "lse " + what, scale=4)
                _close(loss, loss_ref, name, "loss rows " + what, scale=10)
                got[setting, weighted, eps] = (_host(lse), _host(loss))
                for red in ("mean", "sum"):
                    n0 = _launches()
                    loss, _, den = B.softmax_cross_entropy_forward(None, xf, tf, wa, -100, eps, red)
                    assert _launches() - n0 == 1
                    loss_ref, _, den_ref = B.softmax_cross_entropy_forward(None, x64[fin], t[fin], w64, -100, eps,
                                                                            red)
                    _close(den, np.asarray(den_ref, np.float64), acc, f"denominator {red} " + what, scale=4)
                    ref_out = np.asarray(loss_ref, np.float64).astype(dtype).astype(np.float64)
                    _close(loss, ref_out, name, f"loss {red} " + what, scale=10)
                    got[setting, weighted, eps, red] = (_host(loss), _host(den))
    # "2" against "0": lse and the denominator (float) within 2e-5; the loss, stored in the logits' dtype, within one
    # unit of that dtype's last place (an lse a few 1e-7 apart flips its rounding now and then: GPU run 3 of session
    # 12 saw the bfloat16 20000 x 1000 case fail at rtol 2e-5)
    ulp = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}.get(name, 2e-5)
    for key, a in got.items():
        if key[0] == "0":
            continue
        is_loss = (False, True) if len(key) == 3 else (True, False)      # ('none': lse, loss) / (loss, denom)
        for u, v, loss in zip(a, got[("0",) + key[1:]], is_loss):
            if key[0] == "1":
                np.testing.assert_array_equal(u, v, err_msg=str(key))
            else:
                big = np.nanmax(np.abs(np.where(np.isfinite(v), v, 0)), initial=0.0)
                np.testing.assert_allclose(u, v, rtol=ulp if loss else 2e-5, atol=1e-5 * big, equal_nan=True,
                                           err_msg=str(key))


@pytest.mark.cuda
def test_ce_tail_repeats_bitwise(cp, monkeypatch):
    """The ticket is reset by the last block: twenty calls of each setting give the same bits (a stale ticket or a
    partial read before its store would change the 'mean')."""
    x, t, _ = _problem("bfloat16", 16384, 1000, cp)
    fin = np.isfinite(x.astype(np.float64)).all(axis=1) & (t < 1000)
    xd, td = cp.asarray(x[fin]), cp.asarray(t[fin])
    for setting in ("1", "2"):
        monkeypatch.setattr(_lk, "CE_TAIL", setting)
        _reset_plans()
        first = [_host(a) for a in B.softmax_cross_entropy_forward(None, xd, td, None, -100, 0.0, "mean")]
        for _ in range(20):
            again = [_host(a) for a in B.softmax_cross_entropy_forward(None, xd, td, None, -100, 0.0, "mean")]
            for u, v in zip(again, first):
                np.testing.assert_array_equal(u, v, err_msg=setting)


# ---- the float32 forward at the default (TAIL=1: session 11's order) against float64, with a derived bound ----------

U32 = 2.0 ** -24


def _f32_bounds(defines, c, x64, t, w64, steps):
    """Per-row bounds on |lse - lse64| and |loss - loss64| of the float32 row forward with ``defines``, and the
    relative bound of its 'sum' / denominator, from its order of operations (u = 2^-24):
    - thread sums: each thread adds its E = NV * VEC slots (+ NE edge scalars) of expf(v - m_t): expf <= 2 ulp, the
      rounded difference d adds |d| u relative to a term e^d (<= u / e absolute, as |d| e^d <= 1 / e), each add u
      of the running sum (>= 1: the thread's max term is 1): (E + NE + 3) u relative;
    - the group: s_t * expf(m_t - M) (3 u plus |m_t - M| u e^(m_t - M) <= u), log2 G shuffle adds: (log2 G + 4) u;
    - lse = M + logf(S): logf 1 ulp of log S (<= 2^-23 * 2^ceil(log2 log C)), S's relative error carried as absolute,
      the add u |lse|.  Loss rows: w_t (lse - x_t) rounded twice: w_t * lse bound + 2 u |loss|.
    - 'sum': each group adds its ``steps`` rows in float, the warp's 32 lanes (5 levels), the block's warps (8): the
      sum's error <= (steps + 13) u sum |loss_r| + sum of the rows' bounds; the denominator (steps + 13) u sum w_t."""
    d = _defs(defines)
    e, ne, g = d["NV"] * d["VEC"], (d["VEC"] - 1) if d["RAGGED"] else 0, d["G"]
    rel_s = (e + ne + 3 + math.log2(g) + 4) * U32
    logs = math.log(max(c, 2))
    ulp_log = 2.0 ** -23 * 2.0 ** math.ceil(math.log2(max(logs, 1.0)))
    m = x64.max(axis=1)
    lse64 = m + np.log(np.exp(x64 - m[:, None]).sum(axis=1))
    tol_lse = rel_s + ulp_log + U32 * (np.abs(lse64) + 1.0)
    wt = np.ones(len(t)) if w64 is None else w64[t]
    loss64 = wt * (lse64 - x64[np.arange(len(t)), t])
    tol_loss = wt * tol_lse + 2 * U32 * np.abs(loss64)
    return lse64, tol_lse, loss64, tol_loss, (steps + 13) * U32


def _bound_ok(got, ref, tol):
    return np.abs(np.asarray(got, np.float64) - ref) <= tol


def test_f32_bound_fails_on_a_real_error():
    """The bound is tight enough to see a 1e-5 relative error in one row (a real bug's size) on 1000 classes."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 1000)) * 3
    t = rng.integers(0, 1000, 64)
    defs = ("G=32", "NV=8", "VEC=4", "RAGGED=0")
    lse, tl, loss, tol, _ = _f32_bounds(defs, 1000, x, t, None, 4)
    assert _bound_ok(lse, lse, tl).all() and _bound_ok(loss, loss, tol).all()
    bad = lse.copy()
    bad[7] *= 1 + 1e-5
    assert not _bound_ok(bad, lse, tl)[7]
    assert tl.max() < 1e-5 and (tol / np.maximum(loss, 1)).max() < 1e-5


F32_ROWS = [(6000, 1000), (3000, 1001), (20000, 10), (9000, 128), (4000, 33), (5000, 1), (2000, 127), (2000, 513),
            (3000, 100)]


@pytest.mark.cuda
@pytest.mark.parametrize("rows, c", F32_ROWS, ids=[f"{r}x{c}" for r, c in F32_ROWS])
def test_ce_f32_bound(cp, rows, c):
    """The float32 cross-entropy forward at the default setting against float64 within _f32_bounds (loss rows, lse,
    'sum', 'mean' and the denominator; with and without class weights; odd widths, a row shifted by +30)."""
    from minidnn.backend.cuda import launch
    rng = np.random.default_rng(rows * 3 + c)
    x = (rng.standard_normal((rows, c)) * 4).astype(np.float32)
    x[5, :] += 30
    t = rng.integers(0, c, rows)
    t[3:5] = [0, c - 1]
    w = (rng.random(c) + 0.1).astype(np.float32)
    x64 = x.astype(np.float64)
    xd, td = cp.asarray(x), cp.asarray(t)
    for weighted in (False, True):
        w64 = w.astype(np.float64) if weighted else None
        spec = _lk.launch_spec("ce_fwd", (rows, c), np.dtype(np.float32), np.int64, weighted, "none")
        assert "TAIL=1" in spec[2] and spec[0] == "ROWS"
        grid = _lk._grid(spec[3], xd.data.device_id, spec[4])
        steps = -(-rows // (grid * (spec[5] // _defs(spec[2])["G"])))
        lse64, tl, loss64, tol, rel = _f32_bounds(spec[2], c, x64, t, w64, steps)
        loss, lse, _ = B.softmax_cross_entropy_forward(None, xd, td, None if w is None or not weighted
                                                       else cp.asarray(w), -100, 0.0, "none")
        ok_l, ok_r = _bound_ok(_host(lse), lse64, tl), _bound_ok(_host(loss), loss64, tol)
        assert ok_l.all(), (weighted, int((~ok_l).sum()), np.abs(_host(lse) - lse64).max(), tl.min())
        assert ok_r.all(), (weighted, int((~ok_r).sum()), np.abs(_host(loss) - loss64).max(), tol.min())
        wt = np.ones(rows) if w64 is None else w64[t]
        for red in ("sum", "mean"):
            out, _, den = B.softmax_cross_entropy_forward(None, xd, td, None if not weighted else cp.asarray(w),
                                                          -100, 0.0, red)
            tot, den64 = loss64.sum(), wt.sum()
            tol_sum = tol.sum() + rel * np.abs(loss64).sum()
            tol_den = rel * den64 + U32 * den64
            assert abs(float(_host(den)) - den64) <= tol_den, (red, weighted)
            if red == "sum":
                assert abs(float(_host(out)) - tot) <= tol_sum + U32 * abs(tot), (weighted,)
            else:
                mean = tot / den64
                tol_mean = tol_sum / den64 + abs(mean) * (tol_den / den64) + 2 * U32 * abs(mean)
                assert abs(float(_host(out)) - mean) <= tol_mean, (weighted, float(_host(out)), mean, tol_mean)
    assert launch.launch_count() > 0
