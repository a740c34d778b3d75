"""Session 12 round 2's candidates for the channels-last batch-norm one-launch kernels (docs/step_kernels.md,
"Session 12: channels-last batch norm"): MEET (MINIDNN_BN_NHWC_MEET: the meeting with fewer round trips -- one fence
a block, the combine's loads 24 in flight, acquire polling) and KEEP (MINIDNN_BN_NHWC_KEEP: L2 eviction policies --
the reduction pass's newest kl steps evict-last, every other load evict-first).  Neither changes a sum or its order.
CPU: the kept steps emulated over the walk (they are the first the elementwise pass reads, never a shared-memory
slot), kl's arithmetic, nvcc (no spills, <= 128 registers, the same static shared memory, the PTX the switches ask
for), the switches under the fake CuPy, the environment values.  cuda: the candidates bit for bit against the
default and against the float64 reference."""
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
H200_SMEM = (233472, 232448)            # MaxSharedMemoryPerMultiprocessor, MaxSharedMemoryPerBlockOptin (H100 too)
L2 = 50 * 1024 * 1024                   # H100 / H200 L2CacheSize


# ---- CPU: which loads KEEP keeps ---------------------------------------------------------------------------------

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


def pass2_order(n, ks):
    """The elementwise pass's k order (unchanged by KEEP): the uncached ones newest first, then the slots."""
    kc = min(ks, n)
    return list(range(n - 1, kc - 1, -1)) + list(range(kc))


@pytest.mark.parametrize("rows, c, item", [(33 * 31, 24, 4), (5 * 9, 3, 4), (1000, 64, 2), (300, 1040, 4),
                                           (17, 6, 2), (128 * 8 * 8, 64, 4)], ids=str)
@pytest.mark.parametrize("ks", [0, 1, 3, 1000])
@pytest.mark.parametrize("kl", [0, 1, 2, 5, 1000])
def test_keep_marks_the_newest_uncached_vectors_which_the_elementwise_pass_reads_first(rows, c, item, ks, kl):
    vec = M.vec_width(c, item)
    cv, chunks, tx, rb, ng = M.geometry(rows, c, vec)
    for grid in sorted({1, 3, M.reduce_grid(ng, chunks, 264)}):
        marked = np.zeros(rows * c, np.int64)
        for seq in _seqs(rows, c, vec, grid):
            n = len(seq)
            kt = max(ks, n - kl)                        # the source's Pol.kt
            tail = [k for k in range(n) if k >= kt]     # LD_P1's test, over the reduction's walk
            assert all(k >= ks for k in tail), "a shared-memory slot is never kept in L2"
            assert len(tail) == max(0, min(kl, n - min(ks, n)))
            o = pass2_order(n, ks)
            assert o[:len(tail)] == sorted(tail, reverse=True), "the kept ones are read first, newest first"
            for k in tail:
                if seq[k] >= 0:
                    marked[seq[k]:seq[k] + vec] += 1
        assert marked.max(initial=0) <= 1


