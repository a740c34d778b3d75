"""SP_PIPE (session 24): the spatial cross-entropy past SP_CC with the next batch's loads in flight while a batch
computes (loss_kernels.SOURCE_SPATIAL's sp_fwd_sums_rt / sp_bwd_rt under SP_PIPE=1).  CPU: the planner's settings and
the nvcc builds (no spill at the launch bounds); cuda: for both settings ("4": halved batches at four blocks an SM,
"3": the batches as before at three) the backward bitwise the unpipelined one's on the same lse, the forward bitwise
where the batches are the same and within rounding where they are not, special values where they were, and loss, lse
and dx against float64 -- one position a thread, pairs, SPLIT's slices, a grid-stride walk, full batches with and
without a masked last one."""
import re
import shutil

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend._testing import to_numpy
from minidnn.backend.cuda import loss_kernels as _lk
from tests import _nvcc
from tests.backend.test_ce_spatial import TOLS, _defs, _inputs, _reference
from tests.backend.test_softmax_rows_cuda import _dtype

F32, BF16 = np.dtype(np.float32), np.dtype(_dtype("bfloat16"))


def test_pipe_plan(monkeypatch):
    """"0" plans no SP_PIPE; "4" and "3" plan SP_PIPE=1 with their blocks an SM and
    batches where C is read at run time (SP_RT), never where it is compiled in or for float64."""
    spec = _lk.launch_spec
    monkeypatch.setattr(_lk, "SP_PIPE", "0")
    assert "SP_PIPE" not in _defs(spec("ce_fwd", (10, 150, 128, 128), F32, np.int64, False, "mean")[2])
    want = {("4", True, 4): ("4", "8", "6"), ("4", False, 4): ("4", "8", "4"),
            ("3", True, 4): ("3", "16", "8"), ("3", True, 2): ("3", "16", "12"), ("3", False, 4): ("3", "8", "6")}
    for (setting, fwd, size), (minb, u, up) in want.items():
        monkeypatch.setattr(_lk, "SP_PIPE", setting)
        assert _lk.sp_pipe_plan(fwd, size) == (int(minb), int(u), int(up))
        dt = F32 if size == 4 else BF16
        src, k, defines, groups, per_sm, _ = spec("ce_fwd" if fwd else "ce_bwd", (10, 150, 128, 128), dt, np.int64,
                                                  True, "mean", 0.1, sms=132)
        d = _defs(defines)
        assert (d["SP_PIPE"], d["SP_MINB"], d["U"], d["PAIR"], d["UP"]) == ("1", minb, u, "1", up), defines
        assert per_sm == (int(minb) if fwd else 16)
        # (the widened 16-bit logits: 2-byte words, the 16-bit batches)
        d = _defs(spec("ce_fwd", (10, 150, 128, 128), BF16, np.int64, False, "mean", widen=True, sms=132)[2])
        assert d.get("UP") == ("12" if setting == "3" else "6") and d["SP_PIPE"] == "1"
        # the class count compiled in, float64, SP_RT off: no pipe
        assert "SP_PIPE" not in _defs(spec("ce_fwd", (10, 21, 128, 128), dt, np.int64, False, "mean")[2])
        assert "SP_PIPE" not in _defs(spec("ce_fwd", (10, 150, 8, 8), np.dtype(np.float64), np.int64, False,
                                           "mean")[2])
        monkeypatch.setattr(_lk, "SP_RT", False)
        assert "SP_PIPE" not in _defs(spec("ce_bwd", (10, 150, 8, 8), dt, np.int64, False, "mean")[2])
        monkeypatch.setattr(_lk, "SP_RT", True)
    # SPLIT's rule counts the resident threads of the pipe's blocks an SM: (4, 171, 128, 128) is split 2 at four,
    # one thread a position at three
    for setting, split in (("4", "2"), ("3", None)):
        monkeypatch.setattr(_lk, "SP_PIPE", setting)
        assert _defs(spec("ce_fwd", (4, 171, 128, 128), F32, np.int64, False, "mean", sms=132)[2]).get("SPLIT") \
            == split


