"""Cross-entropy on 16-bit logits read as float32 (session 11; loss_kernels XSTORAGE, softmax_cross_entropy_*'s
``widen``, nn cross_entropy under autocast) -- the parts a machine without a GPU can check:
- the planner gives the widened kernels float32's whole plan (tiling, registers, grid) plus XSTORAGE, so their sums
  run in float32's order (the float16 backward one block fewer an SM: no sum crosses its rows);
- nvcc sm_90 compiles every widened configuration, without spills where float32's twin has none;
- under the fake CuPy (tools/record_launches.py): the widened calls launch one kernel each way with those defines,
  float32 loss / lse / denom and a 16-bit dx; a seen call launches the same; a logits view off the vector boundary
  takes the cast and float32's kernel; nn's cross_entropy in an autocast region makes no cast (forward or backward)
  and gives PyTorch's dtypes, while a float64 weight, autocast off and no region keep their paths;
- the reference of ``widen`` (host arrays) is the cast path.
The values on the GPU, bitwise against the cast path: tests/backend/test_ce_lowp_logits_cuda.py."""
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import loss_kernels as _lk
from tests import _nvcc
from tests._nvcc import pick

ROOT = pathlib.Path(__file__).resolve().parents[2]
BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
SHAPES = [(8, 1), (300, 10), (8, 33), (64, 1000), (77, 1001), (8, 1025), (40, 4097), (3, 32768), (3, 50257),
          (5, 7, 3)]
OPTS = [(False, "mean", 0.0), (True, "none", 0.0), (True, "sum", 0.1), (False, "mean", 0.1)]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_widened_plan_is_float32s_plus_the_logits_storage(dtype, shape):
    for name in ("ce_fwd", "ce_bwd"):
        for weighted, red, eps in OPTS:
            f32 = _lk.launch_spec(name, shape, F32, np.int64, weighted, red, eps)
            w = _lk.launch_spec(name, shape, dtype, np.int64, weighted, red, eps, widen=True)
            assert w[0] == f32[0] and w[1] == f32[1] and w[3:] == f32[3:], (name, w, f32)
            extra = [d for d in w[2] if d not in f32[2]]
            missing = [d for d in f32[2] if d not in w[2]]
            xs = 1 if dtype == F16 else 2
            if dtype == F16 and name == "ce_bwd" and w[0] == "ROWS" and any(d.startswith("MINB=") and d != "MINB=1"
                                                                            for d in f32[2]):
                minb = int(dict(d.split("=", 1) for d in f32[2])["MINB"])
                assert sorted(extra) == sorted([f"XSTORAGE={xs}", f"MINB={minb - 1}"]), extra
                assert missing == [f"MINB={minb}"], missing
            else:
                assert extra == [f"XSTORAGE={xs}"] and not missing, (extra, missing)
            assert "P16=1" not in w[2] and "FASTX=0" in w[2] + ("FASTX=0",)


def test_supports_and_bad_widen_input():
    # host arrays: never the kernels; a widen call on 32-bit logits or with a 16-bit weight is refused up front
    x = np.zeros((4, 5), np.float32)
    t = np.zeros(4, np.int64)
    with pytest.raises(B.BadParamError, match="widen=True reads float16/bfloat16"):
        B.softmax_cross_entropy_forward(None, x, t, widen=True)
    with pytest.raises(B.BadParamError, match=r"float32 \(widen=True\)"):
        B.softmax_cross_entropy_forward(None, x.astype(BF16), t, np.ones(5, BF16), widen=True)
    assert not _lk.supports(x.astype(BF16), t, None, widen=True)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("red, weighted, eps, ignore", [("mean", True, 0.1, 0.3), ("sum", False, 0.0, 0.0),
                                                        ("none", True, 0.0, 0.5), ("mean", False, 0.0, 1.0)])
def test_the_reference_is_the_cast_path(dtype, red, weighted, eps, ignore):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((37, 11, 3)) * 4).astype(dtype)
    t = rng.integers(0, 11, (37, 3))
    t[rng.random(t.shape) < ignore] = -100
    w = rng.random(11).astype(np.float32) + 0.5 if weighted else None
    with np.errstate(all="ignore"):
        loss, lse, den = B.softmax_cross_entropy_forward(None, x, t, w, -100, eps, red, widen=True)
        ref = B.softmax_cross_entropy_forward(None, x.astype(np.float32), t, w, -100, eps, red)
        g = np.asarray(rng.standard_normal(np.shape(loss)), np.float32)
        dx = B.softmax_cross_entropy_backward(None, x, t, g, lse, den, w, -100, eps, red, widen=True)
        dref = B.softmax_cross_entropy_backward(None, x.astype(np.float32), t, g, *ref[1:], w, -100, eps, red)
    for a, b in zip((loss, lse, den), ref):
        assert np.asarray(a).dtype == F32 and np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    assert dx.dtype == dtype and np.array_equal(dx.view(np.uint16), dref.astype(dtype).view(np.uint16))


