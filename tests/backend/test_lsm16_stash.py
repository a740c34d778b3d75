"""Session 20 (helper LSM16; issue 10: the 16-bit log-softmax backward of long rows at 46-71% of copy, 0.71-0.93x
PyTorch): softmax_kernels.BWD_STASH 5 (a 16-bit log-softmax cp.async stash counted in the raw bytes it holds:
bwd_raw_stash; the misaligned fallback's float stash BSF) and 6 (5, and the rows whose raw stash fits two blocks an
SM at 64 registers: BSR, MINB 2, aligned calls only -- the others launch bwd_fallback's plan through _TwinPlan);
docs/step_kernels.md, "Session 20: the 16-bit log-softmax backward rows (helper LSM16)".

CPU: the rules (which plans change, to what; every other plan 4's), the budgets, the settings' errors, the launches
under tools/record_launches.py's fake CuPy (aligned and misaligned calls of a BSR plan), nvcc sm_90 builds of the new
plans (registers within MINB, the spills of the BSR builds, the trap only there), every plan of BWD_STASH 0-4
preprocessing to the same tokens as the source before the change, and tools/row_ab.py taking 5 and 6.
GPU: tests/backend/test_softmax_s17_rows.py's test_bwd_stash_rows / test_bwd_stash_in_a_graph (modes 5 and 6
bitwise 0, 16-bit 50257- and 65536-class rows, misaligned views, graph replays).
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from minidnn.backend.cuda import device_facts
from minidnn.backend.cuda import softmax_kernels as _sk
from tests import _nvcc
from tests.backend._row_ab_plans import row_ab_specs
from tests.backend._row_kernels import _row_kernels_only  # noqa: F401  (autouse: the row kernels, not clusters)
from tests.backend.test_softmax_rows_cuda import _defs, _dtype

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BEFORE = "82af97c"          # the commit before this change of softmax_kernels.py (token identity of modes 0-4)
NAMES = ("float32", "bfloat16", "float16", "float64")
ALGOS = ("FAST", "ACCURATE", "LOG")
SHAPES = [(4096, 50257), (300, 50257), (2048, 49999), (2048, 65536), (8192, 16385), (4096, 32001), (4096, 32000),
          (9, 20000), (64, 16384), (64, 8192), (16384, 1000), (16384, 512), (8, 10), (2, 1000, 2), (3, 131072)]
KB = 1024


def _specs(mode, monkeypatch, stash=None):
    monkeypatch.setattr(_sk, "BWD_STASH", mode)
    return {(n, s, a, b): _sk.launch_spec(b, s, (1,), a, _dtype(n), stash=stash)
            for n in NAMES for s in SHAPES for a in ALGOS for b in (False, True)}


def _nch(d, c):
    return -(-(c // d["VEC"]) // (d["G"] * d["NV"]))


def _want_raw(d, c, budget, twin):
    """(arrays, bytes, two blocks) of a 16-bit block row's raw BSA: written out from the rule's words."""
    raw = (_nch(d, c) - 1) * d["NV"] * d["VEC"] * d["BLOCK"] * 2
    caps = ([min(budget, 112 * KB)] if twin else []) + [budget]
    for i, cap in enumerate(caps):
        for arrays in (2, 1):
            if arrays * raw <= cap:
                return arrays, arrays * raw, twin and i == 0
    return None


@pytest.mark.parametrize("mode", [5, 6])
def test_raw_stash_rule(monkeypatch, mode):
    """BWD_STASH 5 / 6: every plan is 4's except 16-bit log-softmax backward rows of several chunks (a block a row,
    vector loads) whose dy chunks but the last fit in raw bytes: BSCH = every chunk but the last, BSA, BSY where both
    arrays fit, BSF = the float chunks the launch's bytes hold (the misaligned fallback's), shared memory the raw
    bytes; under 6 first whichever fits two blocks an SM (112 KB), then with BSR=1 and MINB=2."""
    four = _specs(4, monkeypatch)
    new = _specs(mode, monkeypatch)
    changed = set()
    for k, s in new.items():
        name, shape, algo, backward = k
        d4 = _defs(four[k].defines)
        item = _dtype(name).itemsize
        eligible = (backward and algo == "LOG" and item == 2 and len(shape) == 2 and d4.get("ONE") == 0
                    and d4["G"] == d4["BLOCK"] and d4["VEC"] > 1)
        want = _want_raw(d4, shape[-1], 200 * KB, mode == 6) if eligible else None
        if want is None:
            assert s == four[k], k
            continue
        changed.add(k)
        arrays, nbytes, two = want
        nch = _nch(d4, shape[-1])
        bsf = min(nch - 1, nbytes // (d4["NV"] * d4["VEC"] * d4["BLOCK"] * 4 * arrays))
        core = tuple(x for x in four[k].defines if not x.startswith(("BSCH", "BSY", "BSA", "MINB")))
        assert s.defines == core + (f"BSCH={nch - 1}",) + (("BSY=1",) if arrays == 2 else ()) + (
            "BSA=1", f"BSF={bsf}") + (("BSR=1", "MINB=2") if two else ("MINB=1",)), (k, s.defines)
        assert s.smem == nbytes and s._replace(defines=(), smem=0) == four[k]._replace(defines=(), smem=0), k
        assert _defs(four[k].defines)["MINB"] == 1 and s.smem <= (112 if two else 200) * KB, k
    # the rows the brief names, by hand: 8192-element chunks of 16 KB an array
    want = {(4096, 50257): ((2, 192, 3, False), (1, 96, 3, True)),
            (2048, 49999): ((2, 192, 3, False), (1, 96, 3, True)),
            (2048, 65536): ((1, 112, 3, False), (1, 112, 3, True)),
            (4096, 32000): ((2, 96, 1, False), (2, 96, 1, True)),
            (8192, 16385): ((2, 32, 0, False), (2, 32, 0, True))}
    for shape, per_mode in want.items():
        arrays, kb, bsf, two = per_mode[mode - 5]
        for name in ("bfloat16", "float16"):
            s = new[name, shape, "LOG", True]
            d = _defs(s.defines)
            assert (d.get("BSY", 0) + 1, s.smem // KB, d["BSF"], d.get("BSR", 0) == 1, d["MINB"]) == (
                arrays, kb, bsf, two, 2 if two else 1), (name, shape, s.defines)
            assert d["BSA"] == 1 and s.smem % KB == 0, s
    assert len(changed) == 2 * 9, sorted(changed)       # 9 of SHAPES' rows (not 131072: 240 KB of dy)
    assert not any(k[0] in ("float32", "float64") or k[2] != "LOG" for k in changed)


def test_raw_stash_budgets(monkeypatch):
    """A smaller device budget: the raw stash within it (32000 classes at 70 KB: dy alone, 48 KB; 6 the same, two
    blocks); none that fits: 4's plan; call_stash takes 5 and 6 (sm_80+, as 3 / 4), 7 is an error naming the values;
    bwd_fallback: a BSR plan without BSR at MINB 1 (the same grid and bytes), None for any other plan."""
    bf = _dtype("bfloat16")
    for mode in (5, 6):
        monkeypatch.setattr(_sk, "BWD_STASH", mode)
        s = _sk.launch_spec(True, (4096, 32000), (1,), "LOG", bf, stash=70 * KB)
        d = _defs(s.defines)
        assert (d["BSCH"], d.get("BSY", 0), d["BSA"], d["BSF"], s.smem, d.get("BSR", 0)) == (
            3, 0, 1, 1, 48 * KB, int(mode == 6)), s.defines
        monkeypatch.setattr(_sk, "BWD_STASH", 4)
        four = _sk.launch_spec(True, (4096, 50257), (1,), "LOG", bf, stash=40 * KB)
        monkeypatch.setattr(_sk, "BWD_STASH", mode)
        assert _sk.launch_spec(True, (4096, 50257), (1,), "LOG", bf, stash=40 * KB) == four   # 96 KB of dy > 40
        assert "BSCH" not in _defs(_sk.launch_spec(True, (4096, 50257), (1,), "LOG", bf, stash=0).defines)
    monkeypatch.setattr(_sk, "smem_limits", lambda dev: (233472, 232448))
    monkeypatch.setattr(_sk, "sm80", lambda dev: True)
    for mode in (5, 6):
        monkeypatch.setattr(_sk, "BWD_STASH", mode)
        assert (_sk.call_stash(True, 0), _sk.call_stash(False, 0)) == (200 * KB, 0)
        monkeypatch.setattr(_sk, "sm80", lambda dev: False)
        assert _sk.call_stash(True, 0) == 0
        monkeypatch.setattr(_sk, "sm80", lambda dev: True)
    monkeypatch.setattr(_sk, "BWD_STASH", 7)
    with pytest.raises(ValueError, match="0, 1, 2, 3, 4, 5 or 6"):
        _sk.call_stash(True, 0)
    monkeypatch.setattr(_sk, "BWD_STASH", 6)
    s = _sk.launch_spec(True, (4096, 50257), (1,), "LOG", bf)
    f = _sk.bwd_fallback(s)
    assert "BSR=1" in s.defines and f.defines == tuple(x for x in s.defines if x != "BSR=1")[:-1] + ("MINB=1",)
    assert f._replace(defines=s.defines) == s
    monkeypatch.setattr(_sk, "BWD_STASH", 5)
    assert _sk.bwd_fallback(_sk.launch_spec(True, (4096, 50257), (1,), "LOG", bf)) is None
    monkeypatch.setattr(_sk, "BWD_STASH", 6)                  # 32000: 6's fallback is 5's plan itself
    s6 = _sk.launch_spec(True, (4096, 32000), (1,), "LOG", bf)
    monkeypatch.setattr(_sk, "BWD_STASH", 5)
    assert _sk.bwd_fallback(s6) == _sk.launch_spec(True, (4096, 32000), (1,), "LOG", bf)


def test_env():
    """MINIDNN_SOFTMAX_BWD_STASH=5 / 6 set the module's BWD_STASH at import."""
    code = """
import importlib, os
from minidnn.backend.cuda import softmax_kernels as s
out = []
for v in ("5", "6"):
    os.environ["MINIDNN_SOFTMAX_BWD_STASH"] = v
    out.append(importlib.reload(s).BWD_STASH)
print(repr(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-800:]
    assert eval(r.stdout.strip().splitlines()[-1]) == [5, 6]


def test_twin_launches_under_the_fake_cupy():
    """Under tools/record_launches.py's fake CuPy, a float16 (64, 50257) log-softmax backward: BWD_STASH 6 launches
    the BSR kernel (MINB 2, 96 KB) for aligned arrays and its BSR-less MINB 1 fallback for a view one element off
    (y or dy), 5 the BSY plan (192 KB) for both; one launch a call."""
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import re, numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
recs = []
R.record_to(L, recs)
import minidnn.backend as B
from minidnn.backend import softmax as smx
from minidnn.backend.cuda import softmax_kernels as S
from minidnn.backend.cuda import device_facts as F
S.sm80 = lambda dev: True
S.smem_limits = lambda dev: (233472, 232448)
def forget():
    S._plans.clear()
    for k, v in vars(smx).items():
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()
y = fakecp.asarray(np.zeros((64, 50257), np.float16))
flat = fakecp.asarray(np.zeros(64 * 50257 + 8, np.float16))
off = flat[1:1 + 64 * 50257].reshape(64, 50257)
out = []
for mode in (6, 5):
    S.BWD_STASH = mode
    forget()
    for a, b in ((y, y), (off, y), (y, off), (y, y)):
        n0 = len(recs)
        B.softmax_backward(None, "log", None, a, b, axis=-1)
        out.append([(sorted(set(re.findall(r"-D(BSR|BSY|MINB)=(\\d)", r[0]))), r[1][-1] // 1024) for r in recs[n0:]])
print(repr([int(y.data.ptr % 16), int(off.data.ptr % 16)]))
print(repr(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                       env=dict(os.environ, MINIDNN_SOFTMAX_CLUSTER="0"))      # the row kernels (see _row_kernels_only)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert eval(lines[-2]) == [0, 2], lines[-2]
    out = eval(lines[-1])
    twin, slow = [([("BSR", "1"), ("MINB", "2")], 96)], [([("MINB", "1")], 96)]
    both = [([("BSY", "1"), ("MINB", "1")], 192)]
    assert out == [twin, slow, slow, twin] + [both] * 4, out


# ---- compile checks ------------------------------------------------------------------------------------------------

def _new_builds():
    """(tag, spec) of every distinct kernel BWD_STASH 5 / 6 plan for SHAPES' 16-bit rows, the fallbacks included."""
    saved = _sk.BWD_STASH
    out, seen = [], set()
    try:
        for mode in (5, 6):
            _sk.BWD_STASH = mode
            for name in ("bfloat16", "float16"):
                for shape in SHAPES:
                    s = _sk.launch_spec(True, shape, (1,), "LOG", _dtype(name))
                    for tag, sp in (("main", s), ("fallback", _sk.bwd_fallback(s))):
                        if sp is not None and "BSF=" in " ".join(sp.defines) and sp.defines not in seen:
                            seen.add(sp.defines)
                            out.append((f"{tag}{mode}_{name}_{shape[-1]}", sp))
    finally:
        _sk.BWD_STASH = saved
    return out


