"""Batch / layer / group normalisation.

Every case is reduced to "rows": each row holds the values one statistic is taken over.  The float64
reference normalises each row with two-pass statistics and gets dx from the explicit Jacobian of the
row, dy_j/dx_i = s_j * inv_std * (delta_ij - 1/m - xhat_i xhat_j / m).
"""
import numpy as np
import pytest

from minidnn.backend import (
    BadParamError,
    BatchNormMode,
    batch_normalization_backward,
    batch_normalization_forward_inference,
    batch_normalization_forward_training,
    group_normalization_backward,
    group_normalization_forward,
    layer_normalization_backward,
    layer_normalization_forward,
)
from minidnn.backend._testing import numerical_gradient, to_numpy

EPS = 1e-5
SPATIAL, PER_ACT = BatchNormMode.SPATIAL, BatchNormMode.PER_ACTIVATION


def ref_rows(x, s, b, dy, eps=EPS):
    """x, s, b, dy: (rows, m) -> y, xhat, dx (float64, explicit Jacobian)."""
    m = x.shape[1]
    mean = x.mean(axis=1, keepdims=True)
    inv_std = 1 / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + eps)
    xhat = (x - mean) * inv_std
    jac = (s * inv_std)[:, :, None] * (np.eye(m)[None] - 1 / m - xhat[:, :, None] * xhat[:, None, :] / m)
    return s * xhat + b, xhat, np.einsum("rji,rj->ri", jac, dy)


def to_rows(a, perm, rows):
    return np.transpose(a, perm).reshape(rows, a.size // rows if rows else 0)


def from_rows(r, shape, perm):
    return np.transpose(r.reshape([shape[p] for p in perm]), np.argsort(perm))


def ref_case(x, scale, bias, dy, perm, rows, param_axes, param_shape):
    """Reference y, dx, dscale, dbias for statistics over the rows of transpose(x, perm)."""
    sb = [np.broadcast_to(p, x.shape) for p in (scale, bias)]
    if rows == 0:   # empty batch: the statistics' axes are not empty (the reference can't infer m)
        return np.zeros_like(x), np.zeros_like(x), np.zeros(param_shape), np.zeros(param_shape)
    y, xhat, dx = ref_rows(*(to_rows(a, perm, rows) for a in (x, *sb, dy)))
    xhat = from_rows(xhat, x.shape, perm)
    return (from_rows(y, x.shape, perm), from_rows(dx, x.shape, perm),
            (dy * xhat).sum(axis=param_axes).reshape(param_shape), dy.sum(axis=param_axes).reshape(param_shape))


# ---------------------------------------------------------------------------------------------- batch norm

BN_CASES = [((4, 3), SPATIAL), ((5, 3, 4), SPATIAL), ((2, 3, 4, 5), SPATIAL), ((2, 2, 3, 2, 3), SPATIAL),
            ((1, 3, 2, 3), SPATIAL), ((4, 3), PER_ACT), ((3, 2, 3, 2), PER_ACT)]


def _bn_ref(x, scale, bias, dy, mode):
    n, c = x.shape[:2]
    if mode is SPATIAL:
        perm = (1, 0) + tuple(range(2, x.ndim))
        param_axes = tuple(a for a in range(x.ndim) if a != 1)
        scale_b, bias_b = (p.reshape((1, c) + (1,) * (x.ndim - 2)) for p in (scale, bias))
        return ref_case(x, scale_b, bias_b, dy, perm, c, param_axes, (c,))
    perm = tuple(range(1, x.ndim)) + (0,)
    return ref_case(x, scale[None], bias[None], dy, perm, int(np.prod(x.shape[1:])), (0,), x.shape[1:])


def _nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1)) if a.ndim >= 3 else a


@pytest.mark.parametrize("fmt", [None, "NHWC"])
@pytest.mark.parametrize("shape, mode", BN_CASES,
                         ids=[f"{m.name.lower()}-{'x'.join(map(str, s))}" for s, m in BN_CASES])
