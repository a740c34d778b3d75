"""Session 17: group norm of large groups held by thread-block clusters (backend/cuda/norm_gncl.py: gn_fwdc, gn_bwdc;
norm_kernels routes to them under GN_CLUSTER / MINIDNN_GN_CLUSTER=1, rows no register path takes).

CPU cases: the plan (cluster size, vectors a thread, channels a block touches) for the kernel table's shapes and
None where the kernels do not apply (16-bit data among them, since session 18); the kernels' walk and algebra
emulated in NumPy -- every vector of a row held by exactly one (rank, thread, slot), the block-local channel index
within MAXCH, Chan's combination of the blocks' moments, the backward's one exchange (sum d, sum g, sum g d) with
the re-centring and rank 0's per-channel sums -- in float64 against the reference primitives, over ragged splits
and planes split between blocks; the routing under
tools/record_launches.py's fake CuPy (the switch on: one gn_fwdc launch of rows * CL blocks, gn_bwdc + col_sum;
off, 16-bit data even with the removed MINIDNN_GN_CLUSTER_FWD16 / _BWD16 set, and the shapes the register kernels
hold: the launches before); nvcc (no spills, a spread of configurations; session 25: the partials travel by
remote stores only, with the barrier phases of that exchange, in the PTX).
GPU cases (marked cuda): forward (y, mean, rstd) and backward (dx, dscale, dbias) against float64 on the kernel
table's shapes and ragged ones, float32, with and without affine parameters; every cluster size forced on one shape;
bitwise repeatable; against the looped kernels on the same inputs; 16-bit rows never launch the clusters.
"""
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import norm_gncl as GC
from minidnn.backend.cuda import norm_kernels as NK
from tests._nvcc import pick
from tests.backend._gn_helpers import FAKE_RUN, build, gpu, launched

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- CPU: the plan ----------------------------------------------------------------------------------------------

# (d, s, itemsize, backward, cpg) -> (CL, VPT, MAXCH) or None
PLANS = [
    ((25088, 3136, 4, False, 8), (7, 4, 1)),     # (32, 256, 56, 56) G=32 float32: 6272 vectors, 896 a block
    ((25088, 3136, 4, True, 8), (7, 4, 2)),      # blocks straddle a plane: two channels each
    ((25088, 3136, 2, False, 8), None),          # 16-bit: refused (lost to the looped kernels; norm_gn16's)
    ((25088, 3136, 2, True, 8), None),
    ((12544, 3136, 4, True, 4), (4, 4, 1)),      # (N, 128, 56, 56) G=32: a plane a block
    ((32768, 1024, 4, False, 32), (8, 4, 1)),    # 8192 vectors: the largest float32 row
    ((32772, 1092, 4, False, 30), None),         # 8193 vectors: more than CL_MAX blocks of 4 x 256
    ((16384, 16384, 2, True, 1), None),          # 16-bit, whatever the size
    ((25088, 3136, 8, False, 8), None),          # float64: not taken
    ((2500, 100, 2, False, 25), None),           # planes of 100 halves do not fill 16-byte vectors
    ((16384, 256, 4, True, 64), None),           # backward: a block would touch 16 channels (> MAXCH_MAX)
    ((16384, 256, 4, False, 64), (4, 4, 1)),     # the forward has no channel limit
]


