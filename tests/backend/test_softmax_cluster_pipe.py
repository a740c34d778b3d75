"""Session 23 (issue 10): the persistent, pipelined cluster softmax forward smx_fwdp (backend/cuda/softmax_cluster.py,
PIPE / MINIDNN_SOFTMAX_CLUSTER_PIPE), bitwise smx_fwdc's.

CPU: the plan (which calls take smx_fwdp, its grid the resident-cluster estimate, the Launch carrying PIPE), settle
(the driver's count), the environment read at import with a clear error; the persistent row walk (every row once, a
cluster's blocks the same rows) and the cluster-barrier protocol of the double-slotted partials emulated under random
interleavings of the blocks -- every remote read sees its row's partials, no block leaves while one still reads its
shared memory; the same emulation with one slot or without the closing barrier must fail; nvcc sm_90 builds of every
pipe configuration the plan makes without spills within the launch bounds' registers, the next row's copies issued
before the row's first barrier; the routing under tools/record_launches.py's fake CuPy.
GPU (marked cuda; sm_90+): smx_fwdp against smx_fwdc of the same configuration with ==-bits over float32 / float16 /
bfloat16, softmax and log-softmax, C 50257 / 32001 (ragged heads and tails) / 65536 (float32) / 131072 (16-bit), rows
1, H - 1, H + 1, 2H + 3 and 4096 (H the driver's resident clusters; grids of H clusters and of 3, many rows a
cluster); special rows; through softmax_kernels with PIPE on; captured in a CUDA graph and replayed twice.
"""
import os
import random
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import softmax_cluster as SC
from minidnn.backend.cuda import softmax_kernels as _sk
from tests._nvcc import build as nvcc_build
from tests._nvcc import pick
from tests.backend.test_softmax_cluster import (
    NAMES,
    ROOT,
    _bits,
    _emulate_row,
    _ref_fwd,
    _special_rows,
    cp,  # noqa: F401  (the fixture; the helpers below take it as xp)
)
from tests.backend.test_softmax_rows_cuda import _dtype, _launches, _reset_plans

SMS = 132                           # _sms under no GPU: an H100 / H200's


# ---- CPU: the plan ----------------------------------------------------------------------------------------------

# (rows, C, dtype, algo) forward under PIPE "1" -> (CL, NT, VPT, pipe)
PIPE_PLANS = [
    ((4096, 50257, "float32", "ACCURATE"), (7, 512, 4, 1)),    # 264 blocks an estimate, 37 clusters: 4096 > 37
    ((300, 50257, "float32", "ACCURATE"), (7, 512, 4, 1)),
    ((37, 50257, "float32", "ACCURATE"), (7, 512, 4, 0)),      # every row resident at once: smx_fwdc
    ((38, 50257, "float32", "LOG"), (7, 512, 4, 1)),
    ((4096, 32000, "float32", "ACCURATE"), (8, 256, 4, 1)),    # 132 x 4 / 8 = 66 clusters
    ((66, 32000, "float32", "ACCURATE"), (8, 256, 4, 0)),
    ((67, 32000, "float32", "ACCURATE"), (8, 256, 4, 1)),
    ((2048, 65536, "float32", "ACCURATE"), (8, 512, 4, 1)),
    ((4096, 50257, "bfloat16", "LOG"), (7, 256, 4, 1)),
    ((4096, 131072, "bfloat16", "LOG"), (8, 512, 4, 1)),
    ((4096, 32000, "bfloat16", "LOG"), None),                  # "1": the row kernels hold it (not a cluster call)
]


