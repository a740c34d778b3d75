"""The layer norm, group norm and bias-add CUDA kernels (backend/cuda/norm_kernels.py) and the 16-bit softmax /
cross-entropy kernels against their references.

GPU cases (marked cuda, skipped without a GPU) draw inputs, round them to the dtype under test, run the primitive on
the GPU (the launch counter proves the kernel ran, in the number of launches it promises) and compare with the NumPy
reference computed in float64 from the same rounded values.  Shapes cover rows held in registers and rows too long
for them (the looped path), ragged lengths (no 16-byte vectors), misaligned views, 1-value rows and groups.  The CPU
cases check what can be checked without a GPU: the configuration chooser, the fast divider, the selection predicates,
and (where nvcc is installed) that every kernel configuration compiles without spills.
"""
import math
import shutil
import subprocess

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import norm_kernels as NK

# ---- CPU: configuration, divider, predicates, compilation ------------------------------------------------------

@pytest.mark.parametrize("d, dtype, want", [
    (1024, np.float32, (128, 2, 4)),      # 8 floats per thread in registers, 16-byte vectors
    (8192, np.float32, (512, 4, 4)),      # the longest float row kept in registers
    (16384, np.float32, (512, 0, 4)),     # looped
    (8192, np.float16, (512, 2, 8)),
    (100, np.float16, (32, 4, 1)),        # 100 halves do not fill 16-byte vectors
    (7, np.float32, (32, 1, 1)),
    (1, np.float64, (32, 1, 1)),
    (4096, np.float64, (512, 4, 2)),      # 8 doubles per thread at most
    (8192, np.float64, (512, 0, 2)),
])
def test_row_config(d, dtype, want):
    assert NK.row_config(d, np.dtype(dtype)) == want
    team, vpt, vec = want
    if vpt:
        assert team * vpt * vec >= d and vpt * vec <= 16


def test_row_config_unaligned_uses_scalars():
    assert NK.row_config(1024, np.dtype(np.float32), aligned=False)[2] == 1


@pytest.mark.parametrize("d", [1, 2, 3, 7, 49, 64, 100, 3136, 6272, 65535, 1 << 20, 12345677])
def test_divider_is_exact(d):
    mul, shr = NK.divider(d)
    rng = np.random.default_rng(d)
    n = np.concatenate([rng.integers(0, 2 ** 31, 20000, dtype=np.uint64),
                        np.arange(0, 3 * d + 3, dtype=np.uint64)[:5000],
                        np.array([2 ** 31 - 1, d - 1, d, d + 1], dtype=np.uint64) % np.uint64(2 ** 31)])
    q = ((n * np.uint64(mul)) >> np.uint64(32)) + n >> np.uint64(shr)
    np.testing.assert_array_equal(q, n // np.uint64(d))


def test_predicates_refuse_host_arrays():
    x = np.ones((4, 8), np.float32)
    assert not NK.supports_layer_norm(x, 1)
    assert not NK.supports_group_norm(np.ones((2, 4, 3), np.float32), 2)
    assert not NK.supports_bias(x, np.ones(8, np.float32), 1)
    assert not NK.supports_bias_grad(x, 1)


def test_parameter_dtype_rule():
    f16, f32, f64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
    assert NK._p_info(f16, np.ones(3, f16)) == ("float", 1)
    assert NK._p_info(f16, np.ones(3, f32)) == ("float", 0)
    assert NK._p_info(f32, np.ones(3, f64)) is None
    assert NK._p_info(f64, np.ones(3, f32)) == ("float", 0)
    assert NK._p_info(f64, None) == ("double", 0)


_CONFIGS = [  # (dtype, pinfo, team, vpt, vec, in_t)
    (np.float32, ("float", 0), 512, 4, 4, False),
    (np.float32, ("float", 0), 512, 0, 4, True),
    (np.float16, ("float", 1), 32, 1, 8, False),
    (np.float16, ("float", 0), 512, 2, 8, True),
    (np.dtype("float64"), ("double", 0), 128, 4, 2, False),
]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("cfg", _CONFIGS, ids=lambda c: f"{np.dtype(c[0]).name}-team{c[2]}-vpt{c[3]}-vec{c[4]}")
def test_kernels_compile_without_spills(tmp_path, cfg):
    opts = NK.options(np.dtype(cfg[0]), *cfg[1:])
    defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
    src = tmp_path / "k.cu"
    src.write_text(defines + NK.SOURCE)
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k"),
                        str(src)], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    spills = [line for line in out.splitlines() if "spill stores" in line]
    kernels = NK.SOURCE.count('extern "C" __global__')
    assert len(spills) == kernels and all(" 0 bytes spill stores" in line for line in spills), out


