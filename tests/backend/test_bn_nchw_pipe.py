"""The pipelined NCHW batch-norm kernels (bn_kernels PIPE_SOURCE: bn_fwd1p / bn_bwd1p, MINIDNN_BN_PIPE; session 7).

A block keeps two tiles in flight: it reads tile t_k (statistics pass, the first ks vectors into half k & 1 of its
shared memory), arrives at t_k's meeting without waiting, then waits for t_{k-1} and writes it.
CPU cases: the geometry (two sets in flight within a bn_fwd1 round's budget, half the slots a tile, one set -> the
kernels before it, ResNet-20's shapes unchanged); the kernel's loop emulated in NumPy (every element written once,
every cached slot read back from its own half before a later tile refills that half); the meetings simulated under
every block's order of arrivals and waits (no deadlock with all blocks resident); the launches under
tools/record_launches.py's fake CuPy (the planned grid and shared memory; MINIDNN_BN_PIPE=0 gives bn_fwd1 / bn_bwd1);
nvcc (no spills).  GPU cases (marked cuda): against the float64 reference with the sets forced small (a 64 KiB L2,
2-4 slots: many sets, blocks holding different numbers of tiles, tails), float32/float16/bfloat16, plain and fused
forms, running statistics and the step counter; bit-identical to bn_fwd1 / bn_bwd1 where both split a channel alike;
the bench's (128, 64, 56, 56) float32 and bfloat16.
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
from minidnn.backend.cuda import bn_kernels as K
from minidnn.backend.cuda import bn_nhwc as M

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100_SMEM = (233472, 232448)
SMS, L2 = 132, 50 * 2 ** 20


def _slots(arrays, vec=4, item=4):
    slot = 256 * vec * item * arrays
    return slot, M.cache_slots(*H100_SMEM, 6160, 2, slot)


# ---- CPU: geometry -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, item, arrays", [((128, 64, 3136), 4, 1), ((128, 64, 3136), 4, 2),
                                                 ((128, 64, 3136), 2, 1), ((128, 64, 3136), 2, 2),
                                                 ((256, 16, 1024), 4, 2), ((64, 256, 784), 4, 1)], ids=str)
def test_two_sets_in_flight_fit_a_round_budget(shape, item, arrays):
    outer, c, inner = shape
    slot, ks_max = _slots(arrays, 16 // item, item)
    share = K._ROUND_SHARE_ONCHIP
    vec, tiles, per, grid, ks = K.pipe_geometry(outer, c, inner, item, arrays, True, SMS, L2, slot, ks_max, share)
    set_of = grid // per
    assert grid <= SMS * K.ONEPASS_BPS and grid % per == 0 and tiles == c
    assert -(-tiles // set_of) >= 2                                  # a block holds two tiles at least
    assert 1 <= ks <= ks_max // 2 and 2 * ks * slot <= ks_max * slot  # both halves in the block's shared memory
    # two sets' data within a bn_fwd1 round's budget (the L2 share plus the grid's slots)
    assert set_of == 1 or 2 * set_of * outer * inner * item * arrays <= L2 * share + SMS * K.ONEPASS_BPS * ks_max * slot
    assert ks == ks_max // 2 or ks * 256 >= -(-outer * (inner // vec) // per)


@pytest.mark.parametrize("shape, item", [((128, 16, 1024), 4), ((128, 16, 1024), 2), ((128, 32, 256), 2),
                                         ((128, 64, 64), 2), ((128, 64, 64), 4), ((16, 64, 3136), 4)], ids=str)
@pytest.mark.parametrize("backward", [False, True])
def test_data_within_one_set_keep_the_kernels_before_it(shape, item, backward):
    # ResNet-20's tensors (and anything whose data fit half a round): no pipelined plan, the plan of PIPE off
    outer, c, inner = shape
    plan = K.onepass_plan(outer, c, inner, item, backward)
    assert plan["pipe"] is False
    old = K.PIPE
    try:
        K.PIPE = False
        assert K.onepass_plan(outer, c, inner, item, backward) == plan
    finally:
        K.PIPE = old


def test_the_large_tensor_sets():
    # (128, 64, 56, 56) on an H100: float32 forward 4 sets of 16 channels (bn_fwd1: 2 rounds of 32), backward 8 of 8
    # over all 264 blocks; bfloat16 forward 2 sets of 32 (bn_fwd1: one round), backward 4 of 16
    assert K.PIPE or "MINIDNN_BN_PIPE" in os.environ
    got = {(item, b): K.onepass_plan(128, 64, 3136, item, b) for item in (4, 2) for b in (False, True)}
    assert all(p["pipe"] for p in got.values())
    assert [(p["rounds"], p["per"], p["grid"], p["ks"]) for p in got.values()] == \
        [(4, 16, 256, 13), (8, 33, 264, 6), (2, 8, 256, 13), (4, 16, 256, 6)]


def test_min_vecs_splits_small_channels_over_more_blocks(monkeypatch):
    # MINIDNN_BN_MIN_VECS (default 2 x UNROLL = 8): a block's slice holds at least 256 x v vectors; at 4 the
    # bfloat16 ResNet-20 tensors take the grids their float32 forms take at 8; the large tensor's plans do not move
    assert K.MIN_VECS == 2 * K.ONEPASS_UNROLL or "MINIDNN_BN_MIN_VECS" in os.environ
    monkeypatch.setattr(K, "MIN_VECS", 8)
    f32 = {s: K.onepass_plan(*s, 4, False) for s in ((128, 16, 1024), (128, 32, 256), (128, 64, 64))}
    big = [K.onepass_plan(128, 64, 3136, item, b) for item in (4, 2) for b in (False, True)]
    for v in (8, 4, 2, 1):
        monkeypatch.setattr(K, "MIN_VECS", v)
        assert [K.onepass_plan(128, 64, 3136, item, b) for item in (4, 2) for b in (False, True)] == big
        for shape in f32:
            for item in (4, 2):
                plan = K.onepass_plan(*shape, item, False)
                vectors = shape[0] * shape[2] // plan["vec"]
                assert plan["per"] <= -(-vectors // (256 * v))
                # one round of all channels: as many blocks a channel as the grid holds or the slices allow
                assert plan["rounds"] == 1
                assert plan["per"] == min(132 * K.ONEPASS_BPS // shape[1], -(-vectors // (256 * v)))
                if v == 4 and item == 2:
                    assert (plan["per"], plan["grid"]) == (f32[shape]["per"], f32[shape]["grid"]), (shape, plan)


# ---- CPU: the kernel's loop, emulated ------------------------------------------------------------------------------

def _seq(outer, c, inner, vec, per, t, s, tid):
    """Thread tid's vectors in slice s of tile t (slice_of / slice_len / seq_walk's offsets)."""
    iv = inner // vec
    m = outer * iv
    lo, hi = m * s // per, m * (s + 1) // per
    j0 = lo + tid
    n = (hi - j0 - 1) // K.THREADS + 1 if j0 < hi else 0
    out = []
    for k in range(n):
        jj = j0 + k * K.THREADS
        o = jj // iv
        out.append((o * c) * inner + t * inner + (jj - o * iv) * vec)
    return out


def _emulate(outer, c, inner, vec, tiles, per, grid, ks, threads=K.THREADS):
    """Run bn_fwd1p's loop literally: returns (visits of pass 2 per element offset, every slot read its own element,
    each block's events [("arrive" | "wait", tile)])."""
    seen = np.zeros(outer * c * inner, np.int64)
    ok = True
    events = []
    step = grid // per
    for b in range(grid):
        s = b % per
        smem = {}
        ev = []
        tp, h = -1, 0
        t = b // per
        while True:
            have = t < tiles
            if have:
                for tid in range(threads):
                    seq = _seq(outer, c, inner, vec, per, t, s, tid)
                    for k in range(min(ks, len(seq))):
                        smem[(h, k, tid)] = seq[k]
                ev.append(("arrive", t))
            if tp >= 0:
                ev.append(("wait", tp))
                for tid in range(threads):
                    seq = _seq(outer, c, inner, vec, per, tp, s, tid)
                    n, kc = len(seq), min(ks, len(seq))
                    for k in range(n - 1, kc - 1, -1):
                        seen[seq[k]] += 1
                    for k in range(kc):
                        ok &= smem.get((h ^ 1, k, tid)) == seq[k]
                        seen[seq[k]] += 1
            if not have:
                break
            tp = t
            h ^= 1
            t += step
        events.append(ev)
    return seen, ok, events


