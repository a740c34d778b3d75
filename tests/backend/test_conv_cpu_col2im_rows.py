"""_flat_col2im over the output's rows of the padded grid, its width taps folded first (conv_cpu._COL2IM_ROWS), against
the whole-grid form it replaced and against the float64 reference: the rows below the output only ever held zeros and
the width shifts only move zeros across rows, so the two forms add the same terms (in another order), chunked or not,
1-D to 3-D, dilated, float32 and float64."""
import numpy as np
import pytest

from minidnn.backend import conv_cpu
from minidnn.backend.conv_gemm import gemm_backward_data
from minidnn.backend.conv_problem import make_problem
from minidnn.backend.convolution import ConvolutionDescriptor

CASES = [
    ((64, 6, 14, 14), (16, 6, 5, 5), 0, 1),             # LeNet conv2 at batch 64
    ((5, 6, 14, 14), (16, 6, 5, 5), 2, 1),              # padded
    ((3, 2, 7, 9), (5, 2, 3, 2), (1, 2), (2, 3)),       # dilated, per-axis padding
    ((2, 3, 13), (5, 3, 4), 1, 1),                      # 1-D
    ((2, 2, 5, 6, 4), (3, 2, 3, 2, 2), 1, 1),           # 3-D
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("chunk_images", [1, 2, None])
@pytest.mark.parametrize("case", CASES)
def test_rows_form_matches_whole_grid_and_reference(case, chunk_images, dtype, monkeypatch):
    x_shape, w_shape, padding, dilation = case
    desc = ConvolutionDescriptor(padding=padding, stride=1, dilation=dilation, groups=1)
    p = make_problem("test", x_shape, w_shape, desc, dtype)
    rng = np.random.default_rng(len(x_shape) * 7 + (chunk_images or 0))
    w = rng.standard_normal(p.w_shape).astype(dtype)
    dy = rng.standard_normal(p.y_shape).astype(dtype)
    if chunk_images is not None:                # chunks of that many images in the whole-grid form, fewer in the rows'
        size = np.prod(p.padded_size)
        monkeypatch.setattr(conv_cpu, "_COL2IM_BYTES", chunk_images * np.prod(p.kernel) * p.C * size * w.itemsize)
    got = {}
    for rows in (False, True):
        monkeypatch.setattr(conv_cpu, "_COL2IM_ROWS", [rows])
        got[rows] = conv_cpu._flat_col2im(p, w, dy)
    assert got[True].shape == p.x_shape
    # the same products and terms, added in another order
    np.testing.assert_allclose(got[True], got[False], rtol=0, atol=16 * np.finfo(dtype).eps * np.abs(got[False]).max())
    want = gemm_backward_data(p, w.astype(np.float64), dy.astype(np.float64))
    tol = 1e-11 if dtype == np.float64 else 2e-5 * np.abs(want).max()
    np.testing.assert_allclose(got[True], want, rtol=0, atol=tol)
