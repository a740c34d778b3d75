"""The NumPy fast pooling (backend/pooling_cpu.py) against the reference tap loop in pooling.py: forward values
and argmax (first maximum on ties, NaN wins), backward with and without the stored argmax, every mode, 1-D to 3-D,
padding, ceil_mode, overlapping windows (reference backward) and NHWC."""
import numpy as np
import pytest

from minidnn import backend as B
from minidnn.backend import pooling_cpu

CASES = [  # x shape, window, padding, stride, ceil_mode
    ((2, 3, 8, 8), 2, 0, None, False),
    ((2, 3, 9, 7), 2, 0, None, False),            # odd sizes: the last row/column is dropped
    ((2, 3, 9, 7), 2, 1, None, True),             # padding and ceil_mode
    ((2, 2, 10, 10), 3, 1, 2, False),             # overlapping windows (backward via the reference)
    ((2, 2, 11, 10), (3, 2), (1, 0), (3, 2), True),
    ((2, 2, 12), 3, 1, 3, False),                 # 1-D
    ((1, 2, 4, 6, 6), 2, 0, None, False),         # 3-D
    ((2, 2, 8, 8), 2, 0, 3, False),               # stride > window: gaps between windows
    ((2, 3, 5, 5), 1, 0, None, False),            # 1x1 windows: one tap, argmax 0
]
MODES = list(B.PoolingMode)


def _reference(fn, *args, **kwargs):
    saved = list(B.pooling.FAST_PATHS)
    B.pooling.FAST_PATHS.clear()
    try:
        return fn(*args, **kwargs)
    finally:
        B.pooling.FAST_PATHS[:] = saved


def _input(shape, rng, ties):
    x = rng.standard_normal(shape)
    if ties:                              # many equal values: the first maximum must win
        x = np.round(x)
        x.flat[::7] = np.nan
    return x


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"], autouse=True)
def threads(request, monkeypatch):
    """The fast forms share the batch out between minidnn's threads: same results with 1 or 2 (the test arrays are
    far below the size that is worth a thread: the threshold is lifted here so the 2-thread runs really split)."""
    import minidnn.backend.threads
    monkeypatch.setattr(minidnn.backend.threads, "MIN_PARALLEL_WORK", 0)
    import minidnn
    before = minidnn.backend.threads._current[0]
    minidnn.set_num_threads(request.param)
    yield request.param
    minidnn.set_num_threads(before or 1)


@pytest.mark.parametrize("mode, ties", [(m, False) for m in MODES] + [(m, True) for m in MODES if m.is_max])
@pytest.mark.parametrize("case", CASES)
def test_fast_pooling_matches_reference(case, mode, ties):          # ties and NaN only matter for max
    shape, window, padding, stride, ceil_mode = case
    rng = np.random.default_rng(5)
    desc = B.PoolingDescriptor(mode, window, padding, stride, ceil_mode)
    x = _input(shape, rng, ties)
    if mode.is_max:
        y, arg = B.pooling_forward(None, desc, x, return_argmax=True)
        y_ref, arg_ref = _reference(B.pooling_forward, None, desc, x, return_argmax=True)
        np.testing.assert_array_equal(arg, arg_ref)
        assert arg.dtype == arg_ref.dtype
    else:
        y = B.pooling_forward(None, desc, x)
        y_ref = _reference(B.pooling_forward, None, desc, x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    dx = B.pooling_backward(None, desc, y, dy, x)
    dx_ref = _reference(B.pooling_backward, None, desc, y, dy, x)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-12, atol=1e-12)
    if mode.is_max:
        np.testing.assert_allclose(B.pooling_backward(None, desc, y, dy, x, argmax=arg), dx_ref, rtol=1e-12, atol=1e-12)