def _full(seen, vec):
    full = np.zeros_like(seen)
    nz = np.flatnonzero(seen)
    for e in range(vec):
        full[nz + e] += seen[nz]
    return full


@pytest.mark.parametrize("shape, vec", [((3, 5, 7 * 9), 1), ((4, 7, 64), 4), ((9, 6, 36), 2), ((2, 9, 1000), 4),
                                        ((5, 3, 33), 1)], ids=str)
@pytest.mark.parametrize("per, set_of", [(1, 1), (3, 2), (2, 4)])
@pytest.mark.parametrize("ks", [0, 1, 2, 100])
def test_every_element_written_once_from_its_own_slot(shape, vec, per, set_of, ks):
    outer, c, inner = shape
    seen, ok, events = _emulate(outer, c, inner, vec, c, per, set_of * per, ks)
    assert ok
    assert np.all(_full(seen, vec) == 1)
    for ev in events:           # arrivals and waits alternate as the loop says: a1 [a2 w1] [a3 w2] ... w_last
        arr = [t for kind, t in ev if kind == "arrive"]
        assert [t for kind, t in ev if kind == "wait"] == arr
        assert ev == ([("arrive", arr[0])] + [e for a, w in zip(arr[1:], arr) for e in (("arrive", a), ("wait", w))]
                      + [("wait", arr[-1])] if arr else [])


