"""Session 18 (issue 10, helper BNH200B): the one-pass batch-norm kernels' second round of bytes in flight --
bn_kernels.ONEPASS_PREFETCH_BWD (MINIDNN_BN_PREFETCH_BWD: bn_bwd1's own L2 prefetch distance, -1 = PREFETCH's) and
ONEPASS_TAIL (MINIDNN_BN_TAIL: while the second pass reads the on-chip copy, each step of UNROLL vectors asks L2 for
TAIL x UNROLL vectors of the block's next tile) and ONEPASS_STAGE (MINIDNN_BN_STAGE: cp.async of the next tile's
first-pass vectors into the on-chip copy's slots as the second pass frees them), flipped in one process by
bn_kernels.set_onepass.

CPU cases: bad values fail before any launch (set_onepass keeps the settings; the environment at import); the tail's
prefetches, emulated from the kernel's loop, ask for each of the next tile's vectors after the meeting's once, in
order, never past the slice; under the fake CuPy the launches carry -DTAIL / -DSTAGE in both kernels and PREFETCH_BWD's
distance in bn_bwd1 only (the forward keeps PREFETCH's), the same grid and shared memory, and off means no define
(the PTX as before); nvcc: the settings the A/B times compile without spills at 2 blocks an SM, with the tail's
prefetches and STAGE's copies in the PTX.
GPU cases (marked cuda): forward and backward (plain + ReLU, add + ReLU) bitwise equal to the default's with the tail,
the backward's own distance and the staged copies, on shapes of several rounds (where the tail and STAGE fire).
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from minidnn.backend import devices as _dev
from minidnn.backend.cuda import bn_cluster as BC
from minidnn.backend.cuda import bn_kernels as K
from minidnn.backend.cuda import bn_nhwc as M
from tests.backend.test_bn_s18_unroll import ROOT, _bits, _dt, _fake, _gpu_inputs, _gpu_outputs

SETTINGS = ("ONEPASS_UNROLL", "ONEPASS_BPS", "ONEPASS_PREFETCH", "ONEPASS_PREFETCH_BWD", "ONEPASS_TAIL",
            "ONEPASS_STAGE")


def _now():
    return tuple(getattr(K, n) for n in SETTINGS)


# ---- CPU ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [dict(prefetch_bwd=-2), dict(prefetch_bwd=9), dict(tail=-1), dict(tail=9),
                                    dict(tail=1.0), dict(tail=True), dict(prefetch_bwd="2"), dict(stage=2),
                                    dict(stage=-1), dict(stage=True)], ids=str)
def test_set_onepass_rejects_bad_values_and_keeps_the_settings(kwargs):
    before = _now()
    with pytest.raises(ValueError, match="set_onepass"):
        K.set_onepass(**kwargs)
    assert _now() == before


@pytest.mark.parametrize("env, value", [("MINIDNN_BN_TAIL", "9"), ("MINIDNN_BN_TAIL", "one"),
                                        ("MINIDNN_BN_PREFETCH_BWD", "-2"), ("MINIDNN_BN_STAGE", "2")])
def test_bad_environment_switches_fail_at_import_naming_the_variable(env, value):
    r = subprocess.run([sys.executable, "-c", "import minidnn.backend.cuda.bn_kernels"], cwd=ROOT,
                       env={**os.environ, env: value, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and f"{env}=" in r.stderr, r.stderr[-2000:]


def _tail_requests(kc, n_next, start, unroll, tail):
    """The next tile's vectors k the on-chip phase asks L2 for, in order: seq_walk<false>(0, kc) steps k0 = 0, U, ...,
    each prefetch_range(kb = TAIL_FROM + k0 * TAIL, cnt = TAIL * U), which stops at the slice's end; TAIL_FROM is
    PREFETCH * U (after the meeting's prefetches), or kc with STAGE (after the staged slots)."""
    out = []
    for k0 in range(0, kc, unroll):
        for k in range(start + k0 * tail, start + k0 * tail + tail * unroll):
            if k >= n_next:
                break
            out.append(k)
    return out


@pytest.mark.parametrize("unroll", [4, 6])
@pytest.mark.parametrize("pf, tail", [(0, 1), (1, 1), (1, 2), (2, 3)])
@pytest.mark.parametrize("stage", [0, 1])
def test_the_tail_asks_for_each_next_vector_once_after_the_meetings(unroll, pf, tail, stage):
    # kc: the on-chip slots of the big backward (13) and forward (26), a partial last step (7), none (0); n_next: the
    # next slice's vectors (24.5 a thread on (32, 256, 56, 56) backward: 24 or 25), a short one
    for kc in (0, 7, 13, 26):
        for n_next in (3, 24, 25, 49, 200):
            start = kc if stage else pf * unroll
            got = _tail_requests(kc, n_next, start, unroll, tail)
            steps = -(-kc // unroll)
            want = list(range(start, min(n_next, start + steps * unroll * tail)))
            assert got == want, (kc, n_next, got, want)
    # the emulation's kb / cnt are the kernel text's (both kernels)
    assert K.ONEPASS_SOURCE.count("TAIL_FROM + k[0] * TAIL,") == 2
    assert "#define TAIL_FROM (STAGE ? kc : PREFETCH * UNROLL)" in K.ONEPASS_SOURCE


def test_launches_carry_the_tail_and_the_backwards_distance_under_the_fake_cupy():
    _fake("""
def defs(full, name):
    return sorted(o for o in full.split() if o.startswith(f"-D{name}"))
for shape in ((128, 16, 32, 32), (4, 64, 56, 56), (3, 40, 13, 21)):
    K.set_onepass(4, 2, 1, -1, 0)
    base = run(shape, relu=True)
    assert all("-DPREFETCH=1" in f and "TAIL" not in f for _, _, f in base), base
    for tail in (1, 2):
        K.set_onepass(tail=tail)
        got = run(shape, relu=True)
        assert all(f"-DTAIL={tail}" in f and "-DPREFETCH=1" in f for _, _, f in got), got
        assert [g[:2] for g in got] == [b[:2] for b in base], (shape, tail, got, base)  # the same grid and smem
    K.set_onepass(tail=0, prefetch_bwd=3)
    (gf, df, ff), (gb, db, fb) = run(shape, relu=True)
    assert "-DPREFETCH=1" in ff and "-DPREFETCH=3" in fb and "TAIL" not in ff + fb, (ff, fb)
    assert [(gf, df), (gb, db)] == [b[:2] for b in base]
    K.set_onepass(prefetch=0, prefetch_bwd=2)
    (_, _, ff), (_, _, fb) = run(shape, relu=True)
    assert "PREFETCH" not in ff and "-DPREFETCH=2" in fb, (ff, fb)
    K.set_onepass(prefetch=1, prefetch_bwd=0)
    (_, _, ff), (_, _, fb) = run(shape, relu=True)
    assert "-DPREFETCH=1" in ff and "PREFETCH" not in fb, (ff, fb)
    K.set_onepass(prefetch_bwd=-1, stage=1)
    got = run(shape, relu=True)
    assert all("-DSTAGE=1" in f and "TAIL" not in f for _, _, f in got), got
    assert [g[:2] for g in got] == [b[:2] for b in base], (shape, got, base)
    K.set_onepass(stage=0)
    assert run(shape, relu=True) == base
# a call settled before a flip declines after it, nothing launched
x = fakecp.asarray(np.ones((4, 64, 56, 56), np.float32))
sc, bi = fakecp.asarray(np.ones(64, np.float32)), fakecp.asarray(np.zeros(64, np.float32))
call = K.training_call(x, sc, bi, 0.1, None, None, 1e-5)
n0 = len(names)
assert call(x, None, sc, bi, None, None, None) is not None and len(names) == n0 + 1
K.set_onepass(tail=1)
assert call(x, None, sc, bi, None, None, None) is None and len(names) == n0 + 1
print("OK")
""", MINIDNN_BN_PREFETCH="1", MINIDNN_BN_PREFETCH_BWD="-1", MINIDNN_BN_TAIL="0")


def test_the_environment_switches_are_read_at_import_under_the_fake_cupy():
    _fake("""
assert (K.ONEPASS_PREFETCH_BWD, K.ONEPASS_TAIL, K.ONEPASS_STAGE) == (2, 1, 1)
(_, _, ff), (_, _, fb) = run((4, 64, 56, 56))
assert "-DTAIL=1" in ff and "-DTAIL=1" in fb and "-DPREFETCH=1" in ff and "-DPREFETCH=2" in fb, (ff, fb)
assert "-DSTAGE=1" in ff and "-DSTAGE=1" in fb, (ff, fb)
print("OK")
""", MINIDNN_BN_PREFETCH="1", MINIDNN_BN_PREFETCH_BWD="2", MINIDNN_BN_TAIL="1", MINIDNN_BN_STAGE="1")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, pf_bwd, tail, stage", [("float32", -1, 1, 0), ("bfloat16", -1, 2, 0),
                                                       ("float32", 2, 1, 0), ("bfloat16", 0, 1, 1),
                                                       ("float32", -1, 1, 1)], ids=str)
