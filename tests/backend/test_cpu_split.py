"""One primitive cut over its batch, one part per thread (threads.split_spans / parallel_spans, used by
backend/conv_cpu.py's dense directions and backend/pooling_cpu.py): the split results against the unsplit call --
bit for bit for the forward and data gradient and for pooling (each image computed by the same form), within
float rounding of the float64 reference for the filter gradient (the sum over the images is added in another
order: the parts' sums, in batch order) -- over ragged batches (1, 3, odd), dtypes and every dense form; the grain;
set_num_threads(1); errors in a part."""
import threading

import numpy as np
import pytest

import minidnn
from minidnn.backend import conv_cpu, pooling_cpu
from minidnn.backend import threads as threads_module
from minidnn.backend.conv_gemm import gemm_backward_filter, gemm_forward
from minidnn.backend.conv_problem import ConvolutionDescriptor, make_problem

# (x shape without the batch, w shape, padding, stride, dilation): one config per dense form of conv_cpu.py
FORMS = [
    ((1, 32, 32), (6, 1, 5, 5), 0, 1, 1),             # LeNet conv1: flat im2col (channels-first, C=1)
    ((6, 14, 14), (16, 6, 5, 5), 0, 1, 1),            # LeNet conv2: im2col / flat col2im
    ((6, 14, 14), (16, 6, 5, 5), 2, 1, 1),            # padded: the full correlation for backward data
    ((8, 10, 10), (8, 8, 3, 3), 1, 1, 1),             # flat rows (few output channels)
    ((5, 9, 7), (4, 5, 3, 3), 1, 2, 1),               # stride 2: channels-first gather, per-tap backward data
    ((3, 11, 10), (7, 3, 3, 2), (2, 1), (1, 3), (2, 1)),
    ((4, 12, 9), (5, 4, 3, 3), 1, 1, 1),              # row shift (_ROW_SHIFT_MIN_COLS_BYTES lowered below)
    ((3, 13), (5, 3, 4), 1, 2, 1),                    # 1-D
    ((2, 5, 6, 4), (3, 2, 3, 2, 2), 1, 1, 1),         # 3-D
]
BATCHES = [1, 2, 3, 7]


@pytest.fixture
def split(monkeypatch):
    """2 threads with every primitive split (the grain lifted: test arrays are far below it)."""
    before = threads_module._current[0]
    monkeypatch.setattr(threads_module, "MIN_SPLIT_WORK", 0)
    monkeypatch.setattr(pooling_cpu, "MIN_SPLIT_ELEMENTS", 0)
    monkeypatch.setattr(threads_module, "PAIR_BACKOFF_S", 0.0)     # tiny parts rarely overlap: no resting here
    monkeypatch.setattr(threads_module, "_pair_rest", [0.0])
    minidnn.set_num_threads(2)
    yield
    minidnn.set_num_threads(before or 1)


def _problem(n, cfg, dtype):
    x_shape, w_shape, padding, stride, dilation = cfg
    desc = ConvolutionDescriptor(padding=padding, stride=stride, dilation=dilation)
    return make_problem("test", (n, *x_shape), w_shape, desc, dtype)


def _inputs(p, dtype, seed=0, channels_last=False):
    rng = np.random.default_rng(seed)
    x, w, dy = (rng.standard_normal(s).astype(dtype) for s in (p.x_shape, p.w_shape, p.y_shape))
    if channels_last:
        x, dy = (np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1) for a in (x, dy))
    return x, w, dy


def _unsplit(fn, *args):
    """The call as one part: nothing split inside (the same as set_num_threads(1))."""
    return threads_module._single(fn, *args)