def _deadlocks(events, per):
    """Advance every block as far as its events allow (an arrival always, a wait once all `per` blocks of the tile
    have arrived), in turns; True where some block can never finish."""
    pos = [0] * len(events)
    arrived = {}
    moved = True
    while moved:
        moved = False
        for b, ev in enumerate(events):
            while pos[b] < len(ev):
                kind, t = ev[pos[b]]
                if kind == "wait" and arrived.get(t, 0) < per:
                    break
                if kind == "arrive":
                    arrived[t] = arrived.get(t, 0) + 1
                pos[b] += 1
                moved = True
    assert all(v == per for v in arrived.values())
    return any(p < len(ev) for p, ev in zip(pos, events))


@pytest.mark.parametrize("tiles, per, set_of", [(7, 3, 2), (64, 16, 16), (64, 33, 8), (5, 1, 5), (9, 2, 4)])
def test_the_meetings_never_deadlock(tiles, per, set_of):
    _, _, events = _emulate(1, tiles, 4, 4, tiles, per, set_of * per, 0, threads=0)
    assert not _deadlocks(events, per)
    # reversed block order (the scheduler's turns do not matter)
    assert not _deadlocks(events[::-1], per)


# ---- CPU: the launches under the fake CuPy -------------------------------------------------------------------------

def _fake(code):
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
names = []
L._go = lambda fn, d, stream, p: names.append((str(fn).split("(")[0], d, str(fn), p))
from minidnn.backend.cuda import bn_nhwc as M, bn_kernels as K
M._smem[0] = {H100_SMEM!r}
"""
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    return r.stdout


def test_large_calls_launch_the_pipelined_kernels_and_the_switch_gives_the_ones_before_under_the_fake_cupy():
    _fake("""
for pipe in (True, False):
    K.PIPE = pipe
    for shape, relu in (((128, 64, 56, 56), False), ((128, 64, 56, 56), True), ((128, 16, 32, 32), True)):
        c = shape[1]
        x = fakecp.asarray(np.ones(shape, np.float32))
        sc, bi = fakecp.asarray(np.ones(c, np.float32)), fakecp.asarray(np.zeros(c, np.float32))
        n0 = len(names)
        y, m, i = K.forward_training(x, sc, bi, 0.1, None, None, 1e-5, relu=relu)
        dx, dz, ds, db = K.backward(x, x, sc, m, i, y=y if relu else None, want_dz=relu)
        got = names[n0:]
        big = shape[0] * shape[1] * shape[2] * shape[3] > 2 ** 24
        want = ["bn_fwd1p", "bn_bwd1p"] if pipe and big else ["bn_fwd1", "bn_bwd1"]
        assert [g[0] for g in got] == want, (pipe, shape, got)
        for (name, dims, full, p), bwd in zip(got, (False, True)):
            plan = K.onepass_plan(shape[0], c, shape[2] * shape[3], 4, bwd, 0)
            assert plan["pipe"] is (pipe and big), plan
            assert (dims[0], dims[6]) == (plan["grid"], plan["dyn"]), (name, dims, plan)
            assert "-DCACHE=1" in full and "-DINNER1=0" in full, full