@pytest.mark.parametrize("args, want", PIPE_PLANS, ids=str)
def test_pipe_plan(args, want):
    rows, c, name, algo = args
    p = SC.plan(rows, c, _dtype(name), algo, False, 0, "1", pipe="1")
    assert (p and (p.cl, p.nt, p.vpt, p.pipe)) == want if want else p is None, p
    if p is None:
        return
    held = SC.resident_clusters(SMS, p.cl, p.nt)
    assert held == SMS * SC.minb(False, p.nt) // p.cl
    assert p.grid == (held if p.pipe else rows) * p.cl and p.pipe == (rows > held)
    off = SC.plan(rows, c, _dtype(name), algo, False, 0, "1", pipe="0")
    assert off == p._replace(grid=rows * p.cl, pipe=0)          # the same kernel shape: only grid and kernel differ
    late = SC.plan(rows, c, _dtype(name), algo, False, 0, "1", pipe="late")
    assert late == p._replace(pipe=2 if p.pipe else 0)          # "late": the same launch, PIPE_LATE in the build
    assert ("-DPIPE_LATE=1" in SC.options(_dtype(name), algo, late)) == bool(p.pipe)
    assert "-DPIPE_LATE=1" not in SC.options(_dtype(name), algo, p)
    assert SC.plan(rows, c, _dtype(name), algo, True, 0, "1", pipe="1").pipe == 0       # never the backward
    assert SC.kernel_name(False, p.pipe) == ("smx_fwdp" if p.pipe else "smx_fwdc")


def test_pipe_follows_the_attribute(monkeypatch):
    """plan reads PIPE when ``pipe`` is None (planning time), and the Launch carries it (the prepared kernel and grid
    differ; softmax_kernels' plan cache must be forgotten on a switch, as for FAST_EXP); a bad value is refused."""
    f32 = np.dtype(np.float32)
    assert SC.PIPE == "0"                                        # the default until the GPU A/B
    got = {}
    for mode in ("1", "late", "0"):
        monkeypatch.setattr(SC, "PIPE", mode)
        got[mode] = SC.plan(4096, 50257, f32, "ACCURATE", False, 0, "1")
    assert (got["1"].pipe, got["late"].pipe, got["0"].pipe) == (1, 2, 0)
    monkeypatch.setattr(SC, "PIPE", True)
    with pytest.raises(ValueError, match="MINIDNN_SOFTMAX_CLUSTER_PIPE.*'late'"):
        SC.plan(4096, 50257, f32, "ACCURATE", False, 0, "1")


def test_settle_takes_the_drivers_count():
    p = SC.plan(4096, 50257, np.float32, "ACCURATE", False, 0, "1", pipe="1")
    assert SC.settle(4096, p, None) == p                        # no driver to ask: the estimate
    assert SC.settle(4096, p, 33) == p._replace(grid=33 * 7)
    assert SC.settle(33, p, 33) == p._replace(grid=33 * 7, pipe=0)      # every row resident: smx_fwdc
    assert SC.settle(34, p, 33).pipe == 1
    assert SC.settle(4096, p, 0) == p._replace(grid=4096 * 7, pipe=0)   # not schedulable: smx_fwdc's launch
    q = SC.plan(30, 50257, np.float32, "ACCURATE", False, 0, "1", pipe="1")
    assert q.pipe == 0 and SC.settle(30, q, 5) == q               # smx_fwdc's launches are left alone
    assert SC.slot_bytes(p) == 512 * 4 * 16 < 48 * 1024


def test_pipe_environment_read_at_import():
    code = "from minidnn.backend.cuda import softmax_cluster as SC; print(SC.PIPE)"
    for val, want in (("0", "0"), ("1", "1"), ("late", "late"), (None, "0"), ("yes", None), ("2", None),
                      ("", None)):
        env = {k: v for k, v in os.environ.items() if k != "MINIDNN_SOFTMAX_CLUSTER_PIPE"}
        if val is not None:
            env["MINIDNN_SOFTMAX_CLUSTER_PIPE"] = val
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
        if want:
            assert r.returncode == 0 and r.stdout.strip() == want, r.stderr[-800:]
        else:
            assert r.returncode != 0 and "MINIDNN_SOFTMAX_CLUSTER_PIPE" in r.stderr and "'0'" in r.stderr


