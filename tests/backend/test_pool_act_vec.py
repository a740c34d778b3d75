"""The vectorized pooling kernels (pool_kernels.VEC_SOURCE: NCHW rows of stride = window <= 4x4 windows, channels-last
vectors of any window) and the unrolled activation kernels (act_kernels), issue 10's bandwidth work.

CPU (always): the kernels' NumPy emulation (tools/emulate_pool_vec.py: the same index math, guards, rules and
stores) against the reference primitive, ties included; the activation tiles' coverage of every element; the
primitive's whole GPU path under tools/record_launches.py's fake CuPy with the new kernels' launches replayed by the
emulation (which kernel each call takes, what comes back, MINIDNN_POOL_V1=1 and MINIDNN_ACT_V1=1 restoring the
previous kernels); every new kernel compiled for sm_90 without spills (where nvcc is installed).
GPU (cuda-marked): the kernels against float64 references for float32 / float16 / bfloat16, forward and backward,
tails (odd H/W, sizes not a multiple of the vector width), misaligned views, ties; one launch per call; the new
kernels bit-identical to the previous ones (the switches flipped at run time).
"""
import json
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from tests import _nvcc

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import emulate_pool_vec as E  # noqa: E402

# ---- CPU: the kernels' emulation against the reference -------------------------------------------------------------