def test_fast_pooling_nhwc_and_blending():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 6, 3)).astype(np.float32)        # NHWC
    desc = B.PoolingDescriptor("max", 2)
    y0 = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    y = B.pooling_forward(None, desc, x, alpha=2.0, beta=0.5, y=y0.copy(), format="NHWC")
    y_ref = _reference(B.pooling_forward, None, desc, x, alpha=2.0, beta=0.5, y=y0.copy(), format="NHWC")
    np.testing.assert_allclose(y, y_ref, rtol=1e-6)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx = B.pooling_backward(None, desc, y, dy, x, format="NHWC")
    np.testing.assert_allclose(dx, _reference(B.pooling_backward, None, desc, y, dy, x, format="NHWC"), rtol=1e-6)


def test_which_cases_the_fast_form_takes():
    x = np.zeros((1, 1, 8, 8))
    geom = lambda mode, *args: B.pooling._Geometry(B.PoolingDescriptor(mode, *args), x.shape, "test")  # noqa: E731
    overlapping = geom("max", 3, 1, 2)
    assert pooling_cpu.applies_forward(overlapping, x) and pooling_cpu.applies_backward(overlapping, x)
    # average: forward is the reference's tap sum; backward fast only without overlapping windows
    avg = "average_count_include_padding"
    assert not pooling_cpu.applies_forward(geom(avg, 2), x) and pooling_cpu.applies_backward(geom(avg, 2), x)
    assert not pooling_cpu.applies_backward(geom(avg, 3, 1, 2), x)


@pytest.mark.parametrize("shape, window, fmt", [((4, 3, 16, 16), 2, "NCHW"), ((3, 2, 9, 7), 2, "NCHW"),
                                                ((2, 3, 8, 8), 3, "NCHW"), ((2, 6, 6, 3), 2, "NHWC"),
                                                ((2, 2, 12), 2, "NCHW")])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_short_row_planes_are_bitwise_the_strided_taps(shape, window, fmt, dtype, monkeypatch):
    """Short window rows go through contiguous per-thread tap planes: maxima (signed zeros included) and argmax (ties,
    NaN) bitwise those of the strided tap slices (today's form, _SHORT_RUN = -1), the argmax the reference's; the
    planes are reused across calls of changing shape and dtype."""
    rng = np.random.default_rng(3)
    desc = B.PoolingDescriptor("max", window)
    for variant in range(3):
        x = rng.choice(np.array([0.0, -0.0, 1.0, -1.0]), shape).astype(dtype)     # ties everywhere, +-0 among them
        if variant == 1:
            x.flat[::5] = np.nan
        elif variant == 2:
            x = rng.standard_normal(shape).astype(dtype)
        y, arg = B.pooling_forward(None, desc, x, return_argmax=True, format=fmt)
        with monkeypatch.context() as m:
            m.setattr(pooling_cpu, "_SHORT_RUN", -1)
            y_strided, arg_strided = B.pooling_forward(None, desc, x, return_argmax=True, format=fmt)
        assert y.tobytes() == y_strided.tobytes() and arg.tobytes() == arg_strided.tobytes()
        y_ref, arg_ref = _reference(B.pooling_forward, None, desc, x, return_argmax=True, format=fmt)
        np.testing.assert_array_equal(y, y_ref)
        assert arg.tobytes() == arg_ref.tobytes() and arg.dtype == arg_ref.dtype


PAIRS_CASES = [(4, 3, 16, 16), (64, 16, 10, 10), (3, 5, 2, 2), (2, 3, 6, 16), (5, 1, 4, 10), (1, 2, 8, 2)]


