"""Channels-last batch-norm kernels (backend/cuda/bn_nhwc.py) on the GPU: every output against float64 references,
against the older channels-last kernels of bn_kernels, bit-for-bit repeatability and fused == unfused, launches
per call, the vector-width fallback, inference, running statistics over steps.  All marked cuda (skip without a
GPU).  Both routes (one launch and two launches per direction) run every case."""
import math
import zlib

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import bn_kernels as K
from minidnn.backend.cuda import bn_nhwc as M

pytestmark = pytest.mark.cuda

ROUTES = ["one", "two"]
TOL = {"float64": dict(rtol=1e-9, atol=1e-9), "float32": dict(rtol=1e-4, atol=1e-4),
       "float16": dict(rtol=1e-2, atol=1e-2), "bfloat16": dict(rtol=4e-2, atol=4e-2)}
# the brief's shapes, N=1, C=1, C=3, C=24, odd rows, 2-D, one value per plane, wide C (two column chunks)
SHAPES = [(128, 16, 32, 32), (128, 64, 8, 8), (1, 8, 5, 5), (4, 1, 7, 7), (5, 3, 9, 9), (8, 24, 7, 7),
          (3, 40, 13, 5), (7, 5), (9, 12, 1, 1), (2, 1040, 3, 3), (2, 6, 5, 3, 3)]
LARGE = (128, 64, 56, 56)


def _dtype(name):
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


@pytest.fixture(params=ROUTES)
def route(request, monkeypatch):
    monkeypatch.setattr(M, "ROUTE", request.param)
    return request.param


class Counted:
    def __enter__(self):
        from minidnn.backend.cuda import launch
        self.launch, self.start = launch, launch.launch_count()
        return self

    def __exit__(self, *exc):
        self.n = self.launch.launch_count() - self.start


def _h(a):
    return None if a is None else a.get().astype(np.float64)


def _cl(cp, a):
    """Channels-last copy of host array ``a`` on the GPU (2-D arrays as they are)."""
    if a is None:
        return None
    if a.ndim < 3:
        return cp.asarray(a)
    perm = (0, *range(2, a.ndim), 1)
    back = (0, a.ndim - 1, *range(1, a.ndim - 1))
    return cp.asarray(np.ascontiguousarray(a.transpose(perm))).transpose(back)


def _is_cl(a):
    return a.ndim < 3 or a.transpose((0, *range(2, a.ndim), 1)).flags.c_contiguous


def _close(got, want, name, scale=1.0):
    tol = TOL[name]
    np.testing.assert_allclose(_h(got), want, rtol=tol["rtol"], atol=tol["atol"] * scale)


def _data(name, shape, ops, seed):
    dt = _dtype(name)
    pdt = np.float64 if name == "float64" else np.float32
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = (rng.standard_normal(shape) * 1.5 + 3.0).astype(dt)     # |mean| > std: the shifted sums matter
    dy = rng.standard_normal(shape).astype(dt)
    z = rng.standard_normal(shape).astype(dt) if ops == "bn_add_activation" else None
    scale = rng.uniform(0.5, 1.5, c).astype(pdt)
    bias = rng.standard_normal(c).astype(pdt)
    rm, rv = rng.standard_normal(c).astype(pdt), rng.uniform(0.5, 2, c).astype(pdt)
    return x, dy, z, scale, bias, rm, rv


