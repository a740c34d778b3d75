"""The batch-norm forward's TWIN option (bn_nhwc.TWIN_HEADER; bn_kernels.twin_call): the training forward that also
stores relu(y), for nn's speculation (docs/fusion.md, "Batch norm's forward writes relu(y) too").

CPU: nvcc builds every TWIN kernel (bn_fwd1, bn_cluster's bn_fwdc, bn_nhwc's bnc_fwd1) in every data type without
spills, with one more array parameter and the twin's stores, and refuses TWIN with a fused ReLU; under the fake CuPy
the twin call is the plain call's launch plus one array, on each route, and is refused (False) on the two-launch
route and wherever the TWIN kernel's launch would differ from the plain one's (so the statistics could differ).
GPU (marked cuda): the twin call's y, mean, inv_std, running statistics and counter are the plain call's bits, and
its twin is bitwise the ReLU kernel's output from y (activation_forward) -- NaN and -0.0 included -- for float32,
float16, bfloat16 and float64 on the cluster, one-pass, channels-last and (N, C) routes."""
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
from tests._nvcc import pick

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100_SMEM = (233472, 232448)


def _bf16():
    return pytest.importorskip("ml_dtypes").bfloat16


_DTYPES = [np.float32, np.float16, "bfloat16", np.float64]


# ---- CPU: nvcc ---------------------------------------------------------------------------------------------------

def _forms(dtype):
    """(kernel, source, options with and without TWIN, spill bytes allowed) of each TWIN kernel."""
    dt = np.dtype(dtype)
    vec = 16 // dt.itemsize
    fwd1 = dict(has_scale=True, has_bias=True, cache=True)
    return [("bn_fwd1", K.ONEPASS_SOURCE, K._onepass_options(dt, False, vec, 1, twin=True, **fwd1),
             K._onepass_options(dt, False, vec, 1, **fwd1), 0),
            ("bn_fwd1", K.ONEPASS_SOURCE, K._onepass_options(dt, True, vec, 4, twin=True, **fwd1),
             K._onepass_options(dt, True, vec, 4, **fwd1), 0),
            # (bn_cluster's forward at two blocks of 512 threads may spill 16 bytes outside its loops, as without)
            ("bn_fwdc", BC.SOURCE, BC._options(dt, 8, False, False, True, True, 2, False, True),
             BC._options(dt, 8, False, False, True, True, 2, False), 16),
            ("bn_fwdc", BC.SOURCE, BC._options(dt, 16, False, False, True, False, 1, False, True),
             BC._options(dt, 16, False, False, True, False, 1, False), 0),
            ("bnc_fwd1", M.SOURCE, M._options(dt, vec, twin=True, **fwd1), M._options(dt, vec, **fwd1), 0)]