@pytest.mark.parametrize("shape", PAIRS_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pairs_form_matches_reference_and_general_form(shape, dtype, monkeypatch):
    """2x2 windows, stride 2, even sizes, out_w <= _PAIRS_MAX_OUT_W: _pairs_forward's maxima and argmax (ties with
    signed zeros, NaN windows, -inf) bitwise the general form's and the float64 reference's; chunks of one image
    (_PAIRS_CHUNK_BYTES 1) the same; backward from its argmax equal to the reference's."""
    rng = np.random.default_rng(11)
    desc = B.PoolingDescriptor("max", 2)
    calls = []
    real = pooling_cpu._pairs_forward
    monkeypatch.setattr(pooling_cpu, "_pairs_forward", lambda *a: calls.append(1) or real(*a))
    for variant in range(4):
        x = rng.choice(np.array([0.0, -0.0, 1.0, -1.0, -np.inf]), shape).astype(dtype)
        if variant == 1:
            x.flat[::5] = np.nan
        elif variant == 2:
            x = rng.standard_normal(shape).astype(dtype)
        elif variant == 3:
            x = np.full(shape, np.nan, dtype=dtype)
            x.flat[::3] = 2.0
        calls.clear()
        y, arg = B.pooling_forward(None, desc, x, return_argmax=True)
        assert calls, "the pairs form should take this case"
        with monkeypatch.context() as m:
            m.setattr(pooling_cpu, "_PAIRS_CHUNK_BYTES", 1)
            y1, arg1 = B.pooling_forward(None, desc, x, return_argmax=True)
        with monkeypatch.context() as m:
            m.setattr(pooling_cpu, "_PAIRS_ENABLED", [False])
            y_general, arg_general = B.pooling_forward(None, desc, x, return_argmax=True)
        assert y.tobytes() == y_general.tobytes() == y1.tobytes()
        assert arg.tobytes() == arg_general.tobytes() == arg1.tobytes() and arg.dtype == arg_general.dtype
        y_ref, arg_ref = _reference(B.pooling_forward, None, desc, x.astype(np.float64), return_argmax=True)
        np.testing.assert_array_equal(y, y_ref.astype(dtype))
        np.testing.assert_array_equal(arg, arg_ref)
        dy = rng.standard_normal(y.shape).astype(dtype)
        np.testing.assert_array_equal(B.pooling_backward(None, desc, y, dy, x, argmax=arg),
                                      _reference(B.pooling_backward, None, desc, y, dy, x))


@pytest.mark.parametrize("shape, kwargs", [((2, 3, 18, 18), {}),                    # out_w 9: past the rule
                                           ((2, 3, 9, 8), {}),                      # odd height
                                           ((2, 3, 8, 8), {"padding": 1}),
                                           ((2, 3, 8, 8), {"stride": 1}),
                                           ((2, 3, 8, 7), {"ceil_mode": True})])
def test_pairs_form_rule(shape, kwargs, monkeypatch):
    """Outside the rule (wider rows, odd sizes, padding, other strides, ceil_mode windows) the general form runs, and
    non-contiguous x too; inside it, the boundary out_w == _PAIRS_MAX_OUT_W takes the pairs form."""
    calls = []
    real = pooling_cpu._pairs_forward
    monkeypatch.setattr(pooling_cpu, "_pairs_forward", lambda *a: calls.append(1) or real(*a))
    x = np.random.default_rng(2).standard_normal(shape)
    desc = B.PoolingDescriptor("max", 2, kwargs.get("padding", 0), kwargs.get("stride"), kwargs.get("ceil_mode", False))
    y, arg = B.pooling_forward(None, desc, x, return_argmax=True)
    assert not calls
    y_ref, arg_ref = _reference(B.pooling_forward, None, desc, x, return_argmax=True)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(arg, arg_ref)
    boundary = np.random.default_rng(3).standard_normal((2, 3, 4, 2 * pooling_cpu._PAIRS_MAX_OUT_W))
    B.pooling_forward(None, B.PoolingDescriptor("max", 2), boundary, return_argmax=True)
    assert calls
    calls.clear()
    strided = np.random.default_rng(4).standard_normal((2, 3, 8, 16))[..., ::2]        # not C-contiguous
    y, arg = B.pooling_forward(None, B.PoolingDescriptor("max", 2), strided, return_argmax=True)
    assert not calls
    y_ref, arg_ref = _reference(B.pooling_forward, None, B.PoolingDescriptor("max", 2), strided, return_argmax=True)
    np.testing.assert_array_equal(arg, arg_ref)
