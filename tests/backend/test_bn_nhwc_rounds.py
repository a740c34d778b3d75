"""Session 23's channel rounds for the channels-last batch-norm one-launch kernels (bn_nhwc.ROUNDS,
MINIDNN_BN_NHWC_ROUNDS; docs/step_kernels.md, "Session 23: channel rounds for channels-last batch norm"): a call runs
as k launches of bnc_fwd1 / bnc_bwd1, launch r on channels r * C / k ... of every row (pointers shifted, rows CS
vectors apart: the kernels' RSTRIDE build).
CPU: the settings and their errors, the tile rule, the planner (fixed counts, "auto" on an H200's facts, the cost
model reducing to the brief's "smallest k that fits"), the strided walk emulated (every element once, by its own
round), the launches under tools/record_launches.py's fake CuPy (k launches, each array shifted by its tile, the
scratch not, the counter and has_counter in round 0 only, the seven geometry ints; ROUNDS 0 the launch before),
nvcc (the RSTRIDE builds without spills).
cuda: ROUNDS 2 / 4 / auto against the default and float64 -- forward (running statistics, counter), backward (dx,
dscale, dbias), plain / ReLU / add + ReLU, float32 / float16 / bfloat16, C in {16, 24, 64, 96, 256}, ragged rows; the
twin forward; the large shapes; captured in a CUDA graph and replayed twice."""
import math
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

from minidnn.backend.cuda import bn_nhwc as M
from tests._nvcc import pick

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H200_SMEM = (233472, 232448)
L2 = 50 * 1024 * 1024
SMS = 132
SHAPES3 = [(32, 256, 56, 56), (128, 64, 56, 56), (256, 32, 56, 56)]     # the brief's A/B shapes


# ---- settings ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, want", [("0", 0), (" 2 ", 2), ("4", 4), ("AUTO", "auto"), ("auto", "auto"), (1, 1),
                                         (0, 0), ("64", 64)])
def test_settings_parse(value, want):
    assert M.parse_rounds(value) == want


@pytest.mark.parametrize("value", ["", "two", "-1", "65", "2.5", 2.0, None, True, "1,2"])
def test_bad_settings_raise_with_the_value(value):
    with pytest.raises(ValueError, match="expected 0 \\(off\\), 'auto'") as e:
        M.parse_rounds(value, "MINIDNN_BN_NHWC_ROUNDS")
    assert repr(value) in str(e.value) and "MINIDNN_BN_NHWC_ROUNDS" in str(e.value)


def test_environment_values():
    code = "from minidnn.backend.cuda import bn_nhwc as M; print(repr(M.ROUNDS))"
    got = []
    for v in ("unset", "0", "4", "auto", "bogus"):
        env = dict(os.environ)
        env.pop("MINIDNN_BN_NHWC_ROUNDS", None)
        if v != "unset":
            env["MINIDNN_BN_NHWC_ROUNDS"] = v
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        got.append(r.stdout.strip() if r.returncode == 0 else r.stderr.strip().splitlines()[-1])
    assert got[:4] == ["0", "0", "4", "'auto'"], got
    assert got[4] == "ValueError: MINIDNN_BN_NHWC_ROUNDS='bogus': expected 0 (off), 'auto', or a round count 1-64"


# ---- the tile rule and the planner -------------------------------------------------------------------------------

@pytest.mark.parametrize("c, item, want", [
    (16, 4, [1]), (24, 4, [1]), (32, 4, [1, 2]), (64, 4, [1, 2, 4]), (96, 4, [1, 2, 3, 4, 6]),
    (256, 4, [1, 2, 4, 8, 16]), (16, 2, [1]), (64, 2, [1, 2]), (256, 2, [1, 2, 4, 8]), (24, 8, [1, 2, 3]),
    (3, 4, [1]), (1040, 4, [1, 2, 4, 5, 10, 13, 20, 26, 52]), (6, 2, [1])], ids=str)
def test_tiles_are_whole_vectors_of_at_least_64_bytes(c, item, want):
    got = M.round_tiles(c, item)
    assert got == sorted(want), got
    for k in got[1:]:
        t = c // k * item
        assert c % k == 0 and t % 16 == 0 and t >= 64
    # a count caps the list
    assert M.round_tiles(c, item, 4) == [k for k in got if k <= 4]


@pytest.fixture
def h200(monkeypatch):
    """The planner on an H200's facts (132 SMs, 50 MB L2, 228 KB shared memory an SM), the one-launch route."""
    monkeypatch.setattr(M._launch, "sm_count", lambda dev=None: SMS)
    monkeypatch.setattr(M, "l2_info", lambda dev: (L2, True))
    monkeypatch.setattr(M, "smem_limits", lambda dev: H200_SMEM)
    monkeypatch.setattr(M, "ROUTE", "one")
    monkeypatch.setattr(M, "ONCHIP", True)
    monkeypatch.setattr(M, "SLOTS_CAP", None)
    return monkeypatch


def _rows(shape):
    return int(np.prod(shape)) // shape[1]


F_PLAIN, B_PLAIN = dict(has_scale=1, has_bias=1), dict(has_scale=1)
B_RELU, B_ADD = dict(relu=1, has_scale=1), dict(relu=1, has_z=1, has_scale=1)


