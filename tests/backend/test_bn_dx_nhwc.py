"""Batch norm's dx written in channels-last memory for an NCHW x (docs/fusion.md, "Batch norm's dx in channels-last
memory"): the backward primitives take a ``dx`` laid out in any memory order (cuDNN's dxDesc), and on the GPU the
one-pass kernel bn_bwd1 built with DX_NHWC writes it there itself (bn_kernels.dx_nhwc_call).

CPU: the reference writes the same bits into a channels-last dx as into an NCHW one, in all three backward forms
(plain, BN + ReLU, BN + add + ReLU), float32 and float64; a dx of the wrong shape or dtype is refused before any work.
nvcc: every DX_NHWC variant of bn_bwd1 compiles without spills, its scalar stores replace the vector store of dx,
and the plain kernel's PTX does not change (the option is absent unless asked for).  Fake CuPy: the DX_NHWC call is
the plain call's launch with the option (same grid, shared memory and scalars) and returns dx with channels-last
strides; there is none (False) on the cluster kernels, over several rounds, on the two-launch route, for
channels-last x or (N, C) rows.  GPU (marked cuda): the DX_NHWC kernel's dx is bitwise the plain kernel's, all forms,
float32 / bfloat16, C = 16, 32, 64 and 24 with a spatial tail (H*W not a multiple of the vector), through the
primitives' ``dx`` too.

The cluster kernel bn_bwdc (bn_cluster.py, an H100/H200's route for ResNet-20's 32- and 64-channel backwards in
float32 and every bfloat16 one) has the same option: nvcc compiles it for float32 / bfloat16 / float16 and every
form without spills, registers within a few of the plain kernel, dx's vector stores become scalar stores, and the
plain kernels' PTX is byte-identical to that of the source without any DX_NHWC text; under the fake CuPy with an
H100's shared memory the cluster route's DX_NHWC call is the plain bn_bwdc launch with the option (none with
bn_cluster.DX_NHWC off); on the GPU its dx is bitwise the plain cluster kernel's (C = 32, 64; every form)."""
import functools
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import bn_cluster as BC
from minidnn.backend.cuda import bn_kernels as K
from minidnn.backend.cuda import launch
from tests._nvcc import pick

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPATIAL = B.BatchNormMode.SPATIAL
FORMS = {"plain": None, "relu": B.BatchNormOps.BN_ACTIVATION, "add_relu": B.BatchNormOps.BN_ADD_ACTIVATION}


def _cl_empty(xp, shape, dtype):
    """An uninitialised (N, C, H, W) array in channels-last memory."""
    n, c, h, w = shape
    return xp.empty((n, h, w, c), dtype=dtype).transpose(0, 3, 1, 2)


def _case(xp, dtype, shape, seed=0):
    """x, dy, the fused forms' mask input a (random: half of it <= 0), scale, saved mean and inv_std."""
    rng = np.random.default_rng(seed)
    x, dy, a = (xp.asarray(rng.standard_normal(shape).astype(dtype)) for _ in range(3))
    c = shape[1]
    pdt = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    scale = xp.asarray(rng.uniform(0.5, 1.5, c).astype(pdt))
    bias = xp.asarray(rng.standard_normal(c).astype(pdt))
    _, mean, inv = B.batch_normalization_forward_training(None, SPATIAL, x, scale, bias, 0.1, None, None, 1e-5)
    return x, dy, a, scale, mean, inv


def _backward(form, x, dy, a, scale, mean, inv, dx=None):
    """(dx, dz or None, dscale, dbias) of ``form``, dx into ``dx`` when given."""
    if form == "plain":
        out = B.batch_normalization_backward(None, SPATIAL, x, dy, scale, mean, inv, 1e-5, dx=dx)
        return out[0], None, out[1], out[2]
    return B.batch_normalization_backward_ex(None, SPATIAL, FORMS[form], x, a, dy, scale, mean, inv, 1e-5, dx=dx)


