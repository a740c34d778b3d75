"""Cross-entropy with spatial targets (logits (N, C, *d), targets (N, *d)) on the GPU: loss_kernels.SOURCE_SPATIAL,
a thread a position (session 21).  CPU: the planner's route and the nvcc builds; cuda: loss, lse, denom and dx
against the float64 reference, the special values against the previous warp-a-position kernels, a bad class index,
16-bit and widened logits, repeat calls, and F.cross_entropy's autograd on a 4-D GPU tensor against the CPU."""
import re
import shutil
import zlib

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend._testing import to_numpy
from minidnn.backend.cuda import loss_kernels as _lk
from minidnn.backend.cuda import softmax_kernels as _sk
from tests import _nvcc
from tests.backend.test_softmax_rows_cuda import _dtype


def _defs(defines):
    return dict(d.split("=", 1) for d in defines)


# ---- CPU: the route ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["float32", "float64", "bfloat16", "float16"])
def test_spatial_route(monkeypatch, name):
    """inner > 1 takes the thread-a-position kernels (four 256-thread blocks an SM, two in float64; the forward's grid
    capped at those); inner == 1 keeps the row kernels; MINIDNN_CE_SPATIAL=0 (or the V1 kernels) the warp kernels."""
    dt = _dtype(name)
    for shape in ((4, 21, 128, 128), (2, 5, 3), (8, 1000, 2)):
        rows = shape[0] * int(np.prod(shape[2:]))
        for kname in ("ce_fwd", "ce_bwd"):
            src, k, defines, groups, per_sm, block = _lk.launch_spec(kname, shape, dt, np.int64, True, "mean", 0.1)
            assert (src, k, block) == ("SPATIAL", kname.replace("ce_", "ce_sp_"), 256)
            minb = 2 if name == "float64" else 4
            assert _defs(defines)["SP_MINB"] == str(minb)
            inner = rows // shape[0]
            # (C past SP_CC pairs too, under SP_RT, where the pairs fill 132 SMs twice: never in float64)
            bound = 32 if kname == "ce_fwd" else 24
            pair = name != "float64" and inner % 2 == 0 and (shape[1] <= bound or rows // 2 >= 132 * 2 * 256)
            assert ("PAIR" in _defs(defines)) == pair, (shape, kname)     # two positions a thread: SP_PAIR's rule
            # C read at run time (past SP_CC): the unmasked batches (SP_RT), never in float64
            rt = name != "float64" and shape[1] > (32 if kname == "ce_fwd" else 24)
            assert ("SP_RT" in _defs(defines)) == rt, (shape, kname)
            assert groups == -(-rows // (512 if pair else 256))
            assert per_sm == (minb if kname == "ce_fwd" else 16)
            # the class count compiled in up to SP_CC's bounds (forward 32, backward 24), never in float64
            bound = 0 if name == "float64" else 32 if kname == "ce_fwd" else 24
            assert _defs(defines).get("CC") == (str(shape[1]) if shape[1] <= bound else None), (shape, kname)
    for kname, c, cc in (("ce_fwd", 32, "32"), ("ce_fwd", 33, None), ("ce_bwd", 24, "24"), ("ce_bwd", 25, None)):
        defines = _lk.launch_spec(kname, (2, c, 4, 4), dt, np.int64, False, "mean")[2]
        assert _defs(defines).get("CC") == (None if name == "float64" else cc), (kname, c)
    if name != "float64":       # SP_RT's pairs: where the pairs give every SM two blocks (SP_RT_PAIR_BLOCKS)
        for shape, sms, want in (((16, 150, 128, 128), 132, True), ((4, 171, 128, 128), 132, False),
                                 ((4, 171, 128, 128), 64, True), ((4, 171, 127, 129), 64, False)):
            d = _defs(_lk.launch_spec("ce_fwd", shape, dt, np.int64, False, "mean", sms=sms)[2])
            assert ("PAIR" in d, d.get("SP_RT")) == (want, "1"), (shape, sms)
    if name != "float64":       # SP_SPLIT: C read, too few positions for the device's resident threads
        # (forward, backward): half the resident threads
        for shape, sms, wants in (((8, 150, 64, 64), 132, (4, 4)), ((4, 171, 128, 128), 132, (2, 2)),
                                  ((8, 150, 128, 128), 132, (None, None)),
                                  ((2, 64, 8, 8), 132, (2, 2)), ((16, 150, 128, 128), 132, (None, None)),
                                  ((8, 150, 64, 64), 16, (None, None)), ((8, 40, 64, 64), 132, (None, None)),
                                  ((2, 600, 4, 4), 132, (8, 8))):
            for kname, want in zip(("ce_fwd", "ce_bwd"), wants):
                _, _, defines, groups, _, _ = _lk.launch_spec(kname, shape, dt, np.int64, True, "mean", 0.1, sms=sms)
                d = _defs(defines)
                assert d.get("SPLIT") == (None if want is None else str(want)), (shape, sms, kname)
                if want:
                    assert "PAIR" not in d and d["SP_RT"] == "1"
                    rows = shape[0] * shape[2] * shape[3]
                    assert groups == -(-rows * want // 256)
        monkeypatch.setattr(_lk, "SP_SPLIT", False)
        assert "SPLIT" not in _defs(_lk.launch_spec("ce_fwd", (8, 150, 64, 64), dt, np.int64, True, "mean")[2])
        monkeypatch.setattr(_lk, "SP_SPLIT", True)
    monkeypatch.setattr(_lk, "SP_CC", (0, 0))
    monkeypatch.setattr(_lk, "SP_RT", False)          # (C read at run time pairs only under SP_RT)
    assert not {"CC", "PAIR"} & set(_defs(_lk.launch_spec("ce_fwd", (2, 5, 4, 4), dt, np.int64, False, "mean")[2]))
    assert "SP_RT" not in _defs(_lk.launch_spec("ce_fwd", (2, 150, 4, 4), dt, np.int64, False, "mean")[2])
    monkeypatch.setattr(_lk, "SP_RT", True)
    monkeypatch.setattr(_lk, "SP_CC", (32, 24))
    monkeypatch.setattr(_lk, "SP_PAIR", False)
    assert "PAIR" not in _defs(_lk.launch_spec("ce_fwd", (2, 5, 4, 4), dt, np.int64, False, "mean")[2])
    monkeypatch.undo()
    assert _lk.launch_spec("ce_fwd", (64, 1000), dt, np.int64, False, "mean")[0] == "ROWS"
    monkeypatch.setattr(_lk, "CE_SPATIAL", False)
    assert _lk.launch_spec("ce_fwd", (4, 21, 8, 8), dt, np.int64, False, "mean")[0] == "WARPS"
    monkeypatch.setattr(_lk, "CE_SPATIAL", True)
    monkeypatch.setattr(_sk, "V1", True)
    assert _lk.launch_spec("ce_bwd", (4, 21, 8, 8), dt, np.int64, False, "mean")[0] == "WARPS"


def _spatial_builds():
    jobs = []
    for name, widen in (("float32", False), ("float64", False), ("bfloat16", False), ("float16", False),
                        ("bfloat16", True), ("float16", True)):
        for kname in ("ce_fwd", "ce_bwd"):
            for w, red, eps, index in ((False, "mean", 0.0, np.int64), (True, "none", 0.1, np.int32),
                                       (True, "sum", 0.1, np.int64), (False, "none", 0.0, np.int64)):
                for c, sms in ((24, 132), (32, 132), (40, 132), (150, 132), (150, 1)):
                    # CC (the class count compiled in) at SP_CC's bounds, then C read (150 classes at these 2048
                    # positions: SPLIT 4; on one SM: pairs)
                    src, k, defines, *_ = _lk.launch_spec(kname, (8, c, 16, 16), _dtype(name), index, w, red, eps,
                                                          widen, sms=sms)
                    jobs.append((k, defines, name))
    return jobs


SPATIAL_BUILDS = _nvcc.cover(_spatial_builds(), lambda b: _nvcc.define_features([b[0]], b[1]),
                             lambda b: "HAS_W=0" in b[1] and "REDUCTION=1" in b[1])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_spatial_compiles_without_spills():
    """nvcc sm_90: every planned configuration builds, none spills, and the launch bounds hold (<= 64 registers at
    four blocks an SM, 128 at two)."""
    built = _nvcc.build([(_lk.SOURCE_SPATIAL, d) for _, d, _ in SPATIAL_BUILDS],
                        entries=[(k,) for k, _, _ in SPATIAL_BUILDS])
    for (k, defines, name), r in zip(SPATIAL_BUILDS, built):
        assert r.returncode == 0, r.stderr[:1500]
        m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores.*?Used (\d+) registers" % k,
                      r.stderr, re.S)
        assert m is not None, r.stderr[:1500]
        spills, regs = int(m.group(1)), int(m.group(2))
        assert spills == 0, (k, name, defines)
        assert regs <= 65536 // (256 * int(_defs(defines)["SP_MINB"])), (k, name, regs)


# ---- cuda ----------------------------------------------------------------------------------------------------------



def _inputs(rng, shape, name, weighted, ignore, index=np.int64, scale=3.0):
    c = shape[1]
    x = (rng.standard_normal(shape) * scale).astype(np.float32).astype(_dtype(name))
    t = rng.integers(0, c, (shape[0],) + tuple(shape[2:])).astype(index)
    t[rng.random(t.shape) < ignore] = -100
    w = (rng.random(c) + 0.1).astype(np.float32) if weighted else None
    return x, t, w


def _reference(x, t, w, eps, reduction, g):
    """float64 loss, lse and dx of the backend's CPU reference."""
    x64 = x.astype(np.float64)
    w64 = None if w is None else w.astype(np.float64)
    loss, lse, den = B.softmax_cross_entropy_forward(None, x64, t, w64, -100, eps, reduction)
    dx = B.softmax_cross_entropy_backward(None, x64, t, g, lse, den, w64, -100, eps, reduction)
    return np.asarray(loss), np.asarray(lse), np.asarray(den), np.asarray(dx)


TOLS = {"float32": (3e-6, 2e-6), "float64": (1e-12, 1e-13), "bfloat16": (1e-2, 2e-3), "float16": (2e-3, 3e-4)}

SHAPES = [((2, 5, 3, 7), False, 0.0, 0.0), ((4, 21, 33, 17), True, 0.1, 0.2), ((3, 150, 8, 8), False, 0.05, 0.0),
          ((2, 8, 5), True, 0.0, 0.5), ((1, 9, 1, 300), False, 0.0, 0.0), ((5, 2, 64, 3), True, 0.2, 1.0),
          ((4, 3, 200, 200), True, 0.1, 0.1),     # 160000 positions (one pass of pairs; the walk: grid_stride)
          ((3, 32, 9, 7), True, 0.1, 0.1), ((2, 1, 5, 5), False, 0.0, 0.0), ((2, 25, 6, 6), True, 0.0, 0.1)]
# (C <= 32: the class count compiled in, CC -- the backward's up to 24; 25 and 32: a compiled forward, a read
# backward; 150: both read)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", SHAPES, ids=[str(s[0]) for s in SHAPES])
def test_spatial_against_float64(cp, name, reduction, case):
    """loss, lse, the 'mean' denominator and dx against the float64 reference, the weights in x's dtype (16-bit data:
    float32 parameters are not this primitive's contract, so the weights are rounded to x's dtype first)."""
    shape, weighted, eps, ignore = case
    rng = np.random.default_rng(zlib.crc32(repr((shape, name, reduction)).encode()))     # the same every process
    dt = _dtype(name)
    x, t, w = _inputs(rng, shape, name, weighted, ignore)
    w = None if w is None else w.astype(dt)
    g_shape = () if reduction != "none" else t.shape
    g = rng.standard_normal(g_shape).astype(np.float32).astype(dt)
    loss_r, lse_r, den_r, dx_r = _reference(x, t, w, eps, reduction, np.asarray(g, np.float64))
    assert _lk.launch_spec("ce_fwd", shape, dt, np.int64, weighted, reduction, eps)[0] == "SPATIAL"
    xd, td, wd = cp.asarray(x), cp.asarray(t), None if w is None else cp.asarray(w)
    loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wd, -100, eps, reduction)
    dx = B.softmax_cross_entropy_backward(None, xd, td, cp.asarray(g), lse, den, wd, -100, eps, reduction)
    rtol, atol = TOLS[name]
    mag = np.abs(x.astype(np.float64)).max() + 1
    np.testing.assert_allclose(to_numpy(lse), lse_r.reshape(t.shape), rtol=max(rtol, 3e-7), atol=atol * mag)
    np.testing.assert_allclose(to_numpy(den), den_r, rtol=max(rtol, 1e-6))
    scale = 1.0 if reduction != "sum" else float(np.prod(t.shape))
    # the loss is stored in x's dtype: against the reference rounded to it (a float16 'sum' of 160000 positions
    # overflows to inf there, as it does in PyTorch's float16 loss)
    with np.errstate(over="ignore"):
        want = np.asarray(loss_r).astype(dt).astype(np.float64)
    np.testing.assert_allclose(to_numpy(loss).astype(np.float64), want, rtol=rtol * 4, atol=atol * mag * scale * 4,
                               equal_nan=True)
    np.testing.assert_allclose(to_numpy(dx).astype(np.float64), dx_r, rtol=rtol * 4, atol=atol * 4 * np.abs(
        np.asarray(g, np.float64)).max())
    if ignore == 1.0:
        assert not to_numpy(dx).astype(np.float64).any()
    # deterministic: the same call again, the same bits
    loss2, lse2, _ = B.softmax_cross_entropy_forward(None, xd, td, wd, -100, eps, reduction)
    assert np.array_equal(to_numpy(loss2), to_numpy(loss), equal_nan=True)
    assert np.array_equal(to_numpy(lse2), to_numpy(lse))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
def test_spatial_pairs_and_views(cp, monkeypatch, name):
    """Two positions a thread (SP_PAIR; inner 36 even, 19 classes: batches of 12 and 7) against one a thread (one
    batch of 19): the loss, lse and dx within rounding; an x one element off the 2-element boundary (a view) takes
    one position a thread inside the pair build: bitwise the one-a-thread build's ('none': per position; the 'mean'
    sums would follow each build's grid)."""
    rng = np.random.default_rng(5)
    dt = _dtype(name)
    shape = (3, 19, 6, 6)
    x, t, w = _inputs(rng, shape, name, True, 0.2)
    w = w.astype(dt)                                # the weights in x's dtype (the primitive's contract)
    big = cp.asarray(np.concatenate([x.reshape(-1), x.reshape(-1)[:1]]).astype(dt))
    views = {"aligned": cp.asarray(x.astype(dt)), "view": big[1:].reshape(shape)}
    views["view"][...] = views["aligned"]
    td, wd = cp.asarray(t), cp.asarray(w)
    assert views["view"].data.ptr % (2 * dt.itemsize) != 0
    out = {}
    for pair in (False, True):
        monkeypatch.setattr(_lk, "SP_PAIR", pair)
        _lk._plans.clear()
        for k, xd in views.items():
            loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wd, -100, 0.1, "none")
            dx = B.softmax_cross_entropy_backward(None, xd, td, cp.ones(loss.shape, loss.dtype), lse, den, wd,
                                                  -100, 0.1, "none")
            out[pair, k] = [to_numpy(a) for a in (loss, lse, dx)]
    _lk._plans.clear()
    assert "PAIR=1" in _lk.launch_spec("ce_fwd", shape, dt, np.int64, True, "none", 0.1)[2]
    for key in ((False, "view"), (True, "view")):
        for a, b in zip(out[key], out[False, "aligned"]):
            assert np.array_equal(a, b, equal_nan=True), key
    rtol = 2e-6 if name == "float32" else 1e-2
    for a, b in zip(out[True, "aligned"], out[False, "aligned"]):
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=rtol)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(4, 19, 16, 10), (3, 21, 7, 9), (2, 40, 12, 10), (3, 27, 14, 12),
                                   (2, 96, 12, 10), (3, 150, 9, 7), (2, 150, 12, 10, "pairs")],
                         ids=["pairs", "odd-inner", "C-read", "fwd-pairs-bwd-single", "split-2", "split-4-odd",
                              "rt-pairs"])