def test_batch_norm_matches_reference(xp, rng, shape, mode, fmt):
    x = rng.standard_normal(shape) * 2 + 3
    dy = rng.standard_normal(shape)
    pshape = shape[1:2] if mode is SPATIAL else shape[1:]
    scale, bias = rng.standard_normal(pshape), rng.standard_normal(pshape)
    y_ref, dx_ref, ds_ref, db_ref = _bn_ref(x, scale, bias, dy, mode)
    conv = _nhwc if fmt else (lambda a: a)
    pconv = (lambda p: np.ascontiguousarray(np.moveaxis(p, 0, -1)) if p.ndim >= 2 else p) if fmt else (lambda p: p)
    d = lambda a: xp.asarray(a)  # noqa: E731
    running_mean, running_var = d(pconv(np.full(pshape, 0.5))), d(pconv(np.full(pshape, 2.0)))
    y, mean, inv_var = batch_normalization_forward_training(
        None, mode, d(conv(x)), d(pconv(scale)), d(pconv(bias)), 0.1, running_mean, running_var, EPS, format=fmt)
    np.testing.assert_allclose(to_numpy(y), conv(y_ref), rtol=1e-10, atol=1e-12)
    # running statistics: cuDNN's rule with the unbiased batch variance
    axes = (0,) + tuple(range(2, x.ndim)) if mode is SPATIAL else (0,)
    m = x.size // int(np.prod(pshape))
    np.testing.assert_allclose(to_numpy(running_mean), pconv(0.9 * 0.5 + 0.1 * x.mean(axis=axes)), rtol=1e-12)
    np.testing.assert_allclose(to_numpy(running_var), pconv(0.9 * 2.0 + 0.1 * x.var(axis=axes) * m / (m - 1)),
                               rtol=1e-12)
    for saved in ((mean, inv_var), (None, None)):   # None: recomputed from x
        dx, dscale, dbias = batch_normalization_backward(None, mode, d(conv(x)), d(conv(dy)), d(pconv(scale)),
                                                         *saved, EPS, format=fmt)
        np.testing.assert_allclose(to_numpy(dx), conv(dx_ref), rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(to_numpy(dscale), pconv(ds_ref), rtol=1e-10, atol=1e-11)
        np.testing.assert_allclose(to_numpy(dbias), pconv(db_ref), rtol=1e-10, atol=1e-11)
    # inference with the batch statistics reproduces training's y
    y_inf = batch_normalization_forward_inference(None, mode, d(conv(x)), d(pconv(scale)), d(pconv(bias)),
                                                  mean, 1 / inv_var ** 2 - EPS, EPS, format=fmt)
    np.testing.assert_allclose(to_numpy(y_inf), conv(y_ref), rtol=1e-8, atol=1e-9)


def test_batch_norm_gradcheck_and_affine_off(xp, rng):
    x = xp.asarray(rng.standard_normal((3, 2, 2, 2)))
    scale, bias = xp.asarray(rng.standard_normal(2)), xp.asarray(rng.standard_normal(2))
    dy = xp.asarray(rng.standard_normal(x.shape))

    def loss(x_, s_=scale, b_=bias):
        return (batch_normalization_forward_training(None, SPATIAL, x_, s_, b_, 0.1, None, None, EPS)[0] * dy).sum()

    _, mean, inv_var = batch_normalization_forward_training(None, SPATIAL, x, scale, bias, 0.1, None, None, EPS)
    dx, dscale, dbias = batch_normalization_backward(None, SPATIAL, x, dy, scale, mean, inv_var, EPS)
    np.testing.assert_allclose(to_numpy(dx), numerical_gradient(loss, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(to_numpy(dscale), numerical_gradient(lambda s: loss(x, s), scale), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(to_numpy(dbias), numerical_gradient(lambda b: loss(x, scale, b), bias), rtol=1e-6)
    # affine off: scale = 1, bias = 0, no parameter gradients
    y0 = batch_normalization_forward_training(None, SPATIAL, x, None, None, 0.1, None, None, EPS)[0]
    y1 = batch_normalization_forward_training(None, SPATIAL, x, xp.ones(2), xp.zeros(2), 0.1, None, None, EPS)[0]
    np.testing.assert_allclose(to_numpy(y0), to_numpy(y1))
    dx0, ds0, db0 = batch_normalization_backward(None, SPATIAL, x, dy, None, mean, inv_var, EPS)
    assert ds0 is None and db0 is None
    np.testing.assert_allclose(to_numpy(dx0), to_numpy(batch_normalization_backward(
        None, SPATIAL, x, dy, xp.ones(2), mean, inv_var, EPS)[0]))


def test_batch_norm_empty_batch_and_single_value(xp):
    rm, rv = xp.zeros(3), xp.ones(3)
    y, mean, inv_var = batch_normalization_forward_training(None, SPATIAL, xp.zeros((0, 3, 2, 2)), xp.ones(3),
                                                            xp.zeros(3), 0.1, rm, rv, EPS)
    assert y.shape == (0, 3, 2, 2) and mean.shape == (3,) and float(rv.sum()) == 3.0
    dx, dscale, dbias = batch_normalization_backward(None, SPATIAL, xp.zeros((0, 3, 2, 2)), xp.zeros((0, 3, 2, 2)),
                                                     xp.ones(3), mean, inv_var, EPS)
    assert dx.shape == (0, 3, 2, 2) and float(abs(dscale).sum()) == 0.0
    with pytest.raises(BadParamError, match=r"more than 1 value per statistic .* \(1, 3\)"):
        batch_normalization_forward_training(None, SPATIAL, xp.ones((1, 3)), None, None, 0.1, None, None, EPS)


def test_one_pass_moments_keep_precision_for_large_means(rng):
    x = (1e4 + rng.standard_normal((64, 2, 8, 8))).astype(np.float32)
    _, _, inv_var = batch_normalization_forward_training(None, SPATIAL, x, None, None, 0.1, None, None, 0.0)
    var_ref = x.astype(np.float64).var(axis=(0, 2, 3))
    np.testing.assert_allclose(1 / inv_var.astype(np.float64) ** 2, var_ref, rtol=1e-3)


def test_batch_norm_against_pytorch(rng):
    torch = pytest.importorskip("torch")
    for shape in ((8, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 4)):
        x = rng.standard_normal(shape).astype(np.float32)
        dy = rng.standard_normal(shape).astype(np.float32)
        scale, bias = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
        rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
        rm_t, rv_t = torch.zeros(3), torch.ones(3)
        xt, st, bt = (torch.tensor(a, requires_grad=True) for a in (x, scale, bias))
        yt = torch.nn.functional.batch_norm(xt, rm_t, rv_t, st, bt, training=True, momentum=0.1, eps=EPS)
        yt.backward(torch.tensor(dy))
        y, mean, inv_var = batch_normalization_forward_training(None, SPATIAL, x, scale, bias, 0.1, rm, rv, EPS)
        dx, dscale, dbias = batch_normalization_backward(None, SPATIAL, x, dy, scale, mean, inv_var, EPS)
        tol = dict(rtol=1.3e-6, atol=1e-5)
        for ours, theirs in ((y, yt), (rm, rm_t), (rv, rv_t), (dx, xt.grad), (dscale, st.grad), (dbias, bt.grad)):
            np.testing.assert_allclose(ours, theirs.detach().numpy(), **tol)
        y_inf = batch_normalization_forward_inference(None, SPATIAL, x, scale, bias, rm, rv, EPS)
        yt_inf = torch.nn.functional.batch_norm(torch.tensor(x), rm_t, rv_t, st, bt, training=False, eps=EPS)
        np.testing.assert_allclose(y_inf, yt_inf.detach().numpy(), **tol)


# ---------------------------------------------------------------------------------------------- layer / group norm

LN_CASES = [((4, 6), 1), ((2, 3, 4), 1), ((2, 3, 4), 2), ((2, 2, 3, 4), 3), ((0, 5), 1)]
GN_CASES = [((2, 6, 3, 2), 3), ((3, 4, 5), 2), ((2, 4), 4), ((1, 6, 2, 2, 2), 1), ((0, 4, 3), 2)]


@pytest.mark.parametrize("shape, k", LN_CASES, ids=[f"{'x'.join(map(str, s))}-last{k}" for s, k in LN_CASES])
def test_layer_norm_matches_reference(xp, rng, shape, k):
    x, dy = rng.standard_normal(shape) * 2 + 1, rng.standard_normal(shape)
    nshape = shape[len(shape) - k:]
    scale, bias = rng.standard_normal(nshape), rng.standard_normal(nshape)
    lead = tuple(range(len(shape) - k))
    y_ref, dx_ref, ds_ref, db_ref = ref_case(x, scale, bias, dy, tuple(range(len(shape))),
                                             int(np.prod(shape[:len(shape) - k])), lead, nshape)
    d = xp.asarray
    y, mean, inv_std = layer_normalization_forward(None, d(x), d(scale), d(bias), k, EPS)
    assert mean.shape == inv_std.shape == shape[:len(shape) - k]
    dx, dscale, dbias = layer_normalization_backward(None, d(x), d(dy), d(scale), mean, inv_std, k)
    for ours, ref in ((y, y_ref), (dx, dx_ref), (dscale, ds_ref), (dbias, db_ref)):
        np.testing.assert_allclose(to_numpy(ours), ref, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("shape, groups", GN_CASES, ids=[f"{'x'.join(map(str, s))}-g{g}" for s, g in GN_CASES])
def test_group_norm_matches_reference(xp, rng, shape, groups):
    x, dy = rng.standard_normal(shape) * 2 + 1, rng.standard_normal(shape)
    c = shape[1]
    scale, bias = rng.standard_normal(c), rng.standard_normal(c)
    bshape = (1, c) + (1,) * (len(shape) - 2)
    y_ref, dx_ref, ds_ref, db_ref = ref_case(x, scale.reshape(bshape), bias.reshape(bshape), dy,
                                             tuple(range(len(shape))), shape[0] * groups,
                                             tuple(a for a in range(len(shape)) if a != 1), (c,))
    d = xp.asarray
    y, mean, inv_std = group_normalization_forward(None, d(x), groups, d(scale), d(bias), EPS)
    assert mean.shape == inv_std.shape == (shape[0], groups)
    dx, dscale, dbias = group_normalization_backward(None, d(x), d(dy), groups, d(scale), mean, inv_std)
    for ours, ref in ((y, y_ref), (dx, dx_ref), (dscale, ds_ref), (dbias, db_ref)):
        np.testing.assert_allclose(to_numpy(ours), ref, rtol=1e-9, atol=1e-11)


def test_layer_and_group_norm_gradcheck(xp, rng):
    x = xp.asarray(rng.standard_normal((2, 4, 3)))
    dy = xp.asarray(rng.standard_normal(x.shape))
    s2, b2 = xp.asarray(rng.standard_normal((4, 3))), xp.asarray(rng.standard_normal((4, 3)))
    y, mean, inv_std = layer_normalization_forward(None, x, s2, b2, 2, EPS)
    dx, dscale, _ = layer_normalization_backward(None, x, dy, s2, mean, inv_std, 2)
    ln = lambda x_, s_=s2: (layer_normalization_forward(None, x_, s_, b2, 2, EPS)[0] * dy).sum()  # noqa: E731
    np.testing.assert_allclose(to_numpy(dx), numerical_gradient(ln, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(to_numpy(dscale), numerical_gradient(lambda s: ln(x, s), s2), rtol=1e-6, atol=1e-8)
    s1 = xp.asarray(rng.standard_normal(4))
    y, mean, inv_std = group_normalization_forward(None, x, 2, s1, None, EPS)
    dx, dscale, _ = group_normalization_backward(None, x, dy, 2, s1, mean, inv_std)
    gn = lambda x_, s_=s1: (group_normalization_forward(None, x_, 2, s_, None, EPS)[0] * dy).sum()  # noqa: E731
    np.testing.assert_allclose(to_numpy(dx), numerical_gradient(gn, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(to_numpy(dscale), numerical_gradient(lambda s: gn(x, s), s1), rtol=1e-6, atol=1e-8)


def test_layer_and_group_norm_against_pytorch(rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    tol = dict(rtol=1.3e-6, atol=1e-5)
    for kind, pshape in (("layer", (3, 4)), ("group", (6,))):
        scale, bias = (rng.standard_normal(pshape).astype(np.float32) for _ in range(2))
        xt, st, bt = (torch.tensor(a, requires_grad=True) for a in (x, scale, bias))
        if kind == "layer":
            yt = F.layer_norm(xt, pshape, st, bt, EPS)
            y, mean, inv_std = layer_normalization_forward(None, x, scale, bias, 2, EPS)
            grads = layer_normalization_backward(None, x, dy, scale, mean, inv_std, 2)
        else:
            yt = F.group_norm(xt, 3, st, bt, EPS)
            y, mean, inv_std = group_normalization_forward(None, x, 3, scale, bias, EPS)
            grads = group_normalization_backward(None, x, dy, 3, scale, mean, inv_std)
        yt.backward(torch.tensor(dy))
        np.testing.assert_allclose(y, yt.detach().numpy(), **tol)
        for ours, theirs in zip(grads, (xt.grad, st.grad, bt.grad)):
            np.testing.assert_allclose(ours, theirs.numpy(), **tol)


@pytest.mark.parametrize("make, match", [
    (lambda: batch_normalization_forward_training(None, "GLOBAL", np.ones((2, 3)), None, None, 0.1, None, None, EPS),
     "unknown mode 'GLOBAL'"),
    (lambda: batch_normalization_forward_training(None, SPATIAL, np.ones((2, 3, 4)), np.ones(4), None, 0.1, None,
                                                  None, EPS), r"scale has shape \(4,\) but must have shape \(3,\)"),
    (lambda: batch_normalization_forward_training(None, SPATIAL, np.ones((2, 3)), None, None, 1.5, None, None, EPS),
     r"exponential_average_factor=1.5 must be in \[0, 1\]"),
    (lambda: batch_normalization_forward_training(None, SPATIAL, np.ones((2, 3)), None, None, 0.1, None, None, -1.0),
     "epsilon=-1.0 must be a finite number >= 0"),
    (lambda: batch_normalization_forward_inference(None, SPATIAL, np.ones((2, 3)), None, None, None, None, EPS),
     "estimated_mean and estimated_variance are required"),
    (lambda: batch_normalization_backward(None, SPATIAL, np.ones((2, 3)), np.ones((2, 3)), None, np.ones(3), None,
                                          EPS), "give both saved_mean and saved_inv_variance, or neither"),
    (lambda: layer_normalization_forward(None, np.ones((2, 3)), None, None, 3, EPS),
     r"normalized_ndim=3 must be an int in \[1, 2\]"),
    (lambda: group_normalization_forward(None, np.ones((2, 6, 3)), 4, None, None, EPS),
     "num_groups=4 must be a positive divisor of the 6 channels"),
    (lambda: group_normalization_backward(None, np.ones((2, 6, 3)), np.ones((2, 6, 3)), 3, None, np.ones((2, 2)),
                                          np.ones((2, 3))), r"mean must be the forward's statistic of shape \(2, 3\)"),
])
def test_normalization_errors(make, match):
    with pytest.raises(BadParamError, match=match):
        make()


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_batch_norm_counter_counts_each_successful_call(xp, rng, fmt):
    # BatchNorm's num_batches_tracked is counted by the training primitive (on the GPU: by its statistics kernel)
    shape = (4, 3, 5, 6) if fmt == "NCHW" else (4, 5, 6, 3)
    x = xp.asarray(rng.standard_normal(shape).astype(np.float32))
    s, b = xp.ones(3, np.float32), xp.zeros(3, np.float32)
    rm, rv = xp.zeros(3, np.float32), xp.ones(3, np.float32)
    counter = xp.asarray(np.array([7], dtype=np.int64))
    for i in range(3):
        y, mean, inv = batch_normalization_forward_training(None, SPATIAL, x, s, b, 0.1, rm, rv, EPS, format=fmt,
                                                            counter=counter)
        assert int(to_numpy(counter)[0]) == 8 + i
    y0, _, _ = batch_normalization_forward_training(None, SPATIAL, x, s, b, 0.1, None, None, EPS, format=fmt)
    np.testing.assert_allclose(to_numpy(y), to_numpy(y0), rtol=1e-6, atol=1e-6)
    # a rejected call counts nothing; a wrong counter is named in the error
    with pytest.raises(BadParamError, match="counter must be a one-element int64"):
        batch_normalization_forward_training(None, SPATIAL, x, s, b, 0.1, rm, rv, EPS, format=fmt,
                                             counter=xp.zeros(1, np.float32))
    with pytest.raises(BadParamError):
        batch_normalization_forward_training(None, SPATIAL, x, s, b, 2.0, rm, rv, EPS, format=fmt, counter=counter)
    assert int(to_numpy(counter)[0]) == 10


@pytest.mark.cuda
def test_batch_norm_counter_needs_no_launch_of_its_own():
    cp = pytest.importorskip("cupy")
    from minidnn.backend.cuda import launch
    x = cp.random.standard_normal((8, 16, 6, 6), dtype=cp.float32)
    s, b, rm, rv = cp.ones(16, cp.float32), cp.zeros(16, cp.float32), cp.zeros(16, cp.float32), cp.ones(16, cp.float32)
    counter = cp.zeros(1, cp.int64)

    def launches(c):
        batch_normalization_forward_training(None, SPATIAL, x, s, b, 0.1, rm, rv, EPS, counter=c)  # warm
        start = launch.launch_count()
        batch_normalization_forward_training(None, SPATIAL, x, s, b, 0.1, rm, rv, EPS, counter=c)
        return launch.launch_count() - start
    from minidnn.backend.cuda import bn_kernels
    per_call = 1 if bn_kernels.ONEPASS else 2          # bn_fwd1, else the statistics + apply pair
    assert launches(counter) == launches(None) == per_call
    assert int(counter[0]) == 2
