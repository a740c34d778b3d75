"""Session 18 (issue 10): the one-pass batch-norm kernels' bytes in flight -- bn_kernels.ONEPASS_BPS (MINIDNN_BN_BPS:
blocks per SM, which also sizes the on-chip copy's share of shared memory) and ONEPASS_PREFETCH (MINIDNN_BN_PREFETCH:
L2 prefetches ahead of the first pass and of the next tile before a meeting), flipped in one process by
bn_kernels.set_onepass.  (The third switch, UNROLL, lost on the H200 and is fixed at 4 since session 19:
MINIDNN_BN_UNROLL is ignored.)

CPU cases: ResNet-20's split (16 blocks a channel); bad values fail before any launch; the launches under the fake
CuPy carry -DUNROLL=4 / -DBPS, settle again after a flip and back, the environment switches at import (the old
unroll variable ignored), BPS 3's copy sized for three blocks; nvcc: the settings the A/B times compile without
spills.
GPU cases (marked cuda): forward and backward (plain, + ReLU, + add + ReLU) bitwise equal with the L2 prefetch off,
at 1 (the default) and at 2; the 3-blocks split against the float64 reference, one launch per direction.
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
from tests import _nvcc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100_SMEM = (233472, 232448)


# ---- CPU: the split and the order of the sums --------------------------------------------------------------------

def test_the_control_keeps_sixteen_blocks_a_channel():
    # ResNet-20's (128, 16, 32, 32) float32: 32768 vectors a channel, a minimum slice of 256 x 4 x 2 vectors -> 16
    # blocks (the split every session measured; another split would give other bits)
    assert K.onepass_plan(128, 16, 1024, 4, False)["per"] == 16
    assert K.onepass_plan(128, 16, 1024, 4, True)["per"] == 16


@pytest.mark.parametrize("kwargs", [dict(bps=0), dict(bps=5), dict(bps=3.0), dict(bps=True), dict(bps="3"),
                                    dict(prefetch=-1), dict(prefetch=9), dict(bps=3, prefetch=1.5)], ids=str)
def test_set_onepass_rejects_bad_values_and_keeps_the_settings(kwargs):
    before = (K.ONEPASS_BPS, K.ONEPASS_PREFETCH)
    with pytest.raises(ValueError, match="set_onepass"):
        K.set_onepass(**kwargs)
    assert (K.ONEPASS_BPS, K.ONEPASS_PREFETCH) == before


@pytest.mark.parametrize("env, value", [("MINIDNN_BN_BPS", "three"), ("MINIDNN_BN_BPS", "9"),
                                        ("MINIDNN_BN_PREFETCH", "9")])
def test_bad_environment_switches_fail_at_import_naming_the_variable(env, value):
    r = subprocess.run([sys.executable, "-c", "import minidnn.backend.cuda.bn_kernels"], cwd=ROOT,
                       env={**os.environ, env: value, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and f"{env}=" in r.stderr, r.stderr[-2000:]


# ---- CPU: the launches under the fake CuPy ----------------------------------------------------------------------

def _fake(code, **env):
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
names = []
L._go = lambda fn, d, stream, p: names.append((str(fn).split("(")[0], d, str(fn), p))
from minidnn.backend.cuda import bn_kernels as K, bn_cluster as BC, device_facts as DF
DF._smem[0] = H100_SMEM = {H100_SMEM!r}
BC.ENABLED = False      # the kernels before the cluster ones
def run(shape, relu=False, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = fakecp.asarray(rng.standard_normal(shape).astype(np.float32))
    sc, bi = fakecp.asarray(np.ones(c, np.float32)), fakecp.asarray(np.zeros(c, np.float32))
    n0 = len(names)
    y, m, i = K.forward_training(x, sc, bi, 0.1, None, None, 1e-5, relu=relu)
    K.backward(x, y, sc, m, i, y=y if relu else None)
    got = names[n0:]
    assert [g[0] for g in got] == ["bn_fwd1", "bn_bwd1"], got
    return [(dims[0], dims[6], full) for name, dims, full, p in got]
def settled_declines(flip, back=lambda: None):
    # a call settled before a flip (nn's remembered calls hold one) declines after it, nothing launched
    x = fakecp.asarray(np.ones((4, 64, 56, 56), np.float32))
    sc, bi = fakecp.asarray(np.ones(64, np.float32)), fakecp.asarray(np.zeros(64, np.float32))
    call = K.training_call(x, sc, bi, 0.1, None, None, 1e-5)
    n0 = len(names)
    assert call(x, None, sc, bi, None, None, None) is not None and len(names) == n0 + 1
    flip()
    assert call(x, None, sc, bi, None, None, None) is None and len(names) == n0 + 1
    back()
"""
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=180,
                       env={**os.environ, **env})
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    return r.stdout