# ---- GPU ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


class Counted:
    def __enter__(self):
        from minidnn.backend.cuda import launch
        self.launch = launch
        self.start = launch.launch_count()
        return self

    def __exit__(self, *exc):
        self.n = self.launch.launch_count() - self.start


def _dtype(name):
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# data tolerance (y, dx in the data dtype) and statistic / parameter-gradient tolerance per dtype
TOL = {"float64": dict(rtol=1e-9, atol=1e-9), "float32": dict(rtol=1e-4, atol=2e-5),
       "float16": dict(rtol=4e-3, atol=4e-3), "bfloat16": dict(rtol=2e-2, atol=2e-2)}
DTYPES = ["float64", "float32", "float16", "bfloat16"]


def _h(a):
    return None if a is None else a.get().astype(np.float64) if hasattr(a, "get") else np.asarray(a, np.float64)


def _close(got, want, name, count=1, what="data"):
    if what == "data":
        tol = TOL[name]
    else:   # a sum over `count` products of rounded data, accumulated in float32 (float64 for float64 data)
        tol = dict(rtol=1e-9 if name == "float64" else 1e-4,
                   atol=(1e-9 if name == "float64" else 1e-4) * math.sqrt(count) * 4)
        if what == "data-sum" and name in ("float16", "bfloat16"):      # dbias is rounded to the data's dtype
            tol = dict(rtol=TOL[name]["rtol"], atol=tol["atol"] + TOL[name]["atol"])
    np.testing.assert_allclose(_h(got), want, **tol)


def _draw(rng, shape, dtype, offset=0.0):
    return (rng.standard_normal(shape) * 1.5 + offset).astype(dtype)


LN_CASES = [((4, 7), 1), ((3, 5, 64), 1), ((2, 3, 4, 5), 2), ((2, 1000), 1), ((3, 8192), 1), ((2, 16384), 1),
            ((3, 12289), 1), ((5, 1), 1), ((300, 33), 1), ((129, 256), 1)]