@pytest.mark.parametrize("setting, c, item, want", [
    (0, 256, 4, 1), (1, 256, 4, 1), (2, 256, 4, 2), (4, 256, 4, 4), (3, 256, 4, 2), (64, 256, 4, 16),
    (2, 16, 4, 1), (4, 24, 4, 1), (2, 24, 8, 2), (4, 24, 8, 3), (4, 96, 4, 4), (4, 64, 2, 2), (2, 64, 4, 2),
    (4, 32, 4, 2)], ids=str)
def test_fixed_counts_take_the_most_rounds_the_tiles_allow(h200, setting, c, item, want):
    h200.setattr(M, "ROUNDS", setting)
    dt = {2: np.float16, 4: np.float32, 8: np.float64}[item]
    for fwd, flags in ((True, F_PLAIN), (False, B_RELU)):
        assert M.rounds_for(fwd, dt, 1000, c, flags, 0) == want


def test_rounds_only_on_the_one_launch_route_with_the_copy(h200):
    h200.setattr(M, "ROUNDS", 4)
    assert M.rounds_for(True, np.float32, 1000, 256, F_PLAIN, 0) == 4
    h200.setattr(M, "ROUTE", "two")
    assert M.rounds_for(True, np.float32, 1000, 256, F_PLAIN, 0) == 1
    h200.setattr(M, "ROUTE", "one")
    h200.setattr(M, "ONCHIP", False)
    assert M.rounds_for(False, np.float32, 1000, 256, B_PLAIN, 0) == 1
    h200.setattr(M, "ONCHIP", True)
    h200.setattr(M, "ROUNDS", "three")
    with pytest.raises(ValueError, match="bn_nhwc.ROUNDS='three'"):
        M.rounds_for(True, np.float32, 1000, 256, F_PLAIN, 0)


# the auto plan on an H200 (the model's figures in the docs' table): forward, backward, bn + ReLU backward,
# bn + add + ReLU backward
AUTO = {((32, 256, 56, 56), 4): (2, 4, 4, 2), ((32, 256, 56, 56), 2): (1, 2, 2, 2),
        ((128, 64, 56, 56), 4): (2, 2, 2, 2), ((128, 64, 56, 56), 2): (1, 2, 2, 2),
        ((256, 32, 56, 56), 4): (2, 2, 2, 2), ((256, 32, 56, 56), 2): (1, 1, 1, 1),
        ((128, 16, 32, 32), 4): (1, 1, 1, 1), ((128, 64, 16, 16), 4): (1, 1, 1, 1), ((8, 256, 56, 56), 4): (1, 1, 1, 1)}


@pytest.mark.parametrize("shape, item", list(AUTO), ids=str)
def test_auto_on_an_h200(h200, shape, item):
    h200.setattr(M, "ROUNDS", "auto")
    dt = np.float32 if item == 4 else np.float16
    got = tuple(M.rounds_for(fwd, dt, _rows(shape), shape[1], flags, 0)
                for fwd, flags in ((True, F_PLAIN), (False, B_PLAIN), (False, B_RELU), (False, B_ADD)))
    assert got == AUTO[(shape, item)], got


def test_auto_without_the_devices_facts_is_one_round(h200):
    h200.setattr(M, "ROUNDS", "auto")
    h200.setattr(M, "l2_info", lambda dev: (0, False))
    assert M.rounds_for(True, np.float32, _rows(SHAPES3[0]), 256, F_PLAIN, 0) == 1
    h200.setattr(M, "l2_info", lambda dev: (L2, True))
    h200.setattr(M, "smem_limits", lambda dev: (0, 0))
    assert M.rounds_for(True, np.float32, _rows(SHAPES3[0]), 256, F_PLAIN, 0) == 1