def _same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("cfg", FORMS)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_forward_and_data_gradient_split(split, monkeypatch, cfg, n, dtype, channels_last):
    """The same values up to float rounding: every image goes through the same form with the same operands, but a
    part's GEMM (fewer rows) may be run by another OpenBLAS kernel than the whole's, summing the inner axis in
    another order (its small-matrix kernels, for products of up to ~10^6 multiply-adds: found here at batches 2-7
    on the channels-last and full-correlation forms).  Bit for bit at the benchmarked sizes
    (test_benchmarked_layers_split_bit_for_bit)."""
    if cfg[0] == (4, 12, 9):
        monkeypatch.setattr(conv_cpu, "_ROW_SHIFT_MIN_COLS_BYTES", 0)
    p = _problem(n, cfg, dtype)
    x, w, dy = _inputs(p, dtype, channels_last=channels_last)
    parts = []
    real = threads_module.parallel_spans
    monkeypatch.setattr(conv_cpu, "parallel_spans", lambda fn, spans: parts.append(len(spans)) or real(fn, spans))
    y = conv_cpu.dense_forward(p, x, w)
    dx = conv_cpu.dense_backward_data(p, w, dy)
    # a batch of one image is not split, nor a flat form (it shares its chunks out itself: parallel_for)
    expected = [2] * (n > 1) * (not conv_cpu._flat_dense_applies(p, x)) + [2] * (n > 1) * (
        not (conv_cpu._full_correlation_applies(p) and conv_cpu._flat_dense_applies(p, dy)))
    assert parts == expected
    y1, dx1 = _unsplit(conv_cpu.dense_forward, p, x, w), _unsplit(conv_cpu.dense_backward_data, p, w, dy)
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(y, y1, rtol=0, atol=64 * eps * np.abs(y1).max())
    np.testing.assert_allclose(dx, dx1, rtol=0, atol=64 * eps * np.abs(dx1).max())
    # the layout (channels-first or channels-last memory) is the unsplit call's too
    for a, b in ((y, y1), (dx, dx1)):
        assert (a.strides[1] < a.strides[-1]) == (b.strides[1] < b.strides[-1])


@pytest.mark.parametrize("n", [32, 64, 65, 256])
def test_benchmarked_layers_split_bit_for_bit(split, n):
    """LeNet-5's two convolutions (the batches bench/cpu.py times, the digits batch, an odd one) and conv16: forward
    and data gradient bit for bit against the unsplit call."""
    for cfg in FORMS[:2] + [((16, 32, 32), (16, 16, 3, 3), 1, 1, 1)] * (n == 32):
        p = _problem(n, cfg, np.float32)
        x, w, dy = _inputs(p, np.float32)
        _same_bits(conv_cpu.dense_forward(p, x, w), _unsplit(conv_cpu.dense_forward, p, x, w))
        _same_bits(conv_cpu.dense_backward_data(p, w, dy), _unsplit(conv_cpu.dense_backward_data, p, w, dy))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("group_bytes", [1, 200_000, 2 << 20])
