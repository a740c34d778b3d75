"""The training-step CUDA kernels (issue 10) against their references: batch norm (training, inference, backward,
fused ReLU and add + ReLU), pooling, softmax, softmax cross-entropy and the activations.

Each case draws fresh inputs, runs the primitive on the GPU (where the kernel takes it: the launch counter proves
that the fast path ran, in the number of launches it promises) and compares with the NumPy reference on the host
computed in float64 from the same values.  Those tests are cuda-marked and skip cleanly without a GPU; the new
primitives' references (softmax cross-entropy, the fused batch-norm *_ex forms) are checked here on the CPU too,
against PyTorch and against their compositions.
"""
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import bn_kernels as _bnk

BN = 1 if _bnk.ONEPASS else 2       # batch-norm launches per direction (bn_fwd1 / bn_bwd1, else the two-launch pair)

TOL = {np.float64: dict(rtol=1e-9, atol=1e-10), np.float32: dict(rtol=2e-4, atol=2e-5)}


@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


@pytest.fixture
def rng():
    return np.random.default_rng(20261124)


def launches():
    from minidnn.backend.cuda import launch
    return launch.launch_count()


class Counted:
    """with Counted() as c: ...  ->  c.n launches made through backend/cuda/launch.py inside the block."""

    def __enter__(self):
        self.start = launches()
        return self

    def __exit__(self, *exc):
        self.n = launches() - self.start


def host(a):
    return None if a is None else (a.get() if hasattr(a, "get") else np.asarray(a))


def close(got, want, dtype, scale=1.0, **kw):
    tol = dict(TOL[dtype])
    tol["atol"] = tol["atol"] * scale
    tol.update(kw)
    np.testing.assert_allclose(host(got), want, **tol)


def channels_last(cp, a):
    """A channels-first (N, C, *S) CuPy view of channels-last memory holding a's values."""
    perm = (0, *range(2, a.ndim), 1)
    back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return cp.ascontiguousarray(cp.asarray(a).transpose(perm)).transpose(back)


# ---- batch norm -------------------------------------------------------------------------------------------------

BN_SHAPES = [(2, 3, 5, 7), (1, 1, 3, 3), (1, 4, 3, 1), (7, 1, 9, 9), (3, 300, 2, 2), (32, 16, 16, 16), (2, 7),
             (64, 130), (5, 3, 11), (2, 3, 2, 3, 4), (4, 2, 1, 1)]


def _bn_inputs(rng, shape, dtype, offset=0.0):
    c = shape[1]
    x = (rng.standard_normal(shape) * 2 + offset).astype(dtype)
    scale = rng.standard_normal(c).astype(dtype)
    bias = rng.standard_normal(c).astype(dtype)
    rm = rng.standard_normal(c).astype(dtype)
    rv = (rng.random(c) + 0.5).astype(dtype)
    return x, scale, bias, rm, rv


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_batch_norm_training_forward_and_backward(cp, rng, dtype, shape, layout):
    if layout == "channels_last" and len(shape) < 3:
        pytest.skip("2-D input has one layout")
    x, scale, bias, rm, rv = _bn_inputs(rng, shape, dtype, offset=100.0 if shape[1] == 3 else 0.0)
    dy = rng.standard_normal(shape).astype(dtype)
    f, eps = 0.1, 1e-5
    rm_ref, rv_ref = rm.astype(np.float64), rv.astype(np.float64)
    y_ref, m_ref, i_ref = B.batch_normalization_forward_training(None, "spatial", x.astype(np.float64),
                                                                 scale.astype(np.float64), bias.astype(np.float64),
                                                                 f, rm_ref, rv_ref, eps)
    dx_ref, ds_ref, db_ref = B.batch_normalization_backward(None, "spatial", x.astype(np.float64),
                                                            dy.astype(np.float64), scale.astype(np.float64),
                                                            m_ref, i_ref, eps)
    xg = cp.asarray(x) if layout == "nchw" else channels_last(cp, x)
    dyg = cp.asarray(dy) if layout == "nchw" else channels_last(cp, dy)
    rmg, rvg = cp.asarray(rm), cp.asarray(rv)
    with Counted() as fwd:
        y, m, i = B.batch_normalization_forward_training(None, "spatial", xg, cp.asarray(scale), cp.asarray(bias), f,
                                                         rmg, rvg, eps)
    assert fwd.n == BN, "statistics + apply: one launch (two with MINIDNN_BN_ONEPASS=0)"
    assert y.dtype == dtype and y.shape == x.shape
    if layout == "channels_last" and shape[1] > 1 and np.prod(shape[2:]) > 1:      # else both orders coincide
        assert not y.flags.c_contiguous and y.transpose((0, *range(2, y.ndim), 1)).flags.c_contiguous
    close(y, y_ref, dtype, scale=10)
    close(m, m_ref, dtype, scale=100)
    close(i, i_ref, dtype)
    close(rmg, rm_ref, dtype, scale=100)
    close(rvg, rv_ref, dtype, scale=100)
    with Counted() as bwd:
        dx, ds, db = B.batch_normalization_backward(None, "spatial", xg, dyg, cp.asarray(scale), m, i, eps)
    assert bwd.n == BN, "reduction + elementwise: one launch (two with MINIDNN_BN_ONEPASS=0)"
    close(dx, dx_ref, dtype, scale=10)
    close(ds, ds_ref, dtype, scale=100, rtol=1e-3 if dtype == np.float32 else 1e-9)
    close(db, db_ref, dtype, scale=100, rtol=1e-3 if dtype == np.float32 else 1e-9)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_batch_norm_format_nhwc_and_no_affine(cp, rng, dtype):
    x = rng.standard_normal((3, 4, 5, 6)).astype(dtype)        # NHWC-indexed: C = 6
    dy = rng.standard_normal(x.shape).astype(dtype)
    y_ref, m_ref, i_ref = B.batch_normalization_forward_training(None, "spatial", x.astype(np.float64), None, None,
                                                                 0.1, None, None, 1e-3, format="NHWC")
    dx_ref, _, _ = B.batch_normalization_backward(None, "spatial", x.astype(np.float64), dy.astype(np.float64), None,
                                                  m_ref, i_ref, 1e-3, format="NHWC")
    with Counted() as c:
        y, m, i = B.batch_normalization_forward_training(None, "spatial", cp.asarray(x), None, None, 0.1, None, None,
                                                         1e-3, format="NHWC")
        dx, ds, db = B.batch_normalization_backward(None, "spatial", cp.asarray(x), cp.asarray(dy), None, m, i, 1e-3,
                                                    format="NHWC")
    assert c.n == 2 * BN and ds is None and db is None
    close(y, y_ref, dtype, scale=10)
    close(dx, dx_ref, dtype, scale=10)