def _check(cp, name, shape, ops, route, seed=0):
    x, dy, z, scale, bias, rm, rv = _data(name, shape, ops, seed)
    c = shape[1]
    f, eps = 0.1, 1e-5
    f64 = np.float64
    x64, z64 = x.astype(f64), None if z is None else z.astype(f64)
    rm64, rv64 = rm.astype(f64), rv.astype(f64)
    y_ref, m_ref, i_ref = B.batch_normalization_forward_training_ex(None, "spatial", ops, x64, z64, scale.astype(f64),
                                                                    bias.astype(f64), f, rm64, rv64, eps)
    xg, zg, dyg = _cl(cp, x), _cl(cp, z), _cl(cp, dy)
    rmg, rvg, cnt = cp.asarray(rm), cp.asarray(rv), cp.zeros((1,), np.int64)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    relu = ops != "bn"
    with Counted() as c1:
        y, m, i = M.forward_training(xg, sg, bg, f, rmg, rvg, eps, z=zg, relu=relu, counter=cnt)
    assert c1.n == (1 if route == "one" else 2)
    assert y.shape == xg.shape and y.dtype == xg.dtype and _is_cl(y)
    _close(y, y_ref, name, 4)
    np.testing.assert_allclose(_h(m), m_ref, rtol=1e-5 if name != "float64" else 1e-12, atol=1e-5)
    np.testing.assert_allclose(_h(i), i_ref, rtol=1e-4 if name != "float64" else 1e-10)
    np.testing.assert_allclose(_h(rmg), rm64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_h(rvg), rv64, rtol=1e-4, atol=1e-6)
    assert int(cnt.get()[0]) == 1
    # backward from the GPU's own y (its ReLU mask) against the reference on the same values
    s64 = scale.astype(f64)
    if ops == "bn":
        dx_ref, ds_ref, db_ref = B.batch_normalization_backward(None, "spatial", x64, dy.astype(f64), s64, _h(m),
                                                                _h(i), eps)
        dz_ref = None
    else:
        dx_ref, dz_ref, ds_ref, db_ref = B.batch_normalization_backward_ex(
            None, "spatial", ops, x64, _h(y), dy.astype(f64), s64, _h(m), _h(i), eps)
    with Counted() as c2:
        dx, dz, ds, db = M.backward(xg, dyg, sg, m, i, y=y if relu else None, want_dz=ops == "bn_add_activation")
    assert c2.n == (1 if route == "one" else 2)
    assert _is_cl(dx) and dx.dtype == xg.dtype
    count = x.size // c
    _close(dx, dx_ref, name, 4)
    np.testing.assert_allclose(_h(db), db_ref, rtol=1e-4, atol=TOL[name]["atol"] * math.sqrt(count))
    np.testing.assert_allclose(_h(ds), ds_ref, rtol=1e-4, atol=TOL[name]["atol"] * math.sqrt(count) * 4)
    if ops == "bn_add_activation":
        assert _is_cl(dz)
        np.testing.assert_array_equal(_h(dz), dz_ref)
    else:
        assert dz is None


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
def test_against_the_float64_reference(cp, route, name, shape, ops):
    _check(cp, name, shape, ops, route, seed=zlib.crc32(repr((name, shape, ops)).encode()))


@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_add_activation"])
def test_large_tensor_against_the_float64_reference(cp, route, name, ops):
    _check(cp, name, LARGE, ops, route)


@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(128, 16, 32, 32), (128, 64, 8, 8), (5, 3, 9, 9), (8, 24, 7, 7)], ids=str)
def test_against_the_older_channels_last_kernels(cp, route, name, shape, monkeypatch):
    x, dy, z, scale, bias, rm, rv = _data(name, shape, "bn_add_activation", 3)
    xg, zg, dyg = _cl(cp, x), _cl(cp, z), _cl(cp, dy)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    new = M.forward_training(xg, sg, bg, 0.1, None, None, 1e-5, z=zg, relu=True)
    new_b = M.backward(xg, dyg, sg, new[1], new[2], y=new[0], want_dz=True)
    monkeypatch.setattr(M, "ENABLED", False)        # bn_kernels' own kernels (its hook keys on bn_nhwc.switch())
    old = K.forward_training(xg, sg, bg, 0.1, None, None, 1e-5, z=zg, relu=True)
    old_b = K.backward(xg, dyg, sg, new[1], new[2], y=new[0], want_dz=True)
    tol = TOL[name]
    for a, b in zip(new, old):
        np.testing.assert_allclose(_h(a), _h(b), rtol=tol["rtol"], atol=tol["atol"])
    for a, b in zip(new_b, old_b):
        np.testing.assert_allclose(_h(a), _h(b), rtol=tol["rtol"], atol=tol["atol"] * math.sqrt(x.size // shape[1]))


def _bits(a, signed_zero=True):
    b = a.get().view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]).copy()
    if not signed_zero:
        b[b == b.dtype.type(1) << b.dtype.type(8 * a.dtype.itemsize - 1)] = 0
    return b


