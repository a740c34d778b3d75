"""The CPU fast forms of GEMM and DIRECT (backend/conv_cpu.py) against the references they stand beside:
every direction, 1-D to 3-D, padding, stride, dilation, NCHW and channels-last memory, float32 and float64,
and the registry really running them (and the references with fast_paths_enabled(False))."""
import numpy as np
import pytest

from minidnn.backend import conv_cpu
from minidnn.backend.conv_algorithms import (
    BACKWARD_DATA_ALGORITHMS,
    BACKWARD_FILTER_ALGORITHMS,
    FORWARD_ALGORITHMS,
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionFwdAlgo,
    direct_backward_data,
    direct_backward_filter,
    direct_forward,
)
from minidnn.backend.conv_gemm import gemm_backward_data, gemm_backward_filter, gemm_forward
from minidnn.backend.conv_problem import ConvolutionDescriptor, make_problem

# (x shape, w shape, padding, stride, dilation, groups)
DENSE = [
    ((2, 1, 32, 32), (6, 1, 5, 5), 0, 1, 1, 1),          # LeNet conv1
    ((3, 6, 14, 14), (16, 6, 5, 5), 2, 1, 1, 1),         # LeNet conv2, padded
    ((2, 5, 9, 7), (4, 5, 3, 3), 1, 2, 1, 1),            # stride 2, odd sizes
    ((2, 3, 11, 10), (7, 3, 3, 2), (2, 1), (1, 3), (2, 1), 1),   # dilation, mixed per-axis settings
    ((2, 8, 6, 6), (4, 8, 1, 1), 0, 1, 1, 1),            # pointwise
    ((2, 3, 13), (5, 3, 4), 1, 2, 1, 1),                 # 1-D
    ((1, 2, 5, 6, 4), (3, 2, 3, 2, 2), 1, 1, 1, 1),      # 3-D
    ((2, 4, 12, 9), (5, 4, 3, 3), 1, 1, 1, 1),           # row-shift products (few wasted rows)
    ((2, 3, 16, 8), (4, 3, 2, 3), 1, 1, (2, 1), 1),      # row shift with a dilated kernel height
]
DEPTHWISE = [
    ((2, 8, 10, 10), (8, 1, 3, 3), 1, 1, 1, 8),
    ((3, 5, 9, 7), (5, 1, 3, 3), 1, 2, 1, 5),
    ((2, 4, 12, 11), (4, 1, 5, 3), (2, 0), 1, (1, 2), 4),
    ((2, 6, 15), (6, 1, 3), 1, 1, 1, 6),
    ((3, 3, 5, 6, 4), (3, 1, 3, 2, 3), (1, 0, 2), 1, (1, 1, 2), 3),  # 3-D, mixed padding and dilation
    ((2, 3, 7, 6), (3, 1, 3, 3), 3, 1, 1, 3),                    # padding past the kernel: per-tap backward data
    ((5, 2, 9, 8), (2, 1, 1, 1), 0, 1, 1, 2),                    # 1x1 taps
]
PAIRS = {  # direction: (fast, reference) for dense and for depthwise
    "forward": ((conv_cpu.dense_forward, gemm_forward), (conv_cpu.depthwise_forward, direct_forward)),
    "backward_data": ((conv_cpu.dense_backward_data, gemm_backward_data),
                      (conv_cpu.depthwise_backward_data, direct_backward_data)),
    "backward_filter": ((conv_cpu.dense_backward_filter, gemm_backward_filter),
                        (conv_cpu.depthwise_backward_filter, direct_backward_filter)),
}


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


def _problem(cfg, dtype):
    x_shape, w_shape, padding, stride, dilation, groups = cfg
    desc = ConvolutionDescriptor(padding=padding, stride=stride, dilation=dilation, groups=groups)
    return make_problem("test", x_shape, w_shape, desc, dtype)


def _channels_last(a):
    """The same values, channels-last in memory (a channels-first view of an NHWC array)."""
    return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1)


def _inputs(p, dtype, rng):
    x = rng.standard_normal(p.x_shape).astype(dtype)
    w = rng.standard_normal(p.w_shape).astype(dtype)
    dy = rng.standard_normal(p.y_shape).astype(dtype)
    return x, w, dy