@pytest.mark.cuda
def test_batch_norm_running_stats_over_steps(cp, rng):
    """Ten training steps: the running statistics follow the reference's within float32 rounding."""
    rm, rv = np.zeros(8, np.float32), np.ones(8, np.float32)
    rmg, rvg = cp.asarray(rm), cp.asarray(rv)
    rm64, rv64 = rm.astype(np.float64), rv.astype(np.float64)
    for step in range(10):
        x = (rng.standard_normal((16, 8, 6, 6)) * (1 + step) + step).astype(np.float32)
        B.batch_normalization_forward_training(None, "spatial", x.astype(np.float64), None, None, 0.1, rm64, rv64,
                                               1e-5)
        B.batch_normalization_forward_training(None, "spatial", cp.asarray(x), None, None, 0.1, rmg, rvg, 1e-5)
    np.testing.assert_allclose(host(rmg), rm64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(rvg), rv64, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (4, 64, 8, 8), (9, 5), (1, 1, 1, 1)])
def test_batch_norm_inference(cp, rng, dtype, shape):
    x, scale, bias, rm, rv = _bn_inputs(rng, shape, dtype)
    y_ref = B.batch_normalization_forward_inference(None, "spatial", *(a.astype(np.float64) for a in
                                                                       (x, scale, bias, rm, rv)), 1e-5)
    with Counted() as c:
        y = B.batch_normalization_forward_inference(None, "spatial", *(cp.asarray(a) for a in (x, scale, bias, rm,
                                                                                               rv)), 1e-5)
    assert c.n == 1
    close(y, y_ref, dtype, scale=10)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ops", ["bn_activation", "bn_add_activation"])
@pytest.mark.parametrize("shape, layout", [((4, 6, 5, 5), "nchw"), ((4, 6, 5, 5), "channels_last"),
                                           ((33, 17), "nchw"), ((1, 2, 3, 3), "nchw")])
@pytest.mark.cuda
def test_fused_batch_norm_relu_and_add_relu(cp, rng, dtype, ops, shape, layout):
    x, scale, bias, rm, rv = _bn_inputs(rng, shape, dtype)
    z = rng.standard_normal(shape).astype(dtype) if ops == "bn_add_activation" else None
    dy = rng.standard_normal(shape).astype(dtype)
    def to64(a):
        return None if a is None else a.astype(np.float64)
    rm_ref, rv_ref = to64(rm), to64(rv)
    y_ref, m_ref, i_ref = B.batch_normalization_forward_training_ex(None, "spatial", ops, to64(x), to64(z),
                                                                    to64(scale), to64(bias), 0.1, rm_ref, rv_ref,
                                                                    1e-5)
    dx_ref, dz_ref, ds_ref, db_ref = B.batch_normalization_backward_ex(None, "spatial", ops, to64(x), y_ref,
                                                                       to64(dy), to64(scale), m_ref, i_ref, 1e-5)
    def g(a):
        return None if a is None else (cp.asarray(a) if layout == "nchw" else channels_last(cp, a))
    rmg, rvg = cp.asarray(rm), cp.asarray(rv)
    with Counted() as fwd:
        y, m, i = B.batch_normalization_forward_training_ex(None, "spatial", ops, g(x), g(z), cp.asarray(scale),
                                                            cp.asarray(bias), 0.1, rmg, rvg, 1e-5)
    with Counted() as bwd:
        dx, dz, ds, db = B.batch_normalization_backward_ex(None, "spatial", ops, g(x), y, g(dy), cp.asarray(scale),
                                                           m, i, 1e-5)
    assert fwd.n == BN and bwd.n == BN, "the fused forms launch no more than plain batch norm"
    close(y, y_ref, dtype, scale=10)
    close(rmg, rm_ref, dtype, scale=100)
    close(dx, dx_ref, dtype, scale=10)
    close(ds, ds_ref, dtype, scale=100, rtol=1e-3 if dtype == np.float32 else 1e-9)
    close(db, db_ref, dtype, scale=100, rtol=1e-3 if dtype == np.float32 else 1e-9)
    if ops == "bn_add_activation":
        close(dz, dz_ref, dtype)
    else:
        assert dz is None


# ---- pooling ----------------------------------------------------------------------------------------------------

