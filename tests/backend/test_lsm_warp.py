"""Session 14: softmax_kernels.FWD_LSM (MINIDNN_SOFTMAX_LSM=0|2), PyTorch's epilogue for the WARP log-softmax
forward -- the warp's max first, d = x - M in place, S = sum exp(d), y = d - log S, with exp = ex2.approx.ftz
(docs/step_kernels.md, "Session 14: log-softmax forward"; "1", the same with expf / logf, lost to "2" on every row
and went in session 19: it plans as "0").

CPU: the rule (LSM=n added to exactly the log-softmax forward WARP plans, before MINB; grid, block, budget and every
other plan unchanged; "0" and unknown values plan the session-13 kernel), the environment variable in a fresh
interpreter, a float32 model of "2"'s arithmetic (exp with an error of 2 ulp each way, PTX exp2's bound, flushed below
2^-126) held to the cuda tests' float64 tolerance on adversarial rows (and a control: an error 2^-12 fails it); every
LSM plan is a WARP plan, so test_softmax_warp's nvcc check builds it (no spill, LOG's register budget).
GPU (cuda-marked): "2" (and "0") against float64 at the existing tolerance over rows with tails (row counts not
multiples of a block's rows), RAGGED rows (each row its own head and tail), 513-1027 classes, float32 / bfloat16 /
float16, rows of -inf, NaN, half -inf, +80, x1e-30, x30; a misaligned view (the element-load fallback); one launch a
call; a CUDA graph replay
bitwise the eager call.
"""
import os

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import softmax_kernels as _sk
from tests.backend._row_kernels import _row_kernels_only  # noqa: F401  (autouse: the row kernels, not clusters)
from tests.backend.test_softmax_rows_cuda import RTOL, _close, _defs, _dtype, _host, _launches, _ref_fwd, _reset_plans
from tests.backend.test_softmax_warp import WARP_PLANS, _inputs, _same_bits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WIDTHS = [128, 512, 513, 516, 1000, 1001, 1024, 1027, 2000]
NAMES = ("float32", "bfloat16", "float16", "float64")


def _spec(backward, c, name, algo, rows=16384):
    return _sk.launch_spec(backward, (rows, c), (1,), algo, _dtype(name))


@pytest.mark.parametrize("lsm", ["0", "1", "2", "3", "x"])
@pytest.mark.parametrize("warp", ["auto", "0", "1", "2"])
def test_lsm_rule(monkeypatch, warp, lsm):
    """LSM=2 is added, just before MINB, to the log-softmax forwards that plan WARP -- nothing else of
    those plans changes (grid, block, the other defines, MINB: LSM builds within LOG's budget) and
    no other plan changes (softmax, fast, backwards, PIPE rows, rows under WARP_MIN_ROWS with "auto")."""
    monkeypatch.setattr(_sk, "FWD_WARP", warp)
    for rows in (16384, 4096):
        for name in NAMES:
            for c in WIDTHS:
                for algo in ("FAST", "ACCURATE", "LOG"):
                    for backward in (False, True):
                        monkeypatch.setattr(_sk, "FWD_LSM", "0")
                        base = _spec(backward, c, name, algo, rows)
                        monkeypatch.setattr(_sk, "FWD_LSM", lsm)
                        spec = _spec(backward, c, name, algo, rows)
                        want = lsm == "2" and algo == "LOG" and not backward and "WARP" in _defs(base.defines)
                        if not want:
                            assert spec == base, (warp, lsm, rows, name, c, algo, backward)
                            continue
                        d, item = _defs(spec.defines), np.dtype(_dtype(name)).itemsize
                        regs = _sk.warp_regs(d["NV"] * d["VEC"], item, bool(d["RAGGED"]), True)
                        assert spec.defines == base.defines[:-1] + (f"LSM={lsm}", f"MINB={65536 // (128 * regs)}")
                        assert base.defines[-1].startswith("MINB=")
                        assert spec._replace(defines=base.defines) == base
                        assert spec.defines[-1] == base.defines[-1]                 # LOG's own budget


