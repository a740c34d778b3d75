"""Session 17: loss_kernels.CE_LONG on the GPU -- the cross-entropy forward of multi-chunk rows streamed through a
cp.async stage (docs/step_kernels.md, "Session 17: the cross-entropy forward on long rows").

LONG keeps the plan's tiling, MINB and grid and reads the same values into the same registers before the same sums,
so every output -- lse, the loss rows, 'mean' / 'sum' and the denominator -- must be bitwise CE_LONG "0"'s
(tests/backend/test_ce_long.py checks the plans).  Here, on (4096, 32000), (300, 50257), (17, 32769) -- and (1000,
16385), one RAGGED chunk that keeps its kernel -- in float32, bfloat16, and 16-bit logits widened to float32: "1"
bitwise "0", and every setting (CE_LONG "2", FASTX's exp, on native 16-bit logits too) against a float64 reference
(lse, loss rows, the reductions, the denominator); class weights, ignored rows (ignore_index -100 and a real class),
label smoothing, every reduction; rows of -inf, a NaN, a row shifted by +40, an out-of-range target (a NaN row),
targets on both sides of the first chunk's end and in the RAGGED edges; views of x off the vector boundary (a LONG
plan copies them first; RAGGED rows need not); repeated calls.
"""
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import loss_kernels as _lk
from tests.backend.test_softmax_rows_cuda import _close, _dtype, _host, _launches, _reset_plans

pytestmark = pytest.mark.cuda


@pytest.fixture
def cp():
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