def _operands(direction, x, w, dy):
    return {"forward": (x, w), "backward_data": (w, dy), "backward_filter": (x, dy)}[direction]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("direction", list(PAIRS))
@pytest.mark.parametrize("kind, cfg", [("dense", c) for c in DENSE] + [("depthwise", c) for c in DEPTHWISE])
def test_fast_form_matches_reference(kind, cfg, direction, layout, dtype):
    rng = np.random.default_rng(7)
    p = _problem(cfg, dtype)
    x, w, dy = _inputs(p, dtype, rng)
    if layout == "channels_last":
        x, dy = _channels_last(x), _channels_last(dy)
    fast, ref = PAIRS[direction][kind == "depthwise"]
    a, b = _operands(direction, x, w, dy)
    got, want = fast(p, a, b), ref(p, a, b)
    assert got.shape == want.shape
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(got, want, **tol)


@pytest.mark.parametrize("direction", list(PAIRS))
@pytest.mark.parametrize("cfg", DEPTHWISE)
@pytest.mark.parametrize("planes", ["one", "three", "two_images"])
def test_flat_depthwise_over_chunks(cfg, direction, planes, monkeypatch):
    """The flat stride-1 depthwise form cuts the work into chunks of channels of images, handed out to the threads
    one at a time: every plane a chunk of its own, three channels a chunk (the last block partial where C is not a
    multiple of 3), and all channels of two images a chunk (the last image block partial where N is odd); each
    thread's buffers are reused across chunks of different sizes."""
    rng = np.random.default_rng(11)
    p = _problem(cfg, np.float64)
    _, row_len, _, offsets, _ = conv_cpu._flat_plan(p, p.in_size, p.padding, p.out_size, 8)
    per_plane = len(offsets) * row_len * 8
    budget = {"one": 1, "three": 3 * per_plane, "two_images": 2 * p.C * per_plane}[planes]
    monkeypatch.setattr(conv_cpu, "_FLAT_TAPS_BYTES", budget)
    chunks = conv_cpu._flat_plan(p, p.in_size, p.padding, p.out_size, 8)[-1]
    sizes = {(cs.stop - cs.start, nb.stop - nb.start) for cs, nb in chunks}
    evened = -(-p.C // -(-p.C // 3))                     # at most 3 channels a chunk, as few chunks as that allows
    assert max(sizes) == {"one": (1, 1), "three": (evened, 1), "two_images": (p.C, min(2, p.N))}[planes]
    assert sum(c * n for c, n in (((cs.stop - cs.start), (nb.stop - nb.start)) for cs, nb in chunks)) == p.N * p.C
    fast, ref = PAIRS[direction][1]
    a, b = _operands(direction, *_inputs(p, np.float64, rng))
    np.testing.assert_allclose(fast(p, a, b), ref(p, a, b), rtol=1e-11, atol=1e-11)


def test_flat_depthwise_chunks_are_shared_between_threads(threads, monkeypatch):
    """With two threads, both take chunks (the pool thread and the calling thread), and the result is the one
    thread's bit for bit (each chunk writes its own outputs; filter partials are added in image order)."""
    import threading

    import minidnn.backend.threads as threads_module
    p = _problem(((6, 5, 9, 8), (5, 1, 3, 3), 1, 1, 1, 5), np.float32)
    monkeypatch.setattr(conv_cpu, "_FLAT_TAPS_BYTES", 1)
    calls, real = [], threads_module.parallel_for

    def spy(chunks, body, work, setup=None):
        seen = set()                                  # per call: the pool's two threads may serve the two calls

        def watched(state, chunk):
            seen.add(threading.get_ident())
            body(state, chunk)
        calls.append(seen)
        return real(chunks, watched, work, setup)
    monkeypatch.setattr(conv_cpu, "parallel_for", spy)
    x, w, dy = _inputs(p, np.float32, np.random.default_rng(2))
    got = [conv_cpu.depthwise_forward(p, x, w), conv_cpu.depthwise_backward_filter(p, x, dy)]
    assert len(calls) == 2 and threading.get_ident() in calls[0] | calls[1]
    for seen in calls:                                # a pool thread may find no chunk left
        assert len(seen) == threads or threads == 2 and len(seen) == 1
    import minidnn
    minidnn.set_num_threads(1)
    want = [conv_cpu.depthwise_forward(p, x, w), conv_cpu.depthwise_backward_filter(p, x, dy)]
    minidnn.set_num_threads(threads)
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("direction", list(PAIRS))
@pytest.mark.parametrize("cfg", [c for c in DENSE if c[3] == 1] + [((5, 3, 9, 8), (4, 3, 3, 3), 1, 1, 1, 1)])
@pytest.mark.parametrize("images", [1, 2])
def test_flat_dense_over_chunks_of_images(cfg, direction, images, monkeypatch):
    """The stride-1 flat im2col form runs one GEMM per chunk of images; chunks of one and of two images (the
    last chunk then partial: 5 images) give the reference's result."""
    p = _problem(cfg, np.float64)
    _, offsets, length, _, _ = conv_cpu._flat_dense_plan(p, p.in_size, p.padding, p.out_size, min(p.C, p.K), 8)
    monkeypatch.setattr(conv_cpu, "_FLAT_COLS_BYTES", images * len(offsets) * min(p.C, p.K) * length * 8)
    rng = np.random.default_rng(5)
    fast, ref = PAIRS[direction][0]
    a, b = _operands(direction, *_inputs(p, np.float64, rng))
    np.testing.assert_allclose(fast(p, a, b), ref(p, a, b), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("layout", ["nchw", "channels_last_x"])
@pytest.mark.parametrize("cfg", [c for c in DENSE if c[3] == 1] + [((5, 6, 14, 14), (16, 6, 5, 5), 0, 1, 1, 1),
                                                                 ((3, 2, 7, 9), (5, 2, 3, 2), (1, 2), 1, (2, 3), 1)])
@pytest.mark.parametrize("images", [1, 2, 64])
def test_flat_col2im_backward_data(cfg, images, layout, monkeypatch):
    """Stride-1 backward data by col2im on the flat padded grid, in chunks of one, two (the last partial) and all
    images, against the float64 reference; the weights may be a non-contiguous view (channels-last memory)."""
    p = _problem(cfg, np.float64)
    grid = np.prod(p.padded_size)
    monkeypatch.setattr(conv_cpu, "_COL2IM_BYTES", images * np.prod(p.kernel) * p.C * grid * 8)
    rng = np.random.default_rng()                                       # fresh inputs each run
    _, w, dy = _inputs(p, np.float64, rng)
    if layout == "channels_last_x":
        w = _channels_last(w)
    dy = dy * rng.uniform(0.5, 2.0)
    got = conv_cpu._flat_col2im(p, w, dy)
    want = gemm_backward_data(p, w, dy)
    assert got.shape == want.shape == p.x_shape
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


def test_flat_col2im_is_exercised_and_chosen_where_it_applies(monkeypatch):
    monkeypatch.setattr(conv_cpu, "_SMALL_COLS_BYTES", 0)         # no whole-gather shortcut for small problems
    applies = [conv_cpu._flat_col2im_applies(p, np.empty(p.y_shape)) for p in (_problem(c, np.float32) for c in DENSE)]
    assert set(applies) == {True, False}
    p = _problem(((4, 6, 14, 14), (16, 6, 5, 5), 0, 1, 1, 1), np.float32)       # LeNet's conv2
    assert conv_cpu._flat_col2im_applies(p, np.empty(p.y_shape))
    assert not conv_cpu._flat_col2im_applies(p, _channels_last(np.empty(p.y_shape)))
    monkeypatch.setattr(conv_cpu, "_COL2IM_WIDTH", [False])            # (its width-gather form: its own tests)
    calls, real = [], conv_cpu._flat_col2im
    monkeypatch.setattr(conv_cpu, "_flat_col2im", lambda *a: calls.append(1) or real(*a))
    _, w, dy = _inputs(p, np.float32, np.random.default_rng(1))
    conv_cpu.dense_backward_data(p, w, dy)
    assert calls == [1]


@pytest.mark.parametrize("cfg", DENSE)
@pytest.mark.parametrize("block", [7, 64])
def test_filter_gradient_with_the_inner_axis_in_blocks(cfg, block, monkeypatch):
    """The filter gradients' long-inner products cut their inner axis (output positions) into even blocks added
    in order (_filter_product): blocks of 7 and 64 positions (uneven splits, every path's product) give the
    float64 reference's result, and the same bits with 1 or 2 threads."""
    monkeypatch.setattr(conv_cpu, "_INNER_BLOCK", block)
    p = _problem(cfg, np.float64)
    x, _, dy = _inputs(p, np.float64, np.random.default_rng(3))
    got = conv_cpu.dense_backward_filter(p, x, dy)
    np.testing.assert_allclose(got, gemm_backward_filter(p, x, dy), rtol=1e-11, atol=1e-11)


def test_filter_product_blocks():
    a, b = np.arange(30.0).reshape(3, 10), np.arange(20.0).reshape(10, 2)
    for block in (1, 3, 4, 10, 11):
        conv_cpu._INNER_BLOCK, before = block, conv_cpu._INNER_BLOCK
        try:
            out = np.empty((3, 2))
            assert conv_cpu._filter_product(a, b, out=out) is out
            np.testing.assert_array_equal(out, a @ b)
        finally:
            conv_cpu._INNER_BLOCK = before


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("length,block", [(25088, 4096), (8192, 4096), (10000, 4096), (9, 4)])
def test_stacked_filter_blocks_are_the_loop_bit_for_bit(monkeypatch, dtype, length, block):
    """_filter_product's stacked form (one np.matmul over the blocks, one sum) against its loop of block products:
    the same bits (the same products added in the same order), uneven last blocks included, for the operands the
    filter gradients pass (a chunk's rows of a wider buffer, dy's grid transposed), into ``out`` or not; and the
    float64 product within rounding."""
    monkeypatch.setattr(conv_cpu, "_INNER_BLOCK", block)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((25, length + 7)).astype(dtype)[:, 3:3 + length]        # rows of a wider buffer
    b = np.ascontiguousarray(rng.standard_normal((6, length)).astype(dtype)).T      # (length, 6), F-ordered
    looped, calls, real = [], [], conv_cpu._stacked_blocks
    monkeypatch.setattr(conv_cpu, "_stacked_blocks", lambda *args: calls.append(1) or real(*args))
    for stacked in (False, True):
        monkeypatch.setattr(conv_cpu, "_STACKED_BLOCKS", [stacked])
        calls.clear()
        out = np.empty((25, 6), dtype=dtype)
        assert conv_cpu._filter_product(a, b, out=out) is out
        got = conv_cpu._filter_product(a, b)
        np.testing.assert_array_equal(got, out)
        assert calls == ([1, 1] if stacked else [])
        looped.append(got)
    np.testing.assert_array_equal(looped[0], looped[1])
    ref = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(looped[1], ref, rtol=tol, atol=tol * np.sqrt(length))


def test_flat_dense_form_is_exercised():
    applies = {conv_cpu._flat_dense_applies(p, np.empty(p.x_shape)) for p in (_problem(c, np.float32) for c in DENSE)}
    assert applies == {True, False}


REGISTERED = [
    ("forward", FORWARD_ALGORITHMS, ConvolutionFwdAlgo.GEMM, ConvolutionFwdAlgo.DIRECT),
    ("backward_data", BACKWARD_DATA_ALGORITHMS, ConvolutionBwdDataAlgo.ALGO_1, ConvolutionBwdDataAlgo.ALGO_0),
    ("backward_filter", BACKWARD_FILTER_ALGORITHMS, ConvolutionBwdFilterAlgo.ALGO_1, ConvolutionBwdFilterAlgo.ALGO_0),
]


@pytest.mark.parametrize("direction, registry, gemm, direct", REGISTERED)
def test_registry_runs_the_fast_form_on_numpy_and_the_reference_when_switched_off(direction, registry, gemm,
                                                                                  direct, monkeypatch):
    rng = np.random.default_rng(3)
    for cfg, algo, kind in ((DENSE[1], gemm, "dense"), (DEPTHWISE[0], direct, "depthwise")):
        p = _problem(cfg, np.float64)
        a, b = _operands(direction, *_inputs(p, np.float64, rng))
        algorithm = registry.get(algo)
        fast, ref = PAIRS[direction][kind == "depthwise"]
        calls = []
        assert fast in [run for _, _, run in algorithm.fast_paths]     # (the CUDA kernels sit beside it)
        spied = [(d, ap, lambda *args, _r=run: calls.append(1) or _r(*args)) for d, ap, run in algorithm.fast_paths]
        monkeypatch.setattr(algorithm, "fast_paths", spied)
        np.testing.assert_allclose(algorithm.run(p, a, b), ref(p, a, b), rtol=1e-11, atol=1e-11)
        assert calls == [1], f"{algo} did not run its fast form on NumPy arrays"
        with conv_cpu.fast_paths_enabled(False):
            np.testing.assert_allclose(algorithm.run(p, a, b), ref(p, a, b), rtol=1e-11, atol=1e-11)
        assert calls == [1], "fast_paths_enabled(False) still ran the fast form"


def test_both_gather_layouts_are_exercised(monkeypatch):
    chosen = {conv_cpu._gather_channels_first(_problem(cfg, np.float32)) for cfg in DENSE}
    assert chosen == {True, False}
    # the row shift only above _ROW_SHIFT_MIN_COLS_BYTES: no longer chosen (chunked im2col won at every size
    # measured), not even for LeNet's conv2 at batch 256 (15 MB of cols); lowered, it takes some test shapes
    assert not any(conv_cpu._row_shift_applies(_problem(cfg, np.float32)) for cfg in DENSE)
    lenet_conv2 = ((256, 6, 14, 14), (16, 6, 5, 5), 0, 1, 1, 1)
    assert not conv_cpu._row_shift_applies(_problem(lenet_conv2, np.float32))
    monkeypatch.setattr(conv_cpu, "_ROW_SHIFT_MIN_COLS_BYTES", 4 << 20)
    assert conv_cpu._row_shift_applies(_problem(lenet_conv2, np.float32))
    assert not conv_cpu._row_shift_applies(_problem(((64,) + lenet_conv2[0][1:],) + lenet_conv2[1:], np.float32))
    monkeypatch.setattr(conv_cpu, "_ROW_SHIFT_MIN_COLS_BYTES", 0)
    shifted = {conv_cpu._row_shift_applies(_problem(cfg, np.float32)) for cfg in DENSE}
    assert shifted == {True, False}


@pytest.mark.parametrize("direction", list(PAIRS))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("cfg", DENSE)
def test_large_problem_forms_match_reference(cfg, layout, direction, monkeypatch):
    """The forms chosen only where the whole im2col would not fit the caches (row-shift products; backward data by
    col2im or per-tap products rather than the full correlation) against the float64 reference on the test
    shapes, with _SMALL_COLS_BYTES and _ROW_SHIFT_MIN_COLS_BYTES lowered so that they run."""
    monkeypatch.setattr(conv_cpu, "_SMALL_COLS_BYTES", 0)
    monkeypatch.setattr(conv_cpu, "_ROW_SHIFT_MIN_COLS_BYTES", 0)
    p = _problem(cfg, np.float64)
    x, w, dy = _inputs(p, np.float64, np.random.default_rng(11))
    if layout == "channels_last":
        x, dy = _channels_last(x), _channels_last(dy)
    fast, ref = PAIRS[direction][0]
    a, b = _operands(direction, x, w, dy)
    np.testing.assert_allclose(fast(p, a, b), ref(p, a, b), rtol=1e-11, atol=1e-11)


def test_fast_forms_do_not_apply_to_grouped_or_multiplier_depthwise():
    # groups with several channels each, and depthwise with K = 2C, stay on the reference
    for cfg in [((2, 8, 6, 6), (8, 4, 3, 3), 1, 1, 1, 2), ((2, 4, 6, 6), (8, 1, 3, 3), 1, 1, 1, 4)]:
        p = _problem(cfg, np.float32)
        x, w, _ = _inputs(p, np.float32, np.random.default_rng(0))
        assert not conv_cpu._dense(p, x, w) and not conv_cpu._depthwise(p, x, w)


def test_small_work_stays_on_the_calling_thread(threads, monkeypatch):
    """Below threads.MIN_PARALLEL_WORK the batch is not shared out (a pool thread costs more than such a part)."""
    import minidnn.backend.threads as threads_module
    monkeypatch.setattr(threads_module, "MIN_PARALLEL_WORK", 1 << 17)
    assert threads_module.parallel_parts(8, (1 << 17) - 1) == 1
    assert threads_module.parallel_parts(8, 1 << 17) == threads          # the fixture's thread count
    assert threads_module.parallel_parts(1, 1 << 30) == 1


# ---- the flat width-tap gather with the kernel rows stacked in one GEMM (_flat_rows_*) ---------------------------

ROWS = [  # (x shape, w shape, padding, dilation): stride 1, 2-D
    ((5, 16, 12, 12), (16, 16, 3, 3), 1, 1),              # conv16's shape, smaller
    ((3, 6, 9, 11), (7, 6, 3, 2), (1, 0), 1),             # rectangular kernel, padding on one axis
    ((2, 4, 10, 12), (5, 4, 3, 3), 2, (2, 1)),            # dilated height: rows shifted by 2 grid rows
    ((4, 3, 8, 24), (3, 3, 5, 5), 2, 1),                  # five kernel rows
]


def _direct64(direction, p, a, b):
    """The float64 reference (the DIRECT loops) of one direction."""
    ref = {"forward": direct_forward, "backward_data": direct_backward_data,
           "backward_filter": direct_backward_filter}[direction]
    return ref(p, a.astype(np.float64), b.astype(np.float64))


@pytest.mark.parametrize("direction", ["forward", "backward_data"])
@pytest.mark.parametrize("cfg", ROWS)
@pytest.mark.parametrize("images", [1, 2, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flat_rows_form_matches_float64_reference(cfg, direction, images, dtype, monkeypatch):
    """Forward and backward data through the stacked-rows form (chunks of one and two images, the last one partial,
    and one chunk of all), against the float64 DIRECT loops."""
    x_shape, w_shape, padding, dilation = cfg
    p = _problem((x_shape, w_shape, padding, 1, dilation, 1), dtype)
    channels = (p.K, p.C) if direction == "forward" else (p.C, p.K)
    assert conv_cpu._flat_dense_applies(p, np.empty(p.x_shape)) and conv_cpu._flat_rows_applies(p, *channels)
    _, offsets, length, _, _ = conv_cpu._flat_dense_plan(p, p.in_size, p.padding, p.out_size, min(p.C, p.K), 8)
    monkeypatch.setattr(conv_cpu, "_FLAT_COLS_BYTES", images * len(offsets) * min(p.C, p.K) * length * 8)
    calls, original = [], conv_cpu._flat_rows_correlate
    monkeypatch.setattr(conv_cpu, "_flat_rows_correlate", lambda *a: calls.append(1) or original(*a))
    rng = np.random.default_rng(11)
    fast = PAIRS[direction][0][0]
    a, b = _operands(direction, *_inputs(p, dtype, rng))
    got = fast(p, a, b)
    assert calls, "the stacked-rows form did not run"
    assert got.dtype == dtype
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, _direct64(direction, p, a, b), **tol)


@pytest.mark.parametrize("cfg", ROWS + [((3, 5, 9, 24), (2, 5, 4, 3), (0, 1), (2, 1))])   # 4 rows dilated by 2
@pytest.mark.parametrize("images", [1, 2, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flat_rows_filter_gradient_matches_float64_reference(cfg, images, dtype, monkeypatch):
    """The filter gradient through the width-tap chunks (kernel row r: the taps shifted by r grid rows, one product
    each), with chunks of one and two images (the last one partial) and one of all, against the float64 DIRECT
    loops; the rule lets it run only where OpenBLAS's small-matrix blocks do, so they are switched on here."""
    x_shape, w_shape, padding, dilation = cfg
    p = _problem((x_shape, w_shape, padding, 1, dilation, 1), dtype)
    monkeypatch.setattr(conv_cpu.threads, "blas_small_kernels", lambda: True)
    assert conv_cpu._flat_dense_applies(p, np.empty(p.x_shape)) and conv_cpu._flat_rows_filter_applies(p)
    _, offsets, length, _, _ = conv_cpu._flat_dense_plan(p, p.in_size, p.padding, p.out_size, p.C, 8)
    monkeypatch.setattr(conv_cpu, "_FLAT_COLS_BYTES", images * len(offsets) * p.C * length * 8)
    calls, original = [], conv_cpu._flat_rows_filter
    monkeypatch.setattr(conv_cpu, "_flat_rows_filter", lambda *a: calls.append(1) or original(*a))
    x, _, dy = _inputs(p, dtype, np.random.default_rng(12))
    got = conv_cpu.dense_backward_filter(p, x, dy)
    assert calls, "the width-tap filter form did not run"
    assert got.dtype == dtype and got.shape == p.w_shape
    tol = dict(rtol=2e-5, atol=5e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, _direct64("backward_filter", p, x, dy), **tol)


def test_flat_rows_filter_applies_where_it_measured_faster_only(monkeypatch):
    """At most 16 output channels (the products' columns: small-matrix blocks) and an inner axis of at least 12 width
    taps x channels, on a BLAS with small-matrix kernels."""
    def applies(x_shape, w_shape, padding):
        return conv_cpu._flat_rows_filter_applies(_problem((x_shape, w_shape, padding, 1, 1, 1), np.float32))
    monkeypatch.setattr(conv_cpu.threads, "blas_small_kernels", lambda: True)
    assert applies((2, 16, 32, 32), (16, 16, 3, 3), 1) and applies((2, 8, 32, 32), (8, 8, 3, 3), 1)
    assert not applies((2, 32, 32, 32), (32, 32, 3, 3), 1)            # 32 columns: ran even
    assert not applies((2, 1, 32, 32), (6, 1, 5, 5), 0)               # LeNet's first layer: inner axis 5, slower
    assert not applies((2, 3, 32, 32), (16, 3, 3, 3), 1)              # inner axis 9
    monkeypatch.setattr(conv_cpu.threads, "blas_small_kernels", lambda: False)
    assert not applies((2, 16, 32, 32), (16, 16, 3, 3), 1)


@pytest.mark.parametrize("direction", list(PAIRS))
def test_flat_im2col_form_still_runs_where_the_rows_form_is_off(direction, monkeypatch):
    """Above _FLAT_ROWS_MAX_ROWS kernel rows x output channels the flat im2col keeps the shape (measured: C=K=64
    ran slower stacked); switched off, the same problem goes through it and still matches."""
    p = _problem(ROWS[0][:3] + (1, 1, 1), np.float64)
    monkeypatch.setattr(conv_cpu, "_FLAT_ROWS_MAX_ROWS", 0)
    assert not conv_cpu._flat_rows_applies(p, p.K, p.C)
    a, b = _operands(direction, *_inputs(p, np.float64, np.random.default_rng(2)))
    np.testing.assert_allclose(PAIRS[direction][0][0](p, a, b), _direct64(direction, p, a, b), rtol=1e-12,
                               atol=1e-12)


def test_flat_rows_form_applies_where_it_measured_faster_only():
    """Few output channels (R*K <= 96) and an inner axis of at least 12 width taps x channels; backward data
    correlates K channels into C, so its roles swap."""
    def applies(x_shape, w_shape, padding, direction="forward"):
        p = _problem((x_shape, w_shape, padding, 1, 1, 1), np.float32)
        return conv_cpu._flat_rows_applies(p, *((p.K, p.C) if direction == "forward" else (p.C, p.K)))
    assert applies((2, 16, 32, 32), (16, 16, 3, 3), 1) and applies((2, 3, 32, 32), (6, 3, 5, 5), 2)
    assert not applies((2, 64, 32, 32), (64, 64, 3, 3), 1)            # 192 rows
    assert not applies((2, 1, 32, 32), (6, 1, 5, 5), 0)               # LeNet's first layer: inner axis 5
    assert not applies((2, 3, 32, 32), (16, 3, 3, 3), 1)              # RGB 3x3 stem: 9
    assert applies((2, 64, 32, 32), (16, 64, 3, 3), 1)                # 64 -> 16: 48 rows, inner 192
    assert not applies((2, 64, 32, 32), (16, 64, 3, 3), 1, "backward_data")   # 16 -> 64: 192 rows
    assert applies((2, 3, 32, 32), (16, 3, 3, 3), 1, "backward_data")        # 16 -> 3: 9 rows, inner 48
