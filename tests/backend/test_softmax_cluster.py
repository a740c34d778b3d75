"""Session 21 (issue 10): softmax / log-softmax rows held by thread-block clusters (backend/cuda/softmax_cluster.py:
smx_fwdc, smx_bwdc; softmax_kernels routes to them under MINIDNN_SOFTMAX_CLUSTER="1" / "all").

CPU: the plan over a table of (rows, C, dtype, algo, direction, setting); the kernels' walk emulated in NumPy --
every element of a row held by exactly one (rank, thread, slot) or edge thread, at most VPT vectors a thread, one
edge a thread -- and their algebra in float64 (the per-thread (max, sum), the block's, the cluster's in rank order)
against the reference, special rows included (NaN, +-inf, an all -inf row); nvcc sm_90 builds of every configuration
the plan makes for C in {16385, 32000, 32001, 50257, 65536, 100003, 131072} without spills, within the launch bounds'
registers; the routing under tools/record_launches.py's fake CuPy ("0": the row kernels; "1" / "all": the cluster
kernel with the planned grid; a misaligned call: the row kernels; the setting part of the plan key); the
environment read at import.
GPU (marked cuda; sm_90+): forward and backward of both algorithms against float64 (computed on the device) for
float32 / bfloat16 / float16, rows {1, 3, 64, 300} x C {16385, 32001, 50257, 65536, 131072}; special values where
the row kernels have them; misaligned views correct (through the row kernels); a CUDA graph's replays = eager;
two calls bitwise equal.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import softmax_cluster as SC
from minidnn.backend.cuda import softmax_kernels as _sk
from tests._nvcc import build as nvcc_build
from tests._nvcc import pick
from tests.backend.test_softmax_rows_cuda import RTOL, SUBNORMAL, _dtype, _launches, _reset_plans
from tests.backend.test_softmax_s17_rows import _misaligned

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ("float32", "bfloat16", "float16")


# ---- CPU: the plan ----------------------------------------------------------------------------------------------

# (rows, C, dtype, algo, backward, setting) -> (CL, NT, VPT) or None; MINB and the grid follow (checked below)
PLANS = [
    ((64, 50257, "float32", "ACCURATE", False, "1"), (7, 256, 8)),     # 12564 vectors: VPT_FWD 8, 7 blocks
    ((64, 50257, "float32", "LOG", True, "1"), (7, 512, 4)),           # few rows: the backward too (512 x 4)
    ((4096, 32000, "float32", "ACCURATE", False, "1"), (4, 256, 8)),   # 8000 vectors: 4 x 256 x 8
    ((4096, 32000, "float32", "LOG", True, "1"), (8, 256, 4)),         # many rows too (BWD_ROWS_PER_SM 0)
    ((4096, 32000, "bfloat16", "LOG", False, "1"), None),              # 16-bit, held by the row path: its kernels
    ((4096, 32000, "bfloat16", "LOG", True, "1"), (4, 256, 4)),        # (the backward: clusters)
    ((4096, 32000, "float32", "LOG", True, "all"), (8, 256, 4)),
    ((300, 32000, "float32", "LOG", True, "1"), (8, 256, 4)),
    ((1, 50257, "bfloat16", "ACCURATE", False, "1"), (8, 256, 4)),     # 6282 vectors: CL 7, one row: CL 8
    ((300, 50257, "bfloat16", "LOG", False, "1"), (4, 256, 7)),        # VPT_FWD 8
    ((64, 8192, "float32", "ACCURATE", False, "1"), None),             # one chunk of a block: the row kernels
    ((64, 8192, "float32", "ACCURATE", False, "all"), (3, 256, 3)),    # 128 blocks < 132 SMs: CL 3
    ((64, 16384, "bfloat16", "LOG", False, "1"), None),
    ((64, 16385, "float32", "ACCURATE", False, "1"), None),            # 4096 body vectors + edges: one chunk
    ((64, 16389, "float32", "ACCURATE", False, "1"), (5, 256, 4)),     # 3 x 256 x 6: 192 blocks, fewer (run 4)
    ((64, 8200, "float32", "LOG", True, "1"), (3, 256, 3)),            # the backward's one chunk is 8192
    ((64, 8192, "float32", "LOG", True, "1"), None),
    ((64, 50257, "float32", "FAST", False, "all"), None),              # no max: refused
    ((64, 50257, "float64", "LOG", False, "all"), None),
    ((128, 128000, "float32", "LOG", False, "all"), None),             # 32000 vectors: more than 8 x 512 x 4
    ((128, 128000, "bfloat16", "LOG", False, "1"), (8, 256, 8)),
    ((2048, 65536, "float32", "ACCURATE", False, "1"), (8, 256, 8)),   # 16384 vectors: the largest float32 row
    ((2048, 65537, "float32", "ACCURATE", False, "1"), (8, 256, 8)),   # (a ragged row's body: 16384 at most)
    ((2048, 65537, "float32", "ACCURATE", True, "1"), (8, 512, 4)),    # (backwards: VPT_MAX)
    ((2048, 65540, "float32", "ACCURATE", False, "1"), None),
    ((64, 50257, "float32", "ACCURATE", False, "0"), None),
    ((3, 100, "float32", "ACCURATE", False, "all"), None),             # < 32 vectors
]


@pytest.mark.parametrize("args, want", PLANS, ids=str)
def test_plan(args, want):
    rows, c, name, algo, backward, setting = args
    p = SC.plan(rows, c, _dtype(name), algo, backward, 0, setting)
    assert (p and (p.cl, p.nt, p.vpt)) == want if want else p is None, p
    if p is None:
        return
    nvec = c // (16 // _dtype(name).itemsize)
    assert p.grid == rows * p.cl and p.minb == SC.minb(backward, p.nt)
    wide = not backward and p.nt == 256          # VPT_FWD: the forwards at 256 threads
    assert p.cl * p.nt * p.vpt >= nvec and p.vpt <= (SC.VPT_FWD if wide else SC.VPT_MAX) and p.cl <= SC.CL_MAX
    assert p.vpt == -(-nvec // (p.cl * p.nt))            # the fewest vectors a thread for that cluster
    assert p.fexp == (not backward and (algo == "LOG" or name != "float32"))     # FAST_EXP: not float32 softmax
    assert SC.plan(rows, c, _dtype(name), algo, backward, 0, setting, fast_exp=False).fexp == 0


VPT_FWD_PLANS = [
    ((64, 50257, "ACCURATE", False), (7, 256, 8)), ((4096, 50257, "LOG", False), (7, 256, 8)),
    ((4096, 32000, "ACCURATE", False), (4, 256, 8)), ((64, 16389, "ACCURATE", False), (5, 256, 4)),
    ((2048, 65536, "ACCURATE", False), (8, 256, 8)), ((2048, 65537, "LOG", False), (8, 256, 8)),
    ((64, 8192, "ACCURATE", False), None),                # one chunk of a block: still the row kernels
    ((2048, 65536, "ACCURATE", True), (8, 512, 4)),       # backwards keep VPT_MAX
    ((4096, 50257, "LOG", True), (7, 512, 4)),
]


@pytest.mark.parametrize("args, want", VPT_FWD_PLANS, ids=str)
def test_vpt_fwd_plans(monkeypatch, args, want):
    """VPT_FWD = 8 (session 24's VPT_F32; every dtype since session 25): the forwards' 256-thread blocks take up to 8
    vectors a thread -- the smallest NT, then CL, that holds the row, so 256 threads at CL 3-8 where VPT 4 needed
    512; the backwards and 512-thread blocks keep VPT_MAX; the longest cluster row is unchanged."""
    rows, c, algo, backward = args
    monkeypatch.setattr(SC, "VPT_FWD", 8)
    p = SC.plan(rows, c, np.dtype(np.float32), algo, backward, 0, "1")
    assert (p and (p.cl, p.nt, p.vpt)) == want if want else p is None, p
    if p:
        assert p.minb == SC.minb(backward, p.nt) and p.cl * p.nt * p.vpt >= c // 4
        assert p.vpt == -(-(c // 4) // (p.cl * p.nt))
    assert SC.plan(2048, 65540, np.dtype(np.float32), "ACCURATE", False, 0, "1") is None    # past the longest row
    monkeypatch.setattr(SC, "VPT_FWD", 4)
    q = SC.plan(rows, c, np.dtype(np.float32), algo, backward, 0, "1")
    assert q is None or q.vpt <= SC.VPT_MAX
    if backward:
        assert q == p                                                                       # backwards: no change


VPT_FWD_16 = [
    ((4096, 50257, "ACCURATE", False), (4, 256, 7), (7, 256, 4)),     # 6282 vectors
    ((4096, 50257, "LOG", False), (4, 256, 7), (7, 256, 4)),
    ((2048, 65536, "ACCURATE", False), (4, 256, 8), (8, 256, 4)),
    ((1024, 131072, "LOG", False), (8, 256, 8), (8, 512, 4)),        # the longest 16-bit row: 256 threads now
    ((1, 50257, "ACCURATE", False), (8, 256, 4), (8, 256, 4)),        # one row: CL grows to 8 either way
    ((4096, 32000, "ACCURATE", False), None, None),                   # held by the row path
    ((4096, 50257, "LOG", True), (7, 256, 4), (7, 256, 4)),           # backwards keep VPT_MAX
    ((64, 50257, "ACCURATE", False), (7, 256, 4), (7, 256, 4)),       # few rows: 4 x 256 x 7 has 256 blocks of
    ((64, 65536, "LOG", False), (8, 256, 4), (8, 256, 4)),            # 448-512 (< 3 an SM; run 4: 0.86-0.89x)
    ((132, 65536, "ACCURATE", False), (4, 256, 8), (8, 256, 4)),      # 528 blocks: 4 an SM (run 4: level)
]


@pytest.mark.parametrize("args, want8, want4", VPT_FWD_16, ids=str)
def test_vpt_fwd_plans_16_bit(monkeypatch, args, want8, want4):
    """VPT_FWD covers the 16-bit forwards since session 25 (run 3: 1.11-1.38x the VPT 4 rule's on the H200, once the
    partials travelled by remote stores); 4 gives the rule before."""
    rows, c, algo, backward = args
    for vf, want in ((8, want8), (4, want4)):
        monkeypatch.setattr(SC, "VPT_FWD", vf)
        for name in ("bfloat16", "float16"):
            p = SC.plan(rows, c, _dtype(name), algo, backward, 0, "1")
            assert (p and (p.cl, p.nt, p.vpt)) == want, (vf, name, p)


def test_wide_plan_keeps_the_blocks(monkeypatch):
    """WIDE_MIN_BLOCKS_PER_SM (3): a VPT_FWD plan under 3 blocks an SM gives way to the VPT_MAX plan where that has
    more blocks; at 0 the wide plan stands; a forced shape is judged the same way."""
    bf, sms = _dtype("bfloat16"), 132
    monkeypatch.setattr(SC, "_sms", lambda dev: sms)
    assert SC.WIDE_MIN_BLOCKS_PER_SM == 3
    assert SC.plan(64, 50257, bf, "ACCURATE", False, 0, "1") == SC.Launch(7, 256, 4, 4, 448, 1)
    assert SC.plan(132, 65536, bf, "ACCURATE", False, 0, "1").grid == 4 * sms              # 528 >= 3 x 132
    assert SC.plan(64, 50257, np.dtype(np.float32), "LOG", False, 0, "1") == SC.Launch(7, 256, 8, 4, 448, 1)
    monkeypatch.setattr(SC, "WIDE_MIN_BLOCKS_PER_SM", 0)
    assert SC.plan(64, 50257, bf, "ACCURATE", False, 0, "1") == SC.Launch(4, 256, 7, 4, 256, 1)
    monkeypatch.setattr(SC, "WIDE_MIN_BLOCKS_PER_SM", 3)
    assert SC.plan(64, 50257, bf, "ACCURATE", False, 0, "all", (0, 256)) == SC.Launch(7, 256, 4, 4, 448, 1)


def test_row_caps_of_the_rule(monkeypatch):
    """BWD_ROWS_PER_SM / FWD_ROWS_PER_SM (0 both: no cap, run 10) cap "1" at that many rows an SM (4: 528 rows on
    132 SMs); "all" takes no cap."""
    f32 = np.dtype(np.float32)
    assert SC.BWD_ROWS_PER_SM == 0 and SC.FWD_ROWS_PER_SM == 0
    assert SC.plan(100000, 50257, f32, "LOG", True, 0, "1") is not None
    monkeypatch.setattr(SC, "BWD_ROWS_PER_SM", 4)
    assert SC.plan(528, 50257, f32, "LOG", True, 0, "1") is not None
    assert SC.plan(529, 50257, f32, "LOG", True, 0, "1") is None
    assert SC.plan(529, 50257, f32, "LOG", True, 0, "all") is not None
    assert SC.plan(100000, 50257, f32, "LOG", False, 0, "1") is not None
    monkeypatch.setattr(SC, "FWD_ROWS_PER_SM", 8)
    assert SC.plan(1056, 50257, f32, "LOG", False, 0, "1") is not None
    assert SC.plan(1057, 50257, f32, "LOG", False, 0, "1") is None


def test_plan_refuses_a_bad_setting():
    with pytest.raises(ValueError, match="'0', '1' or 'all'"):
        SC.plan(64, 50257, np.float32, "LOG", False, 0, "2")


def test_the_rule_takes_exactly_the_rows_the_one_chunk_path_does_not_hold():
    """Under "1" a forward takes clusters exactly where row_config's plan has several chunks (and the row fits) --
    16-bit rows only where those chunks do not all stay on chip (rows_path_holds: 32000 classes stay, 50257 do
    not); the backward wherever its one chunk does not hold the row."""
    for name in NAMES:
        item = _dtype(name).itemsize
        for c in (4096, 8192, 8193, 16384, 16385, 20000, 32000, 50257, 65536, 131072, 131079, 262144):
            several = not _sk.row_config(c, item, 4, 1).one
            fits = c // (16 // item) <= SC.CL_MAX * 512 * SC.VPT_MAX
            onchip = item == 2 and SC.rows_path_holds(c, item)
            p = SC.plan(64, c, _dtype(name), "LOG", False, 0, "1")
            assert (p is not None) == (several and fits and not onchip), (name, c, p)
            b = SC.plan(64, c, _dtype(name), "LOG", True, 0, "1")
            assert (b is not None) == (not _sk.row_config(c, item, 4, 2).one and fits), (name, c, b)
    assert SC.rows_path_holds(32000, 2) and SC.rows_path_holds(20000, 2) and not SC.rows_path_holds(50257, 2)
    assert not SC.rows_path_holds(65536, 2) and not SC.rows_path_holds(50257, 4)


# ---- CPU: the kernels emulated ----------------------------------------------------------------------------------

def _slots(r, c, vec, cl, nt, vpt):
    """The element indices each (rank, thread) holds, as the kernels assign them: ([cl] arrays (nt, vpt * vec) of
    indices, -1 where none), and [cl] arrays (nt,) of the thread's edge element or -1.  Asserts every element of the
    row is held exactly once."""
    h = (vec - (r * c) % vec) % vec
    nb = (c - h) // vec
    tl = c - h - nb * vec
    seen = np.zeros(c, np.int64)
    body, edges = [], []
    t = np.arange(nt)
    for rank in range(cl):
        lo, hi = nb * rank // cl, nb * (rank + 1) // cl
        assert hi - lo <= nt * vpt
        vi = lo + t[:, None] + np.arange(vpt)[None, :] * nt                 # (nt, vpt)
        el = h + vi[:, :, None] * vec + np.arange(vec)[None, None, :]        # (nt, vpt, vec)
        el = np.where((vi < hi)[:, :, None], el, -1).reshape(nt, vpt * vec)
        ed = np.full(nt, -1)
        if rank == 0:
            ed[:h] = np.arange(h)
        if rank == cl - 1:
            tail = nt - 1 - t < tl
            assert not (tail & (ed >= 0)).any()                             # one edge a thread
            ed[tail] = c - tl + (nt - 1 - t[tail])
        np.add.at(seen, el[el >= 0], 1)
        np.add.at(seen, ed[ed >= 0], 1)
        body.append(el)
        edges.append(ed)
    assert (seen == 1).all(), np.nonzero(seen != 1)[0][:10]
    return body, edges


def _emulate_row(v, r, vec, cl, nt, vpt, algo):
    """The forward of row r (float64 values v) as smx_fwdc computes it: (y, M, S)."""
    body, edges = _slots(r, v.size, vec, cl, nt, vpt)
    parts = []
    with np.errstate(invalid="ignore", over="ignore"):
        for el, ed in zip(body, edges):
            vals = np.concatenate([np.where(ed >= 0, v[np.maximum(ed, 0)], -np.inf)[:, None],
                                   np.where(el >= 0, v[np.maximum(el, 0)], -np.inf)], axis=1)
            held = np.concatenate([(ed >= 0)[:, None], el >= 0], axis=1)
            m = np.fmax.reduce(vals, axis=1)                                 # fmax: a NaN is skipped
            sh = np.where(m == -np.inf, 0.0, m)
            s = np.where(held, np.exp(vals - sh[:, None]), 0.0).sum(axis=1)
            mb = np.fmax.reduce(m)
            sb = (s * np.where(m == -np.inf, 0.0, np.exp(m - mb))).sum()       # NaN sums kept (x 0: NaN)
            parts.append((mb, sb))
        mbs = np.array([p[0] for p in parts])
        M = np.fmax.reduce(mbs)
        M = 0.0 if M == -np.inf else M
        S = sum(sb * (0.0 if mb == -np.inf else np.exp(mb - M)) for mb, sb in parts)
        with np.errstate(divide="ignore"):
            y = v - M - np.log(S) if algo == "LOG" else np.exp(v - M) / S
    return y


def _ref_fwd(x, algo):
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = x.max(axis=1, keepdims=True)
        e = np.exp(x - m)
        s = e.sum(axis=1, keepdims=True)
        return x - m - np.log(s) if algo == "LOG" else e / s


def _special_rows(rows, c, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, c)) * 3
    x[1, :] = -np.inf                                # all -inf: NaN as the reference
    x[2, c // 3] = np.nan                            # a NaN: the row NaN
    x[3, ::2] = -np.inf                              # half -inf
    x[4, c - 1] = np.inf                             # +inf: the row NaN
    x[5, :] = 80.0 + rng.standard_normal(c)          # large values
    x[6, :] = rng.standard_normal(c) * 30            # a wide spread
    x[7, :c // 2] = np.nan                           # NaN over whole slices (rank 0's and its threads' at CL >= 2):
    return x                                         # fmax skips them all, the NaN must come through the sums


# (C, itemsize, CL, NT, VPT): ragged rows (heads 0..VEC-1 over the rows), empty tails, one block, full clusters
EMU = [(16385, 4, 4, 256, 4), (16387, 2, 2, 512, 2), (8193, 2, 8, 256, 1), (1001, 4, 1, 256, 1),
       (50257, 4, 7, 512, 4), (4100, 2, 3, 256, 1), (515, 4, 8, 256, 1),
       (65536, 4, 8, 512, 4)]     # aligned slices: row 7's NaN half is ranks 0-3 whole, no thread mixes NaN and numbers


@pytest.mark.parametrize("c, item, cl, nt, vpt", EMU, ids=str)
def test_kernels_emulated_against_float64(c, item, cl, nt, vpt):
    vec = 16 // item
    rows = 8
    x = _special_rows(rows, c, c)
    dy = np.random.default_rng(c + 1).standard_normal((rows, c))
    for algo in ("ACCURATE", "LOG"):
        ref = _ref_fwd(x, algo)
        for r in range(rows):
            y = _emulate_row(x[r], r, vec, cl, nt, vpt, algo)
            assert (np.isnan(y) == np.isnan(ref[r])).all(), (algo, r)
            ok = ~np.isnan(ref[r])
            np.testing.assert_allclose(y[ok], ref[r][ok], rtol=1e-12, atol=1e-300)
    # the backward's one sum over the same slots (rank order): dx against the reference
    y = _ref_fwd(np.random.default_rng(3).standard_normal((rows, c)), "LOG")
    for algo in ("ACCURATE", "LOG"):
        yy = y if algo == "LOG" else np.exp(y)
        for r in range(rows):
            body, edges = _slots(r, c, vec, cl, nt, vpt)
            terms = dy[r] if algo == "LOG" else dy[r] * yy[r]
            s = sum(terms[el[el >= 0]].sum() + terms[ed[ed >= 0]].sum() for el, ed in zip(body, edges))
            dx = dy[r] - np.exp(yy[r]) * s if algo == "LOG" else yy[r] * (dy[r] - s)
            ref = (dy[r] - np.exp(yy[r]) * dy[r].sum() if algo == "LOG"
                   else yy[r] * (dy[r] - (dy[r] * yy[r]).sum()))
            np.testing.assert_allclose(dx, ref, rtol=1e-10, atol=1e-12)


def test_emulation_fails_on_a_wrong_split():
    """The walk check is not vacuous: one vector a thread too few does not cover the row."""
    with pytest.raises(AssertionError):
        _slots(0, 50257, 4, 7, 512, 3)
    with pytest.raises(AssertionError):
        _slots(1, 16387, 8, 2, 512, 1)


# ---- CPU: nvcc ------------------------------------------------------------------------------------------------

NVCC_CS = (16385, 32000, 32001, 50257, 65536, 100003, 131072)
NVCC_ROWS = (1, 3, 64, 132, 300, 1000, 4096)


def _configs():
    """Every (dtype, algo, backward, CL, NT, VPT, MINB) the plan makes for NVCC_CS x NVCC_ROWS under "1" and
    "all", with VPT_FWD at 8 (the default) and off (4: MINIDNN_SOFTMAX_CLUSTER_VPT_FWD=4)."""
    out = set()
    was = SC.VPT_FWD
    try:
        for vf in (4, 8):
            SC.VPT_FWD = vf
            _plans_into(out)
    finally:
        SC.VPT_FWD = was
    return sorted(out)


def _plans_into(out):
    for name in NAMES:
        for c in NVCC_CS:
            for rows in NVCC_ROWS:
                for backward in (False, True):
                    for algo in ("ACCURATE", "LOG"):
                        for setting in ("1", "all"):
                            p = SC.plan(rows, c, _dtype(name), algo, backward, 0, setting)
                            if p:
                                out.add((name, algo, backward, p.cl, p.nt, p.vpt, p.minb, p.fexp))
                                if p.fexp:      # FAST_EXP off (MINIDNN_SOFTMAX_CLUSTER_FASTEXP=0)
                                    out.add((name, algo, backward, p.cl, p.nt, p.vpt, p.minb, 0))


def test_configurations_are_many():
    cfgs = _configs()
    assert len(cfgs) >= 40, len(cfgs)
    assert {c[4] for c in cfgs} == {256, 512} and {c[5] for c in cfgs} >= {2, 3, 4}


def _default_configs():
    """The configurations the default setting plans for the kernel table's (4096, 50257) rows in float32 and
    bfloat16 (both algorithms, both directions): always compiled.  Read from the planner, so they follow it (a
    hard-coded list had gone stale: SMXSASS, session 24)."""
    out = set()
    for name in ("float32", "bfloat16"):
        for backward in (False, True):
            for algo in ("ACCURATE", "LOG"):
                p = SC.plan(4096, 50257, _dtype(name), algo, backward, 0, "1")
                if p:
                    out.add((name, algo, backward, p.cl, p.nt, p.vpt, p.minb, p.fexp))
    return out


DEFAULTS = _default_configs()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_kernels_compile_without_spills(tmp_path):
    cfgs = pick(_configs(), 6, DEFAULTS)
    units, entries = [], []
    for name, algo, backward, cl, nt, vpt, minb, fexp in cfgs:
        opts = SC.options(_dtype(name), algo, SC.Launch(cl, nt, vpt, minb, 1, fexp))
        units.append((SC.SOURCE, [o[2:] for o in opts if o.startswith("-D")]))
        entries.append((SC.kernel_name(backward),))
    res = nvcc_build(units, options=("-std=c++17", "-ftz=true"), entries=entries, tmp=tmp_path)
    for cfg, r in zip(cfgs, res):
        assert r.returncode == 0, (cfg, r.stderr[-2000:])
        log = r.stderr
        spill = int(log.split("bytes spill stores")[0].split(",")[-1])
        regs = int(log.split("Used ")[1].split()[0])
        assert spill == 0, (cfg, log)
        assert regs <= 65536 // (cfg[4] * cfg[6]), (cfg, regs)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_exchange_by_remote_stores_only(tmp_path):
    """The partials travel by remote stores (st.shared::cluster) and never by a remote load (session 25: the loads
    faulted in some builds); two cluster barrier phases -- a started-arrive at the start, waited on just before the
    stores, and the exchange -- and none after the output's first store (no closing wait)."""
    cases = [(name, algo, fexp) for algo, fexp in (("ACCURATE", 0), ("LOG", 1)) for name in ("float32", "bfloat16")]
    units = [(SC.SOURCE, [o[2:] for o in SC.options(_dtype(name), algo, SC.Launch(4, 256, 4, 4, 1, fexp))
                          if o.startswith("-D")]) for name, algo, fexp in cases]
    for (name, algo, _), r in zip(cases, nvcc_build(units, options=("-std=c++17",), ptx=True, tmp=tmp_path)):
        assert r.returncode == 0, r.stderr[-1500:]
        for kernel in ("smx_fwdc", "smx_bwdc"):
            b = r.ptx[kernel]
            what = (name, algo, kernel)
            assert "st.shared::cluster" in b and "ld.shared::cluster" not in b, what
            assert b.count("barrier.cluster.wait") == 2 and b.count("barrier.cluster.arrive") == 2, what
            assert b.count("barrier.cluster.arrive.relaxed") == 1 and b.count("barrier.cluster.arrive.release") == 1
            # started-arrive < its wait < the stores < the release arrive < the acquire wait < the output's stores
            order = [b.index("barrier.cluster.arrive.relaxed"), b.index("barrier.cluster.wait"),
                     b.index("st.shared::cluster"), b.rindex("st.shared::cluster"),
                     b.index("barrier.cluster.arrive.release"), b.rindex("barrier.cluster.wait"), b.index("st.global")]
            assert order == sorted(order) and b.index("barrier.cluster.wait") < b.rindex("barrier.cluster.wait"), what


# ---- CPU: the routing under the fake CuPy -------------------------------------------------------------------------

def test_routing_under_the_fake_cupy():
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import re, numpy as np, ml_dtypes, record_launches as R
fakecp, L = R._install({ROOT!r})
recs = []
R.record_to(L, recs)
import minidnn.backend as B
from minidnn.backend import softmax as smx
from minidnn.backend.cuda import softmax_kernels as S, softmax_cluster as SC
assert SC.CLUSTER == "1"
def forget():
    for k, v in vars(smx).items():
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()
def run(shape, dtype=np.float32, off=0):
    flat = fakecp.asarray(np.zeros(int(np.prod(shape)) + off, dtype))
    x = flat[off:].reshape(shape)
    n0 = len(recs)
    y = B.softmax_forward(None, "log", None, x, axis=-1)
    B.softmax_backward(None, "accurate", None, x, x, axis=-1)
    return [(r[0].split("(")[0], re.findall(r"-D(?:CL|NT|VPT)=\\d+", r[0]), r[1][0], r[1][3]) for r in recs[n0:]]
out = {{}}
for setting in ("0", "1", "all", "0"):
    SC.CLUSTER = setting            # no clearing of S._plans: the setting is part of its key
    forget()
    for shape in ((64, 50257), (4096, 32000), (64, 8000)):
        out[setting, shape] = run(shape)
    out[setting, "bf16"] = run((3, 50257), ml_dtypes.bfloat16)
    out[setting, "misaligned"] = run((64, 50257), off=1)
SC.CLUSTER = "1"
x = fakecp.asarray(np.zeros((64, 50257), np.float32))
p = S.plan(x, (1,), "LOG")
out["holds x"] = type(p).__name__, any(a is x for a in p._args)      # a plan must not keep its first input alive
print(repr(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                       env={k: v for k, v in os.environ.items() if k != "MINIDNN_SOFTMAX_CLUSTER"})
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    out = eval(r.stdout.strip().splitlines()[-1])
    rows = ("softmax_rows_fwd", "softmax_rows_bwd")
    for shape in ((64, 50257), (4096, 32000), (64, 8000), "bf16", "misaligned"):
        assert [n for n, *_ in out["0", shape]] == list(rows), (shape, out["0", shape])
        assert [n for n, *_ in out["all", "misaligned"]] == list(rows)      # not on a 16-byte boundary
    assert out["1", (64, 50257)] == [("smx_fwdc", ["-DCL=7", "-DNT=256", "-DVPT=8"], 448, 256),     # VPT_FWD
                                     ("smx_bwdc", ["-DCL=7", "-DNT=512", "-DVPT=4"], 448, 512)], out
    # many rows: clusters both ways (BWD_ROWS_PER_SM 0)
    assert out["1", (4096, 32000)] == [("smx_fwdc", ["-DCL=4", "-DNT=256", "-DVPT=8"], 16384, 256),
                                       ("smx_bwdc", ["-DCL=8", "-DNT=256", "-DVPT=4"], 32768, 256)], out
    assert out["all", (4096, 32000)][1] == ("smx_bwdc", ["-DCL=8", "-DNT=256", "-DVPT=4"], 32768, 256), out
    # 8000 classes: one chunk of a block (forward and backward: 2000 vectors, 8000 <= 8192) -- "all" only
    assert [n for n, *_ in out["1", (64, 8000)]] == list(rows)
    assert out["all", (64, 8000)] == [("smx_fwdc", ["-DCL=3", "-DNT=256", "-DVPT=3"], 192, 256),
                                      ("smx_bwdc", ["-DCL=3", "-DNT=256", "-DVPT=3"], 192, 256)], out
    assert out["1", "bf16"] == [("smx_fwdc", ["-DCL=8", "-DNT=256", "-DVPT=4"], 24, 256),
                                ("smx_bwdc", ["-DCL=8", "-DNT=256", "-DVPT=4"], 24, 256)], out
    assert out["1", "misaligned"] == out["0", "misaligned"]
    assert out["holds x"] == ("_ClusterPlan", False)


def test_environment_read_at_import():
    """MINIDNN_SOFTMAX_CLUSTER and MINIDNN_SOFTMAX_CLUSTER_VPT_FWD: read at import, a bad value refused there."""
    for attr, var, cases in (("CLUSTER", "MINIDNN_SOFTMAX_CLUSTER", (("all", True), ("1", True), ("0", True),
                                                                    ("yes", False))),
                             ("VPT_FWD", "MINIDNN_SOFTMAX_CLUSTER_VPT_FWD", (("4", True), ("6", True), ("3", False),
                                                                            ("9", False)))):
        code = f"from minidnn.backend.cuda import softmax_cluster as SC; print(SC.{attr})"
        for val, ok in cases:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                               env=dict(os.environ, **{var: val}))
            if ok:
                assert r.returncode == 0 and r.stdout.strip() == val, r.stderr[-800:]
            else:
                assert r.returncode != 0 and var in r.stderr


# ---- GPU ----------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    cp = _dev.require_cupy()
    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("thread-block clusters need sm_90")
    return cp


GPU_ROWS = (1, 3, 64, 300)
GPU_CS = (16385, 32001, 50257, 65536, 131072)
GPU_CASES = [(n, c) for n in NAMES for c in GPU_CS]


def _gpu_jobs():
    jobs = []
    for name, c in GPU_CASES:
        for rows in GPU_ROWS + (8,):
            for backward in (False, True):
                for algo in ("ACCURATE", "LOG"):
                    p = SC.plan(rows, c, _dtype(name), algo, backward, 0, "all")
                    if p:
                        jobs.append((name, algo, backward, p))
    for name in NAMES:                  # test_fast_exp_off
        for algo in ("ACCURATE", "LOG"):
            jobs.append((name, algo, False, SC.plan(64, 50257, _dtype(name), algo, False, 0, "all", fast_exp=False)))
    return jobs


def _row_specs():
    """The row kernels the cases launch: float32 131072 classes (not held), the special rows' "0" and every
    misaligned view (the plan a _ClusterPlan falls back to; softmax_kernels.precompile adds a BSR plan's own)."""
    specs = []
    for name, c, rows in ([("float32", 131072, r) for r in GPU_ROWS] + [(n, c, 64) for n, c in SPECIAL]):
        dtype = _dtype(name)
        for bwd in (False, True):
            hint = _sk.call_hint(bwd, rows * c * dtype.itemsize * (3 if bwd else 2), 0)
            specs += [_sk.launch_spec(bwd, (rows, c), (1,), a, dtype, hint, _sk.call_stash(bwd, 0))
                      for a in ("ACCURATE", "LOG")]
    return specs


_WARM = []


def _warm():
    """The kernels the cases launch, compiled first with a process a core (CuPy's disk cache)."""
    if _WARM:
        return
    _WARM.append(True)
    try:
        SC.precompile(_gpu_jobs())
        _sk.precompile(_row_specs())
    except Exception as exc:        # noqa: BLE001 -- only a cache: each compiles when first launched
        print(f"precompile failed ({type(exc).__name__}: {exc}); compiling one by one")


@pytest.fixture
def cluster_all(monkeypatch):
    monkeypatch.setattr(SC, "CLUSTER", "all")
    _reset_plans()
    yield
    _reset_plans()


def _f64(cp, a):
    """float64 on the device (bfloat16 through its bits: the float32 with the same top half)."""
    if a.dtype.itemsize == 2 and a.dtype.kind == "V":
        return (a.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)
    return a.astype(cp.float64)


def _check(cp, got, ref, name, what, scale=1.0, mag=None):
    """As test_softmax_rows_cuda._close, on the device: |got - ref| <= tol (|ref| + 1e-2 row max + mag), NaN
    exactly where the reference is NaN, infinities equal."""
    got = _f64(cp, got)
    tol = RTOL[name] * scale
    err = cp.abs(got - ref)
    fin = cp.where(cp.isfinite(ref), cp.abs(ref), 0.0)
    row = fin.max(axis=-1, keepdims=True)
    bound = tol * (cp.abs(ref) + 1e-2 * row + (0.0 if mag is None else mag) + 1e-30) + SUBNORMAL[name]
    same = (cp.isnan(got) & cp.isnan(ref)) | (got == ref)
    bad = ~(err <= bound) & ~same
    n = int(bad.sum())
    assert n == 0, f"{what}: {n} of {bad.size} off, worst {float(cp.where(bad, err, 0).max())}"


def _dev_ref_fwd(cp, x64, algo):
    m = x64.max(axis=1, keepdims=True)
    e = cp.exp(x64 - m)
    s = e.sum(axis=1, keepdims=True)
    return x64 - m - cp.log(s) if algo == "log" else e / s


def _dev_ref_bwd(cp, y64, dy64, algo):
    if algo == "log":
        ref = dy64 - cp.exp(y64) * dy64.sum(axis=1, keepdims=True)
        mag = cp.abs(dy64) + cp.exp(y64) * cp.abs(dy64).sum(axis=1, keepdims=True)
    else:
        ref = y64 * (dy64 - (dy64 * y64).sum(axis=1, keepdims=True))
        mag = cp.abs(y64) * (cp.abs(dy64) + cp.abs(y64 * dy64).sum(axis=1, keepdims=True))
    return ref, mag


def _bits(cp, a, b, what):
    w = {2: "uint16", 4: "uint32"}[a.dtype.itemsize]
    bad = int((a.view(w) != b.view(w)).sum())
    assert bad == 0, f"{what}: {bad} of {a.size} elements differ"


@pytest.mark.cuda
@pytest.mark.parametrize("name, c", GPU_CASES, ids=[f"{n}-{c}" for n, c in GPU_CASES])
def test_cluster_rows_against_float64(cp, cluster_all, name, c):
    """Every row count routed to the cluster kernels ("all") where they hold the row (float32 131072: the row
    kernels, checked the same), forward and backward of softmax and log-softmax against float64; a second call
    bitwise the first; one launch a call."""
    _warm()
    dtype = _dtype(name)
    for rows in GPU_ROWS:
        rng = np.random.default_rng(rows * 7 + c)
        xd = cp.asarray((rng.standard_normal((rows, c)) * 3).astype(dtype))
        dyd = cp.asarray(rng.standard_normal((rows, c)).astype(dtype))
        x64 = _f64(cp, xd)
        for algo in ("accurate", "log"):
            held = SC.plan(rows, c, dtype, algo.upper(), False, 0) is not None
            assert held == (name != "float32" or c <= 65536)
            n0 = _launches()
            y = B.softmax_forward(None, algo, None, xd, axis=-1)
            assert _launches() - n0 == 1
            plan = _sk.plan(xd, (1,), algo.upper())
            assert isinstance(plan, _sk._ClusterPlan) == held and (not held or plan.old is None)
            what = f"{name} ({rows}, {c}) {algo}"
            _check(cp, y, _dev_ref_fwd(cp, x64, algo), name, what + " forward", scale=4 if algo == "log" else 1)
            ref, mag = _dev_ref_bwd(cp, _f64(cp, y), _f64(cp, dyd), algo)
            dx = B.softmax_backward(None, algo, None, y, dyd, axis=-1)
            _check(cp, dx, ref, name, what + " backward", scale=8, mag=mag)
            if rows == 300:
                _bits(cp, B.softmax_forward(None, algo, None, xd, axis=-1), y, what + " forward again")
                _bits(cp, B.softmax_backward(None, algo, None, y, dyd, axis=-1), dx, what + " backward again")


@pytest.mark.cuda
@pytest.mark.parametrize("name", NAMES)
def test_fast_exp_off(cp, cluster_all, monkeypatch, name):
    """FAST_EXP off (MINIDNN_SOFTMAX_CLUSTER_FASTEXP=0: expf where the default takes ex2.approx -- log-softmax and
    16-bit softmax forwards) against float64 too, and within the tolerance of the default's result."""
    _warm()
    dtype = _dtype(name)
    rows, c = 64, 50257
    xd = cp.asarray((np.random.default_rng(5).standard_normal((rows, c)) * 3).astype(dtype))
    x64 = _f64(cp, xd)
    for algo in ("accurate", "log"):
        y1 = B.softmax_forward(None, algo, None, xd, axis=-1)
        assert isinstance(_sk.plan(xd, (1,), algo.upper()), _sk._ClusterPlan)
        monkeypatch.setattr(SC, "FAST_EXP", False)
        _reset_plans()
        y0 = B.softmax_forward(None, algo, None, xd, axis=-1)
        monkeypatch.setattr(SC, "FAST_EXP", True)
        _reset_plans()
        ref = _dev_ref_fwd(cp, x64, algo)
        for y, what in ((y0, "expf"), (y1, "ex2.approx")):
            _check(cp, y, ref, name, f"{name} {algo} {what}", scale=4 if algo == "log" else 1)
        _check(cp, y1, _f64(cp, y0), name, f"{name} {algo} ex2.approx against expf", scale=4 if algo == "log" else 1)


SPECIAL = [("float32", 50257), ("bfloat16", 50257), ("float16", 32001), ("float32", 16385), ("bfloat16", 65536)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, c", SPECIAL, ids=[f"{n}-{c}" for n, c in SPECIAL])
def test_special_values_as_the_row_kernels(cp, monkeypatch, name, c):
    """Rows of NaN, +-inf, all -inf, large values, a wide spread: NaN and infinity where the row kernels ("0") put
    them, finite values against float64; a misaligned view of the same values (the row kernels: the plan's fallback
    built) against float64.  Row 7 (NaN over whole slices) is the clusters' against float64 only: the row kernels'
    chunked path loses its NaN (test_row_kernels_keep_nan_slices)."""
    _warm()
    dtype = _dtype(name)
    rows = 64
    x = _special_rows(rows, c, c).astype(dtype)
    xd = cp.asarray(x)
    dy = cp.asarray(np.random.default_rng(c).standard_normal((rows, c)).astype(dtype))
    x64 = _f64(cp, xd)
    got = {}
    for setting in ("0", "all"):
        monkeypatch.setattr(SC, "CLUSTER", setting)
        _reset_plans()
        for algo in ("accurate", "log"):
            y = B.softmax_forward(None, algo, None, xd, axis=-1)
            got[setting, algo] = y
            got[setting, algo, "bwd"] = B.softmax_backward(None, algo, None, got["0", algo], dy, axis=-1)
    rk = cp.ones(rows, bool)
    rk[7] = False                                   # the rows the row kernels get right
    for algo in ("accurate", "log"):
        for key in ((algo,), (algo, "bwd")):
            a, b = _f64(cp, got[("all",) + key])[rk], _f64(cp, got[("0",) + key])[rk]
            assert bool((cp.isnan(a) == cp.isnan(b)).all()), f"{key}: NaN positions differ from the row kernels"
            assert bool((cp.isinf(a) == cp.isinf(b)).all()) and bool((a[cp.isinf(a)] == b[cp.isinf(b)]).all())
        _check(cp, got["all", algo], _dev_ref_fwd(cp, x64, algo), name, f"{algo} special rows",
               scale=4 if algo == "log" else 1)
        ym = B.softmax_forward(None, algo, None, _misaligned(cp, xd), axis=-1)
        assert _sk.plan(xd, (1,), algo.upper()).old is not None          # the fallback launched
        _check(cp, ym[rk], _dev_ref_fwd(cp, x64, algo)[rk], name, f"{algo} misaligned",
               scale=4 if algo == "log" else 1)
        y = got["0", algo]
        ref, mag = _dev_ref_bwd(cp, _f64(cp, y), _f64(cp, dy), algo)
        dxm = B.softmax_backward(None, algo, None, _misaligned(cp, y), _misaligned(cp, dy), axis=-1)
        ok = ~cp.isnan(ref)
        _check(cp, dxm[ok], ref[ok], name, f"{algo} backward misaligned", scale=8, mag=mag[ok])


@pytest.mark.cuda
def test_row_kernels_keep_nan_slices(cp, monkeypatch):
    """A bfloat16 (64, 65536) row whose first half is NaN through the row kernels ("0"): all NaN, as the reference
    (run 11: 32768 of 65536, before the chunked rescale kept a NaN sum)."""
    x = cp.asarray(_special_rows(64, 65536, 65536).astype(_dtype("bfloat16")))
    monkeypatch.setattr(SC, "CLUSTER", "0")
    _reset_plans()
    y = _f64(cp, B.softmax_forward(None, "accurate", None, x, axis=-1))
    assert int(cp.isnan(y[7]).sum()) == 65536


GRAPH = [("float32", 64, 50257), ("bfloat16", 300, 50257), ("float16", 3, 131072)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", GRAPH, ids=[f"{n}-{r}x{c}" for n, r, c in GRAPH])
def test_cluster_rows_in_a_graph(cp, cluster_all, name, rows, c):
    """Forward then backward of both algorithms captured in one CUDA graph; replays after x and dy change in
    place give the eager bits."""
    _warm()
    dtype = _dtype(name)
    rng = np.random.default_rng(c)
    xd = cp.asarray((rng.standard_normal((rows, c)) * 3).astype(dtype))
    dy = cp.asarray(rng.standard_normal((rows, c)).astype(dtype))

    def step():
        out = []
        for algo in ("accurate", "log"):
            y = B.softmax_forward(None, algo, None, xd, axis=-1)
            out += [y, B.softmax_backward(None, algo, None, y, dy, axis=-1)]
        return out
    step()                                          # plans and compiles outside the capture
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        outs = step()
        g = s.end_capture()
    w = {2: "uint16", 4: "uint32"}[dtype.itemsize]
    for k in range(2):
        nx = cp.asarray((np.random.default_rng(10 + k).standard_normal((rows, c)) * 2).astype(dtype))
        nd = cp.asarray(np.random.default_rng(20 + k).standard_normal((rows, c)).astype(dtype))
        with s:
            xd.view(w)[...] = nx.view(w)
            dy.view(w)[...] = nd.view(w)
            g.launch(s)
        s.synchronize()
        for a, b in zip(outs, step()):
            _bits(cp, a, b, f"replay {k}")


def test_ab_tool_plans(monkeypatch):
    """tools/softmax_cluster_ab.py plans, per setting, the kernels the A/B means to time (no GPU asked: the device
    facts given) and puts the process's setting back."""
    from minidnn.backend.cuda import device_facts
    monkeypatch.setitem(device_facts._l2, 0, (50 * 2 ** 20, True))
    monkeypatch.setitem(device_facts._smem, 0, (233472, 232448))
    monkeypatch.syspath_prepend(os.path.join(ROOT, "tools"))
    import softmax_cluster_ab as T
    f32 = np.dtype(np.float32)
    got = {(op, s): T.plan_of(op, (4096, 32000), f32, s)[0] for op in T.OPS for s in ("0", "all", "1")}
    want = {(op, s): "rows" if s == "0" else "cluster" for op in T.OPS for s in ("0", "all", "1")}
    assert got == want, got
    assert T.plan_of("lsmxbwd", (300, 50257), f32, "1") == ("cluster", SC.Launch(7, 512, 4, 2, 2100))
    assert T.plan_of("smx", (128, 128000), f32, "all")[0] == "rows"
    assert T.plan_of("smx", (128, 128000), _dtype("bfloat16"), "all")[1] == SC.Launch(8, 256, 8, 4, 1024, 1)
    assert T.plan_of("smx", (128, 128000), _dtype("bfloat16"), "all:vpt4")[1] == SC.Launch(8, 512, 4, 2, 1024, 1)
    bf = _dtype("bfloat16")
    assert T.plan_of("smx", (300, 50257), bf, "all")[1] == SC.Launch(4, 256, 7, 4, 1200, 1)
    assert T.plan_of("smx", (300, 50257), bf, "all:vpt4")[1] == SC.Launch(7, 256, 4, 4, 2100, 1)
    assert T.plan_of("smx", (300, 50257), bf, "all:nt512")[1] == SC.Launch(4, 512, 4, 2, 1200, 1)
    assert T.plan_of("smx", (300, 50257), bf, "all:cl8:nt512")[1] == SC.Launch(8, 512, 2, 2, 2400, 1)
    assert T.plan_of("smx", (300, 50257), bf, "all:exact")[1] == SC.Launch(4, 256, 7, 4, 1200, 0)
    assert T.plan_of("smx", (300, 50257), f32, "all")[1].fexp == 0            # float32 softmax: expf
    assert T.plan_of("smxbwd", (300, 50257), bf, "all")[1].fexp == 0
    assert T.plan_of("smx", (300, 50257), f32, "all:nt256:vpt4")[0] == "rows"    # 12564 vectors: > 8 x 256 x 4
    assert T.plan_of("smx", (300, 50257), f32, "all:nt256")[1] == SC.Launch(7, 256, 8, 4, 2100, 0)   # VPT_FWD
    assert T.plan_of("smx", (300, 50257), f32, "all:nt256:vpt8")[1] == SC.Launch(7, 256, 8, 4, 2100, 0)
    assert T.plan_of("smx", (300, 50257), f32, "1:vpt4")[1] == SC.Launch(7, 512, 4, 2, 2100, 0)
    # vptN (session 24): the vectors a thread may hold, for that setting's plan only
    assert T.plan_of("smx", (4096, 50257), f32, "1:cl7:nt256:vpt8")[1] == SC.Launch(7, 256, 8, 4, 28672, 0)
    assert T.plan_of("smx", (4096, 50257), bf, "1:nt256:vpt8")[1] == SC.Launch(4, 256, 7, 4, 16384, 1)
    assert (SC.VPT_MAX, SC.VPT_FWD) == (4, 8)
    assert T.plan_of("smx", (4096, 50257), bf, "1")[1] == SC.Launch(4, 256, 7, 4, 16384, 1)           # 16-bit too
    assert T.plan_of("smx", (4096, 50257), bf, "1:vpt4")[1] == SC.Launch(7, 256, 4, 4, 28672, 1)
    for bad in ("all:cl9", "all:vpt9", "all:vpt"):
        with pytest.raises(ValueError):
            T.parse(bad)
    with pytest.raises(SystemExit):     # smx_bwdc spills past VPT_MAX: refused before anything runs
        T.main(["--ops", "smx,smxbwd", "--settings", "1,1:vpt8"])
    start = (SC.CLUSTER, SC.FORCE_CL, SC.FORCE_NT, SC.FAST_EXP, SC.VPT_MAX, SC.VPT_FWD)
    T.switch("all:cl8:nt512:exact")
    assert (SC.CLUSTER, SC.FORCE_CL, SC.FORCE_NT, SC.FAST_EXP) == ("all", 8, 512, False) and not _sk._plans
    assert SC.plan(300, 50257, bf, "LOG", True, 0) == SC.Launch(8, 512, 2, 2, 2400)
    assert SC.plan(300, 50257, bf, "LOG", False, 0).fexp == 0
    T.switch("1:cl7:nt256:vpt8")
    assert SC.VPT_MAX == 8 and SC.plan(4096, 50257, f32, "ACCURATE", False, 0) == SC.Launch(7, 256, 8, 4, 28672, 0)
    T.switch("1:vpt4")
    assert (SC.VPT_MAX, SC.VPT_FWD) == (4, 4) and SC.plan(4096, 50257, f32, "ACCURATE", False, 0).nt == 512
    T.restore()
    assert (SC.CLUSTER, SC.FORCE_CL, SC.FORCE_NT, SC.FAST_EXP, SC.VPT_MAX, SC.VPT_FWD) == start