def test_the_timed_settings_compile_without_spills(tmp_path, monkeypatch, name, pf_bwd, tail, stage):
    dt = _dt(name)

    def build(flags, backward, tail_, ptx):
        monkeypatch.setattr(K, "ONEPASS_TAIL", tail_)
        opts = K._onepass_options(dt, False, 16 // dt.itemsize, 1, backward=backward, **flags)
        defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
        f = tmp_path / "k.cu"
        f.write_text(defines + K.ONEPASS_SOURCE)
        out_opts = ["-ptx", "-o", str(tmp_path / "k.ptx")] if ptx else ["-cubin", "-Xptxas", "-v", "-o",
                                                                         str(tmp_path / "k")]
        r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", *out_opts, str(f)], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
        return (tmp_path / "k.ptx").read_text() if ptx else r.stdout + r.stderr

    monkeypatch.setattr(K, "ONEPASS_UNROLL", 4)
    monkeypatch.setattr(K, "ONEPASS_BPS", 2)
    monkeypatch.setattr(K, "ONEPASS_PREFETCH", 1)
    monkeypatch.setattr(K, "ONEPASS_PREFETCH_BWD", pf_bwd)
    monkeypatch.setattr(K, "ONEPASS_STAGE", stage)
    for flags in (dict(has_scale=1, has_bias=1, cache=1), dict(relu=1, has_z=1, has_scale=1, has_bias=1, cache=1)):
        out = build(flags, True, tail, False)        # the backward's options (the forward's differ by PREFETCH)
        spills = [line for line in out.splitlines() if "spill stores" in line]
        assert spills and all(" 0 bytes spill stores" in line for line in spills), out
        regs = [int(w.split()[1]) for line in out.splitlines() if "Used" in line for w in [line[line.index("Used"):]]]
        assert regs and max(regs) <= 128, regs
    # the tail's prefetches are in the text: one more an array read by the first pass (x forward; dy, x (, y)
    # backward), in both kernels of the source
    flags = dict(relu=1, has_z=1, has_scale=1, has_bias=1, cache=1)
    n0 = build(flags, True, 0, True).count("prefetch.global.L2")
    ptx = build(flags, True, tail, True)
    assert ptx.count("prefetch.global.L2") == n0 + 1 + 3, (n0, ptx.count("prefetch.global.L2"))
    # STAGE: x's copy (forward), x's and dy's (backward), UNROLL each; one wait a kernel
    assert (ptx.count("cp.async.cg.shared.global"), ptx.count("cp.async.wait_all")) == ((4 + 8, 2) if stage else (0, 0))


# ---- GPU -----------------------------------------------------------------------------------------------------------

# backward plans of several rounds (the tail fires where a block has a next tile): the big tensor at vec 4 / 8 (the
# bfloat16 forward is one round: its tail is off by construction) and (5, 600, 7, 9) at vec 1 -- odd planes, three
# rounds, one or two vectors a thread (the next slice's end inside a tail step); two kernels a setting each
BITWISE = [("float32", (32, 256, 56, 56), "bn_activation"), ("bfloat16", (32, 256, 56, 56), "bn_add_activation"),
           ("float32", (5, 600, 7, 9), "bn_add_activation")]


@pytest.fixture
def cp(monkeypatch):
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    monkeypatch.setattr(BC, "ENABLED", False)       # bn_fwd1 / bn_bwd1, not the cluster kernels
    before = _now()
    M._calls.clear()
    yield _dev.require_cupy()
    K.set_onepass(*before)


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, ops", BITWISE, ids=str)
def test_the_tail_and_the_backwards_distance_are_bitwise_the_default(cp, name, shape, ops):
    inputs = _gpu_inputs(cp, name, shape, ops, 7)
    settings = ((4, 2, 1, -1, 0, 0), (4, 2, 1, -1, 1, 0), (4, 2, 0, 3, 2, 0), (4, 2, 1, -1, 0, 1), (4, 2, 1, 0, 1, 1))
    outs = []
    for s in settings:
        K.set_onepass(*s)
        outs.append(_gpu_outputs(cp, ops, inputs))
    # the tail fires only where a block has a next tile: the big shapes' plans have several rounds
    plan = K.onepass_plan(shape[0], shape[1], shape[2] * shape[3], _dt(name).itemsize, True,
                          cp.cuda.Device().id)
    assert plan["rounds"] > 1 and plan["ks"] > 0, plan
    for s, o in zip(settings[1:], outs[1:]):
        assert len(o) == len(outs[0])
        for k, (a, b) in enumerate(zip(outs[0], o)):
            assert np.array_equal(_bits(a), _bits(b)), (s, k)
