"""Session 18's PREFETCH for the channels-last batch-norm one-launch kernels (docs/step_kernels.md, "Session 18:
channels-last batch norm prefetch"): L2 prefetches PREFETCH loop trips ahead in the streaming walks of the on-chip
copy's kernels (bnc_fwd1, bnc_bwd1), the loads and sums untouched.
CPU: the environment values and set_prefetch (bad values raise before anything changes; the settled calls dropped;
switch() carries both), the fake CuPy (the compile flags the only difference: the same grids, arguments and shared
memory; a flip settles the call again), nvcc (no spills, <= 128 registers, the prefetches where the walks read memory:
per entry the count of the arrays each walk streams, none with it off).  cuda: every setting bit for bit against it
off -- (32, 256, 56, 56) as the table runs it (KEEP, SPLIT) and ragged / small / wide-row shapes with the copy holding
nothing or all it can -- and against float64."""
import os
import re
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

from minidnn.backend.cuda import bn_nhwc as M
from tests.backend.test_bn_nhwc_cuda import _bits, _check
from tests.backend.test_bn_nhwc_l2 import _both, _compile, _dt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H200_SMEM = (233472, 232448)
L2 = 50 * 1024 * 1024
WIDE = (32, 256, 56, 56)


def test_environment_values():
    code = """import importlib, os, sys
sys.path.insert(0, %r)
from minidnn.backend.cuda import bn_nhwc as M
for pf, ap in ((None, None), ("2", None), (" 8 ", "0"), ("0", "1"), ("9", None), ("-1", None), ("x", None)):
    for k, v in (("PREFETCH", pf), ("PREFETCH_APPLY", ap)):
        os.environ.pop("MINIDNN_BN_NHWC_" + k, None)
        if v is not None:
            os.environ["MINIDNN_BN_NHWC_" + k] = v
    try:
        importlib.reload(M)
        print(M.PREFETCH, M.PREFETCH_APPLY)
    except ValueError as e:
        print("ValueError", "MINIDNN_BN_NHWC_PREFETCH" in str(e))
""" % ROOT
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIDNN_BN_NHWC_PREFETCH")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:-1] == ["0 True", "2 True", "8 False", "0 True", "ValueError True",
                                         "ValueError True", "ValueError True"], r.stdout


def test_set_prefetch_checks_first_and_drops_the_settled_calls(monkeypatch):
    from minidnn.backend.cuda import bn_kernels as K
    monkeypatch.setattr(M, "PREFETCH", 0)
    monkeypatch.setattr(M, "PREFETCH_APPLY", True)
    monkeypatch.setattr(M, "_calls", {"a": 1})
    monkeypatch.setattr(K, "_calls", {"b": 2})
    before = M.switch()
    for bad in (9, -1, 1.5, True, "1", 2.0):
        with pytest.raises(ValueError):
            M.set_prefetch(bad)
        assert (M.PREFETCH, M.PREFETCH_APPLY, M._calls, K._calls) == (0, True, {"a": 1}, {"b": 2}), bad
    M.set_prefetch(2, apply=False)
    assert (M.PREFETCH, M.PREFETCH_APPLY, M._calls, K._calls) == (2, False, {}, {})
    assert M.switch() != before and M.switch()[-1][-2:] == (2, False)
    M.set_prefetch(apply=True)
    assert (M.PREFETCH, M.PREFETCH_APPLY) == (2, True)
    M.set_prefetch(np.int64(0))
    assert (M.PREFETCH, M.PREFETCH_APPLY) == (0, True) and M.switch() == before


def test_only_the_compile_flags_change_under_the_fake_cupy():
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
CASES = [((32, 256, 56, 56), np.float32), ((32, 256, 56, 56), bf), ((256, 32, 56, 56), bf),
         ((128, 16, 32, 32), np.float32), ((8, 24, 7, 7), bf), ((2, 1040, 3, 3), np.float32)]