@pytest.mark.cuda
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("shape, k", LN_CASES)
@pytest.mark.parametrize("affine", ["both", "scale", "none"])
def test_layer_norm(cp, name, shape, k, affine):
    rng = np.random.default_rng(hash((shape, k, name, affine)) % 2 ** 32)
    dtype = _dtype(name)
    pshape = shape[len(shape) - k:]
    pdt = np.float64 if name == "float64" else np.float32
    x = _draw(rng, shape, dtype, offset=3.0)
    dy = _draw(rng, shape, dtype)
    scale = None if affine == "none" else rng.standard_normal(pshape).astype(pdt)
    bias = rng.standard_normal(pshape).astype(pdt) if affine == "both" else None
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    s64 = None if scale is None else scale.astype(np.float64)
    b64 = None if bias is None else bias.astype(np.float64)
    y_r, m_r, i_r = B.layer_normalization_forward(None, x64, s64, b64, k, 1e-5)
    dx_r, ds_r, db_r = B.layer_normalization_backward(None, x64, dy64, s64, m_r, i_r, k)
    g = [None if a is None else cp.asarray(a) for a in (x, dy, scale, bias)]
    with Counted() as c:
        y, m, i = B.layer_normalization_forward(None, g[0], g[2], g[3], k, 1e-5)
        dx, ds, db = B.layer_normalization_backward(None, g[0], g[1], g[2], m, i, k)
    assert c.n == 1 + 1 + (scale is not None)
    acc = np.float64 if name == "float64" else np.float32
    assert y.dtype == dtype and dx.dtype == dtype and m.dtype == acc and i.dtype == acc
    assert m.shape == shape[:len(shape) - k]
    _close(y, y_r, name)
    _close(m, m_r, name, what="stat")
    np.testing.assert_allclose(_h(i), i_r, rtol=1e-9 if name == "float64" else 1e-4)
    _close(dx, dx_r, name)
    rows = math.prod(shape[:len(shape) - k])
    if scale is None:
        assert ds is None and db is None
    else:
        assert ds.dtype == acc and db.dtype == dtype and ds.shape == pshape
        _close(ds, ds_r, name, rows, what="stat")
        _close(db, db_r, name, rows, what="data-sum")


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "float16"])
def test_layer_norm_misaligned_view_and_16_bit_parameters(cp, name):
    """A view starting 1 value into its buffer cannot use 16-byte vectors; parameters in x's own 16-bit dtype."""
    rng = np.random.default_rng(7)
    dtype = np.dtype(name)
    flat = cp.asarray(_draw(rng, (1 + 6 * 96,), dtype))
    x = flat[1:].reshape(6, 96)
    assert x.data.ptr % 16 and x.flags.c_contiguous
    dy = cp.asarray(_draw(rng, (6, 96), dtype))
    scale, bias = cp.asarray(rng.standard_normal(96).astype(dtype)), cp.asarray(rng.standard_normal(96).astype(dtype))
    xh, dyh, sh, bh = (_h(a) for a in (x, dy, scale, bias))
    y_r, m_r, i_r = B.layer_normalization_forward(None, xh, sh, bh, 1, 1e-5)
    dx_r, ds_r, db_r = B.layer_normalization_backward(None, xh, dyh, sh, m_r, i_r, 1)
    with Counted() as c:
        y, m, i = B.layer_normalization_forward(None, x, scale, bias, 1, 1e-5)
        dx, ds, db = B.layer_normalization_backward(None, x, dy, scale, m, i, 1)
    assert c.n == 3
    _close(y, y_r, name)
    _close(dx, dx_r, name)
    _close(ds, ds_r, name, 6, what="stat")


GN_CASES = [((2, 6, 5, 5), 3), ((4, 32, 16, 16), 8), ((2, 64, 28, 28), 32), ((2, 8, 60, 60), 1), ((3, 4), 2),
            ((2, 6, 7), 6), ((1, 3, 3, 3, 3), 1), ((5, 10, 1, 1), 5), ((3, 12, 9, 11), 4), ((2, 32, 5, 5), 1),
            ((2, 64, 3, 3), 1)]     # the last two: 32 channels per group (gn_bwd's limit), 64 (the 3-kernel path)


def _gn_backward_launches(shape, groups, dtype, affine, dev=0):
    """gn_bwd2 / gn_bwd (+ col_sum) where the group row fits in registers and C/G <= 32, else (16-bit) norm_gn16's
    stash kernel gn_bwdp / gn_bwds (+ col_sum) where its plan takes the row (session 18, on by default), else
    norm_gncl's cluster kernel gn_bwdc (+ col_sum) where its plan takes the float32 row (session 17), else row_sums,
    gn_dx (+ col_sum)."""
    from minidnn.backend.cuda import device_facts as DF
    from minidnn.backend.cuda import norm_gn16 as GS
    from minidnn.backend.cuda import norm_gncl as GC
    cpg = shape[1] // groups
    s = math.prod(shape[2:])
    d = cpg * s
    one = cpg <= 32 and ((not NK.V1 and NK.row_config2(d, dtype, True, "gn_bwd") is not None)
                         or NK.row_config(d, dtype)[1] > 0)
    item = np.dtype(dtype).itemsize
    if not one and not NK.V1 and item == 2 and GS.usable(dev, True):
        sm = DF.smem_limits(dev)
        one = ((GS.BWD_VARIANT == 2 and GS.plan_pipe(d, s, item, cpg, sm) is not None)
               or GS.plan(d, s, item, True, cpg, sm) is not None)
    one = one or (not NK.V1 and GC.GN_CLUSTER and item == 4 and GC.plan(d, s, item, True, cpg) is not None)
    return (1 if one else 2) + affine


