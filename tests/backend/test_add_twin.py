"""The add kernel's TWIN option (act_kernels' act_bwd in MODE ADD; act_kernels.add_twin_plan, tensor_ops.
settled_add_relu): one launch that writes a + b and relu(a + b), for nn's speculative residual add + ReLU
(docs/fusion.md, "The residual add writes relu(a) too").

CPU: nvcc builds the TWIN add in every data type without spills, with one more array parameter and the twin's
stores; TWIN with any other mode is refused.  Under the fake CuPy the twin plan's launch is the plain add's launch
plus one array (the same kernel options but -DTWIN=1, grid, block and scalars) on the vector and the misaligned
(scalar) paths, C-contiguous and channels-last, its two outputs fresh arrays laid out as a; settled_add_relu is None
wherever add_arrays would not take the ADD kernel.
GPU (marked cuda): the sum is bitwise add_arrays' (and CuPy's ``a + b``), the twin bitwise the ReLU kernel's output
from that sum (activation_forward) -- NaN, inf - inf and -0.0 included -- for float32, float16, bfloat16 and float64,
C-contiguous, channels-last, misaligned and odd-sized arrays, in one launch."""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from minidnn.backend import devices as _dev
from minidnn.backend.cuda import act_kernels as AK
from minidnn.backend.cuda.bn_nhwc import TWIN_HEADER

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DTYPES = ["float32", "float16", "bfloat16", "float64"]