# ---- CPU: the reference --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=str)
def test_the_reference_writes_the_same_bits_into_a_channels_last_dx(form, dtype):
    x, dy, a, scale, mean, inv = _case(np, dtype, (3, 8, 5, 4))
    ref = _backward(form, x, dy, a, scale, mean, inv)
    assert ref[0].flags.c_contiguous
    dest = _cl_empty(np, x.shape, dtype)
    dest[...] = np.nan                  # (beta 0: never read)
    got = _backward(form, x, dy, a, scale, mean, inv, dest)
    assert got[0] is dest and dest.transpose(0, 2, 3, 1).flags.c_contiguous and not dest.flags.c_contiguous
    assert np.array_equal(np.ascontiguousarray(dest).view(np.uint8), np.ascontiguousarray(ref[0]).view(np.uint8))
    for g, r in zip(got[1:], ref[1:]):
        assert (g is None and r is None) or np.array_equal(g, r)


def test_a_dx_of_the_wrong_shape_or_dtype_is_refused():
    x, dy, a, scale, mean, inv = _case(np, np.float32, (2, 4, 3, 3))
    for bad in (np.empty((2, 4, 3, 2), np.float32), np.empty((2, 4, 3, 3), np.float64)):
        for form in FORMS:
            with pytest.raises(B.BadParamError, match="dx"):
                _backward(form, x, dy, a, scale, mean, inv, bad)


@pytest.mark.parametrize("shape, vec", [((3, 16, 32, 32), 4), ((2, 64, 8, 8), 8), ((5, 24, 7, 7), 1),
                                        ((128, 64, 8, 8), 2), ((1, 3, 1, 5), 1)])
def test_dx_nhwc_of_maps_every_vector_to_its_channels_last_offset(shape, vec):
    """The kernel's dx_nhwc_of emulated in 32-bit unsigned arithmetic (fast_div by bn_kernels' divider of iv): the
    NCHW offset of each vector bn_bwd1 visits -> the channels-last offset of its first value."""
    n, c, h, w = shape
    inner = h * w
    iv = inner // vec
    mul, shr = (int(v) for v in K._make_divider(iv))
    m32 = 0xFFFFFFFF
    nn, cc, kk = np.meshgrid(np.arange(n), np.arange(c), np.arange(iv), indexing="ij")
    off = ((nn * c + cc) * inner + kk * vec).astype(np.int64).ravel()
    q = (off // vec) & m32
    r = ((((q * mul) >> 32) + q) & m32) >> shr
    hw = ((q - r * iv) & m32) * vec
    d = (r - cc.ravel()) * inner + hw * c + cc.ravel()
    assert np.array_equal(d, ((nn * inner + kk * vec) * c + cc).ravel())


# ---- CPU: nvcc ---------------------------------------------------------------------------------------------------

def _nvcc(tmp_path, opts, ptx):
    src = tmp_path / "bn_bwd1.cu"
    launch.write_source(str(src), K.ONEPASS_SOURCE, [o[2:] for o in opts if o.startswith("-D")])
    out = tmp_path / ("k.ptx" if ptx else "k.cubin")
    cmd = ["nvcc", "-arch=sm_90", "-std=c++17", "--ptx" if ptx else "-cubin", "-o", str(out), str(src)]
    if not ptx:
        cmd[3:3] = ["-Xptxas", "-v,--entry=bn_bwd1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r, out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"], ids=str)