def test_keep_steps_fill_the_asked_fraction_of_l2():
    # (128, 64, 56, 56) float32 on an H100 / H200: 264 blocks, RB = 16 rows, 1.08 MB a step and array
    rows, c, item = 128 * 56 * 56, 64, 4
    cv, chunks, tx, rb, ng = M.geometry(rows, c, 4)
    g = M.reduce_grid(ng, chunks, 264)
    n = -(-ng // g)
    assert (g, rb, n) == (264, 16, 96)
    step = g * rb * c * item
    assert M.keep_steps(L2, 0.65, 2 * step, n, 12) == 15            # backward: x, dy -> 32.4 MB
    assert M.keep_steps(L2, 0.65, 3 * step, n, 12) == 10            # fused backward: x, dy, y
    assert M.keep_steps(L2, 0.65, step, n, 25) == 31                 # forward: x
    assert M.keep_steps(L2, 0.65, 2 * step, 14, 12) == 2             # at most the uncached ones
    assert M.keep_steps(L2, 0.65, 2 * step, 10, 12) == 0
    assert M.keep_steps(0, 0.65, 2 * step, n, 12) == 0               # no L2 size: nothing kept
    for frac in (0.0, 0.3, 0.65, 0.9):
        kl = M.keep_steps(L2, frac, 2 * step, n, 12)
        assert kl * 2 * step <= frac * L2 < (kl + 1) * 2 * step


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


def _ptx(tmp_path, name, vec, flags, tag):
    src = tmp_path / f"{tag}.cu"
    src.write_text(M.source_for_nvcc(_dt(name), vec, **flags))
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "--ptx", "-o", str(tmp_path / f"{tag}.ptx"), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return (tmp_path / f"{tag}.ptx").read_text()


_ALL = dict(relu=1, has_z=1, has_scale=1, has_bias=1)
COMPILE = [("float32", 4, _ALL), ("float32", 4, dict(has_scale=1)), ("float32", 4, dict(relu=1, has_scale=1)),
           ("bfloat16", 8, _ALL), ("bfloat16", 8, dict(has_scale=1)), ("float16", 8, _ALL),
           ("float64", 2, _ALL), ("float32", 1, _ALL), ("bfloat16", 2, dict(relu=1, has_scale=1))]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, vec, flags", COMPILE, ids=str)
def test_candidates_compile_without_spills_and_with_the_same_static_memory(tmp_path, name, vec, flags):
    off = _compile(tmp_path, name, vec, dict(cache=1, **flags), "off")
    for tag, extra in (("meet", dict(meet=1)), ("keep", dict(keep=1)), ("both", dict(meet=1, keep=1))):
        on = _compile(tmp_path, name, vec, dict(cache=1, **flags, **extra), tag)
        for k in ("bnc_fwd1", "bnc_bwd1"):
            assert on[k]["spill"] == 0 and on[k]["regs"] <= 65536 // (256 * M.BPS), (tag, k, on[k])
            assert on[k]["smem"] == off[k]["smem"], (tag, k, on[k], off[k])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_switches_reach_the_ptx(tmp_path):
    flags = dict(cache=1, has_scale=1)
    off = _ptx(tmp_path, "float32", 4, flags, "off")
    keep = _ptx(tmp_path, "float32", 4, dict(flags, keep=1), "keep")
    meet = _ptx(tmp_path, "float32", 4, dict(flags, meet=1), "meet")
    for ptx in (off, meet):
        assert "createpolicy" not in ptx and "cache_hint" not in ptx
    for pol in ("evict_last", "evict_normal", "evict_first"):
        assert f"createpolicy.fractional.L2::{pol}" in keep
    assert "ld.global.L2::cache_hint.v4.u32" in keep
    assert "ld.acquire.gpu" in meet and "ld.acquire.gpu" not in off
    assert "nanosleep" in off and "nanosleep" not in meet


# ---- the switches under the fake CuPy ------------------------------------------------------------------------------

def test_switches_build_their_kernels_and_arguments_under_the_fake_cupy():
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
M._l2[0] = ({L2}, True)
BC.ENABLED = False
def cl(a):
    perm = (0, *range(2, a.ndim), 1); back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return fakecp.asarray(np.ascontiguousarray(a.transpose(perm))).transpose(back)
"""
    code = """
c = 64
x = cl(np.zeros((40, c, 56, 56), np.float32))   # 125440 rows: ~30 groups a block at 264 blocks (more than the slots)
sc, bi = fakecp.asarray(np.ones(c, np.float32)), fakecp.asarray(np.zeros(c, np.float32))
count, kls = {}, {}
for meet, keep, frac, last in ((False, frozenset(), 0.65, 1), (True, frozenset(), 0.65, 1),
                               (False, frozenset({"bwd"}), 0.65, 1), (True, frozenset({"fwd", "bwd"}), 0.65, 0),
                               (False, frozenset({"fwd", "bwd"}), 0.3, 1)):
    M.MEET, M.KEEP, M.KEEP_FRAC, M.KEEP_LAST = meet, keep, frac, last
    for rep in range(2):            # the second call through the settled objects (their switch check)
        n0, a0 = len(names), len(args)
        y, m, i = K.forward_training(x, sc, bi, 0.1, None, None, 1e-5)
        K.backward(x, y, sc, m, i, y=y, want_dz=True)
        got = names[n0:]
        assert [g[0] for g in got] == ["bnc_fwd1", "bnc_bwd1"], got
        for (name, dims, full), d in zip(got, ("fwd", "bwd")):
            assert ("-DMEET=1" in full) is meet, (meet, name, full)
            assert ("-DKEEP=1" in full) is (d in keep), (keep, name, full)
        if rep == 0:                # launches prepared once per setting: ks last, then (KEEP) kl and klast
            made = args[a0:]
            assert len(made) == 2, made
            for (n, a), d in zip(made, ("fwd", "bwd")):
                extra = 2 if d in keep else 0
                if extra:
                    assert a[-1] == last, a
                    kls[(d, frac)] = a[-2]
                count.setdefault(d, set()).add(n - extra)      # the arguments before kl: the same
        else:
            assert len(args) == a0, "settled: nothing prepared again"
assert all(len(v) == 1 for v in count.values()), count
# 125440 rows, 264 blocks of 16 rows: 1.08 MB a step and array (30 steps a thread); fused backward 3 arrays, forward 1
step = 264 * 16 * 64 * 4
assert kls[("bwd", 0.65)] == min(30 - 12, int(0.65 * %d) // (3 * step)), kls
assert kls[("fwd", 0.65)] == min(30 - 25, int(0.65 * %d) // step), kls
assert kls[("bwd", 0.3)] == min(30 - 12, int(0.3 * %d) // (3 * step)), kls
print("OK", kls)
""" % (L2, L2, L2)
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_environment_values():
    code = ("import os, sys; sys.path.insert(0, %r)\n"
            "from minidnn.backend.cuda import bn_nhwc as M\n"
            "print(M.MEET, sorted(M.KEEP), M.KEEP_FRAC, M.KEEP_LAST)") % ROOT
    got = {}
    for meet, keep, frac, last in (("", "", "", ""), ("1", "1", "0.4", "0"), ("0", "bwd", "", "1"),
                                   ("yes", " fwd , bwd ", "", ""), ("", "nonsense", "", "")):
        env = dict(os.environ)
        for k, v in (("MEET", meet), ("KEEP", keep), ("KEEP_FRAC", frac), ("KEEP_LAST", last)):
            env.pop(f"MINIDNN_BN_NHWC_{k}", None)
            if v:
                env[f"MINIDNN_BN_NHWC_{k}"] = v
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        got[(meet, keep, frac, last)] = r.stdout.strip()
    assert list(got.values()) == ["False [] 0.65 1", "True ['bwd', 'fwd'] 0.4 0", "False ['bwd'] 0.65 1",
                                  "False ['bwd', 'fwd'] 0.65 1", "False [] 0.65 1"]


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


BOTH = frozenset({"fwd", "bwd"})
# (MEET, KEEP, KEEP_FRAC, KEEP_LAST): the default first; "all" compiles one more kernel per configuration, the other
# KEEP settings are arguments of it (a tiny fraction keeps one step: the tail / evict-first split inside small walks)
DEFAULT = (False, frozenset(), 0.65, 1)
ALL = (True, BOTH, 0.65, 1)
ARGS_ONLY = [(True, BOTH, 0.65, 0), (True, BOTH, 1e-9, 1), (True, BOTH, 1e-3, 1)]


def _set(monkeypatch, setting):
    for k, v in zip(("MEET", "KEEP", "KEEP_FRAC", "KEEP_LAST"), setting):
        monkeypatch.setattr(M, k, v)


# ragged rows, odd channel counts (C = 3: scalars; 5, 24: narrower vectors), 2-D input, two column chunks, and the
# example models' shapes; slots 0 (every vector from memory, kept or evict-first), 1 (a part), None (what fits)
ONE = ("float32", (33, 8, 12, 12))        # also MEET alone and KEEP alone (their own builds: fewer compiles elsewhere)
SHAPES = [(5, 3, 9, 9), (8, 24, 7, 7), (7, 5), (2, 1040, 3, 3), (33, 8, 12, 12), (128, 16, 32, 32), (128, 64, 8, 8)]
CASES = [(name, shape, ops) for name in ("float32", "bfloat16") for shape in SHAPES
         for ops in ("bn", "bn_add_activation")] + \
    [("float32", (8, 24, 7, 7), "bn_activation"), ("float16", (33, 8, 12, 12), "bn_add_activation")]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, ops", CASES, ids=str)
def test_candidates_give_the_default_bits_and_the_reference(gpu, name, shape, ops):
    cp, monkeypatch, clear = gpu
    seed = zlib.crc32(repr((name, shape, ops)).encode())
    for cap in (0, 1, None):
        if cap == 1 and shape[0] >= 128:
            continue
        monkeypatch.setattr(M, "SLOTS_CAP", cap)
        _set(monkeypatch, DEFAULT)
        clear()
        want = _both(cp, name, shape, ops, seed)
        alone = [(True, frozenset(), 0.65, 1), (False, BOTH, 0.65, 1)] if (name, shape) == ONE else []
        for setting in [ALL] + (ARGS_ONLY if cap == 0 else []) + alone:
            _set(monkeypatch, setting)
            clear()
            got = _both(cp, name, shape, ops, seed)
            for k, (a, b) in enumerate(zip(want, got)):
                np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}, slots {cap}, {setting}")
        _check(cp, name, shape, ops, "one", seed=seed)          # the last candidate setting still on
    monkeypatch.setattr(M, "SLOTS_CAP", None)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_add_activation"])
def test_large_tensor_default_bits_and_reference(gpu, name, ops):
    # (128, 64, 56, 56): the walk ~96 (float32) / ~48 (bfloat16) vectors a thread, 12 / 11 of them in the copy,
    # 10-15 kept in L2; both, with the tail evict-normal, with a third of L2 (arguments of one build)
    cp, monkeypatch, clear = gpu
    _set(monkeypatch, DEFAULT)
    clear()
    want = _both(cp, name, LARGE, ops, 2)
    for setting in (ALL, (True, BOTH, 0.65, 0), (True, BOTH, 0.3, 1)):
        _set(monkeypatch, setting)
        clear()
        got = _both(cp, name, LARGE, ops, 2)
        for k, (a, b) in enumerate(zip(want, got)):
            np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}, {setting}")
    _check(cp, name, LARGE, ops, "one", seed=2)


@pytest.mark.cuda
def test_float64_against_the_reference(gpu):
    cp, monkeypatch, clear = gpu
    _set(monkeypatch, ALL)
    for cap in (0, None):
        monkeypatch.setattr(M, "SLOTS_CAP", cap)
        clear()
        for shape in ((5, 3, 9, 9), (8, 24, 7, 7)):
            _check(cp, "float64", shape, "bn_add_activation", "one", seed=4)
    monkeypatch.setattr(M, "SLOTS_CAP", None)
