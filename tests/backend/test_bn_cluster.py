"""Batch norm with a channel held on-chip by a thread-block cluster (backend/cuda/bn_cluster.py: bn_fwdc, bn_bwdc).

CPU cases: the plan (cluster size, slots, shared memory) for the benchmark's and the example models' tensors, and
None where a channel does not fit; the kernels' walk emulated in NumPy -- every vector of every channel visited by
exactly one (rank, thread, slot), every slot within the plan's shared memory -- over ragged splits; the launches
under tools/record_launches.py's fake CuPy (grid C x CL, NT threads, the planned shared memory; the switch off gives
bn_fwd1 / bn_bwd1 back; planes that do not fill vectors keep them); nvcc (every form compiles, no spills; the
partials travel by remote stores only, with no closing barrier).
GPU cases (marked cuda): every form (plain, ReLU, add + ReLU; forward with running statistics and the counter,
backward with dscale / dbias / dz) against float64 over shapes with ragged splits, float32/float16/bfloat16/
float64, every cluster size forced; bitwise repeatable; one launch per direction; the large benchmark tensor.
"""
import os
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import bn_cluster as BC
from minidnn.backend.cuda import bn_kernels as K
from minidnn.backend.cuda import bn_nhwc as M

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100_SMEM = (233472, 232448)


# ---- CPU: the plan --------------------------------------------------------------------------------------------