def test_launches_carry_the_settings_and_a_flip_settles_again_under_the_fake_cupy():
    _fake("""
for shape in ((128, 16, 32, 32), (4, 64, 56, 56), (3, 40, 13, 21)):
    base = run(shape, relu=True)
    assert all("-DUNROLL=4" in f and "-DBPS=2" in f for _, _, f in base), base
    # 3 blocks an SM: the copy's slots split the SM's shared memory three ways, the grid at most 3 blocks an SM
    K.set_onepass(bps=3)
    got = run(shape, relu=True)
    for (grid, dyn, full), bwd in zip(got, (False, True)):
        assert "-DBPS=3" in full and "-DUNROLL=4" in full, full
        want = K.onepass_plan(shape[0], shape[1], shape[2] * shape[3], 4, bwd, 0)
        assert (grid, dyn) == (want["grid"], want["dyn"]), (shape, grid, dyn, want)
        slot = 256 * 16 * (2 if bwd else 1)
        assert dyn % slot == 0 and dyn <= (H100_SMEM[0] // 3 - 1024)
    K.set_onepass(bps=2)
    assert [g[:2] for g in run(shape, relu=True)] == [b[:2] for b in base]
    # the L2 prefetch: a define only when on (off: the kernels' options, and PTX, as before), the same launch
    assert not any("PREFETCH" in f for _, _, f in base)
    for pf in (1, 2):
        K.set_onepass(prefetch=pf)
        got = run(shape, relu=True)
        assert all(f"-DPREFETCH={pf}" in f for _, _, f in got) and [g[:2] for g in got] == [b[:2] for b in base]
    K.set_onepass(prefetch=0)
    assert run(shape, relu=True) == base
settled_declines(lambda: K.set_onepass(prefetch=2), lambda: K.set_onepass(prefetch=0))
# the large forward at 3 blocks: more blocks a round (the grid grows past 2 an SM) and fewer slots a block
K.set_onepass(bps=3)
p3 = K.onepass_plan(32, 256, 3136, 4, False, 0)
K.set_onepass(bps=2)
p2 = K.onepass_plan(32, 256, 3136, 4, False, 0)
assert p3["ks"] < p2["ks"] and p3["dyn"] * 3 <= H100_SMEM[0], (p2, p3)
print("OK")
""", MINIDNN_BN_PREFETCH="0")     # base: the prefetch off (default 1 since run 7), then 1, 2, off


def test_the_environment_switches_are_read_at_import_under_the_fake_cupy():
    _fake("""
assert (K.ONEPASS_UNROLL, K.ONEPASS_BPS, K.ONEPASS_PREFETCH) == (4, 3, 2)
got = run((4, 64, 56, 56))
assert all("-DUNROLL=4" in f and "-DBPS=3" in f and "-DPREFETCH=2" in f for _, _, f in got), got
print("OK")
""", MINIDNN_BN_UNROLL="6", MINIDNN_BN_BPS="3", MINIDNN_BN_PREFETCH="2")     # the unroll's old variable: ignored


# ---- nvcc --------------------------------------------------------------------------------------------------------

def _dt(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, bps, pf", [("float32", 3, 0), ("bfloat16", 3, 0), ("float32", 2, 2),
                                           ("bfloat16", 2, 1)], ids=str)