POOLS = [  # (x shape, window, padding, stride, ceil_mode, dilation)
    ((2, 3, 8, 8), 2, 0, 2, False, 1), ((1, 1, 7, 9), 3, 1, 2, False, 1), ((3, 5, 6, 6), 3, 1, 1, False, 1),
    ((2, 4, 7, 7), 2, 0, 2, True, 1), ((2, 2, 9, 9), 3, 1, 2, True, 1),
    ((2, 3, 8, 8), (2, 3), (1, 0), (1, 2), False, 1),
    ((4, 64, 8, 8), 8, 0, 8, False, 1), ((2, 3, 1, 1), 1, 0, 1, False, 1), ((128, 16, 28, 28), 2, 0, 2, False, 1),
    # global windows (average: gap_fwd / gap_fwd_cl / gap_bwd; max: the disjoint backward): tails, big planes
    ((3, 37, 7, 9), (7, 9), 0, (7, 9), False, 1), ((2, 40, 56, 56), 56, 0, 56, False, 1),
    ((3, 5, 4, 4), 4, 0, 1, False, 1),
    # disjoint windows (pool_bwd_disjoint): ceil-clipped last row and column, 2-wide pairs, 3x3/3
    ((2, 5, 7, 6), 2, 0, 2, True, 1), ((2, 3, 9, 9), 3, 0, 3, False, 1), ((2, 3, 8, 5), (2, 1), 0, (2, 1), False, 1),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode", ["max", "average_count_include_padding", "average_count_exclude_padding"])
@pytest.mark.parametrize("case", POOLS)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_pooling_forward_backward(cp, rng, dtype, mode, case, layout):
    shape, window, padding, stride, ceil_mode, dilation = case
    desc = B.PoolingDescriptor(mode, window, padding, stride, ceil_mode, dilation)
    x = rng.standard_normal(shape).astype(dtype)
    x64 = x.astype(np.float64)
    is_max = mode == "max"
    if is_max:
        y_ref, arg_ref = B.pooling_forward(None, desc, x64, return_argmax=True)
    else:
        y_ref = B.pooling_forward(None, desc, x64)
    dy = rng.standard_normal(y_ref.shape).astype(dtype)
    dx_ref = B.pooling_backward(None, desc, y_ref, dy.astype(np.float64), x64)
    xg = cp.asarray(x) if layout == "nchw" else channels_last(cp, x)
    dyg = cp.asarray(dy) if layout == "nchw" else channels_last(cp, dy)
    with Counted() as fwd:
        out = B.pooling_forward(None, desc, xg, return_argmax=is_max)
    assert fwd.n == 1
    y, arg = out if is_max else (out, None)
    close(y, y_ref, dtype)
    if is_max:
        np.testing.assert_array_equal(host(arg), arg_ref)
        assert arg.dtype == arg_ref.dtype
    with Counted() as bwd:
        dx = B.pooling_backward(None, desc, y, dyg, xg, argmax=arg)
    assert bwd.n == 1, "max pooling backward reads the argmax: one launch"
    close(dx, dx_ref, dtype, scale=10)
    if layout == "channels_last" and shape[1] > 1 and shape[2] * shape[3] > 1:      # else both orders coincide
        assert dx.transpose(0, 2, 3, 1).flags.c_contiguous, "dx keeps x's channels-last order"
        if y.shape[2] * y.shape[3] > 1:
            assert y.transpose(0, 2, 3, 1).flags.c_contiguous


def _plan_kinds():
    from minidnn.backend.cuda import pool_kernels
    return sorted({p.kind for p in pool_kernels._plans.values()})


def _fresh_pool_plans():
    """Forget the primitive's remembered calls and the kernels' plans (a remembered call builds no plan)."""
    from minidnn.backend import pooling
    from minidnn.backend.cuda import pool_kernels
    pooling._SEEN.clear()
    pool_kernels._plans.clear()


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("shape", [(4, 64, 8, 8), (3, 37, 7, 9), (2, 40, 56, 56), (128, 16, 32, 32)])
def test_global_average_pooling_takes_its_own_kernels(cp, rng, layout, shape):
    """Adaptive average pooling to 1x1 (window = the input): gap_fwd / gap_fwd_cl and gap_bwd, one launch each,
    against the reference; dx keeps x's memory order."""
    desc = B.PoolingDescriptor("average_count_include_padding", shape[2:], 0, shape[2:])
    x = rng.standard_normal(shape).astype(np.float32)
    y_ref = B.pooling_forward(None, desc, x.astype(np.float64))
    dy = rng.standard_normal(y_ref.shape).astype(np.float32)
    dx_ref = B.pooling_backward(None, desc, y_ref, dy.astype(np.float64), x.astype(np.float64))
    xg = cp.asarray(x) if layout == "nchw" else channels_last(cp, x)
    _fresh_pool_plans()
    with Counted() as c:
        y = B.pooling_forward(None, desc, xg)
        dx = B.pooling_backward(None, desc, y, cp.asarray(dy), xg)
    assert c.n == 2 and _plan_kinds() == [2, 3]
    close(y, y_ref, np.float32)
    close(dx, dx_ref, np.float32)
    if layout == "channels_last":
        assert dx.transpose(0, 2, 3, 1).flags.c_contiguous
    for _ in range(2):        # repeated calls: the remembered plan, the same bits
        np.testing.assert_array_equal(host(B.pooling_forward(None, desc, xg)), host(y))
        np.testing.assert_array_equal(host(B.pooling_backward(None, desc, y, cp.asarray(dy), xg)), host(dx))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_global_average_pooling_16_bit(cp, rng, name, layout):
    dtype, tol = _lowp(name)
    desc = B.PoolingDescriptor("average_count_exclude_padding", (6, 10), 0, (6, 10))
    x = rng.standard_normal((3, 24, 6, 10)).astype(dtype)
    y_ref = B.pooling_forward(None, desc, x.astype(np.float64))
    dy = rng.standard_normal(y_ref.shape).astype(dtype)
    dx_ref = B.pooling_backward(None, desc, y_ref, dy.astype(np.float64), x.astype(np.float64))
    xg = cp.asarray(x) if layout == "nchw" else channels_last(cp, x)
    with Counted() as c:
        y = B.pooling_forward(None, desc, xg)
        dx = B.pooling_backward(None, desc, y, cp.asarray(dy), xg)
    assert c.n == 2 and y.dtype == dtype and dx.dtype == dtype
    np.testing.assert_allclose(_f64(y), y_ref, **tol)
    np.testing.assert_allclose(_f64(dx), dx_ref, **tol)


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["max", "average_count_include_padding"])
def test_disjoint_windows_take_the_scatter_backward(cp, rng, mode):
    from minidnn.backend.cuda import pool_kernels
    desc = B.PoolingDescriptor(mode, 2)
    x = rng.standard_normal((4, 8, 10, 10))
    y_ref = B.pooling_forward(None, desc, x)
    dy = rng.standard_normal(y_ref.shape)
    dx_ref = B.pooling_backward(None, desc, y_ref, dy, x)
    xg = cp.asarray(x)
    out = B.pooling_forward(None, desc, xg, return_argmax=mode == "max")
    y, arg = out if mode == "max" else (out, None)
    _fresh_pool_plans()
    dx = B.pooling_backward(None, desc, y, cp.asarray(dy), xg, argmax=arg)
    assert _plan_kinds() == [1]
    assert any(p.go.kernel is pool_kernels._kernel("pool_bwd_disjoint", np.dtype(np.float64), np.dtype(np.uint8),
                                                   False, mode == "max", mode != "max", pair=True)
               for p in pool_kernels._plans.values())
    close(dx, dx_ref, np.float64)


