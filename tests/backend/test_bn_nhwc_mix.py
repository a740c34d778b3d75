"""Session 12's MIX order of the channels-last batch-norm one-launch kernels (bn_nhwc.MIX, MINIDNN_BN_NHWC_MIX):
the elementwise pass reads its uncached vectors one newest (L2) to UNROLL - 1 oldest (DRAM), the first far ones
prefetched into L2 before the meeting, and combine's scratch shares block_partial's buffer (one more slot of the
on-chip copy).  CPU: the order emulated with the kernels' formula (every vector once, the copy's slots read back
their own), the slot gain, nvcc (no spills, 4 KB less static shared memory), the switch under the fake CuPy.  cuda:
MIX against the float64 reference and bit for bit against the default order (the same sums, the same arithmetic)."""
import os
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

from minidnn.backend.cuda import bn_nhwc as M
from tests.backend.test_bn_nhwc_cuda import LARGE, Counted, _bits, _check, _cl, _data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
U = M.UNROLL
H200_SMEM = (233472, 232448)            # MaxSharedMemoryPerMultiprocessor, MaxSharedMemoryPerBlockOptin (H100 too)


# ---- CPU: the order ----------------------------------------------------------------------------------------------

def mix_k(j, n, kc, p):
    """The source's mix_k, literally (C division: j, p >= 0)."""
    q = j // p
    r = j - q * p
    return n - 1 - q if r == 0 else kc + (p - 1) * q + r - 1


def order(n, kc, p):
    """Pass 2's k order with MIX: mix_walk over the uncached k (kc <= k < n), then the slots 0 .. kc - 1."""
    return [mix_k(j, n, kc, p) for j in range(n - kc)] + list(range(kc))


def prefetched(n, kc, p, pf):
    """mix_prefetch's k: the first min(pf, far count) far vectors."""
    m = n - kc
    nf = min(pf, m - (m + p - 1) // p)
    return list(range(kc, kc + max(0, nf)))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8, 1 << 30])