def test_lsm_headline_plans(monkeypatch):
    """(16384, 1000) float32 and bfloat16 log-softmax under the default WARP ("auto"): LSM 2 plans WARP 1 with LSM=2
    at the session-13 grid (4096 x 128) and budget (MINB 10); 8192 rows (PIPE under "auto") plan no LSM."""
    monkeypatch.setattr(_sk, "FWD_WARP", "auto")
    monkeypatch.setattr(_sk, "FWD_LSM", "2")
    for name in ("float32", "bfloat16"):
        d = _defs(_spec(False, 1000, name, "LOG").defines)
        assert (d["WARP"], d["LSM"], d["MINB"]) == (1, 2, 10), d
        assert _spec(False, 1000, name, "LOG").groups == 4096
        assert "LSM" not in _defs(_spec(False, 1000, name, "LOG", rows=8192).defines)


def test_lsm_env(env_runs):
    """MINIDNN_SOFTMAX_LSM sets the module default at import (unset: "2", since H200 run 6; "1", removed in session
    19, plans no LSM as every other value); one interpreter, the first setting a fresh import, the others the module
    re-executed (tests/conftest.py env_runs)."""
    code = ("import numpy as np; from minidnn.backend.cuda import softmax_kernels as s; "
            "print(s.FWD_LSM, dict(x.split('=') for x in s.launch_spec(False, (16384, 1000), (1,), 'LOG', "
            "np.dtype('float32')).defines).get('LSM', '-'))")
    cases = ((None, "2 2"), ("0", "0 -"), ("1", "1 -"), ("2", "2 2"), ("7", "7 -"), (None, "2 2"))
    got = env_runs("minidnn.backend.cuda.softmax_kernels", code,
                   [{} if val is None else {"MINIDNN_SOFTMAX_LSM": val} for val, _ in cases],
                   drop=("MINIDNN_SOFTMAX_LSM", "MINIDNN_SOFTMAX_WARP"))
    for (val, want), (rc, out, err) in zip(cases, got):
        assert rc == 0, err[-800:]
        assert out.strip() == want, (val, out)


# ---- "2"'s arithmetic, modelled in float32 ----------------------------------------------------------------------

F32 = np.float32


