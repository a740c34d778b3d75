"""The CPU activation primitive's seen-call cache (_CPU_SEEN) and ReLU's contiguous-zeros form (_relu): repeated and
changed calls give bitwise what the uncached scalar form gives, and invalid calls after a cached one still raise."""
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import activation as A
from minidnn.backend.errors import BadParamError

MODES = [B.ActivationMode.RELU, B.ActivationMode.SIGMOID, B.ActivationMode.LEAKY_RELU, B.ActivationMode.ELU]


def _bits(a):
    return a.view(np.uint8)


def _x(shape, dtype, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[:6] = [np.nan, -0.0, 0.0, -np.nan, np.inf, -np.inf]
    if dtype == np.float32:
        flat.view(np.uint32)[6] = 0x7FC01234        # a NaN with a payload
    return x


@pytest.mark.parametrize("shape", [(8,), (300,), (32, 6, 16, 16), (3, 70001)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_relu_zeros_form_bitwise(shape, dtype):
    x = _x(shape, dtype)
    y = A._relu(np, x, 0.0)
    ref = np.maximum(x, 0)
    assert y.dtype == ref.dtype and y.shape == ref.shape and y.flags.c_contiguous
    assert np.array_equal(_bits(y), _bits(ref))
    for view in (x[..., ::2], np.asfortranarray(x), x.T):     # other layouts take the scalar form
        assert np.array_equal(_bits(np.ascontiguousarray(A._relu(np, view, 0.0))),
                              _bits(np.ascontiguousarray(np.maximum(view, 0))))
        assert A._relu(np, view, 0.0).strides == np.maximum(view, 0).strides


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")     # the inputs hold inf and NaN
def test_cached_calls_match_uncached(mode):
    d = B.ActivationDescriptor(mode)
    for shape, dtype in [((32, 6, 16, 16), np.float32), ((5, 7), np.float64), ((32, 6, 16, 16), np.float64),
                         ((9,), np.float32)]:
        x, dy = _x(shape, dtype, 1), _x(shape, dtype, 2)
        A._CPU_SEEN.clear()
        ref_y = A.activation_forward(None, d, x)
        ref_dx = A.activation_backward(None, d, None, dy, x)
        for _ in range(2):          # the second and third calls take the cache
            assert np.array_equal(_bits(A.activation_forward(None, d, x)), _bits(ref_y))
            assert np.array_equal(_bits(A.activation_backward(None, d, None, dy, x)), _bits(ref_dx))
        assert np.array_equal(_bits(A.activation_forward(None, d, x, alpha=2.0)), _bits(ref_y * dtype(2)))
        x2 = x + 1                  # new values, same signature: computed afresh
        assert np.array_equal(_bits(A.activation_forward(None, d, x2)), _bits(A._MODES[mode][0](np, x2, d.coef)))


def test_invalid_calls_still_raise_after_a_cached_one():
    d = B.ActivationDescriptor(B.ActivationMode.RELU)
    x = np.ones((4, 5), np.float32)
    A.activation_forward(None, d, x)
    A.activation_forward(None, d, x)
    A.activation_backward(None, d, None, x, x)
    A.activation_backward(None, d, None, x, x)
    with pytest.raises(BadParamError):
        A.activation_forward(None, d, x.astype(np.int32))
    with pytest.raises(BadParamError):
        A.activation_forward(None, d, x, beta=1.0)             # beta != 0 needs y
    with pytest.raises(BadParamError):
        A.activation_backward(None, d, None, np.ones((4, 6), np.float32), x)
    with pytest.raises(BadParamError):
        A.activation_backward(None, d, None, x.astype(np.float64), x)
    with pytest.raises(BadParamError):
        A.activation_backward(None, d, np.ones((5, 4), np.float32), x, x)
    with pytest.raises(BadParamError):
        A.activation_forward(None, "relu", x)
    y = np.full((4, 5), 7, np.float32)      # an output array is never cached and is written
    assert A.activation_forward(None, d, x, y=y) is y and (y == 1).all()