def test_spatial_grid_stride(cp, monkeypatch, shape):
    """A grid of 3 blocks, so every thread walks several positions (ColWalk.next: (o, i) advanced by the stride,
    crossing images), forward and backward, against float64: pairs, odd inner, C read at run time, a backward past
    SP_CC's 24 (one position a thread) beside a paired forward, SPLIT's slices (the forward's barriers in a walk whose
    last step leaves threads idle), and pairs past SP_CC (SP_RT_PAIR_BLOCKS 0)."""
    if shape[-1] == "pairs":
        shape = shape[:-1]
        monkeypatch.setattr(_lk, "SP_RT_PAIR_BLOCKS", 0)
        assert "PAIR=1" in _lk.launch_spec("ce_fwd", shape, np.dtype(np.float32), np.int64, True, "none", 0.1)[2]
    monkeypatch.setattr(_lk, "_grid", lambda groups, dev, per_sm: min(groups, 3))
    _lk._plans.clear()
    rng = np.random.default_rng(23)
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


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(4, 19, 17, 9), (4, 19, 16, 9), (4, 19, 16, 9, 0)],
                         ids=["odd-inner", "pairs", "pairs-view"])
def test_spatial_widened(cp, name, shape):
    """16-bit logits read as float32 (autocast's cross-entropy, widen): the float32 kernel's loss and lse on
    x.astype(float32), bitwise, and dx that dx .astype(x's dtype) -- one position a thread (inner odd), pairs (inner
    even), and pairs on an x one element off the 4-byte boundary (a view: the host's cast, so that the float32
    kernel's pairs, batches and grid -- the 'mean' sums' order -- are the ones the reference takes; REVIEW22)."""
    rng = np.random.default_rng(5)
    view = len(shape) == 5
    shape = shape[:4]
    x, t, w = _inputs(rng, shape, name, True, 0.1)
    xd, td, wd = cp.asarray(x), cp.asarray(t), cp.asarray(w)
    if view:
        big = cp.empty(x.size + 1, xd.dtype)
        xd = big[1:].reshape(shape)
        xd[...] = cp.asarray(x)
        assert xd.data.ptr % 4 != 0
    x32 = xd.astype(np.float32)
    assert ("PAIR=1" in _lk.launch_spec("ce_fwd", shape, _dtype(name), np.int64, True, "mean", 0.1, True)[2]) == (
        shape[3] == 9 and shape[2] == 16)
    for reduction in ("mean", "none"):
        loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wd, -100, 0.1, reduction, True)
        loss32, lse32, den32 = B.softmax_cross_entropy_forward(None, x32, td, wd, -100, 0.1, reduction)
        assert np.array_equal(to_numpy(loss), to_numpy(loss32)) and np.array_equal(to_numpy(lse), to_numpy(lse32))
        g = cp.ones(loss.shape, np.float32)
        dx = B.softmax_cross_entropy_backward(None, xd, td, g, lse, den, wd, -100, 0.1, reduction, True)
        dx32 = B.softmax_cross_entropy_backward(None, x32, td, g, lse32, den32, wd, -100, 0.1, reduction)
        assert dx.dtype == xd.dtype and np.array_equal(to_numpy(dx), to_numpy(dx32.astype(xd.dtype)))


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["C-read", "C-compiled", "pairs"])
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
def test_spatial_special_values_as_warp_kernels(cp, monkeypatch, name, mode):
    """NaN, +-inf and all -inf positions, and a class index out of range, give the previous warp kernels' NaN / inf
    pattern: the per-position loss, lse and dx agree in where they are not finite and in value elsewhere.  40 classes:
    C read at run time, the specials sit in the forward's second and third batches of 16 (after a finite running max
    and sum); C compiled in (SP_CC raised past 40), one batch of all 40; pairs: two positions a thread (inner 20),
    batches of 12 classes."""
    monkeypatch.setattr(_lk, "SP_CC", (0, 0) if mode == "C-read" else (64, 64))
    monkeypatch.setattr(_lk, "SP_PAIR", mode == "pairs")
    rng = np.random.default_rng(11)
    dt = _dtype(name)
    x, t, _ = _inputs(rng, (2, 40, 4, 5), name, False, 0.0)
    x[0, 20, 0, 0] = np.nan                       # a NaN after a finite first batch
    x[0, :, 0, 1] = -np.inf                       # a wholly masked position
    x[0, 35, 0, 2] = np.inf                       # one +inf, third batch
    x[0, 17, 0, 3] = x[0, 33, 0, 3] = np.inf      # two, in two batches: NaN
    x[1, :, 1, 1] = -np.inf
    x[1, 30, 1, 1] = 0                            # all -inf but one, second batch
    x[1, 39, 2, 2] = -np.inf                      # -inf at the target
    x[1, :12, 0, 0] = np.nan                      # NaN-only first batch (of pairs) before finite classes:
    x[1, 0, 0, 1] = np.nan                        # the running max -inf, then s * 0 keeps the NaN sum
    t[1, 2, 2] = 39
    t[1, 3, 3] = 40                               # out of range: NaN
    t[1, 3, 4] = -100                             # ignored
    xd, td = cp.asarray(x.astype(dt)), cp.asarray(t)
    out = {}
    for spatial in (True, False):
        monkeypatch.setattr(_lk, "CE_SPATIAL", spatial)
        _lk._plans.clear()
        loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, None, -100, 0.0, "none")
        dx = B.softmax_cross_entropy_backward(None, xd, td, cp.ones(loss.shape, loss.dtype), lse, den, None, -100,
                                              0.0, "none")
        out[spatial] = [to_numpy(a).astype(np.float64) for a in (loss, lse, dx)]
    _lk._plans.clear()
    rtol = 1e-6 if name == "float32" else 1e-2
    for a, b in zip(out[True], out[False]):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_array_equal(np.isposinf(a), np.isposinf(b))
        np.testing.assert_array_equal(np.isneginf(a), np.isneginf(b))
        f = np.isfinite(a)
        np.testing.assert_allclose(a[f], b[f], rtol=rtol, atol=rtol)
    assert np.isnan(out[True][0][1, 3, 3]) and out[True][0][1, 3, 4] == 0
    assert np.isnan(out[True][0][0, 0, 3]) and np.isneginf(out[True][1][0, 0, 1])