@pytest.mark.parametrize("n", [2, 9, 64, 67])
def test_split_im2col_forward_stacked_is_the_loop_bit_for_bit(split, monkeypatch, n, group_bytes, dtype):
    """A split part's im2col forward in groups of whole chunks, one gather and one stacked product a group
    (conv_cpu._STACKED_PARTS), against the per-chunk loop (switch off) and the unsplit call: the same bits, for
    groups of one chunk, several, the whole part, and a last shorter group / chunk; LeNet conv2's shape; and
    only inside a split part (the unsplit call keeps the loop)."""
    monkeypatch.setattr(conv_cpu, "_PART_GATHER_BYTES", group_bytes)
    p = _problem(n, FORMS[1], dtype)
    x, w, _ = _inputs(p, dtype, seed=n)
    calls, real = [], conv_cpu._im2col_product_stacked
    monkeypatch.setattr(conv_cpu, "_im2col_product_stacked", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    got = {}
    for stacked in (False, True):
        monkeypatch.setattr(conv_cpu, "_STACKED_PARTS", [stacked])
        got[stacked] = conv_cpu.dense_forward(p, x, w)
    chunk = conv_cpu._im2col_chunks(np.empty((n, 10, 10, 5, 5, 6), dtype), 16)[0].shape[0]   # images a chunk
    assert sorted(calls) == [m for m in (n // 2, n - n // 2) if m > chunk]     # parts of one chunk: the loop
    _same_bits(got[True], got[False])
    calls.clear()
    _same_bits(got[True], _unsplit(conv_cpu.dense_forward, p, x, w))
    assert calls == []
    exact = gemm_forward(_problem(n, FORMS[1], np.float64), x.astype(np.float64), w.astype(np.float64))
    tol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got[True], exact, rtol=0, atol=tol * np.abs(exact).max() * np.sqrt(150))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("cfg", FORMS)
def test_filter_gradient_split_is_the_parts_summed_in_batch_order(split, monkeypatch, cfg, n, dtype):
    if cfg[0] == (4, 12, 9):
        monkeypatch.setattr(conv_cpu, "_ROW_SHIFT_MIN_COLS_BYTES", 0)
    p = _problem(n, cfg, dtype)
    x, _, dy = _inputs(p, dtype, seed=1)
    dw = conv_cpu.dense_backward_filter(p, x, dy)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    exact = gemm_backward_filter(make_problem("test", p.x_shape, p.w_shape, ConvolutionDescriptor(
        padding=p.padding, stride=p.stride, dilation=p.dilation), np.float64), x64, dy64)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    scale = np.abs(exact).max()
    np.testing.assert_allclose(dw, exact, rtol=0, atol=tol * scale * np.sqrt(n * np.prod(p.out_size)))
    # the fixed order: the first part's sum plus the second's (the same bits every call); the flat form shares its
    # chunks out itself and sums their partials in image order
    half = n // 2
    if n > 1 and not conv_cpu._flat_dense_applies(p, x, dy):
        import dataclasses
        a = _unsplit(conv_cpu.dense_backward_filter, dataclasses.replace(p, N=half), x[:half], dy[:half])
        b = _unsplit(conv_cpu.dense_backward_filter, dataclasses.replace(p, N=n - half), x[half:], dy[half:])
        _same_bits(dw, (a + b).astype(dtype))
    _same_bits(dw, conv_cpu.dense_backward_filter(p, x, dy))


def test_forms_are_chosen_on_the_whole_batch(split, monkeypatch):
    """A form that depends on the batch size (row shift: cols above _ROW_SHIFT_MIN_COLS_BYTES) is the whole call's
    choice in every part, though each part alone would choose another."""
    p = _problem(8, FORMS[6], np.float32)
    cols_bytes = p.N * np.prod(p.out_size) * np.prod(p.kernel) * p.C * p.itemsize
    monkeypatch.setattr(conv_cpu, "_ROW_SHIFT_MIN_COLS_BYTES", cols_bytes - 1)  # whole: row shift; half: im2col
    x, w, dy = _inputs(p, np.float32)
    seen = []
    real = conv_cpu._row_shift_correlate
    monkeypatch.setattr(conv_cpu, "_row_shift_correlate", lambda *a: seen.append(a[2].N) or real(*a))
    _same_bits(conv_cpu.dense_forward(p, x, w), _unsplit(conv_cpu.dense_forward, p, x, w))
    assert sorted(seen) == [4, 4, 8]                                            # two parts, then the unsplit call


def test_the_grain_and_one_thread(monkeypatch):
    before = threads_module._current[0]
    monkeypatch.setattr(threads_module, "_pair_rest", [0.0])
    monkeypatch.setattr(threads_module, "PAIR_BACKOFF_S", 0.0)
    try:
        minidnn.set_num_threads(2)
        grain = threads_module.MIN_SPLIT_WORK
        assert threads_module.split_spans(64, grain - 1) == [slice(0, 64)]
        assert threads_module.split_spans(64, grain) == [slice(0, 32), slice(32, 64)]
        assert threads_module.split_spans(3, grain) == [slice(0, 1), slice(1, 3)]
        assert threads_module.split_spans(1, 1 << 40) == [slice(0, 1)]
        minidnn.set_num_threads(3)
        assert threads_module.split_spans(7, grain) == [slice(0, 2), slice(2, 4), slice(4, 7)]
        minidnn.set_num_threads(1)                            # off, however large the work
        assert threads_module.split_spans(64, 1 << 40) == [slice(0, 64)]
        minidnn.set_num_threads(2)
        assert threads_module._single(threads_module.split_spans, 64, 1 << 40) == [slice(0, 64)]   # inside a part
        # a real primitive: below the grain one call on the caller, above it two parts
        p = _problem(4, FORMS[1], np.float32)                 # the im2col form: split by _over_batch
        x, w, _ = _inputs(p, np.float32)
        calls = []
        real = threads_module.parallel_spans
        monkeypatch.setattr(conv_cpu, "parallel_spans", lambda fn, spans: calls.append(len(spans)) or real(fn, spans))
        monkeypatch.setattr(threads_module, "MIN_SPLIT_WORK", p.macs + 1)
        conv_cpu.dense_forward(p, x, w)
        monkeypatch.setattr(threads_module, "MIN_SPLIT_WORK", p.macs)
        conv_cpu.dense_forward(p, x, w)
        minidnn.set_num_threads(1)
        conv_cpu.dense_forward(p, x, w)
        assert calls == [2]
    finally:
        minidnn.set_num_threads(before or 1)


def test_parts_run_on_two_threads_and_nothing_splits_inside(split):
    where = []

    def part(nb):
        where.append((threading.get_ident(), threads_module._threads(), threads_module.split_spans(8, 1 << 40)))
        threading.Event().wait(0.05)                          # long enough for the pool thread to take its part
        return nb.start
    assert threads_module.parallel_spans(part, threads_module.split_spans(8, 1 << 40)) == [0, 4]
    assert {w[1] for w in where} == {1} and all(w[2] == [slice(0, 8)] for w in where)
    assert threads_module._threads() == 2


def test_an_error_in_a_part_is_raised_after_both_parts_end(split):
    started, finished = threading.Event(), []

    def part(nb):
        if nb.start == 0:
            started.wait(1.0)                                 # the pool thread has taken part 1 (or 1 s passed)
            raise ValueError("part 0 failed")
        started.set()
        threading.Event().wait(0.05)
        finished.append(nb.start)
    with pytest.raises(ValueError, match="part 0 failed"):
        threads_module.parallel_spans(part, [slice(0, 1), slice(1, 2)])
    assert finished == [1]                                    # the other part ran to its end before the raise

    def second_fails(nb):
        if nb.start == 1:
            raise KeyError("part 1")
        return 0
    with pytest.raises(KeyError):
        threads_module.parallel_spans(second_fails, [slice(0, 1), slice(1, 2)])


def test_splits_rest_after_parts_that_did_not_run_at_once(split, monkeypatch):
    """A split whose parts used less CPU than PAIR_OVERLAP x its wall time (here: parts that sleep; on a shared
    machine: a second core held by another process) sends the next splits and pairs to run unsplit for
    PAIR_BACKOFF_S; parts that compute at once do not."""
    monkeypatch.setattr(threads_module, "PAIR_BACKOFF_S", 60.0)
    spans = threads_module.split_spans(8, 1 << 40)
    assert len(spans) == 2
    threads_module.parallel_spans(lambda nb: threading.Event().wait(0.02), spans)
    assert threads_module.split_spans(8, 1 << 40) == [slice(0, 8)]
    assert threads_module.parallel_pair(lambda: 1, lambda: 2, threads_module.MIN_PAIR_WORK) == (1, 2)
    threads_module._pair_rest[0] = 0.0
    assert len(threads_module.split_spans(8, 1 << 40)) == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("window,stride,padding", [(2, 2, 0), (3, 3, 1), (3, 2, 1), (2, 1, 0)])
def test_max_pooling_split_bit_for_bit(split, monkeypatch, n, dtype, window, stride, padding):
    """Max pooling forward (value and argmax) and backward from the stored argmax: each part writes its own
    images, so the split call gives the unsplit call's bits; ties and NaN included.  Overlapping windows' backward
    (one bincount over the batch) is not split."""
    from minidnn.backend.pooling import PoolingDescriptor, PoolingMode, pooling_backward, pooling_forward
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, 3, 11, 9)).astype(dtype)
    x[0, 0, :2, :2] = 1.0                                     # ties
    x[-1, 1, 3, 3] = np.nan
    dy = None
    desc = PoolingDescriptor(PoolingMode.MAX, window, padding, stride)
    parts = []
    real = threads_module.parallel_spans
    monkeypatch.setattr(pooling_cpu, "parallel_spans", lambda fn, spans: parts.append(len(spans)) or real(fn, spans))

    def both():
        y, arg = pooling_forward(None, desc, x, return_argmax=True)
        g = np.random.default_rng(3).standard_normal(y.shape).astype(dtype) if dy is None else dy
        return y, arg, pooling_backward(None, desc, y, g, x, argmax=arg)
    got = both()
    assert parts == [2] * (n > 1) * (1 + (stride >= window))
    for a, b in zip(got, _unsplit(both)):
        _same_bits(a, b)


