"""Session 17's SPLIT for the channels-last batch-norm one-launch kernels (docs/step_kernels.md, "Session 17:
channels-last batch norm at wide C"): the meeting's combine spread over the grid (meet_split) where meet's single
combiner makes SPLIT_TRIPS or more dependent L2 trips -- C = 256 at 264 blocks: 17.  The same sums in the same order.
CPU: the plan of session 17's table shapes and the models' (which take SPLIT), combine_split emulated against
combine_n (every channel's sum the same expression, every channel finalised once, the staging inside V2's buffer),
the rule under the fake CuPy (the compile flag only: the same grid, shared memory and arguments), nvcc (no spills,
<= 128 registers, static shared memory no more than without it), the environment values.  cuda: SPLIT bit for bit
against it off on the table's shapes and ragged ones (float32 / bfloat16, plain and add + ReLU), against float64."""
import os
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

from minidnn.backend.cuda import bn_nhwc as M
from tests._nvcc import pick
from tests.backend.test_bn_nhwc_cuda import _bits, _check, _cl, _data
from tests.backend.test_bn_nhwc_l2 import _both, _compile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H200_SMEM = (233472, 232448)
L2 = 50 * 1024 * 1024
WIDE = (32, 256, 56, 56)            # session 17's table: 49-56% of copy channels-last, 64-66% in NCHW


def _geo(shape, item, blocks=264):
    c = shape[1]
    rows = int(np.prod(shape)) // c
    vec = 16 // item
    cv, chunks, tx, rb, ng = M.geometry(rows, c, vec)
    return vec, tx, rb, ng, M.reduce_grid(ng, chunks, blocks)


# shape, itemsize -> (TX, RB, G, combine trips, SPLIT under the rule at SPLIT_TRIPS = 4) on an H100 / H200 (132 SMs x
# 2 blocks)
PLANS = {(WIDE, 4): (64, 4, 264, 17, True), (WIDE, 2): (32, 8, 264, 17, True),
         ((256, 32, 56, 56), 4): (8, 32, 264, 3, False), ((256, 32, 56, 56), 2): (4, 64, 264, 3, False),
         ((128, 64, 56, 56), 4): (16, 16, 264, 5, True), ((128, 64, 56, 56), 2): (8, 32, 264, 5, True),
         # ResNet-20 / MobileNet-small at batch 128: ResNet-20's (1-2 trips) keep their plans, MobileNet-small's
         # (128, 64, 16, 16) and (128, 128, 8, 8) (4-8 trips) split (run 2: (128, 128, 8, 8) 1.06-1.33x)
         ((128, 16, 32, 32), 4): (4, 64, 264, 2, False), ((128, 16, 32, 32), 2): (2, 128, 256, 1, False),
         ((128, 32, 16, 16), 4): (8, 32, 256, 2, False), ((128, 64, 8, 8), 4): (16, 16, 128, 2, False),
         ((128, 64, 16, 16), 4): (16, 16, 264, 5, True), ((128, 128, 8, 8), 4): (32, 8, 256, 8, True),
         ((128, 128, 8, 8), 2): (16, 16, 128, 4, True), ((128, 32, 32, 32), 4): (8, 32, 264, 3, False)}


@pytest.mark.parametrize("shape, item", list(PLANS), ids=str)
def test_plan_of_the_tables_and_the_models_shapes(monkeypatch, shape, item):
    tx_w, rb_w, g_w, trips_w, split_w = PLANS[(shape, item)]
    vec, tx, rb, ng, g = _geo(shape, item)
    dt = np.float32 if item == 4 else np.float16
    assert (tx, rb, g, M.combine_trips(shape[1], vec, g, False)) == (tx_w, rb_w, g_w, trips_w)
    monkeypatch.setattr(M, "SPLIT", 1)
    assert M.split_call(shape[1], vec, g, dt) is split_w
    monkeypatch.setattr(M, "SPLIT", 0)
    assert not M.split_call(shape[1], vec, g, dt)
    monkeypatch.setattr(M, "SPLIT", 2)
    assert M.split_call(shape[1], vec, g, dt)