@pytest.mark.cuda
def test_cross_entropy_4d_autograd_matches_cpu(cp):
    """F.cross_entropy on a (N, C, H, W) GPU tensor (a segmentation loss) -- one launch forward, one backward -- and
    its gradient, against the same call on the CPU (float64 math there)."""
    import minidnn as mdn
    from minidnn.backend.cuda import launch
    rng = np.random.default_rng(3)
    x, t, w = _inputs(rng, (3, 7, 20, 12), "float32", True, 0.1)
    grads = {}
    for device in ("cpu", "cuda"):
        xt = mdn.tensor(x.astype(np.float64) if device == "cpu" else x, device=device, requires_grad=True)
        wt = mdn.tensor(w.astype(np.float64) if device == "cpu" else w, device=device)
        n0 = launch.launch_count()
        loss = mdn.nn.functional.cross_entropy(xt, mdn.tensor(t, device=device), weight=wt, label_smoothing=0.1)
        loss.backward()
        if device == "cuda":
            assert launch.launch_count() - n0 <= 4      # forward, backward (+ the seed's fill and its reduction)
        grads[device] = (float(loss.item()), to_numpy(xt.grad.data))
    assert abs(grads["cuda"][0] - grads["cpu"][0]) <= 1e-5 * abs(grads["cpu"][0])
    np.testing.assert_allclose(grads["cuda"][1], grads["cpu"][1], rtol=1e-4, atol=1e-7)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(2, 40, 7, 9), (3, 150, 6, 8), (2, 171, 5, 5), (2, 25, 4, 6)],
                         ids=["40-odd", "150-pairs", "171", "25-bwd-read"])