def _pipe_builds():
    jobs = []
    for setting in ("4", "3"):
        for name, widen in (("float32", False), ("bfloat16", False), ("float16", False), ("bfloat16", True)):
            for kname in ("ce_fwd", "ce_bwd"):
                for w, red, eps in ((False, "mean", 0.0), (True, "none", 0.1), (True, "sum", 0.1)):
                    for shape, sms in (((10, 150, 128, 128), 132), ((8, 150, 16, 16), 132), ((8, 40, 16, 16), 1)):
                        jobs.append((setting, kname, (name, widen, w, red, eps, shape, sms)))
    return jobs


PIPE_BUILDS = _nvcc.cover(_pipe_builds(), lambda b: {(b[0], b[1], v) for v in b[2]} | {(b[0], b[1], b[2][0], b[2][5])})


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_pipe_compiles_without_spills(monkeypatch):
    """nvcc sm_90: the SP_PIPE builds (pairs, one position a thread, SPLIT; smoothing and weights) build without a
    spill within their launch bounds (64 registers at four blocks an SM, 80 at three)."""
    units = []
    for setting, kname, (name, widen, w, red, eps, shape, sms) in PIPE_BUILDS:
        monkeypatch.setattr(_lk, "SP_PIPE", setting)
        _, k, defines, *_ = _lk.launch_spec(kname, shape, np.dtype(_dtype(name)), np.int64, w, red, eps, widen,
                                            sms=sms)
        assert "SP_PIPE=1" in defines
        units.append((k, defines))
    built = _nvcc.build([(_lk.SOURCE_SPATIAL, d) for _, d in units], entries=[(k,) for k, _ in units])
    for (k, defines), r in zip(units, built):
        assert r.returncode == 0, r.stderr[:1500]
        m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores.*?Used (\d+) registers" % k,
                      r.stderr, re.S)
        assert m is not None, r.stderr[:1500]
        assert int(m.group(1)) == 0, (k, defines)
        assert int(m.group(2)) <= 65536 // (256 * int(_defs(defines)["SP_MINB"])), (k, defines)


# ---- cuda --------------------------------------------------------------------------------------------------------

# (shape, force pairs): classes against the batches -- 33 / 40 / 48 forward (C read past 32: U 8 or 16 with or
# without a masked last batch), 25 / 32 backward (C read past 24), 150 / 171; SPLIT's slices at 2048 positions of
# 150 classes and 15 positions of 600; pairs at few positions (SP_RT_PAIR_BLOCKS 0)
CASES = [((2, 33, 7, 9), False), ((2, 40, 6, 8), True), ((3, 48, 5, 6), True), ((2, 25, 4, 6), False),
         ((2, 32, 6, 5), True), ((3, 150, 6, 8), True), ((2, 171, 5, 5), False), ((8, 150, 16, 16), False),
         ((1, 600, 3, 5), False)]


def _run(cp, xd, td, wd, eps, reduction, g, lse_den=None):
    loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wd, -100, eps, reduction)
    lse0, den0 = (lse, den) if lse_den is None else lse_den
    dx = B.softmax_cross_entropy_backward(None, xd, td, cp.asarray(np.asarray(g).astype(loss.dtype)), lse0, den0,
                                          wd, -100, eps, reduction)
    return [to_numpy(a) for a in (loss, lse, den, dx)], (lse, den)


@pytest.mark.cuda
@pytest.mark.parametrize("setting", ["4", "3"], ids=["pipe4", "pipe3"])
@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=[f"{s[0][1]}x{s[0][0] * s[0][2] * s[0][3]}{'-pairs' * s[1]}"
                                             for s in CASES])
