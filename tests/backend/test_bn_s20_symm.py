"""Session 20 (issue 10): the one-pass batch-norm kernels' symmetric meeting -- bn_kernels.ONEPASS_SYMM
(MINIDNN_BN_SYMM, set_onepass(symm=); the default since session 20's run 2).  Every block of a channel tile adds the
tile's partials itself once the arrival count is full and keeps the statistics in shared memory; block 0 of the tile
alone updates the running statistics and the step counter.  Before, the last arriver finalised and raised a flag, and
the others read the statistics back from L2.  The same loads in the same order, so the same bits.

CPU cases: bad values fail before any launch (set_onepass, the environment at import); under the fake CuPy the
launches carry -DSYMM=1 only when on, with the same grid and shared memory, and a settled call settles again after a
flip; nvcc: the SYMM builds compile without spills within two blocks an SM.
GPU cases (marked cuda): forward and backward (plain, + ReLU, + add + ReLU; float32 / bfloat16; one and several
rounds, vec 4 / 8 and odd planes at vec 1) bitwise equal to the switch off, every output -- y, the saved mean /
inv_std, the running statistics (updated once: block 0 alone), dx, dz, dscale, dbias -- over three calls in a row
(each launch leaves the tile counters at zero for the next); the step counter once per call.
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
from tests.backend.test_bn_s18_unroll import _bits, _dt, _fake, _gpu_inputs, _gpu_outputs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("kwargs", [dict(symm=2), dict(symm=-1), dict(symm=True), dict(symm=1.0),
                                    dict(symm="1"), dict(prefetch=1, symm=3)], ids=str)
def test_set_onepass_rejects_bad_symm_values_and_keeps_the_settings(kwargs):
    before = (K.ONEPASS_BPS, K.ONEPASS_PREFETCH, K.ONEPASS_SYMM)
    with pytest.raises(ValueError, match="set_onepass"):
        K.set_onepass(**kwargs)
    assert (K.ONEPASS_BPS, K.ONEPASS_PREFETCH, K.ONEPASS_SYMM) == before


@pytest.mark.parametrize("value", ["2", "on"])
def test_a_bad_environment_value_fails_at_import_naming_the_variable(value):
    r = subprocess.run([sys.executable, "-c", "import minidnn.backend.cuda.bn_kernels"], cwd=ROOT,
                       env={**os.environ, "MINIDNN_BN_SYMM": value, "PYTHONPATH": ROOT}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "MINIDNN_BN_SYMM=" in r.stderr, r.stderr[-2000:]


def test_the_define_only_when_on_and_the_same_launches_under_the_fake_cupy():
    _fake("""
assert K.ONEPASS_SYMM == 0          # (the environment below: the switch off)
for shape in ((128, 16, 32, 32), (32, 256, 56, 56), (3, 40, 13, 21)):
    base = run(shape, relu=True)
    assert not any("SYMM" in f for _, _, f in base), base          # off: the options (and PTX) as before
    K.set_onepass(symm=1)
    got = run(shape, relu=True)
    assert all("-DSYMM=1" in f for _, _, f in got), got
    assert [g[:2] for g in got] == [b[:2] for b in base]             # the same grid and shared memory
    K.set_onepass(symm=0)
    assert run(shape, relu=True) == base
settled_declines(lambda: K.set_onepass(symm=1))
print("OK")
""", MINIDNN_BN_SYMM="0")
    _fake("""