@pytest.mark.cuda
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("shape, groups", GN_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm(cp, name, shape, groups, affine):
    rng = np.random.default_rng(hash((shape, groups, name, affine)) % 2 ** 32)
    dtype = _dtype(name)
    c = shape[1]
    pdt = np.float64 if name == "float64" else np.float32
    x = _draw(rng, shape, dtype, offset=-2.0)
    dy = _draw(rng, shape, dtype)
    scale = rng.standard_normal(c).astype(pdt) if affine else None
    bias = rng.standard_normal(c).astype(pdt) if affine else None
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    s64 = None if scale is None else scale.astype(np.float64)
    b64 = None if bias is None else bias.astype(np.float64)
    y_r, m_r, i_r = B.group_normalization_forward(None, x64, groups, s64, b64, 1e-5)
    dx_r, ds_r, db_r = B.group_normalization_backward(None, x64, dy64, groups, s64, m_r, i_r)
    g = [None if a is None else cp.asarray(a) for a in (x, dy, scale, bias)]
    with Counted() as cnt:
        y, m, i = B.group_normalization_forward(None, g[0], groups, g[2], g[3], 1e-5)
        dx, ds, db = B.group_normalization_backward(None, g[0], g[1], groups, g[2], m, i)
    assert cnt.n == 1 + _gn_backward_launches(shape, groups, dtype, affine, g[0].data.device_id)
    assert y.dtype == dtype and dx.dtype == dtype and m.shape == (shape[0], groups)
    _close(y, y_r, name)
    _close(m, m_r, name, what="stat")
    _close(dx, dx_r, name)
    per_channel = x.size // c
    if affine:
        _close(ds, ds_r, name, per_channel, what="stat")
        _close(db, db_r, name, per_channel, what="data-sum")
    else:
        assert ds is None and db is None


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["group", "layer"])
def test_short_rows_with_a_small_variance(cp, kind):
    """2-value groups / rows whose values lie close together (rstd in the hundreds): the saved mean's rounding to
    float32, times rstd^2, had put dx 0.05% off in ~40% of random draws of (5, 10, 1, 1) with 5 groups (a flaky
    GPU failure); the backward re-centres x - mean on the row's own mean.  Fixed seed, 2000 rows."""
    rng = np.random.default_rng(11)
    shape = (200, 20, 1, 1) if kind == "group" else (2000, 2)
    pairs = (rng.standard_normal((math.prod(shape) // 2, 1)) * 1.5 - 2.0).astype(np.float32)
    pairs = np.concatenate([pairs, pairs + (rng.standard_normal(pairs.shape) * 0.01).astype(np.float32)], axis=1)
    x = pairs.reshape(shape)        # each group / row: two values ~0.01 apart
    dy = _draw(rng, shape, np.float32)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    if kind == "group":
        y_r, m_r, i_r = B.group_normalization_forward(None, x64, 10, None, None, 1e-5)
        dx_r = B.group_normalization_backward(None, x64, dy64, 10, None, m_r, i_r)[0]
        y, m, i = B.group_normalization_forward(None, cp.asarray(x), 10, None, None, 1e-5)
        dx = B.group_normalization_backward(None, cp.asarray(x), cp.asarray(dy), 10, None, m, i)[0]
    else:
        y_r, m_r, i_r = B.layer_normalization_forward(None, x64, None, None, 1, 1e-5)
        dx_r = B.layer_normalization_backward(None, x64, dy64, None, m_r, i_r, 1)[0]
        y, m, i = B.layer_normalization_forward(None, cp.asarray(x), None, None, 1, 1e-5)
        dx = B.layer_normalization_backward(None, cp.asarray(x), cp.asarray(dy), None, m, i, 1)[0]
    assert float(np.median(_h(i))) > 50          # the ill-conditioned regime really is tested
    _close(dx, dx_r, "float32")


@pytest.mark.cuda
def test_group_norm_channels_last_goes_to_the_reference(cp):
    x = cp.asarray(np.random.default_rng(1).standard_normal((2, 4, 3, 3)).astype(np.float32))
    xcl = cp.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    with Counted() as c:
        y, _, _ = B.group_normalization_forward(None, xcl, 2, None, None, 1e-5)
    assert c.n == 0
    np.testing.assert_allclose(_h(y), _h(B.group_normalization_forward(None, x, 2, None, None, 1e-5)[0]), atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("cls_name", ["layer", "group"])
def test_nn_norm_layers_use_the_kernels(cp, cls_name):
    """nn.LayerNorm / nn.GroupNorm on the GPU: the kernels run (4 launches a step with affine parameters: forward,
    backward, column sum; group norm the same here) and the gradients agree with the CPU in float64."""
    import minidnn as mdn
    import minidnn.nn as nn
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((4, 8, 5, 5))
    wv = rng.standard_normal((5, 5) if cls_name == "layer" else (8,))
    grads = {}
    for dev in ("cpu", "cuda"):
        mdn.manual_seed(0)
        layer = nn.LayerNorm((5, 5)) if cls_name == "layer" else nn.GroupNorm(4, 8)
        layer = layer.to(dtype=mdn.float64).to(dev)
        with mdn.no_grad():
            layer.weight.copy_(mdn.tensor(wv, dtype=mdn.float64))
        x = mdn.tensor(xv, dtype=mdn.float64, device=dev, requires_grad=True)
        with Counted() as c:
            y = layer(x)
            (y * y).sum().backward()
        if dev == "cuda":
            assert c.n >= 3
        grads[dev] = [_h(t.data) for t in (y, x.grad, layer.weight.grad, layer.bias.grad)]
    for a, b in zip(grads["cpu"], grads["cuda"]):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9)


# ---- bias add and bias gradient --------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("shape, fmt", [((4, 6, 5, 7), "NCHW"), ((4, 5, 7, 6), "NHWC"), ((33, 130), "NCHW"),
                                        ((2, 3, 8, 8), "NCHW"), ((2, 16, 4, 4, 4), "NCHW"), ((3, 9, 1), "NCHW")])
@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)])
def test_add_tensor_bias(cp, name, shape, fmt, alpha, beta):
    rng = np.random.default_rng(hash((shape, name, alpha, beta)) % 2 ** 32)
    dtype = _dtype(name)
    c = shape[-1] if fmt == "NHWC" else shape[1]
    y0 = _draw(rng, shape, dtype)
    b = rng.standard_normal(c).astype(dtype)
    want = B.add_tensor(None, alpha, b.astype(np.float64), beta, y0.astype(np.float64), format=fmt)
    y = cp.asarray(y0)
    if beta == 0:
        y[...] = cp.asarray(np.full(shape, np.nan, dtype))    # beta == 0: the old y is never read
    with Counted() as cnt:
        out = B.add_tensor(None, alpha, cp.asarray(b), beta, y, format=fmt)
    assert cnt.n == 1 and out is y
    _close(y, want, name)