def test_ab_tool_pipe_settings(monkeypatch):
    """tools/softmax_cluster_ab.py's ":pipe" / ":pipelate" set PIPE "1" / "late" for the setting's plans and switch,
    restore puts the process's PIPE back, a bad modifier is refused."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "tools"))
    import softmax_cluster_ab as T
    f32 = np.dtype(np.float32)
    assert T.parse("1:pipe") == ("1", 0, 0, True, "1") and T.parse("all:cl8:pipelate")[4] == "late"
    assert T.parse("1")[4] == "0"
    assert T.plan_of("smx", (4096, 50257), f32, "1:pipe") == ("cluster", SC.Launch(7, 512, 4, 2, 37 * 7, 0, 1))
    assert T.plan_of("lsmx", (4096, 50257), f32, "1:pipelate")[1].pipe == 2
    assert T.plan_of("smxbwd", (4096, 50257), f32, "1:pipe")[1].pipe == 0            # the backward: smx_bwdc
    assert "persistent ~37 clusters" in T.describe(T.plan_of("smx", (4096, 50257), f32, "1:pipe"))
    with pytest.raises(ValueError, match="pipelate"):
        T.parse("1:pipes")
    start = SC.PIPE
    T.switch("1:pipelate")
    assert SC.PIPE == "late" and SC.plan(4096, 50257, f32, "ACCURATE", False, 0).pipe == 2
    T.restore()
    assert SC.PIPE == start


# ---- CPU: the persistent walk and the cluster barriers, emulated -------------------------------------------------

def _walk(rows, clusters):
    """The rows each cluster takes (cluster i: i, i + G, ...), as smx_fwdp's loop."""
    return [list(range(i, rows, clusters)) for i in range(clusters)]


@pytest.mark.parametrize("rows, clusters", [(1, 1), (36, 37), (38, 37), (77, 37), (4096, 33), (5, 3)])
def test_walk_covers_every_row_once(rows, clusters):
    clusters = min(clusters, rows)                              # settle: never more clusters than rows
    got = sorted(r for w in _walk(rows, clusters) for r in w)
    assert got == list(range(rows))
    n = [len(w) for w in _walk(rows, clusters)]
    assert max(n) - min(n) <= 1                                 # balanced to a row


def _barrier_run(cl, nrows, slots, closing, seed):
    """One random interleaving of a cluster of ``cl`` blocks through ``nrows`` rows of smx_fwdp's protocol: per row
    publish (part[slot] := (row, rank)), arrive.release, wait.acquire, then cl remote reads of part[slot] (one step
    each, warp 0), then (after the loop) ``closing`` arrive + wait, then exit.  A block's program is its thread 0 /
    warp 0 (the block barriers order the rest).  Returns the violations: a read that found another row's partials,
    or a read of an exited block's shared memory."""
    rng = random.Random(seed)
    part = [[None] * slots for _ in range(cl)]
    exited = [False] * cl
    arrived = [0] * cl                                          # barrier phases each block has arrived at
    prog = []
    for b in range(cl):
        ops = []
        for j in range(nrows):
            s = j % slots
            ops += [("pub", j, s), ("arrive",), ("wait",)] + [("read", j, s, o) for o in range(cl)]
        if closing:
            ops += [("arrive",), ("wait",)]
        ops.append(("exit",))
        prog.append(ops)
    pc, waits, bad = [0] * cl, [0] * cl, []
    while any(pc[b] < len(prog[b]) for b in range(cl)):
        ready = []
        for b in range(cl):
            if pc[b] >= len(prog[b]):
                continue
            op = prog[b][pc[b]]
            if op[0] == "wait" and min(arrived) < waits[b] + 1:
                continue                                        # the phase is not complete: every block arrives
            ready.append(b)
        assert ready, "deadlock"
        b = rng.choice(ready)
        op = prog[b][pc[b]]
        if op[0] == "pub":
            part[b][op[2]] = (op[1], b)
        elif op[0] == "arrive":
            arrived[b] += 1
        elif op[0] == "wait":
            waits[b] += 1
        elif op[0] == "read":
            _, j, s, o = op
            if exited[o]:
                bad.append(("read an exited block", b, j, o))
            elif part[o][s] != (j, o):
                bad.append(("stale or overwritten", b, j, o, part[o][s]))
        else:
            exited[b] = True
        pc[b] += 1
    return bad


