"""Convolution: one table of configurations x every registered algorithm x every direction, against an
independent float64 reference; adjoint identities; blending; errors; selection/benchmark cache; PyTorch."""

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import (
    AlgoPerf,
    BadParamError,
    ConvolutionBwdFilterAlgo,
    ConvolutionDescriptor,
    ConvolutionFwdAlgo,
    ConvolutionMode,
    ConvolutionPreference,
    Determinism,
    Handle,
    MathType,
    NotSupportedError,
    Status,
    clear_convolution_algorithm_cache,
    convolution_algorithm_cache_info,
    convolution_backward_bias,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_forward,
    find_convolution_backward_data_algorithm,
    find_convolution_backward_filter_algorithm,
    find_convolution_forward_algorithm,
    get_convolution_algorithm_cache,
    get_convolution_backward_data_algorithm_v7,
    get_convolution_backward_filter_algorithm_v7,
    get_convolution_forward_algorithm_v7,
    get_convolution_forward_output_dim,
    get_convolution_forward_workspace_size,
    to_device,
)
from minidnn.backend._testing import to_numpy
from minidnn.backend.algorithm_selection import AlgorithmRegistry
from minidnn.backend.conv_algorithms import (
    BACKWARD_DATA_ALGORITHMS,
    BACKWARD_FILTER_ALGORITHMS,
    FORWARD_ALGORITHMS,
    ConvAlgorithm,
)
from minidnn.backend.conv_problem import make_problem

CC, CONV = ConvolutionMode.CROSS_CORRELATION, ConvolutionMode.CONVOLUTION


# ---- the configuration table --------------------------------------------------------------------------
# (id, x shape channels-first, w shape, padding, stride, dilation, groups, format, mode)
CONFIGS = [
    ("2d-basic", (2, 3, 7, 6), (4, 3, 3, 3), 1, 1, 1, 1, None, CC),
    ("2d-stride2-odd", (2, 3, 9, 7), (5, 3, 3, 2), (1, 0), 2, 1, 1, None, CC),
    ("2d-dilation2", (1, 2, 8, 9), (3, 2, 3, 3), 2, 1, 2, 1, None, CC),
    ("2d-groups2", (2, 4, 6, 7), (6, 2, 3, 3), 1, 1, 1, 2, None, CC),
    ("2d-depthwise", (2, 4, 5, 6), (4, 1, 3, 3), 1, 1, 1, 4, None, CC),
    ("2d-depthwise-x2-stride2", (2, 3, 7, 7), (6, 1, 3, 3), 1, 2, 1, 3, None, CC),
    ("2d-nhwc", (2, 3, 6, 5), (4, 3, 3, 3), 1, 1, 1, 1, "NHWC", CC),
    ("2d-nhwc-groups-stride2", (2, 4, 7, 8), (4, 2, 3, 3), 1, 2, 1, 2, "NHWC", CC),
    ("2d-convolution-mode", (2, 3, 6, 7), (4, 3, 3, 2), 1, 1, 1, 1, None, CONV),
    ("2d-conv-mode-winograd", (1, 2, 6, 5), (3, 2, 3, 3), 1, 1, 1, 1, None, CONV),
    ("2d-1x1", (2, 5, 4, 4), (3, 5, 1, 1), 0, 1, 1, 1, None, CC),
    ("2d-pad3-5x5", (1, 2, 5, 6), (2, 2, 5, 5), 3, 1, 1, 1, None, CC),
    ("2d-bigpad-3x3", (1, 2, 5, 4), (2, 2, 3, 3), 3, 1, 1, 1, None, CC),
    ("2d-batch0", (0, 3, 5, 5), (4, 3, 3, 3), 1, 1, 1, 1, None, CC),
    ("2d-size1", (1, 1, 1, 5), (1, 1, 1, 3), 0, 1, 1, 1, None, CC),
    ("1d-stride2-dil2", (2, 3, 11), (4, 3, 3), 2, 2, 2, 1, None, CC),
    ("1d-nwc-groups2", (2, 4, 9), (2, 2, 4), 1, 1, 1, 2, "NHWC", CONV),
    ("3d-basic", (1, 2, 4, 5, 4), (3, 2, 3, 3, 3), 1, 1, 1, 1, None, CC),
    ("3d-ndhwc-stride-groups-conv", (2, 4, 5, 4, 5), (4, 2, 2, 3, 2), (1, 0, 1), (2, 1, 2), 1, 2, "NHWC", CONV),
]
CONFIG_IDS = [c[0] for c in CONFIGS]

REGISTRIES = {"forward": FORWARD_ALGORITHMS, "backward_data": BACKWARD_DATA_ALGORITHMS,
              "backward_filter": BACKWARD_FILTER_ALGORITHMS}
ALGO_CASES = [(d, a.algo) for d, reg in REGISTRIES.items() for a in reg]
ALGO_IDS = [f"{d}-{a.name}" for d, a in ALGO_CASES]


def desc_of(cfg):
    _, _, _, pad, stride, dil, groups, _, mode = cfg
    return ConvolutionDescriptor(pad, stride, dil, groups, mode)


