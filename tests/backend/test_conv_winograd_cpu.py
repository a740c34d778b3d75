"""The CPU fast form of WINOGRAD_NONFUSED (backend/conv_winograd_cpu.py): forward and backward data against the
float64 GEMM reference, over ragged sizes (odd H/W: tiles past the edge), N=1, channel counts that are multiples of
nothing, padding 0-3 (backward data's 2 - padding negative: cropped), NCHW and channels-last memory, several chunks
on 1 and 2 threads; the heuristic choosing it only where the size rule holds.

float32 error bound.  Each output is A^T (sum_c U_c * V_c) A with V = B^T d B, U = G g G^T.  To first order in the
unit roundoff u = 2^-24: V's two additions per element (2u), U computed in float64 and rounded once (u), the GEMM's
sum over the contracted channels (Cin u: C forward, K backward data), A^T . A's two additions (2u), so
    |y - y64| <= (Cin + 5) u * A^T (sum_c |U_c| * |V_c|) A,   |U| = |G| |g| |G|^T,  |V| = |B|^T |d| |B|
(the same transform with every entry of A, B, G and the data replaced by its absolute value: ``_bound``).  This is
up to ~4x the direct GEMM's (Cin * 9) u * (|x| corr |w|) where the transforms magnify (0.5-weighted taps of whole
4x4 tiles).  Measured: at most 0.14 of the bound (at most ~15 u relative to |x| corr |w|, up to C=128); the tests hold
the bound itself."""
import types

import numpy as np
import pytest

from minidnn.backend import ConvolutionDescriptor, MathType, conv_cpu
from minidnn.backend import conv_winograd_cpu as wc
from minidnn.backend.conv_algorithms import (
    BACKWARD_DATA_ALGORITHMS,
    FORWARD_ALGORITHMS,
    ConvolutionBwdDataAlgo,
    ConvolutionFwdAlgo,
)
from minidnn.backend.conv_gemm import gemm_backward_data, gemm_forward
from minidnn.backend.conv_problem import make_problem

# (N, C, K, H, W)
SHAPES = [(1, 3, 5, 7, 9), (2, 33, 34, 8, 8), (3, 4, 2, 5, 6), (2, 7, 3, 3, 3), (1, 2, 2, 4, 11), (2, 5, 6, 10, 1)]
U32 = 2.0 ** -24


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"], autouse=True)
def threads(request, monkeypatch):
    """Chunks of one image each, handed to 2 threads where asked (the work threshold lifted so they really split)."""
    import minidnn
    import minidnn.backend.threads
    monkeypatch.setattr(minidnn.backend.threads, "MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr(wc, "_CHUNK_BYTES", 1)
    before = minidnn.backend.threads._current[0]
    minidnn.set_num_threads(request.param)
    yield request.param
    minidnn.set_num_threads(before or 1)


def _channels_last(a):
    return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1)


