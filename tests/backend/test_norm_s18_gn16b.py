"""Session 18 (helper GN16B): the 16-bit group-norm stash's backward variant 2 (backend/cuda/norm_gn16.py: gn_bwdp,
BWD_VARIANT / MINIDNN_GN_STASH16_BWD, "2" the default since the H200's run 3) -- a persistent block an SM walking
rows through two row buffers of x and dy, so the next row's loads are in flight while one reduces and stores.  (The
forward's variant 2, gn_fwdp, lost to gn_fwds in run 3 and was removed with its tests.)

CPU cases: the plan (shared memory, teams) on the A/B's rows and None where the kernel does not apply; the team
choice; the kernel's walk (every vector copied and read back by one thread of the team that owns its channel, each
once, rows alternating buffers) and its cp.async accounting (each channel's wait leaves its own group landed, the
cap at 15 included) emulated; the algebra emulated in float64 against the reference primitives on ragged shapes;
the routing under tools/record_launches.py's fake CuPy (a grid of the SMs, 1024 threads, the two rows' bytes; variant
1 and rows that do not fit: gn_bwds or the looped kernels); the environment; nvcc (no spills at 1024 x 1).
GPU cases (marked cuda): y, dx, dscale, dbias against float64 with the grid cut to a few blocks (each walks many rows,
both buffers) and at the SMs' count, bf16 and fp16, with and without parameters; bitwise repeatable; close to gn_bwds.
"""
import math
import shutil

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import norm_gn16 as GS
from minidnn.backend.cuda import norm_kernels as NK
from tests.backend._gn_helpers import build, check_env_cases, entry_body, launched
from tests.backend.test_norm_s17_gncl import TOL, _check, _dtype, _h, _run
from tests.backend.test_norm_s18_gn16 import H200, _fake, cp  # noqa: F401 -- cp: the GPU fixture

# ---- CPU: the plan and the teams ---------------------------------------------------------------------------------

# (d, s, itemsize, cpg) -> (dynamic shared memory, teams, warps a team) or None, on an H100 / H200
PIPE_PLANS = [
    ((25088, 3136, 2, 8), (4 * 50176 + (8 * 4 + 8) * 12, 8, 4)),      # (32, 256, 56, 56) G=32: 8 planes of 392
    ((27648, 2304, 2, 12), (4 * 55296 + (12 * 5 + 12) * 12, 6, 5)),   # (64, 96, 48, 48) G=8: 12 planes of 288
    ((17600, 1760, 2, 10), (4 * 35200 + (10 * 3 + 10) * 12, 10, 3)),  # (3, 30, 40, 44) G=3: 10 planes of 220
    ((24576, 512, 2, 48), (4 * 49152 + (48 * 2 + 48) * 12, 16, 2)),   # planes of 64 vectors (gn_bwds refuses them)
    ((30720, 3840, 2, 8), None),                # two rows of x and dy: 240 KB, past the opt-in limit
    ((25088, 3136, 4, 8), None),                # float32
    ((17500, 700, 2, 25), None),                # planes of 700 halves do not fill 16-byte vectors
    ((8192 * 9, 128, 2, 72), None),             # 72 channels (> CPG_MAX)
]


@pytest.mark.parametrize("args, want", PIPE_PLANS, ids=str)
def test_pipe_plan(args, want):
    d, s, item, cpg = args
    assert GS.plan_pipe(d, s, item, cpg, H200) == want
    assert GS.plan_pipe(d, s, item, cpg, (0, 0)) is None          # the device did not say
    if want is not None:
        nbytes, teams, wpt = want
        assert nbytes + GS.STATIC_SMEM <= H200[1] and 1 <= teams <= cpg and teams * wpt <= GS.NT_PIPE // 32


@pytest.mark.parametrize("cpg, iv", [(8, 392), (12, 288), (10, 220), (48, 64), (1, 5000), (3, 1), (64, 128),
                                     (7, 33), (2, 2000)], ids=str)