@pytest.mark.parametrize("cl", [2, 3, 7, 8])
def test_barrier_protocol_emulated(cl):
    """Two slots by row parity and one barrier a row, plus the closing pair: no read sees another row's partials or
    an exited block, over 300 random interleavings."""
    for seed in range(300):
        assert _barrier_run(cl, 5, 2, True, seed) == [], seed


def test_barrier_emulation_finds_the_races():
    """Not vacuous: one slot (row j + 1 overwrites row j's partials while a slow block still reads them), or no
    closing barrier (a block leaves while another reads its last partials), fails in some interleaving."""
    assert any(_barrier_run(3, 4, 1, True, s) for s in range(300))
    assert any(_barrier_run(3, 4, 2, False, s) for s in range(300))


def test_walk_gives_the_row_kernels_values():
    """Every row, whichever cluster and iteration of the walk takes it, is smx_fwdc's row computation (the same
    device functions): the walk's result assembled from _emulate_row equals the float64 reference."""
    rows, c, vec, cl, nt, vpt = 10, 16387, 8, 2, 512, 2
    x = _special_rows(rows, c, 3)
    ref = _ref_fwd(x, "LOG")
    y = np.full_like(x, np.nan)
    for w in _walk(rows, 3):
        for r in w:
            y[r] = _emulate_row(x[r], r, vec, cl, nt, vpt, "LOG")
    assert (np.isnan(y) == np.isnan(ref)).all()
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(y[ok], ref[ok], rtol=1e-12, atol=1e-300)


# ---- CPU: nvcc ------------------------------------------------------------------------------------------------

PIPE_CS = (2048, 8200, 16385, 32000, 32001, 50257, 65536, 100003, 131072)
PIPE_ROWS = (300, 1000, 4096, 100000)


def _pipe_configs():
    """Every (dtype, algo, CL, NT, VPT, MINB, fexp, pipe) of an smx_fwdp launch the plan makes for PIPE_CS x
    PIPE_ROWS under "1" and "all" (FAST_EXP on and off, PIPE "1" and "late")."""
    out = set()
    for name in NAMES:
        for c in PIPE_CS:
            for rows in PIPE_ROWS:
                for algo in ("ACCURATE", "LOG"):
                    for setting in ("1", "all"):
                        for fexp in (True, False):
                            for mode in ("1", "late"):
                                p = SC.plan(rows, c, _dtype(name), algo, False, 0, setting, fast_exp=fexp, pipe=mode)
                                if p and p.pipe:
                                    out.add((name, algo, p.cl, p.nt, p.vpt, p.minb, p.fexp, p.pipe))
    return sorted(out)


PIPE_DEFAULTS = {("float32", "ACCURATE", 7, 512, 4, 2, 0, 1), ("float32", "ACCURATE", 8, 256, 4, 4, 0, 1),
                 ("bfloat16", "LOG", 7, 256, 4, 4, 1, 1), ("bfloat16", "LOG", 8, 512, 4, 2, 1, 1),
                 ("float16", "ACCURATE", 7, 256, 4, 4, 1, 1), ("float32", "ACCURATE", 7, 512, 4, 2, 0, 2),
                 ("bfloat16", "LOG", 7, 256, 4, 4, 1, 2)}


def test_pipe_configurations_are_many():
    cfgs = _pipe_configs()
    assert len(cfgs) >= 40 and {c[7] for c in cfgs} == {1, 2}, len(cfgs)
    assert PIPE_DEFAULTS <= set(cfgs), PIPE_DEFAULTS - set(cfgs)
    assert {c[3] for c in cfgs} == {256, 512} and {c[4] for c in cfgs} >= {2, 3, 4}


