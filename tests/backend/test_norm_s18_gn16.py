"""Session 18: 16-bit group norm of large groups with the group row stashed in one block's shared memory
(backend/cuda/norm_gn16.py: gn_fwds, gn_bwds; norm_kernels routes 16-bit rows no register path takes to them under
GN_STASH16 / MINIDNN_GN_STASH16=1, sm_80+).

CPU cases: the plan (shared memory a block, blocks an SM) on the kernel table's shape and None where the kernels do
not apply; the kernels' walks (every vector copied and read back by one thread, forward thread-major, backward
channel by channel) and algebra (the two-pass moments; the backward's channel sums, the row's sums made of them, the
re-centring) emulated in float64 against the reference primitives on ragged shapes; the routing under
tools/record_launches.py's fake CuPy (the switch read at import; one gn_fwds launch of a block a row with the row's
bytes of dynamic shared memory, gn_bwds + col_sum; float32, register rows, switch off, pre-sm_80 and unknown shared
memory: the launches before); tools/norm_s17_ab.py's settings; nvcc (no spills within the launch bounds, cp.async
copies and waits in the PTX).
GPU cases (marked cuda): y, mean, rstd, dx, dscale, dbias against float64 on the table's shape and ragged ones,
bfloat16 and float16, with and without parameters, 16-bit parameters; bitwise repeatable; the backward refused where
its stash would leave one block an SM (the looped kernels then); close to the looped kernels on the same inputs.
"""
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import norm_gn16 as GS
from minidnn.backend.cuda import norm_kernels as NK
from tests.backend._gn_helpers import FAKE_RUN, build, check_env_cases, entry_body, gpu, launched
from tests.backend.test_norm_s17_gncl import TOL, _check, _divu, _dtype, _h, _run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H200 = (233472, 232448)         # (shared memory an SM, a block's opt-in limit): H100 and H200 alike


# ---- CPU: the plan ----------------------------------------------------------------------------------------------

# (d, s, itemsize, backward, cpg) -> (dynamic shared memory, blocks an SM) or None, on an H100 / H200
PLANS = [
    ((25088, 3136, 2, False, 8), (50176, 4)),           # (32, 256, 56, 56) G=32: 3136 vectors, a 49 KB row
    ((25088, 3136, 2, True, 8), (100352 + 17 * 8 * 12, 2)),     # x and dy (98 KB) + 17 x 8 channel triples
    ((27648, 2304, 2, True, 12), (110592 + 17 * 12 * 12, 2)),   # (64, 96, 48, 48) G=8: 12 planes of 288 vectors
    ((17600, 1760, 2, True, 10), (70400 + 17 * 10 * 12, 2)),    # (3, 30, 40, 44) G=3: 64 registers, two
    ((30720, 3840, 2, False, 8), (61440, 3)),
    ((30720, 3840, 2, True, 8), None),                  # 122 KB a block: one an SM, no overlap -- not taken
    ((57344, 3584, 2, False, 16), (114688, 2)),         # 112 KB forward: two still fit an SM
    ((59392, 3712, 2, False, 16), None),                # 116 KB: one an SM
    ((25088, 3136, 4, False, 8), None),                 # float32: the cluster kernels
    ((25088, 3136, 8, False, 8), None),                 # float64
    ((17500, 700, 2, False, 25), None),                 # planes of 700 halves do not fill 16-byte vectors
    ((32768, 512, 2, True, 64), None),                  # backward: planes of 64 vectors (< BWD_MIN_IV)
    ((32768, 512, 2, False, 64), (65536, 3)),           # the forward walks the row, not the planes
]


@pytest.mark.parametrize("args, want", PLANS, ids=str)
def test_plan(args, want):
    d, s, item, backward, cpg = args
    assert GS.plan(d, s, item, backward, cpg, H200) == want
    assert GS.plan(d, s, item, backward, cpg, (0, 0)) is None           # the device did not say
    if want is not None:
        nbytes, bps = want
        assert bps * (nbytes + GS.STATIC_SMEM + 1024) <= H200[0] and bps >= GS.MIN_BLOCKS
        assert bps <= (GS.MINB_BWD if backward else GS.MINB_FWD)


