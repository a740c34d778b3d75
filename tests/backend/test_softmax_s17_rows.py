"""Session 17 (issue 10): softmax rows of 512 classes and of 32000 classes -- softmax_kernels.WARP_FROM
(MINIDNN_SOFTMAX_WARP_FROM=513|257: WARP's grid for 257..512-class rows holding 16 elements a lane) and
softmax_kernels.BWD_STASH (MINIDNN_SOFTMAX_BWD_STASH=0|1|2|3: several-chunk backward rows keep their first chunks in
shared memory, BSCH / BSY of SOURCE's bwd_rows; 3: filled by cp.async, bwd_rows_async, BSA; 4-6: sessions 19-20, the
cuda tests here, the rules of 5 / 6 in test_lsm16_stash.py); docs/step_kernels.md,
"Session 17: softmax rows of 512 and of 32000 classes".

CPU: the rules (which plans change, to what; every other plan equal to the switch off), the budget (chunks that fit,
the device's opt-in limit), the environment in a fresh interpreter, the launches under tools/record_launches.py's
fake CuPy (the BSCH define and the dynamic shared memory), nvcc sm_90 builds without spills within the budget, and
the PTX of plans with both switches off byte-identical to the source before the change (git).
GPU (cuda-marked): WARP_FROM 257 bitwise 513 (softmax / fast forward, log-softmax backward: the same sums in the same
order) and against float64 (log-softmax forward: LSM there), special rows, a misaligned view; BWD_STASH 1 / 2 / 3
bitwise 0 and against float64 over 16385..50257-class rows in float32, bfloat16, float64, float16, a misaligned
view, graph replays.
"""
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import device_facts
from minidnn.backend.cuda import softmax_kernels as _sk
from tests._nvcc import pick
from tests.backend._row_ab_plans import row_ab_specs
from tests.backend._row_kernels import _row_kernels_only  # noqa: F401  (autouse: the row kernels, not clusters)
from tests.backend.test_softmax_rows_cuda import (
    _close,
    _defs,
    _dtype,
    _host,
    _launches,
    _mag_bwd,
    _ref_bwd,
    _ref_fwd,
    _reset_plans,
)
from tests.backend.test_softmax_warp import _inputs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ("float32", "bfloat16", "float16", "float64")
ALGOS = ("FAST", "ACCURATE", "LOG")
BEFORE = "e543013"          # the commit before session 17's change of softmax_kernels.py (PTX identity)


def _specs(shapes, names=NAMES):
    """{(name, shape, algo, backward): launch_spec} under the current settings."""
    return {(n, s, a, b): _sk.launch_spec(b, s, (1,), a, _dtype(n)) for n in names for s in shapes for a in ALGOS
            for b in (False, True)}


SHAPES = [(65536, 512), (16384, 512), (7, 512), (16384, 511), (16384, 384), (16384, 300), (16384, 264),
          (16384, 260), (16384, 257), (16384, 256), (16384, 128), (16384, 513), (16384, 1000), (4096, 32000),
          (4096, 32001), (7, 50257), (64, 16384), (64, 16385), (64, 8192), (8, 10), (2, 1000, 2)]


# ---- WARP_FROM ------------------------------------------------------------------------------------------------------

