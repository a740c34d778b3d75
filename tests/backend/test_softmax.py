"""Softmax / log-softmax: one table over modes, layouts and axis=; explicit-Jacobian float64 reference, PyTorch."""
import numpy as np
import pytest

from minidnn.backend import BadParamError, SoftmaxAlgorithm, SoftmaxMode, softmax_backward, softmax_forward
from minidnn.backend._testing import numerical_gradient, to_numpy

A, MODE = SoftmaxAlgorithm, SoftmaxMode

# shape, mode, format, axis -> the axes one distribution spans
CASES = [
    ((3, 5), MODE.INSTANCE, None, None, (1,)),
    ((2, 3, 4, 5), MODE.INSTANCE, None, None, (1, 2, 3)),
    ((2, 3, 4, 5), MODE.CHANNEL, None, None, (1,)),
    ((2, 4, 5, 3), MODE.CHANNEL, "NHWC", None, (3,)),
    ((2, 3, 4), MODE.CHANNEL, None, None, (1,)),
    ((1, 3, 2, 2, 2), MODE.CHANNEL, None, None, (1,)),
    ((0, 3, 2), MODE.CHANNEL, None, None, (1,)),
    ((2, 3, 4), None, None, -1, (2,)),
    ((2, 3, 4), None, None, (0, 2), (0, 2)),
    ((6,), None, None, 0, (0,)),
]
IDS = [f"{'x'.join(map(str, c[0]))}-{c[1].name.lower() if c[1] else 'axis' + str(c[3])}-{c[2]}" for c in CASES]


def _rows(a, axes):
    """a with the distribution axes moved last and flattened: (rows, K)."""
    rest = [d for d in range(a.ndim) if d not in axes]
    moved = np.transpose(a, rest + list(axes))
    return moved.reshape(-1, int(np.prod([a.shape[d] for d in axes]))), moved.shape, rest + list(axes)


def _unrows(r, moved_shape, perm):
    return np.transpose(r.reshape(moved_shape), np.argsort(perm))


def ref_softmax(x, dy, axes, log):
    r, shape, perm = _rows(x, axes)
    g, _, _ = _rows(dy, axes)
    s = np.exp(r - r.max(axis=1, keepdims=True))
    s /= s.sum(axis=1, keepdims=True)
    eye = np.eye(r.shape[1])
    if log:   # J[i, j] = d log s_i / d x_j = delta_ij - s_j
        jac = eye[None] - s[:, None, :]
        y = np.log(s)
    else:     # J[i, j] = s_i (delta_ij - s_j)
        jac = s[:, :, None] * (eye[None] - s[:, None, :])
        y = s
    dx = np.einsum("rij,ri->rj", jac, g)
    return _unrows(y, shape, perm), _unrows(dx, shape, perm)