# Spill bytes ptxas (nvcc 13, sm_90) left the BSR builds at 64 registers: the RAGGED rows' edges (7 + 7 floats a
# thread) held through the wait; the non-RAGGED ones and every MINB 1 build spill nothing.
BSR_SPILL = 16


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_new_builds(tmp_path):
    """nvcc 13 sm_90 (-ftz=true, as CuPy builds): the kernels BWD_STASH 5 / 6 plan build within MINB blocks of BLOCK
    threads an SM (BSR: 64 registers) spilling nothing (BSR: at most BSR_SPILL bytes, RAGGED rows only); NV
    cp.async copies a stashed array a chunk and the wait; the trap only in BSR builds (they have no fallback)."""
    builds = _new_builds()
    assert len(builds) >= 12, [t for t, _ in builds]
    units = [(_sk.SOURCE, s.defines) for _, s in builds]
    got = _nvcc.build(units, options=("-std=c++14", "-ftz=true"), entries=[(s.name,) for _, s in builds], tmp=tmp_path)
    ptx = _nvcc.build(units, options=("-std=c++14", "-ftz=true"), ptx=True, tmp=tmp_path)
    for (tag, s), b, p in zip(builds, got, ptx):
        d = _defs(s.defines)
        assert b.returncode == 0 and p.returncode == 0, (tag, b.stderr[-1500:])
        m = re.search(r"(\d+) bytes spill stores.*?Used (\d+) registers", b.stderr, re.S)
        spill, regs = int(m.group(1)), int(m.group(2))
        assert regs * d["BLOCK"] * d["MINB"] <= 65536, (tag, regs)
        assert spill <= (BSR_SPILL if d.get("BSR") and d["RAGGED"] else 0), (tag, spill)
        text = p.ptx[s.name]
        n = len(re.findall(r"cp\.async\.cg\.shared\.global", text))
        assert n > 0 and n % (d["NV"] * (2 if d.get("BSY") else 1)) == 0 and "cp.async.wait_all" in text, (tag, n)
        assert ("trap;" in text) == bool(d.get("BSR")), tag