def test_spatial_rt_bitwise(cp, monkeypatch, name, shape):
    """SP_RT (C read at run time: the unmasked full batches, the smoothing compiled in or out, x[t] loaded once) is
    the masked batches' arithmetic in the same order: loss, lse and dx bitwise SP_RT off's -- weights or none,
    smoothing or none, ignored positions, an all -inf position, a NaN and a +inf element."""
    rng = np.random.default_rng(11)
    dt = _dtype(name)
    monkeypatch.setattr(_lk, "SP_RT_PAIR_BLOCKS", 0)     # pairs at these few positions too
    monkeypatch.setattr(_lk, "SP_SPLIT", False)          # (SPLIT's slices sum in other batches: test_spatial_split)
    for weighted, eps, reduction in ((False, 0.0, "none"), (True, 0.1, "mean"), (True, 0.0, "sum")):
        x, t, w = _inputs(rng, shape, name, weighted, 0.2)
        x[0, :, 0, 0] = -np.inf
        x[1, 3, 1, 1] = np.nan
        x[0, 5, 2, 2] = np.inf
        xd, td = cp.asarray(x.astype(dt)), cp.asarray(t)
        wd = None if w is None else cp.asarray(w.astype(dt))
        out, dens = {}, {}
        for rt, pair in ((False, False), (True, False), (True, True)):
            monkeypatch.setattr(_lk, "SP_RT", rt)
            monkeypatch.setattr(_lk, "SP_PAIR", pair)
            _lk._plans.clear()
            loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wd, -100, eps, reduction)
            g = cp.ones(loss.shape, loss.dtype) * 0.75
            dx = B.softmax_cross_entropy_backward(None, xd, td, g, lse, den, wd, -100, eps, reduction)
            out[rt, pair] = [to_numpy(a) for a in (loss, lse, dx)]
            dens[rt, pair] = to_numpy(den)
            if pair:        # the paired backward on one-a-thread's lse and denominator: its dx to the bit
                lse1, den1 = cp.asarray(out[True, False][1]), cp.asarray(dens[True, False])
                dx1 = B.softmax_cross_entropy_backward(None, xd, td, g, lse1, den1, wd, -100, eps, reduction)
                assert np.array_equal(to_numpy(dx1), out[True, False][2], equal_nan=True), (weighted, eps, reduction)
            spec = _lk.launch_spec("ce_bwd", shape, dt, np.int64, weighted, reduction, eps)
            assert ("SP_RT=1" in spec[2]) == rt      # (the forward of 25 classes compiles C in: the backward reads it)
            assert ("PAIR=1" in spec[2]) == (pair and shape[2] * shape[3] % 2 == 0)
        _lk._plans.clear()
        for a, b in zip(out[True, False], out[False, False]):
            assert np.array_equal(a, b, equal_nan=True), (weighted, eps, reduction)
        # pairs: batches of UP classes (12 forward), not U (16): the forward's sums in another order -- within
        # rounding of one a thread (the special positions the same: NaN / inf wherever they were); lse is float32 in
        # every dtype, the loss and dx in x's
        rtol = 2e-6 if name == "float32" else 1e-2
        for k, (a, b) in enumerate(zip(out[True, True], out[True, False])):
            r = 2e-6 if k == 1 else rtol
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=r, atol=r)