def test_pipe_teams_take_the_fewest_steps(cpg, iv):
    """No other (teams, warps) split gives a thread fewer vector steps a row; the chosen one fits the block."""
    teams, wpt = GS.pipe_teams(cpg, iv)
    nw = GS.NT_PIPE // 32
    assert 1 <= teams <= min(cpg, nw) and wpt == nw // teams

    def steps(p):
        return -(-cpg // p) * -(-iv // (32 * (nw // p)))
    assert steps(teams) == min(steps(p) for p in range(1, min(cpg, nw) + 1))


# ---- CPU: the kernels emulated (walk, waits, algebra) ------------------------------------------------------------

def _pipe_walk(cpg, iv, teams, wpt):
    """{vector: (thread, j)} of gn_bwdp's copies of one row (thread t = its j-th channel's copier and reader); each
    vector once, by a thread of the team owning its plane."""
    seen = {}
    tt_n = 32 * wpt
    for t in range(GS.NT_PIPE):
        p, tt = divmod(t, tt_n)
        if p >= teams:
            continue
        cpt = (cpg - 1 - p) // teams + 1
        for j in range(cpt):
            c = p + j * teams
            for vi in range(c * iv + tt, (c + 1) * iv, tt_n):
                assert vi not in seen and vi // iv == c and c % teams == p
                seen[vi] = (t, j)
    assert sorted(seen) == list(range(cpg * iv))
    return seen


def _waits_hold(cpt, nrows):
    """One thread's commit groups (cpt a row: row 0 before the loop, row i + 1 at iteration i's top, empty past the
    end) against its waits: at row i's channel j, cp_wait(2 cpt - 1 - j) (capped at 15) must leave that channel's
    group landed -- groups complete in commit order, so it is landed when committed - allowed > its index."""
    committed = cpt
    for i in range(nrows):
        committed += cpt                            # issue(r + stride)
        for j in range(cpt):
            allowed = min(2 * cpt - 1 - j, 15)
            assert committed - allowed > i * cpt + j, (cpt, i, j)
            assert 2 * cpt - 1 - j > 15 or committed - allowed == i * cpt + j + 1     # not earlier than needed
    return True


@pytest.mark.parametrize("cpt", [1, 2, 3, 8, 9, 20])
def test_waits_leave_each_channel_landed(cpt):
    assert _waits_hold(cpt, 5)


def _emulate_pipe(x, dy, groups, scale, mean, rstd, grid):
    """gn_bwdp in float64: the blocks' rows (r = b, b + grid, ...; buffers alternating), the team walk, each
    channel's warp partials added in warp order, the row's sums of the channels', the re-centring, dx."""
    n, c = x.shape[:2]
    s = x.size // (n * c)
    cpg, iv = c // groups, s // 8
    d = cpg * s
    teams, wpt = GS.pipe_teams(cpg, iv)
    walk = _pipe_walk(cpg, iv, teams, wpt)
    rows = n * groups
    xr, gr = x.reshape(rows, cpg * iv, 8), dy.reshape(rows, cpg * iv, 8)
    dx = np.full_like(xr, np.nan)
    sums = np.zeros((n, 2 * c))
    done = []
    for blk in range(min(rows, grid)):
        buffers = [None, None]
        for i, r in enumerate(range(blk, rows, grid)):
            buffers[i % 2] = (r, xr[r], gr[r])     # the copy issued one iteration earlier, into buffer i % 2
            rr, xb, gb = buffers[i % 2]
            assert rr == r
            done.append(r)
            nn, g = divmod(r, groups)
            g0 = g * cpg
            mu, is_ = mean.reshape(-1)[r], rstd.reshape(-1)[r]
            wpart = np.zeros((cpg, wpt, 3))
            for vi, (t, _) in walk.items():
                ch = vi // iv
                dv, gy = xb[vi] - mu, gb[vi]
                wpart[ch, (t // 32) % wpt] += (dv.sum(), gy.sum(), (gy * dv).sum())
            chs = wpart.sum(1)
            sc = scale[g0:g0 + cpg] if scale is not None else np.ones(cpg)
            tot = (chs[:, 0].sum(), (sc * chs[:, 1]).sum(), (sc * chs[:, 2]).sum())
            off = tot[0] / d
            c1, c2 = tot[1] / d, is_ * (tot[2] - off * tot[1]) / d
            sums[nn, g0:g0 + cpg] = is_ * (chs[:, 2] - off * chs[:, 1])
            sums[nn, c + g0:c + g0 + cpg] = chs[:, 1]
            bx, k0 = -is_ * is_ * c2, is_ * (c2 * off * is_ - c1)       # the kernel's dx: affine in (dy, x - mu)
            for vi in walk:
                dx[r, vi] = is_ * sc[vi // iv] * gb[vi] + (bx * (xb[vi] - mu) + k0)
    assert sorted(done) == list(range(rows))        # every row once
    return dx.reshape(x.shape), sums[:, :c].sum(0), sums[:, c:].sum(0)


# (shape, groups, grid): planes of 64..1000 vectors (one to many channels a thread, teams not dividing the
# channels), more rows than blocks (each block both buffers, an odd grid), fewer
EMU = [((4, 8, 32, 32), 2, 3), ((3, 12, 40, 48), 3, 2), ((5, 2, 64, 72), 1, 4), ((2, 6, 1000, 8), 2, 132),
       ((3, 10, 40, 44), 1, 2), ((2, 48, 16, 32), 1, 1)]


@pytest.mark.parametrize("shape, groups, grid", EMU, ids=str)
def test_pipe_emulated_against_float64(shape, groups, grid):
    rng = np.random.default_rng(sum(shape) * 11 + groups)
    x = rng.standard_normal(shape) * 1.5 - 2.0
    dy = rng.standard_normal(shape)
    c = shape[1]
    scale = rng.standard_normal(c)
    s = x.size // (shape[0] * c)
    assert GS.plan_pipe(c // groups * s, s, 2, c // groups, H200) is not None
    _, m_r, i_r = B.group_normalization_forward(None, x, groups, scale, None, 1e-5)
    # the statistics the kernel gets are the forward's rounded to float32: the re-centring takes the offset out
    m32, i32 = m_r.astype(np.float32).astype(np.float64), i_r.astype(np.float32).astype(np.float64)
    for sc in (scale, None):
        dx, ds, db = _emulate_pipe(x, dy, groups, sc, m32, i32, grid)
        dx_r, ds_r, db_r = B.group_normalization_backward(None, x, dy, groups, sc, m_r, i_r)
        np.testing.assert_allclose(dx, dx_r, rtol=2e-6, atol=2e-6)
        if sc is not None:
            np.testing.assert_allclose(ds, ds_r, rtol=2e-6, atol=2e-6)
            np.testing.assert_allclose(db, db_r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("offset, sigma", [(-2.0, 1.5), (100.0, 1.0), (1000.0, 0.5), (0.0, 1e-2)], ids=str)
def test_affine_dx_in_float32_as_accurate_as_variant_1(offset, sigma):
    """gn_bwdp's dx = (rstd scale) dy + (b (x - mu) + k) in float32 arithmetic: within 2x + 1e-7 of gn_bwds' form's
    error (the float32 sums'), |mean| / sigma up to 2000.  (Folding mu into k, b x + k', cancels it: 1.6e-6 of the
    largest |dx| at |mean| / sigma = 100, 12x gn_bwds' -- checked here to fail, so the check has teeth.)"""
    rng = np.random.default_rng(int(offset) + 7)
    f, d = np.float32, 25088
    x = (rng.standard_normal(d) * sigma + offset).astype(np.float16).astype(np.float64)
    g = (rng.standard_normal(d) + 0.3 * (x - x.mean()) / x.std()).astype(np.float16).astype(np.float64)
    mu, is_ = x.mean(), 1 / np.sqrt(x.var() + 1e-5)
    xhat = (x - mu) * is_
    ref = is_ * (g - g.mean() - xhat * (g * xhat).mean())
    mu32, is32 = f(mu), f(is_)
    dv = x.astype(f) - mu32
    tot0, tot1, tot2 = dv.sum(dtype=f), g.astype(f).sum(dtype=f), (g.astype(f) * dv).sum(dtype=f)
    off, c1 = tot0 / f(d), tot1 / f(d)
    c2 = is32 * (tot2 - off * tot1) / f(d)
    bx = -is32 * is32 * c2
    got = is32 * g.astype(f) + (bx * dv + is32 * (c2 * off * is32 - c1))
    folded = is32 * g.astype(f) + (bx * x.astype(f) + is32 * (c2 * (mu32 * is32 + off * is32) - c1))
    was = is32 * (g.astype(f) - c1 - (dv * is32 - off * is32) * c2)      # gn_bwds' form
    assert got.dtype == was.dtype == folded.dtype == f
    err, err_was = (np.abs(a - ref).max() for a in (got, was))
    top = np.abs(ref).max()
    assert err <= 2 * err_was + 1e-7 * top, (err, err_was)
    if offset == 100.0:
        assert np.abs(folded - ref).max() > 2 * err_was + 1e-7 * top


# ---- CPU: the routing under the fake CuPy and the environment ------------------------------------------------------

def test_routing_under_the_fake_cupy():
    _fake("""
assert GS.BWD_VARIANT == 2              # MINIDNN_GN_STASH16_BWD=2 (the default: test_environment), read at import
got = run((8, 256, 56, 56), 32)         # 256 rows: a grid of the 132 SMs, 1024 threads, two rows of x and dy
assert got == [("gn_fwds", (256, 1, 1, 512, 1, 1, 50176)),
               ("gn_bwdp", (132, 1, 1, 1024, 1, 1, 4 * 50176 + 40 * 12)), ("col_sum", got[2][1])], got
got = run((2, 256, 56, 56), 32, np.float16, affine=False)    # 64 rows: a block a row
assert got[1] == ("gn_bwdp", (64, 1, 1, 1024, 1, 1, 4 * 50176 + 40 * 12)) and len(got) == 2, got
assert kinds((2, 96, 48, 48), 8) == ["gn_fwds", "gn_bwdp", "col_sum"]
assert kinds((3, 30, 40, 44), 3, np.float16) == ["gn_fwds", "gn_bwdp", "col_sum"]
# planes of 64 vectors: gn_bwds refuses them (BWD_MIN_IV), gn_bwdp takes them
assert kinds((2, 48, 16, 32), 1) == ["gn_fwds", "gn_bwdp", "col_sum"]
# two rows that do not fit one block: as variant 1 (here the looped kernels: gn_bwds' one row a block does not fit
# two an SM either)
assert kinds((2, 8, 60, 64), 1) == ["gn_fwds", "row_sums", "col_sum", "gn_dx"]
# float32 and the register rows never reach it; the stash off: the kernels before
assert kinds((2, 256, 56, 56), 32, np.float32) == ["gn_fwdc", "gn_bwdc", "col_sum"]
assert kinds((2, 64, 56, 56), 32) == ["norm_fwd2", "gn_bwd2", "col_sum"]
GS.GN_STASH16 = False
assert kinds((2, 256, 56, 56), 32) == ["norm_fwd", "row_sums", "col_sum", "gn_dx"]
GS.GN_STASH16 = True
# variant 1: gn_bwds as before, and the small planes looped again
GS.BWD_VARIANT = 1
assert kinds((2, 256, 56, 56), 32) == ["gn_fwds", "gn_bwds", "col_sum"]
assert kinds((2, 48, 16, 32), 1) == ["gn_fwds", "row_sums", "col_sum", "gn_dx"]
GS.BWD_VARIANT = 2
assert not hasattr(GS, "FWD_VARIANT") and not hasattr(GS, "SOURCE_FPIPE")    # the forward's variant 2 is gone
# tools/norm_s17_ab.py's 16-bit settings: "stash" gn_bwds, "stash2" gn_bwdp, both gn_fwds forward; every setting
# restores the defaults
import norm_s17_ab as T
x = fakecp.asarray(np.ones((2, 256, 56, 56), bf16))
def both():
    y, m, i = B.group_normalization_forward(None, x, 32, None, None, 1e-5)
    B.group_normalization_backward(None, x, x, 32, None, m, i)
got = {}
for s in T.SETTINGS16:
    T.apply(s)
    got[s] = T.kernels_of(both)
assert got == {"old": "norm_fwd+row_sums+gn_dx", "stash": "gn_fwds+gn_bwds", "stash2": "gn_fwds+gn_bwdp"}, got
T.apply("stash")
assert (GS.GN_STASH16, GS.BWD_VARIANT) == (True, 1)
T.apply(None)
assert (GS.GN_STASH16, GS.BWD_VARIANT) == (True, 2)
assert not hasattr(GS, "LEAN")      # (GNLEAN) one kernel text: the switch went
print("OK")
""", {"MINIDNN_GN_STASH16": "1", "MINIDNN_GN_STASH16_BWD": "2"})


def test_environment(env_runs):
    """gn_bwdp by default (run 3); MINIDNN_GN_STASH16_BWD=1 keeps gn_bwds; anything else is an error at import.
    The forward's variable is gone: setting it changes nothing.  (One interpreter, tests/conftest.py env_runs: the
    first setting a fresh import, the others the module re-executed.)"""
    show = "import minidnn.backend.cuda.norm_gn16 as S; print(S.BWD_VARIANT, hasattr(S, 'FWD_VARIANT'))"
    bwd = "MINIDNN_GN_STASH16_BWD"
    cases = (({}, "2 False"), ({bwd: "1"}, "1 False"), ({bwd: "2"}, "2 False"),
             ({"MINIDNN_GN_STASH16_FWD": "2"}, "2 False"), ({bwd: "3"}, None))
    check_env_cases(env_runs, show, cases, "1 (gn_bwds) or 2 (gn_bwdp)")


# ---- CPU: nvcc ------------------------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, pstorage", [("bfloat16", 0), ("float16", 1), ("bfloat16", 2)], ids=str)
def test_pipe_compiles_without_spills(tmp_path, name, pstorage):
    entry = "gn_bwdp"
    opts = GS.options(_dtype(name), ("float", pstorage), True, pipe=True)
    assert "-DNT=1024" in opts and "-DMINB=1" in opts
    log, ptx = build(tmp_path, GS.SOURCE_PIPE, opts, entry)
    assert "0 bytes spill stores" in log and "0 bytes stack frame" in log, log[-800:]
    regs = int(log.split("Used ")[1].split()[0])
    assert regs <= 65536 // GS.NT_PIPE, regs
    assert int(log.split("registers, used 1 barriers, ")[1].split(" bytes smem")[0]) <= GS.STATIC_SMEM
    body = entry_body(ptx, entry)
    copies = [line for line in body.splitlines() if "cp.async.cg.shared.global" in line]
    assert len(copies) >= 2, copies
    assert all(line.rstrip().endswith(", 16;") for line in copies), copies
    assert "cp.async.commit_group" in body and "cp.async.wait_group 0" in body and "cp.async.wait_group 15" in body
    assert "ld.local" not in body and "st.local" not in body
    assert ".maxntid 1024, 1, 1" in body and ".minnctapersm 1" in body


# ---- GPU ----------------------------------------------------------------------------------------------------------

@pytest.fixture
def pipe(monkeypatch):
    """The stash on with the backward's variant 2, plans forgotten before and after; yields the launched kernels'
    names."""
    monkeypatch.setattr(GS, "GN_STASH16", True)
    monkeypatch.setattr(GS, "BWD_VARIANT", 2)
    with launched(monkeypatch) as got:
        yield got


# (shape, groups, grid: None = the SMs' count): the table's row, ragged ones (teams not dividing the channels, planes
# of 64 vectors), grids cut to a few blocks so each walks many rows through both buffers
GPU_CASES = [((4, 256, 56, 56), 32, None), ((4, 256, 56, 56), 32, 5), ((6, 96, 48, 48), 8, 7),
             ((3, 30, 40, 44), 3, 2), ((4, 48, 16, 32), 1, 3), ((8, 96, 48, 48), 8, None)]
CASES = [(n, *c, True) for n in ("bfloat16", "float16") for c in GPU_CASES] + [
    ("bfloat16", (4, 256, 56, 56), 32, 5, False), ("float16", (3, 30, 40, 44), 3, 2, False)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, groups, grid, affine", CASES, ids=str)
def test_pipe_against_float64(cp, pipe, monkeypatch, name, shape, groups, grid, affine):  # noqa: F811
    if grid is not None:
        monkeypatch.setattr(GS, "_pipe_grid", lambda rows, dev: min(rows, grid))
    rng = np.random.default_rng(sum(shape) * 7 + groups + 3 * len(name) + 11 * affine + (grid or 0))
    inputs, got = _run(cp, name, shape, groups, affine, rng)
    assert pipe == ["gn_fwds", "gn_bwdp"] + ["col_sum"] * affine, pipe
    _check(name, shape, groups, inputs, got)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_pipe_16_bit_parameters_repeat_and_close_to_variant_1(cp, pipe, monkeypatch, name):  # noqa: F811
    """Parameters in x's dtype; a second call gives the same bits whatever the grid (each row's sums are one
    block's, in a fixed order); close to gn_bwds on the same inputs."""
    rng = np.random.default_rng(16)
    shape, groups = (4, 128, 56, 56), 16
    inputs, got = _run(cp, name, shape, groups, True, rng, pdtype=_dtype(name))
    _check(name, shape, groups, inputs, got)
    g = [None if a is None else cp.asarray(a) for a in inputs]
    for grid in (3, 64):
        monkeypatch.setattr(GS, "_pipe_grid", lambda rows, dev, n=grid: min(rows, n))
        NK._plans.clear()
        y, m, i = B.group_normalization_forward(None, g[0], groups, g[2], g[3], 1e-5)
        dx, ds, db = B.group_normalization_backward(None, g[0], g[1], groups, g[2], m, i)
        for a, b in zip(got, (y, m, i, dx, ds, db)):
            assert cp.array_equal(a, b)
    assert set(pipe) == {"gn_fwds", "gn_bwdp", "col_sum"}, pipe
    monkeypatch.setattr(GS, "BWD_VARIANT", 1)
    NK._plans.clear()
    dx, ds, db = B.group_normalization_backward(None, g[0], g[1], groups, g[2], got[1], got[2])
    assert pipe[-2:] == ["gn_bwds", "col_sum"], pipe
    np.testing.assert_allclose(_h(got[3]), _h(dx), **TOL[name])
    np.testing.assert_allclose(_h(got[4]), _h(ds), rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(_h(got[5]), _h(db), rtol=1e-3, atol=1e-2 * math.sqrt(shape[0]))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_pipe_one_block_an_sm(cp, name):  # noqa: F811
    """The driver fits exactly one block of gn_bwdp an SM at the table's row (its shared memory and registers): the
    grid of the SMs' count is then one wave, every block resident from the start."""
    from minidnn.backend.cuda import launch
    smem = (int(cp.cuda.Device().attributes["MaxSharedMemoryPerMultiprocessor"]),
            int(cp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]))
    nbytes = GS.plan_pipe(25088, 3136, 2, 8, smem)[0]
    k = GS._kernel("gn_bwdp", _dtype(name), ("float", 0))
    launch._opt_in(k, nbytes)
    got = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(k.kernel.ptr, GS.NT_PIPE, nbytes)
    assert got == 1, (got, nbytes, smem)
