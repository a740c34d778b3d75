"""Session 17: cache hints of the softmax / log-softmax row kernels (softmax_kernels.HINT_FWD / HINT_BWD,
MINIDNN_SOFTMAX_HINT="fwd,bwd"; ROW_HEADER's HINT define: 0 none, 1 streaming loads and stores, 2 streaming stores;
docs/step_kernels.md, "Session 17: cache hints of the row kernels").

CPU: the rule (a hint only on one-chunk row plans of calls whose arrays exceed L2 -- a fake L2 here --, as a HINT
define after ALGO, nothing else of the plan changed; no define at 0, so the default plans compile as before), the
size rule and its switch, the environment variables in a fresh interpreter, plan()'s key (a switched hint re-plans
without clearing anything but the primitive's validated-call caches) and the launched kernel's options under the
fake CuPy, nvcc sm_90 builds of a handful of hinted kernels (the hinted instructions in the PTX at 1 and 2, one for
each access of 0, none at 0; no spill and registers within the plan's budget), tools/row_ab.py's --hint plans.
GPU (cuda-marked): every hint setting bitwise HINT 0 and against float64 over rows 1, 7, 12289, 16384 and classes
10, 513, 1000, 1024, 4097, float32 and bfloat16, softmax and log-softmax forward and backward, a misaligned view (the
element-load fallback) too.
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
L2 = 50 * 2 ** 20                       # an H100 / H200's L2
NAMES = ("float32", "bfloat16", "float16", "float64")


@pytest.fixture
def fake_l2(monkeypatch):
    """Device 0 has an L2 of ``L2`` bytes (device_facts' cache: no GPU asked)."""
    monkeypatch.setitem(device_facts._l2, 0, (L2, True))
    monkeypatch.setattr(_sk, "HINT_BY_SIZE", True)


def _nbytes(shape, name, backward):
    return int(np.prod(shape)) * np.dtype(_dtype(name)).itemsize * (3 if backward else 2)


@pytest.mark.parametrize("fwd, bwd", [(0, 0), (1, 2), (2, 0), (2, 2)])
def test_hint_rule(monkeypatch, fake_l2, fwd, bwd):
    """The call's hint (call_hint: the setting where its arrays exceed L2, else 0) goes into the plan as HINT=n right
    after ALGO on row plans of one chunk (inner = 1, each element read once), and nothing else of the plan changes;
    several-chunk rows (read again from L2), channel columns and hint 0 plan exactly as before."""
    monkeypatch.setattr(_sk, "HINT_FWD", fwd)
    monkeypatch.setattr(_sk, "HINT_BWD", bwd)
    hinted = plain = 0
    cases = ([((r, c), (1,)) for r in (16384, 4096, 7) for c in (10, 513, 1000, 1001, 1024, 4097, 50257)]
             + [((64, 1000, 300), (1,)), ((8, 7, 300000), (1,))])
    for name in NAMES:
        for shape, axes in cases:
            for algo in ("FAST", "ACCURATE", "LOG"):
                for backward in (False, True):
                    nb = _nbytes(shape, name, backward)
                    hint = _sk.call_hint(backward, nb, 0)
                    assert hint == ((bwd if backward else fwd) if nb > L2 else 0), (name, shape, backward)
                    base = _sk.launch_spec(backward, shape, axes, algo, _dtype(name))
                    spec = _sk.launch_spec(backward, shape, axes, algo, _dtype(name), hint)
                    d = _defs(base.defines)
                    fits = base.source == "ROWS" and d["ONE"] == 1 and d["STORAGE"] != 1 and not (
                        backward and d["PIPE"] == 1 and d["NV"] * d["VEC"] <= 16)
                    if not (hint and fits):
                        assert spec == base, (name, shape, algo, backward, hint)
                        plain += 1
                        continue
                    assert base.defines[3].startswith("ALGO=") and "HINT" not in _defs(base.defines)
                    d = 3 if hint == 2 and not backward else hint      # the forward's 2: asm .nc loads
                    assert spec.defines == base.defines[:4] + (f"HINT={d}",) + base.defines[4:]
                    assert spec._replace(defines=base.defines) == base
                    hinted += 1
    assert plain > 0 and (hinted > 40 if fwd or bwd else hinted == 0), (hinted, plain)


def test_hint_skips_rows_read_again(fake_l2, monkeypatch):
    """A row of several chunks re-reads some of them (L2 or the shared-memory stash): no hint, even at 2 GB."""
    monkeypatch.setattr(_sk, "HINT_FWD", 1)
    shape = (4096, 131072)
    spec = _sk.launch_spec(False, shape, (1,), "ACCURATE", np.float32, _sk.call_hint(False, 2 * 4 * 4096 * 131072, 0))
    assert _defs(spec.defines)["ONE"] == 0 and "HINT" not in _defs(spec.defines)


def test_call_hint_by_size(monkeypatch):
    """The size rule: forward x + y, backward y + dy + dx against L2 (the backward's third array tips (8192, 1000)
    float32 over an 80 MB L2, the forward stays under); an L2 the device does not report (0) hints; HINT_BY_SIZE off
    hints at every size; a setting of 0 never; a backward 1 or an unknown value is an error."""
    monkeypatch.setitem(device_facts._l2, 0, (80 * 2 ** 20, True))
    monkeypatch.setattr(_sk, "HINT_BY_SIZE", True)
    monkeypatch.setattr(_sk, "HINT_FWD", 1)
    monkeypatch.setattr(_sk, "HINT_BWD", 2)
    fwd, bwd = _nbytes((8192, 1000), "float32", False), _nbytes((8192, 1000), "float32", True)
    assert (_sk.call_hint(False, fwd, 0), _sk.call_hint(True, bwd, 0)) == (0, 2)
    assert (_sk.call_hint(False, 2 * fwd, 0), _sk.call_hint(True, bwd // 2, 0)) == (1, 0)
    monkeypatch.setitem(device_facts._l2, 0, (0, False))
    assert (_sk.call_hint(False, 80, 0), _sk.call_hint(True, 120, 0)) == (1, 2)
    monkeypatch.setitem(device_facts._l2, 0, (80 * 2 ** 20, True))
    monkeypatch.setattr(_sk, "HINT_BY_SIZE", False)
    assert (_sk.call_hint(False, 80, 0), _sk.call_hint(True, 120, 0)) == (1, 2)
    monkeypatch.setattr(_sk, "HINT_FWD", 0)
    assert _sk.call_hint(False, 2 * fwd, 0) == 0
    for attr, bad in (("HINT_BWD", 1), ("HINT_FWD", 3)):
        monkeypatch.setattr(_sk, attr, bad)
        with pytest.raises(ValueError, match="backward 0 or 2"):
            _sk.call_hint(attr == "HINT_BWD", 2 * fwd, 0)


def test_hint_env():
    """MINIDNN_SOFTMAX_HINT / _HINT_BY_SIZE set the module defaults at import ("2,0" and on when unset); a backward 1
    or a malformed value fails at import with a message naming the variable (one fresh interpreter, the module
    imported again under each setting)."""
    code = """
import importlib, os
os.environ.pop("MINIDNN_SOFTMAX_HINT", None); os.environ.pop("MINIDNN_SOFTMAX_HINT_BY_SIZE", None)
from minidnn.backend.cuda import softmax_kernels as s
out = [(s.HINT_FWD, s.HINT_BWD, s.HINT_BY_SIZE)]
for val, size in (("1,2", "1"), ("2,0", "0"), ("1,1", "1"), ("1", "1")):
    os.environ["MINIDNN_SOFTMAX_HINT"], os.environ["MINIDNN_SOFTMAX_HINT_BY_SIZE"] = val, size
    try:
        s = importlib.reload(s)
        out.append((s.HINT_FWD, s.HINT_BWD, s.HINT_BY_SIZE))
    except ValueError as e:
        out.append(str(e)[:26])
print(repr(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-800:]
    assert eval(r.stdout.strip().splitlines()[-1]) == [(2, 0, True), (1, 2, True), (2, 0, False),
                                                       "MINIDNN_SOFTMAX_HINT='1,1'", "MINIDNN_SOFTMAX_HINT='1' m"]


def test_hint_replans_and_launches_under_the_fake_cupy():
    """Under tools/record_launches.py's fake CuPy (whose device reports no L2 size: every call hinted): the launched
    forward and backward kernels carry -DHINT=n of the current HINT_FWD / HINT_BWD, and none at 0; switching the
    setting re-plans through plan()'s key (only the primitive's validated-call caches are cleared, not
    softmax_kernels._plans); a device reporting a large L2 launches no hint; one launch a call."""
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
recs = []
R.record_to(L, recs)
import minidnn.backend as B
from minidnn.backend import softmax as smx
from minidnn.backend.cuda import softmax_kernels as S, device_facts
x = fakecp.asarray(np.zeros((16384, 1000), np.float32))
out = []
for fwd, bwd, l2 in ((0, 0, None), (1, 2, None), (2, 0, None), (1, 2, 1 << 40)):
    S.HINT_FWD, S.HINT_BWD = fwd, bwd
    if l2:
        fakecp.cuda.Device.attributes["L2CacheSize"] = l2
        fakecp.cuda.Device.compute_capability = "90"
        device_facts._l2.clear()
    for k, v in vars(smx).items():
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()
    n0 = len(recs)
    y = B.softmax_forward(None, "log", None, x, axis=-1)
    B.softmax_backward(None, "log", None, y, x, axis=-1)
    out.append([re.findall(r"-DHINT=\\d", r[0]) for r in recs[n0:]])
print(repr((out, len(S._plans))))
""".replace("import numpy as np,", "import re, numpy as np,")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    out, nplans = eval(r.stdout.strip().splitlines()[-1])
    assert out == [[[], []], [["-DHINT=1"], ["-DHINT=2"]], [["-DHINT=3"], []], [[], []]], out
    assert nplans >= 5, nplans          # fwd / bwd at hint 0, then fwd 1, bwd 2, fwd 2 (the large-L2 calls: hint 0)


# ---- compile checks ----------------------------------------------------------------------------------------------

def _nvcc(spec, tmp, tag):
    """(PTX text of the launched kernel's entry, spill bytes, registers) of ``spec`` (nvcc 13 sm_90, -ftz=true as
    CuPy builds)."""
    from minidnn.backend.cuda import launch
    src = os.path.join(tmp, f"{tag}.cu")
    launch.write_source(src, _sk.SOURCE, spec.defines)
    r = subprocess.run(["nvcc", "-std=c++14", "-arch=sm_90", "--ptx", "-ftz=true", "-o", src + ".ptx", src],
                       capture_output=True, text=True)
    assert r.returncode == 0, (spec.defines, r.stderr[-1500:])
    r = subprocess.run(["ptxas", "-arch=sm_90", "-v", f"--entry={spec.name}", "-o", src + ".cubin", src + ".ptx"],
                       capture_output=True, text=True)
    m = re.search(r"(\d+) bytes spill stores.*?Used (\d+) registers", r.stderr, re.S)
    assert r.returncode == 0 and m, (spec.defines, r.stderr[-1500:])
    text = open(src + ".ptx").read()
    entry = text[text.index(f".entry {spec.name}"):]
    entry = entry[:entry.index("\n}\n")]
    return entry, int(m.group(1)), int(m.group(2))


# (tag, backward, shape, algo, dtype, hint): the WARP log-softmax forward (LSM 2) at 0 / 1 / 2, a RAGGED 2-byte PIPE
# forward (the edges' 16-bit accesses, pipe_issue), the WARP log-softmax backward and softmax's bwd_rows at 2
HINT_BUILDS = [("wlog0", False, (16384, 1000), "LOG", "float32", 0),
               ("wlog1", False, (16384, 1000), "LOG", "float32", 1),
               ("wlog2", False, (16384, 1000), "LOG", "float32", 2),
               ("pipe1", False, (4096, 1001), "ACCURATE", "bfloat16", 1),
               ("wbwd2", True, (16384, 1000), "LOG", "float32", 2),
               ("rbwd2", True, (16384, 1000), "ACCURATE", "float32", 2)]


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("ptxas") is None, reason="nvcc is not installed")
def test_hint_builds(tmp_path):
    """nvcc 13 sm_90: the hinted kernels build without spills and within the plan's register budget (MINB blocks
    of BLOCK threads an SM); HINT 1's PTX has ld.global.cs / st.global.cs vectors, one for each ld.global.nc /
    st.global vector of HINT 0's, and no plain vector access left; HINT 2's the streaming vector stores only; HINT
    0's none."""
    def build(b):
        tag, backward, shape, algo, name, hint = b
        spec = _sk.launch_spec(backward, shape, (1,), algo, _dtype(name), hint)
        assert ("HINT" in _defs(spec.defines)) == bool(hint)
        return tag, spec, _nvcc(spec, str(tmp_path), tag)
    with ThreadPoolExecutor(3) as ex:
        got = {tag: (spec, res) for tag, spec, res in ex.map(build, HINT_BUILDS)}
    for tag, (spec, (ptx, spill, regs)) in got.items():
        d = _defs(spec.defines)
        assert spill == 0, (tag, spill)
        assert regs * d["BLOCK"] * d["MINB"] <= 65536, (tag, regs, d)

    def count(ptx, pat):
        return len(re.findall(pat, ptx))
    p0, p1, p2 = (got[t][1][0] for t in ("wlog0", "wlog1", "wlog2"))
    assert count(p0, r"\.cs") == 0 and count(p0, r"ld\.global\.nc\.v4") > 0
    assert count(p1, r"ld\.global\.cs\.v4") == count(p0, r"ld\.global\.nc\.v4"), "one streaming load per vector load"
    assert count(p1, r"st\.global\.cs\.v4") == count(p0, r"st\.global\.v4"), "one streaming store per vector store"
    assert count(p1, r"ld\.global\.(nc\.)?v4") == 0 and count(p1, r"st\.global\.v4") == 0
    assert count(p2, r"st\.global\.cs\.v4") == count(p0, r"st\.global\.v4") and count(p2, r"ld\.global\.cs") == 0
    assert count(p2, r"st\.global\.v4") == 0 and count(p2, r"ld\.global\.nc\.v4") == count(p0, r"ld\.global\.nc\.v4")
    pipe = got["pipe1"][1][0]
    assert count(pipe, r"ld\.global\.cs\.u16") > 0 and count(pipe, r"st\.global\.cs\.u16") > 0   # the edges
    assert count(pipe, r"ld\.global\.cs\.v4") > 0 and count(pipe, r"st\.global\.cs\.v4") > 0
    for t in ("wbwd2", "rbwd2"):
        b = got[t][1][0]
        assert count(b, r"st\.global\.cs\.v4") > 0 and count(b, r"ld\.global\.cs") == 0, t


def test_row_ab_hint_plans(fake_l2):
    """tools/row_ab.py --hint 0,1,2 plans (before any timing) a kernel a setting where the call exceeds L2 -- the
    backward skips 1 -- and one kernel for a shape under L2; its precompile collects them all."""
    got, = row_ab_specs((["smx", "lsmx", "lsmxbwd"], ["float32", "bfloat16"], [(16384, 1000), (16384, 513)],
                         lambda op: ["h0", "h1", "h2"] if op != "lsmxbwd" else ["h0", "h2"]))
    hints = {}
    for s in got:
        hints.setdefault((s.name, _defs(s.defines)["STORAGE"]), set()).add(_defs(s.defines).get("HINT", 0))
    assert hints[("softmax_rows_fwd", 0)] == {0, 1, 3} and hints[("softmax_rows_bwd", 0)] == {0, 2}, hints
    assert hints[("softmax_rows_fwd", 2)] == {0, 1, 3}, hints     # bf16 (16384, 1000): 65.5 MB > 50 MB
    bf513 = [s for s in got if _defs(s.defines)["STORAGE"] == 2 and _defs(s.defines)["NV"] * _defs(s.defines)["VEC"]
             == 16 and s.name == "softmax_rows_fwd"]
    assert bf513 and all("HINT" not in _defs(s.defines) for s in bf513)   # (16384, 513) bf16: 33.6 MB, under L2


# ---- GPU ------------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    from minidnn.backend import devices as _dev
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


HINT_ROWS = (1, 7, 12289, 16384)
HINT_CLASSES = (10, 513, 1000, 1024, 4097)
HINT_CASES = [(n, c) for n in ("float32", "bfloat16") for c in HINT_CLASSES]
_OPS = ((False, "accurate", (0, 1, 2)), (False, "log", (0, 1, 2)), (True, "accurate", (0, 2)), (True, "log", (0, 2)))


def _settings_specs(dtype_name=None):
    """Every launch_spec the cuda test plans (hints at every size) for data of ``dtype_name`` (None: all), for one
    parallel precompile."""
    specs = []
    for name, c in HINT_CASES:
        if dtype_name not in (None, name):
            continue
        for rows in HINT_ROWS:
            for backward, algo, hints in _OPS:
                for h in hints:
                    specs.append(_sk.launch_spec(backward, (rows, c), (1,), algo.upper(), _dtype(name), h))
    return specs


_WARM = set()


def _warm(name):
    """Compile the kernels the test launches for ``name`` data (~60 a dtype) with a process a core first (CuPy's disk
    cache), not one by one as the cases reach them; where that fails, each compiles when first launched."""
    if name in _WARM:
        return
    _WARM.add(name)
    try:
        _sk.precompile(_settings_specs(name))
    except Exception as exc:        # noqa: BLE001 -- only a cache: the test compiles what it launches anyway
        print(f"precompile failed ({type(exc).__name__}: {exc}); compiling one by one")


def _rows_input(name, rows, c, seed):
    if rows >= 8:
        return _inputs(name, rows, c, seed)
    return (np.random.default_rng(seed).standard_normal((rows, c)) * 3).astype(_dtype(name))


def _edges(a, rows, k=48):
    """Rows [0, k) and [max(k, rows - k), rows) of a device (or host) array, on the host as float64 (two contiguous
    slices: no gather kernel for 2-byte data)."""
    lo, hi = min(rows, k), max(min(rows, k), rows - k)
    return np.concatenate([_host(a[:lo]), _host(a[hi:])])


def _bits(a, b, what):
    """Bitwise equal on the device (the raw words; NaNs of the same code compare equal)."""
    w = {2: "uint16", 4: "uint32", 8: "uint64"}[a.dtype.itemsize]
    bad = int((a.view(w) != b.view(w)).sum())
    assert bad == 0, f"{what}: {bad} of {a.size} elements differ from HINT 0"


@pytest.mark.cuda
@pytest.mark.parametrize("name, c", HINT_CASES, ids=[f"{n}-{c}" for n, c in HINT_CASES])
def test_hint_rows(cp, monkeypatch, name, c):
    """HINT 1 and 2 bitwise HINT 0 (forward), HINT 2 bitwise 0 (backward), over rows 1, 7, 12289, 16384 (PIPE and
    WARP plans; special rows: -inf, NaN, half -inf, +80, x1e-30, x30), a misaligned view (the element-load fallback)
    too; every setting against float64 on the first and last 48 rows (the bits cover the rest); the plan carrying
    the define; one launch a call."""
    _warm(name)
    monkeypatch.setattr(_sk, "HINT_BY_SIZE", False)          # the hints at every size: small calls too
    dtype = _dtype(name)
    for rows in HINT_ROWS:
        x = _rows_input(name, rows, c, rows + c)
        dy = np.random.default_rng(c + rows).standard_normal((rows, c)).astype(dtype)
        xd, dyd = cp.asarray(x), cp.asarray(dy)
        flat = cp.zeros(rows * c + 1, dtype)
        flat[1:] = xd.ravel()
        xm = flat[1:].reshape(rows, c)
        x64, dy64 = _edges(x, rows), _edges(dy, rows)
        got = {}
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            for backward, algo, hints in _OPS:
                for h in hints:
                    monkeypatch.setattr(_sk, "HINT_BWD" if backward else "HINT_FWD", h)
                    _reset_plans()
                    spec = _sk.launch_spec(backward, (rows, c), (1,), algo.upper(), dtype, h)
                    d = _defs(spec.defines)
                    fits = d["ONE"] == 1 and not (backward and d["PIPE"] == 1 and d["NV"] * d["VEC"] <= 16)
                    want = (3 if h == 2 and not backward else h) if fits else 0
                    assert _defs(spec.defines).get("HINT", 0) == want
                    what = f"{name} {rows}x{c} {algo} {'bwd' if backward else 'fwd'} HINT={h}"
                    n0 = _launches()
                    if backward:
                        y = got[False, algo, 0]
                        out = B.softmax_backward(None, algo, None, y, dyd, axis=-1)
                        yh = _edges(y, rows)
                        _close(_edges(out, rows), _ref_bwd(yh, dy64, algo), name, what, scale=8,
                               mag=_mag_bwd(yh, dy64, algo))
                    else:
                        out = B.softmax_forward(None, algo, None, xd, axis=-1)
                        _close(_edges(out, rows), _ref_fwd(x64, algo), name, what, scale=4 if algo == "log" else 1)
                        ym = got[False, algo, h, "m"] = B.softmax_forward(None, algo, None, xm, axis=-1)
                        _close(_edges(ym, rows), _ref_fwd(x64, algo), name, what + " misaligned",
                               scale=4 if algo == "log" else 1)
                    assert _launches() - n0 == (1 if backward else 2)
                    got[backward, algo, h] = out
        for (backward, algo, h), out in [(k, v) for k, v in got.items() if len(k) == 3 and k[2]]:
            _bits(out, got[backward, algo, 0], f"{name} {rows}x{c} {algo} bwd={backward} HINT={h}")
            if not backward:
                _bits(got[False, algo, h, "m"], got[False, algo, 0, "m"], f"{name} {rows}x{c} {algo} misaligned {h}")
