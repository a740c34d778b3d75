"""The one-pass batch-norm kernels (backend/cuda/bn_kernels.py: bn_fwd1, bn_bwd1) and the channels-last path.

CPU cases: the launch geometry (vector width, tiles, blocks per tile, grid within the resident blocks, the same
split for the plain and the fused forms), an emulation of the kernels' index walk (every element visited exactly
once, by a thread of its own channel's tile), the launches the primitives make under tools/record_launches.py's fake
CuPy (one per direction), and (where nvcc is installed) that the kernels compile without spills.
GPU cases (marked cuda): every form against the float64 reference over NCHW and channels-last shapes with ragged
tails, N=1, C=1, odd H*W, in float32/float16/bfloat16 (float64 too), one launch per direction, bitwise repeatable
results, the fused forms equal to the unfused composition bit for bit, running statistics and the batch counter.
"""
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import bn_kernels as K

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---- CPU: geometry and the index walk -------------------------------------------------------------------------

H200 = dict(sm_count=132, l2_bytes=50 * 2 ** 20)


@pytest.mark.parametrize("shape, item, arrays, want_vec, want_tiles", [
    ((128, 64, 56 * 56), 4, 1, 4, 64),       # NCHW: a tile per channel, float4 vectors
    ((128, 64, 56 * 56), 2, 3, 8, 64),       # bfloat16: 8 values per vector
    ((256, 16, 1024), 4, 1, 4, 16),
    ((4, 3, 49), 4, 1, 1, 3),                # 7x7 planes do not fill vectors
    ((128 * 56 * 56, 64, 1), 4, 1, 4, 4),    # channels-last: 16-channel tiles of 401408 rows (25.7 MB)
    ((128 * 56 * 56, 64, 1), 2, 3, 8, 4),    # bfloat16 backward: 16-channel tiles (a 32-byte sector per row)
    ((50, 6, 1), 4, 1, 1, 1),                # 6 channels do not fill float4 vectors: one tile of 8 threads
])
def test_onepass_geometry(shape, item, arrays, want_vec, want_tiles):
    outer, c, inner = shape
    vec, tpr, tiles, per, grid = K.onepass_geometry(outer, c, inner, item, arrays, True, **H200)
    assert (vec, tiles) == (want_vec, want_tiles)
    assert grid % per == 0 and grid <= 132 * K.ONEPASS_BPS
    if inner == 1:
        assert tiles == -(-c // (tpr * vec))
    # a misaligned pointer takes scalars
    assert K.onepass_geometry(outer, c, inner, item, arrays, False, **H200)[0] == 1


def test_plain_and_fused_backward_split_alike():
    # the fused forms must round exactly as the plain one on the masked gradient: the split depends on the shape only
    for shape in ((128, 64, 3136, 1), (401408, 64, 1, 1), (7, 5, 33, 1)):
        outer, c, inner, _ = shape
        g = K.onepass_geometry(outer, c, inner, 4, 3, True, **H200)
        assert g == K.onepass_geometry(outer, c, inner, 4, 3, True, **H200)


def _walk(outer, c, inner, vec, tpr, tiles, per, grid):
    """The offsets (element, lane channel) the kernels' slice_of / walk visit, in NumPy (tools: the CUDA code)."""
    inner1 = inner == 1
    tx_n = tpr if inner1 else 1
    nch = vec if inner1 else 1
    rw = 256 // tx_n
    tw = tx_n * nch
    iv = inner // vec if not inner1 else 1
    seen = np.zeros(outer * c * inner, np.int64)
    chan_ok = True
    for b in range(grid):
        s = b % per
        for t in range(b // per, tiles, grid // per):
            m = outer if inner1 else outer * iv
            lo, hi = m * s // per, m * (s + 1) // per
            for tid in range(256):
                first = tid // tx_n if inner1 else tid
                base = t * tw + (tid % tx_n) * vec if inner1 else t * inner
                if inner1 and base >= c:
                    continue
                j = np.arange(lo + first, hi, rw)
                if inner1:
                    off = j * c + base
                else:
                    o = j // iv
                    off = o * c * inner + base + (j - o * iv) * vec
                for e in range(vec):
                    np.add.at(seen, off + e, 1)
                    ch = (off + e) % c if inner1 else ((off + e) // inner) % c
                    want = base + e if inner1 else t
                    chan_ok &= bool(np.all(ch == want))
    return seen, chan_ok


@pytest.mark.parametrize("shape, item", [
    ((2, 3, 20), 4), ((1, 1, 8), 4), ((3, 2, 49), 4), ((5, 7, 1), 4), ((33, 16, 1), 2), ((9, 24, 1), 4),
    ((4, 5, 64), 2), ((1000, 12, 1), 8), ((3, 4, 4096), 4),
])
def test_every_element_is_visited_once_by_its_channel(shape, item):
    outer, c, inner = shape
    for sm in (1, 3, 132):
        geo = K.onepass_geometry(outer, c, inner, item, 1, True, sm, 50 * 2 ** 20)
        seen, chan_ok = _walk(outer, c, inner, *geo)
        assert chan_ok and np.all(seen == 1), (geo, np.unique(seen))
    # rounds: a small L2 share per round forces several rounds of tiles
    geo = K.onepass_geometry(outer, c, inner, item, 1, True, 2, 4096)
    seen, chan_ok = _walk(outer, c, inner, *geo)
    assert chan_ok and np.all(seen == 1), geo


def test_primitives_launch_once_per_direction_under_the_fake_cupy(tmp_path):
    # tools/record_launches.py's fake CuPy (NumPy arrays, nothing compiled or run): the Python plumbing of the
    # one-pass path -- plans, argument packing, outputs in x's layout -- without a GPU
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
dims = []
L._go = lambda fn, d, stream, p: dims.append((str(fn).split("(")[0], d[0]))
import minidnn.backend as B
def cl(a):
    return fakecp.asarray(np.ascontiguousarray(np.asarray(a).transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
x = fakecp.asarray(np.random.default_rng(0).standard_normal((4, 16, 9, 9)).astype(np.float32))
sc, bi = fakecp.asarray(np.ones(16, np.float32)), fakecp.asarray(np.zeros(16, np.float32))
rm, rv = fakecp.asarray(np.zeros(16, np.float32)), fakecp.asarray(np.ones(16, np.float32))
cnt = fakecp.zeros((1,), np.int64)
for xx in (x, cl(x), x.reshape(4, 16 * 81)[:, :16].copy()):
    for rep in range(2):
        n0 = len(dims)
        y, m, i = B.batch_normalization_forward_training(None, "spatial", xx, sc, bi, 0.1, rm, rv, 1e-5, counter=cnt)
        assert B.memory_format(y) is B.memory_format(xx) and y.shape == xx.shape
        dx, ds, db = B.batch_normalization_backward(None, "spatial", xx, y, sc, m, i, 1e-5)
        assert B.memory_format(dx) is B.memory_format(xx)
        y2, m2, i2 = B.batch_normalization_forward_training_ex(None, "spatial", "bn_add_activation", xx, y, sc, bi,
                                                               0.1, rm, rv, 1e-5)
        dx, dz, ds, db = B.batch_normalization_backward_ex(None, "spatial", "bn_add_activation", xx, y2, y, sc, m2,
                                                           i2, 1e-5)
        assert dz is not None and B.memory_format(dz) is B.memory_format(xx)
        k = "bn" if xx.ndim == 4 and xx.flags.c_contiguous else "bnc"     # (R, C) rows: bn_nhwc's kernels
        assert [d[0] for d in dims[n0:]] == [k + "_fwd1", k + "_bwd1", k + "_fwd1", k + "_bwd1"], dims[n0:]
print("OK", dims[:4])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("shape, item, arrays, routes", [
    ((128, 64, 56 * 56), 4, 3, True),          # NCHW: always
    ((128 * 56 * 56, 64, 1), 4, 1, False),     # 16 of 64 channels a round (measured 0.166 vs 0.133 ms two-launch)
    ((128 * 56 * 56, 64, 1), 4, 3, False),     # 8 of 64, and the round outgrows L2 (0.485 vs 0.170 ms)
    ((128 * 56 * 56, 64, 1), 2, 3, False),     # bfloat16 backward (0.242 vs 0.144 ms)
    ((128 * 32 * 32, 16, 1), 4, 1, True),      # whole rows in one round (0.043 vs 0.057 ms)
    ((128 * 32 * 32, 16, 1), 4, 3, True),      # (0.046 vs 0.063 ms)
    ((25088, 64, 1), 4, 3, True),              # the cuda tests' (32, 64, 28, 28) channels-last backward
])
def test_channels_last_takes_the_one_pass_kernels_only_where_a_round_reads_whole_rows(shape, item, arrays, routes):
    outer, c, inner = shape
    vec, tpr, tiles, per, grid = K.onepass_geometry(outer, c, inner, item, arrays, True, **H200)
    assert K.onepass_routes(inner, tiles, per, grid) is routes


def test_split_channels_last_rounds_take_the_two_launch_kernels_under_the_fake_cupy():
    # an L2 of 4 KB splits a channels-last tensor's channels over rounds: the two-launch kernels run (fused forms
    # too); NCHW keeps the one-pass kernels in several rounds
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
names = []
L._go = lambda fn, d, stream, p: names.append(str(fn).split("(")[0])
import minidnn.backend as B
from minidnn.backend.cuda import bn_kernels as K, bn_nhwc, device_facts
device_facts._l2[0] = (4096, False)
bn_nhwc.ENABLED = False      # bn_kernels' own channels-last routing
def cl(a):
    return fakecp.asarray(np.ascontiguousarray(np.asarray(a).transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
x = fakecp.asarray(np.random.default_rng(0).standard_normal((4, 16, 9, 9)).astype(np.float32))
sc, bi = fakecp.asarray(np.ones(16, np.float32)), fakecp.asarray(np.zeros(16, np.float32))
for xx, want in ((cl(x), ["bn_stats", "bn_apply", "bn_grad", "bn_dx"] * 2), (x, ["bn_fwd1", "bn_bwd1"] * 2)):
    n0 = len(names)
    y, m, i = B.batch_normalization_forward_training(None, "spatial", xx, sc, bi, 0.1, None, None, 1e-5)
    B.batch_normalization_backward(None, "spatial", xx, y, sc, m, i, 1e-5)
    y2, m2, i2 = B.batch_normalization_forward_training_ex(None, "spatial", "bn_add_activation", xx, y, sc, bi,
                                                           0.1, None, None, 1e-5)
    dx, dz, ds, db = B.batch_normalization_backward_ex(None, "spatial", "bn_add_activation", xx, y2, y, sc, m2,
                                                       i2, 1e-5)
    assert B.memory_format(y2) is B.memory_format(xx) and B.memory_format(dz) is B.memory_format(xx)
    assert names[n0:] == want, names[n0:]
print("OK")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


_COMPILE = [("float32", 0, 4), ("float32", 1, 4), ("bfloat16", 1, 8), ("float16", 0, 8), ("float64", 1, 2),
            ("float32", 0, 1)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("cfg", _COMPILE, ids=lambda c: f"{c[0]}-inner1{c[1]}-vec{c[2]}")
def test_onepass_kernels_compile_without_spills(tmp_path, cfg):
    name, inner1, vec = cfg
    opts = K._onepass_options(_dtype(name), bool(inner1), vec, 2 if inner1 else 1, relu=1, has_z=1, has_scale=1,
                              has_bias=1)
    defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
    src = tmp_path / "k.cu"
    src.write_text(defines + K.ONEPASS_SOURCE)
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k"),
                        str(src)], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    spills = [line for line in out.splitlines() if "spill stores" in line]
    assert len(spills) == 2 and all(" 0 bytes spill stores" in line for line in spills), out


# ---- GPU -----------------------------------------------------------------------------------------------------

def _dtype(name):
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


class Counted:
    def __enter__(self):
        from minidnn.backend.cuda import launch
        self.launch, self.start = launch, launch.launch_count()
        return self

    def __exit__(self, *exc):
        self.n = self.launch.launch_count() - self.start


TOL = {"float64": dict(rtol=1e-9, atol=1e-9), "float32": dict(rtol=1e-4, atol=1e-4),
       "float16": dict(rtol=1e-2, atol=1e-2), "bfloat16": dict(rtol=4e-2, atol=4e-2)}
SHAPES = [(2, 3, 5, 7), (1, 4, 8, 8), (3, 1, 9, 11), (5, 6, 1, 1), (7, 5), (2, 32, 16, 16), (16, 24, 7, 7),
          (3, 40, 13, 5), (64, 8, 32, 32)]


def _h(a):
    return None if a is None else a.get().astype(np.float64)


def _cl(cp, a):
    """Channels-last copy of host array ``a`` on the GPU (2-D arrays as they are)."""
    if a.ndim < 3:
        return cp.asarray(a)
    perm = (0, *range(2, a.ndim), 1)
    back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return cp.asarray(np.ascontiguousarray(a.transpose(perm))).transpose(back)


def _close(got, want, name, scale=1.0):
    tol = TOL[name]
    np.testing.assert_allclose(_h(got), want, rtol=tol["rtol"], atol=tol["atol"] * scale)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
def test_onepass_against_the_reference(cp, name, shape, layout, ops):
    if layout == "nhwc" and len(shape) < 3:
        pytest.skip("2-D input has one layout")
    dt = _dtype(name)
    pdt = np.float64 if name == "float64" else np.float32
    rng = np.random.default_rng(abs(hash((name, shape, layout, ops))) % 2 ** 32)
    c = shape[1]
    x = (rng.standard_normal(shape) * 1.5 + 3.0).astype(dt)     # |mean| > std: the shifted sums matter
    dy = rng.standard_normal(shape).astype(dt)
    z = rng.standard_normal(shape).astype(dt) if ops == "bn_add_activation" else None
    scale = rng.uniform(0.5, 1.5, c).astype(pdt)
    bias = rng.standard_normal(c).astype(pdt)
    rm, rv = rng.standard_normal(c).astype(pdt), rng.uniform(0.5, 2, c).astype(pdt)
    f, eps = 0.1, 1e-5
    put = (lambda a: None if a is None else _cl(cp, a)) if layout == "nhwc" else \
        (lambda a: None if a is None else cp.asarray(a))
    x64, z64 = x.astype(np.float64), None if z is None else z.astype(np.float64)
    rm64, rv64 = rm.astype(np.float64), rv.astype(np.float64)
    y_ref, m_ref, i_ref = B.batch_normalization_forward_training_ex(None, "spatial", ops, x64, z64, scale.astype(
        np.float64), bias.astype(np.float64), f, rm64, rv64, eps)
    xg, zg, dyg = put(x), put(z), put(dy)
    rmg, rvg, cnt = cp.asarray(rm), cp.asarray(rv), cp.zeros((1,), np.int64)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    with Counted() as c1:
        if ops == "bn":
            y, m, i = B.batch_normalization_forward_training(None, "spatial", xg, sg, bg, f, rmg, rvg, eps,
                                                             counter=cnt)
        else:
            y, m, i = B.batch_normalization_forward_training_ex(None, "spatial", ops, xg, zg, sg, bg, f, rmg, rvg,
                                                                eps)
    assert c1.n == 1, "statistics, running statistics, counter and y in one launch"
    assert B.memory_format(y) is B.memory_format(xg)
    _close(y, y_ref, name, 4)
    np.testing.assert_allclose(_h(m), m_ref, rtol=1e-5 if name != "float64" else 1e-12, atol=1e-5)
    np.testing.assert_allclose(_h(i), i_ref, rtol=1e-4 if name != "float64" else 1e-10)
    np.testing.assert_allclose(_h(rmg), rm64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_h(rvg), rv64, rtol=1e-4, atol=1e-6)
    if ops == "bn":
        assert int(cnt.get()[0]) == 1
    # backward from the GPU's own y (its ReLU mask), against the reference on the same values
    y_used = _h(y)
    if ops == "bn":
        dx_ref, ds_ref, db_ref = B.batch_normalization_backward(None, "spatial", x64, dy.astype(np.float64),
                                                                scale.astype(np.float64), _h(m), _h(i), eps)
        dz_ref = None
    else:
        dx_ref, dz_ref, ds_ref, db_ref = B.batch_normalization_backward_ex(
            None, "spatial", ops, x64, y_used, dy.astype(np.float64), scale.astype(np.float64), _h(m), _h(i), eps)
    with Counted() as c2:
        if ops == "bn":
            dx, ds, db = B.batch_normalization_backward(None, "spatial", xg, dyg, sg, m, i, eps)
            dz = None
        else:
            dx, dz, ds, db = B.batch_normalization_backward_ex(None, "spatial", ops, xg, y, dyg, sg, m, i, eps)
    assert c2.n == 1
    assert B.memory_format(dx) is B.memory_format(xg)
    count = x.size // c
    _close(dx, dx_ref, name, 4)
    np.testing.assert_allclose(_h(db), db_ref, rtol=1e-4, atol=TOL[name]["atol"] * math.sqrt(count))
    np.testing.assert_allclose(_h(ds), ds_ref, rtol=1e-4, atol=TOL[name]["atol"] * math.sqrt(count) * 4)
    if ops == "bn_add_activation":
        np.testing.assert_array_equal(_h(dz), dz_ref)
    else:
        assert dz is None


def _bits(a, signed_zero=True):
    """a's bit patterns; ``signed_zero=False`` reads -0 as +0."""
    b = a.get().view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]).copy()
    if not signed_zero:
        b[b == b.dtype.type(1) << b.dtype.type(8 * a.dtype.itemsize - 1)] = 0
    return b


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape, layout", [((32, 64, 28, 28), "nchw"), ((32, 64, 28, 28), "nhwc"),
                                           ((8, 16, 33, 31), "nchw"), ((8, 24, 33, 31), "nhwc")])
def test_bitwise_repeatable_and_fused_equals_unfused(cp, name, shape, layout):
    dt = _dtype(name)
    rng = np.random.default_rng(1)
    c = shape[1]
    put = (lambda a: _cl(cp, a)) if layout == "nhwc" else cp.asarray
    xg = put(rng.standard_normal(shape).astype(dt))
    zg = put(rng.standard_normal(shape).astype(dt))
    dyg = put(rng.standard_normal(shape).astype(dt))
    sg, bg = cp.asarray(rng.uniform(0.5, 1.5, c).astype(np.float32)), cp.asarray(np.zeros(c, np.float32))
    runs = [B.batch_normalization_forward_training_ex(None, "spatial", "bn_add_activation", xg, zg, sg, bg, 0.1,
                                                      None, None, 1e-5) for _ in range(3)]
    for run in runs[1:]:
        for a, b in zip(run, runs[0]):
            np.testing.assert_array_equal(_bits(a), _bits(b))
    y, m, i = runs[0]
    fused = [B.batch_normalization_backward_ex(None, "spatial", "bn_add_activation", xg, y, dyg, sg, m, i, 1e-5)
             for _ in range(2)]
    # unfused: relu's gradient (dy where y > 0), then the plain backward
    g = B.activation_backward(None, B.ActivationDescriptor("relu"), y, dyg, y)
    plain = B.batch_normalization_backward(None, "spatial", xg, g, sg, m, i, 1e-5)
    for f in fused[1:]:
        for a, b in zip(f, fused[0]):
            np.testing.assert_array_equal(_bits(a), _bits(b))
    dx, dz, ds, db = fused[0]
    # Where y <= 0 the fused dz is +0 (the reference's where(y <= 0, 0, dy), PyTorch's threshold_backward), the
    # unfused relu gradient relu'(y) * dy is -0 for a negative dy: the same value, the sign of zero the only
    # difference.  dx, dscale, dbias do not see it: the sums start at +0 (x + -0 == x + +0 for every x then), and
    # g - mean(g) with mean(g) != 0 is the same either way.
    np.testing.assert_array_equal(_bits(dz), _bits(g, signed_zero=False))
    for a, b in zip((dx, ds, db), plain):
        np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.cuda
def test_onepass_switch_gives_the_two_launch_kernels(cp, monkeypatch):
    rng = np.random.default_rng(2)
    x = cp.asarray(rng.standard_normal((4, 8, 6, 6)).astype(np.float32))
    s, b = cp.ones(8, np.float32), cp.zeros(8, np.float32)
    y1, m1, i1 = B.batch_normalization_forward_training(None, "spatial", x, s, b, 0.1, None, None, 1e-5)
    monkeypatch.setattr(K, "ONEPASS", False)
    with Counted() as c:
        y2, m2, i2 = B.batch_normalization_forward_training(None, "spatial", x, s, b, 0.1, None, None, 1e-5)
    assert c.n == 2
    np.testing.assert_allclose(_h(y1), _h(y2), rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("residual", [False, True])
def test_nn_channels_last_takes_the_fused_kernels(cp, name, residual):
    # issue 12: BatchNorm2d + ReLU (+ residual) on NHWC activations records the fused node and runs the
    # channels-last kernels: one launch forward, one backward for the pair (the ReLU forward is its own kernel)
    import minidnn as mdn
    import minidnn.nn as nn
    import minidnn.nn.functional as F
    dt = getattr(mdn, name)
    mdn.manual_seed(0)
    bn = nn.BatchNorm2d(16).to("cuda")
    x = mdn.randn(8, 16, 10, 10, device="cuda").to(dt).to(memory_format=mdn.channels_last).requires_grad_()
    z = mdn.randn(8, 16, 10, 10, device="cuda").to(dt).to(memory_format=mdn.channels_last)
    with Counted() as cf:
        y = bn(x)
    assert cf.n == 1
    r = F.relu(y + z) if residual else F.relu(y)
    assert r.grad_fn._fn_cls.__name__ == ("BatchNormAddReLU" if residual else "BatchNormReLU")
    assert r.is_contiguous(memory_format=mdn.channels_last)
    with Counted() as cb:
        r.float().sum().backward()
    assert x.grad.is_contiguous(memory_format=mdn.channels_last)
    assert cb.n <= 3, "the cast's and sum's gradients, then one batch-norm backward launch"