def _module_before():
    """softmax_kernels as it was at BEFORE (git), or None where git or the commit is not there."""
    try:
        text = subprocess.run(["git", "show", f"{BEFORE}:minidnn/backend/cuda/softmax_kernels.py"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # session 22's NaN mend of the chunked forward's rescale (s * 0, not 0, while the running max is -inf), applied
    # to the old text too: the identity is of what this change did
    mend = ("if (nm != m) s = m == NEG_INF ? (A)0 : s * exp(m - nm);",
            "if (nm != m) s = m == NEG_INF ? s * (A)0 : s * exp(m - nm);")
    assert text.count(mend[0]) == 1
    text = text.replace(*mend)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("minidnn.backend.cuda._sk_before", None))
    mod.__package__ = "minidnn.backend.cuda"
    exec(compile(text, "softmax_kernels_before.py", "exec"), mod.__dict__)     # noqa: S102 -- the project's history
    return mod


def _tokens(source, defines):
    text = "".join("#define {} {}\n".format(*d.split("=", 1)) for d in defines) + source
    r = subprocess.run(["cpp", "-P", "-w"], input=text, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-800:]
    return r.stdout.split()


@pytest.mark.skipif(shutil.which("cpp") is None, reason="no C preprocessor")
def test_modes_0_to_4_unchanged(monkeypatch):
    """Every plan of BWD_STASH 0-4 (forwards and backwards, every algorithm and dtype over SHAPES) is the one the
    source before this change made, and its kernel text preprocesses to the same tokens (BSF expands to BSCH, BSR's
    branches vanish): the default's kernels are untouched."""
    old = _module_before()
    if old is None:
        pytest.skip(f"git or commit {BEFORE} not available")
    seen = {}
    # the column plans as they were (session 22's COLS_V2 kernels are their own change, tested in
    # test_softmax_cols_s22.py); SOURCE_COLS gained those kernels, so its tokens are not compared here
    monkeypatch.setattr(_sk, "COLS_V2", False)
    for mode in (0, 1, 2, 3, 4):
        monkeypatch.setattr(_sk, "BWD_STASH", mode)
        old.BWD_STASH = mode
        for k, s in _specs(mode, monkeypatch).items():
            name, shape, algo, backward = k
            assert s == old.launch_spec(backward, shape, (1,), algo, _dtype(name)), (mode, k)
            seen.setdefault((s.source, s.defines), s)
    assert len(seen) >= 100, len(seen)
    for (source, defines) in seen:
        if source != "COLS":
            assert _tokens(_sk._SOURCES[source], defines) == _tokens(old._SOURCES[source], defines), defines


def test_row_ab_plans(monkeypatch):
    """tools/row_ab.py --bwd-stash 4,5,6 plans (before any timing) each setting's kernel of a bfloat16 (4096, 50257)
    log-softmax backward -- dy's BSA, both arrays counted raw, two blocks -- and puts the settings back."""
    monkeypatch.setitem(device_facts._l2, 0, (50 * 2 ** 20, True))        # no GPU asked (the hints stay 0)
    got, = row_ab_specs((["lsmxbwd"], ["bfloat16"], [(4096, 50257)], lambda op: ["bs4", "bs5", "bs6"]))
    stash = [tuple(d for d in s.defines if d[:2] in ("BS", "MI")) for s in got]
    assert stash == [("BSCH=6", "BSA=1", "MINB=1"), ("BSCH=6", "BSY=1", "BSA=1", "BSF=3", "MINB=1"),
                     ("BSCH=6", "BSA=1", "BSF=3", "BSR=1", "MINB=2")], stash
    assert [s.smem // KB for s in got] == [192, 192, 96]
    assert _sk.BWD_STASH == 6