@pytest.mark.parametrize("n", list(range(0, 41)) + [95, 96, 97])
def test_mix_order_visits_every_k_once_near_ones_newest_first(n, p):
    for kc in sorted({0, 1, 2, 3, 5, 12, 13, n // 2, max(0, n - 1), n}):
        if kc > n:
            continue
        o = order(n, kc, p)
        assert sorted(o) == list(range(n)), (n, kc)
        m = n - kc
        near = [o[j] for j in range(m) if j % p == 0]
        far = [o[j] for j in range(m) if j % p != 0]
        # a near item opens every period: the newest ceil(m / p), newest first; the far ones oldest first
        assert near == list(range(n - 1, n - 1 - (m + p - 1) // p, -1))
        assert far == list(range(kc, kc + len(far)))
        if p == 1:          # the order without MIX: newest first, then the slots
            assert o == list(range(n - 1, kc - 1, -1)) + list(range(kc))
        # the prefetched ones are far ones, read before the other far items
        for pf in (0, 1, M.MIX_PF, 1000):
            got = prefetched(n, kc, p, pf)
            assert got == far[:len(got)] and len(got) == min(pf, len(far))


def _seqs(rows, c, vec, grid):
    """Per (block, chunk, thread): seq_off's offsets for k < seq_len (the CUDA formulas)."""
    cv, chunks, tx_n, rb, ng = M.geometry(rows, c, vec)
    out = []
    for y in range(chunks):
        for b in range(grid):
            n = (ng - 1 - b) // grid + 1 if b < ng else 0
            for tid in range(M.THREADS):
                tx, ty = tid % tx_n, tid // tx_n
                vcol = y * tx_n + tx
                if ty < rb and vcol < cv:
                    out.append([((b + k * grid) * rb + ty) * cv * vec + vcol * vec
                                if (b + k * grid) * rb + ty < rows else -1 for k in range(n)])
    return out


@pytest.mark.parametrize("rows, c, item", [(33 * 31, 24, 4), (5 * 9, 3, 4), (1000, 64, 2), (300, 1040, 4),
                                           (17, 6, 2), (7 * 7 * 3, 64, 4), (128 * 8 * 8, 64, 4)], ids=str)
@pytest.mark.parametrize("ks", [0, 1, 3, 1000])
@pytest.mark.parametrize("p", [2, 4])
def test_mix_pass_writes_every_element_once_and_the_slots_give_back_their_own(rows, c, item, ks, p):
    vec = M.vec_width(c, item)
    cv, chunks, tx, rb, ng = M.geometry(rows, c, vec)
    for grid in sorted({1, 3, M.reduce_grid(ng, chunks, 264)}):
        seen = np.zeros(rows * c, np.int64)
        for seq in _seqs(rows, c, vec, grid):
            n = len(seq)
            kc = min(ks, n)
            slots = {k: seq[k] for k in range(kc)}              # pass 1 keeps k < kc (its order is unchanged)
            for k in order(n, kc, p):
                off = seq[k]
                if off < 0:
                    continue
                if k < kc:
                    assert slots[k] == off
                for e in range(vec):
                    seen[off + e] += 1
            for k in prefetched(n, kc, p, M.MIX_PF):
                assert kc <= k < n
        assert np.all(seen == 1), (grid, ks)


def test_mix_takes_one_more_slot_on_the_large_tensor():
    # H100 / H200 shared memory, 2 blocks an SM: the static buffer 4 KB smaller gives every large-tensor kernel of
    # bfloat16 / float32 one slot more (float32 backward 12 -> 13 of a ~95-vector walk, forward 25 -> 26)
    for vec, item, acc in ((4, 4, 4), (8, 2, 4), (2, 8, 8)):
        for arrays in (1, 2):
            slot = M.THREADS * vec * item * arrays
            off = M.cache_slots(*H200_SMEM, M.static_estimate(vec, acc), M.BPS, slot)
            on = M.cache_slots(*H200_SMEM, M.static_estimate(vec, acc, mix=True), M.BPS, slot)
            assert on == off + 1, (vec, item, arrays, off, on)
    assert M.static_estimate(1, 4, mix=True) == M.static_estimate(1, 4)        # 2 KB buffer: not aliased


# ---- nvcc --------------------------------------------------------------------------------------------------------

def _dt(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


def _compile(tmp_path, name, vec, flags, tag):
    src = tmp_path / f"{tag}.cu"
    src.write_text(M.source_for_nvcc(_dt(name), vec, **flags))
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o",
                        str(tmp_path / f"{tag}.cubin"), str(src)], capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    info, cur = {}, None
    for line in out.splitlines():
        if "Compiling entry function" in line:
            cur = line.split("'")[1]
        elif cur and "spill stores" in line:
            info.setdefault(cur, {})["spill"] = int(line.split("bytes stack frame, ")[1].split(" bytes")[0])
        elif cur and "registers" in line:
            info.setdefault(cur, {})["regs"] = int(line.split("Used ")[1].split(" registers")[0])
            info[cur]["smem"] = int(line.split("registers, ")[1].split(" bytes smem")[0].split(", ")[-1]) \
                if "bytes smem" in line else 0
    return info


_ALL = dict(relu=1, has_z=1, has_scale=1, has_bias=1)
MIX_COMPILE = [("float32", 4, _ALL), ("float32", 4, dict(has_scale=1)), ("float32", 4, dict(relu=1, has_scale=1)),
               ("bfloat16", 8, _ALL), ("bfloat16", 8, dict(has_scale=1)), ("float16", 8, _ALL),
               ("float64", 2, _ALL), ("float32", 1, _ALL), ("bfloat16", 2, dict(relu=1, has_scale=1))]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, vec, flags", MIX_COMPILE, ids=str)
def test_mix_kernels_compile_without_spills_and_with_less_static_memory(tmp_path, name, vec, flags):
    on = _compile(tmp_path, name, vec, dict(cache=1, mix=1, **flags), "on")
    off = _compile(tmp_path, name, vec, dict(cache=1, **flags), "off")
    acc = 8 if name == "float64" else 4
    for k in ("bnc_fwd1", "bnc_bwd1"):
        assert on[k]["spill"] == 0 and on[k]["regs"] <= 65536 // (256 * M.BPS), (k, on[k])
        want = off[k]["smem"] - (4096 if vec * acc >= 8 else 0)
        assert on[k]["smem"] == want, (k, on[k], off[k])
        assert on[k]["smem"] <= M.static_estimate(vec, acc, mix=True), (k, on[k])


# ---- the switch under the fake CuPy -------------------------------------------------------------------------------

def test_mix_switch_builds_its_kernels_with_one_more_slot_under_the_fake_cupy():
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
names, args = [], []
L._go = lambda fn, d, stream, p: names.append((str(fn).split("(")[0], d, str(fn)))
from minidnn.backend.cuda import bn_nhwc as M, bn_kernels as K, bn_cluster as BC
_prepare = M._launch.prepare
def prepare(k, grid, block, a, **kw):
    args.append((len(a), [int(v) for v in a[-3:] if v is not None]))
    return _prepare(k, grid, block, a, **kw)
M._launch.prepare = prepare
M._smem[0] = {H200_SMEM!r}
BC.ENABLED = False
def cl(a):
    perm = (0, *range(2, a.ndim), 1); back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return fakecp.asarray(np.ascontiguousarray(a.transpose(perm))).transpose(back)
"""
    code = """
c = 64
x = cl(np.zeros((40, c, 56, 56), np.float32))   # 125440 rows: ~30 groups a block at 264 blocks (more than the slots)
sc, bi = fakecp.asarray(np.ones(c, np.float32)), fakecp.asarray(np.zeros(c, np.float32))
seen, count = {}, {}
for mix, p, pf in ((frozenset(), 4, 6), (frozenset({"bwd"}), 4, 6), (frozenset({"fwd", "bwd"}), 4, 6),
                   (frozenset({"fwd", "bwd"}), 2, 0)):
    M.MIX, M.MIX_P, M.MIX_PF = mix, p, pf
    for rep in range(2):            # the second call through the settled objects (their switch check)
        n0, a0 = len(names), len(args)
        y, m, i = K.forward_training(x, sc, bi, 0.1, None, None, 1e-5)
        K.backward(x, y, sc, m, i, y=y, want_dz=True)
        got = names[n0:]
        assert [g[0] for g in got] == ["bnc_fwd1", "bnc_bwd1"], got
        for (name, dims, full), d, slot in zip(got, ("fwd", "bwd"), (256 * 16, 2 * 256 * 16)):
            assert ("-DMIX=1" in full) is (d in mix), (mix, name, full)
            assert dims[6] % slot == 0, dims
            seen[(mix, d)] = dims[6] // slot
        if rep == 0:                # launches prepared once per setting: ks last, then (with MIX) p and pf
            made = args[a0:]
            assert len(made) == 2, made
            for (n, a), d in zip(made, ("fwd", "bwd")):
                want = [seen[(mix, d)], p, pf] if d in mix else [seen[(mix, d)]]
                assert a[-len(want):] == want, (mix, d, a)
                count.setdefault(d, set()).add(n - len(want))      # the arguments before ks: the same
        else:
            assert len(args) == a0, "settled: nothing prepared again"
assert all(len(v) == 1 for v in count.values()), count
for d in ("fwd", "bwd"):
    off, on = seen[(frozenset(), d)], seen[(frozenset({"fwd", "bwd"}), d)]
    assert on == off + 1, (d, off, on)
assert seen[(frozenset({"bwd"}), "fwd")] == seen[(frozenset(), "fwd")]
print("OK", seen)
"""
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_mix_environment_values():
    code = ("import os, sys; sys.path.insert(0, %r)\n"
            "from minidnn.backend.cuda import bn_nhwc as M\n"
            "print(sorted(M.MIX))") % ROOT
    got = {}
    for value in ("", "1", "bwd", "fwd,bwd", " fwd , bwd ", "0", "nonsense"):
        env = dict(os.environ, MINIDNN_BN_NHWC_MIX=value)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        got[value] = r.stdout.strip()
    assert got == {"": "[]", "1": "['bwd', 'fwd']", "bwd": "['bwd']", "fwd,bwd": "['bwd', 'fwd']",
                   " fwd , bwd ": "['bwd', 'fwd']", "0": "[]", "nonsense": "[]"}


# ---- GPU ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def gpu(monkeypatch):
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


def _both(cp, name, shape, ops, seed):
    """forward + backward (fused as ``ops`` says) on channels-last data: every output, running statistics and
    counter included, in a list of arrays."""
    x, dy, z, scale, bias, rm, rv = _data(name, shape, ops, seed)
    xg, zg, dyg = _cl(cp, x), _cl(cp, z), _cl(cp, dy)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    rmg, rvg, cnt = cp.asarray(rm), cp.asarray(rv), cp.zeros((1,), np.int64)
    relu = ops != "bn"
    with Counted() as c1:
        y, m, i = M.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, z=zg, relu=relu, counter=cnt)
        dx, dz, ds, db = M.backward(xg, dyg, sg, m, i, y=y if relu else None, want_dz=ops == "bn_add_activation")
    assert c1.n == 2, "one launch per direction"
    return [a for a in (y, m, i, dx, dz, ds, db, rmg, rvg, cnt) if a is not None]


# ragged rows, odd channel counts (C = 3: scalars; 5, 24, 40: narrower vectors), 2-D input, two column chunks, and
# the example models' shapes; slots 0 (every vector through the mixed walk), 1 and 3 (a part), None (what fits)
MIX_SHAPES = [(5, 3, 9, 9), (8, 24, 7, 7), (3, 40, 13, 5), (7, 5), (2, 1040, 3, 3), (33, 8, 12, 12),
              (128, 16, 32, 32), (128, 32, 16, 16), (128, 64, 8, 8), (256, 16, 32, 32)]


# float16 differs from bfloat16 in LD / ST only: the fused form on three shapes (fewer NVRTC compiles)
MIX_CASES = [(name, shape, ops) for name in ("float32", "bfloat16") for shape in MIX_SHAPES
             for ops in ("bn", "bn_activation", "bn_add_activation")] + \
    [("float16", shape, "bn_add_activation") for shape in ((5, 3, 9, 9), (8, 24, 7, 7), (33, 8, 12, 12))]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, ops", MIX_CASES, ids=str)
def test_mix_gives_the_default_bits_and_the_reference(gpu, name, shape, ops):
    cp, monkeypatch, clear = gpu
    seed = zlib.crc32(repr((name, shape, ops)).encode())
    for cap in (0, 1, 3, None):
        if cap is not None and shape[0] >= 128 and cap != 0:
            continue                    # the models' shapes: none or all of the walk in the copy (fewer runs)
        monkeypatch.setattr(M, "SLOTS_CAP", cap)
        out = {}
        for mix in (frozenset(), frozenset({"fwd", "bwd"})):
            monkeypatch.setattr(M, "MIX", mix)
            clear()
            out[mix] = _both(cp, name, shape, ops, seed)
        for k, (a, b) in enumerate(zip(*out.values())):
            np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}, slots {cap}")
        _check(cp, name, shape, ops, "one", seed=seed)          # MIX still on
    monkeypatch.setattr(M, "SLOTS_CAP", None)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
def test_mix_large_tensor_default_bits_and_reference(gpu, name, ops):
    # (128, 64, 56, 56): the walk ~95 (float32) / ~48 (bfloat16) vectors a thread, 13 / 12 of them in the copy
    cp, monkeypatch, clear = gpu
    out = {}
    for mix in (frozenset(), frozenset({"fwd", "bwd"})):
        monkeypatch.setattr(M, "MIX", mix)
        clear()
        out[mix] = _both(cp, name, LARGE, ops, 2)
    for k, (a, b) in enumerate(zip(*out.values())):
        np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}")
    _check(cp, name, LARGE, ops, "one", seed=2)


@pytest.mark.cuda
def test_mix_float64_against_the_reference(gpu):
    cp, monkeypatch, clear = gpu
    monkeypatch.setattr(M, "MIX", frozenset({"fwd", "bwd"}))
    for cap in (0, None):
        monkeypatch.setattr(M, "SLOTS_CAP", cap)
        clear()
        for shape in ((5, 3, 9, 9), (8, 24, 7, 7)):
            _check(cp, "float64", shape, "bn_add_activation", "one", seed=4)
    monkeypatch.setattr(M, "SLOTS_CAP", None)