def _fits(fwd, rows, c, k, item, flags):
    """The brief's rule, independently: a round's re-read (1 array forward, 2 backward, 3 after a ReLU) less what
    its slots hold (ks of its n walk steps) fits ROUNDS_L2_SHARE of L2."""
    ct = c // k
    vec = 16 // item
    cv = ct // vec
    chunks = -(-cv // 256)
    tx = -(-cv // chunks)
    rb = 256 // tx
    ng = -(-rows // rb)
    g = max(1, min(SMS * 2 // chunks, -(-ng // 4)))
    n = -(-ng // g)
    slot = 256 * 16 * (1 if fwd else 2)
    static = 256 * (vec * 2 * 4 + 16) + 64
    ks = min(n, (min(H200_SMEM[1], H200_SMEM[0] // 2 - 1024) - static) // slot)
    arrays = 1 if fwd else 3 if flags.get("relu") else 2
    return (n - ks) / n * arrays * rows * ct * item <= M.ROUNDS_L2_SHARE * L2


@pytest.mark.parametrize("shape", SHAPES3 + [(64, 512, 28, 28), (16, 1024, 14, 14), (128, 16, 32, 32)], ids=str)
@pytest.mark.parametrize("item", [4, 2])
def test_auto_with_flat_rates_and_free_rounds_is_the_smallest_count_that_fits(h200, shape, item):
    # with every segment at the whole-row rate and no cost a round, the model's choice is the brief's rule
    h200.setattr(M, "ROUNDS", "auto")
    h200.setattr(M, "_SEG_RATE", {p: (1.0, 1.0, 1.0) for p in (2, 4, 8)})
    h200.setattr(M, "segment_rate", lambda k, s: 1.0)
    h200.setattr(M, "ROUND_BYTES", 0)
    dt = np.float32 if item == 4 else np.float16
    rows, c = _rows(shape), shape[1]
    for fwd, flags in ((True, F_PLAIN), (False, B_PLAIN), (False, B_RELU)):
        tiles = M.round_tiles(c, item)
        fit = [k for k in tiles if _fits(fwd, rows, c, k, item, flags)]
        want = fit[0] if fit else tiles[-1]
        assert M.rounds_for(fwd, dt, rows, c, flags, 0) == want, (fwd, flags, tiles, fit)


def test_segment_rates_follow_the_probe():
    # /tmp/seg.txt (tools/seg_bw_probe.py, H200): halves, quarters, eighths of 1024 / 512 / 256-byte rows
    assert M.segment_rate(1, 32) == 1.0
    assert M.segment_rate(2, 512) == 0.99 and M.segment_rate(2, 128) == 0.96 and M.segment_rate(2, 64) == 0.94
    assert M.segment_rate(4, 256) == 0.84 and M.segment_rate(4, 128) == 0.85 and M.segment_rate(4, 64) == 0.76
    assert M.segment_rate(3, 128) == 0.85 and M.segment_rate(8, 128) == 0.70 and M.segment_rate(16, 64) == 0.37


# ---- the strided walk ----------------------------------------------------------------------------------------------

def _round_offsets(rows, c, k, vec, grid):
    """Element offsets (of the full (R, C) array) each round's threads visit with seq_off's formula -- (r * CS +
    vcol) * VEC past the round's shifted base r_ * C / k -- as (offset, round) pairs."""
    ct = c // k
    cs = c // vec
    out = []
    for rnd in range(k):
        cv, chunks, tx_n, rb, ng = M.geometry(rows, ct, vec)
        g = min(grid, M.reduce_grid(ng, chunks, grid))
        for y in range(chunks):
            for b in range(g):
                n = (ng - 1 - b) // g + 1 if b < ng else 0
                for tid in range(M.THREADS):
                    tx, ty = tid % tx_n, tid // tx_n
                    vcol = y * tx_n + tx
                    if not (ty < rb and vcol < cv):
                        continue
                    for kk in range(n):
                        r = (b + kk * g) * rb + ty
                        if r < rows:
                            out.append((rnd * ct + (r * cs + vcol) * vec, rnd))
    return out


@pytest.mark.parametrize("rows, c, item, k", [(33 * 31, 64, 4, 2), (45, 96, 4, 4), (1000, 256, 2, 4),
                                              (17, 1040, 4, 5), (301, 2048, 4, 2), (7 * 7 * 3, 32, 4, 2)], ids=str)
def test_every_element_is_visited_once_by_its_own_round(rows, c, item, k):
    vec = 16 // item
    assert k in M.round_tiles(c, item)
    for grid in (1, 3, 264):
        seen = np.zeros(rows * c, np.int64)
        owner = np.full(rows * c, -1)
        for off, rnd in _round_offsets(rows, c, k, vec, grid):
            seen[off:off + vec] += 1
            owner[off:off + vec] = rnd
        assert np.all(seen == 1), grid
        # each channel belongs to the round whose tile holds it
        assert np.array_equal(owner.reshape(rows, c), np.broadcast_to(np.arange(c) // (c // k), (rows, c)))


# ---- the launches under the fake CuPy ------------------------------------------------------------------------------

def _fake(code):
    head = f"""
import sys, ctypes; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
from minidnn.backend.cuda import bn_nhwc as M
from minidnn.backend.cuda import device_facts as F
F._l2[0] = ({L2}, True); F._smem[0] = {H200_SMEM}
rec = []
N_PARAMS = dict(bnc_fwd1=23, bnc_bwd1=20, bnc_apply=14)       # the fewest each kernel takes (read no further)
def go(fn, dims, stream, params_ptr):
    name = str(fn).split("(")[0]
    n = N_PARAMS[name]
    p = (ctypes.c_void_p * n).from_address(params_ptr)
    rec.append(dict(name=name, opts=str(fn), dims=tuple(dims),
                    ptr=[ctypes.c_void_p.from_address(p[k]).value or 0 for k in range(min(n, 13))],
                    i32=[ctypes.c_int.from_address(p[k]).value for k in range(12, n)],
                    hc=ctypes.c_int.from_address(p[22]).value if n > 22 else None,
                    hr=ctypes.c_int.from_address(p[21]).value if n > 22 else None))
L._go = go
def cl(a):
    a = np.asarray(a)
    perm = (0, *range(2, a.ndim), 1); back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return fakecp.asarray(np.ascontiguousarray(a.transpose(perm))).transpose(back)
def arrays(shape, dt, pdt):
    rng = np.random.default_rng(0)
    c = shape[1]
    mk = lambda: cl(rng.standard_normal(shape).astype(dt))
    par = lambda: fakecp.asarray(rng.standard_normal(c).astype(pdt))
    return mk(), mk(), mk(), par(), par(), par(), par(), fakecp.zeros((1,), np.int64)
def ptr(a):
    return 0 if a is None else a.data.ptr
"""
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    return r.stdout


def test_rounds_launch_k_kernels_on_shifted_tiles_under_the_fake_cupy():
    _fake("""
for shape, dt, k, want_k in (((2, 64, 5, 7), np.float32, 4, 4), ((3, 96, 3, 3), np.float32, 4, 4),
                             ((2, 256, 3, 5), np.float16, 4, 4), ((2, 24, 3, 3), np.float64, 4, 3),
                             ((2, 24, 3, 3), np.float32, 2, 1), ((5, 32), np.float32, 2, 2)):
    pdt = np.float64 if dt == np.float64 else np.float32
    item, pit = np.dtype(dt).itemsize, np.dtype(pdt).itemsize
    acc = pit
    x, z, dy, sc, bi, rm, rv, cnt = arrays(shape, dt, pdt)
    if len(shape) == 2:
        x, z, dy = (fakecp.asarray(np.asarray(a)) for a in (x, z, dy))
    c = shape[1]
    rows = x.size // c
    ct = c // want_k
    vec = M.vec_width(c, item)
    M.ROUNDS = k
    M._calls.clear()
    for rep in range(2):                                # the same launches at every call
        rec.clear()
        y, m, i = M.forward_training(x, sc, bi, 0.1, rm, rv, 1e-5, z=z, relu=True, counter=cnt)
        fwd = list(rec)
        rec.clear()
        dx, dz, ds, db = M.backward(x, dy, sc, m, i, y=y, want_dz=True)
        bwd = list(rec)
        assert [r["name"] for r in fwd] == ["bnc_fwd1"] * want_k, [r["name"] for r in fwd]
        assert [r["name"] for r in bwd] == ["bnc_bwd1"] * want_k
        strided = want_k > 1
        for recs in (fwd, bwd):
            assert all(("-DRSTRIDE=1" in r["opts"]) is strided for r in recs)
            assert len({(r["opts"], r["dims"]) for r in recs}) == 1
        cv, chunks, tx, rb, ng = M.geometry(rows, ct, vec)
        geo = [rows, ct, cv, tx, rb, ng] + ([c // vec] if strided else [])
        for n_arr, recs in ((12, fwd), (13, bwd)):
            for r in recs:
                assert r["i32"][n_arr - 12:n_arr - 12 + len(geo)] == geo, (r["i32"], geo)
        if not strided:
            continue
        coef = None
        for rnd, r in enumerate(fwd):
            o = rnd * ct
            want = [ptr(x) + o * item, ptr(z) + o * item, ptr(y) + o * item, None, None, ptr(m) + o * acc,
                    ptr(i) + o * acc, ptr(sc) + o * pit, ptr(bi) + o * pit, ptr(rm) + o * pit, ptr(rv) + o * pit,
                    ptr(cnt) if rnd == 0 else 0]
            got = r["ptr"][:12]
            assert [g for g, w in zip(got, want) if w is not None] == [w for w in want if w is not None], (rnd, got)
            assert got[3:5] == fwd[0]["ptr"][3:5]       # partial, sync: the same buffers, unshifted
            # has_counter after the 7 geometry ints, factor, eps, has_running: 1 in round 0 only
            assert r["hc"] == (1 if rnd == 0 else 0), (rnd, r["hc"])
            assert r["hr"] == 1                                 # has_running every round
        for rnd, r in enumerate(bwd):
            o = rnd * ct
            got = r["ptr"][:13]
            if rnd == 0:
                coef = got[7]
            want = [ptr(x) + o * item, ptr(dy) + o * item, ptr(y) + o * item, ptr(m) + o * acc, ptr(i) + o * acc,
                    got[5], got[6], coef + 2 * o * acc, ptr(ds) + o * pit, ptr(db) + o * pit, ptr(sc) + o * pit,
                    ptr(dx) + o * item, ptr(dz) + o * item]
            assert got == want, (rnd, got, want)
            assert got[5:7] == bwd[0]["ptr"][5:7]
        # inference: one launch, no rounds
        rec.clear()
        M.forward_inference(x, sc, bi, rm, rv, 1e-5)
        assert [r["name"] for r in rec] == ["bnc_apply"] and "-DRSTRIDE" not in rec[0]["opts"]
print("OK")
""")


def test_rounds_off_launches_what_it_did_before_under_the_fake_cupy():
    # ROUNDS 0 (the default) and a count the tiles cannot take give the one launch of the default, record for record
    _fake("""
for shape, dt in (((2, 64, 5, 7), np.float32), ((2, 24, 3, 3), np.float32), ((4, 256, 3, 3), np.float16)):
    pdt = np.float32
    x, z, dy, sc, bi, rm, rv, cnt = arrays(shape, dt, pdt)
    runs = []
    for setting in (0, 1, 0, "auto"):
        M.ROUNDS = setting
        rec.clear()
        y, m, i = M.forward_training(x, sc, bi, 0.1, rm, rv, 1e-5, counter=cnt)
        M.backward(x, dy, sc, m, i)
        M.forward_training(x, sc, bi, 0.1, None, None, 1e-5, z=z, relu=True)
        runs.append([(r["name"], r["opts"], r["dims"], r["i32"]) for r in rec])
    assert [len(r) for r in runs] == [3, 3, 3, 3] and runs[1] == runs[0] and runs[2] == runs[0], runs
    assert runs[3] == runs[0]       # auto: small calls fit on chip and L2 -- one round
    assert not any("RSTRIDE" in r[1] for r in runs[0])
print("OK")
""")


def test_twin_forward_takes_the_plain_calls_rounds_under_the_fake_cupy():
    _fake("""
x, z, dy, sc, bi, rm, rv, cnt = arrays((2, 64, 5, 7), np.float32, np.float32)
M.ROUNDS = 2
rec.clear()
plain = M.training_call(x, 0.1, 1e-5, True, True, False, False, True, True).run(x, None, sc, bi, rm, rv, cnt)
n_plain = len(rec)
got = M.training_call(x, 0.1, 1e-5, True, True, False, False, True, True, twin=True).run(x, None, sc, bi, rm, rv, cnt)
tw = rec[n_plain:]
assert n_plain == 2 and len(tw) == 2 and len(got) == 4, (n_plain, len(tw))
assert all("-DTWIN=1" in r["opts"] and "-DRSTRIDE=1" in r["opts"] for r in tw)
y, t = got[0], got[3]
for rnd, r in enumerate(tw):
    assert r["ptr"][2] == ptr(y) + rnd * 32 * 4 and r["ptr"][12] == ptr(t) + rnd * 32 * 4, rnd
    assert r["dims"] == rec[rnd]["dims"]
print("OK")
""")


def test_planned_kernels_records_the_rounds_builds_without_building_under_the_fake_cupy():
    _fake("""
def plan_all():
    for setting in (0, 2):
        M.ROUNDS = setting
        M._fwd_plan(np.dtype(np.float32), 70, 64, 4, "one", 0.1, 1e-5, True, True,
                    dict(relu=False, has_z=False, has_scale=True, has_bias=True), 0)
        M._bwd_plan(np.dtype(np.float32), 70, 64, 4, "one", dict(relu=True, has_z=True, has_scale=True), 0)
built = []
kernel = M._launch.get_kernel
M._launch.get_kernel = lambda *a, **k: built.append(a) or kernel(*a, **k)
jobs = M.planned_kernels(plan_all)
assert built == [] and rec == [] and not M._calls and M._kernel.__name__ == "_kernel"
got = sorted((n, d, v, dict(f).get("rstride", False)) for n, d, v, f in jobs)
assert got == [("bnc_bwd1", "float32", 4, False), ("bnc_bwd1", "float32", 4, True),
               ("bnc_fwd1", "float32", 4, False), ("bnc_fwd1", "float32", 4, True)], got
for n, d, v, f in jobs:                       # the options _kernel would build with
    assert M._options(np.dtype(d), v, **dict(f)) == M._options(np.dtype(np.float32), 4, **dict(f))
    assert dict(f)["cache"] is True and "v2" in dict(f) and "stage" in dict(f)
print("OK")
""")


def test_bad_attribute_raises_before_any_launch_under_the_fake_cupy():
    _fake("""
x, z, dy, sc, bi, rm, rv, cnt = arrays((2, 64, 5, 7), np.float32, np.float32)
M.ROUNDS = "4x"
rec.clear()
try:
    M.forward_training(x, sc, bi, 0.1, rm, rv, 1e-5, counter=cnt)
except ValueError as e:
    assert "bn_nhwc.ROUNDS='4x'" in str(e), e
else:
    raise AssertionError("no error")
assert rec == []
print("OK")
""")


# ---- nvcc --------------------------------------------------------------------------------------------------------

def _dt(name):
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _compile(tmp_path, name, vec, flags, tag, entries=("bnc_fwd1", "bnc_bwd1")):
    src = tmp_path / f"{tag}.cu"
    src.write_text(M.source_for_nvcc(_dt(name), vec, **flags))
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas",
                        ",".join(["-v", *(f"--entry={e}" for e in entries)]), "-o",
                        str(tmp_path / f"{tag}.cubin"), str(src)], capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    info, cur = {}, None
    for line in out.splitlines():
        if "Compiling entry function" in line:
            cur = line.split("'")[1]
        elif cur and "spill stores" in line:
            info.setdefault(cur, {})["spill"] = int(line.split("bytes stack frame, ")[1].split(" bytes")[0])
            info[cur]["stores"] = int(line.split("bytes stack frame, ")[1].split(" bytes spill stores")[0])
        elif cur and "registers" in line:
            info.setdefault(cur, {})["regs"] = int(line.split("Used ")[1].split(" registers")[0])
    return info


_ALL = dict(relu=1, has_z=1, has_scale=1, has_bias=1)
COMPILE = [("float32", 4, dict(keep=1, split=1, **_ALL)), ("bfloat16", 8, dict(keep=1, split=1, **_ALL)),
           ("float32", 4, dict(keep=1, split=1, relu=1, has_scale=1)), ("float16", 8, dict(has_scale=1, has_bias=1)),
           ("float64", 2, _ALL), ("bfloat16", 8, dict(keep=1, has_scale=1, has_bias=1)),
           ("float32", 4, dict(split=1, twin=1, has_scale=1, has_bias=1))]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, vec, flags", pick(COMPILE, 2, always=COMPILE[:2]), ids=str)
def test_rstride_builds_compile_without_spills(tmp_path, name, vec, flags):
    entries = ("bnc_fwd1",) if flags.get("twin") else ("bnc_fwd1", "bnc_bwd1")
    on = _compile(tmp_path, name, vec, dict(cache=1, rstride=1, **flags), "rs", entries)
    assert set(on) == set(entries), on
    for k in entries:
        assert on[k]["spill"] == 0 and on[k]["regs"] <= 65536 // (256 * M.BPS), (k, on[k])


# ---- GPU ---------------------------------------------------------------------------------------------------------

TOL = {"float64": dict(rtol=1e-9, atol=1e-9), "float32": dict(rtol=1e-4, atol=1e-4),
       "float16": dict(rtol=1e-2, atol=1e-2), "bfloat16": dict(rtol=4e-2, atol=4e-2)}


def _gpu_cases():
    """(dtype name, shape, ops, ROUNDS, twin) of every call the GPU tests below make."""
    out = [(n, sh, ops, st, False) for n in ("float32", "float16", "bfloat16") for sh in GPU_SHAPES
           for ops in ("bn", "bn_activation", "bn_add_activation") for st in (0, 2, 4, "auto")]
    out += [("float64", sh, "bn_add_activation", st, False) for sh in ((5, 24, 9, 9), (3, 96, 5, 7)) for st in (2, 4)]
    out += [(n, sh, "bn_add_activation", st, False) for n, sh in LARGE_CASES for st in (0, 2, 4, "auto")]
    out += [("float32", (4, 96, 7, 9), "bn", st, tw) for st in (2, 4) for tw in (False, True)]
    out += [(n, (16, 64, 10, 10), "bn_add_activation", st, False) for n in ("float32", "bfloat16") for st in (2, 4)]
    return out + [(n, SHAPES3[0], "bn_add_activation", "auto", False) for n in ("float32", "bfloat16")]


@pytest.fixture(scope="module")
def warm():
    """Every kernel configuration the GPU tests launch, compiled first into CuPy's disk cache a process a core
    (bn_nhwc.precompile: ~60 NVRTC builds one after another would be most of the tests' time)."""
    saved = M.ROUTE, M.ONCHIP, M.ROUNDS
    M.ROUTE, M.ONCHIP = "one", True

    def plan_all():
        for name, shape, ops, setting, twin in _gpu_cases():
            M.ROUNDS = setting
            dt, c = _dtype(name), shape[1]
            rows, vec = int(np.prod(shape)) // c, M.vec_width(c, _dtype(name).itemsize)
            relu, add = ops != "bn", ops == "bn_add_activation"
            fwd = dict(relu=relu, has_z=add, has_scale=True, has_bias=True)
            if twin:
                fwd["twin"] = True
            M._fwd_plan(dt, rows, c, vec, "one", 0.1, 1e-5, True, True, fwd, 0)
            M._bwd_plan(dt, rows, c, vec, "one", dict(relu=relu, has_z=add, has_scale=True), 0)
    try:
        jobs = M.planned_kernels(plan_all)
    finally:
        M.ROUTE, M.ONCHIP, M.ROUNDS = saved
    try:
        M.precompile(jobs)
    except Exception as e:          # noqa: BLE001 -- only a warm-up: the launches compile what they miss
        warnings.warn(f"bn_nhwc.precompile failed ({type(e).__name__}: {e}); compiling at first use")


@pytest.fixture
def gpu(monkeypatch, request):
    """(cupy, set_rounds): the one-launch route with the on-chip copy, ROUNDS set by set_rounds (caches cleared);
    the tests' kernels precompiled (warm) once."""
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    request.getfixturevalue("warm")
    from minidnn.backend.cuda import bn_kernels as K
    monkeypatch.setattr(M, "ROUTE", "one")
    monkeypatch.setattr(M, "ONCHIP", True)

    def clear():
        M._calls.clear(); K._calls.clear(); K._plans.clear()       # noqa: E702

    def set_rounds(v):
        monkeypatch.setattr(M, "ROUNDS", v)
        clear()
    clear()
    yield _dev.require_cupy(), set_rounds
    monkeypatch.setattr(M, "ROUNDS", 0)
    clear()


def _dtype(name):
    return _dt(name)


def _data(name, shape, ops, seed):
    dt = _dtype(name)
    pdt = np.float64 if name == "float64" else np.float32
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = (rng.standard_normal(shape) * 1.5 + 3.0).astype(dt)     # |mean| > std: the shifted sums matter
    dy = rng.standard_normal(shape).astype(dt)
    z = rng.standard_normal(shape).astype(dt) if ops == "bn_add_activation" else None
    scale = rng.uniform(0.5, 1.5, c).astype(pdt)
    bias = rng.standard_normal(c).astype(pdt)
    rm, rv = rng.standard_normal(c).astype(pdt), rng.uniform(0.5, 2, c).astype(pdt)
    return x, dy, z, scale, bias, rm, rv


def _cl(cp, a):
    if a is None:
        return None
    perm = (0, *range(2, a.ndim), 1)
    back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return cp.asarray(np.ascontiguousarray(a.transpose(perm))).transpose(back)


def _h(a):
    return None if a is None else a.get().astype(np.float64)


def _run(cp, name, shape, ops, seed):
    """forward (running statistics, counter) + backward on channels-last data: (outputs, launches forward,
    launches backward)."""
    from minidnn.backend.cuda import launch
    x, dy, z, scale, bias, rm, rv = _data(name, shape, ops, seed)
    xg, zg, dyg = _cl(cp, x), _cl(cp, z), _cl(cp, dy)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    rmg, rvg, cnt = cp.asarray(rm), cp.asarray(rv), cp.zeros((1,), np.int64)
    relu = ops != "bn"
    n0 = launch.launch_count()
    y, m, i = M.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, z=zg, relu=relu, counter=cnt)
    n1 = launch.launch_count()
    dx, dz, ds, db = M.backward(xg, dyg, sg, m, i, y=y if relu else None, want_dz=ops == "bn_add_activation")
    n2 = launch.launch_count()
    out = dict(y=y, mean=m, inv_std=i, dx=dx, dz=dz, dscale=ds, dbias=db, rm=rmg, rv=rvg, cnt=cnt)
    return out, n1 - n0, n2 - n1


def _reference(name, shape, ops, seed, y_gpu, m_gpu, i_gpu):
    import minidnn.backend as B
    x, dy, z, scale, bias, rm, rv = _data(name, shape, ops, seed)
    f64 = np.float64
    x64, z64 = x.astype(f64), None if z is None else z.astype(f64)
    rm64, rv64 = rm.astype(f64), rv.astype(f64)
    y, m, i = B.batch_normalization_forward_training_ex(None, "spatial", ops, x64, z64, scale.astype(f64),
                                                        bias.astype(f64), 0.1, rm64, rv64, 1e-5)
    s64 = scale.astype(f64)
    if ops == "bn":
        dx, ds, db = B.batch_normalization_backward(None, "spatial", x64, dy.astype(f64), s64, m_gpu, i_gpu, 1e-5)
        dz = None
    else:
        dx, dz, ds, db = B.batch_normalization_backward_ex(None, "spatial", ops, x64, y_gpu, dy.astype(f64), s64,
                                                           m_gpu, i_gpu, 1e-5)
    return dict(y=y, mean=m, inv_std=i, dx=dx, dz=dz, dscale=ds, dbias=db, rm=rm64, rv=rv64)


def _check(got, ref, name, count):
    tol = TOL[name]
    f = name != "float64"
    np.testing.assert_allclose(_h(got["y"]), ref["y"], rtol=tol["rtol"], atol=tol["atol"] * 4)
    np.testing.assert_allclose(_h(got["mean"]), ref["mean"], rtol=1e-5 if f else 1e-12, atol=1e-5)
    np.testing.assert_allclose(_h(got["inv_std"]), ref["inv_std"], rtol=1e-4 if f else 1e-10)
    np.testing.assert_allclose(_h(got["rm"]), ref["rm"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_h(got["rv"]), ref["rv"], rtol=1e-4, atol=1e-6)
    assert int(got["cnt"].get()[0]) == 1, "the counter moves once a call"
    np.testing.assert_allclose(_h(got["dx"]), ref["dx"], rtol=tol["rtol"], atol=tol["atol"] * 4)
    np.testing.assert_allclose(_h(got["dbias"]), ref["dbias"], rtol=1e-4, atol=tol["atol"] * math.sqrt(count))
    np.testing.assert_allclose(_h(got["dscale"]), ref["dscale"], rtol=1e-4, atol=tol["atol"] * math.sqrt(count) * 4)
    if ref["dz"] is not None:
        np.testing.assert_array_equal(_h(got["dz"]), ref["dz"])


# C in {16, 24, 64, 96, 256}; rows with tails (odd N*H*W, 2-D), a wide row of two column chunks
GPU_SHAPES = [(8, 16, 7, 7), (5, 24, 9, 9), (3, 64, 13, 11), (4, 96, 7, 9), (2, 256, 9, 13), (37, 64),
              (2, 2048, 3, 5)]


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
def test_rounds_against_the_default_and_float64(gpu, name, shape, ops):
    cp, set_rounds = gpu
    seed = sum(shape) * 7 + len(ops)
    c = shape[1]
    count = int(np.prod(shape)) // c
    set_rounds(0)
    base, nf, nb = _run(cp, name, shape, ops, seed)
    assert (nf, nb) == (1, 1)
    item = np.dtype(_dtype(name)).itemsize
    for setting in (2, 4, "auto"):
        set_rounds(setting)
        got, nf, nb = _run(cp, name, shape, ops, seed)
        k = M.round_tiles(c, item, setting)[-1] if setting != "auto" else None
        if k is not None:
            assert (nf, nb) == (k, k), (setting, nf, nb)
        ref = _reference(name, shape, ops, seed, _h(got["y"]), _h(got["mean"]), _h(got["inv_std"]))
        _check(got, ref, name, count)
        _tickets_back_at_zero(cp)
        # against the default: another grid, the same sums in another order
        tol = TOL[name]
        for key in ("y", "mean", "inv_std", "rm", "rv"):
            np.testing.assert_allclose(_h(got[key]), _h(base[key]), rtol=tol["rtol"], atol=tol["atol"])


@pytest.mark.cuda
def test_float64_rounds_against_the_reference(gpu):
    cp, set_rounds = gpu
    for shape in ((5, 24, 9, 9), (3, 96, 5, 7)):
        for setting in (2, 4):
            set_rounds(setting)
            got, nf, nb = _run(cp, "float64", shape, "bn_add_activation", 4)
            k = M.round_tiles(shape[1], 8, setting)[-1]
            assert (nf, nb) == (k, k) and k > 1
            ref = _reference("float64", shape, "bn_add_activation", 4, _h(got["y"]), _h(got["mean"]),
                             _h(got["inv_std"]))
            _check(got, ref, "float64", int(np.prod(shape)) // shape[1])


def _tickets_back_at_zero(cp):
    """Every round's last block to leave reset its sync counters (one scratch serves all rounds in a stream)."""
    cp.cuda.Device().synchronize()
    t = M._tickets[cp.cuda.Device().id].get()
    assert not t.any(), np.flatnonzero(t)[:12]


def _close_to(got, base, name, count):
    """Every output of two runs of one call under different rounds (another grid: the same sums in another order)."""
    tol = TOL[name]
    for key in ("y", "mean", "inv_std", "rm", "rv", "dx"):
        np.testing.assert_allclose(_h(got[key]), _h(base[key]), rtol=tol["rtol"], atol=tol["atol"] * 4,
                                   err_msg=key)
    for key in ("dscale", "dbias"):
        np.testing.assert_allclose(_h(got[key]), _h(base[key]), rtol=1e-4,
                                   atol=tol["atol"] * math.sqrt(count) * 4, err_msg=key)
    if base["dz"] is not None:
        np.testing.assert_array_equal(_h(got["dz"]), _h(base["dz"]))
    assert int(got["cnt"].get()[0]) == 1


LARGE_CASES = [("float32", SHAPES3[0]), ("float32", SHAPES3[2]), ("bfloat16", SHAPES3[1])]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape", LARGE_CASES, ids=str)
def test_large_shapes_in_rounds_against_one_launch(gpu, name, shape):
    # the A/B's shapes, where each round takes KEEP / SPLIT as a call of R x C / k channels does; add + ReLU against
    # the default (itself tested against float64 at these shapes: test_bn_nhwc_cuda); float64 for 2 rounds
    cp, set_rounds = gpu
    count = int(np.prod(shape)) // shape[1]
    set_rounds(0)
    base, nf, nb = _run(cp, name, shape, "bn_add_activation", 5)
    item = np.dtype(_dtype(name)).itemsize
    for setting in (2, 4, "auto"):
        set_rounds(setting)
        got, nf, nb = _run(cp, name, shape, "bn_add_activation", 5)
        if setting != "auto":
            k = M.round_tiles(shape[1], item, setting)[-1]
            assert (nf, nb) == (k, k) and k > 1, (setting, nf, nb)
        _close_to(got, base, name, count)
        _tickets_back_at_zero(cp)
        if setting == 2 and name == "float32" and shape == SHAPES3[0]:
            ref = _reference(name, shape, "bn_add_activation", 5, _h(got["y"]), _h(got["mean"]), _h(got["inv_std"]))
            _check(got, ref, name, count)


@pytest.mark.cuda
@pytest.mark.parametrize("setting", [2, 4])
def test_twin_forward_in_rounds_gives_the_plain_bits(gpu, setting):
    cp, set_rounds = gpu
    set_rounds(setting)
    x, dy, z, scale, bias, rm, rv = _data("float32", (4, 96, 7, 9), "bn", 11)
    xg, sg, bg = _cl(cp, x), cp.asarray(scale), cp.asarray(bias)
    outs = []
    for twin in (False, True):
        rmg, rvg, cnt = cp.asarray(rm), cp.asarray(rv), cp.zeros((1,), np.int64)
        got = M.training_call(xg, 0.1, 1e-5, True, True, False, False, True, True, twin=twin).run(
            xg, None, sg, bg, rmg, rvg, cnt)
        outs.append([a.copy() for a in got] + [rmg, rvg, cnt])
    plain, tw = outs
    for a, b in zip(plain[:3] + plain[3:], tw[:3] + tw[4:]):
        np.testing.assert_array_equal(a.get(), b.get())
    np.testing.assert_array_equal(tw[3].get(), np.maximum(tw[0].get(), 0))
    assert int(tw[-1].get()[0]) == 1


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("setting", [2, 4, "auto"])
def test_captured_in_a_cuda_graph_replays_to_the_eager_bits(gpu, name, setting):
    # the same launches every call, nothing read back, the tickets back at 0 after each round: a captured forward +
    # backward replays twice to the eager bits, the counter moving once a replay
    cp, set_rounds = gpu
    set_rounds(setting)
    shape = (16, 64, 10, 10) if setting != "auto" else SHAPES3[0]      # auto: 2 rounds there (1 for the bf16 forward)
    x, dy, z, scale, bias, rm, rv = _data(name, shape, "bn_add_activation", 8)
    xg, zg, dyg = _cl(cp, x), _cl(cp, z), _cl(cp, dy)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    rmg, rvg, cnt = cp.asarray(rm), cp.asarray(rv), cp.zeros((1,), np.int64)

    def step():
        y, m, i = M.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, z=zg, relu=True, counter=cnt)
        return (y, m, i) + M.backward(xg, dyg, sg, m, i, y=y, want_dz=True)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        eager = [a.copy() for a in step() if a is not None]
        s.synchronize()
        s.begin_capture()
        captured = step()
        g = s.end_capture()
        for rep in range(2):
            g.launch(s)
            s.synchronize()
            for a, b in zip([a for a in captured if a is not None], eager):
                np.testing.assert_array_equal(a.get().view(np.uint8), b.get().view(np.uint8), err_msg=f"replay {rep}")
    assert int(cnt.get()[0]) == 3
