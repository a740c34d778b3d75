"""alpha/beta blending, one table for every primitive that has it: out = alpha * op(...) + beta * out."""
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend._testing import to_numpy

R = np.random.default_rng(7)
X = R.standard_normal((2, 4, 5, 6))
DY_POOL = R.standard_normal((2, 4, 2, 3))
DY = R.standard_normal(X.shape)
C4 = R.standard_normal(4)
POOL = B.PoolingDescriptor(B.PoolingMode.MAX, 2)
ACT = B.ActivationDescriptor(B.ActivationMode.ELU)
LRN = B.LRNDescriptor(3, 1.0, 0.75, 1.0)
SM = (B.SoftmaxAlgorithm.ACCURATE, B.SoftmaxMode.CHANNEL)
MEAN, INV = B.batch_normalization_forward_training(None, "SPATIAL", X, C4, C4, 0.1, None, None, 1e-5)[1:]
LN_STATS = B.layer_normalization_forward(None, X, None, None, 2, 1e-5)[1:]
GN_STATS = B.group_normalization_forward(None, X, 2, C4, C4, 1e-5)[1:]
DIV = B.DivNormMode.PRECOMPUTED_MEANS

# name -> call(d, alpha, beta, out) returning the blended output; d moves a NumPy array to the device
TABLE = {
    "pooling_forward": lambda d, a, b, o: B.pooling_forward(None, POOL, d(X), a, b, o),
    "pooling_backward": lambda d, a, b, o: B.pooling_backward(None, POOL, None, d(DY_POOL), d(X), a, b, o),
    "activation_forward": lambda d, a, b, o: B.activation_forward(None, ACT, d(X), a, b, o),
    "activation_backward": lambda d, a, b, o: B.activation_backward(None, ACT, None, d(DY), d(X), a, b, o),
    "softmax_forward": lambda d, a, b, o: B.softmax_forward(None, *SM, d(X), a, b, o),
    "softmax_backward": lambda d, a, b, o: B.softmax_backward(None, *SM, d(np.abs(X) / 9), d(DY), a, b, o),
    "bn_forward_training": lambda d, a, b, o: B.batch_normalization_forward_training(
        None, "SPATIAL", d(X), d(C4), d(C4), 0.1, None, None, 1e-5, a, b, o)[0],
    "bn_forward_inference": lambda d, a, b, o: B.batch_normalization_forward_inference(
        None, "SPATIAL", d(X), d(C4), d(C4), d(C4), d(C4 ** 2), 1e-5, a, b, o),
    "bn_backward_data": lambda d, a, b, o: B.batch_normalization_backward(
        None, "SPATIAL", d(X), d(DY), d(C4), d(MEAN), d(INV), 1e-5, a, b, dx=o)[0],
    "bn_backward_param": lambda d, a, b, o: B.batch_normalization_backward(
        None, "SPATIAL", d(X), d(DY), d(C4), d(MEAN), d(INV), 1e-5, alpha_param=a, beta_param=b, dscale=o,
        dbias=None if o is None else o.copy())[1],
    "ln_forward": lambda d, a, b, o: B.layer_normalization_forward(None, d(X), None, None, 2, 1e-5, a, b, o)[0],
    "ln_backward": lambda d, a, b, o: B.layer_normalization_backward(
        None, d(X), d(DY), None, *(d(s) for s in LN_STATS), 2, a, b, dx=o)[0],
    "gn_forward": lambda d, a, b, o: B.group_normalization_forward(None, d(X), 2, d(C4), d(C4), 1e-5, a, b, o)[0],
    "gn_backward_param": lambda d, a, b, o: B.group_normalization_backward(
        None, d(X), d(DY), 2, d(C4), *(d(s) for s in GN_STATS), alpha_param=a, beta_param=b,
        dscale=None if o is None else o.copy(), dbias=o)[2],
    "lrn_forward": lambda d, a, b, o: B.lrn_cross_channel_forward(None, LRN, d(X), a, b, o),
    "lrn_backward": lambda d, a, b, o: B.lrn_cross_channel_backward(None, LRN, None, d(DY), d(X), a, b, o),
    "divnorm_forward": lambda d, a, b, o: B.divisive_normalization_forward(None, LRN, DIV, d(X), None, a, b, o),
    "divnorm_backward": lambda d, a, b, o: B.divisive_normalization_backward(None, LRN, DIV, d(X), None, d(DY),
                                                                             a, b, o)[0],
    "op_tensor": lambda d, a, b, o: B.op_tensor(None, "MUL", d(X), d(C4), a, 1.0, b, o),
    "transform_tensor": lambda d, a, b, o: B.transform_tensor(None, d(X), "NCHW", "NHWC", a, b, o),
    "reduce_tensor": lambda d, a, b, o: B.reduce_tensor(None, "NORM2", d(X), a, b, o, out_shape=(1, 4, 1, 1)),
}


@pytest.mark.parametrize("name", list(TABLE))
def test_alpha_beta_blending(xp, name):
    call = TABLE[name]
    d = xp.asarray
    plain = to_numpy(call(d, 1.0, 0.0, None))
    old = R.standard_normal(plain.shape)
    out = d(old.copy())
    result = call(d, 2.0, 0.5, out)
    assert result is out, "the given output must be updated in place and returned"
    np.testing.assert_allclose(to_numpy(out), 2.0 * plain + 0.5 * old, rtol=1e-12, atol=1e-12)
    # beta == 0: the old contents are never read, even NaN
    nan_out = d(np.full(plain.shape, np.nan))
    np.testing.assert_allclose(to_numpy(call(d, 3.0, 0.0, nan_out)), 3.0 * plain, rtol=1e-12, atol=1e-12)


def test_beta_without_output_is_an_error():
    with pytest.raises(B.BadParamError, match="beta=0.5 blends into the existing y, so y must be given"):
        B.pooling_forward(None, POOL, X, 1.0, 0.5)
    with pytest.raises(B.BadParamError, match=r"y has shape \(2, 4, 5, 6\) but the result has shape \(2, 4, 2, 3\)"):
        B.pooling_forward(None, POOL, X, 1.0, 0.0, np.zeros_like(X))