def test_routed_rows_are_those_the_registers_refuse():
    """The table's (128, 64, 56, 56) G=32 (6272 values) and (256, 32, 56, 56) keep the register kernels; the
    stash's rows (16-bit D > 16384) are rows row_config2 refuses."""
    for dt in (np.float16, _dtype("bfloat16")):
        for d in (3136, 6272, 16384):
            assert NK.row_config2(d, np.dtype(dt), True, "fwd") is not None
        assert NK.row_config2(25088, np.dtype(dt), True, "fwd") is None
        assert NK.row_config2(25088, np.dtype(dt), True, "gn_bwd") is None
        assert NK.row_config2(17600, np.dtype(dt), True, "gn_bwd") is None


# ---- CPU: the kernels emulated (walks and algebra, float64) -------------------------------------------------------

def _forward_walk(nvec):
    """{vector: (thread, stage)} of gn_fwds' copies (and reads: a thread reads back what it copied); each once."""
    seen = {}
    nst = -(-nvec // GS.NT)
    for k in range(nst):
        for t in range(GS.NT):
            vi = t + k * GS.NT
            if vi < nvec:
                assert vi not in seen
                seen[vi] = (t, k)
    assert sorted(seen) == list(range(nvec))
    return seen


def _backward_walk(cpg, iv):
    """{vector: (channel, thread)} of gn_bwds' copies, channel by channel; each vector once, in its own plane."""
    seen = {}
    for c in range(cpg):
        for t in range(GS.NT):
            for vi in range(c * iv + t, (c + 1) * iv, GS.NT):
                assert vi not in seen and vi // iv == c
                seen[vi] = (c, t)
    assert sorted(seen) == list(range(cpg * iv))
    return seen


def _emulate_forward(x, groups, scale, bias, eps):
    n, c = x.shape[:2]
    s = x.size // (n * c)
    cpg, iv = c // groups, s // 8
    d = cpg * s
    nvec = d // 8
    walk = _forward_walk(nvec)
    rows = x.reshape(n * groups, nvec, 8)
    y = np.empty_like(rows)
    mean, rstd = np.empty(n * groups), np.empty(n * groups)
    for r in range(n * groups):
        thread_sums = np.zeros(GS.NT)
        for vi, (t, _) in sorted(walk.items(), key=lambda kv: kv[1][1]):   # stage order, as the groups land
            thread_sums[t] += rows[r, vi].sum()
        mu = thread_sums.sum() / d
        rs = 1 / math.sqrt(((rows[r] - mu) ** 2).sum() / d + eps)
        mean[r], rstd[r] = mu, rs
        ch = r % groups * cpg + np.array([_divu(vi, iv) for vi in range(nvec)])
        sc = rs * (scale[ch] if scale is not None else 1.0)
        bi = bias[ch] if bias is not None else np.zeros(nvec)
        y[r] = (rows[r] - mu) * sc[:, None] + bi[:, None]
    return y.reshape(x.shape), mean.reshape(n, groups), rstd.reshape(n, groups)


def _emulate_backward(x, dy, groups, scale, mean, rstd):
    n, c = x.shape[:2]
    s = x.size // (n * c)
    cpg, iv = c // groups, s // 8
    d = cpg * s
    walk = _backward_walk(cpg, iv)
    xr, gr = x.reshape(n * groups, cpg * iv, 8), dy.reshape(n * groups, cpg * iv, 8)
    dx = np.empty_like(xr)
    sums = np.zeros((n, 2 * c))
    for r in range(n * groups):
        nn, g = divmod(r, groups)
        g0 = g * cpg
        mu, is_ = mean.reshape(-1)[r], rstd.reshape(-1)[r]
        chs = np.zeros((cpg, 3))                # per channel: sum d, sum dy, sum dy d
        for vi, (ch, _) in walk.items():
            dv, gy = xr[r, vi] - mu, gr[r, vi]
            chs[ch] += (dv.sum(), gy.sum(), (gy * dv).sum())
        sc = scale[g0:g0 + cpg] if scale is not None else np.ones(cpg)
        tot = (chs[:, 0].sum(), (sc * chs[:, 1]).sum(), (sc * chs[:, 2]).sum())
        off = tot[0] / d
        c1, c2 = tot[1] / d, is_ * (tot[2] - off * tot[1]) / d
        sums[nn, g0:g0 + cpg] = is_ * (chs[:, 2] - off * chs[:, 1])
        sums[nn, c + g0:c + g0 + cpg] = chs[:, 1]
        scv = np.repeat(sc, iv)[:, None]
        xhat = (xr[r] - mu) * is_ - off * is_
        dx[r] = is_ * (gr[r] * scv - c1 - xhat * c2)
    return dx.reshape(x.shape), sums[:, :c].sum(0), sums[:, c:].sum(0)


# (shape, groups): planes of 128..1000 vectors, rows of one to many stages, ragged last stages, groups of 1..12 planes
EMU = [((2, 8, 32, 32), 2), ((1, 12, 40, 48), 3), ((3, 2, 64, 72), 1), ((2, 6, 1000, 8), 2), ((1, 1, 129, 8), 1)]


@pytest.mark.parametrize("shape, groups", EMU, ids=str)
def test_kernels_emulated_against_float64(shape, groups):
    rng = np.random.default_rng(sum(shape) * 7 + groups)
    x = rng.standard_normal(shape) * 1.5 - 2.0
    dy = rng.standard_normal(shape)
    c = shape[1]
    scale, bias = rng.standard_normal(c), rng.standard_normal(c)
    s = x.size // (shape[0] * c)
    d = c // groups * s
    assert GS.plan(d, s, 2, False, c // groups, H200) is not None
    assert GS.plan(d, s, 2, True, c // groups, H200) is not None
    y, m, i = _emulate_forward(x, groups, scale, bias, 1e-5)
    y_r, m_r, i_r = B.group_normalization_forward(None, x, groups, scale, bias, 1e-5)
    np.testing.assert_allclose(y, y_r, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(m, m_r, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(i, i_r, rtol=1e-10)
    # the statistics the kernel gets are the forward's rounded to float32: the re-centring takes the offset out
    m32, i32 = m_r.astype(np.float32).astype(np.float64), i_r.astype(np.float32).astype(np.float64)
    for sc in (scale, None):
        dx, ds, db = _emulate_backward(x, dy, groups, sc, m32, i32)
        dx_r, ds_r, db_r = B.group_normalization_backward(None, x, dy, groups, sc, m_r, i_r)
        np.testing.assert_allclose(dx, dx_r, rtol=2e-6, atol=2e-6)      # float32 rstd: ~1e-7 relative
        if sc is not None:
            np.testing.assert_allclose(ds, ds_r, rtol=2e-6, atol=2e-6)
            np.testing.assert_allclose(db, db_r, rtol=1e-12, atol=1e-12)


# ---- CPU: the routing under the fake CuPy -------------------------------------------------------------------------

def _fake(code, env):
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, ml_dtypes, record_launches as R
fakecp, L = R._install({ROOT!r})
names = []
L._go = lambda fn, d, stream, p: names.append((str(fn).split("(")[0], d))
import minidnn.backend as B
from minidnn.backend.cuda import norm_kernels as NK, norm_gn16 as GS, norm_gncl as GC, device_facts as DF
DF._smem[0] = {H200!r}
DF._l2[0] = (50 * 2 ** 20, True)
bf16 = ml_dtypes.bfloat16
DTYPE = bf16
""" + FAKE_RUN + """def kinds(*a, **k):
    return [n for n, _ in run(*a, **k)]
"""
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, **env))
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    return r.stdout


def test_routing_under_the_fake_cupy():
    _fake("""
assert GS.GN_STASH16 is True            # MINIDNN_GN_STASH16=1, read at import
assert GS.BWD_VARIANT == 1              # MINIDNN_GN_STASH16_BWD=1: gn_bwds (gn_bwdp, the default: test_norm_s18_gn16b)
got = run((4, 256, 56, 56), 32)         # the table's (32, 256, 56, 56) G=32 at batch 4: 128 rows, a block each
assert got == [("gn_fwds", (128, 1, 1, 512, 1, 1, 50176)), ("gn_bwds", (128, 1, 1, 512, 1, 1, 100352 + 17 * 96)),
               ("col_sum", got[2][1])], got
assert kinds((4, 256, 56, 56), 32, np.float16, affine=False) == ["gn_fwds", "gn_bwds"]
# ragged: 12 planes of 288 vectors, 10 of 220
assert kinds((2, 96, 48, 48), 8) == ["gn_fwds", "gn_bwds", "col_sum"]
assert kinds((3, 30, 40, 44), 3, np.float16) == ["gn_fwds", "gn_bwds", "col_sum"]
# a backward stash of 122 KB (one block an SM): the forward only, the looped backward
assert kinds((2, 8, 60, 64), 1) == ["gn_fwds", "row_sums", "col_sum", "gn_dx"]
# the clusters take float32 only (their 16-bit switches went in session 18, set in this child's environment to no
# effect), and refuse 16-bit rows asked directly; register rows keep their kernels
assert not hasattr(GC, "FWD16") and not hasattr(GC, "BWD16")
assert kinds((2, 256, 56, 56), 32, np.float32) == ["gn_fwdc", "gn_bwdc", "col_sum"]
assert GC.plan(25088, 3136, 2, False, 8) is None and GC.plan(25088, 3136, 2, True, 8) is None
assert kinds((2, 64, 56, 56), 32) == ["norm_fwd2", "gn_bwd2", "col_sum"]
assert kinds((8, 32, 8, 8), 8) == ["norm_fwd2", "gn_bwd2", "col_sum"]
# planes that do not fill vectors (55 x 55 halves): the looped kernels
assert kinds((2, 256, 55, 55), 32) == ["norm_fwd", "row_sums", "col_sum", "gn_dx"]
# a GPU before sm_80 (no cp.async), a device that does not say its shared memory, the switch off: the looped
# kernels, never the clusters
DF._l2[0] = (50 * 2 ** 20, False)
assert kinds((2, 256, 56, 56), 32) == ["norm_fwd", "row_sums", "col_sum", "gn_dx"]
DF._l2[0] = (50 * 2 ** 20, True)
DF._smem[0] = (0, 0)
assert kinds((2, 256, 56, 56), 32) == ["norm_fwd", "row_sums", "col_sum", "gn_dx"]
DF._smem[0] = {H200!r}
GS.GN_STASH16 = False
assert kinds((2, 256, 56, 56), 32) == ["norm_fwd", "row_sums", "col_sum", "gn_dx"]
GS.GN_STASH16 = True
# one direction only (MINIDNN_GN_STASH16_DIRS)
GS.DIRECTIONS = frozenset({"fwd"})
assert kinds((2, 256, 56, 56), 32) == ["gn_fwds", "row_sums", "col_sum", "gn_dx"]
GS.DIRECTIONS = frozenset({"bwd"})
assert kinds((2, 256, 56, 56), 32) == ["norm_fwd", "gn_bwds", "col_sum"]
GS.DIRECTIONS = frozenset({"fwd", "bwd"})
# tools/norm_s17_ab.py's 16-bit settings: the kernels each launches, and the defaults restored
import norm_s17_ab as T
x = fakecp.asarray(np.ones((2, 256, 56, 56), bf16))
dy = fakecp.asarray(np.ones((2, 256, 56, 56), bf16))
def both():
    y, m, i = B.group_normalization_forward(None, x, 32, None, None, 1e-5)
    B.group_normalization_backward(None, x, dy, 32, None, m, i)
got = {}
for s in T.SETTINGS16:
    T.apply(s)
    got[s] = T.kernels_of(both)
assert got == {"old": "norm_fwd+row_sums+gn_dx", "stash": "gn_fwds+gn_bwds", "stash2": "gn_fwds+gn_bwdp"}, got
# the float32 settings on 16-bit rows (the clusters on, the stash off): the looped kernels
for s in ("new", "new512"):
    T.apply(s)
    assert T.kernels_of(both) == "norm_fwd+row_sums+gn_dx", s
T.apply(None)
assert (GS.GN_STASH16, GS.BWD_VARIANT, GC.GN_CLUSTER, GC.NT) == (True, 1, True, 256)
print("OK")
""".replace("{H200!r}", repr(H200)), {"MINIDNN_GN_STASH16": "1", "MINIDNN_GN_STASH16_BWD": "1",
                                        "MINIDNN_GN_CLUSTER_FWD16": "1", "MINIDNN_GN_CLUSTER_BWD16": "1"})


def test_environment(env_runs):
    """On by default (session 18 run 2), both directions; MINIDNN_GN_STASH16=0 turns it off,
    MINIDNN_GN_STASH16_DIRS limits it; a bad direction is an error at import.  (One interpreter, tests/conftest.py
    env_runs: the first setting a fresh import, the others the module re-executed.)"""
    show = "import minidnn.backend.cuda.norm_gn16 as S; print(S.GN_STASH16, sorted(S.DIRECTIONS))"
    cases = (({}, "True ['bwd', 'fwd']"), ({"MINIDNN_GN_STASH16": "0"}, "False ['bwd', 'fwd']"),
             ({"MINIDNN_GN_STASH16_DIRS": "fwd"}, "True ['fwd']"), ({"MINIDNN_GN_STASH16_DIRS": "fwd,sideways"}, None))
    check_env_cases(env_runs, show, cases, "fwd and / or bwd")


# ---- CPU: nvcc ------------------------------------------------------------------------------------------------

# (dtype, backward, parameter storage): both kernels in both dtypes, float32 and 16-bit parameters
BUILDS = [("bfloat16", False, 0), ("bfloat16", True, 2), ("float16", False, 1), ("float16", True, 0)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, backward, pstorage", BUILDS, ids=str)
def test_kernels_compile_without_spills(tmp_path, name, backward, pstorage):
    entry = "gn_bwds" if backward else "gn_fwds"
    opts = GS.options(_dtype(name), ("float", pstorage), backward)
    log, ptx = build(tmp_path, GS.SOURCE, opts, entry)
    assert "0 bytes spill stores" in log and "0 bytes stack frame" in log, log[-800:]
    regs = int(log.split("Used ")[1].split()[0])
    assert regs <= 65536 // (GS.NT * (GS.MINB_BWD if backward else GS.MINB_FWD)), regs
    # static shared memory within the plan's allowance (the dynamic part is the row)
    assert int(log.split("registers, used 1 barriers, ")[1].split(" bytes smem")[0]) <= GS.STATIC_SMEM
    body = entry_body(ptx, entry)
    copies = [line for line in body.splitlines() if "cp.async.cg.shared.global" in line]
    assert len(copies) >= (2 if backward else 1) and all(line.rstrip().endswith(", 16;") for line in copies), copies
    assert "cp.async.commit_group" in body and "cp.async.wait_group 0" in body and "cp.async.wait_group 15" in body
    assert "ld.local" not in body and "st.local" not in body


def test_the_16bit_source_refuses_float32(tmp_path):
    """The kernels' vectors are 8 halves: a float32 build is an error, not a silent mis-stride."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    from minidnn.backend.cuda import launch
    opts = GS.options(np.dtype(np.float32), ("float", 0), False)
    src = tmp_path / "gn16.cu"
    launch.write_source(str(src), GS.SOURCE, [o[2:] for o in opts if o.startswith("-D")])
    r = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", "-std=c++17", "-o", str(tmp_path / "k.ptx"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "16-bit data only" in r.stderr


# ---- GPU ----------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    return gpu(80, "cp.async needs sm_80")


@pytest.fixture
def on(monkeypatch):
    """The stash route on with the backward's variant 1 (gn_bwds; gn_bwdp is test_norm_s18_gn16b's), plans forgotten
    before and after; yields the launched kernels' names."""
    monkeypatch.setattr(GS, "GN_STASH16", True)
    monkeypatch.setattr(GS, "BWD_VARIANT", 1)
    with launched(monkeypatch) as got:
        yield got


# the kernel table's shape (the batch cut to keep the float64 reference quick) and ragged ones: 8..12 planes of
# 220..392 vectors, rows of 5..7 stages of 512 vectors
GPU_CASES = [((4, 256, 56, 56), 32), ((2, 96, 48, 48), 8), ((3, 30, 40, 44), 3), ((3, 22, 48, 40), 2)]
CASES = [(n, s, g, True) for n in ("bfloat16", "float16") for s, g in GPU_CASES] + [
    ("bfloat16", GPU_CASES[0][0], 32, False), ("float16", GPU_CASES[2][0], 3, False)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, groups, affine", CASES, ids=str)
def test_stash_kernels_against_float64(cp, on, name, shape, groups, affine):
    rng = np.random.default_rng(hash((shape, groups, name, affine)) % 2 ** 32)
    inputs, got = _run(cp, name, shape, groups, affine, rng)
    assert on == ["gn_fwds", "gn_bwds"] + ["col_sum"] * affine, on
    _check(name, shape, groups, inputs, got)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_16_bit_parameters_and_repeat(cp, on, name):
    """Parameters in x's 16-bit dtype; a second call gives the same bits (every sum in a fixed order)."""
    rng = np.random.default_rng(18)
    shape, groups = (2, 128, 56, 56), 16
    inputs, got = _run(cp, name, shape, groups, True, rng, pdtype=_dtype(name))
    _check(name, shape, groups, inputs, got)
    g = [None if a is None else cp.asarray(a) for a in inputs]
    for _ in range(2):
        y, m, i = B.group_normalization_forward(None, g[0], groups, g[2], g[3], 1e-5)
        dx, ds, db = B.group_normalization_backward(None, g[0], g[1], groups, g[2], m, i)
        for a, b in zip(got, (y, m, i, dx, ds, db)):
            assert cp.array_equal(a, b)
    assert set(on) == {"gn_fwds", "gn_bwds", "col_sum"}, on


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_blocks_an_sm_as_planned(cp, name):
    """The driver's occupancy of both kernels at the table's row (25088 values) is the plan's: four forward blocks
    an SM, two backward -- the overlap of one block's loads with another's stores the design counts on."""
    from minidnn.backend.cuda import launch
    dev = cp.cuda.Device().id
    smem = (int(cp.cuda.Device().attributes["MaxSharedMemoryPerMultiprocessor"]),
            int(cp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]))
    for backward, entry in ((False, "gn_fwds"), (True, "gn_bwds")):
        nbytes, bps = GS.plan(25088, 3136, 2, backward, 8, smem)
        k = GS._kernel(entry, _dtype(name), ("float", 0))
        launch._opt_in(k, nbytes)           # as a launch does (never lowers a limit set before)
        got = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(k.kernel.ptr, GS.NT, nbytes)
        assert got == bps == (2 if backward else 4), (entry, got, bps, smem, dev)


@pytest.mark.cuda
def test_backward_refused_where_one_block_fits(cp, on):
    """(2, 8, 60, 64) G=1: a 60 KB forward row (three blocks an SM) takes gn_fwds; the backward's 122 KB would leave
    one block an SM, so it keeps the looped kernels -- both against float64."""
    rng = np.random.default_rng(5)
    shape, groups = (2, 8, 60, 64), 1
    inputs, got = _run(cp, "bfloat16", shape, groups, True, rng)
    assert on == ["gn_fwds", "row_sums", "col_sum", "gn_dx"], on
    _check("bfloat16", shape, groups, inputs, got)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_close_to_the_looped_kernels(cp, on, monkeypatch, name):
    """The same inputs through the route off (norm_fwd looped, row_sums + col_sum + gn_dx) and on."""
    rng = np.random.default_rng(3)
    shape, groups = (4, 256, 56, 56), 32
    inputs, got = _run(cp, name, shape, groups, True, rng)
    monkeypatch.setattr(GS, "GN_STASH16", False)
    NK._plans.clear()
    g = [None if a is None else cp.asarray(a) for a in inputs]
    y, m, i = B.group_normalization_forward(None, g[0], groups, g[2], g[3], 1e-5)
    dx, ds, db = B.group_normalization_backward(None, g[0], g[1], groups, g[2], m, i)
    assert on[:3] == ["gn_fwds", "gn_bwds", "col_sum"] and "norm_fwd" in on and "gn_dx" in on, on
    tol = TOL[name]
    for a, b in zip(got[:4], (y, m, i, dx)):
        np.testing.assert_allclose(_h(a), _h(b), **tol)
    np.testing.assert_allclose(_h(got[4]), _h(ds), rtol=1e-3, atol=1e-2)