def test_pooling_grain(monkeypatch):
    from minidnn.backend.pooling import PoolingDescriptor, PoolingMode, pooling_forward
    before = threads_module._current[0]
    monkeypatch.setattr(threads_module, "_pair_rest", [0.0])
    parts = []
    real = threads_module.parallel_spans
    monkeypatch.setattr(pooling_cpu, "parallel_spans", lambda fn, spans: parts.append(len(spans)) or real(fn, spans))
    x = np.zeros((4, 2, 8, 8), np.float32)
    desc = PoolingDescriptor(PoolingMode.MAX, 2)
    try:
        minidnn.set_num_threads(2)
        monkeypatch.setattr(pooling_cpu, "MIN_SPLIT_ELEMENTS", x.size + 1)
        pooling_forward(None, desc, x)
        monkeypatch.setattr(pooling_cpu, "MIN_SPLIT_ELEMENTS", x.size)
        monkeypatch.setattr(threads_module, "PAIR_BACKOFF_S", 0.0)
        pooling_forward(None, desc, x)
        minidnn.set_num_threads(1)
        pooling_forward(None, desc, x)
    finally:
        minidnn.set_num_threads(before or 1)
    assert parts == [2]


@pytest.mark.parametrize("n", [1, 3, 7])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_and_depthwise_are_not_split_and_keep_their_bits(split, monkeypatch, n, dtype):
    """Groups: depthwise convolutions hand their own chunks out (parallel_for) and grouped dense ones run the
    reference; neither is cut by the batch split, and both give the unsplit call's bits with splitting forced."""
    from minidnn.backend.conv_gemm import gemm_backward_data, gemm_forward
    parts = []
    real = threads_module.parallel_spans
    monkeypatch.setattr(conv_cpu, "parallel_spans", lambda fn, spans: parts.append(len(spans)) or real(fn, spans))
    rng = np.random.default_rng(4)
    for groups, w_shape in ((6, (6, 1, 3, 3)), (2, (4, 3, 3, 3))):
        desc = ConvolutionDescriptor(padding=1, groups=groups)
        p = make_problem("test", (n, 6, 9, 8), w_shape, desc, dtype)
        x, w, dy = (rng.standard_normal(s).astype(dtype) for s in (p.x_shape, p.w_shape, p.y_shape))
        if groups == p.C:
            calls = [(conv_cpu.depthwise_forward, x, w), (conv_cpu.depthwise_backward_data, w, dy),
                     (conv_cpu.depthwise_backward_filter, x, dy)]
        else:
            calls = [(gemm_forward, x, w), (gemm_backward_data, w, dy)]
        for fn, a, b in calls:
            _same_bits(fn(p, a, b), _unsplit(fn, p, a, b))
    assert parts == []