def _dtype(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


# ---- CPU: nvcc ---------------------------------------------------------------------------------------------------

def _nvcc(tmp_path, opts, ptx=False, source=AK.SOURCE):
    from minidnn.backend.cuda import launch
    src = tmp_path / "add.cu"
    launch.write_source(str(src), source, [o[2:] for o in opts if o.startswith("-D")])
    out = tmp_path / ("k.ptx" if ptx else "k.cubin")
    cmd = ["nvcc", "-arch=sm_90", "-std=c++14", "--ptx" if ptx else "-cubin", "-o", str(out), str(src)]
    if not ptx:
        cmd[3:3] = ["-Xptxas", "-v"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600), out


def _entry(ptx, name):
    return ptx.split(f".entry {name}(")[1].split("\n}\n")[0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtname", _DTYPES)
def test_the_twin_add_compiles_without_spills_and_stores_the_twin(tmp_path, dtname):
    dt = _dtype(dtname)
    cfg = AK.config(dt)
    args = (dt, "ADD", cfg["unroll"], cfg["hint"], cfg.get("threads", AK.THREADS))
    plain, twin = AK.options(*args), AK.options(*args, twin=True)
    assert "-DTWIN=1" in twin and not any("TWIN" in o for o in plain)      # absent without the option
    r, _ = _nvcc(tmp_path, twin)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "warning" not in out, out[-2000:]
    spills = [line for line in out.splitlines() if "spill stores" in line]
    assert len(spills) == 2 and all(" 0 bytes spill stores" in line for line in spills), out
    bodies, texts = [], []
    for opts in (plain, twin):
        r, path = _nvcc(tmp_path, opts, ptx=True)
        assert r.returncode == 0, r.stderr
        texts.append(path.read_text())
        bodies.append(_entry(texts[-1], "act_bwd"))
    assert [b.count(".param .u64") for b in bodies] == [4, 5]     # x, dy, dx, n (+ twin)
    assert "act_bwd_param_3]" in bodies[1] and "st.global" in bodies[1]
    # without TWIN the kernels are the source without any of the twin's lines: the same PTX
    bare = re.sub(r"#if TWIN\b.*?#endif\n", "", AK.SOURCE.replace(TWIN_HEADER, "#define TWIN_PARAM\n"), flags=re.S)
    assert "twin" not in bare.lower().replace("twin_param", "")
    r, path = _nvcc(tmp_path, plain, ptx=True, source=bare)
    assert r.returncode == 0, r.stderr
    assert path.read_text() == texts[0]         # the real source's plain PTX, built above


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_twin_with_another_mode_is_refused(tmp_path):
    r, _ = _nvcc(tmp_path, AK.options(np.dtype(np.float32), "RELU", 2, 0, 128, twin=True), ptx=True)
    assert r.returncode != 0 and "only the add" in r.stderr


# ---- CPU: the twin plan under the fake CuPy ----------------------------------------------------------------------

def _fake(code):
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
R._zero_pointers(fakecp, L)
recs = R.record_packed(L, [])
from minidnn.backend.cuda import act_kernels as AK
from minidnn.backend.cuda.bn_nhwc import TWIN_HEADER
from minidnn.backend import tensor_ops as T
def arrays(shape, cl=False, skew=False, dt=np.float32):
    out = []
    for _ in range(2):
        if cl:
            a = fakecp.zeros((shape[0], *shape[2:], shape[1]), dt).transpose(0, 3, 1, 2)
        elif skew:      # one element past an aligned start: the misaligned (scalar) path
            a = fakecp.zeros(int(np.prod(shape)) + 1, dt)[1:].reshape(shape)
        else:
            a = fakecp.zeros(shape, dt)
        out.append(a)
    return out
def both(a, b):
    plan = T.settled_add_relu(a, b)
    assert plan is AK.add_twin_plan(a)                  # settled once per signature
    del recs[:]
    s = T.add_arrays(a, b)
    out = plan(a, b)
    assert len(recs) == 2
    s2, r = out
    for o in (s2, r):
        assert o.shape == s.shape == a.shape and o.strides == s.strides == a.strides and o.dtype == a.dtype
    assert r.data.ptr != s2.data.ptr
    p, t = recs
    assert "'-DTWIN=1'" in t[0] and p[0] == t[0].replace(", '-DTWIN=1'", ""), (p[0], t[0])
    assert p[1] == t[1] and t[2][:64] == "0" * 64 and t[2][64:] == p[2][48:]
    return t[2][-8:]        # (the vec flag)
"""
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    return r.stdout


def test_the_twin_plan_is_the_plain_add_launch_plus_one_array():
    _fake("""
assert both(*arrays((4, 16, 6, 6))) == "01000000"                   # the vector path
assert both(*arrays((4, 16, 6, 6), cl=True)) == "01000000"          # channels-last memory of an NCHW view
assert both(*arrays((3, 5, 7, 9), skew=True)) == "00000000"         # misaligned: the scalar path
import ml_dtypes
assert both(*arrays((3, 5, 7, 9), dt=ml_dtypes.bfloat16)) == "01000000"
print("OK")
""")


def test_no_twin_plan_where_add_arrays_would_not_take_the_add_kernel():
    _fake("""
a, _ = arrays((4, 16, 6, 6))
c, _ = arrays((4, 16, 6, 6), cl=True)
assert T.settled_add_relu(a, c) is None                          # another memory order
assert T.settled_add_relu(a, a.astype(np.float64)) is None       # another dtype
assert T.settled_add_relu(a, a[:, :8]) is None                   # another shape
assert T.settled_add_relu(np.zeros(4, np.float32), np.zeros(4, np.float32)) is None      # NumPy
print("OK")
""")


# ---- GPU --------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


def _arrays(cp, shape, dt, layout, seed):
    rng = np.random.default_rng(seed)
    host = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = host.reshape(-1)
    flat[:4] = [np.nan, np.inf, -0.0, 0.0] if seed == 1 else [1.0, -np.inf, -0.0, -0.0]    # NaN, inf - inf, -0 + -0
    host = host.astype(dt)
    if layout == "nchw":
        return cp.asarray(host)
    if layout == "nhwc":
        return cp.ascontiguousarray(cp.asarray(host).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    flat = cp.empty(host.size + 1, dt)       # misaligned: one element past an aligned start
    flat[1:] = cp.asarray(host.reshape(-1))
    return flat[1:].reshape(shape)


def _bits(cp, a):
    return cp.asnumpy(cp.ascontiguousarray(a)).view(np.uint8)


@pytest.mark.cuda
@pytest.mark.parametrize("dtname", _DTYPES)
@pytest.mark.parametrize("shape, layout", [((32, 16, 16, 16), "nchw"), ((32, 16, 16, 16), "nhwc"),
                                           ((3, 5, 7, 9), "nchw"), ((3, 5, 7, 9), "nhwc"),
                                           ((2, 3, 5, 7), "misaligned")])
def test_the_twin_is_the_relu_kernels_output_and_the_sum_add_arrays_bits(cp, dtname, shape, layout):
    import minidnn.backend as B
    from minidnn.backend.cuda import launch as L
    from minidnn.backend.tensor_ops import add_arrays, settled_add_relu
    dt = _dtype(dtname)
    a, b = _arrays(cp, shape, dt, layout, 1), _arrays(cp, shape, dt, layout, 2)
    plan = settled_add_relu(a, b)
    assert plan, "arrays of one signature take the twin"
    plain = add_arrays(a, b)
    n0 = L.launch_count()
    s, r = plan(a, b)
    assert L.launch_count() - n0 == 1
    assert s.shape == r.shape == a.shape and s.strides == r.strides == plain.strides and s.dtype == r.dtype == dt
    assert np.array_equal(_bits(cp, s), _bits(cp, plain))
    assert np.array_equal(_bits(cp, s), _bits(cp, a + b))
    relu = B.activation_forward(None, B.ActivationDescriptor(B.ActivationMode.RELU), s)
    assert r.strides == relu.strides and np.array_equal(_bits(cp, r), _bits(cp, relu))
    sh = cp.asnumpy(cp.ascontiguousarray(s)).astype(np.float64).reshape(-1)
    rh = cp.asnumpy(cp.ascontiguousarray(r)).astype(np.float64).reshape(-1)
    # (the cases are there: NaN passes, inf - inf is NaN, -0 + -0 = -0 whose ReLU is +0)
    assert np.isnan(rh).sum() >= 2 and np.array_equal(np.isnan(sh), np.isnan(rh))
    z = (sh == 0) & np.signbit(sh)
    assert z.any() and not np.signbit(rh[z]).any()