@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(32, 64, 28, 28), (8, 24, 33, 31), (128, 16, 32, 32), LARGE], ids=str)
def test_bitwise_repeatable_and_fused_equals_unfused(cp, route, name, shape):
    x, dy, z, scale, bias, rm, rv = _data(name, shape, "bn_add_activation", 1)
    xg, zg, dyg = _cl(cp, x), _cl(cp, z), _cl(cp, dy)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    runs = [M.forward_training(xg, sg, bg, 0.1, None, None, 1e-5, z=zg, relu=True) for _ in range(3)]
    for run in runs[1:]:
        for a, b in zip(run, runs[0]):
            np.testing.assert_array_equal(_bits(a), _bits(b))
    y, m, i = runs[0]
    fused = [M.backward(xg, dyg, sg, m, i, y=y, want_dz=True) for _ in range(2)]
    for f in fused[1:]:
        for a, b in zip(f, fused[0]):
            if a is not None:
                np.testing.assert_array_equal(_bits(a), _bits(b))
    g = B.activation_backward(None, B.ActivationDescriptor("relu"), y, dyg, y)
    plain = M.backward(xg, g, sg, m, i)
    dx, dz, ds, db = fused[0]
    # dz is +0 where y <= 0 (the reference's where), relu'(y) * dy is -0 for a negative dy: the sign of zero only
    np.testing.assert_array_equal(_bits(dz), _bits(g, signed_zero=False))
    for a, b in zip((dx, ds, db), (plain[0], plain[2], plain[3])):
        np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float64"])
def test_misaligned_pointers_take_narrower_vectors(cp, route, name):
    dt = _dtype(name)
    c, shape = 16, (4, 16, 6, 5)
    rng = np.random.default_rng(4)
    n = int(np.prod(shape))
    off = 1 if name == "float64" else 2     # 8 bytes (float32: 2-wide vectors; float64: scalars), 4 (bfloat16: 2)
    flat = cp.asarray((rng.standard_normal(n + off) + 2).astype(dt))
    xg = flat[off:].reshape(4, 6, 5, c).transpose(0, 3, 1, 2)
    assert xg.data.ptr % 16 != 0
    x64 = _h(xg)
    sg = cp.asarray(rng.uniform(0.5, 1.5, c).astype(np.float64 if name == "float64" else np.float32))
    y, m, i = M.forward_training(xg, sg, None, 0.1, None, None, 1e-5, relu=True)
    y_ref, m_ref, i_ref = B.batch_normalization_forward_training_ex(None, "spatial", "bn_activation", x64, None,
                                                                    _h(sg), None, 0.1, None, None, 1e-5)
    _close(y, y_ref, name, 4)
    np.testing.assert_allclose(_h(m), m_ref, rtol=1e-5, atol=1e-5)
    dx, dz, ds, db = M.backward(xg, xg, sg, m, i, y=y)
    dx_ref, _, ds_ref, _ = B.batch_normalization_backward_ex(None, "spatial", "bn_activation", x64, _h(y), x64,
                                                             _h(sg), _h(m), _h(i), 1e-5)
    _close(dx, dx_ref, name, 4)
    np.testing.assert_allclose(_h(ds), ds_ref, rtol=1e-3, atol=TOL[name]["atol"] * 30)


