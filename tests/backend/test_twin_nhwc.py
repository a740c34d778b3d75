"""The twin's channels-last shadow (-DTWIN_NHWC=1; docs/fusion.md "The twin's NHWC shadow"): batch norm's TWIN
forward (bn_fwd1 on an NCHW x in one round, bn_cluster's bn_fwdc) and act_kernels' TWIN add also store relu's
values in NHWC memory, for the convolution that would stage that ReLU output.

CPU: nvcc builds every TWIN_NHWC kernel (float32 / bfloat16 / float16) without spills, with one more array
parameter; the plain and TWIN kernels' PTX is that of the source without any TWIN_NHWC text (the option costs them
nothing); under the fake CuPy the shadow call is the twin call's launch with the option and one more array (the
one-pass and cluster routes, the add), returns an NHWC-memory array, and there is none (False) for channels-last x,
(N, C) rows, several rounds, the two-launch route, or an add whose H*W does not fill whole vectors; while the
stream captures a CUDA graph the calls launch nothing (None).
GPU (marked cuda): y, the statistics, the running statistics, the counter and the twin are the twin call's bits,
and the shadow is the twin's values in channels-last memory, bitwise (float32, bfloat16; C = 16, 32, 64; bn_fwd1,
bn_fwdc, the add)."""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from minidnn.backend import devices as _dev
from minidnn.backend.cuda import act_kernels as AK
from minidnn.backend.cuda import bn_cluster as BC
from minidnn.backend.cuda import bn_kernels as K
from tests._nvcc import pick

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_NVCC = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("ptxas") is None,
                           reason="nvcc is not installed")


def _dtype(name):
    return np.dtype(pytest.importorskip("ml_dtypes").bfloat16 if name == "bfloat16" else name)


# ---- CPU: nvcc ---------------------------------------------------------------------------------------------------