def to_fmt(a, fmt):
    """Channels-first NumPy array -> the index order of ``fmt`` (a contiguous copy for NHWC)."""
    return np.ascontiguousarray(np.moveaxis(a, 1, -1)) if fmt == "NHWC" else a


def from_fmt(a, fmt):
    return np.moveaxis(a, -1, 1) if fmt == "NHWC" else a


def fmt_shape(shape, fmt):
    return (shape[0], *shape[2:], shape[1]) if fmt == "NHWC" else tuple(shape)


def on(device, *arrays):
    return [to_device(a, device) for a in arrays]


def cpu(a):
    return to_device(a, "cpu")


# ---- an independent float64 reference: gather every window with np.take, contract with einsum ---------------

def _geometry(x_shape, w_shape, pad, stride, dil):
    nd = len(x_shape) - 2
    t = [(v,) * nd if isinstance(v, int) else tuple(v) for v in (pad, stride, dil)]
    out = [(i + 2 * p - d * (r - 1) - 1) // s + 1 for i, r, p, s, d in zip(x_shape[2:], w_shape[2:], *t)]
    # idx[d][o, r] = the padded input position that output o sees through tap r
    idx = [o_[:, None] * s + np.arange(r)[None, :] * d
           for o_, r, s, d in zip(map(np.arange, out), w_shape[2:], t[1], t[2])]
    return nd, t[0], out, idx


def _letters(nd):
    o, r = "opq"[:nd], "rst"[:nd]
    return o, r, "".join(a + b for a, b in zip(o, r))


def ref_forward(x, w, pad, stride, dil, groups, mode):
    nd, p, out, idx = _geometry(x.shape, w.shape, pad, stride, dil)
    if mode is CONV:
        w = w[(Ellipsis, *(slice(None, None, -1),) * nd)]
    win = np.pad(x, [(0, 0), (0, 0)] + [(q, q) for q in p])
    for d in range(nd):
        win = np.take(win, idx[d], axis=2 + 2 * d)          # (N, C, O1, R1, O2, R2, ...)
    N, C = x.shape[:2]
    K, G = w.shape[0], groups
    o, r, orr = _letters(nd)
    y = np.einsum(f"ngc{orr},gkc{r}->ngk{o}", win.reshape(N, G, C // G, *win.shape[2:]),
                  w.reshape(G, K // G, *w.shape[1:]))
    return y.reshape(N, K, *out)


def ref_backward_data(w, dy, x_shape, pad, stride, dil, groups, mode):
    nd, p, out, idx = _geometry(x_shape, w.shape, pad, stride, dil)
    if mode is CONV:
        w = w[(Ellipsis, *(slice(None, None, -1),) * nd)]
    N, C = x_shape[:2]
    K, G = w.shape[0], groups
    o, r, orr = _letters(nd)
    dwin = np.einsum(f"ngk{o},gkc{r}->ngc{orr}", dy.reshape(N, G, K // G, *out),
                     w.reshape(G, K // G, *w.shape[1:]))
    dwin = dwin.reshape(N, C, *[v for pair in zip(out, w.shape[2:]) for v in pair])
    dxpad = np.zeros((N, C, *[i + 2 * q for i, q in zip(x_shape[2:], p)]))
    index = []
    for d in range(nd):                                    # idx[d] placed on axes (2d, 2d+1) of the window
        shape = [1] * (2 * nd)
        shape[2 * d:2 * d + 2] = idx[d].shape
        index.append(idx[d].reshape(shape))
    np.add.at(dxpad, (slice(None), slice(None), *index), dwin)
    return dxpad[(slice(None), slice(None), *(slice(q, q + i) for q, i in zip(p, x_shape[2:])))]


def ref_backward_filter(x, dy, w_shape, pad, stride, dil, groups, mode):
    nd, p, out, idx = _geometry(x.shape, w_shape, pad, stride, dil)
    win = np.pad(x, [(0, 0), (0, 0)] + [(q, q) for q in p])
    for d in range(nd):
        win = np.take(win, idx[d], axis=2 + 2 * d)
    N, C = x.shape[:2]
    K, G = w_shape[0], groups
    o, r, orr = _letters(nd)
    dw = np.einsum(f"ngk{o},ngc{orr}->gkc{r}", dy.reshape(N, G, K // G, *out),
                   win.reshape(N, G, C // G, *win.shape[2:])).reshape(w_shape)
    if mode is CONV:
        dw = dw[(Ellipsis, *(slice(None, None, -1),) * nd)]
    return dw


def data(cfg, dtype=np.float64, seed=0):
    """x, w, dy (channels-first, NumPy) for a configuration."""
    _, x_shape, w_shape, pad, stride, dil, *_ = cfg
    rng = np.random.default_rng(seed)
    _, _, out, _ = _geometry(x_shape, w_shape, pad, stride, dil)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    dy = rng.standard_normal((x_shape[0], w_shape[0], *out)).astype(dtype)
    return x, w, dy


def run_direction(direction, handle, cfg, x, w, dy, **kw):
    """Call one primitive on channels-first NumPy data (converted to the config's format and device);
    returns the result channels-first on the CPU."""
    fmt = cfg[7]
    desc = desc_of(cfg)
    dev = handle.device
    if direction == "forward":
        xd, wd = on(dev, to_fmt(x, fmt), w)
        return from_fmt(cpu(convolution_forward(handle, xd, wd, desc, format=fmt, **kw)), fmt)
    if direction == "backward_data":
        wd, dyd = on(dev, w, to_fmt(dy, fmt))
        return from_fmt(cpu(convolution_backward_data(handle, wd, dyd, desc, fmt_shape(x.shape, fmt), format=fmt,
                                                      **kw)), fmt)
    xd, dyd = on(dev, to_fmt(x, fmt), to_fmt(dy, fmt))
    return cpu(convolution_backward_filter(handle, xd, dyd, desc, w.shape, format=fmt, **kw))


def reference(direction, cfg, x, w, dy):
    _, _, _, pad, stride, dil, groups, _, mode = cfg
    if direction == "forward":
        return ref_forward(x, w, pad, stride, dil, groups, mode)
    if direction == "backward_data":
        return ref_backward_data(w, dy, x.shape, pad, stride, dil, groups, mode)
    return ref_backward_filter(x, dy, w.shape, pad, stride, dil, groups, mode)


# ---- every algorithm x every direction x every configuration ------------------------------------------------

@pytest.mark.parametrize("direction,algo", ALGO_CASES, ids=ALGO_IDS)
@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
def test_algorithm_matches_reference(device, cfg, direction, algo):
    x, w, dy = data(cfg)
    handle = Handle(device)
    problem = make_problem("test", x.shape, w.shape, desc_of(cfg), x.dtype)
    if not REGISTRIES[direction].get(algo).supports(problem):
        with pytest.raises(NotSupportedError, match=algo.name):
            run_direction(direction, handle, cfg, x, w, dy, algo=algo)
        return
    got = run_direction(direction, handle, cfg, x, w, dy, algo=algo)
    want = reference(direction, cfg, x, w, dy)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_every_direction_has_three_real_algorithms_and_winograd_runs():
    """The table above really exercises GEMM, DIRECT, FFT and Winograd (not only NotSupported paths)."""
    cfg = CONFIGS[0]
    problem = make_problem("test", cfg[1], cfg[2], desc_of(cfg), np.float64)
    for registry in REGISTRIES.values():
        assert sum(a.supports(problem) for a in registry) == 4


@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
def test_adjoint_identities(device, cfg):
    """<conv(x), dy> == <x, backward_data(dy)> == <w, backward_filter(x, dy)> (all linear maps, float64)."""
    x, w, dy = data(cfg, seed=1)
    handle = Handle(device)
    y = run_direction("forward", handle, cfg, x, w, dy)
    dx = run_direction("backward_data", handle, cfg, x, w, dy)
    dw = run_direction("backward_filter", handle, cfg, x, w, dy)
    lhs = np.vdot(y, dy)
    assert np.isclose(lhs, np.vdot(x, dx), rtol=1e-10, atol=1e-10)
    assert np.isclose(lhs, np.vdot(w, dw), rtol=1e-10, atol=1e-10)


# ---- blending, bias, shapes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("direction", list(REGISTRIES))
def test_alpha_beta_blending(device, direction):
    cfg = CONFIGS[6]   # NHWC, so the output buffer is blended through a transposed view
    x, w, dy = data(cfg)
    handle = Handle(device)
    want = reference(direction, cfg, x, w, dy)
    fmt = None if direction == "backward_filter" else cfg[7]
    name = {"forward": "y", "backward_data": "dx", "backward_filter": "dw"}[direction]
    old = np.random.default_rng(5).standard_normal(want.shape)
    out = to_device(to_fmt(old, fmt).copy(), device)         # to_device does not copy on the CPU
    res = run_direction(direction, handle, cfg, x, w, dy, alpha=2.0, beta=0.5, **{name: out})
    np.testing.assert_allclose(res, 2.0 * want + 0.5 * old, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(from_fmt(cpu(out), fmt), res)             # written in place
    # beta == 0: the old contents are ignored, even NaN, and the given array is the one returned
    nan = to_device(np.full(to_fmt(old, fmt).shape, np.nan), device)
    res = run_direction(direction, handle, cfg, x, w, dy, alpha=3.0, **{name: nan})
    np.testing.assert_allclose(res, 3.0 * want, rtol=1e-10, atol=1e-10)
    assert not np.isnan(cpu(nan)).any()
    with pytest.raises(BadParamError, match=f"beta=0.5 blends into the existing {name}"):
        run_direction(direction, handle, cfg, x, w, dy, beta=0.5)


def test_forward_returns_the_given_y(device, xp):
    x, w, _ = data(CONFIGS[0])
    x, w = on(device, x, w)
    y = xp.empty((2, 4, 7, 6))
    assert convolution_forward(None, x, w, ConvolutionDescriptor(1), y=y) is y


@pytest.mark.parametrize("fmt", [None, "NHWC"])
def test_backward_bias(device, fmt):
    dy = np.random.default_rng(2).standard_normal((2, 5, 3, 4))
    want = dy.sum(axis=(0, 2, 3))
    handle = Handle(device)
    db = convolution_backward_bias(handle, to_device(to_fmt(dy, fmt), device), format=fmt)
    assert db.shape == (5,)
    np.testing.assert_allclose(cpu(db), want, rtol=1e-12)
    old = to_device(np.ones(5), device)
    res = convolution_backward_bias(handle, to_device(to_fmt(dy, fmt), device), alpha=2.0, beta=1.0, db=old,
                                    format=fmt)
    assert res is old
    np.testing.assert_allclose(cpu(res), 2 * want + 1, rtol=1e-12)
    with pytest.raises(BadParamError, match="db has shape"):
        convolution_backward_bias(handle, to_device(dy, device), db=to_device(np.ones(4), device))


def test_output_dim_and_nhwc_outputs_are_contiguous(device):
    desc = ConvolutionDescriptor(padding=1, stride=2)
    assert get_convolution_forward_output_dim(desc, (2, 3, 9, 8), (4, 3, 3, 3)) == (2, 4, 5, 4)
    assert get_convolution_forward_output_dim(desc, (2, 9, 8, 3), (4, 3, 3, 3), format="NHWC") == (2, 5, 4, 4)
    x, w = on(device, np.ones((2, 9, 8, 3)), np.ones((4, 3, 3, 3)))
    y = convolution_forward(None, x, w, desc, format="NHWC")
    assert y.shape == (2, 5, 4, 4) and y.flags.c_contiguous


def test_descriptor_is_immutable_hashable_and_dims_open_or_fixed():
    d = ConvolutionDescriptor(1, 2, 1, groups=2)
    assert d.spatial_dims is None and d == ConvolutionDescriptor(1, 2, 1, groups=2)
    assert hash(d) == hash(ConvolutionDescriptor(1, 2, 1, groups=2))
    with pytest.raises(AttributeError):
        d.padding = 3
    assert ConvolutionDescriptor((1, 2), 1, 1).spatial_dims == 2
    assert d.resolve(3) == ((1, 1, 1), (2, 2, 2), (1, 1, 1))


# ---- errors: before any computation, naming values and rules ----------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(padding=-1), r"padding=-1 must be >= 0"),
    (dict(stride=0), r"stride=0 must be >= 1"),
    (dict(dilation=(1, 0)), r"dilation=\(1, 0\) must be >= 1"),
    (dict(groups=0), r"groups=0 must be >= 1"),
    (dict(padding=(1, 1), stride=(1, 1, 1)), r"disagree on the number of spatial dims"),
    (dict(mode="sideways"), r"mode='sideways' must be a ConvolutionMode"),
])
def test_descriptor_errors(kwargs, match):
    with pytest.raises(BadParamError, match=match):
        ConvolutionDescriptor(**kwargs)


F32, F64 = np.float32, np.float64


@pytest.mark.parametrize("x_shape,w_shape,desc,match", [
    ((2, 8, 9, 9), (64, 4, 5, 5), ConvolutionDescriptor(),
     r"convolution_forward: x has 8 channels but w \(64, 4, 5, 5\) with groups=1 expects 4"),
    ((2, 4, 5, 5), (6, 1, 3, 3), ConvolutionDescriptor(groups=4), r"K=6 output channels, which groups=4 does not"),
    ((2, 6, 5, 5), (4, 1, 3, 3), ConvolutionDescriptor(groups=4), r"x has 6 channels, which groups=4 does not"),
    ((1, 1, 4, 4), (1, 1, 3, 3), ConvolutionDescriptor(dilation=2),
     r"dilated kernel spans 5 \(kernel 3, dilation 2\) but the padded input has only 4"),
    ((1, 1, 4, 4), (1, 1, 3), ConvolutionDescriptor(), r"x \(1, 1, 4, 4\) is 4-D but w \(1, 1, 3\) is 3-D"),
    ((1, 1, 4), (1, 1, 3), ConvolutionDescriptor((1, 1)), r"fixes 2 spatial dims but x \(1, 1, 4\) has 1"),
    ((1, 1), (1, 1), ConvolutionDescriptor(), r"x has shape \(1, 1\) \(2-D\) but must be 3-D, 4-D or 5-D"),
])
def test_shape_errors(x_shape, w_shape, desc, match):
    with pytest.raises(BadParamError, match=match):
        convolution_forward(None, np.zeros(x_shape), np.zeros(w_shape), desc)


def test_dtype_and_output_buffer_errors():
    d = ConvolutionDescriptor(1)
    x, w, dy = np.zeros((1, 2, 5, 5), F32), np.zeros((3, 2, 3, 3), F32), np.zeros((1, 3, 5, 5), F32)
    with pytest.raises(BadParamError, match="x has dtype float32 but w has dtype float64"):
        convolution_forward(None, x, w.astype(F64), d)
    with pytest.raises(BadParamError, match="w has dtype float32 but dy has dtype float64"):
        convolution_backward_data(None, w, dy.astype(F64), d, x.shape)
    with pytest.raises(BadParamError, match="x has dtype int64, but only floating-point"):
        convolution_forward(None, x.astype(np.int64), w.astype(np.int64), d)
    with pytest.raises(BadParamError, match=r"y has shape \(1, 3, 4, 4\) but the result has shape \(1, 3, 5, 5\)"):
        convolution_forward(None, x, w, d, y=np.zeros((1, 3, 4, 4), F32))
    with pytest.raises(BadParamError, match="dw has dtype float64 but the result has dtype float32"):
        convolution_backward_filter(None, x, dy, d, w.shape, dw=np.zeros(w.shape))
    with pytest.raises(BadParamError, match=r"dy has shape \(1, 3, 4, 4\) but the convolution of x \(1, 2, 5, 5\) "
                                            r"with w \(3, 2, 3, 3\) .* has output shape \(1, 3, 5, 5\)"):
        convolution_backward_filter(None, x, np.zeros((1, 3, 4, 4), F32), d, w.shape)
    with pytest.raises(BadParamError, match="algo='fast' is not a ConvolutionFwdAlgo"):
        convolution_forward(None, x, w, d, algo="fast")


def test_not_supported_names_algorithm_and_rule():
    x, w = np.zeros((1, 2, 6, 6)), np.zeros((3, 2, 3, 3))
    with pytest.raises(NotSupportedError, match=r"ConvolutionFwdAlgo.FFT cannot run .* supports only stride 1"):
        convolution_forward(None, x, w, ConvolutionDescriptor(stride=2), algo=ConvolutionFwdAlgo.FFT)
    with pytest.raises(NotSupportedError, match=r"IMPLICIT_GEMM .* not implemented in minidnn"):
        convolution_forward(None, x, w, ConvolutionDescriptor(), algo=ConvolutionFwdAlgo.IMPLICIT_GEMM)
    with pytest.raises(NotSupportedError, match=r"WINOGRAD_NONFUSED .* supports only 3x3 kernels"):
        convolution_backward_filter(None, x, np.zeros((1, 3, 6, 6)), ConvolutionDescriptor(), (3, 2, 1, 1),
                                    algo=ConvolutionBwdFilterAlgo.WINOGRAD_NONFUSED)


# ---- selection: heuristics, workspace, find, benchmark cache, determinism, math type -----------------------

SEL_X, SEL_W, SEL_DY = (2, 4, 8, 8), (4, 4, 3, 3), (2, 4, 8, 8)


def test_heuristic_ranks_usable_first():
    d = ConvolutionDescriptor(1)
    perfs = get_convolution_forward_algorithm_v7(None, SEL_X, SEL_W, d)
    assert all(isinstance(p, AlgoPerf) for p in perfs) and {p.algo for p in perfs} == set(ConvolutionFwdAlgo)
    ok = [p for p in perfs if p.status is Status.SUCCESS]
    assert perfs[:len(ok)] == ok and len(ok) == 4 and all(p.time == -1.0 for p in perfs)
    assert get_convolution_forward_algorithm_v7(None, SEL_X, SEL_W, d, requested_algo_count=2) == perfs[:2]
    with pytest.raises(BadParamError, match="requested_algo_count must be a positive int, got 0"):
        get_convolution_forward_algorithm_v7(None, SEL_X, SEL_W, d, requested_algo_count=0)
    for get in (lambda: get_convolution_backward_data_algorithm_v7(None, SEL_W, SEL_DY, d, SEL_X),
                lambda: get_convolution_backward_filter_algorithm_v7(None, SEL_X, SEL_DY, d, SEL_W)):
        assert get()[0].status is Status.SUCCESS


def test_pre_v7_preference_queries_are_deprecated_aliases_of_the_v7_ranking():
    """cuDNN's history: the preference-based query (deprecated in cuDNN 7, removed in 8) beside the ranked _v7
    one.  The old names warn, name their replacement and removal release, and answer as they always did."""
    from minidnn.backend import versioning as V
    d = ConvolutionDescriptor(1)
    ranked = get_convolution_forward_algorithm_v7(None, SEL_X, SEL_W, d)
    ok = [p for p in ranked if p.status is Status.SUCCESS]
    with pytest.warns(DeprecationWarning, match=r"get_convolution_forward_algorithm is deprecated since minidnn 0\.1 "
                                                r"and will be removed in minidnn 0\.3\.0; use "
                                                r"get_convolution_forward_algorithm_v7 instead") as rec:
        fastest = B.get_convolution_forward_algorithm(None, SEL_X, SEL_W, d)
    assert rec[0].filename == __file__
    assert fastest == ranked
    with pytest.warns(DeprecationWarning):
        least = B.get_convolution_forward_algorithm(None, SEL_X, SEL_W, d, ConvolutionPreference.NO_WORKSPACE)[0]
    assert least.memory == min(p.memory for p in ok)
    limit = sorted(p.memory for p in ok)[1]
    with pytest.warns(DeprecationWarning):
        limited = B.get_convolution_forward_algorithm(None, SEL_X, SEL_W, d,
                                                      ConvolutionPreference.SPECIFY_WORKSPACE_LIMIT,
                                                      workspace_limit=limit)
    assert sum(p.status is Status.SUCCESS for p in limited) == sum(p.memory <= limit for p in ok)
    assert all(p.memory <= limit for p in limited if p.status is Status.SUCCESS)
    over = [p for p in limited if p.status is not Status.SUCCESS and p.memory > limit and p in ok] or \
        [p for p in limited if "workspace_limit is" in p.reason]
    assert over and all(f"but workspace_limit is {limit}" in p.reason for p in over)
    with pytest.warns(DeprecationWarning, match="get_convolution_backward_data_algorithm_v7"):
        B.get_convolution_backward_data_algorithm(None, SEL_W, SEL_DY, d, SEL_X)
    with pytest.warns(DeprecationWarning, match="get_convolution_backward_filter_algorithm_v7"):
        B.get_convolution_backward_filter_algorithm(None, SEL_X, SEL_DY, d, SEL_W)
    assert {V.DEPRECATIONS[n].new_name for n in ("get_convolution_forward_algorithm",
                                                 "get_convolution_backward_data_algorithm",
                                                 "get_convolution_backward_filter_algorithm")} == {
        "get_convolution_forward_algorithm_v7", "get_convolution_backward_data_algorithm_v7",
        "get_convolution_backward_filter_algorithm_v7"}


def test_workspace_size_and_workspace_limit(device):
    d = ConvolutionDescriptor(1)
    assert get_convolution_forward_workspace_size(None, SEL_X, SEL_W, d, ConvolutionFwdAlgo.GEMM) > 0
    with pytest.raises(NotSupportedError, match="stride 1"):
        get_convolution_forward_workspace_size(None, SEL_X, SEL_W, ConvolutionDescriptor(1, 2), ConvolutionFwdAlgo.FFT)
    x, w = on(device, np.ones(SEL_X), np.ones(SEL_W))
    with pytest.raises(NotSupportedError, match="handle.workspace_limit is 0"):
        convolution_forward(Handle(device, workspace_limit=0), x, w, d)


@pytest.mark.parametrize("direction", list(REGISTRIES))
def test_find_returns_results_sorted_by_time(device, direction):
    cfg = ("sel", SEL_X, SEL_W, 1, 1, 1, 1, None, CC)
    x, w, dy = (to_device(a, device) for a in data(cfg, F32))
    d, h = desc_of(cfg), Handle(device)
    perfs = {"forward": lambda: find_convolution_forward_algorithm(h, x, w, d, repeats=1),
             "backward_data": lambda: find_convolution_backward_data_algorithm(h, w, dy, d, SEL_X, repeats=1),
             "backward_filter": lambda: find_convolution_backward_filter_algorithm(h, x, dy, d, SEL_W, repeats=1),
             }[direction]()
    ok = [p for p in perfs if p.status is Status.SUCCESS]
    # the four reference algorithms succeed everywhere; the GPU adds its own kernels (implicit GEMM forward,
    # ALGO_3 filter), which may succeed too; successes come first
    names = {p.algo.name for p in ok}
    reference = {"forward": {"GEMM", "DIRECT", "FFT", "WINOGRAD_NONFUSED"},
                 "backward_data": {"ALGO_0", "ALGO_1", "FFT", "WINOGRAD_NONFUSED"},
                 "backward_filter": {"ALGO_0", "ALGO_1", "FFT", "WINOGRAD_NONFUSED"}}[direction]
    status = [(p.algo.name, p.status.name) for p in perfs]
    assert (names == reference if device == "cpu" else names >= reference), status
    assert perfs[:len(ok)] == ok, status
    assert [p.time for p in ok] == sorted(p.time for p in ok) and all(p.time >= 0 for p in ok)
    # on the GPU, backward-filter ALGO_3 is the atomic split-K form (non-deterministic, as cuDNN's): find times it
    # on a handle without `deterministic` and reports it so
    atomic = {("cuda", "backward_filter", "ALGO_3")}
    assert all((p.determinism is Determinism.DETERMINISTIC) != ((device, direction, p.algo.name) in atomic)
               and p.math_type is MathType.DEFAULT for p in ok), status
    assert all(p.reason for p in perfs[len(ok):]), status     # every failure says why


def test_benchmark_cache_is_hit_on_the_second_call(device, monkeypatch):
    calls = []
    real_find = FORWARD_ALGORITHMS.find
    monkeypatch.setattr(FORWARD_ALGORITHMS, "find", lambda *a, **k: calls.append(1) or real_find(*a, **k))
    clear_convolution_algorithm_cache()
    h = Handle(device, benchmark=True)
    x, w = on(device, np.ones(SEL_X, F32), np.ones(SEL_W, F32))
    d = ConvolutionDescriptor(1)
    y1 = convolution_forward(h, x, w, d)
    y2 = convolution_forward(h, x, w, d)
    assert len(calls) == 1
    assert convolution_algorithm_cache_info()["convolution_forward"] == (1, 1, 1)
    (key, perf), = get_convolution_algorithm_cache().items()
    assert key[0] == "convolution_forward" and perf.status is Status.SUCCESS
    np.testing.assert_allclose(cpu(y1), cpu(y2))
    convolution_forward(h, x[:1], w, d)                          # another shape: another find
    assert len(calls) == 2
    clear_convolution_algorithm_cache()
    assert get_convolution_algorithm_cache() == {}


def test_deterministic_flag_excludes_non_deterministic_algorithms(device):
    """The forward algorithms are all deterministic, so that registry loses none (the one non-deterministic member,
    backward-filter ALGO_3 on CUDA, is test_conv_wgrad_atomic.py's); the generic selector's exclusion is checked
    with a registry holding a non-deterministic stand-in."""
    h = Handle(device, deterministic=True)
    p = make_problem("test", SEL_X, SEL_W, ConvolutionDescriptor(1), np.float32)
    assert all(perf.status is Status.SUCCESS for perf in FORWARD_ALGORITHMS.heuristic(p, h, MathType.DEFAULT)[:4])
    registry = AlgorithmRegistry("toy", ConvolutionFwdAlgo)
    calls = []
    atomic = ConvAlgorithm(ConvolutionFwdAlgo.IMPLICIT_GEMM, lambda *a: calls.append(1), (), lambda p: 0,
                           lambda p, device_type: 0, nondeterministic_on=("cpu", "cuda"))
    registry.register(atomic)
    registry.register(ConvAlgorithm(ConvolutionFwdAlgo.GEMM, lambda *a: calls.append(2), (), lambda p: 1,
                                    lambda p, device_type: 1e9))
    assert registry.heuristic(p, Handle(device), MathType.DEFAULT)[0].algo is ConvolutionFwdAlgo.IMPLICIT_GEMM
    ranked = registry.heuristic(p, h, MathType.DEFAULT)
    assert ranked[0].algo is ConvolutionFwdAlgo.GEMM
    assert ranked[1].status is Status.NOT_SUPPORTED and "not deterministic" in ranked[1].reason
    assert [r.algo for r in registry.find(p, h, MathType.DEFAULT, lambda a: a.run(p, None, None), 1)
            if r.status is Status.SUCCESS] == [ConvolutionFwdAlgo.GEMM]
    with pytest.raises(NotSupportedError, match="not deterministic"):
        registry.require(ConvolutionFwdAlgo.IMPLICIT_GEMM, p, h)


def test_math_type(device):
    """TENSOR_OP allows TF32 on the GPU (results then close to, not equal to, fp32); the CPU falls back to DEFAULT."""
    cfg = CONFIGS[0]
    x, w, dy = data(cfg, F32)
    d = ConvolutionDescriptor(1, math_type=MathType.TENSOR_OP)
    h = Handle(device)
    perf = get_convolution_forward_algorithm_v7(h, x.shape, w.shape, d)[0]
    assert perf.math_type is (MathType.DEFAULT if device == "cpu" else MathType.TENSOR_OP)
    xd, wd = on(device, x, w)
    y = cpu(convolution_forward(h, xd, wd, d, algo=ConvolutionFwdAlgo.GEMM))
    np.testing.assert_allclose(y, ref_forward(x.astype(F64), w.astype(F64), 1, 1, 1, 1, CC), rtol=2e-2, atol=2e-2)
    y32 = cpu(convolution_forward(Handle(device, math_type=MathType.TENSOR_OP), xd, wd, ConvolutionDescriptor(
        1, math_type=MathType.DEFAULT), algo=ConvolutionFwdAlgo.GEMM))
    np.testing.assert_allclose(y32, ref_forward(x.astype(F64), w.astype(F64), 1, 1, 1, 1, CC), rtol=1e-5, atol=1e-5)


# ---- PyTorch as an oracle ---------------------------------------------------------------------------------

TORCH_CONFIGS = [CONFIGS[1], CONFIGS[5], CONFIGS[8], CONFIGS[15], CONFIGS[18]]


@pytest.mark.parametrize("cfg", TORCH_CONFIGS, ids=[c[0] for c in TORCH_CONFIGS])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_against_pytorch(device, cfg, dtype):
    torch = pytest.importorskip("torch")
    _, x_shape, w_shape, pad, stride, dil, groups, fmt, mode = cfg
    x, w, dy = data(cfg, dtype, seed=3)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    w_applied = wt.flip(list(range(2, wt.ndim))) if mode is CONV else wt      # torch only cross-correlates
    conv = getattr(torch.nn.functional, f"conv{len(x_shape) - 2}d")
    yt = conv(xt, w_applied, stride=stride, padding=pad, dilation=dil, groups=groups)
    yt.backward(torch.tensor(dy))
    want = {"forward": yt.detach().numpy(), "backward_data": xt.grad.numpy(), "backward_filter": wt.grad.numpy()}
    h = Handle(device)
    for direction, registry in REGISTRIES.items():
        problem = make_problem("test", x_shape, w_shape, desc_of(cfg), dtype)
        for algorithm in registry:
            if algorithm.supports(problem):
                got = run_direction(direction, h, cfg, x, w, dy, algo=algorithm.algo)
                # float32: PyTorch's assert_close tolerances; FFT and Winograd round differently (transforms
                # through frequency / tile space), so they get a documented 1e-4.
                loose = dtype == F32 and algorithm.algo.name.startswith(("FFT", "WINOGRAD"))
                torch.testing.assert_close(torch.tensor(got), torch.tensor(want[direction]),
                                           **(dict(rtol=1e-4, atol=1e-4) if loose else {}))


# The heuristic's policy on the CPU, fitted to find measurements on a 2-core CPU (docs/measurements):
# ungrouped or narrow inputs (few channels per group) -> one im2col GEMM (conv_cpu.py's fast form where
# groups == 1); wide grouped or depthwise -> the DIRECT tap loop.
@pytest.mark.parametrize("x_shape, w_shape, groups, padding, expected", [
    ((64, 1, 32, 32), (6, 1, 5, 5), 1, 0, "GEMM"),          # LeNet conv1: 2.6 ms GEMM vs 28 ms DIRECT
    ((32, 64, 16, 16), (64, 4, 3, 3), 16, 1, "GEMM"),       # 4 channels per group
    ((32, 64, 8, 8), (64, 64, 3, 3), 1, 1, "GEMM"),         # conv_cpu's fast GEMM form beats DIRECT (issue 16)
    # (C=K=64 from 8192 output positions at 1 thread: WINOGRAD_NONFUSED, tests/backend/test_conv_winograd_cpu.py)
    ((64, 64, 4, 4), (64, 1, 3, 3), 64, 1, "DIRECT"),       # depthwise: a broadcast multiply per tap
])
def test_cpu_heuristic_policy(x_shape, w_shape, groups, padding, expected):
    desc = ConvolutionDescriptor(padding, 1, 1, groups=groups)
    ranked = get_convolution_forward_algorithm_v7(None, x_shape, w_shape, desc)
    assert ranked[0].algo.name == expected, [p.algo.name for p in ranked]


# ---- half data: which algorithms take it as it is ---------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_data_reaches_native_kernels_as_it_is(device, dtype):
    """float16/bfloat16 data goes to an algorithm as it is where that algorithm, or the fast form that applies, has
    half math (the CUDA kernels: no float32 round trip of the inputs), and as float32 elsewhere (the NumPy forms);
    the primitive's result is the float64 reference within the dtype's rounding either way."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float16)
    xp = B.devices.device(device).xp
    rng = np.random.default_rng(0)
    x64, w64 = rng.standard_normal((2, 8, 6, 6)), rng.standard_normal((8, 8, 3, 3))
    desc = ConvolutionDescriptor(1, 1, 1)
    x, w = xp.asarray(x64.astype(dt)), xp.asarray(w64.astype(dt))
    dy64 = rng.standard_normal((2, 8, 6, 6))
    dy = xp.asarray(dy64.astype(dt))
    x64, w64, dy64 = (a.astype(dt).astype(np.float64) for a in (x64, w64, dy64))
    p = make_problem("test", (2, 8, 6, 6), (8, 8, 3, 3), desc, dt)
    for registry, algo, a, b in ((BACKWARD_DATA_ALGORITHMS, B.ConvolutionBwdDataAlgo.ALGO_0, w, dy),
                                 (BACKWARD_FILTER_ALGORITHMS, ConvolutionBwdFilterAlgo.ALGO_0, x, dy)):
        assert registry.get(algo).runs_half_natively(p, a, b) == (device == "cuda")
    dx = convolution_backward_data(None, w, dy, desc, (2, 8, 6, 6), algo=B.ConvolutionBwdDataAlgo.ALGO_0)
    ref = convolution_backward_data(None, w64, dy64, desc, (2, 8, 6, 6), algo=B.ConvolutionBwdDataAlgo.ALGO_0)
    assert dx.dtype == dt
    unit = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    np.testing.assert_allclose(to_numpy(dx).astype(np.float64), ref, rtol=0, atol=4 * unit * np.abs(ref).max())


def test_find_times_half_data_the_way_a_call_runs_it(monkeypatch):
    """find / benchmark time each algorithm on what a call would hand it: float16 data reaches an algorithm without
    half math as float32 (the round trip of _execute), not as float16 (it timed a path that never runs)."""
    seen = []
    for alg in FORWARD_ALGORITHMS._algorithms.values():
        real = alg.run
        monkeypatch.setattr(alg, "run", lambda p, a, b, tf32=False, _real=real: seen.append(a.dtype) or
                            _real(p, a, b, tf32))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float16)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float16)
    perfs = find_convolution_forward_algorithm(Handle("cpu"), x, w, ConvolutionDescriptor(1, 1, 1), repeats=1)
    assert any(pf.status is Status.SUCCESS for pf in perfs)
    assert seen and all(dt == np.float32 for dt in seen)        # no CPU algorithm has half math


def test_depthwise_tile_grid_limits():
    from minidnn.backend.cuda import conv_igemm as K
    assert K.tile_config(56, 56, 4096, 3, 3, 1, 1) is not None
    # more than 65535 tile columns (grid z) or tile rows (grid y): the plane kernel keeps such planes
    assert K.tile_config(1, 9_000_000, 2, 1, 3, 1, 1) is None
    assert K.tile_config(40_000_000, 4, 1, 3, 1, 1, 1) is None