def _lsm2_model(x, rel, sign, seed=0):
    """The LSM 2 kernel's float32 arithmetic on rows of C % 4 == 0 classes (G = 32, 16-byte vectors: lane t holds
    vectors k * 32 + t, slot k * 4 + j into partial sum (k * 4 + j) % 4): M = the row's max (NaN skipped; -inf -> 0),
    d = x - M, e = 2^(d log2e) (1 + delta) with |delta| = rel (sign +1 / -1: every term one way; 0: random within
    rel) and e < 2^-126 flushed to 0, the partials added (p0 + p1) + (p2 + p3), the warp's butterfly, log S =
    (log2 S + rel max(1, |log2 S|)) ln 2 (lg2.approx: absolute near 1, relative beyond), y = d - log S."""
    rows, c = x.shape
    nvec = c // 4
    nv = 1 << (-(-nvec // 32) - 1).bit_length()
    slot = np.full((32, nv * 4), -1)
    for k in range(nv):
        for t in range(32):
            if k * 32 + t < nvec:
                slot[t, k * 4:k * 4 + 4] = (k * 32 + t) * 4 + np.arange(4)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.where(np.isnan(x), -np.inf, x).max(axis=1, keepdims=True).astype(F32)
        m[m == -np.inf] = 0
        d = (x - m).astype(F32)
        t = (d * F32(1.4426950408889634)).astype(F32)
        delta = (np.random.default_rng(seed).uniform(-1, 1, x.shape) if sign == 0 else sign) * rel
        e = np.exp2(t.astype(np.float64)) * (1 + delta)
        e = np.where(e < 2.0 ** -126, 0.0, e).astype(F32)
        g = np.where(slot >= 0, e[:, np.maximum(slot, 0)], F32(0))          # (rows, 32 lanes, slots)
        ps = np.zeros((rows, 32, 4), F32)
        for s in range(slot.shape[1]):
            ps[:, :, s % 4] = (ps[:, :, s % 4] + g[:, :, s]).astype(F32)
        v = ((ps[:, :, 0] + ps[:, :, 1]).astype(F32) + (ps[:, :, 2] + ps[:, :, 3]).astype(F32)).astype(F32)
        for o in (16, 8, 4, 2, 1):
            v = (v + v[:, np.arange(32) ^ o]).astype(F32)
        lg = np.log2(v[:, :1].astype(np.float64))
        lg = (lg + (sign or 1) * rel * np.maximum(1.0, np.abs(lg))).astype(F32)      # lg2.approx, as rel
        ls = (lg * F32(0.6931471805599453)).astype(F32)
        return (d - ls).astype(F32)


def _adversarial(c):
    """The cuda tests' rows (_inputs: -inf, NaN, half -inf, +80, x1e-30, x30) and rows aimed at the sum: a large
    offset, all equal (S = C), one dominant term (y_max ~ -1e-6), d uniform in [-10, 0] (the largest weighted mean |d|
    of the terms: the product's rounding), terms at the flush edge, a linear ramp over 100, huge values, near-equal
    values (S ~ C), the terms 1..C, a large negative offset."""
    rng = np.random.default_rng(c)
    x = _inputs("float32", 24, c, c).astype(np.float64)
    x[7] = 1e4 + rng.standard_normal(c)
    x[8] = 5.0
    x[9] = -20.0
    x[9, 7] = 0.0
    x[10] = rng.uniform(-10, 0, c)
    x[11] = rng.uniform(-88.7, -86.0, c)
    x[11, 0] = 0.0
    x[12] = -np.linspace(0, 100, c)
    x[13] = 3e38 * rng.uniform(0.5, 1, c)
    x[14] = rng.standard_normal(c) * 1e-3
    x[15] = np.log(np.arange(1, c + 1))
    x[16] = -1e4 + rng.standard_normal(c)
    return x.astype(F32)


@pytest.mark.parametrize("c", [516, 1000, 1024])
def test_lsm2_error_model_within_the_cuda_tolerance(c):
    """ex2.approx.ftz's documented error (2 ulp: CUDA's exp2f bound; the kernel's exp is that instruction on the
    product d log2e, rounded) on every term, every sign pattern, and lg2.approx's on log S, passes the cuda tests'
    float64 check of log-softmax (RTOL float32 x 4) on adversarial rows with a margin (the worst element under 1/33
    of its bound at 2 ulp, 1/10 at 8 ulp), and an exp 2^-12 off fails it: the check sees an exp of that quality."""
    x = _adversarial(c)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        ref = _ref_fwd(x.astype(np.float64), "log")
        tol = RTOL["float32"] * 4
        fin = np.where(np.isfinite(ref), np.abs(ref), 0.0)
        bound = tol * (np.abs(ref) + 1e-2 * fin.max(axis=1, keepdims=True) + 1e-30)
        for ulps, sign in ((2, 1), (2, -1), (2, 0), (8, 1), (8, -1)):
            y = _lsm2_model(x, ulps * 2.0 ** -23, sign)
            _close(y, ref, "float32", f"LSM 2 model, {ulps} ulp x {sign}", scale=4)
            err = np.abs(y.astype(np.float64) - ref)
            ok = np.isfinite(err) & np.isfinite(ref)
            assert (err[ok] / bound[ok]).max() < (0.03 if ulps == 2 else 0.1), (ulps, sign)
        with pytest.raises(AssertionError):
            _close(_lsm2_model(x, 2.0 ** -12, 1), ref, "float32", "an exp 2^-12 off", scale=4)


# ---- compile checks ----------------------------------------------------------------------------------------------

def _lsm_plans():
    """Every LSM plan of WARP "1" over float32 / bfloat16 / float16 and 513, 516, 1000, 1001, 1024, 1027 classes:
    (defines, kernel) per distinct compilation."""
    old = _sk.FWD_WARP, _sk.FWD_LSM
    out = {}
    try:
        for w in ("1",):
            for lsm in ("2",):
                _sk.FWD_WARP, _sk.FWD_LSM = w, lsm
                for name in ("float32", "bfloat16", "float16"):
                    for c in (513, 516, 1000, 1001, 1024, 1027):
                        spec = _spec(False, c, name, "LOG")
                        if f"LSM={lsm}" in spec.defines:
                            out[spec.defines] = spec.name
    finally:
        _sk.FWD_WARP, _sk.FWD_LSM = old
    return out


LSM_PLANS = sorted(_lsm_plans().items())


def test_lsm_plans_are_compiled_by_the_warp_check():
    """Every LSM plan (3 dtypes x plain / RAGGED / 16-element rows) is also a WARP plan -- the same
    source, defines and kernel, LSM 2 being the default -- so test_softmax_warp::test_warp_compiles_without_spills
    holds it to the no-spill, MINB-budget, -ftz=true check (WARP "1" plans always, the rest under MINIDNN_NVCC_ALL=1
    or until every define's value and pair of values is built).  (Before session 19 LSM 1's plans were built here.)"""
    assert len(LSM_PLANS) >= 10 and len(set(LSM_PLANS)) == len(LSM_PLANS)
    assert set(LSM_PLANS) <= set(WARP_PLANS)
    assert all("LSM=2" in defines for defines, _ in LSM_PLANS)


# ---- GPU ------------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


# Row counts that leave the last block part-filled; RAGGED 1001 / 1027 / 513
LSM_ROWS = [("float32", 6001, 1000), ("float32", 3003, 1001), ("float32", 5001, 513), ("float32", 2113, 1024),
            ("bfloat16", 3001, 1000), ("bfloat16", 2049, 513), ("float16", 1501, 1027)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", LSM_ROWS, ids=[f"{n}-{r}x{c}" for n, r, c in LSM_ROWS])
def test_lsm_rows(cp, monkeypatch, name, rows, c):
    """Log-softmax forward under LSM 0 / 2 (WARP "1") against float64 at the existing tolerance (RTOL x 4, as
    test_warp_rows), one launch a call, the plan carrying the LSM define; a misaligned view (the element-load
    fallback) against float64."""
    dtype = _dtype(name)
    x = _inputs(name, rows, c, rows + c)
    xd = cp.asarray(x)
    flat = cp.zeros(rows * c + 1, dtype)
    flat[1:] = xd.ravel()
    xm = flat[1:].reshape(rows, c)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ref = _ref_fwd(x.astype(np.float64), "log")
        got = {}
        for w, lsm in (("1", "0"), ("1", "2")):
            monkeypatch.setattr(_sk, "FWD_WARP", w)
            monkeypatch.setattr(_sk, "FWD_LSM", lsm)
            _reset_plans()
            d = _defs(_sk.launch_spec(False, (rows, c), (1,), "LOG", dtype).defines)
            assert d.get("WARP") == int(w) and d.get("LSM", 0) == int(lsm), d
            n0 = _launches()
            y = B.softmax_forward(None, "log", None, xd, axis=-1)
            assert _launches() - n0 == 1
            _close(y, ref, name, f"log-softmax WARP={w} LSM={lsm}", scale=4)
            ym = B.softmax_forward(None, "log", None, xm, axis=-1)
            _close(ym, ref, name, f"log-softmax WARP={w} LSM={lsm} misaligned", scale=4)
            got[w, lsm] = y
    err = {k: np.nanmax(np.where(np.isfinite(ref), np.abs(_host(v) - ref), 0.0)) for k, v in got.items()}
    print(f"{name} {rows}x{c} max |y - float64|: " + ", ".join(f"W{w} LSM{lsm} {e:.3g}" for (w, lsm), e in err.items()))


@pytest.mark.cuda
@pytest.mark.parametrize("lsm", ["2"])
def test_lsm_rows_in_a_graph(cp, monkeypatch, lsm):
    """A captured LSM log-softmax forward replays to the eager bits (two replays, the input changed in place)."""
    monkeypatch.setattr(_sk, "FWD_WARP", "1")
    monkeypatch.setattr(_sk, "FWD_LSM", lsm)
    _reset_plans()
    x = cp.asarray(_inputs("float32", 4097, 1000, 11))
    B.softmax_forward(None, "log", None, x, axis=-1)                   # plans and compiles outside the capture
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        yl = B.softmax_forward(None, "log", None, x, axis=-1)
        graph = s.end_capture()
    for scale in (1.0, 0.5):
        x *= scale
        cp.cuda.Device().synchronize()      # the scaling runs on the current stream; s does not wait for it
        graph.launch(s)
        s.synchronize()
        _same_bits(yl, B.softmax_forward(None, "log", None, x, axis=-1), f"graph LSM={lsm} x{scale}")