def test_pipe_against_unpipelined(cp, monkeypatch, setting, name, case):
    """The pipelined kernels against SP_PIPE "0" in the same process: the backward on the same lse and denominator
    bitwise; the forward bitwise where the batches are the same (setting "3" outside float32 pairs), else within
    rounding with NaN / inf where they were; both against float64 -- weights or none, smoothing or none, ignored
    positions, an all -inf position, a NaN and a +inf element."""
    shape, pairs = case
    if pairs:
        monkeypatch.setattr(_lk, "SP_RT_PAIR_BLOCKS", 0)
    rng = np.random.default_rng(31)
    dt = _dtype(name)
    tol = TOLS[name]
    try:
        for weighted, eps, reduction in ((False, 0.0, "none"), (True, 0.1, "mean"), (True, 0.0, "sum"),
                                         (False, 0.2, "none")):
            x, t, w = _inputs(rng, shape, name, weighted, 0.2)
            x[0, :, 0, 0] = -np.inf
            x[-1, shape[1] - 2, 1, 1] = np.nan
            x[0, shape[1] // 2, 2, 2] = np.inf
            x = x.astype(dt)
            g = rng.standard_normal(t.shape).astype(np.float32) if reduction == "none" else np.float32(0.75)
            xd, td = cp.asarray(x), cp.asarray(t)
            wd = None if w is None else cp.asarray(w.astype(dt))
            out, plans, ref = {}, {}, None
            for s in ("0", setting):
                monkeypatch.setattr(_lk, "SP_PIPE", s)
                _lk._plans.clear()
                plans[s] = [_defs(_lk.launch_spec(k, shape, np.dtype(dt), np.int64, weighted, reduction, eps)[2])
                            for k in ("ce_fwd", "ce_bwd")]
                out[s], ld = _run(cp, xd, td, wd, eps, reduction, g, ref)
                ref = ref or ld         # the setting's backward on the unpipelined forward's lse and denominator
            fwd_p, bwd_p = plans[setting]
            assert fwd_p.get("SP_PIPE") == ("1" if shape[1] > 32 else None)
            assert bwd_p.get("SP_PIPE") == "1"
            assert ("PAIR" in bwd_p) == pairs
            # the backward, on the unpipelined forward's lse and denominator: every dx_c its own expression
            assert np.array_equal(out[setting][3], out["0"][3], equal_nan=True), (weighted, eps, reduction)
            same_batches = all(fwd_p.get(k) == plans["0"][0].get(k) for k in ("U", "UP", "PAIR", "SPLIT"))
            for a, b in zip(out[setting][:2], out["0"][:2]):
                if same_batches:
                    assert np.array_equal(a, b, equal_nan=True), (weighted, eps, reduction)
                a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
                assert np.array_equal(np.isnan(a64), np.isnan(b64)) and np.array_equal(np.isinf(a64), np.isinf(b64))
                fin = np.isfinite(b64)
                np.testing.assert_allclose(a64[fin], b64[fin], rtol=tol[0], atol=tol[0])
            # against float64 where the reference is finite
            loss_r, lse_r, den_r, dx_r = _reference(x.astype(np.float32), t, w, eps, reduction,
                                                    np.asarray(g, np.float64))
            lse_r = lse_r.reshape(t.shape)
            fin = np.isfinite(lse_r)
            np.testing.assert_allclose(np.asarray(out[setting][1], np.float64)[fin], lse_r[fin], rtol=tol[0],
                                       atol=tol[0])
            dx64 = np.asarray(out[setting][3], np.float64)
            rows = np.isfinite(dx_r).all(axis=1, keepdims=True) & np.ones_like(dx_r, bool)
            np.testing.assert_allclose(dx64[rows], dx_r[rows], rtol=tol[0] * 4,
                                       atol=tol[1] * 4 * np.abs(np.asarray(g, np.float64)).max())
    finally:
        _lk._plans.clear()


@pytest.mark.cuda
@pytest.mark.parametrize("setting", ["4", "3"], ids=["pipe4", "pipe3"])
@pytest.mark.parametrize("shape", [(2, 150, 12, 10, "pairs"), (3, 150, 9, 7), (2, 45, 12, 10)],
                         ids=["rt-pairs", "split", "singles-45"])
def test_pipe_grid_stride(cp, monkeypatch, setting, shape):
    """A grid of 3 blocks (every thread walks several positions, the pipeline restarted at each), forward and
    backward against float64."""
    if shape[-1] == "pairs":
        shape = shape[:-1]
        monkeypatch.setattr(_lk, "SP_RT_PAIR_BLOCKS", 0)
    monkeypatch.setattr(_lk, "SP_PIPE", setting)
    monkeypatch.setattr(_lk, "_grid", lambda groups, dev, per_sm: min(groups, 3))
    _lk._plans.clear()
    rng = np.random.default_rng(29)
    x, t, w = _inputs(rng, shape, "float32", True, 0.1)
    g = rng.standard_normal(t.shape).astype(np.float32)
    try:
        for reduction in ("none", "mean"):
            gg = g if reduction == "none" else np.float32(1.5)
            loss_r, lse_r, den_r, dx_r = _reference(x, t, w, 0.1, reduction, np.asarray(gg, np.float64))
            xd, td, wd = cp.asarray(x), cp.asarray(t), cp.asarray(w)
            loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wd, -100, 0.1, reduction)
            dx = B.softmax_cross_entropy_backward(None, xd, td, cp.asarray(gg), lse, den, wd, -100, 0.1, reduction)
            np.testing.assert_allclose(to_numpy(lse), lse_r.reshape(t.shape), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(to_numpy(loss), loss_r, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(to_numpy(dx), dx_r, rtol=1e-5, atol=1e-6)
    finally:
        _lk._plans.clear()


# ---- SP_QUAD: four positions a thread past SP_CC -------------------------------------------------------------------

def test_quad_plan(monkeypatch):
    """SP_QUAD plans SP_Q=4 (pairs' build, SP_UPQ batches, two blocks an SM) past SP_CC where inner % 4 == 0 and the
    quads give every SM SP_QUAD_BLOCKS blocks; pairs where inner is only even; not with the class count compiled in,
    float64 or SP_PIPE; the grid counts four positions a thread."""
    spec = _lk.launch_spec
    monkeypatch.setattr(_lk, "SP_QUAD", True)
    monkeypatch.setattr(_lk, "SP_PIPE", "0")
    for dt in (F32, BF16):
        for fwd in (True, False):
            k = "ce_fwd" if fwd else "ce_bwd"
            src, kn, defines, groups, per_sm, _ = spec(k, (10, 150, 128, 128), dt, np.int64, True, "mean", 0.1,
                                                       sms=132)
            d = _defs(defines)
            assert (d["SP_Q"], d["PAIR"], d["UP"], d["SP_MINB"]) == ("4", "1", str(_lk.SP_UPQ[not fwd]), "2")
            assert groups == 10 * 128 * 128 // (4 * 256) and per_sm == (2 if fwd else 16)
    # 135168 positions fill 132 SMs with a block of quads, 135164 do not (pairs then: SP_RT_PAIR_BLOCKS' rule)
    assert _defs(spec("ce_fwd", (1, 150, 4, 33792), F32, np.int64, False, "mean", sms=132)[2]).get("SP_Q") == "4"
    d = _defs(spec("ce_fwd", (1, 150, 4, 33791), F32, np.int64, False, "mean", sms=132)[2])
    assert "SP_Q" not in d
    # inner even but not a multiple of 4: pairs
    d = _defs(spec("ce_fwd", (10, 150, 130, 127), F32, np.int64, False, "mean", sms=132)[2])
    assert "SP_Q" not in d and d["PAIR"] == "1"
    assert "SP_Q" not in _defs(spec("ce_fwd", (10, 21, 128, 128), F32, np.int64, False, "mean")[2])
    assert "SP_Q" not in _defs(spec("ce_fwd", (10, 150, 128, 128), np.dtype(np.float64), np.int64, False,
                                    "mean")[2])
    monkeypatch.setattr(_lk, "SP_QUAD_BLOCKS", 0)
    assert _defs(spec("ce_bwd", (1, 150, 4, 4), BF16, np.int64, False, "mean")[2]).get("SP_Q") == "4"
    monkeypatch.setattr(_lk, "SP_PIPE", "3")
    assert "SP_Q" not in _defs(spec("ce_bwd", (1, 150, 4, 4), BF16, np.int64, False, "mean")[2])
    monkeypatch.setattr(_lk, "SP_PIPE", "0")
    monkeypatch.setattr(_lk, "SP_QUAD", False)
    assert "SP_Q" not in _defs(spec("ce_fwd", (10, 150, 128, 128), F32, np.int64, False, "mean")[2])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_quad_compiles_without_spills(monkeypatch):
    """nvcc sm_90: the quad builds (float32, 16-bit, widened; weights and smoothing) build without a spill at two
    blocks an SM."""
    monkeypatch.setattr(_lk, "SP_QUAD", True)
    units = []
    for name, widen in (("float32", False), ("bfloat16", False), ("float16", False), ("bfloat16", True)):
        for kname in ("ce_fwd", "ce_bwd"):
            for w, red, eps in ((False, "mean", 0.0), (True, "none", 0.1)):
                _, k, defines, *_ = _lk.launch_spec(kname, (10, 150, 128, 128), np.dtype(_dtype(name)), np.int64, w,
                                                    red, eps, widen, sms=132)
                assert "SP_Q=4" in defines
                units.append((k, defines))
    units = _nvcc.pick(units, 6, always=lambda u: "HAS_W=0" in u[1])
    built = _nvcc.build([(_lk.SOURCE_SPATIAL, d) for _, d in units], entries=[(k,) for k, _ in units])
    for (k, defines), r in zip(units, built):
        assert r.returncode == 0, r.stderr[:1500]
        m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores.*?Used (\d+) registers" % k,
                      r.stderr, re.S)
        assert m is not None and int(m.group(1)) == 0 and int(m.group(2)) <= 128, (k, defines, r.stderr[-800:])


QUAD_CASES = [(2, 33, 4, 9), (2, 40, 6, 8), (3, 150, 4, 4), (2, 171, 8, 5), (2, 25, 4, 6), (1, 600, 4, 3)]


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", QUAD_CASES, ids=[f"{s[1]}x{s[0] * s[2] * s[3]}" for s in QUAD_CASES])
@pytest.mark.parametrize("view", [False, True], ids=["aligned", "offset-view"])
def test_quad_against_pairs(cp, monkeypatch, name, shape, view):
    """Quads (SP_QUAD_BLOCKS 0: at these few positions too) against pairs in the same process: lse and the 'none'
    loss bitwise (the same UP batches a position), the backward on the same lse bitwise, the scalar losses within
    rounding (another grid), and against float64 -- weights, smoothing, ignored positions inside a quad, an all -inf
    position, a NaN and a +inf element.  offset-view: x a view 2 elements off the 4-element boundary (one position a
    thread inside the quad build), and widened 16-bit logits through the float32 kernels."""
    monkeypatch.setattr(_lk, "SP_RT_PAIR_BLOCKS", 0)
    monkeypatch.setattr(_lk, "SP_QUAD_BLOCKS", 0)
    monkeypatch.setattr(_lk, "SP_PIPE", "0")
    rng = np.random.default_rng(37)
    dt = _dtype(name)
    tol = TOLS[name]
    try:
        for weighted, eps, reduction in ((False, 0.0, "none"), (True, 0.1, "mean"), (True, 0.0, "sum"),
                                         (False, 0.2, "none")):
            x, t, w = _inputs(rng, shape, name, weighted, 0.3)
            x[0, :, 0, 0] = -np.inf
            x[-1, shape[1] - 2, 1, 1] = np.nan
            x[0, shape[1] // 2, 2, 2] = np.inf
            x = x.astype(dt)
            g = rng.standard_normal(t.shape).astype(np.float32) if reduction == "none" else np.float32(0.75)
            if view:
                buf = cp.zeros(x.size + 2, x.dtype)
                xd = buf[2:].reshape(x.shape)
                xd[...] = cp.asarray(x)
            else:
                xd = cp.asarray(x)
            td = cp.asarray(t)
            wd = None if w is None else cp.asarray(w.astype(dt))
            out, ref = {}, None
            for quad in (False, True):
                monkeypatch.setattr(_lk, "SP_QUAD", quad)
                _lk._plans.clear()
                d = _defs(_lk.launch_spec("ce_bwd", shape, np.dtype(dt), np.int64, weighted, reduction, eps)[2])
                assert (d.get("SP_Q") == "4") == quad
                out[quad], ld = _run(cp, xd, td, wd, eps, reduction, g, ref)
                ref = ref or ld         # the quads' backward on the pairs' lse and denominator
            assert np.array_equal(out[True][3], out[False][3], equal_nan=True), (weighted, eps, reduction)
            assert np.array_equal(out[True][1], out[False][1], equal_nan=True), (weighted, eps, reduction)
            a64, b64 = np.asarray(out[True][0], np.float64), np.asarray(out[False][0], np.float64)
            if reduction == "none":
                assert np.array_equal(a64, b64, equal_nan=True)
            else:
                np.testing.assert_allclose(a64, b64, rtol=tol[0] * 4, atol=0)
            loss_r, lse_r, den_r, dx_r = _reference(x.astype(np.float32), t, w, eps, reduction,
                                                    np.asarray(g, np.float64))
            lse_r = lse_r.reshape(t.shape)
            fin = np.isfinite(lse_r)
            np.testing.assert_allclose(np.asarray(out[True][1], np.float64)[fin], lse_r[fin], rtol=tol[0],
                                       atol=tol[0])
            dx64 = np.asarray(out[True][3], np.float64)
            rows = np.isfinite(dx_r).all(axis=1, keepdims=True) & np.ones_like(dx_r, bool)
            np.testing.assert_allclose(dx64[rows], dx_r[rows], rtol=tol[0] * 4,
                                       atol=tol[1] * 4 * np.abs(np.asarray(g, np.float64)).max())
            if name != "float32" and not weighted:
                # widened: the float32 quad kernels reading the 16-bit logits, bitwise the float32 kernels on the
                # cast (x off the 8-byte boundary: the cast first, as pairs' 4-byte rule)
                x32 = xd.astype(cp.float32)
                wide = B.softmax_cross_entropy_forward(None, xd, td, None, -100, eps, reduction, widen=True)
                cast = B.softmax_cross_entropy_forward(None, x32, td, None, -100, eps, reduction)
                for a, b in zip(wide, cast):
                    assert np.array_equal(to_numpy(a), to_numpy(b), equal_nan=True), (eps, reduction)
                gw = cp.asarray(np.asarray(g, np.float32))
                wdx = B.softmax_cross_entropy_backward(None, xd, td, gw, wide[1], wide[2], None, -100, eps, reduction,
                                                       widen=True)
                cdx = B.softmax_cross_entropy_backward(None, x32, td, gw, cast[1], cast[2], None, -100, eps,
                                                       reduction)
                assert np.array_equal(to_numpy(wdx), to_numpy(cdx.astype(xd.dtype)), equal_nan=True)
    finally:
        _lk._plans.clear()


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(2, 150, 12, 8), (3, 40, 4, 12)], ids=["150", "40"])
def test_quad_grid_stride(cp, monkeypatch, shape):
    """Quads in a grid of 3 blocks (every thread walks several quads, crossing images), forward and backward against
    float64."""
    monkeypatch.setattr(_lk, "SP_QUAD", True)
    monkeypatch.setattr(_lk, "SP_QUAD_BLOCKS", 0)
    monkeypatch.setattr(_lk, "_grid", lambda groups, dev, per_sm: min(groups, 3))
    _lk._plans.clear()
    assert "SP_Q=4" in _lk.launch_spec("ce_fwd", shape, F32, np.int64, True, "none", 0.1)[2]
    rng = np.random.default_rng(41)
    x, t, w = _inputs(rng, shape, "float32", True, 0.1)
    g = rng.standard_normal(t.shape).astype(np.float32)
    try:
        for reduction in ("none", "mean"):
            gg = g if reduction == "none" else np.float32(1.5)
            loss_r, lse_r, den_r, dx_r = _reference(x, t, w, 0.1, reduction, np.asarray(gg, np.float64))
            xd, td, wd = cp.asarray(x), cp.asarray(t), cp.asarray(w)
            loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wd, -100, 0.1, reduction)
            dx = B.softmax_cross_entropy_backward(None, xd, td, cp.asarray(gg), lse, den, wd, -100, 0.1, reduction)
            np.testing.assert_allclose(to_numpy(lse), lse_r.reshape(t.shape), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(to_numpy(loss), loss_r, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(to_numpy(dx), dx_r, rtol=1e-5, atol=1e-6)
    finally:
        _lk._plans.clear()