SETTINGS = [(0, True), (1, True), (2, False), (8, True), (0, False)]
seen = {}
for pf, ap in SETTINGS:
    M.set_prefetch(pf, ap)
    for shape, dt in CASES:
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
            assert len(made) == 2, (pf, ap, shape, made)       # a flip settles the call again
            for (name, dims, full), a in zip(got, made):
                want = [f"'-DPREFETCH={pf}'"] if pf else []
                if pf and ap:
                    want.append("'-DPREFETCH_APPLY=1'")
                have = re.findall(r"'-DPREFETCH[A-Z_]*=[0-9]+'", full)
                assert have == want, (pf, ap, shape, name, have)
                base = re.sub(r", '-DPREFETCH[A-Z_]*=[0-9]+'", "", full)
                seen.setdefault((shape, str(dt), name), []).append((base, a))
for key, runs in seen.items():
    assert len(runs) == len(SETTINGS)
    for base, a in runs:
        assert base == runs[0][0] and a == runs[0][1], (key, base, runs[0][0], a, runs[0][1])
print("OK", len(seen))
"""
    r = subprocess.run([sys.executable, "-c", head + "import re\n" + code], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0 and "OK 12" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


# ---- nvcc --------------------------------------------------------------------------------------------------------

def _entries(ptx):
    """entry name -> its PTX text"""
    out, cur = {}, None
    for line in ptx.splitlines():
        m = re.match(r"\.visible \.entry (\w+)\(", line)
        if m:
            cur = m.group(1)
        if cur:
            out[cur] = out.get(cur, "") + line + "\n"
    return out


def _prefetches(tmp_path, name, vec, flags, tag):
    src = tmp_path / f"{tag}.cu"
    src.write_text(M.source_for_nvcc(_dt(name), vec, **flags))
    out = tmp_path / f"{tag}.ptx"
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "--ptx", "-o", str(out), str(src)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return {k: v.count("prefetch.global.L2") for k, v in _entries(out.read_text()).items()}


_ALL = dict(relu=1, has_z=1, has_scale=1, has_bias=1)
COMPILE = [("float32", 4, _ALL), ("bfloat16", 8, _ALL), ("float32", 4, dict(has_scale=1, has_bias=1, split=1)),
           ("bfloat16", 8, dict(has_scale=1, has_bias=1, split=1))]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, vec, flags", COMPILE, ids=str)
def test_prefetch_compiles_without_spills_and_streams_every_array(tmp_path, name, vec, flags):
    # KEEP as on the large tensors (the tightest registers: bfloat16 sits at the 128 of 2 blocks an SM either way)
    base = dict(cache=1, keep=1, **flags)
    on = _compile(tmp_path, name, vec, dict(base, prefetch=2, pf_apply=1), "on")
    for k in ("bnc_fwd1", "bnc_bwd1"):
        assert on[k]["spill"] == 0 and on[k]["regs"] <= 65536 // (256 * M.BPS), (k, on[k])
    relu, z = bool(flags.get("relu")), bool(flags.get("has_z"))
    # per loop trip, one prefetch a vector and streamed array: forward reduction x (UNROLL_F); the elementwise pass x
    # and z from memory, z alone beside the copy's slots; backward dy, x (y) in both passes
    fwd_red, bwd_red = M.UNROLL_F, M.UNROLL * (2 + relu)
    want = {(1, True): {"bnc_fwd1": fwd_red + M.UNROLL * (1 + z) + M.UNROLL * z, "bnc_bwd1": 2 * bwd_red},
            (1, False): {"bnc_fwd1": fwd_red, "bnc_bwd1": bwd_red}}
    for (pf, ap), w in want.items():
        got = _prefetches(tmp_path, name, vec, dict(base, prefetch=pf, pf_apply=ap), f"p{pf}{ap}")
        assert {k: got[k] for k in w} == w, (pf, ap, got)
    off = _prefetches(tmp_path, name, vec, base, "off")
    assert not any(off.values()), off


# ---- GPU ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def gpu(monkeypatch):
    """(cupy, monkeypatch, clear): the one-launch route with the on-chip copy, call caches cleared around the test."""
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    from minidnn.backend.cuda import bn_kernels as K
    monkeypatch.setattr(M, "ROUTE", "one")
    monkeypatch.setattr(M, "ONCHIP", True)
    monkeypatch.setattr(M, "PREFETCH", 0)
    monkeypatch.setattr(M, "PREFETCH_APPLY", True)

    def clear():
        M._calls.clear(); K._calls.clear(); K._plans.clear()       # noqa: E702
    clear()
    yield _dev.require_cupy(), monkeypatch, clear
    clear()


def _runs(gpu, name, shape, ops, seed, settings):
    """setting -> every output of forward + backward, and the kernels' prefetch flags asked for"""
    cp, monkeypatch, clear = gpu
    asked = []
    kernel = M._kernel

    def ask(kname, dtype, vec, **flags):
        asked.append((kname, flags.get("prefetch", 0), bool(flags.get("pf_apply"))))
        return kernel(kname, dtype, vec, **flags)
    monkeypatch.setattr(M, "_kernel", ask)
    out = {}
    for pf, ap in settings:
        M.set_prefetch(pf, ap)
        clear()
        asked.clear()
        out[(pf, ap)] = _both(cp, name, shape, ops, seed)
        assert asked == [(k, pf, ap and bool(pf)) for k in ("bnc_fwd1", "bnc_bwd1")], (pf, ap, asked)
    monkeypatch.setattr(M, "_kernel", kernel)
    return out