def test_sp_split_rule(monkeypatch):
    """SPLIT: the smallest power of two up to 8 that gives the device its resident threads, slices of at least
    SP_SPLIT_MIN classes; 1 when switched off."""
    f = _lk.sp_split
    assert f(32768, 150, 135168) == 4                   # 131072 < 135168, but 150 / 8 < 32 classes a slice
    assert f(32768, 600, 135168) == 8
    assert f(200000, 150, 135168) == 1
    assert f(100, 63, 135168) == 1 and f(100, 64, 135168) == 2
    assert f(67584, 1000, 135168) == 2 and f(67583, 1000, 135168) == 4
    monkeypatch.setattr(_lk, "SP_SPLIT", False)
    assert f(32768, 150, 135168) == 1


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(2, 150, 9, 7), (3, 171, 6, 6), (2, 64, 5, 4), (1, 600, 3, 5)],
                         ids=["150-split4", "171-split4", "64-split2", "600-split8"])
def test_spatial_split(cp, monkeypatch, name, shape):
    """SPLIT threads a position (few positions, C read at run time): loss, lse and dx against float64; the forward
    within rounding of one thread a position (other batches) and the special positions where they were (an all -inf
    position, a NaN, a +inf -- in one slice or another); the backward, given the same lse, bitwise one thread a
    position's (every dx_c its own expression)."""
    rng = np.random.default_rng(17)
    dt = _dtype(name)
    tol = TOLS[name]
    for weighted, eps, reduction in ((False, 0.0, "none"), (True, 0.1, "mean"), (True, 0.0, "sum"),
                                     (False, 0.2, "none")):
        x, t, w = _inputs(rng, shape, name, weighted, 0.2)
        x[0, :, 0, 0] = -np.inf
        x[0, shape[1] - 2, 1, 1] = np.nan
        x[-1, shape[1] // 2, 2, 1] = np.inf
        x = x.astype(dt)
        g = rng.standard_normal(t.shape).astype(np.float32) if reduction == "none" else np.float32(0.75)
        xd, td = cp.asarray(x), cp.asarray(t)
        wd = None if w is None else cp.asarray(w.astype(dt))
        out = {}
        for split in (False, True):
            monkeypatch.setattr(_lk, "SP_SPLIT", split)
            _lk._plans.clear()
            assert ("SPLIT" in _defs(_lk.launch_spec("ce_fwd", shape, dt, np.int64, weighted, reduction, eps)[2])) \
                == split
            loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wd, -100, eps, reduction)
            gd = cp.asarray(np.asarray(g).astype(loss.dtype))
            out[split] = [to_numpy(a) for a in (loss, lse, den)]
            # the backward of both settings on the unsplit forward's lse and denominator
            lse0, den0 = (lse, den) if not split else (cp.asarray(out[False][1]), cp.asarray(out[False][2]))
            dx = B.softmax_cross_entropy_backward(None, xd, td, gd, lse0, den0, wd, -100, eps, reduction)
            out[split].append(to_numpy(dx))
        _lk._plans.clear()
        assert np.array_equal(out[True][3], out[False][3], equal_nan=True), (weighted, eps, reduction)
        for a, b in zip(out[True][:2], out[False][:2]):
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            assert np.array_equal(np.isnan(a64), np.isnan(b64)) and np.array_equal(np.isinf(a64), np.isinf(b64))
            fin = np.isfinite(b64)
            np.testing.assert_allclose(a64[fin], b64[fin], rtol=tol[0], atol=tol[0])
        # against float64 where the reference is finite (the special positions: their NaN / inf as above)
        loss_r, lse_r, den_r, dx_r = _reference(x.astype(np.float32), t, w, eps, reduction, np.asarray(g, np.float64))
        lse_r = lse_r.reshape(t.shape)
        fin = np.isfinite(lse_r)
        np.testing.assert_allclose(np.asarray(out[True][1], np.float64)[fin], lse_r[fin], rtol=tol[0], atol=tol[0])
        if reduction == "none":
            fin = np.isfinite(np.asarray(loss_r, np.float64))
            np.testing.assert_allclose(np.asarray(out[True][0], np.float64)[fin], np.asarray(loss_r)[fin],
                                       rtol=tol[0], atol=tol[0] * 10)
