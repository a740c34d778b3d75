"""Session 18 (helpers GN16C, GNLEAN): the lean kernel text of the 16-bit group-norm stash (backend/cuda/norm_gn16.py)
-- gn_fwds and gn_bwdp with fewer instructions a value (the shared row's address taken once, immediate cp.async
waits, no division by G a row, the scales of a row's serial steps loaded ahead) and the same sums in the same order
as the text before it, which the H200's run 8 found bitwise equal.  It was behind a switch (LEAN /
MINIDNN_GN_STASH16_LEAN) until GNLEAN made it the only text (its PTX byte-identical to the old -DLEAN=1 build:
docs/step_kernels.md).

CPU cases: one text (no LEAN define or switch left); the forward's wait ladder and the backward's stepped (n, g)
emulated from the kernel text against what they replace; nvcc (no spills within the launch bounds, every immediate
wait present, the shared address converted once a launch, not at every copy as gn_bwds does).
GPU cases (marked cuda): y, mean, rstd, dx, dscale, dbias against float64, bf16 and fp16, with and without
parameters, grids cut so each gn_bwdp block walks many rows; a second call bitwise the first; the backward close to
variant 1's (gn_bwds where it takes the rows).
"""
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import norm_gn16 as GS
from minidnn.backend.cuda import norm_kernels as NK
from tests.backend._gn_helpers import build, entry_body, launched
from tests.backend.test_norm_s17_gncl import TOL, _check, _dtype, _h, _run
from tests.backend.test_norm_s18_gn16 import cp  # noqa: F401 -- cp: the GPU fixture

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- CPU: one text -----------------------------------------------------------------------------------------------

def test_one_kernel_text(monkeypatch):
    """No LEAN define in the sources or the options, and each kernel compiled once a configuration."""
    from minidnn.backend.cuda import launch
    assert not re.search(r"\bLEAN\b", GS.SOURCE + GS.SOURCE_PIPE)
    assert not hasattr(GS, "LEAN")
    got = []
    monkeypatch.setattr(launch, "get_kernel", lambda src, name, opts: got.append((name, opts)) or (name, opts))
    monkeypatch.setattr(GS, "_kernels", {})
    bf16 = _dtype("bfloat16")
    for _ in range(2):
        for name in ("gn_fwds", "gn_bwdp", "gn_bwds"):
            GS._kernel(name, bf16, ("float", 0))
    assert [name for name, _ in got] == ["gn_fwds", "gn_bwdp", "gn_bwds"], got
    assert not any("LEAN" in o for _, opts in got for o in opts), got


def test_environment_variable_is_gone():
    """MINIDNN_GN_STASH16_LEAN is no longer read: any value imports."""
    env = dict(os.environ, MINIDNN_GN_STASH16_LEAN="yes")
    show = "from minidnn.backend.cuda import norm_gn16 as GS; print(hasattr(GS, 'LEAN'))"
    r = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr[-500:]


# ---- CPU: the text emulated ---------------------------------------------------------------------------------------

def _ladder():
    """{groups left m: the wait_group immediate} of gn_fwds' lean fall-through run, read from the kernel text."""
    steps = re.findall(r"GN16_STEP\((\d+), (\d+)\)", GS.SOURCE)
    return [(int(m), int(j)) for m, j in steps]


def test_forward_wait_ladder_matches_cp_wait():
    """Group k of nst is waited for with min(nst - 1 - k, 15) groups allowed in flight (cp_wait's schedule): the
    leading loop waits 15 while more than 16 groups are left, then the run enters at the case of the groups left and
    falls through in order, once a group.  A ladder entry off by one would let a group be summed before it lands."""
    ladder = _ladder()
    assert [m for m, _ in ladder] == list(range(16, 0, -1)), ladder
    cases = dict(ladder)
    for nst in range(1, 41):
        waits, k = [], 0
        while k < nst - 16:
            waits.append(15)
            k += 1
        start = [m for m, _ in ladder].index(nst - k)
        for m, _ in ladder[start:]:
            waits.append(cases[m])
            k += 1
        assert k == nst
        assert waits == [min(nst - 1 - kk, 15) for kk in range(nst)], (nst, waits)


def test_backward_steps_row_coordinates_as_division():
    """gn_bwdp's lean (n, g) of row r = blockIdx + i * stride, stepped by (stride / G, stride % G) with one carry,
    equals (r / G, r % G) for every row of every block (the formula as the text has it)."""
    src = GS.SOURCE_PIPE
    assert "n_ += gstep_n; gq += gstep_g;" in src and "if (gq >= (unsigned int)G) { gq -= (unsigned int)G; ++n_; }" \
        in src
    for groups in (1, 2, 3, 8, 32, 131, 200):
        for stride in (1, 2, 5, 7, 31, 32, 33, 132, 133):
            rows = 3 * stride * groups + 5
            sn, sg = divmod(stride, groups)
            for b in range(min(stride, rows)):
                n, g = divmod(b, groups)
                for r in range(b, rows, stride):
                    assert (n, g) == divmod(r, groups), (groups, stride, b, r)
                    n, g = n + sn, g + sg
                    if g >= groups:
                        g, n = g - groups, n + 1


# ---- CPU: nvcc ------------------------------------------------------------------------------------------------

def _build(tmp_path, name, entry, pstorage):
    pipe = entry == "gn_bwdp"
    opts = GS.options(_dtype(name), ("float", pstorage), pipe, pipe)
    log, ptx = build(tmp_path, GS.SOURCE_PIPE if pipe else GS.SOURCE, opts, entry, stem=f"gn16_{entry}")
    return log, entry_body(ptx, entry), ptx


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, entry, pstorage", [("bfloat16", "gn_fwds", 0), ("float16", "gn_fwds", 1),
                                                   ("bfloat16", "gn_bwdp", 2), ("float16", "gn_bwdp", 0)], ids=str)