@pytest.mark.cuda
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("shape, layout", [((4, 6, 5, 7), "nchw"), ((4, 6, 5, 7), "channels_last"),
                                           ((64, 16, 16, 16), "nchw"), ((64, 16, 16, 16), "channels_last"),
                                           ((3, 5, 11), "nchw"), ((2, 3, 2, 3, 4), "nchw"), ((300, 7, 1, 1), "nchw")])
def test_convolution_backward_bias(cp, name, shape, layout):
    rng = np.random.default_rng(hash((shape, name, layout)) % 2 ** 32)
    dtype = _dtype(name)
    dy = _draw(rng, shape, dtype)
    want = dy.astype(np.float64).sum(axis=(0, *range(2, dy.ndim)))
    g = cp.asarray(dy)
    if layout == "channels_last":
        perm = (0, *range(2, dy.ndim), 1)
        g = cp.ascontiguousarray(g.transpose(perm)).transpose((0, dy.ndim - 1, *range(1, dy.ndim - 1)))
    with Counted() as cnt:
        db = B.convolution_backward_bias(None, g)
    # v2: one launch (bias_grad_planes or col_sum); v1: row_sums + col_sum for NCHW with H*W > 1
    assert cnt.n == (1 if not NK.V1 or layout == "channels_last" or math.prod(shape[2:]) == 1 else 2)
    assert db.dtype == dtype and db.shape == (shape[1],)
    _close(db, want, name, dy.size // shape[1], what="data-sum")


@pytest.mark.cuda
def test_convolution_backward_bias_nhwc_format(cp):
    rng = np.random.default_rng(5)
    dy = rng.standard_normal((3, 4, 5, 6)).astype(np.float32)       # (N, H, W, C)
    with Counted() as cnt:
        db = B.convolution_backward_bias(None, cp.asarray(dy), format="NHWC")
    assert cnt.n == 1
    np.testing.assert_allclose(_h(db), dy.astype(np.float64).sum(axis=(0, 1, 2)), rtol=1e-5, atol=1e-5)


# ---- 16-bit softmax, log-softmax and cross-entropy --------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape, axis", [((7, 1000), -1), ((4, 37), 1), ((3, 10, 4, 5), 1), ((2, 3, 130), (1, 2))])
@pytest.mark.parametrize("algo", ["accurate", "log"])
def test_softmax_16_bit(cp, name, shape, axis, algo):
    rng = np.random.default_rng(hash((shape, name, algo)) % 2 ** 32)
    dtype = _dtype(name)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y_r = B.softmax_forward(None, algo, None, x.astype(np.float64), axis=axis)
    with Counted() as c:
        y = B.softmax_forward(None, algo, None, cp.asarray(x), axis=axis)
    yh = y.get()
    dx_r = B.softmax_backward(None, algo, None, yh.astype(np.float64), dy.astype(np.float64), axis=axis)
    with Counted() as c2:
        dx = B.softmax_backward(None, algo, None, y, cp.asarray(dy), axis=axis)
    assert c.n == 1 and c2.n == 1 and y.dtype == dtype and dx.dtype == dtype
    _close(y, y_r, name)
    _close(dx, dx_r, name)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(64, 10), (33, 1000), (4, 5, 3, 3)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted, smoothing", [(False, 0.0), (True, 0.1)])
def test_cross_entropy_16_bit(cp, name, shape, reduction, weighted, smoothing):
    rng = np.random.default_rng(hash((shape, name, reduction, weighted)) % 2 ** 32)
    dtype = _dtype(name)
    n, c = shape[:2]
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    target = rng.integers(0, c, (n, *shape[2:])).astype(np.int64)
    target.reshape(-1)[::5] = -100
    w = (rng.random(c) + 0.5).astype(dtype) if weighted else None
    x64, w64 = x.astype(np.float64), None if w is None else w.astype(np.float64)
    loss_r, lse_r, den_r = B.softmax_cross_entropy_forward(None, x64, target, w64, -100, smoothing, reduction)
    dloss = np.asarray(rng.standard_normal(loss_r.shape)).astype(dtype)
    dx_r = B.softmax_cross_entropy_backward(None, x64, target, dloss.astype(np.float64), lse_r, den_r, w64, -100,
                                            smoothing, reduction)
    wg = None if w is None else cp.asarray(w)
    tg = cp.asarray(target)
    with Counted() as cnt:
        loss, lse, den = B.softmax_cross_entropy_forward(None, cp.asarray(x), tg, wg, -100, smoothing, reduction)
        dx = B.softmax_cross_entropy_backward(None, cp.asarray(x), tg, cp.asarray(dloss), lse, den, wg, -100,
                                              smoothing, reduction)
    assert cnt.n == 2 and loss.dtype == dtype and lse.dtype == np.float32 and dx.dtype == dtype
    _close(loss, loss_r, name)
    np.testing.assert_allclose(_h(lse), lse_r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_h(den), den_r, rtol=1e-5)
    _close(dx, dx_r, name)
