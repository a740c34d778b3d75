"""An ignored row's gradient when its logits are not finite (loss_kernels' IGNORED_DX, session 24): softmax(x) * 0 --
0, or NaN where the row's softmax is NaN (a NaN or +inf logit, or every logit -inf) -- in the CPU reference, in
PyTorch (log_softmax + nll_loss, the oracle) and in every GPU cross-entropy kernel (rows, warps, the spatial kernels
with the class count compiled in or read, pairs, SPLIT).  Before, the GPU kernels wrote 0 where the other two gave
NaN."""
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend._testing import to_numpy
from minidnn.backend.cuda import loss_kernels as _lk
from minidnn.backend.cuda import softmax_kernels as _sk
from tests.backend.test_softmax_rows_cuda import _dtype

# the rows' specials, each ignored and not: finite; one NaN; one +inf; every logit -inf; some -inf; -inf at the
# target (its loss +inf); two +inf
SPECIALS = ("finite", "nan", "+inf", "all -inf", "some -inf", "-inf at t", "two +inf")


def _rows(rng, n, c):
    """(x (n, c) float32, target (n,) int64): rows cycle through SPECIALS, every other pair of rows ignored."""
    x = (rng.standard_normal((n, c)) * 3).astype(np.float32)
    t = rng.integers(0, c, n).astype(np.int64)
    for r in range(n):
        kind = SPECIALS[(r // 2) % len(SPECIALS)]
        j = (r * 7) % c
        if kind == "nan":
            x[r, j] = np.nan
        elif kind == "+inf":
            x[r, j] = np.inf
        elif kind == "all -inf":
            x[r] = -np.inf
        elif kind == "some -inf":
            x[r, ::3] = -np.inf
            t[r] = 1 % c
        elif kind == "-inf at t":
            x[r, t[r]] = -np.inf
        elif kind == "two +inf":
            x[r, [0, c - 1]] = np.inf
        if r % 2:
            t[r] = -100
    return x, t


def _nchw(x, t, n, c, h, w):
    """The rows as an (n, c, h, w) tensor: row r is position r of the (n, h, w) grid."""
    return (np.ascontiguousarray(x.reshape(n, h, w, c).transpose(0, 3, 1, 2)), t.reshape(n, h, w))


def _reference_dx(x, t, reduction, g):
    loss, lse, den = B.softmax_cross_entropy_forward(None, x, t, None, -100, 0.0, reduction)
    return np.asarray(B.softmax_cross_entropy_backward(None, x, t, g, lse, den, None, -100, 0.0, reduction))


def _nan_rows(x, t):
    """Per row: whether its gradient is NaN under IGNORED_DX where ignored (softmax NaN)."""
    return np.isnan(x).any(1) | np.isposinf(x).any(1) | np.isneginf(x).all(1)


def test_reference_ignored_rows_follow_pytorch():
    """The CPU reference's dx of ignored rows with non-finite logits: NaN exactly where PyTorch's is (row by row,
    element by element), 0 elsewhere; the non-ignored rows' NaN pattern as PyTorch's too."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x, t = _rows(rng, 28, 9)
    for reduction in ("none", "mean", "sum"):
        g = np.ones(t.shape, np.float32) * 0.5 if reduction == "none" else np.float32(0.5)
        dx = _reference_dx(x, t, reduction, g)
        xt = torch.tensor(x, requires_grad=True)
        loss = torch.nn.functional.cross_entropy(xt, torch.tensor(t), ignore_index=-100, reduction=reduction)
        loss.backward(torch.tensor(g))
        want = xt.grad.numpy()
        assert np.array_equal(np.isnan(dx), np.isnan(want)), reduction
        ign = t == -100
        assert np.array_equal(np.isnan(dx[ign]).all(1), _nan_rows(x, t)[ign])
        assert not dx[ign][~np.isnan(dx[ign])].any()
        fin = ~np.isnan(want)
        np.testing.assert_allclose(dx[fin], want[fin], rtol=1e-5, atol=1e-6)


# (route, shape of the logits, switches): every GPU kernel family's ignored-row branch
ROUTES = [("rows", (28, 9), {}), ("rows-ragged", (28, 1001), {}), ("rows-long", (14, 40000), {}),
          ("warps", (2, 9, 2, 7), {"V1": True}),
          ("spatial-cc", (2, 9, 3, 5), {}), ("spatial-read", (2, 40, 2, 7), {}),
          ("spatial-pairs", (2, 40, 2, 8), {"SP_RT_PAIR_BLOCKS": 0}), ("spatial-cc-pairs", (2, 9, 2, 8), {}),
          ("spatial-split", (1, 150, 4, 7), {})]


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("route", ROUTES, ids=[r[0] for r in ROUTES])
def test_gpu_ignored_rows_as_reference(cp, monkeypatch, route, name):
    """Each GPU kernel family: the ignored rows' dx NaN where the reference's is (the whole row: their lse is NaN or
    -inf), 0 elsewhere; every row's NaN pattern as the reference's and the finite values close to it."""
    label, shape, switches = route
    for k, v in switches.items():
        monkeypatch.setattr(_sk if k == "V1" else _lk, k, v)
    if label == "warps":
        monkeypatch.setattr(_lk, "CE_SPATIAL", False)
    _lk._plans.clear()
    rng = np.random.default_rng(13)
    dt = _dtype(name)
    if len(shape) == 2:
        n, c = shape
        x2, t = _rows(rng, n, c)
        x = x2
    else:
        n, c, h, w = shape
        x2, t2 = _rows(rng, n * h * w, c)
        x, t = _nchw(x2, t2, n, c, h, w)
    x = x.astype(dt)
    spec = _lk.launch_spec("ce_bwd", x.shape, np.dtype(dt), np.int64, False, "none")
    want_src = {"rows": "ROWS", "rows-ragged": "ROWS", "rows-long": "ROWS", "warps": "WARPS"}.get(label, "SPATIAL")
    assert spec[0] == want_src, spec[:2]
    if label.startswith("rows"):        # rows-ragged: the scalar head / tail (store_edges' ed[] of the ignored row)
        assert ("RAGGED=1" in spec[2]) == (label == "rows-ragged"), spec[2]
    if label == "spatial-split":
        assert any(d.startswith("SPLIT=") for d in spec[2])
    if label.endswith("pairs"):
        assert "PAIR=1" in spec[2]
    try:
        for reduction in ("none", "mean"):
            g = (rng.standard_normal(t.shape).astype(np.float32) if reduction == "none" else np.float32(0.5))
            ref = _reference_dx(x.astype(np.float32), t, reduction, g)
            xd, td = cp.asarray(x), cp.asarray(t)
            loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, None, -100, 0.0, reduction)
            gd = cp.asarray(np.asarray(g).astype(loss.dtype))
            dx = to_numpy(B.softmax_cross_entropy_backward(None, xd, td, gd, lse, den, None, -100, 0.0,
                                                           reduction)).astype(np.float64)
            rows_dx = dx if dx.ndim == 2 else np.moveaxis(dx, 1, -1).reshape(-1, c)
            rows_ref = ref if ref.ndim == 2 else np.moveaxis(ref, 1, -1).reshape(-1, c)
            tt = t.reshape(-1)
            ign = tt == -100
            assert np.array_equal(np.isnan(rows_dx), np.isnan(rows_ref)), (label, reduction)
            assert np.array_equal(np.isnan(rows_dx[ign]).all(1), _nan_rows(x2, tt)[ign]), (label, reduction)
            assert not np.nan_to_num(rows_dx[ign], nan=0.0).any()
            fin = np.isfinite(rows_ref)
            tol = 2e-6 if name == "float32" else 1e-2
            np.testing.assert_allclose(rows_dx[fin], rows_ref[fin], rtol=tol, atol=tol)
    finally:
        _lk._plans.clear()