def _bound(a, w, padding, cin):
    """(Cin + 5) u * A^T (sum_c |U_c| |V_c|) A for the correlation of a (N, C, H, W) padded by ``padding`` (negative:
    cropped) with w (K, C, 3, 3): the first-order float32 error bound of the module docstring, in float64."""
    ab = np.abs(wc._G)
    bt = np.abs(np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64))
    at = np.abs(np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64))
    N, C, H, W = a.shape
    P, Q = H + 2 * padding[0] - 2, W + 2 * padding[1] - 2
    T0, T1 = -(-P // 2), -(-Q // 2)
    grid = np.zeros((N, C, 2 * T0 + 2 + H, 2 * T1 + 2 + W))
    lo = [max(0, -q) for q in padding]
    rows, cols = slice(lo[0], H), slice(lo[1], W)
    grid[:, :, max(0, padding[0]):max(0, padding[0]) + H - lo[0],
         max(0, padding[1]):max(0, padding[1]) + W - lo[1]] = np.abs(a[:, :, rows, cols])
    tiles = np.stack([np.stack([grid[:, :, 2 * t:2 * t + 4, 2 * s:2 * s + 4] for s in range(T1)], 2)
                      for t in range(T0)], 2)                                   # (N, C, T0, T1, 4, 4)
    V = bt @ tiles @ bt.T
    U = ab @ np.abs(w) @ ab.T                                                   # (K, C, 4, 4)
    M = np.einsum("nctsij,kcij->nktsij", V, U)
    Y = (at @ M @ at.T).transpose(0, 1, 2, 4, 3, 5).reshape(N, -1, 2 * T0, 2 * T1)[:, :, :P, :Q]
    return (cin + 5) * U32 * Y


def _problem(shape, padding, dtype):
    N, C, K, H, W = shape
    return make_problem("test", (N, C, H, W), (K, C, 3, 3), ConvolutionDescriptor(padding=padding), dtype)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("padding", [0, 1, 2, 3, (1, 0)])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference_within_the_bound(shape, padding, layout):
    N, C, K, H, W = shape
    pads = padding if isinstance(padding, tuple) else (padding, padding)
    if H + 2 * pads[0] < 3 or W + 2 * pads[1] < 3:
        pytest.skip("no output")
    rng = np.random.default_rng(5)
    p = _problem(shape, padding, "float32")
    x64, w64, dy64 = (rng.standard_normal(s) for s in (p.x_shape, p.w_shape, p.y_shape))
    x, w, dy = (a.astype(np.float32) for a in (x64, w64, dy64))
    if layout == "channels_last":
        x, dy = _channels_last(x), _channels_last(dy)
    y = wc.winograd_forward(p, x, w)
    assert y.shape == p.y_shape and y.dtype == np.float32
    err = np.abs(y - gemm_forward(p, x64, w64))
    assert np.all(err <= _bound(x64, w64, p.padding, C)), err.max()
    dx = wc.winograd_backward_data(p, w, dy)
    assert dx.shape == p.x_shape and dx.dtype == np.float32
    flipped = np.swapaxes(w64[:, :, ::-1, ::-1], 0, 1)
    err = np.abs(dx - gemm_backward_data(p, w64, dy64))
    assert np.all(err <= _bound(dy64, flipped, tuple(2 - q for q in p.padding), K)), err.max()
    # float64 data: float64 all through
    p64 = _problem(shape, padding, "float64")
    np.testing.assert_allclose(wc.winograd_forward(p64, x64, w64), gemm_forward(p64, x64, w64),
                               rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(wc.winograd_backward_data(p64, w64, dy64), gemm_backward_data(p64, w64, dy64),
                               rtol=1e-11, atol=1e-11)


def test_same_bits_on_one_and_two_threads(threads):
    import minidnn
    rng = np.random.default_rng(9)
    p = _problem((5, 6, 7, 9, 10), 1, "float32")
    x = rng.standard_normal(p.x_shape).astype(np.float32)
    w = rng.standard_normal(p.w_shape).astype(np.float32)
    got = wc.winograd_forward(p, x, w)
    minidnn.set_num_threads(3 - threads)
    assert np.array_equal(got, wc.winograd_forward(p, x, w))


def _cpu():
    return types.SimpleNamespace(device=types.SimpleNamespace(type="cpu"), deterministic=False, workspace_limit=None)


@pytest.mark.parametrize("shape, chosen", [((32, 64, 64, 32, 32), True), ((32, 128, 96, 16, 16), True),
                                           ((8, 128, 128, 16, 16), False), ((32, 64, 64, 8, 8), False),
                                           ((32, 16, 16, 32, 32), False), ((1, 64, 64, 8, 8), False),
                                           ((32, 64, 64, 4, 4), False)])
def test_heuristic_picks_it_only_where_it_wins(shape, chosen, threads):
    """Shapes from the size rule's measurements, at 1 thread; never at 2 (the step did not run faster)."""
    chosen = chosen and threads == 1
    p = _problem(shape, 1, "float32")
    fw = FORWARD_ALGORITHMS.heuristic(p, _cpu(), MathType.DEFAULT)[0].algo
    bd = BACKWARD_DATA_ALGORITHMS.heuristic(p, _cpu(), MathType.DEFAULT)[0].algo
    assert (fw is ConvolutionFwdAlgo.WINOGRAD_NONFUSED) == chosen, fw
    assert (bd is ConvolutionBwdDataAlgo.WINOGRAD_NONFUSED) == chosen, bd
    if not chosen:
        assert fw is ConvolutionFwdAlgo.GEMM and bd is ConvolutionBwdDataAlgo.ALGO_1


def test_registry_runs_it_and_the_reference_when_switched_off(monkeypatch):
    rng = np.random.default_rng(3)
    p = _problem((8, 64, 64, 32, 32), 1, "float64")
    x, w, dy = (rng.standard_normal(s) for s in (p.x_shape, p.w_shape, p.y_shape))
    for registry, algo, run, args, ref in (
            (FORWARD_ALGORITHMS, ConvolutionFwdAlgo.WINOGRAD_NONFUSED, wc.winograd_forward, (x, w), gemm_forward),
            (BACKWARD_DATA_ALGORITHMS, ConvolutionBwdDataAlgo.WINOGRAD_NONFUSED, wc.winograd_backward_data, (w, dy),
             gemm_backward_data)):
        algorithm = registry.get(algo)
        assert run in [r for _, _, r in algorithm.fast_paths]
        calls = []
        spied = [(d, ap, lambda *args, _r=r: calls.append(1) or _r(*args)) for d, ap, r in algorithm.fast_paths]
        monkeypatch.setattr(algorithm, "fast_paths", spied)
        want = ref(p, *args)
        np.testing.assert_allclose(algorithm.run(p, *args), want, rtol=1e-11, atol=1e-11)
        assert calls == [1]
        with conv_cpu.fast_paths_enabled(False):
            np.testing.assert_allclose(algorithm.run(p, *args), want, rtol=1e-11, atol=1e-11)
        assert calls == [1]