def test_split_needs_the_buffer_to_hold_a_channels_partials(monkeypatch):
    monkeypatch.setattr(M, "SPLIT", 2)
    assert M.split_call(3, 1, 256, np.float32) and not M.split_call(3, 1, 257, np.float32)    # VEC * 256 pairs
    assert M.split_call(256, 8, 264, np.float16)
    monkeypatch.setattr(M, "V2", False)                 # (V1's block sum has no bp_red)
    assert not M.split_call(256, 8, 264, np.float16)


def test_trips_count_batches_and_passes():
    # float sums take 16 loads a batch, double sums 8; kw = 256 channels a pass, so C = 1024 makes 4 passes
    assert M.combine_trips(256, 4, 264, False) == 17 and M.combine_trips(256, 4, 264, True) == 33
    assert M.combine_trips(1024, 4, 264, False) == 4 * 17
    assert M.combine_trips(128, 4, 264, False) == 9 and M.combine_trips(64, 4, 264, False) == 5
    assert M.combine_trips(256, 4, 1, False) == 1


# ---- combine_split emulated against combine_n ---------------------------------------------------------------------

def _tree(s, lanes, h0):
    """combine_n's / combine_split's tree over q (j): for h = qn / 2 ... 1, lane q < h takes lane q + h."""
    h = h0
    while h > 0:
        for q in range(h):
            s[lanes[q]] = ("+", s[lanes[q]], s[lanes[q + h]])
        h //= 2


def _kw(nch):
    kw = 1
    while kw < nch and kw < 256:
        kw *= 2
    return kw