def _buf(mv, cl, arrays):
    return -(-(-(-mv // cl)) // BC.NT) * BC.NT * 16 * arrays


PER_BLOCK = min(H100_SMEM[1], H100_SMEM[0] - 1024) - BC._STATIC
PER_BLOCK2 = H100_SMEM[0] // 2 - 1024 - BC._STATIC


# (outer, C, inner), item, backward -> (CL, slots) or None: ResNet-20 / MobileNet-small tensors at batch 128 take
# the clusters (64 KB or less a block, one wave), the benchmark's large ones keep bn_fwd1 / bn_bwd1
PLANS = [((128, 16, 1024), 4, False, (8, 8)), ((128, 16, 1024), 4, True, None), ((128, 16, 1024), 2, False, (8, 4)),
         ((128, 16, 1024), 2, True, (8, 4)), ((128, 32, 256), 4, False, (4, 4)), ((128, 32, 256), 2, True, (4, 2)),
         ((128, 64, 64), 4, True, (2, 2)), ((128, 128, 64), 2, False, (1, 2)), ((2, 3, 4), 4, False, (1, 1)),
         ((7, 3, 4096), 4, False, (8, 2)),
         ((256, 16, 1024), 4, False, None), ((256, 16, 1024), 2, False, (8, 8)), ((256, 16, 1024), 2, True, None),
         ((128, 64, 3136), 4, False, None), ((128, 64, 3136), 4, True, None), ((128, 64, 3136), 2, False, None),
         ((128, 64, 3136), 2, True, None)]


@pytest.mark.parametrize("shape, item, backward, want", PLANS, ids=str)
def test_plan(shape, item, backward, want):
    outer, c, inner = shape
    p = BC.plan(outer, c, inner, item, backward, 132, H100_SMEM)
    assert (p if p is None else p[:2]) == want
    if p is None:
        return
    cl, slots, dyn = p
    mv = outer * inner * item // 16
    arrays = 2 if backward else 1
    assert slots * BC.NT * cl >= mv and (slots - 1) * BC.NT < -(-mv // cl)
    assert dyn == slots * BC.NT * 16 * arrays <= BC.BLOCK_BYTES
    bps = 2 if dyn <= PER_BLOCK2 else 1
    assert c * cl <= 132 * bps                                      # one wave
    if 2 * c * cl >= 132:                                           # a block for every other SM ...
        assert not (cl > 1 and 2 * c * (cl // 2) >= 132)           # ... from the smallest such cluster
    else:                                                           # else a vector for every thread
        assert cl == 1 or (mv // cl >= BC.NT and (cl == 16 or mv // (2 * cl) < BC.NT))


def test_forced_plans_of_the_large_tensor():
    # (128, 64, 56, 56), forced: a float32 channel is 1.6 MB -- 16 blocks of 104 KB; its backward (x and g, 3.2 MB)
    # 16 blocks of 208 KB; portable sizes only, the forward 8 blocks of 200 KB
    assert BC.plan(128, 64, 3136, 4, False, 132, H100_SMEM, force=16) == (16, 13, 13 * 512 * 16)
    assert BC.plan(128, 64, 3136, 4, True, 132, H100_SMEM, force=16) == (16, 13, 2 * 13 * 512 * 16)
    assert BC.plan(128, 64, 3136, 4, False, 132, H100_SMEM, non_portable=False, force=8) == (8, 25, 25 * 512 * 16)
    assert BC.plan(128, 64, 3136, 4, True, 132, H100_SMEM, non_portable=False, force=8) is None


def test_plan_declines_what_does_not_fit_or_fill_vectors():
    assert BC.plan(512, 64, 3136, 4, True, 132, H100_SMEM) is None          # 12.8 MB of x and g a channel
    assert BC.plan(4, 16, 81, 4, False, 132, H100_SMEM) is None             # planes of 81 floats: no vectors
    assert BC.plan(4, 16, 81, 8, False, 132, H100_SMEM) is None
    assert BC.plan(4, 16, 82, 8, False, 132, H100_SMEM) is not None         # 82 doubles: 41 vectors a plane
    assert BC.plan(256, 16, 1024, 4, False, 132, H100_SMEM) is None         # 128 KB a block: bn_fwd1 streams better
    assert BC.plan(128, 64, 3136, 4, False, 132, H100_SMEM, force=4) is None            # 400 KB a block
    assert BC.plan(128, 64, 3136, 4, False, 132, H100_SMEM, force=8)[:2] == (8, 25)


@pytest.mark.parametrize("outer, inner, vec, cl", [(3, 28, 4, 1), (5, 36, 4, 2), (7, 20, 2, 4), (33, 48, 8, 8),
                                                   (2, 4, 4, 16), (129, 12, 4, 16)])
def test_walk_visits_every_vector_once_within_the_slots(outer, inner, vec, cl):
    # the kernels' Range: block r owns [mv r / CL, mv (r + 1) / CL), thread t visits lo + t + k NT, slot k NT + t
    c_all, nt = 3, BC.NT
    iv, mv = inner // vec, outer * inner // vec
    slots = -(-(-(-mv // cl)) // nt)
    for c in range(c_all):
        seen = np.zeros(outer * c_all * inner, np.int64)
        for r in range(cl):
            lo, hi = mv * r // cl, mv * (r + 1) // cl
            for t in range(nt):
                n = (hi - lo - t - 1) // nt + 1 if lo + t < hi else 0
                assert n <= slots
                for k in range(n):
                    j = lo + t + k * nt
                    o = j // iv
                    off = o * c_all * inner + c * inner + (j - o * iv) * vec
                    seen[off:off + vec] += 1
        own = np.zeros((outer, c_all, inner), bool)
        own[:, c] = True
        assert (seen[own.ravel()] == 1).all() and (seen[~own.ravel()] == 0).all()


def test_fast_div_of_the_vector_index():
    # the kernels split j by iv with bn_kernels' multiply-shift divider: exact below 2**31
    for iv in (1, 3, 7, 49, 784, 12544):
        mul, shr = (int(v) for v in K._divider(iv))
        j = np.array([0, 1, iv - 1, iv, 5 * iv + 2, 2 ** 31 - 1], np.uint64)
        q = (((j * mul) >> 32) + j) >> shr
        assert (q == j // iv).all()


# ---- CPU: the launches under the fake CuPy ----------------------------------------------------------------------

def _fake(code):
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
names = []
L._go = lambda fn, d, stream, p: names.append((str(fn).split("(")[0], d))
import minidnn.backend as B
from minidnn.backend.cuda import bn_nhwc as M, bn_kernels as K, bn_cluster as BC, device_facts as F
F._smem[0] = {H100_SMEM!r}
def run(shape, ops="bn_add_activation"):
    rng = np.random.default_rng(0)
    c = shape[1]
    x = fakecp.asarray(rng.standard_normal(shape).astype(np.float32))
    sc, bi = fakecp.asarray(np.ones(c, np.float32)), fakecp.asarray(np.zeros(c, np.float32))
    rm, rv = fakecp.asarray(np.zeros(c, np.float32)), fakecp.asarray(np.ones(c, np.float32))
    n0 = len(names)
    y, m, i = B.batch_normalization_forward_training_ex(None, "spatial", ops, x, x, sc, bi, 0.1, rm, rv, 1e-5)
    B.batch_normalization_backward_ex(None, "spatial", ops, x, y, x, sc, m, i, 1e-5)
    return names[n0:]
"""
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    return r.stdout


def test_launches_under_the_fake_cupy():
    _fake("""
got = run((16, 64, 16, 16))
fc = BC.plan(16, 64, 256, 4, False, 132, F._smem[0])
bc = BC.plan(16, 64, 256, 4, True, 132, F._smem[0])
want = [("bn_fwdc", (64 * fc[0], 1, 1, BC.NT, 1, 1, fc[2])), ("bn_bwdc", (64 * bc[0], 1, 1, BC.NT, 1, 1, bc[2]))]
assert got == want, got
assert [n for n, _ in run((4, 16, 9, 9))] == ["bn_fwd1", "bn_bwd1"]       # planes of 81 floats: no vectors
BC.ENABLED = False
assert [n for n, _ in run((16, 64, 16, 16))] == ["bn_fwd1", "bn_bwd1"]    # switched off: the kernels before
BC.ENABLED = True
assert [n for n, _ in run((16, 64, 16, 16))][0] == "bn_fwdc"                # and back on
assert [n for n, _ in run((256, 16, 32, 32))] == ["bn_fwd1", "bn_bwd1"]     # large: the one-pass kernels
K._calls.clear(); K._plans.clear()
BC.driver_max_clusters = lambda k, cl, dyn: 0          # a GPU that cannot schedule the cluster: declined
assert [n for n, _ in run((16, 64, 16, 16))] == ["bn_fwd1", "bn_bwd1"]
print("OK")
""")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtype, cl, bps", [(np.float32, 16, 2), (np.float32, 8, 1), (np.float64, 4, 1),
                                            (np.float16, 16, 2), ("bfloat16", 16, 1)], ids=str)
def test_kernels_compile_without_spills(tmp_path, dtype, cl, bps):
    # (the forward at 64 registers -- two blocks of 512 threads an SM -- spills a register or two outside its loops:
    # at most 16 bytes allowed there)
    from minidnn.backend.cuda import launch
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    for backward, name in ((False, "bn_fwdc"), (True, "bn_bwdc")):
        opts = BC._options(np.dtype(dtype), cl, True, True, True, True, bps, backward)
        src = tmp_path / "bnc.cu"
        launch.write_source(str(src), BC.SOURCE, [o[2:] for o in opts if o.startswith("-D")])
        # ptxas builds only the entry these options are for (--entry: its spills are its own, as in the whole module)
        r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", f"-v,--entry={name}", "-o",
                            str(tmp_path / "k.cubin"), str(src)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        lines = r.stderr.splitlines()
        at = next(i for i, line in enumerate(lines) if f"entry function '{name}'" in line)
        spill = next(line for line in lines[at:] if "spill stores" in line)
        stores = int(spill.split("bytes spill stores")[0].split(",")[-1])
        assert stores <= (16 if bps == 2 and not backward else 0), spill


# (kernel, dtype, CL, bps, flags): the default route's builds (two blocks an SM, fused ReLU / add) at the smallest and
# largest cluster, forced ones at one block an SM, float64's, and every variant: the twin, its channels-last shadow,
# DX_NHWC (the channel loop is in every build: its trip count comes from the grid)
_EXCHANGE = [("bn_fwdc", "float32", 1, 2, dict(relu=True, has_z=True, has_bias=True)),
             ("bn_bwdc", "float32", 16, 2, dict(relu=True, has_z=True)),
             ("bn_fwdc", "bfloat16", 16, 1, dict(relu=True, has_z=True, has_bias=True)),
             ("bn_bwdc", "bfloat16", 4, 2, dict(relu=True, dx_nhwc=True)),
             ("bn_bwdc", "float16", 8, 1, dict(relu=True, has_z=True, dx_nhwc=True)),
             ("bn_fwdc", "float16", 4, 2, dict(has_bias=True, twin=True)),
             ("bn_fwdc", "bfloat16", 8, 2, dict(has_bias=True, twin=True, twin_nhwc=True)),
             ("bn_fwdc", "float64", 2, 2, dict(relu=True, has_z=True, has_bias=True)),
             ("bn_bwdc", "float64", 16, 1, dict())]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_exchange_by_remote_stores_only():
    """The partials travel by remote stores (st.shared::cluster) and never by a remote load (session 25, as
    softmax_cluster: its remote loads faulted in some builds).  Barrier phases: a relaxed started-arrive at the kernel's
    start and its wait, once, before the first stores; then a trip's releasing arrive after its stores and the
    acquiring wait before its gather -- two arrives and two waits in the PTX (the loop's body once), none after the
    outputs' first store (no closing wait)."""
    from tests import _nvcc
    units = []
    for name, dtype, cl, bps, f in _EXCHANGE:
        opts = BC._options(_dt(dtype), cl, f.get("relu", False), f.get("has_z", False), True, f.get("has_bias", False),
                           bps, name == "bn_bwdc", f.get("twin", False), f.get("dx_nhwc", False),
                           f.get("twin_nhwc", False))
        units.append((BC.SOURCE, [o[2:] for o in opts if o.startswith("-D")]))
    for (name, dtype, cl, bps, f), r, unit in zip(_EXCHANGE, _nvcc.build(units, ("-std=c++17",), ptx=True), units):
        assert r.returncode == 0, r.stderr
        b, what = r.ptx[name], (name, dtype, cl, bps, f)
        assert ("DX_NHWC=1" in unit[1]) == bool(f.get("dx_nhwc")) and ("TWIN_NHWC=1" in unit[1]) == bool(
            f.get("twin_nhwc")), what
        assert b.count("st.shared::cluster.v2.f64") == 1 and "ld.shared::cluster" not in b, what
        assert b.count("barrier.cluster.arrive.relaxed") == 1 and b.count("barrier.cluster.arrive.release") == 1, what
        assert b.count("barrier.cluster.arrive") == 2 and b.count("barrier.cluster.wait.acquire") == 2, what
        assert b.count("barrier.cluster.wait") == 2, what
        assert (b.index("barrier.cluster.arrive.relaxed") < b.index("barrier.cluster.wait") < b.index("mapa.shared")
                < b.index("st.shared::cluster") < b.index("barrier.cluster.arrive.release")
                < b.rindex("barrier.cluster.wait") < b.index("st.global")), what


# ---- GPU ----------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    cp = _dev.require_cupy()
    if BC._cc(cp.cuda.Device().id) < 90:
        pytest.skip("thread-block clusters need compute capability 9.0")
    return cp


@pytest.fixture
def force(monkeypatch):
    """Force a cluster size (None: the plan's), clearing the call caches before and after."""
    def clear():
        M._calls.clear(); K._calls.clear(); K._plans.clear()       # noqa: E702
    clear()
    monkeypatch.setattr(BC, "ENABLED", True)

    def set_cl(v):
        monkeypatch.setattr(BC, "FORCE_CL", v)
        clear()
    yield set_cl
    clear()


def _dt(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


TOL = {"float64": dict(rtol=1e-10, atol=1e-10), "float32": dict(rtol=2e-4, atol=2e-4),
       "float16": dict(rtol=1e-2, atol=1e-2), "bfloat16": dict(rtol=4e-2, atol=4e-2)}


def _close(got, want, name, scale=1.0):
    tol = TOL[name]
    np.testing.assert_allclose(got.get().astype(np.float64), want, rtol=tol["rtol"], atol=tol["atol"] * scale)


def _run(cp, name, shape, ops, seed):
    dt = _dt(name)
    pdt = np.float64 if name == "float64" else np.float32
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = (rng.standard_normal(shape) * 1.5 + 3.0).astype(dt)
    dy = rng.standard_normal(shape).astype(dt)
    z = rng.standard_normal(shape).astype(dt) if ops == "bn_add_activation" else None
    scale, bias = rng.uniform(0.5, 1.5, c).astype(pdt), rng.standard_normal(c).astype(pdt)
    rm, rv = rng.standard_normal(c).astype(pdt), rng.uniform(0.5, 2, c).astype(pdt)
    f, eps = 0.1, 1e-5
    x64, z64 = x.astype(np.float64), None if z is None else z.astype(np.float64)
    rm64, rv64 = rm.astype(np.float64), rv.astype(np.float64)
    y_ref, m_ref, i_ref = B.batch_normalization_forward_training_ex(
        None, "spatial", ops, x64, z64, scale.astype(np.float64), bias.astype(np.float64), f, rm64, rv64, eps)
    ref_b = B.batch_normalization_backward_ex(None, "spatial", ops, x64, y_ref, dy.astype(np.float64),
                                              scale.astype(np.float64), m_ref, i_ref, eps)
    xg, zg, dyg = cp.asarray(x), None if z is None else cp.asarray(z), cp.asarray(dy)
    rmg, rvg = cp.asarray(rm), cp.asarray(rv)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    from minidnn.backend.cuda import launch
    n0 = launch.launch_count()
    y, m, i = B.batch_normalization_forward_training_ex(None, "spatial", ops, xg, zg, sg, bg, f, rmg, rvg, eps)
    got_b = B.batch_normalization_backward_ex(None, "spatial", ops, xg, y, dyg, sg, m, i, eps)
    cp.cuda.Device().synchronize()
    assert launch.launch_count() - n0 == 2, "one launch per direction"
    return (y, m, i, rmg, rvg, got_b), (y_ref, m_ref, i_ref, rm64, rv64, ref_b)


def _check(got, ref, name, shape, ops):
    y, m, i, rmg, rvg, gb = got
    y_ref, m_ref, i_ref, rm64, rv64, rb = ref
    st = dict(rtol=1e-10, atol=1e-10) if name == "float64" else dict(rtol=1e-4, atol=1e-4)
    _close(y, y_ref, name, 4)
    np.testing.assert_allclose(m.get(), m_ref, **st)
    np.testing.assert_allclose(i.get(), i_ref, rtol=st["rtol"] * 10, atol=st["atol"])
    np.testing.assert_allclose(rmg.get(), rm64, **st)
    np.testing.assert_allclose(rvg.get(), rv64, **st)
    _close(gb[0], rb[0], name, 4 * (float(np.abs(rb[0]).max()) + 1))
    if ops == "bn_add_activation":
        _close(gb[1], rb[1], name, 4)
    per = np.prod(shape) / shape[1]
    red = dict(rtol=1e-9, atol=1e-9 * per) if name == "float64" else dict(rtol=1e-3, atol=1e-3 * per)
    np.testing.assert_allclose(gb[2].get(), rb[2], **red)
    np.testing.assert_allclose(gb[3].get(), rb[3], **red)


# planes that fill vectors; ragged splits over ranks and threads (mv not a multiple of CL or NT); C of 1 to 40
SHAPES = [(5, 3, 16, 20), (3, 40, 12, 12), (33, 8, 12, 12), (2, 64, 4, 4), (128, 4, 8, 9), (7, 1, 36, 36)]


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
def test_against_the_float64_reference(cp, force, name, shape, ops):
    force(None)
    got, ref = _run(cp, name, shape, ops, zlib.crc32(repr((name, shape, ops)).encode()))
    _check(got, ref, name, shape, ops)


@pytest.mark.cuda
@pytest.mark.parametrize("cl", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
def test_every_cluster_size_against_the_float64_reference(cp, force, monkeypatch, cl, name):
    from minidnn.backend.cuda import launch
    force(cl)
    grids = []
    real = launch._go
    monkeypatch.setattr(launch, "_go", lambda fn, d, s, p: (grids.append(d[0]), real(fn, d, s, p)))
    shape = (33, 6, 20, 20)
    got, ref = _run(cp, name, shape, "bn_add_activation", cl)
    _check(got, ref, name, shape, "bn_add_activation")
    assert grids == [6 * cl, 6 * cl]        # the cluster kernels ran, one cluster of CL blocks a channel


@pytest.mark.cuda
@pytest.mark.parametrize("cap", [1, 3, 7])
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
def test_several_channels_a_cluster(cp, force, monkeypatch, cap, name, ops):
    # the channel loop: 1, 3 or 7 clusters over 20 channels (ragged: 20 / 3, 20 / 7)
    from minidnn.backend.cuda import launch
    monkeypatch.setattr(BC, "CLUSTERS_CAP", cap)
    force(2)
    grids = []
    real = launch._go
    monkeypatch.setattr(launch, "_go", lambda fn, d, s, p: (grids.append(d[0]), real(fn, d, s, p)))
    shape = (9, 20, 12, 20)
    got, ref = _run(cp, name, shape, ops, cap)
    _check(got, ref, name, shape, ops)
    assert grids == [2 * cap, 2 * cap]


@pytest.mark.cuda
@pytest.mark.parametrize("cl", [1, 8, 16])
def test_the_driver_schedules_the_clusters(cp, cl):
    # what the route asks the driver before taking a cluster size: a positive count on this GPU
    k = BC._kernel("bn_fwdc", np.dtype(np.float32), cl, True, True, True, True, 2, cp.cuda.Device().id)
    n = BC.driver_max_clusters(k, cl, 64 * 1024)
    assert n is not None and n > 0


@pytest.mark.cuda
def test_bitwise_repeatable(cp, force):
    force(None)
    outs = []
    for _ in range(2):
        got, _ref = _run(cp, "float32", (64, 16, 24, 24), "bn_activation", 5)
        outs.append([a.get() for a in (got[0], got[1], got[2], got[5][0], got[5][2], got[5][3])])
    for a, b in zip(*outs):
        assert np.array_equal(a, b)


@pytest.mark.cuda
def test_close_to_the_kernels_before_it(cp, force, monkeypatch):
    force(None)
    on, _ = _run(cp, "float32", (32, 24, 28, 28), "bn_add_activation", 11)
    monkeypatch.setattr(BC, "ENABLED", False)
    K._calls.clear(); K._plans.clear()      # noqa: E702
    off, _ = _run(cp, "float32", (32, 24, 28, 28), "bn_add_activation", 11)
    for a, b in ((on[0], off[0]), (on[1], off[1]), (on[2], off[2]), (on[5][0], off[5][0]), (on[5][1], off[5][1])):
        np.testing.assert_allclose(a.get(), b.get(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(on[5][2].get(), off[5][2].get(), rtol=1e-5, atol=1e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_activation"])
def test_large_tensor_against_the_float64_reference(cp, force, name, ops):
    # the benchmark's (128, 64, 56, 56) forced onto 16-block clusters: 100-200 KB of shared memory a block
    force(16)
    shape = (128, 64, 56, 56)
    got, ref = _run(cp, name, shape, ops, 3)
    _check(got, ref, name, shape, ops)