def _nvcc(tmp_path, name, source, opts, ptx=False):
    from minidnn.backend.cuda import launch
    src = tmp_path / f"{name}.cu"
    launch.write_source(str(src), source, [o[2:] for o in opts if o.startswith("-D")])
    out = tmp_path / ("k.ptx" if ptx else "k.cubin")
    cmd = ["nvcc", "-arch=sm_90", "-std=c++17", "--ptx" if ptx else "-cubin", "-o", str(out), str(src)]
    if not ptx:
        cmd[3:3] = ["-Xptxas", f"-v,--entry={name}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600), out


def _entry(ptx, name):
    return ptx.split(f".entry {name}(")[1].split("\n}\n")[0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtype", pick(_DTYPES, 1, always=["bfloat16"]), ids=str)
def test_the_twin_kernels_compile_without_spills_and_store_the_twin(tmp_path, dtype):
    if dtype == "bfloat16":
        dtype = _bf16()
    for name, source, twin, plain, allowed in pick(_forms(dtype), 3):     # a spread of them (tests/_nvcc.py)
        assert "-DTWIN=1" in twin and not any("TWIN" in o for o in plain)     # absent without the option
        r, _ = _nvcc(tmp_path, name, source, twin)
        assert r.returncode == 0, r.stderr
        lines = r.stderr.splitlines()
        at = next(i for i, line in enumerate(lines) if f"entry function '{name}'" in line)
        spill = next(line for line in lines[at:] if "spill stores" in line)
        assert int(spill.split("bytes spill stores")[0].split(",")[-1]) <= allowed, spill
        counts = []
        for opts in (plain, twin):
            r, out = _nvcc(tmp_path, name, source, opts, ptx=True)
            assert r.returncode == 0, r.stderr
            body = _entry(out.read_text(), name)
            counts.append((body.count(".param .u64"),
                           sum(ln.strip().startswith("st.global") for ln in body.splitlines())))
        (p_ptrs, p_st), (t_ptrs, t_st) = counts
        assert t_ptrs == p_ptrs + 1 and t_st > p_st, (name, counts)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_twin_with_a_fused_relu_is_refused(tmp_path):
    opts = K._onepass_options(np.dtype(np.float32), False, 4, 1, relu=True, twin=True, cache=True)
    r, _ = _nvcc(tmp_path, "bn_fwd1", K.ONEPASS_SOURCE, opts, ptx=True)
    assert r.returncode != 0 and "no fused ReLU" in r.stderr


# ---- CPU: the twin call under the fake CuPy ------------------------------------------------------------------------

def _fake(code):
    head = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tools')!r})
import numpy as np, record_launches as R
fakecp, L = R._install({ROOT!r})
R._zero_pointers(fakecp, L)
recs = R.record_packed(L, [])
from minidnn.backend.cuda import bn_nhwc as M, bn_kernels as K, bn_cluster as BC, device_facts as DF
def arrays(shape, cl=False):
    c = shape[1]
    x = fakecp.zeros(shape, np.float32)
    if cl:
        perm = (0, *range(2, len(shape)), 1)
        back = (0, len(shape) - 1, *range(1, len(shape) - 1))
        x = fakecp.zeros(tuple(shape[i] for i in perm), np.float32).transpose(back)
    p = [fakecp.zeros(c, np.float32) for _ in range(4)]
    return x, p, fakecp.zeros(1, np.int64)
def both(shape, cl=False):
    x, (sc, bi, rm, rv), cnt = arrays(shape, cl)
    plain = K.training_call(x, sc, bi, 0.1, rm, rv, 1e-5, None, False, cnt)
    twin = K.twin_call(x, sc, bi, 0.1, rm, rv, 1e-5, cnt)
    if not twin:
        return twin
    del recs[:]
    y, m, i = plain(x, None, sc, bi, rm, rv, cnt)
    n = len(recs)
    out = twin(x, None, sc, bi, rm, rv, cnt)
    if out is None:
        assert len(recs) == n                       # declined: nothing launched
        return None
    y2, m2, i2, r = out
    assert r.shape == y2.shape == y.shape and r.strides == y2.strides == y.strides and r.dtype == y.dtype
    assert r.data.ptr != y2.data.ptr
    a, b = recs
    assert "-DTWIN=1" in b[0] and a[0] == b[0].replace(", '-DTWIN=1'", ""), (a[0], b[0])
    assert a[1] == b[1] and b[2][:208] == "0" * 208 and b[2][208:] == a[2][192:]
    return b[0].split("(")[0]
"""
    r = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    return r.stdout


def test_the_twin_call_is_the_plain_launch_plus_one_array_on_each_route():
    _fake("""
assert both((4, 16, 6, 6)) == "bn_fwd1"
assert both((8, 16)) == "bnc_fwd1"                         # (N, C) rows
assert both((4, 16, 6, 6), cl=True) == "bnc_fwd1"          # channels-last
DF._smem[0] = (233472, 232448)
assert both((16, 64, 16, 16)) == "bn_fwdc"                 # an H100's shared memory: the cluster route
print("OK")
""")


def test_no_twin_where_the_launch_would_differ():
    _fake("""
K.ONEPASS = False; M.ROUTE = "two"
assert both((4, 16, 6, 6)) is False                        # the two-launch routes: none
assert both((4, 16, 6, 6), cl=True) is None                # (bn_nhwc: declined per alignment, nothing launched)
K.ONEPASS = True; M.ROUTE = "one"
# a TWIN kernel the driver would keep fewer of a SM: another grid, other partial sums -- refused
real = K._resident_per_sm
K._resident_per_sm = lambda k, dyn=0: 1 if "TWIN" in str(k.kernel.ptr) else real(k, dyn)
assert both((128, 64, 16, 16)) is False
K._resident_per_sm = real
K._calls.clear(); K._plans.clear()
assert both((128, 64, 16, 16)) == "bn_fwd1"
print("OK")
""")


# ---- GPU --------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


def _bits(cp, a):
    return cp.asnumpy(cp.ascontiguousarray(a)).view(np.uint8)


_ROUTES = {"fwdc": ((32, 16, 16, 16), False), "fwd1": ((32, 16, 16, 16), False), "fwd1_ragged": ((6, 5, 7, 9), False),
           "cl": ((16, 24, 10, 10), True), "rows": ((300, 40), False)}


@pytest.mark.cuda
@pytest.mark.parametrize("route", list(_ROUTES))
@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_the_twin_is_the_relu_kernels_output_and_the_rest_the_plain_calls_bits(cp, dtype, route, monkeypatch):
    import minidnn.backend as B
    from minidnn.backend.cuda import launch as L
    bias = route in ("fwd1", "cl")          # (the others without: y = -0.0 in the constant channel)
    if dtype == "bfloat16":
        dtype = _bf16()
    dtype = np.dtype(dtype)
    if route == "fwd1" or (route == "fwdc" and BC._cc(cp.cuda.Device().id) < 90):
        monkeypatch.setattr(BC, "ENABLED", False)
    shape, cl = _ROUTES[route]
    c = shape[1]
    rng = np.random.default_rng(len(route) + dtype.itemsize)
    xh = rng.standard_normal(shape).astype(np.float32)
    xh[:, 1] = 0.75                 # a constant channel: y = 0 * (negative scale) = -0.0 without a bias
    xh[(0, 2) + (0,) * (len(shape) - 2)] = np.nan      # a NaN channel: relu keeps NaN
    x = cp.asarray(xh.astype(dtype))
    if cl:
        x = cp.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    pd = K.param_dtype(dtype)
    sc = cp.asarray(rng.uniform(-1.5, 1.5, c).astype(pd))
    sc[1] = -1.0
    bi = cp.asarray(rng.standard_normal(c).astype(pd)) if bias else None
    start = (rng.standard_normal(c).astype(pd), rng.uniform(0.5, 2, c).astype(pd))    # both calls from the same
    stats = [[cp.asarray(start[0]), cp.asarray(start[1]), cp.zeros(1, np.int64)] for _ in range(2)]   # statistics
    plain = K.training_call(x, sc, bi, 0.1, *stats[0][:2], 1e-5, None, False, stats[0][2])
    twin = K.twin_call(x, sc, bi, 0.1, *stats[1][:2], 1e-5, stats[1][2])
    assert twin, "every aligned route of these shapes has a twin"
    y, m, i = plain(x, None, sc, bi, *stats[0])
    n0 = L.launch_count()
    out = twin(x, None, sc, bi, *stats[1])
    assert out is not None, "the twin call declined"
    y2, m2, i2, r = out
    assert L.launch_count() - n0 == 1
    for a, b in zip([y, m, i, *stats[0]], [y2, m2, i2, *stats[1]]):
        assert np.array_equal(_bits(cp, a), _bits(cp, b))
    relu = B.activation_forward(None, B.ActivationDescriptor(B.ActivationMode.RELU), y)
    assert r.shape == relu.shape and r.strides == relu.strides == y.strides and r.dtype == relu.dtype
    assert np.array_equal(_bits(cp, r), _bits(cp, relu))
    rh = cp.asnumpy(r).astype(np.float64)
    assert np.isnan(rh[:, 2]).all() and not np.signbit(rh[:, 1]).any()
    if not bias:
        assert np.signbit(cp.asnumpy(y).astype(np.float64)[:, 1]).all()     # (the -0.0 case is exercised)