def emulate_combine_n(c, vec, g):
    """channel -> the expression combine_n finalises it with: per lane q the partials (b, ...) it adds in order,
    then the tree."""
    cv, chunks, tx, rb, ng = M.geometry(1, c, vec)
    out = {}
    for y in range(chunks):
        cbeg, cend = y * tx * vec, min(c, (y + 1) * tx * vec)
        kw = _kw(cend - cbeg)
        qn = 256 // kw
        for cb in range(cbeg, cend, kw):
            s = {}
            for tid in range(256):
                k, q = tid % kw, tid // kw
                s[tid] = tuple(range(q, g, qn)) if cb + k < cend else ()
            for k in range(kw):
                _tree(s, [q * kw + k for q in range(qn)], qn // 2)
            for k in range(kw):
                if cb + k < cend:
                    assert cb + k not in out, "a channel finalised twice"
                    out[cb + k] = s[k]
    return out


def emulate_combine_split(c, vec, g):
    """The same for combine_split over every block of the grid; checks the staging (inside VEC * 256 pairs, each slot
    written once a round, the partial of the right block and channel) on the way."""
    cv, chunks, tx, rb, ng = M.geometry(1, c, vec)
    cap = vec * 256
    out = {}
    for y in range(chunks):
        cbeg = y * tx * vec
        nch = min(c, cbeg + tx * vec) - cbeg
        kw = _kw(nch)
        qn = 256 // kw
        p = min(kw, cap // g, -(-nch // g))
        assert p >= 1
        for bx in range(g):
            for base in range(bx * p, nch, g * p):
                npc = min(p, nch - base)
                st = {}
                for t in range(g * npc):                 # the staging loop (batches of 4 x 256: the same set)
                    b, k = t // npc, t % npc
                    assert 0 <= k * g + b < cap and k * g + b not in st
                    st[k * g + b] = (b, cbeg + base + k)
                s = {}
                for tid in range(256):
                    i, j = tid // qn, tid % qn
                    seq = ()
                    if i < npc:
                        got = [st[i * g + b] for b in range(j, g, qn)]
                        assert all(ch == cbeg + base + i for _, ch in got)
                        seq = tuple(b for b, _ in got)
                    s[tid] = seq
                for i in range(256 // qn):
                    _tree(s, [i * qn + j for j in range(qn)], qn // 2)
                for i in range(npc):
                    ch = cbeg + base + i
                    assert ch not in out, "a channel finalised twice"
                    out[ch] = s[i * qn]
    return out


@pytest.mark.parametrize("c, vec", [(256, 4), (256, 8), (512, 4), (1040, 4), (2052, 4), (128, 4), (64, 8),
                                    (24, 8), (3, 1), (6, 2), (1024, 4)], ids=str)
@pytest.mark.parametrize("g", [1, 3, 7, 128, 256, 264])
def test_split_combine_adds_every_channel_as_combine_n_does(c, vec, g):
    if g > vec * 256:
        pytest.skip("split_call never plans it")
    want = emulate_combine_n(c, vec, g)
    got = emulate_combine_split(c, vec, g)
    assert sorted(want) == list(range(c)) and got.keys() == want.keys()
    for ch in want:
        assert got[ch] == want[ch], ch


# ---- the rule under the fake CuPy -----------------------------------------------------------------------------------

def test_rule_changes_only_the_compile_flag_under_the_fake_cupy():
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, ml_dtypes, record_launches as R
fakecp, L = R._install({ROOT!r})
names, args = [], []
L._go = lambda fn, d, stream, p: names.append((str(fn).split("(")[0], d, str(fn)))
from minidnn.backend.cuda import bn_nhwc as M, bn_kernels as K, bn_cluster as BC, device_facts as F
_prepare = M._launch.prepare
def prepare(k, grid, block, a, **kw):
    args.append((tuple(grid), [float(v) for v in a if v is not None], kw.get("shared_mem")))
    return _prepare(k, grid, block, a, **kw)
M._launch.prepare = prepare
F._smem[0] = {H200_SMEM!r}
F._l2[0] = ({L2}, True)
BC.ENABLED = False
def cl(shape, dt):       # channels-last memory, channels-first view (zeros: no page touched)
    n, c = shape[0], shape[1]
    return fakecp.asarray(np.zeros((n, *shape[2:], c), dt)).transpose(0, 3, 1, 2)
"""
    code = """
bf = np.dtype(ml_dtypes.bfloat16)
CASES = [((32, 256, 56, 56), np.float32, True), ((32, 256, 56, 56), bf, True), ((128, 64, 56, 56), np.float32, True),
         ((256, 32, 56, 56), bf, False), ((128, 128, 8, 8), np.float32, True), ((128, 16, 32, 32), bf, False),
         ((2, 1040, 3, 3), np.float32, False)]       # "wide": 4 or more combine trips (SPLIT_TRIPS)
seen = {}
for mode in (0, 1, 2):
    M.SPLIT = mode
    for shape, dt, wide in CASES:
        c = shape[1]
        x = cl(shape, dt)
        sc, bi = fakecp.asarray(np.ones(c, np.float32)), fakecp.asarray(np.zeros(c, np.float32))
        for rep in range(2):
            n0, a0 = len(names), len(args)
            y, m, i = K.forward_training(x, sc, bi, 0.1, None, None, 1e-5)
            K.backward(x, y, sc, m, i, y=y, want_dz=True)
            got = names[n0:]
            assert [g[0] for g in got] == ["bnc_fwd1", "bnc_bwd1"], got
            if rep:
                assert len(args) == a0, "settled: nothing prepared again"
                continue
            made = args[a0:]
            assert len(made) == 2, made
            for (name, dims, full), a in zip(got, made):
                split = "-DSPLIT=1" in full
                assert split is (mode == 2 or (mode == 1 and wide)), (mode, shape, dt, name)
                seen.setdefault((shape, str(dt), name), {})[mode] = (full.replace(", '-DSPLIT=1'", ""), a, split)
for key, by in seen.items():
    for mode, (full, a, split) in by.items():
        assert a == by[0][1], (key, mode, a, by[0][1])          # grid, arguments, shared memory
        assert full == by[0][0] or split, (key, mode)
        if split:
            assert full == by[0][0], (key, mode, full, by[0][0])  # the flag is the one difference
print("OK", len(seen))
"""
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def test_environment_values():
    # one process (imports cost ~1.5 s each): the module re-read under each environment
    code = """import importlib, os, sys
sys.path.insert(0, %r)
from minidnn.backend.cuda import bn_nhwc as M
for split, trips in ((None, None), ("0", None), ("1", None), ("all", "4"), (" 1 ", "12"), ("nonsense", None)):
    for k, v in (("SPLIT", split), ("SPLIT_TRIPS", trips)):
        os.environ.pop("MINIDNN_BN_NHWC_" + k, None)
        if v is not None:
            os.environ["MINIDNN_BN_NHWC_" + k] = v
    importlib.reload(M)
    print(M.SPLIT, M.SPLIT_TRIPS)
""" % ROOT
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIDNN_BN_NHWC_SPLIT")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:-1] == ["1 4", "0 4", "1 4", "2 4", "1 12", "0 4"], r.stdout


# ---- nvcc --------------------------------------------------------------------------------------------------------

_ALL = dict(relu=1, has_z=1, has_scale=1, has_bias=1)
COMPILE = [("float32", 4, _ALL, 4), ("bfloat16", 8, _ALL, 4), ("float32", 4, dict(has_scale=1, keep=1), 4),
           ("float64", 2, _ALL, 8), ("float32", 1, _ALL, 4), ("bfloat16", 8, dict(has_scale=1, keep=1), 4)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, vec, flags, acc", pick(COMPILE, 1, always=[COMPILE[1]]), ids=str)
def test_split_compiles_without_spills(tmp_path, name, vec, flags, acc):
    on = _compile(tmp_path, name, vec, dict(cache=1, split=1, **flags), "split")
    for k in ("bnc_fwd1", "bnc_bwd1"):
        assert on[k]["spill"] == 0 and on[k]["regs"] <= 65536 // (256 * M.BPS), (k, on[k])
        # bp_red (2 * VEC * 256 sums, reused as the staging buffer) and combine_split's double tree: no more than
        # meet's build holds (bp_red, combine_n's tree, arrive's flag), so no fewer copy slots
        assert on[k]["smem"] == 2 * vec * 256 * acc + 256 * 16, (k, on[k])


# ---- GPU ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def gpu(monkeypatch):
    """(cupy, monkeypatch, clear): the one-launch route with the on-chip copy (SPLIT's kernels), call caches cleared
    around the test (test_bn_nhwc_l2's fixture)."""
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    from minidnn.backend.cuda import bn_kernels as K
    monkeypatch.setattr(M, "ROUTE", "one")
    monkeypatch.setattr(M, "ONCHIP", True)

    def clear():
        M._calls.clear(); K._calls.clear(); K._plans.clear()       # noqa: E702
    clear()
    yield _dev.require_cupy(), monkeypatch, clear
    clear()


def _split(monkeypatch, mode, clear):
    monkeypatch.setattr(M, "SPLIT", mode)
    clear()


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_add_activation"])
def test_wide_tensor_takes_split_with_the_bits_without_it(gpu, name, ops):
    # (32, 256, 56, 56): 264 blocks, 256 channels -- the rule's case; KEEP too (over L2), as in the table
    cp, monkeypatch, clear = gpu
    asked = []
    kernel = M._kernel

    def record(kname, dtype, vec, **flags):
        asked.append((kname, bool(flags.get("split"))))
        return kernel(kname, dtype, vec, **flags)
    monkeypatch.setattr(M, "_kernel", record)
    _split(monkeypatch, 0, clear)
    want = _both(cp, name, WIDE, ops, 7)
    assert asked == [("bnc_fwd1", False), ("bnc_bwd1", False)], asked
    for rep in range(2):                # twice: the counters were reset by the first call's last block
        _split(monkeypatch, 1, clear)
        asked.clear()
        got = _both(cp, name, WIDE, ops, 7)
        assert asked == [("bnc_fwd1", True), ("bnc_bwd1", True)], asked
        for k, (a, b) in enumerate(zip(want, got)):
            np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}, call {rep}")
    if (name, ops) == ("float32", "bn_add_activation"):
        _check(cp, name, WIDE, ops, "one", seed=3)            # SPLIT still on: against float64


# ragged rows, odd channel counts (scalars, narrow vectors), 2-D input, two column chunks, wide rows, grids from 1
# block up; SPLIT at every size (mode 2) against it off, slots 0 and what fits
CASES = [(name, shape, ops) for name in ("float32", "bfloat16") for shape in ((8, 24, 7, 7), (2, 1040, 3, 3))
         for ops in ("bn", "bn_add_activation")] + \
    [(name, shape, "bn_add_activation") for name in ("float32", "bfloat16")
     for shape in ((5, 3, 9, 9), (7, 3), (3, 512, 5, 7), (1, 8, 5, 5))] + \
    [("float32", (33, 8, 12, 12), "bn_add_activation"), ("float32", (9, 256, 17, 13), "bn"),
     ("bfloat16", (4, 2048, 7, 9), "bn")]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, ops", CASES, ids=str)
def test_split_at_every_size_gives_the_bits_without_it_and_the_reference(gpu, name, shape, ops):
    cp, monkeypatch, clear = gpu
    seed = zlib.crc32(repr((name, shape, ops)).encode())
    for cap in (0, None):
        monkeypatch.setattr(M, "SLOTS_CAP", cap)
        _split(monkeypatch, 0, clear)
        want = _both(cp, name, shape, ops, seed)
        _split(monkeypatch, 2, clear)
        got = _both(cp, name, shape, ops, seed)
        for k, (a, b) in enumerate(zip(want, got)):
            np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}, slots {cap}")
        _check(cp, name, shape, ops, "one", seed=seed)
    monkeypatch.setattr(M, "SLOTS_CAP", None)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(128, 16, 32, 32), (128, 128, 8, 8), (128, 64, 56, 56)], ids=str)
def test_rule_on_the_models_and_the_tuned_shape(gpu, shape):
    # under the rule (mode 1) ResNet-20's (128, 16, 32, 32) (2 trips) keeps exactly the kernels and arguments of SPLIT
    # off; MobileNet-small's (128, 128, 8, 8) (8) and the tuned (128, 64, 56, 56) (5) take the split build, with the
    # same grids, arguments and bits (SPLIT_TRIPS 4 since run 2), on the device's own SM count
    cp, monkeypatch, clear = gpu
    asked = []
    kernel = M._kernel

    def ask(kname, dtype, vec, **flags):
        asked.append((kname, bool(flags.get("split"))))
        return kernel(kname, dtype, vec, **flags)
    monkeypatch.setattr(M, "_kernel", ask)
    made = []
    prepare = M._launch.prepare

    def record(k, grid, block, a, **kw):
        made.append((k, tuple(grid), [None if v is None else float(v) for v in a], kw.get("shared_mem")))
        return prepare(k, grid, block, a, **kw)
    monkeypatch.setattr(M._launch, "prepare", record)
    runs = {}
    for mode in (0, 1):
        _split(monkeypatch, mode, clear)
        made.clear()
        out = _both(cp, "float32", shape, "bn_add_activation", 5)
        runs[mode] = (list(made), out)
    split = shape != (128, 16, 32, 32)
    assert asked == [("bnc_fwd1", False), ("bnc_bwd1", False), ("bnc_fwd1", split), ("bnc_bwd1", split)], asked
    for a, b in zip(runs[0][0], runs[1][0]):
        assert (a[0] is b[0]) is not split and a[1:] == b[1:], (a[1:], b[1:])
    for k, (a, b) in enumerate(zip(runs[0][1], runs[1][1])):
        np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}")


@pytest.mark.cuda
@pytest.mark.parametrize("shape, mode", [(WIDE, 1), ((8, 24, 7, 7), 2)], ids=str)
def test_twin_forward_under_split_gives_the_bits_without_it(gpu, shape, mode):
    # the forward that also writes relu(y) (TWIN_HEADER): its own build, SPLIT taken as by the plain one
    cp, monkeypatch, clear = gpu
    asked = []
    kernel = M._kernel

    def ask(kname, dtype, vec, **flags):
        asked.append(bool(flags.get("split")))
        return kernel(kname, dtype, vec, **flags)
    monkeypatch.setattr(M, "_kernel", ask)
    x, dy, z, scale, bias, rm, rv = _data("float32", shape, "bn", 11)
    xg, sg, bg = _cl(cp, x), cp.asarray(scale), cp.asarray(bias)
    outs = {}
    for m in (0, mode):
        _split(monkeypatch, m, clear)
        asked.clear()
        rmg, rvg, cnt = cp.asarray(rm), cp.asarray(rv), cp.zeros((1,), np.int64)
        got = M.training_call(xg, 0.1, 1e-5, True, True, False, False, True, True, twin=True).run(
            xg, None, sg, bg, rmg, rvg, cnt)
        assert got is not None and len(got) == 4
        assert asked and all(a == bool(m) for a in asked), (m, asked)
        outs[m] = [a.copy() for a in got] + [rmg, rvg, cnt]
    for k, (a, b) in enumerate(zip(outs[0], outs[mode])):
        np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}")


@pytest.mark.cuda
def test_float64_against_the_reference(gpu):
    cp, monkeypatch, clear = gpu
    _split(monkeypatch, 2, clear)
    for shape in ((5, 3, 9, 9), (8, 24, 7, 7), (3, 260, 5, 5)):
        _check(cp, "float64", shape, "bn_add_activation", "one", seed=4)