def _same(out):
    ref = out[(0, True)]
    for key, got in out.items():
        for k, (a, b) in enumerate(zip(ref, got)):
            np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=f"output {k}, setting {key}")


@pytest.mark.cuda
@pytest.mark.parametrize("name, ops", [("float32", "bn"), ("float32", "bn_add_activation"),
                                       ("bfloat16", "bn_activation"), ("bfloat16", "bn_add_activation")], ids=str)
def test_wide_tensor_prefetch_gives_the_bits_without_it(gpu, name, ops):
    # as session 17's table runs it: 264 blocks, KEEP (over L2), SPLIT (distance 2 and the reduction alone: on a
    # small shape below, where they cost the same compiles and less data)
    _same(_runs(gpu, name, WIDE, ops, 7, [(0, True), (1, True)]))


# ragged rows, a scalar path (C = 3), two column chunks, ResNet-20's shape; the copy holding nothing (every vector
# streamed: the prefetch's whole range) or what fits; distance 8 reaches past the walk's end on most threads
# (C = 1040 fp32: 260 vectors a row, two column chunks); every setting kind on the first
SMALL = [("float32", (8, 24, 7, 7), "bn_add_activation"), ("bfloat16", (128, 16, 32, 32), "bn_activation"),
         ("float32", (5, 3, 9, 9), "bn_add_activation"), ("float32", (2, 1040, 3, 3), "bn")]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, ops", SMALL, ids=str)
def test_prefetch_at_small_and_ragged_sizes_gives_the_bits_without_it_and_the_reference(gpu, name, shape, ops):
    cp, monkeypatch, clear = gpu
    seed = zlib.crc32(repr((name, shape, ops)).encode())
    settings = [(0, True), (2, False), (8, True), (1, True)] if shape == (8, 24, 7, 7) else [(0, True), (1, True)]
    for cap in (0, None):
        monkeypatch.setattr(M, "SLOTS_CAP", cap)
        _same(_runs(gpu, name, shape, ops, seed, settings))
        _check(cp, name, shape, ops, "one", seed=seed)           # PREFETCH 1 still on: against float64
    monkeypatch.setattr(M, "SLOTS_CAP", None)
