"""The im2col products gathered a chunk of images at a time (conv_cpu._im2col_product / _im2col_gram): every
direction that takes them, with chunks of one image, of two (a ragged last one) and of the whole batch, against the
float64 references; the chunked forward is the product over the whole cols, row by row."""
import math

import numpy as np
import pytest

from minidnn.backend import conv_cpu, threads
from minidnn.backend.conv_gemm import gemm_backward_data, gemm_backward_filter, gemm_forward
from minidnn.backend.conv_problem import ConvolutionDescriptor, make_problem

CASES = [   # x shape, w shape, padding, stride, dilation: shapes that take the channels-last im2col
    ((5, 6, 14, 14), (16, 6, 5, 5), 0, 1, 1),          # LeNet conv2
    ((3, 6, 8, 8), (16, 6, 5, 5), 2, 1, 1),            # the digits LeNet's conv2 (and its full-correlation dx)
    ((3, 5, 9, 7), (4, 5, 3, 3), 1, 2, 1),             # stride 2
    ((3, 3, 11, 10), (7, 3, 3, 2), (2, 1), (1, 3), (2, 1)),
    ((3, 3, 13), (5, 3, 4), 1, 2, 1),                  # 1-D
    ((3, 2, 5, 6, 4), (3, 2, 3, 2, 2), 1, 2, 1),       # 3-D
]
DIRECTIONS = {"forward": (conv_cpu.dense_forward, gemm_forward),
              "backward_data": (conv_cpu.dense_backward_data, gemm_backward_data),
              "backward_filter": (conv_cpu.dense_backward_filter, gemm_backward_filter)}


def _problem(case, dtype):
    x_shape, w_shape, padding, stride, dilation = case
    desc = ConvolutionDescriptor(padding=padding, stride=stride, dilation=dilation, groups=1)
    return make_problem("test", x_shape, w_shape, desc, dtype)


def _operands(direction, p, dtype, seed):
    rng = np.random.default_rng(seed)
    x, w, dy = (rng.standard_normal(s).astype(dtype) for s in (p.x_shape, p.w_shape, p.y_shape))
    return {"forward": (x, w), "backward_data": (w, dy), "backward_filter": (x, dy)}[direction]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("images", [1, 2, None])
@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("case", CASES)
def test_chunked_im2col_matches_reference(case, direction, images, dtype, monkeypatch):
    p = _problem(case, dtype)
    calls = []
    for name in ("_im2col_product", "_im2col_gram"):
        real = getattr(conv_cpu, name)
        monkeypatch.setattr(conv_cpu, name, lambda windows, right, real=real: calls.append(windows.shape) or
                            real(windows, right))
    if images is not None:                            # chunks by bytes (the sizing without small-matrix kernels)
        monkeypatch.setattr(threads, "_small_kernels", [False])
        per_image = lambda shape: math.prod(shape[1:]) * np.dtype(dtype).itemsize    # noqa: E731
        monkeypatch.setattr(conv_cpu, "_IM2COL_CHUNK_BYTES", images * per_image(
            (p.N, *p.out_size, *p.kernel, p.C)))
    fast, ref = DIRECTIONS[direction]
    a, b = _operands(direction, p, dtype, seed=len(case[0]) + (images or 0))
    got = fast(p, a, b)
    want = ref(p, a.astype(np.float64), b.astype(np.float64))
    assert got.shape == want.shape
    tol = 1e-11 if dtype == np.float64 else 3e-5 * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    if direction != "backward_data":                  # (backward data takes other forms for some of these shapes)
        assert calls, "the chunked im2col was not taken"


def test_chunked_forward_is_the_whole_product(monkeypatch):
    p = _problem(CASES[0], np.float32)
    x, w = _operands("forward", p, np.float32, seed=1)
    windows = conv_cpu._windows(conv_cpu._channels_last_padded(x, p.padding), p.out_size, p.kernel, p.stride,
                                p.dilation)
    right = np.ascontiguousarray(conv_cpu._w_mat(w).T)
    whole = np.ascontiguousarray(windows).reshape(p.N * 100, -1)
    got = {}
    monkeypatch.setattr(threads, "_small_kernels", [False])
    for images in (1, 2, p.N):
        monkeypatch.setattr(conv_cpu, "_IM2COL_CHUNK_BYTES", images * 100 * 150 * 4)
        got[images] = conv_cpu._im2col_product(windows, right)
    for images in (1, 2):                             # row blocks: each row's product is the same whatever the chunk
        np.testing.assert_allclose(got[images], got[p.N], rtol=0, atol=4 * np.finfo(np.float32).eps * 150)
    np.testing.assert_allclose(got[p.N], whole.astype(np.float64) @ right, rtol=0, atol=1e-4)


def test_chunks_hold_one_small_kernel_product(monkeypatch):
    """With small-matrix kernels, a chunk is as many images as one product of at most SMALL_GEMM_MACS takes."""
    monkeypatch.setattr(threads, "_small_kernels", [True])
    windows = np.empty((32, 8, 8, 5, 5, 16), dtype=np.float32)      # digits LeNet backward data: 64 x 400 an image
    buf, chunks = conv_cpu._im2col_chunks(windows, 6)
    assert buf.shape[0] == threads.SMALL_GEMM_MACS // (64 * 400 * 6) == 6
    assert [c.stop - c.start for c in chunks] == [6] * 5 + [2]
    monkeypatch.setattr(threads, "_small_kernels", [False])
    buf, chunks = conv_cpu._im2col_chunks(windows, 6)
    assert buf.shape[0] == conv_cpu._IM2COL_CHUNK_BYTES // (64 * 400 * 4)


def test_empty_batch_gives_zero_filter_gradient():
    windows = np.empty((0, 10, 10, 5, 5, 6), dtype=np.float32)
    gram = conv_cpu._im2col_gram(windows, np.empty((0, 16), dtype=np.float32))
    np.testing.assert_array_equal(gram, np.zeros((150, 16), dtype=np.float32))
    assert conv_cpu._im2col_product(windows, np.ones((150, 16), dtype=np.float32)).shape == (0, 16)
