"""The seen-call shortcuts of layer norm, group norm, cross-entropy and softmax on the GPU (backend/normalization.py
_NORM_SEEN, backend/softmax.py _CE_SEEN / _SEEN; docs/host_overhead.md round 18): for each primitive, the validated
call (shortcuts off), the first call with them on (validated and remembered) and two cached calls give the same bits
and the same number of launches; the cached calls reach no check; a misaligned x of a seen signature gives the full
path's bits (the kernel module picks its variant per call); the values agree with a float64 reference; bad input
after cached calls still raises."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda
if not _dev.cuda_is_available():
    pytest.skip("needs a GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402
import ml_dtypes  # noqa: E402

import minidnn.backend as B  # noqa: E402
from minidnn.backend import normalization as NM  # noqa: E402
from minidnn.backend import softmax as SM  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
          "float16": np.dtype(np.float16)}


def _bits(r):
    if r is None:
        return None
    if isinstance(r, tuple):
        return tuple(_bits(a) for a in r)
    a = cp.asnumpy(r)
    return (a.shape, str(a.dtype), a.tobytes())


@pytest.fixture
def counted(monkeypatch):
    """Counts the full path's calls of ``begin`` in both modules."""
    n = [0]
    for mod in (NM, SM):
        real = mod.begin

        def begin(*a, _real=real, **k):
            n[0] += 1
            return _real(*a, **k)
        monkeypatch.setattr(mod, "begin", begin)
    return n


def _same_with_and_without(counted, f, checks=(1, 1, 0, 0)):
    """f() with the shortcuts off, then on (validated, then cached twice): the same bits and launches each time, and
    ``checks`` full-path calls (softmax has no switch: its first call is remembered, (1, 0, 0, 0))."""
    NM._NORM_SEEN.clear()
    SM._CE_SEEN.clear()
    SM._SEEN.clear()
    runs = []
    try:
        for on in (False, True, True, True):
            NM.SEEN_ON[0] = SM.SEEN_ON[0] = on
            counted[0] = 0
            before = L.launch_count()
            r = f()
            cp.cuda.Device().synchronize()
            runs.append((_bits(r), L.launch_count() - before, counted[0]))
    finally:
        NM.SEEN_ON[0] = SM.SEEN_ON[0] = True
    assert all(r[0] == runs[0][0] for r in runs[1:])
    assert all(r[1] == runs[0][1] and r[1] >= 1 for r in runs)
    assert tuple(r[2] for r in runs) == checks
    return f()


def _arr(rng, shape, dt):
    return cp.asarray(rng.standard_normal(shape).astype(np.float32).astype(dt))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape, k", [((512, 1024), 1), ((64, 40), 1), ((4, 6, 8, 16), 2)])
def test_layer_norm(counted, dtype, shape, k):
    dt = DTYPES[dtype]
    rng = np.random.default_rng(len(shape) + k)
    x, dy = _arr(rng, shape, dt), _arr(rng, shape, dt)
    s, b = _arr(rng, shape[len(shape) - k:], np.float32), _arr(rng, shape[len(shape) - k:], np.float32)
    y, m, r = _same_with_and_without(counted, lambda: B.layer_normalization_forward(None, x, s, b, k, 1e-5))
    _same_with_and_without(counted, lambda: B.layer_normalization_forward(None, x, None, None, k, 1e-5))
    _same_with_and_without(counted, lambda: B.layer_normalization_backward(None, x, dy, s, m, r, k))
    _same_with_and_without(counted, lambda: B.layer_normalization_backward(None, x, dy, None, m, r, k))
    # the values themselves, against float64
    x64 = cp.asnumpy(x).astype(np.float64)
    axes = tuple(range(len(shape) - k, len(shape)))
    mu, var = x64.mean(axis=axes, keepdims=True), x64.var(axis=axes, keepdims=True)
    want = (x64 - mu) / np.sqrt(var + 1e-5) * cp.asnumpy(s) + cp.asnumpy(b)
    tol = 1e-4 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(cp.asnumpy(y).astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape, g", [((8, 64, 14, 14), 32), ((2, 6, 5, 5), 3)])
def test_group_norm(counted, dtype, shape, g):
    dt = DTYPES[dtype]
    rng = np.random.default_rng(g)
    x, dy = _arr(rng, shape, dt), _arr(rng, shape, dt)
    s, b = _arr(rng, shape[1], np.float32), _arr(rng, shape[1], np.float32)
    y, m, r = _same_with_and_without(counted, lambda: B.group_normalization_forward(None, x, g, s, b, 1e-5))
    _same_with_and_without(counted, lambda: B.group_normalization_backward(None, x, dy, g, s, m, r))
    _same_with_and_without(counted, lambda: B.group_normalization_backward(None, x, dy, g, None, m, r))
    x64 = cp.asnumpy(x).astype(np.float64).reshape(shape[0], g, -1)
    xh = ((x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)).reshape(shape)
    cshape = (1, -1) + (1,) * (len(shape) - 2)
    want = xh * cp.asnumpy(s).reshape(cshape) + cp.asnumpy(b).reshape(cshape)
    tol = 1e-4 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(cp.asnumpy(y).astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(1024, 1000), (128, 10)])
