"""Session 12's KEEP for the channels-last batch-norm one-launch kernels (docs/step_kernels.md, "Session 12:
channels-last batch norm"): L2 eviction policies -- the reduction pass's newest kl steps evict-last, every other load
evict-first -- taken by default only where the call's data (its (R, C) arrays read and written) exceeds the device's
L2; every smaller call takes the kernel without it.  Neither changes a sum or its order.
CPU: the kept steps emulated over the walk (they are the first the elementwise pass reads, never a shared-memory
slot), kl's arithmetic, the size rule, nvcc (no spills, <= 128 registers, the same static shared memory, the PTX KEEP
asks for and none without), the rule and the switches under the fake CuPy (kernel options and arguments), the
environment values.  cuda: KEEP bit for bit against the kernel without it and against the float64 reference; the rule
on the device's own L2."""
import functools
import os
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

from minidnn.backend.cuda import bn_nhwc as M
from minidnn.backend.cuda import device_facts as F
from tests._nvcc import pick
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


def test_keep_rule_is_the_calls_data_against_l2(monkeypatch):
    monkeypatch.setattr(M, "KEEP", frozenset({"fwd", "bwd"}))
    monkeypatch.setattr(M, "KEEP_ABOVE", None)
    monkeypatch.setattr(M, "ONCHIP", True)
    f32, bf16 = np.dtype(np.float32), _dt("bfloat16")
    bn, fused = dict(has_scale=True), dict(relu=True, has_z=True, has_scale=True)
    e = 128 * 56 * 56 * 64                      # (128, 64, 56, 56): 102.8 MB float32, 51.4 MB bfloat16 an array
    assert M.footprint(True, f32, e // 64, 64, bn) == 2 * 4 * e                 # x, y
    assert M.footprint(True, f32, e // 64, 64, fused) == 3 * 4 * e              # x, z, y
    assert M.footprint(False, f32, e // 64, 64, bn) == 3 * 4 * e                # x, dy, dx
    assert M.footprint(False, f32, e // 64, 64, fused) == 5 * 4 * e             # x, dy, y, dx, dz
    h100, h200 = 50 * 2 ** 20, 60 * 2 ** 20
    for l2 in (h100, h200):
        monkeypatch.setitem(F._l2, 99, (l2, True))
        for dt in (f32, bf16):
            for fwd in (True, False):
                for flags in (bn, fused):
                    # the large shape: run 5's gains (bfloat16 forward: x alone 51.4 MB < an H200's L2, x + y not)
                    assert M.keep_call(fwd, dt, 128 * 56 * 56, 64, flags, 99)
                    # the models' shapes, where KEEP lost 2-8%: far under either L2
                    assert not M.keep_call(fwd, dt, 128 * 32 * 32, 16, flags, 99)
                    assert not M.keep_call(fwd, dt, 128 * 8 * 8, 64, flags, 99)
        # the boundary: one byte over the L2 takes it, the L2 exactly does not (forward x + y, float32, C = 64)
        rows = l2 // (2 * 4 * 64)
        assert M.footprint(True, f32, rows, 64, bn) == l2
        assert not M.keep_call(True, f32, rows, 64, bn, 99)
        assert M.keep_call(True, f32, rows + 1, 64, bn, 99)
        # the same rows, the fused forward (z as well): over
        assert M.keep_call(True, f32, rows, 64, fused, 99)
    monkeypatch.setitem(F._l2, 99, (h100, True))
    monkeypatch.setattr(M, "KEEP_ABOVE", 0)                     # the tests' switch: KEEP at every size
    assert M.keep_call(True, f32, 7, 5, bn, 99)
    monkeypatch.setattr(M, "KEEP_ABOVE", None)
    monkeypatch.setattr(M, "KEEP", frozenset({"bwd"}))          # the direction asked
    assert not M.keep_call(True, f32, 128 * 56 * 56, 64, bn, 99)
    assert M.keep_call(False, f32, 128 * 56 * 56, 64, bn, 99)
    monkeypatch.setattr(M, "KEEP", frozenset())                 # MINIDNN_BN_NHWC_KEEP=0: nowhere
    assert not M.keep_call(False, f32, 128 * 56 * 56, 64, bn, 99)
    monkeypatch.setattr(M, "KEEP", frozenset({"fwd", "bwd"}))
    monkeypatch.setitem(F._l2, 99, (h100, False))       # below sm_80: no hints
    assert not M.keep_call(False, f32, 128 * 56 * 56, 64, bn, 99)
    monkeypatch.setitem(F._l2, 99, (0, False))          # a device that does not say
    assert not M.keep_call(False, f32, 128 * 56 * 56, 64, bn, 99)
    monkeypatch.setitem(F._l2, 99, (h100, True))
    monkeypatch.setattr(M, "ONCHIP", False)                     # the kernels without the copy
    assert not M.keep_call(False, f32, 128 * 56 * 56, 64, bn, 99)


# ---- nvcc --------------------------------------------------------------------------------------------------------

def _dt(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


def _compile(tmp_path, name, vec, flags, tag, entries=("bnc_fwd1", "bnc_bwd1")):
    """ptxas builds only ``entries`` (--entry: each entry's registers, spills and static memory are its own, the same
    as in the whole module; the other four kernels were two thirds of ptxas's time)."""
    src = tmp_path / f"{tag}.cu"
    src.write_text(M.source_for_nvcc(_dt(name), vec, **flags))
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas",
                        ",".join(["-v", *(f"--entry={e}" for e in entries)]), "-o",
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
@pytest.mark.parametrize("name, vec, flags", pick(COMPILE, 4), ids=str)
def test_keep_compiles_without_spills_and_with_the_same_static_memory(tmp_path, name, vec, flags):
    off = _compile(tmp_path, name, vec, dict(cache=1, **flags), "off")
    for tag, extra in (("keep", dict(keep=1)),):
        on = _compile(tmp_path, name, vec, dict(cache=1, **flags, **extra), tag)
        for k in ("bnc_fwd1", "bnc_bwd1"):
            assert on[k]["spill"] == 0 and on[k]["regs"] <= 65536 // (256 * M.BPS), (tag, k, on[k])
            assert on[k]["smem"] == off[k]["smem"], (tag, k, on[k], off[k])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_keep_reaches_the_ptx(tmp_path):
    flags = dict(cache=1, has_scale=1)
    off = _ptx(tmp_path, "float32", 4, flags, "off")
    keep = _ptx(tmp_path, "float32", 4, dict(flags, keep=1), "keep")
    assert "createpolicy" not in off and "cache_hint" not in off
    for pol in ("evict_last", "evict_normal", "evict_first"):
        assert f"createpolicy.fractional.L2::{pol}" in keep
    assert "ld.global.L2::cache_hint.v4.u32" in keep
    assert "nanosleep" in off and "nanosleep" in keep           # the meeting as it was (MEET removed)


# ---- the switches under the fake CuPy ------------------------------------------------------------------------------

def test_rule_and_switches_build_their_kernels_and_arguments_under_the_fake_cupy():
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
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
def cl(a):
    perm = (0, *range(2, a.ndim), 1); back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return fakecp.asarray(np.ascontiguousarray(a.transpose(perm))).transpose(back)
"""
    code = """
c = 64
sc, bi = fakecp.asarray(np.ones(c, np.float32)), fakecp.asarray(np.zeros(c, np.float32))
# large: 125440 rows (32.1 MB an array; forward x + y 64 MB, fused backward 5 arrays: over the 50 MiB L2), ~30 groups
# a block at 264 blocks (more than the slots); small: (8, 64, 28, 28), 1.6 MB an array
shapes = {"large": cl(np.zeros((40, c, 56, 56), np.float32)), "small": cl(np.zeros((8, c, 28, 28), np.float32))}
BOTH = frozenset({"fwd", "bwd"})
SET = {"off": (frozenset(), 0.40, 1, None), "default": (BOTH, 0.40, 1, None),
       "bwd": (frozenset({"bwd"}), 0.40, 1, None), "keepn65": (BOTH, 0.65, 0, None), "forced": (BOTH, 0.40, 1, 0)}
assert (M.KEEP, M.KEEP_FRAC, M.KEEP_LAST, M.KEEP_ABOVE) == SET["default"], "the module's default"
seen, kls = {}, {}
for label, (keep, frac, last, above) in SET.items():
    M.KEEP, M.KEEP_FRAC, M.KEEP_LAST, M.KEEP_ABOVE = keep, frac, last, above
    for sname, x in shapes.items():
        for rep in range(2):            # the second call through the settled objects (their switch check)
            n0, a0 = len(names), len(args)
            y, m, i = K.forward_training(x, sc, bi, 0.1, None, None, 1e-5)
            K.backward(x, y, sc, m, i, y=y, want_dz=True)
            got = names[n0:]
            assert [g[0] for g in got] == ["bnc_fwd1", "bnc_bwd1"], got
            if rep == 0:                # launches prepared once per setting: ks last, then (KEEP) kl and klast
                made = args[a0:]
                assert len(made) == 2, made
                for (name, dims, full), a, d in zip(got, made, ("fwd", "bwd")):
                    taken = d in keep and (above == 0 or sname == "large")
                    assert ("-DKEEP=1" in full) is taken, (label, sname, d, full)
                    if taken:
                        assert a[1][-1] == last, a
                        kls[(label, sname, d)] = a[1][-2]
                        a = (a[0], a[1][:-2], a[2])
                    seen.setdefault((sname, d), {})[label] = (full, a)
            else:
                assert len(args) == a0, "settled: nothing prepared again"
# without KEEP: the kernel (source name and options) and every argument of "off", whatever the setting
for (sname, d), by in seen.items():
    for label, (full, a) in by.items():
        assert a == by["off"][1], (sname, d, label)
        if "-DKEEP=1" not in full:
            assert full == by["off"][0], (sname, d, label)
assert seen[("small", "fwd")]["default"][0] == seen[("small", "fwd")]["off"][0]
assert seen[("small", "bwd")]["default"][0] == seen[("small", "bwd")]["off"][0]
# 125440 rows, 264 blocks of 16 rows: 1.08 MB a step and array (30 steps a thread); fused backward 3 arrays, forward 1
step = 264 * 16 * 64 * 4
assert kls[("default", "large", "bwd")] == min(30 - 12, int(0.40 * %d) // (3 * step)) == 6, kls
assert kls[("default", "large", "fwd")] == min(30 - 25, int(0.40 * %d) // step) == 5, kls
assert kls[("keepn65", "large", "bwd")] == min(30 - 12, int(0.65 * %d) // (3 * step)) == 10, kls
assert ("bwd", "large", "fwd") not in kls and ("default", "small", "bwd") not in kls
print("OK", kls)
""" % (L2, L2, L2)
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_environment_values(env_runs):
    # one interpreter (tests/conftest.py env_runs): the first setting a fresh import, the others the module re-executed
    code = ("from minidnn.backend.cuda import bn_nhwc as M\n"
            "print(sorted(M.KEEP), M.KEEP_FRAC, M.KEEP_LAST, M.KEEP_ABOVE, hasattr(M, 'MEET'))")
    # None: the variable unset; "": set to the empty string
    cases = ((None, None, None), ("0", None, None), ("", None, None), ("1", "0.65", "0"), ("bwd", None, "1"),
             (" fwd , bwd ", None, None), ("nonsense", None, None))
    envs = [{f"MINIDNN_BN_NHWC_{k}": v for k, v in (("KEEP", keep), ("KEEP_FRAC", frac), ("KEEP_LAST", last))
             if v is not None} for keep, frac, last in cases]
    runs = env_runs("minidnn.backend.cuda.bn_nhwc", code, envs, drop=("MINIDNN_BN_NHWC_KEEP", "MINIDNN_BN_NHWC_MEET"))
    for rc, _, err in runs:
        assert rc == 0, err[-800:]
    assert [out.strip() for _, out, _ in runs] == [
        "['bwd', 'fwd'] 0.4 1 None False", "[] 0.4 1 None False", "[] 0.4 1 None False",
        "['bwd', 'fwd'] 0.65 0 None False", "['bwd'] 0.4 1 None False", "['bwd', 'fwd'] 0.4 1 None False",
        "[] 0.4 1 None False"]


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


# the host arrays of the last cases (read only: copied to the GPU), so that a setting's run does not draw the large
# tensor's 25.7M values x 3 again
_host_data = functools.lru_cache(maxsize=2)(_data)


def _both(cp, name, shape, ops, seed):
    """forward + backward (fused as ``ops`` says) on channels-last data: every output, running statistics and
    counter included, in a list of arrays."""
    x, dy, z, scale, bias, rm, rv = _host_data(name, shape, ops, seed)
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
# (KEEP, KEEP_FRAC, KEEP_LAST, KEEP_ABOVE).  OFF: the kernel without KEEP (MINIDNN_BN_NHWC_KEEP=0), the bits every
# other setting must give; ADOPTED: the default (KEEP where the call's data exceeds L2); FORCED: KEEP at every size (one
# more kernel per configuration); the others are arguments of that build (a tiny fraction keeps one step: the tail /
# evict-first split inside small walks)
OFF = (frozenset(), 0.40, 1, None)
ADOPTED = (BOTH, 0.40, 1, None)
FORCED = (BOTH, 0.40, 1, 0)
ARGS_ONLY = [(BOTH, 0.40, 0, 0), (BOTH, 1e-9, 1, 0), (BOTH, 1e-3, 1, 0)]


def _set(monkeypatch, setting):
    for k, v in zip(("KEEP", "KEEP_FRAC", "KEEP_LAST", "KEEP_ABOVE"), setting):
        monkeypatch.setattr(M, k, v)


def _recording_kernels(monkeypatch):
    """The (kernel name, KEEP build) of every kernel the one-launch plans ask for from now on."""
    asked, kernel = [], M._kernel

    def record(name, dtype, vec, **flags):
        asked.append((name, bool(flags.get("keep"))))
        return kernel(name, dtype, vec, **flags)
    monkeypatch.setattr(M, "_kernel", record)
    return asked


# ragged rows, odd channel counts (C = 3: scalars, 2-byte vectors in bfloat16; 5, 24: narrower vectors), 2-D input,
# two column chunks; slots 0 (every vector from memory, kept or evict-first), 1 (a part), None (what fits).  Kernel
# configurations kept few (NVRTC compiles): float32 vec 4 and bfloat16 vec 8 are the large test's; the scalar path
# with the fused ops only.
CASES = [(name, shape, ops) for name in ("float32", "bfloat16") for shape in ((8, 24, 7, 7), (2, 1040, 3, 3))
         for ops in ("bn", "bn_add_activation")] + \
    [(name, shape, "bn_add_activation") for name in ("float32", "bfloat16") for shape in ((5, 3, 9, 9), (7, 3))] + \
    [("float32", (33, 8, 12, 12), "bn_add_activation")]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, ops", CASES, ids=str)
def test_keep_at_every_size_gives_the_bits_without_it_and_the_reference(gpu, name, shape, ops):
    cp, monkeypatch, clear = gpu
    seed = zlib.crc32(repr((name, shape, ops)).encode())
    for cap in (0, 1, None):
        monkeypatch.setattr(M, "SLOTS_CAP", cap)
        _set(monkeypatch, OFF)
        clear()
        want = _both(cp, name, shape, ops, seed)
        for setting in [FORCED] + (ARGS_ONLY if cap == 0 else []):
            _set(monkeypatch, setting)
            clear()
            got = _both(cp, name, shape, ops, seed)
            for k, (a, b) in enumerate(zip(want, got)):
                np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}, slots {cap}, {setting}")
        _check(cp, name, shape, ops, "one", seed=seed)          # the last KEEP setting still on
    monkeypatch.setattr(M, "SLOTS_CAP", None)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_add_activation"])
def test_large_tensor_takes_keep_by_default_with_the_bits_without_it(gpu, name, ops):
    # (128, 64, 56, 56): 102.8 MB (float32) / 51.4 MB (bfloat16) an array -- every call's data over an H100's or an
    # H200's L2; the walk ~96 / ~48 vectors a thread, 12 / 11 of them in the copy; the adopted setting, its tail
    # evict-normal, 0.65 of L2 (arguments of one build), all the bits of the kernel without KEEP
    cp, monkeypatch, clear = gpu
    asked = _recording_kernels(monkeypatch)
    _set(monkeypatch, OFF)
    clear()
    want = _both(cp, name, LARGE, ops, 2)
    assert asked == [("bnc_fwd1", False), ("bnc_bwd1", False)], asked
    for setting in (ADOPTED, (BOTH, 0.40, 0, None), (BOTH, 0.65, 1, None)):
        _set(monkeypatch, setting)
        clear()
        asked.clear()
        got = _both(cp, name, LARGE, ops, 2)
        assert asked == [("bnc_fwd1", True), ("bnc_bwd1", True)], (setting, asked)      # the rule took KEEP
        for k, (a, b) in enumerate(zip(want, got)):
            np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}, {setting}")
    if (name, ops) == ("float32", "bn_add_activation"):
        _check(cp, name, LARGE, ops, "one", seed=2)           # the adopted setting against float64


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(128, 16, 32, 32), (128, 64, 8, 8)], ids=str)
def test_default_under_l2_launches_the_kernel_without_keep(gpu, shape):
    # the example models' shapes (KEEP lost 2-8% there in run 5): the adopted default compiles and launches exactly
    # the kernels and arguments of MINIDNN_BN_NHWC_KEEP=0, on the device's own L2 size
    cp, monkeypatch, clear = gpu
    l2, hints = F.l2_info(cp.cuda.Device().id)
    asked = _recording_kernels(monkeypatch)
    made = []
    prepare = M._launch.prepare

    def record(k, grid, block, a, **kw):
        made.append((k, tuple(grid), [None if v is None else float(v) for v in a], kw.get("shared_mem")))
        return prepare(k, grid, block, a, **kw)
    monkeypatch.setattr(M._launch, "prepare", record)
    runs = {}
    for label, setting in (("off", OFF), ("default", ADOPTED)):
        _set(monkeypatch, setting)
        clear()
        made.clear()
        out = _both(cp, "float32", shape, "bn_add_activation", 5)
        runs[label] = (list(made), out)
    assert M.footprint(False, np.float32, int(np.prod(shape)) // shape[1], shape[1], dict(relu=1, has_z=1)) < l2
    assert asked == [("bnc_fwd1", False), ("bnc_bwd1", False)] * 2, asked
    assert len(runs["off"][0]) == 2 and len(runs["default"][0]) == 2
    for a, b in zip(runs["off"][0], runs["default"][0]):
        assert a[0] is b[0] and a[1:] == b[1:], (a[1:], b[1:])      # the same compiled kernel object, arguments
    for k, (a, b) in enumerate(zip(runs["off"][1], runs["default"][1])):
        np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}")


@pytest.mark.cuda
def test_float64_against_the_reference(gpu):
    cp, monkeypatch, clear = gpu
    _set(monkeypatch, FORCED)
    for cap in (0, None):
        monkeypatch.setattr(M, "SLOTS_CAP", cap)
        clear()
        for shape in ((5, 3, 9, 9), (8, 24, 7, 7)):
            _check(cp, "float64", shape, "bn_add_activation", "one", seed=4)
    monkeypatch.setattr(M, "SLOTS_CAP", None)