@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("ops", ["bn", "bn_activation", "bn_add_activation"])
def test_inference(cp, name, ops):
    x, dy, z, scale, bias, rm, rv = _data(name, (6, 24, 5, 7), ops, 5)
    f64 = np.float64
    want = B.batch_normalization_forward_inference_ex(None, "spatial", ops, x.astype(f64),
                                                      None if z is None else z.astype(f64), scale.astype(f64),
                                                      bias.astype(f64), rm.astype(f64), rv.astype(f64), 1e-5)
    with Counted() as c1:
        y = M.forward_inference(_cl(cp, x), cp.asarray(scale), cp.asarray(bias), cp.asarray(rm), cp.asarray(rv),
                                1e-5, z=_cl(cp, z), relu=ops != "bn")
    assert c1.n == 1 and _is_cl(y)
    _close(y, want, name, 4)


def test_running_statistics_and_counter_over_steps(cp, route):
    rng = np.random.default_rng(6)
    c = 24
    rm, rv = np.zeros(c), np.ones(c)
    rmg, rvg = cp.zeros(c, np.float32), cp.ones(c, np.float32)
    cnt = cp.zeros((1,), np.int64)
    for step in range(10):
        x = (rng.standard_normal((16, c, 9, 7)) * (1 + step) + step).astype(np.float32)
        M.forward_training(_cl(cp, x), None, None, 0.1, rmg, rvg, 1e-5, counter=cnt)
        B.batch_normalization_forward_training(None, "spatial", x.astype(np.float64), None, None, 0.1, rm, rv, 1e-5)
    np.testing.assert_allclose(_h(rmg), rm, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_h(rvg), rv, rtol=1e-4)
    assert int(cnt.get()[0]) == 10


def test_primitives_route_channels_last_calls_here(cp):
    # the hook in bn_kernels (its settled calls key on bn_nhwc.switch()): a channels-last primitive call settles a
    # call object of this module; MINIDNN_BN_NHWC=0 (ENABLED False) does not
    if not hasattr(K, "_nhwc"):
        pytest.skip("bn_kernels has no channels-last hook (bn_nhwc is reached directly only)")
    x = _cl(cp, np.random.default_rng(7).standard_normal((4, 16, 6, 6)).astype(np.float32))
    s, b = cp.ones(16, np.float32), cp.zeros(16, np.float32)
    M._calls.clear()
    K._calls.clear()        # bn_kernels' settled calls would hand back objects made by earlier tests
    y, m, i = B.batch_normalization_forward_training(None, "spatial", x, s, b, 0.1, None, None, 1e-5)
    B.batch_normalization_backward(None, "spatial", x, y, s, m, i, 1e-5)
    kinds = sorted(k[0] for k in M._calls)
    assert kinds == ["BackwardCall", "TrainingCall"], kinds
    assert _is_cl(y)


@pytest.mark.parametrize("name", ["float32", "bfloat16"])
def test_captured_in_a_cuda_graph_gives_the_eager_bits(cp, route, name):
    # nothing read back to the host, counters reset by the kernels: a captured forward + backward replays to the
    # same bits as the eager calls (same plans, same splits)
    x, dy, z, scale, bias, rm, rv = _data(name, (16, 24, 10, 10), "bn_add_activation", 8)
    xg, zg, dyg = _cl(cp, x), _cl(cp, z), _cl(cp, dy)
    sg, bg = cp.asarray(scale), cp.asarray(bias)

    def step():
        y, m, i = M.forward_training(xg, sg, bg, 0.1, None, None, 1e-5, z=zg, relu=True)
        return (y, m, i) + M.backward(xg, dyg, sg, m, i, y=y, want_dz=True)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        eager = step()
        s.synchronize()
        s.begin_capture()
        captured = step()
        g = s.end_capture()
        for _ in range(2):
            g.launch(s)
        s.synchronize()
    for a, b in zip(captured, eager):
        if a is not None:
            np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(128, 16, 32, 32), (128, 128, 8, 8), (5, 3, 9, 9), (8, 24, 7, 7), (7, 5),
                                   (2, 1040, 3, 3)], ids=str)