assert K.ONEPASS_SYMM == 1          # the default since session 20's run 2
assert all("-DSYMM=1" in f for _, _, f in run((4, 64, 56, 56)))
print("OK")
""")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_symmetric_builds_compile_without_spills(monkeypatch):
    monkeypatch.setattr(K, "ONEPASS_SYMM", 1)
    units = []
    for name in ("float32", "bfloat16"):
        dt = _dt(name)
        for inner1, flags in ((False, dict(has_scale=1, has_bias=1, cache=1)),
                              (False, dict(relu=1, has_z=1, has_scale=1, has_bias=1, cache=1)),
                              (True, dict(relu=1, has_scale=1, has_bias=1))):
            opts = K._onepass_options(dt, inner1, 16 // dt.itemsize, 8 if inner1 else 1, **flags)
            assert "-DSYMM=1" in opts
            units.append((K.ONEPASS_SOURCE, [o[2:] for o in opts if o.startswith("-D")]))
    for r in _nvcc.build(units, ("-std=c++17",)):
        out = r.stderr
        assert r.returncode == 0, out[-2000:]
        spills = [line for line in out.splitlines() if "spill stores" in line]
        assert len(spills) == 2 and all(" 0 bytes spill stores" in line for line in spills), out
        regs = [int(w.split()[1]) for line in out.splitlines() if "Used" in line
                for w in [line[line.index("Used"):]]]
        assert regs and max(regs) <= 65536 // (256 * K.ONEPASS_BPS), regs


# ---- GPU -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    before = (K.ONEPASS_BPS, K.ONEPASS_PREFETCH, K.ONEPASS_SYMM)
    enabled = BC.ENABLED
    BC.ENABLED = False          # bn_fwd1 / bn_bwd1, not the cluster kernels
    M._calls.clear()
    yield _dev.require_cupy()
    BC.ENABLED = enabled
    K.set_onepass(*before)


# the large tensor in 2 (float32 forward) / 4 (backward) rounds and 1 / 2 in bfloat16 (2 / 4 blocks a channel; a
# one-block tile in the bfloat16 forward), ResNet-20's 16 blocks a channel, tiles of 33 (float32 backward of
# (256, 32, 56, 56)), 64 and 88 blocks (3 channels: the tree's shared-memory levels before the shuffles), 264 (one
# channel: threads holding two partials each -- REVIEW20 found the first tree reading past its 256 rows there), and
# odd planes at vec 1 over several rounds
CASES = [("float32", (32, 256, 56, 56), "bn_activation"), ("bfloat16", (32, 256, 56, 56), "bn_add_activation"),
         ("float32", (128, 16, 32, 32), "bn"), ("float32", (256, 32, 56, 56), "bn"),
         ("float32", (128, 3, 64, 64), "bn_activation"), ("float32", (256, 3, 64, 64), "bn"),
         ("float32", (8, 1, 1024, 1024), "bn"),
         ("float32", (3, 40, 13, 21), "bn_add_activation"), ("bfloat16", (5, 24, 9, 11), "bn_activation")]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, ops", CASES, ids=str)
def test_symmetric_meeting_is_bitwise_the_last_arrivers(cp, name, shape, ops):
    dev = cp.cuda.Device().id
    for k in range(3):          # three inputs in a row: each launch must leave the tile counters at zero
        inputs = _gpu_inputs(cp, name, shape, ops, 5 + k)
        K.set_onepass(symm=0)
        ref = _gpu_outputs(cp, ops, inputs)
        K.set_onepass(symm=1)
        got = _gpu_outputs(cp, ops, inputs)
        assert not K._tickets[dev].any(), "the counters were not reset"
        assert len(got) == len(ref)
        for j, (a, b) in enumerate(zip(ref, got)):
            assert np.array_equal(_bits(a), _bits(b)), (k, j)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(32, 256, 56, 56), (8, 1, 1024, 1024)], ids=str)
def test_the_step_counter_and_running_statistics_move_once_a_call(cp, shape):
    # (the updates are plain read-modify-writes: a second block updating them would race the first -- over 264
    # blocks of one tile (the second shape) hardly ever to the same single step)
    x = cp.asarray(np.random.default_rng(3).standard_normal(shape).astype(np.float32))
    c = x.shape[1]
    outs = []
    for symm in (0, 1):
        K.set_onepass(symm=symm)
        rm, rv = cp.zeros(c, np.float32), cp.ones(c, np.float32)
        counter = cp.zeros(1, np.int64)
        for _ in range(3):
            K.forward_training(x, None, None, 0.1, rm, rv, 1e-5, counter=counter)
        cp.cuda.Device().synchronize()
        outs.append((int(counter.get()[0]), rm.get(), rv.get()))
    assert outs[0][0] == outs[1][0] == 3
    xh = x.get().astype(np.float64)
    mean, var = xh.mean(axis=(0, 2, 3)), xh.var(axis=(0, 2, 3), ddof=1)
    want = 1 - 0.9 ** 3          # three updates of factor 0.1 from 0 (mean) and from 1 (variance)
    np.testing.assert_allclose(outs[1][1], want * mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(outs[1][2], 0.9 ** 3 + want * var, rtol=1e-4)
    assert np.array_equal(outs[0][1].view(np.uint32), outs[1][1].view(np.uint32))
    assert np.array_equal(outs[0][2].view(np.uint32), outs[1][2].view(np.uint32))


def test_the_ab_tool_parses_settings_and_sets_the_rounds_shares():
    """tools/bn_s18_ab.py: [bB]pP[sS][lF[_B]] -- the L2 shares in hundredths, set by set_onepass(shares=), move the
    rounds of the planner (float32 (32, 256, 56, 56) on a 60 MB L2: backward 4 rounds at 0.5, 3 at 0.85) and the
    switches settled calls compare; bad shares are refused; the module's shares come back."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import bn_s18_ab as A
    assert A.parse_setting("p1") == (2, 1, 0, None)
    assert A.parse_setting("b3p0s1") == (3, 0, 1, None)
    assert A.parse_setting("p1s1l50_85") == (2, 1, 1, (0.5, 0.85))
    assert A.parse_setting("p1s1l30") == (2, 1, 1, (0.3, 0.3))
    with pytest.raises(SystemExit, match="bad setting"):
        A.parse_setting("p1l")
    before = (K._ROUND_SHARE_ONCHIP, K._ROUND_SHARE_ONCHIP_BWD)

    def rounds(backward):
        return K.onepass_plan(32, 256, 3136, 4, backward, sm_count=132, l2_bytes=60 * 2 ** 20)["rounds"]
    try:
        K.set_onepass(shares=(0.5, 0.85))
        assert (rounds(False), rounds(True)) == (2, 3)
        K.set_onepass(shares=(0.5, None))
        assert (rounds(False), rounds(True)) == (2, 4)
        switches = K._switches()
        K.set_onepass(shares=(0.3, 0.3))        # a settled call sees the shares among the switches
        assert (rounds(False), rounds(True)) == (3, 5) and K._switches() != switches
        for bad in ((0.5,), (0, None), (0.5, -1.0), [0.5, 0.5], (True, None)):
            with pytest.raises(ValueError, match="shares"):
                K.set_onepass(shares=bad)
    finally:
        K.set_onepass(shares=before)
    assert (K._ROUND_SHARE_ONCHIP, K._ROUND_SHARE_ONCHIP_BWD) == before