@pytest.mark.parametrize("form", pick(list(FORMS), 2))
def test_the_dx_nhwc_kernels_compile_without_spills_and_store_scalars(tmp_path, dtype, form):
    dt = np.dtype(pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else dtype)
    flags = dict(relu=form != "plain", has_z=form == "add_relu", has_scale=True, cache=True)
    for vec in (16 // dt.itemsize, 1):
        plain = K._onepass_options(dt, False, vec, 1, **flags)
        nhwc = K._onepass_options(dt, False, vec, 1, dx_nhwc=True, **flags)
        assert "-DDX_NHWC=1" in nhwc and not any("DX_NHWC" in o for o in plain)
        r, _ = _nvcc(tmp_path, nhwc, False)
        spill = next(ln for ln in r.stderr.splitlines() if "spill stores" in ln)
        assert int(spill.split("bytes spill stores")[0].split(",")[-1]) == 0, spill
        bodies = []
        for opts in (plain, nhwc):
            _, out = _nvcc(tmp_path, opts, True)
            body = out.read_text().split(".entry bn_bwd1(")[1].split("\n}\n")[0]
            bodies.append([ln.strip().split()[0] for ln in body.splitlines() if ln.strip().startswith("st.global")])
        (p_v4, p_scalar), (n_v4, n_scalar) = ((sum(".v4" in s for s in b), sum(".v4" not in s for s in b))
                                              for b in bodies)
        if vec > 1:     # dx's vector stores became VEC scalar stores each; dz (HAS_Z) keeps its vector stores
            assert p_v4 and n_v4 == (p_v4 // 2 if flags["has_z"] else 0), (p_v4, n_v4)
            assert n_scalar - p_scalar >= vec * (p_v4 - n_v4), (p_scalar, n_scalar)
        else:
            assert n_scalar >= p_scalar


_BWDC = re.compile(r"#if DX_NHWC\n.*?#else\n(.*?)#endif\n", re.S)


@functools.lru_cache(maxsize=None)
def _cluster_build(source, opts):
    """(bn_bwdc's PTX body, the whole PTX, registers, spill-store bytes) of bn_cluster ``source`` under ``opts``:
    nvcc --ptx, then ptxas on that PTX (cached: several tests compile the same configuration)."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "bn_cluster.cu")
        launch.write_source(src, source, [o[2:] for o in opts if o.startswith("-D")])
        ptx = os.path.join(d, "k.ptx")
        r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "--ptx", "-o", ptx, src], capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["ptxas", "-arch=sm_90", "-v", "--entry=bn_bwdc", "-o", os.path.join(d, "k.cubin"), ptx],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        with open(ptx) as f:
            text = f.read()
    regs = int(re.search(r"Used (\d+) registers", r.stderr).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", r.stderr).group(1))
    return text.split(".entry bn_bwdc(")[1].split("\n}\n")[0], text, regs, spills


def _cluster_opts(dt, form, dx_nhwc=False):
    return BC._options(dt, 4, form != "plain", form == "add_relu", True, False, 2, True, dx_nhwc=dx_nhwc)


def _dtype(name):
    return np.dtype(pytest.importorskip("ml_dtypes").bfloat16 if name == "bfloat16" else name)


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("ptxas") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtype", pick(["float32", "bfloat16", "float16"], 2))
@pytest.mark.parametrize("form", pick(list(FORMS), 2))
def test_the_cluster_dx_nhwc_kernels_compile_without_spills_and_store_scalars(dtype, form):
    """(CL 4, two blocks an SM: the 64-register budget where the backward is tightest.)"""
    dt = _dtype(dtype)
    plain, nhwc = _cluster_opts(dt, form), _cluster_opts(dt, form, True)
    assert "-DDX_NHWC=1" in nhwc and not any("DX_NHWC" in o for o in plain)
    assert tuple(o for o in nhwc if o != "-DDX_NHWC=1") == plain
    p_body, _, p_regs, p_spill = _cluster_build(BC.SOURCE, plain)
    n_body, _, n_regs, n_spill = _cluster_build(BC.SOURCE, nhwc)
    assert p_spill == 0 and n_spill == 0
    assert abs(n_regs - p_regs) <= 4, (p_regs, n_regs)

    def stores(body):
        ops = [ln.strip().split()[0] for ln in body.splitlines() if ln.strip().startswith("st.global")]
        return sum(o.startswith("st.global.cs.v4") for o in ops), sum(".v" not in o and ".cs" not in o for o in ops)
    (p_v4, p_scalar), (n_v4, n_scalar) = stores(p_body), stores(n_body)
    # every dx vector store became VEC plain scalar stores (dz, with HAS_Z, keeps its streaming vector stores)
    vec = 16 // dt.itemsize
    assert p_v4 and n_v4 == (p_v4 // 2 if form == "add_relu" else 0), (p_v4, n_v4)
    assert n_scalar - p_scalar == vec * (p_v4 - n_v4), (p_scalar, n_scalar)


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("ptxas") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_plain_cluster_kernels_ptx_is_that_of_the_source_without_dx_nhwc(dtype):
    """The option absent, bn_cluster's source (bn_fwdc and bn_bwdc) compiles to the PTX of the same source with
    DX_NHWC_HEADER removed and bn_bwdc's DX_NHWC store block replaced by its plain branch: the variant costs the
    plain kernels nothing."""
    dt = _dtype(dtype)
    before = _BWDC.sub(lambda m: m.group(1), BC.SOURCE.replace(BC.DX_NHWC_HEADER, ""))
    assert "DX_NHWC" not in before and before != BC.SOURCE
    for form in ("plain", "add_relu"):
        opts = _cluster_opts(dt, form)
        assert _cluster_build(BC.SOURCE, opts)[1] == _cluster_build(before, opts)[1]


def test_dx_nhwc_of_is_written_once():
    """bn_bwd1 and bn_bwdc share one dx_nhwc_of (bn_cluster.DX_NHWC_HEADER)."""
    for src in (K.ONEPASS_SOURCE, BC.SOURCE):
        assert src.count(BC.DX_NHWC_HEADER) == 1 and src.count("dx_nhwc_of(long long off") == 1


# ---- CPU: the settled calls under the fake CuPy ----------------------------------------------------------------------

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    R.numpy_fallback(fakecp)
    from minidnn.backend.cuda import bn_kernels as K, bn_nhwc as M, bn_cluster as BC, device_facts as DF
    out = {{}}
    H100 = (233472, 232448)

    def arrays(shape, cl=False):
        x = fakecp.empty((shape[0], *shape[2:], shape[1]), np.float32).transpose(0, 3, 1, 2) if cl else \\
            fakecp.empty(shape, np.float32)
        c = shape[1]
        return x, fakecp.empty(x.shape, np.float32) if not cl else x.copy(), fakecp.ones((c,), np.float32), \\
            fakecp.zeros((c,), np.float32), fakecp.ones((c,), np.float32)

    def case(name, shape, form="relu", cl=False, smem=None, onepass=True, cluster_dx=True):
        K._calls.clear(); K._plans.clear(); DF._smem.clear(); K.ONEPASS = onepass
        BC.DX_NHWC = cluster_dx
        if smem:
            DF._smem[0] = smem
        x, dy, scale, mean, inv = arrays(shape, cl)
        y = x if form != "plain" else None
        plain = K.backward_call(x, dy, scale, mean, y, form == "add_relu")
        call = K.dx_nhwc_call(x, dy, scale, mean, y, form == "add_relu")
        r = dict(call=bool(call))
        if call:
            a, b = plain.launch1, call.launch1
            r.update(same=M.same_launch(a, b), plain=a.kernel.kernel.ptr, nhwc=b.kernel.kernel.ptr)
            dx, dz, ds, db = call(x, dy, scale, mean, inv, y)
            r.update(strides=list(dx.strides), shape=list(dx.shape),
                     dz=None if dz is None else list(dz.strides))
        out[name] = r

    case("nchw_plain", (8, 16, 8, 8), "plain")
    case("nchw_relu", (8, 32, 8, 8), "relu")
    case("nchw_add_relu", (8, 64, 8, 8), "add_relu")
    case("tail", (8, 24, 7, 7), "relu")
    case("rounds", (128, 64, 112, 112), "relu")
    # ResNet-20 b128's cluster layers (an H100's shared memory, the fake's 132 SMs) and a small one
    case("cluster_plain", (128, 32, 16, 16), "plain", smem=H100)
    case("cluster_relu", (16, 64, 8, 8), "relu", smem=H100)
    case("cluster_add_relu", (128, 64, 8, 8), "add_relu", smem=H100)
    case("cluster_off", (16, 64, 8, 8), "relu", smem=H100, cluster_dx=False)
    case("two_launch", (8, 16, 8, 8), "relu", onepass=False)
    case("channels_last", (8, 16, 8, 8), "relu", cl=True)
    case("rows", (64, 16), "plain")
    BC.DX_NHWC = True

    # the primitives given a channels-last dx (the settled calls are not the only way in)
    import minidnn.backend as B
    recs = R.record_packed(L, [], other="cupy")
    for name, cl_route in (("primitive", False), ("primitive_cluster", True)):
        K._calls.clear(); K._plans.clear(); DF._smem.clear(); K.ONEPASS = True
        if cl_route:
            DF._smem[0] = (233472, 232448)
        x, dy, scale, mean, inv = arrays((16, 32, 8, 8))
        dest = fakecp.empty((16, 8, 8, 32), np.float32).transpose(0, 3, 1, 2)
        del recs[:]
        got = B.batch_normalization_backward_ex(None, "spatial", "bn_activation", x, x, dy, scale, mean, inv, 1e-5,
                                                dx=dest)
        out[name] = dict(same=got[0] is dest, launches=[r[0].split("(")[0] + (" DX_NHWC" if "DX_NHWC" in r[0]
                                                                           else "") for r in recs])
    print("RESULT" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def fake():
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=ROOT)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    return json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][0][6:])


@pytest.mark.parametrize("name", ["nchw_plain", "nchw_relu", "nchw_add_relu", "tail", "cluster_plain", "cluster_relu",
                                  "cluster_add_relu"])
def test_the_dx_nhwc_call_is_the_plain_launch_and_returns_channels_last_dx(fake, name):
    r = fake[name]
    assert r["call"] and r["same"]
    assert r["plain"].startswith("bn_bwdc" if name.startswith("cluster") else "bn_bwd1")
    assert "DX_NHWC" not in r["plain"]
    assert "-DDX_NHWC=1" in r["nhwc"] and r["nhwc"].replace(", '-DDX_NHWC=1'", "") == r["plain"]
    n, c, h, w = r["shape"]
    assert r["strides"] == [h * w * c * 4, 4, w * c * 4, c * 4]
    if name.endswith("add_relu"):
        assert r["dz"] == [c * h * w * 4, h * w * 4, w * 4, 4]      # dz stays as x


def test_the_primitive_writes_a_channels_last_dx_itself(fake):
    """One launch, the route's own kernel with DX_NHWC, on the one-pass and the cluster routes."""
    assert fake["primitive"] == {"same": True, "launches": ["bn_bwd1 DX_NHWC"]}
    assert fake["primitive_cluster"] == {"same": True, "launches": ["bn_bwdc DX_NHWC"]}


@pytest.mark.parametrize("name", ["rounds", "cluster_off", "two_launch", "channels_last", "rows"])
def test_there_is_no_dx_nhwc_call_off_the_one_round_one_pass_nchw_route(fake, name):
    assert fake[name] == {"call": False}


# ---- GPU ---------------------------------------------------------------------------------------------------------

SHAPES = [(32, 16, 16, 16), (16, 32, 8, 8), (8, 64, 8, 8), (8, 24, 7, 7)]


@pytest.mark.cuda
@pytest.mark.skipif(not _dev.cuda_is_available(), reason="no CUDA GPU with CuPy on this machine")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"], ids=str)
@pytest.mark.parametrize("form", list(FORMS))
def test_the_dx_nhwc_kernel_writes_the_plain_kernels_bits(form, dtype, shape, monkeypatch):
    import cupy as cp

    from minidnn.backend.cuda import bn_cluster
    monkeypatch.setattr(bn_cluster, "ENABLED", False)      # the one-pass route (the clusters': the next test)
    K._calls.clear()
    dt = np.dtype(pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else dtype)
    x, dy, a, scale, mean, inv = _case(cp, dt, shape, seed=sum(shape))
    y = None if form == "plain" else a
    want_dz = form == "add_relu"
    call = K.dx_nhwc_call(x, dy, scale, mean, y, want_dz)
    assert call, "the one-round bn_bwd1 route writes dx channels-last"
    ref = K.backward(x, dy, scale, mean, inv, y, want_dz)
    got = call(x, dy, scale, mean, inv, y)
    assert got[0].transpose(0, 2, 3, 1).flags.c_contiguous
    for r, g in zip(ref, got):
        if r is None:
            assert g is None
            continue
        assert cp.array_equal(cp.ascontiguousarray(r).view(cp.uint8), cp.ascontiguousarray(g).view(cp.uint8))
    # the primitives with a channels-last dx: the same bits, written into it
    dest = _cl_empty(cp, shape, dt)
    prim = _backward(form, x, dy, a, scale, mean, inv, dest)
    assert prim[0] is dest
    assert cp.array_equal(cp.ascontiguousarray(dest).view(cp.uint8), cp.ascontiguousarray(ref[0]).view(cp.uint8))
    # the route an H100/H200 takes (bn_bwdc's DX_NHWC where the clusters take the call): the same bits
    monkeypatch.setattr(bn_cluster, "ENABLED", True)
    K._calls.clear()
    ref = K.backward(x, dy, scale, mean, inv, y, want_dz)
    dest = _cl_empty(cp, shape, dt)
    assert _backward(form, x, dy, a, scale, mean, inv, dest)[0] is dest
    assert cp.array_equal(cp.ascontiguousarray(dest).view(cp.uint8), cp.ascontiguousarray(ref[0]).view(cp.uint8))


CLUSTER_SHAPES = [(16, 32, 8, 8), (128, 32, 16, 16), (8, 64, 8, 8), (128, 64, 8, 8)]     # ResNet-20 b128's: 2nd, 4th


@pytest.mark.cuda
@pytest.mark.skipif(not _dev.cuda_is_available(), reason="no CUDA GPU with CuPy on this machine")
@pytest.mark.parametrize("shape", CLUSTER_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"], ids=str)
@pytest.mark.parametrize("form", list(FORMS))
def test_the_cluster_dx_nhwc_kernel_writes_the_plain_cluster_kernels_bits(form, dtype, shape, monkeypatch):
    import cupy as cp
    monkeypatch.setattr(BC, "ENABLED", True)
    monkeypatch.setattr(BC, "DX_NHWC", True)
    K._calls.clear()
    dt = _dtype(dtype if dtype == "bfloat16" else "float32")
    x, dy, a, scale, mean, inv = _case(cp, dt, shape, seed=sum(shape) + 1)
    y = None if form == "plain" else a
    want_dz = form == "add_relu"
    if not BC.usable(x.data.device_id):
        pytest.skip("no thread-block clusters on this GPU (compute capability < 9.0)")
    plain = K.backward_call(x, dy, scale, mean, y, want_dz)
    call = K.dx_nhwc_call(x, dy, scale, mean, y, want_dz)
    kernels = {id(k): key for key, k in BC._kernels.items() if key[0] == "bn_bwdc"}
    route = kernels.get(id(getattr(plain.launch1, "kernel", None)))
    assert route is not None and not route[-1], "the cluster route (plain bn_bwdc) takes the plain call"
    assert call and kernels.get(id(call.launch1.kernel), ())[-1:] == (True,), "the call is bn_bwdc's DX_NHWC launch"
    ref = plain(x, dy, scale, mean, inv, y)
    got = call(x, dy, scale, mean, inv, y)
    assert got[0].transpose(0, 2, 3, 1).flags.c_contiguous and not got[0].flags.c_contiguous
    for r, g in zip(ref, got):
        if r is None:
            assert g is None
            continue
        assert cp.array_equal(cp.ascontiguousarray(r).view(cp.uint8), cp.ascontiguousarray(g).view(cp.uint8))
    # and not the trivial kind of equal: dx depends on every input
    assert float(cp.abs(ref[0].astype(cp.float32)).max()) > 0