@pytest.mark.parametrize("dtname", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("mode", E.MODES)
@pytest.mark.parametrize("case", E.ROWS_CASES, ids=lambda c: "x".join(map(str, c[0])) + f"-w{c[1]}")
def test_rows_kernels_emulated_match_the_reference(case, mode, dtname):
    for ties in (False, True):
        E.check_rows(*case, mode, dtname, ties)


@pytest.mark.parametrize("dtname", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("mode", E.MODES)
@pytest.mark.parametrize("case", E.CL_CASES, ids=lambda c: "x".join(map(str, c[0])) + f"-w{c[1]}-d{c[5]}")
def test_channels_last_kernels_emulated_match_the_reference(case, mode, dtname):
    for ties in (False, True):
        E.check_clv(*case, mode, dtname, ties)


def test_rows_and_channels_last_applicability():
    from minidnn.backend.cuda import pool_kernels as PK

    def geom(shape, *desc):
        return B.pooling._Geometry(B.PoolingDescriptor(*desc), shape, "t")
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    g = geom((2, 3, 7, 9), "max", 2)
    assert PK.rows_applies(g, 2, 3, f32) and not PK.rows_applies(g, 2, 3, f32, exact=True)   # floor-mode tail
    assert PK.rows_applies(geom((2, 3, 8, 8), "max", 2), 2, 3, f32, exact=True)
    assert not PK.rows_applies(geom((2, 3, 8, 8), "max", 2), 2, 3, f64)           # float64: generic kernels
    assert not PK.rows_applies(geom((2, 3, 8, 8), "max", 3, 1, 2), 2, 3, f32)     # padding / overlap
    assert not PK.rows_applies(geom((2, 3, 7, 7), "max", 2, 0, 2, True), 2, 3, f32)   # ceil-clipped windows
    assert not PK.rows_applies(geom((1, 1, 10, 10), "max", 5), 1, 1, f32)         # window over 4
    assert PK.clv_applies(g, 8, f32, 63) and not PK.clv_applies(g, 6, f32, 63) and PK.clv_applies(g, 8, np.float16, 63)
    assert not PK.clv_applies(g, 8, f64, 63)


def test_activation_tiles_cover_every_element_once():
    """The vector path's walk (tiles of 256 * UNROLL vectors, grid stride, block 0's tail) for sizes around the tile
    and vector boundaries, capped and uncapped grids."""
    from minidnn.backend.cuda import act_kernels as AK
    for vw, unroll, th in [(vw, u, 256) for vw in (2, 4, 8) for u in (1, 2, 4)] + [(4, 2, 128), (8, 1, 128)]:
        for n in (1, vw - 1, vw, 255 * vw + 3, th * unroll * vw, th * unroll * vw * 3 + 5, 100003):
            nv = n // vw
            tiles = AK._vec_grid(nv, 0, {"unroll": unroll, "blocks_per_sm": 0, "threads": th})[0]
            assert tiles == max(1, -(-nv // (th * unroll)))
            for grid in {tiles, min(tiles, 3)}:
                hits = np.zeros(n, np.int64)
                t = np.arange(th)
                for b in range(grid):
                    k0 = b * th * unroll + t
                    while (k0 < nv).any():
                        for u in range(unroll):
                            k = k0 + u * th
                            for e in range(vw):
                                np.add.at(hits, (k[k < nv] * vw + e), 1)
                        k0 = k0 + grid * th * unroll
                i = nv * vw + t
                np.add.at(hits, i[i < n], 1)
                assert (hits == 1).all(), (vw, unroll, th, n, grid)
    assert AK.CONFIG["unroll"] in (1, 2, 4, 8) and AK.CONFIG16["unroll"] in (1, 2, 4, 8)


# ---- CPU: the primitive's GPU path under the fake CuPy, launches replayed -----------------------------------------

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    import ml_dtypes
    import emulate_pool_vec as E
    import minidnn.backend as B
    names = []
    call = L.Prepared.__call__

    def replayed(self, *arrays, stream=None):
        label = self.kernel.kernel.ptr
        names.append(label.partition("(")[0])
        scalars = self.buf.struct.unpack_from(self.buf.data)[len(self.slots):]
        E.replay(label, arrays, scalars)
        return call(self, *arrays, stream=stream)
    L.Prepared.__call__ = replayed

    def w(a):
        return a.view(fakecp.ndarray)

    def misaligned(a):                       # the same values, C-contiguous, 16-byte misaligned (a view)
        flat = np.empty(a.size + 1, a.dtype)
        v = flat[1:].reshape(a.shape)
        v[...] = a
        return w(v)

    def cl(a):
        return w(np.ascontiguousarray(np.moveaxis(a, 1, -1))).transpose(0, 3, 1, 2)
    out = {{}}
    rng = np.random.default_rng(0)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    cases = [  # name, shape, dtype, desc args, layout
        ("f32-2x2", (2, 3, 8, 8), np.float32, ("max", 2), "nchw"),
        ("f32-2x2-avg", (2, 3, 8, 8), np.float32, ("average_count_include_padding", 2), "nchw"),
        ("bf16-2x2-tail", (2, 5, 4, 36), bf16, ("max", 2), "nchw"),
        ("f16-2x2-floor", (1, 2, 7, 9), np.float16, ("max", 2), "nchw"),
        ("f32-w10", (2, 2, 6, 10), np.float32, ("average_count_exclude_padding", 2), "nchw"),
        ("f32-misaligned", (2, 3, 8, 8), np.float32, ("max", 2), "misaligned"),
        ("f32-3x3s3", (2, 3, 9, 12), np.float32, ("max", 3), "nchw"),
        ("f32-3x3p1", (2, 3, 9, 9), np.float32, ("max", 3, 1, 2), "nchw"),
        ("f64-2x2", (2, 3, 8, 8), np.float64, ("max", 2), "nchw"),
        ("cl-f32-3x3p1", (2, 16, 7, 9), np.float32, ("max", 3, 1, 2), "cl"),
        ("cl-bf16-2x2", (2, 8, 8, 8), bf16, ("average_count_include_padding", 2), "cl"),
        ("cl-f32-c6", (2, 6, 8, 8), np.float32, ("max", 2), "cl"),
    ]
    for name, shape, dt, dargs, layout in cases:
        desc = B.PoolingDescriptor(*dargs)
        is_max = desc.mode.is_max
        x = (np.round(rng.standard_normal(shape) * 2) / 2).astype(dt)       # ties in many windows
        x64 = x.astype(np.float64)
        ref = B.pooling_forward(None, desc, x64, return_argmax=is_max)
        y_ref, a_ref = ref if is_max else (ref, None)
        dy = rng.standard_normal(y_ref.shape).astype(dt)
        dx_ref = B.pooling_backward(None, desc, y_ref, dy.astype(np.float64), x64)
        conv = {{"nchw": lambda a: w(np.ascontiguousarray(a)), "misaligned": misaligned, "cl": cl}}[layout]
        xg, dyg = conv(x), conv(dy)
        res = []
        for rep in range(2):                 # the second call: the remembered plan
            names.clear()
            o = B.pooling_forward(None, desc, xg, return_argmax=is_max)
            y, a = o if is_max else (o, None)
            fwd = list(names)
            names.clear()
            dx = B.pooling_backward(None, desc, y, dyg, xg, argmax=a)
            bwd = list(names)
            tol = 2e-2 if np.dtype(dt).itemsize == 2 else 1e-6
            try:
                np.testing.assert_allclose(np.asarray(y).astype(np.float64), y_ref, rtol=tol, atol=tol)
                if is_max:
                    np.testing.assert_array_equal(np.asarray(a), a_ref)
                np.testing.assert_allclose(np.asarray(dx).astype(np.float64), dx_ref, rtol=tol, atol=tol)
                ok = "ok"
            except AssertionError as exc:
                ok = str(exc)[:400]
            res.append([fwd, bwd, ok])
        out[name] = res
    relu = B.ActivationDescriptor("relu")
    names.clear()
    xa = w(rng.standard_normal((3, 5, 7)).astype(np.float32))
    B.activation_forward(None, relu, xa)
    B.activation_backward(None, relu, None, xa, xa)
    from minidnn.backend.cuda import act_kernels as AK
    plans = AK._plans.values()
    out["act"] = [names[:], sorted(set(k[3] for k in AK._kernel_cache)), [p.vec is not None for p in plans]]
    print(json.dumps(out))
""")


def _fake_run(env_extra=None):
    import os
    env = dict(os.environ, **(env_extra or {}))
    res = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                         timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


NEW_KERNELS = {  # case -> (forward kernel, backward kernel) of the vectorized path (VEC_BWD=1, the default)
    "f32-2x2": ("pool_fwd_rows", "pool_bwd_rows"), "f32-2x2-avg": ("pool_fwd_rows", "pool_bwd_rows"),
    "bf16-2x2-tail": ("pool_fwd_rows", "pool_bwd_rows"), "f16-2x2-floor": ("pool_fwd_rows", "pool_bwd"),
    "f32-w10": ("pool_fwd_rows", "pool_bwd_rows"), "f32-misaligned": ("pool_fwd_rows", "pool_bwd_rows"),
    "f32-3x3s3": ("pool_fwd_rows", "pool_bwd_rows"), "f32-3x3p1": ("pool_fwd", "pool_bwd"),
    "f64-2x2": ("pool_fwd", "pool_bwd_disjoint"), "cl-f32-3x3p1": ("pool_fwd_clv", "pool_bwd_clv"),
    "cl-bf16-2x2": ("pool_fwd_clv", "pool_bwd_clv"), "cl-f32-c6": ("pool_fwd", "pool_bwd_disjoint"),
}
OLD_BWD = {  # case -> the backward with MINIDNN_POOL_VEC_BWD=0 (the previous kernels): disjoint or gather
    "f16-2x2-floor": "pool_bwd", "f32-3x3p1": "pool_bwd", "cl-f32-3x3p1": "pool_bwd"}


@pytest.mark.parametrize("vec_bwd", [False, True])
def test_fake_gpu_path_takes_the_vector_kernels_and_matches_the_reference(vec_bwd):
    pytest.importorskip("ml_dtypes")
    out = _fake_run({"MINIDNN_POOL_VEC_BWD": "1" if vec_bwd else "0"})      # (1 is the default)
    for name, (fk, bk) in NEW_KERNELS.items():
        if not vec_bwd:
            bk = OLD_BWD.get(name, "pool_bwd_disjoint")
        for fwd, bwd, ok in out[name]:
            assert fwd == [fk] and bwd == [bk], (name, fwd, bwd)
            if fk in E.VEC_KERNELS and bk in E.VEC_KERNELS:       # both launches replayed: compare the values
                assert ok == "ok", (name, ok)
    names, unrolls, vec = out["act"]
    from minidnn.backend.cuda import act_kernels as AK
    assert names == ["act_fwd", "act_bwd"] and unrolls == [AK.CONFIG["unroll"]] and all(vec)   # 105: the tail too


def test_switches_restore_the_previous_kernels():
    pytest.importorskip("ml_dtypes")
    out = _fake_run({"MINIDNN_POOL_V1": "1", "MINIDNN_ACT_V1": "1"})
    for name in NEW_KERNELS:
        for fwd, bwd, _ in out[name]:
            assert not set(fwd + bwd) & set(E.VEC_KERNELS), (name, fwd, bwd)
    names, unrolls, vec = out["act"]
    assert unrolls == [1] and not any(vec)          # V1: one vector per thread, vectors only where n fills them


# ---- CPU: every new kernel compiles for sm_90 without spills ------------------------------------------------------

def _compile(units):
    """[(defines, source)] built for sm_90 in one nvcc run (tests/_nvcc.build: each unit's ptxas lines are those of
    its own build): no warning, no spill in any kernel; the number of kernels each unit built."""
    counts = []
    for (defines, _), r in zip(units, _nvcc.build([(src, [f"{k}={v}" for k, v in d]) for d, src in units], batch=24)):
        out = r.stderr
        assert r.returncode == 0 and "warning" not in out, (defines, out[-2000:])
        spills = [line for line in out.splitlines() if "spill stores" in line]
        assert spills and all(" 0 bytes spill stores" in line for line in spills), (defines, out)
        counts.append(len(spills))
    return counts


def _defines(opts):
    return [tuple(o[2:].split("=", 1)) for o in opts if o.startswith("-D")]


_VEC_CONFIGS = [  # (dtype, argmax dtype, is_max, include, rows, kh, kw, sv, vin, vdy, vout[, ov])
    ("float32", np.uint8, 1, 0, 1, 2, 2, 4, 1, 1, 1), ("bfloat16", np.uint8, 1, 0, 1, 2, 2, 4, 1, 1, 1),
    ("float16", np.uint8, 0, 1, 1, 2, 2, 8, 0, 0, 0), ("float32", np.uint8, 1, 0, 1, 4, 4, 1, 0, 0, 0),
    ("float32", np.uint8, 0, 0, 1, 3, 3, 2, 1, 1, 1), ("bfloat16", np.uint16, 1, 0, 0, 0, 0, 1, 0, 0, 0),
    ("float32", np.uint8, 0, 1, 0, 0, 0, 1, 0, 0, 0),
    ("float32", np.uint8, 1, 0, 1, 2, 2, 2, 1, 1, 1, 2), ("bfloat16", np.uint8, 0, 0, 1, 2, 2, 4, 1, 1, 1, 4),
    ("bfloat16", np.uint8, 1, 0, 1, 1, 4, 2, 0, 1, 0, 2),      # the backward's OV = VW / KW (MINIDNN_POOL_VEC_BWD=1)
    ("float32", np.uint8, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1), ("bfloat16", np.uint8, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1),
]                                                              # pool_bwd_clv's disjoint form (DISJ)


_ACT_CONFIGS = [("float32", "RELU", 4, 0), ("bfloat16", "GELU", 4, 1), ("float64", "SOFTPLUS", 2, 0),
                ("float16", "SWISH", 8, 0), ("float32", "ELU", 1, 0), ("bfloat16", "RELU", 1, 2),
                ("bfloat16", "RELU", 2, 3), ("float32", "RELU", 2, 128)]
# (dtype, mode, unroll, hint); hint 128: hint 0 in 128-thread blocks


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_vector_pool_kernels_compile_without_spills():
    """Every configuration in _VEC_CONFIGS, one nvcc run: each builds its pair of kernels (the rows pair or the
    channels-last pair) without a spill."""
    from minidnn.backend.cuda import pool_kernels as PK
    pytest.importorskip("ml_dtypes")
    units = [(_defines(PK.vec_options(E._dtype(c[0]) if c[0] == "bfloat16" else np.dtype(c[0]), np.dtype(c[1]),
                                      *c[2:])), PK.VEC_SOURCE) for c in _VEC_CONFIGS]
    assert _compile(units) == [2] * len(units)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_activation_kernels_compile_without_spills():
    """Every configuration in _ACT_CONFIGS (session 9 round 2's 128-thread candidate included), one nvcc run: two
    kernels each, no spill."""
    from minidnn.backend.cuda import act_kernels as AK
    pytest.importorskip("ml_dtypes")
    units = []
    for dtname, mode, unroll, hint in _ACT_CONFIGS:
        dt = E._dtype(dtname) if dtname == "bfloat16" else np.dtype(dtname)
        opts = AK.options(dt, mode, unroll, 0, 128) if hint == 128 else AK.options(dt, mode, unroll, hint)
        units.append((_defines(opts), AK.SOURCE))
    assert _compile(units) == [2] * len(units)


# ---- GPU ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _launches():
    from minidnn.backend.cuda import launch
    return launch.launch_count()


def _fresh():
    from minidnn.backend import activation, pooling
    from minidnn.backend.cuda import act_kernels, pool_kernels
    pooling._SEEN.clear()
    pool_kernels._plans.clear()
    activation._SEEN.clear()
    act_kernels._plans.clear()


GPU_DTYPES = ["float32", "float16", "bfloat16"]
TOLS = {"float32": dict(rtol=2e-6, atol=2e-6), "float16": dict(rtol=2e-3, atol=2e-3),
        "bfloat16": dict(rtol=1.6e-2, atol=1.6e-2)}

GPU_POOLS = [  # (x shape, window, padding, stride, ceil_mode, dilation)
    ((4, 6, 56, 56), 2, 0, 2, False, 1), ((3, 5, 7, 9), 2, 0, 2, False, 1), ((2, 3, 6, 10), 2, 0, 2, False, 1),
    ((2, 5, 4, 36), 2, 0, 2, False, 1), ((2, 3, 9, 12), 3, 0, 3, False, 1),
    ((2, 2, 4, 44), (1, 4), 0, (1, 4), False, 1), ((2, 3, 7, 7), 2, 0, 2, True, 1),
    ((2, 16, 9, 9), 3, 1, 2, False, 2), ((2, 24, 6, 7), 3, 1, 2, True, 1),
    ((128, 16, 32, 32), 2, 0, 2, False, 1),
]


def _gpu_layout(cp, a, layout):
    if layout == "nchw":
        return cp.asarray(a)
    if layout == "misaligned":          # C-contiguous values at a 16-byte misaligned address
        flat = cp.empty(a.size + 1, a.dtype)
        v = flat[1:].reshape(a.shape)
        v[...] = cp.asarray(a)
        return v
    return cp.ascontiguousarray(cp.asarray(a).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


_GPU_POOL_PARAMS = [(c, m, d, lay) for c in GPU_POOLS for m in ("max", "average_count_include_padding",
                                                                  "average_count_exclude_padding")
                    for d in GPU_DTYPES for lay in ("nchw", "channels_last")] + [
    (c, m, d, "misaligned") for c in GPU_POOLS[:4] for m in ("max", "average_count_exclude_padding")
    for d in ("float32", "bfloat16")]      # misaligned pointers: the kernels that need no alignment


@pytest.mark.cuda
@pytest.mark.parametrize("case, mode, dtname, layout", _GPU_POOL_PARAMS,
                         ids=lambda v: "x".join(map(str, v[0])) + f"-w{v[1]}p{v[2]}s{v[3]}" if isinstance(v, tuple)
                         else str(v))
def test_pooling_vector_kernels_on_the_gpu(cp, monkeypatch, case, mode, dtname, layout):
    from minidnn.backend.cuda import pool_kernels as PK
    monkeypatch.setattr(PK, "VEC_BWD", True)            # the opt-in vector backward (the default's: test_step_cuda)
    shape, window, padding, stride, ceil_mode, dilation = case
    if dilation != 1 and mode != "max":
        pytest.skip("dilation is a max-pooling setting")
    dt = E._dtype(dtname)
    desc = B.PoolingDescriptor(mode, window, padding, stride, ceil_mode, dilation)
    rng = np.random.default_rng(7)
    x = (np.round(rng.standard_normal(shape) * 2) / 2).astype(dt)          # ties: the first maximum wins
    is_max = mode == "max"
    ref = B.pooling_forward(None, desc, x.astype(np.float64), return_argmax=is_max)
    y_ref, a_ref = ref if is_max else (ref, None)
    dy = rng.standard_normal(y_ref.shape).astype(dt)
    dx_ref = B.pooling_backward(None, desc, y_ref, dy.astype(np.float64), x.astype(np.float64))
    xg, dyg = _gpu_layout(cp, x, layout), _gpu_layout(cp, dy, layout)
    _fresh()
    for _ in range(2):                                  # the second call: the remembered plan
        before = _launches()
        out = B.pooling_forward(None, desc, xg, return_argmax=is_max)
        y, a = out if is_max else (out, None)
        dx = B.pooling_backward(None, desc, y, dyg, xg, argmax=a)
        assert _launches() - before == 2
        np.testing.assert_allclose(_host(y).astype(np.float64), y_ref, **TOLS[dtname])
        if is_max:
            np.testing.assert_array_equal(_host(a), a_ref)
        np.testing.assert_allclose(_host(dx).astype(np.float64), dx_ref, **TOLS[dtname])
        assert y.dtype == dt and dx.dtype == dt


@pytest.mark.cuda
@pytest.mark.parametrize("dtname", GPU_DTYPES)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("case", [((4, 6, 56, 56), "max", 2), ((3, 8, 7, 9), "average_count_include_padding", 2),
                                  ((2, 16, 9, 9), "max", 3, 1, 2), ((2, 8, 12, 12), "max", 3)])
def test_pooling_vector_kernels_bitwise_equal_the_previous(cp, monkeypatch, case, dtname, layout):
    """MINIDNN_POOL_V1's kernels (generic / disjoint) and the vector kernels: the same bits, forward and backward."""
    from minidnn.backend.cuda import pool_kernels as PK
    shape, *dargs = case
    desc = B.PoolingDescriptor(*dargs)
    is_max = desc.mode.is_max
    rng = np.random.default_rng(3)
    dt = E._dtype(dtname)
    x = (np.round(rng.standard_normal(shape) * 2) / 2).astype(dt)
    xg = _gpu_layout(cp, x, layout)
    results = []
    for v1 in (False, True):
        monkeypatch.setattr(PK, "V1", v1)
        monkeypatch.setattr(PK, "VEC_BWD", not v1)     # the vector backward (opt-in) against the previous one
        _fresh()
        out = B.pooling_forward(None, desc, xg, return_argmax=is_max)
        y, a = out if is_max else (out, None)
        dy = _gpu_layout(cp, rng.standard_normal(tuple(y.shape)).astype(dt), layout) if not results else results[0][3]
        dx = B.pooling_backward(None, desc, y, dy, xg, argmax=a)
        results.append((_host(y), None if a is None else _host(a), _host(dx), dy))
    _fresh()
    (y1, a1, dx1, _), (y0, a0, dx0, _) = results
    np.testing.assert_array_equal(y1.view(np.uint8), y0.view(np.uint8))
    np.testing.assert_array_equal(dx1.view(np.uint8), dx0.view(np.uint8))
    if is_max:
        np.testing.assert_array_equal(a1, a0)


ACT_MODES = [("relu", None), ("sigmoid", None), ("tanh", None), ("leaky_relu", 0.02), ("gelu", None),
             ("gelu_tanh", None), ("swish", 1.3), ("softplus", 2.0), ("elu", 0.7), ("clipped_relu", 2.0),
             ("hardtanh", 1.5), ("relu6", None), ("identity", None)]
# every mode in float32; the 16-bit types (the same kernel, another storage) on a few (each is one more compile)
ACT_CASES = [("float32", m, c) for m, c in ACT_MODES] + [
    (d, m, c) for d in ("float16", "bfloat16") for m, c in ACT_MODES if m in ("relu", "gelu", "leaky_relu", "swish")]


@pytest.mark.cuda
@pytest.mark.parametrize("dtname, mode, coef", ACT_CASES)
@pytest.mark.parametrize("n, layout", [(7, "nchw"), (4099, "nchw"), (262147, "nchw"), (262147, "misaligned"),
                                       (4 * 1024 * 8 + 8, "nchw")])
def test_activation_kernels_on_the_gpu(cp, n, layout, mode, coef, dtname):
    dt = E._dtype(dtname)
    desc = B.ActivationDescriptor(mode, coef)
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(n) * 4).astype(dt)
    x[: min(n, 3)] = np.array([0.0, 6.0, -1.5])[: min(n, 3)]           # kinks
    dy = rng.standard_normal(n).astype(dt)
    y_ref = B.activation_forward(None, desc, x.astype(np.float64))
    dx_ref = B.activation_backward(None, desc, None, dy.astype(np.float64), x.astype(np.float64))

    def g(a):
        if layout == "nchw":
            return cp.asarray(a)
        flat = cp.empty(a.size + 1, a.dtype)
        flat[1:] = cp.asarray(a)
        return flat[1:]
    before = _launches()
    y = B.activation_forward(None, desc, g(x))
    dx = B.activation_backward(None, desc, None, g(dy), g(x))
    assert _launches() - before == 2
    # the kernel computes in float and rounds once to the storage type: one ulp of the dtype, 4 ulps of float32
    tol = TOLS[dtname] if dtname != "float32" else dict(rtol=5e-6, atol=5e-6)
    np.testing.assert_allclose(_host(y).astype(np.float64), y_ref, **tol)
    np.testing.assert_allclose(_host(dx).astype(np.float64), dx_ref, **tol)


@pytest.mark.cuda
@pytest.mark.parametrize("dtname", GPU_DTYPES)
@pytest.mark.parametrize("mode", ["relu", "gelu"])
def test_activation_unrolled_bitwise_equals_the_previous(cp, monkeypatch, mode, dtname):
    """The unrolled tiles and the previous one-vector walk (CONFIG as MINIDNN_ACT_V1 sets it): the same bits."""
    from minidnn.backend.cuda import act_kernels as AK
    dt = E._dtype(dtname)
    desc = B.ActivationDescriptor(mode)
    rng = np.random.default_rng(5)
    x = cp.asarray((rng.standard_normal((64, 32, 28, 28)) * 3).astype(dt))
    dy = cp.asarray(rng.standard_normal((64, 32, 28, 28)).astype(dt))
    got = []
    target = AK.config(dt)                       # CONFIG16 for the 16-bit types
    for cfg in ({"unroll": 4, "blocks_per_sm": 0, "hint": 0}, {"unroll": 1, "blocks_per_sm": 8, "hint": 0},
                {"unroll": 2, "blocks_per_sm": 0, "hint": 0, "threads": 128},      # PyTorch's launch shape
                {"unroll": 2, "blocks_per_sm": 4, "hint": 3})[: 4 if mode == "relu" else 3]:
        for key in ("unroll", "blocks_per_sm", "hint", "threads"):
            monkeypatch.setitem(target, key, cfg.get(key, 256))
        _fresh()
        got.append((_host(B.activation_forward(None, desc, x)), _host(B.activation_backward(None, desc, None, dy, x))))
    _fresh()
    for y, dx in got[1:]:
        np.testing.assert_array_equal(y.view(np.uint8), got[0][0].view(np.uint8))
        np.testing.assert_array_equal(dx.view(np.uint8), got[0][1].view(np.uint8))