@pytest.mark.parametrize("args, want", PLANS, ids=str)
def test_plan(args, want):
    d, s, item, backward, cpg = args
    p = GC.plan(d, s, item, backward, cpg)
    assert p == want
    if p is None:
        return
    cl, vpt, maxch = p
    nvec, iv = d // (16 // item), s // (16 // item)
    share = -(-nvec // cl)
    assert vpt * GC.NT >= share and vpt <= GC.VPT_MAX[item]
    assert cl == 1 or -(-nvec // (cl - 1)) > GC.VPT_MAX[item] * GC.NT        # the smallest such cluster
    if backward:
        assert maxch == GC.max_channels(nvec, cl, iv) <= GC.MAXCH_MAX


def test_forced_cluster_sizes():
    assert GC.plan(25088, 3136, 4, False, 8, force_cl=8) == (8, 4, 1)
    assert GC.plan(25088, 3136, 4, True, 8, force_cl=8) == (8, 4, 1)        # a plane a block
    assert GC.plan(25088, 3136, 4, False, 8, force_cl=6) is None            # 1046 vectors a block: > 4 x 256
    assert GC.plan(25088, 3136, 4, True, 8, force_cl=9) is None             # not portable
    assert GC.plan(25088, 3136, 2, True, 8, force_cl=8) is None             # 16-bit, at any size
    assert GC.plan(25088, 3136, 2, False, 8, force_cl=7) is None


def test_512_thread_blocks(monkeypatch):
    """NT = 512 (MINIDNN_GN_CLUSTER_NT; tools/norm_s17_ab.py's "new512"): half the cluster, the launch bounds'
    blocks an SM halved (the same registers a thread)."""
    monkeypatch.setattr(GC, "NT", 512)
    assert GC.plan(25088, 3136, 4, False, 8) == (4, 4, 1)
    assert GC.plan(25088, 3136, 4, True, 8) == (4, 4, 2)
    assert (GC.minb(False), GC.minb(True)) == (GC.MINB_FWD // 2, GC.MINB_BWD // 2)
    assert "-DNT=512" in GC.options(np.dtype(np.float32), ("float", 0), 4, 4, True, 2)


def test_register_rows_keep_their_plans():
    """Rows a norm_kernels team holds in registers never reach the cluster route: the table's (128, 64, 56, 56)
    G=32 (6272 values) and every smaller group; the cluster rows are exactly those row_config2 refuses."""
    for item, dt in ((4, np.float32), (2, np.float16)):
        assert NK.row_config2(6272, np.dtype(dt), True, "fwd") is not None
        assert NK.row_config2(6272, np.dtype(dt), True, "gn_bwd") is not None
        assert NK.row_config2(25088, np.dtype(dt), True, "fwd") is None
        assert NK.row_config2(25088, np.dtype(dt), True, "gn_bwd") is None


# ---- CPU: the kernels emulated (index maths and algebra, float64) -----------------------------------------------

def _divu(n, d):
    mul, shr = (int(v) for v in GC._divider(d))
    return (((n * mul) >> 32) + n) >> shr


def _slots(nvec, cl, vpt):
    """{vector: (rank, thread, slot)} as the kernels assign them; every vector once."""
    seen = {}
    for rank, (lo, hi) in enumerate(GC.ranges(nvec, cl)):
        for k in range(vpt):
            for t in range(GC.NT):
                vi = lo + k * GC.NT + t
                if vi < hi:
                    assert vi not in seen
                    seen[vi] = (rank, t, k)
    assert sorted(seen) == list(range(nvec))
    return seen


def _emulate_forward(x, groups, scale, bias, eps, cl, vpt, vec):
    n, c = x.shape[:2]
    s = x.size // (n * c)
    cpg, iv = c // groups, s // vec
    d = cpg * s
    nvec = d // vec
    _slots(nvec, cl, vpt)
    rows = x.reshape(n * groups, nvec, vec)
    y = np.empty_like(rows)
    mean, rstd = np.empty(n * groups), np.empty(n * groups)
    for r in range(n * groups):
        parts = []
        for lo, hi in GC.ranges(nvec, cl):
            v = rows[r, lo:hi]
            b = v.sum()
            nb = (hi - lo) * vec
            m2 = ((v - b / nb) ** 2).sum() if nb else 0.0
            parts.append((b, m2, nb))
        mu = sum(p[0] for p in parts) / d
        m2 = sum(p[1] + p[2] * ((p[0] / p[2] - mu) if p[2] else 0.0) ** 2 for p in parts)
        rs = 1 / math.sqrt(m2 / d + eps)
        mean[r], rstd[r] = mu, rs
        g0 = r % groups * cpg
        ch = g0 + np.array([_divu(vi, iv) for vi in range(nvec)])
        sc = rs * (scale[ch] if scale is not None else 1.0)
        bi = bias[ch] if bias is not None else 0.0
        y[r] = (rows[r] - mu) * sc[:, None] + np.asarray(bi).reshape(-1, 1) * np.ones((1, vec))
    return y.reshape(x.shape), mean.reshape(n, groups), rstd.reshape(n, groups)


def _emulate_backward(x, dy, groups, scale, mean, rstd, cl, vpt, maxch, vec):
    n, c = x.shape[:2]
    s = x.size // (n * c)
    cpg, iv = c // groups, s // vec
    d = cpg * s
    nvec = d // vec
    _slots(nvec, cl, vpt)
    xr, gr = x.reshape(n * groups, nvec, vec), dy.reshape(n * groups, nvec, vec)
    dx = np.empty_like(xr)
    sums = np.zeros((n, 2 * c))
    for r in range(n * groups):
        nn, g0 = divmod(r, groups)
        g0 *= cpg
        mu, is_ = mean.reshape(-1)[r], rstd.reshape(-1)[r]
        parts = []
        for lo, hi in GC.ranges(nvec, cl):
            clo = _divu(lo, iv)
            p = np.zeros(3 + 2 * maxch)
            for vi in range(lo, hi):
                ch = _divu(vi, iv)
                sc = scale[g0 + ch] if scale is not None else 1.0
                dv, gy = xr[r, vi] - mu, gr[r, vi]
                g = gy * sc
                p[:3] += (dv.sum(), g.sum(), (g * dv).sum())
                lc = ch - clo
                assert 0 <= lc < maxch
                p[3 + 2 * lc:5 + 2 * lc] += ((gy * dv).sum(), gy.sum())
            parts.append((lo, hi, p))
        tot = sum(p for _, _, p in parts)[:3]
        off = tot[0] / d
        c1, c2 = tot[1] / d, is_ * (tot[2] - off * tot[1]) / d
        for ch in range(cpg):
            se = ss = 0.0
            for lo, hi, p in parts:
                if hi <= lo:
                    continue
                cl0, cl1 = _divu(lo, iv), _divu(hi - 1, iv)
                if cl0 <= ch <= cl1:
                    se, ss = se + p[3 + 2 * (ch - cl0)], ss + p[4 + 2 * (ch - cl0)]
            sums[nn, g0 + ch] = is_ * (se - off * ss)
            sums[nn, c + g0 + ch] = ss
        chs = g0 + np.array([_divu(vi, iv) for vi in range(nvec)])
        sc = (scale[chs] if scale is not None else np.ones(nvec))[:, None]
        xhat = (xr[r] - mu) * is_ - off * is_
        dx[r] = is_ * (gr[r] * sc - c1 - xhat * c2)
    return dx.reshape(x.shape), sums[:, :c].sum(0), sums[:, c:].sum(0)


# (shape, groups, forced CL or None), float32 vectors: ragged splits, planes split over blocks, a block of several
# planes
EMU = [((2, 8, 16, 16), 2, 3), ((1, 6, 8, 12), 3, 5), ((2, 4, 32, 8), 1, 7), ((1, 16, 4, 8), 4, 2),
       ((3, 6, 40), 2, 4), ((1, 2, 64), 1, 8)]


@pytest.mark.parametrize("shape, groups, cl", EMU, ids=str)
def test_kernels_emulated_against_float64(shape, groups, cl):
    item = 4
    rng = np.random.default_rng(hash((shape, cl)) % 2 ** 32)
    x = rng.standard_normal(shape) * 1.5 - 2.0
    dy = rng.standard_normal(shape)
    c = shape[1]
    scale, bias = rng.standard_normal(c), rng.standard_normal(c)
    s = x.size // (shape[0] * c)
    d = c // groups * s
    fwd = GC.plan(d, s, item, False, c // groups, force_cl=cl)
    bwd = GC.plan(d, s, item, True, c // groups, force_cl=cl)
    assert fwd is not None and bwd is not None
    vec = 16 // item
    y, m, i = _emulate_forward(x, groups, scale, bias, 1e-5, fwd[0], fwd[1], vec)
    y_r, m_r, i_r = B.group_normalization_forward(None, x, groups, scale, bias, 1e-5)
    np.testing.assert_allclose(y, y_r, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(m, m_r, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(i, i_r, rtol=1e-10)
    # the statistics the kernel gets are the forward's rounded to float32: the re-centring takes the offset out
    m32, i32 = m_r.astype(np.float32).astype(np.float64), i_r.astype(np.float32).astype(np.float64)
    dx, ds, db = _emulate_backward(x, dy, groups, scale, m32, i32, bwd[0], bwd[1], bwd[2], vec)
    dx_r, ds_r, db_r = B.group_normalization_backward(None, x, dy, groups, scale, m_r, i_r)
    np.testing.assert_allclose(dx, dx_r, rtol=2e-6, atol=2e-6)          # float32 rstd: ~1e-7 relative
    np.testing.assert_allclose(ds, ds_r, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(db, db_r, rtol=1e-12, atol=1e-12)


def test_divider_for_the_planes():
    for iv in (1, 7, 392, 784, 1567):
        j = np.arange(0, 8193 * 4, dtype=np.int64)
        mul, shr = (int(v) for v in GC._divider(iv))
        assert ((((j * mul) >> 32) + j) >> shr == j // iv).all()


# ---- CPU: the routing under the fake CuPy -------------------------------------------------------------------------

def _fake(code):
    # MINIDNN_GN_CLUSTER=1 in the child's environment: the switch read at import (asserted first)
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, ml_dtypes, record_launches as R
fakecp, L = R._install({ROOT!r})
names = []
L._go = lambda fn, d, stream, p: names.append((str(fn).split("(")[0], d))
import minidnn.backend as B
from minidnn.backend.cuda import norm_kernels as NK, norm_gncl as GC
DTYPE = np.float32
""" + FAKE_RUN
    # the removed 16-bit switches set: nothing reads them any more
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, MINIDNN_GN_CLUSTER="1", MINIDNN_GN_CLUSTER_FWD16="1",
                                MINIDNN_GN_CLUSTER_BWD16="1"))
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    return r.stdout


def test_routing_under_the_fake_cupy():
    _fake("""
assert GC.GN_CLUSTER is True
got = run((4, 256, 56, 56), 32)        # the table's (32, 256, 56, 56) G=32 at batch 4: 128 rows of 7 blocks
assert got == [("gn_fwdc", (128 * 7, 1, 1, 256, 1, 1, 0)), ("gn_bwdc", (128 * 7, 1, 1, 256, 1, 1, 0)),
               ("col_sum", got[2][1])], got
assert [n for n, _ in run((4, 256, 56, 56), 32, affine=False)] == ["gn_fwdc", "gn_bwdc"]
# 16-bit: never the clusters (they lost to the looped kernels on the H200; session 18 removed FWD16 / BWD16).  The
# stash (norm_gn16) needs the device's shared memory, unknown to this fake: the looped kernels (test_norm_s18_gn16
# routes the stash)
assert not hasattr(GC, "FWD16") and not hasattr(GC, "BWD16")
for dt in (ml_dtypes.bfloat16, np.float16):
    assert [n for n, _ in run((2, 256, 56, 56), 32, dt)] == ["norm_fwd", "row_sums", "col_sum", "gn_dx"]
    x16 = fakecp.asarray(np.ones((2, 256, 56, 56), dt))
    assert GC.prepare_forward(x16, 32, None, None, 1e-5, 0) is None
    assert GC.prepare_backward(x16, 32, None) is None
    assert GC.prepare_forward(x16, 32, None, None, 1e-5, 0, force_cl=7) is None
# the register kernels' rows keep them: the table's (128, 64, 56, 56) G=32, a small CNN's group norm
assert [n for n, _ in run((2, 64, 56, 56), 32)] == ["norm_fwd2", "gn_bwd2", "col_sum"]
assert [n for n, _ in run((8, 32, 8, 8), 8)] == ["norm_fwd2", "gn_bwd2", "col_sum"]
# planes that do not fill vectors (55 x 55 floats): the looped kernels
assert [n for n, _ in run((2, 256, 55, 55), 32)] == ["norm_fwd", "row_sums", "col_sum", "gn_dx"]
GC.GN_CLUSTER = False
assert [n for n, _ in run((4, 256, 56, 56), 32)] == ["norm_fwd", "row_sums", "col_sum", "gn_dx"]
# tools/norm_s17_ab.py's settings: the kernels each launches, and the defaults restored
import norm_s17_ab as T
x = fakecp.asarray(np.ones((2, 256, 56, 56), np.float32))
fwd = lambda: B.group_normalization_forward(None, x, 32, None, None, 1e-5)
got = {}
for s in T.SETTINGS:
    T.apply(s)
    got[s] = (T.kernels_of(fwd), GC.NT)
assert got == {"old": ("norm_fwd", 256), "new": ("gn_fwdc", 256), "new512": ("gn_fwdc", 512)}, got
T.apply(None)
assert (GC.GN_CLUSTER, GC.NT) == (False, 256)          # as they were when the tool was imported
xl = fakecp.asarray(np.ones((64, 768), ml_dtypes.bfloat16))
T._detail[:] = [(768, xl.dtype)]
ln = lambda: B.layer_normalization_forward(None, xl, None, None, 1, 1e-5)
got = []
for s in T.LN_SETTINGS:
    T.apply_ln(s)
    got.append(T.kernels_of(ln) + T.plan_detail())
assert got == ["ln_fwd3 team=64 VPT=2", "ln_fwd3 team=32 VPT=3"], got
T.apply_ln(None)
assert NK.ROUTE["ln_fwd16"] == "v3kw"
# the block size from the environment, refused unless 256 or 512
import importlib, os
os.environ["MINIDNN_GN_CLUSTER_NT"] = "300"
try:
    importlib.reload(GC)
    raise SystemExit("no error")
except ValueError as exc:
    assert "256 or 512" in str(exc)
print("OK")
""")


# ---- CPU: nvcc ------------------------------------------------------------------------------------------------

def _configs():
    """(backward, CL, VPT, MAXCH), float32: every plan of the GPU cases below, and the ends of each axis."""
    out = set()
    for backward in (False, True):
        for d, s, cpg in ((25088, 3136, 8), (12544, 3136, 4), (32768, 1024, 32), (18000, 1800, 10),
                          (25088 * 2, 3136, 16)):
            for cl in (None, 8):
                p = GC.plan(d, s, 4, backward, cpg, force_cl=cl)
                if p:
                    out.add((backward, *p))
        if backward:
            out.add((True, 8, GC.VPT_MAX[4], GC.MAXCH_MAX))
    return sorted(out)


DEFAULTS = {(False, 7, 4, 1), (True, 7, 4, 2)}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("cfg", pick(_configs(), 2, DEFAULTS), ids=str)
def test_kernels_compile_without_spills(tmp_path, cfg):
    backward, cl, vpt, maxch = cfg
    entry = "gn_bwdc" if backward else "gn_fwdc"
    opts = GC.options(np.dtype(np.float32), GC._PSTORAGE["float32"], cl, vpt, backward, maxch)
    log, _ = build(tmp_path, GC.SOURCE, opts, entry, ptx=False)
    lines = log.splitlines()
    at = next(i for i, line in enumerate(lines) if f"entry function '{entry}'" in line)
    spill = next(line for line in lines[at:] if "spill stores" in line)
    assert int(spill.split("bytes spill stores")[0].split(",")[-1]) == 0, (cfg, spill)
    regs = int(next(line for line in lines[at:] if "registers" in line).split("Used ")[1].split()[0])
    assert regs <= 65536 // (GC.NT * (GC.MINB_BWD if backward else GC.MINB_FWD)), (cfg, regs)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_512_thread_build_without_spills(tmp_path, monkeypatch):
    """The fullest NT = 512 build (float32 backward, 4 vectors of x and dy a thread) within 64 registers."""
    monkeypatch.setattr(GC, "NT", 512)
    opts = GC.options(np.dtype(np.float32), ("float", 0), 4, 4, True, 2)
    log, _ = build(tmp_path, GC.SOURCE, opts, "gn_bwdc", ptx=False)
    assert "0 bytes spill stores" in log, log[-800:]
    assert int(log.split("Used ")[1].split()[0]) <= 64


# (backward, CL, VPT, MAXCH, parameter dtype): the default plans with each parameter storage, and the ends
EXCHANGE = [(False, 7, 4, 1, "float32"), (False, 7, 4, 1, "float16"), (False, 8, 2, 1, "bfloat16"),
            (False, 4, 4, 1, "float32"), (True, 7, 4, 2, "float32"), (True, 7, 4, 2, "bfloat16"),
            (True, 8, 4, 4, "float16"), (True, 4, 4, 1, "float32")]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_exchange_by_remote_stores_only(tmp_path):
    """The partials travel by remote stores (st.shared::cluster) and never by a remote load (session 25: the loads
    faulted in some softmax_cluster builds); two cluster barrier phases -- a relaxed started-arrive at the start,
    waited on just before the stores, then the exchange's release arrive and acquire wait -- and none after the
    output's first global store (no closing wait).  The backward stores two ways: the triple to every block, the
    channel pairs to rank 0."""
    from tests import _nvcc
    units = []
    for backward, cl, vpt, maxch, pname in EXCHANGE:
        opts = GC.options(np.dtype(np.float32), GC._PSTORAGE[pname], cl, vpt, backward, maxch)
        units.append((GC.SOURCE, [o[2:] for o in opts if o.startswith("-D")]))
    for (backward, cl, vpt, maxch, pname), r in zip(EXCHANGE, _nvcc.build(units, ("-std=c++17",), ptx=True,
                                                                        tmp=tmp_path)):
        assert r.returncode == 0, r.stderr[-1500:]
        b = r.ptx["gn_bwdc" if backward else "gn_fwdc"]
        what = (backward, cl, vpt, maxch, pname)
        assert "ld.shared::cluster" not in b, what
        assert b.count("st.shared::cluster") == (2 if backward else 1), what
        assert b.count("barrier.cluster.arrive.relaxed") == 1 and b.count("barrier.cluster.arrive") == 2, what
        assert b.count("barrier.cluster.wait") == 2, what
        # started-arrive < its wait < the stores < the release arrive < the acquire wait < the first global store
        order = [b.index("barrier.cluster.arrive.relaxed"), b.index("barrier.cluster.wait"),
                 b.index("st.shared::cluster"), b.rindex("st.shared::cluster"),
                 b.index("barrier.cluster.arrive.release"), b.rindex("barrier.cluster.wait"), b.index("st.global")]
        assert order == sorted(order) and b.index("barrier.cluster.wait") < b.rindex("barrier.cluster.wait"), what


# ---- GPU ----------------------------------------------------------------------------------------------------------

TOL = {"float32": dict(rtol=1e-4, atol=2e-5), "float16": dict(rtol=4e-3, atol=4e-3),
       "bfloat16": dict(rtol=2e-2, atol=2e-2)}


@pytest.fixture
def cp():
    return gpu(90, "thread-block clusters need sm_90")


@pytest.fixture
def on(monkeypatch):
    """The cluster route on, plans forgotten before and after; yields the launched kernels' names."""
    monkeypatch.setattr(GC, "GN_CLUSTER", True)
    with launched(monkeypatch) as got:
        yield got


def _dtype(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


def _h(a):
    return None if a is None else a.get().astype(np.float64)


def _run(cp, name, shape, groups, affine, rng, pdtype=np.float32):
    dtype = _dtype(name)
    c = shape[1]
    x = (rng.standard_normal(shape) * 1.5 - 2.0).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    scale = rng.standard_normal(c).astype(pdtype) if affine else None
    bias = rng.standard_normal(c).astype(pdtype) if affine else None
    g = [None if a is None else cp.asarray(a) for a in (x, dy, scale, bias)]
    y, m, i = B.group_normalization_forward(None, g[0], groups, g[2], g[3], 1e-5)
    dx, ds, db = B.group_normalization_backward(None, g[0], g[1], groups, g[2], m, i)
    return (x, dy, scale, bias), (y, m, i, dx, ds, db)


def _check(name, shape, groups, inputs, got):
    x, dy, scale, bias = (None if a is None else a.astype(np.float64) for a in inputs)
    y_r, m_r, i_r = B.group_normalization_forward(None, x, groups, scale, bias, 1e-5)
    # the reference backward from the kernel's own (float32) statistics: dx's test is then of the backward alone
    m, i = _h(got[1]), _h(got[2])
    dx_r, ds_r, db_r = B.group_normalization_backward(None, x, dy, groups, scale, m, i)
    tol = TOL[name]
    np.testing.assert_allclose(_h(got[0]), y_r, **tol)
    np.testing.assert_allclose(m, m_r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(i, i_r, rtol=1e-4)
    np.testing.assert_allclose(_h(got[3]), dx_r, **tol)
    if scale is None:
        assert got[4] is None and got[5] is None
        return
    count = x.size // shape[1]
    atol = 1e-4 * math.sqrt(count) * 4
    np.testing.assert_allclose(_h(got[4]), ds_r, rtol=1e-4, atol=atol)
    np.testing.assert_allclose(_h(got[5]), db_r, rtol=tol["rtol"], atol=atol + (tol["atol"] if name != "float32"
                                                                                 else 0))


# the kernel table's shape (the batch cut to keep the float64 reference quick) and ragged ones, all routed to the
# clusters in float32: CL 5..8, planes split between blocks (three channels a block at (3, 22, 48, 40))
GPU_CASES = [((4, 256, 56, 56), 32), ((2, 64, 64, 64), 8), ((3, 30, 40, 44), 3), ((3, 22, 48, 40), 2)]


# (dtype, shape, groups, affine): every shape with parameters, the table's shape and one ragged without (~8 NVRTC
# compiles + col_sum: calls without parameters share the build)
CASES = [("float32", s, g, True) for s, g in GPU_CASES] + [
    ("float32", GPU_CASES[0][0], 32, False), ("float32", GPU_CASES[3][0], 2, False)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, groups, affine", CASES, ids=str)
def test_cluster_kernels_against_float64(cp, on, name, shape, groups, affine):
    rng = np.random.default_rng(hash((shape, groups, name, affine)) % 2 ** 32)
    inputs, got = _run(cp, name, shape, groups, affine, rng)
    assert on[:2] == ["gn_fwdc", "gn_bwdc"] and len(on) == 2 + affine, on
    _check(name, shape, groups, inputs, got)


@pytest.mark.cuda
def test_512_thread_blocks_against_float64(cp, on, monkeypatch):
    """NT = 512 (tools/norm_s17_ab.py's "new512"): CL 4 on the table's shape, blocks straddling planes (ragged;
    its backward touches too many channels a block at NT = 512, so it keeps the looped kernels -- run 3)."""
    name = "float32"
    monkeypatch.setattr(GC, "NT", 512)
    for shape, groups in (GPU_CASES[0], GPU_CASES[3]):
        NK._plans.clear()
        rng = np.random.default_rng(512)
        inputs, got = _run(cp, name, shape, groups, True, rng)
        _check(name, shape, groups, inputs, got)
    assert GC.plan(22 * 48 * 40 // 2, 48 * 40, 4, True, 11) is None
    assert on.count("gn_fwdc") == 2 and on.count("gn_bwdc") == 1, on


@pytest.mark.cuda
def test_cluster_kernels_repeat(cp, on):
    """A second call gives the same bits (the cluster's combinations in rank order)."""
    name = "float32"
    rng = np.random.default_rng(17)
    shape, groups = (2, 128, 56, 56), 16
    inputs, got = _run(cp, name, shape, groups, True, rng)
    assert on[:2] == ["gn_fwdc", "gn_bwdc"], on
    _check(name, shape, groups, inputs, got)
    g = [None if a is None else cp.asarray(a) for a in inputs]
    y, m, i = B.group_normalization_forward(None, g[0], groups, g[2], g[3], 1e-5)
    dx, ds, db = B.group_normalization_backward(None, g[0], g[1], groups, g[2], m, i)
    for a, b in zip(got, (y, m, i, dx, ds, db)):
        assert cp.array_equal(a, b)


def _direct(cp, inputs, groups, cl):
    """The two kernels launched directly (prepare_* at cluster size ``cl``), dscale / dbias summed from their
    (N, 2C) sums on the host."""
    x, dy, scale, bias = (None if a is None else cp.asarray(a) for a in inputs)
    n, c = x.shape[:2]
    fwd = GC.prepare_forward(x, groups, scale, bias, 1e-5, (scale is not None) | (bias is not None) << 1,
                             force_cl=cl)
    bwd = GC.prepare_backward(x, groups, scale, force_cl=cl)
    assert fwd is not None and bwd is not None
    y = cp.empty_like(x)
    m, i = cp.empty((n, groups), cp.float32), cp.empty((n, groups), cp.float32)
    fwd(x, x if scale is None else scale, x if bias is None else bias, y, m, i)
    sums, dx = cp.zeros((n, 2 * c), cp.float32), cp.empty_like(x)
    bwd(x, dy, m, i, x if scale is None else scale, sums, dx)
    ds = db = None
    if scale is not None:
        ds, db = sums[:, :c].sum(0), sums[:, c:].sum(0)
    return y, m, i, dx, ds, db


@pytest.mark.cuda
@pytest.mark.parametrize("cl", [1, 2, 3, 5, 7, 8])
def test_every_cluster_size(cp, cl):
    """Both kernels at every cluster size on one small ragged shape (3, 40, 20, 20) G=10 -- 4 planes of 100
    float32 vectors a row: blocks of one to four planes, planes split between blocks."""
    name = "float32"
    shape, groups = (3, 40, 20, 20), 10
    item = _dtype(name).itemsize
    assert GC.plan(1600, 400, item, True, 4, force_cl=cl) is not None
    rng = np.random.default_rng(cl)
    dtype = _dtype(name)
    inputs = ((rng.standard_normal(shape) * 1.5 - 2.0).astype(dtype), rng.standard_normal(shape).astype(dtype),
              rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32))
    _check(name, shape, groups, inputs, _direct(cp, inputs, groups, cl))
    no_affine = inputs[:2] + (None, None)
    _check(name, shape, groups, no_affine, _direct(cp, no_affine, groups, cl))


@pytest.mark.cuda
def test_close_to_the_looped_kernels(cp, on, monkeypatch):
    """The same inputs through the route off (norm_fwd looped, row_sums + col_sum + gn_dx) and on."""
    name = "float32"
    rng = np.random.default_rng(3)
    shape, groups = (4, 256, 56, 56), 32
    inputs, got = _run(cp, name, shape, groups, True, rng)
    monkeypatch.setattr(GC, "GN_CLUSTER", False)
    NK._plans.clear()
    g = [None if a is None else cp.asarray(a) for a in inputs]
    y, m, i = B.group_normalization_forward(None, g[0], groups, g[2], g[3], 1e-5)
    dx, ds, db = B.group_normalization_backward(None, g[0], g[1], groups, g[2], m, i)
    assert "norm_fwd" in on and "gn_dx" in on
    tol = TOL[name]
    for a, b in zip(got[:4], (y, m, i, dx)):
        np.testing.assert_allclose(_h(a), _h(b), **tol)
    np.testing.assert_allclose(_h(got[4]), _h(ds), rtol=1e-3, atol=1e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("stash", [True, False])
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_16_bit_rows_never_take_the_clusters(cp, on, monkeypatch, name, stash):
    """16-bit rows past the register paths with the cluster route on: norm_gn16's stash where it is on, the looped
    kernels where it is off -- never gn_fwdc / gn_bwdc (session 18) -- and right against float64."""
    from minidnn.backend.cuda import norm_gn16 as GS
    monkeypatch.setattr(GS, "GN_STASH16", stash)
    NK._plans.clear()
    rng = np.random.default_rng(16)
    shape, groups = (2, 256, 56, 56), 32
    inputs, got = _run(cp, name, shape, groups, True, rng)
    assert not {"gn_fwdc", "gn_bwdc"} & set(on), on
    assert ("gn_fwds" in on) == stash and ("norm_fwd" in on) == (not stash), on
    _check(name, shape, groups, inputs, got)
