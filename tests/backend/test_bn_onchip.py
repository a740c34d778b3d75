"""The batch-norm one-launch kernels' on-chip copy (CACHE: bn_kernels bn_fwd1 / bn_bwd1 for NCHW, bn_nhwc bnc_fwd1 /
bnc_bwd1 for channels-last; MINIDNN_BN_ONCHIP=0 switches it off).

CPU cases: the kernels' sequence walk emulated in NumPy -- the reduction pass visits each thread's vectors in walk()'s
order and keeps the first ks in its own shared-memory slots; the elementwise pass visits every element exactly once,
reading each cached slot back at the element that filled it -- over ragged rows and planes, several grids and slot
counts; the slot arithmetic and the rounds of the NCHW geometry (balanced, within shared memory plus the L2 share, the
same split for the plain and fused backward); the launches under tools/record_launches.py's fake CuPy (dynamic shared
memory = slots x slot bytes, ks as the last argument; the switch off gives the kernels before it); nvcc (no spills).
GPU cases (marked cuda): every form against float64 with the copy holding none, part or all of each thread's walk
(SLOTS_CAP), shapes whose walks have tails (odd N*H*W, slices not a multiple of the slots), float32/float16/bfloat16,
forward, backward, fused ReLU and add + ReLU, running statistics; channels-last bit-identical to the kernels without
the copy (same grid, same order of the sums); one launch per direction.
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
from tests._nvcc import pick

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100_SMEM = (233472, 232448)       # MaxSharedMemoryPerMultiprocessor, MaxSharedMemoryPerBlockOptin


# ---- CPU: the sequence walk with the copy ------------------------------------------------------------------------

def _replay(seqs, n_elems, ks):
    """seqs: per thread, the element offsets of its k-th vector (-1: none).  Pass 1 fills slot k < ks with its
    offset; pass 2 visits k = n-1 .. kc (memory) then 0 .. kc-1 (slot).  Returns the visit counts of pass 2 and whether
    every slot read gave its own element."""
    seen = np.zeros(n_elems, np.int64)
    ok = True
    for seq in seqs:
        n = len(seq)
        kc = min(ks, n)
        slots = {k: seq[k] for k in range(n) if k < kc and seq[k] >= 0}
        order = list(range(n - 1, kc - 1, -1)) + list(range(kc))
        assert sorted(order) == list(range(n))
        for k in order:
            off = seq[k]
            if off < 0:
                continue
            if k < kc:
                ok &= slots[k] == off
            seen[off] += 1
    return seen, ok


def _nhwc_seqs(rows, c, vec, grid):
    """Per (block, chunk, thread): the offsets seq_off gives for k < seq_len (the CUDA functions, literally)."""
    cv, chunks, tx_n, rb, ng = M.geometry(rows, c, vec)
    out = []
    for y in range(chunks):
        for b in range(grid):
            n = (ng - 1 - b) // grid + 1 if b < ng else 0
            for tid in range(M.THREADS):
                tx, ty = tid % tx_n, tid // tx_n
                vcol = y * tx_n + tx
                if not (ty < rb and vcol < cv):
                    continue
                seq = []
                for k in range(n):
                    r = (b + k * grid) * rb + ty
                    seq.append((r * cv + vcol) * vec if r < rows else -1)
                out.append(seq)
    return out


@pytest.mark.parametrize("rows, c, item", [(33 * 31, 24, 4), (5 * 9, 3, 4), (1000, 64, 2), (300, 1040, 4),
                                           (17, 6, 2), (7 * 7 * 3, 64, 4)], ids=str)
@pytest.mark.parametrize("ks", [0, 1, 3, 1000])
def test_nhwc_copy_visits_every_element_once_and_reads_back_its_own(rows, c, item, ks):
    vec = M.vec_width(c, item)
    cv, chunks, tx, rb, ng = M.geometry(rows, c, vec)
    for grid in sorted({1, 3, M.reduce_grid(ng, chunks, 264)}):
        seqs = _nhwc_seqs(rows, c, vec, grid)
        seen, ok = _replay(seqs, rows * c, ks)
        assert ok
        # each vector covers vec consecutive channels of its row
        full = np.zeros(rows * c, np.int64)
        for e in range(vec):
            full[np.flatnonzero(seen) + e] += seen[np.flatnonzero(seen)]
        assert np.all(full == 1), (grid, ks)
        # pass 1's order is walk<false>'s: group b, b + G, ... (the sums are those of the kernels without the copy)
        for seq in seqs[:3]:
            offs = [o for o in seq if o >= 0]
            assert offs == sorted(offs)


def _nchw_seqs(outer, c, inner, vec, per, grid):
    """Per (block, tile, thread): the offsets seq_walk gives (slice_of, slice_len, the kernels' formula)."""
    iv = inner // vec
    out = []
    tiles = c
    for b in range(grid):
        s = b % per
        for t in range(b // per, tiles, grid // per):
            m = outer * iv
            lo, hi = m * s // per, m * (s + 1) // per
            for tid in range(K.THREADS):
                j0 = lo + tid
                n = (hi - j0 - 1) // K.THREADS + 1 if j0 < hi else 0
                seq = []
                for k in range(n):
                    jj = j0 + k * K.THREADS
                    o = jj // iv
                    seq.append((o * c) * inner + t * inner + (jj - o * iv) * vec)
                out.append(seq)
    return out


@pytest.mark.parametrize("shape, item", [((3, 5, 7 * 9), 4), ((4, 3, 64), 4), ((9, 2, 36), 2), ((2, 7, 1000), 4),
                                         ((5, 1, 33), 4)], ids=str)
@pytest.mark.parametrize("ks", [0, 2, 1000])
def test_nchw_copy_visits_every_element_once_and_reads_back_its_own(shape, item, ks):
    outer, c, inner = shape
    for cache in (0, 4096, 10 ** 6):
        vec, tpr, tiles, per, grid = K.onepass_geometry(outer, c, inner, item, 1, True, 4, 2 ** 16,
                                                        cache_block_bytes=cache)
        for p in sorted({per, 1, 3}):
            g = (grid // per) * p
            seen, ok = _replay(_nchw_seqs(outer, c, inner, vec, p, g), outer * c * inner, ks)
            assert ok
            full = np.zeros_like(seen)
            nz = np.flatnonzero(seen)
            for e in range(vec):
                full[nz + e] += seen[nz]
            assert np.all(full == 1), (cache, p)


def test_cache_slots_split_the_sms_shared_memory():
    # H100: 228 KiB per SM, 2 blocks, 1 KiB reserved each, 12 KiB static: (115712 - 12304) // 4096 = 25 float4 slots
    assert M.cache_slots(*H100_SMEM, 12304, 2, 4096) == 25
    assert M.cache_slots(*H100_SMEM, 12304, 2, 8192) == 12
    assert M.cache_slots(*H100_SMEM, 12304, 1, 4096) == (232448 - 12304) // 4096     # the per-block limit binds
    assert M.cache_slots(0, 0, 12304, 2, 4096) == 0                                  # unknown device: no copy
    assert M.cache_slots(*H100_SMEM, 200000, 2, 4096) == 0


@pytest.mark.parametrize("shape, item, arrays", [((128, 64, 3136), 4, 1), ((128, 64, 3136), 4, 2),
                                                 ((128, 64, 3136), 2, 1), ((128, 64, 3136), 2, 2),
                                                 ((128, 16, 1024), 4, 1), ((32, 256, 196), 4, 2),
                                                 ((7, 5, 33), 4, 2)], ids=str)
def test_nchw_rounds_take_shared_memory_plus_the_l2_share(shape, item, arrays):
    outer, c, inner = shape
    sms, l2 = 132, 50 * 2 ** 20
    slot = 256 * 16 * arrays
    ks_max = M.cache_slots(*H100_SMEM, 6160, 2, slot)
    vec, tpr, tiles, per, grid = K.onepass_geometry(outer, c, inner, item, arrays, True, sms, l2,
                                                    cache_block_bytes=ks_max * slot)
    rounds_of = grid // per
    rounds = -(-tiles // rounds_of)
    assert grid <= sms * K.ONEPASS_BPS and grid % per == 0
    assert rounds_of == -(-tiles // rounds)           # balanced: no short last round beyond one tile
    budget = l2 * K._ROUND_SHARE_ONCHIP + sms * K.ONEPASS_BPS * ks_max * slot
    assert rounds_of == 1 or rounds_of * outer * inner * item * arrays <= budget
    old = K.onepass_geometry(outer, c, inner, item, arrays, True, sms, l2)
    assert rounds <= -(-tiles // (old[4] // old[3]))     # never more rounds than without the copy
    ks = K.onchip_slots(outer, inner, vec, per, ks_max)
    assert 0 <= ks <= ks_max
    assert ks == ks_max or ks * 256 >= -(-outer * (inner // vec) // per)


def test_the_large_float32_tensor_rounds():
    # (128, 64, 56, 56) float32 on an H100 with the default half of L2 (the share the H100 sweep chose): forward
    # 2 rounds of 32 channels (8 blocks each, 256 of the 264 resident), backward (x and g kept) 4 rounds of 16;
    # bfloat16 forward one round
    assert K._ROUND_SHARE_ONCHIP == 0.5 or "MINIDNN_BN_L2_SHARE" in os.environ
    sms, l2 = 132, 50 * 2 ** 20
    f = K.onepass_geometry(128, 64, 3136, 4, 1, True, sms, l2, cache_block_bytes=26 * 4096)
    assert (f[4] // f[3], f[3]) == (32, 8)
    b = K.onepass_geometry(128, 64, 3136, 4, 2, True, sms, l2, cache_block_bytes=13 * 8192)
    assert -(-64 // (b[4] // b[3])) == 4
    h = K.onepass_geometry(128, 64, 3136, 2, 1, True, sms, l2, cache_block_bytes=26 * 4096)
    assert h[4] // h[3] == 64


def test_the_backward_share_moves_only_the_backward(monkeypatch):
    # MINIDNN_BN_L2_SHARE_BWD: the backward's rounds by its own share (x and dy a round), the forward's unmoved;
    # 0.85 gives the large float32 backward 3 rounds of 22 channels over all 264 resident blocks
    monkeypatch.setattr(K, "_ROUND_SHARE_ONCHIP", 0.5)
    monkeypatch.setattr(K, "_ROUND_SHARE_ONCHIP_BWD", None)
    f0, b0 = K.onepass_plan(128, 64, 3136, 4, False), K.onepass_plan(128, 64, 3136, 4, True)
    assert (f0["rounds"], b0["rounds"], b0["grid"]) == (2, 4, 256)
    monkeypatch.setattr(K, "_ROUND_SHARE_ONCHIP_BWD", 0.85)
    assert K.onepass_plan(128, 64, 3136, 4, False) == f0
    b1 = K.onepass_plan(128, 64, 3136, 4, True)
    assert (b1["rounds"], b1["per"], b1["grid"], b1["ks"]) == (3, 12, 264, 13)
    # the rule, not a table: the round's L2 part (x and dy beyond the slots) within the share where it splits
    l2 = 50 * 2 ** 20
    per_round = b1["grid"] // b1["per"]
    assert per_round * 128 * 3136 * 4 * 2 <= l2 * 0.85 + 132 * K.ONEPASS_BPS * b1["dyn"]
    monkeypatch.setattr(K, "_ROUND_SHARE_ONCHIP_BWD", 0.5)
    assert K.onepass_plan(128, 64, 3136, 4, True) == b0


def test_the_small_cnn_bfloat16_plan_is_the_float32_one_of_the_same_bytes():
    # bench/kernels_gpu.py's (256, 16, 32, 32) bfloat16 rows ran 3-10x their float32 ones once on an H100 (torch's
    # forward row beside them 8x too); the planner gives them the launch (128, 16, 32, 32) float32 runs at 0.012 ms
    # (same bytes a channel): one round, the whole grid resident, every thread's walk (8 vectors) on chip
    bf = K.onepass_plan(256, 16, 1024, 2, True)
    f32 = K.onepass_plan(128, 16, 1024, 4, True)
    assert {k: bf[k] for k in ("tiles", "per", "grid", "rounds", "ks", "dyn")} == \
        {k: f32[k] for k in ("tiles", "per", "grid", "rounds", "ks", "dyn")}
    assert bf == dict(vec=8, tiles=16, per=16, grid=256, rounds=1, ks=8, dyn=65536)
    assert bf["grid"] <= 132 * K.ONEPASS_BPS
    assert bf["ks"] * 256 * bf["vec"] * bf["per"] >= 256 * 1024      # the whole channel in shared memory
    assert K.onepass_plan(256, 16, 1024, 2, False)["rounds"] == 1


# ---- CPU: the launches under the fake CuPy ----------------------------------------------------------------------

def _fake(code):
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
names = []
L._go = lambda fn, d, stream, p: names.append((str(fn).split("(")[0], d, str(fn), p))
from minidnn.backend.cuda import bn_nhwc as M, bn_kernels as K, bn_cluster as BC, device_facts as DF
DF._smem[0] = {H100_SMEM!r}
BC.ENABLED = False      # the kernels before the cluster ones (tests/backend/test_bn_cluster.py has those)
def cl(a):
    perm = (0, *range(2, a.ndim), 1); back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return fakecp.asarray(np.ascontiguousarray(a.transpose(perm))).transpose(back)
"""
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    return r.stdout


def test_launches_carry_the_copy_and_the_switch_restores_the_kernels_before_it_under_the_fake_cupy():
    _fake("""
rng = np.random.default_rng(0)
c = 16
for layout, fwd, bwd in (("nchw", "bn_fwd1", "bn_bwd1"), ("nhwc", "bnc_fwd1", "bnc_bwd1")):
    for onchip in (True, False):
        K.ONCHIP = M.ONCHIP = onchip
        x = rng.standard_normal((8, c, 8, 8)).astype(np.float32)
        xx = cl(x) if layout == "nhwc" else fakecp.asarray(x)
        sc, bi = fakecp.asarray(np.ones(c, np.float32)), fakecp.asarray(np.zeros(c, np.float32))
        for rep in range(2):
            n0 = len(names)
            y, m, i = K.forward_training(xx, sc, bi, 0.1, None, None, 1e-5)
            dx, dz, ds, db = K.backward(xx, y, sc, m, i, y=y, want_dz=True)
            got = names[n0:]
            assert [g[0] for g in got] == [fwd, bwd], got
            for (name, dims, full, p), slot in zip(got, (256 * 16, 2 * 256 * 16)):
                assert ("-DCACHE=1" in full) is onchip, full
                if onchip:
                    ks = dims[6] // slot
                    assert dims[6] % slot == 0 and ks >= 1, dims
                else:
                    assert dims[6] == 0
print("OK")
""")


def test_onepass_plan_is_what_the_launches_settle_under_the_fake_cupy():
    _fake("""
rng = np.random.default_rng(2)
for shape in ((128, 16, 32, 32), (256, 16, 32, 32), (4, 64, 56, 56), (3, 40, 13, 21)):
    c = shape[1]
    x = fakecp.asarray(rng.standard_normal(shape).astype(np.float32))
    sc, bi = fakecp.asarray(np.ones(c, np.float32)), fakecp.asarray(np.zeros(c, np.float32))
    n0 = len(names)
    y, m, i = K.forward_training(x, sc, bi, 0.1, None, None, 1e-5)
    K.backward(x, y, sc, m, i)
    for (name, dims, full, p), bwd in zip(names[n0:], (False, True)):
        want = K.onepass_plan(shape[0], c, int(np.prod(shape[2:])), 4, bwd, 0)
        assert (dims[0], dims[6]) == (want["grid"], want["dyn"]), (shape, name, dims, want)
# the backward's own L2 share (3 rounds over the whole grid where the default takes 4 over 256 blocks)
K._ROUND_SHARE_ONCHIP_BWD = 0.85
x = fakecp.asarray(np.ones((128, 64, 56, 56), np.float32))
sc = fakecp.asarray(np.ones(64, np.float32))
m, i = fakecp.asarray(np.zeros(64, np.float32)), fakecp.asarray(np.ones(64, np.float32))
n0 = len(names)
K.backward(x, x, sc, m, i)
(name, dims, full, p), = names[n0:]
want = K.onepass_plan(128, 64, 3136, 4, True, 0)
assert want["rounds"] == 3 and (dims[0], dims[6]) == (want["grid"], want["dyn"]) == (264, 13 * 8192), (dims, want)
print("OK")
""")


def test_slots_cap_bounds_the_copy_under_the_fake_cupy():
    _fake("""
rng = np.random.default_rng(1)
c = 8
x = fakecp.asarray(rng.standard_normal((16, c, 32, 32)).astype(np.float32))
xl = cl(rng.standard_normal((16, c, 32, 32)).astype(np.float32))
for cap, want in ((None, None), (2, 2), (0, 0)):
    M.SLOTS_CAP = cap
    M._calls.clear(); K._calls.clear(); K._plans.clear()
    for xx in (x, xl):
        n0 = len(names)
        K.forward_training(xx, None, None, 0.1, None, None, 1e-5)
        name, dims, full, p = names[n0]
        ks = dims[6] // (256 * 16)
        assert (ks >= 1 if want is None else ks == want), (cap, name, dims)
print("OK")
""")


# ---- nvcc --------------------------------------------------------------------------------------------------------

_COMPILE = [("float32", 4), ("bfloat16", 8), ("float16", 8), ("float64", 2), ("float32", 1)]


def _dt(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


def _nvcc(tmp_path, src):
    f = tmp_path / "k.cu"
    f.write_text(src)
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k"),
                        str(f)], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    spills = [line for line in out.splitlines() if "spill stores" in line]
    assert spills and all(" 0 bytes spill stores" in line for line in spills), out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, vec", pick(_COMPILE, 3), ids=str)
def test_copy_kernels_compile_without_spills(tmp_path, name, vec):
    full = dict(relu=1, has_z=1, has_scale=1, has_bias=1, cache=1)
    opts = K._onepass_options(_dt(name), False, vec, 1, **full)
    defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
    _nvcc(tmp_path, defines + K.ONEPASS_SOURCE)
    _nvcc(tmp_path, M.source_for_nvcc(_dt(name), vec, **full))


# ---- GPU -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


@pytest.fixture
def cap(monkeypatch):
    """Set the slot cap (clearing the call caches before and after)."""
    def clear():
        M._calls.clear(); K._calls.clear(); K._plans.clear()       # noqa: E702
    clear()
    monkeypatch.setattr(BC, "ENABLED", False)     # the kernels before the cluster ones (test_bn_cluster.py)

    def set_cap(v):
        monkeypatch.setattr(M, "SLOTS_CAP", v)
        clear()
    yield set_cap
    clear()


TOL = {"float32": dict(rtol=2e-4, atol=2e-4), "float16": dict(rtol=1e-2, atol=1e-2),
       "bfloat16": dict(rtol=4e-2, atol=4e-2)}
# odd N*H*W, planes that fill vectors or not, slices that are not multiples of the slots, several rounds (C = 40)
SHAPES = [(5, 3, 17, 19), (3, 40, 13, 21), (33, 8, 12, 12), (2, 64, 31, 31), (128, 4, 7, 9)]


def _put(cp, a, layout):
    if a is None:
        return None
    if layout == "nchw":
        return cp.asarray(a)
    perm, back = (0, 2, 3, 1), (0, 3, 1, 2)
    return cp.asarray(np.ascontiguousarray(a.transpose(perm))).transpose(back)


def _close(got, want, name, scale=1.0):
    tol = TOL[name]
    np.testing.assert_allclose(got.get().astype(np.float64), want, rtol=tol["rtol"], atol=tol["atol"] * scale)


def _run(cp, name, shape, layout, ops, seed):
    dt = _dt(name)
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = (rng.standard_normal(shape) * 1.5 + 3.0).astype(dt)
    dy = rng.standard_normal(shape).astype(dt)
    z = rng.standard_normal(shape).astype(dt) if ops == "bn_add_activation" else None
    scale, bias = rng.uniform(0.5, 1.5, c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    rm, rv = rng.standard_normal(c).astype(np.float32), rng.uniform(0.5, 2, c).astype(np.float32)
    f, eps = 0.1, 1e-5
    x64, z64 = x.astype(np.float64), None if z is None else z.astype(np.float64)
    rm64, rv64 = rm.astype(np.float64), rv.astype(np.float64)
    y_ref, m_ref, i_ref = B.batch_normalization_forward_training_ex(
        None, "spatial", ops, x64, z64, scale.astype(np.float64), bias.astype(np.float64), f, rm64, rv64, eps)
    ref_b = B.batch_normalization_backward_ex(None, "spatial", ops, x64, y_ref, dy.astype(np.float64),
                                              scale.astype(np.float64), m_ref, i_ref, eps)
    xg, zg, dyg = _put(cp, x, layout), _put(cp, z, layout), _put(cp, dy, layout)
    rmg, rvg = cp.asarray(rm), cp.asarray(rv)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    from minidnn.backend.cuda import launch
    n0 = launch.launch_count()
    y, m, i = B.batch_normalization_forward_training_ex(None, "spatial", ops, xg, zg, sg, bg, f, rmg, rvg, eps)
    got_b = B.batch_normalization_backward_ex(None, "spatial", ops, xg, y, dyg, sg, m, i, eps)
    cp.cuda.Device().synchronize()
    assert launch.launch_count() - n0 == 2, "one launch per direction"
    return (y, m, i, rmg, rvg, got_b), (y_ref, m_ref, i_ref, rm64, rv64, ref_b)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
@pytest.mark.parametrize("slots", [0, 2, None])
def test_against_the_float64_reference_with_the_copy_holding_none_part_or_all(cp, cap, name, shape, layout, ops,
                                                                             slots):
    cap(slots)
    got, ref = _run(cp, name, shape, layout, ops, zlib.crc32(repr((name, shape, layout, ops)).encode()))
    y, m, i, rmg, rvg, gb = got
    y_ref, m_ref, i_ref, rm64, rv64, rb = ref
    assert B.memory_format(y) is B.memory_format(_put(cp, np.zeros((1, shape[1], 2, 2), np.float32), layout))
    _close(y, y_ref, name, 4)
    np.testing.assert_allclose(m.get(), m_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(i.get(), i_ref, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(rmg.get(), rm64, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rvg.get(), rv64, rtol=1e-4, atol=1e-4)
    gscale = float(np.abs(rb[0]).max()) + 1
    _close(gb[0], rb[0], name, 4 * gscale)
    if ops == "bn_add_activation":
        _close(gb[1], rb[1], name, 4)
    np.testing.assert_allclose(gb[2].get(), rb[2], rtol=1e-3, atol=1e-3 * np.prod(shape) / shape[1])
    np.testing.assert_allclose(gb[3].get(), rb[3], rtol=1e-3, atol=1e-3 * np.prod(shape) / shape[1])


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
def test_large_tensor_against_the_float64_reference(cp, cap, name, ops):
    # (16, 64, 56, 56): walks longer than the slots (the copy holds part of each), several NCHW rounds
    cap(None)
    for layout in ("nchw", "nhwc"):
        got, ref = _run(cp, name, (16, 64, 56, 56), layout, ops, 7)
        _close(got[0], ref[0], name, 4)
        _close(got[5][0], ref[5][0], name, 4 * (float(np.abs(ref[5][0]).max()) + 1))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(5, 3, 17, 19), (33, 8, 12, 12), (16, 64, 28, 28)], ids=str)
@pytest.mark.parametrize("ops", ["bn", "bn_add_activation"])
def test_channels_last_is_bit_identical_to_the_kernels_without_the_copy(cp, cap, monkeypatch, name, shape, ops):
    outs = []
    for onchip in (False, True):
        monkeypatch.setattr(M, "ONCHIP", onchip)
        cap(2 if shape[0] == 33 else None)
        got, _ = _run(cp, name, shape, "nhwc", ops, 11)
        outs.append([a.get() for a in (got[0], got[1], got[2], got[5][0], got[5][2], got[5][3])])
    for a, b in zip(*outs):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, vec, tpr", [("float32", 4, 4), ("float32", 4, 8), ("bfloat16", 8, 4),
                                            ("float32", 1, 32)], ids=str)
def test_channels_last_copy_kernels_compile_without_spills(tmp_path, name, vec, tpr):
    full = dict(relu=1, has_z=1, has_scale=1, has_bias=1, cache=1)
    opts = K._onepass_options(_dt(name), True, vec, tpr, **full)
    defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
    _nvcc(tmp_path, defines + K.ONEPASS_SOURCE)


@pytest.mark.cuda
def test_nchw_switch_off_runs_the_kernels_before_the_copy(cp, cap, monkeypatch):
    from minidnn.backend.cuda import launch
    outs = []
    for onchip in (False, True):
        monkeypatch.setattr(K, "ONCHIP", onchip)
        cap(None)
        got, ref = _run(cp, "float32", (9, 7, 16, 16), "nchw", "bn_activation", 3)
        _close(got[0], ref[0], "float32", 4)
        outs.append(got[0].get())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    assert launch.launch_count() > 0


@pytest.mark.cuda
def test_backward_share_three_rounds_against_the_float64_reference(cp, cap, monkeypatch):
    # the bench's bL2=0.85 candidate: (128, 64, 56, 56) float32 backward in 3 rounds of 22, 22 and 20 channels over
    # the whole grid (an H100: 264 blocks, 12 a channel); the forward keeps its default rounds
    monkeypatch.setattr(K, "_ROUND_SHARE_ONCHIP_BWD", 0.85)
    cap(None)
    shape = (128, 64, 56, 56)
    plan = K.onepass_plan(128, 64, 3136, 4, True, cp.cuda.Device().id)
    assert plan["rounds"] >= 2 and plan["ks"] > 0
    got, ref = _run(cp, "float32", shape, "nchw", "bn_activation", 13)
    gb, rb = got[5], ref[5]
    _close(gb[0], rb[0], "float32", 4 * (float(np.abs(rb[0]).max()) + 1))
    np.testing.assert_allclose(gb[2].get(), rb[2], rtol=1e-3, atol=1e-3 * np.prod(shape) / shape[1])
    np.testing.assert_allclose(gb[3].get(), rb[3], rtol=1e-3, atol=1e-3 * np.prod(shape) / shape[1])
