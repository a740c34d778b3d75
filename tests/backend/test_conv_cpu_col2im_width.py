"""_flat_width_col2im (dy's width taps gathered, one GEMM per chunk for all kernel rows, conv_cpu._COL2IM_WIDTH)
against the float64 reference and the folded col2im it stands in for: padded, dilated, non-square kernels, chunks of
one and two images (the last one partial) or all, float32 and float64; and chosen only where its rows are fewer."""
import numpy as np
import pytest

from minidnn.backend import conv_cpu
from minidnn.backend.conv_gemm import gemm_backward_data
from minidnn.backend.conv_problem import make_problem
from minidnn.backend.convolution import ConvolutionDescriptor

CASES = [
    ((64, 6, 14, 14), (16, 6, 5, 5), 0, 1),             # LeNet conv2 at batch 64
    ((5, 6, 14, 14), (16, 6, 5, 5), 2, 1),              # padded
    ((3, 4, 7, 9), (5, 4, 3, 2), (1, 2), (2, 3)),       # dilated, per-axis padding, R != S
    ((3, 3, 9, 8), (4, 3, 2, 4), (0, 1), (1, 2)),       # S > R, width dilated
]


def _case(case, dtype):
    x_shape, w_shape, padding, dilation = case
    desc = ConvolutionDescriptor(padding=padding, stride=1, dilation=dilation, groups=1)
    return make_problem("test", x_shape, w_shape, desc, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("chunk_images", [1, 2, None])
@pytest.mark.parametrize("case", CASES)
def test_width_form_matches_reference_and_folded_col2im(case, chunk_images, dtype, monkeypatch):
    p = _case(case, dtype)
    rng = np.random.default_rng(len(case[0]) * 11 + (chunk_images or 0))
    w = rng.standard_normal(p.w_shape).astype(dtype)
    dy = rng.standard_normal(p.y_shape).astype(dtype) * rng.uniform(0.5, 2.0)
    if chunk_images is not None:
        length = p.out_size[0] * p.padded_size[1]
        monkeypatch.setattr(conv_cpu, "_COL2IM_BYTES", chunk_images * p.kernel[1] * p.K * length * w.itemsize)
    got = conv_cpu._flat_width_col2im(p, w, dy)
    assert got.shape == p.x_shape and got.dtype == dtype
    want = gemm_backward_data(p, w.astype(np.float64), dy.astype(np.float64))
    tol = 1e-11 if dtype == np.float64 else 2e-5 * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    folded = conv_cpu._flat_col2im(p, w, dy)
    np.testing.assert_allclose(got, folded, rtol=0, atol=16 * np.finfo(dtype).eps * np.abs(want).max() * p.K)


def test_width_form_with_channels_last_weights():
    p = _case(CASES[0], np.float64)
    rng = np.random.default_rng(3)
    w = np.ascontiguousarray(np.moveaxis(rng.standard_normal(p.w_shape), 1, -1))
    w = np.moveaxis(w, -1, 1)                                           # (K, C, R, S) view of channels-last memory
    dy = rng.standard_normal(p.y_shape)
    np.testing.assert_allclose(conv_cpu._flat_width_col2im(p, w, dy), gemm_backward_data(p, w, dy),
                               rtol=1e-11, atol=1e-11)


def test_width_form_is_chosen_only_where_its_rows_are_fewer(monkeypatch):
    lenet2 = _case(CASES[0], np.float32)
    assert conv_cpu._width_col2im_applies(lenet2)                     # 5*16 + 5*6 < 6*25
    wide = _case(((4, 2, 12, 12), (64, 2, 3, 3), 0, 1), np.float32)
    assert not conv_cpu._width_col2im_applies(wide)                   # 3*64 + 3*2 > 2*9
    calls, real = [], conv_cpu._flat_width_col2im
    monkeypatch.setattr(conv_cpu, "_flat_width_col2im", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(1)
    w = rng.standard_normal(lenet2.w_shape).astype(np.float32)
    dy = rng.standard_normal(lenet2.y_shape).astype(np.float32)
    got = conv_cpu.dense_backward_data(lenet2, w, dy)
    assert calls == [1]
    np.testing.assert_allclose(got, gemm_backward_data(lenet2, w.astype(np.float64), dy.astype(np.float64)),
                               rtol=0, atol=2e-5 * np.abs(got).max())


def test_width_form_reuses_its_buffers_without_stale_values(monkeypatch):
    """The per-thread buffers kept between calls: a second call of the same shapes (chunks of two images, the last
    one partial) with other dy, after a call with other shapes, gives the reference's values."""
    p = _case(((5, 6, 14, 14), (16, 6, 5, 5), 0, 1), np.float64)
    monkeypatch.setattr(conv_cpu, "_COL2IM_BYTES", 2 * 5 * 16 * 10 * 14 * 8)
    rng = np.random.default_rng(9)
    w = rng.standard_normal(p.w_shape)
    other = _case(CASES[2], np.float64)
    for dy in (rng.standard_normal(p.y_shape), None, rng.standard_normal(p.y_shape) * 3):
        if dy is None:
            conv_cpu._flat_width_col2im(other, rng.standard_normal(other.w_shape), rng.standard_normal(other.y_shape))
            continue
        np.testing.assert_allclose(conv_cpu._flat_width_col2im(p, w, dy), gemm_backward_data(p, w, dy),
                                   rtol=1e-11, atol=1e-11)