def test_warp_from_rule(monkeypatch):
    """WARP_FROM 257: exactly the 257..512-class rows whose PIPE plan is a whole warp of 16 elements a lane (float
    sums, vector loads, the forward's >= 12288 rows of "auto"; the log-softmax backward's too) take WARP's grid --
    128-thread blocks, a row a warp, the 16-element budgets (forward 40 registers: MINB 12; backward 64: 8), the LSM
    epilogue for log-softmax -- and every other plan (softmax's backward, float64, E < 16, 513+, short calls) is
    WARP_FROM 513's; 513 plans as before (257 the module default since run 4)."""
    assert _sk.WARP_FROM == 257
    monkeypatch.setattr(_sk, "WARP_FROM", 513)
    off = _specs(SHAPES)
    monkeypatch.setattr(_sk, "WARP_FROM", 257)
    on = _specs(SHAPES)
    changed = {k for k in off if off[k] != on[k]}
    for k in changed:
        name, shape, algo, backward = k
        d, d0 = _defs(on[k].defines), _defs(off[k].defines)
        assert 257 <= shape[-1] <= 512 and len(shape) == 2 and shape[0] >= _sk.WARP_MIN_ROWS, k
        assert name != "float64" and not (backward and algo != "LOG"), k
        assert d0.get("WARP", 0) == 0 and d0["PIPE"] == 1 and d0["G"] == 32 and d0["NV"] * d0["VEC"] == 16, k
        assert d["WARP"] == 1 and d["PIPE"] == 0 and on[k].block == 128 and d["NV"] * d["VEC"] == 16, k
        assert d["MINB"] == (8 if backward else 12), k
        assert d.get("LSM", 0) == (2 if algo == "LOG" and not backward else 0), k
        assert on[k].groups == -(-shape[0] // 4) and on[k].smem == 0, k
    def whole_warp_16(n, s):                 # the PIPE plan of the row: a whole warp, 16 elements a lane
        d = _defs(off[n, s, "ACCURATE", False].defines)
        return d["G"] == 32 and d["NV"] * d["VEC"] == 16 and d["PIPE"] == 1
    want = {(n, s, a, b) for n in ("float32", "bfloat16", "float16") for s in SHAPES
            if 2 == len(s) and s[0] >= 12288 and 257 <= s[1] <= 512 and whole_warp_16(n, s)
            for a in ALGOS for b in (False, True) if not b or a == "LOG"}
    assert changed == want and len(want) == 4 * (7 + 6 + 6), (sorted(changed ^ want)[:6], len(want))
    assert ("float32", (65536, 512), "ACCURATE", False) in changed and ("float32", (16384, 256), "LOG", False) \
        not in changed and ("float32", (16384, 257), "LOG", False) not in changed  # 257: NARROW's 16-thread rows
    monkeypatch.setattr(_sk, "WARP_FROM", 300)
    with pytest.raises(ValueError, match="513 .* or 257"):
        _sk.launch_spec(False, (65536, 512), (1,), "ACCURATE", np.float32)


# ---- BWD_STASH -----------------------------------------------------------------------------------------------------

def test_bwd_stash_rule(monkeypatch):
    """BWD_STASH 1 / 2 / 3: backward plans of several-chunk rows (512-thread blocks) get BSCH = the chunks before the
    last whose stash (dy: log-softmax under 1; dy and y: softmax, log-softmax under 2 / 3 with BSY=1) fits
    BWD_STASH_BYTES, as a define before MINB and the dynamic shared memory of the launch -- under 3 also BSA=1 where
    that is every chunk but the last; nothing else of the plan changes, and every forward and one-chunk backward
    plans as with 0 (3 the module default from run 4 to session 20, 6 since its run 3; where BSA does not fit, 3
    plans exactly as 1 since session 19's run 5)."""
    assert _sk.BWD_STASH == 6
    monkeypatch.setattr(_sk, "BWD_STASH", 0)
    off = _specs(SHAPES)
    asy = 0
    ones = None
    for mode in (1, 2, 3):
        monkeypatch.setattr(_sk, "BWD_STASH", mode)
        on = _specs(SHAPES)
        ones = on if mode == 1 else ones
        n = 0
        for k, s in on.items():
            name, shape, algo, backward = k
            d0 = _defs(off[k].defines)
            if not backward or d0.get("ONE", 1) == 1:          # COLS plans: no ONE
                assert s == off[k], k
                continue
            both = algo != "LOG" or mode >= 2
            acc = 8 if name == "float64" else 4
            per = d0["NV"] * d0["VEC"] * d0["BLOCK"] * acc * (2 if both else 1)
            nch = -(-(shape[-1] // d0["VEC"]) // (d0["G"] * d0["NV"]))
            bsch = min(nch - 1, _sk.BWD_STASH_BYTES // per)
            assert nch >= 2 and bsch >= 1 and d0["BLOCK"] == 512, k
            extra = ((f"BSCH={bsch}",) + (("BSY=1",) if algo == "LOG" and mode >= 2 else ())
                     + (("BSA=1",) if mode == 3 and bsch == nch - 1 else ()))
            asy += "BSA=1" in extra
            if mode == 3 and "BSA=1" not in extra:          # BSA does not fit: 1's plan (session 19 run 5)
                assert s == ones[k] != off[k], k
                n += 1
                continue
            assert s.defines == off[k].defines[:-1] + extra + off[k].defines[-1:], (k, s.defines)
            assert s._replace(defines=off[k].defines, smem=0) == off[k] and s.smem == bsch * per <= 200 * 1024, k
            n += 1
        assert n >= (30 if mode == 3 else 4 * 5 * 3), n
    assert asy >= 30, asy                  # 50257 classes (7 chunks, 3 fit) take 1's plan under 3
    monkeypatch.setattr(_sk, "BWD_STASH", 1)
    # the rows: 3 of 4 chunks; log-softmax 96 KB (dy), softmax 192 KB (dy and y)
    for algo, smem in (("LOG", 96), ("ACCURATE", 192)):
        s = _sk.launch_spec(True, (4096, 32000), (1,), algo, np.float32)
        assert _defs(s.defines)["BSCH"] == 3 and s.smem == smem * 1024, (algo, s)
    s = _sk.launch_spec(True, (4096, 50257), (1,), "LOG", np.float32)               # 7 chunks: 6 fit under 1
    assert _defs(s.defines)["BSCH"] == 6 and s.smem == 192 * 1024
    monkeypatch.setattr(_sk, "BWD_STASH", 2)
    s = _sk.launch_spec(True, (4096, 50257), (1,), "LOG", np.float32)               # ... 3 with y too
    assert _defs(s.defines)["BSCH"] == 3 and _defs(s.defines)["BSY"] == 1 and s.smem == 192 * 1024
    s = _sk.launch_spec(True, (4096, 32000), (1,), "LOG", np.float32, stash=70 * 1024)   # a smaller device budget
    assert _defs(s.defines)["BSCH"] == 1 and s.smem == 64 * 1024
    assert "BSCH" not in _defs(_sk.launch_spec(True, (4096, 32000), (1,), "LOG", np.float32, stash=0).defines)
    monkeypatch.setattr(_sk, "BWD_STASH", 3)
    for algo in ("LOG", "ACCURATE"):
        d = _defs(_sk.launch_spec(True, (4096, 32000), (1,), algo, np.float32).defines)
        assert d["BSCH"] == 3 and d["BSA"] == 1 and d.get("BSY", 0) == (algo == "LOG"), d
    assert "BSA" not in _defs(_sk.launch_spec(True, (4096, 50257), (1,), "LOG", np.float32).defines)
    assert "BSA" not in _defs(_sk.launch_spec(True, (4096, 32000), (1,), "LOG", np.float32, stash=70 * 1024).defines)


def test_bwd_stash_4_rule(monkeypatch):
    """BWD_STASH 4 (session 19; the default in session 20's runs 1-3): every plan as under 3, except log-softmax
    rows where 3 falls back to 1's synchronous stash and dy's chunks but the last fit (50257 classes: 6 of 7): there
    BSA=1 without BSY -- the cp.async stash of dy alone, BSCH and shared memory 1's (5 and 6: test_lsm16_stash)."""
    monkeypatch.setattr(_sk, "BWD_STASH", 3)
    three = _specs(SHAPES)
    monkeypatch.setattr(_sk, "BWD_STASH", 4)
    four = _specs(SHAPES)
    changed = 0
    for k, s in four.items():
        name, shape, algo, backward = k
        d3, d4 = _defs(three[k].defines), _defs(s.defines)
        if s == three[k]:
            assert not (backward and algo == "LOG" and d3.get("BSCH") and not d3.get("BSA") and d3.get("VEC", 1) > 1
                        and d3["BSCH"] == -(-(shape[-1] // d3["VEC"]) // (d3["G"] * d3["NV"])) - 1), k
            continue
        assert backward and algo == "LOG" and not d3.get("BSA") and d4.get("BSA") == 1 and not d4.get("BSY"), k
        assert s.defines == three[k].defines[:-1] + ("BSA=1",) + three[k].defines[-1:] and s.smem == three[k].smem, k
        changed += 1
    assert changed >= 3, changed
    d = _defs(_sk.launch_spec(True, (4096, 50257), (1,), "LOG", np.float32).defines)
    assert d["BSCH"] == 6 and d["BSA"] == 1 and "BSY" not in d, d
    assert "BSA" not in _defs(_sk.launch_spec(True, (2048, 65536), (1,), "LOG", np.float32).defines)   # 6 of 8


def test_call_stash_device_limit(monkeypatch):
    """call_stash: 0 for forwards and with BWD_STASH 0; BWD_STASH_BYTES within the device's opt-in limit (less 1 KB
    for the static shared memory; the whole budget where the device does not say); a bad setting is an error."""
    monkeypatch.setattr(_sk, "smem_limits", lambda dev: (233472, 232448))           # H100 / H200
    monkeypatch.setattr(_sk, "BWD_STASH", 0)
    assert _sk.call_stash(True, 0) == 0
    monkeypatch.setattr(_sk, "BWD_STASH", 1)
    assert (_sk.call_stash(False, 0), _sk.call_stash(True, 0)) == (0, 200 * 1024)
    monkeypatch.setattr(_sk, "smem_limits", lambda dev: (102400, 101376))           # a 99 KB-a-block GPU
    assert _sk.call_stash(True, 0) == 101376 - 1024
    s = _sk.launch_spec(True, (4096, 32000), (1,), "ACCURATE", np.float32, stash=_sk.call_stash(True, 0))
    assert _defs(s.defines)["BSCH"] == 1 and s.smem == 64 * 1024
    monkeypatch.setattr(_sk, "smem_limits", lambda dev: (0, 0))
    assert _sk.call_stash(True, 0) == 200 * 1024
    monkeypatch.setattr(_sk, "BWD_STASH", 4)
    for is_sm80, want in ((True, 200 * 1024), (False, 0)):      # 3's and 4's cp.async stash: sm_80+ only
        monkeypatch.setattr(_sk, "sm80", lambda dev, v=is_sm80: v)
        assert _sk.call_stash(True, 0) == want
    monkeypatch.setattr(_sk, "BWD_STASH", 7)                   # (5 and 6 since session 20: test_lsm16_stash)
    with pytest.raises(ValueError, match="0, 1, 2, 3, 4, 5 or 6"):
        _sk.call_stash(True, 0)


def test_env():
    """MINIDNN_SOFTMAX_WARP_FROM / _BWD_STASH set the module defaults at import (257 and 6 when unset)."""
    code = """
import importlib, os
for k in ("MINIDNN_SOFTMAX_WARP_FROM", "MINIDNN_SOFTMAX_BWD_STASH"):
    os.environ.pop(k, None)
from minidnn.backend.cuda import softmax_kernels as s
out = [(s.WARP_FROM, s.BWD_STASH)]
os.environ["MINIDNN_SOFTMAX_WARP_FROM"], os.environ["MINIDNN_SOFTMAX_BWD_STASH"] = "257", "2"
s = importlib.reload(s)
out.append((s.WARP_FROM, s.BWD_STASH))
print(repr(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-800:]
    assert eval(r.stdout.strip().splitlines()[-1]) == [(257, 6), (257, 2)]


def test_launches_under_the_fake_cupy():
    """Under tools/record_launches.py's fake CuPy: a (4096, 32000) log-softmax / softmax backward launches -DBSCH=3
    with 96 / 192 KB of dynamic shared memory under BWD_STASH 1 (none under 0; switching re-plans through plan()'s
    key); a (16384, 512) float32 forward launches -DWARP=1 in 128-thread blocks under WARP_FROM 257 (PIPE's 256
    under 513; the plans forgotten between, as for FWD_WARP); one launch a call."""
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import re, numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
recs = []
R.record_to(L, recs)
import minidnn.backend as B
from minidnn.backend import softmax as smx
from minidnn.backend.cuda import softmax_kernels as S
def forget():
    for k, v in vars(smx).items():
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()
y = fakecp.asarray(np.zeros((4096, 32000), np.float32))
out = []
for mode in (0, 1, 0):
    S.BWD_STASH = mode
    forget()
    for algo in ("log", "accurate"):
        n0 = len(recs)
        B.softmax_backward(None, algo, None, y, y, axis=-1)
        out.append([(re.findall(r"-DBSCH=\\d", r[0]), r[1][-1], r[1][3]) for r in recs[n0:]])
x = fakecp.asarray(np.zeros((16384, 512), np.float32))
for wf in (513, 257):
    S.WARP_FROM = wf
    S._plans.clear()                # WARP_FROM, as FWD_WARP, is read at planning time: not part of plan()'s key
    forget()
    n0 = len(recs)
    B.softmax_forward(None, "accurate", None, x, axis=-1)
    out.append([(re.findall(r"-DWARP=\\d", r[0]), r[1][3]) for r in recs[n0:]])
print(repr(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                       env=dict(os.environ, MINIDNN_SOFTMAX_CLUSTER="0"))      # the row kernels (see _row_kernels_only)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    out = eval(r.stdout.strip().splitlines()[-1])
    assert out[:6] == [[([], 0, 512)], [([], 0, 512)], [(["-DBSCH=3"], 96 * 1024, 512)],
                       [(["-DBSCH=3"], 192 * 1024, 512)], [([], 0, 512)], [([], 0, 512)]], out
    assert out[6:] == [[([], 256)], [(["-DWARP=1"], 128)]], out


# ---- compile checks ------------------------------------------------------------------------------------------------

def _build(spec, tmp, tag, source=None, ptx_only=False):
    """nvcc 13 sm_90 (-ftz=true, as CuPy builds): (PTX text, spill bytes, registers of the launched kernel)."""
    from minidnn.backend.cuda import launch
    src = os.path.join(tmp, f"{tag}.cu")
    launch.write_source(src, source or _sk.SOURCE, spec.defines)
    r = subprocess.run(["nvcc", "-std=c++14", "-arch=sm_90", "--ptx", "-ftz=true", "-o", src + ".ptx", src],
                       capture_output=True, text=True)
    assert r.returncode == 0, (spec.defines, r.stderr[-1500:])
    text = open(src + ".ptx").read()
    if ptx_only:
        return text, 0, 0
    r = subprocess.run(["ptxas", "-arch=sm_90", "-v", f"--entry={spec.name}", "-o", src + ".cubin", src + ".ptx"],
                       capture_output=True, text=True)
    m = re.search(r"(\d+) bytes spill stores.*?Used (\d+) registers", r.stderr, re.S)
    assert r.returncode == 0 and m, (spec.defines, r.stderr[-1500:])
    return text, int(m.group(1)), int(m.group(2))


def _new_plans():
    """(tag, backward, shape, algo, dtype, WARP_FROM, BWD_STASH) of the plans the switches add."""
    out = []
    for name in ("float32", "bfloat16", "float16", "float64"):
        for c in (32000, 32001, 50257, 16385):
            for algo in ("ACCURATE", "LOG"):
                for mode in ((1, 2, 3, 4) if algo == "LOG" else (1, 3)):
                    out.append((f"stash{mode}_{name}_{c}_{algo}", True, (4096, c), algo, name, 513, mode))
    for name in ("float32", "bfloat16", "float16"):
        for c in (512, 511, 384, 260 if name == "float32" else 264):      # 16-bit 260: RAGGED, 8 a lane (PIPE)
            for backward, algo in ((False, "ACCURATE"), (False, "LOG"), (False, "FAST"), (True, "LOG")):
                out.append((f"warp_{name}_{c}_{algo}_{int(backward)}", backward, (16384, c), algo, name, 257, 0))
    return out


ALWAYS = ("stash1_float32_32000_ACCURATE", "stash3_float32_32000_LOG", "stash3_bfloat16_32001_ACCURATE",
          "stash4_float32_50257_LOG", "stash4_bfloat16_50257_LOG", "warp_float32_512_ACCURATE_0")
BUILDS = pick(_new_plans(), 1, lambda b: b[0] in ALWAYS)


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("ptxas") is None, reason="nvcc is not installed")
def test_new_plans_build(tmp_path, monkeypatch):
    """nvcc 13 sm_90: the plans WARP_FROM 257 and BWD_STASH 1 / 2 / 3 / 4 make build without spills within the plan's
    budget (MINB blocks of BLOCK threads an SM), the stash's shared loads and stores in the backward's PTX (under
    BSA the cp.async copies, 2 NV a chunk -- NV under 4's dy-only stash -- and a wait; MINIDNN_NVCC_ALL=1: all
    144 plans)."""
    specs = []
    for tag, backward, shape, algo, name, wf, mode in BUILDS:
        monkeypatch.setattr(_sk, "WARP_FROM", wf)
        monkeypatch.setattr(_sk, "BWD_STASH", mode)
        specs.append((tag, _sk.launch_spec(backward, shape, (1,), algo, _dtype(name))))
    with ThreadPoolExecutor(2) as ex:
        got = list(ex.map(lambda ts: (ts[0], ts[1], _build(ts[1], str(tmp_path), ts[0])), specs))
    for tag, spec, (ptx, spill, regs) in got:
        d = _defs(spec.defines)
        assert spill == 0, (tag, spill)
        assert regs * d["BLOCK"] * d["MINB"] <= 65536, (tag, regs, d)
        if tag.startswith("stash"):
            assert d["BSCH"] >= 1 and re.search(r"st\.shared\.f(32|64)", ptx) and re.search(r"ld\.shared\.f(32|64)",
                                                                                         ptx), tag
            n = len(re.findall(r"cp\.async\.cg\.shared\.global", ptx))     # 2 NV a chunk (nvcc may unroll chunks);
            per = d["NV"] * (1 if d["ALGO"] == 2 and not d.get("BSY") else 2)     # NV: 4's dy-only BSA
            assert (n > 0 and n % per == 0) if d.get("BSA") else n == 0, (tag, n)
            assert ("cp.async.wait_all" in ptx) == bool(d.get("BSA")), tag
        else:
            assert d["WARP"] == 1, tag


def _source_before():
    """SOURCE of softmax_kernels.py at BEFORE (git), or None where git or the commit is not there."""
    try:
        text = subprocess.run(["git", "show", f"{BEFORE}:minidnn/backend/cuda/softmax_kernels.py"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    text = (text.replace("from .. import devices as _dev", "from minidnn.backend import devices as _dev")
            .replace("from . import launch as _launch", "from minidnn.backend.cuda import launch as _launch")
            .replace("from .bn_kernels import", "from minidnn.backend.cuda.bn_kernels import"))
    # session 22's NaN mend of the chunked forward's rescale (s * 0, not 0, while the running max is -inf: a NaN sum
    # kept), applied to the old text too, so that the identity is of what session 17 changed
    mend = ("if (nm != m) s = m == NEG_INF ? (A)0 : s * exp(m - nm);",
            "if (nm != m) s = m == NEG_INF ? s * (A)0 : s * exp(m - nm);")
    assert text.count(mend[0]) == 1
    text = text.replace(*mend)
    ns = {"__name__": "softmax_kernels_before"}
    exec(compile(text, "softmax_kernels_before.py", "exec"), ns)      # noqa: S102 -- the project's own history
    return ns


IDENTITY = pick([(True, (4096, 32000), "ACCURATE", "float32"), (True, (4096, 32000), "LOG", "bfloat16"),
                 (False, (65536, 512), "LOG", "float32"), (True, (65536, 512), "LOG", "float32")], 1,
                lambda p: p[1] == (4096, 32000) and p[2] == "LOG")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_ptx_unchanged_with_the_switches_off(tmp_path, monkeypatch):
    """With WARP_FROM 513 and BWD_STASH 0 the plans (defines, grid, shared memory) and the PTX of the kernels are the
    source's before the change, byte for byte (the backward the stash is written into, the 512-class rows' PIPE
    plans; MINIDNN_NVCC_ALL=1: four plans)."""
    old = _source_before()
    if old is None:
        pytest.skip(f"git or commit {BEFORE} not available")
    monkeypatch.setattr(_sk, "WARP_FROM", 513)
    monkeypatch.setattr(_sk, "BWD_STASH", 0)
    for backward, shape, algo, name in IDENTITY:
        spec = _sk.launch_spec(backward, shape, (1,), algo, _dtype(name))
        assert spec == old["launch_spec"](backward, shape, (1,), algo, _dtype(name))
        a = _build(spec, str(tmp_path), "now", ptx_only=True)[0]
        b = _build(spec, str(tmp_path), "before", old["SOURCE"], ptx_only=True)[0]
        assert a == b, (shape, algo, name)


# ---- GPU -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


def _bits(a, b, what):
    """Bitwise equal on the device (the raw words; NaNs of the same code compare equal)."""
    w = {2: "uint16", 4: "uint32", 8: "uint64"}[a.dtype.itemsize]
    bad = int((a.view(w) != b.view(w)).sum())
    assert bad == 0, f"{what}: {bad} of {a.size} elements differ from the switch off"


def _misaligned(cp, xd):
    """The same values one element off a 16-byte boundary (the kernels' element-load fallback)."""
    flat = cp.zeros(xd.size + 1, xd.dtype)
    flat[1:] = xd.ravel()
    return flat[1:].reshape(xd.shape)


def _cuda_specs():
    """Every launch_spec the cuda tests below plan (forward and backward, both settings of each switch), for one
    parallel precompile."""
    saved = (_sk.WARP_FROM, _sk.BWD_STASH, _sk.FWD_WARP)
    specs = []
    try:
        for name, rows, c in WARP_CASES:
            _sk.FWD_WARP = "1" if rows < _sk.WARP_MIN_ROWS else saved[2]
            for wf in (513, 257):
                _sk.WARP_FROM = wf
                specs += [_sk.launch_spec(False, (rows, c), (1,), a, _dtype(name)) for a in ALGOS]
                specs.append(_sk.launch_spec(True, (rows, c), (1,), "LOG", _dtype(name)))
        _sk.WARP_FROM, _sk.FWD_WARP = saved[0], saved[2]
        for name, rows, c in STASH_CASES + [("float32", 300, 32000)]:
            specs += [_sk.launch_spec(False, (rows, c), (1,), a, _dtype(name)) for a in ("ACCURATE", "LOG")]
            for mode in _sk.BWD_STASH_MODES:            # (precompile adds a BSR plan's fallback)
                _sk.BWD_STASH = mode
                specs += [_sk.launch_spec(True, (rows, c), (1,), a, _dtype(name)) for a in ("ACCURATE", "LOG")]
    finally:
        _sk.WARP_FROM, _sk.BWD_STASH, _sk.FWD_WARP = saved
    return specs


_WARM = []


def _warm():
    """Compile the kernels the cuda tests launch (~60) with a process a core into CuPy's disk cache first, not one
    by one as the cases reach them (as test_softmax_hint.py); where that fails each compiles when first launched."""
    if _WARM:
        return
    _WARM.append(True)
    try:
        _sk.precompile(_cuda_specs())
    except Exception as exc:        # noqa: BLE001 -- only a cache: the tests compile what they launch anyway
        print(f"precompile failed ({type(exc).__name__}: {exc}); compiling one by one")


WARP_CASES = [("float32", 12289, 512), ("float32", 4099, 511), ("float32", 3001, 300), ("bfloat16", 12289, 512),
              ("bfloat16", 3001, 384), ("float16", 2003, 264)]   # (16-bit: 264..512; 260 is ragged: PIPE)


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", WARP_CASES, ids=[f"{n}-{r}x{c}" for n, r, c in WARP_CASES])
def test_warp_from_rows(cp, monkeypatch, name, rows, c):
    """WARP_FROM 257 against 513 (PIPE): softmax and fast forward and the log-softmax backward bitwise, the
    log-softmax forward (LSM) and everything against float64; special rows (-inf, NaN, +80, tiny, wide), a
    misaligned view; FWD_WARP "1" below 12288 rows (the "auto" rule's threshold) so the small cases plan WARP too."""
    _warm()
    dtype = _dtype(name)
    if rows < _sk.WARP_MIN_ROWS:
        monkeypatch.setattr(_sk, "FWD_WARP", "1")
    x = _inputs(name, rows, c, rows + c)
    safe = np.ones(rows, bool)
    safe[6] = False                         # fast takes no max: exp(90) overflows float (its contract)
    dy = np.random.default_rng(c).standard_normal((rows, c)).astype(dtype)
    xd, dyd = cp.asarray(x), cp.asarray(dy)
    xm = _misaligned(cp, xd)
    x64 = x.astype(np.float64)
    got = {}
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for wf in (513, 257):
            monkeypatch.setattr(_sk, "WARP_FROM", wf)
            _reset_plans()
            for algo in ("accurate", "log") + (("fast",) if name == "float32" else ()):
                spec = _sk.launch_spec(False, (rows, c), (1,), algo.upper(), dtype)
                assert _defs(spec.defines).get("WARP", 0) == (1 if wf == 257 else 0), spec.defines
                n0 = _launches()
                y = B.softmax_forward(None, algo, None, xd, axis=-1)
                assert _launches() - n0 == 1
                sel = safe if algo == "fast" else np.ones(rows, bool)
                ref = _ref_fwd(x64, algo)
                _close(_host(y)[sel], ref[sel], name, f"{algo} WARP_FROM={wf}", scale=4 if algo == "log" else 1)
                ym = B.softmax_forward(None, algo, None, xm, axis=-1)
                _close(_host(ym)[sel], ref[sel], name, f"{algo} WARP_FROM={wf} misaligned",
                       scale=4 if algo == "log" else 1)
                got[wf, algo] = y
            yl = got[513, "log"]                    # the same y for both backwards
            for tag, (yy, dd) in (("", (yl, dyd)), (" misaligned", (_misaligned(cp, yl), _misaligned(cp, dyd)))):
                dx = B.softmax_backward(None, "log", None, yy, dd, axis=-1)
                yh, dyh = _host(yl), dy.astype(np.float64)
                _close(dx, _ref_bwd(yh, dyh, "log"), name, f"log-softmax backward WARP_FROM={wf}{tag}", scale=8,
                       mag=_mag_bwd(yh, dyh, "log"))
                got[wf, "bwd" + tag] = dx
            spec = _sk.launch_spec(True, (rows, c), (1,), "LOG", dtype)
            assert _defs(spec.defines).get("WARP", 0) == (1 if wf == 257 else 0), spec.defines
    for key in ("accurate", "fast", "bwd"):          # (misaligned: PIPE's fallback is bwd_rows, against float64)
        if (513, key) in got:
            _bits(got[257, key], got[513, key], f"{name} {rows}x{c} {key} WARP_FROM 257")


STASH_CASES = [("float32", 67, 32000), ("float32", 33, 32001), ("float32", 9, 50257), ("float32", 131, 16385),
               ("bfloat16", 67, 32000), ("bfloat16", 9, 50257), ("float64", 17, 32001), ("float16", 9, 20000),
               ("bfloat16", 9, 65536), ("float16", 9, 50257), ("float16", 8, 65536), ("bfloat16", 11, 49999)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", STASH_CASES, ids=[f"{n}-{r}x{c}" for n, r, c in STASH_CASES])
def test_bwd_stash_rows(cp, monkeypatch, name, rows, c):
    """BWD_STASH 1-6 bitwise 0 (softmax and log-softmax backward; the same sums in the same order; softmax's
    cp.async stash -- 3 where BSA fits; elsewhere 3 plans 1's stash (session 19) -- not: ~1 ulp in a tenth of the
    rows on the H200 in run 4, so it is held to float64 and to its own bits on a second call), against float64; a
    misaligned view (the element-load fallback: 3's is 2's float stash under BSA; 5's / 6's the BSF float stash, 6's
    through the BSR-less launch) bitwise too; the plan carrying BSCH, and under 6 BSR for the 16-bit log-softmax
    rows (session 20: every 16-bit case here fits two blocks an SM); one launch a call."""
    _warm()
    dtype = _dtype(name)
    x = _inputs(name, rows, c, rows + c)
    dy = np.random.default_rng(c + rows).standard_normal((rows, c)).astype(dtype)
    dy[7, c // 2] = np.nan
    xd, dyd = cp.asarray(x), cp.asarray(dy)
    got = {}
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ys = {algo: B.softmax_forward(None, algo, None, xd, axis=-1) for algo in ("accurate", "log")}
        for mode in _sk.BWD_STASH_MODES:
            monkeypatch.setattr(_sk, "BWD_STASH", mode)
            _reset_plans()
            for algo in ("accurate", "log"):
                spec = _sk.launch_spec(True, (rows, c), (1,), algo.upper(), dtype)
                d = _defs(spec.defines)     # 3: its cp.async stash (BSA) where it fits, else 1's (session 19)
                assert (d.get("BSCH", 0) > 0) == (mode > 0), spec.defines
                assert mode < 3 or d.get("BSA", 0) == 1 or d.get("BSY", 0) == 0, spec.defines
                assert d.get("BSR", 0) == (mode == 6 and algo == "log" and dtype.itemsize == 2), spec.defines
                y = ys[algo]
                n0 = _launches()
                dx = B.softmax_backward(None, algo, None, y, dyd, axis=-1)
                assert _launches() - n0 == 1
                yh, dyh = _host(y), dy.astype(np.float64)
                _close(dx, _ref_bwd(yh, dyh, algo), name, f"{algo} backward BWD_STASH={mode}", scale=8,
                       mag=_mag_bwd(yh, dyh, algo))
                got[mode, algo] = dx
                got[mode, algo, "bsa"] = d.get("BSA", 0) == 1
                got[mode, algo, "m"] = B.softmax_backward(None, algo, None, _misaligned(cp, y), _misaligned(cp, dyd),
                                                          axis=-1)
    for mode in _sk.BWD_STASH_MODES[1:]:
        for key in [k for k in got if k[0] == 0 and k[-1] != "bsa"]:
            if mode >= 3 and key[1:] == ("accurate",) and got[mode, "accurate", "bsa"]:
                continue        # softmax's BSA: not bitwise 0 (run 4), against float64 above and repeated below
            _bits(got[(mode,) + key[1:]], got[key], f"{name} {rows}x{c} {key[1:]} BWD_STASH={mode}")
    monkeypatch.setattr(_sk, "BWD_STASH", 6)
    _reset_plans()
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for algo in ("accurate", "log"):
            again = B.softmax_backward(None, algo, None, ys[algo], dyd, axis=-1)
            _bits(again, got[6, algo], f"{name} {rows}x{c} {algo} BWD_STASH=6 repeated")


GRAPH_CASES = [(2, 32000, "float32"), (3, 32000, "float32"), (4, 50257, "float32"), (5, 50257, "bfloat16"),
               (6, 50257, "bfloat16"), (6, 32000, "float16")]


@pytest.mark.cuda
@pytest.mark.parametrize("mode, c, name", GRAPH_CASES, ids=[f"{m}-{c}-{n}" for m, c, n in GRAPH_CASES])
def test_bwd_stash_in_a_graph(cp, monkeypatch, mode, c, name):
    """A captured 300-row log-softmax backward under BWD_STASH 2 / 3 (32000 classes), 4 (50257: dy's cp.async
    stash alone), 5 (bfloat16 50257: both arrays counted raw) and 6 (two blocks an SM: BSR) replays to the eager
    bits, twice, dy changed in place between the replays."""
    _warm()
    monkeypatch.setattr(_sk, "BWD_STASH", mode)
    _reset_plans()
    rows = 300
    dtype = _dtype(name)
    assert ("BSR=1" in _sk.launch_spec(True, (rows, c), (1,), "LOG", dtype).defines) == (mode == 6)
    y = B.softmax_forward(None, "log", None, cp.asarray(_inputs(name, rows, c, 5)), axis=-1)
    dy = cp.asarray(np.random.default_rng(2).standard_normal((rows, c)).astype(dtype))
    B.softmax_backward(None, "log", None, y, dy, axis=-1)             # plans and compiles outside the capture
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        dx = B.softmax_backward(None, "log", None, y, dy, axis=-1)
        g = s.end_capture()
    w = {2: "uint16", 4: "uint32"}[dtype.itemsize]       # (an in-place copy of the raw words: any dtype)
    nxt = [cp.asarray((np.random.default_rng(3 + k).standard_normal((rows, c)) * 1.5).astype(dtype)) for k in range(2)]
    for k in range(2):
        with s:                 # on the graph's stream: a non-blocking stream does not wait for the default one
            dy.view(w)[...] = nxt[k].view(w)
            g.launch(s)
        s.synchronize()
        _bits(dx, B.softmax_backward(None, "log", None, y, dy, axis=-1), f"replay {k}")


def test_row_ab_plans(monkeypatch):
    """tools/row_ab.py --bwd-stash 0,1,2,3 and --warp-from 513,257 plan (before any timing) the kernel of each
    setting -- BSCH / BSY / BSA on the 32000-class backward, WARP on the 512-class rows -- and put the settings the
    process started with back."""
    monkeypatch.setitem(device_facts._l2, 0, (50 * 2 ** 20, True))        # no GPU asked (the hints stay 0)
    first, got = row_ab_specs(
        (["smxbwd", "lsmxbwd"], ["float32"], [(4096, 32000)], lambda op: ["bs0", "bs1", "bs2", "bs3"]),
        (["smx", "lsmx", "lsmxbwd"], ["float32"], [(65536, 512)], lambda op: ["wf513", "wf257"]))
    stash = [tuple(d for d in s.defines if d[:3] in ("BSC", "BSY", "BSA")) for s in first]
    assert stash == [(), ("BSCH=3",), ("BSCH=3",), ("BSCH=3", "BSA=1"),
                     (), ("BSCH=3",), ("BSCH=3", "BSY=1"), ("BSCH=3", "BSY=1", "BSA=1")], stash
    assert [_defs(s.defines).get("WARP", 0) for s in got] == [0, 1] * 3
    assert (_sk.BWD_STASH, _sk.WARP_FROM) == (6, 257)