def _problem(name, rows, c, ignore):
    dtype = _dtype(name)
    rng = np.random.default_rng(rows + 7 * c)
    x = (rng.standard_normal((rows, c), dtype=np.float32) * 3).astype(dtype)
    x[1, :] = -np.inf
    x[2, c // 2] = np.nan
    x[5, :] += dtype.type(40)
    x[rows - 1, ::2] = -np.inf
    t = rng.integers(0, c, rows)
    t[rng.random(rows) < 0.1] = ignore
    t[3:5] = [0, c - 1]                                        # the head / first chunk, the tail / last chunk
    t[7:10] = [c // 2, 16384, 16383]                           # both sides of the first chunk's end (16K classes)
    t[6] = c                                                   # out of range: a NaN row
    w = (rng.random(c) + 0.1).astype(np.float32)
    return x, t, w


def _ref(x64, t, w64, eps, ignore):
    """float64 lse, loss rows and weights of rows (n, C), in row blocks (a (4096, 32000) float64 temporary is 1 GB)."""
    n, c = x64.shape
    lse = np.empty(n)
    for i in range(0, n, 256):
        b = x64[i:i + 256]
        m = b.max(axis=1)
        lse[i:i + 256] = m + np.log(np.exp(b - m[:, None]).sum(axis=1))
    valid = t != ignore
    tt = np.where(valid, t, 0)
    xt = x64[np.arange(n), tt]
    wt = np.ones(n) if w64 is None else w64[tt]
    sw = float(c) if w64 is None else w64.sum()
    swx = x64.sum(axis=1) if w64 is None else x64 @ w64
    per = -((1 - eps) * wt * (xt - lse) + eps / c * (swx - lse * sw))
    return lse, np.where(valid, per, 0.0), np.where(valid, wt, 0.0)


# (dtype, widened, shape, ignore_index, [(weighted, eps, reductions)]): each tiling sees weights, smoothing and every
# reduction across its cases (NVRTC compiles a kernel per combination and setting: kept to ~40)
CASES = [("float32", False, (4096, 32000), -100, [(False, 0.0, ("none", "mean")), (True, 0.1, ("sum",))]),
         ("bfloat16", False, (4096, 32000), -100, [(False, 0.0, ("none", "mean")), (True, 0.0, ("sum",))]),
         ("bfloat16", True, (4096, 32000), -100, [(True, 0.1, ("mean",)), (False, 0.0, ("none",))]),
         ("float32", False, (1000, 16385), -100, [(True, 0.1, ("none", "mean"))]),
         ("bfloat16", False, (1000, 16385), -100, [(False, 0.0, ("sum",))]),
         ("float32", False, (300, 50257), -100, [(True, 0.0, ("none",)), (False, 0.2, ("mean",))]),
         ("bfloat16", False, (300, 50257), -100, [(True, 0.1, ("none", "sum"))]),
         ("float16", True, (300, 50257), 11, [(False, 0.0, ("mean",))]),
         ("float32", False, (17, 32769), 3, [(True, 0.0, ("sum", "none"))]),
         ("bfloat16", False, (17, 32769), -100, [(False, 0.1, ("mean",))])]


# ids "big-..." ((4096, 32000): ~25 kernels, 131 M-element references) and "small-..." (~32 kernels with the
# misaligned views): `-k big` / `-k small` split the file into two device processes of < 150 s each
@pytest.mark.parametrize("name, widen, shape, ignore, variants", CASES,
                         ids=[f"{'big' if s[0] == 4096 else 'small'}-{n}{'w' if wd else ''}-{s[0]}x{s[1]}"
                              for n, wd, s, *_ in CASES])
def test_ce_long_bitwise_and_float64(cp, monkeypatch, name, widen, shape, ignore, variants):
    """CE_LONG "1" bitwise "0" (every output, one launch a call), both against float64; "2" (16-bit logits: FASTX's
    exp) against float64."""
    rows, c = shape
    x, t, w = _problem(name, rows, c, ignore)
    dtype = _dtype(name)
    x64 = x.astype(np.float64)
    fin = np.isfinite(x64).all(axis=1) & (t <= c - 1)
    xd, td = cp.asarray(x), cp.asarray(t)
    xf, tf = cp.asarray(x[fin]), cp.asarray(t[fin])
    out_dt = "float32" if widen else name                     # the loss's dtype (widened: float32)
    for weighted, eps, reds in variants:
        wdev = None
        if weighted:
            wdev = cp.asarray(w if widen or dtype == np.float32 else w.astype(dtype))
        w64 = None if not weighted else _host(wdev)
        lse64, per64, wt64 = _ref(x64[fin], t[fin], w64, eps, ignore)
        got = {}
        fastx = name != "float32" and not widen               # CE_LONG "2" plans LONG=2 (FASTX's exp) here only
        # "1s3": CE_LONG "1" with CE_LONG_SLOTS "3" (three stage slots where the rows are whole and they fit)
        for setting in ("0", "1", "1s3", "2") if fastx else ("0", "1", "1s3"):
            monkeypatch.setattr(_lk, "CE_LONG", setting[0])
            monkeypatch.setattr(_lk, "CE_LONG_SLOTS", setting[2:] or "1")
            _reset_plans()
            spec = _lk.launch_spec("ce_fwd", shape, dtype, np.int64, weighted, reds[0], eps, widen)
            assert (f"LONG={setting[0]}" in spec[2]) == (setting != "0" and c > 16385), spec
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                for red in reds:
                    what = f"CE_LONG={setting} {name}{'w' * widen} {shape} w={weighted} eps={eps} {red}"
                    n0 = _launches()
                    loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wdev, ignore, eps, red,
                                                                     widen=widen)
                    assert _launches() - n0 == 1, what
                    got[setting, red] = [_host(a) for a in (loss, lse, den)] + [str(loss.dtype)]
                    lse_h = got[setting, red][1][fin]
                    _close(lse_h, lse64, "float32", "lse " + what, scale=4)
                    if red == "none":
                        _close(got[setting, red][0][fin], per64, out_dt, "loss rows " + what, scale=10)
                        continue
                    lossf, _, denf = B.softmax_cross_entropy_forward(None, xf, tf, wdev, ignore, eps, red,
                                                                     widen=widen)
                    tot = per64.sum() / (wt64.sum() if red == "mean" else 1.0)
                    ref = np.asarray(tot).astype(_dtype(out_dt)).astype(np.float64)
                    _close(lossf, ref, out_dt, f"loss {what}", scale=10)
                    _close(denf, np.asarray(wt64.sum()), "float32", f"denominator {what}", scale=4)
                    got[setting, red, "finite"] = [_host(lossf), _host(denf)]
        for key, a in got.items():
            if key[0] in ("1", "1s3"):
                b = got[("0",) + key[1:]]
                for u, v in zip(a, b):
                    if isinstance(u, np.ndarray):
                        np.testing.assert_array_equal(u.view(np.uint64) if u.dtype == np.float64 else u,
                                                      v.view(np.uint64) if v.dtype == np.float64 else v,
                                                      err_msg=str(key))
                    else:
                        assert u == v, key


@pytest.mark.parametrize("name, c", [("float32", 32000), ("bfloat16", 32000), ("float32", 50257)])
def test_ce_long_small_misaligned_view(cp, monkeypatch, name, c):
    """x a view one element off the vector boundary: the LONG plan (whole rows) computes on an aligned copy, RAGGED
    rows (each row its own head) in place -- bitwise CE_LONG "0" on the same array, the view and an aligned copy;
    whole rows also give the aligned copy's bits on the view.  (A RAGGED row's head / body / tail split follows its
    address, so the view and the aligned copy sum a ragged row in different orders: not compared.)"""
    dtype = _dtype(name)
    x, t, _ = _problem(name, 64, c, -100)
    buf = cp.empty(x.size + 1, dtype=dtype)
    xv = buf[1:].reshape(x.shape)
    xv[...] = cp.asarray(x)
    td = cp.asarray(t)
    res = {}
    for where, arr in (("view", xv), ("aligned", cp.asarray(x))):
        for setting in ("0", "1"):
            monkeypatch.setattr(_lk, "CE_LONG", setting)
            _reset_plans()
            with np.errstate(invalid="ignore"):
                for red in ("none", "mean"):
                    res[where, setting, red] = [_host(a) for a in B.softmax_cross_entropy_forward(
                        None, arr, td, None, -100, 0.0, red)]
    pairs = [(("view", "1"), ("view", "0")), (("aligned", "1"), ("aligned", "0"))]
    if c % (16 // dtype.itemsize) == 0:
        pairs.append((("view", "1"), ("aligned", "0")))
    for a, b in pairs:
        for red in ("none", "mean"):
            for u, v in zip(res[(*a, red)], res[(*b, red)]):
                np.testing.assert_array_equal(u, v, err_msg=f"{name} {c} {red} {a} against {b}")


def test_ce_long_big_repeats_bitwise(cp, monkeypatch):
    """Ten calls give the same bits (the stage's slots refilled while still being read, or a stale ticket, would
    not): (4096, 32000) float32 'mean' and the rows' lse."""
    monkeypatch.setattr(_lk, "CE_LONG", "1")
    _reset_plans()
    x, t, _ = _problem("float32", 4096, 32000, -100)
    fin = np.isfinite(x).all(axis=1) & (t < 32000)
    xd, td = cp.asarray(x[fin]), cp.asarray(t[fin])
    first = [_host(a) for a in B.softmax_cross_entropy_forward(None, xd, td, None, -100, 0.0, "mean")]
    for _ in range(10):
        again = [_host(a) for a in B.softmax_cross_entropy_forward(None, xd, td, None, -100, 0.0, "mean")]
        for u, v in zip(again, first):
            np.testing.assert_array_equal(u, v)