@pytest.mark.cuda
@pytest.mark.parametrize("how", ["adaptive", "avg_pool2d", "module"])
def test_nn_global_average_pooling_reaches_the_kernels(cp, rng, how):
    """F.adaptive_avg_pool2d(x, 1), nn.AdaptiveAvgPool2d(1) and F.avg_pool2d with the full window: the global
    average kernels, forward and backward, and the CPU's gradients (float64)."""
    import minidnn as mdn
    import minidnn.nn.functional as F
    xv = rng.standard_normal((4, 24, 7, 7))
    grads = {}
    for dev in ("cpu", "cuda"):
        x = mdn.tensor(xv, dtype=mdn.float64, device=dev, requires_grad=True)
        _fresh_pool_plans()
        with Counted() as c:
            y = (F.adaptive_avg_pool2d(x, 1) if how == "adaptive" else F.avg_pool2d(x, 7) if how == "avg_pool2d"
                 else mdn.nn.AdaptiveAvgPool2d(1)(x))
            (y * y).sum().backward()
        if dev == "cuda":
            assert c.n >= 2 and _plan_kinds() == [2, 3]
        grads[dev] = [host(t.data) for t in (y, x.grad)]
    for a, b in zip(grads["cpu"], grads["cuda"]):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


_POOL_CONFIGS = [  # (dtype, argmax dtype, CL, IS_MAX, INCLUDE_PAD, PAIR, TEAM, VEC)
    (np.float32, np.uint8, 0, 1, 0, 1, 32, 4), (np.float32, np.uint16, 1, 0, 1, 0, 128, 1),
    (np.float64, np.uint8, 0, 0, 0, 1, 256, 2), (np.float16, np.uint8, 1, 1, 0, 0, 64, 8),
]


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("cfg", _POOL_CONFIGS, ids=lambda c: "-".join(str(v) for v in c[2:]) + f"-{np.dtype(c[0])}")
def test_pool_kernels_compile_without_spills(tmp_path, cfg):
    """Every pooling kernel (generic, disjoint backward, global average) compiles for sm_90 without spills."""
    import subprocess

    from minidnn.backend.cuda import pool_kernels
    opts = pool_kernels.options(np.dtype(cfg[0]), np.dtype(cfg[1]), *cfg[2:])
    defines = "".join(f"#define {o[2:].split('=')[0]} {o.split('=', 1)[1]}\n" for o in opts if o.startswith("-D"))
    src = tmp_path / "k.cu"
    src.write_text(defines + pool_kernels.SOURCE)
    r = subprocess.run(["nvcc", "-std=c++14", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k"),
                        str(src)], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "warning" not in out, out[-2000:]
    spills = [line for line in out.splitlines() if "spill stores" in line]
    assert len(spills) == pool_kernels.SOURCE.count('extern "C" __global__') == 6
    assert all(" 0 bytes spill stores" in line for line in spills), out


@pytest.mark.cuda
def test_max_pooling_ties_nan_and_padding_like_the_reference(cp):
    x = np.zeros((1, 2, 4, 4))
    x[0, 1] = -np.inf
    x[0, 0, 1, 1] = np.nan
    desc = B.PoolingDescriptor("max", 3, 1, 1)
    y_ref, arg_ref = B.pooling_forward(None, desc, x, return_argmax=True)
    y, arg = B.pooling_forward(None, desc, cp.asarray(x), return_argmax=True)
    np.testing.assert_array_equal(host(y), y_ref)
    np.testing.assert_array_equal(host(arg), arg_ref)


@pytest.mark.cuda
def test_pooling_backward_without_argmax_recomputes_it(cp, rng):
    desc = B.PoolingDescriptor("max", 3, 1, 2)
    x = rng.standard_normal((2, 3, 9, 9))
    y_ref = B.pooling_forward(None, desc, x)
    dy = rng.standard_normal(y_ref.shape)
    dx_ref = B.pooling_backward(None, desc, y_ref, dy, x)
    with Counted() as c:
        dx = B.pooling_backward(None, desc, cp.asarray(y_ref), cp.asarray(dy), cp.asarray(x))
    assert c.n == 2
    close(dx, dx_ref, np.float64)


# ---- softmax and cross-entropy ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("algo", ["accurate", "log", "fast"])
@pytest.mark.parametrize("shape, axis", [((7, 10), 1), ((1, 1), -1), ((3, 1000), 1), ((4, 5, 6, 3), 1),
                                         ((2, 3, 4), (1, 2)), ((5, 33), -1), ((2, 4, 3, 3), -1)])
@pytest.mark.cuda
def test_softmax_forward_backward(cp, rng, dtype, algo, shape, axis):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y_ref = B.softmax_forward(None, algo, None, x.astype(np.float64), axis=axis)
    dx_ref = B.softmax_backward(None, algo, None, y_ref, dy.astype(np.float64), axis=axis)
    with Counted() as c:
        y = B.softmax_forward(None, algo, None, cp.asarray(x), axis=axis)
        dx = B.softmax_backward(None, algo, None, y, cp.asarray(dy), axis=axis)
    assert c.n == 2
    close(y, y_ref, dtype)
    close(dx, dx_ref, dtype, scale=10)


CE_CASES = [  # (x shape, weighted, label smoothing, ignore fraction)
    ((64, 10), False, 0.0, 0.0), ((1, 1), False, 0.0, 0.0), ((7, 5), True, 0.0, 0.3), ((7, 5), True, 0.1, 0.3),
    ((5, 4, 3), False, 0.2, 0.2), ((3, 1000), True, 0.0, 0.0), ((6, 3), False, 0.0, 1.0), ((6, 3), True, 0.1, 1.0),
    ((2, 7, 2, 3), True, 0.05, 0.5),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", CE_CASES)
def test_softmax_cross_entropy(cp, rng, dtype, reduction, case):
    _check_cross_entropy(cp, rng, dtype, reduction, case, np.int64)


@pytest.mark.cuda
@pytest.mark.parametrize("case", CE_CASES[2:5])
def test_softmax_cross_entropy_int32_targets(cp, rng, case):
    _check_cross_entropy(cp, rng, np.float32, "mean", case, np.int32)


def _check_cross_entropy(cp, rng, dtype, reduction, case, index_dtype):
    shape, weighted, eps, ignore = case
    c = shape[1]
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    t = rng.integers(0, c, (shape[0],) + shape[2:]).astype(index_dtype)
    t[rng.random(t.shape) < ignore] = -100
    w = (rng.random(c) + 0.1).astype(dtype) if weighted else None
    args = (None if w is None else w.astype(np.float64), -100, eps, reduction)
    loss_ref, lse_ref, den_ref = B.softmax_cross_entropy_forward(None, x.astype(np.float64), t, *args)
    g = np.asarray(rng.standard_normal(np.shape(loss_ref)))
    dx_ref = B.softmax_cross_entropy_backward(None, x.astype(np.float64), t, g, lse_ref, den_ref, *args)
    gargs = (None if w is None else cp.asarray(w), -100, eps, reduction)
    with Counted() as fwd:
        loss, lse, den = B.softmax_cross_entropy_forward(None, cp.asarray(x), cp.asarray(t), *gargs)
    with Counted() as bwd:
        dx = B.softmax_cross_entropy_backward(None, cp.asarray(x), cp.asarray(t), cp.asarray(g.astype(dtype)), lse,
                                              den, *gargs)
    assert fwd.n == 1 and bwd.n == 1
    assert loss.dtype == dtype and loss.shape == np.shape(loss_ref)
    close(loss, loss_ref, dtype, scale=10, equal_nan=True)
    close(dx, dx_ref, dtype)
    if ignore == 1.0:
        assert not host(dx).any(), "every target ignored: a zero gradient"


@pytest.mark.cuda
def test_cross_entropy_matches_pytorch(cp, rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((9, 6))
    t = rng.integers(0, 6, 9)
    t[2] = -100
    w = rng.random(6) + 0.5
    xt = torch.tensor(x, requires_grad=True)
    lt = torch.nn.functional.cross_entropy(xt, torch.tensor(t), weight=torch.tensor(w), label_smoothing=0.1)
    lt.backward()
    loss, lse, den = B.softmax_cross_entropy_forward(None, cp.asarray(x), cp.asarray(t), cp.asarray(w), -100, 0.1)
    dx = B.softmax_cross_entropy_backward(None, cp.asarray(x), cp.asarray(t), cp.asarray(1.0), lse, den,
                                          cp.asarray(w), -100, 0.1)
    np.testing.assert_allclose(host(loss), lt.item(), rtol=1e-12)
    np.testing.assert_allclose(host(dx), xt.grad.numpy(), rtol=1e-10, atol=1e-14)


# ---- activations ------------------------------------------------------------------------------------------------

MODES = [("relu", None), ("sigmoid", None), ("tanh", None), ("clipped_relu", 2.0), ("elu", 0.7), ("leaky_relu", 0.02),
         ("gelu", None), ("gelu_tanh", None), ("swish", 1.3), ("softplus", 2.0), ("hardtanh", 1.5), ("relu6", None),
         ("identity", None)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode, coef", MODES)
@pytest.mark.parametrize("shape, layout", [((1000,), "nchw"), ((3, 4, 5, 6), "channels_last"), ((1, 1), "nchw")])
def test_activation_forward_backward(cp, rng, dtype, mode, coef, shape, layout):
    desc = B.ActivationDescriptor(mode, coef)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    x.reshape(-1)[:3] = [0.0, 6.0, -1.5][: x.size]       # kinks
    dy = rng.standard_normal(shape).astype(dtype)
    y_ref = B.activation_forward(None, desc, x.astype(np.float64))
    dx_ref = B.activation_backward(None, desc, None, dy.astype(np.float64), x.astype(np.float64))
    def g(a):
        return cp.asarray(a) if layout == "nchw" else channels_last(cp, a)
    with Counted() as c:
        y = B.activation_forward(None, desc, g(x))
        dx = B.activation_backward(None, desc, None, g(dy), g(x))
    assert c.n == 2
    close(y, y_ref, dtype, scale=10)
    close(dx, dx_ref, dtype, scale=10)
    if layout == "channels_last":
        assert y.strides == g(x).strides


# ---- the whole thing: no host synchronisation, and nn on top --------------------------------------------------------

@pytest.mark.cuda
def test_step_kernels_run_inside_a_cuda_graph_capture(cp, rng):
    """Every kernel above, captured in a CUDA graph (a capture fails on any synchronisation) and replayed."""
    x = cp.asarray(rng.standard_normal((8, 4, 6, 6)).astype(np.float32))
    scale, bias = cp.ones(4, np.float32), cp.zeros(4, np.float32)
    rm, rv = cp.zeros(4, np.float32), cp.ones(4, np.float32)
    t = cp.asarray(rng.integers(0, 4 * 9, 8))
    t[0] = -100
    relu = B.ActivationDescriptor("relu")
    pool = B.PoolingDescriptor("max", 2)

    def step():
        y, m, i = B.batch_normalization_forward_training(None, "spatial", x, scale, bias, 0.1, rm, rv, 1e-5)
        a = B.activation_forward(None, relu, y)
        p, arg = B.pooling_forward(None, pool, a, return_argmax=True)
        logits = p.reshape(8, -1)
        loss, lse, den = B.softmax_cross_entropy_forward(None, logits, t)
        dlog = B.softmax_cross_entropy_backward(None, logits, t, cp.ones((), np.float32), lse, den)
        dp = B.pooling_backward(None, pool, p, dlog.reshape(p.shape), a, argmax=arg)
        da = B.activation_backward(None, relu, None, dp, y)
        dx, ds, db = B.batch_normalization_backward(None, "spatial", x, da, scale, m, i, 1e-5)
        return loss, dx, ds

    eager = [host(a) for a in step()]
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        step()
        s.synchronize()
        s.begin_capture()
        with Counted() as c:
            out = step()
        graph = s.end_capture()
        graph.launch(s)
        s.synchronize()
    assert c.n == 6 + 2 * BN, "bn + 1 relu + 1 pool + 1 ce, and back"
    for a, b in zip(out, eager):
        np.testing.assert_allclose(host(a), b, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_repeated_calls_skip_validation_and_stay_right(cp, rng):
    """The second call of a signature goes straight to the kernels (no re-validation): same launches, right values,
    and a call that differs in any array's shape still meets the validation."""
    relu = B.ActivationDescriptor("relu")
    pool = B.PoolingDescriptor("max", 3, 1, 2)
    scale, bias = cp.ones(5), cp.zeros(5)
    for _ in range(3):
        x = rng.standard_normal((4, 5, 9, 9))
        dy = rng.standard_normal(x.shape)
        y_ref, m_ref, i_ref = B.batch_normalization_forward_training(None, "spatial", x, None, None, 0.1, None, None,
                                                                     1e-5)
        dx_ref = B.batch_normalization_backward(None, "spatial", x, dy, None, m_ref, i_ref, 1e-5)[0]
        p_ref, a_ref = B.pooling_forward(None, pool, x, return_argmax=True)
        pdx_ref = B.pooling_backward(None, pool, p_ref, p_ref * 2, x, argmax=a_ref)
        with Counted() as c:
            y, m, i = B.batch_normalization_forward_training(None, "spatial", cp.asarray(x), scale, bias, 0.1, None,
                                                             None, 1e-5)
            dx = B.batch_normalization_backward(None, "spatial", cp.asarray(x), cp.asarray(dy), scale, m, i, 1e-5)[0]
            r = B.activation_forward(None, relu, cp.asarray(x))
            dr = B.activation_backward(None, relu, None, cp.asarray(dy), cp.asarray(x))
            p, a = B.pooling_forward(None, pool, cp.asarray(x), return_argmax=True)
            pdx = B.pooling_backward(None, pool, p, p * 2, cp.asarray(x), argmax=a)
        assert c.n == 4 + 2 * BN, "bn fwd + bwd, relu fwd + bwd, pool fwd + bwd (p * 2 is CuPy's, not counted)"
        close(y, y_ref, np.float64)
        close(dx, dx_ref, np.float64)
        close(r, np.maximum(x, 0), np.float64)
        close(dr, np.where(x > 0, dy, 0), np.float64)
        close(p, p_ref, np.float64)
        np.testing.assert_array_equal(host(a), a_ref)
        close(pdx, pdx_ref, np.float64)
    with pytest.raises(B.BadParamError, match="scale has shape"):
        B.batch_normalization_forward_training(None, "spatial", cp.asarray(x), cp.ones(4), bias, 0.1, None, None, 1e-5)
    with pytest.raises(B.BadParamError, match="must match"):
        B.activation_backward(None, relu, None, cp.asarray(dy[:2]), cp.asarray(x))


# ---- 16-bit data (float16, bfloat16): computed in float32, parameters and statistics float32 -----------------------

def _lowp(name):
    if name == "float16":
        return np.dtype(np.float16), dict(rtol=4e-3, atol=4e-3)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return np.dtype(ml_dtypes.bfloat16), dict(rtol=2e-2, atol=2e-2)


def _f64(a):
    return host(a).astype(np.float64)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape, layout", [((8, 6, 5, 5), "nchw"), ((8, 6, 5, 5), "channels_last"), ((33, 40), "nchw")])
def test_batch_norm_16_bit(cp, rng, name, shape, layout):
    dtype, tol = _lowp(name)
    c = shape[1]
    x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    scale, bias = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    rm, rv = np.zeros(c, np.float32), np.ones(c, np.float32)
    rm64, rv64 = rm.astype(np.float64), rv.astype(np.float64)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    y_ref, m_ref, i_ref = B.batch_normalization_forward_training(None, "spatial", x64, scale.astype(np.float64),
                                                                 bias.astype(np.float64), 0.1, rm64, rv64, 1e-5)
    dx_ref, ds_ref, db_ref = B.batch_normalization_backward(None, "spatial", x64, dy64, scale.astype(np.float64),
                                                            m_ref, i_ref, 1e-5)
    def g(a):
        return cp.asarray(a) if layout == "nchw" else channels_last(cp, a)
    rmg, rvg = cp.asarray(rm), cp.asarray(rv)
    with Counted() as c_:
        y, m, i = B.batch_normalization_forward_training(None, "spatial", g(x), cp.asarray(scale), cp.asarray(bias),
                                                         0.1, rmg, rvg, 1e-5)
        dx, ds, db = B.batch_normalization_backward(None, "spatial", g(x), g(dy), cp.asarray(scale), m, i, 1e-5)
    assert c_.n == 2 * BN
    assert y.dtype == dtype and dx.dtype == dtype and m.dtype == np.float32 and ds.dtype == np.float32
    np.testing.assert_allclose(_f64(y), y_ref, **tol)
    np.testing.assert_allclose(_f64(m), m_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_f64(rvg), rv64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_f64(dx), dx_ref, **tol)
    np.testing.assert_allclose(_f64(ds), ds_ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(_f64(db), db_ref, rtol=1e-4, atol=1e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["relu", "gelu", "sigmoid"])
def test_activation_16_bit(cp, rng, name, mode):
    dtype, tol = _lowp(name)
    desc = B.ActivationDescriptor(mode)
    x = (rng.standard_normal((7, 9, 3)) * 3).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    y_ref = B.activation_forward(None, desc, x.astype(np.float64))
    dx_ref = B.activation_backward(None, desc, None, dy.astype(np.float64), x.astype(np.float64))
    with Counted() as c:
        y = B.activation_forward(None, desc, cp.asarray(x))
        dx = B.activation_backward(None, desc, None, cp.asarray(dy), cp.asarray(x))
    assert c.n == 2 and y.dtype == dtype
    np.testing.assert_allclose(_f64(y), y_ref, **tol)
    np.testing.assert_allclose(_f64(dx), dx_ref, **tol)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["max", "average_count_exclude_padding"])
def test_pooling_16_bit(cp, rng, name, mode):
    dtype, tol = _lowp(name)
    desc = B.PoolingDescriptor(mode, 3, 1, 2)
    x = rng.standard_normal((2, 5, 9, 9)).astype(dtype)
    x64 = x.astype(np.float64)
    y_ref = B.pooling_forward(None, desc, x64)
    dy = rng.standard_normal(y_ref.shape).astype(dtype)
    dx_ref = B.pooling_backward(None, desc, y_ref, dy.astype(np.float64), x64)
    with Counted() as c:
        y = B.pooling_forward(None, desc, cp.asarray(x))
        dx = B.pooling_backward(None, desc, y, cp.asarray(dy), cp.asarray(x))
    assert c.n == (3 if mode == "max" else 2) and y.dtype == dtype
    np.testing.assert_allclose(_f64(y), y_ref, **tol)
    np.testing.assert_allclose(_f64(dx), dx_ref, **tol)
    if mode == "max":
        np.testing.assert_array_equal(_f64(y), y_ref)     # a maximum is one of the inputs, exactly


# Last: it runs the convolution kernels of another work item too, and must not take the kernels above down with it.
@pytest.mark.cuda
def test_nn_resnet_block_on_the_gpu_matches_the_cpu(cp, rng):
    """A BasicBlock + pooling + cross-entropy training step through nn, float64 on both devices (the fast paths
    reach nn without any nn change): loss, every gradient and the running statistics agree."""
    import minidnn as mdn
    from minidnn.models import BasicBlock
    x = rng.standard_normal((4, 3, 8, 8))
    t = rng.integers(0, 8, 4)
    results = []
    for device in ("cpu", "cuda"):
        mdn.manual_seed(0)
        block = BasicBlock(3, 8, stride=2).double().to(device)
        xt = mdn.tensor(x, device=device)
        out = mdn.nn.functional.max_pool2d(block(xt), 2)
        loss = mdn.nn.functional.cross_entropy(out.reshape(4, -1), mdn.tensor(t, device=device), label_smoothing=0.1)
        loss.backward()
        results.append([host(loss.data)] + [host(p.grad.data) for p in block.parameters()]
                       + [host(b.data) for b in block.buffers() if b.dtype.kind == "f"])
    for a, b in zip(*results):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11)


# ---- the new primitives' references, on the CPU (CI): PyTorch and the compositions as oracles ----------------------

CE_REF_CASES = [  # (x shape, weighted, label smoothing, ignore fraction, reduction)
    ((8, 5), False, 0.0, 0.0, "mean"), ((8, 5), True, 0.0, 0.25, "mean"), ((8, 5), True, 0.2, 0.25, "sum"),
    ((4, 6, 3), False, 0.1, 0.3, "none"), ((3, 4, 2, 2), True, 0.05, 0.5, "mean"), ((1, 1), False, 0.0, 0.0, "sum"),
    ((5, 3), True, 0.1, 1.0, "mean"), ((5, 3), False, 0.0, 1.0, "none"),
]


@pytest.mark.parametrize("case", CE_REF_CASES)
def test_softmax_cross_entropy_reference_matches_pytorch(rng, case):
    torch = pytest.importorskip("torch")
    shape, weighted, eps, ignore, reduction = case
    c = shape[1]
    x = rng.standard_normal(shape) * 3
    t = rng.integers(0, c, (shape[0],) + shape[2:])
    t[rng.random(t.shape) < ignore] = -100
    w = rng.random(c) + 0.1 if weighted else None
    loss, lse, den = B.softmax_cross_entropy_forward(None, x, t, w, -100, eps, reduction)
    xt = torch.tensor(x, requires_grad=True)
    lt = torch.nn.functional.cross_entropy(xt, torch.tensor(t), weight=None if w is None else torch.tensor(w),
                                           ignore_index=-100, label_smoothing=eps, reduction=reduction)
    g = rng.standard_normal(tuple(lt.shape))
    lt.backward(torch.tensor(g))
    np.testing.assert_allclose(loss, lt.detach().numpy(), rtol=1e-12, atol=1e-12, equal_nan=True)
    assert loss.dtype == x.dtype and lse.shape == t.shape and den.shape == ()
    dx = B.softmax_cross_entropy_backward(None, x, t, np.asarray(g), lse, den, w, -100, eps, reduction)
    # (every target ignored: the mean's loss is 0/0 = NaN in both, the gradient 0 in both)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("call, match", [
    (lambda x, t: B.softmax_cross_entropy_forward(None, x, t.astype(np.float64)), "class indices must be integers"),
    (lambda x, t: B.softmax_cross_entropy_forward(None, x, t[:2]), r"needs a target of shape \(4,\)"),
    (lambda x, t: B.softmax_cross_entropy_forward(None, x, t, np.ones(2)), r"weight \(\(2,\), float64\) must be"),
    (lambda x, t: B.softmax_cross_entropy_forward(None, x, t + 5), "target 5 is out of bounds for 3 classes"),
    (lambda x, t: B.softmax_cross_entropy_forward(None, x, t, reduction="avg"), "reduction='avg' must be one of"),
    (lambda x, t: B.softmax_cross_entropy_forward(None, x, t, label_smoothing=1.5), "label_smoothing=1.5"),
    (lambda x, t: B.softmax_cross_entropy_backward(None, x, t, np.ones(4), np.zeros(4), np.asarray(4.0)),
     r"dloss has shape \(4,\) but reduction='mean' gives \(\)"),
])
def test_softmax_cross_entropy_bad_input(call, match):
    x = np.zeros((4, 3))
    t = np.array([0, 1, 2, 0])
    with pytest.raises(B.BadParamError, match=match):
        call(x, t)


@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
@pytest.mark.parametrize("fmt", [None, "NHWC"])
def test_fused_batch_norm_reference_is_the_composition(rng, ops, fmt):
    shape = (4, 3, 5, 5) if fmt is None else (4, 5, 5, 3)
    x = rng.standard_normal(shape)
    z = rng.standard_normal(shape) if ops == "bn_add_activation" else None
    dy = rng.standard_normal(shape)
    scale, bias = rng.standard_normal(3), rng.standard_normal(3)
    rm, rv, rm2, rv2 = np.zeros(3), np.ones(3), np.zeros(3), np.ones(3)
    y, m, i = B.batch_normalization_forward_training_ex(None, "spatial", ops, x, z, scale, bias, 0.1, rm, rv, 1e-5,
                                                        format=fmt)
    y0, m0, i0 = B.batch_normalization_forward_training(None, "spatial", x, scale, bias, 0.1, rm2, rv2, 1e-5,
                                                        format=fmt)
    pre = y0 if z is None else y0 + z
    want = pre if ops == "bn" else np.maximum(pre, 0)
    np.testing.assert_allclose(y, want, rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(rm, rm2)
    np.testing.assert_array_equal(rv, rv2)
    dx, dz, ds, db = B.batch_normalization_backward_ex(None, "spatial", ops, x, y, dy, scale, m, i, 1e-5, format=fmt)
    g = dy if ops == "bn" else np.where(pre > 0, dy, 0)
    dx0, ds0, db0 = B.batch_normalization_backward(None, "spatial", x, g, scale, m0, i0, 1e-5, format=fmt)
    np.testing.assert_allclose(dx, dx0, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ds, ds0, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(db, db0, rtol=1e-12, atol=1e-14)
    if ops == "bn_add_activation":
        np.testing.assert_array_equal(dz, g)
    else:
        assert dz is None
    y_inf = B.batch_normalization_forward_inference_ex(None, "spatial", ops, x, z, scale, bias, rm, rv, 1e-5,
                                                       format=fmt)
    y_inf0 = B.batch_normalization_forward_inference(None, "spatial", x, scale, bias, rm, rv, 1e-5, format=fmt)
    y_inf0 = y_inf0 if z is None else y_inf0 + z
    np.testing.assert_allclose(y_inf, y_inf0 if ops == "bn" else np.maximum(y_inf0, 0), rtol=1e-14, atol=1e-14)


def test_fused_batch_norm_relu_matches_pytorch(rng):
    torch = pytest.importorskip("torch")
    x, z, dy = (rng.standard_normal((6, 4, 3, 3)) for _ in range(3))
    scale, bias = rng.standard_normal(4), rng.standard_normal(4)
    y, m, i = B.batch_normalization_forward_training_ex(None, "spatial", "bn_add_activation", x, z, scale, bias, 0.1,
                                                        None, None, 1e-5)
    dx, dz, ds, db = B.batch_normalization_backward_ex(None, "spatial", "bn_add_activation", x, y, dy, scale, m, i,
                                                       1e-5)
    xt, zt, st, bt = (torch.tensor(a, requires_grad=True) for a in (x, z, scale, bias))
    yt = torch.relu(torch.nn.functional.batch_norm(xt, None, None, st, bt, True, 0.1, 1e-5) + zt)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    for got, want in ((dx, xt), (dz, zt), (ds, st), (db, bt)):
        np.testing.assert_allclose(got, want.grad.numpy(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("call, match", [
    (lambda x: B.batch_normalization_forward_training_ex(None, "spatial", "bn_add_activation", x, None, None, None,
                                                         0.1, None, None, 1e-5), "BN_ADD_ACTIVATION adds z"),
    (lambda x: B.batch_normalization_forward_training_ex(None, "spatial", "bn", x, x, None, None, 0.1, None, None,
                                                         1e-5), "z is only used by BN_ADD_ACTIVATION"),
    (lambda x: B.batch_normalization_forward_training_ex(None, "spatial", "bn_relu", x, None, None, None, 0.1, None,
                                                         None, 1e-5), "unknown bn_ops 'bn_relu'"),
    (lambda x: B.batch_normalization_forward_training_ex(None, "spatial", "bn_activation", x, None, np.ones(3), None,
                                                         0.1, None, None, 1e-5), "scale has shape"),
    (lambda x: B.batch_normalization_forward_training_ex(None, "spatial", "bn_activation", x, None, None, None, 1.5,
                                                         None, None, 1e-5), "exponential_average_factor=1.5"),
    (lambda x: B.batch_normalization_backward_ex(None, "spatial", "bn_activation", x, None, x, None, np.zeros(2),
                                                 np.ones(2), 1e-5), "needs y, the forward's output"),
])
def test_fused_batch_norm_bad_input(call, match):
    with pytest.raises(B.BadParamError, match=match):
        call(np.zeros((3, 2, 2, 2)))