def test_the_timed_settings_compile_without_spills(monkeypatch, name, bps, pf):
    monkeypatch.setattr(K, "ONEPASS_BPS", bps)
    monkeypatch.setattr(K, "ONEPASS_PREFETCH", pf)
    dt = _dt(name)
    units = []
    for flags in (dict(has_scale=1, has_bias=1, cache=1), dict(relu=1, has_z=1, has_scale=1, has_bias=1, cache=1)):
        opts = K._onepass_options(dt, False, 16 // dt.itemsize, 1, **flags)
        units.append((K.ONEPASS_SOURCE, [o[2:] for o in opts if o.startswith("-D")]))
    for r in _nvcc.build(units, ("-std=c++17",)):          # (tests/_nvcc.build: each unit's own ptxas lines)
        out = r.stderr
        assert r.returncode == 0, out[-2000:]
        spills = [int(line.split("bytes spill stores")[0].split(",")[-1]) for line in out.splitlines()
                  if "spill stores" in line]
        # at 3 blocks (80 registers) the kernels spill 16-24 bytes under the symmetric meeting (SYMM, the default
        # since session 20: its departure ticket and the warp tree's doubles live across the meeting; 0 without it):
        # BPS 3 is an A/B setting only
        assert spills and max(spills) <= (24 if bps == 3 and K.ONEPASS_SYMM else 0), out
        regs = [int(w.split()[1]) for line in out.splitlines() if "Used" in line
                for w in [line[line.index("Used"):]]]
        assert regs and max(regs) <= 65536 // (256 * bps), regs
    if pf:      # the prefetches are there (bn_fwd1's first pass and before its meeting; bn_bwd1's likewise)
        for r in _nvcc.build(units, ("-std=c++17",), ptx=True):
            assert r.returncode == 0 and sum(t.count("prefetch.global.L2") for t in r.ptx.values()) >= 4, r.stderr


# ---- GPU -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp(monkeypatch):
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    monkeypatch.setattr(BC, "ENABLED", False)       # bn_fwd1 / bn_bwd1, not the cluster kernels
    before = (K.ONEPASS_BPS, K.ONEPASS_PREFETCH)
    M._calls.clear()
    yield _dev.require_cupy()
    K.set_onepass(*before)


def _gpu_inputs(cp, name, shape, ops, seed):
    dt = _dt(name)
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = cp.asarray((rng.standard_normal(shape) * 1.5 + 3.0).astype(dt))
    dy = cp.asarray(rng.standard_normal(shape).astype(dt))
    z = cp.asarray(rng.standard_normal(shape).astype(dt)) if ops == "bn_add_activation" else None
    sg = cp.asarray(rng.uniform(0.5, 1.5, c).astype(np.float32))
    bg = cp.asarray(rng.standard_normal(c).astype(np.float32))
    rm = cp.asarray(rng.standard_normal(c).astype(np.float32))
    rv = cp.asarray(rng.uniform(0.5, 2, c).astype(np.float32))
    return x, dy, z, sg, bg, rm, rv


def _gpu_outputs(cp, ops, inputs):
    """Every output of a training forward and backward (y, mean, inv_std, running stats, dx, dz, dscale, dbias) on
    the host, one launch per direction (no float64 reference: the bitwise cases compare settings)."""
    import minidnn.backend as B
    from minidnn.backend.cuda import launch
    x, dy, z, sg, bg, rm0, rv0 = inputs
    rm, rv = rm0.copy(), rv0.copy()
    n0 = launch.launch_count()
    y, m, i = B.batch_normalization_forward_training_ex(None, "spatial", ops, x, z, sg, bg, 0.1, rm, rv, 1e-5)
    back = B.batch_normalization_backward_ex(None, "spatial", ops, x, y, dy, sg, m, i, 1e-5)
    cp.cuda.Device().synchronize()
    assert launch.launch_count() - n0 == 2, "one launch per direction"
    return [a.get() for a in (y, m, i, rm, rv, *[b for b in back if b is not None])]


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


# (the large tensor at vec 4 in 2 rounds, a small one at vec 1 -- odd planes -- in several; each case compiles two
# kernels a setting: kept few so the file's cuda cases stay within ~100 s of NVRTC)
BITWISE = [("float32", (32, 256, 56, 56), "bn_activation"), ("bfloat16", (32, 256, 56, 56), "bn_add_activation"),
           ("float32", (3, 40, 13, 21), "bn_add_activation")]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, ops", BITWISE, ids=str)
def test_every_prefetch_distance_is_bitwise_no_prefetch(cp, name, shape, ops):
    inputs = _gpu_inputs(cp, name, shape, ops, 7)
    outs = []
    for pf in (0, 1, 2):
        K.set_onepass(2, pf)
        outs.append(_gpu_outputs(cp, ops, inputs))
    for pf, o in zip((1, 2), outs[1:]):
        assert len(o) == len(outs[0])
        for k, (a, b) in enumerate(zip(outs[0], o)):
            assert np.array_equal(_bits(a), _bits(b)), (pf, k)


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, ops", [("float32", (3, 40, 13, 21), "bn_activation"),
                                              ("float32", (32, 256, 56, 56), "bn_activation"),
                                              ("bfloat16", (32, 256, 56, 56), "bn"),
                                              ("float32", (128, 16, 32, 32), "bn_activation")], ids=str)
def test_three_blocks_an_sm_against_the_float64_reference(cp, name, shape, ops):
    from tests.backend.test_bn_onchip import _close, _run
    K.set_onepass(bps=3)
    plan = K.onepass_plan(shape[0], shape[1], shape[2] * shape[3], _dt(name).itemsize, True, cp.cuda.Device().id)
    assert plan["grid"] <= 3 * cp.cuda.Device().attributes["MultiProcessorCount"]
    got, ref = _run(cp, name, shape, "nchw", ops, 11)
    _close(got[0], ref[0], name, 4)
    n = np.prod(shape) / shape[1]
    gb, rb = got[5], ref[5]
    _close(gb[0], rb[0], name, 4 * (float(np.abs(rb[0]).max()) + 1))
    np.testing.assert_allclose(gb[2].get(), rb[2], rtol=1e-3 if name == "float32" else 3e-2, atol=1e-3 * n)
    np.testing.assert_allclose(gb[3].get(), rb[3], rtol=1e-3 if name == "float32" else 3e-2, atol=1e-3 * n)