def test_v2_against_v1_and_the_reference(cp, route, name, shape, monkeypatch):
    # session 7's block reduction and combine (V2, the default) against session 6's (MINIDNN_BN_NHWC_V2=0): the
    # same sums in another fixed order, so equal within rounding; both against float64 with a fused add + ReLU
    x, dy, z, scale, bias, rm, rv = _data(name, shape, "bn_add_activation", 9)
    xg, zg, dyg = _cl(cp, x), _cl(cp, z), _cl(cp, dy)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    out = {}
    for v2 in (False, True):
        monkeypatch.setattr(M, "V2", v2)
        rmg, rvg = cp.asarray(rm), cp.asarray(rv)
        with Counted() as c1:
            y, m, i = M.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, z=zg, relu=True)
            dx, dz, ds, db = M.backward(xg, dyg, sg, m, i, y=y, want_dz=True)
        assert c1.n == (2 if route == "one" else 4)
        out[v2] = [_h(a) for a in (y, m, i, dx, dz, ds, db, rmg, rvg)]
    tol = TOL[name]
    count = x.size // shape[1]
    for k, (a, b) in enumerate(zip(out[False], out[True])):
        atol = tol["atol"] * (math.sqrt(count) * 4 if k >= 5 and k < 7 else 1)
        np.testing.assert_allclose(b, a, rtol=tol["rtol"], atol=atol, err_msg=str(k))
    monkeypatch.setattr(M, "V2", True)
    _check(cp, name, shape, "bn_add_activation", route, seed=9)


# (few kernel variants: each case compiles its forward and backward twice, and the GPU budget counts NVRTC time)
STAGE_CASES = [("bfloat16", (128, 16, 32, 32), "bn"), ("bfloat16", (128, 16, 32, 32), "bn_activation"),
               ("bfloat16", (128, 128, 8, 8), "bn_activation"), ("bfloat16", (8, 24, 7, 7), "bn_add_activation"),
               ("bfloat16", (2, 1040, 3, 3), "bn_add_activation"), ("bfloat16", (5, 3, 9, 9), "bn"),
               ("float32", (128, 16, 32, 32), "bn"), ("float32", (8, 24, 7, 7), "bn_add_activation"),
               ("float32", (2, 1040, 3, 3), "bn_add_activation")]


@pytest.mark.parametrize("name, shape, ops", STAGE_CASES, ids=str)
def test_staged_constants_give_the_same_bits(cp, name, shape, ops, monkeypatch):
    # the one-launch kernels' constants after the meeting through shared memory (STAGE, the default) against each
    # thread loading its own (MINIDNN_BN_NHWC_STAGE=0): the same values, so the same bits in every output; and the
    # staged forward + backward against float64 (fused ReLU, add + ReLU; tails: C = 3 / 24, 392 rows; C = 1040:
    # 130 vectors a row in bfloat16 (the staging loop's 5 rounds), two column chunks in float32)
    monkeypatch.setattr(M, "ROUTE", "one")
    x, dy, z, scale, bias, rm, rv = _data(name, shape, ops, 11)
    xg, zg, dyg = _cl(cp, x), _cl(cp, z), _cl(cp, dy)
    sg, bg = cp.asarray(scale), cp.asarray(bias)
    relu = ops != "bn"
    out = {}
    for stage in (False, True):
        monkeypatch.setattr(M, "STAGE", stage)
        rmg, rvg, cnt = cp.asarray(rm), cp.asarray(rv), cp.zeros((1,), np.int64)
        with Counted() as c1:
            y, m, i = M.forward_training(xg, sg, bg, 0.1, rmg, rvg, 1e-5, z=zg, relu=relu, counter=cnt)
            dx, dz, ds, db = M.backward(xg, dyg, sg, m, i, y=y if relu else None, want_dz=ops == "bn_add_activation")
        assert c1.n == 2
        out[stage] = [a for a in (y, m, i, dx, dz, ds, db, rmg, rvg, cnt) if a is not None]
    for k, (a, b) in enumerate(zip(out[False], out[True])):
        np.testing.assert_array_equal(_bits(b), _bits(a), err_msg=str(k))
    _check(cp, name, shape, ops, "one", seed=11)