# ---- nvcc: every widened configuration compiles, no spill where float32's twin has none ----------------------------

NVCC_SHAPES = [(8, 1), (8, 10), (8, 33), (8, 1000), (8, 1001), (8, 4097), (8, 32768), (4, 10, 3)]


def _spill(report, kname):
    m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores" % kname, report, re.S)
    return None if m is None else int(m.group(1))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_widened_configurations_compile_without_spills():
    pairs = {}
    for shape in NVCC_SHAPES:
        for dtype in (BF16, F16):
            for name in ("ce_fwd", "ce_bwd"):
                for weighted, red, eps in OPTS[:3]:
                    w = _lk.launch_spec(name, shape, dtype, np.int64, weighted, red, eps, widen=True)[:3]
                    f = _lk.launch_spec(name, shape, F32, np.int64, weighted, red, eps)[:3]
                    pairs[w] = f
    assert len(pairs) >= 60
    pairs = {w: pairs[w] for w in pick(pairs, 12)}     # a spread of them (tests/_nvcc.py)

    # One compile per (source, defines), ptxas building only the entries read from it; float32's twin only for a
    # widened entry that spills -- the one case whose bound reads it.  That left a third of the compiles and half of
    # ptxas's work out (the test was 70 s of the suite).
    def build_all(jobs):      # in batched nvcc runs (tests/_nvcc.build: each unit's report is its own build's)
        units = {}
        for src, kname, defines in jobs:
            units.setdefault((src, defines), set()).add(kname)
        built = _nvcc.build([(_lk._SOURCES[src], defines) for src, defines in units],
                            entries=[sorted(k) for k in units.values()])
        return {u: (b.returncode, b.stderr) for u, b in zip(units, built)}

    def unit(job):
        return job[0], job[2]
    built = build_all(pairs)
    spills = {}
    for w in pairs:
        rc, report = built[unit(w)]
        spills[w] = _spill(report, w[1])
        assert rc == 0 and spills[w] is not None, (w, report[-1500:])
    twins = build_all({f for w, f in pairs.items() if spills[w]})
    for w, f in pairs.items():
        spill = spills[w]
        if spill == 0:
            continue
        rc, report = twins[unit(f)]
        f_spill = _spill(report, f[1])
        assert rc == 0 and f_spill is not None, (f, report[-1500:])
        # none where float32's twin has none; where it spills (label smoothing with weights: 4 bytes), the project's
        # bound for such configurations (the float16 twin at 1000 classes: 6 bytes at its 128 registers)
        assert f_spill and spill <= 256, (w, spill, f_spill)


# ---- the fake CuPy: launches, dtypes, the seen call, the misaligned view, nn under autocast --------------------------

_PRELUDE = textwrap.dedent("""
    import json, re, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    R._zero_pointers(fakecp, L)
    R.numpy_fallback(fakecp)
    recs = R.record_packed(L, [], other="cupy")
    import numpy as np
    import ml_dtypes
    import minidnn as mdn
    import minidnn.backend as B
    import minidnn.nn.functional as F
    from minidnn.backend import softmax as SM
    full = [0]
    real = SM.begin
    def begin(*a, **k):
        full[0] += 1
        return real(*a, **k)
    SM.begin = begin
    DT = np.dtype(ml_dtypes.bfloat16) if {dtype!r} == "bfloat16" else np.dtype(np.float16)
    rng = np.random.default_rng(0)
    def arr(*s, dt=np.float32):
        return fakecp.asarray(rng.standard_normal(s).astype(np.float32).astype(dt))
    _astype = fakecp.ndarray.astype
    def astype(self, *a, **k):
        recs.append(["cupy:astype", [], ""])
        return _astype(self, *a, **k)
    fakecp.ndarray.astype = astype
    def names():
        # kernel launches as "name STORAGE=.. [XSTORAGE=..]", CuPy operations as "cupy..."
        out = []
        for r in recs:
            k = str(r[0])
            if k.startswith("cupy"):
                out.append(k)
                continue
            name, opts = k.split("(", 1)
            out.append(" ".join([name] + re.findall(r"-D(X?STORAGE=\\d)", opts)))
        return out
    out = {{}}
""")


