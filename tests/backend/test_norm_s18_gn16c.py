"""Session 18 (helper GN16C): the lean kernel text of the 16-bit group-norm stash (backend/cuda/norm_gn16.py: LEAN /
MINIDNN_GN_STASH16_LEAN, "1" by default since run 8) -- gn_fwds and gn_bwdp with fewer instructions a value
(the shared row's address taken once, immediate cp.async waits, no division by G a row, the scales of a row's serial
steps loaded ahead) and the same sums in the same order, so the results are bitwise those of the text before.

CPU cases: the switch (options, the kernels it compiles, the environment); the forward's wait ladder and the
backward's stepped (n, g) emulated from the kernel text against what they replace; nvcc (no spills within the launch
bounds, every immediate wait present, the shared address converted once instead of at every copy).
GPU cases (marked cuda): lean against the text before, bitwise (y, mean, rstd, dx, dscale, dbias), bf16 and fp16,
with and without parameters, 16-bit parameters, grids cut so each gn_bwdp block walks many rows; and against
float64.
"""
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
from tests.backend.test_norm_s17_gncl import _check, _dtype, _run
from tests.backend.test_norm_s18_gn16 import cp  # noqa: F401 -- cp: the GPU fixture

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- CPU: the switch ---------------------------------------------------------------------------------------------

def test_options_carry_the_switch():
    bf16 = _dtype("bfloat16")
    assert "-DLEAN=0" in GS.options(bf16, ("float", 0), False)
    assert "-DLEAN=1" in GS.options(bf16, ("float", 0), False, lean=True)
    assert "-DLEAN=1" in GS.options(bf16, ("float", 0), True, True, True)


def test_lean_compiles_gn_fwds_and_gn_bwdp_only(monkeypatch):
    """LEAN builds gn_fwds and gn_bwdp with -DLEAN=1 (apart from the text before in the kernel cache); gn_bwds has
    no lean text and keeps -DLEAN=0."""
    from minidnn.backend.cuda import launch
    got = []
    monkeypatch.setattr(launch, "get_kernel", lambda src, name, opts: got.append((name, opts)) or (name, opts))
    monkeypatch.setattr(GS, "_kernels", {})
    bf16 = _dtype("bfloat16")
    for lean in (False, True):
        monkeypatch.setattr(GS, "LEAN", lean)
        for name in ("gn_fwds", "gn_bwdp", "gn_bwds"):
            GS._kernel(name, bf16, ("float", 0))
    flags = {(name, "-DLEAN=1" in opts) for name, opts in got}
    assert len(got) == 5, got          # gn_bwds once: its key does not change with LEAN
    assert flags == {("gn_fwds", False), ("gn_fwds", True), ("gn_bwdp", False), ("gn_bwdp", True),
                     ("gn_bwds", False)}, got


@pytest.mark.parametrize("value, want", [(None, "True"), ("0", "False"), ("1", "True")])
def test_environment(value, want):
    env = {k: v for k, v in os.environ.items() if k != "MINIDNN_GN_STASH16_LEAN"}
    if value is not None:
        env["MINIDNN_GN_STASH16_LEAN"] = value
    show = "from minidnn.backend.cuda import norm_gn16 as GS; print(GS.LEAN)"
    r = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.stdout.strip() == want, r.stdout + r.stderr


def test_environment_refuses_other_values():
    env = dict(os.environ, MINIDNN_GN_STASH16_LEAN="yes")
    r = subprocess.run([sys.executable, "-c", "import minidnn.backend.cuda.norm_gn16"], capture_output=True,
                       text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode != 0 and "MINIDNN_GN_STASH16_LEAN: 0 or 1" in r.stderr, r.stderr[-500:]


# ---- CPU: the lean text emulated ---------------------------------------------------------------------------------

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

def _build(tmp_path, name, entry, pstorage, lean):
    from minidnn.backend.cuda import launch
    pipe = entry == "gn_bwdp"
    opts = GS.options(_dtype(name), ("float", pstorage), pipe, pipe, lean)
    src = tmp_path / f"gn16_{entry}_{int(lean)}.cu"
    launch.write_source(str(src), GS.SOURCE_PIPE if pipe else GS.SOURCE, [o[2:] for o in opts if o.startswith("-D")])
    r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-ftz=true", "-std=c++17", "-Xptxas", f"-v,--entry={entry}",
                        "-o", str(tmp_path / "k.cubin"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ptx = tmp_path / f"{entry}_{int(lean)}.ptx"
    q = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", "-ftz=true", "-std=c++17", "-o", str(ptx), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stderr[-2000:]
    body = ptx.read_text()
    body = body[body.index(f".entry {entry}"):]
    return r.stderr, body[:body.index("\n}\n")]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name, entry, pstorage", [("bfloat16", "gn_fwds", 0), ("float16", "gn_fwds", 1),
                                                   ("bfloat16", "gn_bwdp", 2), ("float16", "gn_bwdp", 0)], ids=str)