def _build(tmp_path, source, opts, name):
    """(PTX of the entry, whole PTX, registers, spill-store bytes) of ``source`` under ``opts``."""
    from minidnn.backend.cuda import launch
    d = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    launch.write_source(str(d / "k.cu"), source, [o[2:] for o in opts if o.startswith("-D")])
    std = next((o for o in opts if o.startswith("-std")), "-std=c++17")
    r = subprocess.run(["nvcc", "-arch=sm_90", std, "--ptx", "-o", str(d / "k.ptx"), str(d / "k.cu")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(["ptxas", "-arch=sm_90", "-v", f"--entry={name}", "-o", str(d / "k.cubin"), str(d / "k.ptx")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    text = (d / "k.ptx").read_text()
    regs = int(re.search(r"Used (\d+) registers", r.stderr).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", r.stderr).group(1))
    return text.split(f".entry {name}(")[1].split("\n}\n")[0], text, regs, spills


def _variants(dt):
    """(kernel, source, TWIN options, TWIN_NHWC options) of each shadow kernel."""
    vec = 16 // dt.itemsize
    out = []
    for cache in (True, False):
        fl = dict(has_scale=True, has_bias=True, cache=cache)
        out.append(("bn_fwd1", K.ONEPASS_SOURCE, K._onepass_options(dt, False, vec, 1, twin=True, **fl),
                    K._onepass_options(dt, False, vec, 1, twin=True, twin_nhwc=True, **fl)))
    for cl, bps in ((4, 2), (8, 2), (16, 1)):
        out.append(("bn_fwdc", BC.SOURCE, BC._options(dt, cl, False, False, True, True, bps, False, True),
                    BC._options(dt, cl, False, False, True, True, bps, False, True, twin_nhwc=True)))
    cfg = AK.config(dt)
    args = (dt, "ADD", cfg["unroll"], cfg["hint"], cfg.get("threads", AK.THREADS))
    for c, hw in ((16, 1024), (64, 64)):
        out.append(("act_bwd", AK.SHADOW_SOURCE, AK.options(*args, twin=True), AK.options(*args, twin=(c, hw))))
    return out


@_NVCC
@pytest.mark.parametrize("dtype", pick(["float32", "bfloat16", "float16"], 1, always=["bfloat16"]))
def test_the_shadow_kernels_compile_without_spills_with_one_more_array(tmp_path, dtype):
    """(Registers, session 16, sm_90: bn_fwd1 f32 70/69 -> 69/64 (cache/no cache), bf16 72/64 -> 76/80, f16 87/72 ->
    85/72; bn_fwdc CL4/CL8/CL16 f32 64/64/80 unchanged, bf16 58/58/89 -> 63/63/92, f16 64/64/82 -> 64/64/93; the
    add f32 47 -> 48, 16-bit 32 -> 40.)"""
    dt = _dtype(dtype)
    for name, source, twin, shadow in pick(_variants(dt), 3):      # a spread of them (tests/_nvcc.py)
        assert "-DTWIN_NHWC=1" in shadow and not any("TWIN_NHWC" in o for o in twin)
        t_body, _, t_regs, t_spill = _build(tmp_path, source, twin, name)
        s_body, _, s_regs, s_spill = _build(tmp_path, source, shadow, name)
        assert t_spill == 0 and s_spill == 0, (name, shadow)
        assert s_regs <= max(t_regs + 16, 64), (name, t_regs, s_regs)
        assert s_body.count(".param .u64") == t_body.count(".param .u64") + 1

        def scalars(body):
            return sum(ln.strip().startswith("st.global") and ".v" not in ln.split()[0] for ln in body.splitlines())
        assert scalars(s_body) > scalars(t_body), name       # the shadow's stride-C scalar stores


def _without_shadow(source):
    """The kernels' source before the shadow: no SHADOW_HEADER, no SHADOW_PARAM, the TWIN_NHWC branches gone."""
    s = source.replace(BC.SHADOW_HEADER, "").replace(" SHADOW_PARAM", "")
    s = re.sub(r"#if TWIN_NHWC\n.*?#elif TWIN\n", "#if TWIN\n", s, flags=re.S)
    s = s.replace("#if DX_NHWC || TWIN_NHWC", "#if DX_NHWC")
    assert "TWIN_NHWC" not in s and "shadow" not in s
    return s


@_NVCC
@pytest.mark.parametrize("dtype", pick(["float32", "bfloat16"], 1))
def test_the_plain_and_twin_kernels_ptx_is_that_of_the_source_without_the_shadow(tmp_path, dtype):
    dt = _dtype(dtype)
    vec = 16 // dt.itemsize
    fl = dict(has_scale=True, has_bias=True, cache=True)
    cases = [("bn_fwd1", K.ONEPASS_SOURCE, K._onepass_options(dt, False, vec, 1, **fl)),
             ("bn_fwd1", K.ONEPASS_SOURCE, K._onepass_options(dt, False, vec, 1, twin=True, **fl)),
             ("bn_fwdc", BC.SOURCE, BC._options(dt, 4, False, False, True, True, 2)),
             ("bn_fwdc", BC.SOURCE, BC._options(dt, 4, False, False, True, True, 2, False, True))]
    for name, source, opts in cases:
        assert _build(tmp_path, source, opts, name)[1] == _build(tmp_path, _without_shadow(source), opts, name)[1]
    # the add: SOURCE is untouched; SHADOW_SOURCE without the option compiles to SOURCE's PTX
    cfg = AK.config(dt)
    opts = AK.options(dt, "ADD", cfg["unroll"], cfg["hint"], cfg.get("threads", AK.THREADS), twin=True)
    assert _build(tmp_path, AK.SOURCE, opts, "act_bwd")[1] == _build(tmp_path, AK.SHADOW_SOURCE, opts, "act_bwd")[1]
    assert "TWIN_NHWC" not in AK.SOURCE


def test_the_index_map_is_written_once():
    """bn_fwd1 and bn_fwdc store the shadow through bn_cluster's dx_nhwc_of (the backward's channels-last dx map)."""
    for src in (K.ONEPASS_SOURCE, BC.SOURCE):
        assert src.count(BC.DX_NHWC_HEADER) == 1 and src.count("dx_nhwc_of(long long off") == 1
        assert src.count(BC.SHADOW_HEADER) == 1
        assert "#if DX_NHWC || TWIN_NHWC" in BC.DX_NHWC_HEADER


# ---- CPU: the calls under the fake CuPy ------------------------------------------------------------------------

_HEAD = f"""
import sys, types; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
R._zero_pointers(fakecp, L)
recs = R.record_packed(L, [])
from minidnn.backend.cuda import bn_kernels as K, act_kernels as AK, device_facts as DF
H100 = (233472, 232448)
def arrays(shape, cl=False):
    c = shape[1]
    x = fakecp.zeros(shape, np.float32)
    if cl:
        x = fakecp.zeros((shape[0], *shape[2:], c), np.float32).transpose(0, len(shape) - 1, *range(1, len(shape) - 1))
    p = [fakecp.zeros(c, np.float32) for _ in range(4)]
    return x, p, fakecp.zeros(1, np.int64)
def bn(shape, cl=False):
    x, (sc, bi, rm, rv), cnt = arrays(shape, cl)
    twin = K.twin_call(x, sc, bi, 0.1, rm, rv, 1e-5, cnt)
    call = K.twin_nhwc_call(x, sc, bi, 0.1, rm, rv, 1e-5, cnt)
    if not call:
        return call
    del recs[:]
    twin(x, None, sc, bi, rm, rv, cnt)
    out = call(x, None, sc, bi, rm, rv, cnt)
    if out is None:
        return None
    y, m, i, r, s = out
    n, c, h, w = shape
    assert s.shape == x.shape and s.strides == (h * w * c * 4, 4, w * c * 4, c * 4) and r.strides == x.strides
    a, b = recs
    assert "-DTWIN_NHWC=1" in b[0] and a[0] == b[0].replace(", '-DTWIN_NHWC=1'", ""), (a[0], b[0])
    assert a[1] == b[1] and b[2][:224] == "0" * 224 and b[2][224:] == a[2][208:]
    return b[0].split("(")[0]
def add(shape, cl=False):
    a = arrays(shape, cl)[0]
    plan = AK.add_twin_plan(a)
    sh = AK.add_twin_plan(a, shadow=True)
    if not sh:
        return sh
    del recs[:]
    plan(a, a)
    out = sh(a, a)
    if out is None:
        return None
    n, c, h, w = shape
    assert out[2].shape == a.shape and out[2].strides == (h * w * c * 4, 4, w * c * 4, c * 4)
    p, q = recs
    assert q[0] == p[0][:-1] + f", '-DTWIN_NHWC=1', '-DSH_C={{c}}', '-DSH_HW={{h * w}}')", (p[0], q[0])
    assert p[1] == q[1] and q[2] == "0" * 16 + p[2]
    return "act_bwd"
"""


def _fake(code):
    r = subprocess.run([sys.executable, "-c", _HEAD + code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_the_shadow_call_is_the_twin_launch_plus_one_array():
    _fake("""
assert bn((8, 16, 8, 8)) == "bn_fwd1"
assert bn((8, 24, 7, 7)) == "bn_fwd1"                      # a spatial tail
DF._smem[0] = H100
assert bn((16, 64, 16, 16)) == "bn_fwdc"                   # an H100's shared memory: the cluster route
assert bn((128, 32, 16, 16)) == "bn_fwdc"
del DF._smem[0]
assert add((8, 16, 8, 8)) == add((4, 64, 4, 2)) == "act_bwd"
print("OK")
""")


def test_no_shadow_off_the_nchw_one_round_routes():
    _fake("""
assert bn((8, 16, 8, 8), cl=True) is False                 # channels-last: bn_nhwc's kernels, nothing to stage
assert bn((128, 64, 112, 112)) is False                    # several rounds
K.ONEPASS = False
assert bn((8, 16, 8, 8)) is False                          # the two-launch route
K.ONEPASS = True
x = fakecp.zeros((64, 16), np.float32)
p = [fakecp.zeros(16, np.float32) for _ in range(4)]
assert K.twin_nhwc_call(x, *p[:2], 0.1, *p[2:], 1e-5) is False     # (N, C) rows
assert add((8, 16, 8, 8), cl=True) is False
assert add((8, 16, 5, 5)) is False                         # H*W not whole vectors
assert AK.add_twin_plan(fakecp.zeros((8, 16, 64), np.float32), shadow=True) is False
print("OK")
""")


def test_nothing_is_launched_while_the_stream_captures():
    _fake("""
fakecp.cuda.get_current_stream = lambda *a: types.SimpleNamespace(ptr=1)
fakecp.cuda.runtime.streamIsCapturing = lambda s: True
assert bn((8, 16, 8, 8)) is None and len(recs) == 1        # (the twin call's launch only)
assert add((8, 16, 8, 8)) is None and len(recs) == 1
print("OK")
""")


# ---- GPU --------------------------------------------------------------------------------------------------------

def _bits(cp, a):
    return cp.asnumpy(cp.ascontiguousarray(a)).view(np.uint8)


_SHAPES = [(16, 16, 32, 32), (16, 32, 16, 16), (16, 64, 8, 8), (8, 24, 7, 7)]


@pytest.mark.cuda
@pytest.mark.skipif(not _dev.cuda_is_available(), reason="no CUDA GPU with CuPy on this machine")
@pytest.mark.parametrize("shape", _SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("route", ["fwd1", "fwdc"])
def test_the_shadow_is_the_twin_in_channels_last_memory_and_the_rest_the_twin_calls_bits(route, dtype, shape,
                                                                                         monkeypatch):
    import cupy as cp
    dt = _dtype(dtype)
    if route == "fwdc" and not BC.usable(cp.cuda.Device().id):
        pytest.skip("no thread-block clusters on this GPU (compute capability < 9.0)")
    monkeypatch.setattr(BC, "ENABLED", route == "fwdc")
    K._calls.clear()
    c = shape[1]
    rng = np.random.default_rng(sum(shape))
    xh = rng.standard_normal(shape).astype(np.float32)
    xh[0, 2, 0, 0] = np.nan
    x = cp.asarray(xh.astype(dt))
    pd = K.param_dtype(dt)
    sc = cp.asarray(rng.uniform(-1.5, 1.5, c).astype(pd))
    bi = cp.asarray(rng.standard_normal(c).astype(pd))
    start = (rng.standard_normal(c).astype(pd), rng.uniform(0.5, 2, c).astype(pd))
    stats = [[cp.asarray(start[0]), cp.asarray(start[1]), cp.zeros(1, np.int64)] for _ in range(2)]
    twin = K.twin_call(x, sc, bi, 0.1, *stats[0][:2], 1e-5, stats[0][2])
    call = K.twin_nhwc_call(x, sc, bi, 0.1, *stats[1][:2], 1e-5, stats[1][2])
    assert call, "the twin's launch of this shape has a shadow variant"
    on_cluster = id(call.launch1.kernel) in {id(k) for key, k in BC._kernels.items() if key[0] == "bn_fwdc"}
    if route == "fwdc" and not on_cluster:
        pytest.skip("the cluster kernels do not take this shape (a spatial tail)")
    assert on_cluster == (route == "fwdc")
    a = twin(x, None, sc, bi, *stats[0])
    b = call(x, None, sc, bi, *stats[1])
    assert b is not None and len(b) == 5
    for p, q in zip([*a, *stats[0]], [*b[:4], *stats[1]]):
        assert np.array_equal(_bits(cp, p), _bits(cp, q))
    s = b[4]
    n, _, h, w = shape
    assert s.strides == (h * w * c * dt.itemsize, dt.itemsize, w * c * dt.itemsize, c * dt.itemsize)
    assert np.array_equal(_bits(cp, s.transpose(0, 2, 3, 1)), _bits(cp, b[3].transpose(0, 2, 3, 1)))


@pytest.mark.cuda
@pytest.mark.skipif(not _dev.cuda_is_available(), reason="no CUDA GPU with CuPy on this machine")
@pytest.mark.parametrize("shape", _SHAPES[:3] + [(3, 16, 4, 2)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("aligned", [True, False], ids=["vec", "scalar"])
def test_the_add_shadow_is_the_twin_in_channels_last_memory(dtype, shape, aligned):
    import cupy as cp
    dt = _dtype(dtype)
    rng = np.random.default_rng(sum(shape) + 1)
    size = int(np.prod(shape))
    bufs = [cp.asarray(rng.standard_normal(size + 1).astype(np.float32).astype(dt)) for _ in range(2)]
    a, b = ((u if aligned else u[1:])[:size].reshape(shape) for u in bufs)     # (misaligned: the scalar loop)
    plain = AK.add_twin_plan(a)(a, b)
    out = AK.add_twin_plan(a, shadow=True)(a, b)
    assert np.array_equal(_bits(cp, plain[0]), _bits(cp, out[0]))
    assert np.array_equal(_bits(cp, plain[1]), _bits(cp, out[1]))
    n, c, h, w = shape
    assert out[2].strides == (h * w * c * dt.itemsize, dt.itemsize, w * c * dt.itemsize, c * dt.itemsize)
    assert np.array_equal(_bits(cp, out[2].transpose(0, 2, 3, 1)), _bits(cp, out[1].transpose(0, 2, 3, 1)))