def _pipe_order(ptx):
    """smx_fwdp's loop in PTX order: the positions of its first cp.async.wait_all, first shared 16-byte read, the
    copies issued in the loop (after the wait), the loop's first bar.sync, cluster arrive and wait, and its scalar
    global loads (the next row's edge)."""
    lines = ptx.splitlines()
    w = next(i for i, s in enumerate(lines) if "cp.async.wait_all" in s)
    rd = next(i for i, s in enumerate(lines) if i > w and "ld.shared.v4" in s)
    cps = [i for i, s in enumerate(lines) if i > w and "cp.async.cg.shared.global" in s]
    bar = next(i for i, s in enumerate(lines) if i > w and "bar.sync" in s)
    arr = next(i for i, s in enumerate(lines) if i > w and "barrier.cluster.arrive" in s)
    wt = next(i for i, s in enumerate(lines) if i > arr and "barrier.cluster.wait" in s)
    edge = [i for i, s in enumerate(lines) if i > w and re.search(r"ld\.global(\.nc)?\.(f32|u16|b16)\s", s)]
    return w, rd, cps, bar, arr, wt, edge


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_pipe_kernels_compile_without_spills(tmp_path):
    """Every planned smx_fwdp configuration (a spread; MINIDNN_NVCC_ALL=1: all) builds for sm_90 with -ftz=true (as
    CuPy) without spills within the launch bounds' registers; its PTX issues the next row's copies after reading the
    slots back and before the row's first block barrier (the copies are in flight during the reductions) -- PIPE
    "late": between the row's cluster arrive and wait --, the next row's edge load between the arrive and the wait."""
    cfgs = pick(_pipe_configs(), 6, PIPE_DEFAULTS)
    units = []
    for name, algo, cl, nt, vpt, minb, fexp, pipe in cfgs:
        opts = SC.options(_dtype(name), algo, SC.Launch(cl, nt, vpt, minb, 1, fexp, pipe))
        units.append((SC.SOURCE, [o[2:] for o in opts if o.startswith("-D")]))
    res = nvcc_build(units, options=("-std=c++17", "-ftz=true"), entries=[("smx_fwdp",)] * len(units),
                     tmp=tmp_path)
    for cfg, r in zip(cfgs, res):
        assert r.returncode == 0, (cfg, r.stderr[-2000:])
        log = r.stderr
        spill = int(log.split("bytes spill stores")[0].split(",")[-1])
        regs = int(log.split("Used ")[1].split()[0])
        assert spill == 0, (cfg, log)
        assert regs <= 65536 // (cfg[3] * cfg[5]), (cfg, regs)
    odd = [i for i, cfg in enumerate(cfgs) if cfg[7] == 2][:1] + [i for i, cfg in enumerate(cfgs) if cfg[7] == 1][:2]
    for i, r in zip(odd, nvcc_build([units[i] for i in odd], options=("-std=c++17", "-ftz=true"), ptx=True,
                                    tmp=tmp_path)):
        cfg = cfgs[i]
        w, rd, cps, bar, arr, wt, edge = _pipe_order(r.ptx["smx_fwdp"])
        lo, hi = (arr, wt) if cfg[7] == 2 else (rd, bar)
        assert len(cps) == cfg[4] and all(lo < i < hi for i in cps) and bar < arr, (cfg, w, rd, cps, bar, arr, wt)
        assert edge and all(arr < i < wt for i in edge), (cfg, edge, arr, wt)


# ---- CPU: the routing under the fake CuPy -------------------------------------------------------------------------

def test_pipe_routing_under_the_fake_cupy():
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import re, numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
recs = []
R.record_to(L, recs)
import minidnn.backend as B
from minidnn.backend import softmax as smx
from minidnn.backend.cuda import softmax_kernels as S, softmax_cluster as SC
assert SC.PIPE == "0"
def forget():
    S._plans.clear()                # PIPE is not part of softmax_kernels' plan key: forget, as for FAST_EXP
    for k, v in vars(smx).items():
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()
def run(shape):
    x = fakecp.asarray(np.zeros(shape, np.float32))
    n0 = len(recs)
    B.softmax_forward(None, "accurate", None, x, axis=-1)
    B.softmax_backward(None, "log", None, x, x, axis=-1)
    return [(r[0].split("(")[0], re.findall(r"-D(?:CL|NT|VPT|PIPE_LATE)=\\d+", r[0]), r[1][0], r[1][3], r[1][6])
            for r in recs[n0:]]
out = {{}}
for pipe in ("0", "1", "late", "0"):
    SC.PIPE = pipe
    forget()
    for shape in ((4096, 50257), (37, 50257), (38, 50257)):
        out[pipe, shape] = run(shape)