def test_lean_kernels_compile_and_convert_the_address_once(tmp_path, name, entry, pstorage):
    log, body = _build(tmp_path, name, entry, pstorage, True)
    assert "0 bytes spill stores" in log and "0 bytes stack frame" in log, log[-800:]
    regs = int(log.split("Used ")[1].split()[0])
    assert regs <= (65536 // GS.NT_PIPE if entry == "gn_bwdp" else 65536 // (GS.NT * GS.MINB_FWD)), regs
    assert "ld.local" not in body and "st.local" not in body
    copies = [line for line in body.splitlines() if "cp.async.cg.shared.global" in line]
    assert copies and all(line.rstrip().endswith(", 16;") for line in copies), copies
    # the text before converts a generic address at each copy; the lean one once a launch
    _, old = _build(tmp_path, name, entry, pstorage, False)
    assert body.count("cvta.to.shared") == 1 and old.count("cvta.to.shared") >= len(
        [line for line in old.splitlines() if "cp.async.cg.shared.global" in line]), body.count("cvta.to.shared")
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
    from minidnn.backend.cuda import launch
    monkeypatch.setattr(GS, "GN_STASH16", True)
    monkeypatch.setattr(GS, "BWD_VARIANT", 2)
    NK._plans.clear()
    got = []
    real = launch.Prepared.__call__

    def spy(self, *arrays, stream=None):
        got.append(self.kernel.name if hasattr(self.kernel, "name") else str(self.kernel))
        return real(self, *arrays, stream=stream)
    monkeypatch.setattr(launch.Prepared, "__call__", spy)
    yield got
    NK._plans.clear()


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
def test_lean_is_bitwise_the_text_before(cp, route, monkeypatch, name, shape, groups, grid, affine):  # noqa: F811
    if grid is not None:
        monkeypatch.setattr(GS, "_pipe_grid", lambda rows, dev: min(rows, grid))
    rng = np.random.default_rng(sum(shape) * 5 + groups + 3 * len(name) + 11 * affine + (grid or 0))
    monkeypatch.setattr(GS, "LEAN", True)
    inputs, got = _run(cp, name, shape, groups, affine, rng)
    assert route == ["gn_fwds", "gn_bwdp"] + ["col_sum"] * affine, route
    _check(name, shape, groups, inputs, got)
    monkeypatch.setattr(GS, "LEAN", False)
    NK._plans.clear()
    before = _calls([None if a is None else cp.asarray(a) for a in inputs], groups)
    for what, a, b in zip(("y", "mean", "rstd", "dx", "dscale", "dbias"), got, before):
        assert (a is None) == (b is None), what
        if a is not None:
            assert cp.array_equal(a, b), (what, float(cp.abs(a.astype(cp.float32) - b.astype(cp.float32)).max()))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_lean_16_bit_parameters_bitwise(cp, route, monkeypatch, name):  # noqa: F811
    rng = np.random.default_rng(61)
    shape, groups = (4, 128, 56, 56), 16
    monkeypatch.setattr(GS, "LEAN", True)
    inputs, got = _run(cp, name, shape, groups, True, rng, pdtype=_dtype(name))
    _check(name, shape, groups, inputs, got)
    g = [None if a is None else cp.asarray(a) for a in inputs]
    assert all(cp.array_equal(a, b) for a, b in zip(got, _calls(g, groups)))     # repeatable
    monkeypatch.setattr(GS, "LEAN", False)
    NK._plans.clear()
    assert all(cp.array_equal(a, b) for a, b in zip(got, _calls(g, groups)))
    assert set(route) == {"gn_fwds", "gn_bwdp", "col_sum"}, route
