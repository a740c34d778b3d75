"""Tensor ops: add/op/scale/set/transform/reduce against plain NumPy float64 references."""
import numpy as np
import pytest

from minidnn.backend import (
    BadParamError,
    OpTensorOp,
    ReduceTensorOp,
    add_tensor,
    op_tensor,
    reduce_tensor,
    scale_tensor,
    set_tensor,
    transform_tensor,
)
from minidnn.backend._testing import to_numpy

# (y shape, b shape, format, b as the reference broadcasts it)
ADD_CASES = [((2, 3, 4, 5), (1, 3, 1, 1), None, lambda b: b), ((2, 3, 4, 5), (3,), None, lambda b: b[:, None, None]),
             ((2, 4, 5, 3), (3,), "NHWC", lambda b: b), ((2, 3), (3,), None, lambda b: b),
             ((2, 3, 4), (2, 3, 4), None, lambda b: b), ((0, 3, 2, 2), (3,), None, lambda b: b[:, None, None])]


@pytest.mark.parametrize("y_shape, b_shape, fmt, ref_b", ADD_CASES, ids=[f"{c[0]}+{c[1]}-{c[2]}" for c in ADD_CASES])
def test_add_tensor(xp, rng, y_shape, b_shape, fmt, ref_b):
    y0, b = rng.standard_normal(y_shape), rng.standard_normal(b_shape)
    y = xp.asarray(y0.copy())
    assert add_tensor(None, 2.0, xp.asarray(b), 0.5, y, format=fmt) is y
    np.testing.assert_allclose(to_numpy(y), 2.0 * ref_b(b) + 0.5 * y0, rtol=1e-14)


REF_OPS = {OpTensorOp.ADD: np.add, OpTensorOp.MUL: np.multiply, OpTensorOp.MIN: np.minimum,
           OpTensorOp.MAX: np.maximum, OpTensorOp.SQRT: lambda a, b: np.sqrt(a),
           OpTensorOp.NOT: lambda a, b: (a == 0).astype(a.dtype)}


@pytest.mark.parametrize("op", list(OpTensorOp), ids=lambda o: o.name.lower())
def test_op_tensor(xp, rng, op):
    a = np.abs(rng.standard_normal((2, 3, 4)))
    a[0, 0, :2] = 0
    b = rng.standard_normal((1, 3, 1))
    c0 = rng.standard_normal(a.shape)
    c = xp.asarray(c0.copy())
    out = op_tensor(None, op, xp.asarray(a), xp.asarray(b), 2.0, -1.5, 0.25, c)
    np.testing.assert_allclose(to_numpy(out), REF_OPS[op](2.0 * a, -1.5 * b) + 0.25 * c0, rtol=1e-14)


def test_scale_and_set_tensor_work_in_place(xp):
    y = xp.ones((2, 3))
    assert scale_tensor(None, y, 3.0) is y and float(y.sum()) == 18.0
    assert set_tensor(None, y, -1.0) is y and float(y.sum()) == -6.0


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_transform_tensor_round_trip(xp, rng, shape):
    x = rng.standard_normal(shape)
    to_last = transform_tensor(None, xp.asarray(x), "NCHW", "NHWC")
    assert to_last.flags.c_contiguous
    np.testing.assert_array_equal(to_numpy(to_last), np.moveaxis(x, 1, -1))
    back = transform_tensor(None, to_last, "NHWC", "NCHW")
    assert back.flags.c_contiguous
    np.testing.assert_array_equal(to_numpy(back), x)


REF_REDUCE = {
    ReduceTensorOp.ADD: np.sum, ReduceTensorOp.MUL: np.prod, ReduceTensorOp.MIN: np.min, ReduceTensorOp.MAX: np.max,
    ReduceTensorOp.AVG: np.mean,
    ReduceTensorOp.AMAX: lambda a, axis, keepdims: np.abs(a).max(axis=axis, keepdims=keepdims),
    ReduceTensorOp.NORM1: lambda a, axis, keepdims: np.abs(a).sum(axis=axis, keepdims=keepdims),
    ReduceTensorOp.NORM2: lambda a, axis, keepdims: np.sqrt((a * a).sum(axis=axis, keepdims=keepdims)),
    ReduceTensorOp.MUL_NO_ZEROS: lambda a, axis, keepdims: np.where(a == 0, 1, a).prod(axis=axis, keepdims=keepdims),
}


@pytest.mark.parametrize("out_shape", [(1, 3, 1, 1), (2, 1, 4, 1), (1, 1, 1, 1), (2, 3, 4, 5)])
@pytest.mark.parametrize("op", list(ReduceTensorOp), ids=lambda o: o.name.lower())
def test_reduce_tensor(xp, rng, op, out_shape):
    x = rng.standard_normal((2, 3, 4, 5))
    x[0, 0, 0, :2] = 0
    axes = tuple(a for a, n in enumerate(out_shape) if n == 1)
    y = reduce_tensor(None, op, xp.asarray(x), out_shape=out_shape)
    np.testing.assert_allclose(to_numpy(y), REF_REDUCE[op](x, axis=axes, keepdims=True), rtol=1e-12)


@pytest.mark.parametrize("make, match", [
    (lambda: add_tensor(None, 1.0, np.ones((1, 2, 1, 1)), 0.0, np.ones((2, 3, 4, 4))),
     r"b of shape \(1, 2, 1, 1\) does not broadcast to \(2, 3, 4, 4\)"),
    (lambda: add_tensor(None, 1.0, np.ones(4), 0.0, np.ones((2, 3, 4, 4))),
     r"per-channel vector but the target \(2, 3, 4, 4\) has 3 channels on axis 1"),
    (lambda: add_tensor(None, 1.0, np.ones(3), 0.0, None), "y is required"),
    (lambda: op_tensor(None, "DIV", np.ones(3), np.ones(3)), "unknown op 'DIV'"),
    (lambda: op_tensor(None, OpTensorOp.ADD, np.ones(3)), "op ADD needs b"),
    (lambda: transform_tensor(None, np.ones((2, 3, 4)), "NCHW", "CHWN"), "unknown tensor format 'CHWN'"),
    (lambda: reduce_tensor(None, "MAX", np.ones((2, 3)), out_shape=(2,)), r"output shape \(2,\) must have x's rank"),
    (lambda: reduce_tensor(None, "MIN", np.ones((0, 3)), out_shape=(1, 3)), "MIN over an empty dim"),
])
def test_tensor_ops_errors(make, match):
    with pytest.raises(BadParamError, match=match):
        make()