print("OK")
""")


# ---- nvcc ----------------------------------------------------------------------------------------------------------

def _dt(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, vec", [("float32", 4), ("bfloat16", 8), ("float16", 8), ("float64", 2),
                                       ("float32", 1)], ids=str)
@pytest.mark.parametrize("flags", [dict(relu=1, has_z=1, has_scale=1, has_bias=1), dict(has_scale=1, has_bias=1)],
                         ids=["fused", "plain"])
def test_pipelined_kernels_compile_without_spills(tmp_path, name, vec, flags):
    opts = K._onepass_options(_dt(name), False, vec, 1, cache=1, **flags)
    defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
    f = tmp_path / "k.cu"
    f.write_text(defines + K.PIPE_SOURCE)
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k"),
                        str(f)], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    spills = [line for line in out.splitlines() if "spill stores" in line]
    assert len(spills) == 2 and all(" 0 bytes spill stores" in line for line in spills), out


# ---- GPU -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


@pytest.fixture
def small_sets(monkeypatch, cp):
    """Force many small sets: the planner told of ``sms`` SMs (the grid is then at most 2 * sms blocks, all resident
    on the real GPU), an L2 of ``l2`` bytes and at most ``cap`` slots a block; the call caches cleared."""
    dev = cp.cuda.Device().id

    def clear():
        M._calls.clear(); K._calls.clear(); K._plans.clear()       # noqa: E702

    def setup(sms, l2, cap, pipe=True):
        monkeypatch.setattr(K._launch, "sm_count", lambda d=None: sms)
        monkeypatch.setitem(K._l2, dev, l2)
        monkeypatch.setattr(M, "SLOTS_CAP", cap)
        monkeypatch.setattr(K, "PIPE", pipe)
        clear()
    yield setup
    clear()


TOL = {"float32": dict(rtol=2e-4, atol=2e-4), "float16": dict(rtol=1e-2, atol=1e-2),
       "bfloat16": dict(rtol=4e-2, atol=4e-2)}
# odd N*H*W, planes that fill vectors or not (33 x 35: scalars), tails, 2-6 blocks a channel (the last two)
SHAPES = [(5, 3, 17, 19), (3, 40, 13, 21), (33, 8, 12, 12), (2, 64, 31, 31), (128, 4, 7, 9), (4, 9, 32, 32),
          (32, 5, 48, 48), (64, 6, 33, 35)]


def _close(got, want, name, scale=1.0):
    tol = TOL[name]
    np.testing.assert_allclose(got.get().astype(np.float64), want, rtol=tol["rtol"], atol=tol["atol"] * scale)


def _run(cp, name, shape, ops, seed, counter=None):
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
    xg, dyg = cp.asarray(x), cp.asarray(dy)
    zg = None if z is None else cp.asarray(z)
    rmg, rvg, sg, bg = cp.asarray(rm), cp.asarray(rv), cp.asarray(scale), cp.asarray(bias)
    from minidnn.backend.cuda import launch
    n0 = launch.launch_count()
    y, m, i = K.forward_training(xg, sg, bg, f, rmg, rvg, eps, z=zg, relu=ops != "bn", counter=counter)
    got_b = K.backward(xg, dyg, sg, m, i, y=y if ops != "bn" else None, want_dz=ops == "bn_add_activation")
    cp.cuda.Device().synchronize()
    assert launch.launch_count() - n0 == 2, "one launch per direction"
    return (y, m, i, rmg, rvg, got_b), (y_ref, m_ref, i_ref, rm64, rv64, ref_b)


def _check(got, ref, name, shape, ops):
    y, m, i, rmg, rvg, gb = got
    y_ref, m_ref, i_ref, rm64, rv64, rb = ref
    _close(y, y_ref, name, 4)
    np.testing.assert_allclose(m.get(), m_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(i.get(), i_ref, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(rmg.get(), rm64, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rvg.get(), rv64, rtol=1e-4, atol=1e-4)
    _close(gb[0], rb[0], name, 4 * (float(np.abs(rb[0]).max()) + 1))
    if ops == "bn_add_activation":
        _close(gb[1], rb[1], name, 4)
    np.testing.assert_allclose(gb[2].get(), rb[2], rtol=1e-3, atol=1e-3 * np.prod(shape) / shape[1])
    np.testing.assert_allclose(gb[3].get(), rb[3], rtol=1e-3, atol=1e-3 * np.prod(shape) / shape[1])


# (dtype, SMs the planner is told of, L2 bytes, slot cap): float16 and the 8-SM setting (which sends some calls to
# bn_fwd1 / bn_bwd1) once each, to keep the NVRTC compiles few
SETTINGS = [("float32", 1, 1, 2), ("bfloat16", 1, 1, 2), ("float16", 1, 1, 2), ("float32", 3, 1, 4),
            ("bfloat16", 3, 1, 4), ("float32", 8, 65536, 4)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, sms, l2, cap", SETTINGS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
def test_pipelined_against_the_float64_reference(cp, small_sets, name, shape, ops, sms, l2, cap):
    # 1 and 3 SMs: every shape here pipelined (2-64 sets, each block holding several tiles, 1-6 blocks a channel);
    # 8 SMs with a 64 KiB L2: most (some fit one set and take bn_fwd1 / bn_bwd1)
    small_sets(sms, l2, cap)
    dev = cp.cuda.Device().id
    item = _dt(name).itemsize
    inner = shape[2] * shape[3]
    for bwd in (False, True):
        plan = K.onepass_plan(shape[0], shape[1], inner, item, bwd, dev)
        assert plan["pipe"] or sms == 8, plan
    counter = cp.zeros(1, np.int64)
    got, ref = _run(cp, name, shape, ops, zlib.crc32(repr(("pipe", name, shape, ops, l2, cap)).encode()), counter)
    _check(got, ref, name, shape, ops)
    assert int(counter.get()[0]) == 1


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
def test_bit_identical_to_the_kernels_before_it_at_the_same_split(cp, small_sets, name, ops):
    # (4, 9, 32, 32): 1024 float32 / 512 bfloat16 vectors a channel -> one block a channel (per = 1) either way, so
    # the sums run in the same order; one SM and no L2 share give both several rounds / sets
    shape, dev = (4, 9, 32, 32), cp.cuda.Device().id
    outs = []
    for pipe in (False, True):
        small_sets(1, 1, 4, pipe)
        plans = [K.onepass_plan(4, 9, 1024, _dt(name).itemsize, b, dev) for b in (False, True)]
        assert all(p["per"] == 1 and p["pipe"] is pipe for p in plans), plans
        got, _ = _run(cp, name, shape, ops, 5)
        outs.append([a.get() for a in (got[0], got[1], got[2], got[3], got[4], got[5][0], got[5][2], got[5][3])]
                    + ([got[5][1].get()] if ops == "bn_add_activation" else []))
    for a, b in zip(*outs):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(128, 16, 32, 32), (128, 32, 16, 16), (128, 64, 8, 8), (7, 5, 30, 33)], ids=str)
@pytest.mark.parametrize("ops", ["bn", "bn_add_activation"])
@pytest.mark.parametrize("min_vecs", [4, 2])
def test_min_vecs_against_the_float64_reference(cp, monkeypatch, name, shape, ops, min_vecs):
    # ResNet-20's shapes (and a ragged one) split over 2-4x the blocks (MINIDNN_BN_MIN_VECS)
    monkeypatch.setattr(K, "MIN_VECS", min_vecs)
    K._calls.clear(); K._plans.clear()      # noqa: E702
    try:
        got, ref = _run(cp, name, shape, ops, zlib.crc32(repr(("mv", name, shape, ops)).encode()))
        _check(got, ref, name, shape, ops)
    finally:
        K._calls.clear(); K._plans.clear()      # noqa: E702


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_activation"])
def test_the_bench_tensor_against_the_float64_reference(cp, name, ops):
    # (128, 64, 56, 56): the default plan (pipelined on an H100 / H200: 2-8 sets)
    K._calls.clear(); K._plans.clear()      # noqa: E702
    dev = cp.cuda.Device().id
    shape = (128, 64, 56, 56)
    assert K.onepass_plan(128, 64, 3136, _dt(name).itemsize, True, dev)["pipe"] is K.PIPE
    got, ref = _run(cp, name, shape, ops, 21)
    _check(got, ref, name, shape, ops)