def _run(body, dtype):
    script = _PRELUDE.format(root=str(ROOT), dtype=dtype) + textwrap.dedent(body) + \
        "\nimport json\nprint(json.dumps(out))\n"
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    import json
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fake_gpu_widened_primitive(dtype):
    out = _run("""
        x, t, w = arr(64, 1000, dt=DT), fakecp.asarray(np.arange(64) % 1000), arr(1000)
        for i in range(2):
            recs.clear(); full[0] = 0
            loss, lse, den = B.softmax_cross_entropy_forward(None, x, t, w, -100, 0.1, "mean", widen=True)
            dx = B.softmax_cross_entropy_backward(None, x, t, fakecp.asarray(np.ones((), np.float32)), lse, den, w,
                                                  -100, 0.1, "mean", widen=True)
            out[f"call{i}"] = [names(), full[0], str(loss.dtype), str(lse.dtype), str(den.dtype), str(dx.dtype),
                               list(dx.shape)]
        buf = arr(64 * 1000 + 1, dt=DT)
        xm = buf[1:].reshape(64, 1000)                    # 2 bytes off the 8-byte vector boundary
        recs.clear()
        loss, lse, den = B.softmax_cross_entropy_forward(None, xm, t, None, -100, 0.0, "none", widen=True)
        dx = B.softmax_cross_entropy_backward(None, xm, t, fakecp.asarray(np.ones(64, np.float32)), lse, den, None,
                                              -100, 0.0, "none", widen=True)
        out["misaligned"] = [names(), str(loss.dtype), str(dx.dtype)]
        x3 = arr(5, 7, 3, dt=DT)
        recs.clear()
        loss, lse, den = B.softmax_cross_entropy_forward(None, x3, fakecp.asarray(np.zeros((5, 3), np.int64)),
                                                         widen=True)
        out["nd"] = [names(), str(loss.dtype)]
    """, dtype)
    xs = "XSTORAGE=" + ("2" if dtype == "bfloat16" else "1")
    first, again = out["call0"], out["call1"]
    assert first[0] == [f"ce_rows_fwd STORAGE=0 {xs}", f"ce_rows_bwd STORAGE=0 {xs}"], first[0]
    assert first[1] == 2 and again[1] == 0 and again[0] == first[0]          # checked once, then the seen call
    assert first[2:] == ["float32", "float32", "float32", dtype, [64, 1000]]
    launches, loss_dt, dx_dt = out["misaligned"]
    assert [n for n in launches if not n.startswith("cupy:")] == ["ce_rows_fwd STORAGE=0", "ce_rows_bwd STORAGE=0"]
    assert sum(n.startswith("cupy:astype") for n in launches) == 3, launches    # x twice (forward, backward), dx
    assert (loss_dt, dx_dt) == ("float32", dtype)
    assert out["nd"] == [[f"ce_sp_fwd STORAGE=0 {xs}"], "float32"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fake_gpu_nn_cross_entropy_in_autocast(dtype):
    out = _run("""
        from minidnn.amp import autocast
        DTM = mdn.bfloat16 if DT.name == "bfloat16" else mdn.float16
        def case(name, make_x, target, region=True, enabled=True, **kw):
            x = make_x()
            recs.clear()
            if region:
                with autocast("cuda", dtype=DTM, enabled=enabled):
                    loss = F.cross_entropy(x, target, **kw)
            else:
                loss = F.cross_entropy(x, target, **kw)
            loss.sum().backward()
            out[name] = [names(), str(loss.dtype), str(x.grad.dtype)]
        t = mdn.Tensor._from_array(fakecp.asarray(np.arange(32) % 10))
        x16 = lambda: mdn.Tensor._from_array(arr(32, 10, dt=DT)).requires_grad_()
        case("plain", x16, t)
        case("weighted_none", x16, t, weight=mdn.Tensor._from_array(arr(10)), reduction="none",
             label_smoothing=0.1)
        case("weight64", x16, t, weight=mdn.Tensor._from_array(arr(10, dt=np.float64)))
        case("disabled", x16, t, enabled=False)
        case("no_region", x16, t, region=False)
        x32 = lambda: mdn.Tensor._from_array(arr(32, 10)).requires_grad_()
        case("float32_logits", x32, t)
    """, dtype)
    xs = "XSTORAGE=" + ("2" if dtype == "bfloat16" else "1")
    for name in ("plain", "weighted_none"):
        assert out[name] == [[f"ce_rows_fwd STORAGE=0 {xs}", f"ce_rows_bwd STORAGE=0 {xs}"], "float32", dtype], \
            (name, out[name])
    for name in ("weight64",):      # the casts, as before (PyTorch's dtypes all the same); probability targets: the
        # reference on the cast logits (the fake's asarray lacks dtype=: the cuda test has them)
        launches, loss_dt, grad_dt = out[name]
        assert any(n.startswith("cupy:astype") for n in launches) and not any(xs in n for n in launches), launches
        assert (loss_dt, grad_dt) == ("float32", dtype), (name, out[name])
    for name in ("disabled", "no_region"):             # the 16-bit kernels, a 16-bit loss
        launches, loss_dt, grad_dt = out[name]
        assert not any(n.startswith("cupy:astype") or xs in n for n in launches), launches
        assert (loss_dt, grad_dt) == (dtype, dtype)
    launches, loss_dt, grad_dt = out["float32_logits"]
    assert not any(xs in n for n in launches) and (loss_dt, grad_dt) == ("float32", "float32")