def test_kernels_compile_and_convert_the_address_once(tmp_path, name, entry, pstorage):
    log, body, module = _build(tmp_path, name, entry, pstorage)
    assert "0 bytes spill stores" in log and "0 bytes stack frame" in log, log[-800:]
    regs = int(log.split("Used ")[1].split()[0])
    assert regs <= (65536 // GS.NT_PIPE if entry == "gn_bwdp" else 65536 // (GS.NT * GS.MINB_FWD)), regs
    assert "ld.local" not in body and "st.local" not in body
    copies = [line for line in body.splitlines() if "cp.async.cg.shared.global" in line]
    assert copies and all(line.rstrip().endswith(", 16;") for line in copies), copies
    # once a launch here; cp16 (gn_bwds, in gn_fwds' module) converts a generic address at each copy
    assert body.count("cvta.to.shared") == 1, body.count("cvta.to.shared")
    if entry == "gn_fwds":
        bwds = entry_body(module, "gn_bwds")
        assert bwds.count("cvta.to.shared") >= bwds.count("cp.async.cg.shared.global") > 0
    if entry == "gn_fwds":      # the ladder: every immediate from 15 down to 0
        for j in range(16):
            assert f"cp.async.wait_group {j};" in body, j


# ---- GPU ----------------------------------------------------------------------------------------------------------

def _calls(g, groups):
    y, m, i = B.group_normalization_forward(None, g[0], groups, g[2], g[3], 1e-5)
    dx, ds, db = B.group_normalization_backward(None, g[0], g[1], groups, g[2], m, i)
    return y, m, i, dx, ds, db


@pytest.fixture
def route(monkeypatch):
    """The stash on (gn_fwds, gn_bwdp), plans forgotten before and after; yields the launched kernels' names."""
    monkeypatch.setattr(GS, "GN_STASH16", True)
    monkeypatch.setattr(GS, "BWD_VARIANT", 2)
    with launched(monkeypatch) as got:
        yield got


# (shape, groups, gn_bwdp's grid: None = the SMs' count): the table's row, ragged rows (5..7 forward stages, teams
# not dividing the channels -- two channels a thread --, one group a sample, 48 channels a group: warp 0's lanes take
# a second channel past the preloaded scale), grids cut below and above G so the stepped (n, g) carries
GPU_CASES = [((4, 256, 56, 56), 32, None), ((4, 256, 56, 56), 32, 5), ((6, 96, 48, 48), 8, 7),
             ((3, 30, 40, 44), 3, 2), ((4, 48, 16, 32), 1, 3), ((3, 22, 48, 40), 2, None), ((8, 96, 48, 48), 8, 37),
             ((2, 96, 16, 32), 2, 3)]
CASES = [(n, *c, True) for n in ("bfloat16", "float16") for c in GPU_CASES] + [
    ("bfloat16", (4, 256, 56, 56), 32, 5, False), ("float16", (3, 30, 40, 44), 3, 2, False)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, shape, groups, grid, affine", CASES, ids=str)
def test_against_float64_repeatable_and_close_to_variant_1(cp, route, monkeypatch, name, shape, groups, grid,  # noqa: F811
                                                           affine):
    """(GNLEAN: was the bitwise test of the lean text against the text before, which went.)  A second call gives
    the same bits; variant 1's backward (gn_bwds, or the looped kernels where it refuses the planes) is close."""
    if grid is not None:
        monkeypatch.setattr(GS, "_pipe_grid", lambda rows, dev: min(rows, grid))
    rng = np.random.default_rng(sum(shape) * 5 + groups + 3 * len(name) + 11 * affine + (grid or 0))
    inputs, got = _run(cp, name, shape, groups, affine, rng)
    assert route == ["gn_fwds", "gn_bwdp"] + ["col_sum"] * affine, route
    _check(name, shape, groups, inputs, got)
    g = [None if a is None else cp.asarray(a) for a in inputs]
    again = _calls(g, groups)
    for what, a, b in zip(("y", "mean", "rstd", "dx", "dscale", "dbias"), got, again):
        assert (a is None) == (b is None), what
        if a is not None:
            assert cp.array_equal(a, b), (what, float(cp.abs(a.astype(cp.float32) - b.astype(cp.float32)).max()))
    monkeypatch.setattr(GS, "BWD_VARIANT", 1)
    NK._plans.clear()
    del route[:]
    dx, ds, db = B.group_normalization_backward(None, g[0], g[1], groups, g[2], got[1], got[2])
    assert "gn_bwdp" not in route, route
    np.testing.assert_allclose(_h(got[3]), _h(dx), **TOL[name])
    if affine:
        np.testing.assert_allclose(_h(got[4]), _h(ds), rtol=1e-3, atol=1e-2)
        np.testing.assert_allclose(_h(got[5]), _h(db), rtol=1e-3, atol=1e-2 * math.sqrt(shape[0]))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_16_bit_parameters_against_float64_and_repeatable(cp, route, name):  # noqa: F811
    rng = np.random.default_rng(61)
    shape, groups = (4, 128, 56, 56), 16
    inputs, got = _run(cp, name, shape, groups, True, rng, pdtype=_dtype(name))
    _check(name, shape, groups, inputs, got)
    g = [None if a is None else cp.asarray(a) for a in inputs]
    assert all(cp.array_equal(a, b) for a, b in zip(got, _calls(g, groups)))
    assert set(route) == {"gn_fwds", "gn_bwdp", "col_sum"}, route