@pytest.mark.parametrize("algo", list(A), ids=lambda a: a.name.lower())
@pytest.mark.parametrize("shape, mode, fmt, axis, axes", CASES, ids=IDS)
def test_softmax_matches_reference(xp, rng, shape, mode, fmt, axis, axes, algo):
    x = rng.standard_normal(shape) * 3
    dy = rng.standard_normal(shape)
    y_ref, dx_ref = ref_softmax(x, dy, axes, algo is A.LOG)
    y = softmax_forward(None, algo, mode, xp.asarray(x), format=fmt, axis=axis)
    dx = softmax_backward(None, algo, mode, y, xp.asarray(dy), format=fmt, axis=axis)
    np.testing.assert_allclose(to_numpy(y), y_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(to_numpy(dx), dx_ref, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("algo", [A.ACCURATE, A.LOG], ids=["softmax", "log_softmax"])
def test_softmax_backward_finite_differences(xp, rng, algo):
    x = xp.asarray(rng.standard_normal((2, 3, 2)))
    dy = xp.asarray(rng.standard_normal((2, 3, 2)))
    y = softmax_forward(None, algo, MODE.CHANNEL, x)
    num = numerical_gradient(lambda v: (softmax_forward(None, algo, MODE.CHANNEL, v) * dy).sum(), x)
    np.testing.assert_allclose(to_numpy(softmax_backward(None, algo, MODE.CHANNEL, y, dy)), num, rtol=1e-7, atol=1e-9)


def test_accurate_survives_large_inputs_where_fast_overflows(xp):
    x = xp.asarray(np.array([[1000.0, 1001.0]]))
    assert np.isfinite(to_numpy(softmax_forward(None, A.ACCURATE, MODE.INSTANCE, x))).all()
    assert np.isfinite(to_numpy(softmax_forward(None, A.LOG, MODE.INSTANCE, x))).all()
    with np.errstate(over="ignore", invalid="ignore"):
        assert not np.isfinite(to_numpy(softmax_forward(None, A.FAST, MODE.INSTANCE, x))).all()


def test_softmax_against_pytorch(rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    for algo, fn in ((A.ACCURATE, torch.softmax), (A.LOG, torch.log_softmax)):
        for mode in MODE:
            xt = torch.tensor(x, requires_grad=True)
            yt = fn(xt.reshape(2, -1), 1).reshape(x.shape) if mode is MODE.INSTANCE else fn(xt, 1)
            yt.backward(torch.tensor(dy))
            y = softmax_forward(None, algo, mode, x)
            np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1.3e-6, atol=1e-5)
            np.testing.assert_allclose(softmax_backward(None, algo, mode, y, dy), xt.grad.numpy(),
                                       rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("make, match", [
    (lambda: softmax_forward(None, "SLOW", MODE.CHANNEL, np.ones((2, 3))), "unknown algorithm 'SLOW'"),
    (lambda: softmax_forward(None, A.FAST, "SPATIAL", np.ones((2, 3))), "unknown mode 'SPATIAL'"),
    (lambda: softmax_forward(None, A.FAST, MODE.CHANNEL, np.ones(3)), r"at least 2 dims .* got shape \(3,\)"),
    (lambda: softmax_forward(None, A.FAST, None, np.ones((2, 3)), axis=2), r"axis=2 is out of range .* \(2, 3\)"),
    (lambda: softmax_backward(None, A.LOG, MODE.CHANNEL, np.ones((2, 3)), np.ones((3, 2))),
     r"dy has shape \(3, 2\) but y has shape \(2, 3\)"),
])
def test_softmax_errors(make, match):
    with pytest.raises(BadParamError, match=match):
        make()


def test_softmax_over_an_empty_dim_is_empty():
    # PyTorch returns an empty result for a softmax over a size-0 dim (the fuzz suite's edge case).
    for algo in (A.FAST, A.ACCURATE, A.LOG):
        y = softmax_forward(None, algo, MODE.CHANNEL, np.ones((2, 0), np.float32))
        assert y.shape == (2, 0)
        assert softmax_backward(None, algo, MODE.CHANNEL, y, y).shape == (2, 0)



@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_reference_rounds_once(dtype):
    """The CPU reference computes 16-bit data in float32 and rounds once (step by step in bfloat16 it was off by up
    to ~8 ulps): forward within an ulp of the float64 value of its rounded input (softmax bitwise PyTorch's CPU
    result; PyTorch's 16-bit CPU log-softmax is itself 8-13 ulps off), backward within an ulp of its terms."""
    torch = pytest.importorskip("torch")
    import minidnn as mdn
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 50)) * 3).astype(np.float32)
    g = rng.standard_normal((64, 50)).astype(np.float32)
    eps = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11          # half an ulp, relative
    tiny = 1e-30 if dtype == "bfloat16" else 2.0 ** -24                 # float16's subnormal spacing
    for name in ("softmax", "log_softmax"):
        xm = mdn.tensor(x).to(getattr(mdn, dtype)).requires_grad_()
        ym = getattr(mdn.nn.functional, name)(xm, 1)
        ym.backward(mdn.tensor(g).to(getattr(mdn, dtype)))
        xq = xm.detach().float().numpy().astype(np.float64)
        z = xq - xq.max(1, keepdims=True)
        ls = np.log(np.exp(z).sum(1, keepdims=True))
        exact = z - ls if name == "log_softmax" else np.exp(z - ls)
        y = ym.detach().float().numpy()
        assert ym.dtype == getattr(mdn, dtype) and np.all(np.abs(y - exact) <= 2 * eps * np.abs(exact) + tiny), name
        if name == "softmax":
            assert np.array_equal(y, torch.softmax(torch.tensor(x).to(getattr(torch, dtype)), 1).float().numpy())
        yq, gq = y.astype(np.float64), mdn.tensor(g).to(getattr(mdn, dtype)).float().numpy().astype(np.float64)
        if name == "log_softmax":
            terms = (gq, np.exp(yq) * gq.sum(1, keepdims=True))
            dx = terms[0] - terms[1]
        else:
            terms = (yq * gq, yq * (yq * gq).sum(1, keepdims=True))
            dx = terms[0] - terms[1]
        got = xm.grad.float().numpy()
        assert np.all(np.abs(got - dx) <= 2 * eps * (np.abs(terms[0]) + np.abs(terms[1])) + tiny), name