print(repr(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                       env={k: v for k, v in os.environ.items()
                            if k not in ("MINIDNN_SOFTMAX_CLUSTER", "MINIDNN_SOFTMAX_CLUSTER_PIPE")})
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    out = eval(r.stdout.strip().splitlines()[-1])
    shape7 = ["-DCL=7", "-DNT=512", "-DVPT=4"]
    bwd = ("smx_bwdc", shape7, 4096 * 7, 512, 0)
    for shape in ((4096, 50257), (37, 50257), (38, 50257)):
        assert out["0", shape] == [("smx_fwdc", shape7, shape[0] * 7, 512, 0),
                                     ("smx_bwdc", shape7, shape[0] * 7, 512, 0)], out
    # PIPE on: a call of more rows than 132 x 2 / 7 = 37 resident clusters (no driver here: the estimate) takes
    # smx_fwdp on 37 clusters with a 32 KB slot; 37 rows stay on smx_fwdc; the backward is smx_bwdc
    assert out["1", (4096, 50257)] == [("smx_fwdp", shape7, 37 * 7, 512, 512 * 4 * 16), bwd], out
    assert out["1", (38, 50257)][0] == ("smx_fwdp", shape7, 37 * 7, 512, 512 * 4 * 16), out
    assert out["1", (37, 50257)][0] == ("smx_fwdc", shape7, 37 * 7, 512, 0), out
    # "late": the same launches, the forward built with PIPE_LATE
    assert out["late", (4096, 50257)] == [("smx_fwdp", shape7 + ["-DPIPE_LATE=1"], 37 * 7, 512, 512 * 4 * 16), bwd]
    assert out["late", (37, 50257)][0] == ("smx_fwdc", shape7, 37 * 7, 512, 0), out


# ---- GPU ----------------------------------------------------------------------------------------------------------

# (dtype, C): ragged rows (C odd: heads 0..VEC-1 over the rows), the largest rows each dtype's clusters hold
GPU_PIPE = [("float32", 50257), ("float32", 32001), ("float32", 65536), ("bfloat16", 50257), ("bfloat16", 131072),
            ("float16", 32001), ("float16", 131072)]
MANY = 4096
MODES = ("1", "late")


def _launch_of(name, c, algo, mode):
    """The configuration (Launch, PIPE ``mode``) the plan makes for MANY rows -- used for every row count of a case,
    so smx_fwdc and smx_fwdp run the same CL, NT, VPT."""
    p = SC.plan(MANY, c, _dtype(name), algo, False, 0, "all", pipe=mode)
    assert p is not None and p.pipe == SC.PIPE_MODES[mode], (name, c, algo, p)
    return p


_WARM = []


def _warm():
    if _WARM:
        return
    _WARM.append(True)
    jobs = [(n, a, False, _launch_of(n, c, a, m)) for n, c in GPU_PIPE for a in ("ACCURATE", "LOG")
            for m in MODES]
    jobs += [(n, a, False, SC.plan(64, c, _dtype(n), a, False, 0, "all")._replace(pipe=SC.PIPE_MODES[m]))
             for n, c in SPECIAL for a in ("ACCURATE", "LOG") for m in MODES]
    try:
        SC.precompile(jobs)
    except Exception as exc:        # noqa: BLE001 -- only a cache: each compiles when first launched
        print(f"precompile failed ({type(exc).__name__}: {exc}); compiling one by one")


def _kernels(xp, name, algo, launch):
    """(smx_fwdc, smx_fwdp) of ``launch``'s configuration and the driver's resident clusters of smx_fwdp."""
    from minidnn.backend.cuda import launch as L
    opts = SC.options(_dtype(name), algo, launch)
    kc, kp = L.get_kernel(SC.SOURCE, "smx_fwdc", opts), L.get_kernel(SC.SOURCE, "smx_fwdp", opts)
    held = SC.driver_clusters(kp, launch.cl, launch.nt, SC.slot_bytes(launch))
    # the estimate counts the launch bounds' blocks an SM; fewer registers than those allow more, CL not dividing a
    # GPC's block slots fewer: the driver's count within a factor 2 of it, say
    est = SC.resident_clusters(SC._sms(0), launch.cl, launch.nt)
    assert held is not None and est // 2 <= held <= 2 * est, (held, est)
    return kc, kp, held


def _run(xp, kernel, x, grid_clusters, launch, pipe):
    from minidnn.backend.cuda import launch as L
    rows, c = x.shape
    y = xp.empty_like(x)
    y.view(xp.uint8)[...] = 0x5a                               # no stale bits pass for a result
    if pipe:
        go = L.prepare(kernel, (grid_clusters * launch.cl,), (launch.nt,), [None, None, np.int32(c), np.int32(rows)],
                       SC.slot_bytes(launch))
    else:
        go = L.prepare(kernel, (rows * launch.cl,), (launch.nt,), [None, None, np.int32(c)])
    go(x, y)
    return y


def _input(xp, rows, c, dtype, seed):
    """Normal * 3 of ``dtype`` made on the device (bfloat16 / float16 through the float32's bits / a cast)."""
    x32 = xp.random.RandomState(seed).standard_normal((rows, c), dtype=xp.float32) * 3
    if dtype == np.float32:
        return x32
    if dtype == np.float16:
        return x32.astype(xp.float16)
    x = xp.empty((rows, c), dtype)
    x.view(xp.uint16)[...] = (x32.view(xp.uint32) >> 16).astype(xp.uint16)
    return x


@pytest.mark.cuda
@pytest.mark.parametrize("name, c", GPU_PIPE, ids=[f"{n}-{c}" for n, c in GPU_PIPE])
def test_pipe_bitwise_the_cluster_kernel(cp, name, c):  # noqa: F811
    """smx_fwdp (PIPE "1" and "late" builds) == smx_fwdc bit for bit (NaN positions equal), softmax and
    log-softmax, rows 1, H - 1, H + 1, 2H + 3 and MANY on H clusters (H the driver's count; the rows a cluster walks:
    1 to MANY / H) and on 3 clusters (many rows a cluster: the slot parity over many rows)."""
    _warm()
    dtype = _dtype(name)
    for algo in ("ACCURATE", "LOG"):
        launches = {m: _launch_of(name, c, algo, m) for m in MODES}
        kc, _, held = _kernels(cp, name, algo, launches["1"])
        kps = {m: _kernels(cp, name, algo, launches[m])[1] for m in MODES}
        for rows in (1, held - 1, held + 1, 2 * held + 3, MANY):
            if rows < 1:
                continue
            x = _input(cp, rows, c, dtype, rows + c)
            ref = _run(cp, kc, x, rows, launches["1"], False)
            for m in MODES:
                for g in {min(held, rows), min(3, rows)}:
                    got = _run(cp, kps[m], x, g, launches[m], True)
                    _bits(cp, got, ref, f"{name} ({rows}, {c}) {algo} PIPE {m} on {g} clusters (CL {launches[m].cl} "
                                        f"NT {launches[m].nt})")
            del x, ref, got
            cp.get_default_memory_pool().free_all_blocks()


SPECIAL = [("float32", 50257), ("bfloat16", 50257), ("float16", 32001), ("bfloat16", 65536)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, c", SPECIAL, ids=[f"{n}-{c}" for n, c in SPECIAL])
def test_pipe_special_rows(cp, name, c):  # noqa: F811
    """Rows of NaN, +-inf, all -inf, large values, a wide spread, NaN over whole slices (test_softmax_cluster's
    _special_rows): smx_fwdp's bits are smx_fwdc's, on 5 clusters walking 64 rows (the special rows land on several
    clusters and iterations) and on the driver's count."""
    _warm()
    dtype = _dtype(name)
    xd = cp.asarray(_special_rows(64, c, c).astype(dtype))
    for algo in ("ACCURATE", "LOG"):
        for m in MODES:
            launch = SC.plan(64, c, dtype, algo, False, 0, "all")._replace(pipe=SC.PIPE_MODES[m])
            kc, kp, held = _kernels(cp, name, algo, launch)
            ref = _run(cp, kc, xd, 64, launch, False)
            assert bool(cp.isnan(_f(cp, ref)).any())               # the NaN rows are there
            for g in (5, min(held, 64)):
                _bits(cp, _run(cp, kp, xd, g, launch, True), ref, f"{name} {c} {algo} PIPE {m} special rows on {g} "
                                                                   "clusters")


def _f(xp, a):
    """float32 values on the device (16-bit data through its bits)."""
    if a.dtype.itemsize == 2 and a.dtype.kind == "V":
        return (a.view(xp.uint16).astype(xp.uint32) << 16).view(xp.float32)
    return a.astype(xp.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("name, c", [("float32", 50257), ("bfloat16", 50257)], ids=["float32", "bfloat16"])
def test_pipe_through_softmax_kernels(cp, monkeypatch, name, c):  # noqa: F811
    """PIPE "1" / "late": B.softmax_forward of MANY rows launches smx_fwdp once on the driver's clusters (the
    prepared grid), with smx_fwdc's bits (PIPE "0")."""
    _warm()
    dtype = _dtype(name)
    xd = _input(cp, MANY, c, dtype, 7)
    for algo in ("accurate", "log"):
        monkeypatch.setattr(SC, "PIPE", "0")
        _reset_plans()
        y0 = B.softmax_forward(None, algo, None, xd, axis=-1)
        assert SC.plan(MANY, c, dtype, algo.upper(), False, 0).pipe == 0
        for m in MODES:
            monkeypatch.setattr(SC, "PIPE", m)
            _reset_plans()
            launch = SC.plan(MANY, c, dtype, algo.upper(), False, 0)
            assert launch.pipe == SC.PIPE_MODES[m]
            n0 = _launches()
            y1 = B.softmax_forward(None, algo, None, xd, axis=-1)
            assert _launches() - n0 == 1
            plan = _sk.plan(xd, (1,), algo.upper())
            assert isinstance(plan, _sk._ClusterPlan)
            held = _kernels(cp, name, algo.upper(), launch)[2]
            assert plan.go.dims[0] == held * launch.cl and plan.go.shared_mem == SC.slot_bytes(launch), plan.go.dims
            _bits(cp, y1, y0, f"{name} {algo} PIPE {m} against '0'")
    monkeypatch.setattr(SC, "PIPE", "0")
    _reset_plans()


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c, mode", [("float32", 1000, 50257, "1"), ("bfloat16", 300, 131072, "late")],
                         ids=["float32", "bfloat16-late"])
def test_pipe_in_a_graph(cp, monkeypatch, name, rows, c, mode):  # noqa: F811
    """smx_fwdp of both algorithms captured in one CUDA graph (PIPE ``mode``, through softmax_kernels); two replays
    after x changes in place give the eager bits of PIPE "0"."""
    _warm()
    dtype = _dtype(name)
    xd = _input(cp, rows, c, dtype, 1)
    monkeypatch.setattr(SC, "PIPE", mode)
    _reset_plans()

    def step():
        return [B.softmax_forward(None, algo, None, xd, axis=-1) for algo in ("accurate", "log")]
    step()                                          # plans and compiles outside the capture
    assert _sk.plan(xd, (1,), "LOG").go.shared_mem > 0          # smx_fwdp's slot: the pipe kernel was planned
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        outs = step()
        g = s.end_capture()
    w = {2: "uint16", 4: "uint32"}[dtype.itemsize]
    for k in range(2):
        nx = _input(cp, rows, c, dtype, 10 + k)
        cp.cuda.Stream.null.synchronize()          # made on the null stream; s does not wait for it (non-blocking)
        with s:
            xd.view(w)[...] = nx.view(w)
            g.launch(s)
        s.synchronize()
        monkeypatch.setattr(SC, "PIPE", "0")
        _reset_plans()
        for a, b in zip(outs, step()):
            _bits(cp, a, b, f"replay {k}")
        monkeypatch.setattr(SC, "PIPE", mode)
        _reset_plans()
    monkeypatch.setattr(SC, "PIPE", "0")
    _reset_plans()