@pytest.mark.parametrize("opts", [{}, dict(weight=True, ignore_index=3, label_smoothing=0.1, reduction="none"),
                                  dict(label_smoothing=0.2, reduction="sum")])
def test_cross_entropy(counted, dtype, shape, opts):
    dt = DTYPES[dtype]
    rng = np.random.default_rng(shape[0])
    x = _arr(rng, shape, dt)
    t = cp.asarray(rng.integers(0, shape[1], shape[0]))
    kw = dict(opts)
    if kw.pop("weight", False):
        kw["weight"] = cp.asarray(rng.uniform(0.5, 2, shape[1]).astype(np.float32).astype(dt))
    loss, lse, den = _same_with_and_without(counted, lambda: B.softmax_cross_entropy_forward(None, x, t, **kw))
    g = cp.asarray(np.ones(loss.shape, dt))
    _same_with_and_without(counted, lambda: B.softmax_cross_entropy_backward(None, x, t, g, lse, den, **kw))
    # against float64 (PyTorch's definition, as the reference primitive computes it)
    x64 = cp.asnumpy(x).astype(np.float64)
    want = B.softmax_cross_entropy_forward(None, x64, cp.asnumpy(t),
                                           None if "weight" not in kw else cp.asnumpy(kw["weight"]).astype(np.float64),
                                           **{k: v for k, v in kw.items() if k != "weight"})[0]
    tol = 1e-4 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(cp.asnumpy(loss).astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("algo", ["log", "accurate"])
def test_softmax(counted, dtype, algo):
    rng = np.random.default_rng(1)
    x, dy = _arr(rng, (1024, 1000), DTYPES[dtype]), _arr(rng, (1024, 1000), DTYPES[dtype])
    y = _same_with_and_without(counted, lambda: B.softmax_forward(None, algo, None, x, axis=-1), (1, 0, 0, 0))
    _same_with_and_without(counted, lambda: B.softmax_backward(None, algo, None, y, dy, axis=-1), (1, 0, 0, 0))


def test_a_misaligned_x_of_a_seen_signature_gives_the_full_paths_bits(counted):
    rng = np.random.default_rng(5)
    buf = _arr(rng, (64 * 256 + 8,), np.float32)
    aligned, mis = buf[:64 * 256].reshape(64, 256), buf[1:64 * 256 + 1].reshape(64, 256)
    s = _arr(rng, (256,), np.float32)
    NM._NORM_SEEN.clear()
    NM.SEEN_ON[0] = False
    try:
        want = _bits(B.layer_normalization_forward(None, mis, s, s, 1, 1e-5))
    finally:
        NM.SEEN_ON[0] = True
    B.layer_normalization_forward(None, aligned, s, s, 1, 1e-5)      # remembered
    counted[0] = 0
    assert _bits(B.layer_normalization_forward(None, mis, s, s, 1, 1e-5)) == want
    assert counted[0] == 0


def test_bad_input_after_cached_calls_still_raises():
    rng = np.random.default_rng(2)
    x = _arr(rng, (32, 64), np.float32)
    s = _arr(rng, (64,), np.float32)
    t = cp.asarray(rng.integers(0, 64, 32))
    for _ in range(2):
        B.layer_normalization_forward(None, x, s, s, 1, 1e-5)
        B.softmax_cross_entropy_forward(None, x, t)
    with pytest.raises(B.BadParamError):
        B.layer_normalization_forward(None, x, _arr(rng, (63,), np.float32), s, 1, 1e-5)
    with pytest.raises(B.BadParamError):
        B.layer_normalization_forward(None, x, s, s, 1, -1.0)
    with pytest.raises(B.BadParamError):
        B.softmax_cross_entropy_forward(None, x, t, None, -100, 1.5)
    with pytest.raises(B.BadParamError):
        B.softmax_cross_entropy_forward(None, x, t[:31])
