"""Dropout: reproducible seeded masks, scaling, p = 0 / p = 1, backward uses the reserve mask."""
import numpy as np
import pytest

from minidnn.backend import (
    BadParamError,
    DropoutDescriptor,
    dropout_backward,
    dropout_forward,
    dropout_get_reserve_space_size,
)
from minidnn.backend._testing import to_numpy


@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 1.0])
def test_dropout_forward_backward(xp, rng, p):
    x = xp.asarray(rng.standard_normal((64, 50)))
    desc = DropoutDescriptor(p, seed=3)
    y, reserve = dropout_forward(None, desc, x)
    keep = to_numpy(reserve)
    assert keep.dtype == np.bool_ and keep.shape == x.shape
    assert abs(keep.mean() - (1 - p)) < 0.03
    scale = 0.0 if p == 1 else 1 / (1 - p)
    np.testing.assert_allclose(to_numpy(y), np.where(keep, to_numpy(x) * scale, 0.0), rtol=1e-15)
    if p == 0:
        np.testing.assert_array_equal(to_numpy(y), to_numpy(x))
    dy = xp.asarray(rng.standard_normal(x.shape))
    dx = dropout_backward(None, desc, dy, reserve)
    np.testing.assert_allclose(to_numpy(dx), np.where(keep, to_numpy(dy) * scale, 0.0), rtol=1e-15)
    assert dropout_get_reserve_space_size(x) == x.size


def test_dropout_same_seed_same_mask_sequence(xp):
    x = xp.ones((8, 16), dtype=np.float32)
    a, b = DropoutDescriptor(0.5, seed=11), DropoutDescriptor(0.5, seed=11)
    masks_a = [to_numpy(dropout_forward(None, a, x)[1]) for _ in range(3)]
    masks_b = [to_numpy(dropout_forward(None, b, x)[1]) for _ in range(3)]
    for ma, mb in zip(masks_a, masks_b):
        np.testing.assert_array_equal(ma, mb)
    assert not np.array_equal(masks_a[0], masks_a[1]), "consecutive calls must draw new masks"
    a.reset()
    np.testing.assert_array_equal(to_numpy(dropout_forward(None, a, x)[1]), masks_a[0])
    assert dropout_forward(None, a, x)[0].dtype == np.float32


@pytest.mark.parametrize("make, match", [
    (lambda: DropoutDescriptor(1.5), r"p=1.5 must be in \[0, 1\]"),
    (lambda: DropoutDescriptor(0.5, seed=-1), "seed=-1 must be an int >= 0"),
    (lambda: dropout_backward(None, DropoutDescriptor(0.5), np.ones(3), np.ones(3)),
     r"reserve must be the bool mask of dy's shape \(3,\)"),
    (lambda: dropout_forward(None, 0.5, np.ones(3)), "must be a DropoutDescriptor, got float"),
])
def test_dropout_errors(make, match):
    with pytest.raises(BadParamError, match=match):
        make()
